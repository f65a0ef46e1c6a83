"""The AWM multi-turn rollout under over-sampling that stops: episodes still in flight when the batch is full are
cancelled mid-episode, and every environment session they held is released by the time the rollout returns.

Real processes: the scripted engine (its replies held for their token count x a per-token latency) and the slime
router, the in-process environment runtime (worker processes, the verifier sandbox), slime's rollout function.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from awm_grpo import drift_check, env_client
from awm_grpo.loadtest.harness import ScriptedStack, open_episodes, rollout_args, write_inputs
from slime.rollout.data_source import RolloutDataSource, load_prompts
from slime.rollout.engine_abort import engine_load
from slime.rollout.sglang_rollout import GenerateState, play_rollout
from slime.utils.http_utils import get
from slime.utils.types import Sample


def test_cancelled_episodes_release_their_environment_sessions(tiny_model_dir, tmp_path):
    """A batch of 1 group of 2 with 8 groups (16 episodes) pulled at once: the bundled tasks take 2-7 turns, so the
    first group to finish leaves the others mid-episode. When the rollout returns no episode is open, the engine
    holds nothing, and the batch is one whole group of finished, verified episodes."""
    prompts, scripts, _ = write_inputs(None, tmp_path / "inputs")
    with ScriptedStack(tiny_model_dir, scripts, token_latency_ms=4) as stack:
        args = rollout_args(stack, tiny_model_dir, prompts, tmp_path / "traces", episodes=2, n_samples=2)
        args.over_sampling_batch_size = 8
        args.awm_drift_workers = 1  # the drift check in a helper process, awaited by episodes being cancelled
        GenerateState.clear_instances()
        source = RolloutDataSource(load_prompts(args, args.prompt_data, GenerateState(args).tokenizer), 2,
                                   shuffle=True, seed=0)

        async def step() -> tuple:
            out = await play_rollout(args, 0, source)
            return out, open_episodes(), await engine_load(stack.engine_url), await get(f"{stack.engine_url}/get_server_info")

        try:
            out, still_open, load, info = asyncio.run(asyncio.wait_for(step(), timeout=300))
        finally:
            env_client.close_runtimes()
            drift_check.shutdown()
    m = out.metrics
    assert still_open == 0 and load == 0
    assert m["rollout/episodes_aborted"] > 0, m  # some episodes really were cancelled mid-way
    assert m["rollout/episodes_trained"] == 2 and len(out.samples) == 1 and len(out.samples[0]) == 2
    assert m["rollout/episodes_played"] + m["rollout/episodes_aborted"] + m["rollout/episodes_failed"] == 16
    # every model turn posted, the aborted episodes' too, is one the engine received
    assert m["rollout/generate_requests"] == info["generate_total"] >= 2 * m["rollout/episodes_played"]
    for s in out.samples[0]:
        assert s.status == Sample.Status.COMPLETED and s.reward is not None
        assert s.metadata["awm"]["stop_reason"] == "final_answer" and s.metadata["awm"]["verdict"] is not None
        assert s.metadata["awm"]["drift_tokens"] == 0  # checked in the helper process: this template does not drift
    ended = [json.loads(line) for line in (Path(args.awm_trace_dir) / "live.jsonl").read_text().splitlines()]
    assert len(ended) == m["rollout/episodes_played"]  # one live line per episode that ended; cancelled: none
    assert all(r["stop_reason"] == "final_answer" for r in ended)
    assert len(source.pending) == 7  # the other groups' prompts are served first next step

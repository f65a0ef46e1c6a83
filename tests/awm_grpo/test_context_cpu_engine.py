"""Context-managed episodes on the real CPU engine and the real tiny transformer, checked by log-prob parity.

A sample is trained as (prompt, response) with the engine's log-probs; the trainer scores the same tokens
again. They agree only if every sample's tokens are exactly the context the engine saw and what it answered,
so parity over every model token of every sample is the token-in/token-out check. The tiny model cannot be
asked to delete anything, so the first turns are forced: their tokens are fixed, and the CPU engine scores
them under the real context (`logprob_start_len`, as a teacher scores for on-policy distillation); the
turns after them are the model's own samples.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from rollout_helpers import make_args

from awm_grpo.context.loop import play_managed
from awm_grpo.reward import reward
from awm_grpo.rollout import play
from slime.backends.torch_backend import TorchTrainer, TrainerConfig
from slime.rollout.sglang_rollout import sampling_params_from_args
from slime.utils.http_utils import post
from slime.utils.types import Sample

LIST = '<tool_call>\n{"name": "list_tools", "arguments": {}}\n</tool_call>'
DELETE = ('<tool_call>\n{"name": "call_tool", "arguments": {"tool_name": "deleteContext", '
          '"arguments": {"msg_id": 3}}}\n</tool_call>')


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from slime.engine.cpu_server import CPUEngine

    cpu = CPUEngine(tiny_model_dir, port=0, seed=0)
    url = cpu.start()
    yield url
    cpu.shutdown()


def forcing_policy(url: str, tokenizer, forced: list[str], requests: list[list[int]]):
    """The CPU engine as the policy; its first len(forced) turns are the given texts, scored by the engine."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    script = list(forced)

    async def turn(input_ids: list[int], params: dict) -> dict:
        requests.append(list(input_ids))
        if not script:
            return await post(f"{url}/generate", {"input_ids": input_ids, "sampling_params": params,
                                                  "return_logprob": True})
        ids = list(tokenizer.encode(script.pop(0), add_special_tokens=False)) + [end]
        scored = await post(f"{url}/generate", {
            "input_ids": input_ids + ids, "sampling_params": {**params, "max_new_tokens": 0},
            "return_logprob": True, "logprob_start_len": len(input_ids) - 1})
        first, *pairs = scored["meta_info"]["input_token_logprobs"]  # the first is None, as SGLang answers
        assert first[0] is None and [p[1] for p in pairs] == ids
        return {"meta_info": {"output_token_logprobs": [[p[0], p[1], None] for p in pairs],
                              "finish_reason": {"type": "stop", "matched": end}, "weight_version": "0"}}

    return turn


def run(args, policy) -> list[Sample]:
    meta = {"scenario": "library_lending_1", "task_idx": 3, "task": "", "task_type": "state_mutating"}
    sample = Sample(index=0, group_index=0, prompt="", metadata=meta)
    segments: list[Sample] = []

    async def go():
        out = await play(args, sample, sampling_params_from_args(args), policy, segments=segments,
                         body=play_managed)
        for s in [out, *segments]:
            s.reward = await reward(args, s)
        return [out, *segments]

    return asyncio.run(go())


@pytest.mark.parametrize("mode", ["snapshot", "per_turn"])
def test_every_sample_of_a_deleting_episode_matches_the_trainer_s_log_probs(tiny_model_dir, tokenizer, engine,
                                                                              tmp_path, mode):
    args = make_args(tiny_model_dir, engine, tmp_path, max_turns=4, terminate_on_invalid_call=False)
    for key, value in {"tools": True, "limit": 8000, "reserve": 48, "samples": mode, "max_samples": 8}.items():
        setattr(args, f"awm_context_{key}", value)
    args.calculate_per_token_loss, args.rollout_temperature = True, 1.0
    requests: list[list[int]] = []
    samples = run(args, forcing_policy(engine, tokenizer, [LIST, DELETE], requests))
    final = samples[0]
    assert final.metadata["awm"]["infra_error"] is None and final.metadata["awm"]["context"]["deletions"] == 1
    assert final.metadata["awm"]["turns"] >= 3  # two forced turns, then the model's own
    assert len(samples) == (2 if mode == "snapshot" else final.metadata["awm"]["turns"])
    assert "Content has been deleted" in tokenizer.decode(requests[2])
    catalogue = json.loads(final.metadata["awm_trace"]["messages"][2]["content"])
    assert catalogue["msg_id"] == 3 and "checkout_copy" not in tokenizer.decode(requests[2])
    trainer = TorchTrainer(str(tiny_model_dir), TrainerConfig(max_tokens_per_micro_batch=None))
    trained_lp = trainer.compute_log_probs(samples)
    for s, lp in zip(samples, trained_lp, strict=True):
        assert len(s.loss_mask) == len(s.rollout_log_probs) == len(lp) == s.response_length > 0
        pairs = [(a, b) for a, b, m in zip(lp, s.rollout_log_probs, s.loss_mask, strict=True) if m]
        assert pairs, "a sample with no model token"
        assert max(abs(float(a) - b) for a, b in pairs) < 1e-4
        assert tuple(s.tokens[: len(s.tokens) - s.response_length]) in {tuple(r) for r in requests}

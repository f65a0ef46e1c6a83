"""Warm start for AgentGym environments: SFT on episodes whose every action is a uniformly random one
of the actions the environment lists.

A small model built from scratch never writes a well-formed `act` call, so GRPO on it sees no reward
at all. These episodes teach the call format and the habit of copying one listed action into it, and
nothing about which action reaches the goal: the teacher draws uniformly among the listed actions, so
what the RL run learns past this start is its own. Each episode is played through the real rollout
(`awm_grpo.rollout.play`) against the real server, with `awm_grpo.warmstart.sft`'s teacher policy
answering each turn, so the SFT tokens are exactly what RL will produce; `awm_grpo.warmstart.sft.sft`
trains on them (masked next-token loss on the model tokens).

    python -m awm_grpo.agentgym.warmstart --prompts DIR/train.jsonl --base MODEL --out OUT \
        --envs '{"babyai": {"urls": ["http://127.0.0.1:36001"]}}'

The actions are read from the observation text (`Available actions: [...]`, as BabyAI writes them);
a turn whose context shows no such list (an observation cut at `--max-observation-tokens`) reuses
the last list that was whole.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from awm_grpo import protocol
from awm_grpo.agentgym.client import ACT_TOOL, parse_agentgym_envs
from awm_grpo.rollout import Policy, play

logger = logging.getLogger("awm_grpo.agentgym.warmstart")

_LIST = re.compile(r"Available actions: (\[[^\]\n]*\])")


def listed_actions(text: str) -> list[str] | None:
    """The last whole `Available actions: [...]` list in `text` (None: there is none)."""
    for match in reversed(_LIST.findall(text)):
        try:
            actions = json.loads(match)
        except json.JSONDecodeError:
            continue
        if isinstance(actions, list) and actions and all(isinstance(a, str) for a in actions):
            return actions
    return None


def act_reply(action: str, tool_mode: str) -> str:
    """One `act` call in the rollout's call format (meta: through call_tool)."""
    call = {"name": ACT_TOOL, "arguments": {"action": action}} if tool_mode == "native" else \
        {"name": protocol.CALL_TOOL, "arguments": {"tool_name": ACT_TOOL, "arguments": {"action": action}}}
    return "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"


def random_action_policy(tokenizer: Any, rng: random.Random, tool_mode: str) -> Policy:
    """Each turn: one action drawn uniformly from the context's last listed actions, written as an `act` call
    (closed with the end-of-turn token by `awm_grpo.warmstart.sft.teacher_policy`)."""
    from awm_grpo.warmstart.sft import teacher_policy

    async def turn(input_ids: list[int], params: dict[str, Any]) -> dict[str, Any]:
        actions = listed_actions(tokenizer.decode(input_ids))
        if actions is None:
            raise ValueError("the context lists no actions (`Available actions: [...]`): this warm start needs an "
                             "environment whose observations list them, whole (raise --max-observation-tokens)")
        return await teacher_policy(tokenizer, [act_reply(rng.choice(actions), tool_mode)])(input_ids, params)

    return turn


async def collect(args: argparse.Namespace, prompts: list[dict[str, Any]], repeats: int, seed: int) -> list[Any]:
    """Play every prompt `repeats` times with the random-action teacher; keep the episodes without infra errors."""
    from slime.rollout.sglang_rollout import GenerateState
    from slime.utils.types import Sample

    tokenizer = GenerateState(args).tokenizer
    rng = random.Random(seed)
    kept, stops = [], Counter()
    for r in range(repeats):
        for i, record in enumerate(prompts):
            sample = Sample(index=r * len(prompts) + i, group_index=i, prompt=record["text"],
                            metadata=dict(record["metadata"]))
            policy = random_action_policy(tokenizer, rng, args.awm_tool_mode)
            sample = await play(args, sample, {"max_new_tokens": args.rollout_max_response_len}, policy)
            awm = sample.metadata["awm"]
            stops[f"{awm['stop_reason']}/{awm['verdict']}"] += 1
            sample.metadata.pop("awm_trace", None)
            if awm["infra_error"] is None:
                kept.append(sample)
    logger.info("random-action episodes: %d kept of %d; stop/verdict: %s", len(kept), repeats * len(prompts),
                dict(stops))
    return kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m awm_grpo.agentgym.warmstart",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", required=True, help="prompt rows of awm_grpo.agentgym.client prompts")
    parser.add_argument("--envs", required=True, help="environment.agentgym_envs as JSON (the servers to play on)")
    parser.add_argument("--base", required=True, help="HF model folder to fine-tune (e.g. slime.models.tiny's)")
    parser.add_argument("--out", required=True, help="where to write the fine-tuned HF model folder")
    parser.add_argument("--repeats", type=int, default=2, help="random episodes per prompt")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--tool-mode", default="meta", choices=["meta", "native"])
    parser.add_argument("--max-turns", type=int, default=6, help="as the RL run's AWM_MAX_TURNS")
    parser.add_argument("--max-response-len", type=int, default=2048, help="as the RL run's")
    parser.add_argument("--max-observation-tokens", type=int, default=512, help="as the RL run's")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import torch
    from transformers import AutoModelForCausalLM

    from awm_grpo.warmstart.sft import Episodes, sft
    from slime.arguments import parse_args
    from slime.rollout.sglang_rollout import GenerateState

    torch.manual_seed(opts.seed)
    torch.set_num_threads(opts.threads)
    try:
        parse_agentgym_envs(opts.envs)
    except ValueError as exc:
        parser.error(str(exc))
    prompts = [json.loads(line) for line in Path(opts.prompts).read_text().splitlines() if line.strip()]
    if not prompts or any("agentgym" not in p.get("metadata", {}) for p in prompts):
        parser.error(f"{opts.prompts}: every row must be an AgentGym row (write them with "
                     "`python -m awm_grpo.agentgym.client prompts`)")
    args = parse_args(["--hf-checkpoint", opts.base, "--prompt-data", opts.prompts, "--rollout-batch-size", "1",
                       "--num-rollout", "1", "--rollout-max-response-len", str(opts.max_response_len)])
    args.awm_tool_mode, args.awm_agentgym_envs, args.awm_max_turns = opts.tool_mode, opts.envs, opts.max_turns
    args.awm_max_observation_tokens, args.awm_enable_thinking = opts.max_observation_tokens, False
    started = time.perf_counter()
    episodes = Episodes(None, 0, opts.max_response_len)
    episodes.real = asyncio.run(collect(args, prompts, opts.repeats, opts.seed))
    if not episodes.real:
        raise SystemExit("no episode was played without an infrastructure error: nothing to fine-tune on")
    tokens = sum(len(s.tokens) for s in episodes.real)
    complete = sum(s.metadata["awm"]["verdict"] == "complete" for s in episodes.real)
    logger.info("%d episodes (%d complete, %d tokens) in %.1f s", len(episodes.real), complete, tokens,
                time.perf_counter() - started)
    model = AutoModelForCausalLM.from_pretrained(opts.base, dtype=torch.float32)
    losses = sft(model, episodes, epochs=opts.epochs, lr=opts.lr, seed=opts.seed)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    GenerateState(args).tokenizer.save_pretrained(out)
    record = {"base": opts.base, "prompts": opts.prompts, "episodes": len(episodes.real), "complete": complete,
              "tokens": tokens, "repeats": opts.repeats, "epochs": opts.epochs, "lr": opts.lr, "losses": losses,
              "teacher": "uniformly random listed action", "tool_mode": opts.tool_mode, "max_turns": opts.max_turns,
              "max_observation_tokens": opts.max_observation_tokens, "seed": opts.seed,
              "seconds": round(time.perf_counter() - started, 1)}
    (out / "warmstart.json").write_text(json.dumps(record, indent=1))
    logger.info("saved %s (loss %.3f -> %.3f)", out, losses[0], losses[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""CPU engine on multi-turn conversations, with and without the prefix KV cache.

    .venv/bin/python benchmarks/multiturn_engine.py [--model DIR] [--episodes 16] [--turns 4]

Plays `episodes` concurrent conversations of `turns` turns each against a `CPUEngine`, the way the
awm_grpo rollout does: every turn sends the whole conversation so far (prompt, earlier outputs,
an observation of `obs-tokens` tokens) and generates `gen-tokens` tokens. Prints wall time,
generated tokens/s and the prompt tokens served from the cache, once with the cache off and once on.
Without --model it builds the tiny model (slime.models.tiny) in a temporary folder.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time

import httpx

from slime.engine.cpu_server import CPUEngine
from slime.models.tiny import build_tiny_model
from slime.utils.http_utils import post


async def conversation(url: str, rng: random.Random, args: argparse.Namespace, seed: int) -> tuple[int, int]:
    tokens = [rng.randrange(10, 4000) for _ in range(args.prompt_tokens)]
    generated = cached = 0
    for turn in range(args.turns):
        reply = await post(f"{url}/generate", {"input_ids": tokens, "return_logprob": True, "sampling_params": {
            "max_new_tokens": args.gen_tokens, "ignore_eos": True, "temperature": 1.0,
            "sampling_seed": seed * 100 + turn}})
        generated += len(reply["output_ids"])
        cached += reply["meta_info"]["cached_tokens"]
        tokens = tokens + reply["output_ids"] + [rng.randrange(10, 4000) for _ in range(args.obs_tokens)]
    return generated, cached


async def run(url: str, args: argparse.Namespace) -> tuple[float, int, int]:
    rng = random.Random(0)
    started = time.perf_counter()
    results = await asyncio.gather(*(conversation(url, random.Random(rng.random()), args, i)
                                     for i in range(args.episodes)))
    return time.perf_counter() - started, sum(r[0] for r in results), sum(r[1] for r in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="HF model folder (default: the tiny model, built here)")
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=400)
    parser.add_argument("--obs-tokens", type=int, default=120)
    parser.add_argument("--gen-tokens", type=int, default=40)
    parser.add_argument("--max-batch-size", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(build_tiny_model(f"{tmp}/tiny", seed=0))
        print(f"{args.episodes} conversations x {args.turns} turns, prompt {args.prompt_tokens}, "
              f"observation {args.obs_tokens}, {args.gen_tokens} new tokens a turn")
        print(f"{'prefix cache':>14} {'wall s':>8} {'gen tok/s':>10} {'cached prompt tokens':>22}")
        for budget in (0, 1 << 16):
            engine = CPUEngine(model, port=0, seed=0, max_batch_size=args.max_batch_size, prefix_cache_tokens=budget)
            url = engine.start()
            try:
                asyncio.run(run(url, argparse.Namespace(**{**vars(args), "episodes": 2, "turns": 1})))  # warm up
                httpx.post(f"{url}/flush_cache").raise_for_status()
                wall, generated, cached = asyncio.run(run(url, args))
            finally:
                engine.shutdown()
            print(f"{'on' if budget else 'off':>14} {wall:8.2f} {generated / wall:10.0f} {cached:22d}")


if __name__ == "__main__":
    main()

"""Over-sampling that stops: episodes played per trained episode, through the real rollout and the scripted engine.

    .venv/bin/python benchmarks/oversampling.py --episodes 256 --over-sampling 2 0.125 --token-latency-ms 18
    .venv/bin/python benchmarks/oversampling.py --rollout-fn before.py ...   # another generate_rollout, e.g.
                                                                             # `git show REV:slime/rollout/sglang_rollout.py`

Per over-sampling factor (`--over-sampling-batch-size` = factor x the batch's groups, at least 1 group) it runs
`--steps` steps of slime's rollout function, with the recipe's multi-turn rollout, the in-process environment
runtime and verifier, the reward and the profiles' dynamic filter (`check_reward_nonzero_std`), against the
scripted engine (`awm_grpo.loadtest.scripted_engine`, every reply held for its tokens x `--token-latency-ms`,
the per-sequence decode time of a GPU profile: docs/gpu.md) behind the slime router. "Played" counts episodes
that ended (one live-trace line each, `awm_grpo.traces`), so a rollout function without the episode metrics is
measured the same way; "trained" the episodes of the returned batch. A factor below 1 needs this script:
slime's argument check asks for over-sampling >= the batch size, so the script sets it after parsing.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from awm_grpo import env_client
from awm_grpo.loadtest.harness import ScriptedStack, rollout_args, write_inputs
from slime.rollout.data_source import RolloutDataSource, load_prompts
from slime.rollout.sglang_rollout import GenerateState, play_rollout

FILTER = "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std"


def load_rollout_fn(path: str | None) -> Any:
    if path is None:
        return play_rollout
    spec = importlib.util.spec_from_file_location("rollout_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.generate_rollout


def ended_episodes(trace_dir: Path) -> int:
    live = trace_dir / "live.jsonl"
    return sum(1 for line in live.read_text().splitlines() if json.loads(line)["kind"] == "rollout") \
        if live.exists() else 0


async def run_steps(fn: Any, args: argparse.Namespace, steps: int, warmup_groups: int) -> list[dict[str, float]]:
    GenerateState.clear_instances()
    source = RolloutDataSource(load_prompts(args, args.prompt_data, GenerateState(args).tokenizer),
                               args.n_samples_per_prompt, shuffle=True, seed=0)
    trace_dir = Path(args.awm_trace_dir)
    batch = args.rollout_batch_size, args.over_sampling_batch_size
    args.rollout_batch_size = args.over_sampling_batch_size = warmup_groups  # start workers, load scenarios
    try:
        await fn(args, -1, source)
    finally:
        args.rollout_batch_size, args.over_sampling_batch_size = batch
    rows = []
    for step in range(steps):
        before, started = ended_episodes(trace_dir), time.perf_counter()
        out = await fn(args, step, source)
        wall = time.perf_counter() - started
        await asyncio.sleep(0.5)  # episodes cancelled at the end write nothing; let the live file settle
        m = out.metrics or {}
        rows.append({"played": ended_episodes(trace_dir) - before, "trained": sum(len(g) for g in out.samples),
                     "aborted": m.get("rollout/episodes_aborted", float("nan")),
                     "played_metric": m.get("rollout/episodes_played", float("nan")),
                     "filtered": m.get("rollout/groups_filtered", float("nan")),
                     "filtered_episodes": m.get("rollout/episodes_filtered", float("nan")), "wall_s": wall})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--episodes", type=int, default=256, help="episodes trained a step")
    p.add_argument("--n-samples", type=int, default=4, help="group size")
    p.add_argument("--over-sampling", type=float, nargs="+", default=[2.0, 0.125],
                   help="over-sampling batch size as a factor of the batch's groups")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--token-latency-ms", type=float, default=18.0, help="h100 profile: 18, h200: 24 (docs/gpu.md)")
    p.add_argument("--think-words", type=int, default=16)
    p.add_argument("--turns", type=int, default=None, help="stretch every episode to this many model turns")
    p.add_argument("--env-workers", type=int, default=2)
    p.add_argument("--wrong-by-arrival", action="store_true",
                   help="the scripted engine's default: every 4th episode to arrive plays wrong (not comparable "
                        "between runs); by default the wrong episodes are fixed per sample (its sampling_seed)")
    p.add_argument("--no-filter", action="store_true", help="keep every group (no dynamic filter)")
    p.add_argument("--rollout-fn", default=None, help="a Python file whose generate_rollout to measure instead")
    opts = p.parse_args()
    fn = load_rollout_fn(opts.rollout_fn)
    with tempfile.TemporaryDirectory(prefix="oversampling-") as tmp:
        from slime.models.tiny import build_tiny_model

        model = str(build_tiny_model(Path(tmp) / "tiny", seed=0))
        prompts, scripts, tasks = write_inputs(None, Path(tmp) / "inputs", turns=opts.turns)
        padding = {"max_repeated_calls": opts.turns} if opts.turns else {}
        print(f"{tasks} tasks; {opts.episodes} episodes trained a step in groups of {opts.n_samples}; "
              f"{opts.token_latency_ms:g} ms a token, {opts.think_words} thinking words a turn; "
              f"filter {'none' if opts.no_filter else FILTER.rsplit('.', 1)[1]}; rollout "
              f"{opts.rollout_fn or 'slime.rollout.sglang_rollout'}; {os.cpu_count()} CPUs")
        with ScriptedStack(model, scripts, token_latency_ms=opts.token_latency_ms, think_words=opts.think_words,
                           wrong_by_seed=not opts.wrong_by_arrival) as stack:
            for factor in opts.over_sampling:
                args = rollout_args(stack, model, prompts, Path(tmp) / f"traces-{factor}", episodes=opts.episodes,
                                    n_samples=opts.n_samples, env_workers=opts.env_workers, **padding)
                groups = args.rollout_batch_size
                args.over_sampling_batch_size = max(1, round(groups * factor))
                args.dynamic_sampling_filter_path = None if opts.no_filter else FILTER
                args.max_step_retries = 3
                rows = asyncio.run(run_steps(fn, args, opts.steps, warmup_groups=8))
                env_client.close_runtimes()
                played = sum(r["played"] for r in rows)
                trained = sum(r["trained"] for r in rows)
                print(f"\n== over-sampling {args.over_sampling_batch_size} groups ({factor:g} x {groups}) ==")
                for i, r in enumerate(rows):
                    print(f"  step {i}: played {r['played']} (metric {r['played_metric']:g}), trained {r['trained']}, "
                          f"aborted {r['aborted']:g}, groups filtered {r['filtered']:g}, wall {r['wall_s']:.1f} s")
                needed = trained + sum(r["filtered_episodes"] for r in rows)
                print(f"  played per trained episode: {played / trained:.3f}  "
                      f"(wall {sum(r['wall_s'] for r in rows) / len(rows):.1f} s a step); played per episode "
                      f"trained or filtered: {played / needed:.3f}")


if __name__ == "__main__":
    main()

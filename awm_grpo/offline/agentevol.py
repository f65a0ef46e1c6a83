"""AgentEvol (AgentGym, Xi et al. 2024): explore with the current policy, keep what the verifier accepts,
fine-tune, repeat.

    python -m awm_grpo.offline.agentevol --model WS --prompts SPLITS/train.jsonl --out OUT [--iterations 2 --samples 4]

The starting checkpoint plays the part of the paper's behavioural-cloning agent (a warm start of
awm_grpo.warmstart is exactly that: SFT on the reference solutions). Iteration m = 1..M:

1. explore: the policy of iteration m-1 (the start for m = 1) plays `--samples` episodes of every task
   through the training rollout (awm_grpo.offline.explore; the runtime YAML of a CPU GRPO run,
   temperature 1.0); infrastructure failures are dropped and counted;
2. filter: keep the episodes the verifier accepts (verdict `complete`), at most `--keep-per-task` per
   task (the first ones in play order; AgentGym's filter keeps one per task);
3. learn: fine-tune the STARTING checkpoint, not the previous iteration's policy, on the reference
   episodes D_s plus this iteration's accepted episodes. AgentGym's script does the same with its
   base model: every iteration trains `model_train_path` (the same base each time) on the base
   trajectory set merged with the newly accepted ones, so one iteration's errors do not compound.
   Upstream's base is the model before behavioural cloning and each iteration redoes the whole BC run;
   by default ours is the warm start itself (already BC on D_s) with a short fine-tune (`--epochs`),
   which fits the CPU budget; `--train-from ws-base --epochs 40 --lr 2e-3` redoes the warm start's
   SFT from its from-scratch base instead, as upstream does. D_s is the train tasks' reference
   solutions played through the rollout by the warm start's teacher (awm_grpo.warmstart.sft.collect,
   with the warm start's list_tools setting); `--no-reference` trains on the accepted episodes alone.
   The loss is awm_grpo.warmstart.sft.sft's: masked next-token loss on the model's tokens only;
4. the result is iteration m's policy (OUT/iter_<m>/model); the last one is copied to OUT/model.

OUT/agentevol.json holds per iteration: episodes played, accepted, the SFT losses and the wall time;
OUT/awm_runtime.yaml the runtime keys (`python -m awm_grpo.eval --model OUT/model --config
OUT/awm_runtime.yaml` plays as GRPO's eval).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from awm_grpo.eval import policy_runtime
from awm_grpo.offline.explore import (
    Exploration,
    Trajectory,
    check_checkpoint,
    common_flags,
    explore,
    load_model,
    save_model,
    setup,
)
from awm_grpo.warmstart.sft import Episodes, collect, sft
from slime.utils.types import Sample

DEFAULT_LR = 5e-4


def accepted(found: Exploration, keep_per_task: int) -> list[Trajectory]:
    """The verified successes, at most `keep_per_task` per task, in play order."""
    kept: dict[tuple[str, int], int] = {}
    out = []
    for t in found.trajectories:
        if t.success and kept.get(t.task, 0) < keep_per_task:
            kept[t.task] = kept.get(t.task, 0) + 1
            out.append(t)
    return out


def _tokenizer_bytes(model: str | Path) -> bytes | None:
    path = Path(model) / "tokenizer.json"
    return path.read_bytes() if path.is_file() else None


def warmstart_list_tools(model: str | Path) -> bool:
    """Whether the warm start's reference episodes opened with list_tools (its warmstart.json; default True)."""
    record = Path(model) / "warmstart.json"
    if record.is_file():
        return bool(json.loads(record.read_text()).get("list_tools", True))
    return True


def reference_episodes(model: str, prompts: str, records: list[dict[str, Any]], keys: dict[str, Any],
                       max_response_len: int, seed: int) -> tuple[list[Sample], int]:
    """D_s: the tasks' reference solutions played through the rollout under the runtime keys, the verified
    ones kept: (episodes, how many tasks gave none)."""
    with policy_runtime(model, prompts, config=keys, seed=seed, max_response_len=max_response_len,
                        serve=False) as args:
        episodes = asyncio.run(collect(args, records, keys.get("awm_data_dir"),
                                       list_tools=warmstart_list_tools(model), seed=seed))
    return episodes.real, len(records) - len(episodes.real)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m awm_grpo.offline.agentevol",
                                     description=__doc__.split("\n\n")[0])
    common_flags(parser, DEFAULT_LR)
    parser.add_argument("--iterations", type=int, default=2, help="explore / filter / fine-tune rounds")
    parser.add_argument("--samples", type=int, default=4, help="episodes per task each iteration")
    parser.add_argument("--keep-per-task", type=int, default=1, help="accepted episodes kept per task and iteration")
    parser.add_argument("--epochs", type=int, default=3, help="SFT epochs each iteration")
    parser.add_argument("--batch-size", type=int, default=1, help="episodes per SFT step")
    parser.add_argument("--train-from", default=None, help="HF folder every iteration fine-tunes (default: --model; "
                        "e.g. the warm start's from-scratch base, ws-base, to redo its SFT as AgentGym does)")
    parser.add_argument("--reference", action=argparse.BooleanOptionalAction, default=True,
                        help="merge the reference episodes D_s into each iteration's data (AgentGym does)")
    opts = parser.parse_args(argv)
    if opts.lr <= 0:
        raise SystemExit(f"--lr {opts.lr}: use > 0")
    for name in ("iterations", "samples", "keep_per_task", "epochs", "batch_size"):
        if getattr(opts, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} {getattr(opts, name)}: use >= 1")
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    started = time.perf_counter()
    out, records, keys = setup(opts)
    start = str(opts.model)
    trained = str(check_checkpoint(opts.train_from)) if opts.train_from else start
    if _tokenizer_bytes(trained) != _tokenizer_bytes(start):
        raise SystemExit(f"--train-from {trained} has another tokenizer than --model {start}: the explored token ids "
                         "would mean other text to it; pass the warm start's own base (OUT-base of awm_grpo.warmstart)")
    reference: list[Sample] = []
    dropped_reference = 0
    if opts.reference:
        reference, dropped_reference = reference_episodes(start, opts.prompts, records, keys, opts.max_response_len,
                                                          opts.seed)
        print(f"[agentevol] D_s: {len(reference)} verified reference episodes ({dropped_reference} tasks without "
              "one)", file=sys.stderr)
    policy = start
    iterations: list[dict[str, Any]] = []
    for m in range(1, opts.iterations + 1):
        it_started = time.perf_counter()
        found = explore(policy, opts.prompts, records, samples=opts.samples, temperature=opts.temperature,
                        seed=opts.seed + 1000 * (m - 1), config=keys, max_response_len=opts.max_response_len,
                        concurrency=opts.concurrency, desc=f"explore (iteration {m})")
        kept = accepted(found, opts.keep_per_task)
        data = Episodes(None, 0, opts.max_response_len)
        data.real = reference + [t.sample for t in kept]
        print(f"[agentevol] iteration {m}: {found.played} episodes, {found.successes} successes, {len(kept)} kept; "
              f"fine-tuning {trained} on {len(data.real)} episodes", file=sys.stderr)
        if not data.real:
            raise SystemExit(f"iteration {m}: the verifier accepted no episode and there is no reference episode to "
                             "train on: start from a policy that solves some tasks (a warm start: python -m "
                             "awm_grpo.warmstart), play more episodes (--samples), or keep --reference on")
        model = load_model(trained)
        train_started = time.perf_counter()
        losses = sft(model, data, epochs=opts.epochs, lr=opts.lr, seed=opts.seed + m, batch_size=opts.batch_size)
        train_s = time.perf_counter() - train_started
        policy = str(save_model(model, start, out / f"iter_{m}" / "model"))
        iterations.append({
            "iteration": m, "explored_with": "start" if m == 1 else f"iter_{m - 1}",
            "exploration": found.summary(), "episodes": found.played, "accepted": len(kept),
            "accepted_tasks": len({t.task for t in kept}), "train_episodes": len(data.real), "losses": losses,
            "loss": losses[-1], "wall_s": {"explore": round(found.wall_s, 1), "train": round(train_s, 1),
                                           "total": round(time.perf_counter() - it_started, 1)},
            "infra_failures": found.infra_failures,
            "trajectories": [t.record() for t in found.trajectories]})
        (out / "agentevol.json").write_text(json.dumps(_result(opts, reference, dropped_reference, iterations,
                                                               started), indent=1))
    final = out / "model"
    if final.exists():
        shutil.rmtree(final)
    shutil.copytree(policy, final)
    (out / "agentevol.json").write_text(json.dumps(_result(opts, reference, dropped_reference, iterations, started),
                                                   indent=1))
    print(f"[agentevol] saved {final}; evaluate with python -m awm_grpo.eval --model {final} --config "
          f"{out / 'awm_runtime.yaml'} --split SPLITS/test.jsonl", file=sys.stderr)
    return 0


def _result(opts: argparse.Namespace, reference: list[Sample], dropped_reference: int,
            iterations: list[dict[str, Any]], started: float) -> dict[str, Any]:
    return {"method": "agentevol", "model": str(opts.model), "prompts": str(opts.prompts), "seed": opts.seed,
            "hyper": {k: getattr(opts, k) for k in ("iterations", "samples", "keep_per_task", "epochs", "batch_size",
                                                     "lr", "reference", "temperature", "max_response_len", "limit", "tasks",
                                                     "threads")},
            "trains_from": str(opts.train_from or opts.model), "trains_from_note": "the same folder every iteration "
            "(AgentGym), never the previous iteration's policy",
            "reference_episodes": len(reference), "reference_dropped_tasks": dropped_reference,
            "episodes_played": sum(it["episodes"] for it in iterations), "iterations": iterations,
            "wall_s": round(time.perf_counter() - started, 1)}


if __name__ == "__main__":
    sys.exit(main())

"""The context-budget comparison: GRPO with and without the memory tools under one context limit, per seed.

    python -m awm_grpo.context.study --start runs/awm_grpo/methods_ps/ws0 --data runs/awm_grpo/methods_ps/P \\
        --splits runs/awm_grpo/methods_r2/PS --out runs/awm_grpo/context_study          # docs/results.md

Each run is the recipe (`awm_grpo/run_awm_grpo.sh`) from the same start on the same train prompts for `--steps`
steps, evaluated before and after training on the held-out tasks (val + test of `--splits`) under the same
limit, with the arm's tools: `tools` (AWM_CONTEXT_TOOLS=1) or `none`; `tools_wide`, a control, is `tools` with
the limit raised by what the tools' instructions and the empty notes block cost in the prompt (counted with the
start's tokenizer), so that it has the room `none` has for the episode itself. A run whose folder already has its
final evaluation is not run again. The report (`OUT/study.json`, `OUT/study.md`) gives per run the held-out
success before and after, training success, how often episodes ran out of context, deletions and notes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from awm_grpo.launch.processes import recipe_env, run_logged

REPO = Path(__file__).resolve().parents[2]
ARMS = ("none", "tools", "tools_wide")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m awm_grpo.context.study", description=__doc__.split("\n\n")[0])
    p.add_argument("--start", required=True, help="the model every run starts from (an HF folder)")
    p.add_argument("--data", help="AWM data folder of the tasks (AWM_DATA_DIR)")
    p.add_argument("--splits", help="folder with train.jsonl, val.jsonl, test.jsonl (data_prep's): train on train, "
                                    "evaluate on val + test")
    p.add_argument("--prompt-file", help="instead of --splits: a prompt file (JSONL or parquet, the recipe's or "
                                         "StateLM's layout: PROMPT_FILE) to train on ...")
    p.add_argument("--eval-prompt-file", help="... and the one to evaluate on (EVAL_PROMPT_FILE)")
    p.add_argument("--start-tools", help="the tools arm's start, when it differs (a warm start shown the tools)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--arms", nargs="+", default=["none", "tools"], choices=ARMS)
    p.add_argument("--limit", type=int, default=768, help="context limit, tokens (AWM_CONTEXT_LIMIT)")
    p.add_argument("--reserve", type=int, default=128, help="tokens kept for the next turn (AWM_CONTEXT_RESERVE)")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=8, help="prompts per step (4 episodes each)")
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--max-turns", type=int, default=10)
    p.add_argument("--timeout", type=float, default=3600, help="seconds per run")
    p.add_argument("--report-only", action="store_true")
    return p.parse_args(argv)


def prompt_files(opts: argparse.Namespace, out: Path) -> tuple[Path, Path]:
    """(train, evaluation) prompt files: --prompt-file / --eval-prompt-file, or from --splits OUT/train.jsonl and
    OUT/heldout.jsonl (val + test: the evaluation set every run scores)."""
    if not opts.splits:
        return Path(opts.prompt_file), Path(opts.eval_prompt_file)
    src = Path(opts.splits)
    (out / "train.jsonl").write_text((src / "train.jsonl").read_text())
    (out / "heldout.jsonl").write_text((src / "val.jsonl").read_text() + (src / "test.jsonl").read_text())
    return out / "train.jsonl", out / "heldout.jsonl"


def instruction_tokens(model: str | Path) -> int:
    """Prompt tokens the memory tools add: their system-prompt paragraph and the (empty) notes block."""
    from transformers import AutoTokenizer

    from awm_grpo.context.history import memory_block
    from awm_grpo.context.loop import MEMORY_PREAMBLE

    tokenizer = AutoTokenizer.from_pretrained(model)
    return len(tokenizer.encode(MEMORY_PREAMBLE + "\n\n", add_special_tokens=False)) \
        + len(tokenizer.encode(memory_block({}), add_special_tokens=False))


def run_env(opts: argparse.Namespace, out: Path, files: tuple[Path, Path], arm: str, seed: int) -> dict[str, str]:
    start = opts.start_tools if arm != "none" and opts.start_tools else opts.start
    limit = opts.limit + (instruction_tokens(start) if arm == "tools_wide" else 0)
    data = {"PROMPT_FILE": str(files[0].resolve()), "EVAL_PROMPT_FILE": str(files[1].resolve())}
    if opts.data:
        data["AWM_DATA_DIR"] = str(Path(opts.data).resolve())
    return {"HF_CKPT": str(Path(start).resolve()), **data, "SAVE_DIR": str((out / f"{arm}-s{seed}").resolve()),
            "LR": str(opts.lr), "AWM_INVALID_CALL_PENALTY": "0", "NUM_ROLLOUT": str(opts.steps),
            "ROLLOUT_BATCH_SIZE": str(opts.batch), "EVAL_INTERVAL": str(opts.steps),
            "SKIP_EVAL_BEFORE_TRAIN": "false", "AWM_MAX_TURNS": str(opts.max_turns), "TRAIN_SEED": str(seed),
            "AWM_CONTEXT_LIMIT": str(limit), "AWM_CONTEXT_RESERVE": str(opts.reserve),
            "AWM_CONTEXT_TOOLS": "0" if arm == "none" else "1", "SAVE_INTERVAL": str(opts.steps)}


def metrics(run: Path) -> list[dict[str, Any]]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def evals(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {int(r["step"]): r for r in rows if "eval_awm/val/success_rate" in r}


def summarize(run: Path, steps: int) -> dict[str, Any] | None:
    rows = metrics(run)
    by_step = evals(rows)
    if 0 not in by_step or steps not in by_step:
        return None
    train = [r for r in rows if "awm/success_rate" in r]
    before, after = by_step[0], by_step[steps]

    def ctx(row: dict[str, Any], prefix: str, key: str) -> float:
        return float(row.get(f"{prefix}/context/{key}", 0.0))

    runtime = run / "awm_runtime.yaml"
    limit = yaml.safe_load(runtime.read_text()).get("awm_context_limit") if runtime.exists() else None
    return {"limit": limit, "before": before["eval_awm/val/success_rate"], "after": after["eval_awm/val/success_rate"],
            "train_success": statistics.mean(r["awm/success_rate"] for r in train) if train else None,
            "out_of_context_after": after.get("eval_awm/val/stop/context_budget", 0.0),
            "out_of_context_train": statistics.mean(r.get("awm/stop/context_budget", 0.0) for r in train)
            if train else None,
            "deletions_per_episode_train": statistics.mean(ctx(r, "awm", "deletions_mean") for r in train)
            if train else None,
            "deleting_episodes_train": statistics.mean(ctx(r, "awm", "deleting_episodes") for r in train)
            if train else None,
            "notes_per_episode_train": statistics.mean(ctx(r, "awm", "notes_mean") for r in train) if train else None,
            "samples_per_episode_train": statistics.mean(ctx(r, "awm", "samples_mean") for r in train)
            if train else None,
            "final_context_after": ctx(after, "eval_awm/val", "final_tokens_mean"),
            "episodes_after": after.get("eval_awm/val/episodes")}


def report(opts: argparse.Namespace, out: Path) -> dict[str, Any]:
    runs = {f"{arm}-s{seed}": summarize(out / f"{arm}-s{seed}", opts.steps) for arm in opts.arms for seed in opts.seeds}
    arms: dict[str, Any] = {}
    for arm in opts.arms:
        done = [runs[f"{arm}-s{s}"] for s in opts.seeds if runs[f"{arm}-s{s}"]]
        if done:
            afters, gains = [r["after"] for r in done], [r["after"] - r["before"] for r in done]
            arms[arm] = {"seeds": len(done), "after_mean": statistics.mean(afters),
                         "after_std": statistics.stdev(afters) if len(afters) > 1 else 0.0,
                         "gain_mean": statistics.mean(gains), "before_mean": statistics.mean(r["before"] for r in done)}
    result = {"limit": opts.limit, "reserve": opts.reserve, "steps": opts.steps, "batch": opts.batch, "lr": opts.lr,
              "runs": runs, "arms": arms, "date": time.strftime("%Y-%m-%d")}
    (out / "study.json").write_text(json.dumps(result, indent=1))
    (out / "study.md").write_text(markdown(result))
    return result


def markdown(result: dict[str, Any]) -> str:
    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{100 * x:.1f}%"

    lines = [f"Context limit {result['limit']} tokens ({result['reserve']} reserved), {result['steps']} GRPO steps, "
             f"{result['date']}.", "",
             "| run | limit | held-out before | after | train success | out of context (train) | deleting episodes | "
             "deletions / episode | notes / episode | samples / episode |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in result["runs"].items():
        if r is None:
            lines.append(f"| {name} | not run | | | | | | | | |")
            continue
        lines.append(f"| {name} | {r['limit']} | {pct(r['before'])} | {pct(r['after'])} | {pct(r['train_success'])} | "
                     f"{pct(r['out_of_context_train'])} | {pct(r['deleting_episodes_train'])} | "
                     f"{r['deletions_per_episode_train']:.2f} | {r['notes_per_episode_train']:.2f} | "
                     f"{r['samples_per_episode_train']:.2f} |")
    lines += ["", "| arm | seeds | held-out before | after (mean +- std) | gain |", "|---|---|---|---|---|"]
    for arm, a in result["arms"].items():
        lines.append(f"| {arm} | {a['seeds']} | {pct(a['before_mean'])} | {pct(a['after_mean'])} +- "
                     f"{100 * a['after_std']:.1f} | {100 * a['gain_mean']:+.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    if not opts.report_only:
        if bool(opts.splits) == bool(opts.prompt_file and opts.eval_prompt_file):
            raise SystemExit("give --splits, or --prompt-file and --eval-prompt-file")
        files = prompt_files(opts, out)
        for seed in opts.seeds:
            for arm in opts.arms:
                run = out / f"{arm}-s{seed}"
                if summarize(run, opts.steps) is not None:
                    continue
                print(f"[study] {arm} seed {seed} ...", flush=True)
                started = time.time()
                rc = run_logged(["bash", str(REPO / "awm_grpo" / "run_awm_grpo.sh")], out / f"{arm}-s{seed}.log",
                                timeout_s=opts.timeout, env=recipe_env(run_env(opts, out, files, arm, seed)))
                print(f"[study] {arm} seed {seed}: rc {rc} in {time.time() - started:.0f} s", flush=True)
    result = report(opts, out)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

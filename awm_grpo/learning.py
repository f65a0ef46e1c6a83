"""Does GRPO learn on CPU, and by how much: W warm starts x G GRPO seeds, before and after on the same held-out tasks.

    python -m awm_grpo.learning --out runs/awm_grpo/learning            # 3 warm starts x 2 GRPO seeds (docs/results.md)
    python -m awm_grpo.learning --out DIR --report-only                 # rewrite the table of a finished run

One run of the recipe cannot carry a headline: the gain moves with the warm start (docs/results.md).
So every figure here comes from W warm starts (`--warm-seeds`), each trained by G GRPO runs
(`--grpo-seeds`) of a fixed number of steps (not minutes, so a busy machine changes the wall time,
not the result), and every policy is evaluated on the same held-out tasks with the same samples
(`--eval-seed`, `--eval-n`, `--eval-temperature`). Stages, each skipped when its output exists (an
interrupted run resumes where it stopped):

1. data: the practice set `P`, the practice set plus renamed worlds `PW`, their task splits `PS` /
   `PWS` (held-out = PS val + test; PWS has the same val/test tasks and the worlds in train);
2. warm starts `ws<w>`: `python -m awm_grpo.warmstart` on PS (one torch thread each, so
   `--warm-jobs 2` runs two side by side on two cores);
3. GRPO runs `rl-ws<w>-s<g>`: `awm_grpo/run_awm_grpo.sh` on PW from warm start w, seed g;
4. evaluation: every warm start and every trained policy on the held-out tasks (`eval/*.jsonl`);
5. report: `learning.json` and `learning.md`.

Statistics. before(w) and after(w, g) are held-out success rates. The gain of a run is
`after(w, g) - before(w)`; the table gives mean +- std over all W x G runs. The GRPO seeds of one
warm start share it, so the independent unit is the warm start: the paired t-test compares
`mean_g after(w, g)` with `before(w)` over the W starts (W - 1 degrees of freedom), and a
sign-flip test compares per-task success after (pooled over runs) with before (pooled over starts)
over the held-out tasks (awm_grpo.recovery.report).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from awm.data import read_jsonl

from awm_grpo.launch.processes import Children, recipe_env, run_logged
from awm_grpo.recovery import report

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "runs" / "awm_grpo" / "learning"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m awm_grpo.learning", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(DEFAULT_OUT), help=f"output folder (default {DEFAULT_OUT})")
    p.add_argument("--warm-seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--grpo-seeds", type=int, nargs="+", default=[1234, 7], help="launcher TRAIN_SEED of each run")
    p.add_argument("--warm-jobs", type=int, default=1, help="warm starts run side by side (one thread each)")
    p.add_argument("--worlds", type=int, default=6, help="renamed worlds of each scenario in PW's train split")
    p.add_argument("--epochs", type=int, default=10, help="warm start: SFT epochs (docs/results.md used 20)")
    p.add_argument("--layers", type=int, default=6, help="warm start: transformer layers of the from-scratch model")
    p.add_argument("--drill", type=int, default=3000, help="warm start: copy-drill episodes (name,value,id)")
    p.add_argument("--counterfactuals", type=int, default=3, help="warm start: renamed copies per episode")
    p.add_argument("--steps", type=int, default=150, help="GRPO steps per run (4 prompts x 4 samples a step)")
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--eval-n", type=int, default=4, help="samples per held-out task")
    p.add_argument("--eval-temperature", type=float, default=1.0, help="the training temperature")
    p.add_argument("--eval-seed", type=int, default=0)
    p.add_argument("--eval-limit", type=int, default=0, help="only the first N held-out tasks (0: all)")
    p.add_argument("--timeout", type=float, default=3 * 3600, help="seconds per child (warm start, run, eval)")
    p.add_argument("--report-only", action="store_true", help="rewrite learning.md from OUT/eval/*.jsonl")
    return p.parse_args(argv)


def prepare_data(opts: argparse.Namespace, out: Path) -> None:
    """P, PW, PS, PWS and heldout.jsonl (PS val + test), each built only when missing."""
    from awm.scenarios import build

    from awm_grpo.data_prep import prepare

    if not (out / "P" / "gen_tasks.jsonl").exists():
        build.main(["--practice", str(out / "P")])
    if not (out / "PW" / "gen_tasks.jsonl").exists():
        build.main(["--practice", str(out / "PW"), "--worlds", str(opts.worlds)])
    for data, splits in (("P", "PS"), ("PW", "PWS")):
        if not (out / splits / "split_info.json").exists():
            prepare(out / splits, data_dir=out / data, split_by="task")
    rows = [r for name in ("val", "test") for r in read_jsonl(out / "PS" / f"{name}.jsonl")]
    (out / "heldout.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def warm_start_command(opts: argparse.Namespace, out: Path, seed: int) -> list[str]:
    """The start of docs/results.md's GRPO figure (digits as tokens, the number-copying drill), seeded."""
    return [sys.executable, "-m", "awm_grpo.warmstart", "--data", str(out / "PS"), "--data-dir", str(out / "P"),
            "--layers", str(opts.layers), "--split-digits", "--drill", str(opts.drill), "--drill-kinds",
            "name,value,id", "--counterfactuals", str(opts.counterfactuals), "--epochs", str(opts.epochs),
            "--no-list-tools", "--seed", str(seed), "--out", str(out / f"ws{seed}")]


def grpo_env(opts: argparse.Namespace, out: Path, warm: int, seed: int) -> dict[str, str]:
    """The launcher's knobs of one run (docs/results.md's command, with a step budget)."""
    return {"HF_CKPT": str(out / f"ws{warm}"), "AWM_DATA_DIR": str(out / "PW"), "AWM_SPLITS_DIR": str(out / "PWS"),
            "SAVE_DIR": str(out / f"rl-ws{warm}-s{seed}"), "LR": str(opts.lr), "AWM_INVALID_CALL_PENALTY": "0",
            "NUM_ROLLOUT": str(opts.steps), "EVAL_INTERVAL": "100000", "SKIP_EVAL_BEFORE_TRAIN": "true",
            "TRAIN_SEED": str(seed)}


def finished(run_dir: Path, steps: int) -> bool:
    """A run is done when its latest checkpoint is its last step; an interrupted one is started again and
    resumes from its latest checkpoint (the launcher loads SAVE_DIR)."""
    latest = run_dir / "latest_checkpointed_iteration.txt"
    return latest.exists() and int(latest.read_text().strip()) >= steps - 1  # rollout ids count from 0


def trained_model(run_dir: Path) -> Path:
    """The last checkpoint's HF folder of a finished launcher run."""
    latest = run_dir / "latest_checkpointed_iteration.txt"
    if not latest.exists():
        raise SystemExit(f"{run_dir} has no checkpoint: the GRPO run failed (see {run_dir}.log)")
    return run_dir / f"iter_{int(latest.read_text().strip()):07d}" / "model"


def eval_command(opts: argparse.Namespace, out: Path, model: Path, config: Path, dest: Path) -> list[str]:
    return [sys.executable, "-m", "awm_grpo.eval", "--split", str(out / "heldout.jsonl"), "--model", str(model),
            "--config", str(config), "--n", str(opts.eval_n), "--temperature", str(opts.eval_temperature),
            "--max-response-len", "2048", "--concurrency", "16", "--seed", str(opts.eval_seed),
            "--limit", str(opts.eval_limit), "--out", str(dest)]


def _run(name: str, cmd: list[str], log: Path, opts: argparse.Namespace, env: dict[str, str] | None = None) -> None:
    started = time.perf_counter()
    print(f"[learning] {name}: {' '.join(cmd)} (log {log})", file=sys.stderr)
    rc = run_logged(cmd, log, timeout_s=opts.timeout, env=recipe_env(env), cwd=REPO)
    if rc != 0:
        raise SystemExit(f"{name} failed (rc={rc}): see {log}")
    print(f"[learning] {name} done in {(time.perf_counter() - started) / 60:.1f} min", file=sys.stderr)


def warm_starts(opts: argparse.Namespace, out: Path) -> None:
    """Every missing warm start, `--warm-jobs` at a time."""
    todo = [w for w in opts.warm_seeds if not (out / f"ws{w}" / "warmstart.json").exists()]
    while todo:
        batch, todo = todo[: opts.warm_jobs], todo[opts.warm_jobs:]
        children, started = Children(), time.perf_counter()
        procs = []
        for w in batch:
            log = out / f"ws{w}.log"
            print(f"[learning] warm start {w} (log {log})", file=sys.stderr)
            with open(log, "w") as fh:
                procs.append((w, log, children.start(f"ws{w}", warm_start_command(opts, out, w), cwd=REPO,
                                                     env=recipe_env(), stdout=fh, stderr=fh)))
        try:
            for w, log, proc in procs:
                if proc.wait(timeout=opts.timeout) != 0:
                    raise SystemExit(f"warm start {w} failed (rc={proc.returncode}): see {log}")
        finally:
            children.stop_all(grace_s=10)
        print(f"[learning] warm starts {batch} done in {(time.perf_counter() - started) / 60:.1f} min",
              file=sys.stderr)


def run_all(opts: argparse.Namespace, out: Path) -> None:
    """Stages 1-4, skipping what exists."""
    prepare_data(opts, out)
    warm_starts(opts, out)
    (out / "eval").mkdir(exist_ok=True)
    for w in opts.warm_seeds:
        config = None
        for g in opts.grpo_seeds:
            run_dir = out / f"rl-ws{w}-s{g}"
            if not finished(run_dir, opts.steps):
                _run(f"GRPO ws{w} seed {g}", ["bash", str(REPO / "awm_grpo" / "run_awm_grpo.sh")],
                     out / f"rl-ws{w}-s{g}.log", opts, grpo_env(opts, out, w, g))
            config = config or run_dir / "awm_runtime.yaml"  # the same awm_* keys for every run of a start
            dest = out / "eval" / f"rl-ws{w}-s{g}.jsonl"
            if not dest.exists():
                _run(f"eval ws{w} seed {g}", eval_command(opts, out, trained_model(run_dir), config, dest),
                     out / "eval" / f"rl-ws{w}-s{g}.log", opts)
        dest = out / "eval" / f"ws{w}.jsonl"
        if config is not None and not dest.exists():
            _run(f"eval warm start {w}", eval_command(opts, out, out / f"ws{w}", config, dest),
                 out / "eval" / f"ws{w}.log", opts)


def success(records: list[dict[str, Any]]) -> float:
    """Held-out success rate over scored episodes (infrastructure failures left out, never scored 0)."""
    scored = [r for r in records if not r.get("infra_error")]
    if not scored:
        raise ValueError("no scored episode: every one was an infrastructure failure")
    return sum(r.get("verdict") == "complete" for r in scored) / len(scored)


def summarize(before: dict[int, list[dict[str, Any]]],
              after: dict[tuple[int, int], list[dict[str, Any]]]) -> dict[str, Any]:
    """The table's figures from the evaluation records (module docstring, Statistics)."""
    b = {w: success(recs) for w, recs in before.items()}
    a = {k: success(recs) for k, recs in after.items()}
    gains = [a[(w, g)] - b[w] for (w, g) in a]
    starts = sorted({w for w, _ in a} & set(b))
    after_by_start = [sum(a[k] for k in a if k[0] == w) / sum(1 for k in a if k[0] == w) for w in starts]
    by_task_before = report.per_item_success([r for w in starts for r in before[w]])
    by_task_after = report.per_item_success([r for recs in after.values() for r in recs])
    return {
        "before": {str(w): b[w] for w in sorted(b)},
        "after": {f"{w}/{g}": a[(w, g)] for (w, g) in sorted(a)},
        "before_mean_std": report.mean_std([b[w] for w in starts]),
        "after_mean_std": report.mean_std(list(a.values())),
        "gain_mean_std": report.mean_std(gains),
        "gain_min_max": (min(gains), max(gains)) if gains else None,
        "test_starts": report.paired_t(after_by_start, [b[w] for w in starts]),
        "test_tasks": report.sign_flip(report.handover_diffs([by_task_after], [by_task_before])),
        "episodes": {"before": {str(w): len(before[w]) for w in sorted(before)},
                     "after": {f"{w}/{g}": len(v) for (w, g), v in sorted(after.items())}},
    }


def markdown(summary: dict[str, Any], budget: dict[str, Any]) -> str:
    """One row per warm start (before, after per GRPO seed, gains), then the spread and the tests."""
    seeds = sorted({int(k.split("/")[1]) for k in summary["after"]})
    lines = ["| warm start | before | " + " | ".join(f"after, GRPO seed {g}" for g in seeds) + " | gains |",
             "|---|---|" + "---|" * len(seeds) + "---|"]
    for w, before in summary["before"].items():
        afters = [summary["after"].get(f"{w}/{g}") for g in seeds]
        cells = [f"{x:.1%}" if x is not None else "-" for x in afters]
        gains = ", ".join(f"{x - before:+.1%}" for x in afters if x is not None)
        lines.append(f"| {w} | {before:.1%} | " + " | ".join(cells) + f" | {gains} |")

    def ms(key: str) -> str:
        m, s = summary[key]
        return f"{m:.1%} +- {s:.1%}"

    ts, tt = summary["test_starts"], summary["test_tasks"]
    lines += ["", f"- before: {ms('before_mean_std')} over {len(summary['before'])} warm starts; after: "
                  f"{ms('after_mean_std')} over {len(summary['after'])} runs",
              f"- gain: **{summary['gain_mean_std'][0]:+.1%} +- {summary['gain_mean_std'][1]:.1%}** (min "
              f"{summary['gain_min_max'][0]:+.1%}, max {summary['gain_min_max'][1]:+.1%})",
              f"- paired t over warm starts: diff {ts['diff']:+.1%}, p {ts['p']:.3f} (n {ts['n']}); sign flip over "
              f"held-out tasks: diff {tt['diff']:+.1%}, p {tt['p']:.4f} (n {tt['n']})",
              f"- budget: {json.dumps(budget)}"]
    return "\n".join(lines) + "\n"


def write_report(opts: argparse.Namespace, out: Path, wall_s: float | None) -> dict[str, Any]:
    before = {w: read_jsonl(out / "eval" / f"ws{w}.jsonl") for w in opts.warm_seeds
              if (out / "eval" / f"ws{w}.jsonl").exists()}
    after = {(w, g): read_jsonl(out / "eval" / f"rl-ws{w}-s{g}.jsonl") for w in opts.warm_seeds
             for g in opts.grpo_seeds if (out / "eval" / f"rl-ws{w}-s{g}.jsonl").exists()}
    if not before or not after:
        raise SystemExit(f"{out / 'eval'} has no finished evaluation to report")
    budget = {k: getattr(opts, k) for k in ("epochs", "layers", "drill", "counterfactuals", "worlds", "steps", "lr",
                                            "eval_n", "eval_temperature", "eval_seed", "eval_limit")}
    summary = summarize(before, after)
    result = {"summary": summary, "budget": budget, "warm_seeds": opts.warm_seeds, "grpo_seeds": opts.grpo_seeds,
              **({"wall_s": round(wall_s, 1)} if wall_s is not None else {})}
    (out / "learning.json").write_text(json.dumps(result, indent=1))
    md = markdown(summary, budget)
    (out / "learning.md").write_text(md)
    print("\n" + md + f"\nwrote {out / 'learning.json'} and {out / 'learning.md'}")
    return result


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    out = Path(opts.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if not opts.report_only:
        run_all(opts, out)
    write_report(opts, out, None if opts.report_only else time.perf_counter() - started)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What a GRPO step costs with LoRA adapters against full fine-tuning, on the same start and prompts.

    .venv/bin/python benchmarks/lora_step.py --out runs/awm_grpo/methods_ps            # after `methods --arms grpo lora`
    .venv/bin/python benchmarks/lora_step.py --out DIR --repeats 2 --steps 6

Runs the recipe (`awm_grpo/run_awm_grpo.sh`) with exactly the environment `awm_grpo.methods` gives its `grpo`
and `lora` arms (same warm start, data, split, seed, batch, horizon; each arm its own learning rate; LoRA's rank
and alpha), alternating the arms `--repeats` times so that a change in the machine's load hits both, each
run into a scratch folder (`OUT/bench/<arm>-r<k>`, replaced). Prints, per arm and repeat, the means over steps of
slime.train's metrics: weight sync bytes and seconds, trainer step seconds, rollout seconds, the trainer's
training state and its peak memory. Run it on an idle machine: the seconds are the machine's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from awm_grpo import methods  # noqa: E402
from awm_grpo.launch.processes import recipe_env, run_logged  # noqa: E402

FIGURES = {"sync bytes": "sync/bytes", "sync s": "sync/time_s", "trainer step s": "train/time_s",
           "rollout s": "rollout/time_s", "state GiB": "train/state_gib", "peak GiB": "train/peak_memory_gib"}


def step_means(metrics: Path) -> dict[str, float]:
    """Each figure's mean over the run's train rows (NaN where the run did not log it)."""
    rows = [r for r in map(json.loads, metrics.read_text().splitlines()) if r.get("kind") == "train"]
    return {name: statistics.fmean([r[key] for r in rows if key in r]) if any(key in r for r in rows)
            else float("nan") for name, key in FIGURES.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="a methods.py folder whose warm start, data and split exist")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--steps", type=int, default=6, help="GRPO steps a run (the first includes start-up effects)")
    p.add_argument("--seed", type=int, default=0)
    args, rest = p.parse_known_args(argv)
    out = Path(args.out).resolve()
    opts = methods.parse(["--out", str(out), "--arms", "grpo", "lora", "--steps", str(args.steps), *rest])
    if not (methods.folder(opts, out, "ws") / "config.json").exists():
        raise SystemExit(f"{out} has no warm start yet: run `python -m awm_grpo.methods --out {out} --arms grpo lora`")
    results: dict[str, list[dict[str, float]]] = {"grpo": [], "lora": []}
    for k in range(args.repeats):
        for arm in results:
            run = out / "bench" / f"{arm}-r{k}"
            shutil.rmtree(run, ignore_errors=True)
            run.parent.mkdir(parents=True, exist_ok=True)
            env = {**methods.rl_env(opts, out, arm, args.seed), "SAVE_DIR": str(run), "SAVE_INTERVAL": "100000"}
            rc = run_logged(["bash", str(REPO / "awm_grpo" / "run_awm_grpo.sh")], run.with_suffix(".log"),
                            timeout_s=3600, env=recipe_env(env), cwd=REPO)
            if rc != 0:
                raise SystemExit(f"{arm} repeat {k} failed (rc={rc}): see {run.with_suffix('.log')}")
            results[arm].append(step_means(run / "metrics.jsonl"))
            print(f"{arm} repeat {k}: " + ", ".join(f"{n} {v:.4g}" for n, v in results[arm][-1].items()), flush=True)
    print("\n| arm | repeat | " + " | ".join(FIGURES) + " |\n|---|---|" + "---|" * len(FIGURES))
    for arm, runs in results.items():
        for k, figures in enumerate(runs):
            print(f"| {arm} | {k} | " + " | ".join(f"{v:,.0f}" if n == "sync bytes" else f"{v:.4g}"
                                                   for n, v in figures.items()) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

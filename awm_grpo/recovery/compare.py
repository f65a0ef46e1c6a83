"""B1 (outcome-only GRPO) against the recovery method, on the embedded CPU default, judged on the controlled split.

    python -m awm_grpo.recovery.compare                                   # build what is missing, train, evaluate, print
    python -m awm_grpo.recovery.compare --methods b1 ours traj_agg --seeds 0 1 2 --steps 4 --eval-limit 0
    python -m awm_grpo.recovery.compare --dry-run                         # print the training commands only

For every seed and method: a short `python -m slime.train` run from the same starting model, same
prompts, same seeds, the recipe's plugins (awm_grpo.rollout / reward / traces), progress predicates
on, and only the credit switched (`awm_credit_method` through `awm_grpo.recovery.advantages`); then
the trained policy plays every handover of the controlled recovery split (`awm_grpo.recovery.split`)
of the tasks held out from training (`--eval-tasks heldout`: the val and test split's tasks; `all`:
every task, training tasks included, from their damaged states).
Training prompts (`--train-from`): the train split from initial states, the split's handovers of
the other tasks (episodes that start damaged, where a dip and a repair can actually be credited), or
both. "base" is the starting model itself. The table shows mean +- std over seeds of recovery_success,
additional_damage, verification_first_rate, SR and DSR, all and per task type; `OUT/compare.json`
keeps every figure and the commands.

Starting model: `--model`, else the warm-started small model (`python -m awm_grpo.warmstart`: a
model built from scratch never writes a tool call, so neither method could learn anything), else
the random base model with a warning. On 2 shared CPU cores keep runs to a few steps.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from awm_grpo.launch.job import PLUGINS
from awm_grpo.launch.processes import Children
from awm_grpo.recovery import split as recovery_split
from awm_grpo.recovery.credit import CreditConfig
from awm_grpo.recovery.plugin import METHODS
from slime.backends.checkpoint import copy_tokenizer_files

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "runs" / "awm_grpo" / "compare"
SPLITS = REPO / "runs" / "awm_grpo" / "splits" / "bundled"
MODELS = REPO / "runs" / "awm_grpo" / "models"


def runtime_yaml(opts: argparse.Namespace, method: str, predicates: Path, trace_dir: Path) -> dict[str, Any]:
    """The awm_* keys of one run: everything equal across methods except awm_credit_method."""
    return {"awm_predicates": str(predicates), "awm_credit_method": method, "awm_credit_lambda": opts.lam,
            "awm_credit_beta": opts.beta, "awm_credit_eta": opts.eta, "awm_max_turns": opts.max_turns,
            "awm_max_tokens_per_turn": opts.max_tokens_per_turn, "awm_max_observation_tokens": 256,
            "awm_terminate_on_invalid_call": True, "awm_env_workers": 1, "awm_trace_dir": str(trace_dir)}


def train_command(opts: argparse.Namespace, model: Path, run_dir: Path, config: Path, seed: int) -> list[str]:
    """slime.train flags of one short CPU run (no dynamic-sampling filter: it would drop groups whose
    outcomes tie but whose progress differs, which only the method can use)."""
    return [sys.executable, "-m", "slime.train", "--hf-checkpoint", str(model), "--ref-load", str(model),
            "--save", str(run_dir / "ckpt"), "--save-interval", str(opts.steps),
            "--metrics-path", str(run_dir / "metrics.jsonl"),
            "--num-gpus-per-node", "0", "--actor-num-gpus-per-node", "1", "--rollout-num-gpus", "1",
            "--rollout-num-gpus-per-engine", "1", "--ray-num-cpus", "4", "--engine-type", "cpu",
            "--num-rollout", str(opts.steps), "--rollout-batch-size", str(opts.batch),
            "--n-samples-per-prompt", str(opts.group), "--num-steps-per-rollout", "1",
            "--max-tokens-per-gpu", "4096", "--lr", str(opts.lr), "--clip-grad", "1.0",
            "--seed", str(seed), "--rollout-seed", str(seed), "--engine-seed", str(seed),
            "--rollout-max-response-len", str(opts.max_response_len), "--rollout-temperature", "1.0",
            "--prompt-data", str(opts.train_prompts), "--input-key", "text", "--metadata-key", "metadata",
            "--apply-chat-template", "--rollout-shuffle", *PLUGINS,
            "--custom-advantage-function-path", "awm_grpo.recovery.advantages", "--custom-config-path", str(config)]


def _run(cmd: list[str], log: Path, timeout_s: float) -> int:
    """Run a child in its own session, output to `log`; on timeout stop exactly what it started."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": f"{REPO}:{REPO / 'agent-world-model'}" + (f":{os.environ['PYTHONPATH']}"
                                                                  if os.environ.get("PYTHONPATH") else "")}
    children = Children()
    with open(log, "w") as out:
        proc = children.start(log.parent.name, cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            children.stop_all(grace_s=30)
            return 124


def final_model(run_dir: Path, base: Path) -> Path:
    """The last saved iteration as an HF folder the CPU engine can serve (weights + the base's tokenizer)."""
    ckpt = run_dir / "ckpt"
    latest = ckpt / "latest_checkpointed_iteration.txt"
    if not latest.exists():
        raise RuntimeError(f"{ckpt} has no checkpoint: the training run failed, see {run_dir / 'train.log'}")
    src = ckpt / f"iter_{int(latest.read_text().strip()):07d}" / "model"
    dest = run_dir / "final"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest)
    copy_tokenizer_files(base, dest)  # checkpoints carry them already; older ones may not
    return dest


def held_out_tasks(which: str, splits_dir: Path = SPLITS) -> set[tuple[str, int]] | None:
    """(scenario, task_idx) of the prompt split(s) named by `which` (heldout = val + test); None for all."""
    if which == "all":
        return None
    names = ("val", "test") if which == "heldout" else (which,)
    out = set()
    for name in names:
        for line in (Path(splits_dir) / f"{name}.jsonl").read_text().splitlines():
            if line.strip():
                meta = json.loads(line)["metadata"]
                out.add((meta["scenario"], int(meta["task_idx"])))
    return out


def training_prompts(opts: argparse.Namespace, split: Path, held_out: set[tuple[str, int]] | None, dest: Path) -> Path:
    """The run's prompt file: the train split (`initial`), the split's handovers of tasks not held out
    (`handovers`: episodes start from damaged states), or both."""
    rows = []
    if opts.train_from in ("initial", "both"):
        rows += [line for line in Path(opts.train_prompts).read_text().splitlines() if line.strip()]
    if opts.train_from in ("handovers", "both"):
        for line in (split / "split.jsonl").read_text().splitlines():
            r = json.loads(line) if line.strip() else None
            if r and (held_out is None or (r["metadata"]["scenario"], r["metadata"]["task_idx"]) not in held_out):
                r["metadata"]["start_db"] = str((split / r["metadata"]["start_db"]).resolve())
                r["text"] = [{"role": "user", "content": r["metadata"]["task"]}]  # as data_prep writes prompts
                rows.append(json.dumps(r))
    if not rows:
        raise SystemExit(f"no training prompts for --train-from {opts.train_from}")
    dest.write_text("".join(r + "\n" for r in rows))
    return dest


def starting_model(opts: argparse.Namespace) -> Path:
    if opts.model:
        return Path(opts.model).resolve()
    if (MODELS / "warmstart" / "config.json").exists():
        return MODELS / "warmstart"
    print("compare: no warm-started model (python -m awm_grpo.warmstart --data runs/awm_grpo/splits/bundled "
          f"--out {MODELS / 'warmstart'}): using the random base model, which never calls a tool",
          file=sys.stderr)
    return MODELS / "base"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m awm_grpo.recovery.compare", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(DEFAULT_OUT))
    p.add_argument("--model", help="starting HF model folder (default: runs/awm_grpo/models/warmstart, else base)")
    p.add_argument("--split", help="controlled recovery split folder (default: OUT/split, built when missing)")
    p.add_argument("--train-prompts", default=str(SPLITS / "train.jsonl"))
    p.add_argument("--train-from", default="both", choices=["initial", "handovers", "both"],
                   help="train from the initial states (train split), from the split's handovers of the "
                        "non-held-out tasks, or both (default)")
    p.add_argument("--methods", nargs="+", default=["b1", "ours"], choices=METHODS)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--no-base", action="store_true", help="do not evaluate the starting model itself")
    p.add_argument("--steps", type=int, default=3, help="training steps per run")
    p.add_argument("--batch", type=int, default=2, help="prompts per step")
    p.add_argument("--group", type=int, default=4, help="rollouts per prompt")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--lam", type=float, default=CreditConfig.lam, help="progress weight lambda")
    p.add_argument("--beta", type=float, default=CreditConfig.beta, help="verification bonus beta")
    p.add_argument("--eta", type=float, default=CreditConfig.eta, help="turn discount eta")
    p.add_argument("--max-turns", type=int, default=6)
    p.add_argument("--max-tokens-per-turn", type=int, default=128)
    p.add_argument("--max-response-len", type=int, default=1024)
    p.add_argument("--eval-tasks", default="heldout", choices=["heldout", "test", "val", "all"],
                   help="whose handovers to evaluate on (default heldout: the val and test tasks, never trained on)")
    p.add_argument("--eval-limit", type=int, default=0, help="only the first N handovers (0: all)")
    p.add_argument("--eval-temperature", type=float, default=0.7)
    p.add_argument("--train-timeout", type=float, default=900.0, help="seconds per training run")
    p.add_argument("--dry-run", action="store_true")
    opts = p.parse_args(argv)
    out = Path(opts.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    split = Path(opts.split).resolve() if opts.split else out / "split"
    if not (split / "split.jsonl").exists() and not opts.dry_run:
        print(f"building the controlled recovery split in {split}", file=sys.stderr)
        import asyncio

        asyncio.run(recovery_split.build(split, data_dir=None, predicates=None, scenarios=None, tool_mode="meta",
                                         weak_traces=[], max_per_task=2, max_chars=2000))
    if not Path(opts.train_prompts).exists() and Path(opts.train_prompts).parent == SPLITS and not opts.dry_run:
        from awm_grpo.data_prep import prepare

        print(f"writing the CPU profile's splits (by task, seed 42) to {SPLITS}", file=sys.stderr)
        prepare(SPLITS, split_by="task", seed=42)
    model = starting_model(opts)
    tasks = held_out_tasks(opts.eval_tasks, Path(opts.train_prompts).parent)
    if not opts.dry_run or (split / "split.jsonl").exists():
        opts.train_prompts = str(training_prompts(opts, split, tasks, out / "train_prompts.jsonl"))
    results: dict[str, Any] = {"model": str(model), "split": str(split), "eval_tasks": opts.eval_tasks,
                               "train_from": opts.train_from,
                               "seeds": opts.seeds, "runs": {}, "commands": {}}
    per_policy: dict[str, list[dict[str, Any]]] = {}

    def evaluate(name: str, policy: Path, seed: int) -> None:
        started = time.perf_counter()
        metrics, _ = recovery_split.evaluate(split, model=str(policy), seed=seed, temperature=opts.eval_temperature,
                                             max_turns=opts.max_turns, max_tokens_per_turn=opts.max_tokens_per_turn,
                                             max_response_len=opts.max_response_len, limit=opts.eval_limit,
                                             tasks=tasks)
        per_policy.setdefault(name, []).append(metrics)
        results["runs"][f"{name}/seed{seed}"] = {"metrics": metrics, "eval_s": round(time.perf_counter() - started, 1)}
        print(f"[compare] evaluated {name} seed {seed} in {time.perf_counter() - started:.0f}s", file=sys.stderr)

    for seed in opts.seeds:
        if not opts.no_base and not opts.dry_run:
            evaluate("base", model, seed)
        for method in opts.methods:
            run_dir = out / f"{method}-seed{seed}"
            if run_dir.exists() and not opts.dry_run:
                shutil.rmtree(run_dir)
            run_dir.mkdir(parents=True, exist_ok=True)
            config = run_dir / "awm_runtime.yaml"
            config.write_text(yaml.safe_dump(runtime_yaml(opts, method, split / "predicates.jsonl",
                                                          run_dir / "traces")))
            cmd = train_command(opts, model, run_dir, config, seed)
            results["commands"][f"{method}/seed{seed}"] = " ".join(cmd)
            if opts.dry_run:
                print(" ".join(cmd))
                continue
            started = time.perf_counter()
            rc = _run(cmd, run_dir / "train.log", opts.train_timeout)
            print(f"[compare] trained {method} seed {seed}: rc={rc} in {time.perf_counter() - started:.0f}s",
                  file=sys.stderr)
            if rc != 0:
                raise SystemExit(f"training {method} seed {seed} failed (rc={rc}): see {run_dir / 'train.log'}")
            evaluate(method, final_model(run_dir, model), seed)
    if opts.dry_run:
        return 0
    table = {name: recovery_split.summarize(runs) for name, runs in per_policy.items()}
    results["table"] = table
    (out / "compare.json").write_text(json.dumps(results, indent=1, default=str))
    print(f"\ncontrolled recovery split ({split}, tasks: {opts.eval_tasks}), model {model.name}, trained from "
          f"{opts.train_from}: {opts.steps} steps x {opts.batch} prompts x {opts.group} rollouts, seeds {opts.seeds}")
    recovery_split.print_table(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

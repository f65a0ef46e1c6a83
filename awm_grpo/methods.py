"""AgentGym-RL's training methods side by side on the bundled scenarios: GRPO at a fixed horizon, GRPO with
the ScalingInter-RL horizon schedule, DPO and AgentEvol, from one warm start, every seed, same held-out tasks;
and GRPO with LoRA adapters against full fine-tuning (`--arms grpo lora`).

    python -m awm_grpo.methods --out runs/awm_grpo/methods                       # 4 arms x seeds 0 1 2 (docs/results.md)
    python -m awm_grpo.methods --out DIR --arms grpo scaling --steps 12          # a subset; add arms later
    python -m awm_grpo.methods --out DIR --dry-run                               # print the plan, run nothing
    python -m awm_grpo.methods --out DIR --report-only                           # rewrite the report and plots

Stages, each skipped when its output exists (an interrupted or extended run resumes; one child at a time):

1. data (`--data practice`, the default): the practice set `OUT/P` of the bundled scenarios (their
   hand-written tasks plus every task-family instance) and its task split `OUT/PS` (seed 42: 250 train,
   54 val, 53 test tasks), as docs/results.md's GRPO figure; `--data bundled`: the 60 hand-written tasks
   only, `OUT/splits` (42 / 9 / 9). Held-out `OUT/heldout.jsonl` = val + test, never trained on by any arm;
2. the warm start, the one start of every arm: practice `OUT/ws0`, awm_grpo.learning's (6 layers, digits as
   tokens, the copy drill, counterfactual copies, 10 epochs); bundled `OUT/ws`, the quick 2-layer start of
   setup.sh, which solves none of the 18 held-out tasks (docs/results.md), so every arm reads 0 there;
3. arms x seeds, each from the warm start on the train prompts:
   - `grpo`: the recipe (`awm_grpo/run_awm_grpo.sh`) for `--steps` steps at the fixed horizon `--max-turns`;
   - `lora`: the same as `grpo` training LoRA adapters only (`--lora-rank`, `--lora-alpha`, at `--lora-lr`):
     the base frozen, each weight sync moving the adapter alone; evaluated through the checkpoint's merged model;
   - `scaling`: the same with the ScalingInter-RL schedule (`AWM_TURN_SCHEDULE`, `--rounds`, growing to the
     same final horizon; each round lasts `--steps // len(rounds)` steps, the last one the rest);
   - `dpo`, `agentevol`: `python -m awm_grpo.offline.dpo` / `.agentevol` with `--dpo-args` /
     `--agentevol-args` (defaults: about as many episodes as a GRPO run plays), exploring under the
     evaluation's runtime YAML;
4. evaluation: the warm start ("before") and every trained policy on the held-out tasks with the same
   samples (`--eval-n` at `--eval-temperature`, `--eval-seed`; `--greedy`: one greedy episode a task too),
   all under one runtime YAML `OUT/eval_runtime.yaml` (the fixed arm's: the schedule is a training device);
5. report: `OUT/methods.json`, `OUT/methods.md`, `OUT/methods_held_out.png`, `OUT/methods_curves.png`; for the
   GRPO-family arms also what each step cost, from the runs' metrics.jsonl (slime.train's `sync/bytes`,
   `train/time_s`, `rollout/time_s`, `train/state_gib`, `train/peak_memory_gib`).

Statistics (awm_grpo.learning / awm_grpo.recovery.report). All arms share one warm start, so the seed is the
replication unit of an arm: the gain of seed s is `after(s) - before`; the table gives mean +- std over
seeds; `vs before, seeds` is a one-sample t-test of those gains (it treats `before`, itself a sample of
`eval_n x 18` episodes, as exact); `vs before, tasks` a sign-flip test of per-task success after (pooled over
seeds) against before over the 18 held-out tasks; `vs grpo` the same two tests against the fixed-horizon
GRPO arm (seeds paired by number).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from awm.data import read_jsonl

from awm_grpo import learning
from awm_grpo.launch.processes import recipe_env, run_logged
from awm_grpo.recovery import report

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "runs" / "awm_grpo" / "methods"
RL_ARMS = ("grpo", "scaling", "lora")
OFFLINE_ARMS = ("dpo", "agentevol")
ARMS = RL_ARMS + OFFLINE_ARMS
DEFAULT_ARMS = ("grpo", "scaling", "dpo", "agentevol")  # AgentGym-RL's methods; `lora` on request
SPLIT_SEED = 42  # the CPU profile's split (data.split_seed)
# Folders under OUT per --data: the scenarios' data (None: the bundled copy), the task splits, the warm start.
LAYOUT = {"practice": {"data": "P", "splits": "PS", "ws": "ws{seed}"},  # awm_grpo.learning's names
          "bundled": {"data": None, "splits": "splits", "ws": "ws"}}
# The warm start of each --data: on the practice set docs/results.md's GRPO start (awm_grpo.learning); on
# the 42 bundled train tasks the quick 2-layer start of setup.sh, which solves none of the 18 held-out tasks.
WS_DEFAULTS = {"practice": {"epochs": 10, "layers": 6, "drill": 3000, "counterfactuals": 3}, "bundled": {"epochs": 40}}


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m awm_grpo.methods", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(DEFAULT_OUT), help=f"output folder (default {DEFAULT_OUT})")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="training seeds of every arm")
    p.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS), choices=ARMS,
                   help=f"default: {' '.join(DEFAULT_ARMS)}; `--arms grpo lora` compares LoRA with full fine-tuning")
    p.add_argument("--data", default="practice", choices=list(LAYOUT),
                   help="practice: the practice set of the bundled scenarios (their 10 tasks each plus every "
                        "task-family instance; 250 train / 107 held-out tasks), with docs/results.md's warm start; "
                        "bundled: their 60 hand-written tasks only (42 / 18), with the quick 2-layer start")
    p.add_argument("--steps", type=int, default=12, help="GRPO steps per run (--batch prompts x 4 samples a step)")
    p.add_argument("--batch", type=int, default=8, help="GRPO: prompts per step (ROLLOUT_BATCH_SIZE)")
    p.add_argument("--lr", type=float, default=2e-4, help="GRPO learning rate (docs/results.md's)")
    p.add_argument("--lora-rank", type=int, default=8, help="`lora`: adapter rank (LORA_RANK)")
    p.add_argument("--lora-alpha", type=float, default=16.0, help="`lora`: adapter alpha, updates x alpha / rank")
    p.add_argument("--lora-lr", type=float, default=2e-3,
                   help="`lora`: learning rate (default 10x --lr's default: adapters start at zero and move "
                        "through a low-rank product, and LoRA's best learning rate is commonly about 10x full "
                        "fine-tuning's)")
    p.add_argument("--max-turns", type=int, default=10,
                   help="the fixed horizon of `grpo`, the final one of `scaling`, and the evaluation's")
    p.add_argument("--rounds", type=int, nargs="+", default=[4, 7, 10],
                   help="`scaling`: the horizon of each round (the last must equal --max-turns)")
    p.add_argument("--ws-epochs", type=int, default=None, help="warm start: SFT epochs (default: practice 10, "
                   "as awm_grpo.learning; bundled 40)")
    p.add_argument("--ws-seed", type=int, default=0)
    p.add_argument("--eval-n", type=int, default=1, help="samples per held-out task")
    p.add_argument("--eval-temperature", type=float, default=1.0, help="the training temperature")
    p.add_argument("--eval-seed", type=int, default=0)
    p.add_argument("--eval-limit", type=int, default=0, help="only the first N held-out tasks (0: all)")
    p.add_argument("--greedy", action="store_true", help="also evaluate greedily, 1 episode a task (on 2 shared "
                   "cores as long as the sampled evaluation: long greedy loops run to the turn limit)")
    p.add_argument("--offline-tasks", type=int, default=96,
                   help="dpo / agentevol explore a seeded sample of this many train tasks, OUT/offline_train.jsonl "
                        "(0: all); with the defaults every arm plays 384 training episodes (GRPO: 12 x 8 x 4)")
    p.add_argument("--dpo-args", default="--samples 4", help="flags for `python -m awm_grpo.offline.dpo` (one "
                   "string; default: 4 episodes a task)")
    p.add_argument("--agentevol-args", default="--iterations 2 --samples 2",
                   help="flags for `python -m awm_grpo.offline.agentevol` (one string; default: 2 rounds of 2 "
                        "episodes a task)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per child")
    p.add_argument("--img-dir", help="also copy the plots here (docs/img for the docs' figures)")
    p.add_argument("--dry-run", action="store_true", help="print the plan (what would run, what is done)")
    p.add_argument("--report-only", action="store_true", help="rewrite the report from OUT's evaluations")
    opts = p.parse_args(argv)
    if opts.rounds[-1] != opts.max_turns:
        p.error(f"--rounds must grow to the fixed horizon: the last round is {opts.rounds[-1]}, --max-turns "
                f"{opts.max_turns} (the comparison is the schedule against that horizon)")
    if opts.steps < len(opts.rounds):
        p.error(f"--steps {opts.steps} cannot hold {len(opts.rounds)} rounds: give at least one step a round")
    if len(set(opts.seeds)) != len(opts.seeds):
        p.error("--seeds has a repeated seed")
    opts.ws_epochs = opts.ws_epochs or WS_DEFAULTS[opts.data]["epochs"]
    return opts


def folder(opts: argparse.Namespace, out: Path, what: str) -> Path | None:
    """OUT's data, splits or warm-start folder for --data (LAYOUT)."""
    name = LAYOUT[opts.data][what]
    return None if name is None else out / name.format(seed=opts.ws_seed)


def schedule(opts: argparse.Namespace) -> dict[str, Any]:
    """AWM_TURN_SCHEDULE of the `scaling` arm: len(rounds) equal rounds (awm_grpo.rollout.max_turns_at)."""
    return {"rounds": list(opts.rounds), "every": opts.steps // len(opts.rounds)}


def horizon(turn_schedule: dict[str, Any] | None, max_turns: int, step: int) -> int:
    """The turn limit the rollout applies at `step` (its own rule, RolloutConfig.max_turns_at)."""
    from awm_grpo.rollout import RolloutConfig

    return RolloutConfig(max_turns=max_turns, turn_schedule=turn_schedule).max_turns_at(step)


def rl_env(opts: argparse.Namespace, out: Path, arm: str, seed: int) -> dict[str, str]:
    """The launcher's knobs of one GRPO run (docs/results.md's LR and penalty, this experiment's budget)."""
    env = {"HF_CKPT": str(folder(opts, out, "ws")), "AWM_SPLITS_DIR": str(folder(opts, out, "splits")),
           "SAVE_DIR": str(out / f"{arm}-s{seed}"),
           "LR": str(opts.lr), "AWM_INVALID_CALL_PENALTY": "0", "NUM_ROLLOUT": str(opts.steps),
           "ROLLOUT_BATCH_SIZE": str(opts.batch), "EVAL_INTERVAL": "100000", "SKIP_EVAL_BEFORE_TRAIN": "true",
           "AWM_MAX_TURNS": str(opts.max_turns), "TRAIN_SEED": str(seed)}
    if opts.data == "practice":
        env["AWM_DATA_DIR"] = str(folder(opts, out, "data"))
    if arm == "scaling":
        env["AWM_TURN_SCHEDULE"] = json.dumps(schedule(opts))
    if arm == "lora":
        env.update(LORA_RANK=str(opts.lora_rank), LORA_ALPHA=str(opts.lora_alpha), LR=str(opts.lora_lr))
    return env


def eval_runtime(opts: argparse.Namespace, out: Path) -> dict[str, Any]:
    """The runtime YAML every policy is evaluated with: the launcher's for the fixed arm, resolved here."""
    from awm_grpo.launch.config import resolve
    from awm_grpo.launch.job import runtime_config

    keys = runtime_config(resolve(None, env=rl_env(opts, out, "grpo", opts.seeds[0]), gpus=[]))
    keys["awm_trace_dir"] = None  # evaluation writes its records to --out
    return keys


def model_of(opts: argparse.Namespace, out: Path, arm: str, seed: int) -> Path:
    """Where the trained policy of (arm, seed) lies once its run finished."""
    run = out / f"{arm}-s{seed}"
    return run / f"iter_{opts.steps - 1:07d}" / "model" if arm in RL_ARMS else run / "model"


def trained(opts: argparse.Namespace, out: Path, arm: str, seed: int) -> bool:
    if arm in RL_ARMS:
        return learning.finished(out / f"{arm}-s{seed}", opts.steps)
    return (model_of(opts, out, arm, seed) / "config.json").exists()


def evaluations(opts: argparse.Namespace, out: Path, name: str, model: Path) -> list[dict[str, Any]]:
    """The held-out evaluations of one policy: `--eval-n` samples a task (with `--greedy`, then one greedy
    episode a task)."""
    kinds = [("", opts.eval_n, opts.eval_temperature)] + ([("-greedy", 1, 0.0)] if opts.greedy else [])
    steps = []
    for suffix, n, temperature in kinds:
        dest = out / "eval" / f"{name}{suffix}.jsonl"
        sampling = argparse.Namespace(eval_n=n, eval_temperature=temperature, eval_seed=opts.eval_seed,
                                      eval_limit=opts.eval_limit)
        steps.append({"name": f"eval {name}{suffix}", "log": dest.with_suffix(".log"), "done": dest.exists(),
                      "cmd": learning.eval_command(sampling, out, model, out / "eval_runtime.yaml", dest)})
    return steps


def data_steps(opts: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """The practice set (practice only), the task splits and the warm start, each with its done-check."""
    py = sys.executable
    data, splits, ws = (folder(opts, out, k) for k in ("data", "splits", "ws"))
    steps = []
    if data is not None:
        steps.append({"name": "data", "cmd": [py, "-m", "awm.scenarios.build", "--practice", str(data)],
                      "done": (data / "gen_tasks.jsonl").exists(), "log": out / "data.log"})
    steps.append({"name": "splits", "cmd": [py, "-m", "awm_grpo.data_prep", *(["--data-dir", str(data)] if data else []),
                                            "--split-by", "task", "--seed", str(SPLIT_SEED), "--out", str(splits)],
                  "done": (splits / "split_info.json").exists(), "log": out / "splits.log"})
    if opts.data == "practice":
        start = argparse.Namespace(**{**WS_DEFAULTS["practice"], "epochs": opts.ws_epochs})
        cmd = learning.warm_start_command(start, out, opts.ws_seed)  # writes OUT/ws<seed> (LAYOUT)
    else:
        cmd = [py, "-m", "awm_grpo.warmstart", "--data", str(splits), "--epochs", str(opts.ws_epochs),
               "--seed", str(opts.ws_seed), "--out", str(ws)]
    steps.append({"name": "warm start", "cmd": cmd, "done": (ws / "warmstart.json").exists(), "log": out / "ws.log"})
    return steps


def offline_prompts(opts: argparse.Namespace, out: Path) -> Path:
    """The train prompts the offline arms explore: all, or OUT/offline_train.jsonl (--offline-tasks)."""
    return out / "offline_train.jsonl" if opts.offline_tasks else folder(opts, out, "splits") / "train.jsonl"


def write_offline_prompts(opts: argparse.Namespace, out: Path) -> None:
    """A seeded sample of the train prompts, in split order: the split file is sorted by scenario, so its
    first N tasks would cover one or two scenarios only."""
    rows = (folder(opts, out, "splits") / "train.jsonl").read_text().splitlines()
    rows = [r for r in rows if r.strip()]
    if opts.offline_tasks > len(rows):
        raise SystemExit(f"--offline-tasks {opts.offline_tasks}: the train split has {len(rows)} tasks")
    keep = sorted(random.Random(SPLIT_SEED).sample(range(len(rows)), opts.offline_tasks))
    (out / "offline_train.jsonl").write_text("".join(rows[i] + "\n" for i in keep))


def plan(opts: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """Every child in order: name, command, extra environment, log, whether it is done."""
    py = sys.executable
    ws = folder(opts, out, "ws")
    steps = data_steps(opts, out)
    steps += evaluations(opts, out, "ws", ws)
    for seed in opts.seeds:  # seed by seed, the arms side by side: an interrupted run has paired seeds
        for arm in opts.arms:
            name, log = f"{arm}-s{seed}", out / f"{arm}-s{seed}.log"
            if arm in RL_ARMS:
                cmd, env = ["bash", str(REPO / "awm_grpo" / "run_awm_grpo.sh")], rl_env(opts, out, arm, seed)
            else:
                cmd, env = [py, "-m", f"awm_grpo.offline.{arm}", "--model", str(ws), "--prompts",
                            str(offline_prompts(opts, out)), "--config", str(out / "eval_runtime.yaml"), "--out",
                            str(out / name), "--seed", str(seed),
                            *shlex.split(getattr(opts, f"{arm}_args"))], {}
            steps.append({"name": name, "cmd": cmd, "env": env, "log": log, "done": trained(opts, out, arm, seed)})
            steps += evaluations(opts, out, name, model_of(opts, out, arm, seed))
    return steps


def load_times(out: Path) -> dict[str, float]:
    path = out / "times.json"
    return json.loads(path.read_text()) if path.exists() else {}


def run_all(opts: argparse.Namespace, out: Path) -> None:
    """Run what the plan has not done yet, one child at a time, recording each one's wall time."""
    (out / "eval").mkdir(parents=True, exist_ok=True)
    mark = out / "data.json"  # the warm start's evaluation is "before" of every arm: never mix two --data
    if mark.exists() and json.loads(mark.read_text())["data"] != opts.data:
        raise SystemExit(f"{out} holds a --data {json.loads(mark.read_text())['data']} run: give another --out")
    mark.write_text(json.dumps({"data": opts.data}))
    times = load_times(out)
    for step in plan(opts, out):
        if step["name"] not in ("data", "splits") and not (out / "heldout.jsonl").exists():
            rows = [r for name in ("val", "test") for r in read_jsonl(folder(opts, out, "splits") / f"{name}.jsonl")]
            (out / "heldout.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        if step["name"] not in ("data", "splits") and opts.offline_tasks and not (out / "offline_train.jsonl").exists():
            write_offline_prompts(opts, out)
        if step["name"] not in ("data", "splits", "warm start") and not (out / "eval_runtime.yaml").exists():
            (out / "eval_runtime.yaml").write_text(yaml.safe_dump(eval_runtime(opts, out), sort_keys=False))
        if step["done"]:
            continue
        started = time.perf_counter()
        print(f"[methods] {step['name']}: {shlex.join(step['cmd'])} (log {step['log']})", file=sys.stderr)
        rc = run_logged(step["cmd"], step["log"], timeout_s=opts.timeout, env=recipe_env(step.get("env")), cwd=REPO)
        times[step["name"]] = round(time.perf_counter() - started, 1)
        (out / "times.json").write_text(json.dumps(times, indent=1))
        if rc != 0:
            raise SystemExit(f"{step['name']} failed (rc={rc}): see {step['log']}")
        print(f"[methods] {step['name']} done in {times[step['name']] / 60:.1f} min", file=sys.stderr)




def records(out: Path, name: str) -> list[dict[str, Any]] | None:
    """The evaluation records of one policy (None before it was evaluated)."""
    path = out / "eval" / f"{name}.jsonl"
    return read_jsonl(path) if path.exists() else None


def arm_summary(before: list[dict[str, Any]], after: dict[int, list[dict[str, Any]]],
                reference: dict[int, list[dict[str, Any]]] | None = None) -> dict[str, Any]:
    """One arm's held-out figures (module docstring, Statistics): learning.summarize with the warm start
    as its only start, the gains tested over seeds and tasks, and the same tests against `reference`."""
    base = learning.summarize({0: before}, {(0, s): recs for s, recs in after.items()})
    seeds = sorted(after)
    rates = [base["after"][f"0/{s}"] for s in seeds]
    out = {"before": base["before"]["0"], "after": {str(s): r for s, r in zip(seeds, rates, strict=True)},
           "after_mean_std": base["after_mean_std"], "gain_mean_std": base["gain_mean_std"],
           "gain_min_max": base["gain_min_max"],
           "vs_before_seeds": report.paired_t(rates, [base["before"]["0"]] * len(rates)),
           "vs_before_tasks": base["test_tasks"], "episodes": base["episodes"]["after"]}
    if reference:
        common = [s for s in seeds if s in reference]
        out["vs_grpo_seeds"] = report.paired_t([learning.success(after[s]) for s in common],
                                               [learning.success(reference[s]) for s in common])
        out["vs_grpo_tasks"] = report.sign_flip(report.handover_diffs(
            [report.per_item_success([r for s in seeds for r in after[s]])],
            [report.per_item_success([r for s in reference for r in reference[s]])]))
    return out


# What a GRPO-family step cost, per step of slime.train's metrics.jsonl: curve name -> metric.
SYSTEM = {"sync_bytes": "sync/bytes", "train_s": "train/time_s", "rollout_s": "rollout/time_s",
          "state_gib": "train/state_gib", "peak_gib": "train/peak_memory_gib"}


def run_curves(run_dir: Path, turn_schedule: dict[str, Any] | None, max_turns: int) -> dict[str, dict[int, float]]:
    """Per training step of one GRPO run, from its traces: success, mean reward, model turns per episode,
    the share stopped by the turn limit (stop_reason max_turns), the limit itself; and episodes played
    (slime.train's metrics.jsonl, which also counts episodes the batch filter dropped)."""
    from awm_grpo.traces import read_records

    by_step: dict[int, list[dict[str, Any]]] = {}
    for r in read_records(run_dir / "traces", "rollout_*.jsonl"):
        if not r.get("infra_error"):
            by_step.setdefault(int(r["step"]), []).append(r)
    steps = sorted(by_step)

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else math.nan

    curves = {"success": report.learning_curve([r for s in steps for r in by_step[s]], handovers=False),
              "reward": {s: mean([r["reward"] for r in by_step[s] if r.get("reward") is not None]) for s in steps},
              "turns": {s: mean([len(r.get("turns") or []) for r in by_step[s]]) for s in steps},
              "truncated": {s: mean([r.get("stop_reason") == "max_turns" for r in by_step[s]]) for s in steps},
              "horizon": {s: horizon(turn_schedule, max_turns, s) for s in steps}, "played": {},
              **{name: {} for name in SYSTEM}}
    metrics = run_dir / "metrics.jsonl"
    for line in metrics.read_text().splitlines() if metrics.exists() else []:
        row = json.loads(line) if line.strip() else {}
        if row.get("kind") != "train":
            continue
        if "rollout/episodes_played" in row:
            curves["played"][int(row["step"])] = row["rollout/episodes_played"]  # a resumed step: the last
        for name, key in SYSTEM.items():
            if isinstance(row.get(key), (int, float)):
                curves[name][int(row["step"])] = float(row[key])
    return curves


def offline_run(run_dir: Path, arm: str) -> dict[str, Any] | None:
    """What an offline run's JSON (OUT/<arm>-s<seed>/<arm>.json) says about its cost and data: episodes
    played, wall time, DPO's pair counts, AgentEvol's per-iteration figures (scalars only)."""
    path = run_dir / f"{arm}.json"
    if not path.exists():
        return None
    run = json.loads(path.read_text())

    def scalars(d: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in d.items() if isinstance(v, (int, float, str, bool)) or v is None}

    out = {"episodes_played": run.get("episodes_played"), "wall_s": run.get("wall_s")}
    if isinstance(run.get("pairs"), dict):
        out["pairs"] = run["pairs"]  # tasks, paired tasks, pairs, why the others gave none
    if isinstance(run.get("iterations"), list):
        out["iterations"] = [{**scalars(it), "exploration": it.get("exploration")} for it in run["iterations"]
                             if isinstance(it, dict)]
    return out


def summarize(opts: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Everything methods.json holds, from OUT's evaluations, traces and times."""
    before = records(out, "ws")
    if before is None:
        raise SystemExit(f"{out / 'eval' / 'ws.jsonl'} is missing: the warm start was not evaluated yet")
    afters = {arm: {s: recs for s in opts.seeds if (recs := records(out, f"{arm}-s{s}")) is not None}
              for arm in opts.arms}
    reference = afters.get("grpo")
    arms = {arm: arm_summary(before, after, reference if arm != "grpo" else None)
            for arm, after in afters.items() if after}
    greedy: dict[str, Any] = {}
    for name in ["ws"] + [f"{a}-s{s}" for a in opts.arms for s in opts.seeds]:
        recs = records(out, f"{name}-greedy")
        if recs is not None:
            greedy[name] = learning.success(recs)
    for arm in opts.arms:
        values = [greedy[f"{arm}-s{s}"] for s in opts.seeds if f"{arm}-s{s}" in greedy]
        if values:
            greedy[f"{arm} mean_std"] = report.mean_std(values)
    times = load_times(out)
    curves = {arm: {str(s): run_curves(out / f"{arm}-s{s}", schedule(opts) if arm == "scaling" else None,
                                       opts.max_turns)
                    for s in opts.seeds if trained(opts, out, arm, s)}  # finished runs only
              for arm in opts.arms if arm in RL_ARMS}
    cost: dict[str, Any] = {}
    offline: dict[str, dict[str, Any]] = {}
    for arm in opts.arms:
        played = {}
        for s in opts.seeds:
            if arm in RL_ARMS and str(s) in curves.get(arm, {}):
                played[str(s)] = int(sum(curves[arm][str(s)]["played"].values()))
            elif arm in OFFLINE_ARMS and (run := offline_run(out / f"{arm}-s{s}", arm)) is not None:
                played[str(s)] = run["episodes_played"]
                offline.setdefault(arm, {})[str(s)] = run
        cost[arm] = {"episodes_played": played,
                     "train_s": {str(s): times[f"{arm}-s{s}"] for s in opts.seeds if f"{arm}-s{s}" in times}}
    commands = {step["name"]: " ".join(f"{k}={shlex.quote(v)}" for k, v in (step.get("env") or {}).items())
                + (" " if step.get("env") else "") + shlex.join(step["cmd"]) for step in plan(opts, out)}
    budget = {k: getattr(opts, k) for k in ("data", "seeds", "steps", "batch", "lr", "lora_rank", "lora_alpha",
                                            "lora_lr", "max_turns", "rounds",
                                            "ws_epochs", "ws_seed", "eval_n", "eval_temperature", "eval_seed",
                                            "eval_limit", "offline_tasks", "dpo_args", "agentevol_args")}
    return {"budget": budget, "schedule": schedule(opts), "heldout_tasks": len({(r["scenario"], r["task_idx"])
                                                                                 for r in before}),
            "before": learning.success(before), "arms": arms, "greedy": greedy, "cost": cost, "times": times,
            "offline": offline,
            "curves": {a: {s: {k: {str(step): v for step, v in c.items()} for k, c in run.items()}
                           for s, run in by_seed.items()} for a, by_seed in curves.items()},
            "commands": commands}


def _pct(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.1%}"


def _test(result: dict[str, float] | None) -> str:
    if not result or result.get("p") is None or math.isnan(result["p"]):
        return "-"
    return f"{result['diff']:+.1%}, p {result['p']:.3f}"


def curve_mean(runs: dict[str, dict[str, dict[str, float]]], key: str, part: slice) -> float:
    """Mean of one curve over seeds and the steps in `part` (steps in order)."""
    vals = [v for run in runs.values() for _, v in sorted(run[key].items(), key=lambda kv: int(kv[0]))[part]]
    return sum(vals) / len(vals) if vals else math.nan


def _system_cell(runs: dict[str, dict[str, dict[str, float]]], key: str, fmt: str) -> str:
    """A SYSTEM figure's mean over seeds and steps ("-" where no run logged it: runs before it was logged)."""
    value = curve_mean({s: r for s, r in runs.items() if r.get(key)}, key, slice(None))
    return "-" if math.isnan(value) else format(value, fmt)


def markdown(result: dict[str, Any]) -> str:
    """The held-out table (one row per arm), then the cost table and the training curves' summary."""
    b, seeds = result["budget"], result["budget"]["seeds"]
    lines = [f"Held-out: {result['heldout_tasks']} tasks (val + test) x {b['eval_n']} samples at T "
             f"{b['eval_temperature']}, eval seed {b['eval_seed']}; one warm start ({b['ws_epochs']} SFT epochs); "
             f"GRPO: {b['steps']} steps x {b['batch']} prompts x 4 samples, LR {b['lr']}, horizon {b['max_turns']} "
             f"(scaling: rounds {b['rounds']} every {result['schedule']['every']} steps; lora: rank "
             f"{b.get('lora_rank')}, alpha {b.get('lora_alpha')}, LR {b.get('lora_lr')}).", "",
             "| policy | " + " | ".join(f"seed {s}" for s in seeds) + " | mean +- std | gain mean +- std | "
             "vs before: seeds | vs before: tasks | vs grpo: seeds | vs grpo: tasks | greedy |",
             "|---|" + "---|" * len(seeds) + "---|---|---|---|---|---|---|",
             f"| warm start (before) | {_pct(result['before'])}" + " |" * len(seeds) + " | | | | | | "
             f"{_pct(result['greedy'].get('ws'))} |"]
    for arm, a in result["arms"].items():
        cells = [_pct(a["after"].get(str(s))) for s in seeds]
        m, sd = a["after_mean_std"]
        gm, gs = a["gain_mean_std"]
        g = result["greedy"].get(f"{arm} mean_std")
        lines.append(f"| {arm} | " + " | ".join(cells) + f" | {_pct(m)} +- {_pct(sd)} | {gm:+.1%} +- {gs:.1%} | "
                     f"{_test(a['vs_before_seeds'])} | {_test(a['vs_before_tasks'])} | "
                     f"{_test(a.get('vs_grpo_seeds'))} | {_test(a.get('vs_grpo_tasks'))} | "
                     + (f"{_pct(g[0])} +- {_pct(g[1])}" if g else "-") + " |")
    lines += ["", "| arm | episodes played (per seed) | training wall time (per seed) |", "|---|---|---|"]
    for arm, c in result["cost"].items():
        played = ", ".join(f"{c['episodes_played'][str(s)]}" if str(s) in c["episodes_played"] else "-"
                           for s in seeds)
        wall = ", ".join(f"{c['train_s'][str(s)] / 60:.1f} min" if str(s) in c["train_s"] else "-" for s in seeds)
        lines.append(f"| {arm} | {played} | {wall} |")
    for s, run in result["offline"].get("dpo", {}).items():
        p = run.get("pairs") or {}
        lines.append(f"\n- dpo seed {s}: {p.get('pairs')} pairs from {p.get('paired_tasks')} of {p.get('tasks')} "
                     f"train tasks (the others: {json.dumps(p.get('unpaired'))})")
    for s, run in result["offline"].get("agentevol", {}).items():
        its = "; ".join(f"iteration {it.get('iteration')}: {it.get('accepted')} accepted of {it.get('episodes')} "
                        f"({it.get('accepted_tasks')} tasks)" for it in run.get("iterations") or [])
        lines.append(f"\n- agentevol seed {s}: {its}")
    if result["curves"]:
        lines += ["", "| GRPO arm | training success, first 4 / last 4 steps | turns per episode | stopped by the "
                      "turn limit | (means over seeds and steps) |", "|---|---|---|---|---|"]
        for arm, runs in result["curves"].items():
            lines.append(f"| {arm} | {_pct(curve_mean(runs, 'success', slice(0, 4)))} / "
                         f"{_pct(curve_mean(runs, 'success', slice(-4, None)))} | "
                         f"{curve_mean(runs, 'turns', slice(None)):.2f} | "
                         f"{_pct(curve_mean(runs, 'truncated', slice(None)))} | |")
        lines += ["", "| GRPO arm | weight sync, bytes a step | trainer step, s | rollout, s | training state, GiB | "
                      "trainer peak memory, GiB |", "|---|---|---|---|---|---|"]
        for arm, runs in result["curves"].items():
            cells = [_system_cell(runs, key, fmt) for key, fmt in (("sync_bytes", ",.0f"), ("train_s", ".1f"),
                                                                 ("rollout_s", ".1f"), ("state_gib", ".4f"),
                                                                 ("peak_gib", ".2f"))]
            lines.append(f"| {arm} | " + " | ".join(cells) + " |")
        lines.append("(means over seeds and steps; the state is the trainer's weights, gradients, optimizer moments "
                     "and reference weights; the peak is the trainer process's resident memory on CPU, the "
                     "allocator's on GPU)")
    return "\n".join(lines) + "\n"


def plot(out: Path, result: dict[str, Any]) -> list[Path]:
    """methods_curves.png (per step: success, reward, turns, turn-limit stops; each seed thin, the mean
    thick) and methods_held_out.png (held-out success per policy: mean +- std bars, seeds as dots)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    colours = {"grpo": "tab:blue", "scaling": "tab:orange", "dpo": "tab:green", "agentevol": "tab:red",
               "lora": "tab:purple"}
    panels = [("success", "training success"), ("reward", "mean reward"), ("turns", "model turns per episode"),
              ("truncated", "share stopped by the turn limit")]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for ax, (key, label) in zip(axes.flat, panels, strict=True):
        for arm, by_seed in result["curves"].items():
            runs = [{int(k): v for k, v in run[key].items()} for run in by_seed.values()]
            steps = sorted(set().union(*[set(r) for r in runs])) if runs else []
            for r in runs:
                ax.plot([s + 1 for s in sorted(r)], [r[s] for s in sorted(r)], color=colours[arm], alpha=0.3, lw=0.8)
            means = [sum(r[s] for r in runs if s in r) / sum(1 for r in runs if s in r) for s in steps]
            ax.plot([s + 1 for s in steps], means, color=colours[arm], lw=2, label=f"{arm} (mean of {len(runs)})")
            if key == "turns" and runs:
                hz = {int(k): v for k, v in next(iter(by_seed.values()))["horizon"].items()}
                ax.step([s + 1 for s in sorted(hz)], [hz[s] for s in sorted(hz)], where="mid", color=colours[arm],
                        ls="--", lw=1, label=f"{arm}: turn limit")
        ax.set_xlabel("training step")
        ax.set_ylabel(label)
        if key in ("success", "truncated"):
            ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=7)
    b = result["budget"]
    fig.suptitle(f"GRPO, fixed horizon {b['max_turns']} vs ScalingInter-RL rounds {b['rounds']} (every "
                 f"{result['schedule']['every']} steps): {b['steps']} steps x {b['batch']} prompts x 4 samples, "
                 f"seeds {' '.join(sorted({s for runs in result['curves'].values() for s in runs}))}", fontsize=9)
    fig.tight_layout()
    written.append(out / "methods_curves.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4))
    names = ["warm start"] + list(result["arms"])
    for i, name in enumerate(names):
        if name == "warm start":
            vals = [result["before"]]
        else:
            vals = list(result["arms"][name]["after"].values())
        m, sd = report.mean_std(vals)
        ax.bar(i, m, 0.6, yerr=sd if len(vals) > 1 else 0, capsize=4, color=colours.get(name, "tab:gray"), alpha=0.7)
        ax.scatter([i] * len(vals), vals, color="black", s=12, zorder=3)
    ax.axhline(result["before"], color="tab:gray", ls=":", lw=1)
    ax.set_xticks(range(len(names)), [n if n == "warm start" else f"{n}\n{len(result['arms'][n]['after'])} seeds"
                                      for n in names])
    ax.set_ylabel(f"held-out success (T {b['eval_temperature']}, {b['eval_n']} a task)")
    ax.set_title(f"{result['heldout_tasks']} held-out tasks; bars: mean +- std over seeds, dots: seeds", fontsize=9)
    fig.tight_layout()
    written.append(out / "methods_held_out.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written


def write_report(opts: argparse.Namespace, out: Path) -> dict[str, Any]:
    """methods.json, methods.md and the two plots (copied to --img-dir when given)."""
    result = summarize(opts, out)
    (out / "methods.json").write_text(json.dumps(result, indent=1, default=str))
    md = markdown(result)
    (out / "methods.md").write_text(md)
    plots = plot(out, result)
    if opts.img_dir:
        import shutil

        Path(opts.img_dir).mkdir(parents=True, exist_ok=True)
        for path in plots:
            shutil.copy(path, Path(opts.img_dir) / path.name)
    print("\n" + md + f"\nwrote {out / 'methods.json'}, {out / 'methods.md'}, " + ", ".join(map(str, plots)))
    return result


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    out = Path(opts.out).resolve()
    if opts.dry_run:
        for step in plan(opts, out):
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in (step.get("env") or {}).items())
            print(f"# {step['name']}: {'done' if step['done'] else 'to run'}\n{env + ' ' if env else ''}"
                  f"{shlex.join(step['cmd'])}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    if not opts.report_only:
        run_all(opts, out)
    write_report(opts, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

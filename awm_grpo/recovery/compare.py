"""Compare credit methods and ablations on the controlled recovery split: train, evaluate, table, tests, plots.

    python -m awm_grpo.recovery.compare --testbed runs/awm_grpo/recovery_testbed   # the experiment (docs/recovery-method.md)
    python -m awm_grpo.recovery.compare --arms b1 ours --seeds 0 1 2 --steps 4      # bundled split, warm start
    python -m awm_grpo.recovery.compare --dry-run                                   # print the training commands only

For every seed and arm: a short `python -m slime.train` run from the same starting model, same
prompts, same seeds, the recipe's plugins (awm_grpo.rollout / reward / traces), progress predicates
on, and only the credit switched (an arm is `awm_credit_*` keys through `awm_grpo.recovery.advantages`:
ARMS); then the trained policy plays every handover of the controlled recovery split
(`awm_grpo.recovery.split`) of the tasks held out from training (`--eval-tasks heldout`: the val and
test prompts' tasks; `all`: every task, training tasks included) and, from their initial states,
the held-out tasks themselves (ordinary success: the method must not cost it).
Training prompts (`--train-from`): the train split from initial states, the split's handovers of
the other tasks (episodes that start damaged, where a dip and a repair can actually be credited), or
both. "base" is the starting model itself, evaluated first: if it never repairs or always does,
no arm can differ and the report says so.

`--testbed DIR` (awm_grpo.recovery.testbed) takes the split, prompts, data and warm start from DIR, and
builds whichever of them is missing first (one command from nothing to the table and plots).
Writes OUT/compare.json (every figure, per-handover outcomes, commands, wall times), OUT/compare.md
(the tables with paired tests against B1, awm_grpo.recovery.report) and OUT/learning_curves.png +
OUT/held_out.png. On 2 shared CPU cores keep runs to a few minutes each.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from awm.data import read_jsonl

from awm_grpo.launch.job import PLUGINS
from awm_grpo.launch.processes import recipe_env, run_logged
from awm_grpo.recovery import report, testbed
from awm_grpo.recovery import split as recovery_split
from awm_grpo.recovery.credit import CreditConfig
from slime.backends.checkpoint import copy_tokenizer_files

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "runs" / "awm_grpo" / "compare"
SPLITS = REPO / "runs" / "awm_grpo" / "splits" / "bundled"
MODELS = REPO / "runs" / "awm_grpo" / "models"
REFERENCE_ARM = "b1"
# An arm = the awm_credit_* keys it sets on top of the shared ones (docs/recovery-method.md, Baselines and ablations).
ARMS: dict[str, dict[str, Any]] = {
    "b1": {"awm_credit_method": "b1"},              # outcome-only GRPO
    "b1_window": {"awm_credit_method": "b1",        # B1 with its sliding window: the policy sees the task and
                  "awm_history_window_turns": 3},   # the last 3 turns, in training and in evaluation
    "b2": {"awm_credit_method": "b2"},              # action-based step reward, turn-level credit
    "b2plus": {"awm_credit_method": "b2plus"},      # an LLM judge's per-call score (needs --judge-url)
    "ours": {"awm_credit_method": "ours"},          # progress + verification bonus, carry + leave-one-out
    "traj_agg": {"awm_credit_method": "traj_agg"},  # ours' rewards summed per trajectory
    "s1_binary": {"awm_credit_method": "ours", "awm_credit_binary_only": True},
    "potential": {"awm_credit_method": "ours", "awm_credit_progress_form": "potential"},
    "naive": {"awm_credit_method": "ours", "awm_credit_estimator": "naive"},
    "v1_no_verify": {"awm_credit_method": "ours", "awm_credit_beta": 0.0},
}
# Keys that change how a policy acts, not how it is credited: its evaluation plays with them too.
ACTING_KEYS = ("awm_history_window_turns",)
TABLE_METRICS = ("recovery_success", "additional_damage", "verification_first_rate", "SR_ordinary")


def runtime_yaml(opts: argparse.Namespace, arm: str, predicates: Path, trace_dir: Path,
                 data_dir: str | None = None) -> dict[str, Any]:
    """The awm_* keys of one run: everything equal across arms except the arm's awm_credit_* keys."""
    keys = {"awm_predicates": str(predicates), "awm_credit_lambda": opts.lam, "awm_credit_beta": opts.beta,
            "awm_credit_eta": opts.eta, "awm_max_turns": opts.max_turns,
            "awm_max_tokens_per_turn": opts.max_tokens_per_turn, "awm_max_observation_tokens": 256,
            "awm_terminate_on_invalid_call": True, "awm_env_workers": 1, "awm_trace_dir": str(trace_dir),
            "awm_data_dir": data_dir, **ARMS[arm]}
    if arm == "b2plus":
        keys.update({"awm_judge_url": opts.judge_url, "awm_judge_model": opts.judge_model})
    return keys


def acting_keys(policy: str) -> dict[str, Any]:
    """The awm_* keys a policy is evaluated with: the arm's acting keys (B1's window; the rollout
    accepts the window only beside credit method b1), none for the base model."""
    keys = {k: v for k, v in ARMS.get(policy, {}).items() if k in ACTING_KEYS}
    return {"awm_credit_method": ARMS[policy]["awm_credit_method"], **keys} if keys else {}


def train_command(opts: argparse.Namespace, model: Path, run_dir: Path, config: Path, seed: int,
                  arm: str = REFERENCE_ARM) -> list[str]:
    """slime.train flags of one short CPU run (no dynamic-sampling filter: it would drop groups whose
    outcomes tie but whose progress differs, which only the method can use). B1's window splits an
    episode into samples, so its arm also trains with the per-token loss (awm_grpo.rollout)."""
    window = ["--calculate-per-token-loss"] if "awm_history_window_turns" in ARMS[arm] else []
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
            "--custom-advantage-function-path", "awm_grpo.recovery.advantages", "--custom-config-path", str(config), *window]


def _run(cmd: list[str], log: Path, timeout_s: float) -> int:
    return run_logged(cmd, log, timeout_s=timeout_s, env=recipe_env(), cwd=REPO)


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


def _prompt_rows(path: Path) -> list[dict[str, Any]]:
    return read_jsonl(path) if path.exists() else []


def held_out_tasks(which: str, splits_dir: Path = SPLITS) -> set[tuple[str, int]] | None:
    """(scenario, task_idx) of the prompt split(s) named by `which` (heldout = val + test); None for all."""
    if which == "all":
        return None
    names = ("val", "test") if which == "heldout" else (which,)
    return {(r["metadata"]["scenario"], int(r["metadata"]["task_idx"]))
            for name in names for r in _prompt_rows(Path(splits_dir) / f"{name}.jsonl")}


def ordinary_prompts(which: str, splits_dir: Path, dest: Path) -> Path | None:
    """The held-out prompts themselves (initial states), for success on non-damaged tasks; None for `all`."""
    if which == "all":
        return None
    names = ("val", "test") if which == "heldout" else (which,)
    rows = [r for name in names for r in _prompt_rows(Path(splits_dir) / f"{name}.jsonl")]
    dest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return dest if rows else None


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
    if opts.testbed:
        return testbed.ensure(Path(opts.testbed), warm_start=not opts.dry_run).resolve()
    if (MODELS / "warmstart" / "config.json").exists():
        return MODELS / "warmstart"
    print("compare: no warm-started model (python -m awm_grpo.warmstart --data runs/awm_grpo/splits/bundled "
          f"--out {MODELS / 'warmstart'}): using the random base model, which never calls a tool",
          file=sys.stderr)
    return MODELS / "base"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m awm_grpo.recovery.compare", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help=f"output folder (default {DEFAULT_OUT}, or TESTBED/compare)")
    p.add_argument("--testbed", help="a folder of `python -m awm_grpo.recovery.testbed`: its split, prompts, data "
                                     "and warm start (models/ws)")
    p.add_argument("--model", help="starting HF model folder (default: the testbed's or runs/awm_grpo/models/"
                                   "warmstart, else base)")
    p.add_argument("--split", help="controlled recovery split folder (default: OUT/split, built when missing)")
    p.add_argument("--train-prompts", default=None, help=f"default {SPLITS / 'train.jsonl'}")
    p.add_argument("--train-from", default="both", choices=["initial", "handovers", "both"],
                   help="train from the initial states (train split), from the split's handovers of the "
                        "non-held-out tasks, or both (default)")
    p.add_argument("--arms", nargs="+", default=["b1", "ours"], choices=list(ARMS),
                   help="credit methods and ablations to train (default b1 ours)")
    p.add_argument("--judge-url", help="b2plus: OpenAI-compatible endpoint of the judge model")
    p.add_argument("--judge-model", help="b2plus: the judge's model name")
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
    p.add_argument("--eval-n", type=int, default=1, help="episodes per handover (and held-out task) per seed")
    p.add_argument("--eval-temperature", type=float, default=0.7)
    p.add_argument("--no-ordinary", action="store_true", help="skip success on the held-out tasks from their "
                                                              "initial states")
    p.add_argument("--train-timeout", type=float, default=900.0, help="seconds per training run")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--report-only", action="store_true", help="rewrite compare.md and the plots of the finished run "
                                                               "in OUT from its compare.json and traces")
    opts = p.parse_args(argv)
    if "b2plus" in opts.arms and not (opts.judge_url and opts.judge_model):
        p.error("arm b2plus needs a judge: --judge-url URL --judge-model NAME (any OpenAI-compatible endpoint)")
    if opts.testbed:
        tb = opts.testbed = str(Path(opts.testbed).resolve())
        if Path(tb).exists() and not (Path(tb) / "testbed.json").exists():
            p.error(f"{tb} exists but is not a testbed: give a new folder (it is built there) or one written by "
                    "`python -m awm_grpo.recovery.testbed`")
        tb = Path(tb)
        opts.split = opts.split or str(tb / "split")
        opts.train_prompts = opts.train_prompts or str(tb / "prompts" / "train.jsonl")
        opts.out = opts.out or str(tb / "compare")
    opts.train_prompts = opts.train_prompts or str(SPLITS / "train.jsonl")
    opts.out = opts.out or str(DEFAULT_OUT)
    return opts


def prepare_inputs(opts: argparse.Namespace, out: Path) -> Path:
    """Build the split and the CPU profile's splits when missing (bundled mode); returns the split folder."""
    if opts.testbed:
        testbed.ensure(Path(opts.testbed), warm_start=False)
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
    return split


class Evaluation:
    """Every policy's held-out figures, per seed: handover metrics, per-handover outcomes, ordinary SR."""

    def __init__(self, opts: argparse.Namespace, split: Path, tasks: set[tuple[str, int]] | None,
                 ordinary: Path | None, saved: Path | None = None) -> None:
        self.opts, self.split, self.tasks, self.ordinary, self.saved = opts, split, tasks, ordinary, saved
        self.runs: dict[str, Any] = {}  # "policy/seedK" -> metrics, per-handover outcomes, eval seconds
        self.results: dict[str, Any] = {}  # compare.json, rewritten after every evaluation

    def __call__(self, name: str, policy: Path, seed: int) -> None:
        o, started = self.opts, time.perf_counter()
        common = {"model": str(policy), "seed": seed, "n": o.eval_n, "temperature": o.eval_temperature,
                  "max_turns": o.max_turns, "max_tokens_per_turn": o.max_tokens_per_turn,
                  "max_response_len": o.max_response_len, "limit": o.eval_limit, "runtime": acting_keys(name)}
        metrics, records = recovery_split.evaluate(self.split, tasks=self.tasks, **common)
        if self.ordinary is not None:
            ordinary, _ = recovery_split.play_like(self.split, self.ordinary, **common)
            metrics.setdefault("all", {})["SR_ordinary"] = (ordinary.get("all") or {}).get("SR")
        self.runs[f"{name}/seed{seed}"] = {"metrics": metrics, "eval_s": round(time.perf_counter() - started, 1),
                                           "handovers": report.per_item_success(records)}
        if self.saved is not None:  # an interrupted comparison keeps what it measured (`--report-only`)
            self.saved.write_text(json.dumps({**self.results, "runs": self.runs, "partial": True}, default=str))
        print(f"[compare] evaluated {name} seed {seed} in {time.perf_counter() - started:.0f}s: recovery_success "
              f"{_rate(metrics, 'recovery_success')}, SR_ordinary {_rate(metrics, 'SR_ordinary')}", file=sys.stderr)


def _rate(metrics: dict[str, Any], key: str) -> str:
    value = (metrics.get("all") or {}).get(key)
    return f"{value['rate']:.3f} ({value['n']}/{value['of']})" if isinstance(value, dict) and value.get("of") else "-"


def summarize(per_policy: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, tuple[float, float, int]]]:
    """Policy -> metric -> (mean, std over seeds, seeds with a value), over all task types."""
    return {name: recovery_split.summarize(runs, TABLE_METRICS).get("all", {}) for name, runs in per_policy.items()}


def paired_tests(metrics: dict[str, list[dict[str, Any]]],
                 items: dict[str, list[dict[str, list[float]]]]) -> dict[str, dict[str, dict[str, float] | None]]:
    """Each policy against B1 (report.py): recovery_success over seeds and over handovers, and
    SR_ordinary over seeds (the method must not cost ordinary success)."""
    if REFERENCE_ARM not in metrics:
        return {}

    def rates(name: str, key: str) -> list[float]:
        return [m["all"][key]["rate"] if isinstance(m["all"].get(key), dict) and m["all"][key]["rate"] is not None
                else float("nan") for m in metrics[name]]

    out = {}
    for name in metrics:
        if name == REFERENCE_ARM:
            continue
        same = len(metrics[name]) == len(metrics[REFERENCE_ARM])
        out[name] = {"recovery_seeds": report.paired_t(rates(name, "recovery_success"),
                                                       rates(REFERENCE_ARM, "recovery_success")) if same else None,
                     "recovery_handovers": report.sign_flip(report.handover_diffs(items[name], items[REFERENCE_ARM])),
                     "ordinary_seeds": report.paired_t(rates(name, "SR_ordinary"), rates(REFERENCE_ARM, "SR_ordinary"))
                     if same and "SR_ordinary" in metrics[name][0]["all"] else None}
    return out


def run_curves(out: Path, arms: list[str], seeds: list[int]) -> dict[str, dict[str, list[dict[int, float]]]]:
    """kind (recovery: damaged starts, ordinary: initial states) -> arm -> per seed: success by training step."""
    from awm_grpo.traces import read_records

    curves: dict[str, dict[str, list[dict[int, float]]]] = {"recovery": {}, "ordinary": {}}
    for arm in arms:
        for seed in seeds:
            records = read_records(out / f"{arm}-seed{seed}" / "traces", "rollout_*.jsonl")
            curves["recovery"].setdefault(arm, []).append(report.learning_curve(records, handovers=True))
            curves["ordinary"].setdefault(arm, []).append(report.learning_curve(records, handovers=False))
    return curves


def write_report(out: Path, results: dict[str, Any]) -> None:
    """compare.json, compare.md and the plots from the runs' evaluations and traces (also `--report-only`)."""
    metrics: dict[str, list[dict[str, Any]]] = {}
    items: dict[str, list[dict[str, list[float]]]] = {}
    for key, run in results["runs"].items():  # "policy/seedK", in the order they ran
        name = key.rsplit("/", 1)[0]
        metrics.setdefault(name, []).append(run["metrics"])
        items.setdefault(name, []).append(run["handovers"])
    table = summarize(metrics)
    tests = paired_tests(metrics, items)
    ran = [arm for arm in results["arms"] if arm in metrics]  # an interrupted comparison: the arms it reached
    curves = run_curves(out, ran, results["seeds"])
    results.update(table=table, tests=tests, by_task_type={n: recovery_split.summarize(r) for n, r in metrics.items()},
                   curves={kind: {a: [{str(k): v for k, v in c.items()} for c in cs] for a, cs in by_arm.items()}
                           for kind, by_arm in curves.items()})
    (out / "compare.json").write_text(json.dumps(results, indent=1, default=str))
    b = results["budget"]
    title = (f"{Path(results['testbed']).name if results.get('testbed') else 'bundled split'}: {b['steps']} steps x "
             f"{b['batch']} prompts x {b['group']} rollouts, seeds {' '.join(map(str, results['seeds']))}")
    plots = report.plot(out, {kind: {a: [report.smooth(c, 5) for c in cs] for a, cs in by_arm.items()}
                              for kind, by_arm in curves.items()}, table, ("recovery_success", "SR_ordinary"), title)
    md = (f"Held-out handovers ({results['eval_tasks']}) of {results['split']}, {title}; eval n={b['eval_n']} at T "
          f"{b['eval_temperature']}; mean +- std over seeds; paired tests against B1 (report.py). "
          + (f"Interrupted: {len(results['runs'])} evaluations. " if results.get("partial") else
             f"Wall time {results.get('wall_s', 0) / 60:.1f} min. ")
          + "\n\n" + report.markdown_table(table, TABLE_METRICS, tests))
    (out / "compare.md").write_text(md)
    print("\n" + md)
    recovery_split.print_table(results["by_task_type"])
    print(f"\nwrote {out / 'compare.json'}, {out / 'compare.md'}, {', '.join(str(x) for x in plots)}")
    base = table.get("base", {}).get("recovery_success")
    if base and base[2] and base[0] in (0.0, 1.0) and base[1] == 0:
        print(f"WARNING: the starting model's recovery success is {base[0]:.0f} on every seed: no arm can be told "
              "apart from another on this split (docs/recovery-method.md)", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    started = time.perf_counter()
    out = Path(opts.out).resolve()
    if opts.report_only:
        if not (out / "compare.json").exists():
            raise SystemExit(f"{out / 'compare.json'} does not exist: --report-only rewrites the report of a finished run")
        write_report(out, json.loads((out / "compare.json").read_text()))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    split = prepare_inputs(opts, out)
    model = starting_model(opts)
    splits_dir = Path(opts.train_prompts).parent
    tasks = held_out_tasks(opts.eval_tasks, splits_dir)
    if not opts.dry_run or (split / "split.jsonl").exists():
        opts.train_prompts = str(training_prompts(opts, split, tasks, out / "train_prompts.jsonl"))
    data_dir = None
    if (split / "manifest.json").exists():
        data_dir = json.loads((split / "manifest.json").read_text()).get("data_dir")
    ordinary = None if opts.no_ordinary else ordinary_prompts(opts.eval_tasks, splits_dir, out / "ordinary.jsonl")
    ev = Evaluation(opts, split, tasks, ordinary, None if opts.dry_run else out / "compare.json")
    results: dict[str, Any] = ev.results
    results.update({"model": str(model), "split": str(split), "eval_tasks": opts.eval_tasks,
                    "train_from": opts.train_from, "testbed": opts.testbed, "seeds": opts.seeds, "arms": opts.arms,
                    "budget": {k: getattr(opts, k) for k in ("steps", "batch", "group", "lr", "eval_n",
                                                             "eval_temperature", "max_turns")},
                    "runs": ev.runs, "commands": {}, "train_s": {}})
    for seed in opts.seeds if not (opts.no_base or opts.dry_run) else []:
        ev("base", model, seed)
    # arm by arm, every seed of one before the next: an interrupted comparison still has whole arms
    for arm, seed in ((arm, seed) for arm in opts.arms for seed in opts.seeds):
        run_dir = out / f"{arm}-seed{seed}"
        if run_dir.exists() and not opts.dry_run:
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        config = run_dir / "awm_runtime.yaml"
        config.write_text(yaml.safe_dump(runtime_yaml(opts, arm, split / "predicates.jsonl", run_dir / "traces",
                                                      data_dir)))
        cmd = train_command(opts, model, run_dir, config, seed, arm)
        results["commands"][f"{arm}/seed{seed}"] = " ".join(cmd)
        if opts.dry_run:
            print(" ".join(cmd))
            continue
        t0 = time.perf_counter()
        rc = _run(cmd, run_dir / "train.log", opts.train_timeout)
        results["train_s"][f"{arm}/seed{seed}"] = round(time.perf_counter() - t0, 1)
        print(f"[compare] trained {arm} seed {seed}: rc={rc} in {time.perf_counter() - t0:.0f}s", file=sys.stderr)
        if rc != 0:
            raise SystemExit(f"training {arm} seed {seed} failed (rc={rc}): see {run_dir / 'train.log'}")
        ev(arm, final_model(run_dir, model), seed)
    if opts.dry_run:
        return 0
    results["wall_s"] = round(time.perf_counter() - started, 1)
    results.pop("partial", None)
    write_report(out, results)
    return 0

if __name__ == "__main__":
    sys.exit(main())

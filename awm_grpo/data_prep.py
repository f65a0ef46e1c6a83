"""Train/val/test prompt files for the recipe, split by scenario (default) or by task.

    python -m awm_grpo.data_prep --out runs/awm_grpo/splits/bundled            # bundled scenarios
    python -m awm_grpo.data_prep --data-dir data/awm1k --out runs/awm_grpo/splits/awm1k --max-scenarios 500

Why by scenario: a scenario's tasks share its database and tools, so a task of a training scenario
says a lot about a "held-out" task of the same scenario. Splitting scenarios keeps val/test honest.
`--split-by task` (held-out tasks within the same scenarios) exists for tiny demos such as the six
bundled scenarios, where three scenarios per split would be too few to learn anything.

Allocation is seeded systematic sampling: units (scenarios or tasks) are grouped by stratum (the
task type; for a scenario its most common task type; for a practice-set family instance split by
task, its family, so every family has training and held-out instances), shuffled within a stratum with `--seed`,
laid end to end, and dealt one by one to the split whose share lags most behind its ratio:

    split(k) = argmax_s  k * ratio_s - assigned_s(k-1)      (ties -> train, then val, then test)

so every stratum is spread over the splits in proportion and the global counts follow the ratios.
Only tasks with a code verifier are written (of runnable scenarios unless `--include-unrunnable`).
Same inputs -> byte-identical files; `split_info.json` holds everything needed to redo the split.

`--task-mix` (the plan's state-mutating ratio ablation) reshapes train.jsonl only, after the split,
so val and test are the same for every mix: `natural` (R1) writes the split as is; `mutating_2x`
(R2) writes every state-mutating task twice; `mutating_only` (R3) drops the other task types. The
two non-natural mixes shuffle train.jsonl with `--seed` so duplicates are not adjacent. They need
task types (`--task-types` or the bundled labels); an unlabelled task is an error there.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from awm.audit import read_exclusions
from awm.data import AWMDataset, bundled_data_dir, normalize_scenario_name, read_jsonl

logger = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
TASK_MIXES = ("natural", "mutating_2x", "mutating_only")  # the plan's R1, R2, R3
MUTATING = "state_mutating"
LABELS_FILE = "reference_solutions.jsonl"  # carries `task_type` per task in the bundled data


class SplitError(ValueError):
    """The data cannot be split as asked; the message says what to change."""


@dataclass(frozen=True)
class Task:
    scenario: str
    task_idx: int
    task: str
    task_type: str | None
    family: str | None = None  # practice set: the task family of an instance (stratum of the task split)
    world: int = 0  # practice set: k >= 1 for an instance of renamed world k (training only)

    @property
    def base(self) -> str:
        """The real scenario of a renamed world's task (`<name>_w<k>` -> `<name>`)."""
        suffix = f"_w{self.world}"
        return self.scenario[:-len(suffix)] if self.world and self.scenario.endswith(suffix) else self.scenario


def read_task_types(path: str | Path, field: str = "task_type") -> dict[tuple[str, int], str]:
    """(scenario, task_idx) -> task_type (or another `field`) from JSONL rows of {scenario, task_idx, field}."""
    out: dict[tuple[str, int], str] = {}
    for lineno, row in enumerate(read_jsonl(path), start=1):
        try:
            key = (normalize_scenario_name(row["scenario"]), int(row["task_idx"]))
        except (KeyError, TypeError, ValueError):
            raise SplitError(f"{path}: row {lineno} needs 'scenario' and an integer 'task_idx'") from None
        if row.get(field) is not None:
            out[key] = str(row[field])
    return out


def load_tasks(data_dir: Path, *, task_types_file: str | Path | None = None, exclude_file: str | Path | None = None,
               include_unrunnable: bool = False) -> tuple[list[Task], str | None]:
    """Every task with a code verifier, labelled with its task type where a label exists.

    Labels: `reference_solutions.jsonl` of the data dir if present, then `task_types_file` (wins).
    Returns the tasks and a description of the label source (None: unlabelled).
    """
    exclude = read_exclusions(exclude_file) if exclude_file else set()
    dataset = AWMDataset(data_dir, exclude=exclude)
    labels: dict[tuple[str, int], str] = {}
    families: dict[tuple[str, int], str] = {}
    worlds: dict[tuple[str, int], str] = {}
    sources = []
    bundled_labels = data_dir / LABELS_FILE
    if bundled_labels.is_file():
        labels.update(read_task_types(bundled_labels))
        families = read_task_types(bundled_labels, "family")
        worlds = read_task_types(bundled_labels, "world")
        sources.append(str(bundled_labels))
    if task_types_file:
        labels.update(read_task_types(task_types_file))
        sources.append(str(task_types_file))
    tasks = []
    for scenario, idx in dataset.task_keys(runnable_only=not include_unrunnable):
        texts = dataset.tasks(scenario)
        tasks.append(Task(scenario, idx, texts[idx], labels.get((scenario, idx)), families.get((scenario, idx)),
                          int(worlds.get((scenario, idx), 0))))
    if not tasks:
        hint = "" if include_unrunnable else " (runnable scenarios only: pass --include-unrunnable to list " \
                                             "tasks of scenarios without environment code)"
        raise SplitError(f"{data_dir} has no task with a code verifier{hint}")
    return tasks, (" + ".join(sources) if sources and any(t.task_type for t in tasks) else None)


def target_counts(n: int, ratios: tuple[float, ...]) -> list[int]:
    """Largest-remainder rounding of n * ratios (sums to n; ties -> earlier split)."""
    raw = [n * r for r in ratios]
    counts = [int(x) for x in raw]
    order = sorted(range(len(ratios)), key=lambda i: (-(raw[i] - counts[i]), i))
    for i in order[: n - sum(counts)]:
        counts[i] += 1
    return counts


def deal(units: list[tuple[str | None, Any]], ratios: tuple[float, ...], seed: int) -> list[list[Any]]:
    """Seeded stratified systematic allocation of (stratum, unit) pairs; see the module docstring."""
    rng = random.Random(seed)
    by_stratum: dict[str, list[Any]] = {}
    for stratum, unit in units:
        by_stratum.setdefault(stratum or "", []).append(unit)
    ordered = []
    for stratum in sorted(by_stratum):
        block = sorted(by_stratum[stratum])
        rng.shuffle(block)
        ordered += block
    targets = target_counts(len(ordered), ratios)
    out: list[list[Any]] = [[] for _ in ratios]
    for k, unit in enumerate(ordered, start=1):
        open_splits = [s for s in range(len(ratios)) if len(out[s]) < targets[s]]
        best = max(open_splits, key=lambda s: (k * ratios[s] - len(out[s]), -s))
        out[best].append(unit)
    return out


def dominant_type(tasks: list[Task]) -> str | None:
    """A scenario's stratum: its most common task type (ties -> alphabetical), None if unlabelled."""
    counts = Counter(t.task_type for t in tasks if t.task_type)
    if not counts:
        return None
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]


def split_tasks(tasks: list[Task], *, ratios: tuple[float, ...], seed: int, split_by: str,
                max_scenarios: int | None = None) -> dict[str, list[Task]]:
    """Assign every task to train/val/test; by scenario, no scenario is in two splits.

    Tasks of renamed worlds (awm.scenarios.worlds) are training data: they go to train when their
    real scenario does (split by task: always), never to val or test. A world task whose text is
    word for word a val/test task's (nothing in it was renamed: `What is the base fare on flight AB
    78?`) is dropped: its world keeps the codes and numbers (amounts too, unless built with
    --vary-amounts), so training on it would train on the held-out task itself."""
    if len(ratios) != len(SPLITS) or any(r < 0 for r in ratios) or abs(sum(ratios) - 1.0) > 1e-6:
        raise SplitError(f"--ratios {list(ratios)}: give three non-negative numbers that sum to 1")
    by_scenario: dict[str, list[Task]] = {}
    renamed: dict[str, list[Task]] = {}
    for t in tasks:
        (renamed if t.world else by_scenario).setdefault(t.base, []).append(t)
    names = sorted(by_scenario)
    if max_scenarios is not None:  # a seeded sample, not the first N in file order
        random.Random(seed).shuffle(names)
        names = sorted(names[:max_scenarios])
    if split_by == "scenario":
        dealt = deal([(dominant_type(by_scenario[n]), n) for n in names], ratios, seed)
        chosen = [[t for n in sorted(part) for t in by_scenario[n]] for part in dealt]
        chosen[0] += [t for n in sorted(dealt[0]) for t in renamed.get(n, [])]
    elif split_by == "task":  # stratum: the task family where there is one, so each family reaches every split
        units = [(t.family and f"{t.scenario}/{t.family}" or t.task_type, (t.scenario, t.task_idx))
                 for n in names for t in by_scenario[n]]
        index = {(t.scenario, t.task_idx): t for t in tasks}
        chosen = [[index[k] for k in sorted(part)] for part in deal(units, ratios, seed)]
        chosen[0] += [t for n in names for t in renamed.get(n, [])]
    else:
        raise SplitError(f"--split-by {split_by!r}: use 'scenario' or 'task'")
    held_out = {t.task for part in chosen[1:] for t in part}
    train = [t for t in chosen[0] if not (t.world and t.task in held_out)]
    if len(train) < len(chosen[0]):
        logger.info("dropped %d renamed-world tasks worded exactly as a val/test task", len(chosen[0]) - len(train))
    chosen[0] = train
    out = dict(zip(SPLITS, chosen, strict=True))
    for name, ratio in zip(SPLITS, ratios, strict=True):
        if ratio > 0 and not out[name]:
            hint = " (try --split-by task)" if split_by == "scenario" else ""
            logger.warning("split %s is empty: %d %ss are too few for ratios %s%s", name,
                           len(names) if split_by == "scenario" else len(tasks), split_by, list(ratios), hint)
    return out


def mix_train(train: list[Task], task_mix: str, seed: int) -> list[Task]:
    """The training prompts under `task_mix` (module docstring); val and test never pass through here."""
    if task_mix == "natural":
        return train
    if task_mix not in TASK_MIXES:
        raise SplitError(f"--task-mix {task_mix!r}: use one of {', '.join(TASK_MIXES)}")
    unlabelled = [f"{t.scenario}/{t.task_idx}" for t in train if not t.task_type]
    if unlabelled:
        raise SplitError(f"--task-mix {task_mix} needs the task type of every training task; {len(unlabelled)} have "
                         f"none (e.g. {unlabelled[0]}): pass --task-types FILE (rows of scenario, task_idx, "
                         "task_type, e.g. a predicates JSONL from `awm predicates build`)")
    mutating = [t for t in train if t.task_type == MUTATING]
    if not mutating:
        raise SplitError(f"--task-mix {task_mix}: the training split has no {MUTATING} task")
    out = mutating if task_mix == "mutating_only" else [t for t in train for _ in range(2 if t.task_type == MUTATING
                                                                                        else 1)]
    out = list(out)
    random.Random(f"task-mix/{seed}").shuffle(out)
    return out


def prompt_record(task: Task, split: str, data_dir: Path) -> dict[str, Any]:
    """One prompt line; the rollout adds the system prompt and the tools itself."""
    meta = {"scenario": task.scenario, "task_idx": task.task_idx, "task": task.task,
            "task_type": task.task_type, "split": split, "data_dir": str(data_dir)}
    if task.family:
        meta["family"] = task.family
    if task.world:
        meta["world"] = task.world
    return {"text": [{"role": "user", "content": task.task}], "metadata": meta}


def prepare(out: str | Path, *, data_dir: str | Path | None = None, seed: int = 42,
            ratios: tuple[float, ...] = (0.7, 0.15, 0.15), split_by: str = "scenario",
            task_types_file: str | Path | None = None, max_scenarios: int | None = None,
            exclude_file: str | Path | None = None, include_unrunnable: bool = False,
            task_mix: str = "natural") -> dict[str, Any]:
    """Write train/val/test.jsonl and split_info.json into `out`; returns the split info."""
    bundled = data_dir is None
    root = (bundled_data_dir() if bundled else Path(data_dir)).resolve()
    tasks, label_source = load_tasks(root, task_types_file=task_types_file, exclude_file=exclude_file,
                                     include_unrunnable=include_unrunnable)
    parts = split_tasks(tasks, ratios=tuple(ratios), seed=seed, split_by=split_by, max_scenarios=max_scenarios)
    split_train = parts["train"]
    parts["train"] = mix_train(split_train, task_mix, seed)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name, part in parts.items():
        lines = "".join(json.dumps(prompt_record(t, name, root), ensure_ascii=False) + "\n" for t in part)
        tmp = out / f".{name}.jsonl.tmp"
        tmp.write_text(lines, encoding="utf-8")
        tmp.replace(out / f"{name}.jsonl")  # atomic: a reader never sees half a split
    info = {
        "data_dir": str(root), "bundled": bundled, "seed": seed, "ratios": list(ratios), "split_by": split_by,
        "max_scenarios": max_scenarios, "include_unrunnable": include_unrunnable,
        "exclude_file": str(Path(exclude_file).resolve()) if exclude_file else None,
        "task_types_file": str(Path(task_types_file).resolve()) if task_types_file else None,
        "stratified_by": "task_type" if label_source else None, "task_type_source": label_source,
        "task_mix": task_mix, "train_before_mix": {"prompts": len(split_train), "task_types": dict(sorted(
            Counter(t.task_type or "unlabelled" for t in split_train).items()))},
        "scenarios": {n: sorted({t.scenario for t in p}) for n, p in parts.items()},
        "counts": {n: {"tasks": len(p), "scenarios": len({t.scenario for t in p}),
                       "task_types": dict(sorted(Counter(t.task_type or "unlabelled" for t in p).items()))}
                   for n, p in parts.items()},
    }
    (out / "split_info.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    return info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m awm_grpo.data_prep", description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default=None, help="AWM-1K data folder (default: the bundled scenarios)")
    p.add_argument("--out", required=True, help="folder for train.jsonl, val.jsonl, test.jsonl, split_info.json")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--ratios", type=float, nargs=3, default=[0.7, 0.15, 0.15], metavar=("TRAIN", "VAL", "TEST"))
    p.add_argument("--split-by", choices=["scenario", "task"], default="scenario",
                   help="scenario: no scenario in two splits (default); task: held-out tasks within scenarios")
    p.add_argument("--task-types", default=None, help="JSONL of {scenario, task_idx, task_type} labels to "
                   "stratify by (the bundled data carries them in reference_solutions.jsonl)")
    p.add_argument("--max-scenarios", type=int, default=None, help="a seeded sample of this many scenarios")
    p.add_argument("--exclude", default=None, help="`awm verify audit --out` file: drop the tasks it flags")
    p.add_argument("--include-unrunnable", action="store_true",
                   help="also tasks of scenarios without environment code or DB (listing only; cannot be played)")
    p.add_argument("--task-mix", choices=TASK_MIXES, default="natural",
                   help="training prompts: natural (R1), every state-mutating task twice (R2), state-mutating only "
                   "(R3); val/test are unchanged")
    opts = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        info = prepare(opts.out, data_dir=opts.data_dir, seed=opts.seed, ratios=tuple(opts.ratios),
                       split_by=opts.split_by, task_types_file=opts.task_types, max_scenarios=opts.max_scenarios,
                       exclude_file=opts.exclude, include_unrunnable=opts.include_unrunnable, task_mix=opts.task_mix)
    except (SplitError, FileNotFoundError) as exc:
        print(f"data_prep: {exc}", file=sys.stderr)
        return 2
    for name in SPLITS:
        c = info["counts"][name]
        print(f"{name:5s} {c['tasks']:5d} tasks  {c['scenarios']:4d} scenarios  {c['task_types']}")
    print(f"wrote {Path(opts.out).resolve()}/{{train,val,test}}.jsonl and split_info.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The recovery testbed: damage a small CPU model can sometimes repair by sampling, so RL can learn it.

    python -m awm_grpo.recovery.testbed --out runs/awm_grpo/recovery_testbed [--worlds 6] [--seed 0] [--warm-start]

The bundled controlled split (awm_grpo.recovery.split on the hand-written tasks) asks for repairs the
warm-started CPU model never makes (0 of 37 before and after training), so it cannot tell methods
apart. This testbed keeps the split's machinery and changes the tasks:

- four task families whose write *sets* a value (awm.scenarios families with a `wrong` solution):
  `set_cart_quantity`, `set_priority`, `raise_budget_limit`, `home_branch`. Their wrong write is a
  plausible slip on the right row (quantity one too many, a neighbouring priority, the limit $10
  off, another branch), made by the agent itself in the handed-over conversation, and the tool's
  result shows the value it wrote: the damage is observable;
- the repair is an action the model already knows (the same tool, with the value from the task),
  but in a place where its training never had one: the warm start (awm_grpo.warmstart on
  `prompts/train.jsonl`) imitates reference plans and never sees a repair. Three companion
  families (two cart lines, two issues' priorities, two budgets in one task; never damaged) are
  ordinary tasks whose plans write twice with the same tool. Without more, the warm start answers
  right after the handover (0 repairs in 200 sampled episodes at T 1.0, every variant tried:
  docs/recovery-method.md), so RL has nothing to reinforce. So the warm start also plays a
  fraction of its plans as *rechecks* (`--recheck-writes`, RECHECK_WRITES): reads, write, the
  same reads, the same write again, which on a right state changes nothing. It learns that a write
  may follow "reads after a write", the handover's shape, without ever seeing a repair: whether the
  second write copies the task's value (a repair) or the previous call's (the damage again) is
  left to sampling, and RL has to make the repair a habit;
- held-out instances come from held-out worlds: the original scenarios (world 0) and the last renamed
  world are never trained on, so every held-out handover is a conversation in names the policy has
  not seen. Renamed worlds keep the slot rows' ids and values (only names change), so a held-out
  instance's ids and values did occur in training, under other names; holding out whole slot rows
  instead left the small warm start at 0 % on the held-out tasks themselves (it recalls ids and
  values by position rather than copying them), which would make "ordinary success" meaningless.

Writes to OUT: `data/` (an AWM data folder with only the testbed tasks of the original scenarios
and `--worlds` renamed worlds), `prompts/train.jsonl` and `prompts/test.jsonl` (data_prep's prompt
format; `val.jsonl` is empty: nothing is tuned on held-out tasks), `split/` (the controlled recovery
split of every instance: `split.jsonl`, `states/`, `predicates.jsonl`, `manifest.json`) and
`testbed.json` (counts, held-out worlds, the split's manifest).

The base policy's repair rate must lie strictly between 0 and the ceiling for a comparison to mean
anything: `python -m awm_grpo.recovery.compare --testbed OUT` reports it first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "runs" / "awm_grpo" / "recovery_testbed"
REPAIR_FAMILIES = {"online_grocery_1": "set_cart_quantity", "project_tracker_1": "set_priority",
                   "personal_finance_1": "raise_budget_limit", "library_lending_1": "home_branch"}
# Ordinary tasks beside them, never damaged: plans in which a write of the same tool follows a write
# Fraction of the warm start's plans also played as rechecks (module doc; docs/recovery-method.md has the
# base repair rates this gives)
RECHECK_WRITES = 0.6
COMPANION_FAMILIES = {"online_grocery_1": "set_two_cart_quantities", "project_tracker_1": "set_two_priorities",
                      "personal_finance_1": "raise_two_budget_limits"}


def _lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def testbed_data(worlds: int) -> dict[str, str]:
    """File name -> text of an AWM data folder holding only the testbed families' instances.

    Tasks are renumbered per scenario (AWM's task_idx is a position in `gen_tasks`), so the folder
    is a normal AWM-1K-shaped data folder the runtime, predicates and splits read unchanged."""
    from awm.scenarios.build import render

    files = render(practice=True, names=sorted(REPAIR_FAMILIES), worlds=worlds, testbed=True)
    solutions = _lines(files["reference_solutions.jsonl"])
    keep: dict[str, list[int]] = {}  # scenario -> old task indices, in order
    for r in solutions:
        base = r["scenario"].rsplit("_w", 1)[0] if r.get("world") else r["scenario"]
        if r.get("family") and r["family"] in (REPAIR_FAMILIES.get(base), COMPANION_FAMILIES.get(base)):
            keep.setdefault(r["scenario"], []).append(r["task_idx"])
    new_idx = {(s, old): new for s, olds in keep.items() for new, old in enumerate(olds)}
    out: dict[str, list[dict[str, Any]]] = {}
    for name, text in files.items():
        rows = []
        for r in _lines(text):
            if r.get("scenario", r.get("name")) not in keep:
                continue
            if name == "gen_tasks.jsonl":
                r = {**r, "tasks": [r["tasks"][i] for i in keep[r["scenario"]]]}
            elif "task_idx" in r:
                if (r["scenario"], r["task_idx"]) not in new_idx:
                    continue
                r = {**r, "task_idx": new_idx[(r["scenario"], r["task_idx"])]}
            rows.append(r)
        out[name] = rows
    return {name: "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows) for name, rows in out.items()}


def held_out_worlds(worlds: int) -> list[int]:
    """The worlds held out: the original scenarios (world 0) and, with renamed worlds, the last one."""
    return [0] + ([worlds] if worlds >= 2 else [])


def write_prompts(data_dir: Path, out: Path, held: list[int]) -> dict[str, int]:
    """prompts/{train,val,test}.jsonl: instances of held-out worlds go to test, the rest to train."""
    from awm_grpo.data_prep import load_tasks, prompt_record

    tasks, _ = load_tasks(data_dir)
    parts: dict[str, list[str]] = {"train": [], "val": [], "test": []}
    for t in tasks:
        part = "test" if t.world in held else "train"
        parts[part].append(json.dumps(prompt_record(t, part, data_dir), ensure_ascii=False))
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in parts.items():
        (out / f"{name}.jsonl").write_text("".join(r + "\n" for r in rows), encoding="utf-8")
    return {name: len(rows) for name, rows in parts.items()}


def build(out: Path, *, worlds: int = 6) -> dict[str, Any]:
    """Write the whole testbed to `out` (module docstring); returns `testbed.json`'s content."""
    from awm_grpo.recovery import split as recovery_split

    data_dir = out / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    for name, text in testbed_data(worlds).items():
        (data_dir / name).write_text(text, encoding="utf-8")
    held = held_out_worlds(worlds)
    counts = write_prompts(data_dir, out / "prompts", held)
    manifest = asyncio.run(recovery_split.build(out / "split", data_dir=str(data_dir), predicates=None,
                                                scenarios=None, tool_mode="meta", weak_traces=[], max_per_task=1,
                                                max_chars=2000, list_tools=False, read_back=True))
    info = {"worlds": worlds, "families": REPAIR_FAMILIES, "held_out_worlds": held,
            "prompts": counts, "split": manifest, "data_dir": str(data_dir.resolve())}
    (out / "testbed.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def warm_start_command(out: Path, seed: int = 0) -> list[str]:
    """The testbed's warm start: reference plans of the train instances (and rechecks of a
    RECHECK_WRITES fraction of them) only, never a repair.

    From scratch, as the practice-set start of docs/results.md but smaller (4 layers, 12 epochs,
    a 1,500-episode copy drill): about 15 minutes on 2 idle cores."""
    return [sys.executable, "-m", "awm_grpo.warmstart", "--data", str(out / "prompts"), "--data-dir",
            str(out / "data"), "--out", str(out / "models" / "ws"), "--layers", "4", "--split-digits",
            "--counterfactuals", "2", "--epochs", "12", "--no-list-tools", "--drill", "1500",
            "--drill-kinds", "name,value,id", "--recheck-writes", str(RECHECK_WRITES),
            "--seed", str(seed)]


def ensure(out: Path, *, worlds: int = 6, seed: int = 0, warm_start: bool = True) -> Path:
    """Build what `out` lacks (the testbed, then its warm start); returns the warm-started model folder."""
    import subprocess

    if not (out / "testbed.json").exists():
        print(f"building the recovery testbed in {out}", file=sys.stderr)
        build(out, worlds=worlds)
    model = out / "models" / "ws"
    if warm_start and not (model / "config.json").exists():
        cmd = warm_start_command(out, seed)
        print(f"warm-starting the testbed's model (about 15 min on 2 cores): {' '.join(cmd[1:])}", file=sys.stderr)
        if subprocess.run(cmd, cwd=REPO).returncode != 0:
            raise SystemExit(f"the warm start failed: rerun `{' '.join(cmd)}` to see why")
    return model


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m awm_grpo.recovery.testbed", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(DEFAULT_OUT), help=f"output folder (default {DEFAULT_OUT})")
    p.add_argument("--worlds", type=int, default=6, help="renamed worlds besides the original scenarios (default 6)")
    p.add_argument("--seed", type=int, default=0, help="the warm start's seed")
    p.add_argument("--warm-start", action="store_true", help="also warm-start its model (models/ws, ~15 min)")
    opts = p.parse_args(argv)
    if opts.worlds < 0:
        p.error("--worlds must be >= 0")
    out = Path(opts.out).resolve()
    info = build(out, worlds=opts.worlds)
    if opts.warm_start:
        ensure(out, worlds=opts.worlds, seed=opts.seed)
    print(json.dumps({k: info[k] for k in ("prompts", "held_out_worlds")} | {"split": info["split"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

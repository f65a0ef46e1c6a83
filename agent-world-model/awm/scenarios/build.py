"""Assemble the bundled scenarios' AWM-1K files from their sources.

Each `<scenario>/scenario.py` holds the data and `<scenario>/app.py` the environment code;
this writes the exact AWM-1K record shapes to `data/`, one line per record, so the runtime
reads bundled scenarios and a downloaded AWM-1K through the same code path.

`--practice DIR` writes the practice set instead: the same scenarios with, after each scenario's ten
hand-written tasks, every instance of its task families (awm.scenarios.families). It is not committed:
setup.sh builds it for the CPU recipe.

Usage: python -m awm.scenarios.build [--check] [--practice DIR]
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATA_DIR = HERE / "data"


def scenario_names() -> list[str]:
    """Every folder beside this file that holds a scenario.py, sorted."""
    return sorted(p.parent.name for p in HERE.glob("*/scenario.py"))


def _source(name: str) -> Any:
    src = importlib.import_module(f"awm.scenarios.{name}.scenario")
    if src.NAME != name:
        raise ValueError(f"scenarios/{name}/scenario.py declares NAME={src.NAME!r}; it must equal the folder name")
    if len(src.TASKS) != 10:
        raise ValueError(f"scenario {name!r} has {len(src.TASKS)} tasks; AWM-1K scenarios have exactly 10")
    return src


def _rows(src: Any, code: str, practice: bool = False, testbed: bool = False) -> dict[str, list[dict]]:
    """The AWM-1K records of one scenario module (or renamed world, awm.scenarios.worlds)."""
    name = src.NAME
    tasks = list(src.TASKS)
    if practice:
        from awm.scenarios.families import expand_scenario

        tasks += expand_scenario(src, testbed)
    world = {"world": src.world} if getattr(src, "world", 0) else {}
    inserts = sum(len(t["insert_statements"]) for t in src.SAMPLE)
    rows: dict[str, list[dict]] = {
        "gen_scenario": [{"name": name, "description": src.DESCRIPTION}],
        "gen_tasks": [{"scenario": name, "tasks": [t["task"] for t in tasks]}],
        "gen_db": [{"scenario": name, "db_schema": {"tables": src.TABLES}, "db_path": f"./outputs/databases/{name}.db"}],
        "gen_sample": [{"scenario": name, "tables_count": len(src.SAMPLE), "inserts_count": inserts,
                        "sample_data": {"tables": src.SAMPLE}}],
        "gen_envs": [{"scenario": name, "db_path": f"./outputs/databases/{name}.db", "full_code": code}],
        "gen_verifier.pure_code": [],
        "reference_solutions": [],
        "tool_probes": [{"scenario": name, "calls": src.PROBES}],
    }
    for idx, t in enumerate(tasks):
        rows["gen_verifier.pure_code"].append({"scenario": name, "task_idx": idx, "task": t["task"],
                                               "verification": {"code": t["verifier"], "raw_response": ""}})
        rows["reference_solutions"].append({
            "scenario": name, "task_idx": idx, "task_type": t["task_type"], "repair": bool(t.get("repair")),
            "calls": t["solution"]["calls"], "final_answer": t["solution"].get("final_answer"),
            "wrong_calls": t["wrong"]["calls"], "wrong_final_answer": t["wrong"].get("final_answer"),
            **({"family": t["family"], "slots": t["slots"]} if t.get("family") else {}), **world,
        })
    return rows


def render(practice: bool = False, names: list[str] | None = None, worlds: int = 0,
           vary_amounts: bool = False, testbed: bool = False) -> dict[str, str]:
    """File name -> exact text of every file in data/ (or of the practice set), of `names` or all scenarios.

    `worlds` (practice set only): also that many renamed worlds of each scenario with task families;
    `vary_amounts`: their prices and balances rescaled too (awm.scenarios.worlds); `testbed`: also the
    families marked testbed_only (awm_grpo.recovery.testbed)."""
    from awm.scenarios.worlds import world

    merged: dict[str, list[dict]] = {}
    for name in names or scenario_names():
        src = _source(name)
        code = (HERE / name / "app.py").read_text(encoding="utf-8")
        sources = [src] + ([world(src, k, code=code, vary_amounts=vary_amounts) for k in range(1, worlds + 1)]
                           if practice and getattr(src, "FAMILIES", None) else [])
        for one in sources:
            for stage, rows in _rows(one, code, practice, testbed).items():
                merged.setdefault(stage, []).extend(rows)
    return {f"{stage}.jsonl": "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
            for stage, rows in merged.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if data/ differs from the sources")
    parser.add_argument("--practice", metavar="DIR", help="write the practice set (hand-written tasks + task "
                        "family instances) to DIR instead of data/")
    parser.add_argument("--scenarios", nargs="+", help="with --practice: only these scenarios")
    parser.add_argument("--worlds", type=int, default=0, metavar="K", help="with --practice: also K renamed worlds "
                        "of each scenario (awm.scenarios.worlds: invented names, family instances only; training data)")
    parser.add_argument("--vary-amounts", action="store_true", help="with --worlds: also rescale each world's "
                        "prices, fares and balances (REAL columns), so answers must be read, not recalled")
    args = parser.parse_args(argv)
    if args.worlds and not args.practice:
        parser.error("--worlds needs --practice")
    if args.vary_amounts and not args.worlds:
        parser.error("--vary-amounts needs --worlds")
    if args.practice:
        out = Path(args.practice)
        out.mkdir(parents=True, exist_ok=True)
        unknown = sorted(set(args.scenarios or []) - set(scenario_names()))
        if unknown:
            parser.error(f"unknown scenarios {unknown}: choose from {scenario_names()}")
        files = render(practice=True, names=args.scenarios, worlds=args.worlds, vary_amounts=args.vary_amounts)
        for name, text in files.items():
            tmp = out / f".{name}.tmp"
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(out / name)
        tasks = sum(len(json.loads(line)["tasks"]) for line in files["gen_tasks.jsonl"].splitlines())
        scenarios = len(files["gen_scenario.jsonl"].splitlines())
        print(f"wrote the practice set ({tasks} tasks in {scenarios} scenarios) to {out}")
        return 0
    files = render()
    if args.check:
        stale = [n for n, text in files.items()
                 if not (DATA_DIR / n).exists() or (DATA_DIR / n).read_text(encoding="utf-8") != text]
        if stale:
            print(f"stale bundled data: {', '.join(stale)}; run `python -m awm.scenarios.build`", file=sys.stderr)
            return 1
        return 0
    DATA_DIR.mkdir(exist_ok=True)
    for name, text in files.items():
        (DATA_DIR / name).write_text(text, encoding="utf-8")
    print(f"wrote {len(files)} files for {len(scenario_names())} scenarios to {DATA_DIR}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

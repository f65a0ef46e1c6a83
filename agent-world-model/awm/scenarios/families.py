"""Task families: parameterised tasks expanded over a scenario's own data (the bundled practice set).

The ten hand-written tasks of a bundled scenario each name one situation, so a small model trained
on some of them has nothing to carry over to the others. A family is one task written once with
slots (`{title}`, `{branch}`, ...) and instantiated for every row of a SQL query over the scenario's
initial DB: held-out instances then differ from training ones in their values, not in their kind,
which is what the CPU run can learn and measure. A scenario declares them as

    FAMILIES = [{
        "family": "book_author",                  # unique within the scenario
        "task_type": "info_seeking",              # or "state_mutating"
        "slots": "SELECT title, author FROM books ORDER BY id",   # one instance per row (read-only)
        "limit": 12,                              # optional: at most this many instances
        "task": "Who wrote '{title}'?",           # str.format over the row
        "verifier": _verifier,                    # the scenario's verifier(opening, check) builder
        "check": 'return norm(P["author"]) in answer_text()',  # body of check(); P is the row
        "solution": {"calls": [{"tool": "search_books", "arguments": {"query": "{title}"}}],
                     "final_answer": "It was written by {author}."},
    }]

Placeholders fill every string of the solution; a string that is exactly one placeholder takes the
slot's own value and type (so `"{book_id}"` becomes the integer 8). The verifier is a normal pure-code
AWM verifier whose check() opens with `P = {...}`, the instance's slot values as a literal.

Instances get task indices after the hand-written ten and are marked with `family` (and their
`slots` row) in reference_solutions.jsonl; `python -m awm.scenarios.build --practice DIR` writes the whole set (the
hand-written tasks plus every instance) as an AWM data folder. The tests replay every instance's
solution and require the verifier to accept it and to reject the untouched DB.
"""

from __future__ import annotations

import re
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

_ONE_SLOT = re.compile(r"^\{(\w+)\}$")
REQUIRED = ("family", "task_type", "slots", "task", "verifier", "check", "solution")


def fill(value: Any, row: dict[str, Any]) -> Any:
    """`value` with every `{slot}` replaced from `row` (recursively; an exact "{slot}" keeps its type)."""
    if isinstance(value, str):
        whole = _ONE_SLOT.match(value)
        if whole and whole.group(1) in row:
            return row[whole.group(1)]
        return value.format(**row)
    if isinstance(value, list):
        return [fill(v, row) for v in value]
    if isinstance(value, dict):
        return {k: fill(v, row) for k, v in value.items()}
    return value


def slot_rows(db_path: str | Path, sql: str, limit: int | None = None) -> list[dict[str, Any]]:
    """The rows of a slot query on a read-only connection, as dicts."""
    conn = sqlite3.connect(f"file:{Path(db_path).resolve()}?mode=ro", uri=True)
    try:
        cur = conn.execute(sql)
        names = [d[0] for d in cur.description]
        rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    finally:
        conn.close()
    return rows[:limit] if limit else rows


def instantiate(family: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """One task (the hand-written task shape of scenario.py) from a family and one slot row."""
    check = f"P = {row!r}\n" + family["check"].strip("\n")
    solution = fill(family["solution"], row)
    wrong = fill(family.get("wrong") or {"calls": [], "final_answer": None}, row)
    return {"task": family["task"].format(**row), "task_type": family["task_type"], "repair": False,
            "verifier": family["verifier"](check), "solution": solution, "wrong": wrong,
            "family": family["family"], "slots": row}


def expand(scenario: Any, db_path: str | Path, testbed: bool = False) -> list[dict[str, Any]]:
    """Every instance of a scenario module's FAMILIES over its initial DB at `db_path` (families marked
    `"testbed_only": True` only with `testbed`: awm_grpo.recovery.testbed's companions)."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for family in getattr(scenario, "FAMILIES", []):
        if family.get("testbed_only") and not testbed:
            continue
        missing = [k for k in REQUIRED if k not in family]
        if missing:
            raise ValueError(f"{scenario.NAME}: family {family.get('family')!r} lacks {', '.join(missing)}")
        if family["family"] in seen:
            raise ValueError(f"{scenario.NAME}: family {family['family']!r} is declared twice")
        seen.add(family["family"])
        rows = slot_rows(db_path, family["slots"], family.get("limit"))
        if not rows:
            raise ValueError(f"{scenario.NAME}: family {family['family']!r} has no slot rows: its query finds nothing")
        out += [instantiate(family, row) for row in rows]
    texts = [t["task"] for t in out]
    duplicated = sorted({t for t in texts if texts.count(t) > 1})
    if duplicated:
        raise ValueError(f"{scenario.NAME}: family instances repeat task texts: {duplicated[:3]}")
    return out


def initial_db(scenario: Any, dest: str | Path) -> Path:
    """Build the scenario's initial DB (DDL + sample INSERTs, foreign keys on) at `dest`."""
    from awm.database import build_db

    dest = Path(dest)
    report = build_db(dest, {"tables": scenario.TABLES}, {"tables": scenario.SAMPLE}, scenario=scenario.NAME)
    if report.failed:
        raise ValueError(f"{scenario.NAME}: {len(report.failed)} statements failed building its DB: {report.failed[0]}")
    return dest


def expand_scenario(scenario: Any, testbed: bool = False) -> list[dict[str, Any]]:
    """Every family instance of a scenario module (its initial DB built in a temporary folder)."""
    if not getattr(scenario, "FAMILIES", None):
        return []
    with tempfile.TemporaryDirectory(prefix="awm-families-") as tmp:
        return expand(scenario, initial_db(scenario, Path(tmp) / f"{scenario.NAME}.db"), testbed)

"""Per-turn state progress of an episode: Phi after every tool turn, row-level changes, credit signals.

Enabled by `awm_predicates: PATH` (a predicates JSONL of `python -m awm.predicates build`). For one
episode the tracker evaluates the task's progress predicates on the episode DB (read-only SQL):

    Phi(s) = (1/N) sum_i phi_i(s)          Phi_b(s): the same with scalar predicates counted 1 only when met

at the start (Phi_0, on whatever state the episode starts from: the initial DB or a snapshotted
damaged state) and after every turn that ran a tool. Turns without a tool call keep the previous
value. It also records which rows each tool turn inserted / updated / deleted (primary keys and
content fingerprints, for the duplicate-effect and contradictory-update metrics) and, at the end,
the preservation predicates' values (irreversible damage).

Write labels (`awm.predicates.tool_labels.label_tools`, from the handler code) gate the progress reward; a read is
"task-relevant" when the tables its handler touches meet the tables of the task's predicates.
Only the in-process transport exposes the episode DB; MCP episodes are refused at config time.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from awm.predicates.predicate import Predicate, TaskPredicates, evaluate
from awm.predicates.tool_labels import handler_tables, label_tools, sql_tables


@lru_cache(maxsize=8)
def load_predicates(path: str) -> dict[tuple[str, int], TaskPredicates]:
    """The predicates file as {(scenario, task_idx): TaskPredicates}, read and validated once per process."""
    from awm.predicates.build import read_predicates

    if not Path(path).exists():
        raise FileNotFoundError(f"awm_predicates {path} does not exist: build it with "
                                "`python -m awm.predicates build --out PATH`")
    return {(r.scenario, r.task_idx): r for r in read_predicates(path)}


def predicate_tables(preds: list[Predicate]) -> frozenset[str]:
    """Tables the predicates read (their `table`, else the names after FROM / JOIN in their SQL)."""
    out: set[str] = set()
    for p in preds:
        out |= {p.table.lower()} if p.table else sql_tables(p.sql)
    return frozenset(out)


@lru_cache(maxsize=64)
def tool_semantics(code: str) -> tuple[dict[str, str], dict[str, frozenset[str]]]:
    """({tool: label}, {tool: tables}) of one environment module (cached by its source)."""
    return {name: lab.label for name, lab in label_tools(code).items()}, handler_tables(code)


def _snapshot_rows(db_path: str | Path) -> dict[str, tuple[list[int], dict[str, tuple]]]:
    """{table: (pk column indexes, {key: row})} of every table with a primary key."""
    conn = sqlite3.connect(f"file:{Path(db_path).resolve()}?mode=ro", uri=True)
    try:
        out = {}
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' "
                                             "AND name NOT LIKE 'sqlite_%'")]
        for t in tables:
            info = conn.execute(f'PRAGMA table_info("{t}")').fetchall()
            pk = [c[0] for c in sorted(info, key=lambda c: c[5]) if c[5] > 0]
            if not pk:
                continue
            rows = conn.execute(f'SELECT * FROM "{t}"').fetchall()
            out[t] = (pk, {json.dumps([r[i] for i in pk], default=str): tuple(r) for r in rows})
        return out
    finally:
        conn.close()


def _fingerprint(row: tuple, pk: list[int]) -> str:
    body = [v for i, v in enumerate(row) if i not in pk]
    return hashlib.sha256(json.dumps(body, default=str).encode()).hexdigest()[:16]


def row_changes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, dict[str, list[str]]]:
    """Per-table inserted / updated / deleted keys (and inserted row fingerprints) between two snapshots."""
    out = {}
    for t in sorted(set(before) | set(after)):
        pk, rb = before.get(t, ([], {}))
        pk, ra = after.get(t, (pk, {}))
        ins = sorted(ra.keys() - rb.keys())
        entry = {"inserted": ins, "updated": sorted(k for k in ra.keys() & rb.keys() if ra[k] != rb[k]),
                 "deleted": sorted(rb.keys() - ra.keys()), "fingerprints": [_fingerprint(ra[k], pk) for k in ins]}
        if entry["inserted"] or entry["updated"] or entry["deleted"]:
            out[t] = entry
    return out


@dataclass
class ProgressTracker:
    """Progress bookkeeping of one episode (see the module docstring); all methods are synchronous SQL."""

    task: TaskPredicates
    labels: dict[str, str]
    tool_tables: dict[str, frozenset[str]]
    db_path: str

    def __post_init__(self) -> None:
        self.kinds = [p.kind for p in self.task.predicates]
        self.tables = predicate_tables(self.task.predicates + self.task.preservation)
        self.phi0, self.phi0_b, self.values0 = self._phi()
        self._rows = _snapshot_rows(self.db_path)

    def _phi(self) -> tuple[float, float, list[float]]:
        from awm_grpo.recovery.credit import potential

        values = evaluate(self.db_path, self.task.predicates)
        return potential(values, self.kinds), potential(values, self.kinds, binary_only=True), values

    def after_tool_turn(self) -> dict[str, Any]:
        """Phi, Phi_b, phi_i and the row changes of the turn that just ran its tools."""
        phi, phi_b, values = self._phi()
        rows = _snapshot_rows(self.db_path)
        changes = row_changes(self._rows, rows)
        self._rows = rows
        return {"phi": phi, "phi_b": phi_b, "values": values, "rows": changes}

    def label(self, tool: str) -> str:
        return self.labels.get(tool, "read")

    def relevant(self, tool: str) -> bool:
        return bool(self.tool_tables.get(tool, frozenset()) & self.tables)

    def finish(self, turns: list[dict[str, Any]]) -> dict[str, Any]:
        """Episode-level progress record: Phi_0, preservation values and the compact per-turn credit signals.

        credit: phi0 / phi0_b (start state) and lists (one entry per model turn): span [start, end) of its response tokens, phi / phi_b
        after it (carried over turns without a tool), write (a write-labelled tool ran), error (a
        tool returned an explicit error), fmt (an invalid call), rel_read (a task-relevant read ran),
        ok (B2: True if its calls succeeded, False on an error, None without a call), rel_tool (B2).
        """
        credit: dict[str, Any] = {k: [] for k in ("span", "phi", "phi_b", "write", "error", "fmt",
                                                         "rel_read", "ok", "rel_tool")}
        phi, phi_b = self.phi0, self.phi0_b
        for turn in turns:
            prog = turn.get("progress")
            if prog is not None:
                phi, phi_b = prog["phi"], prog["phi_b"]
            calls = [c for c in turn.get("calls") or [] if "name" in c and c["name"] != "list_tools"]
            invalid = [c for c in turn.get("calls") or [] if "invalid" in c or c.get("kind") in
                       ("invalid_arguments", "unknown_tool")]
            credit["span"].append(turn.get("span") or [0, 0])
            credit["phi"].append(phi)
            credit["phi_b"].append(phi_b)
            credit["write"].append(any(self.label(c["name"]) != "read" for c in calls))
            credit["error"].append(any(c.get("is_error") for c in calls))
            credit["fmt"].append(bool(invalid))
            credit["rel_read"].append(any(self.label(c["name"]) == "read" and self.relevant(c["name"])
                                          and not c.get("is_error") for c in calls))
            credit["ok"].append(None if not calls else not any(c.get("is_error") for c in calls))
            credit["rel_tool"].append(any(self.relevant(c["name"]) for c in calls))
        credit["phi0"], credit["phi0_b"] = self.phi0, self.phi0_b
        preservation = evaluate(self.db_path, self.task.preservation)
        return {"task_type": self.task.task_type, "phi0": self.phi0, "phi0_b": self.phi0_b,
                "predicates": len(self.task.predicates), "preservation_end": preservation, "credit": credit}


def open_tracker(predicates_path: str, code: str | None, scenario: str, task_idx: int,
                 db_path: str | Path) -> ProgressTracker:
    """A tracker for one episode; a task missing from the file gets an empty predicate set (Phi = 0)."""
    task = load_predicates(predicates_path).get((scenario, task_idx)) or TaskPredicates(scenario, task_idx)
    labels, tables = tool_semantics(code) if code else ({}, {})
    return ProgressTracker(task, labels, tables, str(db_path))

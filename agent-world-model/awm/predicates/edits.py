"""Edits of a task's initial database and the scratch states they make (used by `awm.predicates.goal_states`).

An edit is data (insert / update / delete a row, or a phrase added to the final answer); `States`
applies a list of them to a fresh copy of s0, as parameterised statements, never text from the
verifier. An insert copies its other columns from a donor row; variant 1 of a state gives the columns
listed in `Edit.alt` other values (the second accepting state, see goal_states).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import sqlite3
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from awm.predicates.predicate import run_query


@dataclass
class Edit:
    """One change to the state: insert / update / delete a row, or a phrase added to the final answer."""

    kind: str  # insert | update | delete | answer
    table: str = ""
    values: dict[str, Any] = field(default_factory=dict)  # columns an observation set
    rowid: int | None = None  # update / delete target
    donors: list[int] = field(default_factory=list)  # insert: rows to copy other columns from (first is used)
    alt: dict[str, Any] = field(default_factory=dict)  # variant 1: other values for columns the verifier leaves free
    text: str = ""  # answer phrase
    why: str = ""

    def key(self) -> str:
        d = asdict(self)
        d.pop("why")
        d.pop("alt")
        return json.dumps(d, sort_keys=True, default=repr)


def answer_of(edits: list[Edit]) -> str | None:
    """The final answer the edits' answer phrases make (None: no answer)."""
    parts = [e.text for e in edits if e.kind == "answer"]
    return ". ".join(parts) if parts else None


def extend(edits: list[Edit], proposal: list[Edit]) -> list[Edit]:
    """The path with a proposal applied: "undo" entries remove an earlier edit, the rest are appended."""
    undo = {e.text for e in proposal if e.kind == "undo"}
    return [e for e in edits if e.key() not in undo] + [e for e in proposal if e.kind != "undo"]


class Schema:
    """Columns, primary keys and types of s0's tables."""

    def __init__(self, db: Path) -> None:
        conn = sqlite3.connect(f"file:{db.resolve()}?mode=ro", uri=True)
        try:
            names = [r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
            self.columns: dict[str, list[str]] = {}
            self.types: dict[str, dict[str, str]] = {}
            self.rowid_pk: dict[str, str | None] = {}
            self.pk: dict[str, list[str]] = {}
            for name in names:
                info = conn.execute(f'PRAGMA table_info("{name}")').fetchall()
                self.columns[name] = [c[1] for c in info]
                self.types[name] = {c[1]: (c[2] or "").upper() for c in info}
                pk = [c[1] for c in sorted(info, key=lambda c: c[5]) if c[5] > 0]
                self.pk[name] = pk
                single_int = len(pk) == 1 and self.types[name][pk[0]] == "INTEGER"
                self.rowid_pk[name] = pk[0] if single_int else None
        finally:
            conn.close()

    def table(self, name: str) -> str | None:
        return next((t for t in self.columns if t.lower() == name.lower()), None)


def same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)
    if isinstance(a, str) != isinstance(b, str) and None not in (a, b):  # "12.50" read with float()
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-6)
        except (TypeError, ValueError):
            return False
    if isinstance(a, str) and isinstance(b, str):
        if a == b or norm(a) == norm(b) or norm(a).replace(" ", "") == norm(b).replace(" ", ""):
            return True
        for x, y in ((a, b), (b, a)):  # phone numbers and codes compared by their digits
            if y.isdigit() and len(y) >= 4 and re.sub(r"\D", "", x) == y and len(x) <= 2 * len(y) + 12:
                return True
        return False
    return (a is None or a == "") and (b is None or b == "")  # verifiers often read NULL as ""


_FOLD = str.maketrans({"\u2013": "-", "\u2014": "-", "\u2212": "-", "\u2018": "'", "\u2019": "'", "\u201c": '"',
                       "\u201d": '"'})


def norm(text: str) -> str:
    """Text as verifiers commonly compare it: lower case, single spaces, plain dashes and quotes, no
    surrounding punctuation."""
    return " ".join(text.translate(_FOLD).lower().split()).strip(" .,;:!?'\"")


def scalar(v: Any) -> bool:
    return v is None or isinstance(v, bool | int | float | str)


def ro_rows(db: Path, sql: str) -> list[tuple] | None:
    """Rows (at most 1,000) of a query, possibly built from the verifier's SQL, read-only with a deadline;
    None when it fails."""
    try:
        return run_query(db, sql, max_rows=1000)
    except (sqlite3.Error, ValueError):
        return None


def max_rowid(db: Path, table: str) -> int:
    rows = ro_rows(db, f'SELECT MAX(rowid) FROM "{table}"')
    return int(rows[0][0] or 0) if rows and isinstance(rows[0][0], int) else 0


class States:
    """Scratch databases: s0 with a list of edits applied."""

    def __init__(self, s0: Path, workdir: Path) -> None:
        self.s0, self.workdir, self.schema = s0, workdir, Schema(s0)
        self._n = 0
        self._other_keys, self._renamed = False, {}

    def materialize(self, edits: list[Edit], variant: int = 0, other_keys: bool = False) -> Path | None:
        """s0 with `edits` applied; None if an edit cannot apply.

        Variant 1 gives the columns in each edit's `alt` their other values. `other_keys`: text keys made
        up for inserted rows (`_fresh`) take other values, and every later value naming one follows it,
        so a state can show whether the verifier cares which key a new row got.
        """
        self._n += 1
        dest = self.workdir / f"state-{self._n}.db"
        shutil.copyfile(self.s0, dest)
        conn = sqlite3.connect(dest)
        self._other_keys, self._renamed = other_keys, {}
        try:
            conn.execute("PRAGMA foreign_keys = OFF")
            for e in edits:
                if self._renamed:
                    e = Edit(**{**e.__dict__, "values": {c: self._renamed.get(v, v) if isinstance(v, str) else v
                                                         for c, v in e.values.items()}})
                if not self._apply(conn, e, variant):
                    conn.close()
                    dest.unlink(missing_ok=True)
                    return None
            conn.commit()
        finally:
            conn.close()
        return dest

    @property
    def renamed_any(self) -> bool:
        """The last state made with `other_keys` gave some new row another key."""
        return bool(self._renamed)

    def _apply(self, conn: sqlite3.Connection, e: Edit, variant: int) -> bool:
        if e.kind == "answer":
            return True
        table = self.schema.table(e.table)
        if table is None:
            return False
        q = f'"{table}"'
        try:
            if e.kind == "delete":
                conn.execute(f"DELETE FROM {q} WHERE rowid = ?", (e.rowid,))
                return True
            if e.kind == "update":
                values = {**e.values, **(e.alt if variant else {})}
                sets = ", ".join(f'"{c}" = ?' for c in values)
                return conn.execute(f"UPDATE {q} SET {sets} WHERE rowid = ?",
                                    (*values.values(), e.rowid)).rowcount == 1
            return self._insert(conn, table, e, variant)
        except sqlite3.Error:
            return False

    def _insert(self, conn: sqlite3.Connection, table: str, e: Edit, variant: int) -> bool:
        cols = self.schema.columns[table]
        row: dict[str, Any] = {}
        if e.donors:
            found = conn.execute(f'SELECT * FROM "{table}" WHERE rowid = ?', (e.donors[0],)).fetchone()
            row = dict(zip(cols, found, strict=True)) if found else {}
        for c in cols:
            row.setdefault(c, None)
        row.update({c: v for c, v in e.values.items() if c in row})
        if variant:  # last: it may also replace a value an observation set (a case or spacing the verifier ignores)
            row.update({c: v for c, v in e.alt.items() if c in row})
        ipk = self.schema.rowid_pk[table]
        if ipk and ipk not in e.values:
            row[ipk] = (conn.execute(f'SELECT MAX(rowid) FROM "{table}"').fetchone()[0] or 0) + 1
        for attempt in range(8):
            try:
                conn.execute(f'INSERT INTO "{table}" ({", ".join(f"{chr(34)}{c}{chr(34)}" for c in cols)}) '
                             f'VALUES ({", ".join("?" for _ in cols)})', [row[c] for c in cols])
                return True
            except sqlite3.IntegrityError as exc:
                failed = [part.strip().split(".")[-1] for part in str(exc).split(":", 1)[-1].split(",")]
                fixable = [c for c in failed if c in row and c not in e.values]
                if not fixable:
                    return False
                for c in fixable:
                    row[c] = self._fresh(conn, table, c, row[c], attempt)
        return False

    def alternative(self, table: str, col: str, e: Edit) -> Any:
        """Another plausible value for an inserted row's column: another row's, else a changed copy."""
        donor = e.donors[0] if e.donors else None
        conn = sqlite3.connect(f"file:{self.s0.resolve()}?mode=ro", uri=True)
        try:
            current = conn.execute(f'SELECT "{col}" FROM "{table}" WHERE rowid = ?', (donor,)).fetchone() \
                if donor is not None else None
            rows = conn.execute(f'SELECT DISTINCT "{col}" FROM "{table}" LIMIT 50').fetchall()
        finally:
            conn.close()
        now = current[0] if current else None
        for (v,) in reversed(rows):
            if v != now and not (isinstance(v, str) and isinstance(now, str) and (v in now or now in v)):
                return v
        if isinstance(now, int | float) and not isinstance(now, bool):
            return now + 1
        return "zz-other" if now != "zz-other" else "yy-other"

    def _fresh(self, conn: sqlite3.Connection, table: str, col: str, value: Any, attempt: int) -> Any:
        """A value for `col` not yet in the table (UNIQUE / NOT NULL repairs)."""
        kind = self.schema.types[table].get(col, "")
        if isinstance(value, int | float) and not isinstance(value, bool) or (value is None and "INT" in kind):
            top = conn.execute(f'SELECT MAX("{col}") FROM "{table}"').fetchone()[0]
            return (top if isinstance(top, int | float) else 0) + 1 + attempt
        if value is None and any(k in kind for k in ("REAL", "FLOA", "DOUB", "NUM", "DEC")):
            return 0.0
        made = f"{value if value is not None else table} ({attempt + 2})"
        if self._other_keys and col in self.schema.pk[table]:
            self._renamed[made] = other = f"{value if value is not None else table} (key {attempt + 2})"
            return other
        return made

"""Executable intermediate predicates of a task: the record, its evaluation, its extraction from a trace.

A predicate is one SQL query run on a read-only connection plus a check on its rows; an exception
(missing table, bad SQL, timeout) counts as unmet. Satisfaction phi_i(s) in [0, 1]:

    binary  exists     phi = 1[rows != []]              not_exists  phi = 1[rows == []]
            count_eq   phi = 1[len(rows) == N]          count_gte   phi = 1[len(rows) >= N]
            value_eq   phi = 1[single value == v*]      rows_equal  phi = 1[sha256(sorted rows) == h]
    scalar  distance   phi = max(0, 1 - |v(s) - v*| / (|v(s0) - v*| + eps))

Roles: a "progress" predicate is unmet on the initial DB s0 and met on the reference final state;
a "preservation" predicate is met on both (kept apart: destructive-step metrics need them).

Extraction (`extract`) turns the statements a traced verifier ran on the final DB into
candidates, by comparing each statement's rows on s0 and on two independent replays of the
reference solution (A and B, run at different times): whole-table reads (`SELECT * FROM t`, the
`table()`/`diff()` helpers) become row-level predicates restricted to the columns the verifier
names; other reads become exists / not_exists / count / value / rows predicates; values that
differ between A and B (clock columns, random tokens) are never used as targets.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import sqlite3
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from awm.database import MAX_VALUE_BYTES
from awm.predicates.sql_shape import parse
from awm.predicates.verifier_analysis import StaticInfo, required_count, variables_of

CHECKS = {"exists", "not_exists", "count_eq", "count_gte", "value_eq", "rows_equal", "distance"}
ROLES = {"progress", "preservation"}
EPS = 1e-6
VALUE_TOL = 1e-6
# A read of every row of one table (all columns or a plain column list, in any order): its changes are
# compared row by row (`_table_diff`), as the verifier itself can only be comparing rows.
_WHOLE_TABLE = re.compile(r"^\s*SELECT\s+(?:\*|[\w\"]+(?:\s*,\s*[\w\"]+)*)\s+FROM\s+\"?([A-Za-z_][A-Za-z0-9_]*)\"?"
                          r"(?:\s+ORDER\s+BY\s+[\w\"]+(?:\s+(?:ASC|DESC))?(?:\s*,\s*[\w\"]+(?:\s+(?:ASC|DESC))?)*)?\s*;?\s*$",
                          re.IGNORECASE)
_SQL_START = re.compile(r"^\s*(SELECT|WITH)\b", re.IGNORECASE)


class PredicateError(ValueError):
    """A predicate record is malformed; the message names the field."""


@dataclass
class Predicate:
    """One executable condition (see the module docstring for `check` semantics)."""

    id: str
    sql: str
    check: str
    expected: Any = None
    initial_value: Any = None
    kind: str = "binary"  # "binary" | "scalar"
    role: str = "progress"
    source: str = "trace"  # trace | table_diff | static_len | llm
    table: str | None = None
    executable: bool = True
    replay: str = "ok"  # "ok": held on two reference replays; "verifier_states": on states the verifier accepts

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Predicate:
        """Validate and build; rejects instead of guessing (docs/recovery-method.md, Predicates)."""
        for key in ("id", "sql", "check"):
            if not isinstance(d.get(key), str) or not d[key]:
                raise PredicateError(f"predicate field {key!r} must be a non-empty string, got {d.get(key)!r}")
        if d["check"] not in CHECKS:
            raise PredicateError(f"predicate {d['id']}: check {d['check']!r} is not one of {sorted(CHECKS)}")
        if d.get("role", "progress") not in ROLES:
            raise PredicateError(f"predicate {d['id']}: role {d.get('role')!r} is not one of {sorted(ROLES)}")
        kind = "scalar" if d["check"] == "distance" else "binary"
        if d.get("kind", kind) != kind:
            raise PredicateError(f"predicate {d['id']}: check {d['check']} has kind {kind}, record says {d['kind']}")
        if d["check"] == "distance" and not (_is_number(d.get("expected")) and _is_number(d.get("initial_value"))):
            raise PredicateError(f"predicate {d['id']}: a distance predicate needs numeric expected and initial_value")
        if d["check"] in ("count_eq", "count_gte") and not isinstance(d.get("expected"), int):
            raise PredicateError(f"predicate {d['id']}: {d['check']} needs an integer expected count")
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{**{k: v for k, v in d.items() if k in known}, "kind": kind})


@dataclass
class TaskPredicates:
    """The predicate set of one task and how it was validated."""

    scenario: str
    task_idx: int
    predicates: list[Predicate] = field(default_factory=list)  # progress
    preservation: list[Predicate] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> count
    task_type: str = "ambiguous"
    replayed: bool = False
    replay_ok: bool | None = None  # every kept predicate held on both replays (None: not replayed)
    phi_initial: float | None = None
    phi_reference: float | None = None
    phi_wrong: float | None = None
    verdict_reference: str | None = None
    verdict_wrong: str | None = None
    note: str = ""
    evidence: str = ""  # what the task type rests on
    validation: dict[str, Any] = field(default_factory=dict)  # how the kept predicates were checked

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["predicates"] = [p.to_dict() for p in self.predicates]
        d["preservation"] = [p.to_dict() for p in self.preservation]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TaskPredicates:
        known = {f for f in cls.__dataclass_fields__}
        out = cls(**{k: v for k, v in d.items() if k in known})
        out.predicates = [Predicate.from_dict(p) for p in d.get("predicates", [])]
        out.preservation = [Predicate.from_dict(p) for p in d.get("preservation", [])]
        return out


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def rows_digest(rows: list[tuple]) -> str:
    """Order-free digest of a result set (rows sorted by their repr)."""
    text = json.dumps(sorted((list(r) for r in rows), key=repr), default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def run_query(db_path: str | Path, sql: str, *, timeout_s: float = 2.0, max_rows: int | None = None) -> list[tuple]:
    """Rows of `sql` (at most `max_rows`) on a read-only connection; raises sqlite3.Error (also when past
    `timeout_s`)."""
    conn = sqlite3.connect(f"file:{Path(db_path).resolve()}?mode=ro", uri=True)
    # predicate SQL comes from a file anyone may have edited; a read-only connection can still ATTACH (which
    # creates a file) and VACUUM INTO (which writes a copy): both need an attached slot, so allow none
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)  # env code's virtual columns: no GB values here
    deadline = time.monotonic() + timeout_s
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
    try:
        cur = conn.execute(sql)
        return [tuple(r) for r in (cur.fetchall() if max_rows is None else cur.fetchmany(max_rows))]
    finally:
        conn.close()


def phi_of_rows(pred: Predicate, rows: list[tuple] | None) -> float:
    """phi_i in [0, 1] from a query's rows (None: the query failed -> unmet)."""
    if rows is None:
        return 0.0
    c, e = pred.check, pred.expected
    if c == "exists":
        return float(bool(rows))
    if c == "not_exists":
        return float(not rows)
    if c == "count_eq":
        return float(len(rows) == e)
    if c == "count_gte":
        return float(len(rows) >= e)
    if c == "rows_equal":
        return float(rows_digest(rows) == e)
    single = rows[0][0] if len(rows) == 1 and len(rows[0]) == 1 else _Missing
    if c == "value_eq":
        return float(single is not _Missing and _same(single, e))
    if c == "distance":
        if not _is_number(single):
            return 0.0
        return max(0.0, 1.0 - abs(single - e) / (abs(pred.initial_value - e) + EPS))
    raise PredicateError(f"unknown check {c!r}")


class _Missing:
    pass


def _same(a: Any, b: Any) -> bool:
    if _is_number(a) and _is_number(b):
        return abs(a - b) <= VALUE_TOL
    return a == b


def evaluate(db_path: str | Path, predicates: list[Predicate]) -> list[float]:
    """phi_i(s) of every predicate on one DB state (exceptions count as unmet)."""
    out = []
    for p in predicates:
        try:
            rows = run_query(db_path, p.sql)
        except sqlite3.Error:
            rows = None
        out.append(phi_of_rows(p, rows))
    return out


# ---- extraction from a traced verifier run ------------------------------------------------------
def _lit(v: Any) -> str:
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, bytes):
        return f"X'{v.hex()}'"
    return "'" + str(v).replace("'", "''") + "'"


_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}([ T]\d{2}:\d{2}(:\d{2}(\.\d+)?)?)?$")


def _where(col: str, v: Any) -> str:
    """`col` holds v; a date or time as an instant (julianday), so "2026-12-17T22:04:19" matches "... 22:04:19"."""
    if v is None:
        return f'"{col}" IS NULL'
    if isinstance(v, str) and _DATE.match(v):
        return f'ABS(julianday("{col}") - julianday({_lit(v)})) < 1e-5'
    return f'"{col}" = {_lit(v)}'


def _id_like(col: str) -> bool:
    c = col.lower()
    return c == "id" or c.endswith("_id")


def _try_rows(db: Path, sql: str) -> list[tuple] | None:
    try:
        return run_query(db, sql)
    except sqlite3.Error:
        return None


def _table_rows(db: Path, table: str) -> tuple[list[str], list[str], dict[tuple, dict[str, Any]]]:
    conn = sqlite3.connect(f"file:{db.resolve()}?mode=ro", uri=True)
    try:
        info = conn.execute(f'PRAGMA table_info("{table}")').fetchall()
        cols = [c[1] for c in info]
        pk = [c[1] for c in sorted(info, key=lambda c: c[5]) if c[5] > 0]
        if not pk:
            return cols, [], {}
        cur = conn.execute(f'SELECT * FROM "{table}"')
        keyed = {}
        for r in cur.fetchall():
            row = dict(zip(cols, r, strict=True))
            keyed[tuple(row[c] for c in pk)] = row
        return cols, pk, keyed
    finally:
        conn.close()


class _Builder:
    """Collects candidates for one task; `drop(reason)` counts what was rejected and why."""

    def __init__(self) -> None:
        self.candidates: list[Predicate] = []
        self.dropped: Counter[str] = Counter()
        self._sql: set[tuple[str, str]] = set()

    def add(self, **kw: Any) -> None:
        key = (kw["sql"], kw["check"])
        if key not in self._sql:
            self._sql.add(key)
            self.candidates.append(Predicate(id=f"c{len(self.candidates) + 1}", **kw))

    def drop(self, reason: str, n: int = 1) -> None:
        self.dropped[reason] += n


def _table_diff(b: _Builder, table: str, s0: Path, a: Path, bb: Path, info: StaticInfo,
                selected: list[str] | None = None, every_column: bool = False) -> None:
    """Row-level predicates for a whole-table read that the final state changed.

    Compared columns: the ones the read selects; for `SELECT *`, the ones the verifier names, else all.
    """
    cols, pk, r0 = _table_rows(s0, table)
    if not pk:
        b.drop("table_without_primary_key")
        return
    _, _, ra = _table_rows(a, table)
    _, _, rb = _table_rows(bb, table)
    if selected:
        wanted = {s.strip('"').lower() for s in selected}
        checked = [c for c in cols if c.lower() in wanted and c not in pk]
    else:
        named = [c for c in cols if c.lower() in info.columns and c not in pk and not every_column]
        checked = named or [c for c in cols if c not in pk]
    if len(pk) > 1 or (len(pk) == 1 and not _id_like(pk[0])):  # a link table's key is its content
        checked = list(dict.fromkeys(pk + checked))

    def key_sql(k: tuple) -> str:
        return " AND ".join(_where(c, v) for c, v in zip(pk, k, strict=True))

    added_b = [rb[k] for k in rb.keys() - r0.keys()]
    for k in sorted(ra.keys() - r0.keys(), key=repr):  # added rows: match on what both final states hold
        row = ra[k]
        twin = rb.get(k) if k in rb else max(
            added_b, key=lambda r: sum(2 * (r.get(c) == row[c]) + bool(_loose(row[c], r.get(c)) or _part(row[c], r.get(c)))
                                       for c in checked), default=None)
        if twin is None:
            b.drop("volatile")
            continue
        stable = [c for c in checked if twin.get(c) == row[c]]
        if not stable:
            b.drop("volatile")
            continue
        cond = " AND ".join([_where(c, row[c]) for c in stable]
                            + [_shared(c, row[c], twin.get(c)) for c in checked if c not in stable
                               and _shared(c, row[c], twin.get(c))] + _new_row(pk, r0))
        b.add(sql=f'SELECT 1 FROM "{table}" WHERE {cond}', check="exists", expected=None, initial_value=0,
              source="table_diff", table=table)
    for k in sorted(r0.keys() - ra.keys(), key=repr):  # removed rows
        b.add(sql=f'SELECT 1 FROM "{table}" WHERE {key_sql(k)}', check="not_exists", initial_value=1,
              source="table_diff", table=table)
    for k in sorted(r0.keys() & ra.keys(), key=repr):  # changed rows: one predicate per changed column
        for c in checked:
            v0, va = r0[k][c], ra[k][c]
            if v0 == va:
                continue
            if k not in rb or rb[k][c] != va:  # the two final states disagree: only what they share is a target
                vb = rb[k][c] if k in rb else None
                if _shared(c, va, vb):
                    cond = _shared(c, va, vb)
                elif va is not None and vb is not None and k in rb:
                    cond = f'"{c}" IS NOT NULL' if v0 is None else f'"{c}" IS NOT {_lit(v0)}'
                else:
                    b.drop("volatile")
                    continue
                b.add(sql=f'SELECT 1 FROM "{table}" WHERE {key_sql(k)} AND {cond}', check="exists", initial_value=0,
                      source="table_diff", table=table)
                continue
            sql = f'SELECT "{c}" FROM "{table}" WHERE {key_sql(k)}'
            if _is_number(v0) and _is_number(va) and not _id_like(c):
                b.add(sql=sql, check="distance", kind="scalar", expected=va, initial_value=v0,
                      source="table_diff", table=table)
            else:
                if isinstance(va, str) and _DATE.match(va):
                    b.add(sql=f'SELECT 1 FROM "{table}" WHERE {key_sql(k)} AND {_where(c, va)}', check="exists",
                          initial_value=0, source="table_diff", table=table)
                else:
                    b.add(sql=sql, check="value_eq", expected=va, initial_value=v0, source="table_diff", table=table)


def _new_row(pk: list[str], r0: dict[tuple, Any]) -> list[str]:
    """`a row that was not there at s0`, by its integer key, whatever key it got."""
    if len(pk) != 1 or not _id_like(pk[0]) or not r0:
        return []
    keys = sorted(k[0] for k in r0 if isinstance(k[0], int))
    if len(keys) > 2000:
        return [f'"{pk[0]}" > {keys[-1]}']
    return [f'"{pk[0]}" NOT IN ({", ".join(map(str, keys))})'] if keys else []


def _shared(col: str, a: Any, b: Any, ref: str = "") -> str:
    """A condition on `col` both values meet when they differ only in case and spacing, or one text
    contains the other; "" when they share nothing a condition can say. `ref` qualifies the column."""
    name = f'{ref}"{col}"'
    if isinstance(a, str) and isinstance(b, str) and _DATE.match(" ".join(a.split())) and _DATE.match(" ".join(b.split())):
        return f"ABS(julianday(TRIM({name})) - julianday({_lit(' '.join(a.split()))})) < 1e-5" \
            if _same_instant(" ".join(a.split()), " ".join(b.split())) else ""
    if _same_json(a, b):  # one JSON value written two ways: compared as JSON
        return f"json({name}) = json({_lit(a)})"
    if _loose(a, b):
        spaced = isinstance(a, str) and isinstance(b, str) and ("  " in a.strip()) != ("  " in b.strip())
        if spaced:  # one accepted value has doubled inner spaces: the verifier collapses them
            name = f"REPLACE(REPLACE(REPLACE({name}, '  ', ' '), '  ', ' '), '  ', ' ')"
        return f"LOWER(TRIM({name})) = {_loose(a, b)}"
    part = _part(a, b)
    return f"{name} LIKE {_lit(_like(part))} ESCAPE '\\'" if part else ""


def _same_json(a: Any, b: Any) -> bool:
    if not (isinstance(a, str) and isinstance(b, str)) or a == b or a.lstrip()[:1] not in "[{":
        return False
    try:
        return json.loads(a) == json.loads(b)
    except ValueError:
        return False


def _same_instant(a: str, b: str) -> bool:
    import datetime as dt

    try:
        return dt.datetime.fromisoformat(a.strip()) == dt.datetime.fromisoformat(b.strip())
    except ValueError:
        return False


def _loose(a: Any, b: Any) -> str | None:
    """A condition for two texts both final states hold that differ only in case and surrounding spaces."""
    if isinstance(a, str) and isinstance(b, str) and a != b and " ".join(a.split()).lower() == " ".join(b.split()).lower():
        return _lit(" ".join(a.split()).lower() if ("  " in a.strip()) != ("  " in b.strip()) else a.strip().lower())
    return None


def _part(a: Any, b: Any) -> str | None:
    """The shorter of two texts when the longer contains it (3+ characters): what both final states hold."""
    if not (isinstance(a, str) and isinstance(b, str)) or a == b:
        return None
    short, long = sorted((a, b), key=len)
    return short if len(short) >= 3 and short.lower() in long.lower() else None


def _like(text: str) -> str:
    """A LIKE pattern matching `text` anywhere (its own % _ and \\ escaped)."""
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _shared_rows(b: _Builder, sql: str, s0: Path, r0: list[tuple], ra: list[tuple], rb: list[tuple]) -> None:
    """For a read whose rows differ between two accepted states: each row the states added, as far as
    they agree on it (columns equal in both), must be in the read's result; rows both removed must not."""
    names = _column_names(s0, sql)
    if names is None or len(set(names)) != len(names):
        b.drop("volatile")
        return
    made_keys = _key_columns(s0, sql)  # a new row's integer key is the database's choice, not the task's
    sub = f"SELECT 1 FROM ({sql.rstrip().rstrip(';')}) AS awm_q WHERE "

    def cond(row: tuple, cols: list[int]) -> str:
        return " AND ".join(_where(names[i], row[i]).replace(f'"{names[i]}"', f'awm_q."{names[i]}"') for i in cols)

    before = {tuple(r) for r in r0}
    added_a = [r for r in ra if tuple(r) not in before]
    added_b = [r for r in rb if tuple(r) not in before]
    for row in added_a:
        twin = max(added_b, key=lambda r: sum(2 * (x == y) + bool(_loose(x, y) or _part(x, y))
                                              for x, y in zip(r, row, strict=False)), default=None)
        cols = [i for i in range(len(row)) if twin is not None and i < len(twin) and twin[i] == row[i]
                and i not in made_keys]
        extra = [s for i in range(len(row)) if i not in cols and i not in made_keys and twin is not None
                 and i < len(twin) and (s := _shared(names[i], row[i], twin[i], "awm_q."))]
        if not cols and not extra and not made_keys:
            b.drop("volatile")
            continue
        # a new row: not one of the rows the read returned at s0 (by key), whichever key it got
        fresh = [f'awm_q."{names[i]}" NOT IN ({", ".join(_lit(v) for v in old)})' for i in sorted(made_keys)
                 if (old := sorted({r[i] for r in r0 if i < len(r) and r[i] is not None}, key=repr))]
        where = " AND ".join(([cond(row, cols)] if cols else []) + extra + fresh)
        b.add(sql=sub + where if where else sub[:-len(" WHERE ")], check="exists", initial_value=0)
    after_a, after_b = {tuple(r) for r in ra}, {tuple(r) for r in rb}
    for row in sorted(before - after_a - after_b, key=repr):
        b.add(sql=sub + cond(row, list(range(len(row)))), check="not_exists", initial_value=1)


def _key_columns(db: Path, sql: str) -> set[int]:
    """Output positions of `sql` that are a table's single integer key (an id the database assigns)."""
    conn = sqlite3.connect(f"file:{db.resolve()}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        info = {t: conn.execute(f'PRAGMA table_info("{t}")').fetchall() for t in tables}
    finally:
        conn.close()
    shape = parse(sql, {t: [c[1] for c in cols] for t, cols in info.items()})
    if shape is None:
        return set()
    keys = {t.lower(): [c[1] for c in cols if c[5] > 0] for t, cols in info.items()}
    types = {t.lower(): {c[1]: (c[2] or "").upper() for c in cols} for t, cols in info.items()}
    out = set()
    for i, ref in enumerate(shape.output_columns({t: [c[1] for c in cols] for t, cols in info.items()})):
        table = shape.tables.get(ref[0], "").lower() if ref else ""
        if ref and keys.get(table) == [ref[1]] and types[table].get(ref[1]) == "INTEGER":
            out.add(i)
    return out


def _column_names(db: Path, sql: str) -> list[str] | None:
    conn = sqlite3.connect(f"file:{db.resolve()}?mode=ro", uri=True)
    try:
        cur = conn.execute(f"SELECT * FROM ({sql.rstrip().rstrip(';')}) LIMIT 0")
        return [d[0] for d in cur.description]
    except sqlite3.Error:
        return None
    finally:
        conn.close()


def _single_numeric(rows: list[tuple]) -> bool:
    return len(rows) == 1 and len(rows[0]) == 1 and _is_number(rows[0][0])


def _query(b: _Builder, sql: str, r0: list[tuple], ra: list[tuple], rb: list[tuple] | None,
           demanded: tuple[str, int] | None) -> None:
    """Candidates for one non-whole-table read, from its rows on s0, A and B."""
    if rows_digest(r0) == rows_digest(ra):
        b.add(sql=sql, check="rows_equal", expected=rows_digest(ra), initial_value=len(r0), role="preservation")
        return
    stable = rb is not None and rows_digest(ra) == rows_digest(rb)
    if demanded and phi_of_rows(Predicate("x", sql, demanded[0], demanded[1]), ra) == 1.0:
        b.add(sql=sql, check=demanded[0], expected=demanded[1], initial_value=len(r0), source="trace+static_len")
    elif not r0 and ra:
        b.add(sql=sql, check="exists", initial_value=0)
    elif r0 and not ra:
        b.add(sql=sql, check="not_exists", initial_value=len(r0))
    elif stable and _single_numeric(r0) and _single_numeric(ra):
        b.add(sql=sql, check="distance", kind="scalar", expected=ra[0][0], initial_value=r0[0][0])
    elif stable:
        b.add(sql=sql, check="rows_equal", expected=rows_digest(ra), initial_value=len(r0))
    elif rb is not None and len(ra) == len(rb) and len(ra) != len(r0):
        b.add(sql=sql, check="count_eq", expected=len(ra), initial_value=len(r0))
    else:
        b.drop("volatile")


def _demanded(statement: dict[str, Any], info: StaticInfo) -> tuple[str, int] | None:
    for var in variables_of(statement, info):
        if var in info.len_checks:
            return required_count(*info.len_checks[var])
    return None


def extract(statements: list[dict[str, Any]], info: StaticInfo, s0: Path, a: Path,
            b: Path | None, *, built: bool = False) -> tuple[list[Predicate], Counter[str]]:
    """Candidate predicates from a traced run's final-DB statements (unvalidated; see `validate`).

    Targets come from the final states a and b: two replays of a reference solution, or (`built`) two
    states the verifier accepts (`awm.predicates.goal_states`). Built states changed only what the
    verifier needs and differ from each other exactly where it leaves values free, so every column of
    a table read may be compared, and a read whose rows differ between them still yields the rows they
    share; replays may change columns the verifier never reads, so there only the named ones count.
    """
    bld = _Builder()
    whole_tables: set[str] = set()
    for st in statements:
        sql = (st.get("sql") or "").strip()
        if st.get("role") != "final" or not _SQL_START.match(sql):
            continue
        r0 = _try_rows(s0, sql)
        if r0 is None:
            bld.drop("not_executable_on_s0")
            continue
        whole = _WHOLE_TABLE.match(sql)
        ra = _try_rows(a, sql)
        if ra is None:
            bld.drop("not_executable_on_reference")
            continue
        if whole and rows_digest(r0) != rows_digest(ra):
            if whole.group(1) not in whole_tables:
                whole_tables.add(whole.group(1))
                listed = sql.split(None, 1)[1].rsplit(" FROM ", 1)[0] if " FROM " in sql else "*"
                selected = None if listed.strip() == "*" else [c.strip() for c in listed.split(",")]
                _table_diff(bld, whole.group(1), s0, a, b or a, info, selected, every_column=built)
            continue
        rb = _try_rows(b, sql) if b else None
        if built and rb is not None and rows_digest(r0) != rows_digest(ra) and not (
                _single_numeric(r0) and _single_numeric(ra) and rows_digest(ra) == rows_digest(rb)):
            _shared_rows(bld, sql, s0, r0, ra, rb)  # row by row: an `exists` of any row would be too weak
            continue
        _query(bld, sql, r0, ra, rb, _demanded(st, info))
    return bld.candidates, bld.dropped


def validate(candidates: list[Predicate], s0: Path, a: Path | None, b: Path | None,
             dropped: Counter[str]) -> tuple[list[Predicate], list[Predicate]]:
    """Split candidates into (progress, preservation): executable on s0, met on both replays.

    Without replays the role follows s0 alone: met there -> preservation, else progress (unreplayed).
    """
    progress, preservation = [], []
    for p in candidates:
        if _try_rows(s0, p.sql) is None:
            dropped["not_executable_on_s0"] += 1
            continue
        if a is not None:
            if evaluate(a, [p])[0] < 1.0:
                dropped["false_on_reference"] += 1
                continue
            if b is not None and evaluate(b, [p])[0] < 1.0:
                dropped["false_on_second_replay"] += 1
                continue
        met_at_s0 = evaluate(s0, [p])[0] >= 1.0
        p.role = "preservation" if met_at_s0 else "progress"
        (preservation if met_at_s0 else progress).append(p)
    for i, p in enumerate(progress, start=1):
        p.id = f"c{i}"
    for i, p in enumerate(preservation, start=1):
        p.id = f"p{i}"
    return progress, preservation


def phi(db_path: str | Path, predicates: list[Predicate]) -> float | None:
    """Phi(s) = mean phi_i(s) over the progress predicates, None when there are none."""
    if not predicates:
        return None
    values = evaluate(db_path, predicates)
    return sum(values) / len(values)

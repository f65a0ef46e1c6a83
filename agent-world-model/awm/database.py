"""Scenario databases: build each initial SQLite DB once, keep it as a template.

Building follows upstream's order (each table's DDL, then its indexes, then legacy
`examples`, then every INSERT with foreign keys on) but runs in one transaction and reports
every failed statement instead of only logging it. Episodes never touch a template: they get
their own copy (`awm.episode`), and snapshots use SQLite's online backup API so a copy is
consistent even while a connection is open.

Deterministic clock: AWM sample data says `datetime('now', '-3 days')` and its DDL says
`DEFAULT CURRENT_TIMESTAMP`, so two builds differ. With `clock` set, 'now' in the SQLite
date functions is pinned to that instant (the functions are overridden by Python versions
that delegate to SQLite's own code with the fixed time), `CURRENT_TIMESTAMP/DATE/TIME` in
DDL defaults are rewritten to the equivalent `datetime('now')` forms for the build, and
`random()` / `randomblob()` draw from `seed`. Same inputs + clock + seed -> identical bytes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

BUILDER_VERSION = 1
_DATE_FUNCS = {"date": 0, "time": 0, "datetime": 0, "julianday": 0, "unixepoch": 0, "strftime": 1}
_CURRENT_RE = re.compile(r"\bCURRENT_(TIMESTAMP|DATE|TIME)\b", re.IGNORECASE)
_CURRENT_SUB = {"TIMESTAMP": "(datetime('now'))", "DATE": "(date('now'))", "TIME": "(time('now'))"}


class DatabaseBuildError(RuntimeError):
    """The schema could not be built at all (no table was created)."""


@dataclass
class BuildReport:
    """What happened while building one scenario DB; `failed` lists (kind, statement, error)."""

    scenario: str
    path: str
    tables: int = 0
    indexes: int = 0
    inserts_total: int = 0
    inserts_ok: int = 0
    failed: list[tuple[str, str, str]] = field(default_factory=list)
    clock: str | None = None
    seed: int = 0
    built_at: str = ""
    sha256: str = ""
    env_created_tables: list[str] = field(default_factory=list)

    @property
    def insert_failure_ratio(self) -> float:
        return 0.0 if not self.inserts_total else 1 - self.inserts_ok / self.inserts_total

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_clock(clock: str) -> str:
    """Normalise a clock value to SQLite's 'YYYY-MM-DD HH:MM:SS' (UTC)."""
    try:
        dt = datetime.fromisoformat(clock.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"clock {clock!r} is not an ISO date-time such as 2025-01-01T00:00:00") from None
    if dt.tzinfo is not None:
        dt = dt.astimezone(UTC).replace(tzinfo=None)
    return dt.strftime("%Y-%m-%d %H:%M:%S")


def install_fixed_clock(conn: sqlite3.Connection, clock: str, seed: int = 0) -> None:
    """Pin 'now' and the random functions of `conn` (see module docstring)."""
    now = parse_clock(clock)
    plain = sqlite3.connect(":memory:")  # SQLite's own date code, never overridden
    rng = random.Random(seed)

    def make(name: str, pos: int) -> Callable[..., Any]:
        sql = f"SELECT {name}({{}})"

        def fn(*args: Any) -> Any:
            args = list(args)
            if len(args) <= pos:
                args.append(now)  # date() with no argument means 'now'
            elif isinstance(args[pos], str) and args[pos].strip().lower() == "now":
                args[pos] = now
            return plain.execute(sql.format(", ".join("?" * len(args))), args).fetchone()[0]

        return fn

    for name, pos in _DATE_FUNCS.items():
        conn.create_function(name, -1, make(name, pos))
    conn.create_function("random", 0, lambda: rng.getrandbits(64) - (1 << 63))
    conn.create_function("randomblob", 1, lambda n: rng.randbytes(max(int(n or 0), 1)))


def _exec(conn: sqlite3.Connection, sql: str) -> None:
    try:
        conn.execute(sql)
    except sqlite3.ProgrammingError as exc:  # more than one statement in the string
        if "one statement" not in str(exc):
            raise
        for stmt in _split_statements(sql):
            conn.execute(stmt)


def _split_statements(sql: str) -> list[str]:
    out, buf = [], ""
    for part in sql.split(";"):
        buf += part + ";"
        if sqlite3.complete_statement(buf):
            if buf.strip(" \n\t;"):
                out.append(buf.strip())
            buf = ""
    return out


def build_db(path: str | os.PathLike[str], db_schema: dict, sample_data: dict | None, *,
             scenario: str = "", clock: str | None = None, seed: int = 0) -> BuildReport:
    """Create the initial DB of a scenario at `path` (replacing it) and report every failure."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".building{os.getpid()}-{threading.get_ident()}")
    tmp.unlink(missing_ok=True)
    report = BuildReport(scenario=scenario, path=str(path), clock=parse_clock(clock) if clock else None, seed=seed,
                         built_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    conn = sqlite3.connect(tmp, isolation_level=None)
    try:
        if clock:
            install_fixed_clock(conn, clock, seed)
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("BEGIN")
        tables = (db_schema or {}).get("tables") or []
        for table in tables:
            ddl = table.get("ddl") or ""
            if clock:
                ddl = _CURRENT_RE.sub(lambda m: _CURRENT_SUB[m.group(1).upper()], ddl)
            try:
                _exec(conn, ddl)
                report.tables += 1
            except sqlite3.Error as exc:
                report.failed.append(("ddl", ddl, str(exc)))
            for index in table.get("indexes") or []:
                try:
                    _exec(conn, index)
                    report.indexes += 1
                except sqlite3.Error as exc:
                    report.failed.append(("index", index, str(exc)))
            for example in table.get("examples") or []:
                try:
                    _exec(conn, example)
                except sqlite3.Error as exc:
                    report.failed.append(("example", example, str(exc)))
        if tables and report.tables == 0:
            raise DatabaseBuildError(f"scenario {scenario!r}: none of {len(tables)} CREATE TABLE statements "
                                     f"executed; first error: {report.failed[0][2]}")
        conn.execute("COMMIT")
        apply_inserts(conn, sample_data, report)
    finally:
        conn.close()
    os.replace(tmp, path)
    report.sha256 = file_sha256(path)
    if report.failed:
        log.warning("scenario %s: %d statements failed while building its DB (first: %s)",
                    scenario, len(report.failed), report.failed[0][2])
    return report


def apply_inserts(conn: sqlite3.Connection, sample_data: dict | None, report: BuildReport) -> None:
    """Run the sample INSERTs in one transaction with foreign keys on; record each failure."""
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("BEGIN")
    for table in (sample_data or {}).get("tables") or []:
        for stmt in table.get("insert_statements") or []:
            report.inserts_total += 1
            try:
                _exec(conn, stmt)
                report.inserts_ok += 1
            except sqlite3.Error as exc:
                report.failed.append(("insert", stmt, str(exc)))
    conn.execute("COMMIT")


def file_sha256(path: str | os.PathLike[str]) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def backup(src: str | os.PathLike[str] | sqlite3.Connection, dst: str | os.PathLike[str] | sqlite3.Connection) -> None:
    """Copy a whole DB with SQLite's online backup API (consistent even if `src` is in use)."""
    s = src if isinstance(src, sqlite3.Connection) else sqlite3.connect(src)
    d = dst if isinstance(dst, sqlite3.Connection) else sqlite3.connect(dst)
    try:
        s.backup(d)
    finally:
        if s is not src:
            s.close()
        if d is not dst:
            d.close()


def state_hash(path: str | os.PathLike[str]) -> str:
    """Hash of a DB's logical content (schema + rows in key order), independent of file layout.

    Two DBs with the same tables and rows hash alike even if their pages differ (after a
    VACUUM, a restore, or a different insert order), which is what trace auditing needs.
    """
    h = hashlib.sha256()
    conn = sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True)
    try:
        tables = conn.execute("SELECT name, sql FROM sqlite_master WHERE type='table' "
                              "AND name NOT LIKE 'sqlite_%' ORDER BY name").fetchall()
        for name, sql in tables:
            h.update(f"T:{name}:{sql}\n".encode())
            order = ", ".join(str(i + 1) for i in range(_ncols(conn, name)))
            for row in conn.execute(f'SELECT * FROM "{name}" ORDER BY {order}'):
                h.update(json.dumps(row, default=repr).encode())
    finally:
        conn.close()
    return h.hexdigest()


def _tables(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' "
                                       "AND name NOT LIKE 'sqlite_%' ORDER BY name")]


def _keyed_rows(conn: sqlite3.Connection, table: str) -> tuple[list[str], dict[tuple, tuple]]:
    """Column names and rows keyed by primary key (rowid when the table has none)."""
    info = conn.execute(f'PRAGMA table_info("{table}")').fetchall()
    cols = [c[1] for c in info]
    pk = [c[1] for c in sorted(info, key=lambda c: c[5]) if c[5] > 0]
    key_sql = ", ".join(f'"{c}"' for c in pk) if pk else "rowid"
    rows = conn.execute(f'SELECT {key_sql}, * FROM "{table}"').fetchall()
    width = len(pk) or 1
    return cols, {tuple(r[:width]): tuple(r[width:]) for r in rows}


def table_change(cols: list[str], before: dict[tuple, tuple], after: dict[tuple, tuple]) -> dict[str, Any] | None:
    """One table's change between two keyed row sets (`_keyed_rows`): rows added, removed and changed, and the
    columns that changed; None when nothing did."""
    changed = [k for k in before.keys() & after.keys() if before[k] != after[k]]
    columns = sorted({cols[i] for k in changed for i, (x, y) in enumerate(zip(before[k], after[k], strict=False))
                      if x != y})
    entry = {"added": len(after.keys() - before.keys()), "removed": len(before.keys() - after.keys()),
             "changed": len(changed), "changed_columns": columns}
    return entry if entry["added"] or entry["removed"] or entry["changed"] else None


def diff_databases(before: str | os.PathLike[str], after: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """What changed between two DBs, per table: rows added/removed/changed and which columns.

    Tables without changes are left out; a table that exists on one side only is reported with
    `"table": "added"` or `"removed"`. Used for traces (what did this turn do to the state?).
    """
    out: dict[str, dict[str, Any]] = {}
    a = sqlite3.connect(f"file:{Path(before).resolve()}?mode=ro", uri=True)
    b = sqlite3.connect(f"file:{Path(after).resolve()}?mode=ro", uri=True)
    try:
        ta, tb = set(_tables(a)), set(_tables(b))
        for name in sorted(ta | tb):
            if name not in ta or name not in tb:
                out[name] = {"table": "added" if name in tb else "removed"}
                continue
            cols, ra = _keyed_rows(a, name)
            _, rb = _keyed_rows(b, name)
            entry = table_change(cols, ra, rb)
            if entry is not None:
                out[name] = entry
    finally:
        a.close()
        b.close()
    return out


def _ncols(conn: sqlite3.Connection, table: str) -> int:
    return len(conn.execute(f'PRAGMA table_info("{table}")').fetchall())


class TemplateStore:
    """Built scenario DBs on disk, keyed by their inputs, so each is built once per machine.

    Layout: `<root>/<scenario>-<key>.db` and a `.json` build report beside it; `key` hashes the
    schema, the sample data, the clock, the seed and the builder version.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    @staticmethod
    def key(db_schema: Any, sample_data: Any, clock: str | None, seed: int) -> str:
        blob = json.dumps([BUILDER_VERSION, db_schema, sample_data, clock and parse_clock(clock), seed], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def path(self, scenario: str, key: str) -> Path:
        return self.root / f"{scenario}-{key}.db"

    def get_or_build(self, scenario: str, db_schema: dict, sample_data: dict | None, *,
                     clock: str | None = None, seed: int = 0, rebuild: bool = False) -> tuple[Path, BuildReport]:
        key = self.key(db_schema, sample_data, clock, seed)
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            return self._get_or_build(scenario, key, db_schema, sample_data, clock, seed, rebuild)

    def _get_or_build(self, scenario: str, key: str, db_schema: dict, sample_data: dict | None, clock: str | None,
                      seed: int, rebuild: bool) -> tuple[Path, BuildReport]:
        db, meta = self.path(scenario, key), self.path(scenario, key).with_suffix(".json")
        if not rebuild and db.exists() and meta.exists():
            try:
                data = json.loads(meta.read_text())
                data["failed"] = [tuple(f) for f in data["failed"]]
                return db, BuildReport(**data)
            except (ValueError, TypeError, KeyError):
                log.warning("rebuilding %s: unreadable build report", db)
        report = build_db(db, db_schema, sample_data, scenario=scenario, clock=clock, seed=seed)
        self.save_report(report)
        return db, report

    @staticmethod
    def save_report(report: BuildReport) -> None:
        meta = Path(report.path).with_suffix(".json")
        tmp = meta.with_name(meta.name + f".tmp{os.getpid()}-{threading.get_ident()}")
        tmp.write_text(json.dumps(report.to_dict(), indent=1))
        os.replace(tmp, meta)

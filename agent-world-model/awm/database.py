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

Trust: the SQL text of the data files (gen_db DDL, gen_sample INSERTs) and the DDL a worker reports
(its code's `create_all`) run in the trainer, so every connection that runs them has a `SqlGuard`:
a SQLite authorizer that lets through only what a schema and sample build needs and refuses ATTACH,
VACUUM, PRAGMAs, transaction control, extensions and anything outside the main database. A refused
statement is a failed statement of the BuildReport, with the reason. Cost is bounded too: each statement
of such text has a wall-clock limit (STATEMENT_BUDGET_S, by a progress handler) and a build has a total one
(BUILD_BUDGET_S), and no value may exceed MAX_VALUE_BYTES (SQLITE_LIMIT_LENGTH): an endless recursive CTE
or an index on `zeroblob(10**9)` is a failed statement naming the limit, not a stalled trainer.

Reading an episode DB (env code wrote it) goes through `open_readonly`: the same value-size limit, no
ATTACH, a wall-clock budget per read (READ_BUDGET_S), and only stored columns are read (a VIRTUAL
generated column is computed on every read: `AS (zeroblob(200000000))` costs nothing on disk).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

BUILDER_VERSION = 2  # 2: built under SqlGuard; env DDL goes to its own completed file
_DATE_FUNCS = {"date": 0, "time": 0, "datetime": 0, "julianday": 0, "unixepoch": 0, "strftime": 1}
_CURRENT_RE = re.compile(r"\bCURRENT_(TIMESTAMP|DATE|TIME)\b", re.IGNORECASE)
_CURRENT_SUB = {"TIMESTAMP": "(datetime('now'))", "DATE": "(date('now'))", "TIME": "(time('now'))"}


MAX_VALUE_BYTES = 16 << 20  # SQLITE_LIMIT_LENGTH (value or row) on connections that run or read env/data SQL
STATEMENT_BUDGET_S = 10.0  # wall-clock limit of one statement of data or env SQL text in a build
BUILD_BUDGET_S = 120.0  # wall-clock limit of all the data or env SQL text of one build
READ_BUDGET_S = 10.0  # wall-clock limit of one trainer-side read of an episode DB (state hash, diff)
_PROGRESS_STEPS = 10_000  # SQLite VM steps between two looks at the clock (a look costs ~0.1 us)


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


# ---- the guard on SQL text from data files and workers ---------------------------------------------
_SCHEMA_TABLES = frozenset({"sqlite_master", "sqlite_schema", "sqlite_temp_master", "sqlite_temp_schema"})
_REFUSED_FUNCTIONS = frozenset({"load_extension", "fts3_tokenizer"})  # code loading / raw pointers
_READS = frozenset({sqlite3.SQLITE_READ, sqlite3.SQLITE_SELECT, sqlite3.SQLITE_RECURSIVE})
_WRITES = frozenset({sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE})
_DATA_CREATES = frozenset({sqlite3.SQLITE_CREATE_TABLE, sqlite3.SQLITE_CREATE_INDEX, sqlite3.SQLITE_CREATE_VIEW,
                           sqlite3.SQLITE_CREATE_TRIGGER})
_DDL_CREATES = frozenset({sqlite3.SQLITE_CREATE_TABLE, sqlite3.SQLITE_CREATE_INDEX})
_ACTION_NAMES = {getattr(sqlite3, f"SQLITE_{n}"): n for n in (
    "CREATE_INDEX CREATE_TABLE CREATE_TEMP_INDEX CREATE_TEMP_TABLE CREATE_TEMP_TRIGGER CREATE_TEMP_VIEW "
    "CREATE_TRIGGER CREATE_VIEW DELETE DROP_INDEX DROP_TABLE DROP_TEMP_INDEX DROP_TEMP_TABLE DROP_TEMP_TRIGGER "
    "DROP_TEMP_VIEW DROP_TRIGGER DROP_VIEW INSERT PRAGMA READ SELECT TRANSACTION UPDATE ATTACH DETACH "
    "ALTER_TABLE REINDEX ANALYZE CREATE_VTABLE DROP_VTABLE FUNCTION SAVEPOINT RECURSIVE").split()}
# pragmas data text may use: schema reads, and foreign_keys set ON (a no-op: the build already has it on)
_PRAGMAS_READ = frozenset({"foreign_keys", "table_info", "table_xinfo", "index_list", "index_info", "index_xinfo",
                           "foreign_key_list"})
_ON = frozenset({"on", "1", "true", "yes"})
_VACUUM = re.compile(r"VACUUM\b", re.IGNORECASE)
_LEADING = re.compile(r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?(?:\*/|$))*", re.DOTALL)  # whitespace and comments


class SqlRefused(sqlite3.DatabaseError):
    """A statement the SqlGuard refused (its message says what and why)."""


class SqlTimeout(sqlite3.OperationalError):
    """A statement of SQL text the trainer did not write ran past its wall-clock limit (the message says which)."""


class SqlGuard:
    """A SQLite authorizer for a connection that runs SQL text the trainer did not write.

    Data mode (gen_db DDL, gen_sample INSERTs): CREATE TABLE/INDEX/VIEW/TRIGGER in the main database,
    INSERT/UPDATE/DELETE of main-database tables, reads, read-only schema PRAGMAs and `foreign_keys=ON`,
    and every function but load_extension and fts3_tokenizer. DDL mode (`ddl_only`, the DDL a worker reports): CREATE TABLE and CREATE INDEX only
    (not CREATE TABLE ... AS SELECT).
    Everything else is refused, among it ATTACH and DETACH (so VACUUM, which attaches, and VACUUM INTO),
    other PRAGMAs (writable_schema, journal_mode, ...), BEGIN/COMMIT/ROLLBACK/SAVEPOINT (a `COMMIT;` in the text cannot end the build's transaction),
    ALTER, DROP, ANALYZE, virtual and temporary objects. Writes to sqlite_master come only from CREATE
    (SQLite refuses them otherwise while writable_schema is off, and no PRAGMA can turn it on). The
    build's own PRAGMA/BEGIN/COMMIT run in `trusted()`. The authorizer is consulted when a statement is
    prepared; `set_authorizer` expires every cached statement, so none prepared in `trusted()` runs
    unchecked later.
    """

    def __init__(self, conn: sqlite3.Connection, *, ddl_only: bool = False, build_deadline: float | None = None,
                 statement_budget_s: float | None = None) -> None:
        self.conn, self.ddl_only = conn, ddl_only
        self.refusal: str | None = None
        # time.monotonic() past which no statement of the text may run (shared by the guards of one build)
        self.build_deadline = time.monotonic() + BUILD_BUDGET_S if build_deadline is None else build_deadline
        self.statement_budget_s = STATEMENT_BUDGET_S if statement_budget_s is None else statement_budget_s
        self._deadline = float("inf")  # of the statement running now; inf for the build's own statements
        self._limit = ""
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)  # a second lock on ATTACH (and so on VACUUM INTO)
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
        conn.set_authorizer(self._authorize)
        conn.set_progress_handler(self._past_deadline, _PROGRESS_STEPS)

    def _past_deadline(self) -> bool:
        return time.monotonic() > self._deadline

    @contextmanager
    def timed(self) -> Iterator[None]:
        """Run one statement of the text under its wall-clock limit (and the build's); past it SQLite
        interrupts the statement and `SqlTimeout` names the limit."""
        now = time.monotonic()
        if now >= self.build_deadline:
            raise SqlTimeout("not run: the build's SQL text has used its wall-clock budget (BUILD_BUDGET_S)")
        statement_end = now + self.statement_budget_s
        self._deadline = min(statement_end, self.build_deadline)
        try:
            yield
        except sqlite3.OperationalError as exc:
            if str(exc) != "interrupted" or time.monotonic() <= self._deadline:
                raise
            limit = (f"{self.statement_budget_s:g} s a statement (STATEMENT_BUDGET_S)"
                     if statement_end <= self.build_deadline else "the build's total (BUILD_BUDGET_S)")
            raise SqlTimeout(f"interrupted by the trainer's SQL guard: ran past its wall-clock limit of {limit}") \
                from None
        finally:
            self._deadline = float("inf")

    @contextmanager
    def trusted(self) -> Iterator[None]:
        """Run the build's own statements (PRAGMA foreign_keys, BEGIN, COMMIT) without the guard."""
        self.conn.set_authorizer(None)
        try:
            yield
        finally:
            self.conn.set_authorizer(self._authorize)

    def _authorize(self, action: int, arg1: str | None, arg2: str | None, db: str | None, _src: str | None) -> int:
        if action == sqlite3.SQLITE_READ or (action in _READS and not self.ddl_only):  # DDL: no SELECT (AS SELECT)
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION:
            if (arg2 or "").lower() not in _REFUSED_FUNCTIONS:
                return sqlite3.SQLITE_OK
            return self._refuse(f"the function {arg2}() is not allowed")
        if action == sqlite3.SQLITE_PRAGMA and not self.ddl_only and (arg1 or "").lower() in _PRAGMAS_READ and (
                arg2 is None or (arg1 or "").lower() != "foreign_keys" or arg2.strip().lower() in _ON):
            return sqlite3.SQLITE_OK  # reads of the schema, and the `PRAGMA foreign_keys=ON` the build sets anyway
        if db not in (None, "main"):
            return self._refuse(f"{_ACTION_NAMES.get(action, action)} on database {db!r}: only the main database")
        if action in _WRITES:
            table = (arg1 or "").lower()
            if table not in _SCHEMA_TABLES and not self.ddl_only:
                return sqlite3.SQLITE_OK
            if table in _SCHEMA_TABLES and action != sqlite3.SQLITE_DELETE:
                return sqlite3.SQLITE_OK  # CREATE's own row (SQLite refuses other writes: writable_schema is off)
        elif action in (_DDL_CREATES if self.ddl_only else _DATA_CREATES) or action == sqlite3.SQLITE_REINDEX:
            return sqlite3.SQLITE_OK  # REINDEX: what CREATE INDEX asks for
        what = _ACTION_NAMES.get(action, str(action))
        detail = " ".join(str(a) for a in (arg1, arg2) if a)
        allowed = ("CREATE TABLE and CREATE INDEX" if self.ddl_only else
                   "CREATE TABLE/INDEX/VIEW/TRIGGER, INSERT, UPDATE, DELETE and SELECT")
        return self._refuse(f"{what}{' ' + detail if detail else ''} (allowed here: {allowed})")

    def _refuse(self, why: str) -> int:
        if self.refusal is None:
            self.refusal = why
        return sqlite3.SQLITE_DENY

    def execute(self, sql: str) -> None:
        """Run one item of SQL text (one or more statements, each prepared and run on its own)."""
        self.refusal = None
        try:
            try:
                self._one(sql)
            except sqlite3.ProgrammingError as exc:  # more than one statement in the string (none of them ran)
                if "one statement" not in str(exc):
                    raise
                for stmt in _split_statements(sql):
                    self._one(stmt)
        except SqlTimeout:
            raise
        except sqlite3.Error as exc:
            if self.refusal is not None:
                raise SqlRefused(f"refused by the trainer's SQL guard: {self.refusal}") from None
            raise exc from None

    def _one(self, stmt: str) -> None:
        # VACUUM asks the authorizer only while it runs (for the ATTACH it does); name it before SQLite's
        # "cannot VACUUM from within a transaction" does
        if _VACUUM.match(stmt, _LEADING.match(stmt).end()):
            self.refusal = "VACUUM (it attaches a database: VACUUM INTO writes a file)"
            raise SqlRefused(self.refusal)
        with self.timed():
            self.conn.execute(stmt)


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
    """Create the initial DB of a scenario at `path` (replacing it) and report every failure.

    The data's SQL runs under a `SqlGuard` (see the module docstring): a refused statement is a
    failed one, like a statement SQLite rejects."""
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
        guard = SqlGuard(conn)
        with guard.trusted():
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute("BEGIN")
        tables = (db_schema or {}).get("tables") or []
        for table in tables:
            ddl = table.get("ddl") or ""
            if clock and isinstance(ddl, str):
                ddl = _CURRENT_RE.sub(lambda m: _CURRENT_SUB[m.group(1).upper()], ddl)
            if _run(guard, "ddl", ddl, report):
                report.tables += 1
            for index in table.get("indexes") or []:
                if _run(guard, "index", index, report):
                    report.indexes += 1
            for example in table.get("examples") or []:
                _run(guard, "example", example, report)
        if tables and report.tables == 0:
            raise DatabaseBuildError(f"scenario {scenario!r}: none of {len(tables)} CREATE TABLE statements "
                                     f"executed; first error: {report.failed[0][2]}")
        with guard.trusted():
            conn.execute("COMMIT")
        apply_inserts(conn, sample_data, report, guard)
    finally:
        conn.close()
    os.replace(tmp, path)
    report.sha256 = file_sha256(path)
    if report.failed:
        log.warning("scenario %s: %d statements failed while building its DB (first: %s)",
                    scenario, len(report.failed), report.failed[0][2])
    return report


def _run(guard: SqlGuard, kind: str, sql: str, report: BuildReport) -> bool:
    """Run one item of the data's SQL inside the build's transaction; record a failure (or refusal)."""
    if not isinstance(sql, str):
        report.failed.append((kind, repr(sql)[:1000], f"not SQL text but {type(sql).__name__}"))
        return False
    try:
        guard.execute(sql)
        return True
    except sqlite3.Error as exc:
        report.failed.append((kind, sql, str(exc)))
        why = ("SQLite rolls back the transaction of an interrupted write" if isinstance(exc, SqlTimeout)
               else "ON CONFLICT ROLLBACK?")
    if not guard.conn.in_transaction:  # `INSERT OR ROLLBACK` (or an I/O error) ended the build's transaction
        report.failed.append((kind, sql, f"this statement ended the build's transaction ({why}); "
                                         "the statements before it in that transaction were rolled back"))
        with guard.trusted():
            guard.conn.execute("BEGIN")
    return False


def apply_inserts(conn: sqlite3.Connection, sample_data: dict | None, report: BuildReport,
                  guard: SqlGuard | None = None) -> None:
    """Run the sample INSERTs in one transaction with foreign keys on, under a `SqlGuard` (installed on
    `conn` when none is given); record each failure."""
    guard = guard or SqlGuard(conn)
    with guard.trusted():
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("BEGIN")
    for table in (sample_data or {}).get("tables") or []:
        for stmt in table.get("insert_statements") or []:
            report.inserts_total += 1
            if _run(guard, "insert", stmt, report):
                report.inserts_ok += 1
    with guard.trusted():
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
    with open_readonly(path) as conn:
        tables = conn.execute("SELECT name, sql FROM sqlite_master WHERE type='table' "
                              "AND name NOT LIKE 'sqlite_%' ORDER BY name").fetchall()
        for name, sql in tables:
            h.update(f"T:{name}:{sql}\n".encode())
            cols = row_columns(conn, name)[0]
            order = ", ".join(str(i + 1) for i in range(len(cols)))
            for row in conn.execute(f'SELECT {", ".join(map(_q, cols))} FROM {_q(name)} ORDER BY {order}'):
                h.update(json.dumps(row, default=repr).encode())
    return h.hexdigest()


class ReadBudgetExceeded(sqlite3.OperationalError):
    """A trainer-side read of an episode DB ran past READ_BUDGET_S (env code made its rows costly to read)."""


@contextmanager
def open_readonly(path: str | os.PathLike[str], budget_s: float | None = None) -> Iterator[sqlite3.Connection]:
    """A read-only connection on a DB that env code wrote, closed on exit: no value over MAX_VALUE_BYTES
    ("string or blob too big"), no ATTACH, and past `budget_s` of wall-clock time its statement is
    interrupted (`ReadBudgetExceeded`). Every trainer-side read of an episode DB uses one."""
    budget_s = READ_BUDGET_S if budget_s is None else budget_s
    conn = sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True)
    try:
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        deadline = time.monotonic() + budget_s
        conn.set_progress_handler(lambda: time.monotonic() > deadline, _PROGRESS_STEPS)
        try:
            yield conn
        except sqlite3.OperationalError as exc:
            if str(exc) == "interrupted" and time.monotonic() > deadline:
                raise ReadBudgetExceeded(f"reading {path} ran past its {budget_s:g} s wall-clock budget "
                                         "(READ_BUDGET_S): its rows are too costly to read") from None
            raise
    finally:
        conn.close()


def row_columns(conn: sqlite3.Connection, table: str) -> tuple[list[str], list[str]]:
    """(columns, primary key columns) of a state read, from one PRAGMA. The columns are in `SELECT *` order,
    all but VIRTUAL generated ones (computed on each read, at a cost env code chooses; what they derive from
    is read) and hidden ones of virtual tables: for a table without generated columns, `SELECT *`'s, so its
    rows read (and hash) as before."""
    info = conn.execute(f"PRAGMA table_xinfo({_q(table)})").fetchall()
    return [c[1] for c in info if c[6] in (0, 3)], [c[1] for c in sorted(info, key=lambda c: c[5]) if c[5] > 0]


def _q(name: str) -> str:
    """A quoted SQL identifier: env code names the tables of the DBs the trainer reads (a name may hold '"')."""
    return '"' + name.replace('"', '""') + '"'


def _tables(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' "
                                       "AND name NOT LIKE 'sqlite_%' ORDER BY name")]


def _keyed_rows(conn: sqlite3.Connection, table: str) -> tuple[list[str], dict[tuple, tuple]]:
    """Column names and rows keyed by primary key (rowid when the table has none)."""
    cols, pk = row_columns(conn, table)
    key_sql = ", ".join(_q(c) for c in pk) if pk else "rowid"
    rows = conn.execute(f'SELECT {key_sql}, {", ".join(map(_q, cols))} FROM {_q(table)}').fetchall()
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
    with open_readonly(before) as a, open_readonly(after) as b:
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
    return out


_NAME = re.compile(r"[A-Za-z0-9_]{1,200}")
_CREATE = re.compile(r"CREATE\b", re.IGNORECASE)
MAX_ENV_DDL_CHARS = 100_000  # one CREATE statement a worker reports (SQLAlchemy's are a few hundred)
MAX_ENV_DDL_STATEMENTS = 5_000  # statements a worker reports (AWM-1K's create_all: tens)


class TemplateStore:
    """Built scenario DBs on disk, keyed by their inputs, so each is built once per machine.

    Layout: `<root>/<scenario>-<key>.db` and a `.json` build report beside it; `key` hashes the
    schema, the sample data, the clock, the seed and the builder version. A template completed with
    the DDL of its environment code's `create_all` is another file, `<scenario>-<key>-<ddl key>.db`
    (`complete`): the base template, which every data set with the same inputs shares across runs, is
    never changed after its build.
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
        if not _NAME.fullmatch(scenario):
            raise ValueError(f"scenario name {scenario!r} cannot name a template file: use letters, digits and '_' "
                             "(awm.data.normalize_scenario_name gives such a name)")
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
        db = self.path(scenario, key)
        cached = None if rebuild else self._cached(db)
        if cached is not None:
            return db, cached
        report = build_db(db, db_schema, sample_data, scenario=scenario, clock=clock, seed=seed)
        self.save_report(report)
        return db, report

    @staticmethod
    def _cached(db: Path) -> BuildReport | None:
        """The build report of a template built before (None: not built, or its report is unreadable)."""
        meta = db.with_suffix(".json")
        if not (db.exists() and meta.exists()):
            return None
        try:
            data = json.loads(meta.read_text())
            data["failed"] = [tuple(f) for f in data["failed"]]
            return BuildReport(**data)
        except (ValueError, TypeError, KeyError):
            log.warning("rebuilding %s: unreadable build report", db)
            return None

    @staticmethod
    def save_report(report: BuildReport) -> None:
        meta = Path(report.path).with_suffix(".json")
        tmp = meta.with_name(meta.name + f".tmp{os.getpid()}-{threading.get_ident()}")
        tmp.write_text(json.dumps(report.to_dict(), indent=1))
        os.replace(tmp, meta)

    def complete(self, base: Path, base_report: BuildReport, created_sql: Any, sample_data: dict | None, *,
                 clock: str | None = None, seed: int = 0) -> tuple[Path, BuildReport]:
        """The base template plus the DDL a worker reported (and `sample_data`'s INSERTs, for a scenario
        whose schema only its code defines), built once into a file of its own keyed by that DDL.

        The DDL is text env code could have written (a forged sqlite_master row, a forged reply): only
        single CREATE TABLE / CREATE INDEX statements run, under a DDL-mode `SqlGuard`; anything else is a
        failed statement ("env_ddl") of the returned report."""
        statements = created_sql if isinstance(created_sql, list) else [created_sql]
        blob = json.dumps([BUILDER_VERSION, base.name, statements, sample_data, clock and parse_clock(clock), seed],
                          sort_keys=True, default=repr)
        path = base.with_name(f"{base.stem}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}.db")
        with self._guard:
            lock = self._locks.setdefault(path.name, threading.Lock())
        with lock:
            cached = self._cached(path)
            if cached is not None:
                return path, cached
            report = _complete(base, path, base_report, statements, sample_data, clock, seed)
            self.save_report(report)
            return path, report


def _complete(base: Path, path: Path, base_report: BuildReport, statements: list[Any], sample_data: dict | None,
              clock: str | None, seed: int) -> BuildReport:
    report = replace(base_report, path=str(path), failed=list(base_report.failed),
                     env_created_tables=list(base_report.env_created_tables),
                     built_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    tmp = path.with_name(path.name + f".building{os.getpid()}-{threading.get_ident()}")
    shutil.copyfile(base, tmp)
    conn = sqlite3.connect(tmp, isolation_level=None)
    try:
        if clock:
            install_fixed_clock(conn, clock, seed)
        guard = SqlGuard(conn, ddl_only=True)
        with guard.trusted():
            conn.execute("BEGIN")
        created, ran = set(), []
        if len(statements) > MAX_ENV_DDL_STATEMENTS:
            report.failed.append(("env_ddl", f"<{len(statements) - MAX_ENV_DDL_STATEMENTS} more statements>",
                                  f"more than {MAX_ENV_DDL_STATEMENTS} statements (MAX_ENV_DDL_STATEMENTS)"))
            statements = statements[:MAX_ENV_DDL_STATEMENTS]
        for stmt in statements:
            why = _env_ddl_problem(stmt)
            if why is None:
                guard.refusal = None
                try:
                    with guard.timed():
                        conn.execute(stmt)  # never split: a string of two statements fails here, before it runs
                    created.add(stmt[_LEADING.match(stmt).end():].split("(")[0].strip())
                    ran.append(stmt)
                    continue
                except sqlite3.ProgrammingError as exc:
                    if "one statement" not in str(exc):
                        raise
                    why = "refused by the trainer's SQL guard: more than one statement"
                except SqlTimeout as exc:
                    why = str(exc)
                    if not conn.in_transaction:  # SQLite rolled back the transaction of the interrupted statement
                        _replay(guard, ran, report)
                except sqlite3.Error as exc:
                    if "already exists" in str(exc) and guard.refusal is None:
                        continue
                    why = (f"refused by the trainer's SQL guard: {guard.refusal}" if guard.refusal is not None
                           else f"{type(exc).__name__}: {exc}")
            report.failed.append(("env_ddl", stmt[:1000] if isinstance(stmt, str) else repr(stmt)[:1000], why))
        with guard.trusted():
            conn.execute("COMMIT")
        if sample_data:
            apply_inserts(conn, sample_data, report, SqlGuard(conn, build_deadline=guard.build_deadline))
    finally:
        conn.close()
    os.replace(tmp, path)
    report.env_created_tables = sorted(set(report.env_created_tables) | created)
    report.sha256 = file_sha256(path)
    bad = [f for f in report.failed if f[0] == "env_ddl"]
    if bad:
        log.warning("scenario %s: %d statements of its environment code's schema were not folded into its "
                    "template (first: %s)", report.scenario, len(bad), bad[0][2])
    return report


def _replay(guard: SqlGuard, ran: list[str], report: BuildReport) -> None:
    """Begin the completion's transaction again and rerun the statements an interrupt rolled back."""
    with guard.trusted():
        guard.conn.execute("BEGIN")
    for stmt in list(ran):
        try:
            with guard.timed():
                guard.conn.execute(stmt)
        except sqlite3.Error as exc:  # the build's budget spent meanwhile: this one is lost
            ran.remove(stmt)
            report.failed.append(("env_ddl", stmt[:1000], f"rolled back by an interrupted statement, then {exc}"))
            if not guard.conn.in_transaction:
                with guard.trusted():
                    guard.conn.execute("BEGIN")


def _env_ddl_problem(stmt: Any) -> str | None:
    """Why a statement a worker reported is not one CREATE statement (None when it is)."""
    if not isinstance(stmt, str):
        return f"not SQL text but {type(stmt).__name__}"
    if len(stmt) > MAX_ENV_DDL_CHARS:
        return f"{len(stmt)} characters: longer than {MAX_ENV_DDL_CHARS} (MAX_ENV_DDL_CHARS)"
    if not _CREATE.match(stmt, _LEADING.match(stmt).end()):
        return "refused by the trainer's SQL guard: not a CREATE statement (only CREATE TABLE / CREATE INDEX)"
    if not sqlite3.complete_statement(stmt.rstrip().rstrip(";") + ";"):
        return "refused by the trainer's SQL guard: not one complete statement"
    return None

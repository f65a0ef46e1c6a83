"""SQL text the trainer did not write never runs unguarded in the trainer (issue 38).

Two sources: the data files' gen_db DDL and gen_sample INSERTs (template builds), and the DDL a worker
reports after its code's import-time `create_all` (env code can forge it: here it writes rows into its
scratch DB's sqlite_master with PRAGMA writable_schema, through the real runtime). Before the SQL guard,
`COMMIT; ATTACH ...` and `VACUUM INTO` in data text wrote files from the trainer, and the forged rows
were replayed by the trainer into another scenario's cached template, which later runs reused.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
from pathlib import Path

import pytest
from awm.data import AWMDataset, bundled_data_dir
from awm.database import TemplateStore, build_db, diff_databases, install_fixed_clock, state_hash
from awm.episode import EnvRuntime
from conftest import FAULT_APP, write_scenarios

CLOCK = "2025-01-01T00:00:00"
NOTES_DDL = "CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT NOT NULL)"
GOOD_INSERTS = ["INSERT INTO notes (id, text) VALUES (1, 'one');", "INSERT INTO notes (id, text) VALUES (2, 'two');"]
GUARD = "refused by the trainer's SQL guard"

# Each hostile text names a file it would create ({f}) if it ran unguarded; `escape` notes what it tries.
HOSTILE = {
    "commit_attach": "COMMIT; ATTACH '{f}' AS x; CREATE TABLE x.t (a); BEGIN;",
    "commit_vacuum_into": "COMMIT; VACUUM INTO '{f}'; BEGIN;",
    "vacuum_into": "VACUUM INTO '{f}';",
    "attach": "ATTACH '{f}' AS x;",
    "load_extension": "SELECT load_extension('{f}');",
    "writable_schema": "PRAGMA writable_schema=ON; INSERT INTO sqlite_master (type, name, tbl_name, rootpage, sql) "
                       "VALUES ('table', 'forged', 'forged', 0, 'CREATE TABLE forged (x)');",
}


def _schema(ddl: list[str], indexes: list[str] = (), examples: list[str] = ()) -> dict:
    return {"tables": [{"name": f"t{i}", "ddl": d, "indexes": list(indexes) if i == 0 else [],
                        "examples": list(examples) if i == 0 else []} for i, d in enumerate(ddl)]}


def _sample(inserts: list[str]) -> dict:
    return {"tables": [{"table_name": "notes", "reasoning": "", "insert_statements": inserts}]}


@pytest.mark.parametrize("where", ["ddl", "index", "example", "insert"])
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_data_file_sql_is_refused_writes_no_file_and_is_a_failed_statement(tmp_path: Path, name: str,
                                                                           where: str) -> None:
    target = tmp_path / "written.db"
    text = HOSTILE[name].format(f=target)
    ddl, indexes, examples, inserts = [NOTES_DDL], [], [], list(GOOD_INSERTS)
    {"ddl": ddl, "index": indexes, "example": examples, "insert": inserts}[where].append(text)
    inserts.append("INSERT INTO notes (id, text) VALUES (3, 'three');")  # the build goes on after a refusal
    report = build_db(tmp_path / "t.db", _schema(ddl, indexes, examples), _sample(inserts), scenario="s")
    assert not target.exists(), f"{name} in {where} wrote {target} from the trainer"
    failed = [f for f in report.failed if f[1] == text]
    assert failed and GUARD in failed[0][2], report.failed
    conn = sqlite3.connect(tmp_path / "t.db")
    try:
        assert conn.execute("SELECT id FROM notes ORDER BY id").fetchall() == [(1,), (2,), (3,)]
        assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'forged'").fetchall() == []
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        conn.close()


def test_transaction_control_in_data_cannot_end_the_build_transaction(tmp_path: Path) -> None:
    """A `ROLLBACK;` or `COMMIT;` among the INSERTs is refused: the rows before it stay, the build ends
    normally (before: ROLLBACK dropped them and the build's own COMMIT raised out of build_db)."""
    inserts = [GOOD_INSERTS[0], "ROLLBACK;", "COMMIT;", "SAVEPOINT s;", "END;", GOOD_INSERTS[1]]
    report = build_db(tmp_path / "t.db", _schema([NOTES_DDL]), _sample(inserts), scenario="s")
    refused = {f[1]: f[2] for f in report.failed}
    assert set(refused) == {"ROLLBACK;", "COMMIT;", "SAVEPOINT s;", "END;"}
    assert all(GUARD in why for why in refused.values()), refused
    assert (report.inserts_ok, report.inserts_total) == (2, 6)
    conn = sqlite3.connect(tmp_path / "t.db")
    assert conn.execute("SELECT COUNT(*) FROM notes").fetchone() == (2,)
    conn.close()


def test_pragmas_that_change_nothing_still_build_and_others_are_refused(tmp_path: Path) -> None:
    """Generated DDL often opens with `PRAGMA foreign_keys = ON;` (what the build sets anyway): it must not
    cost the table; a PRAGMA that changes the connection or file is refused with its table."""
    schema = {"tables": [{"ddl": "PRAGMA foreign_keys = ON; CREATE TABLE a (id INTEGER PRIMARY KEY);"},
                         {"ddl": "CREATE TABLE c (x); PRAGMA table_info(c);"},
                         {"ddl": "PRAGMA foreign_keys=OFF; CREATE TABLE b (x);"},
                         {"ddl": "PRAGMA journal_mode=WAL; CREATE TABLE e (x);"}]}
    report = build_db(tmp_path / "t.db", schema, None)
    assert report.tables == 2
    assert [f[1][:22] for f in report.failed] == ["PRAGMA foreign_keys=OF", "PRAGMA journal_mode=WA"]
    assert all(GUARD in f[2] for f in report.failed)
    assert not (tmp_path / "t.db-wal").exists()


def test_template_names_cannot_leave_the_store(tmp_path: Path) -> None:
    store = TemplateStore(tmp_path / "templates")
    for name in ("../x", "a/b", "a-b", ""):
        with pytest.raises(ValueError, match="cannot name a template file"):
            store.get_or_build(name, _schema([NOTES_DDL]), None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["templates"]


# ---- DDL a worker reports ---------------------------------------------------------------------------
FORGER = r'''
import glob, os
from fastapi import FastAPI
from sqlalchemy import create_engine

engine = create_engine(os.getenv("DATABASE_PATH", "sqlite:///x.db"))
app = FastAPI(title="forger")
VICTIM = sorted(glob.glob(%(victims)r))[0]
ROWS = ["COMMIT", f"ATTACH '{VICTIM}' AS v", "INSERT INTO v.notes (id, text, created_at) VALUES (99, 'pwned', '')",
        "DETACH v", "ATTACH %(canary)r AS c", "CREATE TABLE c.written (x)", "DETACH c", "BEGIN"]
raw = engine.raw_connection()  # at import: the worker's scratch copy of this scenario's template
cur = raw.cursor()
cur.execute("PRAGMA writable_schema=ON")
for i, sql in enumerate(ROWS):
    cur.execute("INSERT INTO sqlite_master (type, name, tbl_name, rootpage, sql) VALUES ('table', ?, ?, 0, ?)",
                (f"forged{i}", f"forged{i}", sql))
raw.commit()


@app.get("/ping", operation_id="ping", summary="Ping")
async def ping():
    return {"ok": True}
'''


def _sha(paths: list[Path]) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


def test_forged_schema_rows_from_env_code_reach_no_file_and_no_other_template(tmp_path: Path) -> None:
    cache, canary = tmp_path / "cache", tmp_path / "canary.db"
    forger = FORGER % {"victims": str(cache / "templates" / "victim-*.db"), "canary": str(canary)}
    data = write_scenarios(tmp_path / "data", {"victim": FAULT_APP, "forger": forger})

    async def main() -> None:
        with EnvRuntime(data, num_workers=1, cache_dir=cache, clock=CLOCK) as rt:
            ep = await rt.open("victim")
            await ep.close()
            victims = sorted((cache / "templates").glob("victim-*.db"))
            before = _sha(victims)
            ep = await rt.open("forger")  # loads the forger: its worker reports the forged rows
            await ep.close()
            assert _sha(victims) == before, "the forger's DDL changed the victim's cached templates"
            _, report = rt.template("forger")
            refused = [f for f in report.failed if f[0] == "env_ddl"]
            assert len(refused) == 8 and all(GUARD in f[2] or "unknown database" in f[2] for f in refused), refused
        with EnvRuntime(data, num_workers=1, cache_dir=cache, clock=CLOCK) as rt:  # a later run reuses the cache
            ep = await rt.open("victim")
            ids = [n["id"] for n in json.loads((await ep.call("list_notes", {})).text)["notes"]]
            assert ids == [1, 2]

    asyncio.run(main())
    assert not canary.exists(), "the trainer wrote a file named by env code"


HONEST = FAULT_APP  # its create_all adds `tags` beside gen_db's `notes`
GREEDY = FAULT_APP.replace('class Tag(Base):', '''class Backdoor(Base):
    __tablename__ = "backdoor"
    id = Column(Integer, primary_key=True)
    secret = Column(String)


class Tag(Base):''')


def test_one_data_sets_env_schema_never_reaches_another_data_sets_template(tmp_path: Path) -> None:
    """Two data sets with a scenario of the same name and the same gen_db/gen_sample (so the same cached
    base template) but different environment code: the tables one's code creates are not in the other's
    episodes, in either order, across runs sharing one template cache."""
    cache = tmp_path / "cache"
    greedy = write_scenarios(tmp_path / "greedy", {"shared": GREEDY})
    honest = write_scenarios(tmp_path / "honest", {"shared": HONEST})

    async def tables(data: Path) -> set[str]:
        with EnvRuntime(data, num_workers=1, cache_dir=cache, clock=CLOCK) as rt:
            ep = await rt.open("shared")
            conn = sqlite3.connect(ep.db_path)
            names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            conn.close()
            await ep.close()
            return names

    async def main() -> None:
        assert "backdoor" in await tables(greedy)
        assert await tables(honest) == {"notes", "tags"}
        assert "backdoor" in await tables(greedy)  # and the honest run did not undo the greedy one's

    asyncio.run(main())


def test_env_ddl_is_taken_only_as_single_create_table_or_index(tmp_path: Path) -> None:
    """What a worker reports, called the way `_load` calls it; the base template stays as built."""
    target = tmp_path / "written.db"
    data = write_scenarios(tmp_path / "data", {"victim": FAULT_APP})
    sql = ["CREATE TABLE ok1 (x INTEGER)", "/* c */ CREATE UNIQUE INDEX ok_i ON ok1 (x)",
           f"CREATE TABLE t2 (x); ATTACH '{target}' AS a", "CREATE TABLE t3 AS SELECT * FROM notes",
           "CREATE TRIGGER tr AFTER INSERT ON notes BEGIN DELETE FROM notes; END", "CREATE TEMP TABLE tt (x)",
           "CREATE VIEW v AS SELECT 1", f"VACUUM INTO '{target}'", "CREATE TABLE t4 (x DEFAULT (load_extension('z')))",
           "DROP TABLE notes", "CREATE TABLE ok2 (y TEXT)"]
    with EnvRuntime(data, num_workers=1, cache_dir=tmp_path / "cache", clock=CLOCK) as rt:
        base, report = rt.template("victim")
        base_sha = hashlib.sha256(base.read_bytes()).hexdigest()
        rt._complete_template(base, report, sql, None)
        done, done_report = rt.template("victim")
    assert not target.exists()
    assert hashlib.sha256(base.read_bytes()).hexdigest() == base_sha, "the shared base template was written"
    conn = sqlite3.connect(done)
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'")}
    conn.close()
    assert names == {"notes", "idx_notes_text", "ok1", "ok_i", "ok2", "t4"}
    refused = {f[1] for f in done_report.failed if f[0] == "env_ddl"}
    assert refused == set(sql) - {sql[0], sql[1], sql[-1], sql[8]}
    # t4's DEFAULT would call load_extension only when a row is inserted: refused then (see the data test)


# ---- real data still builds identically ----------------------------------------------------------------
def _reference_build(path: Path, db_schema: dict, sample_data: dict | None, clock: str) -> None:
    """Today's build algorithm without any guard: what the guarded build must reproduce byte for byte."""
    import re

    current = re.compile(r"\bCURRENT_(TIMESTAMP|DATE|TIME)\b", re.IGNORECASE)
    sub = {"TIMESTAMP": "(datetime('now'))", "DATE": "(date('now'))", "TIME": "(time('now'))"}

    def run(conn: sqlite3.Connection, text: str) -> bool:
        buf = ""
        for part in text.split(";"):
            buf += part + ";"
            if sqlite3.complete_statement(buf):
                if buf.strip(" \n\t;"):
                    try:
                        conn.execute(buf.strip())
                    except sqlite3.Error:
                        return False
                buf = ""
        return True

    conn = sqlite3.connect(path, isolation_level=None)
    install_fixed_clock(conn, clock, 0)
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("BEGIN")
    for table in db_schema.get("tables") or []:
        run(conn, current.sub(lambda m: sub[m.group(1).upper()], table.get("ddl") or ""))
        for text in (table.get("indexes") or []) + (table.get("examples") or []):
            run(conn, text)
    conn.execute("COMMIT")
    conn.execute("BEGIN")
    for table in (sample_data or {}).get("tables") or []:
        for text in table.get("insert_statements") or []:
            run(conn, text)
    conn.execute("COMMIT")
    conn.close()


def test_bundled_and_excerpt_templates_are_byte_identical_to_an_unguarded_build(tmp_path: Path,
                                                                                excerpt_dir: Path) -> None:
    built = 0
    for data in (bundled_data_dir(), excerpt_dir):
        ds = AWMDataset(data, cache_dir=tmp_path / "cache")
        for name in ds.scenario_names():
            sc = ds.scenario(name)
            if not sc.db_schema:
                continue
            report = build_db(tmp_path / f"{name}.db", sc.db_schema, sc.sample_data, scenario=name, clock=CLOCK)
            assert not [f for f in report.failed if GUARD in f[2]], (name, report.failed[:3])
            _reference_build(tmp_path / f"{name}.ref.db", sc.db_schema, sc.sample_data, CLOCK)
            assert report.sha256 == hashlib.sha256((tmp_path / f"{name}.ref.db").read_bytes()).hexdigest(), name
            built += 1
    assert built == 9  # six bundled scenarios, three excerpt schemas


def test_excerpt_schema_from_env_code_is_folded_in_whole(tmp_path: Path, excerpt_dir: Path) -> None:
    """communication_messaging_1 has no gen_db: its real SQLAlchemy `create_all` DDL is the whole schema.
    None of it is refused, and the completed template holds what an unguarded replay of it would."""
    async def main() -> tuple[Path, object]:
        with EnvRuntime(excerpt_dir, num_workers=1, cache_dir=tmp_path / "cache", clock=CLOCK) as rt:
            await rt.tools("communication_messaging_1")
            return rt.template("communication_messaging_1")

    path, report = asyncio.run(main())
    assert [f for f in report.failed if f[0] == "env_ddl"] == []
    assert len(report.env_created_tables) >= 22 and (report.inserts_ok, report.inserts_total) == (138, 139)
    conn = sqlite3.connect(path)
    ddl = [r[0] for r in conn.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL "
                                      "ORDER BY type = 'index', rowid")]
    conn.close()
    sample = AWMDataset(excerpt_dir, cache_dir=tmp_path / "cache").scenario("communication_messaging_1").sample_data
    _reference_build(tmp_path / "ref.db", {"tables": [{"ddl": d} for d in ddl]}, sample, CLOCK)
    assert state_hash(path) == state_hash(tmp_path / "ref.db")


def test_table_names_env_code_chose_are_quoted_in_the_trainers_state_reads(tmp_path: Path) -> None:
    """Env code names the tables of its episode DB; a '"' in a name must not change (or break) the SQL that
    the trainer's state hash and change summary run on it."""
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    for path in (a, b):
        conn = sqlite3.connect(path)
        conn.execute('CREATE TABLE "x"" ORDER BY 1; --" (id INTEGER PRIMARY KEY, "v""" TEXT)')
        conn.execute('INSERT INTO "x"" ORDER BY 1; --" VALUES (1, \'a\')')
        conn.commit()
        conn.close()
    conn = sqlite3.connect(b)
    conn.execute('UPDATE "x"" ORDER BY 1; --" SET "v""" = \'b\'')
    conn.commit()
    conn.close()
    assert state_hash(a) != state_hash(b)
    assert diff_databases(a, b) == {'x" ORDER BY 1; --': {"added": 0, "removed": 0, "changed": 1,
                                                          "changed_columns": ['v"']}}


# ---- cost: time and memory the trainer spends on SQL text and on DBs env code wrote --------------------
ENDLESS = ("INSERT INTO notes (text) WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
           "SELECT count(*) FROM c;")


def _build_in_thread(target, timeout_s: float = 30.0):
    """Run a build in a daemon thread: an unbounded one fails the test instead of hanging it."""
    import threading

    out: dict = {}
    thread = threading.Thread(target=lambda: out.setdefault("report", target()), daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        pytest.fail(f"the build still ran after {timeout_s:g} s (no wall-clock limit on the SQL text)")
    return out["report"]


def test_an_endless_statement_in_sample_data_is_a_failed_statement_naming_its_limit(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    """Red team t03: gen_sample's INSERT over an endless recursive CTE passes the authorizer (INSERT, SELECT,
    RECURSIVE) and spun the trainer's template build for ever. Each statement has a wall-clock limit
    (STATEMENT_BUDGET_S, lowered here); the build goes on after it."""
    from awm import database

    monkeypatch.setattr(database, "STATEMENT_BUDGET_S", 0.5, raising=False)
    inserts = [*GOOD_INSERTS, ENDLESS, "INSERT INTO notes (id, text) VALUES (3, 'three');"]
    report = _build_in_thread(lambda: build_db(tmp_path / "t.db", _schema([NOTES_DDL]), _sample(inserts),
                                               scenario="s"))
    failed = [f for f in report.failed if f[1] == ENDLESS]
    assert failed and "STATEMENT_BUDGET_S" in failed[0][2], report.failed
    conn = sqlite3.connect(tmp_path / "t.db")
    assert [r[0] for r in conn.execute("SELECT id FROM notes")] == [3]  # an interrupt rolls back the transaction
    conn.close()


def test_a_builds_sql_text_has_a_total_wall_clock_budget(tmp_path: Path, monkeypatch) -> None:
    """Statements each under their own limit cannot add up without end: the build's total (BUILD_BUDGET_S)
    interrupts the one running when it is spent, and the rest are not run."""
    from awm import database

    monkeypatch.setattr(database, "STATEMENT_BUDGET_S", 0.6, raising=False)
    monkeypatch.setattr(database, "BUILD_BUDGET_S", 1.0, raising=False)
    report = _build_in_thread(lambda: build_db(tmp_path / "t.db", _schema([NOTES_DDL]),
                                               _sample([ENDLESS] * 4), scenario="s"))
    reasons = [f[2] for f in report.failed if f[1] == ENDLESS and "ended the build's transaction" not in f[2]]
    assert len(reasons) == 4 and "STATEMENT_BUDGET_S" in reasons[0], reasons
    assert "BUILD_BUDGET_S" in reasons[1] and all("not run" in r for r in reasons[2:]), reasons


def _notes_template(tmp_path: Path, rows: int) -> tuple[Path, object]:
    inserts = [f"INSERT INTO notes (id, text) VALUES ({i}, 'n{i}');" for i in range(1, rows + 1)]
    store = TemplateStore(tmp_path / "store")
    return store, store.get_or_build("s", _schema([NOTES_DDL]), _sample(inserts), clock=CLOCK)


def test_env_ddl_cannot_make_values_past_the_length_limit(tmp_path: Path) -> None:
    """Red team t08: env code's reported DDL `CREATE INDEX ... ON notes(length(hex(zeroblob(150000000))) + N)`
    cost the trainer 0.5 s and 250 MB a statement (5,000 statements allowed). Values past MAX_VALUE_BYTES
    (SQLITE_LIMIT_LENGTH) fail at once: each is a failed env_ddl statement."""
    store, (base, report) = _notes_template(tmp_path, 3)
    ddl = [f"CREATE INDEX ix{i} ON notes(length(hex(zeroblob(150000000))) + {i})" for i in range(3)]
    path, done = _build_in_thread(lambda: store.complete(base, report, ddl, None, clock=CLOCK))
    failed = [f for f in done.failed if f[0] == "env_ddl"]
    assert len(failed) == 3 and all("too big" in f[2] for f in failed), failed


def test_slow_env_ddl_is_interrupted_at_its_statement_limit(tmp_path: Path, monkeypatch) -> None:
    """An index whose expression is costly on every row of the template stops at STATEMENT_BUDGET_S (lowered)."""
    from awm import database

    store, (base, report) = _notes_template(tmp_path, 2000)
    monkeypatch.setattr(database, "STATEMENT_BUDGET_S", 0.2, raising=False)
    ddl = ["CREATE TABLE tags (id INTEGER PRIMARY KEY, name TEXT)",
           "CREATE INDEX slow ON notes(length(hex(zeroblob(2000000 + id))))",
           "CREATE INDEX tags_name ON tags(name)"]
    path, done = _build_in_thread(lambda: store.complete(base, report, ddl, None, clock=CLOCK))
    failed = [f for f in done.failed if f[0] == "env_ddl"]
    assert len(failed) == 1 and "STATEMENT_BUDGET_S" in failed[0][2], failed
    conn = sqlite3.connect(path)  # the interrupt rolled back the transaction: what ran before it is run again
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    conn.close()
    assert {"tags", "tags_name"} <= names and "slow" not in names, names


def _select_star_hash(path: Path) -> str:
    """awm.database.state_hash as it was (every column of `SELECT *`): the reference for normal DBs."""
    h = hashlib.sha256()
    conn = sqlite3.connect(path)
    for name, sql in conn.execute("SELECT name, sql FROM sqlite_master WHERE type='table' "
                                  "AND name NOT LIKE 'sqlite_%' ORDER BY name").fetchall():
        h.update(f"T:{name}:{sql}\n".encode())
        n = len(conn.execute(f'PRAGMA table_info("{name}")').fetchall())
        for row in conn.execute(f'SELECT * FROM "{name}" ORDER BY {", ".join(str(i + 1) for i in range(n))}'):
            h.update(json.dumps(row, default=repr).encode())
    conn.close()
    return h.hexdigest()


def test_state_reads_skip_virtual_columns_and_hash_normal_dbs_as_before(tmp_path: Path, excerpt_dir: Path) -> None:
    """Red team t04 at awm.database: state_hash and diff_databases computed a VIRTUAL generated column's
    zeroblob(200 MB) on every row. They read stored columns only; a DB without generated columns (every
    bundled and excerpt template) hashes exactly as `SELECT *` did."""
    import time

    hashed = 0
    for data in (bundled_data_dir(), excerpt_dir):
        ds = AWMDataset(data, cache_dir=tmp_path / "cache")
        for name in ds.scenario_names():
            sc = ds.scenario(name)
            if sc.db_schema:
                report = build_db(tmp_path / f"{name}.db", sc.db_schema, sc.sample_data, scenario=name, clock=CLOCK)
                assert state_hash(report.path) == _select_star_hash(Path(report.path)), name
                hashed += 1
    assert hashed == 9
    hostile = tmp_path / "hostile.db"
    conn = sqlite3.connect(hostile)
    conn.execute("CREATE TABLE g (id INTEGER PRIMARY KEY, a TEXT, b BLOB AS (zeroblob(200000000)) VIRTUAL, "
                 "s AS (a || '!') STORED)")
    conn.execute("INSERT INTO g (id, a) VALUES (1, 'x'), (2, 'y'), (3, 'z')")
    conn.commit()
    conn.close()
    after = tmp_path / "after.db"
    database_copy = sqlite3.connect(after)
    sqlite3.connect(hostile).backup(database_copy)
    database_copy.execute("UPDATE g SET a = 'w' WHERE id = 2")
    database_copy.commit()
    database_copy.close()
    start = time.monotonic()
    assert state_hash(hostile) != state_hash(after)
    assert diff_databases(hostile, after) == {"g": {"added": 0, "removed": 0, "changed": 1,
                                                    "changed_columns": ["a", "s"]}}
    assert time.monotonic() - start < 1.0

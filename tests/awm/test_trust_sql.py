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

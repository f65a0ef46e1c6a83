"""Template databases: excerpt conformance, failure reports, the deterministic clock."""

from __future__ import annotations

import sqlite3

from awm.data import AWMDataset
from awm.database import TemplateStore, backup, build_db, diff_databases, file_sha256, state_hash


def test_e_commerce_33_builds_with_every_insert(excerpt_dir, cache_dir, tmp_path):
    sc = AWMDataset(excerpt_dir, cache_dir=cache_dir).scenario("e_commerce_33")
    report = build_db(tmp_path / "ec.db", sc.db_schema, sc.sample_data, scenario=sc.name)
    assert (report.tables, report.inserts_ok, report.inserts_total, report.failed) == (19, 133, 133, [])
    conn = sqlite3.connect(tmp_path / "ec.db")
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    conn.close()


def test_content_platform_1_builds(excerpt_dir, cache_dir, tmp_path):
    sc = AWMDataset(excerpt_dir, cache_dir=cache_dir).scenario("content_platform_1")
    report = build_db(tmp_path / "cp.db", sc.db_schema, sc.sample_data)
    assert (report.tables, report.indexes, report.inserts_ok, report.inserts_total) == (14, 22, 154, 154)


def test_failed_statements_are_reported(tmp_path):
    schema = {
        "tables": [
            {
                "name": "a",
                "ddl": "CREATE TABLE a (id INTEGER PRIMARY KEY, b_id INTEGER REFERENCES b(id));",
                "indexes": [],
            },
            {
                "name": "b",
                "ddl": "CREATE TABLE b (id INTEGER PRIMARY KEY);",
                "indexes": ["CREATE INDEX i ON nope(x);"],
            },
            {"name": "c", "ddl": "CREATE TABL c (id);", "indexes": []},
        ]
    }
    sample = {
        "tables": [
            {
                "table_name": "a",
                "reasoning": "",
                "insert_statements": [
                    "INSERT INTO b (id) VALUES (1);",
                    "INSERT INTO a (id, b_id) VALUES (1, 1);",
                    "INSERT INTO a (id, b_id) VALUES (2, 99);",  # dangling foreign key: rejected with FKs on
                    "INSERT INTO a (id, b_id) VALUES (1, 1);",
                ],
            }
        ]
    }  # duplicate key
    r = build_db(tmp_path / "x.db", schema, sample)
    assert (r.tables, r.inserts_ok, r.inserts_total) == (2, 2, 4)
    kinds = [f[0] for f in r.failed]
    assert kinds == ["index", "ddl", "insert", "insert"]
    assert "FOREIGN KEY" in r.failed[2][2] and "UNIQUE" in r.failed[3][2]
    assert r.insert_failure_ratio == 0.5


def test_deterministic_clock_gives_identical_bytes(excerpt_dir, cache_dir, tmp_path):
    sc = AWMDataset(excerpt_dir, cache_dir=cache_dir).scenario("e_commerce_33")
    a = build_db(tmp_path / "a.db", sc.db_schema, sc.sample_data, clock="2025-03-01T12:00:00", seed=7)
    b = build_db(tmp_path / "b.db", sc.db_schema, sc.sample_data, clock="2025-03-01T12:00:00", seed=7)
    c = build_db(tmp_path / "c.db", sc.db_schema, sc.sample_data, clock="2025-03-02T12:00:00", seed=7)
    assert a.sha256 == b.sha256 == file_sha256(tmp_path / "b.db")
    assert a.sha256 != c.sha256
    assert a.inserts_ok == 133
    conn = sqlite3.connect(tmp_path / "a.db")
    dates = {r[0] for r in conn.execute("SELECT created_at FROM users")}
    conn.close()
    assert dates and all(
        d <= "2025-03-01 12:00:00" and d.endswith("12:00:00") for d in dates
    )  # relative to the clock


def test_clock_pins_now_and_defaults(tmp_path):
    schema = {
        "tables": [
            {
                "name": "t",
                "ddl": "CREATE TABLE t (id INTEGER PRIMARY KEY, a TEXT, "
                "made DATETIME DEFAULT CURRENT_TIMESTAMP, r INTEGER);",
                "indexes": [],
            }
        ]
    }
    sample = {
        "tables": [
            {
                "table_name": "t",
                "reasoning": "",
                "insert_statements": [
                    "INSERT INTO t (id, a, r) VALUES (1, datetime('now', '-3 days'), random());",
                    "INSERT INTO t (id, a, r) VALUES (2, strftime('%Y', 'now'), random());",
                    "INSERT INTO t (id, a, r) VALUES (3, date('2020-01-05', '+1 day'), random());",
                ],
            }
        ]
    }
    build_db(tmp_path / "t.db", schema, sample, clock="2024-06-15T08:30:00Z", seed=1)
    rows = sqlite3.connect(tmp_path / "t.db").execute("SELECT a, made, r FROM t ORDER BY id").fetchall()
    assert [r[0] for r in rows] == ["2024-06-12 08:30:00", "2024", "2020-01-06"]
    assert {r[1] for r in rows} == {"2024-06-15 08:30:00"}
    build_db(tmp_path / "u.db", schema, sample, clock="2024-06-15T08:30:00Z", seed=1)
    assert file_sha256(tmp_path / "t.db") == file_sha256(tmp_path / "u.db")


def test_template_store_builds_once(excerpt_dir, cache_dir, tmp_path):
    sc = AWMDataset(excerpt_dir, cache_dir=cache_dir).scenario("content_platform_1")
    store = TemplateStore(tmp_path / "templates")
    p1, r1 = store.get_or_build(sc.name, sc.db_schema, sc.sample_data)
    mtime = p1.stat().st_mtime_ns
    p2, r2 = store.get_or_build(sc.name, sc.db_schema, sc.sample_data)
    assert p1 == p2 and p2.stat().st_mtime_ns == mtime and r2.inserts_ok == 154
    p3, _ = store.get_or_build(sc.name, sc.db_schema, sc.sample_data, clock="2025-01-01T00:00:00")
    assert p3 != p1


def test_state_hash_is_logical(tmp_path):
    schema = {
        "tables": [{"name": "t", "ddl": "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT);", "indexes": []}]
    }
    ins = ["INSERT INTO t (id, v) VALUES (1, 'a');", "INSERT INTO t (id, v) VALUES (2, 'b');"]
    build_db(
        tmp_path / "a.db",
        schema,
        {"tables": [{"table_name": "t", "reasoning": "", "insert_statements": ins}]},
    )
    build_db(
        tmp_path / "b.db",
        schema,
        {"tables": [{"table_name": "t", "reasoning": "", "insert_statements": ins[::-1]}]},
    )
    assert state_hash(tmp_path / "a.db") == state_hash(tmp_path / "b.db")
    backup(tmp_path / "a.db", tmp_path / "c.db")
    conn = sqlite3.connect(tmp_path / "c.db")
    conn.execute("UPDATE t SET v = 'z' WHERE id = 2")
    conn.commit()
    conn.close()
    assert state_hash(tmp_path / "c.db") != state_hash(tmp_path / "a.db")


def test_diff_databases_counts_rows_and_columns(tmp_path):
    schema = {"tables": [
        {"name": "t", "ddl": "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT, w INTEGER);", "indexes": []},
        {"name": "pairs", "ddl": "CREATE TABLE pairs (a INTEGER, b INTEGER, note TEXT, PRIMARY KEY (a, b));",
         "indexes": []},
        {"name": "loose", "ddl": "CREATE TABLE loose (x TEXT);", "indexes": []}]}
    ins = ["INSERT INTO t (id, v, w) VALUES (1, 'a', 1);", "INSERT INTO t (id, v, w) VALUES (2, 'b', 2);",
           "INSERT INTO pairs (a, b, note) VALUES (1, 2, 'x');", "INSERT INTO loose (x) VALUES ('k');"]
    build_db(tmp_path / "a.db", schema, {"tables": [{"table_name": "t", "reasoning": "", "insert_statements": ins}]})
    backup(tmp_path / "a.db", tmp_path / "b.db")
    assert diff_databases(tmp_path / "a.db", tmp_path / "b.db") == {}
    conn = sqlite3.connect(tmp_path / "b.db")
    conn.executescript("UPDATE t SET w = 5 WHERE id = 1; DELETE FROM t WHERE id = 2; INSERT INTO t (id, v) VALUES (3, 'c');"
                       "UPDATE pairs SET note = 'y'; CREATE TABLE extra (z);")
    conn.close()
    assert diff_databases(tmp_path / "a.db", tmp_path / "b.db") == {
        "extra": {"table": "added"},
        "pairs": {"added": 0, "removed": 0, "changed": 1, "changed_columns": ["note"]},
        "t": {"added": 1, "removed": 1, "changed": 1, "changed_columns": ["w"]},
    }

"""The rollout's state reads (awm_grpo.env_client.read_state, InProcessEnv.state) against awm.database's own
state_hash and diff_databases: the same hash and change summary, with fewer reads of the DB.
"""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
from pathlib import Path

from awm.database import diff_databases, state_hash

from awm_grpo import env_client
from awm_grpo.env_client import EnvConfig, db_version, open_env, read_state


def awm_state(initial: Path, current: Path) -> dict:
    return {"state_hash": state_hash(current), "changes": diff_databases(initial, current)}


def write(path: Path, *statements: str) -> None:
    """Commit `statements` the way an environment worker does (journal in memory, no fsync)."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=MEMORY")
    conn.execute("PRAGMA synchronous=OFF")
    for sql in statements:
        conn.execute(sql)
    conn.commit()
    conn.close()


def make_db(path: Path) -> None:
    write(path,
          "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT, score REAL, avatar BLOB)",
          "CREATE TABLE pairs (a TEXT, b INTEGER, note TEXT, PRIMARY KEY (b, a))",
          "CREATE TABLE log (msg TEXT, at INTEGER)",  # no primary key: keyed by rowid
          "CREATE TABLE tags (tag TEXT PRIMARY KEY, n INTEGER) WITHOUT ROWID",
          "INSERT INTO users VALUES (1, 'Zoë', 1.5, x'00ff'), (2, NULL, -0.0, NULL), (3, 'b', 1e300, x'')",
          "INSERT INTO pairs VALUES ('x', 2, 'n1'), ('a', 2, NULL), ('x', 1, '\"quoted\"')",
          "INSERT INTO log VALUES ('same', 1), ('same', 1), ('other', 0)",
          "INSERT INTO tags VALUES ('t1', 1), ('t0', 2)")


def test_read_state_matches_awm_database_through_every_kind_of_change(tmp_path):
    initial, current = tmp_path / "initial.db", tmp_path / "current.db"
    make_db(initial)
    shutil.copyfile(initial, current)
    assert read_state(initial, current) == awm_state(initial, current)
    steps = [
        ["UPDATE users SET score = 2.5 WHERE id = 1"],                       # same size, one value
        ["INSERT INTO log VALUES ('same', 1)", "DELETE FROM pairs WHERE a = 'a'"],
        ["UPDATE pairs SET note = 'changed', b = b WHERE a = 'x' AND b = 1", "DELETE FROM log WHERE rowid = 1"],
        ["CREATE TABLE extra (k INTEGER PRIMARY KEY)", "DROP TABLE tags"],  # a table added, one removed
        ["INSERT INTO users VALUES (9, 'z', NULL, x'01')"],
    ]
    for statements in steps:
        write(current, *statements)
        ours = read_state(initial, current)
        assert ours == awm_state(initial, current), statements
        assert ours["changes"], statements


def test_db_version_changes_with_every_commit_and_only_then(tmp_path):
    db = tmp_path / "e.db"
    make_db(db)
    versions = [db_version(db)]
    for i in range(5):  # commits that keep the file's size, back to back
        write(db, f"UPDATE users SET score = {i + 10} WHERE id = 2")
        versions.append(db_version(db))
    assert None not in versions and len(set(versions)) == len(versions)
    conn = sqlite3.connect(db)
    conn.execute("SELECT * FROM users").fetchall()  # a read commits nothing
    conn.close()
    assert db_version(db) == versions[-1]
    wal = tmp_path / "wal.db"
    write(wal, "PRAGMA journal_mode=WAL", "CREATE TABLE t (x)")
    assert db_version(wal) is None  # WAL mode: the header's counter is not kept; always read


def test_a_changed_template_is_read_again(tmp_path):
    initial, current = tmp_path / "initial.db", tmp_path / "current.db"
    make_db(initial)
    shutil.copyfile(initial, current)
    read_state(initial, current)  # caches the template's rows
    write(initial, "DELETE FROM users WHERE id = 3")
    assert read_state(initial, current) == awm_state(initial, current)
    assert read_state(initial, current)["changes"]["users"]["added"] == 1


def test_episode_state_matches_the_runtime_before_and_after_writes_and_reads():
    """A real episode (bundled library_lending_1, worker processes): every state read equals what the
    episode's own state_hash() and changes() say, whether the turn wrote or only read."""

    async def go() -> list[tuple[dict, dict]]:
        env = await open_env(EnvConfig(), "library_lending_1", 3)
        out = []
        try:
            for name, arguments in [("search_books", {"query": "Project Hail Mary"}), ("checkout_copy", {"copy_id": 1}),
                                    ("search_books", {"query": "Dune"}), ("checkout_copy", {"copy_id": 3}),
                                    ("search_books", {"query": "Dune"})]:
                await env.call(name, arguments)
                ours = await env.state()
                theirs = {"state_hash": env.episode.state_hash(), "changes": env.episode.changes()}
                out.append((ours, theirs))
        finally:
            await env.close()
        return out

    try:
        pairs = asyncio.run(go())
    finally:
        env_client.close_runtimes()
    assert [ours for ours, _ in pairs] == [theirs for _, theirs in pairs]
    hashes = [ours["state_hash"] for ours, _ in pairs]
    assert hashes[0] != hashes[1] and pairs[1][0]["changes"], "the checkout must show up"
    assert hashes[1] == hashes[2]  # a read changes nothing


def test_an_untouched_copy_has_its_templates_state_and_a_written_one_is_read(tmp_path):
    from awm_grpo.env_client import untouched_state

    initial, current = tmp_path / "initial.db", tmp_path / "current.db"
    make_db(initial)
    shutil.copyfile(initial, current)
    assert untouched_state(initial, db_version(current)) == awm_state(initial, current)
    write(current, "UPDATE users SET name = 'y' WHERE id = 3")  # same size, one commit
    assert untouched_state(initial, db_version(current)) is None
    assert read_state(initial, current) == awm_state(initial, current)

"""Where Landlock can keep a verifier from changing the databases, it reads hard links to the originals
instead of copies; elsewhere (and with `link_databases=False`) the copies stay the write protection."""

import hashlib
import os
import sqlite3
from pathlib import Path

import pytest
from awm.verifier import VerifierSandbox

# Reports what the verifier got and what each attempt on its final database did.
_PROBE = """\
def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    import signal
    seen = {"inode": os.stat(final_db_path).st_ino, "rows": sqlite3.connect(
        f"file:{final_db_path}?mode=ro", uri=True).execute("SELECT COUNT(*) FROM item").fetchone()[0]}
    attempts = {
        "open_for_write": lambda: open(final_db_path, "r+b").close(),
        "sqlite_write": lambda: sqlite3.connect(final_db_path).execute("DELETE FROM item").connection.commit(),
        "truncate": lambda: os.truncate(final_db_path, 0),
        "chmod": lambda: os.chmod(final_db_path, 0o666),
        "utime": lambda: os.utime(final_db_path, (0, 0)),
        "xattr": lambda: os.setxattr(final_db_path, "user.awm", b"x"),
        "read_original_path": lambda: open(ORIGINAL, "rb").read(),
        "read_helper_file": lambda: open(HELPER_FILE, "rb").read(),
    }
    for label, attempt in attempts.items():
        try:
            attempt()
            seen[label] = "done"
        except Exception as exc:
            seen[label] = type(exc).__name__
    return {"result": "complete", "seen": seen}
"""


def _database(path: Path, *, wal: bool = False) -> Path:
    conn = sqlite3.connect(path)
    if wal:
        conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE item (id INTEGER PRIMARY KEY, name TEXT)")
    conn.executemany("INSERT INTO item (name) VALUES (?)", [("a",), ("b",), ("c",)])
    conn.commit()
    conn.close()
    return path


def _state(path: Path) -> tuple:
    info = path.stat()
    return hashlib.sha256(path.read_bytes()).hexdigest(), info.st_mode, info.st_mtime_ns, info.st_nlink


def _probe(box: VerifierSandbox, original: Path) -> dict:
    code = _PROBE.replace("ORIGINAL", repr(str(original)))
    # The helper's own database, beside the verifier's directory in the helper's directory.
    code = code.replace("HELPER_FILE", "os.path.join(os.path.dirname(os.path.dirname(final_db_path)), 'probe.db')")
    verdict = box.verify(code, str(original), str(original))
    assert verdict.verdict == "complete", verdict.detail
    return verdict.result["seen"]


def _needs_guards(box: VerifierSandbox) -> None:
    if box.protections["landlock_abi"] < 3 or not box.protections["seccomp_no_fork"]:
        pytest.skip("links need Landlock ABI 3+ and seccomp: this kernel takes the copy path only")


@pytest.mark.parametrize("direct", [True, False], ids=["caller-to-spare", "through-helper"])
def test_a_linked_database_is_the_original_and_the_verifier_cannot_change_it(tmp_path, direct):
    original = _database(tmp_path / "episode.db")
    before = _state(original)
    with VerifierSandbox(direct=direct) as box:
        _needs_guards(box)
        seen = _probe(box, original)
    assert seen["inode"] == original.stat().st_ino and seen["rows"] == 3  # no copy was made
    refused = {key: value for key, value in seen.items() if key not in ("inode", "rows")}
    assert "done" not in refused.values(), refused
    assert refused["open_for_write"] == refused["chmod"] == refused["read_original_path"] == "PermissionError"
    assert _state(original) == before  # contents, mode, times, and no link left behind


def test_with_link_databases_off_the_verifier_reads_private_read_only_copies(tmp_path):
    original = _database(tmp_path / "episode.db")
    before = _state(original)
    with VerifierSandbox(link_databases=False) as box:
        seen = _probe(box, original)
    assert seen["inode"] != original.stat().st_ino and seen["rows"] == 3
    assert "done" not in (seen["open_for_write"], seen["sqlite_write"])
    assert _state(original) == before


def test_a_wal_database_is_copied_not_linked_so_its_recent_writes_are_seen(tmp_path):
    """A WAL database keeps recent writes in its -wal file, which a link does not carry: it is copied."""
    live = _database(tmp_path / "live.db", wal=True)
    writer = sqlite3.connect(live)
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("INSERT INTO item (name) VALUES ('only in the wal')")
    writer.commit()
    try:
        assert Path(f"{live}-wal").stat().st_size > 0
        with VerifierSandbox() as box:
            _needs_guards(box)
            seen = _probe(box, live)
    finally:
        writer.close()
    assert seen["inode"] != live.stat().st_ino and seen["rows"] == 4
    assert os.path.exists(live) and "done" not in (seen["open_for_write"], seen["sqlite_write"])

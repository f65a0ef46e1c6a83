"""Spares handed to the caller: requests go from the caller to a locked-down child and back, not
through the helper, and the caller keeps the helper's duties on that path (deadline, kill, status)."""

import asyncio
import os
import signal
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from awm.verifier import Verdict, VerifierSandbox

_COMPLETE = "def verify_task_completion(initial_db_path, final_db_path):\n    return {'result': 'complete'}\n"


@pytest.fixture()
def db(tmp_path: Path) -> str:
    path = tmp_path / "episode.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE item (id INTEGER PRIMARY KEY)")
    conn.commit()
    conn.close()
    return str(path)


def _children(pid: int) -> set[int]:
    """The live children of `pid` (an exited one the helper has not reaped yet is not counted)."""
    live = set()
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            if Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX":
                live.add(int(child))
        except OSError:
            continue
    return live


def _until(condition, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _box_with_spares(db: str) -> VerifierSandbox:
    box = VerifierSandbox(spare_children=2)
    assert box.verify(_COMPLETE, db, db).complete
    if box._helper.pool is None:
        box.close()
        pytest.skip("no spares are handed over here (Landlock ABI 3+, seccomp and pidfd_open are needed)")
    helper = box.helper_pid
    assert _until(lambda: _children(helper) == _waiting(box) and len(_waiting(box)) == 2), "no two spares handed over"
    return box


def _waiting(box: VerifierSandbox) -> set[int]:
    """The pids of the spares handed to this process and not taken yet."""
    pool = box._helper.pool
    with pool.lock:
        pool._receive()
        return {spare.pid for spare in pool.spares}


def test_a_request_reaches_a_handed_spare_while_the_helper_is_stopped(db):
    """Caller -> child -> caller: with the helper frozen, the two spares it handed over still answer."""
    box = _box_with_spares(db)
    verdicts: list[Verdict] = []
    worker = threading.Thread(target=lambda: verdicts.extend(box.verify(_COMPLETE, db, db) for _ in range(2)))
    os.kill(box.helper_pid, signal.SIGSTOP)
    try:
        worker.start()
        worker.join(timeout=5.0)
        answered_while_stopped = [v.verdict for v in verdicts]
    finally:
        os.kill(box.helper_pid, signal.SIGCONT)
        worker.join()
        box.close()
    assert answered_while_stopped == ["complete", "complete"]


@pytest.mark.parametrize(("sig", "verdict", "detail"), [
    ("SIGKILL", "judge_error", "verifier process ended without a result (signal SIGKILL)"),
    ("SIGXCPU", "timeout", "verifier exceeded its CPU time limit and was killed"),
])
def test_a_handed_spare_that_ends_without_a_result_is_explained_by_the_helper(db, sig, verdict, detail):
    """The caller sees only the pipe close; the helper, which reaps the child, says why it ended."""
    code = f"def verify_task_completion(initial_db_path, final_db_path):\n    import signal\n" \
           f"    os.kill(os.getpid(), signal.{sig})\n"
    box = _box_with_spares(db)
    try:
        got = box.verify(code, db, db)
    finally:
        box.close()
    assert (got.verdict, got.detail) == (verdict, detail)


def test_a_cancelled_verification_kills_its_child(db):
    """A caller that stops waiting (a cancelled task) kills the child it wrote to: it would sleep on."""
    box = _box_with_spares(db)
    helper = box.helper_pid
    spares = _children(helper)
    sleeper = "def verify_task_completion(initial_db_path, final_db_path):\n    import time\n    time.sleep(60)\n"

    async def cancel_one() -> None:
        task = asyncio.ensure_future(box.averify(sleeper, db, db, timeout_s=60.0))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(cancel_one())
        assert _until(lambda: len(spares & _children(helper)) == 1, timeout_s=3.0), "the sleeping child lives on"
    finally:
        box.close()


def test_a_database_on_another_filesystem_is_copied_without_spending_a_spare(tmp_path):
    """A hard link cannot cross filesystems: such a request goes to the helper (which copies) and
    leaves the caller's spares waiting, instead of taking one only to give it up."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs /dev/shm on a filesystem of its own")
    local = tmp_path / "local.db"
    sqlite3.connect(local).close()
    box = _box_with_spares(str(local))
    elsewhere = shm / f"awm-test-{os.getpid()}.db"
    try:
        sqlite3.connect(elsewhere).execute("CREATE TABLE item (id INTEGER PRIMARY KEY)").connection.commit()
        waiting = _waiting(box)
        assert os.stat(box._helper.workdir).st_dev != elsewhere.stat().st_dev
        verdicts = [box.verify(_COMPLETE, str(elsewhere), str(elsewhere)).verdict for _ in range(3)]
        assert verdicts == ["complete"] * 3 and _waiting(box) == waiting
    finally:
        box.close()
        elsewhere.unlink(missing_ok=True)

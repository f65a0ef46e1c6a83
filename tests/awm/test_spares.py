"""Spares handed to the caller: requests go from the caller to a locked-down child and back, not
through the helper, and the caller keeps the helper's duties on that path (deadline, kill, status)."""

import asyncio
import dataclasses
import os
import signal
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from awm.episode import EnvRuntime
from awm.solutions import load_solutions, replay
from awm.verifier import SandboxStats, Verdict, VerifierSandbox

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


_INODES = """
def verify_task_completion(initial_db_path, final_db_path):
    try:
        open(initial_db_path, "r+b")
        writable = True
    except OSError:
        writable = False
    try:
        open(ORIGINAL, "rb")
        original_readable = True
    except OSError:
        original_readable = False
    rows = sqlite3.connect(initial_db_path).execute("SELECT count(*) FROM item").fetchone()[0]
    return {"result": "complete", "inodes": [os.stat(initial_db_path).st_ino, os.stat(final_db_path).st_ino],
            "rows": rows, "writable": writable, "original_readable": original_readable}
"""


def test_a_database_on_another_filesystem_is_copied_into_a_handed_spare(tmp_path, db):
    """Per file: the final database, on the helper's filesystem, is linked; the initial one in /dev/shm
    cannot be, so the caller copies it (read-only) into the spare's directory, and the request still
    skips the helper. The spare reads neither the original's path nor anything outside its directory."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs /dev/shm on a filesystem of its own")
    final = Path(db)
    box = _box_with_spares(db)
    initial = shm / f"awm-test-{os.getpid()}.db"
    try:
        conn = sqlite3.connect(initial)
        conn.executescript("CREATE TABLE item (id INTEGER PRIMARY KEY); INSERT INTO item VALUES (1), (2);")
        conn.close()
        assert os.stat(box._helper.workdir).st_dev != initial.stat().st_dev
        before = box.stats
        code = _INODES.replace("ORIGINAL", repr(str(initial)))
        runs = [box.run(code, str(initial), str(final)) for _ in range(2)]
        after = box.stats
        for run in runs:
            assert run.status == "ok", run.detail
            assert run.value["rows"] == 2
            assert run.value["inodes"][0] != initial.stat().st_ino  # a copy
            assert run.value["inodes"][1] == final.stat().st_ino  # the original, linked
            assert not run.value["writable"] and not run.value["original_readable"]
        assert (after.direct - before.direct, after.through_helper - before.through_helper) == (2, 0)
        assert (after.linked - before.linked, after.copied - before.copied) == (2, 2)
    finally:
        box.close()
        initial.unlink(missing_ok=True)


def test_a_real_episode_is_verified_through_a_handed_spare(cache_dir):
    """Through the real runtime: an episode's DB lives in /dev/shm and its template in the cache. The
    sandbox's directory sits beside the episode directory, so the episode's DB is linked (the template
    copied where it lies elsewhere) into a spare handed to the runtime, and the verdicts are right:
    the task's wrong solution is rejected, its reference solution accepted."""
    (scenario, task_idx), solution = sorted(load_solutions().items())[0]
    fields = [field.name for field in dataclasses.fields(SandboxStats)]

    same_fs = [False]  # whether the template is on the episode's filesystem, so linked too

    async def verdicts() -> list[tuple[str, set[int], SandboxStats]]:
        seen = []
        with EnvRuntime(num_workers=1, cache_dir=cache_dir) as rt:
            box, (template, _) = rt.sandbox(), rt.template(scenario)
            box.verify(_COMPLETE, str(template), str(template))  # start the helper
            if box._helper.pool is None:
                pytest.skip("no spares are handed over here (Landlock ABI 3+, seccomp and pidfd_open are needed)")
            for calls, answer in ((solution.wrong_calls, solution.wrong_final_answer),
                                  (solution.calls, solution.final_answer)):
                async with await rt.open(scenario, task_idx) as ep:
                    await replay(ep, calls)
                    assert _until(lambda: len(_waiting(box)) == 2), "no two spares handed over"
                    waiting, before = _waiting(box), box.stats
                    verdict = await ep.verify(answer)
                    after = box.stats
                    delta = SandboxStats(*(getattr(after, f) - getattr(before, f) for f in fields))
                    seen.append((verdict.verdict, waiting - _waiting(box), delta))
                    # the episode's DB can be linked: the sandbox's directory is on its filesystem
                    assert os.stat(box._helper.workdir).st_dev == ep.db_path.stat().st_dev
                    same_fs[0] = template.stat().st_dev == ep.db_path.stat().st_dev
        return seen

    (wrong, used_first, first), (right, used_second, second) = asyncio.run(verdicts())
    assert (wrong, right) == ("others", "complete")
    assert len(used_first) == 1 and len(used_second) == 1  # each verification took one handed spare
    for delta in (first, second):
        assert (delta.direct, delta.through_helper) == (1, 0)
        assert (delta.linked, delta.copied) == ((2, 0) if same_fs[0] else (1, 1))

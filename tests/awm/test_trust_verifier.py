"""A verifier's result message is data its own code can write (issue 38, red team t10).

The child's result fd (3) is open to the verifier, so its code can write a message of its own and exit. One
nested 100,000 deep raised RecursionError out of `VerifierSandbox.verify` (the direct path), killed the
helper (the helper path: its reply could not be parsed nor passed on) and, on the async path, logged a
traceback per read and waited out the timeout. Each must be a verifier crash: `judge_error`, an
infrastructure failure (dropped, never scored), answered at once, with the sandbox still serving.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest
from awm.verifier import VerifierSandbox

FORGED = '''def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    import os
    os.write(3, b'{"ok": true, "value": ' + b'[' * DEPTH + b'{"result": "complete"}' + b']' * DEPTH + b'}\\n')
    os._exit(0)
'''
HONEST = '''def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    value = {"result": "complete"}
    for _ in range(60):  # deeper than the sandbox keeps (it cuts at 51): still a fine reply
        value = [value]
    return {"result": "complete", "nested": value}
'''
# 100,000: past Python's recursion limit when parsed; 900: parses, but deeper than any message the sandbox
# writes and too deep for the helper's json.dumps of its reply on top of its own stack.
DEPTHS = [100_000, 900]


@pytest.fixture(scope="module")
def dbs(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("dbs")
    for name in ("a.db", "b.db"):
        conn = sqlite3.connect(root / name)
        conn.execute("CREATE TABLE t (x)")
        conn.commit()
        conn.close()
    return str(root / "a.db"), str(root / "b.db")


def _check(verdict, seconds: float) -> None:
    assert verdict.verdict == "judge_error" and verdict.infra_failure, verdict
    assert "nests deeper" in verdict.detail, verdict.detail
    assert seconds < 4.0, f"answered after {seconds:.1f} s (the timeout is 10 s)"


@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize("path", ["direct", "helper"])
def test_a_forged_deep_result_is_a_verifier_crash_on_the_sync_paths(dbs, path: str, depth: int) -> None:
    code = FORGED.replace("DEPTH", str(depth))
    with VerifierSandbox(spare_children=2 if path == "direct" else 0) as box:
        assert box.verify(HONEST, *dbs).verdict == "complete"  # starts the helper (and its spares)
        helper = box.helper_pid
        time.sleep(0.5)  # the spares are handed over meanwhile: the next requests take the direct path
        before = box.stats
        for _ in range(2):
            start = time.monotonic()
            _check(box.verify(code, *dbs, timeout_s=10), time.monotonic() - start)
        after = box.stats
        taken = after.direct - before.direct if path == "direct" else after.through_helper - before.through_helper
        assert taken == 2, (before, after)
        assert box.verify(HONEST, *dbs).verdict == "complete"
        assert box.helper_pid == helper, "the helper died"


@pytest.mark.parametrize("depth", DEPTHS)
def test_a_forged_deep_result_is_a_verifier_crash_on_the_async_path(dbs, depth: int) -> None:
    code = FORGED.replace("DEPTH", str(depth))

    async def main() -> None:
        async with VerifierSandbox() as box:
            start = time.monotonic()
            _check(await box.averify(code, *dbs, timeout_s=10), time.monotonic() - start)
            assert (await box.averify(HONEST, *dbs)).verdict == "complete"

    asyncio.run(main())


def test_the_forged_path_and_sizes_stay_bounded(dbs, tmp_path: Path) -> None:
    """The check walks the parsed message without recursion: a wide (not deep) result is a normal reply."""
    wide = '''def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    return {"result": "complete", "rows": [[i, str(i)] for i in range(100000)]}
'''
    with VerifierSandbox() as box:
        verdict = box.verify(wide, *dbs)
    assert verdict.verdict == "complete" and len(verdict.result["rows"]) == 100000

"""The verifier sandbox: upstream code-mode semantics, real e_commerce_33 verifiers, and containment."""

import asyncio
import hashlib
import json
import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest
from awm import verifier
from awm.sandbox import HELPER_SCRIPT
from awm.verifier import Verdict, VerifierSandbox, strip_thinking, verifier_function_name, verify_code

EXCERPT = Path(__file__).resolve().parents[2].parent / "shared" / "awm_1k_excerpt"
SCENARIO = "e_commerce_33"

# Final states that solve tasks 0-2, read off the tasks' text and the sample data: the newest
# paper-towel order item is offer 8 x 1 (order 4); the three air fryers under $150 are products
# 11-13; the top-rated wireless noise-cancelling headphone under $200 is offer 1 (Sony, $149.99).
SOLUTIONS = {
    0: ["INSERT INTO cart_items (cart_id, product_offer_id, quantity) VALUES (1, 1, 1)"],
    1: ["INSERT INTO cart_items (cart_id, product_offer_id, quantity) VALUES (1, 8, 1)"],
    2: [
        "INSERT INTO wishlists (id, user_id, name) VALUES (4, 1, 'Kitchen Upgrades 2025')",
        "INSERT INTO wishlist_items (wishlist_id, product_id) VALUES (4, 11), (4, 12), (4, 13)",
    ],
}


def _first_row(name: str) -> dict:
    return json.loads((EXCERPT / name).read_text(encoding="utf-8").splitlines()[0])


def _build_initial_db(path: Path) -> None:
    """DDL, indexes, then the sample INSERTs with foreign keys on (awm/database.py does this for real)."""
    schema = _first_row(f"gen_db.{SCENARIO}.jsonl")["db_schema"]
    sample = _first_row(f"gen_sample.{SCENARIO}.jsonl")["sample_data"]
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA foreign_keys=ON")
    for table in schema["tables"]:
        conn.execute(table["ddl"])
        for index in table.get("indexes", []):
            conn.execute(index)
    for table in sample["tables"]:
        for statement in table["insert_statements"]:
            conn.execute(statement)
    conn.commit()
    conn.close()


def _verifier_code(task_idx: int) -> str:
    for line in (EXCERPT / "gen_verifier.pure_code.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row["scenario"] == SCENARIO and row["task_idx"] == task_idx:
            return row["verification"]["code"]
    raise LookupError(f"no verifier for {SCENARIO} task {task_idx}")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _sandbox_processes() -> set[int]:
    """Pids of live processes running the sandbox helper script (helpers and their children)."""
    marker = HELPER_SCRIPT.encode()
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes():
                    pids.add(int(entry.name))
            except OSError:
                continue
    return pids


@pytest.fixture(scope="module")
def dbs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    if not EXCERPT.is_dir():
        pytest.fail(f"AWM excerpt not found at {EXCERPT}: the shared folder beside the repository holds it")
    root = tmp_path_factory.mktemp("e_commerce_33")
    initial = root / "initial.db"
    _build_initial_db(initial)
    paths = {"initial": initial}
    for task_idx, statements in SOLUTIONS.items():
        solved = root / f"solved_{task_idx}.db"
        solved.write_bytes(initial.read_bytes())
        conn = sqlite3.connect(solved)
        conn.execute("PRAGMA foreign_keys=ON")
        for statement in statements:
            conn.execute(statement)
        conn.commit()
        conn.close()
        paths[task_idx] = solved
    return paths


@pytest.fixture(scope="module")
def sandbox():
    with VerifierSandbox() as box:
        yield box


def _verdict(sandbox: VerifierSandbox, dbs: dict, body: str, **kwargs) -> Verdict:
    code = "def verify_task_completion(initial_db_path, final_db_path, final_answer=None):\n" + body
    return sandbox.verify(code, str(dbs["initial"]), str(dbs["initial"]), **kwargs)


@pytest.mark.parametrize("task_idx", [1, 2])
def test_real_verifier_completes_solved_state_only(sandbox, dbs, task_idx):
    code = _verifier_code(task_idx)
    solved = sandbox.verify(code, str(dbs["initial"]), str(dbs[task_idx]))
    untouched = sandbox.verify(code, str(dbs["initial"]), str(dbs["initial"]))
    assert (solved.verdict, solved.result) == ("complete", {"result": "complete"})
    assert (untouched.verdict, untouched.infra_failure) == ("others", False)


def test_task0_is_a_known_false_negative(sandbox, dbs):
    # The released verifier picks the top-rated headphone overall (Bose, $299.99) before filtering
    # by price, finds no offer under $200 and says "others" even for the correct cart (Sony, $149.99).
    verdict = sandbox.verify(_verifier_code(0), str(dbs["initial"]), str(dbs[0]))
    assert verdict.verdict == "others"


def test_result_shapes_follow_upstream(sandbox, dbs):
    assert _verdict(sandbox, dbs, "    return {'result': 'complete', 'n': 3}").result == {
        "result": "complete",
        "n": 3,
    }
    assert _verdict(sandbox, dbs, "    return {'result': 'others'}").verdict == "others"
    not_dict = _verdict(sandbox, dbs, "    return ['complete']")
    assert (not_dict.verdict, not_dict.infra_failure) == ("judge_error", True)
    assert "list" in not_dict.detail
    assert _verdict(sandbox, dbs, "    return {'status': 'complete'}").verdict == "judge_error"
    odd = _verdict(sandbox, dbs, "    return {'result': 'partially complete'}")
    assert (odd.verdict, odd.result) == ("others", {"result": "partially complete"})


def test_exceptions_and_missing_code_are_judge_errors(sandbox, dbs):
    raised = _verdict(sandbox, dbs, "    x = 1\n    return {'result': 'complete' if x / 0 else 'others'}")
    assert raised.verdict == "judge_error"
    assert "ZeroDivisionError" in raised.detail and "x / 0" in raised.detail
    initial = str(dbs["initial"])
    for code in (None, "", "   "):
        assert sandbox.verify(code, initial, initial).verdict == "judge_error"
    no_function = sandbox.verify("def check(a, b):\n    return {'result': 'complete'}\n", initial, initial)
    assert no_function.verdict == "judge_error" and "verify_task_completion" in no_function.detail
    syntax = sandbox.verify("def verify_task_completion(a, b:\n    pass\n", initial, initial)
    assert syntax.verdict == "judge_error" and "SyntaxError" in syntax.detail
    missing_db = sandbox.verify(
        "def verify_x(a, b):\n    return {'result': 'complete'}\n", initial, "/nonexistent.db"
    )
    assert missing_db.verdict == "judge_error" and "final database not found" in missing_db.detail


def test_function_name_and_argument_binding(sandbox, dbs):
    code = (
        "def helper():\n    pass\n\n"
        "def verify_custom(final_answer, final_db_path, initial_db_path):\n"
        "    return {'result': 'complete', 'answer': final_answer, 'same': initial_db_path != final_db_path,\n"
        "            'seeded': [sqlite3.__name__, json.__name__, os.__name__, re.__name__]}\n"
    )
    assert verifier_function_name(code) == "verify_custom"
    assert verifier_function_name("def check():\n    pass", "sql") == "verify_task"
    initial = str(dbs["initial"])
    by_name = sandbox.verify(code, initial, initial, final_answer="done")
    assert by_name.result == {
        "result": "complete",
        "answer": "done",
        "same": True,
        "seeded": ["sqlite3", "json", "os", "re"],
    }
    positional = sandbox.verify(
        "def verify_x(a, b, c):\n    return {'result': 'complete', 'c': c}\n", initial, initial
    )
    assert positional.result == {"result": "complete", "c": ""}  # a missing answer arrives as "", as upstream


def test_infinite_loop_times_out_and_sandbox_recovers(sandbox, dbs):
    started = time.monotonic()
    verdict = _verdict(sandbox, dbs, "    while True:\n        pass", timeout_s=0.5)
    assert verdict.verdict == "timeout" and verdict.infra_failure
    assert time.monotonic() - started < 2.0
    assert sandbox.verify(_verifier_code(1), str(dbs["initial"]), str(dbs[1])).verdict == "complete"


def test_writes_fail_and_databases_stay_unchanged(sandbox, dbs, tmp_path):
    target = tmp_path / "created_by_verifier.txt"
    original = dbs[1]
    before = {path: _digest(path) for path in (dbs["initial"], original)}
    body = f"""\
    attempts = {{}}
    for label, path in (("copy", final_db_path), ("original", {str(original)!r})):
        try:
            conn = sqlite3.connect(path)
            conn.execute("DELETE FROM cart_items")
            conn.commit()
            attempts[label] = "written"
        except Exception as exc:
            attempts[label] = type(exc).__name__
    try:
        with open({str(target)!r}, "w") as handle:
            handle.write("x")
        attempts["file"] = "written"
    except Exception as exc:
        attempts["file"] = type(exc).__name__
    return {{"result": "complete", "attempts": attempts}}
"""
    code = "def verify_task_completion(initial_db_path, final_db_path, final_answer=None):\n" + body
    verdict = sandbox.verify(code, str(dbs["initial"]), str(original))
    attempts = verdict.result["attempts"]
    assert "written" not in attempts.values(), attempts
    assert before == {path: _digest(path) for path in before}
    if sandbox.protections["landlock_abi"]:
        assert not target.exists()
    else:  # without Landlock an empty file may appear, but RLIMIT_FSIZE=0 keeps it empty
        assert not target.exists() or target.stat().st_size == 0
    assert sandbox.verify(_verifier_code(1), str(dbs["initial"]), str(original)).verdict == "complete"


def test_uncheckpointed_wal_writes_are_seen(sandbox, dbs, tmp_path):
    live = tmp_path / "live.db"
    live.write_bytes(dbs["initial"].read_bytes())
    writer = sqlite3.connect(live)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute(SOLUTIONS[1][0])
    writer.commit()  # the row now lives only in live.db-wal, as with a running environment server
    try:
        assert Path(f"{live}-wal").stat().st_size > 0
        assert sandbox.verify(_verifier_code(1), str(dbs["initial"]), str(live)).verdict == "complete"
    finally:
        writer.close()


def test_parent_environment_is_invisible(dbs, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-must-not-leak")
    monkeypatch.setenv("PYTHONPATH", "/must/not/matter")
    body = f"""\
    seen = {{"key": os.environ.get("OPENAI_API_KEY"), "names": sorted(os.environ)}}
    try:
        seen["parent"] = open("/proc/{os.getpid()}/environ", "rb").read().decode("latin-1")
    except OSError as exc:
        seen["parent"] = type(exc).__name__
    return {{"result": "complete", "seen": seen}}
"""
    with VerifierSandbox() as box:
        seen = _verdict(box, dbs, body).result["seen"]
        guarded = box.protections["landlock_abi"] > 0 or box.protections["capabilities_dropped"]
    assert seen["key"] is None
    assert not {"OPENAI_API_KEY", "PYTHONPATH"} & set(seen["names"])
    if guarded:  # without Landlock a non-root trainer's /proc/<pid>/environ stays readable
        assert "sk-test-must-not-leak" not in seen["parent"]


def test_memory_bomb_is_stopped(dbs):
    with VerifierSandbox(memory_bytes=256 << 20) as box:
        bomb = _verdict(
            box, dbs, "    chunks = []\n    while True:\n        chunks.append(bytearray(16 << 20))"
        )
        after = box.verify(_verifier_code(2), str(dbs["initial"]), str(dbs[2]))
    assert bomb.verdict == "judge_error" and "MemoryError" in bomb.detail
    assert after.verdict == "complete"


def test_fifty_concurrent_verifications(sandbox, dbs):
    cases = [(task, state) for task in (1, 2) for state in (task, "initial")] * 13  # 52 calls

    async def run_all() -> list[Verdict]:
        calls = [
            sandbox.averify(_verifier_code(task), str(dbs["initial"]), str(dbs[state]))
            for task, state in cases
        ]
        return await asyncio.gather(*calls)

    verdicts = asyncio.run(run_all())
    assert [v.verdict for v in verdicts] == [
        "complete" if state != "initial" else "others" for _, state in cases
    ]


def _family(pid: int) -> set[int]:
    """A helper and its live children (the verifiers it runs and the spares waiting for requests)."""
    return {pid} | {child for child in _sandbox_processes() if _parent(child) == pid}


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def test_killed_helper_fails_inflight_and_restarts(sandbox, dbs):
    sandbox.verify(_verifier_code(1), str(dbs["initial"]), str(dbs[1]))  # make sure a helper is up
    old_helper = sandbox.helper_pid
    before = _sandbox_processes()
    old_family = _family(old_helper)

    async def kill_during_call() -> Verdict:
        call = asyncio.ensure_future(_averdict_loop(sandbox, dbs))
        await asyncio.sleep(0.3)
        os.kill(old_helper, signal.SIGKILL)
        return await call

    inflight = asyncio.run(kill_during_call())
    assert inflight.verdict == "judge_error" and "helper died" in inflight.detail
    assert sandbox.verify(_verifier_code(1), str(dbs["initial"]), str(dbs[1])).verdict == "complete"
    assert sandbox.helper_pid not in (None, old_helper)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:  # the orphaned child dies by its parent-death signal, asynchronously
        alive = _sandbox_processes()
        leftovers = (alive - before - _family(sandbox.helper_pid)) | (old_family & alive)
        if not leftovers:
            break
        time.sleep(0.05)
    assert not leftovers


async def _averdict_loop(sandbox: VerifierSandbox, dbs: dict) -> Verdict:
    code = "def verify_task_completion(initial_db_path, final_db_path):\n    while True:\n        pass\n"
    return await sandbox.averify(code, str(dbs["initial"]), str(dbs["initial"]), timeout_s=5.0)


def test_close_leaves_no_processes_or_files(dbs):
    box = VerifierSandbox()
    assert box.verify(_verifier_code(1), str(dbs["initial"]), str(dbs[1])).complete
    helper, workdir = box.helper_pid, box._helper.workdir
    family = _wait_for_spares(helper, 2)
    box.close()
    assert not family & _sandbox_processes()  # the helper and the spares it kept waiting
    assert not os.path.exists(workdir)
    with pytest.raises(verifier.SandboxError, match="closed"):
        box.verify(_verifier_code(1), str(dbs["initial"]), str(dbs[1]))


def test_thinking_is_stripped_before_verification(sandbox, dbs):
    assert strip_thinking("<think>plan</think> Done.") == "Done."
    assert strip_thinking("<THINK>a</THINK>x<think>b</think>y") == "xy"
    assert strip_thinking("reasoning whose tag was in the prompt</think>Answer") == "Answer"
    assert strip_thinking("Answer<think>ran out of tokens while thinking") == "Answer"
    assert strip_thinking("<think>never closed") == ""
    assert strip_thinking(None) == ""
    # Task 1's verifier rejects answers that mention a quantity other than the reordered one.
    thought = "<think>Maybe they want 2 packs of the value paper towels?</think>"
    answer = "Reordered your Household Paper Towels."
    initial, solved = str(dbs["initial"]), str(dbs[1])
    assert (
        sandbox.verify(_verifier_code(1), initial, solved, final_answer=thought + answer).verdict
        == "complete"
    )
    raw_thought = "Maybe they want 2 packs of the value paper towels?"
    assert sandbox.verify(_verifier_code(1), initial, solved, final_answer=raw_thought).verdict == "others"


def test_verdict_record_and_cli_helper(dbs):
    verdict = verify_code(_verifier_code(2), str(dbs["initial"]), str(dbs[2]))
    assert verdict.complete and not verdict.infra_failure
    assert verdict.to_dict()["verdict"] == "complete" and verdict.to_dict()["mode"] == "code"
    assert Verdict("server_error", "sql").infra_failure and not Verdict("incomplete", "sql").infra_failure
    with pytest.raises(ValueError, match="not valid in code mode"):
        Verdict("incomplete", "code")


def test_unix_socket_connect_is_denied(sandbox, dbs, tmp_path):
    """A path-based Unix socket is a way out to any local daemon (Ray's, Docker's): socket() fails."""
    import socket

    path = str(tmp_path / "daemon.sock")
    daemon = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    daemon.bind(path)
    daemon.listen()
    os.chmod(tmp_path, 0o755)
    body = f"""\
    import socket
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect({path!r})
        return {{"result": "complete", "seen": "connected"}}
    except OSError as exc:
        return {{"result": "complete", "seen": type(exc).__name__}}
"""
    try:
        seen = _verdict(sandbox, dbs, body).result["seen"]
    finally:
        daemon.close()
    assert seen == "PermissionError"


def test_hung_verifiers_do_not_hold_up_a_healthy_one(dbs):
    """Six verifiers that hang (sleep) in a sandbox of two slots: a healthy verifier submitted after
    them finishes well within one timeout instead of waiting for three rounds of timeouts."""
    hung = "def verify_task_completion(initial_db_path, final_db_path):\n    import time\n    time.sleep(60)\n"

    async def main() -> tuple[list[Verdict], Verdict, float]:
        with VerifierSandbox(max_workers=2) as box:
            stuck = [asyncio.ensure_future(box.averify(hung, str(dbs["initial"]), str(dbs[1]), timeout_s=3.0))
                     for _ in range(6)]
            await asyncio.sleep(0.2)
            started = time.monotonic()
            healthy = await box.averify(_verifier_code(1), str(dbs["initial"]), str(dbs[1]), timeout_s=3.0)
            elapsed = time.monotonic() - started
            return await asyncio.gather(*stuck), healthy, elapsed

    stuck, healthy, elapsed = asyncio.run(main())
    assert healthy.verdict == "complete" and elapsed < 1.5
    assert [v.verdict for v in stuck] == ["timeout"] * 6


def _wait_for_spares(helper: int, count: int, timeout_s: float = 5.0) -> set[int]:
    """The helper's family once it has `count` children waiting for requests (and nothing running)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        family = _family(helper)
        if len(family) == count + 1:
            return family
        time.sleep(0.02)
    raise AssertionError(f"helper {helper} has children {sorted(_family(helper) - {helper})}, wanted {count}")


def _wait_dead(pid: int, timeout_s: float = 5.0) -> None:
    """Until `pid` is a zombie or gone (SIGKILL is delivered asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX":
                return
        except OSError:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} is still alive")


def test_spares_killed_while_waiting_are_replaced(dbs):
    """Children forked ahead of demand that die before a request arrives cost that request nothing:
    the helper skips them (or forks a fresh child) and forks new spares in their place."""
    initial, solved = str(dbs["initial"]), str(dbs[1])
    with VerifierSandbox(spare_children=2) as box:
        assert box.verify(_verifier_code(1), initial, solved).complete
        helper = box.helper_pid
        spares = _wait_for_spares(helper, 2) - {helper}
        for pid in spares:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # listed while the first request's child was still exiting: gone already
                pass
        for pid in spares:
            _wait_dead(pid)
        verdict = box.verify(_verifier_code(1), initial, solved)
        assert (verdict.verdict, verdict.detail) == ("complete", "")
        replaced = _wait_for_spares(helper, 2) - {helper}
        assert box.helper_pid == helper and not replaced & spares


def test_without_spares_each_request_forks_its_own_child(dbs):
    initial, solved = str(dbs["initial"]), str(dbs[2])
    with VerifierSandbox(spare_children=0) as box:
        verdicts = [box.verify(_verifier_code(2), initial, solved).verdict for _ in range(3)]
        _wait_for_spares(box.helper_pid, 0)  # the last child exits after its answer, asynchronously
        time.sleep(0.2)
        assert _family(box.helper_pid) == {box.helper_pid}  # and no spare is forked behind it
    assert verdicts == ["complete"] * 3


def test_verifier_reads_only_its_own_snapshots(sandbox, dbs):
    """A child waits for its request before it knows which files it may read, yet only its own
    request's snapshots are readable: not the helper's directory, nor another request's copies."""
    body = """\
    own = os.path.dirname(final_db_path)
    seen = {"own": sorted(os.listdir(own)), "same_dir": os.path.dirname(initial_db_path) == own}
    for label, path in (("helper_dir", os.path.dirname(own)), ("probe", os.path.join(os.path.dirname(own), "probe.db"))):
        try:
            seen[label] = sorted(os.listdir(path)) if label == "helper_dir" else len(open(path, "rb").read())
        except OSError as exc:
            seen[label] = type(exc).__name__
    return {"result": "complete", "seen": seen}
"""
    seen = _verdict(sandbox, dbs, body).result["seen"]
    assert seen["own"] == ["final.db", "initial.db"] and seen["same_dir"]
    if sandbox.protections["landlock_abi"]:
        assert (seen["helper_dir"], seen["probe"]) == ("PermissionError", "PermissionError")


def test_database_gone_before_its_snapshot_is_an_infra_failure(sandbox, dbs, tmp_path):
    """The helper snapshots the databases itself: one that vanished after the caller checked it is
    reported (never scored), and the helper goes on serving."""
    vanished = tmp_path / "vanished.db"
    vanished.write_bytes(dbs["initial"].read_bytes())
    request = sandbox._request(_verifier_code(1), str(dbs["initial"]), str(vanished), "code", None, 5.0)
    vanished.unlink()
    run = verifier._run_from_reply(sandbox._submit(request).result(), 0.0)
    verdict = verifier.code_verdict(run)
    assert (verdict.verdict, verdict.infra_failure) == ("judge_error", True)
    assert "could not snapshot" in verdict.detail and "final database not found" in verdict.detail
    assert sandbox.verify(_verifier_code(1), str(dbs["initial"]), str(dbs[1])).verdict == "complete"


def test_the_compiled_form_the_helper_keeps_is_what_runs_and_is_taken_before_the_verifier_runs(dbs):
    """A verifier runs once per episode, so the helper keeps its compiled form: a child runs the form it is
    handed (not the source), and the form it hands back was taken before the verifier's own code ran."""
    from awm.sandbox import _encode_program, _run_verifier

    initial = str(dbs["initial"])
    tamper = ("import marshal\nmarshal.dumps = lambda *a: b'poisoned'\n"
              "def verify_task_completion(initial_db_path, final_db_path):\n    return {'result': 'complete'}\n")
    request = {"mode": "code", "code": tamper, "function": "verify_task_completion", "want_compiled": True}
    import marshal

    dumps = marshal.dumps
    try:
        first = _run_verifier(request, initial, initial)
    finally:
        marshal.dumps = dumps  # the verifier replaced it in this (test) process
    assert first["ok"] and first["value"] == {"result": "complete"}
    assert first["compiled"] == _encode_program(compile(tamper, "<awm-verifier>", "exec"))

    other = "def verify_task_completion(initial_db_path, final_db_path):\n    return {'result': 'others'}\n"
    handed = {"mode": "code", "code": tamper, "function": "verify_task_completion",
              "compiled": _encode_program(compile(other, "<awm-verifier>", "exec"))}
    assert _run_verifier(handed, initial, initial)["value"] == {"result": "others"}  # the form, not the source


def test_a_verifier_run_again_from_its_kept_form_gives_the_same_verdict(sandbox, dbs):
    code, initial, solved = _verifier_code(2), str(dbs["initial"]), str(dbs[2])
    assert [sandbox.verify(code, initial, solved).verdict for _ in range(3)] == ["complete"] * 3
    assert [sandbox.verify(code, initial, initial).verdict for _ in range(2)] == ["others"] * 2
    broken = sandbox.verify("def verify_task_completion(a, b:\n", initial, initial)  # nothing kept: compiled again
    assert [broken.verdict, sandbox.verify("def verify_task_completion(a, b:\n", initial, initial).verdict] == [
        "judge_error"] * 2

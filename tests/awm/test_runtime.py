"""The episode runtime with real worker processes, real SQLite files and real FastAPI apps."""

from __future__ import annotations

import asyncio
import os
import socket
import sqlite3
import time

import pytest
from awm.episode import EnvRuntime
from awm.runtime.pool import LOAD_PENALTY, EnvLoadError, InfraError, ToolTimeout, WorkerCrashed
from awm.runtime.worker import ReplyBuffer


def run(coro):
    return asyncio.run(coro)


def notes(path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [r[0] for r in conn.execute("SELECT text FROM notes ORDER BY id")]
    finally:
        conn.close()


def test_episode_basics_and_isolation(fault_data_dir, cache_dir):
    async def main():
        with EnvRuntime(fault_data_dir, num_workers=2, cache_dir=cache_dir) as rt:
            a = await rt.open("faults", 0)
            b = await rt.open("faults", 0)
            assert a.task == "Add a note 'buy milk'."
            assert {t["name"] for t in a.tools} >= {"list_notes", "add_note", "get_note", "run_sql"}
            obs = await a.call("add_note", {"text": "buy milk"})
            assert not obs.is_error and '"text": "buy milk"' in obs.text
            # b is another episode of the same scenario: it never sees a's write
            assert "buy milk" not in (await b.call("list_notes", {})).text
            assert notes(a.db_path) == ["call mom", "water plants", "buy milk"]
            assert notes(b.db_path) == ["call mom", "water plants"]
            assert (await a.verify("done")).verdict == "complete"
            assert (await b.verify("done")).verdict == "others"
            await a.close()
            await b.close()
            assert not a.db_path.exists()

    run(main())


def test_agent_mistakes_are_observations(fault_data_dir, cache_dir):
    async def main():
        with EnvRuntime(fault_data_dir, num_workers=1, cache_dir=cache_dir) as rt:
            ep = await rt.open("faults")
            unknown = await ep.call("no_such_tool", {})
            assert unknown.is_error and unknown.kind == "unknown_tool" and "list_notes" in unknown.text
            bad = await ep.call("get_note", {"note_id": "one"})
            assert bad.kind == "invalid_arguments" and bad.text.startswith("Input validation error:")
            missing = await ep.call("get_note", {})
            assert missing.kind == "invalid_arguments" and "note_id" in missing.text
            not_json = await ep.call("get_note", "{not json")
            assert not_json.kind == "invalid_arguments"
            not_found = await ep.call("get_note", {"note_id": 99})
            assert not_found.is_error and not_found.status == 404
            assert (
                not_found.text
                == 'Error calling get_note. Status code: 404. Response: {"detail":"note not found"}'
            )
            boom = await ep.call("boom", {})
            assert boom.is_error and boom.status == 500 and "ZeroDivisionError" in boom.detail
            assert "ZeroDivisionError" not in boom.text  # the agent sees upstream's plain 500
            ok = await ep.call("get_note", '{"note_id": 1}')  # arguments as a JSON string work too
            assert not ok.is_error and '"call mom"' in ok.text
            assert ep.infra_error is None

    run(main())


def test_uncommitted_writes_of_a_failing_handler_are_rolled_back(fault_data_dir, cache_dir):
    async def main():
        with EnvRuntime(fault_data_dir, num_workers=1, cache_dir=cache_dir) as rt:
            ep = await rt.open("faults")
            obs = await ep.call("half_write", {"text": "ghost"})
            assert obs.status == 500
            assert "ghost" not in (await ep.call("list_notes", {})).text
            assert (await ep.call("add_note", {"text": "after"})).status == 200  # no lock left behind

    run(main())


def test_sql_injection_stays_in_its_episode(fault_data_dir, cache_dir):
    async def main():
        with EnvRuntime(fault_data_dir, num_workers=1, cache_dir=cache_dir) as rt:
            victim = await rt.open("faults")
            attacker = await rt.open("faults")
            await attacker.call("run_sql", {"sql": "DROP TABLE notes"})
            assert (await attacker.call("list_notes", {})).status == 500
            attach = await attacker.call("run_sql", {"sql": f"ATTACH DATABASE '{victim.db_path}' AS v"})
            assert attach.status == 500  # ATTACH is disabled on episode connections
            assert notes(victim.db_path) == ["call mom", "water plants"]
            assert notes(rt.template("faults")[0]) == ["call mom", "water plants"]
            fresh = await rt.open("faults")
            assert '"water plants"' in (await fresh.call("list_notes", {})).text

    run(main())


def test_snapshot_restore_and_reset(fault_data_dir, cache_dir):
    async def main():
        with EnvRuntime(fault_data_dir, num_workers=1, cache_dir=cache_dir) as rt:
            ep = await rt.open("faults")
            await ep.call("add_note", {"text": "one"})
            h1 = ep.state_hash()
            assert ep.changes() == {"notes": {"added": 1, "removed": 0, "changed": 0, "changed_columns": []}}
            snap = await ep.snapshot()
            await ep.call("run_sql", {"sql": "DELETE FROM notes"})
            assert ep.changes(since=snap)["notes"]["removed"] == 3
            assert notes(ep.db_path) == []
            await ep.restore(snap)
            assert ep.state_hash() == h1 and ep.steps == snap.step
            assert '"one"' in (await ep.call("list_notes", {})).text  # the connection sees the restored file
            await ep.reset()
            assert notes(ep.db_path) == ["call mom", "water plants"]
            assert ep.state_hash() == await asyncio.to_thread(
                lambda: __import__("awm.database").database.state_hash(rt.template("faults")[0])
            )
            other = await rt.open("faults")
            with pytest.raises(ValueError):
                await other.restore(snap)

    run(main())


def test_create_all_tables_are_folded_into_the_template(fault_data_dir, cache_dir):
    async def main():
        with EnvRuntime(fault_data_dir, num_workers=1, cache_dir=cache_dir) as rt:
            ep = await rt.open("faults")
            await ep.call("run_sql", {"sql": "INSERT INTO tags (name) VALUES ('x')"})
            conn = sqlite3.connect(ep.db_path)
            assert conn.execute("SELECT name FROM tags").fetchall() == [("x",)]
            conn.close()
            path, report = rt.template("faults")
            assert any("tags" in t for t in report.env_created_tables)

    run(main())


def test_broken_environment_code_names_the_scenario_and_spares_others(fault_data_dir, cache_dir):
    async def main():
        with EnvRuntime(fault_data_dir, num_workers=1, cache_dir=cache_dir) as rt:
            with pytest.raises(EnvLoadError, match="broken_import.*generated code is broken at import"):
                await rt.open("broken_import")
            with pytest.raises(EnvLoadError, match="broken_syntax.*SyntaxError"):
                await rt.open("broken_syntax")
            with pytest.raises(EnvLoadError, match="broken_syntax"):  # remembered: no second import
                await rt.open("broken_syntax")
            assert sum(rt.pool.slots[0].loaded.get(s) is not None for s in ("broken_import", "broken_syntax")) == 2
            ep = await rt.open("faults")  # same worker, still healthy
            assert not (await ep.call("list_notes", {})).is_error
            assert rt.pool.restarts == 0

    run(main())


def test_hanging_tool_times_out_and_worker_is_replaced(fault_data_dir, cache_dir):
    async def main():
        with EnvRuntime(fault_data_dir, num_workers=1, cache_dir=cache_dir, call_timeout_s=1.0) as rt:
            ep = await rt.open("faults")
            bystander = await rt.open("faults_twin")
            t0 = time.monotonic()
            with pytest.raises(ToolTimeout, match="exceeded 1.0 s"):
                await ep.call("slow", {"seconds": 60})
            assert time.monotonic() - t0 < 5
            assert ep.infra_error and rt.pool.restarts == 1
            with pytest.raises(InfraError):  # the episodes of the killed worker report the failure
                await bystander.call("list_notes", {})
            fresh = await rt.open("faults")
            assert not (await fresh.call("list_notes", {})).is_error

    run(main())


def test_dead_worker_is_replaced_and_its_episodes_fail(fault_data_dir, cache_dir):
    async def main():
        with EnvRuntime(fault_data_dir, num_workers=2, cache_dir=cache_dir) as rt:
            eps = [await rt.open("faults") for _ in range(10)]  # > LOAD_PENALTY: both workers serve it
            victim = eps[0]
            with pytest.raises(WorkerCrashed):
                await victim.call("crash", {})
            same_worker = [e for e in eps[1:] if e._slot is victim._slot]
            other_worker = [e for e in eps[1:] if e._slot is not victim._slot]
            assert same_worker and other_worker
            for e in same_worker:
                with pytest.raises(InfraError):
                    await e.call("list_notes", {})
            for e in other_worker:
                assert not (await e.call("list_notes", {})).is_error
            await asyncio.gather(*(e.close() for e in eps))
            again = await rt.open("faults")
            assert not (await again.call("list_notes", {})).is_error
            assert rt.pool.restarts == 1

    run(main())


def test_generated_code_sees_no_secrets(fault_data_dir, cache_dir, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")

    async def main():
        with EnvRuntime(fault_data_dir, num_workers=1, cache_dir=cache_dir) as rt:
            ep = await rt.open("faults")
            assert '"value": null' in (await ep.call("read_env", {"name": "OPENAI_API_KEY"})).text
            worker_pid = rt.pool.slots[0].proc.pid
            assert worker_pid != os.getpid()

    run(main())


def test_runtime_refuses_a_second_event_loop(fault_data_dir, cache_dir):
    rt = EnvRuntime(fault_data_dir, num_workers=1, cache_dir=cache_dir)
    try:
        asyncio.run(rt.open("faults"))
        with pytest.raises(RuntimeError, match="another event loop"):
            asyncio.run(rt.open("faults"))
    finally:
        rt.close()


def test_closing_after_the_event_loop_ended_with_a_call_in_flight(fault_data_dir, cache_dir):
    """A trainer stopped mid-rollout: its loop is gone with a tool call pending, and the runtime closes
    at exit. Closing kills the worker without raising 'Event loop is closed' for the orphaned call."""
    rt = EnvRuntime(fault_data_dir, num_workers=1, cache_dir=cache_dir)
    loop = asyncio.new_event_loop()
    try:
        ep = loop.run_until_complete(rt.open("faults"))
        call = loop.create_task(ep.call("slow", {"seconds": 60}))
        loop.run_until_complete(asyncio.sleep(0.5))
        assert not call.done() and rt.pool.slots[0].pending
    finally:
        loop.close()
    worker = rt.pool.slots[0].proc
    rt.close()
    assert worker.poll() is not None


def test_many_concurrent_episodes(fault_data_dir, cache_dir):
    async def main():
        with EnvRuntime(fault_data_dir, num_workers=2, cache_dir=cache_dir) as rt:
            eps = await asyncio.gather(*(rt.open("faults" if i % 2 else "faults_twin") for i in range(64)))

            async def work(i, ep):
                await ep.call("add_note", {"text": f"note {i}"})
                return (await ep.call("list_notes", {"q": "note"})).text

            texts = await asyncio.gather(*(work(i, ep) for i, ep in enumerate(eps)))
            for i, text in enumerate(texts):
                assert f'"note {i}"' in text and text.count('"note ') == 1
            low, high = sorted(len(s.episodes) for s in rt.pool.slots)
            assert low + high == 64 and high - low <= LOAD_PENALTY  # load spread over both workers

    run(main())


def test_calls_that_queue_behind_a_busy_worker_share_one_write(fault_data_dir, cache_dir):
    """Frames for a busy worker submitted in one loop iteration go out in one write; every answer is still
    its own episode's, in order, and a hung call still blames itself, not a request queued before it."""
    async def main():
        with EnvRuntime(fault_data_dir, num_workers=1, cache_dir=cache_dir, call_timeout_s=2.0) as rt:
            eps = [await rt.open("faults") for _ in range(6)]
            slot = eps[0]._slot
            writes: list[bytes] = []
            real_write = slot.transport.write
            slot.transport.write = lambda data: (writes.append(data), real_write(data))[1]
            results = await asyncio.gather(*(ep.call("add_note", {"text": f"note {i}"})
                                             for i, ep in enumerate(eps)))
            assert [r.is_error for r in results] == [False] * 6
            assert len(writes) == 2  # the first call went at once (idle worker), the other five together
            for i, ep in enumerate(eps):
                assert notes(ep.db_path)[-1] == f"note {i}"
            slot.transport.write = real_write
            # a hang behind a queued call: the watchdog must blame the hanging request
            quick, hung = eps[0].call("list_notes", {}), eps[1].call("slow", {"seconds": 60})
            outcomes = await asyncio.gather(quick, hung, return_exceptions=True)
            assert not isinstance(outcomes[0], BaseException) and not outcomes[0].is_error
            assert isinstance(outcomes[1], ToolTimeout) and outcomes[1].culprit

    run(main())


def test_a_batch_s_replies_leave_in_one_write(fault_data_dir, cache_dir):
    """Calls queued behind a busy worker are read in one go; their replies come back in one write (one read
    here) instead of one each, and each is still its own episode's."""
    async def main():
        with EnvRuntime(fault_data_dir, num_workers=1, cache_dir=cache_dir) as rt:
            eps = [await rt.open("faults") for _ in range(6)]
            protocol = eps[0]._slot.transport.get_protocol()
            reads: list[int] = []
            real = protocol.data_received
            protocol.data_received = lambda data: (reads.append(len(data)), real(data))[1]
            busy = asyncio.ensure_future(eps[0].call("slow", {"seconds": 0.3}))
            await asyncio.sleep(0.1)  # the worker is inside the slow call; the next five queue behind it
            results = await asyncio.gather(*(ep.call("add_note", {"text": f"note {i}"})
                                             for i, ep in enumerate(eps[1:], 1)))
            assert not (await busy).is_error and [r.is_error for r in results] == [False] * 5
            assert len(reads) == 2, reads  # the slow call's reply, then the five together
            for i, ep in enumerate(eps[1:], 1):
                assert notes(ep.db_path)[-1] == f"note {i}"

    run(main())


def test_a_reply_held_for_its_batch_is_sent_while_a_slow_call_runs(fault_data_dir, cache_dir):
    """A reply waits for the rest of its batch only briefly: a slow call after it does not delay it."""
    async def main():
        with EnvRuntime(fault_data_dir, num_workers=1, cache_dir=cache_dir) as rt:
            eps = [await rt.open("faults") for _ in range(3)]
            busy = asyncio.ensure_future(eps[0].call("slow", {"seconds": 0.2}))
            await asyncio.sleep(0.05)
            t0 = time.monotonic()
            quick = asyncio.ensure_future(eps[1].call("list_notes", {}))
            slow = asyncio.ensure_future(eps[2].call("slow", {"seconds": 1.0}))  # same batch, after `quick`
            assert not (await quick).is_error
            assert time.monotonic() - t0 < 0.8  # well before the slow call ends
            assert not (await slow).is_error and not (await busy).is_error

    run(main())


def test_the_reply_thread_keeps_its_own_clock_and_sends_what_the_loop_does_not():
    """Batches sent by the serving loop never wake the reply thread (a GIL hand-over each: 60-130 us); it
    ticks every hold_s while replies flow, parks when none do, and sends a held reply within 2 * hold_s."""
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    theirs.settimeout(2.0)
    replies = ReplyBuffer(ours, hold_s=0.02)
    try:
        t0 = time.monotonic()
        for _ in range(300):  # the serving loop's pattern: a batch's replies held, then sent together
            work_until = time.perf_counter() + 0.0005  # the batch's requests
            while time.perf_counter() < work_until:
                pass
            replies.add(b"reply")
            ours.send(replies.take())
            assert theirs.recv(64) == b"reply"
            time.sleep(0.0005)  # waiting for the next batch: the GIL is free, a woken thread would take it
        busy_s = time.monotonic() - t0
        assert replies.ticks <= busy_s / 0.02 + 3, (replies.ticks, busy_s)  # a wake per batch: about 300
        give_up = time.monotonic() + 5.0
        while not replies.parked and time.monotonic() < give_up:  # two looks at most, on an idle machine
            time.sleep(0.01)
        assert replies.parked
        parked = replies.ticks
        time.sleep(0.2)
        assert replies.ticks == parked  # idle: no ticks at all
        t0 = time.monotonic()
        replies.add(b"held")  # a slow request follows: the loop will not send it
        assert theirs.recv(64) == b"held"
        assert 0.015 <= time.monotonic() - t0 < 1.0
    finally:
        ours.close()
        theirs.close()


def test_a_worker_dying_inside_a_batch_blames_the_request_that_killed_it(fault_data_dir, cache_dir):
    """A call that kills its worker after others of its batch ran (their replies were still held): the crash
    is blamed on it (the worker's progress record), not on the first request of the batch."""
    async def main():
        with EnvRuntime(fault_data_dir, num_workers=1, cache_dir=cache_dir) as rt:
            eps = [await rt.open("faults") for _ in range(4)]
            busy = asyncio.ensure_future(eps[0].call("slow", {"seconds": 0.3}))
            await asyncio.sleep(0.1)
            outcomes = await asyncio.gather(eps[1].call("list_notes", {}), eps[2].call("crash", {}),
                                            eps[3].call("list_notes", {}), return_exceptions=True)
            assert not (await busy).is_error
            assert isinstance(outcomes[1], WorkerCrashed) and outcomes[1].culprit
            assert isinstance(outcomes[2], WorkerCrashed) and not outcomes[2].culprit  # queued behind it
            first = outcomes[0]  # ran before the crash: its reply was held, or sent if the machine stalled
            assert not isinstance(first, BaseException) or (isinstance(first, WorkerCrashed) and not first.culprit)
            assert rt.pool.restarts == 1

    run(main())


MANY_EPISODES = """
import asyncio, resource, sys
from awm.episode import EnvRuntime

async def main():
    with EnvRuntime(sys.argv[1], num_workers=1, cache_dir=sys.argv[2]) as rt:
        eps = await asyncio.gather(*(rt.open("faults", 0) for _ in range(300)))
        texts = await asyncio.gather(*(ep.call("list_notes", {}) for ep in eps))
        print(sum("call mom" in t.text for t in texts), resource.getrlimit(resource.RLIMIT_NOFILE)[0])

asyncio.run(main())
"""


def test_more_episodes_than_the_soft_open_file_limit(fault_data_dir, cache_dir):
    """300 open episodes (one SQLite file each, all in one worker) under a soft limit of 128 open files:
    the pool raises the soft limit to the hard one before it starts its workers."""
    import resource
    import subprocess
    import sys
    from pathlib import Path

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 1024:
        pytest.skip(f"hard open-file limit {hard}: too low to show the difference")
    package_root = Path(__file__).resolve().parents[2] / "agent-world-model"
    out = subprocess.run([sys.executable, "-c", MANY_EPISODES, str(fault_data_dir), str(cache_dir)],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(package_root)},
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard)))  # noqa: PLW1509
    assert out.returncode == 0, out.stderr[-2000:]
    done, soft = map(int, out.stdout.split())
    assert done == 300 and soft > 128

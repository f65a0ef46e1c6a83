"""Control state the trainer trusts lives where environment code cannot write (issue 38).

Each test runs hostile generated-code-style Python through the real runtime: env code forges the
worker's shared progress record (a start time in the future; a blame moved to the next request),
leaves a timer armed for another scenario's import, reaches a socket around seccomp's socket() ban
(io_uring, socketpair, pidfds), returns a result larger than the frame cap, or floods stderr. Before
this change each one defeated a deadline, refused an innocent scenario, connected, or reached the
trainer whole.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import socket
import sqlite3
import time

import pytest
from awm.episode import EnvRuntime
from awm.runtime import pool as pool_module
from awm.runtime import wire
from awm.runtime.pool import EnvLoadError, InfraError, ToolTimeout
from awm.verifier import VerifierSandbox
from conftest import FAULT_APP, write_scenarios

HOSTILE_ROUTES = r'''

import ctypes as _ctypes, json as _json, mmap as _mmap, signal as _signal, socket, struct as _struct, sys as _sys


def _progress():
    """The worker's shared progress record: its fd is in the worker's command line."""
    fd = _json.loads(_sys.argv[2])["progress_fd"]
    return _mmap.mmap(fd, 16)


@app.get("/forge_start", operation_id="forge_start", summary="Move this call's start into the future, then sleep")
def forge_start(seconds: float = 8.0):
    record = _progress()
    request_id, started_ns = _struct.unpack_from("<QQ", record, 0)
    _struct.pack_into("<QQ", record, 0, request_id, started_ns + 10**12)
    time.sleep(seconds)
    return {"slept": seconds}


@app.get("/forge_reply", operation_id="forge_reply", summary="Answer the next request in the worker's name")
def forge_reply():
    request_id, _ = _struct.unpack_from("<QQ", _progress(), 0)
    fake = {"text": "forged", "is_error": False, "kind": "ok", "status": 200, "latency_s": 0.0, "detail": "",
            "extra": {}}
    body = _json.dumps([request_id + 1, True, fake]).encode()
    os.write(int(_sys.argv[1]), _struct.pack(">I", len(body)) + body)  # the worker's own socket to the pool
    return {"sent": request_id + 1}


@app.get("/arm", operation_id="arm", summary="Arm a timer and leave")
def arm(seconds: float = 0.3):
    _signal.setitimer(_signal.ITIMER_REAL, seconds)
    return {"armed": seconds}


@app.get("/big", operation_id="big", summary="A huge result")
def big(mb: int = 20):
    return {"blob": "x" * (mb << 20)}


@app.get("/spew", operation_id="spew", summary="Write to stderr without end")
def spew(mb: int = 50):
    line = "generated code talks a lot " * 3 + "\n"
    chunk = line * ((1 << 20) // len(line))
    for _ in range(mb):
        _sys.stderr.write(chunk)
    _sys.stderr.flush()
    return {"mb": mb}


@app.get("/reserve", operation_id="reserve", summary="Ask malloc for a lot of memory (not touched)")
def reserve(gb: int = 5):
    libc = _ctypes.CDLL(None)
    libc.malloc.restype = _ctypes.c_void_p
    pointer = libc.malloc(_ctypes.c_size_t(gb << 30))
    libc.free(_ctypes.c_void_p(pointer))
    return {"granted": bool(pointer)}


def _raw_syscall(number, *args):
    libc = _ctypes.CDLL(None, use_errno=True)
    result = libc.syscall(_ctypes.c_long(number), *(_ctypes.c_ulong(a) for a in args))
    return result, _ctypes.get_errno()


def _uring(_):
    params = _ctypes.create_string_buffer(120)  # struct io_uring_params, zeroed
    return _raw_syscall(425, 4, _ctypes.addressof(params))  # io_uring_setup(4 entries)


def _dgram(path):
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.sendto(b"reached you", path)  # a datagram pair can still address any Unix socket path
    return 0, 0


def _pidfd(_):
    return _raw_syscall(434, os.getppid(), 0)  # pidfd_open(the trainer)


ROUTES = {"io_uring_setup": _uring, "socketpair_sendto": _dgram, "pidfd_open": _pidfd}


@app.get("/escape", operation_id="escape", summary="Try one way to a socket around socket()")
def escape(what: str, arg: str = ""):
    try:
        result, err = ROUTES[what](arg)
    except OSError as exc:
        return {"result": -1, "errno": exc.errno}
    return {"result": result, "errno": err}
'''

SHIFT_BLAME_AT_IMPORT = '''
import json, mmap, os, struct, sys
record = mmap.mmap(json.loads(sys.argv[2])["progress_fd"], 16)
request_id, started_ns = struct.unpack_from("<QQ", record, 0)
struct.pack_into("<QQ", record, 0, request_id + 1, started_ns)  # "the next queued request is running"
os._exit(3)
'''

ARM_AT_IMPORT = "import signal as _sig\n_sig.setitimer(_sig.ITIMER_REAL, 1.0)\n"
ARM_RAISING_HANDLER_AT_IMPORT = ("import signal as _sig\n_sig.signal(_sig.SIGALRM, lambda *a: 1 / 0)\n"
                                 "_sig.setitimer(_sig.ITIMER_REAL, 1.0)\n")
SLOW_IMPORT = "import time as _t\n_t.sleep(2.5)\n"


@pytest.fixture(scope="module")
def hostile_dir(tmp_path_factory: pytest.TempPathFactory):
    return write_scenarios(tmp_path_factory.mktemp("trust"), {
        "hostile": FAULT_APP + HOSTILE_ROUTES,
        "shift_blame": SHIFT_BLAME_AT_IMPORT,
        "arms_timer": ARM_AT_IMPORT + FAULT_APP,
        "arms_raising_timer": ARM_RAISING_HANDLER_AT_IMPORT + FAULT_APP,
        "slow_import": SLOW_IMPORT + FAULT_APP,
        "bystander": FAULT_APP,
    })


def test_a_start_time_forged_into_the_future_does_not_extend_the_hard_deadline(hostile_dir, cache_dir):
    """Env code moves its start in the worker's progress record 1,000 s ahead and sleeps 8 s (in C: the
    soft deadline cannot interrupt it). The pool's deadline comes from when it sent the request: the
    worker is killed at 2 s. Before, the call returned after 8 s (and a longer sleep hung the worker)."""
    async def main():
        with EnvRuntime(hostile_dir, num_workers=1, cache_dir=cache_dir, call_timeout_s=2.0) as rt:
            ep = await rt.open("hostile")
            t0 = time.monotonic()
            with pytest.raises(ToolTimeout) as caught:
                await ep.call("forge_start", {"seconds": 8})
            elapsed = time.monotonic() - t0
            fresh = await rt.open("hostile")
            assert not (await fresh.call("list_notes", {})).is_error
            return caught.value, elapsed, rt.pool.restarts

    exc, elapsed, restarts = asyncio.run(main())
    assert elapsed < 3.5, elapsed
    assert exc.culprit and restarts == 1


def test_a_forged_reply_to_another_episode_s_call_kills_the_worker(hostile_dir, cache_dir):
    """Env code writes, on its worker's socket, a well-formed reply to the call queued behind its own (another
    episode's). The worker answers in order, once: a reply to anything but the oldest unanswered request is
    a protocol break, the worker is killed, and both calls fail as infrastructure errors. Before, the other
    episode received the forged observation."""
    async def main():
        with EnvRuntime(hostile_dir, num_workers=1, cache_dir=cache_dir) as rt:
            forger, victim = await rt.open("hostile"), await rt.open("hostile")
            outcomes = await asyncio.gather(forger.call("forge_reply", {}), victim.call("list_notes", {}),
                                            return_exceptions=True)
            return outcomes, rt.pool.restarts

    outcomes, restarts = asyncio.run(main())
    assert not any(getattr(o, "text", "") == "forged" for o in outcomes), outcomes
    assert isinstance(outcomes[1], InfraError) and "protocol" in str(outcomes[1]), outcomes
    assert restarts == 1


def test_a_forged_progress_record_cannot_move_the_blame_for_an_import_crash(hostile_dir, cache_dir):
    """An import points the progress record at the next queued request, then kills its worker. A load runs
    alone in its worker, so the crash is its own whatever the record says: the scenario is refused after
    the first time (load_attempts=1). Before, a bystander took the blame on every try: 3 opens, 3 restarts."""
    async def main():
        with EnvRuntime(hostile_dir, num_workers=1, cache_dir=cache_dir) as rt:
            rt.template("shift_blame")  # built now, so the load is sent at once and the calls queue behind it
            outcomes = []
            for _ in range(3):
                bystanders = [await rt.open("hostile") for _ in range(4)]
                results = await asyncio.gather(rt.open("shift_blame"),
                                               *(ep.call("list_notes", {}) for ep in bystanders),
                                               return_exceptions=True)
                outcomes.append(results[0])
                for ep in bystanders:
                    await ep.close()
            return outcomes, rt.pool.restarts, dict(rt._load_strikes)

    outcomes, restarts, strikes = asyncio.run(main())
    assert isinstance(outcomes[0], InfraError) and outcomes[0].culprit, outcomes[0]
    for later in outcomes[1:]:
        assert isinstance(later, EnvLoadError) and "took its worker down at import" in str(later), later
    assert restarts == 1 and strikes == {"shift_blame": 1}


@pytest.mark.parametrize("armer", ["arms_timer", "arms_raising_timer"])
def test_a_timer_armed_by_one_scenario_does_not_fire_in_another_s_import(hostile_dir, cache_dir, armer):
    """One scenario's import arms a 1 s SIGALRM timer (with no handler: the signal kills; or with a handler
    that raises); another's import takes 2.5 s. The worker starts every import from a clean timer state,
    and ignores timer signals, so the second scenario loads. Before, it was refused for the first one's
    timer (a worker death counted against it, or the handler's exception as its import error)."""
    async def main():
        with EnvRuntime(hostile_dir, num_workers=1, cache_dir=cache_dir, load_timeout_s=20.0) as rt:
            rt.template(armer), rt.template("slow_import")  # built now: the second import starts at once
            try:
                await rt.open(armer)
            except EnvLoadError:  # the per-request process guard (isolation.py) may refuse the armer itself
                pass
            second = await rt.open("slow_import")
            assert not (await second.call("list_notes", {})).is_error
            return rt.pool.restarts, dict(rt._load_strikes), dict(rt._broken)

    restarts, strikes, broken = asyncio.run(main())
    assert restarts == 0 and strikes == {} and "slow_import" not in broken, (restarts, strikes, broken)


def test_a_timer_a_call_leaves_armed_does_not_kill_the_worker_later(hostile_dir, cache_dir):
    """A call arms a timer and returns; it fires during another episode's call. The worker ignores timer
    signals (env code that wants one installs its own handler): nobody's call fails. Before, SIGALRM's
    default action killed the worker and every episode it hosted."""
    async def main():
        with EnvRuntime(hostile_dir, num_workers=1, cache_dir=cache_dir) as rt:
            armer, bystander = await rt.open("hostile"), await rt.open("bystander")
            try:
                await armer.call("arm", {"seconds": 0.2})
            except InfraError:  # the per-request process guard (isolation.py) may fail the armer's call
                pass
            assert not (await bystander.call("slow", {"seconds": 0.6})).is_error
            return rt.pool.restarts

    assert asyncio.run(main()) == 0


def test_a_worker_s_memory_is_capped_and_it_is_the_oom_killer_s_first_choice(hostile_dir, cache_dir):
    """A worker's data is capped (RLIMIT_DATA: DATA_LIMIT_FACTOR x its memory ceiling, at least
    MIN_DATA_LIMIT): a 5 GiB allocation under a 1 GiB ceiling fails in its call; a smaller one works. Its
    oom_score_adj is 1000, so under memory pressure the kernel kills a worker, never the trainer first.
    Before, the allocation was granted and the worker's oom_score_adj was the trainer's."""
    async def main():
        with EnvRuntime(hostile_dir, num_workers=1, cache_dir=cache_dir, worker_memory_limit_mb=1024) as rt:
            ep = await rt.open("hostile")
            huge = json.loads((await ep.call("reserve", {"gb": 5})).text)
            small = json.loads((await ep.call("reserve", {"gb": 1})).text)
            with open(f"/proc/{rt.pool.slots[0].proc.pid}/oom_score_adj") as handle:
                adj = int(handle.read())
            return huge, small, adj, rt.pool.restarts

    huge, small, adj, restarts = asyncio.run(main())
    assert huge == {"granted": False} and small == {"granted": True}
    assert adj == 1000 and restarts == 0
    assert pool_module.MIN_DATA_LIMIT == 4 << 30  # the figure the docstring and docs give


def _escape_results(data_dir, cache_dir, lockdown: bool, target: str) -> dict:
    async def main():
        with EnvRuntime(data_dir, num_workers=1, cache_dir=cache_dir, sandbox_workers=lockdown) as rt:
            ep = await rt.open("hostile")
            out = {}
            for what in ("io_uring_setup", "socketpair_sendto", "pidfd_open"):
                obs = await ep.call("escape", {"what": what, "arg": target})
                assert not obs.is_error, obs.text
                out[what] = json.loads(obs.text)
            return out

    return asyncio.run(main())


def test_no_route_to_a_socket_around_seccomp(hostile_dir, cache_dir, tmp_path):
    """io_uring (whose IORING_OP_SOCKET/CONNECT seccomp never sees), a socketpair's datagram sent to a Unix
    socket path, and a pidfd of the trainer (pidfd_getfd copies its fds) are refused under the lockdown.
    Without it the same code succeeds: the test shows each route is real on this kernel."""
    target = tmp_path / "trainer.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(target))
    listener.settimeout(0.5)
    try:
        open_ = _escape_results(hostile_dir, cache_dir, False, str(target))
        try:
            reached = listener.recv(64)
        except TimeoutError:
            reached = b""
        locked = _escape_results(hostile_dir, cache_dir, True, str(target))
        try:
            reached_locked = listener.recv(64)
        except TimeoutError:
            reached_locked = b""
    finally:
        listener.close()
    denied = {errno.EPERM, errno.ENOSYS, errno.EACCES}
    for what, r in locked.items():
        assert r["result"] == -1 and r["errno"] in denied, (what, r)
    assert reached_locked == b""
    assert reached == b"reached you"  # the datagram route is real
    if open_["io_uring_setup"]["result"] < 0:
        pytest.skip(f"this kernel refuses io_uring to everyone (errno {open_['io_uring_setup']['errno']}): "
                    "its denial under the lockdown proves nothing here")
    assert open_["pidfd_open"]["result"] >= 0


VERIFIER_TRIES_IO_URING = """def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    params = ctypes.create_string_buffer(120)
    fd = libc.syscall(ctypes.c_long(425), ctypes.c_ulong(4), ctypes.c_ulong(ctypes.addressof(params)))
    return {"result": "complete" if fd < 0 else "others"}
"""


def test_the_verifier_sandbox_refuses_io_uring_too(tmp_path):
    """Verifier code runs under the same seccomp program (`awm.lockdown`): io_uring_setup fails there."""
    db = tmp_path / "state.db"
    sqlite3.connect(db).close()
    with VerifierSandbox() as box:
        verdict = box.verify(VERIFIER_TRIES_IO_URING, str(db), str(db))
    assert verdict.verdict == "complete", verdict


def test_a_result_over_the_frame_cap_is_an_error_observation_and_the_worker_lives(hostile_dir, cache_dir):
    """A 20 MiB tool result (cap: wire.MAX_FRAME, 16 MiB) comes back as an error observation naming the cap;
    the worker and its other episodes go on. Before, it reached the trainer whole."""
    assert wire.MAX_FRAME == 16 << 20

    async def main():
        with EnvRuntime(hostile_dir, num_workers=1, cache_dir=cache_dir) as rt:
            ep, bystander = await rt.open("hostile"), await rt.open("hostile")
            obs = await ep.call("big", {"mb": 20})
            small = await ep.call("big", {"mb": 1})
            assert not (await bystander.call("list_notes", {})).is_error
            return obs, small, rt.pool.restarts

    obs, small, restarts = asyncio.run(main())
    assert obs.is_error and "16 MiB" in obs.text and len(obs.text) < 1000, obs.text[:300]
    assert not small.is_error and restarts == 0


def test_env_output_reaches_the_trainer_bounded(hostile_dir, cache_dir, capfd, caplog):
    """50 MB written to stderr by env code: the pool drains the worker's output and forwards at most
    STDERR_BUDGET bytes per window to logging; nothing reaches the trainer's own stderr. Before, all
    50 MB went to the trainer's stderr (an unread pipe there blocks the worker, then the trainer)."""
    caplog.set_level(logging.WARNING, logger=pool_module.__name__)

    async def main():
        with EnvRuntime(hostile_dir, num_workers=1, cache_dir=cache_dir, call_timeout_s=30.0) as rt:
            ep = await rt.open("hostile")
            obs = await ep.call("spew", {"mb": 50})
            return obs, rt.pool.restarts

    obs, restarts = asyncio.run(main())
    err = capfd.readouterr().err
    forwarded = sum(len(r.getMessage()) for r in caplog.records if r.name == pool_module.__name__)
    assert not obs.is_error and restarts == 0, obs.text[:300]
    assert len(err) < 64 << 10, len(err)
    assert forwarded < 2 * pool_module.STDERR_BUDGET, forwarded
    assert any("dropped" in r.getMessage() for r in caplog.records)

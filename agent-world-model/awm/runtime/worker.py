"""The environment worker process: hosts scenario apps and the episode DB connections.

Started by `awm.runtime.pool.WorkerPool` as `python -m awm.runtime.worker <fd> <config>` with an allow-listed
environment (generated code never sees API keys). Before serving, the worker locks itself down
with the verifier sandbox's pieces (`awm.lockdown.Lockdown`): generated code runs in a process
with no network, no capabilities, no new processes (threads only), no sockets, no ptrace, and,
by Landlock, read access to the interpreter, libraries and scenario templates only (no /proc, so
no other process's environment or memory) and write access to this worker's own directory only. Requests arrive over a socket as
`(request_id, op, payload)` frames and are served one at a time, in order, by an asyncio loop
that awaits each app call directly: handlers of AWM code are blocking SQLAlchemy work, so
concurrency inside one process would buy nothing and would let episodes interleave on shared
module state. The parent's transport buffers what we have not read yet, so it never blocks.
The replies of the requests read in one go leave in one write (`ReplyBuffer`); a shared
`wire.Progress` record hints to the pool which request runs now (a hint: env code can write it, so the
pool's deadlines and a load's blame never depend on it). Timer signals are ignored, and every import
starts with no timer armed (`clean_timers`). Memory is capped per worker (`limit_memory`).

Invariant: the worker that owns an episode's connection is the only writer of that
episode's DB file; reset, snapshot and restore go through it (SQLite backup API).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import resource
import shutil
import signal
import socket
import sqlite3
import sys
import tempfile
import threading
import time
import traceback
from typing import Any

from awm.lockdown import Lockdown
from awm.runtime import wire
from awm.runtime.deadline import CallDeadline
from awm.runtime.envapp import EpisodeDB, EpisodeRouter, LoadedEnv, call_tool, load_env, unload_env
from awm.runtime.isolation import (
    ProcessGuard,
    cancel_new_handles,
    cancel_new_tasks,
    loop_handles,
    route_sqlite_connect,
)

log = logging.getLogger("awm.runtime.worker")
_TIMER_SIGNALS = (signal.SIGALRM, signal.SIGVTALRM, signal.SIGPROF)
_ITIMERS = (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF)


def ignore_timer_signals() -> None:
    """The worker's own state, set before any env code runs: a timer a scenario arms (`alarm`, `setitimer`)
    and leaves armed must not kill the worker, and with it every episode it hosts, when it fires later."""
    for sig in _TIMER_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def clean_timers(handlers: dict[int, Any], mask: set[int]) -> None:
    """Start an import from a clean timer and signal state: disarm every interval timer (and `alarm`),
    drop a timer signal already pending, and put back signal handlers and the signal mask as the worker
    had them (`handlers`, `mask`). A timer armed by one scenario then never fires in another's import,
    where the crash or exception would be counted against the innocent one. POSIX timers cannot be
    armed at all (seccomp refuses timer_create: `awm.lockdown`). Main thread only; a few system calls."""
    for which in _ITIMERS:
        signal.setitimer(which, 0)
    for sig in _TIMER_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)  # setting SIG_IGN discards a pending instance (POSIX)
    for sig, handler in handlers.items():
        if signal.getsignal(sig) is not handler:
            signal.signal(sig, handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _own_signal_state() -> tuple[dict[int, Any], set[int]]:
    """The handlers and mask the worker runs with (after `ignore_timer_signals`), to put back before imports."""
    handlers = {}
    for sig in signal.valid_signals():
        try:
            handler = signal.getsignal(sig)
        except (OSError, ValueError):
            continue
        if handler is not None and sig not in (signal.SIGKILL, signal.SIGSTOP):
            handlers[sig] = handler
    return handlers, signal.pthread_sigmask(signal.SIG_BLOCK, [])


class Worker:
    """All state of one worker process; `handle` serves one request."""

    def __init__(self, scratch_root: str | None = None, direct_dispatch: bool = True) -> None:
        self.router = EpisodeRouter()
        self.envs: dict[str, LoadedEnv] = {}
        self.sources: dict[str, tuple[str, str, list | None]] = {}  # scenario -> code, template, tools
        self.private: dict[str, LoadedEnv] = {}  # episode -> its own module instance (module state)
        self.episodes: dict[str, tuple[str, EpisodeDB]] = {}
        self.scratch = tempfile.mkdtemp(prefix="awm-worker-", dir=scratch_root)
        # what $DATABASE_PATH names for generated code: a raw sqlite3.connect of it opens the call's DB
        self.database_path = os.path.join(self.scratch, "current-episode.db")
        route_sqlite_connect(self.database_path, self.router.path)
        self.protections: dict[str, Any] = {}
        # scenarios cannot reach each other through the process: checked after every request (isolation.py)
        self.guard = ProcessGuard({"DATABASE_PATH": f"sqlite:///{self.database_path}"})
        self.signal_state = _own_signal_state()
        self.deadline = CallDeadline()
        self.direct_dispatch = direct_dispatch

    # ops -----------------------------------------------------------------------------
    def op_ping(self, _: dict) -> dict:
        return {"pid": os.getpid(), "scenarios": sorted(self.envs), "episodes": len(self.episodes),
                "protections": self.protections}

    def op_load(self, p: dict) -> dict:
        scenario = p["scenario"]
        if scenario not in self.envs:
            self.envs[scenario] = self._import(scenario, p["code"], p["template"], p.get("tools"))
            self.sources[scenario] = (p["code"], p["template"], p.get("tools"))
        env = self.envs[scenario]
        return {"tools": [t.to_dict() for t in env.tools.values()], "load_s": env.load_s,
                "created_sql": env.created_sql, "module_state": env.module_state}

    def _import(self, scenario: str, code: str, template: str, tools: list | None) -> LoadedEnv:
        """A fresh module instance; its import-time DB work goes to a throwaway copy of the template."""
        scratch = os.path.join(self.scratch, f"{scenario}.db")
        shutil.copyfile(template, scratch)
        clean_timers(*self.signal_state)
        try:
            return load_env(scenario, code, self.router, scratch, tools, self.database_path, self.direct_dispatch)
        finally:
            os.unlink(scratch)

    def op_unload(self, p: dict) -> dict:
        env = self.envs.pop(p["scenario"], None)
        self.sources.pop(p["scenario"], None)
        if env is not None:
            unload_env(env)
        return {}

    def op_open(self, p: dict) -> dict:
        scenario, episode = p["scenario"], p["episode"]
        if scenario not in self.envs:
            raise KeyError(f"scenario {scenario!r} is not loaded in this worker")
        if self.envs[scenario].module_state:  # the slower path: module state stays with its episode
            self.private[episode] = self._import(scenario, *self.sources[scenario])
        self.episodes[episode] = (scenario, EpisodeDB(p["db_path"], self.deadline))
        return {"private_module": episode in self.private}

    async def op_call(self, p: dict) -> dict:
        scenario, db = self._episode(p["episode"])
        env = self.private.get(p["episode"]) or self.envs[scenario]
        before, loop = asyncio.all_tasks(), asyncio.get_running_loop()
        handles = loop_handles(loop)
        try:
            with self.deadline.running(p.get("soft_timeout_s")):
                obs = await call_tool(env, self.router, db, p["tool"], p.get("arguments"))
        finally:
            cancel_new_tasks(before)  # a task left running would write during another episode's call
            cancel_new_handles(loop, handles)  # so would a callback left scheduled (call_later, add_reader)
        return obs.to_dict()

    def op_restore(self, p: dict) -> dict:
        """Overwrite the episode DB with `source` (the template for a reset, or a snapshot); a reset
        (`fresh_module`) also gives a private-module episode a fresh module, as a restarted server would."""
        scenario, db = self._episode(p["episode"])
        if p.get("fresh_module") and p["episode"] in self.private:
            unload_env(self.private.pop(p["episode"]))
            self.private[p["episode"]] = self._import(scenario, *self.sources[scenario])
        src = sqlite3.connect(f"file:{p['source']}?mode=ro", uri=True)
        try:
            src.backup(db.conn)
        finally:
            src.close()
        return {}

    def op_snapshot(self, p: dict) -> dict:
        _, db = self._episode(p["episode"])
        dst = sqlite3.connect(p["dest"])
        try:
            db.conn.backup(dst)
        finally:
            dst.close()
        return {}

    def op_close(self, p: dict) -> dict:
        item = self.episodes.pop(p["episode"], None)
        if item is not None:
            item[1].close()
        private = self.private.pop(p["episode"], None)
        if private is not None:
            unload_env(private)
        return {"max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}  # Linux: KiB

    def op_crash(self, p: dict) -> dict:
        """Test hook: die abruptly, as a segfault in a C extension would."""
        os._exit(int(p.get("code", 70)))

    def _episode(self, episode: str) -> tuple[str, EpisodeDB]:
        try:
            return self.episodes[episode]
        except KeyError:
            raise KeyError(f"episode {episode!r} is not open in this worker") from None

    async def handle(self, op: str, payload: dict) -> tuple[bool, Any]:
        fn = getattr(self, f"op_{op}", None)
        if fn is None:
            return False, {"type": "ValueError", "message": f"unknown op {op!r}"}
        try:
            scenario = payload.get("scenario") or self.episodes.get(payload.get("episode"), (None,))[0]
            with self.guard.watch(op, scenario):  # what the request changed of the process is undone after it
                result = fn(payload)
                result = await result if asyncio.iscoroutine(result) else result
            return True, result
        except Exception as exc:
            return False, {"type": type(exc).__name__, "message": str(exc),
                           "traceback": "".join(traceback.format_exc(limit=-4))}


def unsendable(op: str, ok: bool, why: str) -> tuple[bool, dict[str, Any]]:
    """The reply to send instead of one that cannot be sent (`why`): for a tool call, an error observation
    (the model asked for more than `wire.MAX_FRAME` bytes, or the tool returned what JSON cannot carry);
    for any other request, an error."""
    if op == "call" and ok:
        text = (f"The tool's result could not be returned: {why}. Tool results are capped at "
                f"{wire.MAX_FRAME >> 20} MiB: ask for less (filter, or page through the results).")
        return True, {"text": text, "is_error": True, "kind": "http_error", "status": 500, "latency_s": 0.0,
                      "detail": why, "extra": {"result_too_large": "frame limit" in why}}
    return False, {"type": "ValueError", "message": why}


def limit_memory(data_limit: int | None) -> dict[str, Any]:
    """Before env code runs: cap this process's data (heap and private mappings) at `data_limit` bytes, so a
    runaway allocation fails in its call with MemoryError, and make the worker the OOM killer's first
    choice (oom_score_adj 1000; raising it needs no privilege), never the trainer."""
    out: dict[str, Any] = {"data_limit": None, "oom_score_adj": None}
    if data_limit:
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        limit = data_limit if hard == resource.RLIM_INFINITY else min(data_limit, hard)
        try:
            resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
            out["data_limit"] = limit
        except (ValueError, OSError):
            pass
    try:
        with open("/proc/self/oom_score_adj", "w") as handle:
            handle.write("1000")
        out["oom_score_adj"] = 1000
    except OSError:
        pass
    return out


def lock_down(config: dict[str, Any]) -> dict[str, Any]:
    """Apply the sandbox to this process (it is single-threaded here, so every later thread inherits it)."""
    memory = limit_memory(config.get("data_limit"))
    if not config.get("lockdown", True):
        return {"lockdown": False, **memory}
    lockdown = Lockdown(tuple(config.get("read", ())), (config["dir"],), threads=True)
    lockdown.apply(None)
    return {"lockdown": True, **lockdown.describe(), **memory}


class ReplyBuffer:
    """The replies of one batch of requests (those read from the socket in one go), sent in one write.

    Under load requests arrive in batches, and one write per batch instead of one per reply halves the
    caller's CPU per call (one wake-up and one parse for many replies) and saves the worker a system call a
    reply (measured: docs/performance.md). A reply is never held for long behind a slow request: a thread
    looks every `hold_s` and sends whatever has waited that long, so a reply leaves within 2 * `hold_s`
    even while a slow request runs. Only a request that holds the GIL in C code can delay the replies
    before it until it ends or its worker is killed; then those replies are lost with the worker, whose
    episodes all fail anyway, and the pool's hint names the request that ran (`wire.Progress`).

    The thread ticks on its own clock and is never woken per batch: waking it is a GIL hand-over that
    cost the serving thread 60-130 us each time (measured), more than a whole batch's replies save. It
    parks when a tick finds nothing added since the last one, and the next `add` wakes it.
    """

    def __init__(self, sock: socket.socket, hold_s: float = 0.02) -> None:
        self.sock, self.hold_s = sock, hold_s
        self.lock = threading.Lock()
        self.frames: list[bytes] = []
        self.since = 0.0  # when the oldest held frame was added
        self.added = False  # a frame was added since the thread's last tick
        self.parked = False  # the thread waits on `wake` (set by the next `add`)
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None
        self.ticks = 0  # how often the thread has looked (it must not follow the batches: tests)

    def add(self, frame: bytes) -> None:
        with self.lock:
            if not self.frames:
                self.since = time.monotonic()
            self.frames.append(frame)
            self.added = True
            wake, self.parked = self.parked, False
        if wake:
            self.wake.set()
        if self.thread is None:  # started on first use: after the lockdown, which allows threads
            self.thread = threading.Thread(target=self._send_stale, name="awm-reply-buffer", daemon=True)
            self.thread.start()

    def take(self) -> bytes:
        """Everything held, for the serving loop to send now."""
        with self.lock:
            data = b"".join(self.frames)
            self.frames.clear()
            return data

    def _send_stale(self) -> None:
        while True:
            with self.lock:
                self.ticks += 1
                if self.frames and time.monotonic() - self.since >= self.hold_s:
                    data = b"".join(self.frames)
                    try:
                        sent = self.sock.send(data)  # non-blocking: what does not fit waits for the loop
                    except BlockingIOError:
                        sent = 0
                    except OSError:
                        return  # the parent is gone; the serving loop finds out too
                    self.frames[:] = [data[sent:]] if sent < len(data) else []
                    self.since = time.monotonic()
                self.parked = not self.added and not self.frames
                self.added = False
                parked = self.parked
            if parked:
                self.wake.wait()
                self.wake.clear()
            time.sleep(self.hold_s)


async def serve(sock: socket.socket, config: dict[str, Any]) -> None:
    """Lock down, then read frames and answer each in order; return when the parent closes the socket.

    The socket is read and written with the loop's `sock_recv` / `sock_sendall`, which try the system
    call first and wait in the loop only when it would block. The requests of one read are served in
    order, each marked in the shared progress record as it starts, and their replies leave together.
    """
    loop = asyncio.get_running_loop()  # the event loop's own sockets exist now
    sock.setblocking(False)
    progress = wire.Progress(config["progress_fd"]) if "progress_fd" in config else None
    ignore_timer_signals()
    protections = lock_down(config)
    worker, buffer = Worker(config.get("dir"), config.get("direct_dispatch", True)), bytearray()
    worker.protections = protections
    replies = ReplyBuffer(sock)
    try:
        while data := await loop.sock_recv(sock, 1 << 16):
            buffer += data
            for req_id, op, payload in wire.decode_all(buffer, wire.REQUEST):
                if progress is not None:
                    progress.started(req_id)
                ok, result = await worker.handle(op, payload)
                try:
                    frame = wire.encode((req_id, ok, result))
                except ValueError as exc:  # over the cap, or not JSON: the call fails, the worker lives
                    frame = wire.encode((req_id, *unsendable(op, ok, str(exc))))
                replies.add(frame)
            if out := replies.take():
                await loop.sock_sendall(sock, out)
    except (ConnectionError, OSError):
        pass  # parent is gone
    finally:
        shutil.rmtree(worker.scratch, ignore_errors=True)


def main() -> None:
    logging.basicConfig(level=os.environ.get("AWM_LOG_LEVEL", "WARNING"))
    config = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {"lockdown": False}
    asyncio.run(serve(socket.socket(fileno=int(sys.argv[1])), config))


if __name__ == "__main__":
    main()

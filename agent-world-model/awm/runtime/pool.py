"""A pool of environment worker processes, seen from the caller's (asyncio) side.

Each worker (`awm.runtime.worker`) is a separate Python process with an allow-listed environment.
The pool talks to it over a socketpair registered with the running event loop: replies are
parsed in the loop itself and resolve the waiting futures directly (no helper threads, few
system calls per tool call). A watchdog task enforces per-request deadlines: a worker whose
current request overruns is killed (it may be stuck in generated code) and replaced at once.

Trust: a worker runs generated code, so nothing it writes decides a deadline or the blame that counts.
A worker serves its requests one at a time in the order sent, so the oldest unanswered request (the
head) started no later than the later of its sending and the last reply: its hard deadline is that
plus its timeout, computed from the pool's own clock (`_watch`). The worker's shared progress record
(`wire.Progress`) is a hint that can only make the kill earlier, and names which call of a batch
was running when its worker died (a call's blame has no consequence). A `load` (an import, whose
crashes count against its scenario) is sent only to an idle worker, and nothing else is sent until it
answers: a death during it has exactly one possible culprit. A reply must answer the head, once: any
other (a reply env code forges for a request not sent, or out of order) breaks the protocol and kills
the worker. Env code can still forge the reply to a request its worker was sent (it runs in that
process); that reaches only the episodes of that worker. Worker stdout and stderr come through a pipe
the pool drains into logging, at most `STDERR_BUDGET` bytes per `STDERR_WINDOW_S` per worker.

Placement: an episode goes to the worker minimising `open episodes + LOAD_PENALTY` (the
penalty applies where its scenario is not yet loaded), so a popular scenario spreads over
workers while a rare one stays in one place. Idle scenarios beyond `max_scenarios` per worker
are unloaded to bound memory.

The pool belongs to the event loop it was started in; use it from that loop only.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from awm.runtime import wire

log = logging.getLogger(__name__)

LOAD_PENALTY = 4
DATA_LIMIT_FACTOR = 4  # a worker's RLIMIT_DATA, in multiples of its memory ceiling (`memory_limit_bytes`)
MIN_DATA_LIMIT = 4 << 30  # and at least this: thread stacks (8 MiB each) count against RLIMIT_DATA too
STDERR_BUDGET = 64 << 10  # bytes of a worker's stdout/stderr forwarded to logging per window; the rest is dropped
STDERR_WINDOW_S = 10.0
ENV_ALLOWLIST = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "PYTHONPATH",
                 "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE", "VIRTUAL_ENV", "AWM_LOG_LEVEL")


class InfraError(RuntimeError):
    """The environment infrastructure failed; not the agent's fault, never a reward of 0.

    `culprit` is True on the request that was running when its worker died or overran (the worker
    serves one request at a time, so that request caused it); False on the bystanders: those queued
    behind it, and those of its batch whose replies died with the worker. For a `load` it is trusted (a
    load runs alone in its worker); for other requests it comes from the worker's progress hint.
    """

    culprit = False


class WorkerCrashed(InfraError):
    """The worker process serving this request or episode died."""


class ToolTimeout(InfraError):
    """A request overran its deadline; the worker was killed and replaced."""


class EnvLoadError(InfraError):
    """A scenario's environment code could not be loaded (names the scenario)."""


class WorkerRequestError(RuntimeError):
    """The worker answered a request with an error (bad episode id, bad op, ...)."""

    def __init__(self, info: dict[str, Any]) -> None:
        super().__init__(f"{info.get('type')}: {info.get('message')}")
        self.info = info


@dataclass
class _Pending:
    future: asyncio.Future
    op: str
    timeout_s: float
    submitted: float  # when it was handed to the worker's socket (or its outbox before it connected)
    exclusive: bool = False  # runs alone in its worker (a load): sent to an idle worker, nothing sent after it


@dataclass
class WorkerSlot:
    """One worker process and what the pool knows about it."""

    index: int
    generation: int = 0
    proc: subprocess.Popen | None = None
    transport: asyncio.Transport | None = None
    outbox: list[bytes] = field(default_factory=list)  # frames not written yet (one write per loop iteration)
    flush_scheduled: bool = False
    pending: OrderedDict[int, _Pending] = field(default_factory=OrderedDict)  # sent, in the order it serves them
    held: deque[tuple[int, bytes, _Pending]] = field(default_factory=deque)  # not sent: behind an exclusive one
    alone: bool = False  # an exclusive request is in flight: nothing else is sent until it is answered
    last_reply: float = 0.0  # when the worker last answered (or started): the head started no later
    progress: wire.Progress | None = None  # the worker's hint: which request runs, since when
    log: asyncio.BaseTransport | None = None  # the pipe of the worker's stdout and stderr
    loaded: OrderedDict[str, asyncio.Future] = field(default_factory=OrderedDict)  # scenario -> load (LRU)
    episodes: dict[str, str] = field(default_factory=dict)  # episode id -> scenario
    dead_reason: str = ""
    draining: bool = False  # past the memory ceiling: no new episodes, recycled when the last one closes


class _WorkerOutput(asyncio.Protocol):
    """A worker's stdout and stderr, forwarded to logging line by line, at most `STDERR_BUDGET` bytes per
    `STDERR_WINDOW_S`: env code that prints without end can neither fill the trainer's own stderr (an
    unread pipe would block it) nor its logs; a worker never blocks on it (the pool always reads)."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.window, self.forwarded, self.dropped = time.monotonic(), 0, 0

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        if now - self.window >= STDERR_WINDOW_S:
            self._report_dropped()
            self.window, self.forwarded = now, 0
        room = max(0, STDERR_BUDGET - self.forwarded)
        self.dropped += max(0, len(data) - room)
        data = data[:room]
        self.forwarded += len(data)
        for line in data.decode("utf-8", "replace").splitlines():
            if line.strip():
                log.warning("worker %d: %s", self.index, line)

    def _report_dropped(self) -> None:
        if self.dropped:
            log.warning("worker %d: %d bytes of its output dropped (over %d bytes per %.0f s)", self.index,
                        self.dropped, STDERR_BUDGET, STDERR_WINDOW_S)
            self.dropped = 0

    def connection_lost(self, exc: Exception | None) -> None:
        self._report_dropped()


class _WorkerProtocol(asyncio.Protocol):
    def __init__(self, pool: WorkerPool, slot: WorkerSlot, generation: int) -> None:
        self.pool, self.slot, self.generation = pool, slot, generation
        self.buffer = bytearray()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        try:
            replies = wire.decode_all(self.buffer, wire.REPLY)
        except wire.FrameError as exc:  # the worker's code wrote something that is not a reply: kill it
            self.buffer.clear()
            self.pool._on_death(self.slot, self.generation, f"worker {self.slot.index} broke the protocol ({exc})")
            return
        for req_id, ok, result in replies:
            self.pool._reply(self.slot, self.generation, req_id, ok, result)

    def connection_lost(self, exc: Exception | None) -> None:
        slot = self.slot
        self.pool._on_death(slot, self.generation,
                            f"worker {slot.index} (pid {slot.proc.pid if slot.proc else '?'}) exited")


def _fire_and_forget(fut: asyncio.Future) -> None:
    """Mark a future's exception as seen, so asyncio does not warn about it at garbage collection."""
    fut.add_done_callback(lambda f: f.cancelled() or f.exception())


def _fail(fut: asyncio.Future, exc: BaseException) -> None:
    """Fail a waiter, unless it is done or its event loop is gone (the pool closed at exit after the
    loop that awaited it ended: nobody can receive the error, and telling the loop would raise)."""
    if not fut.done() and not fut.get_loop().is_closed():
        fut.set_exception(exc)


def raise_open_file_limit() -> int:
    """Raise this process's soft open-file limit to its hard limit, before workers inherit it; returns the soft limit.

    Every open episode holds its SQLite DB open in a worker, and an MCP server a socket per session:
    under the common soft limit of 1,024, a rollout of 1,024 concurrent episodes fails with "unable to
    open database file" although the hard limit allows far more (SGLang raises its own limit likewise)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20  # Linux caps NOFILE at nr_open (2^20 by default)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("open-file limit stays at %d (%s): raise it (ulimit -n) for many concurrent episodes",
                           soft, exc)
    return soft


class WorkerPool:
    """Processes, request routing, deadlines, crash recovery and episode placement."""

    def __init__(self, num_workers: int | None = None, *, max_scenarios: int = 64,
                 scratch_dir: str | os.PathLike[str] | None = None, read_dirs: tuple[str, ...] = (),
                 lockdown: bool = True, memory_limit_bytes: int | None = 2 << 30,
                 direct_dispatch: bool = True) -> None:
        self.num_workers = num_workers or max(1, min(os.cpu_count() or 1, 8))
        self.scratch_dir = str(scratch_dir or tempfile.gettempdir())  # owner deletes it: killed workers can't
        self.read_dirs = tuple(str(d) for d in read_dirs)  # what workers may read besides Python itself
        self.lockdown = lockdown
        self.direct_dispatch = direct_dispatch  # False: every call over ASGI (awm.runtime.dispatch), to compare
        self.memory_limit_bytes = memory_limit_bytes  # peak RSS past which a worker is recycled between episodes
        # the hard cap: an allocation past it fails (MemoryError in the call) instead of growing the worker
        # until the machine's OOM killer picks a victim (workers volunteer first: oom_score_adj 1000)
        self.data_limit_bytes = memory_limit_bytes and max(DATA_LIMIT_FACTOR * memory_limit_bytes, MIN_DATA_LIMIT)
        self.recycles = 0
        self.max_scenarios = max_scenarios
        self._ids = itertools.count(1)
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watchdog: asyncio.Task | None = None
        self.restarts = 0
        self.slots = [WorkerSlot(i) for i in range(self.num_workers)]

    async def start(self) -> WorkerPool:
        """Spawn the workers; must run inside the event loop that will use the pool."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            raise_open_file_limit()
            for slot in self.slots:
                self._spawn(slot)
            self._watchdog = self._loop.create_task(self._watch())
        return self

    # ---- processes -------------------------------------------------------------------
    def worker_dir(self, slot: WorkerSlot) -> str:
        """The only directory worker `slot` may write: its episodes' DBs and snapshots live here."""
        return os.path.join(self.scratch_dir, f"worker-{slot.index}")

    def _spawn(self, slot: WorkerSlot) -> None:
        parent_sock, child_sock = socket.socketpair()
        if slot.progress is not None:
            slot.progress.close()
        slot.progress = wire.Progress.create()
        workdir = self.worker_dir(slot)
        os.makedirs(workdir, exist_ok=True)
        env = {k: os.environ[k] for k in ENV_ALLOWLIST if k in os.environ}
        env["PYTHONPATH"] = os.pathsep.join(p for p in [os.path.dirname(os.path.dirname(__file__)),
                                                        env.get("PYTHONPATH", "")] if p)
        env["TMPDIR"] = workdir  # SQLite's and tempfile's scratch files stay where the worker may write
        config = json.dumps({"dir": workdir, "read": self.read_dirs, "lockdown": self.lockdown,
                             "direct_dispatch": self.direct_dispatch, "progress_fd": slot.progress.fd,
                             "data_limit": self.data_limit_bytes})
        # cwd is the worker's dir: `-m` puts it first on sys.path, and sys.path entries are readable
        slot.proc = subprocess.Popen([sys.executable, "-m", "awm.runtime.worker", str(child_sock.fileno()), config],
                                     pass_fds=(child_sock.fileno(), slot.progress.fd), env=env, start_new_session=True,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     cwd=workdir)
        child_sock.close()
        parent_sock.setblocking(False)
        slot.pending, slot.held, slot.loaded, slot.episodes = OrderedDict(), deque(), OrderedDict(), {}
        slot.dead_reason, slot.transport, slot.outbox, slot.draining = "", None, [], False
        slot.flush_scheduled = slot.alone = False
        slot.last_reply = time.monotonic()
        self._loop.create_task(self._connect(slot, slot.generation, parent_sock, slot.proc.stdout))

    async def _connect(self, slot: WorkerSlot, generation: int, sock: socket.socket, output: Any) -> None:
        log_transport = None
        if not output.closed:  # closed with the pool before this ran: a transport on it would fail half-built
            try:
                log_transport, _ = await self._loop.connect_read_pipe(lambda: _WorkerOutput(slot.index), output)
            except (OSError, ValueError):  # the worker is gone already
                log_transport = None
        transport, _ = await self._loop.connect_accepted_socket(
            lambda: _WorkerProtocol(self, slot, generation), sock=sock)
        if slot.generation != generation:
            transport.abort()  # the output pipe is read on to its end, and closes itself there
            return
        slot.transport, slot.log = transport, log_transport
        for frame in slot.outbox:
            transport.write(frame)
        slot.outbox.clear()

    def _reply(self, slot: WorkerSlot, generation: int, req_id: int, ok: bool, result: Any) -> None:
        if slot.generation != generation:
            return
        head, item = slot.pending.popitem(last=False) if slot.pending else (None, None)
        if req_id != head:  # the worker answers in order, once: this reply was forged (or the worker is broken)
            if head is not None:  # put it back: it fails with the others
                slot.pending[head] = item
                slot.pending.move_to_end(head, last=False)
            expected = f"request {head}" if head is not None else "no reply"
            self._on_death(slot, generation, f"worker {slot.index} broke the protocol (a reply to request {req_id}, "
                           f"expected {expected})")
            return
        slot.last_reply = time.monotonic()
        slot.alone = False  # an exclusive request is the only one in flight: it was this one
        if not item.future.done():
            if ok:
                item.future.set_result(result)
            else:  # the worker's words: an error record, or whatever its code put there
                info = result if isinstance(result, dict) else {"type": "ProtocolError", "message": repr(result)[:300]}
                item.future.set_exception(WorkerRequestError(info))
        if not slot.pending and slot.held:
            self._release(slot)

    def _on_death(self, slot: WorkerSlot, generation: int, reason: str, exc_type: type = WorkerCrashed,
                  recycled: bool = False, culprit: int | None = None) -> None:
        """`culprit`: the request that overran (the watchdog knows); else the one that was running."""
        if slot.generation != generation:
            return
        self._kill(slot)
        if culprit is None and not (recycled or self._closed) and slot.pending:
            culprit = self._running(slot)[0]
        code = slot.proc.returncode if slot.proc else None
        if code is not None and not recycled:
            reason += f" (exit code {code})"
        if not self._closed and not recycled:
            log.warning("%s; %d requests and %d episodes fail as infrastructure errors", reason,
                        len(slot.pending) + len(slot.held), len(slot.episodes))
        pending = [*slot.pending.items(), *((req_id, item) for req_id, _, item in slot.held)]
        slot.held = deque()
        slot.generation += 1
        slot.dead_reason = reason
        for req_id, item in pending:
            exc = exc_type(f"{reason} during '{item.op}'")
            exc.culprit = req_id == culprit
            _fail(item.future, exc)
        for fut in slot.loaded.values():
            _fail(fut, exc_type(f"{reason} while loading"))
        if not self._closed:
            if recycled:
                self.recycles += 1
            else:
                self.restarts += 1
            self._spawn(slot)

    @staticmethod
    def _kill(slot: WorkerSlot) -> None:
        if slot.transport is not None:
            try:
                slot.transport.abort()
            except RuntimeError:  # the event loop is already closed: the socket goes with the process
                pass
        slot.log = None  # its output pipe is read on to its end (the dying words) and closes itself there
        if slot.proc is not None and slot.proc.poll() is None:
            try:
                os.killpg(slot.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            slot.proc.wait(timeout=10)

    @staticmethod
    def _running(slot: WorkerSlot) -> tuple[int, _Pending, float]:
        """The request `slot`'s worker most likely runs now, and its hard deadline (it has pending requests).

        Trusted: the head (the oldest unanswered request) started no later than the later of its sending
        and the worker's last reply, so it must end by then plus its timeout. The progress hint may name a
        later request of the batch (the head's reply may be held for the batch) or an earlier start: it is
        used only where its deadline is earlier. An exclusive head (a load) is alone: no hint applies."""
        head_id, head = next(iter(slot.pending.items()))
        deadline = max(slot.last_reply, head.submitted) + head.timeout_s
        if slot.progress is not None and not head.exclusive:
            req_id, started = slot.progress.running()
            item = slot.pending.get(req_id)
            if item is not None and max(started, item.submitted) + item.timeout_s < deadline:
                return req_id, item, max(started, item.submitted) + item.timeout_s
            if item is not None:  # the hint's request, with the trusted deadline (which is earlier)
                return req_id, item, deadline
        return head_id, head, deadline

    async def _watch(self) -> None:
        while not self._closed:
            await asyncio.sleep(0.05)
            now = time.monotonic()
            for slot in self.slots:
                if not slot.pending or slot.transport is None:
                    continue
                req_id, item, deadline = self._running(slot)
                if now > deadline:
                    self._on_death(slot, slot.generation, f"worker {slot.index}: '{item.op}' exceeded "
                                   f"{item.timeout_s:.1f} s; worker killed and replaced", ToolTimeout,
                                   culprit=req_id)

    # ---- requests --------------------------------------------------------------------
    def submit(self, slot: WorkerSlot, op: str, payload: dict[str, Any], timeout_s: float,
               generation: int | None = None, exclusive: bool = False) -> asyncio.Future:
        """Send one request; the future fails with an InfraError if the worker dies first.

        `exclusive`: run it alone in the worker (see the module docstring): it waits until the worker has
        answered everything sent before it, and what is submitted after it waits until it is answered."""
        if self._loop is None or self._closed:
            raise RuntimeError("the worker pool is not running: `await pool.start()` first (and do not use it "
                               "after close())")
        if asyncio.get_running_loop() is not self._loop:
            raise RuntimeError("the worker pool belongs to another event loop: create one EnvRuntime per loop")
        fut = self._loop.create_future()
        if generation is not None and generation != slot.generation:
            fut.set_exception(WorkerCrashed(slot.dead_reason or f"worker {slot.index} was replaced"))
            return fut
        req_id = next(self._ids)
        try:
            frame = wire.encode((req_id, op, payload))
        except ValueError as exc:  # arguments JSON cannot carry: this request fails, nothing else
            fut.set_exception(WorkerRequestError({"type": "ValueError", "message": str(exc)}))
            return fut
        item = _Pending(fut, op, timeout_s, 0.0, exclusive)
        if slot.held or slot.alone or (exclusive and slot.pending):
            slot.held.append((req_id, frame, item))  # sent by `_release` once the worker is idle
            return fut
        idle = not slot.pending
        slot.alone = exclusive
        item.submitted = time.monotonic()
        slot.pending[req_id] = item
        slot.outbox.append(frame)
        if slot.transport is None:
            pass  # `_connect` writes the outbox
        elif idle and not slot.flush_scheduled:
            self._flush(slot, slot.generation)  # the worker waits for it: no reason to wait for more
        elif not slot.flush_scheduled:
            slot.flush_scheduled = True  # the worker is busy: frames of this loop iteration go in one write
            self._loop.call_soon(self._flush, slot, slot.generation)
        return fut

    def _release(self, slot: WorkerSlot) -> None:
        """The worker is idle: send what was held, an exclusive request alone or the requests before the next."""
        now = time.monotonic()
        while slot.held and not slot.alone and not (slot.pending and slot.held[0][2].exclusive):
            req_id, frame, item = slot.held.popleft()
            item.submitted = now
            slot.alone = item.exclusive
            slot.pending[req_id] = item
            slot.outbox.append(frame)
        if slot.transport is not None:
            self._flush(slot, slot.generation)

    @staticmethod
    def _flush(slot: WorkerSlot, generation: int) -> None:
        """Write the frames queued for `slot` at once: one system call, and one read in the worker, for all the
        episodes whose next call became ready in the same loop iteration (replies often arrive together)."""
        if slot.generation != generation:
            return  # the worker died since: its frames went with it, and the new one has its own outbox
        slot.flush_scheduled = False
        if slot.transport is not None and slot.outbox:
            slot.transport.write(b"".join(slot.outbox))
            slot.outbox.clear()

    async def request(self, slot: WorkerSlot, op: str, payload: dict[str, Any], timeout_s: float,
                      generation: int | None = None) -> Any:
        return await self.submit(slot, op, payload, timeout_s, generation)

    # ---- placement -------------------------------------------------------------------
    def place(self, scenario: str) -> WorkerSlot:
        """Pick the worker for a new episode of `scenario` (see module docstring); draining ones last."""
        return min(self.slots, key=lambda s: (s.draining, len(s.episodes) +
                                              (0 if scenario in s.loaded else LOAD_PENALTY), s.index))

    def episode_closed(self, slot: WorkerSlot, generation: int, max_rss_bytes: int) -> None:
        """Called after an episode of `slot` closed: a worker whose peak memory passed the ceiling takes
        no new episodes and is replaced by a fresh process once its last episode is gone (a leak in
        generated code is bounded without failing anyone's episode)."""
        if generation != slot.generation:
            return
        if self.memory_limit_bytes and max_rss_bytes > self.memory_limit_bytes:
            slot.draining = True
        if slot.draining and not slot.episodes and not slot.pending and not self._closed:
            log.info("worker %d recycled: peak memory %.0f MB > %.0f MB", slot.index, max_rss_bytes / 2**20,
                     self.memory_limit_bytes / 2**20)
            self._on_death(slot, generation, f"worker {slot.index} recycled (memory ceiling)", recycled=True)

    def ensure_loaded(self, slot: WorkerSlot, scenario: str, code: str, template: str, timeout_s: float,
                      tools: list[dict[str, Any]] | None = None) -> asyncio.Future:
        """The load future of `scenario` in `slot` (shared by concurrent callers)."""
        fut = slot.loaded.get(scenario)
        if fut is not None and not (fut.done() and fut.exception() is not None):
            slot.loaded.move_to_end(scenario)
            return fut
        fut = self.submit(slot, "load", {"scenario": scenario, "code": code, "template": template, "tools": tools},
                          timeout_s, exclusive=True)  # alone: a crash or hang during an import has one culprit
        _fire_and_forget(fut)  # awaited by whoever opens an episode; a failure nobody awaits is not news
        slot.loaded[scenario] = fut
        self._evict_idle(slot)
        return fut

    def _evict_idle(self, slot: WorkerSlot) -> None:
        busy = set(slot.episodes.values())
        for name in list(slot.loaded):
            if len(slot.loaded) <= self.max_scenarios:
                break
            if name not in busy and slot.loaded[name].done():
                del slot.loaded[name]
                _fire_and_forget(self.submit(slot, "unload", {"scenario": name}, 30.0))

    # ---- lifecycle -------------------------------------------------------------------
    def kill_worker(self, slot: WorkerSlot, reason: str) -> None:
        """Kill `slot`'s worker now (what it sent shows generated code wrote in its name) and replace it; its
        requests and episodes fail as infrastructure errors."""
        self._on_death(slot, slot.generation, reason)

    def crash_worker(self, index: int) -> None:
        """Test hook: make a worker die abruptly."""
        _fire_and_forget(self.submit(self.slots[index], "crash", {}, 5.0))

    def close(self) -> None:
        """Kill every worker; pending requests fail with WorkerCrashed."""
        if self._closed:
            return
        self._closed = True
        if self._watchdog is not None and not self._watchdog.get_loop().is_closed():
            self._watchdog.cancel()
        for slot in self.slots:
            output = slot.log
            self._on_death(slot, slot.generation, "the worker pool was closed")
            try:
                if output is not None:
                    output.close()
            except RuntimeError:  # its event loop is closed: close the pipe itself
                pass
            if slot.proc is not None and slot.proc.stdout is not None and (output is None or output.is_closing()):
                slot.proc.stdout.close()
            if slot.progress is not None:
                slot.progress.close()
                slot.progress = None

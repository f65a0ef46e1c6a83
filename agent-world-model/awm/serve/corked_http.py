"""uvicorn's HTTP protocol with the writes of one event-loop turn sent as one: one send() per reply.

uvicorn writes a reply's status line and headers, then its body, as two `transport.write` calls:
two send() syscalls and two wake-ups of the client per reply. Holding the bytes until the end of
the current loop turn (`call_soon`) puts head and body, written in the same turn, into one send();
nothing waits longer than that turn. Measured on the shared 2-core machine (16 keep-alive clients
on /health, three alternating rounds): server CPU per request 0.13-0.18 ms -> 0.11-0.13 ms (system
time 0.02-0.03 -> 0.006-0.009 ms), and in every round more requests per second.

The protocol underneath is uvicorn's httptools one (a C parser; pinned in requirements-cpu.txt),
else its pure-Python h11 one: on tools/call, httptools took the server's main process from
0.79-0.94 to 0.69-0.70 ms of CPU per call (three alternating rounds, same machine).

Read limits (`guarded_protocol`): uvicorn bounds only the idle time between two requests of a
keep-alive connection (`timeout_keep_alive`) and, for h11 alone, the head size
(`h11_max_incomplete_event_size`); a client sending a head or a body a byte at a time, or nothing
after connecting, held its connection for ever (300 such held the server, 2026-11-28). Its
`limit_concurrency` would not help: it answers 503 to every new request while the slow connections
hold their places. So the protocol here gives each request head `header_timeout_s` from its first
byte (or from the connection's opening) and each body `body_timeout_s` from the end of its head,
answers 408 past them and closes; a head still incomplete past `max_head_bytes` gets 431. At most
`max_pending_connections` connections may stay reading a head or body for longer than a grace of
min(1 s, header timeout / 2): past the cap the oldest are closed (503), so slow clients cannot crowd
out fast ones, whose heads take microseconds; the grace keeps a burst of fresh connections (all
opened in one loop turn, none read yet) from closing each other. One sweep timer per server checks
the deadlines; a request costs a few dict operations and a clock read (about 1 us), no timer.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any, ClassVar

from awm.serve.limits import ServerLimits

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Protocol
except ImportError:  # httptools not installed: uvicorn's pure-Python parser
    from uvicorn.protocols.http.h11_impl import H11Protocol as _Protocol

log = logging.getLogger(__name__)


class CorkedTransport:
    """A transport whose writes of one loop turn leave together; everything else is the wrapped one's."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._pending: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._pending:
            asyncio.get_running_loop().call_soon(self.flush)
        self._pending.append(bytes(data))

    def flush(self) -> None:
        if not self._pending:
            return
        data = b"".join(self._pending)
        self._pending.clear()
        if not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CorkedHttpProtocol(_Protocol):  # type: ignore[misc,valid-type]
    """uvicorn's HTTP protocol on a CorkedTransport: pass the class as uvicorn.Config(http=...)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CorkedTransport(transport))  # type: ignore[arg-type]


_HEAD, _BODY = "header", "body"  # what a pending connection is still sending


def _reply(status: str, text: str) -> bytes:
    body = text.encode()
    return (f"HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {len(body)}\r\n"
            f"connection: close\r\n\r\n").encode() + body


class ReadGuard:
    """One server's connections that are still sending a request head or body, oldest first, with deadlines."""

    def __init__(self, limits: ServerLimits) -> None:
        self.limits = limits
        self.pending: dict[GuardedHttpProtocol, tuple[float, float]] = {}  # connection -> (since, deadline)
        self.dropped: Counter[str] = Counter()  # why connections were closed: header_timeout, body_timeout, ...
        self._sweep_at: asyncio.TimerHandle | None = None
        self.interval = max(0.05, min(1.0, limits.header_timeout_s / 4, limits.body_timeout_s / 4))
        self.grace_s = min(1.0, limits.header_timeout_s / 2)  # younger pending connections are never evicted

    def begin(self, conn: GuardedHttpProtocol, timeout_s: float) -> None:
        pending, now = self.pending, conn.loop.time()
        pending.pop(conn, None)
        if len(pending) >= self.limits.max_pending_connections:
            self._evict(now, self.limits.max_pending_connections - 1)  # room for this one
        pending[conn] = (now, now + timeout_s)
        if self._sweep_at is None:
            self._sweep_at = conn.loop.call_later(self.interval, self._sweep, conn.loop)

    def _evict(self, now: float, keep: int) -> None:
        """Close the connections that have been sending longest until `keep` are left (past the grace only)."""
        pending = self.pending
        while len(pending) > keep:
            oldest = next(iter(pending))
            if now - pending[oldest][0] < self.grace_s:
                return
            oldest.drop("evicted")

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        self._sweep_at = None
        now = loop.time()
        for conn, (_, deadline) in list(self.pending.items()):
            if deadline <= now:
                conn.drop(f"{conn.phase}_timeout")
        if len(self.pending) > self.limits.max_pending_connections:
            self._evict(now, self.limits.max_pending_connections)
        if self.pending:
            self._sweep_at = loop.call_later(self.interval, self._sweep, loop)


class GuardedHttpProtocol(CorkedHttpProtocol):
    """CorkedHttpProtocol with head and body deadlines and a cap on slow connections: make one per
    server with `guarded_protocol(limits)` (the class holds that server's ReadGuard)."""

    guard: ClassVar[ReadGuard]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_cycle: Any = None
        self._head_bytes = 0
        self.phase: str | None = None
        self._begin_head()  # a connection that sends nothing has a head deadline too

    def _begin_head(self) -> None:
        self.phase, self._head_cycle, self._head_bytes = _HEAD, self.cycle, 0
        self.guard.begin(self, self.guard.limits.header_timeout_s)

    def _end(self) -> None:
        self.phase = None
        self.guard.pending.pop(self, None)

    def data_received(self, data: bytes) -> None:
        if self.phase is None:
            cycle = self.cycle
            if cycle is None or cycle.response_complete:  # these bytes start the next request's head
                self._begin_head()
        super().data_received(data)
        phase = self.phase
        if phase is None:
            return
        cycle = self.cycle
        if phase is _HEAD:
            if cycle is self._head_cycle:  # the head is not complete yet
                self._head_bytes += len(data)
                if self._head_bytes > self.guard.limits.max_head_bytes and not self.transport.is_closing():
                    self.drop("head_too_large")
                return
            if cycle.more_body and not cycle.response_complete:
                self.phase = _BODY
                self.guard.begin(self, self.guard.limits.body_timeout_s)
                return
            self._end()
        elif not cycle.more_body or cycle.response_complete:
            self._end()

    def drop(self, reason: str) -> None:
        """Close this connection, telling the client why unless part of a reply is already on the wire."""
        limits = self.guard.limits
        self._end()
        self.guard.dropped[reason] += 1
        log.info("MCP server: closing a connection from %s: %s", self.client, reason)
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is None or cycle.response_complete or not cycle.response_started:
            if reason == "head_too_large":
                self.transport.write(_reply("431 Request Header Fields Too Large",
                                            f"request head over {limits.max_head_bytes} bytes\n"))
            elif reason == "evicted":
                self.transport.write(_reply("503 Service Unavailable",
                                            f"closed to make room: over {limits.max_pending_connections} "
                                            "connections were sending requests slowly; send the request at once\n"))
            else:
                head = reason == "header_timeout"
                timeout = limits.header_timeout_s if head else limits.body_timeout_s
                self.transport.write(_reply("408 Request Timeout",
                                            f"request {'head' if head else 'body'} not received within "
                                            f"{timeout:g} s: send each request whole and at once\n"))
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._end()
        super().connection_lost(exc)


def guarded_protocol(limits: ServerLimits) -> type[GuardedHttpProtocol]:
    """A protocol class for one server (pass it as uvicorn.Config(http=...)) enforcing `limits`' read limits."""
    return type("GuardedHttpProtocol", (GuardedHttpProtocol,), {"guard": ReadGuard(limits)})

"""Keep-alive HTTP/1.1 connections on asyncio streams: the transport under the rollout's MCP client.

Why not httpx: on the 2-core machine httpx's AsyncClient spends about 2 ms of client CPU per small
POST to an `awm env start` server, more than the server spends answering it (~0.8 ms); a request
written and parsed here by hand costs about 0.1 ms. Only what MCP over HTTP needs is here:

- one request at a time per connection; idle connections are reused (LIFO) per origin;
- response bodies framed by Content-Length, chunked transfer coding, or the connection's end;
- a per-request deadline (the connection is dropped when it passes: its state is unknown);
- a reused connection that the server closed while idle (EOF or reset before any byte of the reply)
  is retried once on a fresh one; a fresh connection's failure is never retried.

    pool = HttpPool()
    origin = Origin.parse("http://127.0.0.1:8001")
    reply = await pool.request(origin, "POST", "/mcp", {"content-type": "application/json"}, body, 30.0)
    async with asyncio.timeout(30.0), pool.stream(origin, "POST", "/mcp", headers, body) as reply:
        async for chunk in reply.chunks(): ...     # the body as it arrives
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

IDLE_REUSE_S = 4.0  # below uvicorn's 5 s keep-alive timeout: older idle connections are not reused
MAX_IDLE_PER_ORIGIN = 256
MAX_HEAD_BYTES = 64 * 1024  # the StreamReader's default limit: a longer status line + headers is refused


class HttpError(RuntimeError):
    """The request did not get a well-formed reply: connection refused or lost, deadline, bad framing."""


@dataclass(frozen=True)
class Origin:
    """Where requests go: scheme, host, port, and the Host header and path prefix that follow from them."""

    scheme: str
    host: str
    port: int
    prefix: str = ""  # the base URL's path, without its trailing slash

    @classmethod
    def parse(cls, url: str) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url!r} is not an http(s) URL: use e.g. http://127.0.0.1:8001")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    @functools.cached_property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host_header}{self.prefix}"


@dataclass
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    idle_since: float = 0.0
    reused: bool = False

    def usable(self, now: float) -> bool:
        return (not self.reader.at_eof() and not self.writer.is_closing()
                and now - self.idle_since < IDLE_REUSE_S)

    def close(self) -> None:
        self.writer.close()


@dataclass
class Response:
    """A reply whose head has been read; its body is read through `chunks()` or `read()`."""

    status: int
    headers: dict[str, str]  # lower-case names; repeated fields joined with ", "
    _conn: _Connection
    _length: int | None  # None: chunked if `_chunked`, else up to the connection's end
    _chunked: bool
    _keep_alive: bool
    done: bool = False
    body: bytes = b""  # set by read()

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (Content-Length, chunked, or until the connection ends)."""
        reader = self._conn.reader
        try:
            if self._chunked:
                while True:
                    size_line = await reader.readuntil(b"\r\n")
                    size = int(size_line.split(b";", 1)[0], 16)
                    if size == 0:
                        while await reader.readuntil(b"\r\n") != b"\r\n":  # trailer fields, ignored
                            pass
                        break
                    data = await reader.readexactly(size + 2)
                    yield data[:-2]
            elif self._length is not None:
                if self._length:
                    yield await reader.readexactly(self._length)
            else:
                while data := await reader.read(65536):
                    yield data
                self._keep_alive = False
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, OSError) as exc:
            raise HttpError(f"reading the body of an HTTP {self.status} reply: {type(exc).__name__}: {exc}") from exc
        self.done = True

    async def read(self) -> bytes:
        """The whole body (also kept in `.body`)."""
        self.body = b"".join([chunk async for chunk in self.chunks()])
        return self.body


class HttpPool:
    """Idle keep-alive connections per origin, for the event loop that uses them (streams are loop-bound)."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        """`tls`: the context for https origins (default: the system's trust store, hostnames checked)."""
        self._idle: dict[Origin, list[_Connection]] = {}
        self._tls = tls
        self.closed = False

    async def request(self, origin: Origin, method: str, path: str, headers: Mapping[str, str],
                      body: bytes, timeout_s: float) -> Response:
        """Send one request and read its whole reply (into `.body`) within one deadline."""
        try:
            async with asyncio.timeout(timeout_s), self.stream(origin, method, path, headers, body) as reply:
                await reply.read()
        except TimeoutError:
            raise HttpError(f"{method} {origin.url}{path}: no reply within {timeout_s:g} s") from None
        return reply

    @contextlib.asynccontextmanager
    async def stream(self, origin: Origin, method: str, path: str, headers: Mapping[str, str],
                     body: bytes) -> AsyncIterator[Response]:
        """Send one request and yield its reply once the head is in; the body is the caller's to read.

        No deadline of its own: wrap it in `asyncio.timeout`. The connection goes back to the pool
        only if the body was read to its end; otherwise (a caller that stopped early, an error, a
        deadline) it is closed.
        """
        head = _request_head(origin, method, path, headers, len(body))
        reply = await self._send(origin, head + body if body else head, method)
        try:
            yield reply
        except BaseException:
            reply._conn.close()
            raise
        if reply.done and reply._keep_alive:
            self._release(origin, reply._conn)
        else:
            reply._conn.close()

    async def _send(self, origin: Origin, data: bytes, method: str) -> Response:
        conn = self._take(origin) or await self._connect(origin)
        while True:
            try:
                try:
                    conn.writer.write(data)
                    await conn.writer.drain()
                except OSError as exc:
                    raise _ClosedBeforeReply(f"{type(exc).__name__}: {exc}") from None
                return await _read_head(conn, method)
            except _ClosedBeforeReply as exc:
                conn.close()
                if not conn.reused:
                    raise HttpError(f"{method} {origin.url}: the server closed the connection without "
                                    f"replying ({exc})") from None
            except BaseException:
                conn.close()
                raise
            conn = await self._connect(origin)  # the server had closed the idle connection: once, afresh

    def _take(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.usable(now):
                conn.reused = True
                return conn
            conn.close()
        return None

    async def _connect(self, origin: Origin) -> _Connection:
        if self.closed:
            raise HttpError("this HTTP pool is closed")
        tls = None
        if origin.scheme == "https":
            tls = self._tls = self._tls or ssl.create_default_context()
        try:
            reader, writer = await asyncio.open_connection(origin.host, origin.port, ssl=tls, limit=MAX_HEAD_BYTES)
        except OSError as exc:
            raise HttpError(f"cannot connect to {origin.url}: {type(exc).__name__}: {exc}") from exc
        return _Connection(reader, writer)

    def _release(self, origin: Origin, conn: _Connection) -> None:
        idle = self._idle.setdefault(origin, [])
        if self.closed or len(idle) >= MAX_IDLE_PER_ORIGIN:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    @property
    def idle(self) -> int:
        """Idle connections kept for reuse, all origins together."""
        return sum(len(conns) for conns in self._idle.values())

    def close(self) -> None:
        """Close every idle connection; connections in use close when their request ends."""
        self.closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # a closed loop cannot close transports: they close when collected
            self.close()


class _ClosedBeforeReply(Exception):
    """The connection ended before the first byte of a reply (a reused one may be retried)."""


def _request_head(origin: Origin, method: str, path: str, headers: Mapping[str, str], length: int) -> bytes:
    lines = [f"{method} {origin.prefix}{path} HTTP/1.1", f"host: {origin.host_header}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if length or method in ("POST", "PUT", "PATCH"):
        lines.append(f"content-length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _read_head(conn: _Connection, method: str) -> Response:
    """Read a reply's status line and headers (skipping 1xx interim replies) and decide its framing."""
    while True:
        try:
            raw = await conn.reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                raise _ClosedBeforeReply("EOF") from None
            raise HttpError(f"the connection ended inside a reply's head: {exc.partial[:80]!r}") from None
        except asyncio.LimitOverrunError:
            raise HttpError(f"a reply's head is longer than {MAX_HEAD_BYTES} bytes") from None
        except ConnectionResetError:
            raise _ClosedBeforeReply("connection reset") from None
        except OSError as exc:
            raise HttpError(f"reading a reply: {type(exc).__name__}: {exc}") from exc
        lines = raw.decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        try:
            status = int(rest[:3])
        except ValueError:
            raise HttpError(f"not an HTTP reply: {lines[0][:80]!r}") from None
        if not version.startswith("HTTP/1."):
            raise HttpError(f"not an HTTP/1.x reply: {lines[0][:80]!r}")
        if not 100 <= status < 200:
            break
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            name, value = name.strip().lower(), value.strip()
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
    keep_alive = "close" not in headers.get("connection", "").lower() and version != "HTTP/1.0"
    chunked = "chunked" in headers.get("transfer-encoding", "").lower()
    length: int | None = None
    if method == "HEAD" or status in (204, 304):
        length = 0
    elif not chunked and "content-length" in headers:
        try:
            length = int(headers["content-length"])
        except ValueError:
            raise HttpError(f"bad Content-Length {headers['content-length']!r}") from None
    return Response(status, headers, conn, length, chunked, keep_alive)

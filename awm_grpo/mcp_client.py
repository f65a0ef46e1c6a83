"""A lean MCP client (streamable HTTP, JSON-RPC 2.0): the rollout's hot path to `awm env start` servers.

The official `mcp` client runs each session as a task group of memory streams and validates every
message through pydantic models: about 1.2-1.5 ms of client CPU per tools/call on the 2-core
machine, more than the server's own cost. This client speaks the same protocol directly on a
pooled keep-alive connection (`awm_grpo.http_pool`); tests/awm_grpo/test_mcp_client.py checks its
requests and the server's replies against the official package's models (`mcp_types`).

What it does of the MCP streamable-HTTP transport (spec revision 2025-11-25, also 2025-06-18 and
2025-03-26):

    initialize  -> result, Mcp-Session-Id header     (the server picks the protocol version it speaks)
    notifications/initialized                       -> 202
    tools/list, tools/call  (+ Mcp-Session-Id, MCP-Protocol-Version headers)
    DELETE on close                                  (ends the session; a 405 means the server keeps it)

A POST may be answered with one JSON body (application/json) or a stream of server-sent events
(text/event-stream) that carries the reply among notifications; both are read. A JSON-RPC error
raises `McpRpcError`; a tool that fails returns a result with `isError` (the caller's observation).
Everything else that goes wrong (connection, deadline, HTTP status, malformed reply) is an `McpError`.
"""

from __future__ import annotations

import asyncio
import codecs
import itertools
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import orjson

from awm_grpo.http_pool import HttpError, HttpPool, Origin

# The handshake revisions with the streamable-HTTP transport, newest first: the first is offered.
PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26")
CLIENT_INFO = {"name": "awm-grpo", "version": "1"}
_ACCEPT = "application/json, text/event-stream"


class McpError(RuntimeError):
    """The session or its transport failed: no usable reply (an infrastructure failure for a rollout)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class McpAuthError(McpError):
    """HTTP 401: the server wants a bearer token, or a different one."""


class McpRpcError(McpError):
    """A JSON-RPC error reply: {code, message, data}."""

    def __init__(self, method: str, error: dict[str, Any], status: int | None = None) -> None:
        self.code, self.message, self.data = error.get("code"), str(error.get("message", "")), error.get("data")
        super().__init__(f"{method}: JSON-RPC error {self.code}: {self.message}"
                         + (f" ({self.data})" if self.data is not None else ""), status)


class McpSession:
    """One MCP session on one endpoint URL; `open()` does the handshake, `close()` ends it on the server."""

    def __init__(self, http: HttpPool, url: str, *, token: str | None = None, timeout_s: float = 30.0) -> None:
        self.http = http
        parts = urlsplit(url)
        self.origin = Origin.parse(f"{parts.scheme}://{parts.netloc}")
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.url = url
        self.timeout_s = timeout_s
        self.session_id: str | None = None
        self.protocol_version: str | None = None
        self.server_info: dict[str, Any] = {}
        self._ids = itertools.count(1)
        self._headers = {"content-type": "application/json", "accept": _ACCEPT}
        if token:
            self._headers["authorization"] = f"Bearer {token}"

    async def open(self) -> dict[str, Any]:
        """initialize + notifications/initialized; returns the server's InitializeResult."""
        result = await self.request("initialize", {"protocolVersion": PROTOCOL_VERSIONS[0], "capabilities": {},
                                                   "clientInfo": CLIENT_INFO})
        version = result.get("protocolVersion")
        if version not in PROTOCOL_VERSIONS:
            await self.close()
            raise McpError(f"{self.url}: the server speaks MCP protocol {version!r}; this client speaks "
                           f"{list(PROTOCOL_VERSIONS)}")
        self.protocol_version = version
        self.server_info = result.get("serverInfo", {})
        self._headers["mcp-protocol-version"] = version
        await self.notify("notifications/initialized")
        return result

    async def list_tools(self) -> list[dict[str, Any]]:
        """Every tool ({name, description, inputSchema, ...}), following `nextCursor` pages."""
        tools: list[dict[str, Any]] = []
        params: dict[str, Any] = {}
        while True:
            page = await self.request("tools/list", params or None)
            tools += page.get("tools", [])
            if not page.get("nextCursor"):
                return tools
            params = {"cursor": page["nextCursor"]}

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """The CallToolResult as sent: {content: [...], isError?, structuredContent?, _meta?}."""
        return await self.request("tools/call", {"name": name, "arguments": arguments})

    async def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """One JSON-RPC request; its result, or McpRpcError / McpError."""
        request_id = next(self._ids)
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        try:
            async with asyncio.timeout(self.timeout_s), \
                    self.http.stream(self.origin, "POST", self.path, self._headers, orjson.dumps(message)) as reply:
                self._check_status(method, reply.status, reply.headers)
                kind = reply.headers.get("content-type", "").split(";", 1)[0].strip().lower()
                if kind == "text/event-stream":
                    answer = await _reply_in_events(reply.chunks(), request_id)
                    if answer is None:
                        raise McpError(f"{method} at {self.url}: the event stream ended without a reply")
                else:
                    body = await reply.read()
                    try:
                        answer = _parse(body, method, self.url)
                    except McpError:
                        if reply.status < 400:
                            raise
                        answer = {}
                    if reply.status >= 400 and not isinstance(answer.get("error"), dict):
                        raise McpError(f"{method} at {self.url}: HTTP {reply.status}: {body[:300]!r}", reply.status)
        except TimeoutError:
            raise McpError(f"{method} at {self.url}: no reply within {self.timeout_s:g} s") from None
        except HttpError as exc:
            raise McpError(f"{method} at {self.url}: {exc}") from exc
        if "mcp-session-id" in reply.headers and method == "initialize":
            self.session_id = reply.headers["mcp-session-id"]
            self._headers["mcp-session-id"] = self.session_id
        if isinstance(answer.get("error"), dict):
            raise McpRpcError(method, answer["error"], reply.status)
        if answer.get("id") != request_id or not isinstance(answer.get("result"), dict):
            raise McpError(f"{method} at {self.url}: not a reply to request {request_id}: {str(answer)[:300]}")
        return answer["result"]

    async def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        """One JSON-RPC notification (no reply expected: the server answers 202)."""
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        try:
            reply = await self.http.request(self.origin, "POST", self.path, self._headers, orjson.dumps(message),
                                            self.timeout_s)
        except HttpError as exc:
            raise McpError(f"{method} at {self.url}: {exc}") from exc
        self._check_status(method, reply.status, reply.headers)
        if reply.status not in (200, 202):
            raise McpError(f"{method} at {self.url}: HTTP {reply.status}: {reply.body[:300]!r}", reply.status)

    async def close(self) -> None:
        """End the session on the server (DELETE); a server that is gone has ended it already."""
        if self.session_id is None:
            return
        session_id, self.session_id = self.session_id, None
        try:
            reply = await self.http.request(self.origin, "DELETE", self.path, self._headers, b"", self.timeout_s)
        except HttpError as exc:
            raise McpError(f"ending MCP session {session_id} at {self.url}: {exc}") from exc
        if reply.status not in (200, 202, 204, 404, 405):
            raise McpError(f"ending MCP session {session_id} at {self.url}: HTTP {reply.status}", reply.status)

    def _check_status(self, method: str, status: int, headers: dict[str, str]) -> None:
        if status == 401:
            raise McpAuthError(f"{method} at {self.url}: HTTP 401, the server wants a bearer token "
                               f"({headers.get('www-authenticate', 'Bearer')})", status)
        if status == 404 and self.session_id is not None:
            raise McpError(f"{method} at {self.url}: MCP session {self.session_id} is unknown to the server "
                           "(it restarted, or the session expired): start a new session", status)


def _parse(body: bytes, method: str, url: str) -> dict[str, Any]:
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise McpError(f"{method} at {url}: the reply is not JSON: {body[:300]!r}") from None
    if not isinstance(message, dict):
        raise McpError(f"{method} at {url}: the reply is not one JSON-RPC message: {body[:300]!r}")
    return message


async def _reply_in_events(chunks: AsyncIterator[bytes], request_id: int) -> dict[str, Any] | None:
    """The JSON-RPC reply to `request_id` among a stream's server-sent events (others are skipped).

    SSE framing: events end at a blank line; `data:` lines (one leading space dropped) join with
    newlines; `event:`, `id:`, `retry:` and `:` comment lines carry nothing needed here.
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # as the SSE spec decodes
    buffer, data = "", []
    async for chunk in chunks:
        buffer += decoder.decode(chunk)
        held = "\r" if buffer.endswith("\r") else ""  # maybe the first half of a CRLF: wait for the next chunk
        *lines, buffer = buffer[:len(buffer) - len(held)].replace("\r\n", "\n").replace("\r", "\n").split("\n")
        buffer += held
        for line in lines:
            if line:
                if line.startswith("data:"):
                    data.append(line[6:] if line.startswith("data: ") else line[5:])
                continue
            if data:  # a blank line dispatches the event
                try:
                    message = orjson.loads("\n".join(data))
                except orjson.JSONDecodeError:
                    message = None
                data = []
                if isinstance(message, dict) and message.get("id") == request_id and "method" not in message:
                    return message
    return None

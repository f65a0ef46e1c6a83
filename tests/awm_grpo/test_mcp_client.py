"""The rollout's lean MCP client against real servers on 127.0.0.1, checked with the official package's models.

The project's server (awm.serve.mcp_server.serve, bundled data, project_tracker_1 by default: issue 7
carries only the label 'bug', and label 6 is 'regression') answers in JSON; the official SDK's own
server in SSE mode (json_response=False) answers in event streams. Every request the lean client
sends and every JSON reply it reads is validated with `mcp_types` (the `mcp` package's models), so
the protocol is checked against the real library, not against a helper of ours on both ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import mcp_types
import pytest
import uvicorn
from awm.episode import EnvRuntime
from awm.serve.limits import TOKEN_ENV
from awm.serve.mcp_server import serve
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp_types.jsonrpc import jsonrpc_message_adapter
from mcp_types.methods import validate_client_notification, validate_client_request
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.applications import Starlette
from starlette.routing import Mount

from awm_grpo.env_client import EnvInfraError, McpEnv
from awm_grpo.http_pool import HttpPool, Origin
from awm_grpo.mcp_client import PROTOCOL_VERSIONS, McpAuthError, McpError, McpRpcError, McpSession

SCENARIO = "project_tracker_1"


class RecordingPool(HttpPool):
    """A real pool that also keeps what went out (method, headers, body) and the JSON bodies that came back."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, dict[str, str], bytes]] = []
        self.received: list[tuple[int, dict[str, str], bytes]] = []

    @contextlib.asynccontextmanager
    async def stream(self, origin: Origin, method: str, path: str, headers: Any, body: bytes) -> AsyncIterator[Any]:
        self.sent.append((method, dict(headers), body))
        async with super().stream(origin, method, path, headers, body) as reply:
            yield reply
        self.received.append((reply.status, reply.headers, reply.body))


class Served:
    """A server coroutine running in its own thread and event loop until `stop()`."""

    def __init__(self, run: Any) -> None:
        self.url = ""
        self.ready = threading.Event()
        self._run = run
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self.thread.start()
        assert self.ready.wait(60) and self.url, "the server did not start"

    async def _main(self) -> None:
        self.loop, self.stop_event = asyncio.get_running_loop(), asyncio.Event()
        try:
            await self._run(self)
        finally:
            self.ready.set()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.stop_event.set)
        self.thread.join(15)
        assert not self.thread.is_alive()


def awm_server(host: str = "127.0.0.1", port: int = 0, **kwargs: Any) -> Served:
    async def run(srv: Served) -> None:
        runtime = EnvRuntime(num_workers=1)
        srv.runtime = runtime
        try:
            await serve(runtime, SCENARIO, host=host, port=port, stop=srv.stop_event,
                        ready=lambda _, url: (setattr(srv, "url", url.replace("0.0.0.0", "127.0.0.1")),
                                              srv.ready.set()), **kwargs)
        finally:
            runtime.close()

    return Served(run)


@pytest.fixture(scope="module")
def server() -> Iterator[Served]:
    srv = awm_server()
    yield srv
    srv.stop()


def base_of(srv: Served) -> str:
    return srv.url.removesuffix("/mcp")


def check_sent(pool: RecordingPool, version: str) -> list[str]:
    """Validate every request and notification the client sent with the SDK's models; their methods."""
    methods = []
    for method, headers, body in pool.sent:
        if method != "POST":
            continue
        assert headers["content-type"] == "application/json"
        assert {"application/json", "text/event-stream"} <= {t.strip() for t in headers["accept"].split(",")}
        message = jsonrpc_message_adapter.validate_json(body)
        if isinstance(message, mcp_types.JSONRPCRequest):
            validate_client_request(message.method, version, message.params)
        else:
            assert isinstance(message, mcp_types.JSONRPCNotification)
            validate_client_notification(message.method, version, message.params)
        if message.method != "initialize":  # every later request names the session and the version
            assert headers["mcp-session-id"] and headers["mcp-protocol-version"] == version
        methods.append(message.method)
    return methods


def test_offered_versions_are_handshake_versions_of_the_sdk() -> None:
    assert set(PROTOCOL_VERSIONS) <= set(HANDSHAKE_PROTOCOL_VERSIONS)
    assert PROTOCOL_VERSIONS[0] == HANDSHAKE_PROTOCOL_VERSIONS[-1]


def test_a_session_speaks_valid_mcp_to_the_project_server(server: Served) -> None:
    async def story() -> tuple[Any, ...]:
        pool = RecordingPool()
        session = McpSession(pool, f"{server.url}/{SCENARIO}?task_idx=4")
        init = mcp_types.InitializeResult.model_validate(await session.open())
        tools = [mcp_types.Tool.model_validate(t) for t in await session.list_tools()]
        before = mcp_types.CallToolResult.model_validate(await session.call_tool("get_issue", {"issue_id": 7}))
        await session.call_tool("add_label_to_issue", {"issue_id": 7, "label_id": 6})
        after = mcp_types.CallToolResult.model_validate(await session.call_tool("get_issue", {"issue_id": 7}))
        bad = mcp_types.CallToolResult.model_validate(await session.call_tool("get_issue", {"issue_id": "seven"}))
        session_id = session.session_id
        await session.close()
        pool.close()
        return init, tools, before, after, bad, session_id, pool

    init, tools, before, after, bad, session_id, pool = asyncio.run(story())
    assert init.protocol_version == PROTOCOL_VERSIONS[0] and init.server_info.name == "awm"
    expected = server.loop and asyncio.run_coroutine_threadsafe(server.runtime.tools(SCENARIO), server.loop).result(30)
    assert [(t.name, t.description, t.input_schema) for t in tools] == \
        [(t["name"], t["description"], t["inputSchema"]) for t in expected]
    labels = [[label["name"] for label in json.loads(r.content[0].text)["labels"]] for r in (before, after)]
    assert labels == [["bug"], ["bug", "regression"]] and not before.is_error
    assert bad.is_error and bad.content[0].text.startswith("Input validation error")
    assert bad.meta == {"awm": {"kind": "invalid_arguments", "status": None}}
    assert check_sent(pool, init.protocol_version) == ["initialize", "notifications/initialized", "tools/list"] + \
        ["tools/call"] * 4
    assert pool.sent[-1][0] == "DELETE" and pool.sent[-1][1]["mcp-session-id"] == session_id
    replies = [jsonrpc_message_adapter.validate_json(body) for status, _, body in pool.received if status == 200 and body]
    assert len(replies) == 6 and all(isinstance(r, mcp_types.JSONRPCResponse) for r in replies)
    assert [status for status, _, _ in pool.received] == [200, 202, 200, 200, 200, 200, 200, 200]


def test_session_close_ends_the_episode_on_the_server(server: Served) -> None:
    async def story() -> list[int]:
        pool = HttpPool()
        health = Origin.parse(base_of(server))

        async def open_episodes() -> int:
            return json.loads((await pool.request(health, "GET", "/health", {}, b"", 10)).body)["open_episodes"]

        seen = [await open_episodes()]
        session = McpSession(pool, f"{server.url}/{SCENARIO}")
        await session.open()
        await session.list_tools()
        seen.append(await open_episodes())
        await session.close()
        for _ in range(100):
            if await open_episodes() == seen[0]:
                break
            await asyncio.sleep(0.02)
        seen.append(await open_episodes())
        pool.close()
        return seen

    before, during, after = asyncio.run(story())
    assert (during, after) == (before + 1, before)


def test_json_rpc_errors_are_errors_not_results(server: Served) -> None:
    async def story() -> list[McpRpcError]:
        pool = HttpPool()
        session = McpSession(pool, f"{server.url}/{SCENARIO}")
        await session.open()
        errors = []
        for method, params in [("bogus/method", {}), ("tools/call", {"name": "get_issue", "arguments": "seven"})]:
            with pytest.raises(McpRpcError) as caught:
                await session.request(method, params)
            errors.append(caught.value)
        await session.close()
        with pytest.raises(McpRpcError) as caught:  # refused before any session exists: HTTP 404 + JSON-RPC error
            await McpSession(pool, f"{server.url}/no_such_scenario").open()
        errors.append(caught.value)
        pool.close()
        return errors

    unknown, bad_params, no_scenario = asyncio.run(story())
    assert (no_scenario.status, no_scenario.code) == (404, mcp_types.jsonrpc.INVALID_REQUEST)
    assert "not served here" in no_scenario.message
    assert unknown.code == mcp_types.jsonrpc.METHOD_NOT_FOUND and "bogus/method" in str(unknown)
    assert bad_params.code == mcp_types.jsonrpc.INVALID_PARAMS
    for error in (unknown, bad_params):
        mcp_types.ErrorData.model_validate({"code": error.code, "message": error.message, "data": error.data})


def test_the_rollout_env_tells_observations_from_infra_failures(server: Served) -> None:
    async def story() -> tuple[Any, ...]:
        env = await McpEnv(base_of(server), SCENARIO, 4, 10.0).start()
        unknown = await env.call("no_such_tool", {})
        invalid = await env.call("get_issue", {"issue_id": "seven"})
        with pytest.raises(EnvInfraError, match="JSON-RPC error -32602"):
            await env.call("get_issue", "seven")  # not an object: the SDK refuses the request itself
        await env.call("add_label_to_issue", {"issue_id": 7, "label_id": 6})
        verdict = await env.verify("done")
        state = await env.state()
        await env.close()
        return unknown, invalid, verdict, state, len(env.tools)

    unknown, invalid, verdict, state, n_tools = asyncio.run(story())
    assert (unknown.is_error, unknown.kind) == (True, "unknown_tool")
    assert (invalid.is_error, invalid.kind) == (True, "invalid_arguments")
    assert verdict.verdict == "complete" and state["state_hash"] and n_tools > 10


def test_episodes_of_one_event_loop_share_keep_alive_connections(server: Served) -> None:
    async def one_loop() -> tuple[bool, int, HttpPool]:
        a = await McpEnv(base_of(server), SCENARIO, 0, 10.0).start()
        b = await McpEnv(base_of(server), SCENARIO, 1, 10.0).start()
        for env in (a, b, a, b):  # one request at a time: one connection serves both episodes
            await env.call("get_issue", {"issue_id": 7})
            await env.state()
        shared, idle = a.http is b.http, a.http.idle
        await a.close()
        await b.close()
        return shared, idle, a.http

    shared, idle, first_pool = asyncio.run(one_loop())
    assert shared and idle == 1
    assert asyncio.run(one_loop())[2] is not first_pool  # another loop, another pool (streams are loop-bound)


def test_the_token_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server off loopback wants its bearer token: without it a 401 is an infra failure naming the variable."""
    srv = awm_server(host="0.0.0.0", token="s3cret-token")
    try:
        async def story(token: str | None) -> int:
            if token is None:
                monkeypatch.delenv(TOKEN_ENV, raising=False)
            else:
                monkeypatch.setenv(TOKEN_ENV, token)
            env = await McpEnv(base_of(srv), SCENARIO, 0, 10.0).start()
            await env.state()  # the control plane carries the token too
            await env.close()
            return len(env.tools)

        for token in (None, "wrong"):
            with pytest.raises(EnvInfraError, match=TOKEN_ENV):
                asyncio.run(story(token))
        assert asyncio.run(story("s3cret-token")) > 10

        async def bare() -> None:
            await McpSession(HttpPool(), srv.url).open()

        with pytest.raises(McpAuthError, match="HTTP 401"):
            monkeypatch.delenv(TOKEN_ENV, raising=False)
            asyncio.run(bare())
    finally:
        srv.stop()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_and_restarted_servers_are_infra_failures() -> None:
    port = free_port()

    async def unreachable() -> None:
        await McpEnv(f"http://127.0.0.1:{port}", SCENARIO, 0, 5.0).start()

    with pytest.raises(EnvInfraError, match="MCP server .*cannot connect"):
        asyncio.run(unreachable())

    async def story() -> list[str]:
        pool = HttpPool()
        messages = []
        first = awm_server(port=port)
        env = await McpEnv(base_of(first), SCENARIO, 0, 10.0, http=pool).start()
        await env.call("get_issue", {"issue_id": 7})
        await asyncio.to_thread(first.stop)
        with pytest.raises(EnvInfraError) as down:  # the kept-alive connection is gone, and nothing listens
            await env.call("get_issue", {"issue_id": 7})
        messages.append(str(down.value))
        second = await asyncio.to_thread(awm_server, port=port)
        try:
            with pytest.raises(EnvInfraError) as restarted:  # a new server does not know the old session
                await env.call("get_issue", {"issue_id": 7})
            messages.append(str(restarted.value))
            fresh = await McpEnv(base_of(second), SCENARIO, 0, 10.0, http=pool).start()
            messages.append((await fresh.call("get_issue", {"issue_id": 7})).kind)
            await fresh.close()
        finally:
            await asyncio.to_thread(second.stop)
        pool.close()
        return messages

    down, restarted, fresh = asyncio.run(story())
    assert "cannot connect" in down
    assert "is unknown to the server" in restarted
    assert fresh == "ok"


def sse_server() -> Served:
    """The official SDK's own server answering in event streams (json_response=False), one tool `echo`."""

    async def list_tools(ctx: Any, params: Any) -> mcp_types.ListToolsResult:
        return mcp_types.ListToolsResult(tools=[mcp_types.Tool(name="echo", description="echo the text back",
                                                               input_schema={"type": "object"})])

    async def call_tool(ctx: Any, params: Any) -> mcp_types.CallToolResult:
        text = str((params.arguments or {}).get("text", ""))
        return mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text=text)],
                                        is_error=text == "fail")

    async def run(srv: Served) -> None:
        manager = StreamableHTTPSessionManager(Server("sse", on_list_tools=list_tools, on_call_tool=call_tool),
                                               json_response=False)

        @contextlib.asynccontextmanager
        async def lifespan(app: Any) -> AsyncIterator[None]:
            async with manager.run():
                yield

        app = Starlette(routes=[Mount("/mcp", app=manager.handle_request)], lifespan=lifespan)
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
        serving = asyncio.ensure_future(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        srv.url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}/mcp/"
        srv.ready.set()
        await srv.stop_event.wait()
        server.should_exit = True
        await serving

    return Served(run)


def test_replies_in_event_streams_are_read() -> None:
    srv = sse_server()
    try:
        async def story() -> tuple[Any, ...]:
            pool = RecordingPool()
            session = McpSession(pool, srv.url)
            init = mcp_types.InitializeResult.model_validate(await session.open())
            tools = await session.list_tools()
            ok = mcp_types.CallToolResult.model_validate(await session.call_tool("echo", {"text": "héllo"}))
            failed = mcp_types.CallToolResult.model_validate(await session.call_tool("echo", {"text": "fail"}))
            await session.close()
            pool.close()
            return init, tools, ok, failed, pool

        init, tools, ok, failed, pool = asyncio.run(story())
    finally:
        srv.stop()
    assert init.protocol_version == PROTOCOL_VERSIONS[0] and [t["name"] for t in tools] == ["echo"]
    assert (ok.content[0].text, ok.is_error, failed.is_error) == ("héllo", False, True)
    kinds = [headers.get("content-type", "").split(";")[0] for _, headers, _ in pool.received]
    assert kinds.count("text/event-stream") == 4  # initialize, tools/list and both calls came as event streams
    check_sent(pool, init.protocol_version)


def test_a_server_that_speaks_an_unknown_version_is_refused() -> None:
    """The lean client offers the newest handshake version; a reply naming one it does not speak fails."""

    async def story() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    fields = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:] if line)
                    raw = await reader.readexactly(int(fields.get(b"content-length", 0)))
                    body = json.dumps({"jsonrpc": "2.0", "id": json.loads(raw)["id"], "result": {
                        "protocolVersion": "1999-01-01", "capabilities": {},
                        "serverInfo": {"name": "old", "version": "0"}}}) if head.startswith(b"POST") else ""
                    writer.write(f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nmcp-session-id: s1\r\n"
                                 f"content-length: {len(body)}\r\n\r\n{body}".encode())
            writer.close()

        listener = await asyncio.start_server(handler, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        pool = HttpPool()
        try:
            with pytest.raises(McpError, match="1999-01-01"):
                await McpSession(pool, f"http://127.0.0.1:{port}/mcp", timeout_s=5).open()
        finally:
            pool.close()
            listener.close()

    asyncio.run(story())

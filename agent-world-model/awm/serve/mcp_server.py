"""Serve AWM episodes over MCP streamable HTTP: one MCP session is one isolated episode.

Upstream runs one fastapi-mcp server process per episode (awm-format.md sections 6 and 10):
about 2.6 s and 260 MB before the first call, a restart instead of a reset, and a temp file
that races when one scenario starts twice (section 12). Here one server answers for many
scenarios from one `EnvRuntime`: `/mcp` serves the default scenario, `/mcp/{scenario}` any
allowed one, both optionally with `?task_idx=N`. Each MCP session opens its own episode (a
private DB copy) at its first tools/list or tools/call and closes it when the session ends
(DELETE, idle expiry, server shutdown), so two sessions never see each other's writes.
Replies are plain JSON (`json_response=True`), as upstream's.

Beside MCP, a JSON control plane the agent never sees lets a remote rollout finish an episode:

    POST /episodes/{session_id}/verify    {"final_answer": str|null, "task_idx": int|null} -> Verdict
    POST /episodes/{session_id}/reset
    POST /episodes/{session_id}/snapshot  -> {"snapshot": id}
    POST /episodes/{session_id}/restore   {"snapshot": id}
    GET  /episodes/{session_id}/state     -> {"state_hash", "changes", "steps", "scenario", "task_idx"}
    GET  /health                          -> {"status": "ok", "scenarios": [...], "open_episodes": n}
    GET  /limits                          -> {"limits": {...}, what they closed or replaced, by kind}

The session id is the `mcp-session-id` header of the initialize reply; mcp 2.3's client does not
expose it, so read it with an httpx2 response hook (as tests/awm/test_mcp_server.py does).

Command line: `python -m awm.serve.mcp_server --scenario S [--data-dir D] [--host H] [--port P]
[limits]`, the limits being those of awm.serve.limits (`--help` lists them).

Exposure: bound to a non-loopback address, every request must carry `Authorization: Bearer
<token>`; the token is $AWM_MCP_TOKEN, or a fresh one printed at start. What a client can hold is
bounded (awm.serve.limits has the values and why): open sessions are capped (`--max-sessions`, 503
past it), expire after `--session-idle-timeout` seconds without a request, and `--unused-session-timeout`
seconds after their initialize if they made no tools/call nor control-plane request by then; a tool
result over `--max-result-bytes` becomes an error observation naming the cap (the session goes on);
a request head or body sent too slowly gets 408 and its connection is closed (awm.serve.corked_http).
Episode dirs (`awm-episodes-*`) left by servers that were killed are removed at start.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from awm.data import normalize_scenario_name
from awm.episode import EnvRuntime, Episode, Snapshot
from awm.runtime.pool import InfraError
from awm.serve.http_common import (
    LOOPBACK_HOST_HEADERS,
    LOOPBACK_HOSTS,
    HttpError,
    RequireToken,
    check_token,
    json_body,
    preview,
    resolve_scenarios,
    run_until_signalled,
    serve_app,
    until_stopped,
)
from awm.serve.limits import (
    MAX_SESSIONS,
    SESSION_IDLE_TIMEOUT_S,
    ServerLimits,
    add_limit_arguments,
    limits_from,
)

log = logging.getLogger(__name__)

_TARGET = "awm.target"  # ASGI scope key: the validated (scenario, task_idx) of an MCP request


@dataclass(frozen=True)
class _Target:
    """What an MCP URL asks for: a scenario and, optionally, the task the episode is for."""

    scenario: str
    task_idx: int | None

    @property
    def path(self) -> str:
        return f"/mcp/{self.scenario}" + ("" if self.task_idx is None else f"?task_idx={self.task_idx}")


@dataclass
class _Session:
    """One MCP session's episode (opened at first use) and the snapshots the control plane took."""

    session_id: str
    target: _Target
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    episode: Episode | None = None
    failure: str | None = None  # set after an infrastructure error: the episode is gone for good
    ended: bool = False
    used: bool = False  # made a tools/call or control-plane request: exempt from the unused-session expiry
    snapshots: dict[str, Snapshot] = field(default_factory=dict)
    snapshot_ids: Iterator[int] = field(default_factory=itertools.count)


class _SessionEpisodes:
    """The episodes opened through MCP, one per MCP session id; the only owner of those episodes."""

    def __init__(self, runtime: EnvRuntime) -> None:
        self.runtime = runtime
        self._sessions: dict[str, _Session] = {}

    def get(self, session_id: str) -> _Session | None:
        return self._sessions.get(session_id)

    def add(self, session_id: str, target: _Target) -> _Session:
        session = self._sessions[session_id] = _Session(session_id, target)
        return session

    def open_count(self) -> int:
        return sum(1 for s in self._sessions.values() if s.episode is not None)

    async def episode(self, session: _Session) -> Episode:
        """The session's episode, opened at first use; concurrent first requests share one open."""
        async with session.lock:
            if session.failure:
                raise InfraError(f"this session's episode was closed after an infrastructure failure "
                                 f"({session.failure}): start a new MCP session")
            if session.episode is None:
                if session.ended:
                    raise RuntimeError(f"MCP session {session.session_id} has ended")
                episode = await self.runtime.open(session.target.scenario, session.target.task_idx)
                if session.ended:  # the session ended while its episode was being opened
                    await episode.close()
                    raise RuntimeError(f"MCP session {session.session_id} has ended")
                session.episode = episode
            return session.episode

    async def fail(self, session: _Session, reason: str) -> None:
        """Close the episode after an infrastructure error; later calls say why instead of reopening."""
        log.warning("MCP session %s: infrastructure error, episode closed: %s", session.session_id, reason)
        session.failure = session.failure or reason
        episode, session.episode = session.episode, None
        if episode is not None:
            await episode.close()

    async def end(self, session_id: str) -> None:
        """The MCP session is over: close its episode and forget it."""
        session = self._sessions.pop(session_id, None)
        if session is None:
            return
        session.ended = True
        episode, session.episode = session.episode, None
        if episode is not None:
            await episode.close()

    async def close_all(self) -> None:
        for session_id in list(self._sessions):
            await self.end(session_id)


def _on_session_end(ctx: ServerRequestContext[Any, Any], callback: Callable[[], Awaitable[None]]) -> None:
    """Run `callback` when the SDK tears the MCP session down (DELETE, idle expiry, crash, shutdown).

    The SDK unwinds each connection's `exit_stack` exactly then. mcp 2.3's low-level handler
    context does not expose the connection yet (its `Context.connection` is not wired up),
    hence the private attribute, checked so that an SDK change fails loudly here.
    """
    connection = getattr(ctx.session, "_connection", None)
    if connection is None or not hasattr(connection, "exit_stack"):
        raise RuntimeError("this mcp SDK does not expose the session's Connection as mcp 2.3 does: "
                           "install mcp==2.3.* or adapt awm.serve.mcp_server._on_session_end")
    connection.exit_stack.push_async_callback(callback)


def _rpc_error(status: int, code: int, message: str, data: Any = None) -> JSONResponse:
    error = {"code": code, "message": message, **({"data": data} if data is not None else {})}
    return JSONResponse({"jsonrpc": "2.0", "id": None, "error": error}, status_code=status)


def _tool_result(text: str, is_error: bool, kind: str, status: int | None = None) -> types.CallToolResult:
    """A tool result; `_meta.awm` tells a rollout what kind of result it is (ok, http_error,
    invalid_arguments, unknown_tool, infra_error) without parsing the text the agent sees."""
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=is_error,
                                _meta={"awm": {"kind": kind, "status": status}})


class _McpEndpoint:
    """The ASGI app behind `/mcp` and `/mcp/{scenario}`: checks the URL, then hands over to the SDK."""

    def __init__(self, service: _EpisodeService) -> None:
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope)
        if request.method == "GET":
            # Episodes never push messages, and an idle SSE stream per session would hold the
            # session (and its episode) open past its idle timeout and stall shutdown.
            await JSONResponse({"error": "this server sends no server-initiated messages: no GET stream"},
                               status_code=405, headers={"Allow": "POST, DELETE"})(scope, receive, send)
            return
        version = request.headers.get(MCP_PROTOCOL_VERSION_HEADER)
        if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            # 2026-era requests carry no session, so they cannot own an episode; this error makes
            # an auto-negotiating client fall back to the initialize handshake.
            supported = list(HANDSHAKE_PROTOCOL_VERSIONS)
            await _rpc_error(400, types.UNSUPPORTED_PROTOCOL_VERSION,
                             f"AWM episodes live in stateful MCP sessions: use one of {supported} "
                             "with the initialize handshake",
                             {"supported": supported, "requested": version})(scope, receive, send)
            return
        try:
            scope[_TARGET] = self.service.target(request)
        except HttpError as exc:
            await _rpc_error(exc.status, types.INVALID_REQUEST, str(exc))(scope, receive, send)
            return
        if MCP_SESSION_ID_HEADER not in request.headers:  # may open a session (initialize): note when it does
            send = self._watch_for_new_session(send)
        await self.service.manager.handle_request(scope, receive, send)

    def _watch_for_new_session(self, send: Send) -> Send:
        async def watched(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400:
                for name, value in message.get("headers", ()):
                    if name == b"mcp-session-id":
                        self.service.session_opened(value.decode("latin-1"))
            await send(message)
        return watched


class _EpisodeService:
    """Everything behind the app: scenario routing, MCP handlers and the control plane."""

    def __init__(self, runtime: EnvRuntime, scenarios: list[str] | None, default_scenario: str | None,
                 session_idle_timeout_s: float | None, max_sessions: int | None,
                 limits: ServerLimits = ServerLimits()) -> None:
        self.runtime = runtime
        self.limits = limits
        self.unused_expired = 0  # sessions closed for making no tools/call in time (counts go out in /limits)
        self.results_capped = 0  # tool results replaced by the over-the-cap error
        self.scenarios, self.default = resolve_scenarios(runtime, scenarios, default_scenario)
        self._allowed = set(self.scenarios)
        self.episodes = _SessionEpisodes(runtime)
        self._listings: dict[str, types.ListToolsResult] = {}
        self._terminating: set[asyncio.Future[None]] = set()
        self.server: Server[Any] = Server("awm", on_list_tools=self._list_tools, on_call_tool=self._call_tool)
        # The SDK wraps every request in an OpenTelemetry span by default; nothing here configures a
        # tracer, so the spans went nowhere and cost ~8% of the main process per tools/call (py-spy).
        self.server.middleware = []
        self.manager = StreamableHTTPSessionManager(self.server, json_response=True,
                                                    session_idle_timeout=session_idle_timeout_s,
                                                    max_sessions=max_sessions)
        # The unused-session expiry ends sessions the SDK holds; mcp 2.3 keeps them in this private dict
        # (no public accessor), so check it here, where an SDK change fails loudly at start.
        if not isinstance(getattr(self.manager, "_server_instances", None), dict):
            raise RuntimeError("this mcp SDK does not keep its sessions as mcp 2.3 does: install mcp==2.3.* or "
                               "adapt awm.serve.mcp_server._EpisodeService._expire_if_unused")

    # ---- unused sessions -------------------------------------------------------------------
    def session_opened(self, session_id: str) -> None:
        """A new MCP session: unless it is used in time, close it `unused_session_timeout_s` from now."""
        asyncio.get_running_loop().call_later(self.limits.unused_session_timeout_s, self._expire_if_unused,
                                              session_id)

    def _expire_if_unused(self, session_id: str) -> None:
        session = self.episodes.get(session_id)
        if session is not None and session.used:
            return
        transport = self.manager._server_instances.get(session_id)
        if transport is None or transport.is_terminated:
            return  # ended already
        log.info("MCP session %s made no tools/call within %g s of its initialize: closing it", session_id,
                 self.limits.unused_session_timeout_s)
        self.unused_expired += 1
        if transport.idle_scope is not None:
            transport.idle_scope.cancel()  # the SDK's own idle expiry: ends the session, its episode with it
        else:  # no idle timeout configured: no idle scope to end the session by
            task = asyncio.ensure_future(transport.terminate())
            self._terminating.add(task)
            task.add_done_callback(self._terminating.discard)

    # ---- routing ---------------------------------------------------------------------------
    def target(self, request: Request) -> _Target:
        """The scenario and task an MCP URL names, or an HttpError saying what to use instead."""
        name = request.path_params.get("scenario")
        if name is None:
            if self.default is None:
                raise HttpError(404, f"this server has no default scenario: use /mcp/{{scenario}} with one of "
                                     f"{preview(self.scenarios)}")
            scenario = self.default
        else:
            scenario = normalize_scenario_name(name)
            if scenario not in self._allowed:
                raise HttpError(404, f"scenario {name!r} is not served here: use /mcp/{{scenario}} with one of "
                                     f"{preview(self.scenarios)}")
        raw = request.query_params.get("task_idx")
        if raw in (None, ""):
            return _Target(scenario, None)
        try:
            task_idx = int(raw)
        except ValueError:
            raise HttpError(400, f"task_idx must be an integer, got {raw!r}") from None
        _check_task(self.runtime, scenario, task_idx)
        return _Target(scenario, task_idx)

    # ---- MCP handlers ----------------------------------------------------------------------
    def _session(self, ctx: ServerRequestContext[Any, Any]) -> _Session:
        request = ctx.request
        session_id = request.headers.get(MCP_SESSION_ID_HEADER) if request is not None else None
        if not session_id or _TARGET not in request.scope:
            raise MCPError(types.INVALID_REQUEST, "AWM episodes live in stateful MCP sessions: connect over "
                                                  "streamable HTTP with the initialize handshake")
        target = request.scope[_TARGET]
        session = self.episodes.get(session_id)
        if session is None:
            session = self.episodes.add(session_id, target)
            _on_session_end(ctx, lambda: self.episodes.end(session_id))
        elif session.target != target:
            raise MCPError(types.INVALID_REQUEST, f"MCP session {session_id} was opened on {session.target.path}: "
                                                  "send its requests there, or open a new session")
        return session

    async def _list_tools(self, ctx: ServerRequestContext[Any, Any],
                          params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        session = self._session(ctx)
        try:
            episode = await self.episodes.episode(session)
        except InfraError as exc:
            await self.episodes.fail(session, str(exc))
            raise MCPError(types.INTERNAL_ERROR, f"Infrastructure error: {exc}") from None
        listing = self._listings.get(episode.scenario)
        if listing is None:  # the same for every episode of a scenario: build the models once
            listing = types.ListToolsResult(tools=[
                types.Tool(name=t["name"], description=t["description"], input_schema=t["inputSchema"])
                for t in episode.tools])
            # Generated code writes the descriptions and schemas: the result cap holds for them too.
            size, cap = len(listing.model_dump_json(by_alias=True, exclude_none=True)), self.limits.max_result_bytes
            if size > cap:
                raise MCPError(types.INTERNAL_ERROR, f"the tool list of scenario {episode.scenario!r} is {size} "
                                                     f"bytes, over this server's cap of {cap} bytes per result "
                                                     "(--max-result-bytes): the scenario cannot be served")
            self._listings[episode.scenario] = listing
        return listing

    async def _call_tool(self, ctx: ServerRequestContext[Any, Any],
                         params: types.CallToolRequestParams) -> types.CallToolResult:
        session = self._session(ctx)
        session.used = True
        try:
            episode = await self.episodes.episode(session)
            obs = await episode.call(params.name, params.arguments)
        except InfraError as exc:
            await self.episodes.fail(session, str(exc))
            return _tool_result(f"Infrastructure error: {exc}", is_error=True, kind="infra_error")
        text, cap = obs.text, self.limits.max_result_bytes
        if len(text) * 4 > cap:  # a UTF-8 character is at most 4 bytes: only then can the text be over the cap
            size = len(text.encode("utf-8", "surrogatepass"))
            if size > cap:
                self.results_capped += 1
                log.warning("MCP session %s: the result of %s is %d bytes, over the %d-byte cap: replaced by an "
                            "error", session.session_id, params.name, size, cap)
                return _tool_result(f"Error: the result of tool {params.name!r} is {size} bytes, over this "
                                    f"server's cap of {cap} bytes per tool result (--max-result-bytes); the call "
                                    "did run. Ask for less: filter or page what the tool returns.",
                                    is_error=True, kind="result_too_large", status=obs.status)
        return _tool_result(text, obs.is_error, obs.kind, obs.status)

    # ---- control plane ---------------------------------------------------------------------
    def _lookup(self, request: Request) -> tuple[_Session, Episode]:
        session_id = request.path_params["session_id"]
        session = self.episodes.get(session_id)
        if session is None or (session.episode is None and session.failure is None):
            raise HttpError(404, f"no episode for MCP session {session_id!r}: an episode opens at its session's "
                                  "first tools/list or tools/call and closes when the session ends")
        if session.episode is None:
            raise HttpError(503, f"Infrastructure error: the episode of MCP session {session_id!r} was closed "
                                 f"after an infrastructure failure ({session.failure}): start a new session")
        return session, session.episode

    async def _run(self, request: Request, action: Callable[[_Session, Episode, dict[str, Any]],
                                                           Awaitable[dict[str, Any]]]) -> JSONResponse:
        """Run one control-plane action and turn its failures into JSON errors that say what to do."""
        try:
            session, episode = self._lookup(request)
            session.used = True
            body = await json_body(request)
            try:
                return JSONResponse(await action(session, episode, body))
            except InfraError as exc:
                await self.episodes.fail(session, str(exc))
                raise HttpError(503, f"Infrastructure error: {exc}") from None
            except RuntimeError:
                if not episode.closed:
                    raise
                raise HttpError(404, f"the episode of MCP session {session.session_id!r} closed during this "
                                      "request (its session ended)") from None
        except HttpError as exc:
            return JSONResponse({"error": str(exc), "infra_error": str(exc).startswith("Infrastructure error")},
                                status_code=exc.status)

    async def verify(self, request: Request) -> JSONResponse:
        async def action(session: _Session, episode: Episode, body: dict[str, Any]) -> dict[str, Any]:
            final_answer, task_idx = body.get("final_answer"), body.get("task_idx")
            if final_answer is not None and not isinstance(final_answer, str):
                raise HttpError(400, "final_answer must be a string or null")
            if task_idx is not None and (not isinstance(task_idx, int) or isinstance(task_idx, bool)):
                raise HttpError(400, "task_idx must be an integer or null")
            self._bind_task(session, episode, task_idx)
            return (await episode.verify(final_answer)).to_dict()
        return await self._run(request, action)

    def _bind_task(self, session: _Session, episode: Episode, task_idx: int | None) -> None:
        """Fix the task an episode is verified against: from the URL, else from the verify request."""
        if task_idx is None or task_idx == episode.task_idx:
            if episode.task_idx is None:
                raise HttpError(400, f"MCP session {session.session_id!r} was opened without a task: pass "
                                      "\"task_idx\" in the verify request, or connect to /mcp/{scenario}?task_idx=N")
            return
        if episode.task_idx is not None:
            raise HttpError(409, f"MCP session {session.session_id!r} was opened for task {episode.task_idx}, "
                                 f"not {task_idx}: open a session on /mcp/{episode.scenario}?task_idx={task_idx}")
        _check_task(self.runtime, episode.scenario, task_idx)
        episode.assign_task(task_idx)

    async def reset(self, request: Request) -> JSONResponse:
        async def action(session: _Session, episode: Episode, body: dict[str, Any]) -> dict[str, Any]:
            await episode.reset()
            return {"status": "ok", "steps": episode.steps}
        return await self._run(request, action)

    async def snapshot(self, request: Request) -> JSONResponse:
        async def action(session: _Session, episode: Episode, body: dict[str, Any]) -> dict[str, Any]:
            snap = await episode.snapshot()
            snapshot_id = f"snap-{next(session.snapshot_ids)}"
            session.snapshots[snapshot_id] = snap
            return {"snapshot": snapshot_id, "steps": snap.step}
        return await self._run(request, action)

    async def restore(self, request: Request) -> JSONResponse:
        async def action(session: _Session, episode: Episode, body: dict[str, Any]) -> dict[str, Any]:
            snapshot_id = body.get("snapshot")
            snap = session.snapshots.get(snapshot_id) if isinstance(snapshot_id, str) else None
            if snap is None:
                raise HttpError(404, f"unknown snapshot {snapshot_id!r} for MCP session "
                                     f"{session.session_id!r}: use an id returned by its /snapshot, one of "
                                      f"{sorted(session.snapshots)}")
            await episode.restore(snap)
            return {"status": "ok", "steps": episode.steps}
        return await self._run(request, action)

    async def state(self, request: Request) -> JSONResponse:
        async def action(session: _Session, episode: Episode, body: dict[str, Any]) -> dict[str, Any]:
            # Both read the whole DB: not on the loop.
            state_hash = await asyncio.to_thread(episode.state_hash)
            changes = await asyncio.to_thread(episode.changes)
            return {"state_hash": state_hash, "changes": changes, "steps": episode.steps,
                    "scenario": episode.scenario, "task_idx": episode.task_idx}
        return await self._run(request, action)

    async def health(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "scenarios": self.scenarios,
                             "open_episodes": self.episodes.open_count()})

    async def limit_counts(self, request: Request) -> JSONResponse:
        guard = getattr(request.app.state, "read_guard", None)  # set by `serve` (absent under another server)
        return JSONResponse({"limits": dataclasses.asdict(self.limits),
                             "unused_sessions_closed": self.unused_expired, "results_capped": self.results_capped,
                             "connections_closed": dict(guard.dropped) if guard else {}})

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        """Run the SDK's session manager; leaving it ends every session, and so closes every episode."""
        try:
            async with self.manager.run():
                yield
        finally:
            await self.episodes.close_all()


def _check_task(runtime: EnvRuntime, scenario: str, task_idx: int) -> None:
    n = len(runtime.dataset.tasks(scenario))
    if not 0 <= task_idx < n:
        raise HttpError(400, f"scenario {scenario!r} has {n} tasks: task_idx must be in 0..{n - 1}, got {task_idx}")


def build_app(runtime: EnvRuntime, scenarios: list[str] | None = None, default_scenario: str | None = None, *,
              allowed_hosts: list[str] | None = None,
              session_idle_timeout_s: float | None = SESSION_IDLE_TIMEOUT_S,
              max_sessions: int | None = MAX_SESSIONS, token: str | None = None,
              limits: ServerLimits = ServerLimits()) -> Starlette:
    """The ASGI app: MCP at `/mcp` and `/mcp/{scenario}`, the control plane under `/episodes`, `/health`.

    `scenarios=None` serves every runnable scenario of the runtime's data. Run the app in the
    event loop that uses `runtime`. `allowed_hosts` guards against DNS rebinding (the SDK's
    default for a loopback server); leave it None when clients reach the server by other names.
    `token`: require it as a bearer token on every request. `limits`: the unused-session expiry and the
    result cap (the connection limits are the protocol's: see `serve`).
    """
    service = _EpisodeService(runtime, scenarios, default_scenario, session_idle_timeout_s, max_sessions, limits)
    mcp = _McpEndpoint(service)
    routes = [
        Route("/mcp", mcp),
        Route("/mcp/{scenario}", mcp),
        Route("/episodes/{session_id}/verify", service.verify, methods=["POST"]),
        Route("/episodes/{session_id}/reset", service.reset, methods=["POST"]),
        Route("/episodes/{session_id}/snapshot", service.snapshot, methods=["POST"]),
        Route("/episodes/{session_id}/restore", service.restore, methods=["POST"]),
        Route("/episodes/{session_id}/state", service.state, methods=["GET"]),
        Route("/health", service.health, methods=["GET"]),
        Route("/limits", service.limit_counts, methods=["GET"]),
    ]
    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts)] if allowed_hosts else []
    if token:
        middleware.append(Middleware(RequireToken, token=token))
    return Starlette(routes=routes, middleware=middleware, lifespan=service.lifespan)


def _announce(scenario: str, url: str) -> None:
    print(f"AWM MCP server for {scenario} at {url}", flush=True)


async def serve(runtime: EnvRuntime, scenario: str, *, host: str = "127.0.0.1", port: int = 0,
                scenarios: list[str] | None = None, stop: asyncio.Event | None = None,
                ready: Callable[[str, str], None] = _announce, token: str | None = None,
                max_sessions: int | None = MAX_SESSIONS,
                session_idle_timeout_s: float | None = SESSION_IDLE_TIMEOUT_S,
                limits: ServerLimits | None = None) -> None:
    """Serve `runtime` until `stop` is set; every episode is closed on the way out, the runtime is not.

    The default scenario is loaded before the port opens, so a bad name fails before anything
    listens and the first session does not pay for the load. Once listening, `ready(scenario, url)`
    gets the actual URL (port 0 picks a free port); by default it prints the one line
    `AWM MCP server for <scenario> at http://HOST:PORT/mcp`. A non-loopback `host` needs a `token`.
    `limits` (the CLI's flags) replaces `max_sessions` and `session_idle_timeout_s` and sets every other
    limit; without it those two are used (None: no cap, no idle expiry) and the rest take their defaults.
    """
    if limits is None:
        limits = ServerLimits()
    else:
        max_sessions, session_idle_timeout_s = limits.max_sessions, limits.session_idle_timeout_s
    loopback = host in LOOPBACK_HOSTS
    check_token(host, token)
    stop = stop or asyncio.Event()
    scenario = runtime.scenario(scenario).name  # KeyError naming the data directory if unknown
    if not await until_stopped(runtime.tools(scenario), stop):
        return
    app = build_app(runtime, scenarios, scenario, allowed_hosts=LOOPBACK_HOST_HEADERS if loopback else None,
                    session_idle_timeout_s=session_idle_timeout_s, max_sessions=max_sessions, token=token,
                    limits=limits)
    await serve_app(app, host, port, limits, stop, lambda base: ready(scenario, f"{base}/mcp"))


def run_server(data_dir: str | None, scenario: str, host: str, port: int, num_workers: int | None,
               scenarios: list[str] | None = None, limits: ServerLimits = ServerLimits()) -> None:
    """Blocking entry point of `awm env start`: serve until SIGINT/SIGTERM, then close everything."""
    run_until_signalled("AWM MCP server", host, data_dir, num_workers,
                        lambda runtime, stop, token: serve(runtime, scenario, host=host, port=port, scenarios=scenarios,
                                                           stop=stop, token=token, limits=limits))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m awm.serve.mcp_server", description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", required=True, help="the scenario served at /mcp")
    parser.add_argument("--data-dir", default=None, help="AWM-1K data directory (default: the bundled scenarios)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed once listening)")
    parser.add_argument("--num-workers", type=int, default=None)
    parser.add_argument("--scenarios", nargs="*", default=None,
                        help="scenarios served at /mcp/{scenario} (default: every runnable one)")
    add_limit_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    try:
        limits = limits_from(args)
    except ValueError as exc:
        parser.error(str(exc))
    run_server(args.data_dir, args.scenario, args.host, args.port, args.num_workers, args.scenarios, limits)


if __name__ == "__main__":
    main()

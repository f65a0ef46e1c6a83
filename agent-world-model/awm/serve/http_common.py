"""HTTP pieces both environment servers share: the MCP server (awm.serve.mcp_server) and the AgentGym-protocol
server (awm.serve.agentgym_server). Errors as JSON with a status, bounded JSON bodies, the bearer-token
guard, the scenario allow-list, and serving an app (uvicorn under our connection guards) until a stop
event or a signal."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import secrets
import signal
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import uvicorn
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from awm.data import normalize_scenario_name
from awm.episode import EnvRuntime, remove_stale_episode_dirs
from awm.serve.corked_http import guarded_protocol
from awm.serve.limits import KEEP_ALIVE_TIMEOUT_S, TOKEN_ENV, ServerLimits

log = logging.getLogger(__name__)

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
LOOPBACK_HOST_HEADERS = ["127.0.0.1", "localhost", "[::1]"]  # the Host header values naming them
SHUTDOWN_GRACE_S = 3.0  # uvicorn waits this long for open requests before cancelling them
CONTROL_BODY_LIMIT = 1 << 20  # bytes of a control-plane request body (a final answer is far smaller)


class HttpError(Exception):
    """A control-plane request that cannot be served; becomes a JSON error with this status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def resolve_scenarios(runtime: EnvRuntime, scenarios: list[str] | None,
                      default: str | None) -> tuple[list[str], str | None]:
    """The allowed scenario names (normalised; None = every runnable one) and the default one."""
    runnable = runtime.dataset.scenario_names(runnable_only=True)
    names = runnable if scenarios is None else list(dict.fromkeys(normalize_scenario_name(s) for s in scenarios))
    default = normalize_scenario_name(default) if default else None
    if default and default not in names:
        names.append(default)
    missing = sorted(set(names) - set(runnable))
    if missing:
        raise ValueError(f"scenarios {missing} are not runnable in {runtime.dataset.data_dir} (each needs "
                         f"gen_tasks, gen_db and gen_envs rows): choose from {preview(runnable)}")
    return names, default


def preview(names: list[str], limit: int = 8) -> str:
    return ", ".join(names[:limit]) + (f" (and {len(names) - limit} more)" if len(names) > limit else "")


async def json_body(request: Request) -> dict[str, Any]:
    """A control-plane request's JSON object body, read up to CONTROL_BODY_LIMIT bytes (the MCP path has
    the SDK's own 4 MiB cap; this one had none)."""
    if request.method != "POST":
        return {}
    declared = request.headers.get("content-length", "")
    too_large = HttpError(413, f"the request body is over {CONTROL_BODY_LIMIT} bytes: control-plane requests "
                                "carry a small JSON object")
    if declared.isdigit() and int(declared) > CONTROL_BODY_LIMIT:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > CONTROL_BODY_LIMIT:
            raise too_large
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser's stack
        raise HttpError(400, "the request body must be a JSON object") from None
    if not isinstance(body, dict):
        raise HttpError(400, "the request body must be a JSON object")
    return body


class RequireToken:
    """ASGI wrapper: every HTTP request must carry `Authorization: Bearer <token>` (compared in constant time)."""

    def __init__(self, app: Any, token: str) -> None:
        self.app, self.expected = app, f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                await JSONResponse({"error": f"send `Authorization: Bearer <token>`: the token printed when the "
                                             f"server started, or ${TOKEN_ENV}"},
                                   status_code=401, headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
                return
        await self.app(scope, receive, send)


class SignalFreeUvicorn(uvicorn.Server):
    """uvicorn that leaves signals to its caller, so a signal during startup or teardown is handled too."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def until_stopped(work: Awaitable[Any], stop: asyncio.Event) -> bool:
    """Await `work` unless `stop` is set first (then cancel it); True when `work` finished."""
    task, stopped = asyncio.ensure_future(work), asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if not task.done():
        task.cancel()
        return False
    task.result()
    return True


def check_token(host: str, token: str | None) -> None:
    """A server on a non-loopback address reaches other machines: it must require a bearer token."""
    if host not in LOOPBACK_HOSTS and not token:
        raise ValueError(f"serving on {host!r} reaches other machines: pass token= (the CLI reads ${TOKEN_ENV} "
                         "or prints a fresh one), or bind to 127.0.0.1")


async def serve_app(app: Any, host: str, port: int, limits: ServerLimits, stop: asyncio.Event,
                    listening: Callable[[str], None]) -> None:
    """Run `app` until `stop` is set; `listening(base_url)` gets the bound URL once the port is open.

    One send() per reply and head/body deadlines (awm.serve.corked_http); uvicorn's own knobs for the
    rest: idle keep-alive connections, and the head size under its h11 parser. No proxy headers: nothing
    here reads client addresses; no WebSocket upgrades: nothing here serves one. `app.state.read_guard`
    gets the connection guard, whose counters the apps report under /limits."""
    server = SignalFreeUvicorn(uvicorn.Config(app, host=host, port=port, loop="asyncio", http=guarded_protocol(limits),
                                              ws="none", proxy_headers=False, log_level="warning", access_log=False,
                                              lifespan="on", timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
                                              timeout_keep_alive=KEEP_ALIVE_TIMEOUT_S,
                                              h11_max_incomplete_event_size=limits.max_head_bytes))
    app.state.read_guard = server.config.http.guard
    serving = asyncio.ensure_future(server.serve())
    try:
        while not (server.started or serving.done() or stop.is_set()):
            await asyncio.sleep(0.01)
        if server.started and not stop.is_set():
            bound = server.servers[0].sockets[0].getsockname()[1]
            listening(f"http://{f'[{host}]' if ':' in host else host}:{bound}")
        await until_stopped(asyncio.shield(serving), stop)
    finally:
        server.should_exit = True
        await serving  # also when cancelled: uvicorn's shutdown closes every episode before we return


def run_until_signalled(what: str, host: str, data_dir: str | None, num_workers: int | None,
                        serve: Callable[[EnvRuntime, asyncio.Event, str | None], Awaitable[None]]) -> None:
    """Blocking entry point of a server command: serve until SIGINT/SIGTERM, then close everything.

    Everything = every episode (`serve` closes them on its way out), the worker processes and the
    verifier sandbox (the runtime). Off loopback the token is $AWM_MCP_TOKEN or a fresh one, printed."""
    token = os.environ.get(TOKEN_ENV) or None
    if host not in LOOPBACK_HOSTS and token is None:
        token = secrets.token_urlsafe(24)
        print(f"{what} token (send `Authorization: Bearer <token>`; set ${TOKEN_ENV} to choose it): {token}",
              flush=True)
    removed = remove_stale_episode_dirs()
    if removed:
        log.warning("removed %d episode dirs of servers that are gone: %s", len(removed), ", ".join(removed))

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        runtime = EnvRuntime(data_dir, num_workers=num_workers)
        try:
            await serve(runtime, stop, token)
        finally:
            runtime.close()

    asyncio.run(main())

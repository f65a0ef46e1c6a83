"""How a rollout reaches an AWM environment: in-process runtime or MCP over HTTP, one interface.

    env = await open_env(cfg, scenario, task_idx)   # cfg.transport: "inprocess" | "mcp"
    env.tools                                        # [{name, description, inputSchema}]
    result = await env.call(name, arguments)         # ToolResult(text, is_error, kind)
    state = await env.state()                        # {"state_hash", "changes"} after a turn
    verdict = await env.verify(final_answer)         # awm.verifier.Verdict
    await env.close()

"inprocess" drives `awm.episode.EnvRuntime` inside this process (the environment code itself runs
in the runtime's worker processes, verifiers in its sandbox); one runtime per event loop and data
directory. "mcp" talks to `awm env start` servers, possibly on other hosts: one MCP session per
episode on `/mcp/<scenario>?task_idx=N`, plus the server's control plane for state and verify;
episodes are spread over the given URLs round robin.

Failures of the machinery (worker crash, tool or verifier timeout, unreachable server) raise
`EnvInfraError`: the rollout marks the sample as an infrastructure failure, never scores it 0.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import logging
import os
import sqlite3
import weakref
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from awm.serve.limits import TOKEN_ENV
from awm.verifier import Verdict

from awm_grpo.http_pool import HttpError, HttpPool, Origin
from awm_grpo.mcp_client import McpAuthError, McpError, McpSession

logger = logging.getLogger(__name__)


class EnvInfraError(RuntimeError):
    """The environment machinery failed (not the agent): drop the sample, count it."""


@dataclass
class ToolResult:
    """One tool call's outcome. kind: ok | http_error | invalid_arguments | unknown_tool."""

    text: str
    is_error: bool
    kind: str = "ok"
    latency_s: float = 0.0


class EnvSession(Protocol):
    tools: list[dict[str, Any]]

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult: ...

    async def state(self) -> dict[str, Any]: ...

    async def verify(self, final_answer: str | None) -> Verdict: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class EnvConfig:
    """The environment part of the recipe's config (the awm_* keys of the runtime YAML)."""

    transport: str = "inprocess"
    data_dir: str | None = None
    mcp_urls: tuple[str, ...] = ()
    workers: int = 2
    tool_timeout_s: float = 30.0
    verifier_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.transport not in ("inprocess", "mcp"):
            raise ValueError(f"awm_transport {self.transport!r} is unknown: use 'inprocess' or 'mcp'")
        if self.transport == "mcp" and not self.mcp_urls:
            raise ValueError("awm_transport 'mcp' needs awm_mcp_urls: the base URLs of `awm env start` servers, "
                             "e.g. ['http://127.0.0.1:8001']")


# ---- in-process ----------------------------------------------------------------------------------

_RUNTIMES: dict[tuple[int, str | None], Any] = {}


def _runtime(cfg: EnvConfig) -> Any:
    """One EnvRuntime per (event loop, data dir): its worker pool is bound to the loop that made it."""
    from awm.episode import EnvRuntime

    key = (id(asyncio.get_running_loop()), cfg.data_dir)
    runtime = _RUNTIMES.get(key)
    if runtime is None or runtime.closed:
        runtime = EnvRuntime(cfg.data_dir, num_workers=cfg.workers, call_timeout_s=cfg.tool_timeout_s,
                             verifier_timeout_s=cfg.verifier_timeout_s)
        _RUNTIMES[key] = runtime
    return runtime


@atexit.register
def close_runtimes() -> None:
    """Stop every in-process runtime's workers (also called by tests between event loops)."""
    while _RUNTIMES:
        _, runtime = _RUNTIMES.popitem()
        runtime.close()


class InProcessEnv:
    def __init__(self, episode: Any) -> None:
        self.episode = episode
        self.tools = episode.tools

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        from awm.runtime.pool import InfraError

        try:
            obs = await self.episode.call(name, arguments)
        except InfraError as exc:
            raise EnvInfraError(f"tool {name!r}: {exc}") from exc
        return ToolResult(obs.text, obs.is_error, obs.kind, obs.latency_s)

    async def state(self) -> dict[str, Any]:
        def read() -> dict[str, Any]:
            return {"state_hash": self.episode.state_hash(), "changes": self.episode.changes()}

        try:
            return await asyncio.to_thread(read)
        except (sqlite3.Error, OSError) as exc:  # e.g. out of file descriptors: the machinery, not the agent
            raise EnvInfraError(f"reading the state of episode {self.episode.id}: {type(exc).__name__}: {exc}") from exc

    @property
    def db_path(self) -> str:
        """The episode's SQLite file (read-only use: progress predicates)."""
        return str(self.episode.db_path)

    @property
    def code(self) -> str | None:
        """The scenario's environment code (tool labels for progress gating)."""
        return self.episode.runtime.dataset.scenario(self.episode.scenario).full_code

    async def load_state(self, path: str) -> None:
        """Start from a saved DB state (controlled recovery split) instead of the initial DB."""
        from awm.runtime.pool import InfraError

        try:
            await self.episode.load_state(path)
        except InfraError as exc:
            raise EnvInfraError(f"loading state {path}: {exc}") from exc

    async def verify(self, final_answer: str | None) -> Verdict:
        from awm.runtime.pool import InfraError

        try:
            return await self.episode.verify(final_answer)
        except InfraError as exc:
            raise EnvInfraError(f"verifier: {exc}") from exc

    async def close(self) -> None:
        await self.episode.close()


# ---- MCP over HTTP -------------------------------------------------------------------------------

_NEXT_URL = itertools.count()
_HTTP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, weakref.ref[HttpPool]] = weakref.WeakKeyDictionary()


def _http() -> HttpPool:
    """The running loop's pool of keep-alive connections, shared by the episodes that hold it.

    Held weakly on both sides: the pool lives while some episode of the loop does (so concurrent
    episodes share connections) and closes its idle connections when the last one is gone, and a
    finished loop is not kept alive by connections that point back at it.
    """
    loop = asyncio.get_running_loop()
    ref = _HTTP.get(loop)
    pool = ref() if ref is not None else None
    if pool is None:
        pool = HttpPool()
        _HTTP[loop] = weakref.ref(pool)
    return pool


class McpEnv:
    """One MCP session (= one episode on the server) plus the server's JSON control plane.

    Spoken by the lean client (awm_grpo.mcp_client) on the event loop's shared connections.
    """

    def __init__(self, base_url: str, scenario: str, task_idx: int, timeout_s: float,
                 http: HttpPool | None = None) -> None:
        self.base = base_url.rstrip("/")
        self.url = f"{self.base}/mcp/{scenario}?task_idx={task_idx}"
        self.timeout_s = timeout_s
        self.http = http or _http()
        self.origin = Origin.parse(self.base)
        self.tools: list[dict[str, Any]] = []
        # A server bound off loopback requires its bearer token (awm.serve.limits.TOKEN_ENV) on every request.
        token = os.environ.get(TOKEN_ENV)
        self._auth = {"authorization": f"Bearer {token}"} if token else {}
        self.session = McpSession(self.http, self.url, token=token, timeout_s=timeout_s)

    @property
    def session_id(self) -> str:
        return self.session.session_id or ""

    async def start(self) -> McpEnv:
        try:
            await self.session.open()
            listing = await self.session.list_tools()
        except McpAuthError as exc:
            await self.close()
            raise EnvInfraError(f"MCP server {self.base} wants its token: set {TOKEN_ENV} to the token the "
                                f"server printed at start (or was started with) ({exc})") from exc
        except McpError as exc:
            await self.close()
            raise EnvInfraError(f"MCP server {self.base}: {exc}") from exc
        self.tools = [{"name": t["name"], "description": t.get("description") or "",
                       "inputSchema": t.get("inputSchema", {})} for t in listing]
        return self

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        try:
            result = await self.session.call_tool(name, arguments)
        except McpError as exc:
            raise EnvInfraError(f"MCP tool {name!r}: {exc}") from exc
        meta = result.get("_meta") or {}
        awm_meta = meta.get("awm") or {} if isinstance(meta, dict) else {}
        content = result.get("content") or []
        text = "\n".join(part.get("text", "") for part in content
                         if isinstance(part, dict) and part.get("type") == "text")
        is_error = bool(result.get("isError"))
        kind = awm_meta.get("kind", "http_error" if is_error else "ok")
        if kind == "infra_error":
            raise EnvInfraError(f"MCP tool {name!r} at {self.url}: {text}")
        return ToolResult(text, is_error, kind)

    async def _control(self, method: str, action: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        path = f"/episodes/{self.session_id}/{action}"
        headers = {**self._auth, "content-type": "application/json"} if body is not None else self._auth
        try:
            reply = await self.http.request(self.origin, method, path, headers,
                                            orjson.dumps(body) if body is not None else b"", self.timeout_s)
            data = orjson.loads(reply.body)
        except (HttpError, orjson.JSONDecodeError) as exc:
            raise EnvInfraError(f"{method} {self.base}{path}: {type(exc).__name__}: {exc}") from exc
        if reply.status >= 400:
            raise EnvInfraError(f"{method} {self.base}{path}: HTTP {reply.status}: "
                                f"{data.get('error', data) if isinstance(data, dict) else data}")
        return data

    async def state(self) -> dict[str, Any]:
        data = await self._control("GET", "state")
        return {"state_hash": data["state_hash"], "changes": data.get("changes", {})}

    async def verify(self, final_answer: str | None) -> Verdict:
        data = await self._control("POST", "verify", {"final_answer": final_answer})
        return Verdict(**data)

    async def close(self) -> None:
        with contextlib.suppress(McpError):
            await self.session.close()


async def open_env(cfg: EnvConfig, scenario: str, task_idx: int) -> EnvSession:
    """A fresh episode of `scenario` bound to task `task_idx`, over the configured transport."""
    if cfg.transport == "mcp":
        url = cfg.mcp_urls[next(_NEXT_URL) % len(cfg.mcp_urls)]
        return await McpEnv(url, scenario, task_idx, cfg.tool_timeout_s + cfg.verifier_timeout_s).start()
    from awm.runtime.pool import InfraError

    try:
        episode = await _runtime(cfg).open(scenario, task_idx)
    except InfraError as exc:
        raise EnvInfraError(f"opening {scenario} task {task_idx}: {exc}") from exc
    return InProcessEnv(episode)

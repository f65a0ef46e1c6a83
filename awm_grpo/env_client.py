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
from dataclasses import dataclass
from typing import Any, Protocol

from awm.server_limits import TOKEN_ENV
from awm.verifier import Verdict

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
        from awm.pool import InfraError

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
        from awm.pool import InfraError

        try:
            await self.episode.load_state(path)
        except InfraError as exc:
            raise EnvInfraError(f"loading state {path}: {exc}") from exc

    async def verify(self, final_answer: str | None) -> Verdict:
        from awm.pool import InfraError

        try:
            return await self.episode.verify(final_answer)
        except InfraError as exc:
            raise EnvInfraError(f"verifier: {exc}") from exc

    async def close(self) -> None:
        await self.episode.close()


# ---- MCP over HTTP -------------------------------------------------------------------------------

_NEXT_URL = itertools.count()


class McpEnv:
    """One MCP session (= one episode on the server) plus the server's JSON control plane."""

    def __init__(self, base_url: str, scenario: str, task_idx: int, timeout_s: float) -> None:
        self.base = base_url.rstrip("/")
        self.url = f"{self.base}/mcp/{scenario}?task_idx={task_idx}"
        self.timeout_s = timeout_s
        self.tools: list[dict[str, Any]] = []
        self.session_id = ""
        self._stack = contextlib.AsyncExitStack()

    async def start(self) -> McpEnv:
        import httpx2
        from mcp.client.session import ClientSession
        from mcp.client.streamable_http import streamable_http_client

        async def remember(response: httpx2.Response) -> None:
            if not self.session_id and "mcp-session-id" in response.headers:
                self.session_id = response.headers["mcp-session-id"]

        # A server bound off loopback requires its bearer token (awm.server_limits.TOKEN_ENV) on every request.
        token = os.environ.get(TOKEN_ENV)
        self.http = await self._stack.enter_async_context(httpx2.AsyncClient(
            timeout=self.timeout_s, headers={"Authorization": f"Bearer {token}"} if token else None,
            event_hooks={"response": [remember]}))
        try:
            # A plain request first: the MCP client reports an unreachable server as a cancellation
            # from inside its task group, which cannot be told apart from a real one.
            reply = await self.http.get(f"{self.base}/health")
            if reply.status_code == 401:
                raise EnvInfraError(f"MCP server {self.base} wants its token: set {TOKEN_ENV} to the token the "
                                    "server printed at start (or was started with)")
            reply.raise_for_status()
        except EnvInfraError:
            await self.close()
            raise
        except Exception as exc:
            await self.close()
            raise EnvInfraError(f"MCP server {self.base} is not healthy: {type(exc).__name__}: {exc}") from exc
        try:
            read, write = await self._stack.enter_async_context(streamable_http_client(self.url, http_client=self.http))
            self.session = await self._stack.enter_async_context(ClientSession(read, write))
            await self.session.initialize()
            listing = await self.session.list_tools()
        except Exception as exc:
            await self.close()
            raise EnvInfraError(f"MCP server {self.url}: {type(exc).__name__}: {exc}") from exc
        self.tools = [{"name": t.name, "description": t.description or "", "inputSchema": t.input_schema}
                      for t in listing.tools]
        return self

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        try:
            result = await asyncio.wait_for(self.session.call_tool(name, arguments), self.timeout_s)
        except Exception as exc:
            raise EnvInfraError(f"MCP tool {name!r} at {self.url}: {type(exc).__name__}: {exc}") from exc
        meta = (result.meta or {}).get("awm", {}) if getattr(result, "meta", None) else {}
        text = "\n".join(part.text for part in result.content if getattr(part, "type", "") == "text")
        kind = meta.get("kind", "http_error" if result.is_error else "ok")
        if kind == "infra_error":
            raise EnvInfraError(f"MCP tool {name!r} at {self.url}: {text}")
        return ToolResult(text, bool(result.is_error), kind)

    async def _control(self, method: str, action: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        url = f"{self.base}/episodes/{self.session_id}/{action}"
        try:
            reply = await self.http.request(method, url, json=body) if body is not None \
                else await self.http.request(method, url)
        except Exception as exc:
            raise EnvInfraError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
        data = reply.json()
        if reply.status_code >= 400:
            raise EnvInfraError(f"{method} {url}: HTTP {reply.status_code}: {data.get('error', data)}")
        return data

    async def state(self) -> dict[str, Any]:
        data = await self._control("GET", "state")
        return {"state_hash": data["state_hash"], "changes": data.get("changes", {})}

    async def verify(self, final_answer: str | None) -> Verdict:
        data = await self._control("POST", "verify", {"final_answer": final_answer})
        return Verdict(**data)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._stack.aclose()


async def open_env(cfg: EnvConfig, scenario: str, task_idx: int) -> EnvSession:
    """A fresh episode of `scenario` bound to task `task_idx`, over the configured transport."""
    if cfg.transport == "mcp":
        url = cfg.mcp_urls[next(_NEXT_URL) % len(cfg.mcp_urls)]
        return await McpEnv(url, scenario, task_idx, cfg.tool_timeout_s + cfg.verifier_timeout_s).start()
    from awm.pool import InfraError

    try:
        episode = await _runtime(cfg).open(scenario, task_idx)
    except InfraError as exc:
        raise EnvInfraError(f"opening {scenario} task {task_idx}: {exc}") from exc
    return InProcessEnv(episode)

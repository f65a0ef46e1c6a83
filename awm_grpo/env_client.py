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
import errno
import hashlib
import itertools
import json
import logging
import os
import sqlite3
import stat
import weakref
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from awm.database import open_readonly, row_columns, table_change
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
    done: bool = False  # the environment ended the episode (AgentGym servers say so): the rollout stops


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
    agentgym: tuple[Any, ...] = ()  # awm_grpo.agentgym.client.AgentGymSpec per AgentGym environment kind

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


# ---- episode state: awm.database's state hash and change summary, each DB read once a change ----------

_HEADER_BYTES = 100
MAX_STATE_DB_BYTES = 64 << 20  # AWM-1K's DBs are KB to a few MB; reading 64 MiB a turn costs the driver ~0.5 s
_TEMPLATES: dict[str, tuple[tuple[int, ...], str, dict[str, Any]]] = {}  # path -> (version, state hash, rows)
_TEMPLATE_CACHE_SIZE = 64  # initial DBs (one a scenario) kept; the oldest is dropped past it
_ROW_JSON = json.JSONEncoder(default=repr)  # what awm.database.state_hash's json.dumps(row, default=repr) uses


def db_version(path: str | os.PathLike[str]) -> tuple[int, ...] | None:
    """What changes whenever the SQLite file's content does, or None when that cannot be told from the file.

    Outside WAL mode SQLite increments the header's file change counter (bytes 24-27) on every commit that
    changes the file (the environment workers keep their journal in memory, so no other file is involved),
    and the commit rewrites the file (mtime); together with the inode and size, a stale match would need a
    file replaced by a same-sized one carrying the same counter within one timestamp tick. WAL-mode files
    (header bytes 18-19 = 2), a journal or WAL file beside the DB, or a short header: None (always read).
    OSError when `path` is not a regular file: env code can put a FIFO there, whose open or read would block."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"not a regular file (mode {st.st_mode:o})", os.fspath(path))
        header = os.pread(fd, _HEADER_BYTES, 0)
    finally:
        os.close(fd)
    if len(header) < _HEADER_BYTES or header[18] == 2 or header[19] == 2:
        return None
    if os.path.exists(f"{os.fspath(path)}-journal") or os.path.exists(f"{os.fspath(path)}-wal"):
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns, int.from_bytes(header[24:28], "big")


def _table_rows(conn: sqlite3.Connection, table: str, hashed: Any = None) -> tuple[list[str], dict[tuple, tuple]]:
    """awm.database._keyed_rows(conn, table) (the same query), read in awm.database.state_hash's row order;
    with `hashed` (a sha256) each row is also fed to it as state_hash does, so one read serves both."""
    cols, pk = row_columns(conn, table)  # stored columns only: a VIRTUAL one would be computed here, at any cost
    key_sql = ", ".join(map(_q, pk)) if pk else "rowid"
    width = len(pk) or 1
    order = ", ".join(str(width + i + 1) for i in range(len(cols)))
    rows = conn.execute(f'SELECT {key_sql}, {", ".join(map(_q, cols))} FROM {_q(table)} ORDER BY {order}').fetchall()
    keyed = {tuple(r[:width]): tuple(r[width:]) for r in rows}
    if hashed is not None:
        encode = _ROW_JSON.encode
        hashed.update(b"".join([encode(r[width:]).encode() for r in rows]))
    return cols, keyed


def _q(name: str) -> str:
    """A quoted SQL identifier (env code names the tables and columns; a name may hold '"')."""
    return '"' + name.replace('"', '""') + '"'


def _read_db(path: str | os.PathLike[str]) -> tuple[str, dict[str, tuple[list[str], dict[tuple, tuple]]]]:
    """(awm.database.state_hash(path), {table: awm.database._keyed_rows(...)}) from one read of the file."""
    h = hashlib.sha256()
    tables: dict[str, tuple[list[str], dict[tuple, tuple]]] = {}
    with open_readonly(path) as conn:  # bounded: value size, wall-clock budget, no ATTACH
        for name, sql in conn.execute("SELECT name, sql FROM sqlite_master WHERE type='table' "
                                      "AND name NOT LIKE 'sqlite_%' ORDER BY name").fetchall():
            h.update(f"T:{name}:{sql}\n".encode())
            tables[name] = _table_rows(conn, name, h)
    return h.hexdigest(), tables


def _template(path: str | os.PathLike[str]) -> tuple[tuple[int, ...] | None, str, dict[str, Any]]:
    """(version, state hash, keyed rows) of an initial DB, kept while the file is unchanged (episodes of a
    scenario share it)."""
    key, version = os.fspath(path), db_version(path)
    cached = _TEMPLATES.get(key)
    if version is not None and cached is not None and cached[0] == version:
        return cached
    found = (version, *_read_db(path))
    if version is not None:
        _TEMPLATES.pop(key, None)
        while len(_TEMPLATES) >= _TEMPLATE_CACHE_SIZE:
            _TEMPLATES.pop(next(iter(_TEMPLATES)))
        _TEMPLATES[key] = found
    return found


def untouched_state(initial_db: str | os.PathLike[str], version: tuple[int, ...] | None) -> dict[str, Any] | None:
    """The state of an episode DB (at `version`, from `db_version`) that no commit has changed since it was
    copied from `initial_db`: the initial DB's hash and no changes; None when that is not certain. A byte
    copy starts with its template's header, and every commit that changes it increments the change counter,
    so the same counter and size mean the same content."""
    template_version, template_hash, _ = _template(initial_db)
    if version is None or template_version is None or version[1:4:2] != template_version[1:4:2]:
        return None
    return {"state_hash": template_hash, "changes": {}}


def read_state(initial_db: str | os.PathLike[str], db_path: str | os.PathLike[str]) -> dict[str, Any]:
    """{"state_hash": awm.database.state_hash(db_path), "changes": awm.database.diff_databases(initial_db,
    db_path)}, from one read of `db_path` (both walk every row of every table) and the initial DB's rows
    kept across episodes: the two functions read the episode's DB twice and the template once a turn."""
    before = _template(initial_db)[2]
    state_hash, after = _read_db(db_path)
    changes: dict[str, dict[str, Any]] = {}
    for name in sorted(before.keys() | after.keys()):
        if name not in before or name not in after:
            changes[name] = {"table": "added" if name in after else "removed"}
            continue
        entry = table_change(before[name][0], before[name][1], after[name][1])
        if entry is not None:
            changes[name] = entry
    return {"state_hash": state_hash, "changes": changes}


def _copy_changes(changes: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """A turn's own copy: later turns may return the same (cached) summary."""
    return {t: {k: list(v) if isinstance(v, list) else v for k, v in e.items()} for t, e in changes.items()}


class InProcessEnv:
    def __init__(self, episode: Any) -> None:
        self.episode = episode
        self.tools = episode.tools
        self._state: dict[str, Any] = {}
        self._state_version: tuple[int, ...] | None = None

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        from awm.runtime.pool import InfraError

        try:
            obs = await self.episode.call(name, arguments)
        except InfraError as exc:
            raise EnvInfraError(f"tool {name!r}: {exc}") from exc
        return ToolResult(obs.text, obs.is_error, obs.kind, obs.latency_s)

    async def state(self) -> dict[str, Any]:
        """{"state_hash", "changes"} as `Episode.state_hash()` and `Episode.changes()` give them; the DB is read
        only when it changed since the last read (`db_version`), which a read-only call never does."""
        try:
            version = db_version(self.episode.db_path)
            size = version[1] if version is not None else os.stat(self.episode.db_path).st_size
            if size > MAX_STATE_DB_BYTES:  # env code can grow its DB; every changed turn reads it whole, here
                raise EnvInfraError(f"episode {self.episode.id}: its DB has grown to {size >> 20} MiB, over the "
                                    f"{MAX_STATE_DB_BYTES >> 20} MiB the trainer reads for a turn's state; an "
                                    "environment that needs more is not a fit for per-turn state diffs")
            if version is None or version != self._state_version:
                state = untouched_state(self.episode.initial_db, version) if not self._state else None
                if state is None:
                    state = await asyncio.to_thread(read_state, self.episode.initial_db, self.episode.db_path)
                self._state, self._state_version = state, version
            return {"state_hash": self._state["state_hash"], "changes": _copy_changes(self._state["changes"])}
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


def shared_http() -> HttpPool:
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
        self.http = http or shared_http()
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
        except orjson.JSONEncodeError as exc:  # a lone surrogate, nesting past orjson's 255 levels: never sent
            return ToolResult(f"Input validation error: the arguments cannot be sent to the tool ({exc})", True,
                              "invalid_arguments")
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
    """A fresh episode of `scenario` bound to task `task_idx`, over the configured transport (AgentGym-protocol
    environments are opened by awm_grpo.rollout.open_episode, which knows both)."""
    if cfg.transport == "mcp":
        url = cfg.mcp_urls[next(_NEXT_URL) % len(cfg.mcp_urls)]
        return await McpEnv(url, scenario, task_idx, cfg.tool_timeout_s + cfg.verifier_timeout_s).start()
    from awm.runtime.pool import InfraError

    try:
        episode = await _runtime(cfg).open(scenario, task_idx)
    except InfraError as exc:
        raise EnvInfraError(f"opening {scenario} task {task_idx}: {exc}") from exc
    return InProcessEnv(episode)

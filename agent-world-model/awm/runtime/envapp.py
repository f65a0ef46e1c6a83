"""Run AWM's generated FastAPI code against per-episode SQLite databases (worker side).

This module is only imported inside worker processes (`awm.runtime.worker`): generated code never
runs in the caller's process.

How one module serves many episodes: while the generated code is imported, SQLAlchemy's
`create_engine` is replaced so that the engine it builds takes its connections from an
`EpisodeRouter`. The worker binds the router to one episode's connection for the duration of
one call, so a handler's `SessionLocal()` reads and writes that episode's DB file and nothing
else. Connections are kept open per episode (opening SQLite and parsing the schema costs more
than a typical handler), and every call ends with a rollback of anything left uncommitted,
as upstream's pool does when a session is dropped.

We do not rewrite the code's text (upstream replaces whole lines, which breaks on multi-line
calls); we load the module and hand requests to its `app` object in-process: straight to the
route's endpoint where FastAPI's handling of that route can be reproduced exactly, else over
ASGI (`awm.runtime.dispatch`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import sys
import time
import traceback
import types
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import jsonschema
import sqlalchemy
import sqlalchemy.engine
from sqlalchemy.pool import StaticPool

from awm.runtime.argcheck import Check, compile_check
from awm.runtime.deadline import ENV_CODE_PREFIX, CallDeadline, CallInterrupted
from awm.runtime.dispatch import Dispatcher, interrupted_reply, short_traceback
from awm.runtime.isolation import guarded_import, module_state
from awm.tools import Observation, ToolSpec, build_request, observation_from_response, tools_from_openapi


class EnvCodeError(RuntimeError):
    """The scenario's environment code failed to import or exposes no app."""


class EpisodeRouter:
    """Hands the current episode's connection to the engines of generated code.

    Each engine the code creates gets a `StaticPool` per episode (made by `pool.recreate()`
    while that episode is bound), and `use()` swaps the engines' pools for the duration of a
    call. A StaticPool keeps its one connection, so a call costs no connect, no schema parse
    and no dialect set-up; its reset-on-return rolls back whatever a handler left open.
    """

    def __init__(self) -> None:
        self.current: sqlite3.Connection | None = None
        self.current_path = ""
        self.engines: list[sqlalchemy.engine.Engine] = []  # filled while a module is imported

    def connect(self) -> sqlite3.Connection:
        if self.current is None:
            raise RuntimeError("environment code opened a DB connection outside a tool call")
        return self.current

    def path(self) -> str:
        """The DB file of the call running now (where a raw `sqlite3.connect(DATABASE_PATH)` goes)."""
        if not self.current_path:
            raise RuntimeError("environment code opened its database outside a tool call")
        return self.current_path

    @contextlib.contextmanager
    def bound(self, conn: sqlite3.Connection, path: str) -> Iterator[None]:
        self.current, self.current_path = conn, path
        try:
            yield
        finally:
            self.current, self.current_path = None, ""
            if conn.in_transaction:
                conn.rollback()


class EpisodeDB:
    """One episode's open connection and its per-engine pools inside a worker."""

    def __init__(self, path: str, deadline: CallDeadline | None = None) -> None:
        self.path = path
        self.conn = sqlite3.connect(path, check_same_thread=False)
        self.deadline = deadline
        if deadline is not None:
            deadline.guard(self.conn)  # slow statements are interrupted at the call's soft deadline
        # No ATTACH: SQL injected through tool arguments must not reach other episodes' files.
        self.conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        # Rollback journal in memory, no fsync: transactions still roll back, and a DB that a
        # dying worker leaves half-written belongs to an episode already marked failed.
        # Measured: writes 4x and resets 3x faster on these throwaway files; reads unchanged.
        self.conn.execute("PRAGMA journal_mode=MEMORY")
        self.conn.execute("PRAGMA synchronous=OFF")
        self.pools: dict[int, Any] = {}

    @contextlib.contextmanager
    def use(self, env: LoadedEnv, router: EpisodeRouter) -> Iterator[None]:
        with router.bound(self.conn, self.path):
            for engine in env.engines:
                pool = self.pools.get(id(engine))
                if pool is None:
                    pool = self.pools[id(engine)] = env.idle_pools[id(engine)].recreate()
                engine.pool = pool
            try:
                yield
            finally:  # work left behind (a thread, a callback) finds no connection, not the next episode's
                for engine in env.engines:
                    engine.pool = env.idle_pools[id(engine)]

    def close(self) -> None:
        for pool in self.pools.values():
            pool.dispose()
        self.conn.close()


@contextlib.contextmanager
def _routed_create_engine(router: EpisodeRouter) -> Iterator[None]:
    real = sqlalchemy.create_engine

    def create_engine(url: Any = None, *args: Any, **kwargs: Any) -> sqlalchemy.engine.Engine:
        if not str(url).startswith("sqlite"):
            raise EnvCodeError(f"environment code asked for a non-SQLite database ({url!r}); AWM uses SQLite only")
        engine = real("sqlite://", creator=router.connect, poolclass=StaticPool)
        router.engines.append(engine)
        return engine

    sqlalchemy.create_engine = sqlalchemy.engine.create_engine = create_engine
    try:
        yield
    finally:
        sqlalchemy.create_engine = sqlalchemy.engine.create_engine = real


@dataclass
class LoadedEnv:
    """One scenario's app inside a worker."""

    scenario: str
    module: types.ModuleType
    app: Any
    tools: dict[str, ToolSpec]
    validators: dict[str, jsonschema.protocols.Validator]
    checks: dict[str, Check | None]  # cheap pre-checks in front of `validators` (awm.runtime.argcheck)
    load_s: float
    created_sql: list[str]  # DDL that the code's import-time `create_all` added to the DB
    engines: list[sqlalchemy.engine.Engine]
    idle_pools: dict[int, Any]  # per engine: a pool whose connect fails (bound between calls)
    module_state: list[str]  # module-level names its functions change: one instance per episode
    dispatcher: Dispatcher  # how a request reaches `app`: directly or over ASGI


def load_env(scenario: str, code: str, router: EpisodeRouter, scratch_db: str,
             known_tools: list[dict[str, Any]] | None = None, database_path: str | None = None,
             direct: bool = True) -> LoadedEnv:
    """Import generated code as a fresh module; its import-time DB work hits `scratch_db`.

    `known_tools` (the same code's tool specs, derived by another worker) skips building the
    OpenAPI document, about half of a load. `database_path`: what $DATABASE_PATH names for the
    code (a path `route_sqlite_connect` sends to the current call's DB); default `scratch_db`.
    A module that patches shared library code at import is refused (see `awm.runtime.isolation`).
    `direct=False` sends every call over ASGI (to compare the two paths).
    """
    if not code or not code.strip():
        raise EnvCodeError(f"scenario {scenario!r} has no environment code (gen_envs full_code is empty)")
    t0 = time.perf_counter()
    name = f"awm_env_{scenario}_{id(router)}_{int(t0 * 1e6)}"
    module = types.ModuleType(name)
    module.__file__ = f"{ENV_CODE_PREFIX}{scenario}>"
    sys.modules[name] = module  # pydantic resolves forward references through sys.modules
    scratch = sqlite3.connect(scratch_db, check_same_thread=False)
    router.engines = []
    before = {r[0] for r in scratch.execute("SELECT name FROM sqlite_master")}
    os.environ["DATABASE_PATH"] = f"sqlite:///{database_path or scratch_db}"  # for code that reads the URL itself
    try:
        with guarded_import() as patched:
            with warnings.catch_warnings(), _routed_create_engine(router), router.bound(scratch, scratch_db):
                warnings.simplefilter("ignore")
                exec(compile(code, module.__file__, "exec"), module.__dict__)  # noqa: S102 - isolated worker
                scratch.commit()
        created_sql = [sql for name_, sql in scratch.execute("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL "
                                                             "ORDER BY type = 'index', rowid") if name_ not in before]
    except EnvCodeError:
        sys.modules.pop(name, None)
        raise
    except BaseException as exc:  # a broken module must not take the worker down
        sys.modules.pop(name, None)
        raise EnvCodeError(f"scenario {scenario!r}: environment code failed to import: "
                           f"{type(exc).__name__}: {exc}\n{short_traceback()}") from None
    finally:
        scratch.close()
    engines, router.engines = router.engines, []
    if patched:
        sys.modules.pop(name, None)
        raise EnvCodeError(f"scenario {scenario!r}: environment code patches shared library code at import "
                           f"({', '.join(patched[:5])}); on a shared worker that would change other scenarios' "
                           "behaviour, so it is refused (the patch was undone)")
    idle_pools = {id(engine): engine.pool.recreate() for engine in engines}  # never connected: connect fails
    for engine in engines:
        engine.pool = idle_pools[id(engine)]
    app = getattr(module, "app", None)
    if app is None or not callable(app):
        sys.modules.pop(name, None)
        raise EnvCodeError(f"scenario {scenario!r}: environment code defines no FastAPI `app`")
    try:
        specs = [ToolSpec.from_dict(t) for t in known_tools] if known_tools else tools_from_openapi(app.openapi())
    except Exception as exc:
        sys.modules.pop(name, None)
        raise EnvCodeError(f"scenario {scenario!r}: cannot build the OpenAPI document: {exc}") from None
    tools = {t.name: t for t in specs}
    validators = {}
    for t in specs:
        cls = jsonschema.validators.validator_for(t.input_schema, default=jsonschema.Draft202012Validator)
        validators[t.name] = cls(t.input_schema)
    checks = {t.name: compile_check(t.input_schema) for t in specs}
    return LoadedEnv(scenario, module, app, tools, validators, checks, time.perf_counter() - t0, created_sql, engines,
                     idle_pools, module_state(code), Dispatcher(app, direct=direct))


def unload_env(env: LoadedEnv) -> None:
    sys.modules.pop(env.module.__name__, None)
    env.module.__dict__.clear()


def _validation_message(err: jsonschema.ValidationError) -> str:
    where = "/".join(str(p) for p in err.absolute_path)
    return f"{where}: {err.message}" if where else err.message


async def call_tool(env: LoadedEnv, router: EpisodeRouter, db: EpisodeDB, name: str, arguments: Any) -> Observation:
    """Validate and dispatch one tool call against the episode's database `db`.

    The soft deadline's interrupt can land outside the dispatcher's guard: in its own handling of the
    scenario's failure (formatting an exception whose `__str__` is the scenario's), or late, after the
    scenario's frames returned (CPython delivers an async exception at the thread's next check). It is
    the same interrupted call either way; its log detail keeps frame names only, since formatting the
    exception chain would call the scenario's code again."""
    try:
        return await _call_tool(env, router, db, name, arguments)
    except CallInterrupted as exc:
        frames = "".join(traceback.format_list(traceback.extract_tb(exc.__traceback__, limit=-6)))
        status, body, obs_detail = interrupted_reply(frames)
        obs = observation_from_response(name, status, body)
        obs.detail = obs_detail
        return obs


async def _call_tool(env: LoadedEnv, router: EpisodeRouter, db: EpisodeDB, name: str, arguments: Any) -> Observation:
    t0 = time.perf_counter()
    tool = env.tools.get(name) if type(name) is str else None
    if tool is None:
        known = ", ".join(sorted(env.tools))
        shown = name[:200].encode("utf-8", "backslashreplace").decode() if type(name) is str \
            else f"<{type(name).__name__}>"  # whatever the caller sent, as valid text
        return Observation(f"Error: unknown tool '{shown}'. Available tools: {known}", is_error=True,
                           kind="unknown_tool")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError as exc:
            return Observation(f"Input validation error: arguments are not valid JSON ({exc})", is_error=True,
                               kind="invalid_arguments")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return Observation("Input validation error: arguments must be a JSON object", is_error=True,
                           kind="invalid_arguments")
    check = env.checks[name]
    try:
        error = None if check is not None and check(arguments) else next(
            iter(env.validators[name].iter_errors(arguments)), None)
        problem = _validation_message(error) if error is not None else None
        req = build_request(tool, arguments) if problem is None else None
    except RecursionError:  # a value nested deeper than the validator can walk
        problem = "arguments are nested too deeply"
    except UnicodeEncodeError as exc:  # a lone surrogate (from a "\\ud800" escape) where the request needs UTF-8
        problem = f"arguments hold text that is not valid Unicode ({exc.object[exc.start:exc.end]!a})"
    if problem is not None:
        return Observation(f"Input validation error: {problem}", is_error=True, kind="invalid_arguments")
    with db.use(env, router):  # the worker serves one request at a time, so no other call interleaves
        status, body, server_error = await env.dispatcher.call(req, tool.path)
        if status == 500 and db.deadline is not None and db.deadline.passed():
            # Two enforcers race past the deadline (SQLite's progress handler, the watcher thread):
            # whichever fired, or whatever the handler made of it, the call was interrupted.
            status, body, server_error = interrupted_reply(server_error)
    if status == 500 and server_error and any(sign in server_error for sign in _NO_ROOM):
        # the episode's DB lives in a file system all episodes share (/dev/shm by default): a full one is the
        # machinery's failure (some episode filled it), never the agent's; the worker answers with an error
        raise DiskFull(f"tool {name!r} could not write its DB: {server_error.splitlines()[0][:300]}")
    obs = observation_from_response(name, status, body)
    obs.detail = server_error
    obs.latency_s = time.perf_counter() - t0
    return obs


_NO_ROOM = ("database or disk is full", "No space left on device", "Disk quota exceeded")


class DiskFull(RuntimeError):
    """A call's write found no room: an infrastructure failure (`Episode.call` raises InfraError)."""

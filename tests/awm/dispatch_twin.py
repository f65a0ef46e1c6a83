"""Run every tool of some scenarios both ways (direct dispatch, ASGI) and report any difference.

    python tests/awm/dispatch_twin.py CACHE_DIR DATA_DIR[:SCENARIO,...] ...   -> JSON on stdout

A separate process, as a worker is: generated code and the patched `sqlite3.connect` stay out of
pytest. Each scenario is loaded twice (one module instance per side, so module state evolves alike)
on two episode DBs; each case restores both DBs from the template, seeds `random`, calls one side
each way and compares status, body bytes, the first line of the server error and the DB state
(file bytes, else sha256 of `iterdump()`). Python's clock is frozen inside the modules (their
`datetime` names and SQLAlchemy column defaults); SQLite's own clock (CURRENT_TIMESTAMP) ticks
per second, so a case whose two calls straddle a second boundary is run again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import hashlib
import json
import os
import random
import re
import sqlite3
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

from awm.episode import EnvRuntime
from awm.health import probe_arguments
from awm.runtime.deadline import CallDeadline
from awm.runtime.dispatch import Dispatcher
from awm.runtime.envapp import EpisodeDB, EpisodeRouter, LoadedEnv, call_tool, load_env
from awm.runtime.isolation import route_sqlite_connect
from awm.solutions import load_probes, load_solutions
from awm.tools import HttpRequest, ToolSpec, build_request

_REAL = dt.datetime
_NOW = _REAL(2025, 6, 1, 12, 0, 0)
_SKIP_TOOLS = {"crash", "slow"}  # kill or stall the process: covered by the hostile-env tests


class FrozenDateTime(_REAL):
    """`datetime` with a fixed now; every constructor returns a real datetime."""

    def __new__(cls, *args: Any, **kwargs: Any) -> dt.datetime:  # noqa: D102
        return _REAL(*args, **kwargs)

    @classmethod
    def now(cls, tz: dt.tzinfo | None = None) -> dt.datetime:  # noqa: D102
        return _NOW.replace(tzinfo=dt.UTC).astimezone(tz) if tz else _NOW

    @classmethod
    def utcnow(cls) -> dt.datetime:  # noqa: D102
        return _NOW

    @classmethod
    def today(cls) -> dt.datetime:  # noqa: D102
        return _NOW


for _name in ("fromisoformat", "strptime", "combine", "fromtimestamp", "utcfromtimestamp", "fromordinal"):
    setattr(FrozenDateTime, _name, getattr(_REAL, _name))


def _frozen_default(fn: Any) -> Any:
    if getattr(fn, "__self__", None) is _REAL and fn.__name__ in ("now", "utcnow", "today"):
        return lambda *_: _NOW
    return None


def freeze_clock(module: types.ModuleType) -> None:
    """Pin what the module's handlers and column defaults read as 'now'."""
    frozen_mod = types.SimpleNamespace(**{**vars(dt), "datetime": FrozenDateTime})
    for name, value in list(vars(module).items()):
        if value is _REAL:
            setattr(module, name, FrozenDateTime)
        elif value is dt:
            setattr(module, name, frozen_mod)
    for value in list(vars(module).values()):
        table = getattr(value, "__table__", None)
        for column in getattr(table, "columns", ()):
            for default in (column.default, column.onupdate):
                fn = getattr(default, "arg", None)
                original = getattr(fn, "__wrapped__", fn)
                if callable(fn) and _frozen_default(original) is not None:
                    default.arg = _frozen_default(original)


def first_line(error: str) -> str:
    """The error's first line, object addresses masked (`<Thread at 0x7f...>` differs per run)."""
    return re.sub(r"0x[0-9a-fA-F]+", "0x?", error.split("\n", 1)[0])


def db_state(db: EpisodeDB) -> str:
    return hashlib.sha256("\n".join(db.conn.iterdump()).encode()).hexdigest()


def file_hash(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class Side:
    """One module instance and one episode DB, served one way."""

    def __init__(self, env: LoadedEnv, direct: bool, db_path: str, template: str, router: EpisodeRouter,
                 deadline: CallDeadline) -> None:
        self.env, self.router, self.deadline, self.template = env, router, deadline, template
        env.dispatcher = Dispatcher(env.app, direct=direct)
        if not getattr(env.module, "_awm_frozen", False):
            freeze_clock(env.module)
            env.module._awm_frozen = True
        self.db = EpisodeDB(db_path, deadline)

    def restore(self, seed: int) -> None:
        src = sqlite3.connect(f"file:{self.template}?mode=ro", uri=True)
        try:
            src.backup(self.db.conn)
        finally:
            src.close()
        random.seed(seed)

    async def request(self, req: HttpRequest, route_path: str) -> tuple[int, bytes, str]:
        with self.deadline.running(5.0), self.db.use(self.env, self.router):
            return await self.env.dispatcher.call(req, route_path)

    async def observe(self, tool: str, arguments: Any) -> dict[str, Any]:
        with self.deadline.running(5.0):
            obs = await call_tool(self.env, self.router, self.db, tool, arguments)
        return {"text": obs.text, "is_error": obs.is_error, "kind": obs.kind, "status": obs.status,
                "error": first_line(obs.detail)}


_WRONG = {"integer": "not-a-number", "number": "NaN-ish", "boolean": "maybe", "string": ["not", "a", "string"],
          "array": "not-a-list", "object": "not-an-object"}


def _type_of(schema: dict[str, Any]) -> str:
    return schema.get("type") or next((s.get("type") for s in schema.get("anyOf", []) if s.get("type") != "null"),
                                      "string")


def cases(tool: ToolSpec, known: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(label, arguments): valid ones, then invalid ones that reach the app past the MCP schema check."""
    valid = [("probe", probe_arguments(tool)), ("probe_ids_1", probe_arguments(tool, use_examples=False))]
    valid += [(f"known{i}", args) for i, args in enumerate(known)]
    out = list(valid)
    base = valid[0][1]
    props = tool.input_schema.get("properties", {})
    for name in tool.input_schema.get("required", []):
        if name not in tool.path_params:
            out.append((f"missing:{name}", {k: v for k, v in base.items() if k != name}))
            break
    for name in [*tool.path_params, *tool.query_params, *tool.body_params][:2]:
        out.append((f"wrong:{name}", {**base, name: _WRONG.get(_type_of(props.get(name, {})), 12345)}))
    out.append(("unknown_arg", {**base, "unexpected_argument": "x"}))
    for name in tool.path_params[:1]:
        out += [(f"path:{name}=''", {**base, name: ""}), (f"path:{name}=a/b", {**base, name: "a/b"}),
                (f"path:{name}=1.0", {**base, name: 1.0})]
    if tool.body_params:
        out.append(("body:null_fields", {**base, **{k: None for k in tool.body_params}}))
    return out


async def compare(direct: Side, asgi: Side, tool: ToolSpec, label: str, args: dict[str, Any], seed: int,
                  valid: bool) -> dict[str, Any]:
    """Run one case both ways (again while the two calls straddle a second); the differences found."""
    try:
        req = build_request(tool, args)
    except (KeyError, TypeError, ValueError, UnicodeError) as exc:
        return {"skipped": f"{type(exc).__name__}: {exc}"}
    for _ in range(5):
        second = int(time.time())
        results = []
        for side in (direct, asgi):
            side.restore(seed)
            served = side.env.dispatcher.calls["direct"]
            status, body, error = await side.request(req, tool.path)
            results.append({"status": status, "body": body.decode("utf-8", "replace"),
                            "error": first_line(error), "file": file_hash(side.db.path),
                            "direct": side.env.dispatcher.calls["direct"] > served})
            if valid:
                side.restore(seed)
                results[-1]["observation"] = await side.observe(tool.name, args)
        if int(time.time()) == second:
            break
    d, a = results
    diff = [k for k in ("status", "body", "error", "observation") if d.get(k) != a.get(k)]
    if d["file"] != a["file"]:
        for side in (direct, asgi):  # file bytes differ: compare the logical content
            side.restore(seed)
            await side.request(req, tool.path)
        if db_state(direct.db) != db_state(asgi.db):
            diff.append("db")
    return {"tool": tool.name, "case": label, "status": a["status"], "direct": d["direct"], "diff": diff,
            **({"direct_result": d, "asgi_result": a} if diff else {})}


async def run_scenario(rt: EnvRuntime, scenario: str, known: dict[str, list[dict[str, Any]]], work: str) -> dict:
    await rt.tools(scenario)  # builds the template, completed with what the code's create_all adds
    template, _ = rt.template(scenario)
    code = rt.dataset.scenario(scenario).full_code
    router, deadline = EpisodeRouter(), CallDeadline()
    route_sqlite_connect(os.path.join(work, "current-episode.db"), router.path)
    sides, env = [], None
    for direct in (True, False):
        scratch = os.path.join(work, f"{scenario}-{direct}-scratch.db")
        Path(scratch).write_bytes(Path(template).read_bytes())
        if env is None or env.module_state:  # module state: one instance per side, evolving alike
            env = load_env(scenario, code, router, scratch, None, os.path.join(work, "current-episode.db"))
        else:  # no module state: both sides share the module, each with its own dispatcher
            env = dataclasses.replace(env)
        db_path = os.path.join(work, f"{scenario}-{direct}.db")
        Path(db_path).write_bytes(Path(template).read_bytes())
        sides.append(Side(env, direct, db_path, str(template), router, deadline))
    results, seed = [], 0
    for tool in sides[0].env.tools.values():
        if tool.name in _SKIP_TOOLS:
            continue
        for i, (label, args) in enumerate(cases(tool, known.get(tool.name, []))):
            seed += 1
            valid = i == 0  # the whole call path (schema check, observation text) once per tool
            results.append({**await compare(*sides, tool, label, args, seed, valid), "scenario": scenario})
    reasons = {f"{m} {p}": r for (m, p), r in sides[0].env.dispatcher.reason.items() if r}
    return {"scenario": scenario, "results": results, "fallback": reasons}


async def main(cache: str, specs: list[str]) -> list[dict[str, Any]]:
    out = []
    with tempfile.TemporaryDirectory() as work:
        for spec in specs:
            data_dir, _, names = spec.partition(":")
            known: dict[str, list[dict[str, Any]]] = {}
            bundled = Path(data_dir, "reference_solutions.jsonl").exists()
            calls = []
            if bundled:
                calls = [c for sol in load_solutions(data_dir).values() for c in sol.calls + sol.wrong_calls]
                calls += [c for probes in load_probes(data_dir).values() for c in probes]
            for c in calls:
                known.setdefault(c["tool"], []).append(c.get("arguments") or {})
            with EnvRuntime(data_dir, num_workers=1, cache_dir=cache, clock="2025-06-01T12:00:00") as rt:
                scenarios = names.split(",") if names else [
                    name for name in rt.dataset.scenario_names() if rt.dataset.scenario(name).full_code]
                for scenario in scenarios:
                    # a tool's known calls are shared by scenarios with the same tool name: keep a few
                    out.append(await run_scenario(rt, scenario, {k: v[:3] for k, v in known.items()}, work))
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2:]))))

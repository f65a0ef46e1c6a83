"""CPU cost of one tool call inside a worker-like process: the bare endpoint, and the whole in-worker call.

    python benchmarks/handler_cost.py DATA_DIR SCENARIO TEMPLATE_DB '[["tool", {args}], ...]'   -> JSON

Run by `env_throughput.py` in a separate process (generated code stays out of the benchmark's own
process, as in a worker). Per tool it reports the CPU microseconds of:
- `endpoint`: the route's endpoint function called directly with arguments FastAPI validated
  beforehand, inside the episode's DB binding: the handler's own cost, what no dispatch can go below;
- `direct` / `asgi`: `awm.runtime.envapp.call_tool` (schema check, dispatch, observation) each way, under the
  call deadline, as a worker runs it (no socket, no caller).
Each figure is the best of several rounds of thread CPU time (other processes on a busy machine
inflate every round; the best round is the closest to the code's own cost).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

from awm.data import AWMDataset
from awm.runtime.deadline import CallDeadline
from awm.runtime.dispatch import Dispatcher
from awm.runtime.envapp import EpisodeDB, EpisodeRouter, LoadedEnv, call_tool, load_env
from awm.runtime.isolation import route_sqlite_connect
from awm.tools import build_request
from fastapi.dependencies.utils import request_params_to_args
from starlette.datastructures import QueryParams


async def best_cpu_us(fn: Callable[[], Awaitable[Any]], calls: int = 300, rounds: int = 7) -> float:
    """Best-of-`rounds` thread CPU microseconds per call of `fn`."""
    for _ in range(30):
        await fn()
    best = float("inf")
    for _ in range(rounds):
        t = time.thread_time()
        for _ in range(calls):
            await fn()
        best = min(best, (time.thread_time() - t) / calls * 1e6)
    return best


def endpoint_call(env: LoadedEnv, dispatcher: Dispatcher, tool: str, args: dict[str, Any]) -> Callable[[], Awaitable[Any]]:
    """The endpoint of `tool` with FastAPI-validated arguments (path and query tools only)."""
    spec = env.tools[tool]
    route = dispatcher.compile(spec.method, spec.path)
    if route is None or route.route.body_field is not None or route.route.dependant.dependencies:
        raise SystemExit(f"{tool}: only direct routes without a body or dependencies are measured "
                         f"({dispatcher.reason.get((spec.method, spec.path)) or 'it has a body or dependencies'})")
    req = build_request(spec, args)
    dep = route.route.dependant
    values, errors = request_params_to_args(dep.path_params, route.path_params(req.path))
    query, query_errors = request_params_to_args(dep.query_params, QueryParams(req.query_string))
    if errors or query_errors:
        raise SystemExit(f"{tool}: arguments {args} do not validate: {errors + query_errors}")
    values.update(query)
    return lambda: dep.call(**values)


async def main(data_dir: str, scenario: str, template: str, tools: list[tuple[str, dict[str, Any]]]) -> dict:
    code = AWMDataset(data_dir).scenario(scenario).full_code
    work = tempfile.mkdtemp(prefix="awm-handler-cost-")
    try:
        router, deadline = EpisodeRouter(), CallDeadline()
        current = os.path.join(work, "current-episode.db")
        route_sqlite_connect(current, router.path)
        scratch, db_path = os.path.join(work, "scratch.db"), os.path.join(work, "episode.db")
        shutil.copyfile(template, scratch)
        shutil.copyfile(template, db_path)
        env = load_env(scenario, code, router, scratch, None, current)
        db = EpisodeDB(db_path, deadline)
        direct, asgi = env.dispatcher, Dispatcher(env.app, direct=False)
        out = {}
        for tool, args in tools:
            endpoint = endpoint_call(env, direct, tool, args)

            async def bare(endpoint: Callable[[], Awaitable[Any]] = endpoint) -> Any:
                with db.use(env, router):
                    return await endpoint()

            def whole(dispatcher: Dispatcher, tool: str = tool, args: dict = args) -> Callable[[], Awaitable[Any]]:
                async def call() -> Any:
                    env.dispatcher = dispatcher
                    with deadline.running(8.0):
                        return await call_tool(env, router, db, tool, args)
                return call

            figures = {"endpoint": [], "direct": [], "asgi": []}
            for _ in range(2):  # interleaved, so a burst of load elsewhere hits all three alike
                for name, fn in (("endpoint", bare), ("direct", whole(direct)), ("asgi", whole(asgi))):
                    figures[name].append(await best_cpu_us(fn))
            out[tool] = {name: min(values) for name, values in figures.items()}
        env.dispatcher = direct
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    data_dir_, scenario_, template_, tools_ = sys.argv[1:5]
    print(json.dumps(asyncio.run(main(data_dir_, scenario_, template_, [tuple(t) for t in json.loads(tools_)]))))

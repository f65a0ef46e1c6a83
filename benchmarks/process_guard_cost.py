"""Per-request CPU cost of the worker's process guard (`awm.runtime.isolation.ProcessGuard`), real libraries.

    .venv/bin/python benchmarks/process_guard_cost.py [DATA_DIR] [--scenario NAME]   # default: bundled data

A real `awm.runtime.worker.Worker` in this process (no lockdown, no socket) loads every scenario of DATA_DIR,
so every library module a worker holds is loaded and watched, and serves tool calls through `Worker.handle`,
first with the guard switched off (no audit hook installed yet), then with it. Reported, best of several
rounds of thread CPU time:
- `handle("call")` of one read-only tool without the guard (no audit hook installed yet) and with it; then
  the check switched off and on in turns (the audit hook, once installed, stays in both): the check's cost
  without the drift of a noisy machine between the first two figures; and the hook's cost per audited event
  (`id()` is one; a tool call raises about a dozen);
- the check alone (`with guard.watch("call", ...)` around nothing), and the full check before/after a load;
- how many namespaces are watched, and how many after every request.
Prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from awm.data import AWMDataset, bundled_data_dir
from awm.episode import EnvRuntime
from awm.health import probe_arguments
from awm.runtime import isolation, worker


class _NoGuard:
    """Stands in for the guard while the unguarded figure is taken."""

    def watch(self, op: str, scenario: str | None) -> _NoGuard:
        return self

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: object) -> None:
        pass


def best_us(fn: Callable[[], Any], n: int, rounds: int = 9) -> float:
    best = float("inf")
    for _ in range(rounds):
        t = time.thread_time()
        for _ in range(n):
            fn()
        best = min(best, (time.thread_time() - t) / n * 1e6)
    return best


def main(data_dir: str, scenario: str | None) -> dict[str, Any]:
    ds = AWMDataset(data_dir)
    work = tempfile.mkdtemp(prefix="awm-guard-cost-")
    try:
        with EnvRuntime(data_dir, num_workers=1, cache_dir=work) as rt:
            templates = {sc: str(rt.template(sc)[0]) for sc in ds.scenario_names()}
        loop = asyncio.new_event_loop()  # before the guard's snapshot, as in a worker (asyncio's policy set)
        asyncio.set_event_loop(loop)
        real_guard = worker.ProcessGuard
        worker.ProcessGuard = lambda *a, **k: _NoGuard()  # type: ignore[assignment,misc]
        try:
            w = worker.Worker(work)
        finally:
            worker.ProcessGuard = real_guard

        def handle(op: str, payload: dict[str, Any]) -> Any:
            ok, result = loop.run_until_complete(w.handle(op, payload))
            if not ok:
                raise SystemExit(f"{op} failed: {result}")
            return result

        for sc, template in templates.items():
            handle("load", {"scenario": sc, "code": ds.scenario(sc).full_code, "template": template})
        sc = scenario or next(iter(templates))
        db = os.path.join(work, "episode.db")
        shutil.copyfile(templates[sc], db)
        handle("open", {"scenario": sc, "episode": "e1", "db_path": db})
        spec = next(t for t in w.envs[sc].tools.values() if t.read_only)
        payload = {"episode": "e1", "tool": spec.name, "arguments": probe_arguments(spec),
                   "soft_timeout_s": 10}
        call = lambda: handle("call", payload)  # noqa: E731
        call()
        probe = object()
        id_us = best_us(lambda: id(probe), 100_000)
        without = best_us(call, 300)  # no audit hook in the process yet

        w.guard = guard = isolation.ProcessGuard({"DATABASE_PATH": f"sqlite:///{w.database_path}"})
        hook_us = best_us(lambda: id(probe), 100_000) - id_us  # `id()` is an audited event
        call()
        alternated: dict[str, float] = {"off": float("inf"), "on": float("inf")}
        for _ in range(30):  # the check on and off in turns (the audit hook stays: it cannot be removed)
            for key, g in (("off", _NoGuard()), ("on", guard)):
                w.guard = g
                alternated[key] = min(alternated[key], best_us(call, 100, rounds=1))
        w.guard = guard
        with_guard = best_us(call, 300)

        def bare_check() -> None:
            with guard.watch("call", sc):
                pass

        out = {"python": sys.version.split()[0], "scenarios loaded": len(templates),
               "namespaces watched": len(guard.hot) + sum(len(p) for p in guard.cold),
               "namespaces checked after every request": len(guard.hot) + len(guard.cold[0]),
               "check after one request (us)": round(best_us(bare_check, 20_000), 2),
               "full check before or after a load (us)": round(best_us(lambda: guard.check(True), 20, 5), 1),
               f"Worker.handle call {sc}.{spec.name} (us)": {
                   "without guard (no audit hook)": round(without, 1), "with guard": round(with_guard, 1),
                   "check off / on in turns (audit hook in both)": [round(alternated["off"], 1),
                                                                    round(alternated["on"], 1)]},
               "audit hook per audited event (us)": round(hook_us, 3),
               "refused": guard.refused}
        handle("close", {"episode": "e1"})
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data_dir", nargs="?", default=None, help="AWM data directory (default: bundled)")
    p.add_argument("--scenario", default=None, help="whose read-only tool is called (default: first)")
    a = p.parse_args()
    print(json.dumps(main(a.data_dir or str(bundled_data_dir()), a.scenario), indent=1))

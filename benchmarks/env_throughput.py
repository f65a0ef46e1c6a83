"""Environment runtime benchmark: reset latency, tool calls/s, memory per episode, verifier latency.

    .venv/bin/python benchmarks/env_throughput.py                      # bundled scenario
    .venv/bin/python benchmarks/env_throughput.py --data-dir ../shared/awm_1k_excerpt --scenario content_platform_1

Prints one table. Figures depend on the machine; the issue's targets (2-core machine):
reset p99 <= 5 ms, >= 2,500 tool calls/s with 16 concurrent episodes, <= 20 MB per open
episode, 1,024 concurrent open episodes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

from awm.episode import EnvRuntime
from awm.health import probe_arguments
from awm.solutions import load_solutions, replay


def pss_bytes(pid: int) -> int:
    """Proportional set size of one process (shared pages split fairly), from /proc."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def footprint(rt: EnvRuntime) -> int:
    """Memory of everything an episode costs: caller, workers and episode files (tmpfs is RAM)."""
    pids = [os.getpid()] + [s.proc.pid for s in rt.pool.slots if s.proc and s.proc.poll() is None]
    files = sum(p.stat().st_size for p in rt.episode_dir.rglob("*.db"))  # episode files sit in per-worker dirs
    return sum(pss_bytes(p) for p in pids) + files


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def pick_tool(rt: EnvRuntime, scenario: str, name: str | None) -> tuple[str, dict]:
    """The named tool, or the first read-only tool that answers its probe without an error."""
    ep = await rt.open(scenario)
    try:
        for spec in ep.tool_specs:
            if (name and spec.name != name) or (not name and not spec.read_only):
                continue
            for args in (probe_arguments(spec), probe_arguments(spec, use_examples=False)):
                if not (await ep.call(spec.name, args)).is_error:
                    return spec.name, args
        raise SystemExit(f"no usable read-only tool in {scenario}; pass --tool")
    finally:
        await ep.close()


async def calls_per_second(rt: EnvRuntime, scenario: str, tool: str, args: dict, episodes: int,
                           seconds: float) -> tuple[float, float]:
    eps = [await rt.open(scenario) for _ in range(episodes)]
    stop = time.perf_counter() + seconds
    latencies: list[float] = []

    async def loop(ep) -> int:
        n = 0
        while time.perf_counter() < stop:
            t = time.perf_counter()
            await ep.call(tool, args)
            latencies.append(time.perf_counter() - t)
            n += 1
        return n

    t0 = time.perf_counter()
    total = sum(await asyncio.gather(*(loop(e) for e in eps)))
    rate = total / (time.perf_counter() - t0)
    await asyncio.gather(*(e.close() for e in eps))
    return rate, statistics.median(latencies)


async def main(args: argparse.Namespace) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    t0 = time.perf_counter()
    with EnvRuntime(args.data_dir, num_workers=args.workers) as rt:
        scenario = args.scenario or rt.dataset.scenario_names(runnable_only=True)[0]
        await rt.tools(scenario)
        rows.append(("scenario", f"{scenario} ({len(rt._tools[scenario])} tools)"))
        rows.append(("first load (template build + import in a worker)", f"{(time.perf_counter() - t0) * 1e3:.0f} ms"))
        tool, tool_args = await pick_tool(rt, scenario, args.tool)

        opens, resets = [], []
        for _ in range(args.samples):
            t = time.perf_counter()
            ep = await rt.open(scenario)
            opens.append(time.perf_counter() - t)
            await ep.call(tool, tool_args)
            t = time.perf_counter()
            await ep.reset()
            resets.append(time.perf_counter() - t)
            await ep.close()
        rows.append(("episode open  p50 / p99", f"{pct(opens, .5) * 1e3:.2f} / {pct(opens, .99) * 1e3:.2f} ms"))
        rows.append(("episode reset p50 / p99", f"{pct(resets, .5) * 1e3:.2f} / {pct(resets, .99) * 1e3:.2f} ms"))

        for n in args.concurrency:
            rate, med = await calls_per_second(rt, scenario, tool, tool_args, n, args.seconds)
            rows.append((f"tool calls/s, {n} concurrent episodes ({tool})", f"{rate:,.0f}/s (median {med * 1e3:.2f} ms)"))

        before = footprint(rt)
        eps = await asyncio.gather(*(rt.open(scenario) for _ in range(args.open_episodes)))
        for ep in eps:
            await ep.call(tool, tool_args)  # every connection opened and used
        after = footprint(rt)
        rows.append((f"{args.open_episodes} open episodes: memory per episode",
                     f"{(after - before) / len(eps) / 2**20:.2f} MB (all {after / 2**20:,.0f} MB)"))
        await asyncio.gather(*(e.close() for e in eps))

    if args.data_dir is None:  # verifier latency on the bundled reference solutions
        solutions = load_solutions()
        with EnvRuntime(num_workers=args.workers) as rt:
            ep = await rt.open(*sorted(solutions)[3])
            sol = solutions[(ep.scenario, ep.task_idx)]
            await replay(ep, sol.calls)
            await ep.verify(sol.final_answer)  # sandbox start
            lat = []
            for _ in range(args.samples):
                t = time.perf_counter()
                assert (await ep.verify(sol.final_answer)).verdict == "complete"
                lat.append(time.perf_counter() - t)
            rows.append(("verifier (sandboxed) p50 / p99", f"{pct(lat, .5) * 1e3:.2f} / {pct(lat, .99) * 1e3:.2f} ms"))
            t = time.perf_counter()
            verdicts = await asyncio.gather(*(ep.verify(sol.final_answer) for _ in range(64)))
            rows.append(("verifier, 64 concurrent", f"{64 / (time.perf_counter() - t):,.0f} verifications/s "
                         f"({sum(v.complete for v in verdicts)}/64 complete)"))
    return rows


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", default=None, help="AWM data directory (default: bundled scenarios)")
    p.add_argument("--scenario", default=None)
    p.add_argument("--tool", default=None, help="tool to call (default: first read-only tool that works)")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: CPU count)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[16, 256])
    p.add_argument("--seconds", type=float, default=5.0, help="duration of each throughput run")
    p.add_argument("--samples", type=int, default=300, help="samples for latency percentiles")
    p.add_argument("--open-episodes", type=int, default=1024)
    args = p.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs", file=sys.stderr)
    rows = asyncio.run(main(args))
    width = max(len(k) for k, _ in rows)
    print(f"{'measure':{width}}  value")
    print("-" * (width + 30))
    for k, v in rows:
        print(f"{k:{width}}  {v}")


if __name__ == "__main__":
    cli()

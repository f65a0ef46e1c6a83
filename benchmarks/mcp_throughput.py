"""MCP transport benchmark: an `awm env start` server driven by the rollout's client and by the official one.

    .venv/bin/python benchmarks/mcp_throughput.py                 # content_platform_1 of ../shared/awm_1k_excerpt
    .venv/bin/python benchmarks/mcp_throughput.py --seconds 10 --episodes 16 --workers 2 --rounds 2

Starts the server as a real process on 127.0.0.1 (`python -m awm.cli env start`), then, for each
client (the rollout's `McpEnv` via `open_env(transport="mcp")`, and the official `mcp` client on
one shared HTTP client), measures: session open (initialize + initialized + tools/list, which opens
the episode on the server) and close, tools/list and tools/call latency one at a time, and tools/call
throughput with `--episodes` concurrent episodes, with the CPU that client and server spent per
call (server = its main process plus its worker processes). Figures depend on the machine and its
load; compare the two clients within one run. Target (issue 22, 2-core machine): >= 1,000 calls/s
with 16 episodes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EXCERPT = REPO.parent / "shared" / "awm_1k_excerpt"


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(main process, its child processes) user+system CPU seconds, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")

    def of(p: int) -> float:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / tick

    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return of(pid), sum(of(int(c)) for c in children)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


@contextlib.contextmanager
def server(data_dir: Path, scenario: str, workers: int) -> Any:
    env = {**os.environ, "PYTHONPATH": str(REPO / "agent-world-model")}
    proc = subprocess.Popen([sys.executable, "-m", "awm.cli", "env", "start", "--data-dir", str(data_dir),
                             "--scenario", scenario, "--port", "0", "--workers", str(workers)],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline().strip()
        if " at http" not in line:
            raise SystemExit(f"the server did not start: {line!r}")
        yield proc, line.rsplit(" ", 1)[1].removesuffix("/mcp")
    finally:
        proc.terminate()
        proc.wait(15)


@dataclass
class Client:
    """One way to talk MCP: open an episode, and the calls on it."""

    name: str
    open: Callable[[], Awaitable[Any]]
    call: Callable[[Any], Awaitable[bool]]  # True when the tool call was not an error
    list_tools: Callable[[Any], Awaitable[int]]
    close: Callable[[Any], Awaitable[None]]


def lean_client(base: str, scenario: str, tool: str, args: dict[str, Any]) -> Client:
    from awm_grpo.env_client import EnvConfig, open_env

    cfg = EnvConfig(transport="mcp", mcp_urls=(base,))

    async def call(env: Any) -> bool:
        return not (await env.call(tool, args)).is_error

    async def list_tools(env: Any) -> int:
        return len(await env.session.list_tools())

    return Client("lean (McpEnv, rollout)", lambda: open_env(cfg, scenario, 0), call, list_tools,
                  lambda env: env.close())


@contextlib.asynccontextmanager
async def official_client(base: str, scenario: str, tool: str, args: dict[str, Any]) -> AsyncIterator[Client]:
    import httpx2
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    url = f"{base}/mcp/{scenario}?task_idx=0"
    async with httpx2.AsyncClient(timeout=60) as http:
        async def open_session() -> Any:
            stack = contextlib.AsyncExitStack()
            read, write = await stack.enter_async_context(streamable_http_client(url, http_client=http))
            session = await stack.enter_async_context(ClientSession(read, write))
            await session.initialize()
            await session.list_tools()
            session.stack = stack
            return session

        async def call(session: Any) -> bool:
            return not (await session.call_tool(tool, args)).is_error

        async def list_tools(session: Any) -> int:
            return len((await session.list_tools()).tools)

        async def close(session: Any) -> None:
            await session.stack.aclose()

        yield Client("official mcp client", open_session, call, list_tools, close)


async def measure(client: Client, server_pid: int, episodes: int, seconds: float, samples: int) -> dict[str, str]:
    out: dict[str, str] = {}
    opens, closes = [], []
    for _ in range(samples):
        t = time.perf_counter()
        env = await client.open()
        opens.append(time.perf_counter() - t)
        t = time.perf_counter()
        await client.close(env)
        closes.append(time.perf_counter() - t)
    out["session open (handshake + tools/list) p50/p99"] = f"{pct(opens, .5) * 1e3:.2f} / {pct(opens, .99) * 1e3:.2f} ms"
    out["session close (DELETE) p50"] = f"{pct(closes, .5) * 1e3:.2f} ms"

    env = await client.open()
    if not await client.call(env):
        raise SystemExit(f"{client.name}: the benchmark's tool call is an error: pass --tool/--args that work")
    lists, calls = [], []
    for _ in range(samples):
        t = time.perf_counter()
        await client.list_tools(env)
        lists.append(time.perf_counter() - t)
        t = time.perf_counter()
        await client.call(env)
        calls.append(time.perf_counter() - t)
    await client.close(env)
    out["tools/list, one at a time p50/p99"] = f"{pct(lists, .5) * 1e3:.2f} / {pct(lists, .99) * 1e3:.2f} ms"
    out["tools/call, one at a time p50/p99"] = f"{pct(calls, .5) * 1e3:.2f} / {pct(calls, .99) * 1e3:.2f} ms"

    latencies: list[float] = []
    errors = 0
    opened, go = asyncio.Barrier(episodes + 1), asyncio.Event()
    stop = 0.0

    async def episode() -> None:  # one task from open to close: the official client's sessions need that
        nonlocal errors
        env = await client.open()
        await opened.wait()
        await go.wait()
        while time.perf_counter() < stop:
            t = time.perf_counter()
            errors += not await client.call(env)
            latencies.append(time.perf_counter() - t)
        await opened.wait()
        await client.close(env)

    tasks = [asyncio.create_task(episode()) for _ in range(episodes)]
    await opened.wait()
    server_before, cpu_before, t0 = cpu_seconds(server_pid), time.process_time(), time.perf_counter()
    stop = t0 + seconds
    go.set()
    await opened.wait()
    wall, cpu, server_after = time.perf_counter() - t0, time.process_time() - cpu_before, cpu_seconds(server_pid)
    await asyncio.gather(*tasks)
    n = len(latencies)
    main_ms, workers_ms = ((a - b) / n * 1e3 for a, b in zip(server_after, server_before, strict=True))
    out[f"tools/call, {episodes} concurrent episodes"] = f"{n / wall:,.0f} calls/s ({n} calls, {errors} errors)"
    out["  latency p50/p99"] = f"{pct(latencies, .5) * 1e3:.2f} / {pct(latencies, .99) * 1e3:.2f} ms"
    out["  client CPU per call"] = f"{cpu / n * 1e3:.3f} ms"
    out["  server CPU per call (main + workers)"] = f"{main_ms + workers_ms:.3f} ms ({main_ms:.3f} + {workers_ms:.3f})"
    return out


async def main(args: argparse.Namespace, base: str, pid: int) -> list[tuple[str, dict[str, str]]]:
    import orjson

    tool_args = orjson.loads(args.args)
    results = []
    for round_ in range(1, args.rounds + 1):  # alternate the clients: the machine's load drifts
        suffix = f" #{round_}" if args.rounds > 1 else ""
        lean = lean_client(base, args.scenario, args.tool, tool_args)
        results.append((f"lean{suffix}", await measure(lean, pid, args.episodes, args.seconds, args.samples)))
        if not args.lean_only:
            async with official_client(base, args.scenario, args.tool, tool_args) as official:
                results.append((f"official{suffix}", await measure(official, pid, args.episodes, args.seconds,
                                                                   args.samples)))
    return results


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", type=Path, default=EXCERPT)
    p.add_argument("--scenario", default="content_platform_1")
    p.add_argument("--tool", default="get_channel_by_id", help="a read-only tool of the scenario")
    p.add_argument("--args", default='{"channel_id": 1}', help="its arguments, as JSON")
    p.add_argument("--workers", type=int, default=2, help="the server's worker processes")
    p.add_argument("--episodes", type=int, default=16, help="concurrent episodes in the throughput run")
    p.add_argument("--seconds", type=float, default=5.0, help="duration of each throughput run")
    p.add_argument("--samples", type=int, default=50, help="samples for the one-at-a-time latencies")
    p.add_argument("--rounds", type=int, default=1, help="rounds of both clients, alternating")
    p.add_argument("--lean-only", action="store_true", help="skip the official client")
    args = p.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}", file=sys.stderr)
    with server(args.data_dir, args.scenario, args.workers) as (proc, base):
        results = asyncio.run(main(args, base, proc.pid))
    keys = list(dict.fromkeys(k for _, r in results for k in r))
    width = max(map(len, keys))
    print(f"{'measure':{width}}  " + "  ".join(f"{name:>34}" for name, _ in results))
    print("-" * (width + 36 * len(results)))
    for k in keys:
        print(f"{k:{width}}  " + "  ".join(f"{r.get(k, ''):>34}" for _, r in results))
    print(f"(scenario {args.scenario}, tool {args.tool} {args.args}, {args.workers} server workers)")


if __name__ == "__main__":
    cli()

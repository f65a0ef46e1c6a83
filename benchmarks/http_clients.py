"""Client CPU per request with N requests in flight: httpx, httpx2 and aiohttp, against one local server.

    .venv/bin/python benchmarks/http_clients.py [--in-flight 256 1024] [--turns 4] [--ids 2000]

Why slime.utils.http_utils uses aiohttp: the rollout keeps one `/generate` request in flight per
episode. The server (uvicorn, its own process) holds every request `--latency-ms`, so all of them
are in flight together, as with an engine busy decoding; each "episode" posts `--turns` requests of
`--ids` token ids. Prints wall time, the client's CPU seconds and failed requests per client.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from collections import Counter

import aiohttp
import httpx
import httpx2

from slime.utils.misc import free_port

SERVER = """
import asyncio, sys
import uvicorn
from fastapi import FastAPI, Request
app = FastAPI()
@app.post("/generate")
async def generate(request: Request):
    body = await request.json()
    await asyncio.sleep(float(sys.argv[2]))
    return {"n": len(body["input_ids"])}
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="error", backlog=4096, timeout_keep_alive=60)
"""


async def drive(name: str, url: str, in_flight: int, turns: int, ids: int) -> tuple[float, float, Counter]:
    payload = {"input_ids": list(range(ids))}
    failed: Counter = Counter()
    if name == "aiohttp":
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=3.0))

        async def one() -> None:
            async with session.post(url, json=payload) as reply:
                await reply.json()
        close = session.close
    else:
        lib = httpx if name == "httpx" else httpx2
        client = lib.AsyncClient(timeout=600, trust_env=False,
                                 limits=lib.Limits(max_connections=None, max_keepalive_connections=in_flight))

        async def one() -> None:
            (await client.post(url, json=payload)).json()
        close = client.aclose

    async def episode() -> None:
        for _ in range(turns):
            try:
                await one()
            except Exception as exc:  # noqa: BLE001 - counted and printed: what fails under load is the point
                failed[type(exc).__name__] += 1

    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(episode() for _ in range(in_flight)))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    await close()
    return wall, cpu, failed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--in-flight", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--ids", type=int, default=2000)
    p.add_argument("--latency-ms", type=float, default=300.0)
    opts = p.parse_args()
    port = free_port("127.0.0.1")
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port), str(opts.latency_ms / 1000)])
    try:
        time.sleep(3.0)
        for n in opts.in_flight:
            for name in ("aiohttp", "httpx2", "httpx"):
                wall, cpu, failed = asyncio.run(drive(name, f"http://127.0.0.1:{port}/generate", n, opts.turns,
                                                      opts.ids))
                print(f"{n:5d} in flight  {name:8s} wall {wall:6.1f} s  client CPU {cpu:6.1f} s  "
                      f"({1000 * cpu / (n * opts.turns):.2f} ms a request)  failed {dict(failed) or 0}", flush=True)
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()

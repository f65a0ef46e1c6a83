"""Trajectory viewer on a run of GPU size: first and warm page loads, one episode, bytes on the wire.

    .venv/bin/python benchmarks/viewer_scale.py                          # 40 steps x 1,024 episodes
    .venv/bin/python benchmarks/viewer_scale.py --steps 200 --episodes 1024 --keep /tmp/big-run
    PYTHONPATH=OLD_TREE:OLD_TREE/agent-world-model .venv/bin/python benchmarks/viewer_scale.py --keep /tmp/big-run

The recipe's GPU profiles write one `rollout_<step>.jsonl` per step with every episode's whole trace
(`awm_grpo.traces`); 8 GPUs write 1,024 episodes a step. This writes such a run with synthetic episodes
of realistic size (turns with model text, tool calls, observations and DB state), then times what the
viewer server (`awm_grpo.viewer`) does for it through a real HTTP server on 127.0.0.1:
- the run's page data (`/api/run`) the first time (every file parsed) and again (rows cached per file);
- one episode (`/api/episode`);
- the size of the page data as sent with and without gzip (a browser asks for gzip; over an SSH tunnel
  the bytes are the wait).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

from awm_grpo.viewer.server import make_app


def synthetic_episode(rng: random.Random, step: int, index: int, turns: int) -> dict:
    """One trace record shaped like `awm_grpo.traces` writes it, about 2 KB a turn."""
    scenario = f"scenario_{rng.randrange(100)}"
    reward = rng.choice([0.0, 0.0, 0.1, 1.0])
    return {
        "scenario": scenario, "task_idx": rng.randrange(10), "task": f"Task text of {scenario}. " * 8,
        "task_type": rng.choice(["info_seeking", "state_mutating"]), "step": step, "index": index,
        "group_index": index // 8, "verdict": "complete" if reward == 1.0 else "incomplete", "reward": reward,
        "tool_calls": turns - 1, "stop_reason": "final_answer", "final_answer": "done",
        "turns": [{"turn": t, "tokens": rng.randrange(50, 400), "finish": "stop",
                   "assistant": "<think>" + "reasoning " * 60 + "</think>",
                   "calls": [{"name": "search_items", "arguments": {"query": "q" * 20, "limit": 10}, "kind": "ok"}],
                   "observations": ['{"items": [' + ", ".join(['{"id": 1, "name": "item"}'] * 30) + "]}"],
                   "state": {"state_hash": f"{rng.getrandbits(64):016x}", "changes": {}}}
                  for t in range(turns)],
    }


def write_run(folder: Path, steps: int, episodes: int, turns: int) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    rng, size = random.Random(0), 0
    for step in range(steps):
        path = folder / f"rollout_{step:06d}.jsonl"
        with open(path, "w") as f:
            for i in range(episodes):
                f.write(json.dumps(synthetic_episode(rng, step, step * episodes + i, turns)) + "\n")
        size += path.stat().st_size
    return size


async def measure(root: Path, steps: int, episodes: int) -> list[tuple[str, str]]:
    runner = web.AppRunner(make_app(root))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    rows = []
    try:
        async with aiohttp.ClientSession(auto_decompress=False) as http:
            for label, encoding in (("first", "gzip"), ("again", "gzip"), ("again, no gzip", "identity")):
                t = time.perf_counter()
                async with http.get(f"{base}/api/run?run=.", headers={"Accept-Encoding": encoding}) as resp:
                    body = await resp.read()
                    sent = resp.headers.get("Content-Encoding", "identity")
                rows.append((f"/api/run, {label}", f"{time.perf_counter() - t:.2f} s, {len(body) / 1e6:.1f} MB "
                                                    f"on the wire ({sent})"))
            episode_id = f"rollout_{steps // 2:06d}.jsonl:{episodes // 2}"
            t = time.perf_counter()
            async with http.get(f"{base}/api/episode", params={"run": ".", "id": episode_id}) as resp:
                await resp.read()
            rows.append(("/api/episode (one of the middle file)", f"{(time.perf_counter() - t) * 1e3:.0f} ms"))
    finally:
        await runner.cleanup()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=40, help="trace files (one per training step)")
    p.add_argument("--episodes", type=int, default=1024, help="episodes per step")
    p.add_argument("--turns", type=int, default=6, help="turns per episode")
    p.add_argument("--keep", default=None,
                   help="write the run here and keep it (default: a temporary folder); a folder that already "
                        "holds one is measured as it is")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="awm-viewer-scale-") as tmp:
        root = Path(args.keep or tmp)
        if any(root.glob("rollout_*.jsonl")):  # a kept run: measure it again (e.g. an older tree on it)
            size = sum(p.stat().st_size for p in root.glob("rollout_*.jsonl"))
            print(f"run: {root} as written before, {size / 1e6:.0f} MB of traces")
        else:
            t = time.perf_counter()
            size = write_run(root, args.steps, args.episodes, args.turns)
            print(f"run: {args.steps} steps x {args.episodes} episodes, {size / 1e6:.0f} MB of traces "
                  f"(written in {time.perf_counter() - t:.1f} s)")
        for name, value in asyncio.run(measure(root, args.steps, args.episodes)):
            print(f"  {name:40s} {value}")


if __name__ == "__main__":
    main()

"""The environment worker process: hosts scenario apps and the episode DB connections.

Started by `awm.pool.WorkerPool` as `python -m awm.worker <fd> <config>` with an allow-listed
environment (generated code never sees API keys). Before serving, the worker locks itself down
with the verifier sandbox's pieces (`awm.sandbox.Lockdown`): generated code runs in a process
with no network, no capabilities, no new processes (threads only), no sockets, no ptrace, and,
by Landlock, read access to the interpreter, libraries and scenario templates only (no /proc, so
no other process's environment or memory) and write access to this worker's own directory only. Requests arrive over a socket as
`(request_id, op, payload)` frames and are served one at a time, in order, by an asyncio loop
that awaits each app call directly: handlers of AWM code are blocking SQLAlchemy work, so
concurrency inside one process would buy nothing and would let episodes interleave on shared
module state. The parent's transport buffers what we have not read yet, so it never blocks.

Invariant: the worker that owns an episode's connection is the only writer of that
episode's DB file; reset, snapshot and restore go through it (SQLite backup API).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import resource
import shutil
import socket
import sqlite3
import sys
import tempfile
import traceback
from typing import Any

from awm import wire
from awm.deadline import CallDeadline
from awm.envapp import EpisodeDB, EpisodeRouter, LoadedEnv, call_tool, load_env, unload_env
from awm.sandbox import Lockdown

log = logging.getLogger("awm.worker")


class Worker:
    """All state of one worker process; `handle` serves one request."""

    def __init__(self, scratch_root: str | None = None) -> None:
        self.router = EpisodeRouter()
        self.envs: dict[str, LoadedEnv] = {}
        self.episodes: dict[str, tuple[str, EpisodeDB]] = {}
        self.scratch = tempfile.mkdtemp(prefix="awm-worker-", dir=scratch_root)
        self.protections: dict[str, Any] = {}
        self.deadline = CallDeadline()

    # ops -----------------------------------------------------------------------------
    def op_ping(self, _: dict) -> dict:
        return {"pid": os.getpid(), "scenarios": sorted(self.envs), "episodes": len(self.episodes),
                "protections": self.protections}

    def op_load(self, p: dict) -> dict:
        scenario = p["scenario"]
        if scenario not in self.envs:
            scratch = os.path.join(self.scratch, f"{scenario}.db")
            shutil.copyfile(p["template"], scratch)
            try:
                self.envs[scenario] = load_env(scenario, p["code"], self.router, scratch, p.get("tools"))
            finally:
                os.unlink(scratch)
        env = self.envs[scenario]
        return {"tools": [t.to_dict() for t in env.tools.values()], "load_s": env.load_s,
                "created_sql": env.created_sql}

    def op_unload(self, p: dict) -> dict:
        env = self.envs.pop(p["scenario"], None)
        if env is not None:
            unload_env(env)
        return {}

    def op_open(self, p: dict) -> dict:
        if p["scenario"] not in self.envs:
            raise KeyError(f"scenario {p['scenario']!r} is not loaded in this worker")
        self.episodes[p["episode"]] = (p["scenario"], EpisodeDB(p["db_path"], self.deadline))
        return {}

    async def op_call(self, p: dict) -> dict:
        scenario, db = self._episode(p["episode"])
        with self.deadline.running(p.get("soft_timeout_s")):
            obs = await call_tool(self.envs[scenario], self.router, db, p["tool"], p.get("arguments"))
        return obs.to_dict()

    def op_restore(self, p: dict) -> dict:
        """Overwrite the episode DB with `source` (the template for a reset, or a snapshot)."""
        _, db = self._episode(p["episode"])
        src = sqlite3.connect(f"file:{p['source']}?mode=ro", uri=True)
        try:
            src.backup(db.conn)
        finally:
            src.close()
        return {}

    def op_snapshot(self, p: dict) -> dict:
        _, db = self._episode(p["episode"])
        dst = sqlite3.connect(p["dest"])
        try:
            db.conn.backup(dst)
        finally:
            dst.close()
        return {}

    def op_close(self, p: dict) -> dict:
        item = self.episodes.pop(p["episode"], None)
        if item is not None:
            item[1].close()
        return {"max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}  # Linux: KiB

    def op_crash(self, p: dict) -> dict:
        """Test hook: die abruptly, as a segfault in a C extension would."""
        os._exit(int(p.get("code", 70)))

    def _episode(self, episode: str) -> tuple[str, EpisodeDB]:
        try:
            return self.episodes[episode]
        except KeyError:
            raise KeyError(f"episode {episode!r} is not open in this worker") from None

    async def handle(self, op: str, payload: dict) -> tuple[bool, Any]:
        fn = getattr(self, f"op_{op}", None)
        if fn is None:
            return False, {"type": "ValueError", "message": f"unknown op {op!r}"}
        try:
            result = fn(payload)
            return True, (await result if asyncio.iscoroutine(result) else result)
        except Exception as exc:
            return False, {"type": type(exc).__name__, "message": str(exc),
                           "traceback": "".join(traceback.format_exc(limit=-4))}


def lock_down(config: dict[str, Any]) -> dict[str, Any]:
    """Apply the sandbox to this process (it is single-threaded here, so every later thread inherits it)."""
    if not config.get("lockdown", True):
        return {"lockdown": False}
    lockdown = Lockdown(tuple(config.get("read", ())), (config["dir"],), threads=True)
    lockdown.apply(None)
    return {"lockdown": True, **lockdown.describe()}


async def serve(sock: socket.socket, config: dict[str, Any]) -> None:
    """Lock down, then read frames and answer each in order; return when the parent closes the socket."""
    reader, writer = await asyncio.open_unix_connection(sock=sock)  # the event loop's own sockets exist now
    protections = lock_down(config)
    worker, buffer = Worker(config.get("dir")), bytearray()
    worker.protections = protections
    try:
        while data := await reader.read(1 << 16):
            buffer += data
            for req_id, op, payload in wire.decode_all(buffer):
                ok, result = await worker.handle(op, payload)
                writer.write(wire.encode((req_id, ok, result)))
    except (ConnectionError, OSError):
        pass  # parent is gone
    finally:
        shutil.rmtree(worker.scratch, ignore_errors=True)


def main() -> None:
    logging.basicConfig(level=os.environ.get("AWM_LOG_LEVEL", "WARNING"))
    config = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {"lockdown": False}
    asyncio.run(serve(socket.socket(fileno=int(sys.argv[1])), config))


if __name__ == "__main__":
    main()

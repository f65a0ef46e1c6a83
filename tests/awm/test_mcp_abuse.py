"""The MCP server against clients it should not trust: strangers off loopback, session floods,
abandoned sessions, and the leftovers of a server that was SIGKILLed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from awm import episode as episode_module
from awm.episode import EnvRuntime
from awm.serve import mcp_server
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from test_mcp_server import ServerThread

REPO = Path(__file__).resolve().parents[2]
SCENARIO = "library_lending_1"
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


def initialize(base: str, **headers: str) -> httpx.Response:
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": HANDSHAKE_PROTOCOL_VERSIONS[-1], "capabilities": {},
                       "clientInfo": {"name": "abuse", "version": "1"}}}
    return httpx.post(f"{base}/mcp", json=body, headers={**HEADERS, **headers}, timeout=30)


def list_tools(base: str, session_id: str) -> httpx.Response:
    headers = {**HEADERS, "mcp-session-id": session_id, "mcp-protocol-version": HANDSHAKE_PROTOCOL_VERSIONS[-1]}
    httpx.post(f"{base}/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    return httpx.post(f"{base}/mcp", json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, headers=headers,
                      timeout=30)


@contextlib.contextmanager
def served(**serve_kwargs: Any) -> Iterator[ServerThread]:
    """`mcp_server.serve` in a thread (its own loop and runtime) with these keyword arguments."""
    with ServerThread(SCENARIO, num_workers=1, **serve_kwargs).running() as srv:
        yield srv


def test_serving_off_loopback_without_a_token_is_refused():
    async def main():
        with EnvRuntime(num_workers=1) as rt:
            with pytest.raises(ValueError, match="'0.0.0.0' reaches other machines: pass token="):
                await asyncio.wait_for(mcp_server.serve(rt, SCENARIO, host="0.0.0.0"), 30)

    asyncio.run(main())


@pytest.mark.parametrize("given", [None, "chosen-token-123"], ids=["printed", "from-env"])
def test_non_loopback_server_requires_its_token(given):
    env = {**os.environ, "PYTHONPATH": str(REPO / "agent-world-model")}
    env.pop("AWM_MCP_TOKEN", None)
    if given:
        env["AWM_MCP_TOKEN"] = given
    proc = subprocess.Popen([sys.executable, "-m", "awm.serve.mcp_server", "--scenario", SCENARIO, "--host", "0.0.0.0",
                             "--port", "0", "--num-workers", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        line = proc.stdout.readline().strip()
        if given is None:
            assert line.startswith("AWM MCP server token"), line
            token = line.rsplit(" ", 1)[1]
            line = proc.stdout.readline().strip()
        else:
            token = given
        port = line.rsplit(":", 1)[1].split("/")[0]
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/health").status_code == 401
        assert initialize(base).status_code == 401
        assert initialize(base, authorization="Bearer wrong").status_code == 401
        auth = {"authorization": f"Bearer {token}"}
        assert httpx.get(f"{base}/health", headers=auth).json()["status"] == "ok"
        assert initialize(base, **auth).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


def test_session_cap_and_idle_timeout():
    with served(max_sessions=2, session_idle_timeout_s=1.0) as srv:
        sessions = [initialize(srv.base) for _ in range(2)]
        assert [r.status_code for r in sessions] == [200, 200]
        refused = initialize(srv.base)
        assert refused.status_code == 503, refused.text
        sid = sessions[0].headers["mcp-session-id"]
        assert list_tools(srv.base, sid).status_code == 200
        assert len(srv.runtime.episodes) == 1  # the session opened its episode
        time.sleep(2.5)
        assert not srv.runtime.episodes  # the idle session closed and gave its episode back
        assert initialize(srv.base).status_code == 200  # and freed its place


def test_dirs_of_a_killed_runtime_are_removed_and_live_ones_kept(tmp_path):
    code = ("import sys, time; from awm.episode import EnvRuntime; rt = EnvRuntime(episode_dir=sys.argv[1]); "
            "print(rt.episode_dir, flush=True); time.sleep(60)")
    env = {**os.environ, "PYTHONPATH": str(REPO / "agent-world-model")}
    victim = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env)
    stale = Path(victim.stdout.readline().strip())
    victim.kill()
    victim.wait()
    foreign = tmp_path / "awm-episodes-no-owner"  # a dir this version did not make: never touched
    foreign.mkdir()
    with EnvRuntime(episode_dir=tmp_path) as live:
        assert stale.is_dir()
        removed = episode_module.remove_stale_episode_dirs(tmp_path)
        assert removed == [str(stale)] and not stale.exists()
        assert live.episode_dir.is_dir() and foreign.is_dir()


def test_server_start_removes_stale_dirs():
    root = episode_module.default_episode_dir()
    stale = root / f"awm-episodes-stale-{uuid.uuid4().hex[:8]}"
    stale.mkdir()
    (stale / "owner").write_text("999999999 1")  # no such process
    env = {**os.environ, "PYTHONPATH": str(REPO / "agent-world-model")}
    proc = subprocess.Popen([sys.executable, "-m", "awm.serve.mcp_server", "--scenario", SCENARIO, "--port", "0",
                             "--num-workers", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().startswith("AWM MCP server for")
        assert not stale.exists()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        if stale.exists():
            shutil.rmtree(stale)

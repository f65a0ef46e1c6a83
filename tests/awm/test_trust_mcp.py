"""The MCP server's limits against clients that try to hold it (issue 38's hostile tries of 2026-11-28):
request heads and bodies sent a byte at a time, silent connections, a flood of them, initialize-only
sessions, and a tool whose result is far larger than any model could read.

Everything runs for real: `mcp_server.serve` on 127.0.0.1 (uvicorn, the mcp SDK, the runtime's
workers), raw sockets for the slow clients, httpx for the fast ones, and for the big result a
generated-code-style scenario run in the runtime's sandboxed worker. The limits are set small here
(seconds, KB) so that each test takes seconds; awm.serve.limits has the defaults and why.
"""

from __future__ import annotations

import json
import select
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from awm.episode import EnvRuntime
from awm.serve import limits as limits_module
from awm.serve.limits import ServerLimits
from conftest import write_scenarios
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from test_mcp_server import ServerThread

SCENARIO = "library_lending_1"  # bundled
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}

BIG_RESULT_APP = r'''
import os
from fastapi import FastAPI
from sqlalchemy import create_engine

engine = create_engine(os.getenv("DATABASE_PATH", "sqlite:///big.db"))
app = FastAPI(title="big results")


@app.get("/blob", operation_id="blob", summary="Return n characters")
def blob(n: int):
    return {"blob": "x" * n}
'''

BIG_LISTING_APP = BIG_RESULT_APP + r'''

@app.get("/wordy", operation_id="wordy", summary="A tool whose description is 200 KB", description="d" * 200_000)
def wordy():
    return {}
'''


class DataServerThread(ServerThread):
    """ServerThread on a given data dir (ServerThread serves the bundled scenarios)."""

    def __init__(self, data_dir: Path, cache_dir: Path, scenario: str, **serve_kwargs: Any) -> None:
        super().__init__(scenario, num_workers=1, **serve_kwargs)
        self.data_dir, self.cache_dir = data_dir, cache_dir

    def _runtime(self) -> EnvRuntime:
        return EnvRuntime(self.data_dir, num_workers=1, cache_dir=self.cache_dir)


def address(srv: ServerThread) -> tuple[str, int]:
    host, port = srv.base.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def dribble(sock: socket.socket, chunks: list[bytes], every_s: float, give_up_s: float) -> tuple[bytes, float | None]:
    """Send `chunks` one at a time, `every_s` apart (cycling), until the server closes the connection.

    Returns what the server sent and the seconds it took to close, or (data, None) if it was
    still open after `give_up_s`.
    """
    start, data, i = time.monotonic(), b"", 0
    sock.settimeout(every_s)
    while time.monotonic() - start < give_up_s:
        try:
            sock.sendall(chunks[i % len(chunks)])
        except (BrokenPipeError, ConnectionResetError):
            return data, time.monotonic() - start
        i += 1
        try:
            while True:
                got = sock.recv(65536)
                if not got:
                    return data, time.monotonic() - start
                data += got
        except TimeoutError:
            continue
        except ConnectionResetError:
            return data, time.monotonic() - start
    return data, None


def closed_by_server(sock: socket.socket, wait_s: float) -> bool:
    """True when the server has closed `sock` (EOF readable, after any reply) within `wait_s`."""
    deadline = time.monotonic() + wait_s
    while (left := deadline - time.monotonic()) > 0:
        if not select.select([sock], [], [], left)[0]:
            return False
        try:
            if not sock.recv(65536):
                return True
        except ConnectionResetError:
            return True
    return False


def initialize(base: str, path: str = "/mcp") -> httpx.Response:
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": HANDSHAKE_PROTOCOL_VERSIONS[-1], "capabilities": {},
                       "clientInfo": {"name": "trust", "version": "1"}}}
    return httpx.post(f"{base}{path}", json=body, headers=HEADERS, timeout=30)


def rpc(base: str, session_id: str, method: str, params: dict[str, Any] | None = None,
        path: str = "/mcp") -> httpx.Response:
    headers = {**HEADERS, "mcp-session-id": session_id, "mcp-protocol-version": HANDSHAKE_PROTOCOL_VERSIONS[-1]}
    body = {"jsonrpc": "2.0", "id": 2, "method": method, **({"params": params} if params is not None else {})}
    return httpx.post(f"{base}{path}", json=body, headers=headers, timeout=60)


def open_session(base: str, path: str = "/mcp") -> str:
    """initialize + notifications/initialized at `path`; the session id."""
    reply = initialize(base, path)
    assert reply.status_code == 200, reply.text
    session_id = reply.headers["mcp-session-id"]
    headers = {**HEADERS, "mcp-session-id": session_id, "mcp-protocol-version": HANDSHAKE_PROTOCOL_VERSIONS[-1]}
    httpx.post(f"{base}{path}", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    return session_id


def test_slow_and_silent_request_heads_are_cut_off():
    """Slowloris: a head sent a header line every 0.3 s never completes; nor does a connection that sends
    nothing. Both get 408 and are closed at the header timeout, and a fast client is served meanwhile."""
    limits = ServerLimits(header_timeout_s=1.0, body_timeout_s=1.0)
    with ServerThread(SCENARIO, num_workers=1, limits=limits).running() as srv:
        host, port = address(srv)
        with socket.create_connection((host, port), timeout=5) as slow:
            slow.sendall(f"GET /health HTTP/1.1\r\nhost: {host}\r\n".encode())
            data, closed_after = dribble(slow, [b"x-slow: 1\r\n"], every_s=0.3, give_up_s=8)
        assert closed_after is not None, "a head sent a line every 0.3 s held its connection for 8 s"
        assert 0.8 < closed_after < 4, closed_after
        assert data.startswith(b"HTTP/1.1 408") and b"request head not received within 1 s" in data, data

        with socket.create_connection((host, port), timeout=5) as silent:
            start = time.monotonic()
            assert closed_by_server(silent, 6), "a connection that sent nothing was kept open for 6 s"
            assert time.monotonic() - start < 4
        assert httpx.get(f"{srv.base}/health").json()["status"] == "ok"


def test_slow_clients_cannot_hold_more_than_the_cap_of_connections():
    """30 connections each stuck in their head: past the grace (1 s) at most `max_pending_connections`
    stay open (the oldest are closed to make room), and a fast client still gets its reply at once. A
    burst of 20 fast clients connecting together is not cut by the same cap."""
    limits = ServerLimits(header_timeout_s=30.0, max_pending_connections=5)
    with ServerThread(SCENARIO, num_workers=1, limits=limits).running() as srv:
        with ThreadPoolExecutor(20) as pool:
            burst = list(pool.map(lambda _: httpx.get(f"{srv.base}/health", timeout=10).status_code, range(20)))
        assert burst == [200] * 20
        host, port = address(srv)
        socks = []
        try:
            for _ in range(30):
                sock = socket.create_connection((host, port), timeout=5)
                sock.sendall(f"GET /health HTTP/1.1\r\nhost: {host}\r\n".encode())
                socks.append(sock)
            time.sleep(2.5)  # the grace, and a sweep
            start = time.monotonic()
            assert httpx.get(f"{srv.base}/health", timeout=5).json()["status"] == "ok"
            assert time.monotonic() - start < 2
            still_open = [s for s in socks if not closed_by_server(s, 0.3)]
        finally:
            for sock in socks:
                sock.close()
        assert len(still_open) <= 5, f"{len(still_open)} of 30 slow connections still open with a cap of 5"
        counts = httpx.get(f"{srv.base}/limits").json()
        assert counts["connections_closed"].get("evicted", 0) >= 25, counts


def test_an_endless_request_head_gets_431():
    """Header lines sent without end (4 KB at a time): cut off with 431 once past the head cap, not buffered
    until the header timeout."""
    limits = ServerLimits(max_head_bytes=16 * 1024)
    with ServerThread(SCENARIO, num_workers=1, limits=limits).running() as srv:
        host, port = address(srv)
        with socket.create_connection((host, port), timeout=5) as sock:
            sock.sendall(f"GET /health HTTP/1.1\r\nhost: {host}\r\n".encode())
            lines = [b"".join(b"x-pad-%d-%d: %s\r\n" % (i, j, b"y" * 1000) for j in range(4)) for i in range(1000)]
            data, closed_after = dribble(sock, lines, every_s=0.05, give_up_s=5)
        assert closed_after is not None and closed_after < 3, "an endless head was read for 5 s"
        assert data.startswith(b"HTTP/1.1 431") and b"request head over 16384 bytes" in data, data[:200]


def test_a_slow_request_body_is_cut_off_and_leaks_no_session():
    """An initialize whose body (1.2 KB) arrives 10 bytes every 0.3 s: 408 and closed at the body timeout; the
    session it would have opened is not kept (with a cap of one session, a new one opens at once)."""
    limits = ServerLimits(header_timeout_s=5.0, body_timeout_s=1.0, max_sessions=1)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                       "params": {"protocolVersion": HANDSHAKE_PROTOCOL_VERSIONS[-1], "capabilities": {},
                                  "clientInfo": {"name": "slow", "version": "1"}}}).encode() + b" " * 1000
    with ServerThread(SCENARIO, num_workers=1, limits=limits).running() as srv:
        host, port = address(srv)
        head = (f"POST /mcp HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
                f"accept: application/json, text/event-stream\r\ncontent-length: {len(body)}\r\n\r\n").encode()
        with socket.create_connection((host, port), timeout=5) as slow:
            slow.sendall(head + body[:10])
            chunks = [body[i:i + 10] for i in range(10, len(body) - 1, 10)]
            data, closed_after = dribble(slow, chunks, every_s=0.3, give_up_s=8)
        assert closed_after is not None, "a body sent 10 bytes every 0.3 s held its connection for 8 s"
        assert 0.7 < closed_after < 4, closed_after
        assert data.startswith(b"HTTP/1.1 408") and b"request body not received within 1 s" in data, data
        start = time.monotonic()
        while (reply := initialize(srv.base)).status_code == 503 and time.monotonic() - start < 5:
            time.sleep(0.1)  # the aborted opening request's session is discarded as its task unwinds
        assert reply.status_code == 200, reply.text


def test_sessions_that_never_call_a_tool_expire():
    """initialize-only, and initialize + tools/list (which opens an episode), then nothing: both are
    closed `unused_session_timeout_s` after their initialize, well before the (60 s) idle timeout, and
    give their places and episode back; a session that made a tools/call stays."""
    limits = ServerLimits(max_sessions=3, session_idle_timeout_s=60.0, unused_session_timeout_s=1.5)
    with ServerThread(SCENARIO, num_workers=1, limits=limits).running() as srv:
        init_only = open_session(srv.base)
        listed = open_session(srv.base)
        assert rpc(srv.base, listed, "tools/list").status_code == 200
        used = open_session(srv.base)
        tools = rpc(srv.base, used, "tools/list").json()["result"]["tools"]
        assert rpc(srv.base, used, "tools/call", {"name": tools[0]["name"], "arguments": {}}).status_code == 200
        assert initialize(srv.base).status_code == 503  # the cap is full
        assert len(srv.runtime.episodes) == 2
        time.sleep(3.0)
        assert rpc(srv.base, init_only, "tools/list").status_code == 404
        assert rpc(srv.base, listed, "tools/list").status_code == 404
        assert len(srv.runtime.episodes) == 1  # the listed-only session's episode was closed
        assert rpc(srv.base, used, "tools/list").status_code == 200  # a used session is kept
        assert initialize(srv.base).status_code == 200  # the places are free again
        assert httpx.get(f"{srv.base}/limits").json()["unused_sessions_closed"] == 2


def test_control_plane_bodies_are_capped_and_deep_nesting_is_a_400():
    """The control plane read any body whole (the MCP path has the SDK's 4 MiB cap) and let a deeply nested
    one raise RecursionError (HTTP 500); now: 413 past 1 MiB, 400 for nesting, and the episode goes on."""
    with ServerThread(SCENARIO, num_workers=1).running() as srv:
        sid = open_session(srv.base)
        assert rpc(srv.base, sid, "tools/list").status_code == 200  # opens the episode
        url = f"{srv.base}/episodes/{sid}/verify"
        big = json.dumps({"final_answer": "x" * (2 << 20), "task_idx": 0})
        reply = httpx.post(url, content=big, headers={"content-type": "application/json"}, timeout=30)
        assert reply.status_code == 413 and "over 1048576 bytes" in reply.json()["error"], reply.text[:300]

        def chunked():  # no content-length: the cap holds while streaming too
            for _ in range(64):
                yield b"x" * 65536

        reply = httpx.post(url, content=chunked(), timeout=30)
        assert reply.status_code == 413, reply.text[:300]
        reply = httpx.post(url, content="[" * 100_000, timeout=30)
        assert reply.status_code == 400 and "JSON object" in reply.json()["error"], reply.text[:300]
        reply = httpx.post(url, json={"final_answer": "done", "task_idx": 0}, timeout=60)
        assert reply.status_code == 200 and "verdict" in reply.json(), reply.text[:300]


@pytest.fixture(scope="module")
def big_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_scenarios(tmp_path_factory.mktemp("big-results"),
                           {"big_results": BIG_RESULT_APP, "big_listing": BIG_LISTING_APP})


def test_a_result_over_the_cap_becomes_an_error_and_the_session_goes_on(big_data_dir, cache_dir):
    cap = 64 * 1024
    limits = ServerLimits(max_result_bytes=cap)
    with DataServerThread(big_data_dir, cache_dir, "big_results", limits=limits).running() as srv:
        sid = open_session(srv.base)
        reply = rpc(srv.base, sid, "tools/call", {"name": "blob", "arguments": {"n": 1_000_000}})
        assert reply.status_code == 200
        assert len(reply.content) < 4096, f"a 1 MB result went out as {len(reply.content)} bytes with a {cap} cap"
        result = reply.json()["result"]
        text = result["content"][0]["text"]
        assert result["isError"] and result["_meta"]["awm"]["kind"] == "result_too_large", result
        assert f"cap of {cap} bytes" in text and "--max-result-bytes" in text, text
        small = rpc(srv.base, sid, "tools/call", {"name": "blob", "arguments": {"n": 100}}).json()["result"]
        assert not small["isError"] and json.loads(small["content"][0]["text"]) == {"blob": "x" * 100}
        assert httpx.get(f"{srv.base}/limits").json()["results_capped"] == 1
        # a tool list (descriptions and schemas are generated code's too) over the cap: a clear error
        wordy = open_session(srv.base, "/mcp/big_listing")
        listing = rpc(srv.base, wordy, "tools/list", path="/mcp/big_listing")
        assert len(listing.content) < 4096, f"a 200 KB tool list went out whole with a {cap} cap"
        error = listing.json()["error"]["message"]
        assert "tool list of scenario 'big_listing'" in error and f"cap of {cap} bytes" in error, error
        assert rpc(srv.base, sid, "tools/list").json()["result"]["tools"][0]["name"] == "blob"


def test_limit_flags_reach_the_server_limits_and_bad_values_are_named():
    import argparse

    parser = argparse.ArgumentParser()
    limits_module.add_limit_arguments(parser)
    got = limits_module.limits_from(parser.parse_args(
        ["--header-timeout", "2", "--body-timeout", "3", "--unused-session-timeout", "60",
         "--max-result-bytes", "1000", "--max-pending-connections", "7"]))
    assert (got.header_timeout_s, got.body_timeout_s, got.unused_session_timeout_s, got.max_result_bytes,
            got.max_pending_connections) == (2, 3, 60, 1000, 7)
    assert limits_module.limits_from(parser.parse_args([])) == ServerLimits()
    with pytest.raises(ValueError, match="--header-timeout 0: use a positive number of seconds"):
        ServerLimits(header_timeout_s=0)
    with pytest.raises(ValueError, match="--max-result-bytes 0: use a whole number, 1 or more"):
        ServerLimits(max_result_bytes=0)

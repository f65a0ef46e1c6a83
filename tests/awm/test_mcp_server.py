"""awm.serve.mcp_server through real components: uvicorn on 127.0.0.1 port 0 and the official mcp client.

One server (a background thread with its own event loop and EnvRuntime) serves every bundled
scenario with project_tracker_1 as the default. The facts used below were read off the bundled
data: issue 7 of project_tracker_1 ("Push notifications arrive twice") carries only the label
'bug' (id 5); task 4 asks to add the label 'regression' (id 6) to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Coroutine, Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from awm.episode import EnvRuntime
from awm.serve.mcp_server import serve
from mcp import Client
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

DEFAULT = "project_tracker_1"
OTHER = "online_grocery_1"
REPO = Path(__file__).resolve().parents[2]


class ServerThread:
    """A real server in a thread; `on_server` runs coroutines in its loop (the runtime's loop)."""

    def __init__(self, scenario: str = DEFAULT, num_workers: int = 2, **serve_kwargs: Any) -> None:
        self.scenario, self.num_workers, self.serve_kwargs = scenario, num_workers, serve_kwargs
        self.url = ""
        self.loop: asyncio.AbstractEventLoop | None = None
        self.runtime: EnvRuntime | None = None
        self.stop: asyncio.Event | None = None
        self.error: BaseException | None = None
        self.listening = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def _runtime(self) -> EnvRuntime:
        """The runtime the server uses (the bundled scenarios); subclasses serve other data."""
        return EnvRuntime(num_workers=self.num_workers)

    def start(self) -> ServerThread:
        self.thread.start()
        assert self.listening.wait(60) and self.url, f"the server did not start: {self.error!r}"
        return self

    def shutdown(self) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(15)

    @contextlib.contextmanager
    def running(self) -> Iterator[ServerThread]:
        """Started on entry, stopped on exit."""
        try:
            yield self.start()
        finally:
            self.shutdown()

    async def _main(self) -> None:
        self.loop, self.stop = asyncio.get_running_loop(), asyncio.Event()
        self.runtime = self._runtime()
        try:
            await serve(self.runtime, self.scenario, stop=self.stop, ready=self._ready, **self.serve_kwargs)
        except BaseException as exc:
            self.error = exc
            raise
        finally:
            self.runtime.close()
            self.listening.set()

    def _ready(self, scenario: str, url: str) -> None:
        self.url = url
        self.listening.set()

    @property
    def base(self) -> str:
        return self.url.removesuffix("/mcp")

    def on_server(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def health(self) -> dict[str, Any]:
        return httpx.get(f"{self.base}/health").json()


@pytest.fixture(scope="module")
def server() -> ServerThread:
    srv = ServerThread().start()
    yield srv
    srv.shutdown()
    assert not srv.thread.is_alive(), "the server did not shut down"
    assert srv.runtime.closed and not srv.runtime.episodes


@contextlib.asynccontextmanager
async def mcp_session(url: str) -> AsyncIterator[tuple[ClientSession, str]]:
    """An initialized official-client session, and its id (read off the response headers)."""
    seen: dict[str, str] = {}

    async def remember(response: httpx2.Response) -> None:
        if "mcp-session-id" in response.headers:
            seen["id"] = response.headers["mcp-session-id"]

    async with (
        httpx2.AsyncClient(event_hooks={"response": [remember]}) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session, seen["id"]


def labels_of_issue_7(text: str) -> list[str]:
    return [label["name"] for label in json.loads(text)["labels"]]


def test_lists_exactly_the_runtime_tools(server: ServerThread) -> None:
    async def listed() -> list[dict[str, Any]]:
        async with mcp_session(server.url) as (session, _):
            tools = (await session.list_tools()).tools
        return [{"name": t.name, "description": t.description, "inputSchema": t.input_schema} for t in tools]

    assert asyncio.run(listed()) == server.on_server(server.runtime.tools(DEFAULT))


def test_read_write_and_bad_arguments(server: ServerThread) -> None:
    async def story() -> None:
        async with mcp_session(server.url) as (session, _):
            before = await session.call_tool("get_issue", {"issue_id": 7})
            wrote = await session.call_tool("add_label_to_issue", {"issue_id": 7, "label_id": 6})
            after = await session.call_tool("get_issue", {"issue_id": 7})
            bad = await session.call_tool("get_issue", {"issue_id": "seven"})
        assert not before.is_error and labels_of_issue_7(before.content[0].text) == ["bug"]
        assert not wrote.is_error and labels_of_issue_7(wrote.content[0].text) == ["bug", "regression"]
        assert labels_of_issue_7(after.content[0].text) == ["bug", "regression"]
        assert bad.is_error and len(bad.content) == 1
        assert bad.content[0].text.startswith("Input validation error")

    asyncio.run(story())


def test_concurrent_sessions_of_one_scenario_are_isolated(server: ServerThread) -> None:
    async def story() -> tuple[list[str], list[str], str, str]:
        async with mcp_session(server.url) as (a, a_id), mcp_session(server.url) as (b, b_id):
            await asyncio.gather(a.list_tools(), b.list_tools())  # both episodes open at once
            await a.call_tool("add_label_to_issue", {"issue_id": 7, "label_id": 6})
            seen_a, seen_b = await asyncio.gather(a.call_tool("get_issue", {"issue_id": 7}),
                                                  b.call_tool("get_issue", {"issue_id": 7}))
            async with httpx.AsyncClient(base_url=server.base) as http:
                hash_a = (await http.get(f"/episodes/{a_id}/state")).json()["state_hash"]
                hash_b = (await http.get(f"/episodes/{b_id}/state")).json()["state_hash"]
        return labels_of_issue_7(seen_a.content[0].text), labels_of_issue_7(seen_b.content[0].text), hash_a, hash_b

    seen_a, seen_b, hash_a, hash_b = asyncio.run(story())
    assert seen_a == ["bug", "regression"]
    assert seen_b == ["bug"]
    assert hash_a != hash_b


def test_one_server_serves_other_scenarios_by_path(server: ServerThread) -> None:
    async def names(url: str) -> list[str]:
        async with mcp_session(url) as (session, _):
            return [t.name for t in (await session.list_tools()).tools]

    other = asyncio.run(names(f"{server.url}/{OTHER}"))
    assert other == [t["name"] for t in server.on_server(server.runtime.tools(OTHER))]
    assert set(other).isdisjoint({"get_issue", "add_label_to_issue"})
    refused = httpx.post(f"{server.url}/no_such_scenario", json={})
    assert refused.status_code == 404 and "not served here" in refused.json()["error"]["message"]
    bad_task = httpx.post(f"{server.url}/{OTHER}?task_idx=10", json={})
    assert bad_task.status_code == 400 and "task_idx must be in 0..9" in bad_task.json()["error"]["message"]


def test_a_loopback_server_refuses_foreign_host_headers(server: ServerThread) -> None:
    assert httpx.get(f"{server.base}/health", headers={"host": "attacker.example"}).status_code == 400
    assert httpx.get(f"{server.base}/health", headers={"host": "localhost"}).status_code == 200


def test_control_plane_verify_snapshot_reset_state(server: ServerThread) -> None:
    async def story() -> list[Any]:
        out: list[Any] = []
        async with (mcp_session(f"{server.url}?task_idx=4") as (session, sid),
                    httpx.AsyncClient(base_url=f"{server.base}/episodes/{sid}") as http):
            await session.list_tools()
            initial = (await http.get("/state")).json()
            out.append((await http.post("/verify", json={"final_answer": "done"})).json()["verdict"])
            await session.call_tool("add_label_to_issue", {"issue_id": 7, "label_id": 6})
            out.append((await http.post("/verify", json={"final_answer": "done", "task_idx": 4})).json()["verdict"])
            snap = (await http.post("/snapshot")).json()["snapshot"]
            out.append((await http.post("/reset")).json())
            out.append((await http.get("/state")).json() == initial)
            out.append((await http.post("/verify", json={})).json()["verdict"])
            await http.post("/restore", json={"snapshot": snap})
            out.append((await http.get("/state")).json()["steps"])
            out.append((await http.post("/verify", json={"final_answer": None})).json()["verdict"])
            conflict = await http.post("/verify", json={"task_idx": 3})
            out.append((conflict.status_code, "opened for task 4" in conflict.json()["error"]))
        return out

    assert asyncio.run(story()) == ["others", "complete", {"status": "ok", "steps": 0}, True, "others", 1,
                                    "complete", (409, True)]


def test_verify_takes_the_task_from_the_request_when_the_url_has_none(server: ServerThread) -> None:
    async def story() -> tuple[int, str, dict[str, Any]]:
        async with (mcp_session(server.url) as (session, sid),
                    httpx.AsyncClient(base_url=f"{server.base}/episodes/{sid}") as http):
            await session.call_tool("add_label_to_issue", {"issue_id": 7, "label_id": 6})
            missing = await http.post("/verify", json={"final_answer": "done"})
            verdict = (await http.post("/verify", json={"final_answer": "done", "task_idx": 4})).json()
            state = (await http.get("/state")).json()
        return missing.status_code, verdict["verdict"], state

    status, verdict, state = asyncio.run(story())
    assert status == 400 and verdict == "complete"
    assert (state["scenario"], state["task_idx"], state["steps"]) == (DEFAULT, 4, 1)


def test_unknown_session_is_a_404_with_a_message(server: ServerThread) -> None:
    for method, path in [("GET", "state"), ("POST", "verify"), ("POST", "reset")]:
        reply = httpx.request(method, f"{server.base}/episodes/nope/{path}")
        assert reply.status_code == 404
        assert "no episode for MCP session 'nope'" in reply.json()["error"]


def test_session_end_closes_its_episode(server: ServerThread) -> None:
    baseline = server.health()["open_episodes"]

    async def story() -> int:
        async with mcp_session(server.url) as (session, _):
            await session.list_tools()
            return server.health()["open_episodes"]

    assert asyncio.run(story()) == baseline + 1
    deadline = time.monotonic() + 5
    while server.health()["open_episodes"] != baseline and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.health() == {"status": "ok", "scenarios": server.runtime.dataset.scenario_names(runnable_only=True),
                               "open_episodes": baseline}


def test_an_auto_negotiating_client_gets_a_session(server: ServerThread) -> None:
    async def story() -> tuple[str, bool]:
        async with Client(server.url) as client:  # probes the 2026 protocol first, then falls back
            result = await client.call_tool("get_issue", {"issue_id": 7})
            return client.protocol_version, result.is_error

    version, is_error = asyncio.run(story())
    assert not version.startswith("2026") and not is_error


def test_infrastructure_failure_is_a_tool_error_and_closes_the_episode(server: ServerThread) -> None:
    async def crash_workers() -> None:
        for index in range(server.runtime.pool.num_workers):
            server.runtime.pool.crash_worker(index)
        await asyncio.sleep(0.3)

    async def story() -> tuple[str, str, int, bool]:
        async with mcp_session(server.url) as (session, sid):
            await session.list_tools()
            server.on_server(crash_workers())
            first = await session.call_tool("get_issue", {"issue_id": 7})
            again = await session.call_tool("get_issue", {"issue_id": 7})
            state = httpx.get(f"{server.base}/episodes/{sid}/state")
        async with mcp_session(server.url) as (fresh, _):  # the pool replaced its workers
            recovered = await fresh.call_tool("get_issue", {"issue_id": 7})
        assert first.is_error and again.is_error
        return first.content[0].text, again.content[0].text, state.status_code, recovered.is_error

    first, again, state_status, recovered_is_error = asyncio.run(story())
    assert first.startswith("Infrastructure error:")
    assert again.startswith("Infrastructure error:") and "start a new MCP session" in again
    assert state_status == 503
    assert not recovered_is_error


@pytest.mark.parametrize("command", [
    ["awm.serve.mcp_server", "--scenario", "library_lending_1", "--port", "0", "--num-workers", "1"],
    ["awm.cli", "env", "start", "--scenario", "library_lending_1", "--port", "0", "--workers", "1"],  # `awm env start`
], ids=["module", "awm-env-start"])
def test_entry_points_serve_and_stop_on_sigterm(tmp_path: Path, command: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "agent-world-model")}
    proc = subprocess.Popen([sys.executable, "-m", *command],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("AWM MCP server for library_lending_1 at http://127.0.0.1:"), line
        url = line.rsplit(" ", 1)[1]
        assert url.endswith("/mcp")

        async def names() -> list[str]:
            async with mcp_session(url) as (session, _):
                return [t.name for t in (await session.list_tools()).tools]

        assert "search_books" in asyncio.run(names())
        children = [int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                                   text=True).stdout.split()]
        assert children, "expected worker processes under the server"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=8) == 0, proc.stderr.read()
        time.sleep(0.2)
        assert not [pid for pid in children if Path(f"/proc/{pid}").exists()], "worker processes leaked"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

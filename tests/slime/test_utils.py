"""load_function, free_port and the retrying HTTP helpers, against a real local HTTP server."""

from __future__ import annotations

import asyncio
import json
import os.path
import socket
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import aiohttp
import pytest

from slime.utils import http_utils
from slime.utils.http_utils import HTTPRequestError, get, post
from slime.utils.misc import PluginLoadError, free_port, load_function

FAST = 0.01  # retry delay in tests


def test_load_function_resolves_a_stdlib_function():
    assert load_function("os.path.join") is os.path.join
    assert load_function("os.path.join") is load_function("os.path.join")


def test_free_port_can_be_bound_and_is_not_in_use():
    port = free_port("127.0.0.1")
    assert 1024 <= port <= 65535
    with socket.socket() as sock:  # nothing listens there: binding it again succeeds
        sock.bind(("127.0.0.1", port))
        sock.listen()
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass


def test_load_function_names_the_missing_piece():
    with pytest.raises(PluginLoadError, match=r"'no_such_pkg_x\.mod' not found"):
        load_function("no_such_pkg_x.mod.fn")
    with pytest.raises(PluginLoadError, match="has no attribute 'joinn'"):
        load_function("os.path.joinn")
    with pytest.raises(PluginLoadError, match="must look like"):
        load_function("join")


class _Handler(BaseHTTPRequestHandler):
    """/flaky answers 503 twice per method, then 200 with the request echoed; /missing answers 404."""

    hits: Counter = Counter()

    def _reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _serve(self, echo: dict) -> None:
        key = (self.command, self.path.split("?")[0])
        self.hits[key] += 1
        if key[1] == "/missing":
            self._reply(404, {"error": "no such route"})
        elif key[1] == "/flaky" and self.hits[key] <= 2:
            self._reply(503, {"error": "busy"})
        else:
            self._reply(200, {"attempt": self.hits[key], **echo})

    def do_GET(self) -> None:
        self._serve({"path": self.path})

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        self._serve(
            {"payload": json.loads(self.rfile.read(length)), "key": self.headers.get("X-SMG-Routing-Key")}
        )

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server():
    _Handler.hits = Counter()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def test_post_retries_5xx_then_returns_json(server):
    reply = asyncio.run(
        post(f"{server}/flaky", {"input_ids": [1, 2]}, retry_delay=FAST, headers={"X-SMG-Routing-Key": "s1"})
    )

    assert reply == {"attempt": 3, "payload": {"input_ids": [1, 2]}, "key": "s1"}


def test_get_retries_5xx_then_returns_json(server):
    reply = asyncio.run(get(f"{server}/flaky", params={"a": "1"}, retry_delay=FAST))

    assert reply == {"attempt": 3, "path": "/flaky?a=1"}


def test_post_gives_up_after_max_retries_naming_the_url(server):
    with pytest.raises(
        HTTPRequestError, match=r"POST .*/flaky failed after 2 attempts \(last: HTTP 503"
    ) as info:
        asyncio.run(post(f"{server}/flaky", {}, max_retries=2, retry_delay=FAST))

    assert info.value.attempts == 2 and info.value.status_code == 503


def test_client_error_is_not_retried(server):
    with pytest.raises(HTTPRequestError, match="answered 404") as info:
        asyncio.run(post(f"{server}/missing", {}, retry_delay=FAST))

    assert info.value.attempts == 1 and _Handler.hits[("POST", "/missing")] == 1


def test_unreachable_port_raises_after_retries():
    url = f"http://127.0.0.1:{free_port('127.0.0.1')}/generate"

    with pytest.raises(HTTPRequestError, match=r"failed after 3 attempts \(last: ClientConnectorError") as info:
        asyncio.run(post(url, {"text": "hi"}, max_retries=3, retry_delay=FAST))

    assert info.value.url == url and info.value.status_code is None


def test_one_shared_client_per_event_loop(server):
    async def twice() -> tuple[aiohttp.ClientSession, aiohttp.ClientSession]:
        first = http_utils.shared_client()
        await get(f"{server}/ok", retry_delay=FAST)
        second = http_utils.shared_client()
        await http_utils.close_shared_client()
        return first, second

    first_loop = asyncio.run(twice())
    second_loop = asyncio.run(twice())  # a fresh loop works: no client bound to a dead loop is reused

    assert first_loop[0] is first_loop[1]
    assert second_loop[0] is not first_loop[0]


def test_explicit_client_is_used_as_given(server):
    async def call() -> dict:
        async with aiohttp.ClientSession() as client:
            return await post(f"{server}/ok", {"x": 1}, client=client)

    assert asyncio.run(call())["payload"] == {"x": 1}

"""The router against small SGLang-shaped HTTP servers on 127.0.0.1: distribution, affinity, failover,
fan-out, membership changes and the standalone module."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from slime.engine.router import BackgroundServer, HashRing, Router, engine_id

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HTTP = httpx.Client(timeout=10, trust_env=False)  # one client: building one costs ~40 ms (TLS context)


class FakeEngine:
    """An SGLang-shaped server that answers with its own name and records what it was sent."""

    def __init__(self, name: str, port: int = 0):
        self.name = name
        self.calls: list[tuple[str, dict | None]] = []
        self.weight_version = "0"
        self.flush_status = 200
        app = FastAPI()

        @app.post("/generate")
        async def generate(request: Request) -> JSONResponse:
            body = await request.json()
            self.calls.append(("/generate", body))
            return JSONResponse({"text": self.name, "output_ids": [1],
                                 "meta_info": {"finish_reason": {"type": "length"},
                                               "weight_version": self.weight_version}})

        @app.get("/health")
        async def health() -> PlainTextResponse:
            return PlainTextResponse("")

        @app.api_route("/flush_cache", methods=["GET", "POST"])
        async def flush_cache() -> PlainTextResponse:
            self.calls.append(("/flush_cache", None))
            return PlainTextResponse("busy" if self.flush_status != 200 else "", status_code=self.flush_status)

        @app.post("/abort_request")
        async def abort_request(request: Request) -> PlainTextResponse:
            self.calls.append(("/abort_request", await request.json()))
            return PlainTextResponse("")

        @app.post("/update_weights_from_disk")
        async def update_weights_from_disk(request: Request) -> JSONResponse:
            body = await request.json()
            self.calls.append(("/update_weights_from_disk", body))
            self.weight_version = body.get("weight_version", "1")
            return JSONResponse({"success": True, "message": "ok"})

        @app.get("/model_info")
        async def model_info() -> JSONResponse:
            return JSONResponse({"model_path": "/m", "weight_version": self.weight_version})

        self.server = BackgroundServer(app, port=port)
        self.url = self.server.start()
        self.port = self.server.port

    def paths(self) -> list[str]:
        return [path for path, _ in self.calls]

    def stop(self) -> None:
        self.server.stop()


@pytest.fixture
def fakes():
    engines = [FakeEngine(f"e{i}") for i in range(3)]
    yield engines
    for engine in engines:
        engine.stop()


@pytest.fixture
def router(fakes):
    router = Router([f.url for f in fakes], health_check_interval_s=0.1, failure_threshold=1)
    router.start()
    yield router
    router.shutdown()


def generate(router_url: str, session: str | None = None, *, header: bool = True, **body) -> httpx.Response:
    headers = {"X-SMG-Routing-Key": session} if session is not None and header else {}
    if session is not None and not header:
        body["session_id"] = session
    return HTTP.post(f"{router_url}/generate", json={"input_ids": [1, 2], **body}, headers=headers, timeout=10)


def served_by(router_url: str, session: str | None = None, **kwargs) -> str:
    reply = generate(router_url, session, **kwargs)
    assert reply.status_code == 200, reply.text
    return reply.json()["text"]


def wait_for(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_requests_without_session_go_round_robin(router):
    counts = Counter(served_by(router.url) for _ in range(30))

    assert counts == {"e0": 10, "e1": 10, "e2": 10}


def test_session_sticks_to_one_engine_by_header_or_field(router, fakes):
    by_header = {s: {served_by(router.url, s) for _ in range(4)} for s in (f"s{i}" for i in range(20))}
    by_field = {s: {served_by(router.url, s, header=False) for _ in range(4)} for s in by_header}

    assert all(len(engines) == 1 for engines in by_header.values())
    assert by_field == by_header  # the field and the header route the same way
    assert len(set().union(*by_header.values())) == 3  # 20 sessions spread over all engines
    forwarded = [body for f in fakes for path, body in f.calls if path == "/generate"]
    assert all("session_id" not in body for body in forwarded)  # not an SGLang field: stripped


def test_removing_an_engine_remaps_only_its_sessions(router, fakes):
    sessions = [f"s{i}" for i in range(40)]
    before = {s: served_by(router.url, s) for s in sessions}

    router.remove_engine(fakes[1].url)
    after = {s: served_by(router.url, s) for s in sessions}

    assert all(after[s] == before[s] for s in sessions if before[s] != "e1")
    assert all(after[s] != "e1" for s in sessions)
    assert any(before[s] == "e1" for s in sessions)


def test_hash_ring_is_deterministic_and_balanced():
    urls = [f"http://127.0.0.1:{30000 + i}" for i in range(4)]
    ring, same = HashRing(urls), HashRing(reversed(urls))

    owners = Counter(ring.lookup(f"session-{i}") for i in range(4000))

    assert all(ring.lookup(f"k{i}") == same.lookup(f"k{i}") for i in range(100))
    assert set(owners) == set(urls) and min(owners.values()) > 500  # 1000 each on average
    assert HashRing().lookup("x") is None


def test_dead_engine_fails_over_and_leaves_rotation(router, fakes):
    sessions = [f"s{i}" for i in range(20)]
    before = {s: served_by(router.url, s) for s in sessions}
    fakes[0].stop()

    after = {s: served_by(router.url, s) for s in sessions}  # every request still answered
    wait_for(lambda: fakes[0].url not in router.healthy_urls())

    assert all(after[s] != "e0" for s in sessions)
    assert all(after[s] == before[s] for s in sessions if before[s] != "e0")
    health = HTTP.get(f"{router.url}/health", timeout=5).json()
    assert {e["url"]: e["healthy"] for e in health["engines"]} == {
        fakes[0].url: False, fakes[1].url: True, fakes[2].url: True}


def test_no_engine_left_answers_503(fakes):
    router = Router([fakes[0].url], health_check_interval_s=60)
    router.start()
    try:
        fakes[0].stop()
        reply = generate(router.url)
        assert reply.status_code == 503
        assert HTTP.get(f"{router.url}/health", timeout=5).status_code == 503
    finally:
        router.shutdown()


def test_control_endpoints_fan_out_to_every_engine(router, fakes):
    assert HTTP.post(f"{router.url}/flush_cache", timeout=5).status_code == 200
    assert HTTP.post(f"{router.url}/abort_request", json={"abort_all": True}, timeout=5).status_code == 200
    update = router.update_weights_from_disk("/ckpt/weight_v000003", weight_version="3")

    assert update == "3"  # RolloutEngine API through the router: versions agree
    for fake in fakes:
        assert fake.paths() == ["/flush_cache", "/abort_request", "/update_weights_from_disk"]
        assert fake.calls[1][1] == {"abort_all": True}
        assert fake.calls[2][1] == {"model_path": "/ckpt/weight_v000003", "weight_version": "3"}


def test_flush_is_busy_while_any_engine_is_busy(router, fakes):
    fakes[2].flush_status = 503

    assert HTTP.get(f"{router.url}/flush_cache", timeout=5).status_code == 503
    fakes[2].flush_status = 200
    router.flush_cache(timeout_s=5)  # retries until every engine flushed


def test_weight_versions_must_agree(router, fakes):
    fakes[1].weight_version = "7"

    reply = HTTP.get(f"{router.url}/model_info", timeout=5)

    assert reply.status_code == 409
    assert reply.json()["engines"][fakes[1].url] == "7"


def test_engine_that_comes_back_reloads_the_last_weights_first(router, fakes):
    router.update_weights_from_disk("/ckpt/weight_v000002", weight_version="2")
    port = fakes[0].port
    fakes[0].stop()
    served_by(router.url)
    served_by(router.url)  # one of the two reached e0's address and took it out
    wait_for(lambda: fakes[0].url not in router.healthy_urls())

    fakes[0] = FakeEngine("e0-restarted", port=port)  # a fresh server at the same URL, weights "0"
    wait_for(lambda: fakes[0].url in router.healthy_urls())

    assert fakes[0].calls[0] == ("/update_weights_from_disk",
                                 {"model_path": "/ckpt/weight_v000002", "weight_version": "2"})
    assert router.weight_version() == "2"
    assert "e0-restarted" in {served_by(router.url) for _ in range(6)}


def test_workers_api_adds_and_removes_engines_at_run_time(router, fakes):
    extra = FakeEngine("e3")
    try:
        reply = HTTP.post(f"{router.url}/workers", json={"url": extra.url}, timeout=10).json()
        assert reply == {"id": engine_id(extra.url), "url": extra.url, "healthy": True}
        assert Counter(served_by(router.url) for _ in range(8)) == {"e0": 2, "e1": 2, "e2": 2, "e3": 2}

        workers = HTTP.get(f"{router.url}/workers", timeout=5).json()["workers"]
        assert [w["url"] for w in workers] == [f.url for f in fakes] + [extra.url]

        assert HTTP.delete(f"{router.url}/workers/{engine_id(extra.url)}", timeout=5).status_code == 200
        assert "e3" not in {served_by(router.url) for _ in range(6)}
    finally:
        extra.stop()


def test_standalone_router_prints_its_url_and_stops_on_sigterm(fakes):
    proc = subprocess.Popen(
        [sys.executable, "-m", "slime.engine.router", "--engine-url", fakes[0].url,
         "--engine-url", fakes[1].url, "--port", "0"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("router listening on http://127.0.0.1:"), line + proc.stderr.read()
        url = line.split()[-1]
        assert {served_by(url) for _ in range(4)} == {"e0", "e1"}
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0

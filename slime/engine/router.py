"""An HTTP router in front of several engines that speaks the same SGLang subset as one engine.

Rollout code posts to the router's URL and never learns how many engines run behind it:

    python -m slime.engine.router --engine-url http://127.0.0.1:30001 --engine-url ... --port 0

prints `router listening on http://HOST:PORT`; in-process (tests, Ray actors):

    router = Router([url_a, url_b]); url = router.start(); ...; router.shutdown()

Routing. `POST /generate` goes to one healthy engine: the one owning the request's session on a
consistent-hash ring when a session key is given (header `X-SMG-Routing-Key`, which sglang_router
0.3.2's `manual` policy reads, or `X-Session-ID`, or a `session_id` field in the body, which
is removed before forwarding), round robin otherwise. The ring holds only healthy engines, so taking
one out re-maps just the sessions it owned. A connection failure takes the engine out of rotation
and the request is retried on another engine (generation is stateless for the caller).

Fan-out. `/flush_cache`, `/update_weights_from_disk`, `/abort_request`, `/pause_generation`,
`/continue_generation`, `/health_generate` and `/model_info` go to every engine in rotation and the
replies are combined (one non-200 reply makes the whole reply non-200; the `weight_version`s of
`/model_info`, where stock sglang serves it, must agree). The last successful `update_weights_from_disk` body is remembered: an engine that joins or
comes back after a failure is loaded with it before it re-enters rotation, so it never serves stale
weights. An engine that cannot be reached during a fan-out is taken out of rotation too.

Membership at run time: `add_engine` / `remove_engine`, or sglang_router's HTTP API (`POST /workers
{"url"}`, `GET /workers`, `DELETE /workers/{id}`). A background check polls each engine's `/health`
every `health_check_interval_s`; `failure_threshold` misses in a row take an engine out, one
answered check (plus the weight reload) brings it back.

Not supported: streaming (`"stream": true` is forwarded but the reply is buffered), the
tensor/NCCL weight endpoints (those need per-engine payloads: post them to engine URLs directly).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import hashlib
import json
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx
import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from slime.engine.base import MODEL_INFO, EngineError, RolloutEngine
from slime.utils.fd_limit import raise_open_file_limit
from slime.utils.http_utils import TRANSPORT_ERRORS, make_client

logger = logging.getLogger(__name__)

ROUTING_HEADERS = ("x-smg-routing-key", "x-session-id")
SESSION_FIELD = "session_id"
# Endpoints whose request goes to every engine in rotation.
FAN_OUT_POST = ("/flush_cache", "/abort_request", "/pause_generation", "/continue_generation")


class NoHealthyEngineError(EngineError):
    """Every engine behind the router is out of rotation (or none was added)."""


def engine_id(url: str) -> str:
    """A stable short id for an engine URL (sglang_router's `DELETE /workers/{id}` takes one)."""
    return hashlib.sha1(url.encode()).hexdigest()[:12]


def _hash64(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


class HashRing:
    """Consistent hashing: each URL owns `replicas` points on a 64-bit ring; a key goes to the owner
    of the first point at or after its hash. Removing a URL only moves the keys it owned."""

    def __init__(self, urls: Iterable[str] = (), replicas: int = 64):
        points = sorted((_hash64(f"{url}#{i}"), url) for url in set(urls) for i in range(replicas))
        self._hashes = [h for h, _ in points]
        self._urls = [u for _, u in points]

    def lookup(self, key: str) -> str | None:
        if not self._urls:
            return None
        i = bisect.bisect_left(self._hashes, _hash64(key)) % len(self._hashes)
        return self._urls[i]


@dataclass
class EngineState:
    """What the router knows about one engine."""

    url: str
    healthy: bool = False
    failures: int = 0  # health checks missed in a row
    requests: int = 0  # /generate requests forwarded
    in_flight: int = 0

    def as_json(self) -> dict[str, Any]:
        return {"id": engine_id(self.url), "url": self.url, "worker_type": "regular", "healthy": self.healthy,
                "requests": self.requests, "in_flight": self.in_flight}


class Router(RolloutEngine):
    """Router over engine URLs; also a `RolloutEngine`, so the trainer drives it like one engine."""

    def __init__(
        self,
        engine_urls: Iterable[str] = (),
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        health_check_interval_s: float = 5.0,
        failure_threshold: int = 2,
        request_timeout_s: float = 14400.0,
    ):
        self.host, self.port = host, port
        self.health_check_interval_s = health_check_interval_s
        self.failure_threshold = failure_threshold
        self.request_timeout_s = request_timeout_s
        self._lock = threading.Lock()
        self._engines: dict[str, EngineState] = {}
        self._ring = HashRing()
        self._next = 0  # round-robin position
        self._last_weights: dict[str, Any] | None = None  # body of the last successful disk update
        self._server: BackgroundServer | None = None
        self._sync_http = httpx.Client(timeout=request_timeout_s, trust_env=False)
        for url in engine_urls:
            self.add_engine(url)

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self) -> str:
        self._server = BackgroundServer(self.build_app(), self.host, self.port)
        self.url = self._server.start()
        self.port = self._server.port
        return self.url

    def serve_forever(self, on_started: Callable[[], None] | None = None) -> None:
        """Serve in the calling (main) thread until SIGTERM / SIGINT."""
        self._server = BackgroundServer(self.build_app(), self.host, self.port)
        self.url = self._server.url
        self.port = self._server.port
        self._server.run(on_started)

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        self._sync_http.close()
        if getattr(self, "_http", None) is not None:
            self._http.close()
            self._http = None

    # ---- membership ------------------------------------------------------------------------------

    def add_engine(self, url: str) -> bool:
        """Add an engine; it enters rotation at once if it answers /health (after loading the last
        weights pushed through the router), else when a later health check passes. Returns whether
        it is in rotation now."""
        url = url.rstrip("/")
        with self._lock:
            if url in self._engines:
                return self._engines[url].healthy
            self._engines[url] = EngineState(url)
        return self._try_admit(url)

    def remove_engine(self, url: str) -> None:
        url = url.rstrip("/")
        with self._lock:
            if self._engines.pop(url, None) is None:
                raise KeyError(f"{url} is not behind this router; engines: {sorted(self._engines)}")
            self._rebuild_ring()

    def engines(self) -> list[dict[str, Any]]:
        with self._lock:
            return [state.as_json() for state in self._engines.values()]

    def healthy_urls(self) -> list[str]:
        with self._lock:
            return [url for url, state in self._engines.items() if state.healthy]

    def pick(self, session_key: str | None = None, exclude: Iterable[str] = ()) -> str:
        """The engine for one request: the session's owner on the ring, else the next in round robin."""
        skip = set(exclude)
        with self._lock:
            healthy = [url for url, state in self._engines.items() if state.healthy and url not in skip]
            if not healthy:
                raise NoHealthyEngineError(
                    f"no engine in rotation ({len(self._engines)} registered, all unhealthy or excluded); "
                    "check the engines' /health or add one with POST /workers"
                )
            if session_key is not None:
                ring = self._ring if not skip else HashRing(healthy)
                owner = ring.lookup(session_key)
                if owner in healthy:
                    return owner
            self._next += 1
            return healthy[self._next % len(healthy)]

    def mark_unhealthy(self, url: str, reason: str) -> None:
        with self._lock:
            state = self._engines.get(url)
            if state is None or not state.healthy:
                return
            state.healthy = False
            self._rebuild_ring()
        logger.warning("engine %s taken out of rotation: %s", url, reason)

    def _rebuild_ring(self) -> None:
        """Call with the lock held."""
        self._ring = HashRing(url for url, state in self._engines.items() if state.healthy)

    def _try_admit(self, url: str) -> bool:
        """Health-check an engine, reload the last weights into it, and put it in rotation (blocking)."""
        try:
            if self._sync_http.get(f"{url}/health", timeout=5.0).status_code != 200:
                return False
            weights = self._last_weights
            if weights is not None:
                reply = self._sync_http.post(f"{url}/update_weights_from_disk", json=weights)
                if reply.status_code != 200 or not reply.json().get("success"):
                    logger.warning("engine %s could not load %s: %s", url, weights.get("model_path"), reply.text)
                    return False
        except httpx.HTTPError as exc:
            logger.debug("engine %s not admitted: %s", url, exc)
            return False
        with self._lock:
            state = self._engines.get(url)
            if state is None:  # removed meanwhile
                return False
            if self._last_weights is not weights:  # a newer update raced this admission: retry later
                return False
            state.healthy, state.failures = True, 0
            self._rebuild_ring()
        logger.info("engine %s in rotation", url)
        return True

    # ---- the HTTP app ----------------------------------------------------------------------------

    def build_app(self) -> FastAPI:
        router = self
        client: dict[str, httpx.AsyncClient] = {}

        @contextlib.asynccontextmanager
        async def lifespan(_: FastAPI) -> AsyncIterator[None]:
            client["http"] = httpx.AsyncClient(
                timeout=httpx.Timeout(router.request_timeout_s),
                # Idle connections expire before uvicorn's 5 s keep-alive closes them on the engine side.
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=256, keepalive_expiry=3.0),
                trust_env=False,
            )
            # /generate, one request in flight per episode: aiohttp, whose pool costs the same per request
            # at 1,024 in flight as at 10 (httpx's walks every connection: see slime/utils/http_utils.py).
            client["generate"] = make_client(router.request_timeout_s)
            checker = asyncio.create_task(router._health_loop(client["http"]))
            try:
                yield
            finally:
                checker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await checker
                await client["http"].aclose()
                await client["generate"].close()

        app = FastAPI(title="slime router", lifespan=lifespan)

        @app.post("/generate")
        async def generate(request: Request) -> Response:
            body = await request.json()
            key = next((request.headers[h] for h in ROUTING_HEADERS if h in request.headers), None)
            if isinstance(body, dict) and SESSION_FIELD in body:
                session = body.pop(SESSION_FIELD)
                key = key if key is not None or session is None else str(session)
            return await router._forward_generate(client["generate"], body, key)

        for path in FAN_OUT_POST:
            app.add_api_route(path, self._fan_out_endpoint(path, client), methods=["POST"])
        app.add_api_route("/flush_cache", self._fan_out_endpoint("/flush_cache", client), methods=["GET"])

        @app.post("/update_weights_from_disk")
        async def update_weights_from_disk(request: Request) -> JSONResponse:
            return await router._update_weights(client["http"], await request.json())

        @app.get(MODEL_INFO.path)
        async def model_info() -> JSONResponse:
            """One engine's model info, if every engine reports the same `weight_version` (stock
            sglang serves the version here; it has no /get_weight_version)."""
            replies = await router._fan_out(client["http"], *MODEL_INFO, None)
            if not replies:
                return _no_engine_reply()
            infos = {url: _json_or_text(r) if r.status_code == 200 else None for url, r in replies.items()}
            versions = {url: info.get("weight_version") if isinstance(info, dict) else None
                        for url, info in infos.items()}
            if len(set(versions.values())) != 1 or None in versions.values():
                return JSONResponse({"error": {"message": "engines disagree on the weight version"},
                                     "engines": versions}, status_code=409)
            return JSONResponse({**next(iter(infos.values())), "engines": versions})

        @app.get("/health")
        async def health() -> JSONResponse:
            engines = router.engines()
            ok = any(e["healthy"] for e in engines)
            return JSONResponse({"healthy": ok, "engines": engines}, status_code=200 if ok else 503)

        @app.get("/health_generate")
        async def health_generate() -> Response:
            replies = await router._fan_out(client["http"], "GET", "/health_generate", None)
            return _combine(replies)

        @app.get("/get_model_info")
        async def get_model_info() -> Response:
            return await router._forward_one(client["http"], "GET", "/get_model_info")

        @app.get("/get_server_info")
        async def get_server_info() -> Response:
            return await router._forward_one(client["http"], "GET", "/get_server_info")

        @app.get("/workers")
        async def list_workers() -> JSONResponse:
            return JSONResponse({"workers": router.engines()})

        @app.post("/workers")
        async def add_worker(request: Request) -> JSONResponse:
            url = (await request.json()).get("url")
            if not url:
                return JSONResponse({"error": {"message": "POST /workers needs {\"url\": ...}"}}, status_code=400)
            healthy = await asyncio.to_thread(router.add_engine, url)
            return JSONResponse({"id": engine_id(url.rstrip("/")), "url": url, "healthy": healthy})

        @app.delete("/workers/{worker_id}")
        async def remove_worker(worker_id: str) -> JSONResponse:
            for engine in router.engines():
                if engine["id"] == worker_id:
                    router.remove_engine(engine["url"])
                    return JSONResponse({"removed": engine["url"]})
            return JSONResponse({"error": {"message": f"no worker with id {worker_id}"}}, status_code=404)

        return app

    def _fan_out_endpoint(self, path: str, client: dict[str, httpx.AsyncClient]) -> Callable:
        async def endpoint(request: Request) -> Response:
            raw = await request.body()
            body = json.loads(raw) if raw else None
            replies = await self._fan_out(client["http"], request.method, path, body)
            return _combine(replies)

        endpoint.__name__ = "fan_out_" + path.strip("/")
        return endpoint

    # ---- forwarding ------------------------------------------------------------------------------

    async def _forward_generate(self, http: aiohttp.ClientSession, body: Any, key: str | None) -> Response:
        tried: list[str] = []
        while True:
            try:
                url = self.pick(key, exclude=tried)
            except NoHealthyEngineError as exc:
                return _no_engine_reply(str(exc))
            state = self._engines.get(url)
            if state is not None:
                state.requests += 1
                state.in_flight += 1
            try:
                status, content, media_type = await self._post_generate(http, url, body)
            except TimeoutError as exc:
                return JSONResponse({"error": {"message": f"{url}/generate timed out: {exc!r}"}}, status_code=504)
            except TRANSPORT_ERRORS as exc:
                self.mark_unhealthy(url, f"/generate failed: {exc!r}")
                tried.append(url)
                continue
            finally:
                if state is not None:
                    state.in_flight -= 1
            return Response(content, status_code=status, media_type=media_type)

    @staticmethod
    async def _post_generate(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, bytes, str]:
        """(status, body, content type) of one POST, sent once more if the engine still answers /health:
        a kept-alive connection the engine closed as idle fails like a crash, but the engine is fine."""
        data = orjson.dumps(body)

        async def post() -> tuple[int, bytes, str]:
            async with http.post(f"{url}/generate", data=data, headers={"Content-Type": "application/json"}) as r:
                return r.status, await r.read(), r.headers.get("content-type", "application/json")

        try:
            return await post()
        except TimeoutError:
            raise
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientPayloadError):
            try:
                async with http.get(f"{url}/health", timeout=aiohttp.ClientTimeout(total=5.0)) as r:
                    alive = r.status == 200
            except (*TRANSPORT_ERRORS, aiohttp.ClientError):
                alive = False
            if not alive:
                raise
            return await post()

    async def _forward_one(self, http: httpx.AsyncClient, method: str, path: str) -> Response:
        try:
            url = self.pick()
            return _relay(await http.request(method, f"{url}{path}", timeout=30.0))
        except NoHealthyEngineError as exc:
            return _no_engine_reply(str(exc))
        except httpx.TransportError as exc:
            return JSONResponse({"error": {"message": f"{path} failed: {exc!r}"}}, status_code=502)

    async def _fan_out(
        self, http: httpx.AsyncClient, method: str, path: str, body: Any
    ) -> dict[str, httpx.Response]:
        """Send one request to every engine in rotation; engines that cannot be reached are taken out."""
        urls = self.healthy_urls()

        async def one(url: str) -> httpx.Response | None:
            try:
                return await http.request(method, f"{url}{path}", json=body)
            except httpx.TransportError as exc:
                self.mark_unhealthy(url, f"{path} failed: {exc!r}")
                return None

        replies = await asyncio.gather(*(one(url) for url in urls))
        return {url: reply for url, reply in zip(urls, replies, strict=True) if reply is not None}

    async def _update_weights(self, http: httpx.AsyncClient, body: dict[str, Any]) -> JSONResponse:
        replies = await self._fan_out(http, "POST", "/update_weights_from_disk", body)
        if not replies:
            return _no_engine_reply()
        results = {url: _json_or_text(reply) for url, reply in replies.items()}
        ok = all(reply.status_code == 200 and isinstance(results[url], dict) and results[url].get("success")
                 for url, reply in replies.items())
        if ok:
            with self._lock:
                self._last_weights = dict(body)
        messages = "; ".join(f"{url}: {r.get('message') if isinstance(r, dict) else r}" for url, r in results.items())
        return JSONResponse({"success": ok, "message": messages, "num_paused_requests": 0, "engines": results},
                            status_code=200 if ok else 400)

    async def _health_loop(self, http: httpx.AsyncClient) -> None:
        while True:
            await asyncio.sleep(self.health_check_interval_s)
            with self._lock:
                states = list(self._engines.values())

            async def check(state: EngineState) -> None:
                try:
                    ok = (await http.get(f"{state.url}/health", timeout=5.0)).status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok and not state.healthy:
                    await asyncio.to_thread(self._try_admit, state.url)
                elif ok:
                    state.failures = 0
                elif state.healthy:
                    state.failures += 1
                    if state.failures >= self.failure_threshold:
                        self.mark_unhealthy(state.url, f"{state.failures} health checks failed")

            try:
                await asyncio.gather(*(check(state) for state in states))
            except Exception:  # the checker must outlive any one bad round
                logger.exception("router health check round failed")


def _json_or_text(reply: httpx.Response) -> Any:
    try:
        return reply.json()
    except ValueError:
        return reply.text


def _relay(reply: httpx.Response) -> Response:
    return Response(reply.content, status_code=reply.status_code,
                    media_type=reply.headers.get("content-type", "application/json"))


def _combine(replies: dict[str, httpx.Response]) -> Response:
    """One reply for a fan-out: 200 when every engine answered 200, else the worst engine's status."""
    if not replies:
        return _no_engine_reply()
    status = max(reply.status_code for reply in replies.values())
    if status == 200:
        return Response(b"", status_code=200)
    body = {url: reply.text[:500] for url, reply in replies.items() if reply.status_code != 200}
    return JSONResponse({"error": {"message": "some engines refused", "engines": body}}, status_code=status)


def _no_engine_reply(message: str = "no engine in rotation") -> JSONResponse:
    # 503: `http_utils.post` retries it, which covers an engine restarting behind the router.
    return JSONResponse({"error": {"message": message}}, status_code=503)


class _AnnouncingServer(uvicorn.Server):
    """uvicorn server that calls `on_started` once it accepts connections."""

    on_started: Callable[[], None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.on_started is not None:
            self.on_started()


# How long an idle client connection stays open. uvicorn's default, 5 s, closes connections that
# clients still hold: a rollout process busy with 1,024 episodes may read a reply seconds after it was
# sent and then reuse the connection after the server closed it (ServerDisconnected, a retry a second
# later). Clients here drop idle connections after 3 s (http_utils, the router's own client).
KEEP_ALIVE_S = 60.0


class BackgroundServer:
    """A uvicorn server for one app on a socket bound up front (so port 0 resolves before anyone is
    told the URL), run on a daemon thread (`start`) or in the calling thread (`run`). The listen
    backlog holds a step's worth of connections arriving at once (1,024 episodes)."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets that say so; without it every
        # keep-alive reply waits ~40 ms on Nagle + delayed ACK.
        self._sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://{f'[{host}]' if family == socket.AF_INET6 else host}:{self.port}"
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5,
                                timeout_keep_alive=KEEP_ALIVE_S, backlog=4096)
        self._server = _AnnouncingServer(config)
        self._thread: threading.Thread | None = None

    def start(self, timeout_s: float = 30.0) -> str:
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name="router-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise EngineError(f"server on {self.url} did not start")
            time.sleep(0.01)
        return self.url

    def run(self, on_started: Callable[[], None] | None = None) -> None:
        self._server.on_started = on_started
        self._server.run(sockets=[self._sock])

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=15)
            self._thread = None
        self._sock.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Route SGLang-style requests over several engines.")
    parser.add_argument("--engine-url", action="append", default=[], help="an engine's base URL (repeat)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000, help="0 picks a free port")
    parser.add_argument("--health-check-interval", type=float, default=5.0, help="seconds between checks")
    parser.add_argument("--failure-threshold", type=int, default=2, help="missed checks before removal")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(0))
    raise_open_file_limit(0, "router")  # two connections per request in flight: one in, one out
    router = Router(args.engine_url, host=args.host, port=args.port,
                    health_check_interval_s=args.health_check_interval, failure_threshold=args.failure_threshold)
    router.serve_forever(on_started=lambda: print(f"router listening on {router.url}", flush=True))


if __name__ == "__main__":
    main()

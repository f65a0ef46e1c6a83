"""Async `post` / `get` with retries: the one HTTP helper for engines, the router and remote rewards.

Plugins call `await post(url, payload)` (slime's contract: up to 60 attempts, 1 s apart). Engines
restart, routers briefly lose workers and weight updates pause servers, so connection errors and 5xx
replies are retried; 4xx replies are the caller's bug and fail at once.

One `aiohttp.ClientSession` is shared per event loop (connection reuse matters at hundreds of
requests in flight). A session is bound to the loop that created it, so the cache is keyed by the
running loop and a new loop (each `asyncio.run`, each Ray actor) gets its own. Pass `client=` to
manage your own.

Why aiohttp, not httpx: a rollout step keeps one request in flight per episode, 1,024 in the AWM
paper's setting. httpx's connection pool walks every connection (and polls each idle socket) on
every request it queues or releases, so its cost per request grows with the requests in flight:
measured on 2 cores, 1,024 x 4 concurrent POSTs cost 14-17 s of client CPU with httpx or httpx2
against 1.9 s with aiohttp (benchmarks/rollout_scale.py shows the rollout itself). Bodies go through
orjson: a turn of a long episode posts every token so far.

The end of the module holds upstream's host and port helpers under their names (`is_port_available`,
`find_available_port`, `get_host_info`, `get_rollout_num_engines`, `init_http_client`,
`terminate_process`).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import random
import socket
import weakref
from collections.abc import Mapping
from typing import Any

import aiohttp
import orjson

logger = logging.getLogger(__name__)

# slime's --sglang-router-request-timeout-secs default: long generations must not time out mid-way.
DEFAULT_TIMEOUT_S = 14400.0
DEFAULT_MAX_RETRIES = 60
DEFAULT_RETRY_DELAY_S = 1.0
# Idle connections are dropped before uvicorn's 5 s keep-alive closes them on the server side: reusing
# one the server just closed fails the request (the retry would cover it, a second later).
KEEPALIVE_S = 3.0
# What a failed exchange raises: connection refused or reset, a reply cut short, a timeout.
TRANSPORT_ERRORS = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError)

_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aiohttp.ClientSession] = (
    weakref.WeakKeyDictionary()
)
_closers: set[asyncio.Task] = set()  # strong references: the loop keeps only weak ones to its tasks


class HTTPRequestError(RuntimeError):
    """An HTTP call failed for good: retries ran out, or the server answered 4xx."""

    def __init__(self, message: str, *, url: str, attempts: int, status_code: int | None = None):
        super().__init__(message)
        self.url = url
        self.attempts = attempts
        self.status_code = status_code


def make_client(timeout_s: float = DEFAULT_TIMEOUT_S) -> aiohttp.ClientSession:
    """A session sized for rollout traffic; create it inside the event loop that will use it.

    No connection cap (the rollout's semaphore bounds concurrency) and `trust_env=False`: engine,
    router and reward URLs are cluster-internal, and a proxy from the environment would misroute them.
    """
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s),
                                 trust_env=False)


def shared_client() -> aiohttp.ClientSession:
    """The running event loop's shared session, created on first use; call from inside a coroutine."""
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None or client.closed:
        client = make_client()
        _clients[loop] = client
        _closers.add(loop.create_task(_close_with_loop(client), name="http_utils: close the shared session"))
    return client


async def _close_with_loop(client: aiohttp.ClientSession) -> None:
    """Close `client` when its loop ends: `asyncio.run` cancels the tasks left at the end, this one too.
    An unclosed session would complain from the garbage collector, at some later, unrelated moment."""
    try:
        await asyncio.get_running_loop().create_future()
    finally:
        await client.close()
        _closers.discard(asyncio.current_task())


async def close_shared_client() -> None:
    """Close the running loop's shared client (e.g. before the loop ends, to avoid unclosed sockets)."""
    client = _clients.pop(asyncio.get_running_loop(), None)
    if client is not None:
        await client.close()


async def post(
    url: str,
    payload: Any,
    max_retries: int = DEFAULT_MAX_RETRIES,
    *,
    headers: Mapping[str, str] | None = None,
    retry_delay: float = DEFAULT_RETRY_DELAY_S,
    client: aiohttp.ClientSession | None = None,
) -> Any:
    """POST `payload` as JSON to `url`; return the parsed JSON reply (text if the body is not JSON).

    `max_retries` is the total number of attempts, `retry_delay` seconds apart. A None payload posts
    `{}`, as upstream's does.
    """
    body = orjson.dumps({} if payload is None else payload, option=orjson.OPT_SERIALIZE_NUMPY)
    headers = {"Content-Type": "application/json", **(headers or {})}
    return await _request("POST", url, max_retries, retry_delay, client, data=body, headers=headers)


async def get(
    url: str,
    max_retries: int = DEFAULT_MAX_RETRIES,
    *,
    params: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
    retry_delay: float = DEFAULT_RETRY_DELAY_S,
    client: aiohttp.ClientSession | None = None,
) -> Any:
    """GET `url`; return the parsed JSON reply (text if the body is not JSON), retrying like `post`."""
    return await _request("GET", url, max_retries, retry_delay, client, params=params, headers=headers)


async def _request(
    method: str,
    url: str,
    max_retries: int,
    retry_delay: float,
    client: aiohttp.ClientSession | None,
    **kwargs: Any,
) -> Any:
    if max_retries < 1:
        raise ValueError(f"max_retries must be >= 1 (total attempts), got {max_retries}")
    http = client if client is not None else shared_client()
    last_problem, last_status = "", None
    for attempt in range(1, max_retries + 1):
        try:
            async with http.request(method, url, **kwargs) as response:
                status, content = response.status, await response.read()
        except TRANSPORT_ERRORS as exc:
            last_problem, last_status = f"{type(exc).__name__}: {exc}", None
        else:
            if status < 400:
                return _decode(content)
            body = content[:500].decode(errors="replace")
            if status < 500:
                raise HTTPRequestError(
                    f"{method} {url} answered {status} (not retried: the request itself is wrong): {body}",
                    url=url,
                    attempts=attempt,
                    status_code=status,
                )
            last_problem, last_status = f"HTTP {status}: {body}", status
        if attempt < max_retries:
            logger.warning(
                "%s %s attempt %d/%d failed (%s); retrying", method, url, attempt, max_retries, last_problem
            )
            await asyncio.sleep(retry_delay)
    raise HTTPRequestError(
        f"{method} {url} failed after {max_retries} attempts (last: {last_problem}); check that the "
        "server is running and reachable at that address",
        url=url,
        attempts=max_retries,
        status_code=last_status,
    )


def _decode(content: bytes) -> Any:
    """JSON when the body parses, else its text (`/health`, `/flush_cache` answer plain text)."""
    if not content:
        return None
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        return content.decode(errors="replace")


# ------------------------------------------------------------------- upstream's host, port and setup helpers

# Upstream's override of the address this node advertises (get_host_info), and its IPv6 switch.
SLIME_HOST_IP_ENV = "SLIME_HOST_IP"
SLIME_PREFER_IPV6_ENV = "SLIME_PREFER_IPV6"


def is_port_available(port: int) -> bool:
    """Whether a listening TCP socket can be opened on `port` on every interface right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
            sock.listen(1)
        except (OSError, OverflowError):  # in use, privileged, or not a port number at all
            return False
    return True


def find_available_port(base_port: int) -> int:
    """A free port a random 100-1000 above `base_port`, so launches started together rarely collide.

    The search steps upward from there and turns downward near the top of the port range.
    """
    port = base_port + random.randint(100, 1000)
    step = 42
    for _ in range(65536):
        if 0 < port <= 65535 and is_port_available(port):
            return port
        if port >= 60000:
            step = -43
        elif port <= 1024:
            step = 42
        port += step
    raise RuntimeError(f"no free TCP port found near {base_port}; free some ports or pick another base")


def get_host_info() -> tuple[str, str]:
    """`(hostname, ip)`: the address other nodes can reach this one at.

    `$SLIME_HOST_IP` wins when set. Otherwise the address the routing table would use to leave the
    node (no packet is sent), then the hostname's own non-loopback address, then loopback. IPv4 unless
    `$SLIME_PREFER_IPV6` is 1/true/yes/on; the two families are never mixed.
    """
    hostname = socket.gethostname()
    if override := os.environ.get(SLIME_HOST_IP_ENV):
        return hostname, override
    if os.environ.get(SLIME_PREFER_IPV6_ENV, "0").strip().lower() in {"1", "true", "yes", "on"}:
        family, probe, loopback = socket.AF_INET6, "2001:4860:4860::8888", "::1"
    else:
        family, probe, loopback = socket.AF_INET, "8.8.8.8", "127.0.0.1"
    return hostname, _routed_ip(family, probe) or _hostname_ip(hostname, family) or loopback


def _is_loopback(ip: str) -> bool:
    return ip.startswith("127.") or ip == "::1"


def _routed_ip(family: socket.AddressFamily, probe: str) -> str | None:
    """The local address of a UDP socket 'connected' to `probe`: the route out, found without sending."""
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect((probe, 80))
            ip = sock.getsockname()[0]
    except OSError:
        return None
    return None if _is_loopback(ip) else ip


def _hostname_ip(hostname: str, family: socket.AddressFamily) -> str | None:
    """The first non-loopback address `hostname` resolves to (offline clusters with /etc/hosts)."""
    try:
        infos = socket.getaddrinfo(hostname, None, family=family, type=socket.SOCK_STREAM)
    except OSError:
        return None
    return next((info[4][0] for info in infos if not _is_loopback(info[4][0])), None)


def get_rollout_num_engines(args: Any) -> int:
    """How many rollout engines serve requests: `--rollout-num-engines` if given, then (ours) the
    `--rollout-engine-urls` listed, else the rollout GPUs divided by the GPUs per engine (0 without GPUs).
    """
    if getattr(args, "rollout_num_engines", None) is not None:
        return int(args.rollout_num_engines)
    if urls := getattr(args, "rollout_engine_urls", None):
        return len(urls)
    gpus = getattr(args, "rollout_num_gpus", None) or 0
    if gpus <= 0:
        return 0
    return max(1, gpus // (getattr(args, "rollout_num_gpus_per_engine", None) or 1))


def init_http_client(args: Any) -> None:
    """Upstream's set-up call before `post`/`get`; here they need none, so this only checks `args`.

    Ours creates one session per event loop on first use, with no connection cap (the rollout's
    semaphore bounds requests in flight), so there is nothing to size ahead. Upstream's
    `--use-distributed-post` (POSTs spread over Ray actors) does not exist here and is refused.
    """
    if getattr(args, "use_distributed_post", False):
        raise NotImplementedError(
            "--use-distributed-post (HTTP POSTs sent from Ray actors) is not available in this trainer: "
            "posts go out from the rollout process over one aiohttp session per event loop, which "
            "benchmarks/http_clients.py measures at thousands in flight; drop the flag"
        )


def terminate_process(process: multiprocessing.Process, timeout: float = 1.0) -> None:
    """Stop `process`: SIGTERM, then SIGKILL if it is still alive `timeout` seconds later."""
    if not process.is_alive():
        return
    process.terminate()
    process.join(timeout=timeout)
    if process.is_alive():
        process.kill()
        process.join()

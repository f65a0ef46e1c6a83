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
"""

from __future__ import annotations

import asyncio
import logging
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

    `max_retries` is the total number of attempts, `retry_delay` seconds apart.
    """
    body = orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
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

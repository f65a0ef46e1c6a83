"""Async `post` / `get` with retries: the one HTTP helper for engines, the router and remote rewards.

Plugins call `await post(url, payload)` (slime's contract: up to 60 attempts, 1 s apart). Engines
restart, routers briefly lose workers and weight updates pause servers, so connection errors and 5xx
replies are retried; 4xx replies are the caller's bug and fail at once.

One `httpx.AsyncClient` is shared per event loop (connection reuse matters at hundreds of requests
in flight). A client is bound to the loop that created it, so the cache is keyed by the running loop
and a new loop (each `asyncio.run`, each Ray actor) gets its own. Pass `client=` to manage your own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from collections.abc import Mapping
from typing import Any

import httpx

logger = logging.getLogger(__name__)

# slime's --sglang-router-request-timeout-secs default: long generations must not time out mid-way.
DEFAULT_TIMEOUT_S = 14400.0
DEFAULT_MAX_RETRIES = 60
DEFAULT_RETRY_DELAY_S = 1.0

_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
    weakref.WeakKeyDictionary()
)


class HTTPRequestError(RuntimeError):
    """An HTTP call failed for good: retries ran out, or the server answered 4xx."""

    def __init__(self, message: str, *, url: str, attempts: int, status_code: int | None = None):
        super().__init__(message)
        self.url = url
        self.attempts = attempts
        self.status_code = status_code


def make_client(timeout_s: float = DEFAULT_TIMEOUT_S) -> httpx.AsyncClient:
    """A client sized for rollout traffic.

    No connection cap (the rollout's semaphore bounds concurrency) and `trust_env=False`: engine,
    router and reward URLs are cluster-internal, and a proxy from the environment would misroute them.
    """
    return httpx.AsyncClient(
        timeout=httpx.Timeout(timeout_s),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
        trust_env=False,
    )


def shared_client() -> httpx.AsyncClient:
    """The running event loop's shared client, created on first use; call from inside a coroutine."""
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None or client.is_closed:
        client = make_client()
        _clients[loop] = client
    return client


async def close_shared_client() -> None:
    """Close the running loop's shared client (e.g. before the loop ends, to avoid unclosed sockets)."""
    client = _clients.pop(asyncio.get_running_loop(), None)
    if client is not None:
        await client.aclose()


async def post(
    url: str,
    payload: Any,
    max_retries: int = DEFAULT_MAX_RETRIES,
    *,
    headers: Mapping[str, str] | None = None,
    retry_delay: float = DEFAULT_RETRY_DELAY_S,
    client: httpx.AsyncClient | None = None,
) -> Any:
    """POST `payload` as JSON to `url`; return the parsed JSON reply (text if the body is not JSON).

    `max_retries` is the total number of attempts, `retry_delay` seconds apart.
    """
    return await _request("POST", url, max_retries, retry_delay, client, json=payload, headers=headers)


async def get(
    url: str,
    max_retries: int = DEFAULT_MAX_RETRIES,
    *,
    params: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
    retry_delay: float = DEFAULT_RETRY_DELAY_S,
    client: httpx.AsyncClient | None = None,
) -> Any:
    """GET `url`; return the parsed JSON reply (text if the body is not JSON), retrying like `post`."""
    return await _request("GET", url, max_retries, retry_delay, client, params=params, headers=headers)


async def _request(
    method: str,
    url: str,
    max_retries: int,
    retry_delay: float,
    client: httpx.AsyncClient | None,
    **kwargs: Any,
) -> Any:
    if max_retries < 1:
        raise ValueError(f"max_retries must be >= 1 (total attempts), got {max_retries}")
    http = client if client is not None else shared_client()
    last_problem, last_status = "", None
    for attempt in range(1, max_retries + 1):
        try:
            response = await http.request(method, url, **kwargs)
        except httpx.TransportError as exc:
            last_problem, last_status = f"{type(exc).__name__}: {exc}", None
        else:
            if response.status_code < 400:
                return _decode(response)
            body = response.text[:500]
            if response.status_code < 500:
                raise HTTPRequestError(
                    f"{method} {url} answered {response.status_code} (not retried: the request itself "
                    f"is wrong): {body}",
                    url=url,
                    attempts=attempt,
                    status_code=response.status_code,
                )
            last_problem, last_status = f"HTTP {response.status_code}: {body}", response.status_code
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


def _decode(response: httpx.Response) -> Any:
    """JSON when the body parses, else its text (`/health`, `/flush_cache` answer plain text)."""
    if not response.content:
        return None
    try:
        return response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return response.text

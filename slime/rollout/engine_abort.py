"""Ending the requests engines hold (sglang's `/abort_request`) and waiting until they are idle.

Used by the default rollout when a step's batch is full: `abort_engines` tells each engine `abort_all`, and
`settle_engines` re-aborts until its load report (`/v1/loads`, or `/get_server_info` on the CPU and scripted
engines) shows nothing running or waiting.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from slime.engine.base import ABORT, LOADS
from slime.utils.http_utils import HTTPRequestError, get, post

logger = logging.getLogger(__name__)

ABORT_ALL = {"abort_all": True}  # sglang's AbortReq body: every request the engine holds ends with "abort"
LOADS_PATH = LOADS.path  # sglang's load report ({"loads": [per DP rank: num_running_reqs, num_waiting_reqs]})
SERVER_INFO_PATH = "/get_server_info"  # the CPU engine's (and scripted engine's) num_running_reqs / num_waiting_reqs
SETTLE_TIMEOUT_S = 30.0  # how long `settle_engines` re-aborts before it gives up with a warning
_LOAD_PATHS: dict[str, str] = {}  # engine URL -> the load endpoint it answered (/v1/loads or /get_server_info)


async def abort_engines(urls: Sequence[str]) -> None:
    """POST `{"abort_all": true}` to each URL: held requests end at once with finish_reason abort.

    A failed abort is logged, not raised: an engine that cannot be reached holds no request of ours
    that could finish, and the step's batch is already complete."""
    results = await asyncio.gather(*(post(f"{url}{ABORT.path}", ABORT_ALL, max_retries=2, retry_delay=0.2)
                                     for url in urls), return_exceptions=True)
    for url, result in zip(urls, results, strict=True):
        if isinstance(result, BaseException):
            logger.warning("abort_all on %s failed: %s: %s", url, type(result).__name__, result)


def requests_in(reply: Any, path: str) -> int | None:
    """Requests running or waiting in a load reply: sglang's `/v1/loads` (`loads`: one entry per DP rank) or a
    `/get_server_info` carrying `num_running_reqs` / `num_waiting_reqs` at the top (the CPU and scripted
    engines); None when the reply has no such counts (stock sglang's /get_server_info)."""
    entries = reply.get("loads") if isinstance(reply, dict) and path == LOADS_PATH else [reply]
    if not isinstance(entries, list) or not entries or not all(
            isinstance(e, dict) and "num_running_reqs" in e for e in entries):
        return None
    return sum(int(e["num_running_reqs"]) + int(e.get("num_waiting_reqs") or 0) for e in entries)


async def engine_load(url: str) -> int | None:
    """Requests an engine is running or queueing (`requests_in`): `GET /v1/loads`, else `GET /get_server_info`;
    None when neither says."""
    paths = [_LOAD_PATHS[url]] if url in _LOAD_PATHS else [LOADS_PATH, SERVER_INFO_PATH]
    for path in paths:
        try:
            reply = await get(f"{url}{path}", max_retries=1)
        except HTTPRequestError as exc:
            if exc.status_code in (404, 405):
                continue
            logger.warning("load of %s unknown: %s", url, exc)
            return None
        count = requests_in(reply, path)
        if count is not None:
            _LOAD_PATHS[url] = path
            return count
    return None


async def settle_engines(urls: Sequence[str], timeout_s: float = SETTLE_TIMEOUT_S) -> dict[str, int | None]:
    """Abort again until every engine reports no request running or waiting (or `timeout_s` passes).

    An abort ends what the engine holds when it reads it; a request whose client was cancelled while its
    body was still on the way arrives afterwards and would run to its token limit (sglang aborts on a client
    disconnect, the CPU engine does not). Returns the last load seen per engine (None: it reports none)."""
    deadline = time.monotonic() + timeout_s
    loads: dict[str, int | None] = {}
    busy = list(urls)
    while busy:
        for url, load in zip(busy, await asyncio.gather(*(engine_load(u) for u in busy)), strict=True):
            loads[url] = load
        busy = [u for u in busy if loads[u]]
        if not busy:
            break
        if time.monotonic() > deadline:
            logger.warning("engines still busy %.0f s after abort_all: %s", timeout_s,
                           {u: loads[u] for u in busy})
            break
        await abort_engines(busy)
        await asyncio.sleep(0.05)
    return loads

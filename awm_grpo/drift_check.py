"""The end-of-episode drift check, in helper processes: off the rollout driver's core.

`ChatEncoder.drift` re-renders a finished conversation through the chat template and re-encodes the model's
own text, to count where the ids the episode was played with differ from a full render
(docs/chat-templates.md). That is about a third of the rollout driver's CPU an episode
(docs/performance.md), and one driver process plays every episode of a step. With `awm_drift_workers` N > 0
the check runs in N spawned processes holding the same tokenizer and template; the driver pickles the
conversation (its ids, messages and the pieces already encoded) and awaits one `Drift`. With 0, or where a
worker cannot load the tokenizer, it runs in the driver (the same numbers: tests/awm_grpo/test_drift_check.py).

The workers are the driver's own children: they receive text and ids, and give back four integers.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from awm_grpo.chat import ChatEncoder, Drift

logger = logging.getLogger(__name__)

_POOLS: dict[tuple[str, int], ProcessPoolExecutor | None] = {}  # None: the workers could not start; in the driver
_WORKER: dict[str, Any] = {}  # in a worker: its tokenizer and encoders


async def drift(encoder: ChatEncoder, workers: int, tokens: list[int], messages: list[dict[str, Any]], *,
                open_turn: bool, pieces: dict[str, list[int]] | None) -> Drift:
    """`encoder.drift(tokens, messages, ...)`, in one of `workers` helper processes (0: here)."""
    path = getattr(encoder.tok, "name_or_path", "") or ""
    pool = _pool(path, workers) if workers > 0 and path else None
    if pool is not None:
        system = encoder.system[0]["content"] if encoder.system else None
        try:
            found = await asyncio.get_running_loop().run_in_executor(
                pool, _check, path, system, encoder.tools, encoder.kwargs, tokens, messages, open_turn, pieces)
            if isinstance(found, Drift):
                return found
            raise TypeError(f"a drift worker returned {type(found).__name__}")
        except (BrokenProcessPool, OSError, TypeError, ValueError) as exc:
            logger.warning("the drift check's helper processes failed (%s): it runs in the rollout driver from now on",
                           exc)
            _POOLS[(path, workers)] = None
            pool.shutdown(wait=False, cancel_futures=True)
    return encoder.drift(tokens, messages, open_turn=open_turn, pieces=pieces)


def _pool(path: str, workers: int) -> ProcessPoolExecutor | None:
    key = (path, workers)
    if key not in _POOLS:
        # spawn: the driver runs threads (Ray, aiohttp's resolver, the runtime's readers), which fork would copy
        # mid-lock
        _POOLS[key] = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                          initializer=_init_worker, initargs=(path,))
    return _POOLS[key]


@atexit.register
def shutdown() -> None:
    """Stop every helper process (at exit; tests)."""
    for pool in _POOLS.values():
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
    _POOLS.clear()


def _init_worker(path: str) -> None:
    import gc

    from transformers import AutoTokenizer

    _WORKER["tokenizer"] = AutoTokenizer.from_pretrained(path)
    _WORKER["encoders"] = {}
    gc.freeze()  # the libraries out of the collector's walks (awm_grpo.rollout.relax_gc does the same)


def _check(path: str, system: str | None, tools: list[dict[str, Any]] | None, kwargs: dict[str, Any],
           tokens: list[int], messages: list[dict[str, Any]], open_turn: bool,
           pieces: dict[str, list[int]] | None) -> Drift:
    key = (system, json.dumps(tools, sort_keys=True), json.dumps(kwargs, sort_keys=True))
    encoders: dict[Any, ChatEncoder] = _WORKER["encoders"]
    if key not in encoders:
        encoders[key] = ChatEncoder(_WORKER["tokenizer"], system, tools, kwargs)
    return encoders[key].drift(tokens, messages, open_turn=open_turn, pieces=pieces)

"""One background event loop per process for rollout coroutines (slime's `slime.utils.async_utils`).

Upstream's rollout functions are plain functions: `generate_rollout(args, rollout_id, data_source)` blocks
until its step is done. Their coroutines (generate, reward, HTTP clients, `GenerateState`'s semaphore) all
run on one long-lived loop in a daemon thread, so objects bound to a loop stay valid from one step to the
next, and a caller that has its own loop (the trainer) calls the rollout from a worker thread without
nesting loops.

    from slime.utils.async_utils import run
    reward = run(async_rm(args, sample))       # blocks; runs on the background loop
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["AsyncLoopThread", "get_async_loop", "run"]

T = TypeVar("T")


class AsyncLoopThread:
    """An event loop running forever in a daemon thread; `run(coro)` submits and waits."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name="slime-rollout-loop", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the loop and return its result (or raise its exception) in the calling thread.

        Called from the loop's own thread it would wait on itself forever: that is refused instead."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("slime.utils.async_utils.run was called from inside the rollout loop; "
                               "`await` the coroutine there instead")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # the caller was interrupted (KeyboardInterrupt): stop the coroutine too
            raise


_LOCK = threading.Lock()
_LOOP: AsyncLoopThread | None = None


def get_async_loop() -> AsyncLoopThread:
    """The process's background loop, started on first use."""
    global _LOOP
    with _LOCK:
        if _LOOP is None:
            _LOOP = AsyncLoopThread()
        return _LOOP


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on the process's background loop and wait for its result."""
    return get_async_loop().run(coro)

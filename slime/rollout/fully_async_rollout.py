"""Fully asynchronous rollout (slime's `slime.rollout.fully_async_rollout`): generation never stops between steps.

    --rollout-function-path slime.rollout.fully_async_rollout.generate_rollout_fully_async
    [--custom-generate-function-path ...] [--custom-rm-path ...] [--sglang-server-concurrency N]

On its first call a background worker starts (one per process) and from then on keeps up to `concurrency`
prompt groups in flight, `--sglang-server-concurrency` x engines as slime sizes it: it draws one group at a
time from the data source and runs slime's `generate_and_rm_group` on it (so custom generate and reward
functions apply as in the default rollout). A step takes the first `--rollout-batch-size` finished groups
that are waiting and returns them ordered by sample index; groups finished beyond that stay queued for the
next step, where they are a step or more off-policy (their `weight_versions` say which weights made them).
The worker stops drawing while `concurrency` finished groups wait. A group that comes back with an ABORTED
sample goes back to the data source (`add_samples`) instead of to training, to be generated again.

Ours: the worker runs on the process's rollout loop (`slime.utils.async_utils`), the loop that
`GenerateState`'s semaphore and the HTTP clients belong to, not on a loop of its own; a worker whose groups
keep failing (e.g. every engine gone) makes the next step raise with the error instead of waiting forever.
Prompts the worker drew but that were not trained on before a checkpoint are not replayed on resume.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import concurrent.futures
import logging
import queue
import threading
import time
from typing import Any

from slime.rollout.sglang_rollout import GenerateState, generate_and_rm_group
from slime.utils.async_utils import get_async_loop, run
from slime.utils.types import Sample

__all__ = ["AsyncRolloutWorker", "generate_rollout_fully_async"]

logger = logging.getLogger(__name__)

_WORKER: AsyncRolloutWorker | None = None
_WORKER_LOCK = threading.Lock()
_PROGRESS_LOG_S = 30.0


class AsyncRolloutWorker:
    """Keeps `concurrency` groups generating from `data_buffer`; finished ones wait in `output_queue`.

    `start()` launches it on the rollout loop; `get_completed_groups(limit)` pops finished groups as
    `(draw number, group)`; `queue_size()` counts them; `stop()` cancels what is in flight.
    """

    def __init__(self, args: argparse.Namespace, data_buffer: Any, concurrency: int = 10):
        if concurrency < 1:
            raise ValueError(f"fully-async rollout needs a concurrency of at least 1, got {concurrency}: "
                             "raise --sglang-server-concurrency")
        self.args = args
        self.data_buffer = data_buffer
        self.concurrency = concurrency
        self.running = False
        self.output_queue: queue.Queue[tuple[int, list[Sample]]] = queue.Queue()
        self.poll_interval = 1.0
        self.state = GenerateState(args)
        self.draws = 0  # groups drawn so far (their draw number orders nothing, it only names them)
        self.requeued = 0  # groups given back to the data source because a sample was aborted
        self.failed = 0  # groups whose generation raised (dropped, as slime does)
        self.error: BaseException | None = None  # set once groups keep failing: the collector raises it
        self._failures_in_a_row = 0
        self._future: concurrent.futures.Future | None = None

    # ---- control ----------------------------------------------------------------------------------------

    def start(self) -> None:
        if self.is_alive():
            return
        self.running = True
        self._future = asyncio.run_coroutine_threadsafe(self._serve(), get_async_loop().loop)

    def is_alive(self) -> bool:
        return self._future is not None and not self._future.done()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop drawing, cancel the groups in flight and wait (at most `timeout_s`) for the worker to end."""
        self.running = False
        if self._future is not None:
            try:
                self._future.result(timeout=timeout_s)
            except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
                self._future.cancel()
            except Exception:  # noqa: BLE001 - the worker's own failure was logged where it happened
                pass

    def get_completed_groups(self, limit: int | None = None) -> list[tuple[int, list[Sample]]]:
        """Pop up to `limit` finished groups (every waiting one when None); the rest stay queued."""
        out: list[tuple[int, list[Sample]]] = []
        while limit is None or len(out) < limit:
            try:
                out.append(self.output_queue.get_nowait())
            except queue.Empty:
                break
        return out

    def queue_size(self) -> int:
        return self.output_queue.qsize()

    # ---- the worker ---------------------------------------------------------------------------------------

    async def _serve(self) -> None:
        in_flight: set[asyncio.Task] = set()
        try:
            while self.running:
                while self.running and len(in_flight) < self.concurrency and self.queue_size() < self.concurrency:
                    groups = self.data_buffer.get_samples(1)
                    if not groups:
                        break
                    for group in groups:
                        in_flight.add(self._launch(group))
                if in_flight:
                    done, in_flight = await asyncio.wait(in_flight, timeout=self.poll_interval,
                                                         return_when=asyncio.FIRST_COMPLETED)
                else:
                    await asyncio.sleep(self.poll_interval)
        finally:
            for task in in_flight:
                task.cancel()
            if in_flight:
                await asyncio.gather(*in_flight, return_exceptions=True)

    def _launch(self, group: list[Sample]) -> asyncio.Task:
        draw = self.draws
        self.draws += 1
        task = asyncio.ensure_future(generate_and_rm_group(
            self.args, group, dict(self.state.sampling_params), evaluation=False))
        task.add_done_callback(lambda t: self._finished(draw, t))
        return task

    def _finished(self, draw: int, task: asyncio.Task) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            self.failed += 1
            self._failures_in_a_row += 1
            logger.warning("fully-async rollout: a group failed and is dropped: %r", error)
            if self._failures_in_a_row >= max(self.concurrency, 4):
                self.error = error
            return
        self._failures_in_a_row = 0
        result = task.result()
        if not isinstance(result, list) or not all(isinstance(s, Sample) for s in result):
            logger.warning("fully-async rollout: generate_and_rm_group returned %s, not a list of Samples; dropped",
                           type(result).__name__)
            return
        if any(s.status == Sample.Status.ABORTED for s in result):
            self.requeued += 1
            self.data_buffer.add_samples([result])
            return
        self.output_queue.put((draw, result))


def _worker(args: argparse.Namespace, data_buffer: Any) -> AsyncRolloutWorker:
    """The process's worker, (re)started when there is none running."""
    global _WORKER
    with _WORKER_LOCK:
        if _WORKER is None or not _WORKER.is_alive():
            concurrency = GenerateState(args).concurrency
            logger.info("fully-async rollout: starting the background worker (%d groups in flight)", concurrency)
            _WORKER = AsyncRolloutWorker(args, data_buffer, concurrency=concurrency)
            _WORKER.start()
        return _WORKER


def stop_worker() -> None:
    """Stop the process's worker (at exit, or before a test starts another)."""
    global _WORKER
    with _WORKER_LOCK:
        if _WORKER is not None:
            _WORKER.stop()
            _WORKER = None


atexit.register(stop_worker)


def _first_index(group: list[Sample]) -> int:
    return next((int(s.index) for s in group if s.index is not None), 0)


async def _collect(worker: AsyncRolloutWorker, rollout_id: int, target: int) -> list[list[Sample]]:
    started = last_log = time.monotonic()
    groups: list[list[Sample]] = []
    while len(groups) < target:
        got = worker.get_completed_groups(limit=target - len(groups))
        groups += [group for _, group in got]
        if got:
            continue
        if worker.error is not None:
            raise RuntimeError(f"fully-async rollout: every recent group failed (last error: {worker.error!r}); "
                               "check the engines and the generate / reward functions") from worker.error
        if not worker.is_alive():
            raise RuntimeError("fully-async rollout: the background worker stopped; see the log for why")
        await asyncio.sleep(0.05)
        if time.monotonic() - last_log > _PROGRESS_LOG_S:
            last_log = time.monotonic()
            logger.info("fully-async rollout %d: %d/%d groups after %.0f s (%d waiting)", rollout_id, len(groups),
                        target, last_log - started, worker.queue_size())
    return sorted(groups, key=_first_index)


def generate_rollout_fully_async(
    args: argparse.Namespace, rollout_id: int, data_buffer: Any, evaluation: bool = False
) -> list[list[Sample]]:
    """slime's `--rollout-function-path` entry: `--rollout-batch-size` finished groups from the worker."""
    if evaluation:
        raise ValueError("the fully-async rollout has no evaluation mode: set --eval-function-path to "
                         "slime.rollout.sglang_rollout.generate_rollout for evaluation")
    if not getattr(args, "rollout_global_dataset", True):
        raise ValueError("the fully-async rollout draws from the global dataset: drop --disable-rollout-global-dataset")
    worker = _worker(args, data_buffer)
    return run(_collect(worker, rollout_id, args.rollout_batch_size))

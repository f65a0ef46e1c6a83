"""`python -m slime.train_async ...`: one-step-off-policy training (slime's train_async.py), same flags.

Timeline with `--update-weights-interval 1` (w_v = weights after v train steps):

    gen(0, w0) | train(0) || gen(1, w0) | sync w1 | train(1) || gen(2, w1) | sync w2 | ...

The rollout of step k+1 starts as soon as step k's rollout is in, and runs while step k trains.
Weights are synced after step k trained and only once the in-flight generation finished (never in
the middle of a generation), so step k+1 trains on samples from w_k while holding w_{k+1}:
**one step stale** (`rollout/weight_staleness` = 1 from the second step on; larger intervals add
staleness). The trainer recomputes the old log-probs with its current weights; the samples keep the
engine's `rollout_log_probs`, so `--use-tis` reweights by exp(lp_old - lp_rollout) and
`--use-rollout-logprobs` takes the PPO ratio against the generating policy. The train/rollout
log-prob gap metric therefore measures staleness here, not only numerical mismatch.

Save and resume work as in `python -m slime.train`: a checkpoint after step k stores the prompt
position from before step k+1's in-flight draws, so a resumed run regenerates step k+1 from the
same prompts. Per-step overlap figures: `async/rollout_overlap_s` (how much of this step's rollout
ran during the previous step's training), `async/rollout_overlap_ratio` (that over the rollout
time) and `async/wait_for_rollout_s` (how long the trainer sat idle, from the end of its previous
step, until this step's rollout was in).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from typing import Any

from slime.arguments import ArgumentError
from slime.train import Run, StepBatch
from slime.train import main as _main


class AsyncRun(Run):
    """The synchronous run's pieces, scheduled one step off-policy (see the module docstring)."""

    def __init__(self, args: argparse.Namespace):
        if args.offload_train or args.offload_rollout:
            raise ArgumentError("train_async generates while it trains, so trainer and engines cannot hand one GPU "
                                "back and forth: drop --colocate / --offload* (slime runs colocated only synchronously)")
        super().__init__(args)

    def _spawn(self, rollout_id: int) -> tuple[asyncio.Task, dict[str, Any]]:
        """Start step `rollout_id`'s generation; also return the data position before its draws."""
        state = self.data_source.state()  # taken before the task can draw anything
        return asyncio.create_task(self.generate(rollout_id), name=f"rollout-{rollout_id}"), state

    async def run(self) -> None:
        args = self.args
        start = await self.start()
        if start >= args.num_rollout:
            return
        task, _ = self._spawn(start)
        previous_train: tuple[float, float] | None = None
        try:
            for rollout_id in range(start, args.num_rollout):
                waited = time.perf_counter()
                batch: StepBatch = await task
                waited = time.perf_counter() - waited
                pending = self._spawn(rollout_id + 1) if rollout_id + 1 < args.num_rollout else None
                task = pending[0] if pending else None
                train_started = time.perf_counter()
                metrics = await self.train(batch)
                metrics.update(overlap_metrics(batch, previous_train, waited))
                previous_train = (train_started, time.perf_counter())
                await self.end_step(batch, metrics, in_flight=task, next_data_state=pending[1] if pending else None)
                self.bar.update()
        finally:
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)


def overlap_metrics(batch: StepBatch, previous_train: tuple[float, float] | None, waited: float) -> dict[str, float]:
    """How much of this step's rollout ran while the previous step trained, and how long training waited.

    overlap = max(0, min(gen_end, train_end) - max(gen_start, train_start)); ratio = overlap / rollout time.
    wait = gen_end - previous train_end (>= 0): the trainer idles from the end of its previous step until
    this rollout is in, whether it waits in the loop or in `end_step` (the weight sync waits for the
    in-flight generation, so with `--update-weights-interval 1` that is where it waits). First step:
    `waited`, the time the loop awaited the rollout.
    """
    rollout_s = batch.finished - batch.started
    overlap = 0.0
    if previous_train is not None:
        overlap = max(0.0, min(batch.finished, previous_train[1]) - max(batch.started, previous_train[0]))
        waited = max(0.0, batch.finished - previous_train[1])
    return {
        "async/rollout_overlap_s": overlap,
        "async/rollout_overlap_ratio": overlap / rollout_s if rollout_s > 0 else 0.0,
        "async/wait_for_rollout_s": waited,
    }


def main(argv: Sequence[str] | None = None) -> None:
    _main(argv, run_cls=AsyncRun)


if __name__ == "__main__":
    main()

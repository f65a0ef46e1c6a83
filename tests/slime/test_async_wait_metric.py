"""`async/wait_for_rollout_s` is the trainer's idle time, wherever the async loop waits for the rollout."""

from __future__ import annotations

import pytest

from slime.train import StepBatch
from slime.train_async import overlap_metrics


def batch(started: float, finished: float) -> StepBatch:
    return StepBatch(1, [], None, {}, 0.0, started, finished)


def test_wait_counts_the_idle_time_after_the_previous_step_trained():
    # generation 10..50, previous step trained 20..30: end_step waited 30..50 for it before the weight sync,
    # and the loop's own await then took no time (the case the recipe's CPU run showed: 0.0005 s reported)
    m = overlap_metrics(batch(10.0, 50.0), (20.0, 30.0), waited=0.0005)
    assert m["async/rollout_overlap_s"] == pytest.approx(10.0)
    assert m["async/rollout_overlap_ratio"] == pytest.approx(0.25)
    assert m["async/wait_for_rollout_s"] == pytest.approx(20.0)


def test_no_wait_when_the_rollout_finished_while_training():
    m = overlap_metrics(batch(10.0, 25.0), (20.0, 30.0), waited=0.0)
    assert m["async/wait_for_rollout_s"] == 0.0 and m["async/rollout_overlap_s"] == pytest.approx(5.0)


def test_first_step_reports_the_awaited_time():
    m = overlap_metrics(batch(0.0, 29.0), None, waited=29.0)
    assert m == {"async/rollout_overlap_s": 0.0, "async/rollout_overlap_ratio": 0.0, "async/wait_for_rollout_s": 29.0}

"""What a rollout function returns (`--rollout-function-path`; docs/trainer.md, slime's contracts).

`fn(args, rollout_id, data_source, evaluation=False)` returns `RolloutFnTrainOutput` (train) or
`RolloutFnEvalOutput` (evaluation). Legacy functions return the bare payload instead: a list of
groups (`list[list[Sample]]`) or the eval dict `{name: {"rewards", "truncated", "samples"}}`;
`call_rollout_fn` accepts both and always hands back the dataclass.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slime.utils.types import Sample


@dataclass
class RolloutFnTrainOutput:
    """One step's groups of samples (each group: the samples of one prompt) and rollout metrics."""

    samples: list[list[Sample]]
    metrics: dict[str, Any] | None = None


@dataclass
class RolloutFnEvalOutput:
    """Eval results per dataset name: `{"rewards": [...], "truncated": [...], "samples": [...]}`."""

    data: dict[str, dict[str, Any]]
    metrics: dict[str, Any] | None = None


def _as_groups(samples: Any) -> list[list[Sample]]:
    """Validate train samples as a list of groups; a flat list of Samples is grouped by group_index."""
    if not isinstance(samples, list | tuple):
        raise TypeError(f"rollout function returned {type(samples).__name__}; expected a list of sample groups")
    if samples and all(isinstance(s, Sample) for s in samples):
        groups: dict[Any, list[Sample]] = {}
        for i, s in enumerate(samples):
            groups.setdefault(s.group_index if s.group_index is not None else ("ungrouped", i), []).append(s)
        return list(groups.values())
    out = []
    for group in samples:
        if not isinstance(group, list | tuple) or not all(isinstance(s, Sample) for s in group):
            raise TypeError("rollout function must return list[list[Sample]] (one list per prompt group)")
        out.append(list(group))
    return out


def normalize_rollout_output(output: Any, *, evaluation: bool) -> RolloutFnTrainOutput | RolloutFnEvalOutput:
    """The dataclass for `output`, which may be a dataclass or a legacy bare payload."""
    if evaluation:
        if isinstance(output, RolloutFnEvalOutput):
            return output
        if isinstance(output, dict):
            return RolloutFnEvalOutput(data=output)
        raise TypeError(f"eval rollout function returned {type(output).__name__}; expected RolloutFnEvalOutput "
                        "or a dict {dataset name: {'rewards', 'truncated', 'samples'}}")
    if isinstance(output, RolloutFnTrainOutput):
        return RolloutFnTrainOutput(samples=_as_groups(output.samples), metrics=output.metrics)
    if isinstance(output, RolloutFnEvalOutput):
        raise TypeError("rollout function returned RolloutFnEvalOutput for a training rollout")
    return RolloutFnTrainOutput(samples=_as_groups(output))


async def call_rollout_fn(
    fn: Callable[..., Any], *args: Any, evaluation: bool = False, **kwargs: Any
) -> RolloutFnTrainOutput | RolloutFnEvalOutput:
    """Call a rollout function and normalise what it returns.

    Coroutine functions are awaited in the caller's event loop; plain functions run in a worker
    thread, so a sync plugin that drives its own event loop (as slime's own rollout code does) works.
    """
    if inspect.iscoroutinefunction(fn):
        output = await fn(*args, evaluation=evaluation, **kwargs)
    else:
        output = await asyncio.to_thread(fn, *args, evaluation=evaluation, **kwargs)
        if inspect.isawaitable(output):
            output = await output
    return normalize_rollout_output(output, evaluation=evaluation)

"""What a rollout function returns (`--rollout-function-path`; docs/trainer.md, slime's contracts).

`fn(args, rollout_id, data_source, evaluation=False)` returns `RolloutFnTrainOutput` (train) or
`RolloutFnEvalOutput` (evaluation). Legacy functions return the bare payload instead: a list of
groups (`list[list[Sample]]`) or the eval dict `{name: {"rewards", "truncated", "samples"}}`;
`call_rollout_fn` accepts both and always hands back the dataclass.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slime.utils.async_utils import run
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
    """Validate train samples as a list of groups; every sample leaves with a `group_index`.

    A flat list of Samples is grouped by `group_index`, and samples without one by their prompt. In a list
    of groups, a sample without `group_index` takes its group's (a sibling's, else a new negative number
    per group): group statistics (GRPO's mean and std) are taken over `group_index`, so a sample a plugin
    built afresh would otherwise be a group of one, with advantage 0 whatever its reward."""
    if not isinstance(samples, list | tuple):
        raise TypeError(f"rollout function returned {type(samples).__name__}; expected a list of sample groups")
    if samples and all(isinstance(s, Sample) for s in samples):
        by_key: dict[Any, list[Sample]] = {}
        for s in samples:
            by_key.setdefault(("group", s.group_index) if s.group_index is not None else ("prompt", repr(s.prompt)),
                              []).append(s)
        groups = list(by_key.values())
    else:
        groups = []
        for group in samples:
            if not isinstance(group, list | tuple) or not all(isinstance(s, Sample) for s in group):
                raise TypeError("rollout function must return list[list[Sample]] (one list per prompt group)")
            groups.append(list(group))
    for k, group in enumerate(groups):
        known = next((s.group_index for s in group if s.group_index is not None), -1 - k)
        for s in group:
            if s.group_index is None:
                s.group_index = known
    return groups


def normalize_rollout_output(output: Any, *, evaluation: bool) -> RolloutFnTrainOutput | RolloutFnEvalOutput:
    """The dataclass for `output`, which may be a dataclass or a legacy bare payload.

    As upstream's `call_rollout_fn`, a dataclass of the other kind (a train output from an eval call) is
    passed through unchanged for the caller to judge (`expect_output`); a bare payload that is neither a
    list of groups nor an eval dict is a TypeError."""
    if isinstance(output, RolloutFnTrainOutput):
        return RolloutFnTrainOutput(samples=_as_groups(output.samples), metrics=output.metrics)
    if isinstance(output, RolloutFnEvalOutput):
        return output
    if evaluation:
        if isinstance(output, dict):
            return RolloutFnEvalOutput(data=output)
        raise TypeError(f"eval rollout function returned {type(output).__name__}; expected RolloutFnEvalOutput "
                        "or a dict {dataset name: {'rewards', 'truncated', 'samples'}}")
    return RolloutFnTrainOutput(samples=_as_groups(output))


def expect_output(output: Any, *, evaluation: bool, path: str) -> Any:
    """`output` if it is the kind the call asked for, else a TypeError naming the rollout function `path`."""
    wanted = RolloutFnEvalOutput if evaluation else RolloutFnTrainOutput
    if not isinstance(output, wanted):
        raise TypeError(f"rollout function {path} returned {type(output).__name__} for "
                        f"{'an evaluation' if evaluation else 'a training'} call; return {wanted.__name__}")
    return output


def call_rollout_fn(
    fn: Callable[..., Any], *args: Any, evaluation: bool = False, **kwargs: Any
) -> RolloutFnTrainOutput | RolloutFnEvalOutput:
    """Call a rollout function and normalise what it returns (upstream's contract: a plain call).

    Ours besides: a coroutine function, or a function returning an awaitable, is run to its end on the
    process's rollout loop (`slime.utils.async_utils.run`), so async rollout plugins work too. The trainer
    calls this from a worker thread, never from that loop.
    """
    output = fn(*args, evaluation=evaluation, **kwargs)
    if inspect.isawaitable(output):
        output = run(_awaited(output))
    return normalize_rollout_output(output, evaluation=evaluation)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable

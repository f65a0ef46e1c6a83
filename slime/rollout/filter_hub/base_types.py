"""The result type of a dynamic sampling filter (`--dynamic-sampling-filter-path`) and how it is applied."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class DynamicFilterOutput:
    """slime's filter result: keep the group or drop it (with a reason, logged as a metric).

    `keep_when_insufficient`: a dropped group that is still used when dropping it would force another
    over-sampling round.
    """

    keep: bool
    reason: str | None = None
    keep_when_insufficient: bool = False


def call_dynamic_filter(fn: Callable[..., Any] | None, *args: Any, **kwargs: Any) -> DynamicFilterOutput:
    """Run a filter (None keeps everything); a legacy bare truth value becomes `DynamicFilterOutput(keep=...)`."""
    if fn is None:
        return DynamicFilterOutput(keep=True)
    out = fn(*args, **kwargs)
    return out if isinstance(out, DynamicFilterOutput) else DynamicFilterOutput(keep=out)


def should_drop_dynamic_filter_output(
    output: DynamicFilterOutput, *, remaining_batch_size: int, target_data_size: int
) -> bool:
    """Whether a finished group leaves the batch (upstream's rule).

    A kept group stays. A rejected one stays anyway when it says `keep_when_insufficient` and the groups
    still counting towards the batch (`remaining_batch_size`: in flight or kept) are no more than the batch
    needs (`target_data_size`): dropping it would start another over-sampling round."""
    if output.keep:
        return False
    return not (output.keep_when_insufficient and remaining_batch_size <= target_data_size)


class MetricGatherer:
    """Counts of dropped groups per filter reason, as `rollout/dynamic_filter/drop_<reason>` metrics."""

    def __init__(self) -> None:
        self._drops: Counter[str] = Counter()

    def on_dynamic_filter_drop(self, reason: str | None) -> None:
        if reason:
            self._drops[reason] += 1

    def collect(self) -> dict[str, int]:
        return {f"rollout/dynamic_filter/drop_{reason}": count for reason, count in self._drops.items()}

"""The result type of a dynamic sampling filter (`--dynamic-sampling-filter-path`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DynamicFilterOutput:
    """slime's filter result: keep the group or drop it (with a reason, logged as a metric).

    `keep_when_insufficient`: a dropped group that is still used when dropping it would force another
    over-sampling round.
    """

    keep: bool
    reason: str | None = None
    keep_when_insufficient: bool = False

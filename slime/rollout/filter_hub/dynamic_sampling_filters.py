"""Stock dynamic sampling filters (`--dynamic-sampling-filter-path slime.rollout.filter_hub....`)."""

from __future__ import annotations

import argparse
from typing import Any

from slime.rollout.filter_hub.base_types import DynamicFilterOutput
from slime.utils.types import Sample


def _reward_std(args: argparse.Namespace, samples: list[Sample]) -> tuple[float, float]:
    """(population std, first reward) of the group's scalar rewards, in float64."""
    rewards = [float(s.get_reward_value(args)) for s in samples]
    mean = sum(rewards) / len(rewards)
    return (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5, rewards[0]


def check_reward_nonzero_std(args: argparse.Namespace, samples: list[Sample], **kwargs: Any) -> DynamicFilterOutput:
    """Keep a group iff its rewards differ (float std > 1e-6): an all-equal group has zero advantage."""
    std, first = _reward_std(args, samples)
    if std > 1e-6:
        return DynamicFilterOutput(keep=True)
    return DynamicFilterOutput(keep=False, reason=f"zero_std_{first:.1f}")


def check_reward_nonzero_std_with_fallback(
    args: argparse.Namespace, samples: list[Sample], **kwargs: Any
) -> DynamicFilterOutput:
    """`check_reward_nonzero_std`, but a dropped group is still used rather than over-sample again."""
    out = check_reward_nonzero_std(args, samples, **kwargs)
    if not out.keep:
        out.keep_when_insufficient = True
    return out

"""Rollout and eval logging hooks (`--custom-rollout-log-function-path`,
`--custom-eval-rollout-log-function-path`).

slime's contract: the hook returns a bool, True meaning "skip the default logging". Ours also
accepts a dict: its numeric entries (int, float, bool) are merged into the step's metrics, so a hook
can add its own curves (success rate by task type, turns per episode) to JSONL, TensorBoard and
wandb without opening its own writer. None (no return) keeps the default logging.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)


@dataclass
class HookResult:
    """What a hook asked for: skip the default metrics, and extra metrics to log."""

    skip_default: bool = False
    metrics: dict[str, float] = field(default_factory=dict)


def interpret_hook_return(value: Any, hook_path: str) -> HookResult:
    """bool -> skip flag; dict -> numeric entries as metrics; None -> defaults; anything else is an error."""
    if value is None:
        return HookResult()
    if isinstance(value, bool):
        return HookResult(skip_default=value)
    if isinstance(value, dict):
        metrics, ignored = {}, []
        for key, v in value.items():
            if isinstance(v, int | float) and math.isfinite(float(v)):
                metrics[str(key)] = float(v)
            else:
                ignored.append(str(key))
        if ignored:
            logger.debug("%s: non-numeric or non-finite entries not logged: %s", hook_path, ", ".join(ignored[:10]))
        return HookResult(metrics=metrics)
    raise TypeError(
        f"log hook {hook_path} returned {type(value).__name__}; return None, a bool (True skips the default "
        "logging) or a dict of numeric metrics"
    )


async def call_log_hook(fn: Callable[..., Any], hook_path: str, *args: Any) -> HookResult:
    """Call a sync or async hook with positional `args` and interpret its return value."""
    value = fn(*args)
    if inspect.isawaitable(value):
        value = await value
    return interpret_hook_return(value, hook_path)

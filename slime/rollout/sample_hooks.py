"""Rollout sample hooks (`--rollout-sample-hook-path`, repeatable; upstream slime's `slime.rollout.sample_hooks`).

Each hook sees every Sample a generate function returned, before its reward is computed:

    hook(args, sample, *, rollout_id=None, evaluation=False) -> Sample | None     (sync or async)

A returned Sample takes the place of the one given (None keeps it); hooks run in the order given, and a hook
receives only the keywords its signature names (all of them when it takes `**kwargs`). `rollout_id` is the
step the rollout is playing (`set_current_rollout_id`, set by the default rollout at its start).
"""

from __future__ import annotations

import argparse
import inspect
from typing import Any

from slime.utils.misc import load_function
from slime.utils.types import Sample

_rollout_id: int | None = None


def set_current_rollout_id(rollout_id: int | None) -> None:
    """The step hooks are told about (`rollout_id=`) from now on."""
    global _rollout_id
    _rollout_id = rollout_id


def _keywords_for(hook: Any, offered: dict[str, Any]) -> dict[str, Any]:
    params = inspect.signature(hook).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return offered
    names = {p.name for p in params}
    return {k: v for k, v in offered.items() if k in names}


async def _run_hooks(args: argparse.Namespace, sample: Sample, paths: list[str], offered: dict[str, Any]) -> Sample:
    for path in paths:
        hook = load_function(path)
        out = hook(args, sample, **_keywords_for(hook, offered))
        if inspect.isawaitable(out):
            out = await out
        if out is None:
            continue
        if not isinstance(out, Sample):
            raise TypeError(f"rollout sample hook {path} returned {type(out).__name__}; return the Sample or None")
        sample = out
    return sample


async def apply_rollout_sample_hooks(args: argparse.Namespace, value: Sample | list[Any], **offered: Any) -> Any:
    """`value` (a Sample, or a list of them, nested lists kept in shape) after every configured hook."""
    paths = list(getattr(args, "rollout_sample_hook_path", None) or [])
    if not paths:
        return value
    offered.setdefault("rollout_id", _rollout_id)
    if isinstance(value, Sample):
        return await _run_hooks(args, value, paths, offered)
    if isinstance(value, list):
        return [await apply_rollout_sample_hooks(args, item, **offered) for item in value]
    raise TypeError(f"rollout sample hooks take a Sample or a list of them, got {type(value).__name__}")

"""Reward dispatch: `sample.custom_rm_path`, else `--custom-rm-path` (built-in `--rm-type`s are not
implemented). Reward functions may be sync or async; single form `fn(args, sample, **kw)`, batch form
`fn(args, samples) -> list`."""

from __future__ import annotations

import argparse
import inspect
from typing import Any

from slime.utils.plugins import load_function
from slime.utils.types import Sample


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def async_rm(args: argparse.Namespace, sample: Sample, **kwargs: Any) -> Any:
    """One sample's reward: `sample.custom_rm_path`, else `--custom-rm-path`."""
    path = sample.custom_rm_path or args.custom_rm_path
    if not path:
        raise ValueError("no reward function: pass --custom-rm-path module.fn (built-in --rm-type is not implemented)")
    return await _maybe_await(load_function(path)(args, sample, **kwargs))


async def batched_async_rm(args: argparse.Namespace, samples: list[Sample]) -> list[Any]:
    """Rewards of several samples in one call of the reward function (group form)."""
    path = samples[0].custom_rm_path or args.custom_rm_path
    if not path:
        raise ValueError("no reward function: pass --custom-rm-path module.fn")
    rewards = await _maybe_await(load_function(path)(args, samples))
    if len(rewards) != len(samples):
        raise ValueError(f"group reward function {path} returned {len(rewards)} rewards for {len(samples)} samples")
    return list(rewards)

"""Reward dispatch: `sample.custom_rm_path`, else `--custom-rm-path` (built-in `--rm-type`s are not
implemented). Reward functions may be sync or async; single form `fn(args, sample, **kw)`, batch form
`fn(args, samples) -> list`.

The contract (upstream slime's): a reward is a number, or with `--reward-key K` a dict whose `K` is
that number (its other keys are free); the batch form returns one such reward per sample, in order.
Every reward is checked where it enters the trainer: the number must be a finite int or float (NaN,
inf, strings, None, tensors are refused with `RewardError`, which names the sample).
Each call has a time limit (`--rm-timeout`, seconds): a reward function that never returns fails
with `RewardTimeoutError` naming the samples and the limit. A sync function runs in a daemon thread
(one call at a time) so the limit can fire; Python cannot stop that thread, so a hung sync function
keeps it, and the sync calls after it time out too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import math
import numbers
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from slime.utils.plugins import load_function
from slime.utils.types import Sample

DEFAULT_RM_TIMEOUT_S = 600.0


class RewardError(TypeError):
    """A reward that is not a finite number (or a dict holding one under --reward-key); names the sample.

    A TypeError, so the rollout treats it as a bug in the reward code: all groups failing alike stop
    the step at once instead of being retried as engine trouble."""


class RewardTimeoutError(TimeoutError):
    """A reward function did not return within --rm-timeout seconds; names the samples."""


def describe(sample: Sample) -> str:
    """How an error names a sample: its index and group, and the task when the metadata says."""
    meta = sample.metadata if isinstance(sample.metadata, Mapping) else {}
    task = "".join(f" {k}={meta[k]!r}" for k in ("scenario", "task_idx") if k in meta)
    return f"sample {sample.index} (group {sample.group_index}{task})"


def check_reward(args: argparse.Namespace, sample: Sample, reward: Any, source: str = "the reward") -> Any:
    """`reward` unchanged when it is a finite number (or, with --reward-key, a dict holding one under
    that key); else RewardError naming `sample`, what was returned and what to return."""
    key = getattr(args, "reward_key", None)
    value = reward
    what = f"{source} of {describe(sample)}"
    if key:
        if not isinstance(reward, Mapping) or key not in reward:
            raise RewardError(f"{what} is {_show(reward)}: with --reward-key {key!r} a reward is a dict holding "
                              f"the number under {key!r}")
        value = reward[key]
        what += f", its {key!r},"
    elif isinstance(reward, Mapping):
        raise RewardError(f"{what} is a dict ({_show(reward)}): pass --reward-key to say which of its keys is the "
                          "reward, or return a number")
    if not isinstance(value, numbers.Real):
        raise RewardError(f"{what} is {_show(value)}: a reward must be a finite number (int or float)")
    try:
        finite = math.isfinite(float(value))
    except OverflowError:  # an int beyond float's range
        finite = False
    if not finite:
        raise RewardError(f"{what} is {value}: a reward must be a finite number (a NaN or infinite reward would "
                          "poison the group's advantages)")
    return reward


def _show(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:120]}{'...' if len(text) > 120 else ''}"


def rm_timeout(args: argparse.Namespace) -> float:
    timeout = getattr(args, "rm_timeout", None)
    timeout = DEFAULT_RM_TIMEOUT_S if timeout is None else float(timeout)
    if not timeout > 0 or not math.isfinite(timeout):
        raise ValueError(f"--rm-timeout must be a positive number of seconds, got {timeout}")
    return timeout


async def _call(fn: Any, *call_args: Any, **kwargs: Any) -> Any:
    """Call a sync or async reward function. A sync one runs in a daemon thread, one call at a time (as
    on the event loop before), so a time limit around it can fire and a hung one never blocks the exit."""
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__):
        value = fn(*call_args, **kwargs)
    else:
        value = await _in_thread(fn, *call_args, **kwargs)
    return await value if inspect.isawaitable(value) else value


_SYNC_RM_LOCK = threading.Lock()  # sync reward functions were written for one call at a time


async def _in_thread(fn: Any, *call_args: Any, **kwargs: Any) -> Any:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def deliver(result: Any, error: BaseException | None) -> None:
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(result)

    def run() -> None:
        try:
            with _SYNC_RM_LOCK:
                result, error = fn(*call_args, **kwargs), None
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits any more
            loop.call_soon_threadsafe(deliver, result, error)

    threading.Thread(target=run, name=f"reward {getattr(fn, '__name__', fn)}", daemon=True).start()
    return await future


async def _timed(args: argparse.Namespace, path: str, samples: Sequence[Sample], fn: Any, *call_args: Any,
                 **kwargs: Any) -> Any:
    timeout = rm_timeout(args)
    try:
        return await asyncio.wait_for(_call(fn, *call_args, **kwargs), timeout)
    except TimeoutError:
        names = ", ".join(describe(s) for s in samples[:4]) + (f" and {len(samples) - 4} more" if len(samples) > 4
                                                               else "")
        raise RewardTimeoutError(f"reward function {path} did not return within {timeout:g} s (--rm-timeout) for "
                                 f"{names}: make it return sooner, or raise --rm-timeout") from None


async def async_rm(args: argparse.Namespace, sample: Sample, **kwargs: Any) -> Any:
    """One sample's reward: `sample.custom_rm_path`, else `--custom-rm-path`; checked (`check_reward`)."""
    path = sample.custom_rm_path or args.custom_rm_path
    if not path:
        raise ValueError("no reward function: pass --custom-rm-path module.fn (built-in --rm-type is not implemented)")
    reward = await _timed(args, path, [sample], load_function(path), args, sample, **kwargs)
    return check_reward(args, sample, reward, f"reward function {path}'s reward")


async def batched_async_rm(args: argparse.Namespace, samples: list[Sample]) -> list[Any]:
    """Rewards of several samples in one call of the reward function (group form); each checked."""
    path = samples[0].custom_rm_path or args.custom_rm_path
    if not path:
        raise ValueError("no reward function: pass --custom-rm-path module.fn")
    rewards = await _timed(args, path, samples, load_function(path), args, samples)
    if isinstance(rewards, str | bytes | Mapping) or not isinstance(rewards, Sequence):
        raise RewardError(f"group reward function {path} returned {_show(rewards)} for {len(samples)} samples "
                          f"({describe(samples[0])}, ...): the batch form returns a list, one reward per sample")
    if len(rewards) != len(samples):
        raise ValueError(f"group reward function {path} returned {len(rewards)} rewards for {len(samples)} samples")
    return [check_reward(args, s, r, f"group reward function {path}'s reward") for s, r in zip(samples, rewards,
                                                                                                strict=True)]

"""Reward dispatch: `sample.custom_rm_path`, else `--custom-rm-path`, else a built-in rule by `--rm-type`.

Reward functions may be sync or async; single form `fn(args, sample, **kw)`, batch form
`fn(args, samples) -> list` (`--group-rm` with `--custom-rm-path`).

Built-in rules (`--rm-type`, or per sample `sample.metadata["rm_type"]`, which wins), as upstream slime's:
`deepscaler` (1/0: the boxed answer after `</think>`), `math` (1/0: the response's last boxed answer,
`math_utils.grade_answer_verl`), `dapo` (the dict `{"score": +1.0/-1.0, "acc", "pred"}` of
`math_dapo_utils.compute_score`: pass `--reward-key score`), `f1` (token F1 against the label), `gpqa`
(1.0/0.0 for a multiple-choice letter), `ifbench` (needs AllenAI's IFBench on PYTHONPATH), `random` (0 or
1), `remote_rm` (POST {prompt, response, label} to `--rm-url`; the reply's JSON is the reward). A
`boxed_` prefix (`boxed_f1`) grades only the response's last `\boxed{}` content (empty when none).

The contract (upstream slime's): a reward is a number, or with `--reward-key K` a dict whose `K` is
that number (its other keys are free); the batch form returns one such reward per sample, in order.
Every reward is checked where it enters the trainer: the number must be a finite int or float (NaN,
inf, strings, None, tensors are refused with `RewardError`, which names the sample). Upstream lets a
`--custom-reward-post-process-path` hook turn raw rewards into numbers: with one set, a reward that is not
a number (e.g. the teacher's /generate reply of `slime.rollout.on_policy_distillation.reward_func`) is
accepted as it is and the hook's numbers are checked instead (`slime.algorithms.estimators`);
`reward_number` reads such a sample's reward as None in the rollout's metrics.
Each call has a time limit (`--rm-timeout`, seconds): a reward function (or rule) that never returns fails
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
import random
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from slime.rollout.rm_hub.deepscaler import get_deepscaler_rule_based_reward
from slime.rollout.rm_hub.f1 import f1_score
from slime.rollout.rm_hub.gpqa import compute_gpqa_reward
from slime.rollout.rm_hub.math_dapo_utils import compute_score as compute_score_dapo
from slime.rollout.rm_hub.math_utils import extract_answer as extract_boxed_answer
from slime.rollout.rm_hub.math_utils import grade_answer_verl
from slime.utils.http_utils import post
from slime.utils.misc import load_function
from slime.utils.types import Sample

__all__ = ["RewardError", "RewardTimeoutError", "async_rm", "batched_async_rm", "check_reward", "compute_gpqa_reward",
           "compute_score_dapo", "extract_boxed_answer", "f1_score", "get_deepscaler_rule_based_reward",
           "grade_answer_verl", "remote_rm", "reward_number"]

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
    if _left_to_post_process(args, reward):
        return reward
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


def _left_to_post_process(args: argparse.Namespace, reward: Any) -> bool:
    """Whether `reward` is a raw one that --custom-reward-post-process-path turns into a number: one is
    set, and the reward (its --reward-key entry, when it has one) is something other than a number or None."""
    if not getattr(args, "custom_reward_post_process_path", None) or reward is None:
        return False
    key = getattr(args, "reward_key", None)
    if key and isinstance(reward, Mapping) and key in reward:
        return False  # the number is there: check it
    return not isinstance(reward, numbers.Real)


def reward_number(args: argparse.Namespace, sample: Sample) -> float | None:
    """`sample`'s reward as a float (its --reward-key entry with one); None when it has none yet or its raw
    reward awaits --custom-reward-post-process-path (a metric then leaves it out)."""
    if sample.reward is None or _left_to_post_process(args, sample.reward):
        return None
    return float(sample.get_reward_value(args))


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


async def remote_rm(args: argparse.Namespace, sample: Sample, max_retries: int = 10) -> Any:
    """The reward a remote service gives: POST {prompt, response, label} as JSON to `--rm-url`; its JSON
    reply is the reward. Connection errors and 5xx replies are retried (`max_retries` attempts in all)."""
    url = getattr(args, "rm_url", None)
    if not url:
        raise ValueError("--rm-type remote_rm posts each sample to a reward service: pass --rm-url http://host:port/path")
    return await post(url, {"prompt": sample.prompt, "response": sample.response, "label": sample.label},
                      max_retries=max_retries)


def _random_reward(response: str, label: Any, metadata: Mapping[str, Any]) -> int:
    return random.randint(0, 1)


def _ifbench_reward(response: str, label: Any, metadata: Mapping[str, Any]) -> float:
    from slime.rollout.rm_hub.ifbench import compute_ifbench_reward  # needs IFBench's checkers: only on use

    return compute_ifbench_reward(response, label, metadata=dict(metadata))


def _math_reward(response: str, label: Any, metadata: Mapping[str, Any]) -> int:
    return 1 if grade_answer_verl(response, label) else 0


def _deepscaler_reward(response: str, label: Any, metadata: Mapping[str, Any]) -> int:
    return get_deepscaler_rule_based_reward(response, label)


def _dapo_reward(response: str, label: Any, metadata: Mapping[str, Any]) -> dict[str, Any]:
    return compute_score_dapo(response, label)


def _f1_reward(response: str, label: Any, metadata: Mapping[str, Any]) -> float:
    return f1_score(response, label)[0]


def _gpqa_reward(response: str, label: Any, metadata: Mapping[str, Any]) -> float:
    return compute_gpqa_reward(response, label, metadata=dict(metadata))


# The rules `--rm-type` names, each fn(response, label, metadata) -> reward; `remote_rm` is the other type.
RULES: dict[str, Any] = {"deepscaler": _deepscaler_reward, "dapo": _dapo_reward, "math": _math_reward,
                         "f1": _f1_reward, "gpqa": _gpqa_reward, "ifbench": _ifbench_reward, "random": _random_reward}
_KNOWN_TYPES = ", ".join([*RULES, "remote_rm"]) + " (each may take a boxed_ prefix)"


def rm_type_of(args: argparse.Namespace, sample: Sample) -> str:
    """The rule that scores `sample`: its metadata's "rm_type", else `--rm-type`; "" when neither says."""
    metadata = sample.metadata if isinstance(sample.metadata, Mapping) else {}
    rm_type = metadata.get("rm_type") or getattr(args, "rm_type", None) or ""
    if not isinstance(rm_type, str):
        raise ValueError(f"{describe(sample)}: its metadata's rm_type must be a string naming a rule ({_KNOWN_TYPES}),"
                         f" got {_show(rm_type)}")
    return rm_type.strip()


async def _rule_reward(args: argparse.Namespace, sample: Sample, rm_type: str) -> Any:
    if not rm_type:
        raise ValueError(f"no reward function for {describe(sample)}: pass --custom-rm-path module.fn, or "
                         f"--rm-type with a built-in rule ({_KNOWN_TYPES})")
    name, response = rm_type, sample.response or ""
    if name.startswith("boxed_"):  # grade only what the response boxed
        name, response = name[len("boxed_"):], extract_boxed_answer(response) or ""
    if name == "remote_rm":
        return await _timed(args, "--rm-type remote_rm", [sample], remote_rm, args, sample)
    rule = RULES.get(name)
    if rule is None:
        raise ValueError(f"--rm-type {rm_type!r} (for {describe(sample)}) is not a built-in reward rule: use one of "
                         f"{_KNOWN_TYPES}, or pass --custom-rm-path module.fn")
    metadata = sample.metadata if isinstance(sample.metadata, Mapping) else {}
    return await _timed(args, f"--rm-type {rm_type}", [sample], rule, response, sample.label, metadata)


async def async_rm(args: argparse.Namespace, sample: Sample, **kwargs: Any) -> Any:
    """One sample's reward: `sample.custom_rm_path`, else `--custom-rm-path`, else the built-in rule of
    `sample.metadata["rm_type"]` or `--rm-type`; checked (`check_reward`)."""
    path = sample.custom_rm_path or getattr(args, "custom_rm_path", None)
    if not path:
        rm_type = rm_type_of(args, sample)
        reward = await _rule_reward(args, sample, rm_type)
        return check_reward(args, sample, reward, f"the --rm-type {rm_type} reward")
    reward = await _timed(args, path, [sample], load_function(path), args, sample, **kwargs)
    return check_reward(args, sample, reward, f"reward function {path}'s reward")


async def batched_async_rm(args: argparse.Namespace, samples: list[Sample]) -> list[Any]:
    """Rewards of several samples: with `--custom-rm-path`, one call of its batch form; otherwise each
    sample's own reward (`async_rm`: its custom_rm_path, else its rule), all at once. Each reward is checked."""
    if not samples:
        return []
    path = getattr(args, "custom_rm_path", None)
    if not path:
        return await _each(args, samples)
    rewards = await _timed(args, path, samples, load_function(path), args, samples)
    if isinstance(rewards, str | bytes | Mapping) or not isinstance(rewards, Sequence):
        raise RewardError(f"group reward function {path} returned {_show(rewards)} for {len(samples)} samples "
                          f"({describe(samples[0])}, ...): the batch form returns a list, one reward per sample")
    if len(rewards) != len(samples):
        raise ValueError(f"group reward function {path} returned {len(rewards)} rewards for {len(samples)} samples")
    return [check_reward(args, s, r, f"group reward function {path}'s reward") for s, r in zip(samples, rewards,
                                                                                                strict=True)]


async def _each(args: argparse.Namespace, samples: list[Sample]) -> list[Any]:
    """`async_rm` of every sample, concurrently; the first failure (in sample order) is raised once all
    have finished, so no reward call is left running unseen."""
    results = await asyncio.gather(*(async_rm(args, s) for s in samples), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return list(results)

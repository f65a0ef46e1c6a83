"""Default single-turn rollout: prompts -> engine `/generate` -> reward -> dynamic filter -> groups.

Plugin contracts (slime's; docs/trainer.md, slime's contracts):

- rollout function: `generate_rollout(args, rollout_id, data_source, evaluation=False)` is the default
  `--rollout-function-path`. It is a plain function, as upstream's: it blocks while its coroutines run on
  the process's background loop (`slime.utils.async_utils.run`) and returns `RolloutFnTrainOutput` (or
  `RolloutFnEvalOutput`). `play_rollout` is the same step as a coroutine, for callers already on that loop.
- generate: `async fn(args, sample, sampling_params[, evaluation]) -> Sample | list[Sample]`
  (`--custom-generate-function-path`, or `sample.generate_function_path`); default `generate`.
  What it returns is checked against the contract before anything scores or trains on it
  (`check_generated`: a violation names the plugin).
- reward: `async fn(args, sample) -> float | dict`, or with `--group-rm` (and whenever generate
  returned a list) `async fn(args, samples) -> list` (`--custom-rm-path` / `sample.custom_rm_path`).
  Skipped when `sample.reward` is already set.
- dynamic filter: `fn(args, samples_of_one_group) -> DynamicFilterOutput | bool`
  (`--dynamic-sampling-filter-path`), applied as each group finishes; groups are pulled
  `--over-sampling-batch-size` at a time until `--rollout-batch-size` are kept, then the rest is
  aborted on the engines (sglang's `/abort_request`) and cancelled, or with `--partial-rollout` kept,
  half-generated, for the next step.

`GenerateState(args)` is the per-process singleton plugins use for the tokenizer, the request
semaphore, the base sampling params and the abort flag.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import copy
import functools
import inspect
import logging
import math
import numbers
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from slime.engine.lora_adapters import generate_lora_fields
from slime.rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput
from slime.rollout.data_source import Prompt, RolloutDataSource, load_prompts
from slime.rollout.engine_abort import SETTLE_TIMEOUT_S, abort_engines, settle_engines
from slime.rollout.filter_hub.base_types import call_dynamic_filter
from slime.rollout.rm_hub import async_rm, batched_async_rm, check_reward, reward_number
from slime.rollout.sample_hooks import apply_rollout_sample_hooks, set_current_rollout_id
from slime.utils.async_utils import run
from slime.utils.http_utils import get_rollout_num_engines, post
from slime.utils.misc import SingletonMeta, load_function
from slime.utils.types import Sample, parse_status

logger = logging.getLogger(__name__)

EngineCheck = Callable[[list[BaseException]], Awaitable[None]]


# ---- generate and reward ------------------------------------------------------------------------


def sampling_params_from_args(args: argparse.Namespace, *, evaluation: bool = False) -> dict[str, Any]:
    """slime's base sampling params (GenerateState), in SGLang's names."""
    def pick(name: str) -> Any:  # --eval-<name> when evaluating and set, else --rollout-<name>
        value = getattr(args, f"eval_{name}", None) if evaluation else None
        return getattr(args, f"rollout_{name}") if value is None else value

    params: dict[str, Any] = {
        "temperature": pick("temperature"),
        "top_p": pick("top_p"),
        "top_k": pick("top_k"),
        "max_new_tokens": pick("max_response_len") or 128,
        "skip_special_tokens": args.rollout_skip_special_tokens,
        "no_stop_trim": True,
        "spaces_between_special_tokens": False,
    }
    if args.rollout_stop:
        params["stop"] = list(args.rollout_stop)
    if args.rollout_stop_token_ids:
        params["stop_token_ids"] = list(args.rollout_stop_token_ids)
    return params


class GenerateState(metaclass=SingletonMeta):
    """The per-process rollout state plugins share (upstream's `GenerateState`, a `SingletonMeta` singleton:
    `GenerateState(args)` builds it once, later calls return it; `GenerateState.clear_instances()` forgets it).

    Upstream's fields: `tokenizer` (from `--hf-checkpoint`, loaded on first use), `processor` (None: text only
    here), `semaphore` (`--sglang-server-concurrency` x engines requests at a time), base `sampling_params`,
    `group_sampling_seeds` (with `--sglang-enable-deterministic-inference`), `dp_rank_context()`, and the
    per-step `remaining_batch_size`, `pendings`, `aborted` that `reset()` clears; `aborted` is set while a
    step's leftovers are being aborted, and a sample that reaches `generate_and_rm` then ends ABORTED at once.

    Ours: `concurrency`, `generate_requests` (every `/generate` posted, aborted episodes' too:
    `count_generate_request`), `pass_rate` (the dynamic filter's pass rate last step, for adaptive
    over-sampling) and `engine_check` (the trainer's engine health check, awaited before failed groups are
    retried; None outside the trainer).

    Its asyncio objects belong to the loop that first uses them: the rollout loop of
    `slime.utils.async_utils` in the trainer. Code that runs rollouts on loops of its own (tests, one-off
    tools) calls `GenerateState.clear_instances()` before each new loop.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.processor = None
        self.concurrency = args.sglang_server_concurrency * max(get_rollout_num_engines(args), 1)
        self.semaphore = asyncio.Semaphore(self.concurrency)
        self.sampling_params = sampling_params_from_args(args)
        if getattr(args, "sglang_enable_deterministic_inference", False):
            self.group_sampling_seeds = [args.rollout_seed + i for i in range(args.n_samples_per_prompt)]
        self.dp_counts = [0] * (getattr(args, "sglang_dp_size", None) or 1)
        self.dp_rank = 0
        self.generate_requests = 0
        self.pass_rate: float | None = None
        self.engine_check: EngineCheck | None = None
        self.reset()

    @functools.cached_property
    def tokenizer(self) -> Any:
        from slime.utils.processing_utils import load_tokenizer

        return load_tokenizer(self.args.hf_checkpoint, trust_remote_code=True)

    def reset(self) -> None:
        """Clear the per-step fields (upstream's meaning): nothing pending, not aborting."""
        self.remaining_batch_size = 0
        self.pendings: set[asyncio.Task] = set()
        self.aborted = False

    @contextmanager
    def dp_rank_context(self) -> Iterator[int]:
        """Hold the least busy data-parallel rank (`--sglang-dp-size`) for one request; yields its number."""
        rank = min(range(len(self.dp_counts)), key=self.dp_counts.__getitem__)
        self.dp_counts[rank] += 1
        self.dp_rank = rank
        try:
            yield rank
        finally:
            self.dp_counts[rank] -= 1

    def submit_generate_tasks(self, samples: list[list[Sample]]) -> None:
        """Start `generate_and_rm_group` for each group (on the running loop) and track it in `pendings`."""
        for group in samples:
            self.pendings.add(asyncio.create_task(
                generate_and_rm_group(self.args, group, dict(self.sampling_params), evaluation=False)))
        self.remaining_batch_size += len(samples)


def count_generate_request(args: argparse.Namespace) -> None:
    """Count one `/generate` request posted by a generate function (`rollout/generate_requests`)."""
    GenerateState(args).generate_requests += 1


def engine_url(args: argparse.Namespace, sample: Sample | None = None) -> str:
    """Base URL a sample's `/generate` goes to (ours; upstream posts everything to its router).

    With a sample and engines started by the trainer, its group's engine (groups spread round robin
    over `args.rollout_engine_urls`); otherwise the router address `--sglang-router-ip/-port`
    (the trainer points it at the first engine), else the first engine. With `--rollout-router`, the
    router the trainer started (`args.rollout_router_url`) always.
    """
    router = getattr(args, "rollout_router_url", None)
    if router:
        return router
    urls = getattr(args, "rollout_engine_urls", None)
    if urls and sample is not None:
        return urls[(sample.group_index or 0) % len(urls)]
    if getattr(args, "sglang_router_ip", None) is not None and getattr(args, "sglang_router_port", None) is not None:
        return f"http://{args.sglang_router_ip}:{args.sglang_router_port}"
    if urls:
        return urls[0]
    raise RuntimeError("no engine address: the trainer sets args.sglang_router_ip/port when engines start")


def get_model_url(args: argparse.Namespace, model_name: str, endpoint: str = "/generate") -> str:
    """The full URL of `endpoint` on the router serving `model_name` (upstream's meaning).

    `args.sglang_model_routers` maps model names to `(ip, port)` when several models are deployed; any
    other name gets the default router (`engine_url(args)`), as upstream falls back."""
    routers = getattr(args, "sglang_model_routers", None) or {}
    if model_name in routers:
        ip, port = routers[model_name]
        return f"http://{ip}:{port}{endpoint}"
    return f"{engine_url(args)}{endpoint}"


def _prompt_ids(args: argparse.Namespace, sample: Sample) -> list[int]:
    """What `/generate` continues: `sample.tokens` when set (prompt, plus a partial response being
    continued), else the string prompt tokenised without special tokens (upstream's rule)."""
    if sample.tokens:
        return list(sample.tokens)
    if not isinstance(sample.prompt, str):
        raise TypeError(f"sample {sample.index}: the default generate needs token ids or a string prompt, got "
                        f"{type(sample.prompt).__name__}; use --apply-chat-template or a custom generate function")
    return list(GenerateState(args).tokenizer.encode(sample.prompt, add_special_tokens=False))


async def generate(args: argparse.Namespace, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """Single-turn generation: post the prompt ids with `return_logprob` and append the response.

    The response budget is `max_new_tokens` less the response already there (a partial rollout being
    continued), cut to what `--rollout-max-context-len` leaves; none left: TRUNCATED.
    """
    params = dict(sampling_params)
    prompt_ids = _prompt_ids(args, sample)
    params["max_new_tokens"] = params["max_new_tokens"] - sample.response_length
    if args.rollout_max_context_len is not None:
        params["max_new_tokens"] = min(params["max_new_tokens"], args.rollout_max_context_len - len(prompt_ids))
    if params["max_new_tokens"] <= 0:
        sample.status = Sample.Status.TRUNCATED
        return sample
    if not sample.tokens:
        sample.tokens = prompt_ids
    payload = {"input_ids": prompt_ids, "sampling_params": params, "return_logprob": True,
               **generate_lora_fields(args)}  # a LoRA run: lora_path = its adapter's name
    count_generate_request(args)
    output = await post(f"{engine_url(args, sample)}/generate", payload)
    meta = output["meta_info"]
    pairs = meta.get("output_token_logprobs") or []
    tokens = [int(tok) for _, tok, *_ in pairs]
    log_probs = [float(lp) for lp, *_ in pairs]
    sample.append_response_tokens(args, tokens, log_probs, meta_info=meta, text=output.get("text", ""))
    return sample


def _generate_path(args: argparse.Namespace, sample: Sample) -> str | None:
    return sample.generate_function_path or args.custom_generate_function_path


class PluginContractError(TypeError):
    """A generate function returned something the trainer cannot train on; the message names the plugin."""


def check_generated(path: str, result: Any) -> list[Sample]:
    """The samples a generate function returned, checked against the contract before reward and training.

    A Sample or a non-empty list of Samples; each with int `tokens`, an int `response_length` within them,
    per-token `loss_mask` / `rollout_log_probs` of that length when set, a `Sample.Status`, and a reward that
    is None, a number or a dict. Raises `PluginContractError` naming `path` and the first violation."""
    samples = result if isinstance(result, list) else [result]
    if not samples or not all(isinstance(s, Sample) for s in samples):
        got = type(result).__name__ if not isinstance(result, list) else \
            f"a list of {', '.join(sorted({type(s).__name__ for s in result})) or 'nothing'}"
        raise PluginContractError(f"generate function {path} returned {got}; it must return a Sample or a "
                                  "non-empty list of Samples (slime.utils.types.Sample)")
    for s in samples:
        if isinstance(s.status, str):  # set after construction as upstream plugins do: its value or name
            try:
                s.status = parse_status(s.status)
            except ValueError as exc:
                raise PluginContractError(f"generate function {path} returned sample {s.index}: {exc}") from None
        problem = _sample_problem(s)
        if problem:
            raise PluginContractError(f"generate function {path} returned sample {s.index}: {problem}")
    return samples


def _sample_problem(s: Sample) -> str | None:
    if not isinstance(s.tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in s.tokens):
        return "tokens must be a list of ints (prompt + response token ids)"
    if not isinstance(s.response_length, int) or not 0 <= s.response_length <= len(s.tokens):
        return f"response_length={s.response_length!r} must be an int in [0, len(tokens)={len(s.tokens)}]"
    for name in ("loss_mask", "rollout_log_probs"):
        values = getattr(s, name)
        if values is not None and (not isinstance(values, list) or len(values) != s.response_length):
            return (f"{name} must hold one entry per response token ({s.response_length}), got "
                    f"{len(values) if isinstance(values, list) else type(values).__name__}")
    if not isinstance(s.status, Sample.Status):
        return f"status must be a Sample.Status, got {s.status!r}"
    if s.reward is not None and not isinstance(s.reward, numbers.Real | Mapping):
        return f"reward must be None, a number or a dict, got {type(s.reward).__name__}"
    return None


async def generate_and_rm(
    args: argparse.Namespace,
    sample: Sample,
    sampling_params: dict[str, Any],
    evaluation: bool = False,
) -> Sample | list[Sample]:
    """Generate under `GenerateState`'s semaphore, then score unless the group RM will or the reward is set.

    Upstream's order: a continued partial sample first has its earlier, off-policy tokens masked out of the
    loss when `--mask-offpolicy-in-partial-rollout`; a COMPLETED or TRUNCATED sample returns as it is; once
    the step is aborting (`GenerateState.aborted`) a sample still waiting ends ABORTED without a request;
    ABORTED results are not scored. `--rollout-sample-hook-path` hooks see each result before its reward.
    Samples the generate function built afresh inherit the input sample's
    `group_index` (and `index` when unset), so group statistics see them in their group."""
    if (getattr(args, "partial_rollout", False) and getattr(args, "mask_offpolicy_in_partial_rollout", False)
            and sample.response_length > 0):
        sample.loss_mask = [0] * sample.response_length
    if sample.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED) and sample.response_length:
        return sample
    state = GenerateState(args)
    path = _generate_path(args, sample)
    fn = load_function(path) if path else generate
    kwargs = {"evaluation": evaluation} if "evaluation" in inspect.signature(fn).parameters else {}
    async with state.semaphore:
        if state.aborted:
            sample.status = Sample.Status.ABORTED
            return sample
        with state.dp_rank_context():
            result = await fn(args, sample, sampling_params, **kwargs)
    name = path or f"{__name__}.generate"
    check_generated(name, result)
    hooks = list(getattr(args, "rollout_sample_hook_path", None) or [])
    if hooks:
        result = await apply_rollout_sample_hooks(args, result, evaluation=evaluation)
        name = " then sample hook ".join([name, *hooks])
    samples = check_generated(name, result)
    for s in samples:  # a Sample the plugin built afresh (tau-bench's res_to_sample) stays in its group
        if s.group_index is None:
            s.group_index = sample.group_index
        if s.index is None:
            s.index = sample.index
    _count_ended(result)
    if getattr(args, "group_rm", False) or any(s.status == Sample.Status.ABORTED for s in samples):
        return result
    unscored = [s for s in samples if s.reward is None]
    if isinstance(result, list):
        if unscored:
            for s, r in zip(unscored, await batched_async_rm(args, unscored), strict=True):
                s.reward = r
    elif unscored:
        result.reward = await async_rm(args, result)
    for s in samples:
        if s.reward is not None:  # set by the generate function itself: the same contract as an RM's
            check_reward(args, s, s.reward)
    return result


async def generate_and_rm_group(
    args: argparse.Namespace,
    group: list[Sample],
    sampling_params: dict[str, Any],
    evaluation: bool = False,
) -> list[Sample]:
    """All samples of one prompt, then the group reward with `--group-rm`.

    Each sample gets a `session_id` (router affinity) if it has none and, with
    `--sglang-enable-deterministic-inference`, the group's per-position `sampling_seed`. One sample failing cancels its siblings (the group is regenerated whole), and
    cancelling the group waits until every sample's task has finished: no episode of it runs on unseen."""
    state = GenerateState(args)
    if state.aborted:
        return group
    seeds = getattr(state, "group_sampling_seeds", None) if getattr(
        args, "sglang_enable_deterministic_inference", False) else None
    coros = []
    for i, sample in enumerate(group):
        if sample.session_id is None:
            sample.session_id = str(uuid.uuid4())
        params = dict(sampling_params)
        if seeds:
            params["sampling_seed"] = seeds[i % len(seeds)]
        coros.append(generate_and_rm(args, sample, params, evaluation))
    results = await _all_or_nothing(coros)
    samples = [s for r in results for s in (r if isinstance(r, list) else [r])]
    if getattr(args, "group_rm", False) and not state.aborted and not any(
            s.status == Sample.Status.ABORTED for s in samples):
        unscored = [s for s in samples if s.reward is None]
        if unscored:
            for s, r in zip(unscored, await batched_async_rm(args, unscored), strict=True):
                s.reward = r
        for s in samples:
            if s.reward is not None:
                check_reward(args, s, s.reward)
    return samples


async def _all_or_nothing(coros: list[Coroutine[Any, Any, Any]]) -> list[Any]:
    """Results of `coros` run concurrently, in order. The first exception (in task order) is raised after the
    other tasks were cancelled and finished; cancelling the caller cancels them all and waits for them.

    `asyncio.gather` does neither: a failed sibling leaves the others running unseen, and a cancelled gather
    returns before its children's cleanup (an episode's environment session) has run."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except asyncio.CancelledError:
        await _cancel_and_wait(tasks)
        raise
    if not all(t.done() for t in tasks):
        await _cancel_and_wait(tasks)
    errors = [t.exception() for t in tasks if not t.cancelled()]  # every one read: none logged as lost
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return [t.result() for t in tasks]


# ---- one step's rollout ---------------------------------------------------------------------------


class RolloutFailedError(RuntimeError):
    """Groups kept failing after every engine restart the step was allowed."""


def _group_failed(result: Any) -> bool:
    if isinstance(result, BaseException):
        return True
    return any(s.status == Sample.Status.ABORTED for s in result)


# What a bug in generate or reward code raises, the same way on every try. Engine and environment
# failures do not look like this: they come back as aborted samples, or as connection, timeout and
# infrastructure errors (RuntimeError, OSError), which a retry after an engine check can cure.
CODE_ERRORS = (AttributeError, NameError, TypeError, ImportError, SyntaxError, AssertionError, LookupError,
               ZeroDivisionError, NotImplementedError, RecursionError)


def _code_bug(errors: list[BaseException], aborted: int) -> tuple[type, str] | None:
    """The signature (type, message) of a wave's failures when they all look like one bug in plugin code:
    no group aborted, and every failed group raised the same code error with the same message."""
    if aborted or not errors or not all(isinstance(e, CODE_ERRORS) for e in errors):
        return None
    if all(isinstance(e, PluginContractError) for e in errors):  # the plugin's output, whatever sample it names
        return PluginContractError, str(errors[0])
    signatures = {(type(e), str(e)) for e in errors}
    return signatures.pop() if len(signatures) == 1 else None


# ---- where an abort goes ------------------------------------------------------------------------


def abort_targets(args: argparse.Namespace) -> list[str]:
    """Where an abort goes: every engine (`args.rollout_engine_urls`), else the router or the one address
    the rollout posts to (slime's router fans `/abort_request` out to its engines)."""
    urls = list(getattr(args, "rollout_engine_urls", None) or [])
    if urls:
        return urls
    try:
        return [engine_url(args)]
    except RuntimeError:
        return []


async def _cancel_and_wait(tasks: Sequence[asyncio.Future]) -> None:
    """Cancel `tasks` and wait until each has really finished (its `finally` blocks ran: environment
    sessions closed), even if the caller is cancelled meanwhile; that cancellation is re-raised after."""
    for task in tasks:
        task.cancel()
    interrupted = False
    while not all(t.done() for t in tasks):
        try:
            await asyncio.wait([t for t in tasks if not t.done()])
        except asyncio.CancelledError:
            interrupted = True
    if interrupted:
        raise asyncio.CancelledError


# ---- over-sampling that stops ----------------------------------------------------------------------


@dataclass
class _Origin:
    """Where a group came from: its first group index, its prompt and how many episodes it plays; `fresh`:
    a copy of the group as drawn, kept only for data sources that cannot rebuild a group from its prompt
    (upstream's `--data-source-path` classes: `get_samples` / `add_samples` only)."""

    group_index: int
    prompt_index: int
    size: int
    fresh: list[Sample] | None = None


class _EpisodeTally:
    """Episodes of one group whose generate returned, not aborted: they ran to their end (`generate_and_rm`
    counts them through `_TALLY`, so a cancelled group's finished episodes are counted too)."""

    __slots__ = ("ended",)

    def __init__(self) -> None:
        self.ended = 0


_TALLY: contextvars.ContextVar[_EpisodeTally | None] = contextvars.ContextVar("slime_rollout_tally", default=None)


def _count_ended(result: Sample | list[Sample]) -> None:
    tally = _TALLY.get()
    if tally is None:
        return
    samples = result if isinstance(result, list) else [result]
    if not any(s.status == Sample.Status.ABORTED for s in samples):
        tally.ended += 1


class _OverSampler:
    """One step of `generate_rollout`: groups in flight, the filter as each one finishes, failure waves."""

    def __init__(self, args: argparse.Namespace, rollout_id: int, data_source: RolloutDataSource,
                 on_failure: EngineCheck | None) -> None:
        self.args, self.rollout_id, self.data_source, self.on_failure = args, rollout_id, data_source, on_failure
        self.params = GenerateState(args).sampling_params
        path = args.dynamic_sampling_filter_path
        self.filter_fn = load_function(path) if path else None
        self.target, self.chunk = args.rollout_batch_size, args.over_sampling_batch_size
        self.policy = getattr(args, "over_sampling_policy", "eager")  # args built without the parser: slime's
        # Groups as (origin, samples): plugins may return fresh samples.
        self.kept: list[tuple[_Origin, list[Sample]]] = []
        self.reserve: list[tuple[_Origin, list[Sample]]] = []  # dropped, but kept when insufficient
        self.dropped: dict[str, int] = {}
        self.in_flight: dict[asyncio.Task, tuple[_Origin, _EpisodeTally]] = {}
        self.failed: list[tuple[_Origin, BaseException | None]] = []  # this wave's failed groups
        self.retry: list[_Origin] = []  # failed groups to play again
        self.returned: list[_Origin] = []  # played to no use (cancelled, surplus): prompts go back
        self.finished: list[list[Sample]] = []  # every group that finished, filtered ones too (all-samples hook)
        self.unnumbered = -10**9  # group indices handed to groups drawn without one (counting down)
        self.carried: list[list[Sample]] = []  # --partial-rollout: groups given back half-generated
        self.wave_successes = 0  # groups finished since the last failure wave was handled
        self.failures = self.generated = self.filtered = self.filtered_episodes = 0
        self.played = self.aborted = self.failed_unfinished = 0
        self.requests_before = GenerateState(args).generate_requests

    # -- the loop --

    async def run(self) -> None:
        while True:
            self._refill()
            done, _ = await asyncio.wait(self.in_flight, return_when=asyncio.FIRST_COMPLETED)
            self._settle(sorted(done, key=lambda t: self.in_flight[t][0].group_index))
            if self._wave_due():
                await self._handle_wave()
            if len(self.kept) >= self.target:
                return
            if not self.in_flight and not self.failed and len(self.kept) + len(self.reserve) >= self.target:
                self.kept += self.reserve[: self.target - len(self.kept)]
                return

    def _refill(self) -> None:
        """Pull groups while `_short()` says the batch cannot be made; retried prompts first."""
        while (short := self._short()) > 0:
            size = self.chunk if self.policy == "eager" else min(self.chunk, short)
            retry, self.retry = self.retry[:size], self.retry[size:]
            groups = [self.data_source.make_group(o.prompt_index, o.size) if o.fresh is None
                      else copy.deepcopy(o.fresh) for o in retry]
            groups += self.data_source.get_samples(max(size - len(groups), 0))
            if not groups:
                return
            for group in groups:
                self._launch(group)

    def _short(self) -> int:
        """How many more groups to start now.

        eager (slime's): `--over-sampling-batch-size` whenever the groups kept, in flight, held in reserve or
        failed (to be retried) cannot make the batch even if every one of them passes; so a step starts 2x
        the batch at 2x over-sampling, and what is beyond the batch when it is full is aborted (with the
        engines' concurrency at the batch, the extra groups queue and start as the first ones end: they are
        most of a second wave).

        adaptive: the groups the batch still lacks, d = batch - kept - reserve, divided by the share r of
        finished groups the dynamic filter kept in the previous step, plus one when r < 1, less those in
        flight or failed: ceil(d / r) + [r < 1] - in_flight - failed. A drop is replaced as soon as it is
        seen, in the slots it freed. In the first step r is the most a filter of tied groups can keep of
        0/1 rewards, 1 - 2 x 0.5^n for groups of n (0.875 for 4; 1 without a filter). (Estimating r within
        the step from its first few groups over-pulls: one early drop would halve it.)"""
        started = len(self.in_flight) + len(self.failed)
        if self.policy == "eager":
            return self.chunk if len(self.kept) + started + len(self.reserve) < self.target else 0
        lacking = self.target - len(self.kept) - len(self.reserve)
        if lacking <= 0:
            return 0
        rate = GenerateState(self.args).pass_rate
        if rate is None:
            rate = 1 - 2 * 0.5 ** self.args.n_samples_per_prompt if self.filter_fn is not None else 1.0
        return math.ceil(lacking / max(rate, 1e-3)) + (rate < 1) - started

    def _launch(self, group: list[Sample]) -> None:
        if group[0].group_index is None:  # a data source of upstream's kind may leave it unset
            self.unnumbered -= 1
            for s in group:
                s.group_index = self.unnumbered
        rebuildable = hasattr(self.data_source, "make_group") and "prompt_index" in group[0].metadata
        origin = _Origin(group[0].group_index, group[0].metadata.get("prompt_index", -1), len(group),
                         None if rebuildable else copy.deepcopy(group))
        tally = _EpisodeTally()
        context = contextvars.copy_context()
        context.run(_TALLY.set, tally)
        task = asyncio.create_task(generate_and_rm_group(self.args, group, self.params), context=context)
        self.in_flight[task] = (origin, tally)

    def _settle(self, done: Sequence[asyncio.Task]) -> None:
        """Finished groups: failures join the wave, the rest go through the dynamic filter."""
        for task in done:
            origin, tally = self.in_flight.pop(task)
            self.played += tally.ended
            result: Any = (RuntimeError("the group's task was cancelled") if task.cancelled()
                           else task.exception() or task.result())
            if _group_failed(result):
                self.failed.append((origin, result if isinstance(result, BaseException) else None))
                self.failed_unfinished += origin.size - tally.ended
                continue
            self.generated += 1
            self.wave_successes += 1
            self.finished.append(result)
            verdict = call_dynamic_filter(self.filter_fn, self.args, result)
            if verdict.keep:
                self.kept.append((origin, result))
                continue
            self.filtered += 1
            self.filtered_episodes += origin.size
            reason = verdict.reason or "filtered"
            self.dropped[reason] = self.dropped.get(reason, 0) + 1
            if verdict.keep_when_insufficient:
                self.reserve.append((origin, result))

    # -- failures --

    def _wave_due(self) -> bool:
        """Handle the failed groups now? When nothing else is in flight; at once for engine trouble (the
        check should start before more groups fail on a dead engine); for code errors once another group
        succeeded (a record the code cannot handle), else wait: if every group fails alike, it is a bug."""
        if not self.failed:
            return False
        if not self.in_flight:
            return True
        errors = [e for _, e in self.failed if e is not None]
        if len(errors) < len(self.failed) or not all(isinstance(e, CODE_ERRORS) for e in errors):
            return True
        return self.wave_successes > 0

    async def _handle_wave(self) -> None:
        failed, self.failed = self.failed, []
        errors = [e for _, e in failed if e is not None]
        self.failures += 1
        bug = _code_bug(errors, aborted=len(failed) - len(errors))
        if bug is not None and len(errors) >= 2 and not self.wave_successes and not self.in_flight:
            raise RolloutFailedError(
                f"step {self.rollout_id}: all {len(errors)} groups failed with {bug[0].__name__}: {bug[1]} -- a bug "
                "in the generate or reward code (its traceback is above this line), not an engine failure: "
                "retrying cannot cure it"
            ) from errors[0]
        logger.warning("step %d: %d groups failed (%s); %s", self.rollout_id, len(failed),
                       "; ".join(f"{type(e).__name__}: {e}" for e in errors[:2]) or "aborted",
                       "retrying them (a code error: no engine check)" if bug else "checking engines and retrying")
        if self.failures > self.args.max_step_retries:
            raise RolloutFailedError(
                f"step {self.rollout_id}: groups still failing after {self.args.max_step_retries} retries: "
                f"{errors[:1]}"
            )
        if self.on_failure is not None and bug is None:
            await self.on_failure(errors)
            # Groups that failed during the check failed for the same cause: this wave, no second check.
            self._settle(sorted((t for t in self.in_flight if t.done()),
                                key=lambda t: self.in_flight[t][0].group_index))
            failed, self.failed = failed + self.failed, []
        self.retry += [origin for origin, _ in failed]
        self.wave_successes = 0

    # -- the end --

    async def stop(self) -> None:
        """Abort what is still in flight: engines first told `abort_all`, then

        - by default the group tasks are cancelled (their tool calls, verifiers and rewards are not awaited:
          slime issue #2176) and waited for until really done (environment sessions released), their partial
          samples dropped and their prompts given back to the data source;
        - with `--partial-rollout` (upstream's mechanics) `GenerateState.aborted` stops samples still waiting
          from starting, and the groups are awaited while the engines end their requests with what they
          generated so far (re-aborted every 0.2 s, at most `SETTLE_TIMEOUT_S`; a group still running then is
          cancelled as above). Whole groups go back to the data source's buffer (`add_samples`) to be continued
          next step: their samples keep their tokens, log-probs and loss mask, and a sample with a response
          is marked `metadata["start_rollout_id"]` (the step it started in, upstream's mark) and
          `metadata["partial_tokens"]` (ours: how many of its tokens came from that earlier step).

        Then the engines are re-checked until idle."""
        if not self.in_flight:
            return
        tasks = dict(self.in_flight)
        self.in_flight.clear()
        urls = abort_targets(self.args)
        state = GenerateState(self.args)
        partial = bool(getattr(self.args, "partial_rollout", False))
        if partial:
            state.aborted = True
        else:
            for task in tasks:
                task.cancel()
        try:
            await abort_engines(urls)
            if partial:
                deadline = time.monotonic() + SETTLE_TIMEOUT_S
                pending = set(tasks)
                while pending and time.monotonic() < deadline:
                    _, pending = await asyncio.wait(pending, timeout=0.2)
                    if pending:
                        await abort_engines(urls)
                for task in pending:
                    task.cancel()
        finally:
            await _cancel_and_wait(list(tasks))
            state.aborted = False
        for task, (origin, tally) in tasks.items():
            self.played += tally.ended
            if task.cancelled() or task.exception() is not None:
                if task.cancelled() or isinstance(task.exception(), asyncio.CancelledError):
                    self.aborted += origin.size - tally.ended
                self.returned.append(origin)
                continue
            group = task.result()
            if partial and len(group) == origin.size and self._carry(group):
                self.aborted += origin.size - tally.ended
                continue
            self.returned.append(origin)  # a group that finished just before the cancel is surplus too
        if getattr(self.args, "rollout_engine_urls", None):
            await settle_engines(urls)

    def _carry(self, group: list[Sample]) -> bool:
        """Give a half-generated group back to the data source's buffer; False when it keeps none."""
        for s in group:
            if s.response_length:
                s.metadata.setdefault("start_rollout_id", self.rollout_id)
                s.metadata["partial_tokens"] = s.response_length
        try:
            self.data_source.add_samples([group])
        except (AttributeError, NotImplementedError):
            logger.warning("--partial-rollout needs a data source that takes groups back (add_samples, e.g. "
                           "RolloutDataSourceWithBuffer); %s does not: the partial group is dropped and its prompt "
                           "given back", type(self.data_source).__name__)
            return False
        self.carried.append(group)
        return True

    def output(self, started: float) -> RolloutFnTrainOutput:
        if self.generated:
            GenerateState(self.args).pass_rate = max(self.generated - self.filtered, 1) / self.generated
        kept = sorted(self.kept, key=lambda entry: entry[0].group_index)
        surplus = [origin for origin, _ in kept[self.target:]]
        kept = kept[: self.target]
        back = sorted(surplus + self.returned + self.retry + [origin for origin, _ in self.failed],
                      key=lambda o: o.group_index)
        if any(o.fresh is None for o in back):
            self.data_source.put_back([o.prompt_index for o in back if o.fresh is None])
        if any(o.fresh is not None for o in back):
            self.data_source.add_samples([o.fresh for o in back if o.fresh is not None])
        groups = [g for _, g in kept]
        path = getattr(self.args, "rollout_sample_filter_path", None)
        if path:  # upstream: fn(args, kept groups), marks samples with remove_sample
            load_function(path)(self.args, groups)
        path = getattr(self.args, "rollout_all_samples_process_path", None)
        if path:  # upstream: fn(args, every finished group, filtered ones too, data_source)
            load_function(path)(self.args, sorted(self.finished, key=lambda g: g[0].index or 0), self.data_source)
        samples = [s for g in groups for s in g]
        rewards = [r for r in (reward_number(self.args, s) for s in samples) if r is not None]
        trained = sum(origin.size for origin, _ in kept)
        continued = [s for s in samples if s.metadata.get("start_rollout_id", self.rollout_id) < self.rollout_id]
        metrics: dict[str, Any] = {
            "rollout/raw_reward": sum(rewards) / max(len(rewards), 1),
            "rollout/response_len_mean": sum(s.response_length for s in samples) / max(len(samples), 1),
            "rollout/truncated_ratio": sum(s.status == Sample.Status.TRUNCATED for s in samples) / max(len(samples), 1),
            "rollout/groups_generated": float(self.generated),
            "rollout/groups_filtered": float(self.filtered),
            "rollout/failed_rounds": float(self.failures),
            "rollout/episodes_played": float(self.played),
            "rollout/episodes_trained": float(trained),
            "rollout/episodes_aborted": float(self.aborted),
            "rollout/episodes_filtered": float(self.filtered_episodes),
            "rollout/episodes_failed": float(self.failed_unfinished),
            "rollout/played_per_trained": self.played / trained if trained else 0.0,
            "rollout/generate_requests": float(GenerateState(self.args).generate_requests - self.requests_before),
            "rollout/partial_samples_carried": float(sum(len(g) for g in self.carried)),
            "rollout/partial_samples_trained": float(len(continued)),
            "rollout/offpolicy_token_ratio": (sum(s.metadata.get("partial_tokens", 0) for s in continued)
                                              / max(sum(s.response_length for s in samples), 1)),
            "rollout/time_s": time.perf_counter() - started,
        }
        for reason, count in self.dropped.items():
            metrics[f"rollout/dynamic_filter/drop_{reason}"] = float(count)
        metrics["rollout/prompt_indices"] = [origin.prompt_index for origin, _ in kept]
        return RolloutFnTrainOutput(samples=groups, metrics=metrics)


def generate_rollout(
    args: argparse.Namespace, rollout_id: int, data_source: Any, evaluation: bool = False
) -> RolloutFnTrainOutput | RolloutFnEvalOutput:
    """slime's default rollout function: `play_rollout` run to its end on the process's rollout loop.

    A plain function with upstream's signature: it blocks, and must not be called from that loop itself
    (`await play_rollout(...)` there). The trainer's engine check comes from `GenerateState(args).engine_check`."""
    return run(play_rollout(args, rollout_id, data_source, evaluation))


async def play_rollout(
    args: argparse.Namespace,
    rollout_id: int,
    data_source: RolloutDataSource,
    evaluation: bool = False,
    *,
    on_failure: EngineCheck | None = None,
) -> RolloutFnTrainOutput | RolloutFnEvalOutput:
    """Collect `--rollout-batch-size` kept groups for step `rollout_id` (the coroutine of `generate_rollout`).

    With `evaluation=True`: every `--eval-prompt-data` set instead (`data_source` unused), as
    `RolloutFnEvalOutput(data={name: {"rewards", "truncated", "samples"}})`.

    Over-sampling that stops (upstream slime's mechanics): `--over-sampling-batch-size` groups are pulled
    at a time whenever the groups kept, in flight and held in reserve (dropped with `keep_when_insufficient`)
    cannot make the batch; each group goes through the dynamic filter as it finishes (a drop lets the next
    chunk in). Once the batch is full the rest is aborted: `{"abort_all": true}` to every engine, the group
    tasks cancelled (their tool calls, verifiers and rewards are not awaited) and waited for, the engines
    re-aborted until idle; their partial samples are dropped and their prompts, like kept groups beyond the
    batch, go back to the data source, so the next step serves them first (with `--partial-rollout` the
    half-generated groups themselves go back, to be continued: `_OverSampler.stop`). When nothing is left in flight
    and the kept groups plus the reserve make the batch, the reserve fills it. Kept groups are returned
    sorted by group index.

    Groups that raise or come back aborted (an engine died) are regenerated from their prompts after
    `on_failure` (default `GenerateState(args).engine_check`: the trainer's engine health check and
    restart), at most `--max-step-retries` failure waves (groups failing while the check runs belong to its wave). A bug in generate or reward code fails the
    step at once instead (`RolloutFailedError` from the plugin's own exception) when every group that
    finished since the last wave (two or more) failed with one `CODE_ERRORS` exception and message; when
    other groups succeed meanwhile (a record the reward cannot handle), the failed ones are retried
    without an engine check: the engines are not at fault.

    Metrics besides reward and lengths: `rollout/episodes_played` (episodes that ran to their end: kept,
    filtered, surplus, and finished episodes of aborted or failed groups), `rollout/episodes_trained`,
    `rollout/episodes_aborted` (cancelled before their end, never-started ones included),
    `rollout/episodes_filtered` (episodes of groups the dynamic filter dropped; played, never trained),
    `rollout/episodes_failed` (unfinished episodes of failed groups), `rollout/played_per_trained`,
    `rollout/generate_requests` (every `/generate` posted: model turns, aborted episodes' included),
    `rollout/groups_generated`, `rollout/groups_filtered`, `rollout/failed_rounds` (failure waves),
    `rollout/dynamic_filter/drop_<reason>`, `rollout/prompt_indices`; with `--partial-rollout`
    `rollout/partial_samples_carried` (given back half-generated), `rollout/partial_samples_trained` (trained
    samples begun in an earlier step) and `rollout/offpolicy_token_ratio` (their earlier tokens over all
    response tokens trained). `--rollout-sample-filter-path` `fn(args, groups)` and
    `--rollout-all-samples-process-path` `fn(args, all_finished_groups, data_source)` run on the kept groups
    at the end, as upstream's.
    """
    set_current_rollout_id(rollout_id)
    if evaluation:
        return await _eval_rollout_output(args)
    started = time.perf_counter()
    step = _OverSampler(args, rollout_id, data_source, on_failure or GenerateState(args).engine_check)
    try:
        await step.run()
    finally:
        await step.stop()
    return step.output(started)


def _eval_reward(args: argparse.Namespace, sample: Sample) -> Any:
    """An eval sample's reward under `--eval-reward-key` (default `--reward-key`), as upstream reads it."""
    key = getattr(args, "eval_reward_key", None) or getattr(args, "reward_key", None)
    return sample.reward[key] if key and isinstance(sample.reward, Mapping) else sample.reward


async def _eval_samples(args: argparse.Namespace, prompts: Sequence[Prompt]) -> list[Sample]:
    """Every eval prompt `--n-samples-per-eval-prompt` times, generated and scored."""
    source = RolloutDataSource(prompts, args.n_samples_per_eval_prompt, shuffle=False, seed=0)
    params = sampling_params_from_args(args, evaluation=True)
    groups = source.get_samples(len(prompts))
    results = await asyncio.gather(*(generate_and_rm_group(args, g, params, True) for g in groups))
    return [s for g in results for s in g]


_EVAL_PROMPTS: dict[tuple[str, str], list[Prompt]] = {}


def eval_prompts(args: argparse.Namespace, path: str) -> list[Prompt]:
    """An eval set's prompts, read and tokenised once per process (evals repeat every few steps)."""
    key = (str(path), str(args.hf_checkpoint))
    if key not in _EVAL_PROMPTS:
        _EVAL_PROMPTS[key] = load_prompts(args, path, GenerateState(args).tokenizer)
    return _EVAL_PROMPTS[key]


async def _eval_rollout_output(args: argparse.Namespace) -> RolloutFnEvalOutput:
    """Every `--eval-prompt-data` set through `generate_and_rm_group(..., evaluation=True)`."""
    data = {}
    for name, path in args.eval_datasets.items():
        samples = await _eval_samples(args, eval_prompts(args, path))
        data[name] = {
            "rewards": [_eval_reward(args, s) for s in samples],
            "truncated": [s.status == Sample.Status.TRUNCATED for s in samples],
            "samples": samples,
        }
    return RolloutFnEvalOutput(data=data)


def eval_metrics(args: argparse.Namespace, data: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Default eval metrics per set: mean reward, response length and truncated ratio.

    eval/{name} = mean reward; eval/{name}_response_len; eval/{name}_truncated_ratio. Reads
    `rewards` and `truncated` (and `samples` for lengths when present) of slime's eval dict.
    """
    metrics: dict[str, float] = {}
    for name, result in data.items():
        key = getattr(args, "eval_reward_key", None) or getattr(args, "reward_key", None)
        rewards = [float(r[key] if isinstance(r, dict) else r) for r in result.get("rewards") or []
                   if r is not None]
        if not rewards:
            continue
        metrics[f"eval/{name}"] = sum(rewards) / len(rewards)
        samples = result.get("samples") or []
        if samples:
            metrics[f"eval/{name}_response_len"] = sum(s.response_length for s in samples) / len(samples)
        truncated = result.get("truncated") or []
        if truncated:
            metrics[f"eval/{name}_truncated_ratio"] = sum(bool(t) for t in truncated) / len(truncated)
    return metrics


async def eval_rollout(args: argparse.Namespace, rollout_id: int) -> tuple[RolloutFnEvalOutput, list[list[Sample]]]:
    """Every `--eval-prompt-data` set, scored (upstream's coroutine): `(RolloutFnEvalOutput, [])`; the empty
    list is upstream's slot for partial groups, which evaluation never keeps."""
    del rollout_id
    return await _eval_rollout_output(args), []

"""Default single-turn rollout: prompts -> engine `/generate` -> reward -> dynamic filter -> groups.

Plugin contracts (slime's; docs/trainer.md, slime's contracts):

- rollout function: `generate_rollout(args, rollout_id, data_source, evaluation=False)` is the default
  `--rollout-function-path`; it returns `RolloutFnTrainOutput` (or `RolloutFnEvalOutput`).
- generate: `async fn(args, sample, sampling_params[, evaluation]) -> Sample | list[Sample]`
  (`--custom-generate-function-path`, or `sample.generate_function_path`); default `generate`.
- reward: `async fn(args, sample) -> float | dict`, or with `--group-rm` (and whenever generate
  returned a list) `async fn(args, samples) -> list` (`--custom-rm-path` / `sample.custom_rm_path`).
  Skipped when `sample.reward` is already set.
- dynamic filter: `fn(args, samples_of_one_group) -> DynamicFilterOutput | bool`
  (`--dynamic-sampling-filter-path`), applied as each group finishes; groups are pulled
  `--over-sampling-batch-size` at a time until `--rollout-batch-size` are kept, then the rest is
  aborted on the engines (sglang's `/abort_request`) and cancelled (`generate_rollout`).

`GenerateState(args)` is the per-process singleton plugins use for the tokenizer, the request
semaphore and the base sampling params.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import functools
import inspect
import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from slime.engine.base import ABORT, LOADS
from slime.rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput
from slime.rollout.data_source import Prompt, RolloutDataSource, load_prompts
from slime.rollout.filter_hub.base_types import DynamicFilterOutput
from slime.rollout.rm_hub import async_rm, batched_async_rm, check_reward
from slime.utils.http_utils import HTTPRequestError, get, post
from slime.utils.plugins import load_function
from slime.utils.types import Sample

logger = logging.getLogger(__name__)


# ---- generate and reward ------------------------------------------------------------------------


def sampling_params_from_args(args: argparse.Namespace, *, evaluation: bool = False) -> dict[str, Any]:
    """slime's base sampling params (GenerateState), in SGLang's names."""
    params: dict[str, Any] = {
        "temperature": args.eval_temperature if evaluation else args.rollout_temperature,
        "top_p": args.rollout_top_p,
        "top_k": args.rollout_top_k,
        "max_new_tokens": args.rollout_max_response_len or 128,
        "skip_special_tokens": args.rollout_skip_special_tokens,
        "no_stop_trim": True,
        "spaces_between_special_tokens": False,
    }
    if args.rollout_stop:
        params["stop"] = list(args.rollout_stop)
    if args.rollout_stop_token_ids:
        params["stop_token_ids"] = list(args.rollout_stop_token_ids)
    return params


def _num_engines(args: argparse.Namespace) -> int:
    urls = getattr(args, "rollout_engine_urls", None)
    if urls:
        return len(urls)
    per_engine = getattr(args, "rollout_num_gpus_per_engine", 1) or 1
    return max((getattr(args, "rollout_num_gpus", None) or 1) // per_engine, 1)


class GenerateState:
    """Per-process singleton: `tokenizer`, `processor`, `semaphore`, base `sampling_params`.

    `GenerateState(args)` builds it on the first call and returns the same object afterwards (later
    `args` are ignored). The semaphore admits `concurrency` = `--sglang-server-concurrency` x engines
    requests; the
    tokenizer comes from `--hf-checkpoint`, loaded on first use. `processor` is None: multimodal
    inputs are not supported here. `generate_requests` counts the `/generate` requests posted (one a model
    turn; `count_generate_request`), aborted episodes' too: the rollout's work, whatever became of it.
    """

    _instance: GenerateState | None = None

    def __new__(cls, args: argparse.Namespace) -> GenerateState:
        if cls._instance is None:
            state = super().__new__(cls)
            state.args = args
            state.processor = None
            state.concurrency = args.sglang_server_concurrency * _num_engines(args)
            state.semaphore = asyncio.Semaphore(state.concurrency)
            state.sampling_params = sampling_params_from_args(args)
            state.generate_requests = 0
            state.pass_rate = None  # the share of groups the dynamic filter kept last step (adaptive over-sampling)
            cls._instance = state
        return cls._instance

    @functools.cached_property
    def tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.args.hf_checkpoint)

    @classmethod
    def reset(cls) -> None:
        """Forget the instance (tests; a new event loop needs a new semaphore)."""
        cls._instance = None


def count_generate_request(args: argparse.Namespace) -> None:
    """Count one `/generate` request posted by a generate function (`rollout/generate_requests`)."""
    GenerateState(args).generate_requests += 1


def get_model_url(args: argparse.Namespace, sample: Sample | None = None) -> str:
    """Base URL that `/generate` is posted to.

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
    if args.sglang_router_ip is not None and args.sglang_router_port is not None:
        return f"http://{args.sglang_router_ip}:{args.sglang_router_port}"
    if urls:
        return urls[0]
    raise RuntimeError("no engine address: the trainer sets args.sglang_router_ip/port when engines start")


async def generate(args: argparse.Namespace, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """Single-turn generation: post the prompt ids with `return_logprob` and append the response.

    The response budget is `max_new_tokens`, cut to what `--rollout-max-context-len` leaves.
    """
    params = dict(sampling_params)
    if args.rollout_max_context_len is not None:
        left = args.rollout_max_context_len - len(sample.tokens)
        if left <= 0:
            sample.status = Sample.Status.TRUNCATED
            return sample
        params["max_new_tokens"] = min(params["max_new_tokens"], left)
    payload = {"input_ids": list(sample.tokens), "sampling_params": params, "return_logprob": True}
    count_generate_request(args)
    output = await post(f"{get_model_url(args, sample)}/generate", payload)
    meta = output["meta_info"]
    pairs = meta.get("output_token_logprobs") or []
    tokens = [int(tok) for _, tok, *_ in pairs]
    log_probs = [float(lp) for lp, *_ in pairs]
    sample.append_response_tokens(args, tokens, log_probs, meta_info=meta, text=output.get("text", ""))
    return sample


def _generate_function(args: argparse.Namespace, sample: Sample) -> Callable[..., Awaitable[Any]]:
    path = sample.generate_function_path or args.custom_generate_function_path
    return load_function(path) if path else generate


async def generate_and_rm(
    args: argparse.Namespace,
    sample: Sample,
    sampling_params: dict[str, Any],
    evaluation: bool = False,
) -> Sample | list[Sample]:
    """Generate under `GenerateState`'s semaphore; score unless the group RM will or the reward is set."""
    if sample.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED) and sample.response_length:
        return sample
    fn = _generate_function(args, sample)
    kwargs = {"evaluation": evaluation} if "evaluation" in inspect.signature(fn).parameters else {}
    async with GenerateState(args).semaphore:
        result = await fn(args, sample, dict(sampling_params), **kwargs)
    _count_ended(result)
    if args.group_rm:
        return result
    if isinstance(result, list):
        unscored = [s for s in result if s.reward is None]
        if unscored:
            for s, r in zip(unscored, await batched_async_rm(args, unscored), strict=True):
                s.reward = r
    elif result.reward is None:
        result.reward = await async_rm(args, result)
    for s in result if isinstance(result, list) else [result]:
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

    One sample failing cancels its siblings (the group is regenerated whole), and cancelling the group
    waits until every sample's task has finished: no episode of it runs on unseen."""
    results = await _all_or_nothing([generate_and_rm(args, s, sampling_params, evaluation) for s in group])
    samples = [s for r in results for s in (r if isinstance(r, list) else [r])]
    if args.group_rm:
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
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()
    return [t.result() for t in tasks]


# ---- dynamic sampling filter ----------------------------------------------------------------------


def _apply_filter(fn: Callable[..., Any] | None, args: argparse.Namespace, group: list[Sample]) -> DynamicFilterOutput:
    if fn is None:
        return DynamicFilterOutput(keep=True)
    out = fn(args, group)
    if isinstance(out, bool):
        return DynamicFilterOutput(keep=out)
    return DynamicFilterOutput(keep=bool(out.keep), reason=getattr(out, "reason", None),
                               keep_when_insufficient=bool(getattr(out, "keep_when_insufficient", False)))


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
    signatures = {(type(e), str(e)) for e in errors}
    return signatures.pop() if len(signatures) == 1 else None


# ---- aborting the engines' requests (sglang's /abort_request) --------------------------------------

ABORT_ALL = {"abort_all": True}  # sglang's AbortReq body: every request the engine holds ends with "abort"
LOADS_PATH = LOADS.path  # sglang's load report ({"loads": [per DP rank: num_running_reqs, num_waiting_reqs]})
SERVER_INFO_PATH = "/get_server_info"  # the CPU engine's (and scripted engine's) num_running_reqs / num_waiting_reqs
SETTLE_TIMEOUT_S = 30.0  # how long `settle_engines` re-aborts before it gives up with a warning
_LOAD_PATHS: dict[str, str] = {}  # engine URL -> the load endpoint it answered (/v1/loads or /get_server_info)


def abort_targets(args: argparse.Namespace) -> list[str]:
    """Where an abort goes: every engine (`args.rollout_engine_urls`), else the router or the one address
    the rollout posts to (slime's router fans `/abort_request` out to its engines)."""
    urls = list(getattr(args, "rollout_engine_urls", None) or [])
    if urls:
        return urls
    try:
        return [get_model_url(args)]
    except RuntimeError:
        return []


async def abort_engines(urls: Sequence[str]) -> None:
    """POST `{"abort_all": true}` to each URL: held requests end at once with finish_reason abort.

    A failed abort is logged, not raised: an engine that cannot be reached holds no request of ours
    that could finish, and the step's batch is already complete."""
    results = await asyncio.gather(*(post(f"{url}{ABORT.path}", ABORT_ALL, max_retries=2, retry_delay=0.2)
                                     for url in urls), return_exceptions=True)
    for url, result in zip(urls, results, strict=True):
        if isinstance(result, BaseException):
            logger.warning("abort_all on %s failed: %s: %s", url, type(result).__name__, result)


def requests_in(reply: Any, path: str) -> int | None:
    """Requests running or waiting in a load reply: sglang's `/v1/loads` (`loads`: one entry per DP rank) or a
    `/get_server_info` carrying `num_running_reqs` / `num_waiting_reqs` at the top (the CPU and scripted
    engines); None when the reply has no such counts (stock sglang's /get_server_info)."""
    entries = reply.get("loads") if isinstance(reply, dict) and path == LOADS_PATH else [reply]
    if not isinstance(entries, list) or not entries or not all(
            isinstance(e, dict) and "num_running_reqs" in e for e in entries):
        return None
    return sum(int(e["num_running_reqs"]) + int(e.get("num_waiting_reqs") or 0) for e in entries)


async def engine_load(url: str) -> int | None:
    """Requests an engine is running or queueing (`requests_in`): `GET /v1/loads`, else `GET /get_server_info`;
    None when neither says."""
    paths = [_LOAD_PATHS[url]] if url in _LOAD_PATHS else [LOADS_PATH, SERVER_INFO_PATH]
    for path in paths:
        try:
            reply = await get(f"{url}{path}", max_retries=1)
        except HTTPRequestError as exc:
            if exc.status_code in (404, 405):
                continue
            logger.warning("load of %s unknown: %s", url, exc)
            return None
        count = requests_in(reply, path)
        if count is not None:
            _LOAD_PATHS[url] = path
            return count
    return None


async def settle_engines(urls: Sequence[str], timeout_s: float = SETTLE_TIMEOUT_S) -> dict[str, int | None]:
    """Abort again until every engine reports no request running or waiting (or `timeout_s` passes).

    An abort ends what the engine holds when it reads it; a request whose client was cancelled while its
    body was still on the way arrives afterwards and would run to its token limit (sglang aborts on a client
    disconnect, the CPU engine does not). Returns the last load seen per engine (None: it reports none)."""
    deadline = time.monotonic() + timeout_s
    loads: dict[str, int | None] = {}
    busy = list(urls)
    while busy:
        for url, load in zip(busy, await asyncio.gather(*(engine_load(u) for u in busy)), strict=True):
            loads[url] = load
        busy = [u for u in busy if loads[u]]
        if not busy:
            break
        if time.monotonic() > deadline:
            logger.warning("engines still busy %.0f s after abort_all: %s", timeout_s,
                           {u: loads[u] for u in busy})
            break
        await abort_engines(busy)
        await asyncio.sleep(0.05)
    return loads


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
    """Where a group came from: its first group index, its prompt and how many episodes it plays."""

    group_index: int
    prompt_index: int
    size: int


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
                 on_failure: Callable[[list[BaseException]], Awaitable[None]] | None) -> None:
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
            groups = [self.data_source.make_group(o.prompt_index, o.size) for o in retry]
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
        origin = _Origin(group[0].group_index, group[0].metadata["prompt_index"], len(group))
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
            verdict = _apply_filter(self.filter_fn, self.args, result)
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
        """Abort what is still in flight: engines first told `abort_all`, the group tasks cancelled (their
        tool calls, verifiers and rewards are not awaited: slime issue #2176), waited for until really done
        (environment sessions released), then the engines re-checked until idle. Partial samples are
        dropped (no --partial-rollout here) and their prompts go back to the data source."""
        if not self.in_flight:
            return
        tasks = dict(self.in_flight)
        self.in_flight.clear()
        for task in tasks:
            task.cancel()
        urls = abort_targets(self.args)
        try:
            await abort_engines(urls)
        finally:
            await _cancel_and_wait(list(tasks))
        for task, (origin, tally) in tasks.items():
            self.played += tally.ended
            if task.cancelled() or isinstance(task.exception(), asyncio.CancelledError):
                self.aborted += origin.size - tally.ended
            self.returned.append(origin)  # a group that finished just before the cancel is surplus too
        if getattr(self.args, "rollout_engine_urls", None):
            await settle_engines(urls)

    def output(self, started: float) -> RolloutFnTrainOutput:
        if self.generated:
            GenerateState(self.args).pass_rate = max(self.generated - self.filtered, 1) / self.generated
        kept = sorted(self.kept, key=lambda entry: entry[0].group_index)
        surplus = [origin for origin, _ in kept[self.target:]]
        kept = kept[: self.target]
        back = surplus + self.returned + self.retry + [origin for origin, _ in self.failed]
        self.data_source.put_back([o.prompt_index for o in sorted(back, key=lambda o: o.group_index)])
        samples = [s for _, g in kept for s in g]
        rewards = [float(s.get_reward_value(self.args)) for s in samples]
        trained = sum(origin.size for origin, _ in kept)
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
            "rollout/time_s": time.perf_counter() - started,
        }
        for reason, count in self.dropped.items():
            metrics[f"rollout/dynamic_filter/drop_{reason}"] = float(count)
        metrics["rollout/prompt_indices"] = [origin.prompt_index for origin, _ in kept]
        return RolloutFnTrainOutput(samples=[g for _, g in kept], metrics=metrics)


async def generate_rollout(
    args: argparse.Namespace,
    rollout_id: int,
    data_source: RolloutDataSource,
    evaluation: bool = False,
    *,
    on_failure: Callable[[list[BaseException]], Awaitable[None]] | None = None,
) -> RolloutFnTrainOutput | RolloutFnEvalOutput:
    """Collect `--rollout-batch-size` kept groups for step `rollout_id` (slime's rollout function).

    With `evaluation=True`: every `--eval-prompt-data` set instead (`data_source` unused), as
    `RolloutFnEvalOutput(data={name: {"rewards", "truncated", "samples"}})`.

    Over-sampling that stops (upstream slime's mechanics): `--over-sampling-batch-size` groups are pulled
    at a time whenever the groups kept, in flight and held in reserve (dropped with `keep_when_insufficient`)
    cannot make the batch; each group goes through the dynamic filter as it finishes (a drop lets the next
    chunk in). Once the batch is full the rest is aborted: `{"abort_all": true}` to every engine, the group
    tasks cancelled (their tool calls, verifiers and rewards are not awaited) and waited for, the engines
    re-aborted until idle; their partial samples are dropped and their prompts, like kept groups beyond the
    batch, go back to the data source, so the next step serves them first. When nothing is left in flight
    and the kept groups plus the reserve make the batch, the reserve fills it. Kept groups are returned
    sorted by group index.

    Groups that raise or come back aborted (an engine died) are regenerated from their prompts after
    `on_failure` (the trainer's engine health check and restart), at most `--max-step-retries` failure waves
    (groups failing while the check runs belong to its wave). A bug in generate or reward code fails the
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
    `rollout/dynamic_filter/drop_<reason>`, `rollout/prompt_indices`.
    """
    if evaluation:
        return await _eval_rollout_output(args)
    started = time.perf_counter()
    step = _OverSampler(args, rollout_id, data_source, on_failure)
    try:
        await step.run()
    finally:
        await step.stop()
    return step.output(started)


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
            "rewards": [s.get_reward_value(args) for s in samples],
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
        rewards = [float(r[args.reward_key] if isinstance(r, dict) else r) for r in result.get("rewards") or []
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


async def eval_rollout(
    args: argparse.Namespace, name: str, prompts: Sequence[Prompt]
) -> dict[str, float]:
    """Mean reward (and response length) over an eval set, `--n-samples-per-eval-prompt` each."""
    samples = await _eval_samples(args, prompts)
    rewards = [float(s.get_reward_value(args)) for s in samples]
    return {
        f"eval/{name}": sum(rewards) / len(rewards),
        f"eval/{name}_response_len": sum(s.response_length for s in samples) / len(samples),
    }

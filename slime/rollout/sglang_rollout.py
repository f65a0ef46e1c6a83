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
  (`--dynamic-sampling-filter-path`); groups are over-sampled in rounds of
  `--over-sampling-batch-size` until `--rollout-batch-size` groups are kept.

`GenerateState(args)` is the per-process singleton plugins use for the tokenizer, the request
semaphore and the base sampling params.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from slime.rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput
from slime.rollout.data_source import Prompt, RolloutDataSource, load_prompts
from slime.rollout.filter_hub.base_types import DynamicFilterOutput
from slime.rollout.rm_hub import async_rm, batched_async_rm
from slime.utils.http_utils import post
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
    inputs are not supported here.
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
    if args.group_rm:
        return result
    if isinstance(result, list):
        unscored = [s for s in result if s.reward is None]
        if unscored:
            for s, r in zip(unscored, await batched_async_rm(args, unscored), strict=True):
                s.reward = r
    elif result.reward is None:
        result.reward = await async_rm(args, result)
    return result


async def generate_and_rm_group(
    args: argparse.Namespace,
    group: list[Sample],
    sampling_params: dict[str, Any],
    evaluation: bool = False,
) -> list[Sample]:
    """All samples of one prompt, then the group reward with `--group-rm`."""
    results = await asyncio.gather(
        *(generate_and_rm(args, s, sampling_params, evaluation) for s in group)
    )
    samples = [s for r in results for s in (r if isinstance(r, list) else [r])]
    if args.group_rm:
        unscored = [s for s in samples if s.reward is None]
        if unscored:
            for s, r in zip(unscored, await batched_async_rm(args, unscored), strict=True):
                s.reward = r
    return samples


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
    """The signature (type, message) of a round's failures when they all look like one bug in plugin code:
    no group aborted, and every failed group raised the same code error with the same message."""
    if aborted or not errors or not all(isinstance(e, CODE_ERRORS) for e in errors):
        return None
    signatures = {(type(e), str(e)) for e in errors}
    return signatures.pop() if len(signatures) == 1 else None


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

    Rounds of `--over-sampling-batch-size` groups run concurrently; groups that raise or come back
    aborted (an engine died) are regenerated from their prompts after `on_failure` (the trainer's
    engine health check and restart), at most `--max-step-retries` times. Kept groups beyond the
    batch size go back to the data source, so the next step starts with them.

    A bug in generate or reward code fails the step at once instead (`RolloutFailedError` from the
    plugin's own exception) when every group of a round (two or more) failed with one `CODE_ERRORS`
    exception and message. When only some groups failed that way (a record the reward cannot handle),
    they are retried without an engine check: the engines are not at fault.
    """
    if evaluation:
        return await _eval_rollout_output(args)
    started = time.perf_counter()
    params = GenerateState(args).sampling_params
    filter_fn = load_function(args.dynamic_sampling_filter_path) if args.dynamic_sampling_filter_path else None
    # Kept groups as (group index, prompt index, samples): plugins may return fresh samples.
    kept: list[tuple[int, int, list[Sample]]] = []
    dropped: dict[str, int] = {}
    insufficient: list[tuple[int, int, list[Sample]]] = []
    retry_prompts: list[tuple[int, int]] = []  # (prompt index, group size) to regenerate
    failures, generated = 0, 0
    while len(kept) < args.rollout_batch_size:
        want = args.over_sampling_batch_size
        groups = [data_source.make_group(i, n) for i, n in retry_prompts]
        retry_prompts = []
        groups += data_source.get_samples(max(want - len(groups), 0))
        pristine = [(g[0].group_index, g[0].metadata["prompt_index"], len(g)) for g in groups]
        results = await asyncio.gather(
            *(generate_and_rm_group(args, g, params) for g in groups), return_exceptions=True
        )
        errors = []
        for origin, result in zip(pristine, results, strict=True):
            if _group_failed(result):
                retry_prompts.append(origin[1:])
                if isinstance(result, BaseException):
                    errors.append(result)
                continue
            generated += 1
            verdict = _apply_filter(filter_fn, args, result)
            entry = (origin[0], origin[1], result)
            if verdict.keep:
                kept.append(entry)
            else:
                reason = verdict.reason or "filtered"
                dropped[reason] = dropped.get(reason, 0) + 1
                if verdict.keep_when_insufficient:
                    insufficient.append(entry)
        if retry_prompts:
            failures += 1
            bug = _code_bug(errors, aborted=len(retry_prompts) - len(errors))
            if bug is not None and len(errors) == len(groups) >= 2:
                raise RolloutFailedError(
                    f"step {rollout_id}: all {len(errors)} groups failed with {bug[0].__name__}: {bug[1]} -- a bug "
                    "in the generate or reward code (its traceback is above this line), not an engine failure: "
                    "retrying cannot cure it"
                ) from errors[0]
            logger.warning("step %d: %d groups failed (%s); %s", rollout_id, len(retry_prompts),
                           "; ".join(f"{type(e).__name__}: {e}" for e in errors[:2]) or "aborted",
                           "retrying them (a code error: no engine check)" if bug else "checking engines and retrying")
            if failures > args.max_step_retries:
                raise RolloutFailedError(
                    f"step {rollout_id}: groups still failing after {args.max_step_retries} retries: {errors[:1]}"
                )
            if on_failure is not None and bug is None:
                await on_failure(errors)
        elif len(kept) + len(insufficient) >= args.rollout_batch_size and len(kept) < args.rollout_batch_size:
            kept += insufficient[: args.rollout_batch_size - len(kept)]
    kept.sort(key=lambda entry: entry[0])
    data_source.put_back([prompt_index for _, prompt_index, _ in kept[args.rollout_batch_size:]])
    kept = kept[: args.rollout_batch_size]
    samples = [s for _, _, g in kept for s in g]
    rewards = [float(s.get_reward_value(args)) for s in samples]
    metrics = {
        "rollout/raw_reward": sum(rewards) / max(len(rewards), 1),
        "rollout/response_len_mean": sum(s.response_length for s in samples) / max(len(samples), 1),
        "rollout/truncated_ratio": sum(s.status == Sample.Status.TRUNCATED for s in samples) / max(len(samples), 1),
        "rollout/groups_generated": float(generated),
        "rollout/failed_rounds": float(failures),
        "rollout/time_s": time.perf_counter() - started,
    }
    for reason, count in dropped.items():
        metrics[f"rollout/dynamic_filter/drop_{reason}"] = float(count)
    metrics["rollout/prompt_indices"] = [prompt_index for _, prompt_index, _ in kept]
    return RolloutFnTrainOutput(samples=[g for _, _, g in kept], metrics=metrics)


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

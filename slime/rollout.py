"""Default single-turn rollout: prompts -> engine `/generate` -> reward -> dynamic filter -> groups.

Plugin contracts (slime's, slime-contracts.md section 3):

- generate: `async fn(args, sample, sampling_params[, evaluation]) -> Sample | list[Sample]`
  (`--custom-generate-function-path`, or `sample.generate_function_path`); default `generate`.
- reward: `async fn(args, sample) -> float | dict`, or with `--group-rm` (and whenever generate
  returned a list) `async fn(args, samples) -> list` (`--custom-rm-path` / `sample.custom_rm_path`).
  Skipped when `sample.reward` is already set.
- dynamic filter: `fn(args, samples_of_one_group) -> DynamicFilterOutput | bool`
  (`--dynamic-sampling-filter-path`); groups are over-sampled in rounds of
  `--over-sampling-batch-size` until `--rollout-batch-size` groups are kept.

The prompt order comes from `PromptDataSource`: a permutation per epoch seeded by `--rollout-seed`
(identity without `--rollout-shuffle`), whose position is a small JSON state saved in checkpoints,
so a resumed run draws exactly the prompts an uninterrupted run would have drawn.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import inspect
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slime.utils.http_utils import post
from slime.utils.misc import load_function
from slime.utils.types import Sample

logger = logging.getLogger(__name__)


# ---- data --------------------------------------------------------------------------------------


@dataclass
class Prompt:
    """One dataset row, tokenised once at load time."""

    index: int
    prompt: str | list[dict[str, Any]]
    token_ids: list[int]
    label: str | None
    metadata: dict[str, Any]


def load_prompts(args: argparse.Namespace, path: str | Path, tokenizer: Any) -> list[Prompt]:
    """Read a JSONL prompt file: `--input-key` (text or messages), `--label-key`, `--metadata-key`.

    With `--apply-chat-template` messages (or a bare string, as one user turn) are rendered with the
    tokenizer's template and a generation prompt. Rows over `--rollout-max-prompt-len` are dropped.
    """
    prompts: list[Prompt] = []
    dropped = 0
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if args.input_key not in row:
                raise KeyError(f"{path}:{line_no} has no key {args.input_key!r}: set --input-key")
            raw = row[args.input_key]
            if args.apply_chat_template:
                messages = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw
                text = tokenizer.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=True, **args.apply_chat_template_kwargs
                )
            elif isinstance(raw, str):
                text = raw
            else:
                raise ValueError(f"{path}:{line_no}: {args.input_key!r} holds messages; pass --apply-chat-template")
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            if args.rollout_max_prompt_len is not None and len(ids) > args.rollout_max_prompt_len:
                dropped += 1
                continue
            label = row.get(args.label_key) if args.label_key else None
            metadata = row.get(args.metadata_key) or {}
            if isinstance(metadata, str):
                metadata = json.loads(metadata)
            prompts.append(Prompt(len(prompts), text, ids, None if label is None else str(label), dict(metadata)))
    if dropped:
        logger.warning("%s: dropped %d prompts longer than --rollout-max-prompt-len", path, dropped)
    if not prompts:
        raise ValueError(f"{path} holds no usable prompts")
    return prompts


class PromptDataSource:
    """Groups of `n_samples_per_prompt` fresh samples in a deterministic, resumable order.

    Order: epoch e visits prompts in `random.Random(seed + e).shuffle(range(N))` (or 0..N-1).
    Groups given back with `put_back` (kept but not needed this step) are served first next time.
    `state()` / `load_state()` hold everything needed to continue exactly.
    """

    def __init__(self, prompts: Sequence[Prompt], n_samples_per_prompt: int, *, shuffle: bool, seed: int):
        self.prompts = list(prompts)
        self.n = n_samples_per_prompt
        self.shuffle, self.seed = shuffle, seed
        self.epoch, self.offset = 0, 0
        self.group_counter, self.sample_counter = 0, 0
        self.pending: list[int] = []
        self._order = self._epoch_order(0)

    def __len__(self) -> int:
        return len(self.prompts)

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.prompts)))
        if self.shuffle:
            random.Random(self.seed + epoch).shuffle(order)
        return order

    def _next_prompt_index(self) -> int:
        if self.pending:
            return self.pending.pop(0)
        if self.offset >= len(self._order):
            self.epoch += 1
            self.offset = 0
            self._order = self._epoch_order(self.epoch)
        index = self._order[self.offset]
        self.offset += 1
        return index

    def get_samples(self, num_groups: int) -> list[list[Sample]]:
        return [self.make_group(self._next_prompt_index()) for _ in range(num_groups)]

    def make_group(self, prompt_index: int, n: int | None = None) -> list[Sample]:
        p = self.prompts[prompt_index]
        group = []
        for _ in range(self.n if n is None else n):
            metadata = copy.deepcopy(p.metadata)
            metadata["prompt_index"] = p.index
            group.append(Sample(
                group_index=self.group_counter, index=self.sample_counter, prompt=copy.deepcopy(p.prompt),
                tokens=list(p.token_ids), label=p.label, metadata=metadata,
            ))
            self.sample_counter += 1
        self.group_counter += 1
        return group

    def put_back(self, prompt_indices: Sequence[int]) -> None:
        self.pending = list(prompt_indices) + self.pending

    def state(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "offset": self.offset, "group_counter": self.group_counter,
                "sample_counter": self.sample_counter, "pending": list(self.pending),
                "num_prompts": len(self.prompts), "shuffle": self.shuffle, "seed": self.seed}

    def load_state(self, state: dict[str, Any]) -> None:
        if state.get("num_prompts") != len(self.prompts):
            raise ValueError(
                f"checkpoint data state is for {state.get('num_prompts')} prompts but --prompt-data has "
                f"{len(self.prompts)}: resume with the same prompt file"
            )
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
        self.group_counter, self.sample_counter = int(state["group_counter"]), int(state["sample_counter"])
        self.pending = [int(i) for i in state["pending"]]
        self._order = self._epoch_order(self.epoch)


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


def engine_url(args: argparse.Namespace, sample: Sample) -> str:
    """The engine for `sample`: groups spread round robin over `args.rollout_engine_urls`."""
    urls = getattr(args, "rollout_engine_urls", None)
    if urls:
        return urls[(sample.group_index or 0) % len(urls)]
    if args.sglang_router_ip is None or args.sglang_router_port is None:
        raise RuntimeError("no engine address: the trainer sets args.sglang_router_ip/port when engines start")
    return f"http://{args.sglang_router_ip}:{args.sglang_router_port}"


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
    output = await post(f"{engine_url(args, sample)}/generate", payload)
    meta = output["meta_info"]
    pairs = meta.get("output_token_logprobs") or []
    tokens = [int(tok) for _, tok, *_ in pairs]
    log_probs = [float(lp) for lp, *_ in pairs]
    sample.append_response_tokens(args, tokens, log_probs, meta_info=meta, text=output.get("text", ""))
    return sample


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


def _generate_function(args: argparse.Namespace, sample: Sample) -> Callable[..., Awaitable[Any]]:
    path = sample.generate_function_path or args.custom_generate_function_path
    return load_function(path) if path else generate


async def generate_and_rm(
    args: argparse.Namespace,
    sample: Sample,
    sampling_params: dict[str, Any],
    semaphore: asyncio.Semaphore,
    evaluation: bool = False,
) -> Sample | list[Sample]:
    """Generate under the semaphore, then score unless the group RM will or the reward is set."""
    if sample.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED) and sample.response_length:
        return sample
    fn = _generate_function(args, sample)
    kwargs = {"evaluation": evaluation} if "evaluation" in inspect.signature(fn).parameters else {}
    async with semaphore:
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
    semaphore: asyncio.Semaphore,
    evaluation: bool = False,
) -> list[Sample]:
    """All samples of one prompt, then the group reward with `--group-rm`."""
    results = await asyncio.gather(
        *(generate_and_rm(args, s, sampling_params, semaphore, evaluation) for s in group)
    )
    samples = [s for r in results for s in (r if isinstance(r, list) else [r])]
    if args.group_rm:
        unscored = [s for s in samples if s.reward is None]
        if unscored:
            for s, r in zip(unscored, await batched_async_rm(args, unscored), strict=True):
                s.reward = r
    return samples


# ---- dynamic sampling filter -----------------------------------------------------------------------


@dataclass
class DynamicFilterOutput:
    """slime's filter result: keep the group or drop it (with a reason, logged as a metric)."""

    keep: bool
    reason: str | None = None
    keep_when_insufficient: bool = False


def check_reward_nonzero_std(args: argparse.Namespace, samples: list[Sample], **kwargs: Any) -> DynamicFilterOutput:
    """Keep a group iff its rewards differ (float std > 1e-6): an all-equal group has zero advantage."""
    rewards = [float(s.get_reward_value(args)) for s in samples]
    mean = sum(rewards) / len(rewards)
    std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5
    if std > 1e-6:
        return DynamicFilterOutput(keep=True)
    return DynamicFilterOutput(keep=False, reason=f"zero_std_{rewards[0]:.1f}")


def _apply_filter(fn: Callable[..., Any] | None, args: argparse.Namespace, group: list[Sample]) -> DynamicFilterOutput:
    if fn is None:
        return DynamicFilterOutput(keep=True)
    out = fn(args, group)
    if isinstance(out, bool):
        return DynamicFilterOutput(keep=out)
    return DynamicFilterOutput(keep=bool(out.keep), reason=getattr(out, "reason", None),
                               keep_when_insufficient=bool(getattr(out, "keep_when_insufficient", False)))


# ---- one step's rollout ----------------------------------------------------------------------------


class RolloutFailedError(RuntimeError):
    """Groups kept failing after every engine restart the step was allowed."""


@dataclass
class RolloutResult:
    """The kept groups (sorted by group index) and rollout metrics of one step."""

    groups: list[list[Sample]]
    metrics: dict[str, Any] = field(default_factory=dict)


def _group_failed(result: Any) -> bool:
    if isinstance(result, BaseException):
        return True
    return any(s.status == Sample.Status.ABORTED for s in result)


async def generate_rollout(
    args: argparse.Namespace,
    rollout_id: int,
    data_source: PromptDataSource,
    *,
    on_failure: Callable[[list[BaseException]], Awaitable[None]] | None = None,
) -> RolloutResult:
    """Collect `--rollout-batch-size` kept groups for step `rollout_id`.

    Rounds of `--over-sampling-batch-size` groups run concurrently; groups that raise or come back
    aborted (an engine died) are regenerated from their prompts after `on_failure` (the trainer's
    engine health check and restart), at most `--max-step-retries` times. Kept groups beyond the
    batch size go back to the data source, so the next step starts with them.
    """
    started = time.perf_counter()
    params = sampling_params_from_args(args)
    semaphore = asyncio.Semaphore(args.sglang_server_concurrency * max(len(getattr(args, "rollout_engine_urls", [])), 1))
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
            *(generate_and_rm_group(args, g, params, semaphore) for g in groups), return_exceptions=True
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
            logger.warning("step %d: %d groups failed (%s); checking engines and retrying", rollout_id,
                           len(retry_prompts), "; ".join(f"{type(e).__name__}: {e}" for e in errors[:2]) or "aborted")
            if failures > args.max_step_retries:
                raise RolloutFailedError(
                    f"step {rollout_id}: groups still failing after {args.max_step_retries} retries: {errors[:1]}"
                )
            if on_failure is not None:
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
    return RolloutResult([g for _, _, g in kept], metrics)


async def eval_rollout(
    args: argparse.Namespace, name: str, prompts: Sequence[Prompt]
) -> dict[str, float]:
    """Mean reward (and response length) over an eval set, `--n-samples-per-eval-prompt` each."""
    source = PromptDataSource(prompts, args.n_samples_per_eval_prompt, shuffle=False, seed=0)
    params = sampling_params_from_args(args, evaluation=True)
    semaphore = asyncio.Semaphore(args.sglang_server_concurrency)
    groups = source.get_samples(len(prompts))
    results = await asyncio.gather(*(generate_and_rm_group(args, g, params, semaphore, True) for g in groups))
    samples = [s for g in results for s in g]
    rewards = [float(s.get_reward_value(args)) for s in samples]
    return {
        f"eval/{name}": sum(rewards) / len(rewards),
        f"eval/{name}_response_len": sum(s.response_length for s in samples) / len(samples),
    }

"""`Sample`: one prompt and its response as it travels rollout -> reward -> trainer.

Field names, defaults, `Sample.Status`, `Sample.SpecInfo`, `Sample.PrefixCacheInfo`,
`effective_response_length` and `append_response_tokens` keep slime's public contract so that users'
generate and reward plugins run unchanged (docs/trainer.md, slime's contracts). Ours on top: every
sample gets its own `session_id` (slime's default is None), `to_dict` names the status ("COMPLETED";
`from_dict` reads names and slime's values), `from_dict` refuses keys that are not fields, and
`append_response_tokens` refuses to align a segment to a response without log-probs (slime pads
zeros) and drops the log-probs of a non-trainable segment (slime refuses them). The trainer only ever
learns from `tokens[-response_length:]` weighted by `loss_mask`, so the per-token lists must stay
aligned with `response_length`; `append_response_tokens` and `validate` exist to keep them so.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any


class SampleLengthError(ValueError):
    """A per-token list of a `Sample` disagrees with its `response_length`."""


def _plain_list(values: Any, kind: type) -> list[Any]:
    """A list of Python numbers from a list, tuple or 1-D tensor (`tolist`), None as empty."""
    if values is None:
        return []
    if hasattr(values, "tolist"):
        values = values.tolist()
    return [kind(v) for v in values]


def _new_session_id() -> str:
    return str(uuid.uuid4())


@dataclass
class Sample:
    """One rollout sample: prompt + response token ids and everything the trainer needs about them.

    `tokens` holds prompt **and** response ids; `response_length` counts the tail of `tokens` that is
    response (model tokens and, in multi-turn rollouts, environment observation tokens). `loss_mask`
    (None = all ones) and `rollout_log_probs` have one entry per response token.
    """

    class Status(Enum):
        """Why generation stopped; TRUNCATED feeds `train_data["truncated"]`, FAILED is set by plugins."""

        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    @dataclass
    class SpecInfo:
        """Speculative-decoding counters summed over a sample's engine calls (slime's `Sample.SpecInfo`)."""

        spec_accept_token_num: int = 0
        spec_draft_token_num: int = 0
        spec_verify_ct: int = 0
        completion_token_num: int = 0

        @property
        def spec_accept_rate(self) -> float:
            """Accepted draft tokens per drafted token (0 when nothing was drafted)."""
            drafted = self.spec_draft_token_num
            return self.spec_accept_token_num / drafted if drafted > 0 else 0.0

        @property
        def spec_accept_length(self) -> float:
            """Completion tokens per verify step (0 before any verify step)."""
            return self.completion_token_num / self.spec_verify_ct if self.spec_verify_ct > 0 else 0.0

        def add(self, meta_info: Mapping[str, Any]) -> None:
            """Add one engine answer's `meta_info` counters (absent ones count 0)."""
            self.spec_accept_token_num += meta_info.get("spec_accept_token_num", 0)
            self.spec_draft_token_num += meta_info.get("spec_draft_token_num", 0)
            self.spec_verify_ct += meta_info.get("spec_verify_ct", 0)
            self.completion_token_num += meta_info.get("completion_tokens", 0)

        def to_dict(self) -> dict[str, int]:
            return {f.name: getattr(self, f.name) for f in fields(self)}

        @staticmethod
        def from_dict(data: Mapping[str, Any]) -> Sample.SpecInfo:
            return Sample.SpecInfo(**{f.name: data.get(f.name, 0) for f in fields(Sample.SpecInfo)})

    @dataclass
    class PrefixCacheInfo:
        """Prompt tokens served from the engine's prefix cache, summed over a sample's engine calls."""

        cached_tokens: int = 0
        total_prompt_tokens: int = 0

        @property
        def prefix_cache_hit_rate(self) -> float:
            """Cached share of the prompt tokens sent (0 before any call)."""
            total = self.total_prompt_tokens
            return self.cached_tokens / total if total > 0 else 0.0

        def add(self, meta_info: Mapping[str, Any]) -> None:
            """Add one engine answer's `cached_tokens` / `prompt_tokens`."""
            self.cached_tokens += meta_info.get("cached_tokens", 0)
            self.total_prompt_tokens += meta_info.get("prompt_tokens", 0)

        def to_dict(self) -> dict[str, int]:
            return {f.name: getattr(self, f.name) for f in fields(self)}

        @staticmethod
        def from_dict(data: Mapping[str, Any]) -> Sample.PrefixCacheInfo:
            return Sample.PrefixCacheInfo(**{f.name: data.get(f.name, 0) for f in fields(Sample.PrefixCacheInfo)})

    group_index: int | None = None
    index: int | None = None
    # Fan-out siblings (one rollout split into several samples) share this; falls back to `index`.
    rollout_id: int | None = None
    # Usually text or chat messages; any JSON value a dataset row holds when no chat template is applied
    # (tau-bench's `--input-key index` gives an int), for the generate function to interpret.
    prompt: Any = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None  # raw media (images, ...), as slime's processor reads them
    multimodal_train_inputs: dict[str, Any] | None = None  # processed media tensors the trainer would take
    multimodal_train_input_id: str | None = None
    response: str = ""
    response_length: int = 0
    label: Any = None  # the dataset's value as is: a string, or a dict (search-r1's {"ground_truth": ...})
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    rollout_log_probs: list[float] | None = None
    weight_versions: list[str] = field(default_factory=list)
    status: Sample.Status = Status.PENDING
    remove_sample: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    train_metadata: dict[str, Any] | None = None
    session_id: str | None = field(default_factory=_new_session_id)
    non_generation_time: float = 0.0
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    # Top-p replay, ragged: the candidates of response token i are ids[offsets[i]:offsets[i + 1]].
    rollout_top_p_token_ids: list[int] | None = None
    rollout_top_p_token_offsets: list[int] | None = None
    rollout_routed_experts: Any = None
    teacher_log_probs: list[float] | None = None
    spec_info: Sample.SpecInfo = field(default_factory=lambda: Sample.SpecInfo())
    prefix_cache_info: Sample.PrefixCacheInfo = field(default_factory=lambda: Sample.PrefixCacheInfo())

    def __post_init__(self) -> None:
        # Plugins written for upstream build Samples with a status string (tau-bench's res_to_sample passes
        # "completed"); upstream keeps the string, so every `status == Sample.Status.X` test then fails quietly.
        if isinstance(self.status, str):
            self.status = parse_status(self.status)

    @property
    def effective_response_length(self) -> int:
        """Response tokens the loss sees: the loss mask's ones (all of them without a mask)."""
        return sum(self.loss_mask) if self.loss_mask is not None else self.response_length

    def append_response_tokens(
        self,
        args: Any = None,
        tokens: Sequence[int] | None = None,
        log_probs: Sequence[float] | None = None,
        trainable: bool = True,
        meta_info: Mapping[str, Any] | None = None,
        text: str | None = None,
        *,
        update_terminal_info: bool = True,
    ) -> None:
        """Append one response segment: model output (`trainable`) or an environment observation.

        Trainable segments need the engine's log-probs and get loss mask 1; non-trainable ones get
        mask 0 and log-prob 0.0, so `tokens`, `loss_mask` and `rollout_log_probs` never drift apart.
        `tokens` / `log_probs` may be lists or 1-D tensors; no tokens with `meta_info` only records it.
        With `update_terminal_info` (slime's default), a `meta_info` that holds a `finish_reason` sets
        `status` from its type, records `weight_version`, adds `cached_tokens` / `prompt_tokens` to
        `prefix_cache_info`, and, when `args.sglang_speculative_algorithm` is set, the counters to
        `spec_info`. `text` is appended to `response` when given (no tokenizer here to decode it).
        Nothing is changed if an argument is invalid.
        """
        tokens = _plain_list(tokens, int)
        log_probs = None if log_probs is None else _plain_list(log_probs, float)
        self.validate()
        if tokens and self.rollout_log_probs is None and self.response_length > 0:
            raise SampleLengthError(
                f"sample has {self.response_length} response tokens but rollout_log_probs is None, so "
                "a new segment cannot be aligned: build multi-turn samples with append_response_tokens "
                "from the first segment, or set rollout_log_probs first"
            )
        if tokens and trainable and log_probs is None:
            raise ValueError(
                f"a trainable segment of {len(tokens)} tokens needs log_probs (the engine's per-token "
                "log-probs, meta_info['output_token_logprobs']); pass trainable=False for environment "
                "or template tokens"
            )
        if trainable and log_probs is not None and len(log_probs) != len(tokens):
            raise SampleLengthError(
                f"segment has {len(tokens)} tokens but {len(log_probs)} log_probs: pass one log-prob per token"
            )
        terminal = update_terminal_info and meta_info is not None and meta_info.get("finish_reason") is not None
        new_status = status_from_finish_reason(meta_info["finish_reason"]) if terminal else None

        if tokens:
            if self.loss_mask is None:
                self.loss_mask = [1] * self.response_length
            if self.rollout_log_probs is None:
                self.rollout_log_probs = []
            self.tokens.extend(tokens)
            self.response_length += len(tokens)
            self.loss_mask.extend([1 if trainable else 0] * len(tokens))
            self.rollout_log_probs.extend(log_probs if trainable else [0.0] * len(tokens))
        if text is not None:
            self.response += text
        if not terminal:
            return
        self.status = new_status
        if meta_info.get("weight_version") is not None:
            self.weight_versions.append(str(meta_info["weight_version"]))
        self.prefix_cache_info.add(meta_info)
        if getattr(args, "sglang_speculative_algorithm", None):
            self.spec_info.add(meta_info)

    def validate(self) -> None:
        """Raise `SampleLengthError` if a per-token list disagrees with `response_length`.

        Why: the trainer right-aligns `loss_mask` and `rollout_log_probs` to `tokens`; a length
        mismatch would silently train on the wrong tokens instead of failing.
        """
        if not 0 <= self.response_length <= len(self.tokens):
            raise SampleLengthError(
                f"sample {self.index}: response_length={self.response_length} must lie in "
                f"[0, len(tokens)={len(self.tokens)}]: tokens holds prompt + response ids"
            )
        for name in ("loss_mask", "rollout_log_probs"):
            values = getattr(self, name)
            if values is not None and len(values) != self.response_length:
                raise SampleLengthError(
                    f"sample {self.index}: len({name})={len(values)} but response_length="
                    f"{self.response_length}: keep one entry per response token "
                    "(append_response_tokens does this)"
                )

    def get_reward_value(self, args: Any) -> Any:
        """The scalar reward: `reward[args.reward_key]` when `--reward-key` is set, else `reward`."""
        key = getattr(args, "reward_key", None)
        if not key:
            return self.reward
        if not isinstance(self.reward, Mapping) or key not in self.reward:
            raise KeyError(
                f"--reward-key {key!r} not found in sample {self.index}'s reward {self.reward!r}: "
                "return a dict with that key from the reward function, or drop --reward-key"
            )
        return self.reward[key]

    def to_dict(self) -> dict[str, Any]:
        """A deep-copied plain dict (status as its name) for debug dumps; inverse of `from_dict`."""
        data = {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self)}
        data["status"] = self.status.name
        data["spec_info"] = self.spec_info.to_dict()
        data["prefix_cache_info"] = self.prefix_cache_info.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Sample:
        """Rebuild a sample from `to_dict` output; unknown keys and misaligned lists are errors."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"Sample.from_dict got unknown keys {unknown}: the dump was written by another "
                "version of Sample; remove those keys or add the fields"
            )
        values = copy.deepcopy(dict(data))
        if "status" in values:
            values["status"] = parse_status(values["status"])
        for name, kind in (("spec_info", Sample.SpecInfo), ("prefix_cache_info", Sample.PrefixCacheInfo)):
            if isinstance(values.get(name), Mapping):
                values[name] = kind.from_dict(values[name])
        sample = cls(**values)
        sample.validate()
        return sample


_FINISH_REASON_STATUS = {
    "stop": Sample.Status.COMPLETED,
    "length": Sample.Status.TRUNCATED,
    "abort": Sample.Status.ABORTED,
}


def status_from_finish_reason(finish_reason: str | Mapping[str, Any]) -> Sample.Status:
    """Map SGLang's `meta_info.finish_reason` (the dict or its `type`) to a `Sample.Status`.

    stop -> COMPLETED, length -> TRUNCATED, abort -> ABORTED; anything else is an error rather than
    a guess, because TRUNCATED and ABORTED change how the sample is trained on or resumed.
    """
    kind = finish_reason.get("type") if isinstance(finish_reason, Mapping) else finish_reason
    try:
        return _FINISH_REASON_STATUS[kind]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown finish_reason {finish_reason!r}: expected type one of {sorted(_FINISH_REASON_STATUS)}"
        ) from None


def parse_status(value: Sample.Status | str) -> Sample.Status:
    """Accept a Status, its name ("COMPLETED") or its value ("completed")."""
    if isinstance(value, Sample.Status):
        return value
    if isinstance(value, str):
        if value in Sample.Status.__members__:
            return Sample.Status[value]
        for status in Sample.Status:
            if status.value == value:
                return status
    names = ", ".join(Sample.Status.__members__)
    raise ValueError(f"unknown Sample status {value!r}: expected one of {names}")

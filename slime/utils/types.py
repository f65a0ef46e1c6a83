"""`Sample`: one prompt and its response as it travels rollout -> reward -> trainer.

Field names, defaults and `Sample.Status` keep slime's public contract so that users' generate and
reward plugins run unchanged (docs/trainer.md, slime's contracts). The trainer only ever
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

    group_index: int | None = None
    index: int | None = None
    # Fan-out siblings (one rollout split into several samples) share this; falls back to `index`.
    rollout_id: int | None = None
    prompt: str | list[dict[str, Any]] = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    response: str = ""
    response_length: int = 0
    label: str | None = None
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
    spec_info: dict[str, Any] = field(default_factory=dict)
    prefix_cache_info: dict[str, Any] = field(default_factory=dict)

    def append_response_tokens(
        self,
        args: Any,
        tokens: Sequence[int],
        log_probs: Sequence[float] | None = None,
        trainable: bool = True,
        meta_info: Mapping[str, Any] | None = None,
        text: str | None = None,
    ) -> None:
        """Append one response segment: model output (`trainable`) or an environment observation.

        Trainable segments need the engine's log-probs and get loss mask 1; non-trainable ones get
        mask 0 and log-prob 0.0, so `tokens`, `loss_mask` and `rollout_log_probs` never drift apart.
        `meta_info` (SGLang's) sets `status` from `finish_reason.type` and records `weight_version`.
        `text` is appended to `response` when given (no tokenizer here to decode it). Nothing is
        changed if an argument is invalid. `args` is unused; it keeps slime's signature.
        """
        del args
        tokens = list(tokens)
        self.validate()
        if self.rollout_log_probs is None and self.response_length > 0:
            raise SampleLengthError(
                f"sample has {self.response_length} response tokens but rollout_log_probs is None, so "
                "a new segment cannot be aligned: build multi-turn samples with append_response_tokens "
                "from the first segment, or set rollout_log_probs first"
            )
        if trainable and log_probs is None:
            raise ValueError(
                f"a trainable segment of {len(tokens)} tokens needs log_probs (the engine's per-token "
                "log-probs, meta_info['output_token_logprobs']); pass trainable=False for environment "
                "or template tokens"
            )
        if log_probs is not None and len(log_probs) != len(tokens):
            raise SampleLengthError(
                f"segment has {len(tokens)} tokens but {len(log_probs)} log_probs: pass one log-prob per token"
            )
        new_status = None
        if meta_info is not None and meta_info.get("finish_reason") is not None:
            new_status = status_from_finish_reason(meta_info["finish_reason"])

        if self.loss_mask is None:
            self.loss_mask = [1] * self.response_length
        if self.rollout_log_probs is None:
            self.rollout_log_probs = []
        self.tokens.extend(tokens)
        self.response_length += len(tokens)
        if trainable:
            self.loss_mask.extend([1] * len(tokens))
            self.rollout_log_probs.extend(float(lp) for lp in log_probs)
        else:
            self.loss_mask.extend([0] * len(tokens))
            self.rollout_log_probs.extend([0.0] * len(tokens))
        if text is not None:
            self.response += text
        if new_status is not None:
            self.status = new_status
        if meta_info is not None and meta_info.get("weight_version") is not None:
            self.weight_versions.append(str(meta_info["weight_version"]))

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
            values["status"] = _parse_status(values["status"])
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


def _parse_status(value: Sample.Status | str) -> Sample.Status:
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

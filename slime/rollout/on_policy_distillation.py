"""On-policy distillation from a teacher server (slime's `slime.rollout.on_policy_distillation`).

    --custom-rm-path slime.rollout.on_policy_distillation.reward_func
    --custom-reward-post-process-path slime.rollout.on_policy_distillation.post_process_rewards
    --rm-url http://TEACHER:PORT/generate
    --use-opd --opd-type sglang [--opd-kl-coef 1.0]

`reward_func` asks the teacher (an SGLang-compatible `/generate`) to score the student's whole sequence
without generating: `max_new_tokens` 0, `return_logprob` with `logprob_start_len` 0, at the rollout
temperature, so the teacher's log-probs are on the same footing as the student's. Its "reward" is the
teacher's reply. `post_process_rewards` then takes the teacher's log-prob of every response token from
`meta_info.input_token_logprobs` into `sample.teacher_log_probs` and returns 0.0 as every sample's raw and
processed reward: the learning signal is the distillation penalty on the advantages, which the trainer
applies from `teacher_log_probs` (`--use-opd`: A - --opd-kl-coef x (student - teacher log-prob) per response
token, `slime.backends.train_worker.opd_advantages`), not a task reward. Until this hook runs, the reward is
the teacher's reply, which `rm_hub.check_reward` accepts because a post-process hook is set.
The teacher may be any SGLang-compatible engine; the CPU engine (`python -m slime.engine.cpu_server`)
scores the same way.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from slime.utils.http_utils import post
from slime.utils.types import Sample

__all__ = ["post_process_rewards", "reward_func"]


def teacher_payload(args: argparse.Namespace, sample: Sample) -> dict[str, Any]:
    """The `/generate` body that scores `sample.tokens` under the teacher without generating."""
    return {
        "input_ids": list(sample.tokens),
        "sampling_params": {"temperature": args.rollout_temperature, "max_new_tokens": 0,
                            "skip_special_tokens": False},
        "return_logprob": True,
        "logprob_start_len": 0,
    }


async def reward_func(args: argparse.Namespace, sample: Sample, **kwargs: Any) -> dict[str, Any]:
    """The teacher's `/generate` reply for the student's sequence (prompt + response), as the raw reward."""
    url = getattr(args, "rm_url", None)
    if not url:
        raise ValueError("on-policy distillation posts to the teacher's /generate: set --rm-url "
                         "(e.g. http://TEACHER_HOST:PORT/generate)")
    if sample.multimodal_inputs and sample.multimodal_inputs.get("images"):
        raise ValueError("on-policy distillation here scores text only; this sample carries images")
    if not sample.tokens:
        raise ValueError(f"sample {sample.index} has no tokens for the teacher to score")
    return await post(url, teacher_payload(args, sample))


def _teacher_response_log_probs(reply: Any, sample: Sample) -> list[float]:
    """The teacher's log-probs of the last `response_length` tokens of `sample` from its reply."""
    entries = reply.get("meta_info", {}).get("input_token_logprobs") if isinstance(reply, dict) else None
    if entries is None:
        raise ValueError(
            f"sample {sample.index}: the teacher's reply has no meta_info.input_token_logprobs; --rm-url must be "
            "an SGLang-compatible /generate that honours return_logprob with logprob_start_len (and reward_func "
            "must be the --custom-rm-path)"
        )
    scored = entries[1:]  # the first input token has no log-prob (nothing precedes it)
    if sample.response_length > len(scored):
        raise ValueError(f"sample {sample.index}: the teacher scored {len(scored)} tokens, fewer than its "
                         f"{sample.response_length} response tokens")
    tail = scored[len(scored) - sample.response_length:]
    return [float(entry[0]) for entry in tail]


def post_process_rewards(
    args: argparse.Namespace, samples: Sequence[Sample] | Sequence[Sequence[Sample]], **kwargs: Any
) -> tuple[list[float], list[float]]:
    """Set each sample's `teacher_log_probs` from its teacher reply (its reward); return (raw, processed)
    rewards, 0.0 for every sample: pure distillation has no task reward."""
    flat = [s for item in samples for s in (item if isinstance(item, list | tuple) else [item])]
    for sample in flat:
        sample.teacher_log_probs = _teacher_response_log_probs(sample.get_reward_value(args), sample)
    zeros = [0.0] * len(flat)
    return zeros, list(zeros)

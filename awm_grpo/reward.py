"""The reward: edit this file to change what the agent is trained towards.

    --custom-rm-path awm_grpo.reward.reward

The rollout has already run the task's verifier on the final DB; `sample.metadata["awm"]` holds
the verdict and what happened. The reward is

    outcome  complete -> awm_reward_complete (1.0)
             partial  -> awm_reward_partial  (0.1)  only if the verifier reports partial completion
             other    -> awm_reward_other    (0.0)
             a document episode (awm_grpo.context.document: verifier_result["grading"] == "document_qa")
             by its finish(answer) instead (StateLM's rule):
             correct   -> awm_reward_doc_correct (1.0)
             wrong     -> awm_reward_doc_wrong   (-0.5)
             no_answer -> awm_reward_doc_none    (-1.0)  no finish call
    format   + awm_invalid_call_penalty (-1.0) if the agent wrote an invalid tool call; an episode
             terminated for it (awm_terminate_on_invalid_call) gets the penalty alone

Infrastructure failures (environment or verifier crash/timeout) are not the agent's doing: the
rollout marked them FAILED + remove_sample, so the trainer leaves them out of the group statistics
and the loss; they get 0.0 here only because a number is required, and are counted in metrics.
"""

from __future__ import annotations

import argparse
from typing import Any

from slime.utils.types import Sample

PARTIAL_RESULTS = ("partial", "partially_complete", "partially_completed")
DOCUMENT_OUTCOMES = {"correct": ("awm_reward_doc_correct", 1.0), "wrong": ("awm_reward_doc_wrong", -0.5),
                     "no_answer": ("awm_reward_doc_none", -1.0)}


def _knob(args: argparse.Namespace, name: str, default: float) -> float:
    value = getattr(args, name, None)
    return default if value is None else float(value)


def outcome(args: argparse.Namespace, awm: dict[str, Any]) -> float:
    """Reward of the verdict alone."""
    result = awm.get("verifier_result") or {}
    if result.get("grading") == "document_qa":
        knob = DOCUMENT_OUTCOMES.get(result.get("outcome"))
        if knob is None:
            raise ValueError(f"a document episode's outcome {result.get('outcome')!r} is not one of "
                             f"{sorted(DOCUMENT_OUTCOMES)}: the verdict must come from awm_grpo.context.document")
        return _knob(args, *knob)
    if awm.get("verdict") == "complete":
        return _knob(args, "awm_reward_complete", 1.0)
    raw = result.get("result")
    if isinstance(raw, str) and raw.lower() in PARTIAL_RESULTS:
        return _knob(args, "awm_reward_partial", 0.1)
    return _knob(args, "awm_reward_other", 0.0)


def score(args: argparse.Namespace, sample: Sample) -> float:
    """The reward of one sample (module docstring)."""
    awm = (sample.metadata or {}).get("awm")
    if awm is None:
        raise ValueError("sample has no metadata['awm']: use awm_grpo.rollout.generate as the generate function")
    if awm.get("infra_error"):
        return 0.0  # excluded from training (status FAILED, remove_sample); see the module docstring
    penalty = _knob(args, "awm_invalid_call_penalty", -1.0) if awm.get("invalid_calls") else 0.0
    if awm.get("verdict") == "format_error":  # terminated at the invalid call: no outcome to score
        return penalty
    return outcome(args, awm) + penalty


async def reward(args: argparse.Namespace, sample: Sample | list[Sample], **kwargs: Any) -> float | list[float]:
    """slime custom reward function (async): one sample, or a list in slime's batch form, which slime
    uses with --group-rm and whenever generate returned a list (B1's sliding window: an episode and
    its windowed turns' samples)."""
    if isinstance(sample, list):
        return [score(args, s) for s in sample]
    return score(args, sample)

"""Programmatic reward of the toy task: answer with digits, ideally the target digit.

reward = 0.5 * (share of the response's visible characters that are digits)
       + 0.5 * (share that equal the target digit in `sample.label`),  in [0, 1].
Dense on purpose: a random tiny model emits digits now and then, so groups differ and GRPO has a
signal from the first step.
"""

from __future__ import annotations

from typing import Any

SPECIAL = ("<|im_end|>", "<|endoftext|>", "<|im_start|>")


def score(text: str, target: str | None) -> float:
    for token in SPECIAL:
        text = text.replace(token, "")
    chars = [c for c in text if not c.isspace()]
    if not chars:
        return 0.0
    digits = sum(c.isdigit() for c in chars) / len(chars)
    hits = sum(c == target for c in chars) / len(chars) if target else digits
    return 0.5 * digits + 0.5 * hits


async def reward(args: Any, sample: Any, **kwargs: Any) -> float:
    """slime's single-sample reward signature (`--custom-rm-path reward.reward`)."""
    return score(sample.response, sample.label)


async def group_reward(args: Any, samples: list[Any]) -> list[float]:
    """The group form (`--group-rm`): same score, one call per prompt group."""
    return [score(s.response, s.label) for s in samples]

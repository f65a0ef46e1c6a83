"""Counterfactual copies of reference episodes: the same conversation with invented names.

A small model fine-tuned on a few hundred reference episodes memorises them: asked about a book it
has never seen, it searches for one it has. What transfers to held-out tasks is copying - the name in
the task into the call's arguments, the value in the observation into the answer - and a model only
learns to copy when the names vary more than any fixed database can make them vary.

So for a practice-set episode (a task-family instance, whose slot values are known) this writes
copies in which every text slot value is replaced by an invented name of the same shape, everywhere
it occurs in the task, the model's replies and the tool results (never in the tool catalogue):

    "Who is the author of 'Dune'?"  ->  call search_books {"query": "Dune"}  ->  {"author": "Frank Herbert"}
    "Who is the author of 'Velmor Tasin'?"  ->  {"query": "Velmor Tasin"}  ->  {"author": "Kel Oruna"}

The copies are SFT data only: never played against an environment, never verified. Their tokens
are built exactly as the rollout builds an episode (prompt ids, each reply's ids plus the end-of-turn
token, each observation delta from the chat template), and a copy is made only if rebuilding the
original episode this way reproduces its tokens exactly.
"""

from __future__ import annotations

import random
import re
from typing import Any

from awm.scenarios.worlds import invent_like

from awm_grpo.chat import ChatEncoder
from slime.utils.types import Sample


def substitutable(slots: dict[str, Any]) -> list[str]:
    """Slot values worth replacing: strings with letters, 4+ characters, longest first."""
    values = {v for v in slots.values() if isinstance(v, str) and len(v) >= 4 and any(c.isalpha() for c in v)}
    return sorted(values, key=len, reverse=True)


def substitute(text: str, mapping: dict[str, str]) -> str:
    """Replace whole occurrences (not inside a longer word or identifier) of each key, longest first."""
    if not mapping:
        return text
    pattern = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(re.escape(k) for k in mapping) + r")(?![A-Za-z0-9_])")
    return pattern.sub(lambda m: mapping[m.group(1)], text)


def rebuild(encoder: ChatEncoder, messages: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """(tokens, loss mask over the response) of a finished episode, built the way the rollout builds it.

    `messages` = [user task, assistant, tool..., assistant, ...], ending with the final answer.
    """
    if not messages or messages[0]["role"] != "user" or messages[-1]["role"] != "assistant":
        raise ValueError("an episode starts with the task and ends with the model's final answer")
    tokens = encoder.prompt_ids(messages[0]["content"])
    mask: list[int] = []
    i = 1
    while i < len(messages):
        if messages[i]["role"] == "assistant":
            ids = encoder.encode(messages[i]["content"]) + [encoder.end_of_turn_id]
            tokens += ids
            mask += [1] * len(ids)
            i += 1
        else:
            results = []
            while i < len(messages) and messages[i]["role"] == "tool":
                results.append(messages[i]["content"])
                i += 1
            ids = encoder.observation_ids(results, model_closed_turn=True)
            tokens += ids
            mask += [0] * len(ids)
    return tokens, mask


def renamable(encoder: ChatEncoder, sample: Sample, messages: list[dict[str, Any]], slots: dict[str, Any]) -> bool:
    """Whether copies of this episode can be made: its slots hold a name, and rebuilding its
    messages reproduces its tokens and loss mask exactly (checked once, not per copy)."""
    if not substitutable(slots):
        return False
    tokens, mask = rebuild(encoder, messages)
    return tokens == list(sample.tokens) and mask == list(sample.loss_mask)


def counterfactuals(encoder: ChatEncoder, sample: Sample, messages: list[dict[str, Any]], slots: dict[str, Any],
                    copies: int, rng: random.Random, max_len: int) -> list[Sample]:
    """Up to `copies` renamed copies of a `renamable` reference episode (see the module docstring);
    a copy whose response exceeds `max_len` tokens is skipped."""
    values = substitutable(slots)
    # meta mode opens with a list_tools call: its result (message 2), the tool catalogue, is never renamed
    catalogue = 2 if len(messages) > 2 and '"list_tools"' in messages[1]["content"] else None
    out = []
    for _ in range(copies):
        mapping = {v: invent_like(v, rng) for v in values}
        renamed = [m if k == catalogue else {**m, "content": substitute(m["content"], mapping)}
                   for k, m in enumerate(messages)]
        ids, loss_mask = rebuild(encoder, renamed)
        prompt_len = len(encoder.prompt_ids(renamed[0]["content"]))
        if len(ids) - prompt_len > max_len:
            continue
        out.append(Sample(index=sample.index, group_index=sample.group_index, prompt=[renamed[0]],
                          tokens=ids, response_length=len(ids) - prompt_len, loss_mask=loss_mask,
                          metadata={**(sample.metadata or {}), "counterfactual": mapping}))
    return out

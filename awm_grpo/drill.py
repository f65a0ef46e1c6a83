"""Copy drill: synthetic one-call episodes in which copying is the only way to lower the loss.

A model built from scratch that goes straight to the reference solutions memorises their names
instead of copying them: asked about a book it has never seen, it searches for one it has. A short
drill first, on episodes whose every name is invented and never repeats, makes it learn the two
copies every task needs - the name in the task into the call's arguments, and the value in the
tool result into the final answer:

    Who is the author of 'Velmor Tasin'?
      -> call_tool search_books {"query": "Velmor Tasin"}
      <- {"books": [{"id": 17, "title": "Velmor Tasin", "author": "Kel Oruna", "genre": "Dra"}], "count": 1}
      -> 'Velmor Tasin' is by Kel Oruna.

The episodes are never played against an environment. Their tokens are built the way the rollout
builds an episode (awm_grpo.counterfactual.rebuild: prompt, replies with the end-of-turn token, the
chat template's observation deltas), in the meta-tool call format of the warm start's episodes,
with whatever system prompt the given encoder carries (the warm start gives none: see there).
"""

from __future__ import annotations

import json
import random
from typing import Any

from awm_grpo.chat import ChatEncoder
from awm_grpo.counterfactual import rebuild
from slime.utils.types import Sample

SYLLABLES = ("ka lo mi ren tor vel sa nu pe dra fin gor hal ish jun kel mor nal os pri qua rus sel tam ul "
             "vor wen yas zel bri").split()


def invented_name(rng: random.Random) -> str:
    """One to three capitalised words of one to three syllables: 'Velmor Tasin', 'Kel'."""
    def word() -> str:
        return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))).capitalize()
    return " ".join(word() for _ in range(rng.randint(1, 3)))


def drill_messages(rng: random.Random) -> list[dict[str, Any]]:
    """One drill episode as chat messages: task, call, tool result, answer."""
    title, author, genre = invented_name(rng), invented_name(rng), invented_name(rng)
    call = {"name": "call_tool", "arguments": {"tool_name": "search_books", "arguments": {"query": title}}}
    result = {"books": [{"id": rng.randint(1, 99), "title": title, "author": author, "genre": genre}], "count": 1}
    return [{"role": "user", "content": f"Who is the author of '{title}'?"},
            {"role": "assistant", "content": "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"},
            {"role": "tool", "content": json.dumps(result)},
            {"role": "assistant", "content": f"'{title}' is by {author}."}]


def drill_episodes(encoder: ChatEncoder, count: int, seed: int = 0) -> list[Sample]:
    """`count` drill episodes as SFT samples (loss mask 1 on the two replies only)."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        messages = drill_messages(rng)
        tokens, mask = rebuild(encoder, messages)
        prompt_len = len(tokens) - len(mask)
        out.append(Sample(index=i, group_index=i, prompt=messages[:1], tokens=tokens,
                          response_length=len(tokens) - prompt_len, loss_mask=mask, metadata={"drill": True}))
    return out

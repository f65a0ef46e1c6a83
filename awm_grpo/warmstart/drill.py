"""Copy drill: synthetic episodes in which copying is the only way to lower the loss.

A model built from scratch that goes straight to the reference solutions memorises their names
instead of copying them: asked about a book it has never seen, it searches for one it has. A short
drill first, on episodes whose every name is invented and never repeats, makes it learn the two
copies every task needs - the name in the task into the call's arguments, and the value in the
tool result into the final answer:

    Who is the author of 'Velmor Tasin'?
      -> call_tool search_books {"query": "Velmor Tasin"}
      <- {"books": [{"id": 17, "title": "Velmor Tasin", "author": "Kel Oruna", "genre": "Dra"}], "count": 1}
      -> 'Velmor Tasin' is by Kel Oruna.

That is the `name` kind. Names are not the only thing a task copies: answers quote numbers from the
result (a price, a count) and state-mutating tasks pass an id from one result into the next call,
which the name drill never shows (the warm-start model then writes `product_id: 11` after reading
`"id": 4`). Two more kinds, drawn with `kinds`, make random numbers the only way to lower the loss:

    value: How many copies of 'Velmor Tasin' are available?  ... "available_copies": 7 ...
      -> 'Velmor Tasin' has 7 copies available.
    id:    Place a hold on 'Velmor Tasin' for me.  <- {"books": [{"id": 38, ...}]}
      -> call_tool place_hold {"book_id": 38}  <- {"id": 512, "book_id": 38, "status": "active"}
      -> Done: hold 512 on 'Velmor Tasin'.

The episodes are never played against an environment. Their tokens are built the way the rollout
builds an episode (awm_grpo.warmstart.counterfactual.rebuild: prompt, replies with the end-of-turn token, the
chat template's observation deltas), in the meta-tool call format of the warm start's episodes,
with whatever system prompt the given encoder carries (the warm start gives none: see there).
"""

from __future__ import annotations

import json
import random
from typing import Any

from awm_grpo.chat import ChatEncoder
from awm_grpo.warmstart.counterfactual import rebuild
from slime.utils.types import Sample

SYLLABLES = ("ka lo mi ren tor vel sa nu pe dra fin gor hal ish jun kel mor nal os pri qua rus sel tam ul "
             "vor wen yas zel bri").split()


def invented_name(rng: random.Random) -> str:
    """One to three capitalised words of one to three syllables: 'Velmor Tasin', 'Kel'."""
    def word() -> str:
        return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))).capitalize()
    return " ".join(word() for _ in range(rng.randint(1, 3)))


KINDS = ("name", "value", "id")

# The value kind's questions: (search tool, result key, field, question, answer), the answer's `{v}`
# being the field's value exactly as the result writes it.
VALUE_QUESTIONS = (
    ("search_books", "books", "available_copies", "How many copies of '{t}' are available?",
     "'{t}' has {v} copies available."),
    ("search_books", "books", "publication_year", "In which year was '{t}' published?", "'{t}' was published in {v}."),
    ("search_products", "products", "price", "What is the price of '{t}'?", "'{t}' costs ${v}."),
    ("search_products", "products", "stock_quantity", "How many '{t}' are in stock?", "{v} of '{t}' are in stock."),
)
# The id kind's actions: (search tool, result key, follow-up tool, its id argument, task, answer).
ID_ACTIONS = (
    ("search_books", "books", "place_hold", "book_id", "Place a hold on '{t}' for me.", "Done: hold {n} on '{t}'."),
    ("search_products", "products", "add_to_cart", "product_id", "Add '{t}' to my cart.",
     "Added '{t}' to your cart (item {n})."),
)


def _tool_call(tool: str, arguments: dict[str, Any]) -> dict[str, str]:
    call = {"name": "call_tool", "arguments": {"tool_name": tool, "arguments": arguments}}
    return {"role": "assistant", "content": "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"}


def _row(rng: random.Random, key: str, title: str) -> dict[str, Any]:
    """A search result row with several numeric fields (so the one to read must be picked by its key,
    not by being the only number), shaped like a book or a product."""
    if key == "books":
        return {"id": rng.randint(1, 999), "title": title, "author": invented_name(rng),
                "publication_year": rng.randint(1900, 2025), "total_copies": rng.randint(1, 12),
                "available_copies": rng.randint(0, 12)}
    return {"id": rng.randint(1, 999), "name": title, "brand": invented_name(rng), "price": round(rng.uniform(0.5, 250), 2),
            "stock_quantity": rng.randint(0, 400), "is_active": True}


def drill_messages(rng: random.Random, kind: str = "name") -> list[dict[str, Any]]:
    """One drill episode of `kind` (KINDS) as chat messages: task, call(s), tool result(s), answer."""
    title = invented_name(rng)
    if kind == "name":
        author, genre = invented_name(rng), invented_name(rng)
        result = {"books": [{"id": rng.randint(1, 99), "title": title, "author": author, "genre": genre}], "count": 1}
        return [{"role": "user", "content": f"Who is the author of '{title}'?"},
                _tool_call("search_books", {"query": title}),
                {"role": "tool", "content": json.dumps(result)},
                {"role": "assistant", "content": f"'{title}' is by {author}."}]
    if kind == "value":
        tool, key, field, question, answer = rng.choice(VALUE_QUESTIONS)
        row = _row(rng, key, title)
        return [{"role": "user", "content": question.format(t=title)},
                _tool_call(tool, {"query": title}),
                {"role": "tool", "content": json.dumps({key: [row], "count": 1})},
                {"role": "assistant", "content": answer.format(t=title, v=json.dumps(row[field]))}]
    if kind == "id":
        tool, key, action, id_arg, task, answer = rng.choice(ID_ACTIONS)
        row = _row(rng, key, title)
        created = {"id": rng.randint(1, 999), id_arg: row["id"], "status": "active"}
        return [{"role": "user", "content": task.format(t=title)},
                _tool_call(tool, {"query": title}),
                {"role": "tool", "content": json.dumps({key: [row], "count": 1})},
                _tool_call(action, {id_arg: row["id"]}),
                {"role": "tool", "content": json.dumps(created)},
                {"role": "assistant", "content": answer.format(t=title, n=created["id"])}]
    raise ValueError(f"unknown drill kind {kind!r}: one of {', '.join(KINDS)}")


def drill_episodes(encoder: ChatEncoder, count: int, seed: int = 0, kinds: tuple[str, ...] = ("name",)) -> list[Sample]:
    """`count` drill episodes as SFT samples (loss mask 1 on the replies only), their kinds drawn
    uniformly from `kinds`."""
    unknown = set(kinds) - set(KINDS)
    if not kinds or unknown:
        raise ValueError(f"drill kinds {sorted(unknown) or '(none)'}: choose from {', '.join(KINDS)}")
    rng = random.Random(seed)
    out = []
    for i in range(count):
        # one kind draws nothing for it: the name-only drill keeps the episodes it always had
        kind = kinds[0] if len(kinds) == 1 else rng.choice(kinds)
        messages = drill_messages(rng, kind)
        tokens, mask = rebuild(encoder, messages)
        prompt_len = len(tokens) - len(mask)
        out.append(Sample(index=i, group_index=i, prompt=messages[:1], tokens=tokens,
                          response_length=len(tokens) - prompt_len, loss_mask=mask, metadata={"drill": kind}))
    return out

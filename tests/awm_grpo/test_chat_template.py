"""ChatEncoder against the chat template Qwen3-4B ships, with the real Qwen vocabulary.

The template is read in place from `../shared/qwen3/chat_template.jinja` (CI has it; never copied into
the repo); the vocabulary is Qwen's own (slime.models.qwen_vocab), so the ids compared here are the
ids Qwen3-4B's tokenizer produces. Expected values are cut from Qwen3's rendering of a whole
conversation, never from the encoder's own dummy renders.
"""

from __future__ import annotations

import json

import pytest
from rollout_helpers import qwen3_template

from awm_grpo.chat import ChatEncoder, token_drift

IM_END = 151645
EMPTY_THINK = [151667, 271, 151668, 271]  # "<think>\n\n</think>\n\n" in Qwen3's vocabulary


@pytest.fixture(scope="module")
def qwen_tok():
    from slime.models.qwen_vocab import build_qwen_tokenizer

    return build_qwen_tokenizer(qwen3_template())


def call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def render_ids(tok, messages, *, thinking: bool, generation: bool, tools=None) -> list[int]:
    """Qwen3's own rendering of a whole conversation, tokenised by Qwen's tokenizer."""
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=generation,
                                   enable_thinking=thinking)
    return list(tok.encode(text, add_special_tokens=False))


def after_nth_im_end(ids: list[int], n: int) -> list[int]:
    positions = [i for i, t in enumerate(ids) if t == IM_END]
    return ids[positions[n - 1] + 1:]


def test_the_vocabulary_is_qwens(qwen_tok):
    assert len(qwen_tok) == 151669
    assert qwen_tok.encode("Hello world", add_special_tokens=False) == [9707, 1879]
    assert qwen_tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>", "<tool_call>", "<think>"]) == \
        [151644, 151645, 151657, 151667]
    ids = qwen_tok.encode("<think>\nx\n</think>\n\n<tool_call>{}</tool_call><|im_end|>", add_special_tokens=False)
    assert qwen_tok.decode(ids, skip_special_tokens=True) == "<think>\nx\n</think>\n\n<tool_call>{}</tool_call>"


@pytest.mark.parametrize("thinking", [False, True])
def test_qwen3_rewrites_the_last_assistant_turn_once_a_tool_message_follows(qwen_tok, thinking):
    """Why a prefix-based delta cannot work: the same assistant message renders two ways."""
    base = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
    short = qwen_tok.apply_chat_template(base, tokenize=False, enable_thinking=thinking)
    longer = qwen_tok.apply_chat_template(base + [{"role": "tool", "content": "r"}], tokenize=False,
                                          enable_thinking=thinking)
    assert not longer.startswith(short)


@pytest.mark.parametrize("thinking", [False, True])
@pytest.mark.parametrize("native", [False, True])
def test_prompt_is_qwen3s_own_rendering(qwen_tok, thinking, native):
    tools = [{"type": "function", "function": {"name": "search_books", "description": "Search.",
                                               "parameters": {"type": "object", "properties": {}}}}] if native else None
    encoder = ChatEncoder(qwen_tok, "You are an agent.", tools, {"enable_thinking": thinking})
    expected = render_ids(qwen_tok, [{"role": "system", "content": "You are an agent."},
                                     {"role": "user", "content": "Find a book."}],
                          thinking=thinking, generation=True, tools=tools)
    assert encoder.prompt_ids("Find a book.") == expected
    assert (expected[-4:] == EMPTY_THINK) is (not thinking)


REPLIES = {
    "plain": call("search_books", title="Dune"),
    "thinking": "<think>\nI should search first.\n</think>\n\n" + call("search_books", title="Dune"),
    "two calls": "<think>\nBoth at once.\n</think>\n\n" + call("search_books", title="Dune") + "\n"
                 + call("list_my_loans"),
}


@pytest.mark.parametrize("thinking", [False, True])
@pytest.mark.parametrize("reply", sorted(REPLIES))
@pytest.mark.parametrize("results", [['{"id": 4, "title": "Dune"}'], ["[]", '{"error": "not found"}', "ok"]])
def test_observation_delta_is_what_qwen3_renders_after_the_models_end_of_turn(qwen_tok, thinking, reply, results):
    encoder = ChatEncoder(qwen_tok, "You are an agent.", None, {"enable_thinking": thinking})
    conversation = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Find Dune."},
                    {"role": "assistant", "content": REPLIES[reply]}, *({"role": "tool", "content": r} for r in results)]
    full = render_ids(qwen_tok, conversation, thinking=thinking, generation=True)
    expected = after_nth_im_end(full, 3)  # system, user, then the model's own <|im_end|>
    assert encoder.observation_ids(results, model_closed_turn=True) == expected
    # a reply that stopped on a stop string gets the end-of-turn token a full render has
    assert encoder.observation_ids(results, model_closed_turn=False) == [IM_END, *expected]
    assert (expected[-4:] == EMPTY_THINK) is (not thinking)
    assert qwen_tok.decode(expected).count("<tool_response>") == len(results)


def play_by_hand(qwen_tok, encoder: ChatEncoder, replies: list[str], results: list[list[str]]):
    """Token-in/token-out bookkeeping as the rollout does it: prompt, model ids + <|im_end|>, deltas."""
    tokens = encoder.prompt_ids("Find Dune.")
    messages = [{"role": "user", "content": "Find Dune."}]
    for i, reply in enumerate(replies):
        tokens += list(qwen_tok.encode(reply, add_special_tokens=False)) + [IM_END]
        messages.append({"role": "assistant", "content": reply})
        if i < len(results):
            tokens += encoder.observation_ids(results[i], model_closed_turn=True)
            messages += [{"role": "tool", "content": r} for r in results[i]]
    return tokens, messages


def test_with_thinking_the_model_written_blocks_leave_no_drift(qwen_tok):
    encoder = ChatEncoder(qwen_tok, "You are an agent.", None, {"enable_thinking": True})
    replies = [REPLIES["thinking"], REPLIES["two calls"], "<think>\nFound it.\n</think>\n\nDune is on loan."]
    tokens, messages = play_by_hand(qwen_tok, encoder, replies, [["[]"], ["a", "b"]])
    drift = encoder.drift(tokens, messages, open_turn=False)
    assert drift.mismatched_tokens == 0 and not drift.drifted
    assert tokens == render_ids(qwen_tok, [encoder.system[0], *messages], thinking=True, generation=False)[:-1]


def test_without_thinking_a_rerender_drops_the_empty_think_block_of_every_earlier_turn(qwen_tok):
    """Qwen3 writes `<think>\\n\\n</think>\\n\\n` into each generation prompt, but a full render keeps it only
    for the last turn: drift is 4 tokens per earlier turn, and nothing else."""
    encoder = ChatEncoder(qwen_tok, "You are an agent.", None, {"enable_thinking": False})
    replies = [REPLIES["plain"], call("list_my_loans"), "Dune is on loan."]
    tokens, messages = play_by_hand(qwen_tok, encoder, replies, [["[]"], ["a", "b"]])
    drift = encoder.drift(tokens, messages, open_turn=False)
    assert drift.mismatched_tokens == 2 * len(EMPTY_THINK)
    rerender = render_ids(qwen_tok, [encoder.system[0], *messages], thinking=False, generation=False)[:-1]
    # removing the empty blocks before the first two replies gives exactly the re-render
    starts = [i for i in range(len(tokens) - 3) if tokens[i:i + 4] == EMPTY_THINK]
    assert len(starts) == 3
    pruned = [t for i, t in enumerate(tokens) if not any(s <= i < s + 4 for s in starts[:2])]
    assert pruned == rerender


def test_token_drift_counts_an_inserted_block_as_its_size():
    a = list(range(100))
    b = a[:10] + [900, 901, 902, 903] + a[10:]
    drift = token_drift(a, b)
    assert (drift.mismatched_tokens, drift.first_mismatch) == (4, 10)
    assert token_drift(a, a).mismatched_tokens == 0 and token_drift(a, a).first_mismatch == -1
    assert token_drift(a, a[:-3]).mismatched_tokens == 3


def test_the_systemless_encoder_writes_no_empty_system_turn(qwen_tok):
    encoder = ChatEncoder(qwen_tok, "", None, {"enable_thinking": False})
    assert not qwen_tok.decode(encoder.prompt_ids("hi")).startswith("<|im_start|>system")


BROKEN = {
    # tool results rendered with the assistant's words: the delta depends on what the model said
    "echoes the reply": "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'tool' %}"
                        "{{ messages[loop.index0 - 1].content }}: {% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
                        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    # the assistant's text disappears once a tool message follows it
    "drops the reply": "{% for m in messages %}{% if m.role != 'assistant' or loop.last %}<|im_start|>{{ m.role }}\n"
                       "{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
                       "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_template_with_no_possible_delta_gets_a_clear_error(qwen_tok, name):
    with pytest.raises(ValueError, match="incremental encoding is impossible"):
        ChatEncoder(qwen_tok, "sys", None, {"chat_template": BROKEN[name]})

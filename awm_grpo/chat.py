"""Token bookkeeping for multi-turn chats: the prompt once, then only deltas, never re-tokenised.

The engine always receives `prompt ids + every earlier model token + every observation delta`.
A delta is what the chat template writes between the end of the model's turn and the start of its
next turn, e.g. with Qwen3's template and `enable_thinking=False` (after the model's own `<|im_end|>`):

    "\n<|im_start|>user\n<tool_response>\n{result}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    "<think>\n\n</think>\n\n"

It is cut out of a render of a dummy conversation `[user, assistant, tool...]` + generation prompt:
everything after the end-of-turn token that closes the dummy assistant turn. A shorter render is
never assumed to be a prefix of a longer one: Qwen3's template writes the last assistant turn with
a `<think>` block only while nothing follows it, so `render([user, assistant])` is not a prefix of
`render([user, assistant, tool])`. The delta must not depend on what the assistant said: that is
checked once per encoder with two different dummy replies, and a template that fails it (or drops
the assistant's text, or never closes its turn) gets a clear error: no incremental encoding exists.

Because earlier turns are never re-tokenised, what the trainer trains on is exactly what the engine
generated from. The price is that the sequence may differ from what a full re-render of the
conversation tokenises to: non-canonical BPE splits of model output, and templates that rewrite
history. Qwen3's template, for instance, drops the empty `<think>\n\n</think>\n\n` that the
generation prompt of `enable_thinking=False` puts before every reply when that reply is not the last
turn, and it re-writes the model's own thinking in a normalised layout (and drops it entirely
before a later user message). `drift` measures the difference so it is reported, never silent.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

_DUMMY_USER = "u"
# Dummy replies: markers no tool result or template contains; the second one looks like a real turn
# (thinking and a call) so that a template whose delta depends on the reply is caught.
_DUMMY_REPLY = "\x1fawm-dummy-reply\x1f"
_DUMMY_REPLY_WITH_CALL = ("<think>\nplan\n</think>\n\n\x1fawm-dummy-reply\x1f\n<tool_call>\n"
                          '{"name": "f", "arguments": {}}\n</tool_call>')
_PROBE_RESULTS = ["first result", "second result"]


@dataclass
class Drift:
    """How the incremental ids differ from a full re-render (0 / -1 when identical).

    `mismatched_tokens` counts the tokens outside a common alignment of the two sequences (insertions +
    deletions + 2 per substitution; difflib's alignment, so an upper bound), so one extra block of 4
    tokens counts 4, not everything after it.
    """

    mismatched_tokens: int
    first_mismatch: int
    incremental_len: int
    rerender_len: int

    @property
    def drifted(self) -> bool:
        return self.mismatched_tokens > 0


class ChatEncoder:
    """Encodes one conversation's prompt, observation deltas and full re-render with one template.

    `system_prompt` "" or None: no system message at all (a template such as Qwen3's would
    otherwise write an empty system turn).
    """

    def __init__(self, tokenizer: Any, system_prompt: str | None, tools: list[dict[str, Any]] | None = None,
                 template_kwargs: dict[str, Any] | None = None) -> None:
        self.tok = tokenizer
        self.system = [{"role": "system", "content": system_prompt}] if system_prompt else []
        self.tools = tools or None
        self.kwargs = dict(template_kwargs or {})
        self.end_of_turn = self._end_of_turn_text()
        self.end_of_turn_id = self.tok.convert_tokens_to_ids(self.end_of_turn)
        self._trailer = self._text_after_end_of_turn()
        self._check_deltas_exist()

    # ---- rendering -----------------------------------------------------------------------------
    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool) -> str:
        return self.tok.apply_chat_template([*self.system, *messages], tools=self.tools, tokenize=False,
                                            add_generation_prompt=add_generation_prompt, **self.kwargs)

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def _end_of_turn_text(self) -> str:
        """The token that closes an assistant turn: Qwen's `<|im_end|>` if present, else EOS."""
        vocab = self.tok.get_vocab()
        if "<|im_end|>" in vocab:
            return "<|im_end|>"
        if self.tok.eos_token is None:
            raise ValueError("the tokenizer has neither <|im_end|> nor an EOS token: cannot find where a turn ends")
        return self.tok.eos_token

    def _text_after_end_of_turn(self) -> str:
        """What the template writes right after a final assistant turn's end token (Qwen: a newline)."""
        base = [{"role": "user", "content": _DUMMY_USER}, {"role": "assistant", "content": _DUMMY_REPLY}]
        text = self.render(base, add_generation_prompt=False)
        cut = text.rfind(self.end_of_turn)
        if cut < 0:
            raise ValueError(f"the chat template does not close assistant turns with {self.end_of_turn!r}: "
                             "incremental encoding is impossible with it")
        return text[cut + len(self.end_of_turn):]

    def _delta_text(self, results: list[str], reply: str = _DUMMY_REPLY) -> str:
        """The template's text after the dummy assistant turn's end token, up to the next generation prompt."""
        base = [{"role": "user", "content": _DUMMY_USER}, {"role": "assistant", "content": reply}]
        text = self.render(base + [{"role": "tool", "content": r} for r in results], add_generation_prompt=True)
        start = text.find(_DUMMY_REPLY)
        if start < 0:
            raise ValueError("the chat template drops the assistant's text once a tool message follows it: "
                             "incremental encoding is impossible with it")
        end = text.find(self.end_of_turn, start + len(_DUMMY_REPLY))
        if end < 0:
            raise ValueError(f"the chat template does not close an assistant turn with {self.end_of_turn!r} "
                             "before the tool messages: incremental encoding is impossible with it")
        return text[end + len(self.end_of_turn):]

    def _check_deltas_exist(self) -> None:
        """The delta may not depend on the reply it follows, or no token-in/token-out encoding exists."""
        plain = self._delta_text(_PROBE_RESULTS)
        if plain != self._delta_text(_PROBE_RESULTS, _DUMMY_REPLY_WITH_CALL):
            raise ValueError("the chat template renders tool messages differently depending on the assistant "
                             "turn before them: incremental encoding is impossible with it")
        if not all(r in plain for r in _PROBE_RESULTS):
            raise ValueError("the chat template does not render tool messages after an assistant turn: "
                             "incremental encoding is impossible with it")

    # ---- the three encodings -------------------------------------------------------------------
    def prompt_ids(self, user_content: str) -> list[int]:
        """System + task, ending with the assistant header the model continues from."""
        text = self.render([{"role": "user", "content": user_content}], add_generation_prompt=True)
        return self.encode(text)

    def observation_ids(self, results: list[str], *, model_closed_turn: bool) -> list[int]:
        """Tokens between the model's last token and its next turn, carrying `results` as tool messages.

        `model_closed_turn`: the model's last token was the end-of-turn token; otherwise (it stopped
        on a stop string) the end-of-turn token is inserted first, as a full render would have it.
        """
        head = "" if model_closed_turn else self.end_of_turn
        return self.encode(head + self._delta_text(results))

    def drift(self, incremental: list[int], messages: list[dict[str, Any]], *, open_turn: bool) -> Drift:
        """Compare incremental ids with a full re-render of `messages` (user, assistant, tool, ...).

        `open_turn`: the conversation ends with observations, so the render ends with the assistant
        header. Assistant contents are the decoded model text without its end-of-turn token.
        """
        text = self.render(messages, add_generation_prompt=open_turn)
        if not open_turn and self._trailer and text.endswith(self._trailer):
            text = text[: -len(self._trailer)]  # the model's last turn ends at its end-of-turn token
        rendered = self.encode(text)
        return token_drift(incremental, rendered)


def token_drift(incremental: list[int], rendered: list[int]) -> Drift:
    """Drift between two id sequences: tokens outside their longest common alignment."""
    if incremental == rendered:
        return Drift(0, -1, len(incremental), len(rendered))
    # autojunk (difflib's default) keeps this at ~10 ms for 8k tokens (without it: ~1.5 s); it can only
    # miss matches, so the count is an upper bound, exact for the block insertions templates cause.
    matcher = difflib.SequenceMatcher(None, incremental, rendered)
    matched = sum(block.size for block in matcher.get_matching_blocks())
    first = next((i for i, (a, b) in enumerate(zip(incremental, rendered, strict=False)) if a != b),
                 min(len(incremental), len(rendered)))
    return Drift(len(incremental) + len(rendered) - 2 * matched, first, len(incremental), len(rendered))

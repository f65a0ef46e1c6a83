"""Token bookkeeping for multi-turn chats: the prompt once, then only deltas, never re-tokenised.

The engine always receives `prompt ids + every earlier model token + every observation delta`.
A delta is what the chat template writes between the end of the model's turn and the start of its
next turn, e.g. with Qwen's template (after the model's own `<|im_end|>`):

    "\n<|im_start|>user\n<tool_response>\n{result}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"

It is found by rendering a dummy conversation with and without the tool messages and keeping the
difference, so any chat template works without hard-coding its layout. Because earlier turns are
never re-tokenised, what the trainer trains on is exactly what the engine generated from; the price
is that the sequence may differ from what a full re-render of the conversation would tokenise to
(non-canonical BPE splits of model output, templates that drop old thinking). `drift` measures that
difference so it is reported, never silent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_DUMMY_USER = "u"
_DUMMY_REPLY = "a"


@dataclass
class Drift:
    """How the incremental ids differ from a full re-render: 0 / -1 when identical."""

    mismatched_tokens: int
    first_mismatch: int
    incremental_len: int
    rerender_len: int

    @property
    def drifted(self) -> bool:
        return self.mismatched_tokens > 0


class ChatEncoder:
    """Encodes one conversation's prompt, observation deltas and full re-render with one template."""

    def __init__(self, tokenizer: Any, system_prompt: str, tools: list[dict[str, Any]] | None = None,
                 template_kwargs: dict[str, Any] | None = None) -> None:
        self.tok = tokenizer
        self.system = {"role": "system", "content": system_prompt}
        self.tools = tools or None
        self.kwargs = dict(template_kwargs or {})
        self.end_of_turn = self._end_of_turn_text()
        self.end_of_turn_id = self.tok.convert_tokens_to_ids(self.end_of_turn)
        self._trailer = self._text_after_end_of_turn()

    # ---- rendering -----------------------------------------------------------------------------
    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool) -> str:
        return self.tok.apply_chat_template([self.system, *messages], tools=self.tools, tokenize=False,
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
        """What the template writes right after an assistant turn's end token (Qwen: a newline)."""
        base = [{"role": "user", "content": _DUMMY_USER}, {"role": "assistant", "content": _DUMMY_REPLY}]
        text = self.render(base, add_generation_prompt=False)
        cut = text.rfind(self.end_of_turn)
        if cut < 0:
            raise ValueError(f"the chat template does not close assistant turns with {self.end_of_turn!r}")
        return text[cut + len(self.end_of_turn):]

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
        base = [{"role": "user", "content": _DUMMY_USER}, {"role": "assistant", "content": _DUMMY_REPLY}]
        before = self.render(base, add_generation_prompt=False)
        after = self.render(base + [{"role": "tool", "content": r} for r in results], add_generation_prompt=True)
        if not after.startswith(before):
            raise ValueError("the chat template rewrites earlier turns when a tool message is added: "
                             "incremental encoding is impossible with it")
        delta = after[len(before):]
        head = "" if model_closed_turn else self.end_of_turn
        return self.encode(head + self._trailer + delta)

    def drift(self, incremental: list[int], messages: list[dict[str, Any]], *, open_turn: bool) -> Drift:
        """Compare incremental ids with a full re-render of `messages` (user, assistant, tool, ...).

        `open_turn`: the conversation ends with observations, so the render ends with the assistant
        header. Assistant contents are the decoded model text without its end-of-turn token.
        """
        text = self.render(messages, add_generation_prompt=open_turn)
        if not open_turn and self._trailer and text.endswith(self._trailer):
            text = text[: -len(self._trailer)]  # the model's last turn ends at its end-of-turn token
        rendered = self.encode(text)
        mismatched = sum(a != b for a, b in zip(incremental, rendered, strict=False))
        mismatched += abs(len(incremental) - len(rendered))
        first = next((i for i, (a, b) in enumerate(zip(incremental, rendered, strict=False)) if a != b),
                     min(len(incremental), len(rendered)) if len(incremental) != len(rendered) else -1)
        return Drift(mismatched, first, len(incremental), len(rendered))

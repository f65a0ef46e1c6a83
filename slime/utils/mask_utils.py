"""Loss masks for multi-turn chat data (slime's `slime.utils.mask_utils`): which tokens an SFT step learns.

`MultiTurnLossMaskGenerator(tokenizer, tokenizer_type).get_loss_mask(messages, tools=None)` returns
`(token_ids, loss_mask)` for a whole conversation, one mask entry per token: 1 on what the assistant says
(its content through the end-of-turn marker), 0 on system, user and tool turns and on each assistant
turn's header (`<|im_start|>assistant\\n`). A message with `"step_loss_mask": 0` (anything but 1) is
rendered but not learned. `tokenizer_type` (slime's `--loss-mask-type`) says how the chat template is
cut into turns:

- `qwen`: each message rendered on its own; the default system turn a Qwen2.5-style template adds to a
  lone message is measured once and cut from every later message. A tokenizer whose added vocabulary
  has DeepSeek-R1's `<｜Assistant｜>` marker is treated as `distill_qwen`.
- `qwen3`: each message (consecutive `tool` messages together, as Qwen3's template puts them in one user
  turn) rendered after a placeholder user turn that is then cut off, so an assistant turn renders as a
  reply to a query does (with Qwen3's template: the empty `<think>` block included, and learned).
- `qwen3_5`: the whole conversation rendered once; tokens overlapping assistant replies (after the
  header and an opening `<think>\\n`, through `<|im_end|>` and its newline) are learned. Needs a fast
  tokenizer (character offsets).
- `distill_qwen`: the first message as the prompt (with the generation prompt), the last message's
  content as the response tokens.

`get_response_lengths(masks)` is the trainer's response length of each mask: from its first 1 to its end
(the SFT rollout trains on `tokens[-response_length:]` with the tail of the mask).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["LOSS_MASK_TYPES", "MultiTurnLossMaskGenerator", "get_response_lengths"]

LOSS_MASK_TYPES = ("qwen", "qwen3", "qwen3_5", "distill_qwen")

# Placeholder texts for measuring the template; never part of the returned tokens.
_PROBE_TEXT = "FOR TESTING ONLY"
_SEPARATOR_TEXT = "FOR CALCULATING LOSS MASK ONLY"
# DeepSeek-R1 distilled Qwen checkpoints carry this marker in their added vocabulary.
_DISTILL_MARKER = "<｜Assistant｜>"
_ASSISTANT_HEADER = "<|im_start|>assistant\n"
_OPEN_THINK = "<think>\n"
_END_OF_TURN = "<|im_end|>"


def get_response_lengths(loss_masks: Sequence[Sequence[int]]) -> list[int]:
    """For each mask, the number of entries from its first 1 to its end (0 when it has no 1)."""
    lengths = []
    for mask in loss_masks:
        first = next((i for i, value in enumerate(mask) if value == 1), None)
        lengths.append(0 if first is None else len(mask) - first)
    return lengths


class MultiTurnLossMaskGenerator:
    """Token ids and loss mask of a conversation under `tokenizer`'s chat template (module docstring).

    `system_message_length`: tokens of the system turn the template adds to a lone non-system message
    (0 for Qwen3's template); `gen_token_length`: tokens of the generation prompt (the assistant header).
    Both are measured from the template for `qwen` and `qwen3` and are 0 otherwise.
    """

    def __init__(self, tokenizer: Any, tokenizer_type: str = "qwen"):
        if tokenizer_type not in LOSS_MASK_TYPES:
            raise ValueError(
                f"unknown loss mask type {tokenizer_type!r}: --loss-mask-type takes one of {', '.join(LOSS_MASK_TYPES)}"
            )
        self.tokenizer = tokenizer
        self.tokenizer_type = tokenizer_type
        self.system_message_length = 0
        self.gen_token_length = 0
        if tokenizer_type in ("qwen", "qwen3"):
            self.system_message_length, self.gen_token_length = self.get_system_message_length()

    # ---- small helpers ---------------------------------------------------------------------------

    def _render_ids(self, messages: list[dict], **kwargs: Any) -> list[int]:
        """The chat template's token ids for `messages` (a plain list whatever transformers' default)."""
        ids = self.tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs)
        if hasattr(ids, "keys"):  # a tokenizer that ignores return_dict
            ids = ids["input_ids"]
        return list(ids)

    def get_response_lengths(self, loss_masks: Sequence[Sequence[int]]) -> list[int]:
        """`get_response_lengths` of the module, as a method (slime's SFT rollout calls it so)."""
        return get_response_lengths(loss_masks)

    @staticmethod
    def find_all_sublist_indices(main_list: Sequence[Any], sublist: Sequence[Any]) -> list[int]:
        """Every start index at which `sublist` occurs in `main_list` (overlapping matches included)."""
        width = len(sublist)
        target = list(sublist)
        return [start for start in range(len(main_list) - width + 1) if list(main_list[start:start + width]) == target]

    def get_system_message_length(self) -> tuple[int, int]:
        """(system_message_length, gen_token_length), measured by rendering probe user turns.

        One probe turn renders as [implicit system turn] + turn, two as [implicit system turn] + turn +
        turn, so their difference is one turn and what the single rendering has beyond it is the
        implicit system turn. The generation prompt is what add_generation_prompt adds.
        """
        probe = {"role": "user", "content": _PROBE_TEXT}
        one = self._render_ids([probe])
        two = self._render_ids([probe, probe])
        turn = len(two) - len(one)
        system_length = len(one) - turn
        if turn <= 0 or system_length < 0:
            raise ValueError(
                "the tokenizer's chat template does not render one turn per message, so the loss mask "
                f"cannot be cut into turns: use another --loss-mask-type than {self.tokenizer_type!r}"
            )
        with_prompt = self._render_ids([probe, probe], add_generation_prompt=True)
        return system_length, len(with_prompt) - len(two)

    def _turn_mask(self, message: dict, length: int) -> list[int]:
        """The mask of one rendered turn of `length` tokens whose first message is `message`."""
        learned = message["role"] == "assistant" and message.get("step_loss_mask", 1) == 1
        if not learned:
            return [0] * length
        header = min(self.gen_token_length, length)
        return [0] * header + [1] * (length - header)

    # ---- the four layouts ------------------------------------------------------------------------

    def gen_multi_turn_loss_mask_qwen(
        self, messages: list[dict], tools: list[dict] | None = None
    ) -> tuple[list[int], list[int]]:
        """`qwen` layout: every message rendered alone (tools with the first), implicit system cut."""
        token_ids: list[int] = []
        loss_mask: list[int] = []
        for position, message in enumerate(messages):
            extra = {"tools": tools} if position == 0 else {}
            ids = self._render_ids([message], **extra)
            if position > 0 and message["role"] != "system":
                ids = ids[self.system_message_length:]
            token_ids += ids
            loss_mask += self._turn_mask(message, len(ids))
        return token_ids, loss_mask

    @staticmethod
    def _turn_groups(messages: list[dict]) -> list[list[dict]]:
        """Messages as the template's turns: a run of consecutive `tool` messages is one turn."""
        groups: list[list[dict]] = []
        for message in messages:
            if message["role"] == "tool" and groups and groups[-1][0]["role"] == "tool":
                groups[-1].append(message)
            else:
                groups.append([message])
        return groups

    def gen_multi_turn_loss_mask_qwen3(
        self, messages: list[dict], tools: list[dict] | None = None
    ) -> tuple[list[int], list[int]]:
        """`qwen3` layout: each turn rendered next to a placeholder user turn that is then cut off."""
        separator = {"role": "user", "content": _SEPARATOR_TEXT}
        separator_length = len(self._render_ids([separator]))
        token_ids: list[int] = []
        loss_mask: list[int] = []
        for position, group in enumerate(self._turn_groups(messages)):
            if position == 0:  # first turn: the placeholder follows it, so tools and system render as usual
                ids = self._render_ids(group + [separator], tools=tools)[:-separator_length]
            else:
                ids = self._render_ids([separator] + group)[separator_length:]
                if group[0]["role"] != "system":
                    ids = ids[self.system_message_length:]
            token_ids += ids
            loss_mask += self._turn_mask(group[0], len(ids))
        return token_ids, loss_mask

    def gen_multi_turn_loss_mask_qwen3_5(
        self, messages: list[dict], tools: list[dict] | None = None
    ) -> tuple[list[int], list[int]]:
        """`qwen3_5` layout: one rendering; tokens overlapping an assistant reply's characters are learned."""
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, tools=tools)
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        offsets = encoded.get("offset_mapping")
        if offsets is None:
            raise ValueError("--loss-mask-type qwen3_5 needs a fast tokenizer (one that returns character offsets)")
        token_ids = list(encoded["input_ids"])
        if token_ids != self._render_ids(messages, tools=tools):
            raise ValueError(
                "--loss-mask-type qwen3_5: tokenizing the rendered text gives other ids than the chat "
                "template's own tokenization, so character spans cannot be mapped to tokens"
            )
        spans = self._assistant_spans(text, messages)
        loss_mask = [int(end > start and any(s < end and start < e for s, e in spans)) for start, end in offsets]
        return token_ids, loss_mask

    @staticmethod
    def _assistant_spans(text: str, messages: list[dict]) -> list[tuple[int, int]]:
        """Character spans [start, end) of the learned assistant replies in the rendered `text`."""
        spans = []
        cursor = 0
        for message in messages:
            if message["role"] != "assistant":
                continue
            header = text.find(_ASSISTANT_HEADER, cursor)
            if header < 0:
                raise ValueError("assistant message not found in the rendered chat template output")
            start = header + len(_ASSISTANT_HEADER)
            close = text.find(_END_OF_TURN, start)
            if close < 0:
                raise ValueError(f"an assistant message has no {_END_OF_TURN} in the rendered chat template output")
            end = close + len(_END_OF_TURN)
            if text[end:end + 1] == "\n":
                end += 1
            cursor = end
            if message.get("step_loss_mask", 1) != 1:
                continue
            if text.startswith(_OPEN_THINK, start):
                start += len(_OPEN_THINK)
            spans.append((start, end))
        return spans

    def gen_multi_turn_loss_mask_distill_qwen(
        self, messages: list[dict], tools: list[dict] | None = None
    ) -> tuple[list[int], list[int]]:
        """`distill_qwen` layout: first message as prompt (with generation prompt), last content as response."""
        prompt = self.tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True, tools=tools)
        prompt_ids = list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
        response_ids = list(self.tokenizer(messages[-1]["content"], add_special_tokens=False)["input_ids"])
        learned = int(messages[-1].get("step_loss_mask", 1) == 1)
        return prompt_ids + response_ids, [0] * len(prompt_ids) + [learned] * len(response_ids)

    # ---- entry points ----------------------------------------------------------------------------

    def get_loss_mask(self, messages: list[dict], tools: list[dict] | None = None) -> tuple[list[int], list[int]]:
        """(token_ids, loss_mask) of `messages` in this generator's layout (module docstring)."""
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise TypeError(
                "get_loss_mask takes a list of chat messages ({'role': ..., 'content': ...}); for SFT data "
                "point --input-key at the messages column and leave --apply-chat-template off"
            )
        kind = self.tokenizer_type
        if kind == "qwen" and _DISTILL_MARKER in self.tokenizer.get_added_vocab():
            kind = "distill_qwen"
        layout = {
            "qwen": self.gen_multi_turn_loss_mask_qwen,
            "qwen3": self.gen_multi_turn_loss_mask_qwen3,
            "qwen3_5": self.gen_multi_turn_loss_mask_qwen3_5,
            "distill_qwen": self.gen_multi_turn_loss_mask_distill_qwen,
        }[kind]
        return layout(messages, tools)

    def get_loss_mask_with_multimodal_alignment(
        self, messages: list[dict], input_ids: list[int], tools: list[dict] | None = None
    ) -> tuple[list[int], list[int]]:
        """The text-only loss mask of `messages`, left-padded with 0s to the length of `input_ids`.

        A processor expands image placeholders into more tokens than the text tokenizer produces, all of
        them before the reply tokens; list contents are reduced to their text parts joined by spaces.
        """
        text_messages = []
        for message in messages:
            content = message.get("content")
            if isinstance(content, list):
                parts = [
                    part if isinstance(part, str) else part.get("text", "")
                    for part in content
                    if isinstance(part, str) or (isinstance(part, dict) and part.get("type") == "text")
                ]
                message = {**message, "content": " ".join(parts)}
            text_messages.append(message)
        _, text_mask = self.get_loss_mask(text_messages, tools=tools)
        extra = len(input_ids) - len(text_mask)
        if extra < 0:
            raise ValueError(
                f"input_ids has {len(input_ids)} tokens, fewer than the text loss mask's {len(text_mask)}: the "
                "processor and the tokenizer tokenize the conversation differently"
            )
        return input_ids, [0] * extra + text_mask

    def get_text_from_loss_mask(self, token_ids: Sequence[int], loss_masks: Sequence[int]) -> list[str]:
        """The decoded text of each run of consecutive learned tokens (for checking a mask by eye)."""
        texts: list[str] = []
        run: list[int] = []
        for token, value in zip(token_ids, loss_masks, strict=False):
            if value == 1:
                run.append(token)
            elif run:
                texts.append(self.tokenizer.decode(run))
                run = []
        if run:
            texts.append(self.tokenizer.decode(run))
        return texts

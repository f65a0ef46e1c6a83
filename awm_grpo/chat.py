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
import json
import unicodedata
from dataclasses import dataclass
from typing import Any

_DUMMY_USER = "u"
# Dummy replies: markers no tool result or template contains; the second one looks like a real turn
# (thinking and a call) so that a template whose delta depends on the reply is caught.
_DUMMY_REPLY = "\x1fawm-dummy-reply\x1f"
_DUMMY_REPLY_WITH_CALL = ("<think>\nplan\n</think>\n\n\x1fawm-dummy-reply\x1f\n<tool_call>\n"
                          '{"name": "f", "arguments": {}}\n</tool_call>')
_PROBE_RESULTS = ["first result", "second result"]
# Where observation_ids puts each tool result into the template's delta (rendered once per result count);
# the probes check that the template writes a result verbatim, whatever its edges or markup.
_SLOT = "\x1eawm-result-{}\x1e"
_SLOT_PROBES = [["", "  padded \n"], ["{{ x }} {% if y %}", "<tool_response>\n</tool_response><|im_end|>\n"],
                ["é ✓ \t", "\n\nlast"]]


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
        self._backend = _same_backend(tokenizer)
        self._delta_slots: dict[int, list[str] | None] = {}
        self._splitter = _piece_splitter(self._backend)
        if self._splitter is not None and not self._pieces_compose():
            self._splitter = None

    # ---- rendering -----------------------------------------------------------------------------
    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool) -> str:
        return self.tok.apply_chat_template([*self.system, *messages], tools=self.tools, tokenize=False,
                                            add_generation_prompt=add_generation_prompt, **self.kwargs)

    def encode(self, text: str) -> list[int]:
        """`tokenizer.encode(text, add_special_tokens=False)`; straight from the Rust tokenizer where that is
        the same (`_same_backend`): transformers' wrapper costs more than the tokenizing of a short text."""
        backend = self._backend
        if backend is not None and backend.usable():
            return backend.encode(text)
        return list(self.tok.encode(text, add_special_tokens=False))

    def encode_pieces(self, text: str, pieces: dict[str, list[int]] | None) -> list[int]:
        """`encode(text)`, message by message: the tokenizer cuts its input at special tokens before anything
        else, so the pieces between them encode on their own, and a piece seen before (kept in `pieces`, one
        conversation's) is not encoded again. Without a usable split: `encode(text)`."""
        if pieces is None or self._splitter is None or not self._backend.usable():
            return self.encode(text)
        split, ids_of = self._splitter
        out: list[int] = []
        for i, part in enumerate(split(text)):
            if i % 2:  # a special token
                out.append(ids_of[part])
            elif part:
                ids = pieces.get(part)
                if ids is None:
                    ids = pieces[part] = self.encode(part)
                out += ids
        return out

    def _pieces_compose(self) -> bool:
        """Piece-wise encoding equals whole encoding on a rendered conversation (else it is not used)."""
        messages = [{"role": "user", "content": "Find   the\nbook."},
                    {"role": "assistant", "content": "<think>\nplan it\n</think>\n\n<tool_call>\n{}\n</tool_call>"},
                    {"role": "tool", "content": " {\"a\": [1]}\n"}, {"role": "tool", "content": "é\n"},
                    {"role": "assistant", "content": "Done.\n"}]
        for generation in (True, False):
            text = self.render(messages, add_generation_prompt=generation) + self.end_of_turn + "\n x"
            if self.encode_pieces(text, {}) != self.encode(text):
                return False
        return True

    def max_tokens(self, text: str) -> int | None:
        """A bound on `len(encode(text))` known without encoding (None: none known): byte-level BPE makes
        every token of at least one byte of the normalised text, so a short text needs no count."""
        return self._backend.max_tokens(text) if self._backend is not None else None

    def decode(self, ids: list[int]) -> str:
        """`tokenizer.decode(ids, skip_special_tokens=False)`, straight from the Rust tokenizer where the same."""
        if self._backend is not None:
            return self._backend.tokenizer.decode(ids, skip_special_tokens=False)
        return self.tok.decode(ids, skip_special_tokens=False)

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
    def prompt_ids(self, user_content: str, pieces: dict[str, list[int]] | None = None) -> list[int]:
        """System + task, ending with the assistant header the model continues from."""
        text = self.render([{"role": "user", "content": user_content}], add_generation_prompt=True)
        return self.encode_pieces(text, pieces)

    def observation_ids(self, results: list[str], *, model_closed_turn: bool,
                        pieces: dict[str, list[int]] | None = None) -> list[int]:
        """Tokens between the model's last token and its next turn, carrying `results` as tool messages.

        `model_closed_turn`: the model's last token was the end-of-turn token; otherwise (it stopped
        on a stop string) the end-of-turn token is inserted first, as a full render would have it.
        `pieces`: the conversation's encoded pieces (`encode_pieces`), which `drift` finds again.
        """
        return self.observation(results, model_closed_turn=model_closed_turn, pieces=pieces)[0]

    def observation(self, results: list[str], *, model_closed_turn: bool,
                    pieces: dict[str, list[int]] | None = None) -> tuple[list[int], str]:
        """(`observation_ids(...)`, `decode` of them): the text is the one encoded where decoding is known to
        give it back (`_Backend.decodes_back`), else decoded."""
        head = "" if model_closed_turn else self.end_of_turn
        text = head + self.delta_text(results)
        ids = self.encode_pieces(text, pieces)
        if self._backend is not None and self._backend.decodes_back(text):
            return ids, text
        return ids, self.decode(ids)

    def delta_text(self, results: list[str]) -> str:
        """`_delta_text(results)` without rendering the template each turn: the delta for this many results
        is rendered once with a slot marker in place of each result, and the results go into the slots.
        Used only where probes showed the template writes results verbatim (`_slots`), else rendered."""
        slots = self._delta_slots.get(len(results), ())
        if slots == ():
            slots = self._delta_slots[len(results)] = self._slots(len(results))
        if slots is None or any("\x1eawm-result-" in r for r in results):
            return self._delta_text(results)
        parts = [slots[0]]
        for result, after in zip(results, slots[1:], strict=True):
            parts += [result, after]
        return "".join(parts)

    def _slots(self, n: int) -> list[str] | None:
        """The delta for `n` results cut at its slot markers, or None if filling them differs from a render."""
        marked = self._delta_text([_SLOT.format(i) for i in range(n)])
        slots: list[str] = []
        for i in range(n):
            head, found, marked = marked.partition(_SLOT.format(i))
            if not found:
                return None
            slots.append(head)
        slots.append(marked)
        for probe in _SLOT_PROBES:
            results = [probe[i % len(probe)] + str(i) * (i >= len(probe)) for i in range(n)]
            filled = "".join(part for pair in zip(slots, [*results, ""], strict=True) for part in pair)
            if filled != self._delta_text(results):
                return None
        return slots

    def drift(self, incremental: list[int], messages: list[dict[str, Any]], *, open_turn: bool,
              pieces: dict[str, list[int]] | None = None) -> Drift:
        """Compare incremental ids with a full re-render of `messages` (user, assistant, tool, ...).

        `open_turn`: the conversation ends with observations, so the render ends with the assistant
        header. Assistant contents are the decoded model text without its end-of-turn token.
        `pieces`: what `prompt_ids` / `observation_ids` encoded of this conversation (not encoded again).
        """
        text = self.render(messages, add_generation_prompt=open_turn)
        if not open_turn and self._trailer and text.endswith(self._trailer):
            text = text[: -len(self._trailer)]  # the model's last turn ends at its end-of-turn token
        rendered = self.encode_pieces(text, pieces)
        return token_drift(incremental, rendered)


class _Backend:
    """The tokenizer's Rust `tokenizers.Tokenizer`, when calling it gives what transformers' encode / decode do."""

    def __init__(self, tokenizer: Any, split_special: bool) -> None:
        self.tokenizer, self.split_special = tokenizer, split_special
        # encode_batch_fast: the same ids without the character offsets transformers never asks for here
        self._fast = getattr(tokenizer, "encode_batch_fast", None)
        self._bytes_bound = _byte_level_bound(tokenizer)
        self._lossless = _lossless(tokenizer, self._bytes_bound)

    def encode(self, text: str) -> list[int]:
        if self._fast is not None:
            return self._fast([text], add_special_tokens=False)[0].ids
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def max_tokens(self, text: str) -> int | None:
        if self._bytes_bound is None:
            return None
        normalize, extra = self._bytes_bound
        return len(normalize(text).encode("utf-8")) + extra

    def decodes_back(self, text: str) -> bool:
        """decode(encode(text)) == text for certain: byte-level BPE keeps every byte of the normalised text,
        and NFC changes nothing in text already in NFC."""
        if self._lossless is None:
            return False
        return self._lossless or unicodedata.is_normalized("NFC", text)

    def usable(self) -> bool:
        """transformers clears truncation and padding before encoding and sets special-token splitting; a
        backend that some other caller left configured otherwise is left to transformers."""
        b = self.tokenizer
        return b.truncation is None and b.padding is None and b.encode_special_tokens == self.split_special


def _same_backend(tok: Any) -> _Backend | None:
    """The Rust backend if transformers' `encode(text, add_special_tokens=False)` and `decode(ids,
    skip_special_tokens=False)` are exactly its encode(...).ids and decode(...): a fast tokenizer that does no
    clean-up of decoded spaces. Checked on sample texts; anything else keeps transformers' own methods."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    backend = getattr(tok, "_tokenizer", None)
    if not isinstance(backend, Tokenizer) or getattr(tok, "clean_up_tokenization_spaces", True):
        return None
    found = _Backend(backend, bool(getattr(tok, "split_special_tokens", False)))
    for text in ["Hello, world! <|im_end|>\n<tool_call>\n{\"a\": 1}", "é ✓\t  x\n\n", "", "\u0344\ufb2a Å"]:
        ids = list(tok.encode(text, add_special_tokens=False))
        if not found.usable() or found.encode(text) != ids:
            return None
        bound = found.max_tokens(text)
        if bound is not None and len(ids) > bound:
            found._bytes_bound = found._lossless = None  # noqa: SLF001 - the premise is wrong for this tokenizer
        if found.decodes_back(text) and tok.decode(ids, skip_special_tokens=False) != text:
            found._lossless = None  # noqa: SLF001
        if found.tokenizer.decode(ids, skip_special_tokens=False) != tok.decode(ids, skip_special_tokens=False):
            return None
    return found


def _lossless(backend: Any, bound: tuple[Any, int] | None) -> bool | None:
    """True: byte-level BPE that decodes every text back (no normaliser); False: only NFC text (an NFC
    normaliser); None: not known. Needs the byte-level bound's model without prefix spaces, a byte-level
    decoder, and no added token that swallows the whitespace beside it (lstrip / rstrip)."""
    if bound is None or bound[1]:
        return None
    spec = json.loads(backend.to_str())
    if (spec.get("decoder") or {}).get("type") != "ByteLevel":
        return None
    if any(a.get("lstrip") or a.get("rstrip") for a in spec.get("added_tokens", [])):
        return None
    return spec.get("normalizer") is None


def _piece_splitter(backend: _Backend | None) -> tuple[Any, dict[str, int]] | None:
    """(split, ids) for cutting text at the tokenizer's special tokens as its added-token pass does: tokens
    matched on the raw text (not normalised) with no whitespace stripping or word rule, that no other added
    token contains or overlaps (so the tokenizer's leftmost-longest match is the same one), and not encoded
    as plain text (`split_special_tokens`). `split(text)` alternates text pieces and special tokens."""
    import re

    if backend is None or backend.split_special:
        return None
    try:
        added = {a.content: (i, a) for i, a in backend.tokenizer.get_added_tokens_decoder().items()}
    except AttributeError:
        return None

    def overlaps(a: str, b: str) -> bool:
        return a in b or b in a or any(a.endswith(b[:k]) or b.endswith(a[:k]) for k in range(1, min(len(a), len(b))))

    chosen = {text: i for text, (i, a) in added.items()
              if a.special and not (a.normalized or a.lstrip or a.rstrip or a.single_word)
              and not any(overlaps(text, other) for other in added if other != text)}
    if not chosen:
        return None
    pattern = re.compile("(" + "|".join(re.escape(t) for t in sorted(chosen, key=len, reverse=True)) + ")")
    return pattern.split, chosen


def _byte_level_bound(backend: Any) -> tuple[Any, int] | None:
    """(normalise, extra) when every token covers at least one byte of the normalised text: a BPE model
    without byte fallback behind a byte-level pre-tokenizer (alone, or after regex splits), with no
    normaliser or NFC; `extra` counts the space a byte-level prefix may add. None for anything else."""
    try:
        spec = json.loads(backend.to_str())
    except Exception:  # noqa: BLE001 - a backend that cannot describe itself gets no bound
        return None
    normalizer, pre, model = spec.get("normalizer"), spec.get("pre_tokenizer") or {}, spec.get("model") or {}
    if normalizer is None:
        normalize: Any = str
    elif normalizer.get("type") == "NFC":
        normalize = lambda text: unicodedata.normalize("NFC", text)  # noqa: E731
    else:
        return None
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    if not steps or steps[-1].get("type") != "ByteLevel" or any(s.get("type") not in ("Split", "ByteLevel")
                                                                 for s in steps):
        return None
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        return None
    return normalize, sum(bool(s.get("add_prefix_space")) for s in steps)


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

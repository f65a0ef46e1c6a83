"""The offline tiny Qwen3: deterministic build, HF loading, and the Qwen-style chat template."""

from __future__ import annotations

import hashlib

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from slime.models.tiny import MARKER_TOKENS, SPECIAL_TOKENS, build_tiny_model, main

TOOLS = [{
    "type": "function",
    "function": {
        "name": "query_db",
        "description": "Run one SQL query",
        "parameters": {"type": "object", "properties": {"sql": {"type": "string"}}, "required": ["sql"]},
    },
}]
CONVERSATION = [
    {"role": "system", "content": "Answer with data."},
    {"role": "user", "content": "How many users?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "query_db", "arguments": {"sql": "SELECT count(*) FROM users"}}},
    ]},
    {"role": "tool", "content": "[[3]]"},
    {"role": "assistant", "content": "There are 3 users."},
]


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="module")
def tokenizer(tiny_dir):
    return AutoTokenizer.from_pretrained(tiny_dir)


def test_same_seed_gives_identical_weights_and_vocab(tiny_dir, tmp_path):
    again = build_tiny_model(tmp_path / "again", seed=0)
    other = build_tiny_model(tmp_path / "other", seed=1)

    assert _sha(again / "model.safetensors") == _sha(tiny_dir / "model.safetensors")
    assert _sha(again / "tokenizer.json") == _sha(tiny_dir / "tokenizer.json")
    assert _sha(other / "model.safetensors") != _sha(tiny_dir / "model.safetensors")
    assert _sha(other / "tokenizer.json") == _sha(tiny_dir / "tokenizer.json")  # seed only moves weights


def test_loads_offline_with_the_tiny_architecture(tiny_dir, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)

    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert len(tokenizer) == model.config.vocab_size == 4096
    assert sum(p.numel() for p in model.parameters()) == 336_256  # platform-facts section 9
    assert model.config.tie_word_embeddings and model.dtype == torch.float32
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert set(model.generation_config.eos_token_id) == {
        tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")
    }


def test_added_tokens_are_single_ids_and_only_chat_markers_are_special(tokenizer):
    for token in SPECIAL_TOKENS + MARKER_TOKENS:
        assert tokenizer.encode(token, add_special_tokens=False) == [tokenizer.convert_tokens_to_ids(token)]
    ids = tokenizer.encode("<tool_call>x</tool_call><|im_end|>", add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<tool_call>x</tool_call>"


def test_chat_template_renders_tools_tool_calls_and_tool_responses(tokenizer):
    text = tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False)

    assert text.startswith("<|im_start|>system\nAnswer with data.\n\n# Tools\n")
    assert '<tools>\n{"type": "function", "function": {"name": "query_db"' in text
    assert (
        "<|im_start|>assistant\n<tool_call>\n"
        '{"name": "query_db", "arguments": {"sql": "SELECT count(*) FROM users"}}\n</tool_call><|im_end|>\n'
    ) in text
    assert "<|im_start|>user\n<tool_response>\n[[3]]\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\nThere are 3 users.<|im_end|>\n")
    ids = tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=True)["input_ids"]
    assert tokenizer.decode(ids) == text


def test_consecutive_tool_messages_share_one_user_turn(tokenizer):
    messages = [{"role": "user", "content": "q"}, {"role": "tool", "content": "a"}, {"role": "tool", "content": "b"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    assert text == (
        "<|im_start|>user\nq<|im_end|>\n<|im_start|>user\n<tool_response>\na\n</tool_response>\n"
        "<tool_response>\nb\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_assistant_mask_covers_exactly_the_assistant_replies(tokenizer):
    out = tokenizer.apply_chat_template(
        CONVERSATION, tools=TOOLS, return_assistant_tokens_mask=True, return_dict=True
    )
    masked = [t for t, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m]

    assert tokenizer.decode(masked) == (
        '<tool_call>\n{"name": "query_db", "arguments": {"sql": "SELECT count(*) FROM users"}}\n'
        "</tool_call><|im_end|>There are 3 users.<|im_end|>"
    )


def test_rebuild_is_skipped_when_current_and_cli_builds(tiny_dir, tmp_path, capsys):
    before = (tiny_dir / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model(tiny_dir, seed=0) == tiny_dir
    assert (tiny_dir / "model.safetensors").stat().st_mtime_ns == before

    main(["--out", str(tmp_path / "cli")])
    assert capsys.readouterr().out.strip() == str(tmp_path / "cli")
    assert _sha(tmp_path / "cli" / "model.safetensors") == _sha(tiny_dir / "model.safetensors")


def test_cli_overrides_reach_the_config_and_bad_ones_fail(tmp_path, capsys):
    from transformers import AutoConfig

    from slime.models import tiny

    tiny.main(["--out", str(tmp_path / "m"), "--set", "hidden_size=32", "--set", "num_hidden_layers=3"])
    config = AutoConfig.from_pretrained(tmp_path / "m")
    assert (config.hidden_size, config.num_hidden_layers) == (32, 3)
    for bad in ("hidden_size", "hidden_size=big", "no_such_field=3"):
        with pytest.raises(SystemExit):
            tiny.main(["--out", str(tmp_path / "x"), "--set", bad])


def test_split_whitespace_gives_a_word_the_same_ids_after_a_space_or_a_quote():
    from slime.models.tiny import build_tokenizer

    corpus = ['"author": "Richard Powers", "price": 4.59\n' * 50, "The book is by Richard Powers and costs 4.59.\n" * 50]
    attached, split = build_tokenizer(600, corpus), build_tokenizer(600, corpus, split_whitespace=True)

    def ids_of(tok, text: str, word: str) -> list[int]:
        """The ids of `word` where it occurs in `text` (by character offsets)."""
        enc = tok(text, return_offsets_mapping=True, add_special_tokens=False)
        start = text.index(word)
        return [i for i, (a, b) in zip(enc["input_ids"], enc["offset_mapping"], strict=True)
                if a >= start - 1 and b <= start + len(word) and text[a:b].strip(' "')]

    result, answer = '{"author": "Richard Powers", "price": 4.59}', "It is by Richard Powers for 4.59."
    for word in ("Richard Powers", "4.59"):
        assert ids_of(split, result, word) == ids_of(split, answer, word)
    assert ids_of(attached, result, "Richard") != ids_of(attached, answer, "Richard")  # ` Richard` vs `Richard`
    for text in (result, answer, "  indented\n\tlines  "):
        assert split.decode(split(text)["input_ids"]) == text
    assert len(split(answer)["input_ids"]) > len(attached(answer)["input_ids"])  # the price: one id a space


def test_split_digits_gives_a_number_the_same_ids_in_a_result_and_an_answer():
    from slime.models.tiny import build_tokenizer

    corpus = ['"monthly_limit": 600.0, "price": 4.59, "id": 37\n' * 50, "The limit is $600.00 and it costs $4.59.\n" * 50]
    merged, digits = build_tokenizer(600, corpus), build_tokenizer(600, corpus, split_digits=True)

    def pieces(tok, text: str) -> list[str]:
        return [tok.decode([i]) for i in tok(text, add_special_tokens=False)["input_ids"]]

    assert "600" in "".join(pieces(merged, '"monthly_limit": 600.0'))
    assert [p for p in pieces(digits, '"monthly_limit": 600.0,') if p.isdigit()] == ["6", "0", "0", "0"]
    assert [p for p in pieces(digits, "costs $600.00.") if p.isdigit()] == ["6", "0", "0", "0", "0"]
    # the same number, the same ids, whatever stands before it (a space in JSON, a dollar sign in prose)
    result, answer = digits('"price": 4.59', add_special_tokens=False)["input_ids"], digits(
        "$4.59", add_special_tokens=False)["input_ids"]
    assert result[-3:] == answer[-3:]
    assert any(p.strip().isdigit() and len(p.strip()) > 1 for p in pieces(merged, '"price": 4.59 "id": 37 600'))
    for text in ('{"id": 37, "price": 4.59}', "2026-11-22T02:03:35"):
        assert digits.decode(digits(text)["input_ids"]) == text


def test_cli_ships_another_chat_template_and_the_real_qwen_vocabulary(tmp_path, capsys):
    """`--chat-template FILE --vocab qwen`: the template Qwen3-4B ships over Qwen3's real 151,669 ids."""
    from pathlib import Path

    template = Path(__file__).resolve().parents[3] / "shared" / "qwen3" / "chat_template.jinja"
    if not template.is_file():
        pytest.fail(f"{template} is missing: this test reads the template Qwen3-4B ships from the shared folder")
    out = tmp_path / "qwen3-vocab"
    main(["--out", str(out), "--chat-template", str(template), "--vocab", "qwen", "--set", "num_hidden_layers=1"])
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.chat_template == template.read_text(encoding="utf-8")
    assert len(tok) == 151669 and tok.encode("Hello world", add_special_tokens=False) == [9707, 1879]
    assert tok.convert_tokens_to_ids(["<|im_end|>", "<think>"]) == [151645, 151667]
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True,
                                   enable_thinking=False)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.vocab_size == 151669 and model.config.eos_token_id == 151645
    ids = torch.tensor([tok.encode(text, add_special_tokens=False)])
    assert model(input_ids=ids).logits.shape == (1, ids.shape[1], 151669)
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "x"), "--chat-template", str(tmp_path / "missing.jinja")])
    assert "--chat-template" in capsys.readouterr().err

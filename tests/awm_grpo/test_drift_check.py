"""The drift check in helper processes (awm_grpo.drift_check) counts what the rollout driver would.

Qwen3's own template (read in place from ../shared/qwen3) with Qwen's vocabulary, saved to a folder so
that a spawned worker loads the same tokenizer: with thinking off a re-render drops the empty think block
of every earlier turn, so the conversation below drifts by 8 tokens, in the driver and in the worker alike.
"""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from rollout_helpers import qwen3_template

from awm_grpo import drift_check
from awm_grpo.chat import ChatEncoder

IM_END = 151645


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    from slime.models.qwen_vocab import build_qwen_tokenizer

    path = tmp_path_factory.mktemp("qwen3-tokenizer")
    build_qwen_tokenizer(qwen3_template()).save_pretrained(path)
    return path


def conversation(encoder: ChatEncoder) -> tuple[list[int], list[dict], dict]:
    """Token-in/token-out as the rollout does it (pieces kept), three model turns, two tool results."""
    pieces: dict = {}
    tokens = encoder.prompt_ids("Find Dune.", pieces)
    messages = [{"role": "user", "content": "Find Dune."}]
    call = "<tool_call>\n" + json.dumps({"name": "search_books", "arguments": {"title": "Dune"}}) + "\n</tool_call>"
    for i, reply in enumerate([call, call, "Dune is on loan."]):
        tokens += encoder.encode(reply) + [IM_END]
        messages.append({"role": "assistant", "content": reply})
        if i < 2:
            tokens += encoder.observation_ids([f"result {i}"], model_closed_turn=True, pieces=pieces)
            messages.append({"role": "tool", "content": f"result {i}"})
    return tokens, messages, pieces


def test_a_helper_process_counts_the_drift_the_driver_counts(qwen_dir):
    from transformers import AutoTokenizer

    encoder = ChatEncoder(AutoTokenizer.from_pretrained(qwen_dir), "You are an agent.", None,
                          {"enable_thinking": False})
    tokens, messages, pieces = conversation(encoder)
    here = encoder.drift(tokens, messages, open_turn=False, pieces=pieces)
    try:
        there = asyncio.run(drift_check.drift(encoder, 1, tokens, messages, open_turn=False, pieces=pieces))
        pool = drift_check._POOLS[(str(qwen_dir), 1)]  # noqa: SLF001
        assert pool is not None and len(pool._processes) == 1  # noqa: SLF001  (it ran there, not here)
    finally:
        drift_check.shutdown()
    assert there == here and here.mismatched_tokens == 8  # two earlier turns' empty think blocks of 4


def test_without_a_loadable_tokenizer_the_check_runs_in_the_driver(qwen_dir, tmp_path, caplog):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(qwen_dir)
    encoder = ChatEncoder(tok, "You are an agent.", None, {"enable_thinking": False})
    tokens, messages, pieces = conversation(encoder)
    tok.name_or_path = str(tmp_path / "gone")  # what a worker would load: not there
    try:
        with caplog.at_level(logging.WARNING, logger="awm_grpo.drift_check"):
            found = asyncio.run(drift_check.drift(encoder, 1, tokens, messages, open_turn=False, pieces=pieces))
        assert drift_check._POOLS[(str(tmp_path / "gone"), 1)] is None  # noqa: SLF001  (not tried again)
    finally:
        drift_check.shutdown()
    assert found.mismatched_tokens == 8
    assert "runs in the rollout driver from now on" in caplog.text

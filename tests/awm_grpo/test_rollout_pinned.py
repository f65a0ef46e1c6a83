"""A multi-turn episode's sample pinned token for token: what the trainer gets must not move when the rollout's
hot path is made cheaper (awm_grpo.chat's slot-filled deltas and Rust-backend encode/decode, the state cache).

The episode covers every path an observation takes: the tool catalogue (never cut), two calls in one reply
(two tool messages), a result cut to `max_observation_tokens`, a reply that stops without its end-of-turn
token (the delta then starts with one), an invalid call, an error result and the final answer; with the
tiny model's own template and with Qwen3's in both thinking modes. Read-only calls only, so every
observation is the same at every run. The digests were taken with the rollout as it was before those
changes (commit 7440707); a change to the tokenizer, the templates or the bundled scenario moves them too.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

import pytest
from rollout_helpers import make_args, qwen3_template

from awm_grpo import protocol
from awm_grpo.rollout import play
from slime.models.tiny import build_tiny_model
from slime.rollout.sglang_rollout import GenerateState
from slime.utils.types import Sample

TASK = {"scenario": "clinic_appointments_1", "task_idx": 2, "task": "", "task_type": "info_seeking"}


def call(tool: str, **arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": protocol.CALL_TOOL, "arguments": {
        "tool_name": tool, "arguments": arguments}}) + "\n</tool_call>"


REPLIES = [  # (reply text, closes its turn with the end-of-turn token)
    ("<think>\nFirst the tools.\n</think>\n\n" + '<tool_call>\n{"name": "list_tools", "arguments": {}}\n</tool_call>',
     True),
    (call("search_doctors", name="Lena Fischer") + "\n" + call("search_doctors", name="Fischer"), True),
    (call("list_doctor_slots", doctor_id=3, status="open", slot_type="video"), False),  # stopped on a stop string
    ("<tool_call>\n{not json}\n</tool_call>", True),
    (call("list_doctor_slots", doctor_id="three"), True),
    ("Dr. Lena Fischer has 3 open video-visit slots.", True),
]


def scripted_policy(tokenizer: Any) -> Any:
    end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    queue = list(REPLIES)

    async def turn(input_ids: list[int], params: dict[str, Any]) -> dict[str, Any]:
        text, closed = queue.pop(0)
        ids = list(tokenizer.encode(text, add_special_tokens=False)) + [end_id] * closed
        return {"meta_info": {"output_token_logprobs": [[-((i * 7 + t) % 97) / 32, t, None] for i, t in enumerate(ids)],
                              "finish_reason": {"type": "stop"}, "weight_version": "0"}}

    return turn


def digest(values: Any) -> str:
    return hashlib.sha256(json.dumps(values).encode()).hexdigest()[:16]


def play_pinned(model_dir: Any, tmp_path: Any, **awm: Any) -> dict[str, Any]:
    from transformers import AutoTokenizer

    GenerateState.clear_instances()
    args = make_args(model_dir, "http://127.0.0.1:9", tmp_path, calls_per_turn="all", max_observation_tokens=24,
                     terminate_on_invalid_call=False, max_turns=10, **awm)
    sample = Sample(index=0, group_index=0, prompt="", metadata=dict(TASK))
    out = asyncio.run(play(args, sample, {"max_new_tokens": 1024}, scripted_policy(AutoTokenizer.from_pretrained(
        model_dir))))
    awm_meta = out.metadata["awm"]
    return {"turns": awm_meta["turns"], "stop": awm_meta["stop_reason"], "response_length": out.response_length,
            "tokens": digest(out.tokens), "loss_mask": digest(out.loss_mask),
            "log_probs": digest(out.rollout_log_probs), "response": digest(out.response),
            "drift": awm_meta["drift_tokens"]}


PINNED = {
    "tiny": {"turns": 6, "stop": "final_answer", "response_length": 1566, "tokens": "f6c6efc6f0c99033",
             "loss_mask": "98fe136ad26fe407", "log_probs": "660dbb6b3644f79f", "response": "b5e52d2a3af7d891",
             "drift": 0},
    "qwen3": {"turns": 6, "stop": "final_answer", "response_length": 1586, "tokens": "b0e889805b5cc31d",
              "loss_mask": "63a56cdce363134d", "log_probs": "1e706dc3389af627", "response": "90c29cf03ce6bcb7",
              "drift": 23},
    "qwen3-thinking": {"turns": 6, "stop": "final_answer", "response_length": 1566, "tokens": "f6c6efc6f0c99033",
                       "loss_mask": "98fe136ad26fe407", "log_probs": "660dbb6b3644f79f",
                       "response": "b5e52d2a3af7d891", "drift": 5},
}


@pytest.fixture(scope="module")
def qwen3_model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("pinned") / "qwen3", chat_template=qwen3_template())


@pytest.mark.parametrize("case", list(PINNED))
def test_a_multi_turn_sample_is_what_it_was(case, tiny_model_dir, qwen3_model_dir, tmp_path):
    model = tiny_model_dir if case == "tiny" else qwen3_model_dir
    got = play_pinned(model, tmp_path, **({"enable_thinking": True} if case == "qwen3-thinking" else {}))
    assert got["turns"] == len(REPLIES) and got["stop"] == "final_answer"
    assert got == PINNED[case]

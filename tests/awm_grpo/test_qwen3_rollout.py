"""Whole episodes through the recipe's rollout with Qwen3's own chat template and the real CPU engine.

A tiny model carrying the template Qwen3-4B ships (`../shared/qwen3/chat_template.jinja`) first learns
one reference episode of a bundled task by SFT (awm_grpo.warmstart.sft), in both thinking modes: two
tool calls in one reply (`awm_calls_per_turn: all`), then the final answer; with thinking on, each
reply opens with a `<think>` block the model writes itself. The real CPU engine then serves it and
`awm_grpo.rollout` plays the task greedily. Every token is checked against Qwen3's own rendering.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from rollout_helpers import make_args, qwen3_template

from awm_grpo import protocol
from awm_grpo.rollout import engine_policy, play
from awm_grpo.traces import TRACE_KEY, episode_metrics
from awm_grpo.warmstart.sft import Episodes, sft, teacher_policy
from slime.models.tiny import build_tiny_model
from slime.rollout.sglang_rollout import GenerateState
from slime.utils.types import Sample


def _task() -> dict:
    """Two read-only calls: the observations are the same at every play (a write would stamp `updated_at`)."""
    from awm.data import AWMDataset, bundled_data_dir

    text = AWMDataset(bundled_data_dir()).tasks("clinic_appointments_1")[2]
    return {"scenario": "clinic_appointments_1", "task_idx": 2, "task": text, "task_type": "info_seeking"}


TASK = _task()
THINK = "<think>\nI read the task.\n</think>\n\n"


def teacher_replies(thinking: bool) -> list[str]:
    """The reference solution of TASK as two replies: both calls at once, then the answer."""
    from awm.solutions import load_solutions

    solution = load_solutions(None)[(TASK["scenario"], TASK["task_idx"])]
    calls = "\n".join("<tool_call>\n" + json.dumps({"name": protocol.CALL_TOOL, "arguments": {
        "tool_name": c["tool"], "arguments": c["arguments"]}}) + "\n</tool_call>" for c in solution.calls)
    head = THINK if thinking else ""
    return [head + calls, head + solution.final_answer]


def episode(args, policy) -> Sample:
    sample = Sample(index=0, group_index=0, prompt="", metadata=dict(TASK))
    return asyncio.run(play(args, sample, {"max_new_tokens": 1024, "temperature": 0.0}, policy))


@pytest.fixture(scope="module")
def qwen3_agents(tmp_path_factory) -> dict[bool, Path]:
    """Per thinking mode, a tiny Qwen3-template model that has learnt TASK's reference episode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tmp_path_factory.mktemp("qwen3-agent")
    base = build_tiny_model(root / "base", chat_template=qwen3_template())
    tok = AutoTokenizer.from_pretrained(base)
    torch.set_num_threads(2)
    agents = {}
    for thinking in (False, True):
        GenerateState.clear_instances()
        args = make_args(base, "http://127.0.0.1:9", root, calls_per_turn="all", enable_thinking=thinking)
        taught = episode(args, teacher_policy(tok, teacher_replies(thinking)))
        assert taught.metadata["awm"]["verdict"] == "complete", taught.metadata["awm"]
        episodes = Episodes(None, 0, 4096)
        episodes.real.append(taught)
        model = AutoModelForCausalLM.from_pretrained(base)
        losses = sft(model, episodes, epochs=80, lr=5e-3, seed=0)
        assert losses[-1] < 0.05, losses
        agents[thinking] = root / f"agent-thinking-{thinking}"
        model.save_pretrained(agents[thinking])
        tok.save_pretrained(agents[thinking])
    GenerateState.clear_instances()
    return agents


@pytest.fixture(params=[False, True], ids=["thinking-off", "thinking-on"])
def qwen3_served(request, qwen3_agents):
    """(model dir, engine URL, thinking): the real CPU engine serving the mode's model."""
    from slime.engine.cpu_server import CPUEngine

    engine = CPUEngine(qwen3_agents[request.param], port=0, seed=0)
    yield qwen3_agents[request.param], engine.start(), request.param
    engine.shutdown()


def qwen3_ids(tok, messages, **kwargs) -> list[int]:
    """Qwen3's own rendering of a whole conversation (through the tokenizer's template, not ChatEncoder)."""
    return list(tok.encode(tok.apply_chat_template(messages, tokenize=False, **kwargs), add_special_tokens=False))


def test_qwen3_episode_tokens_masks_and_deltas(qwen3_served, tmp_path):
    model_dir, url, thinking = qwen3_served
    args = make_args(model_dir, url, tmp_path, calls_per_turn="all", enable_thinking=thinking)
    outputs: list[list[int]] = []
    real_engine = engine_policy(args, Sample(index=0))

    async def recording(input_ids, params):
        reply = await real_engine(input_ids, params)
        outputs.append([int(p[1]) for p in reply["meta_info"]["output_token_logprobs"]])
        return reply

    sample = episode(args, recording)
    awm = sample.metadata["awm"]
    assert awm["infra_error"] is None and awm["stop_reason"] == "final_answer", awm
    assert (awm["turns"], awm["tool_calls"], awm["verdict"]) == (2, 2, "complete"), awm
    tok = GenerateState(args).tokenizer
    end = tok.convert_tokens_to_ids("<|im_end|>")
    assert [o[-1] for o in outputs] == [end, end]

    # the prompt is Qwen3's rendering of system prompt + task, ending with its generation prompt
    messages = sample.metadata[TRACE_KEY]["messages"]
    system = {"role": "system", "content": protocol.META_SYSTEM_PROMPT}
    prompt = qwen3_ids(tok, [system, messages[0]], add_generation_prompt=True, enable_thinking=thinking)
    prompt_len = len(sample.tokens) - sample.response_length
    assert sample.tokens[:prompt_len] == prompt

    # the observation delta is what Qwen3 renders after the model's own <|im_end|> for these two results
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
    full = qwen3_ids(tok, [system, *messages[:4]], add_generation_prompt=True, enable_thinking=thinking)
    model_end = [i for i, t in enumerate(full) if t == end][2]  # after system, user: the model's turn
    delta = full[model_end + 1:]
    assert tok.decode(delta).count("<tool_response>") == 2

    # response = model ids exactly as generated, the delta, model ids; the mask covers the model's ids only
    assert sample.tokens[prompt_len:] == outputs[0] + delta + outputs[1]
    assert sample.loss_mask == [1] * len(outputs[0]) + [0] * len(delta) + [1] * len(outputs[1])
    assert len(sample.rollout_log_probs) == sample.response_length
    if thinking:  # the model's own thinking stays in the tokens, never re-rendered
        assert tok.decode(outputs[0]).startswith(THINK) and tok.decode(outputs[1]).startswith(THINK)

    # drift: a full re-render gives back the same text, except that with thinking off it drops the
    # generation prompt's empty think block before the first (non-final) reply. With thinking on the
    # model's blocks are rendered back as written: no drift. (With this local BPE the drop costs more
    # than the block's 4 tokens: the delta ends in "\n\n", one token at the end of a text, which the
    # tokenizer splits in two before a letter; Qwen's own pre-tokeniser keeps it whole.)
    rerender = tok.apply_chat_template([system, *messages], tokenize=False, enable_thinking=thinking)
    incremental = tok.decode(sample.tokens)
    empty_think = "<think>\n\n</think>\n\n"
    if thinking:
        assert incremental + "\n" == rerender
        assert awm["drift_tokens"] == 0
    else:
        assert incremental.count(empty_think) == 2 and rerender.count(empty_think) == 1
        assert incremental.replace(empty_think, "", 1) + "\n" == rerender
        assert awm["drift_tokens"] >= len(tok.encode(empty_think, add_special_tokens=False))
    metrics = episode_metrics([sample.metadata[TRACE_KEY]], "awm")  # what the step's log line reports
    assert metrics["awm/drift_rate"] == float(awm["drift_tokens"] > 0)
    assert metrics["awm/drift_tokens_per_turn"] == awm["drift_tokens"] / 2


def test_eval_of_a_qwen3_checkpoint_plays_the_same_rollout(qwen3_agents, tmp_path, capsys):
    """`awm_grpo.eval --model DIR` serves the checkpoint and plays through the training rollout."""
    from awm_grpo import eval as awm_eval

    split = tmp_path / "test.jsonl"
    split.write_text(json.dumps({"text": [{"role": "user", "content": TASK["task"]}], "metadata": TASK}) + "\n")
    config = tmp_path / "runtime.yaml"
    config.write_text("awm_calls_per_turn: all\nawm_enable_thinking: true\nawm_env_workers: 1\n")
    out = tmp_path / "eval.jsonl"
    assert awm_eval.main(["--split", str(split), "--model", str(qwen3_agents[True]), "--config", str(config),
                          "--out", str(out), "--concurrency", "1"]) == 0
    record = json.loads(out.read_text())
    assert (record["verdict"], record["tool_calls"], record["drift_tokens"]) == ("complete", 2, 0), record
    assert record["turns"][0]["assistant"].startswith(THINK)
    assert "success rate 1.000 over 1 episodes" in capsys.readouterr().out


@pytest.mark.parametrize("thinking", [False, True])
def test_a_recovery_handover_prompt_is_qwen3s_rendering_of_the_prefix(tmp_path, thinking):
    """The controlled recovery split starts from a conversation prefix (assistant / tool messages)."""
    from rollout_helpers import ScriptedEngine
    from transformers import AutoTokenizer

    base = build_tiny_model(tmp_path / "base", chat_template=qwen3_template())
    tok = AutoTokenizer.from_pretrained(base)
    engine = ScriptedEngine(tok)
    try:
        prefix = [{"role": "assistant", "content": (THINK if thinking else "") + teacher_replies(False)[0]},
                  {"role": "tool", "content": '{"id": 1, "phone": "555-201-7788"}'}, {"role": "tool", "content": "ok"}]
        engine.reply("<tool_call>\n" + json.dumps({"name": protocol.CALL_TOOL, "arguments": {
            "tool_name": "get_my_profile", "arguments": {}}}) + "\n</tool_call>", "Done.")
        args = make_args(base, engine.url, tmp_path, enable_thinking=thinking)
        sample = Sample(index=0, group_index=0, prompt="", metadata={**TASK, "start_messages": prefix})
        sample = asyncio.run(play(args, sample, {"max_new_tokens": 256}, engine_policy(args, sample)))
    finally:
        engine.server.stop()
    assert sample.metadata["awm"]["infra_error"] is None and sample.metadata["awm"]["turns"] == 2
    messages = sample.metadata[TRACE_KEY]["messages"]
    system = {"role": "system", "content": protocol.META_SYSTEM_PROMPT}
    prompt = qwen3_ids(tok, [system, *messages[:4]], add_generation_prompt=True, enable_thinking=thinking)
    assert engine.requests[0]["input_ids"] == prompt
    full = qwen3_ids(tok, [system, *messages[:6]], add_generation_prompt=True, enable_thinking=thinking)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    model_end = [i for i, t in enumerate(full) if t == end][4]  # system, user, prefix reply, its results, the model
    assert engine.requests[1]["input_ids"] == prompt + engine.outputs[0] + full[model_end + 1:]

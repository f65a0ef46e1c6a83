"""The context-managed episode (awm_grpo.context.loop): deletions, samples in both modes, budget, reward, group.

Real runtime (bundled library_lending_1, task 3), the tiny model's tokenizer and chat template, the scripted
SGLang-protocol engine (it records the input ids of every request), slime's own group path and torch trainer.
The real CPU engine plays managed episodes in test_context_cpu_engine.py.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from rollout_helpers import LOGPROB, make_args

from awm_grpo.context.loop import ContextConfig, generate, keep_samples
from awm_grpo.context.tools import STUB
from awm_grpo.reward import reward
from awm_grpo.rollout import RolloutConfig, chat_encoder
from slime.algorithms.advantages import grpo_advantages
from slime.algorithms.losses import PolicyLossConfig
from slime.backends.torch_backend import TorchTrainer, TrainerConfig
from slime.rollout.sglang_rollout import generate_and_rm_group, sampling_params_from_args
from slime.utils.types import Sample

SCENARIO = "library_lending_1"
LIST = '<tool_call>\n{"name": "list_tools", "arguments": {}}\n</tool_call>'
DONE = "Checked out copy LIB-000101 of Project Hail Mary."


def call(tool: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": "call_tool", "arguments": {"tool_name": tool, "arguments": arguments}}) \
        + "\n</tool_call>"


def managed_args(tiny_model_dir, scripted, tmp_path, **context):
    args = make_args(tiny_model_dir, scripted.url, tmp_path)
    settings = {"tools": True, "limit": 6000, "reserve": 256, "samples": "snapshot", "max_samples": 8, **context}
    for key, value in settings.items():
        setattr(args, f"awm_context_{key}", value)
    args.calculate_per_token_loss = True
    args.custom_generate_function_path, args.custom_rm_path = "awm_grpo.context.loop.generate", "awm_grpo.reward.reward"
    return args


def play(args, index: int = 0, evaluation: bool = False, group: int = 0) -> list[Sample]:
    meta = {"scenario": SCENARIO, "task_idx": 3, "task": "", "task_type": "state_mutating"}
    sample = Sample(index=index, group_index=group, prompt="", metadata=meta)

    async def go():
        out = await generate(args, sample, sampling_params_from_args(args), evaluation=evaluation)
        out = out if isinstance(out, list) else [out]
        for s in out:
            s.reward = await reward(args, s)
        return out

    return asyncio.run(go())


def rendered(args, tokenizer, messages: list[dict]) -> list[int]:
    from awm_grpo.context.loop import MEMORY_PREAMBLE

    encoder = chat_encoder(tokenizer, RolloutConfig.from_args(args), [], MEMORY_PREAMBLE)
    return encoder.encode(encoder.render(messages, add_generation_prompt=True))


def trained(sample: Sample) -> list[int]:
    response = sample.tokens[len(sample.tokens) - sample.response_length:]
    return [t for t, m in zip(response, sample.loss_mask, strict=True) if m]


def stub(msg_id: int, invoker: int, tool: str) -> dict:
    """A deleted tool result as the model reads it after the deletion (StateLM's fields)."""
    return {"role": "tool", "content": json.dumps({"msg_id": msg_id, "msg_id(invoking_assistant)": invoker,
                                                   "status": "deleted", "message": STUB, "original_tool": tool})}


def test_a_deletion_closes_a_snapshot_and_the_next_prompt_is_the_rerendered_conversation(
        tiny_model_dir, scripted, tokenizer, tmp_path):
    scripted.reset()
    args = managed_args(tiny_model_dir, scripted, tmp_path)
    # ids: 0 system, 1 task, 2 list_tools, 3 the catalogue, 4 deleteContext(3), 5 its result, 6 checkout, 7 result
    scripted.reply(LIST, call("deleteContext", msg_id=3), call("checkout_copy", copy_id=1), DONE)
    out = play(args)
    assert len(out) == 2
    final, snap = out
    requests, outputs = [r["input_ids"] for r in scripted.requests], list(scripted.outputs)
    # the snapshot: the first prompt, list_tools (trained), the catalogue (not), deleteContext (trained)
    assert snap.tokens[: len(requests[1])] == requests[1] and requests[1][: len(requests[0])] == requests[0]
    assert snap.tokens[len(requests[1]):] == outputs[1] and trained(snap) == outputs[0] + outputs[1]
    assert snap.response_length == len(snap.tokens) - len(requests[0])
    assert snap.rollout_log_probs == [LOGPROB if m else 0.0 for m in snap.loss_mask]
    assert snap.metadata["awm_segment"] == {"of": 0, "k": 1} and "awm_trace" not in snap.metadata
    # the next prompt is the conversation rendered again: the catalogue is a stub, the task has its notes block
    history = final.metadata["awm_trace"]["messages"]  # task, list_tools, catalogue, deleteContext, its result, ...
    assert json.loads(history[2]["content"])["msg_id"] == 3 and "checkout_copy" in history[2]["content"]
    assert json.loads(history[4]["content"])["msg_id(invoking_assistant)"] == 4
    prompt = requests[2]
    assert prompt == rendered(args, tokenizer, [history[0], history[1], stub(3, 2, "list_tools"), *history[3:5]])
    text = tokenizer.decode(prompt)
    assert STUB in text and "checkout_copy" not in text and "<external_memory>" in text
    # the final sample: that prompt, then checkout (trained), its result (not), the answer (trained)
    assert final.tokens[: len(prompt)] == prompt and final.response_length == len(final.tokens) - len(prompt)
    assert trained(final) == outputs[2] + outputs[3] and final.tokens[-len(outputs[3]):] == outputs[3]
    # one episode: one reward and one group for both samples
    assert final.metadata["awm"]["verdict"] == "complete" and [s.reward for s in out] == [1.0, 1.0]
    assert final.group_index == snap.group_index == 0 and snap.metadata["awm"] == final.metadata["awm"]
    ctx = final.metadata["awm"]["context"]
    assert ctx["deletions"] == 1 and ctx["samples"] == 2 and ctx["final_tokens"] == len(final.tokens)
    assert final.metadata["awm"]["turns"] == 4


def test_per_turn_mode_makes_one_sample_per_turn_each_under_the_context_it_was_sampled_from(
        tiny_model_dir, scripted, tokenizer, tmp_path):
    scripted.reset()
    args = managed_args(tiny_model_dir, scripted, tmp_path, samples="per_turn")
    scripted.reply(LIST, call("deleteContext", msg_id=3), call("checkout_copy", copy_id=1), DONE)
    out = play(args)
    final, *earlier = out
    ordered = [*earlier, final]
    requests, outputs = [r["input_ids"] for r in scripted.requests], list(scripted.outputs)
    assert len(ordered) == 4 == len(requests)
    for s, request, output in zip(ordered, requests, outputs, strict=True):
        assert s.tokens == request + output and s.response_length == len(output)
        assert s.loss_mask == [1] * len(output) and s.rollout_log_probs == [LOGPROB] * len(output)
    # without a deletion the next prompt extends the last; after one it is rendered again
    assert requests[1][: len(requests[0]) + len(outputs[0])] == requests[0] + outputs[0]
    assert requests[2][: len(requests[1])] != requests[1] and STUB in tokenizer.decode(requests[2])
    assert requests[3][: len(requests[2]) + len(outputs[2])] == requests[2] + outputs[2]
    assert [s.metadata["awm_segment"]["k"] for s in earlier] == [1, 2, 3]
    assert {s.reward for s in out} == {1.0} and {s.group_index for s in out} == {0}


def test_the_snapshot_cap_keeps_the_last_and_a_seeded_draw_of_the_others(tiny_model_dir, scripted, tmp_path):
    scripted.reset()
    args = managed_args(tiny_model_dir, scripted, tmp_path, samples="per_turn", max_samples=2)
    scripted.reply(LIST, call("deleteContext", msg_id=3), call("checkout_copy", copy_id=1), DONE)
    out = play(args)
    assert len(out) == 2 and out[0].metadata["awm"]["context"]["samples_made"] == 4
    assert out[0].tokens[-out[0].response_length:] == scripted.outputs[3]  # the last turn is always kept
    picks = [s for s in range(10) if keep_samples(list("abc"), 1, (0, s)) != keep_samples(list("abc"), 1, (0, 0))]
    assert picks and keep_samples(list("abc"), 1, (0, 3)) == keep_samples(list("abc"), 1, (0, 3))
    assert keep_samples(list("abc"), 5, (0, 0)) == list("abc")
    assert keep_samples(list("abcdef"), 3, (1, 2)) == sorted(keep_samples(list("abcdef"), 3, (1, 2)))


def test_the_budget_ends_an_episode_whose_observations_do_not_fit(tiny_model_dir, scripted, tokenizer, tmp_path):
    scripted.reset()
    args = managed_args(tiny_model_dir, scripted, tmp_path, tools=False, limit=1200, reserve=200)
    scripted.reply(LIST, call("checkout_copy", copy_id=1), DONE)  # the catalogue alone is over 1,000 tokens
    (only,) = play(args)
    assert only.metadata["awm"]["stop_reason"] == "context_budget" and only.status == Sample.Status.TRUNCATED
    assert len(scripted.requests) == 1 and len(only.tokens) + 200 <= 1200
    assert only.metadata["awm"]["context"]["deletions"] == 0 and only.metadata["awm"]["context"]["tools"] is False
    assert "deleteContext" not in tokenizer.decode(scripted.requests[0]["input_ids"])  # no memory tools offered


def test_evaluation_returns_only_the_last_sample(tiny_model_dir, scripted, tmp_path):
    scripted.reset()
    args = managed_args(tiny_model_dir, scripted, tmp_path)
    scripted.reply(LIST, call("deleteContext", msg_id=3), call("checkout_copy", copy_id=1), DONE)
    (only,) = play(args, evaluation=True)
    assert only.metadata["awm"]["context"]["samples_made"] == 2 and only.metadata["awm"]["verdict"] == "complete"


def test_bad_deletions_are_observations_and_delete_nothing(tiny_model_dir, scripted, tmp_path):
    scripted.reset()
    args = managed_args(tiny_model_dir, scripted, tmp_path)
    scripted.reply(call("deleteContext", msg_id=1), call("deleteContext", msg_id=99), DONE)
    (only,) = play(args)
    turns = only.metadata["awm_trace"]["turns"]
    assert all(t["calls"][0]["is_error"] for t in turns[:2]) and "cannot be deleted" in turns[0]["observations"][0]
    assert only.metadata["awm"]["context"]["deletions"] == 0 and only.metadata["awm"]["context"]["samples"] == 1


def test_config_is_checked(tmp_path):
    import argparse

    with pytest.raises(ValueError, match="context limit"):
        ContextConfig.from_args(argparse.Namespace(awm_context_tools=True))
    with pytest.raises(ValueError, match="larger than"):
        ContextConfig(limit=100, reserve=100)
    with pytest.raises(ValueError, match="per_turn"):
        ContextConfig(limit=1000, samples="every")
    args = argparse.Namespace(awm_context_tools=True, awm_context_limit=4000, awm_history_window_turns=2,
                              awm_credit_method="b1", calculate_per_token_loss=True)
    with pytest.raises(ValueError, match="cannot run with"):
        ContextConfig.from_args(args)


def test_slime_s_group_path_scores_every_sample_and_the_trainer_trains_on_them(tiny_model_dir, scripted, tmp_path):
    """As a training step runs it: slime's generate_and_rm_group, GRPO over the group's samples, a train step."""
    scripted.reset()
    args = managed_args(tiny_model_dir, scripted, tmp_path)
    meta = {"scenario": SCENARIO, "task_idx": 3, "task": "", "task_type": "state_mutating"}
    args.n_samples_per_prompt = 2
    out = []
    # the group's two episodes one after the other (the scripted engine answers in request order)
    for i, script in enumerate([(LIST, call("deleteContext", msg_id=3), call("checkout_copy", copy_id=1), DONE),
                                ("I could not do it.",)]):
        scripted.reply(*script)
        out += asyncio.run(generate_and_rm_group(args, [Sample(index=i, group_index=7, prompt="", metadata=dict(meta))],
                                                 sampling_params_from_args(args)))
    assert [(s.index, s.reward, "awm_segment" in s.metadata) for s in out] == [(0, 1.0, False), (0, 1.0, True),
                                                                              (1, 0.0, False)]
    assert {s.group_index for s in out} == {7}
    # StateLM's rule: every sample of the prompt's episodes is a member of the GRPO group
    adv = grpo_advantages(torch.tensor([s.reward for s in out]), torch.tensor([s.group_index for s in out]))
    assert sorted(adv.tolist())[0] < 0 < sorted(adv.tolist())[-1]
    trainer = TorchTrainer(str(tiny_model_dir), TrainerConfig(max_tokens_per_micro_batch=None))
    metrics = trainer.train_step(out, adv.tolist(), PolicyLossConfig(aggregation="token_mean"))
    assert metrics and all(v == v for v in metrics.values())


DOCUMENT = "\n".join(f"Record {i}: name Person {i}, email person{i}@example.org, city Town {i % 17}"
                     for i in range(400))


def play_document(args, reply: str) -> list[Sample]:
    """A document row as slime's loader gives it (StateLM's layout): messages, the reward_model label,
    extra_info plus the document in the metadata."""
    question = "What is the email of Person 137?"
    meta = {"index": 5, "question": question, "data_source": "test_docs", "document_content": DOCUMENT}
    sample = Sample(index=0, group_index=0, label={"style": "rule", "ground_truth": "person137@example.org"},
                    prompt=[{"role": "system", "content": "(the row's own system prompt)"},
                            {"role": "user", "content": question}], metadata=meta)

    async def go():
        out = await generate(args, sample, sampling_params_from_args(args))
        out = out if isinstance(out, list) else [out]
        for s in out:
            s.reward = await reward(args, s)
        return out

    return asyncio.run(go())


@pytest.mark.parametrize(("answer", "outcome", "score"), [("person137@example.org", "correct", 1.0),
                                                           ("person138@example.org", "wrong", -0.5),
                                                           (None, "no_answer", -1.0)])
def test_a_document_episode_uses_the_document_and_memory_tools_and_scores_as_statelm(
        tiny_model_dir, scripted, tokenizer, tmp_path, answer, outcome, score):
    scripted.reset()
    args = managed_args(tiny_model_dir, scripted, tmp_path, limit=3000)
    end = call("finish", answer=answer) if answer else "It is person137@example.org."  # a reply is no answer
    scripted.reply(call("analyzeText"), call("note", key="q", summary="asked for Person 137's email", content={}),
                   call("deleteContext", msg_id=3), end)
    out = play_document(args, end)
    final = out[0]
    awm = final.metadata["awm"]
    assert awm["scenario"] == "docqa:test_docs" and awm["task_idx"] == 5
    assert awm["verifier_result"]["outcome"] == outcome and {s.reward for s in out} == {score}
    first = tokenizer.decode(scripted.requests[0]["input_ids"])
    assert "What is the email of Person 137?" in first and "Record 137" not in first  # never in the prompt
    assert "(the row's own system prompt)" not in first and "finish(answer)" in first
    total = json.loads(final.metadata["awm_trace"]["messages"][2]["content"])["total_tokens"]
    assert total > 3000  # the document would not fit the context
    last = tokenizer.decode(scripted.requests[-1]["input_ids"])
    assert "- q: asked for Person 137's email" in last and STUB in last  # the notes block and the stub
    assert awm["context"]["deletions"] == 1 and awm["context"]["notes"] == 1 and len(out) == 2

"""B1's sliding-window history: the engine sees task + last K turns; each token trains under its own context.

Real runtime (bundled library_lending_1, task 3), the tiny model's tokenizer and chat template, the
scripted SGLang-protocol engine (it records the input ids of every request).
"""

from __future__ import annotations

import argparse
import asyncio
import json

import pytest
import yaml
from rollout_helpers import LOGPROB, make_args

from awm_grpo.launch import config as C
from awm_grpo.launch.job import check_against_slime, runtime_config, slime_command
from awm_grpo.recovery.plugin import advantages
from awm_grpo.reward import reward
from awm_grpo.rollout import RolloutConfig, chat_encoder, generate, window_messages
from slime.algorithms.losses import PolicyLossConfig
from slime.arguments import apply_custom_config
from slime.backends.torch_backend import TorchTrainer, TrainerConfig
from slime.rollout.sglang_rollout import GenerateState, sampling_params_from_args
from slime.utils.types import Sample

SCENARIO = "library_lending_1"
LIST = '<tool_call>\n{"name": "list_tools", "arguments": {}}\n</tool_call>'


def call(tool: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": "call_tool", "arguments": {"tool_name": tool, "arguments": arguments}}) \
        + "\n</tool_call>"


def play(args, index: int, evaluation: bool = False) -> Sample | list[Sample]:
    meta = {"scenario": SCENARIO, "task_idx": 3, "task": "", "task_type": "state_mutating"}
    sample = Sample(index=index, group_index=0, prompt="", metadata=meta)

    async def go():
        out = await generate(args, sample, sampling_params_from_args(args), evaluation=evaluation)
        for s in out if isinstance(out, list) else [out]:
            s.reward = await reward(args, s)
        return out

    return asyncio.run(go())


def test_window_keeps_the_task_and_the_last_k_turns():
    msgs = [{"role": "user", "content": "task"}, {"role": "assistant", "content": "a1"},
            {"role": "tool", "content": "t1"}, {"role": "assistant", "content": "a2"},
            {"role": "tool", "content": "t2a"}, {"role": "tool", "content": "t2b"},
            {"role": "assistant", "content": "a3"}, {"role": "tool", "content": "t3"}]
    assert window_messages(msgs, 2) == [msgs[0], *msgs[3:]]
    assert window_messages(msgs, 1) == [msgs[0], *msgs[6:]]
    assert window_messages(msgs, 3) == msgs


def test_knob_reaches_the_rollout_and_needs_b1(tmp_path):
    def rollout_config(env):
        path = tmp_path / "rt.yaml"
        path.write_text(yaml.safe_dump(runtime_config(C.resolve(None, gpus=[], env=env))))
        args = argparse.Namespace(calculate_per_token_loss=True)  # the launcher's flag with a window (below)
        apply_custom_config(args, str(path))
        return RolloutConfig.from_args(args)

    assert rollout_config({}).history_window_turns is None
    assert rollout_config({"AWM_HISTORY_WINDOW_TURNS": "3", "AWM_CREDIT_METHOD": "b1"}).history_window_turns == 3
    with pytest.raises(ValueError, match="needs awm_credit_method b1"):
        rollout_config({"AWM_HISTORY_WINDOW_TURNS": "3"})
    with pytest.raises(ValueError, match="use >= 1"):
        rollout_config({"AWM_HISTORY_WINDOW_TURNS": "0", "AWM_CREDIT_METHOD": "b1"})
    windowed = C.resolve(None, gpus=[], env={"AWM_HISTORY_WINDOW_TURNS": "3", "AWM_CREDIT_METHOD": "b1"})
    cmd = slime_command(windowed, tmp_path / "rt.yaml")
    assert "--calculate-per-token-loss" in cmd and check_against_slime(cmd) == []
    assert "--calculate-per-token-loss" not in slime_command(C.resolve(None, gpus=[], env={}), tmp_path / "rt.yaml")
    args = argparse.Namespace(awm_history_window_turns=3, awm_credit_method="b1")
    with pytest.raises(ValueError, match="--calculate-per-token-loss"):
        RolloutConfig.from_args(args)


def test_windowed_turns_train_in_their_own_samples_under_the_context_the_engine_saw(tiny_model_dir, scripted,
                                                                                    tokenizer, tmp_path):
    scripted.reset()
    args = make_args(tiny_model_dir, scripted.url, tmp_path, history_window_turns=1, credit_method="b1")
    args.calculate_per_token_loss = True
    # A: list tools, a failing return, an answer (turn 3 sees the task + turn 2 only); B: check out, answer
    scripted.reply(LIST, call("return_loan", loan_id=999, return_branch_id=1), "Done.")
    out = play(args, 0)
    assert isinstance(out, list) and len(out) == 2
    a, seg = out
    requests, outputs = [r["input_ids"] for r in scripted.requests], list(scripted.outputs)
    # turns 1-2: the full history, i.e. a prefix of the episode's sequence
    for r in requests[:2]:
        assert a.tokens[: len(r)] == r
    # turn 3: system + task + turn 2 re-rendered, not a prefix of the episode's sequence
    messages = a.metadata["awm_trace"]["messages"]
    encoder = chat_encoder(tokenizer, RolloutConfig.from_args(args), [])
    windowed = encoder.encode(encoder.render(window_messages(messages[:5], 1), add_generation_prompt=True))
    assert requests[2] == windowed and a.tokens[: len(windowed)] != windowed
    assert len(windowed) < len(a.tokens) - len(outputs[2])  # shorter than the full history it replaced
    # the episode's sample keeps every token (traces, budget) but trains only turns 1-2
    response_ids = a.tokens[len(a.tokens) - a.response_length:]
    trained = [t for t, m in zip(response_ids, a.loss_mask, strict=True) if m]
    assert trained == outputs[0] + outputs[1]
    assert response_ids[-len(outputs[2]):] == outputs[2] and a.loss_mask[-len(outputs[2]):] == [0] * len(outputs[2])
    # the segment: context = what the engine saw, response = turn 3 with its log-probs, no trace record
    assert seg.tokens == windowed + outputs[2] and seg.response_length == len(outputs[2])
    assert seg.loss_mask == [1] * len(outputs[2]) and seg.rollout_log_probs == [LOGPROB] * len(outputs[2])
    assert seg.metadata["awm_segment"] == {"of": 0, "k": 1} and "awm_trace" not in seg.metadata
    assert seg.reward == a.reward == 0.0 and seg.group_index == a.group_index
    # B1: one advantage per episode, over episodes (not samples); the segment gets its episode's
    scripted.reply(call("checkout_copy", copy_id=1), "Checked out copy LIB-000101 of Project Hail Mary.")
    b = play(args, 1)
    assert isinstance(b, Sample) and b.reward == 1.0  # two turns: never windowed
    adv = advantages(args, [a, seg, b])
    # rewards 0 vs 1 over 2 episodes: mean 0.5 (counting the segment would give 1/3); no std with
    # --n-samples-per-prompt 1, as slime's GRPO
    assert adv[0] == adv[1] == pytest.approx(-0.5) and adv[2] == pytest.approx(0.5)
    # the trainer (slime's torch backend, the tiny model) takes the three samples; turn 3's tokens have other
    # log-probs under the window than inside the full history: training them in the episode's sequence would
    # score them under a context they were not sampled from
    trainer = TorchTrainer(str(tiny_model_dir), TrainerConfig(max_tokens_per_micro_batch=None))
    lp = trainer.compute_log_probs([a, seg, b])
    assert [len(x) for x in lp] == [a.response_length, seg.response_length, b.response_length]
    assert lp[0][-len(outputs[2]):] != pytest.approx(lp[1], abs=1e-3)
    metrics = trainer.train_step([a, seg, b], adv, PolicyLossConfig(aggregation="token_mean"))
    assert all(v == v for v in metrics.values())  # finite, no NaN
    args.awm_credit_method = "b2"
    with pytest.raises(ValueError, match="b1 only"):
        advantages(args, [a, seg, b])


def test_a_windowed_episode_is_scored_through_slime_s_own_group_path(tiny_model_dir, scripted, tmp_path):
    """slime's generate_and_rm_group (as a training step calls it): a generate function that returns a
    list gets the reward function's batch form, so every sample of the episode is scored."""
    from slime.rollout.sglang_rollout import generate_and_rm_group

    scripted.reset()
    args = make_args(tiny_model_dir, scripted.url, tmp_path, history_window_turns=1, credit_method="b1")
    args.calculate_per_token_loss = True
    args.custom_generate_function_path, args.custom_rm_path = "awm_grpo.rollout.generate", "awm_grpo.reward.reward"
    scripted.reply(LIST, call("checkout_copy", copy_id=1), "Checked out copy LIB-000101 of Project Hail Mary.")
    meta = {"scenario": SCENARIO, "task_idx": 3, "task": "", "task_type": "state_mutating"}
    out = asyncio.run(generate_and_rm_group(args, [Sample(index=0, group_index=0, prompt="", metadata=meta)],
                                            sampling_params_from_args(args)))
    assert len(out) == 2 and "awm_segment" in out[1].metadata  # 3 turns: the third is windowed
    assert out[0].metadata["awm"]["verdict"] == "complete"
    assert [s.reward for s in out] == [1.0, 1.0]  # the segment is scored as its episode


def test_evaluation_uses_the_window_but_returns_one_sample(tiny_model_dir, scripted, tmp_path):
    scripted.reset()
    GenerateState.clear_instances()
    args = make_args(tiny_model_dir, scripted.url, tmp_path, history_window_turns=1, credit_method="b1")
    args.calculate_per_token_loss = True
    scripted.reply(LIST, call("return_loan", loan_id=999, return_branch_id=1), "Done.")
    out = play(args, 0, evaluation=True)
    assert isinstance(out, Sample) and out.metadata["awm"]["turns"] == 3
    assert not out.tokens[: len(scripted.requests[2]["input_ids"])] == scripted.requests[2]["input_ids"]

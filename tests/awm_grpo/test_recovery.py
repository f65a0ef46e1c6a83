"""The recovery method wired into the rollout and the trainer: per-turn progress, token spans, advantages.

Real runtime (bundled library_lending_1), real predicates built from its verifiers, the scripted
SGLang-protocol engine. Task 3: "check out the available copy of Project Hail Mary" (copy 1); its
progress predicates: an active loan of copy 1 exists, copy 1's status is on loan.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import sqlite3

import pytest
from rollout_helpers import make_args

from awm_grpo.recovery.credit import progress_rewards
from awm_grpo.recovery.plugin import advantages, credit_config, signals, trace_metrics
from awm_grpo.reward import reward
from awm_grpo.rollout import generate
from awm_grpo.traces import log_rollout
from slime.algorithms.estimators import builtin_advantages
from slime.rollout.sglang_rollout import sampling_params_from_args
from slime.utils.types import Sample

SCENARIO = "library_lending_1"
LIST = '<tool_call>\n{"name": "list_tools", "arguments": {}}\n</tool_call>'


def call(tool: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": "call_tool", "arguments": {"tool_name": tool, "arguments": arguments}}) \
        + "\n</tool_call>"


@pytest.fixture(scope="module")
def predicates(tmp_path_factory):
    from awm.predicates.build import build, write_predicates

    path = tmp_path_factory.mktemp("preds") / "predicates.jsonl"
    write_predicates(asyncio.run(build(None, scenarios=[SCENARIO])), path)
    return str(path)


@pytest.fixture
def engine(scripted):
    scripted.reset()
    return scripted


def play(args, index: int, metadata: dict | None = None, task_idx: int = 3) -> Sample:
    meta = {"scenario": SCENARIO, "task_idx": task_idx, "task": "", "task_type": "state_mutating", **(metadata or {})}
    sample = Sample(index=index, group_index=0, prompt="", metadata=meta)

    async def go() -> Sample:
        out = await generate(args, sample, sampling_params_from_args(args))
        out.reward = await reward(args, out)
        return out

    return asyncio.run(go())


def dip_and_recover_then_direct(args, engine) -> tuple[Sample, Sample]:
    """A: check out, return it (Phi dips), check out again, answer (verifier: not complete). B: check out, answer."""
    engine.reply(LIST, call("checkout_copy", copy_id=1), call("return_loan", loan_id=14, return_branch_id=1),
                 call("checkout_copy", copy_id=1), "Done.")
    a = play(args, 0)
    engine.reply(call("checkout_copy", copy_id=1), "Checked out copy LIB-000101 of Project Hail Mary.")
    b = play(args, 1)
    return a, b


def test_rollout_records_phi_per_turn_and_spans_that_cover_exactly_the_model_tokens(tiny_model_dir, engine, tmp_path,
                                                                                     predicates):
    args = make_args(tiny_model_dir, engine.url, tmp_path, predicates=predicates)
    a, b = dip_and_recover_then_direct(args, engine)
    credit = a.metadata["awm"]["credit"]
    assert credit["phi0"] == 0.0 and credit["phi"] == [0.0, 1.0, 0.0, 1.0, 1.0]
    assert credit["write"] == [False, True, True, True, False]  # list_tools and the answer are not writes
    assert credit["fmt"] == [False] * 5 and credit["error"] == [False] * 5
    covered = [0] * a.response_length
    for (start, end), out in zip(credit["span"], engine.outputs[:5], strict=True):
        assert a.tokens[len(a.tokens) - a.response_length + start:][: end - start] == out
        covered[start:end] = [1] * (end - start)
    assert covered == a.loss_mask  # spans = the model tokens, nothing else
    assert b.metadata["awm"]["verdict"] == "complete" and b.metadata["awm"]["credit"]["phi"] == [1.0, 1.0]
    rec = a.metadata["awm_trace"]["recovery"]
    assert rec["task_type"] == "state_mutating" and rec["predicates"] == 2 and rec["preservation_end"]
    assert set(a.metadata["awm_trace"]["turns"][2]["progress"]["rows"]["loans"]["updated"]) == {"[14]"}


def test_method_advantages_reach_each_turns_tokens_with_hand_computed_values(tiny_model_dir, engine, tmp_path,
                                                                              predicates):
    args = make_args(tiny_model_dir, engine.url, tmp_path, predicates=predicates)
    a, b = dip_and_recover_then_direct(args, engine)
    args.awm_credit_method, args.awm_credit_lambda, args.awm_credit_beta, args.awm_credit_eta = "ours", 0.5, 0.0, 0.9
    adv_a, adv_b = advantages(args, [a, b])
    # A: r = 0.5 x [0, 1, -1, 1, 0] (outcome 0); G = [.4095, .455, -.05, .5, 0]
    # B: r = [0.5, 1]; G = [1.4, 1.0]; carried: [1.4, 1, 1, 1, 1]; leave-one-out baselines = the other rollout
    expected_a = [0.4095 - 1.4, 0.455 - 1.0, -0.05 - 1.0, 0.5 - 1.0, 0.0 - 1.0]
    expected_b = [1.4 - 0.4095, 1.0 - 0.455]
    for sample, adv, expected in ((a, adv_a, expected_a), (b, adv_b, expected_b)):
        assert len(adv) == sample.response_length
        for (start, end), value in zip(sample.metadata["awm"]["credit"]["span"], expected, strict=True):
            assert adv[start:end] == pytest.approx([value] * (end - start), abs=1e-6)  # float32 tensors
        assert all(v == 0.0 for v, m in zip(adv, sample.loss_mask, strict=True) if m == 0)  # observations get 0
        assert set(sample.loss_mask) == {0, 1}  # the mask stays a mask


def test_b1_equals_plain_grpo_and_failures_stay_out(tiny_model_dir, engine, tmp_path, predicates):
    args = make_args(tiny_model_dir, engine.url, tmp_path, predicates=predicates)
    a, b = dip_and_recover_then_direct(args, engine)
    failed = Sample(index=2, group_index=0, response_length=3, loss_mask=[0, 0, 0], reward=0.0,
                    status=Sample.Status.FAILED, remove_sample=True,
                    metadata={"awm": {"turns": 1, "infra_error": "worker died"}})
    args.awm_credit_method, args.advantage_estimator, args.n_samples_per_prompt = "b1", "grpo", 2
    ours = advantages(args, [a, b, failed])
    plain = builtin_advantages(args, [a, b, failed])
    assert ours == pytest.approx(plain) and ours[2] == 0.0
    assert ours[0] == pytest.approx(-(2 ** 0.5) / 2, abs=1e-5)  # rewards 0 / 1: (0 - 0.5) / std(Bessel) 0.707
    args.awm_credit_method = "ours"  # per-token methods give the failure one zero per token
    assert advantages(args, [a, b, failed])[2] == [0.0, 0.0, 0.0]


def test_methods_that_need_progress_refuse_without_predicates(tiny_model_dir, engine, tmp_path):
    args = make_args(tiny_model_dir, engine.url, tmp_path)
    engine.reply(call("checkout_copy", copy_id=1), "ok")
    s = play(args, 0)
    args.awm_credit_method = "ours"
    with pytest.raises(ValueError, match="awm_predicates"):
        advantages(args, [s, s])
    args.awm_credit_method = "b1"
    assert advantages(args, [s]) == [0.0]


def test_rollout_log_hook_reports_recovery_metrics_by_task_type(tiny_model_dir, engine, tmp_path, predicates):
    args = make_args(tiny_model_dir, engine.url, tmp_path, predicates=predicates)
    a, b = dip_and_recover_then_direct(args, engine)
    metrics = log_rollout(0, args, [a, b])
    assert metrics["awm/recovery/all/SR"] == 0.5
    assert metrics["awm/recovery/state_mutating/DSR"] == pytest.approx(1 / 4)  # 1 of 4 writes lowered Phi
    assert metrics["awm/recovery/state_mutating/RR"] == 0.0  # the only troubled episode failed
    assert metrics["awm/recovery/all/progress_patterns/dip_and_fail"] == 1.0
    assert metrics["awm/recovery/all/progress_patterns/monotonic_success"] == 1.0


def test_episode_starts_from_a_loaded_state_and_a_conversation_prefix(tiny_model_dir, engine, tmp_path, predicates):
    args = make_args(tiny_model_dir, engine.url, tmp_path, predicates=predicates)
    # a damaged start state: copy 1 checked out (loan 14), then returned by mistake
    engine.reply(call("checkout_copy", copy_id=1), call("return_loan", loan_id=14, return_branch_id=1), "stop")
    first = play(args, 0)
    turns = first.metadata["awm_trace"]["turns"]
    from awm.episode import EnvRuntime

    async def damaged() -> str:
        with EnvRuntime(num_workers=1) as rt:
            ep = await rt.open(SCENARIO, 3)
            await ep.call("checkout_copy", {"copy_id": 1})
            await ep.call("return_loan", {"loan_id": 14, "return_branch_id": 1})
            dest = tmp_path / "damaged.db"
            shutil.copyfile((await ep.snapshot()).path, dest)
            await ep.close()
            return str(dest)

    start_db = asyncio.run(damaged())
    prefix = [{"role": "assistant", "content": turns[0]["assistant"]},
              {"role": "tool", "content": turns[0]["observations"][0]},
              {"role": "assistant", "content": turns[1]["assistant"]},
              {"role": "tool", "content": turns[1]["observations"][0]}]
    engine.reset()
    engine.reply(call("checkout_copy", copy_id=1), "Checked out again.")
    s = play(args, 1, {"start_db": start_db, "start_messages": prefix})
    prompt = engine.tok.decode(engine.requests[0]["input_ids"])
    assert "return_loan" in prompt and prompt.endswith("<|im_start|>assistant\n")
    assert s.response_length == len(s.loss_mask) and s.metadata["awm"]["turns"] == 2
    obs = s.metadata["awm_trace"]["turns"][0]["observations"][0]
    assert '"id": 15' in obs  # the loaded DB already had loan 14
    rec = s.metadata["awm_trace"]["recovery"]
    assert rec["prefix_turns"] == 2 and rec["phi0"] == 0.0 and rec["credit"]["phi"] == [1.0, 1.0]
    assert s.metadata["awm"]["drift_tokens"] == 0
    m = trace_metrics([s.metadata["awm_trace"]], "split")
    assert m["split/all/additional_damage"] == 0.0 and m["split/all/verification_first_rate"] == 0.0
    with sqlite3.connect(start_db) as conn:  # the split's file itself is left untouched
        assert conn.execute("SELECT COUNT(*) FROM loans WHERE id = 15").fetchone()[0] == 0


def handmade(index: int, credit: dict, verdict: str = "others") -> Sample:
    """A finished rollout with hand-written per-turn signals (one token per turn, no observations)."""
    T = len(credit["phi"])
    full = {"span": [[t, t + 1] for t in range(T)], "write": [True] * T, "error": [False] * T, "fmt": [False] * T,
            "rel_read": [False] * T, "ok": [True] * T, "rel_tool": [True] * T, "phi0": 0.0, "phi0_b": 0.0, **credit}
    return Sample(index=index, group_index=0, response_length=T, loss_mask=[1] * T, reward=0.0,
                  status=Sample.Status.COMPLETED, metadata={"awm": {"turns": T, "verdict": verdict, "credit": full}})


def test_switches_binary_only_verification_bonus_and_format_term():
    from slime.arguments import parse_args as slime_args

    args = slime_args(["--hf-checkpoint", "m", "--prompt-data", "p", "--rollout-batch-size", "1",
                       "--n-samples-per-prompt", "2", "--num-rollout", "1"])
    args.awm_credit_method, args.awm_credit_lambda, args.awm_credit_eta = "ours", 1.0, 1.0
    # a scalar predicate halfway there: Phi = 0.5, Phi_b = 0 (it counts only when met exactly)
    a = handmade(0, {"phi": [0.5], "phi_b": [0.0]})
    b = handmade(1, {"phi": [0.0], "phi_b": [0.0]})
    assert advantages(args, [a, b]) == [[0.5], [-0.5]]
    args.awm_credit_binary_only = True
    assert advantages(args, [a, b]) == [[0.0], [0.0]]
    # verification bonus: an error at turn 1, then a relevant read at turn 2 earns beta
    args.awm_credit_binary_only = False
    c = handmade(0, {"phi": [0.0, 0.0], "phi_b": [0.0, 0.0], "write": [True, False], "error": [True, False],
                     "rel_read": [False, True], "ok": [False, True]})
    d = handmade(1, {"phi": [0.0, 0.0], "phi_b": [0.0, 0.0]})
    args.awm_credit_beta = 0.05
    assert advantages(args, [c, d])[0] == pytest.approx([0.05, 0.05])  # G = [0.05, 0.05] vs 0
    args.awm_credit_beta = 0.0
    assert advantages(args, [c, d])[0] == [0.0, 0.0]
    # format term: -1 once, on the first invalid turn (as reward.py charges it)
    e = handmade(0, {"phi": [0.0, 0.0], "phi_b": [0.0, 0.0], "fmt": [True, True]})
    args.awm_credit_method = "traj_agg"
    totals = advantages(args, [e, d])
    assert totals[0] == pytest.approx(-(2 ** 0.5) / 2, abs=1e-5)  # rewards -1 vs 0
    args.awm_invalid_call_penalty = -0.5
    with pytest.raises(ValueError, match="R_fmt = -1"):
        advantages(args, [e, d])


def test_progress_predicates_refuse_the_mcp_transport():
    from awm_grpo.env_client import EnvConfig
    from awm_grpo.rollout import RolloutConfig

    with pytest.raises(ValueError, match="inprocess"):
        RolloutConfig(env=EnvConfig(transport="mcp", mcp_urls=("http://127.0.0.1:1",)), predicates="p.jsonl")


def test_step_metrics_count_the_tasks_that_got_progress_credit(tiny_model_dir, engine, tmp_path, predicates, caplog):
    """Task 3 (two rollouts whose writes move Phi), task 4 (a write that leaves its predicates where they were),
    task 0 (info seeking): 1 of 2 state-mutating tasks with predicates got R_prog != 0, 2 of its 3 episodes."""
    args = make_args(tiny_model_dir, engine.url, tmp_path, predicates=predicates)
    a, b = dip_and_recover_then_direct(args, engine)
    engine.reply(call("checkout_copy", copy_id=1), "Done.")  # task 4 asks for a renewal of loan 1
    c = play(args, 2, task_idx=4)
    engine.reply(LIST, "Nothing to do.")
    d = play(args, 3, {"task_type": "info_seeking"}, task_idx=0)
    samples = [a, b, c, d]
    # the credit path's own R_prog (difference form) on the samples the trainer gets
    cfg, _ = credit_config(args)
    moved = {}
    for s in samples:
        sig = signals(args, s, cfg)
        key = s.metadata["task_idx"]
        moved[key] = moved.get(key, False) or any(r != 0 for r in progress_rewards(sig.phis, sig.is_write))
    assert moved == {3: True, 4: False, 0: False}
    assert c.metadata["awm"]["credit"]["write"][0] and c.metadata["awm_trace"]["recovery"]["predicates"] == 2
    with caplog.at_level(logging.INFO, logger="awm_grpo"):
        metrics = log_rollout(0, args, samples)
    assert metrics["awm/recovery/progress_sm_tasks"] == 2.0 and metrics["awm/recovery/progress_tasks"] == 2.0
    assert metrics["awm/recovery/progress_write_tasks"] == 2.0  # task 4's checkout changed the DB too
    assert metrics["awm/recovery/progress_credit_tasks"] == 1.0
    assert metrics["awm/recovery/progress_credit_task_rate"] == 0.5
    assert metrics["awm/recovery/progress_credit_episode_rate"] == round(2 / 3, 4)
    assert "| progress credit 1/2 mutating tasks" in caplog.text
    rows = (tmp_path / "traces" / "rollout_000000.jsonl").read_text().splitlines()
    assert sorted(json.loads(r)["task_idx"] for r in rows) == [0, 3, 3, 4]

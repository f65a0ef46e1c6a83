"""The controlled recovery split: damaged states built from wrong writes or a recorded episode's damaging
write, and a policy (the scripted SGLang-protocol engine) evaluated from them through the real rollout."""

from __future__ import annotations

import asyncio
import json
import sqlite3

import pytest

from awm_grpo.recovery import split as recovery_split

SCENARIO = "library_lending_1"


def call(tool: str, **arguments) -> str:
    return recovery_split.call_text(tool, arguments, "meta")


@pytest.fixture(scope="module")
def predicates(tmp_path_factory):
    from awm.predicates.build import build, write_predicates

    path = tmp_path_factory.mktemp("preds") / "predicates.jsonl"
    write_predicates(asyncio.run(build(None, scenarios=[SCENARIO])), path)
    return str(path)


@pytest.fixture(scope="module")
def split(tmp_path_factory, predicates):
    out = tmp_path_factory.mktemp("split")
    manifest = asyncio.run(recovery_split.build(out, data_dir=None, predicates=predicates, scenarios=[SCENARIO],
                                                tool_mode="meta", weak_traces=[], max_per_task=2, max_chars=2000))
    return out, manifest


def rows(split_dir) -> list[dict]:
    return [json.loads(line) for line in (split_dir / "split.jsonl").read_text().splitlines()]


def test_wrong_write_handovers_snapshot_the_damaged_db_and_the_conversation(split):
    out, manifest = split
    # every state-mutating task of the scenario (3..9) with a wrong write the reference never makes
    assert manifest["handovers"] == len(rows(out)) == 8 and manifest["tasks"] == 7
    task3 = next(r["metadata"] for r in rows(out) if r["metadata"]["task_idx"] == 3)
    # reference reads before its first write (search_books, get_book_details), then the wrong checkout
    assert [c["tool"] for c in task3["handover"]["calls"]] == ["search_books", "get_book_details", "checkout_copy"]
    assert task3["handover"]["calls"][-1]["arguments"] == {"copy_id": 3}
    assert task3["handover"]["kind"] == "wrong_write" and task3["handover"]["phi_after"] == 0.0
    msgs = task3["start_messages"]
    assert [m["role"] for m in msgs] == ["assistant", "tool"] * 4 and "list_tools" in msgs[0]["content"]
    assert '"copy_id": 3' in msgs[-2]["content"] and '"status": "active"' in msgs[-1]["content"]
    with sqlite3.connect(out / task3["start_db"]) as conn:
        assert conn.execute("SELECT COUNT(*) FROM loans WHERE copy_id = 3 AND status = 'active'").fetchone()[0] == 1
    # finishing the reference plan on top of the damage fails here (loan limit): a repair is needed
    assert task3["handover"]["reference_completion"] == "others"
    kinds = {(r["metadata"]["task_idx"], r["metadata"]["handover"]["kind"]) for r in rows(out)}
    assert (8, "error") in kinds  # a wrong place_hold that the environment refused


def test_recorded_episode_handover_is_judged_by_the_predicates_now_not_the_recorded_phi(tmp_path, predicates):
    # the trace claims Phi never moved (as if recorded with other predicates); replayed, the return lowers it
    trace = {"scenario": SCENARIO, "task_idx": 3, "infra_error": None,
             "turns": [{"calls": [{"name": "list_tools", "arguments": {}, "catalogue": True}]},
                       {"calls": [{"name": "checkout_copy", "arguments": {"copy_id": 1}, "is_error": False}]},
                       {"calls": [{"name": "return_loan", "arguments": {"loan_id": 14, "return_branch_id": 1},
                                   "is_error": False}]},
                       {"calls": [{"name": "checkout_copy", "arguments": {"copy_id": 1}, "is_error": False}]}],
             "recovery": {"credit": {"phi0": 0.0, "phi": [0.0, 0.0, 0.0, 0.0]}}}
    path = tmp_path / "episodes.jsonl"
    path.write_text(json.dumps(trace) + "\n")
    # weak_traces: the old name of `episodes`; episodes_only: no wrong writes of the bundled references
    manifest = asyncio.run(recovery_split.build(tmp_path / "split", data_dir=None, predicates=predicates,
                                                scenarios=None, tool_mode="meta", weak_traces=[str(path)],
                                                max_per_task=2, max_chars=2000, episodes_only=True))
    assert manifest["kinds"] == {"recorded_episode/negative_progress": 1}
    assert manifest["reference_solutions"] is False and manifest["episodes"]["outcomes"] == {"handover": 1}
    meta = rows(tmp_path / "split")[0]["metadata"]
    assert [c["tool"] for c in meta["handover"]["calls"]] == ["checkout_copy", "return_loan"]
    assert meta["handover"]["phi_before"] == 1.0 and meta["handover"]["phi_after"] == 0.0
    assert meta["handover"]["episode"] == f"{path}:1"


def test_a_policy_trained_with_b1_s_window_is_evaluated_in_its_window(split, tiny_model_dir, scripted):
    """compare's b1_window arm: the evaluation's engine sees the task and the last 3 turns, not the
    handover's whole prefix (4 model turns), as in training."""
    from awm_grpo.recovery.compare import acting_keys

    out, _ = split
    assert acting_keys("b1") == {} and acting_keys("base") == {}
    seen = {}
    for name in ("b1", "b1_window"):
        scripted.reset()
        _, records = recovery_split.evaluate(out, model=str(tiny_model_dir), engine_url=scripted.url, concurrency=1,
                                             tasks={(SCENARIO, 8)}, limit=1, runtime=acting_keys(name))
        assert len(records) == 1 and records[0]["recovery"]["prefix_turns"] == 4
        seen[name] = scripted.tok.decode(scripted.requests[0]["input_ids"])
    prefix = seen["b1"].split("<|im_start|>assistant")[1:]  # the prefix's 4 model turns, then the generation prompt
    assert len(prefix) == 5 and seen["b1_window"].count("<|im_start|>assistant") == 4
    assert prefix[0].split("<|im_end|>")[0] not in seen["b1_window"]
    assert all(p.split("<|im_end|>")[0] in seen["b1_window"] for p in prefix[1:4])


def test_evaluate_plays_from_each_handover_and_reports_recovery_metrics(split, tiny_model_dir, scripted):
    out, _ = split
    scripted.reset()
    # task 8 has two handovers (wrong cancel_hold; refused place_hold): the policy checks the holds,
    # then makes the reference's fix
    for _ in range(2):
        scripted.reply(call("list_my_holds", status="waiting"), call("update_hold", hold_id=1, pickup_branch_id=2),
                       "Your hold now picks up at the Riverside Branch.")
    metrics, records = recovery_split.evaluate(out, model=str(tiny_model_dir), engine_url=scripted.url,
                                               concurrency=1, tasks={(SCENARIO, 8)})
    assert len(records) == 2 and all(r["recovery"]["prefix_turns"] == 4 for r in records)
    by_kind = {json.dumps(r["turns"][0]["calls"][0]["arguments"]): r for r in records}
    assert len(by_kind) == 1  # both start with the same read
    verdicts = sorted(r["verdict"] for r in records)
    # after the refused place_hold nothing changed: the fix completes the task; after a cancelled hold it cannot
    assert verdicts == ["complete", "others"]
    m = metrics["state_mutating"]
    assert m["recovery_success"]["rate"] == 0.5
    assert m["verification_first_rate"]["rate"] == 1.0  # list_my_holds reads the predicates' table
    assert m["additional_damage"]["rate"] == 0.0
    table = recovery_split.summarize([metrics, metrics])
    assert table["state_mutating"]["recovery_success"] == (0.5, 0.0, 2)

"""The recovery testbed (awm_grpo.recovery.testbed): held-out worlds, observable damage, repairable states.

Built for real (original scenarios + two renamed worlds): AWM data folder, prompts, the controlled
split with its snapshots, replayed by the real runtime and judged by the real verifiers.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pytest

from awm_grpo.recovery import testbed


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("testbed")
    testbed.build(out, worlds=2)
    return out


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_the_data_folder_holds_only_the_repair_families_renumbered(built):
    sols = rows(built / "data" / "reference_solutions.jsonl")
    assert {(r["scenario"].split("_w")[0], r["family"]) for r in sols} == \
        set(testbed.REPAIR_FAMILIES.items()) | set(testbed.COMPANION_FAMILIES.items())
    assert not {r["family"] for r in sols if r["wrong_calls"]} & set(testbed.COMPANION_FAMILIES.values())
    tasks = {r["scenario"]: r["tasks"] for r in rows(built / "data" / "gen_tasks.jsonl")}
    for scenario, texts in tasks.items():
        assert sorted(r["task_idx"] for r in sols if r["scenario"] == scenario) == list(range(len(texts)))
    assert len(tasks) == 12  # 4 scenarios x (original + 2 worlds)


def test_held_out_worlds_are_never_trained(built):
    info = json.loads((built / "testbed.json").read_text())
    train = rows(built / "prompts" / "train.jsonl")
    test = rows(built / "prompts" / "test.jsonl")
    assert info["held_out_worlds"] == [0, 2] and info["prompts"] == {"train": 32, "val": 0, "test": 64}
    assert {r["metadata"].get("world", 0) for r in test} == {0, 2} and {r["metadata"]["world"] for r in train} == {1}
    names = {r["metadata"]["scenario"] for r in train}
    assert not names & {r["metadata"]["scenario"] for r in test}  # held-out worlds: other names everywhere
    assert testbed.held_out_worlds(0) == [0] and testbed.held_out_worlds(6) == [0, 6]


def test_every_handover_shows_the_agent_s_own_wrong_write_and_a_second_write_repairs_it(built):
    from awm.episode import EnvRuntime
    from awm.solutions import load_solutions

    split = rows(built / "split" / "split.jsonl")
    manifest = json.loads((built / "split" / "manifest.json").read_text())
    assert manifest["handovers"] == len(split) == 60 and manifest["skipped_already_complete"] == 0
    assert manifest["list_tools"] is False and manifest["read_back"] is True
    assert manifest["reference_completion"] == {"complete": 60}
    sols = load_solutions(str(built / "data"))
    runtime = EnvRuntime(str(built / "data"), num_workers=1)

    async def check(meta: dict) -> None:
        sol = sols[(meta["scenario"], meta["task_idx"])]
        calls = meta["handover"]["calls"]  # the reference's reads, the wrong write, the reads again (read-back)
        reads = sol.calls[:-1]
        assert calls == reads + [calls[len(reads)]] + reads and calls[len(reads)] in sol.wrong_calls
        wrong = calls[len(reads)]
        msgs = meta["start_messages"]
        assert [m["role"] for m in msgs] == ["assistant", "tool"] * len(calls)
        write_call, write_result = msgs[2 * len(reads)], msgs[2 * len(reads) + 1]
        assert wrong["tool"] in write_call["content"] and reads[0]["tool"] in msgs[-2]["content"]
        shown = next(v for k, v in wrong["arguments"].items() if not k.endswith("_id") or k == "home_branch_id")
        assert str(shown) in write_result["content"]  # the damage is visible in the tool's result
        assert "list_tools" not in msgs[0]["content"]
        db = built / "split" / meta["start_db"]
        ep = await runtime.open(meta["scenario"], meta["task_idx"])
        try:  # the damaged snapshot fails the task; the reference write on top of it repairs it
            ep_db = Path(ep.db_path)
            src, dst = sqlite3.connect(db), sqlite3.connect(ep_db)
            src.backup(dst)
            src.close()
            dst.close()
            assert (await ep.verify(sol.final_answer)).verdict != "complete"
            fix = sol.calls[-1]
            await ep.call(fix["tool"], fix["arguments"])
            assert (await ep.verify(sol.final_answer)).verdict == "complete"
        finally:
            await ep.close()

    async def all_checks() -> None:
        for r in split[::5]:
            await check(r["metadata"])

    try:
        asyncio.run(all_checks())
    finally:
        runtime.close()


def test_every_companion_instance_is_solved_by_its_reference_and_not_by_the_untouched_db(built):
    """The testbed-only families are not in the practice set, so tests/awm/test_families.py never replays them."""
    from awm.episode import EnvRuntime
    from awm.solutions import load_solutions

    sols = {k: s for k, s in load_solutions(str(built / "data")).items()
            if s.family in testbed.COMPANION_FAMILIES.values()}
    assert len({s.family for s in sols.values()}) == 3 and len(sols) >= 30
    runtime = EnvRuntime(str(built / "data"), num_workers=1)

    async def replay_all() -> list[str]:
        bad = []
        for (scenario, idx), sol in sorted(sols.items()):
            async with await runtime.open(scenario, idx) as ep:
                if (await ep.verify(sol.final_answer)).verdict == "complete":
                    bad.append(f"{scenario}/{idx}: complete untouched")
                for call in sol.calls:
                    obs = await ep.call(call["tool"], call["arguments"])
                    if obs.is_error:
                        bad.append(f"{scenario}/{idx}: {call['tool']} failed: {obs.text[:200]}")
                if (await ep.verify(sol.final_answer)).verdict != "complete":
                    bad.append(f"{scenario}/{idx}: reference not accepted")
        return bad

    try:
        assert asyncio.run(replay_all()) == []
    finally:
        runtime.close()


def test_the_warm_start_s_rechecks_verify_on_every_train_task_and_show_the_handover_s_shape(built, tiny_model_dir):
    """`--recheck-writes` on the testbed: each recheck (reads, write, reads, the same write) is accepted,
    so the start learns that a write may follow a write's read-back without ever seeing a repair."""
    from awm_grpo.warmstart.sft import collect
    from slime.arguments import parse_args

    assert f"--recheck-writes {testbed.RECHECK_WRITES}" in " ".join(testbed.warm_start_command(built))
    prompts = rows(built / "prompts" / "train.jsonl")
    args = parse_args(["--hf-checkpoint", str(tiny_model_dir), "--prompt-data", "unused.jsonl",
                       "--rollout-batch-size", "1", "--num-rollout", "1", "--rollout-max-response-len", "2048"])
    args.awm_tool_mode, args.awm_data_dir, args.awm_env_workers = "meta", str(built / "data"), 1
    args.awm_max_observation_tokens, args.awm_max_turns = 256, 64
    episodes = asyncio.run(collect(args, prompts, str(built / "data"), list_tools=False, recheck=1.0))
    assert episodes.rechecks == len(prompts) and len(episodes.real) == 2 * len(prompts)
    assert all(s.metadata["awm"]["verdict"] == "complete" for s in episodes.real)

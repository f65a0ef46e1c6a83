"""The recovery split without reference solutions: handovers from recorded episodes of real rollouts.

The bundled data is copied without reference_solutions.jsonl (as AWM-1K ships it); episodes are played
by the scripted engine through the training rollout without progress predicates, and the trace file
training writes (traces/rollout_000000.jsonl) is the split's input. The split judges each episode's
writes by the predicates given now. The AWM-1K excerpt gives an empty split with a reason per task.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sqlite3
from pathlib import Path

import pytest
from rollout_helpers import make_args

from awm_grpo.recovery import split as recovery_split
from awm_grpo.reward import reward
from awm_grpo.rollout import generate
from awm_grpo.traces import log_rollout
from slime.rollout.sglang_rollout import sampling_params_from_args
from slime.utils.types import Sample

SCENARIO = "library_lending_1"
LIST = '<tool_call>\n{"name": "list_tools", "arguments": {}}\n</tool_call>'
EXCERPT = Path(__file__).resolve().parents[2].parent / "shared" / "awm_1k_excerpt"
STAGES = ("gen_scenario", "gen_tasks", "gen_db", "gen_sample", "gen_envs", "gen_spec",
          "gen_verifier.pure_code")


def call(tool: str, **arguments) -> str:
    return recovery_split.call_text(tool, arguments, "meta")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> str:
    """The bundled scenarios as AWM-1K ships data: no reference solutions, no tool probes."""
    from awm.data import bundled_data_dir

    dest = tmp_path_factory.mktemp("data") / "no_solutions"
    shutil.copytree(bundled_data_dir(), dest, ignore=shutil.ignore_patterns("reference_solutions.jsonl",
                                                                            "tool_probes.jsonl"))
    return str(dest)


@pytest.fixture(scope="module")
def predicates(tmp_path_factory) -> str:
    """The predicates file given to the split (built here from the bundled data)."""
    from awm.predicates.build import build, write_predicates

    path = tmp_path_factory.mktemp("preds") / "predicates.jsonl"
    write_predicates(asyncio.run(build(None, scenarios=[SCENARIO])), path)
    return str(path)


EPISODES = [  # (task_idx, scripted model turns)
    (3, [LIST, call("checkout_copy", copy_id=1), call("return_loan", loan_id=14, return_branch_id=1),
         call("checkout_copy", copy_id=1), "Done."]),  # Phi 0 -> 1 -> 0: the return is the damage
    (3, [call("checkout_copy", copy_id=1), "Checked out copy LIB-000101."]),  # no damaging write
    (8, [call("list_my_holds", status="waiting"), call("return_loan", loan_id=1, return_branch_id=1),
         "Done."]),  # returns a loan the task must leave alone: a preservation predicate breaks
    (8, [call("cancel_hold", hold_id=1), "Cancelled."]),  # wrong, but neither Phi nor preservation shows it
    (6, [call("place_hold", book_id=4, pickup_branch_id=99),  # the environment refuses this write
         call("place_hold", book_id=4, pickup_branch_id=3), "Placed."]),
    (0, [call("search_books", query="The Left Hand of Darkness"), "Two."]),  # info-seeking
    (3, [call("checkout_copy", copy_id=1), call("return_loan", loan_id=14, return_branch_id=1), "Done."]),
    (4, [call("list_my_loans", status="active"), "Nothing to do."]),  # no write
    (3, [call("checkout_copy", copy_id=1), call("place_hold", book_id=1, pickup_branch_id=99),
         "Done."]),  # a refused write after the task is done: the verifier accepts that state, no handover
]


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory, data_dir, tiny_model_dir, scripted) -> Path:
    """Rollouts of EPISODES through the training rollout, written by training's log hook."""
    from awm_grpo import env_client
    from slime.rollout.sglang_rollout import GenerateState

    tmp = tmp_path_factory.mktemp("run")
    args = make_args(tiny_model_dir, scripted.url, tmp, data_dir=data_dir)
    samples = []
    try:
        for i, (task_idx, turns) in enumerate(EPISODES):
            scripted.reset()
            scripted.reply(*turns)
            meta = {"scenario": SCENARIO, "task_idx": task_idx, "task": "", "task_type": None}
            sample = Sample(index=i, group_index=i, prompt="", metadata=meta)

            async def go(sample: Sample = sample) -> Sample:
                out = await generate(args, sample, sampling_params_from_args(args))
                out.reward = await reward(args, out)
                return out

            samples.append(asyncio.run(go()))
        log_rollout(0, args, samples)
    finally:
        GenerateState.clear_instances()
        env_client.close_runtimes()
    return tmp / "traces" / "rollout_000000.jsonl"


@pytest.fixture(scope="module")
def split(tmp_path_factory, data_dir, predicates, trace_file):
    out = tmp_path_factory.mktemp("split")
    manifest = asyncio.run(recovery_split.build(out, data_dir=data_dir, predicates=predicates,
                                                scenarios=[SCENARIO], tool_mode="meta",
                                                episodes=[str(trace_file)]))
    return out, manifest


CLOCK = re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d\.\d+$")  # a now() timestamp (seed data has none)


def content(db: str | Path) -> dict[str, list[tuple]]:
    """Every table's rows, with timestamps the tools took from the clock masked."""
    with sqlite3.connect(db) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                             "ORDER BY name")]
        return {t: sorted(tuple("<now>" if isinstance(v, str) and CLOCK.match(v) else v for v in row)
                          for row in conn.execute(f'SELECT * FROM "{t}"')) for t in tables}


def data_dir_template(data_dir: str) -> Path:
    from awm.episode import EnvRuntime

    with EnvRuntime(data_dir, num_workers=1) as rt:
        template, _ = rt.template(SCENARIO)
        dest = Path(data_dir).parent / "initial.db"
        shutil.copyfile(template, dest)
        return dest


def rows(split_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (split_dir / "split.jsonl").read_text().splitlines()]


def test_handovers_come_from_the_recorded_episodes_whose_write_the_predicates_show_as_wrong(split, trace_file,
                                                                                            data_dir):
    out, manifest = split
    records = [json.loads(line) for line in trace_file.read_text().splitlines()]
    assert len(records) == len(EPISODES) and all(r["recovery"] is None for r in records)  # no Phi recorded
    assert manifest["reference_solutions"] is False and manifest["skipped_already_complete"] == 1
    assert manifest["episodes"]["outcomes"] == {"handover": 3, "no_damaging_write": 2, "no_write": 1,
                                                "task_not_state_mutating": 1, "already_complete": 1,
                                                "duplicate_of_an_earlier_handover": 1}
    assert manifest["kinds"] == {"recorded_episode/negative_progress": 1, "recorded_episode/destructive": 1,
                                 "recorded_episode/error": 1}
    by_task = {r["metadata"]["task_idx"]: r["metadata"] for r in rows(out)}
    assert sorted(by_task) == [3, 6, 8]
    h3 = by_task[3]["handover"]
    assert h3["source"] == "recorded_episode" and h3["episode"] == f"{trace_file.resolve()}:1"
    assert h3["calls"] == [{"tool": "checkout_copy", "arguments": {"copy_id": 1}},
                           {"tool": "return_loan", "arguments": {"loan_id": 14, "return_branch_id": 1}}]
    assert (h3["phi_before"], h3["phi_after"]) == (1.0, 0.0)
    assert [c["tool"] for c in by_task[8]["handover"]["calls"]] == ["list_my_holds", "return_loan"]
    assert by_task[6]["handover"]["kind"] == "error" and len(by_task[6]["handover"]["calls"]) == 1
    msgs = by_task[3]["start_messages"]
    assert "list_tools" in msgs[0]["content"] and '"return_loan"' in msgs[-2]["content"]
    # the snapshot is the state the handover's calls leave on a fresh episode of this data (up to the clock)
    from awm.episode import EnvRuntime

    async def replayed() -> dict:
        with EnvRuntime(data_dir, num_workers=1) as rt:
            ep = await rt.open(SCENARIO, 3)
            for c in h3["calls"]:
                await ep.call(c["tool"], c["arguments"])
            rows = content(ep.db_path)
            await ep.close()
            return rows

    snapshot = content(out / by_task[3]["start_db"])
    assert snapshot == asyncio.run(replayed()) and snapshot != content(data_dir_template(data_dir))
    with sqlite3.connect(out / by_task[3]["start_db"]) as conn:
        assert conn.execute("SELECT status FROM loans WHERE id = 14").fetchone()[0] == "returned"
    reasons = manifest["no_handover"]
    assert reasons[f"{SCENARIO}#5"] == "no reference solution and no recorded episode"
    assert reasons[f"{SCENARIO}#4"].endswith("(no_write 1)")
    assert reasons[f"{SCENARIO}#0"].startswith("task type info_seeking")
    assert f"{SCENARIO}#3" not in reasons and len(manifest["playable_tasks"]) == 7


def test_unproductive_writes_catch_a_wrong_write_the_predicates_do_not_watch(tmp_path, data_dir, predicates,
                                                                             trace_file):
    """Task 8's cancel_hold changes holds (no preservation predicate there) and leaves Phi at 0; the
    verifier rejects the episode's end state, so with the option it is the episode's damaging call."""
    manifest = asyncio.run(recovery_split.build(tmp_path / "split", data_dir=data_dir, predicates=predicates,
                                                scenarios=[SCENARIO], tool_mode="meta",
                                                episodes=[str(trace_file.parent)],  # the run's traces/ folder
                                                unproductive_writes=True))
    assert manifest["episodes"]["outcomes"] == {"handover": 4, "no_damaging_write": 1, "no_write": 1,
                                                "task_not_state_mutating": 1, "already_complete": 1,
                                                "duplicate_of_an_earlier_handover": 1}
    assert manifest["kinds"]["recorded_episode/wrong_write"] == 1
    wrong = [r["metadata"] for r in rows(tmp_path / "split")
             if r["metadata"]["handover"]["kind"] == "wrong_write"]
    assert wrong[0]["task_idx"] == 8 and wrong[0]["handover"]["calls"] == [{"tool": "cancel_hold",
                                                                             "arguments": {"hold_id": 1}}]
    with sqlite3.connect(tmp_path / "split" / wrong[0]["start_db"]) as conn:
        assert conn.execute("SELECT status FROM holds WHERE id = 1").fetchone()[0] == "cancelled"


def test_evaluate_plays_the_policy_from_recorded_episode_handovers(split, tiny_model_dir, scripted):
    out, _ = split
    scripted.reset()
    # task 3 (after the wrong return): a second checkout leaves two loans of copy 1, which the verifier
    # rejects; task 6 (after the refused hold): the right hold completes the task
    scripted.reply(call("checkout_copy", copy_id=1), "Checked it out again.",
                   call("place_hold", book_id=4, pickup_branch_id=3), "Placed.")
    metrics, records = recovery_split.evaluate(out, model=str(tiny_model_dir), engine_url=scripted.url,
                                               concurrency=1, tasks={(SCENARIO, 3), (SCENARIO, 6)})
    by_task = {r["task_idx"]: r for r in records}
    assert sorted(by_task) == [3, 6]
    assert by_task[3]["recovery"]["prefix_turns"] == 3  # list_tools + the 2 recorded calls
    assert by_task[6]["recovery"]["prefix_turns"] == 2
    assert (by_task[3]["verdict"], by_task[6]["verdict"]) == ("others", "complete")
    assert by_task[6]["recovery"]["phi0"] == 0.0 and by_task[6]["recovery"]["credit"]["phi"] == [1.0, 1.0]
    assert metrics["state_mutating"]["recovery_success"]["rate"] == 0.5


def test_a_malformed_trace_line_is_an_error_naming_file_and_line(tmp_path, trace_file, data_dir, predicates,
                                                                  capsys):
    good = trace_file.read_text().splitlines()[0]
    cases = {"broken.jsonl": (good + "\n{not json\n", r"broken\.jsonl:2: not valid JSON"),
             "live.jsonl": ('\n{"time": 1, "scenario": "x", "task_idx": 0, "turns": 3}\n',
                            r"live\.jsonl:2: no 'turns' list"),
             "other.jsonl": (json.dumps({**json.loads(good), "scenario": "nowhere_1"}) + "\n",
                             r"other\.jsonl:1: task nowhere_1#3 is not in .*--data-dir")}
    for name, (text, pattern) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(recovery_split.TraceFormatError, match=pattern):
            asyncio.run(recovery_split.build(tmp_path / "split", data_dir=data_dir, predicates=predicates,
                                             scenarios=[SCENARIO], tool_mode="meta",
                                             episodes=[str(tmp_path / name)]))
    rc = recovery_split.main(["build", "--data-dir", data_dir, "--predicates", predicates, "--out",
                              str(tmp_path / "cli"), "--weak-traces", str(tmp_path / "broken.jsonl")])
    assert rc == 2 and "broken.jsonl:2" in capsys.readouterr().err


def test_without_solutions_or_episodes_the_split_is_empty_and_says_what_to_pass(tmp_path, data_dir,
                                                                                predicates, capsys):
    out = tmp_path / "split"
    rc = recovery_split.main(["build", "--data-dir", data_dir, "--predicates", predicates,
                              "--scenario", SCENARIO, "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 1 and "--episodes" in err and "rollout_*.jsonl" in err and f"{SCENARIO}#3" in err
    assert (out / "split.jsonl").read_text() == ""
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["handovers"] == 0 and manifest["reference_solutions"] is False
    assert manifest["unproductive_writes"] is True  # the command's default (--strict-damage turns it off)
    assert manifest["no_handover"][f"{SCENARIO}#3"] == "no reference solution and no recorded episode"
    assert manifest["no_handover_reasons"]["no reference solution and no recorded episode"] == 7


def test_the_awm_1k_excerpt_gives_an_empty_split_with_a_reason_per_task(tmp_path, capsys):
    if not EXCERPT.is_dir():
        pytest.fail(f"the AWM-1K excerpt is not at {EXCERPT}: the shared folder beside the repository "
                    "holds it")
    data = tmp_path / "excerpt"
    data.mkdir()
    for stage in STAGES:  # the excerpt's per-scenario files, concatenated into the standard names
        parts = sorted(EXCERPT.glob(f"{stage}.jsonl")) + sorted(EXCERPT.glob(f"{stage}.*.jsonl"))
        if stage == "gen_verifier":
            parts = [p for p in parts if "pure_code" not in p.name]
        (data / f"{stage}.jsonl").write_text("".join(p.read_text() for p in parts))
    episode = {"scenario": "e_commerce_33", "task_idx": 2, "infra_error": None,
               "turns": [{"calls": [{"name": "create_wishlist", "arguments": {"name": "Kitchen"},
                                     "is_error": False}]}]}
    (tmp_path / "ep.jsonl").write_text(json.dumps(episode) + "\n")
    out = tmp_path / "split"
    rc = recovery_split.main(["build", "--data-dir", str(data), "--out", str(out), "--episodes",
                              str(tmp_path / "ep.jsonl")])
    err = capsys.readouterr().err
    assert rc == 1 and "No task of this data can get a handover" in err and "--episodes" in err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["handovers"] == 0 and manifest["playable_tasks"] == []
    from awm.data import AWMDataset

    ds = AWMDataset(data)
    every = {f"{s}#{i}" for s in ds.scenario_names() for i in range(len(ds.tasks(s)))}
    assert set(manifest["no_handover"]) == every and len(every) == 30
    types = {(r["scenario"], r["task_idx"]): r["task_type"]
             for r in map(json.loads, (out / "predicates.jsonl").read_text().splitlines())}
    assert len(types) == 3  # e_commerce_33's three verified tasks
    for (s, i), t in types.items():
        reason = manifest["no_handover"][f"{s}#{i}"]
        if t == "state_mutating":
            assert reason == recovery_split.NO_ENV_CODE
        else:
            assert reason.startswith(f"task type {t}")
    mutating = types[("e_commerce_33", 2)] == "state_mutating"
    expected = "no_environment_code" if mutating else "task_not_state_mutating"
    assert manifest["episodes"]["outcomes"] == {expected: 1}
    assert manifest["no_handover"]["content_platform_1#0"].startswith("no code verifier")

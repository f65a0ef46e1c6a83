"""`python -m awm_grpo.methods`: GRPO (fixed horizon and ScalingInter-RL schedule), DPO and AgentEvol compared.

The plan and its commands are checked through the driver's dry run and the real launcher's dry run; the
resume logic by running the driver over a folder where some stages are done (the child runner records
what it was asked to start instead of training); the report's figures on outcomes whose answers are known.
No training runs here.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest

from awm_grpo import methods

REPO = Path(__file__).resolve().parents[2]


def episodes(outcomes: dict[int, list[int]], infra: int = 0) -> list[dict]:
    """Evaluation records: task idx -> 1/0 outcomes, plus `infra` infrastructure failures (never scored)."""
    rows = [{"scenario": "s", "task_idx": t, "verdict": "complete" if ok else "incomplete"}
            for t, outs in outcomes.items() for ok in outs]
    return rows + [{"scenario": "s", "task_idx": 1, "verdict": None, "infra_error": "server died"}] * infra


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_schedule_grows_to_the_fixed_horizon_in_equal_rounds():
    assert methods.schedule(methods.parse([])) == {"rounds": [4, 7, 10], "every": 4}  # 12 steps by default
    opts = methods.parse(["--steps", "12"])
    assert methods.schedule(opts) == {"rounds": [4, 7, 10], "every": 4}
    # the rollout's own rule: steps count from 0, so the run's steps 1-4 play 4 turns, 5-8 seven, 9-12 ten
    assert [methods.horizon(methods.schedule(opts), 10, s) for s in range(12)] == [4] * 4 + [7] * 4 + [10] * 4
    assert [methods.horizon(None, 10, s) for s in (0, 11)] == [10, 10]
    opts = methods.parse(["--steps", "10", "--rounds", "5", "10"])
    assert methods.schedule(opts) == {"rounds": [5, 10], "every": 5}


@pytest.mark.parametrize("argv, message", [
    (["--rounds", "4", "8"], "must grow to the fixed horizon"),
    (["--steps", "2"], "cannot hold 3 rounds"),
    (["--seeds", "1", "1"], "repeated seed"),
])
def test_bad_budgets_are_refused_with_what_to_change(argv, message, capsys):
    with pytest.raises(SystemExit):
        methods.parse(argv)
    assert message in capsys.readouterr().err


def test_the_practice_plan_builds_the_practice_set_and_learnings_warm_start(tmp_path, capsys):
    out = tmp_path / "m"
    assert methods.main(["--out", str(out), "--seeds", "4", "--arms", "scaling", "dpo", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line[2:].split(":")[0] for line in lines if line.startswith("# ")] == [
        "data", "splits", "warm start", "eval ws", "scaling-s4", "eval scaling-s4", "dpo-s4", "eval dpo-s4"]
    assert lines[1].endswith(f"-m awm.scenarios.build --practice {out / 'P'}")
    assert lines[3].endswith(f"-m awm_grpo.data_prep --data-dir {out / 'P'} --split-by task --seed 42 --out {out / 'PS'}")
    ws = lines[5]
    assert "--layers 6 --split-digits --drill 3000" in ws and "--counterfactuals 3 --epochs 10 --no-list-tools" in ws
    assert ws.endswith(f"--seed 0 --out {out / 'ws0'}")  # awm_grpo.learning's start, its folder name
    scaling = lines[lines.index("# scaling-s4: to run") + 1]
    assert f"HF_CKPT={out / 'ws0'} AWM_SPLITS_DIR={out / 'PS'}" in scaling and f"AWM_DATA_DIR={out / 'P'}" in scaling
    assert "NUM_ROLLOUT=12 ROLLOUT_BATCH_SIZE=8" in scaling and """'{"rounds": [4, 7, 10], "every": 4}'""" in scaling
    dpo = lines[lines.index("# dpo-s4: to run") + 1]
    assert dpo.endswith(f"--prompts {out / 'offline_train.jsonl'} --config {out / 'eval_runtime.yaml'} "
                        f"--out {out / 'dpo-s4'} --seed 4 --samples 4")
    assert "--n 1 --temperature 1.0" in lines[lines.index("# eval dpo-s4: to run") + 1]
    opts = methods.parse(["--out", str(out)])
    keys = methods.eval_runtime(opts, out)  # every policy plays the practice set's worlds
    assert keys["awm_data_dir"] == str(out / "P") and keys["awm_max_turns"] == 10 and keys["awm_turn_schedule"] is None


def test_the_dry_run_plans_every_arm_from_one_warm_start_with_one_evaluation(tmp_path, capsys):
    out = tmp_path / "m"
    assert methods.main(["--out", str(out), "--data", "bundled", "--seeds", "0", "1", "--steps", "6", "--rounds",
                         "3", "10", "--eval-n", "8", "--offline-tasks", "0", "--greedy", "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert not out.exists()  # a dry run writes nothing
    names = [line[2:].split(":")[0] for line in text.splitlines() if line.startswith("# ")]
    assert names[:4] == ["splits", "warm start", "eval ws", "eval ws-greedy"]
    # seed by seed, every arm of a seed trained and evaluated before the next seed
    assert names[4:10] == ["grpo-s0", "eval grpo-s0", "eval grpo-s0-greedy", "scaling-s0", "eval scaling-s0",
                           "eval scaling-s0-greedy"]
    assert len(names) == 4 + 2 * 4 * 3
    lines = text.splitlines()
    grpo = lines[lines.index("# grpo-s1: to run") + 1]
    scaling = lines[lines.index("# scaling-s1: to run") + 1]
    assert "AWM_TURN_SCHEDULE" not in grpo and "AWM_MAX_TURNS=10" in grpo and "TRAIN_SEED=1" in grpo
    assert "AWM_DATA_DIR" not in grpo  # the bundled scenarios: the launcher's default data
    assert """AWM_TURN_SCHEDULE='{"rounds": [3, 10], "every": 3}'""" in scaling
    assert grpo.replace("grpo-s1", "X") == scaling.replace("scaling-s1", "X").replace(
        """ AWM_TURN_SCHEDULE='{"rounds": [3, 10], "every": 3}'""", "")  # nothing else differs
    for arm in ("dpo", "agentevol"):
        cmd = lines[lines.index(f"# {arm}-s1: to run") + 1]
        assert f"-m awm_grpo.offline.{arm} --model {out / 'ws'} --prompts {out / 'splits' / 'train.jsonl'}" in cmd
        assert f"--out {out / f'{arm}-s1'} --seed 1" in cmd
    assert lines[lines.index("# agentevol-s1: to run") + 1].endswith("--seed 1 --iterations 2 --samples 2")
    evals = [lines[i + 1] for i, line in enumerate(lines) if line.startswith("# eval") and "greedy" not in line]
    assert len(evals) == 9 and all(f"--split {out / 'heldout.jsonl'}" in e and "--n 8 --temperature 1.0" in e
                                   and f"--config {out / 'eval_runtime.yaml'}" in e and "--seed 0" in e
                                   for e in evals)
    assert f"--model {out / 'scaling-s0' / 'iter_0000005' / 'model'}" in "\n".join(evals)


def test_the_rl_arms_are_valid_launcher_jobs(tmp_path):
    """The launcher's dry run resolves every knob the driver sets (an unknown variable would be ignored)."""
    opts = methods.parse(["--out", str(tmp_path), "--data", "bundled", "--steps", "9", "--rounds", "2", "5", "10"])
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "config.json").write_text("{}")  # the dry run checks the folder, loads nothing
    (tmp_path / "splits").mkdir()
    for name in ("train", "val", "test"):
        (tmp_path / "splits" / f"{name}.jsonl").write_text("")
    out = subprocess.run(["bash", str(REPO / "awm_grpo" / "run_awm_grpo.sh"), "--dry-run"],
                         env={**os.environ, **methods.rl_env(opts, tmp_path, "scaling", 7)},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for flag in ("--num-rollout 9", "--rollout-batch-size 8", "--lr 0.0002", "--seed 7", "--skip-eval-before-train",
                 f"--save {tmp_path / 'scaling-s7'}", "awm_max_turns: 10", "every: 3"):
        assert flag in text, flag
    assert "- 2\n  - 5\n  - 10" in text
    # the evaluation's runtime: the fixed arm's keys, no schedule, no traces
    keys = methods.eval_runtime(opts, tmp_path)
    assert keys["awm_max_turns"] == 10 and keys["awm_turn_schedule"] is None and keys["awm_trace_dir"] is None
    assert keys["awm_invalid_call_penalty"] == 0.0


def test_the_driver_resumes_running_only_what_is_missing(tmp_path, monkeypatch):
    out = tmp_path / "m"
    write_jsonl(out / "splits" / "val.jsonl", [{"metadata": {"scenario": "s", "task_idx": 1}}])
    write_jsonl(out / "splits" / "test.jsonl", [{"metadata": {"scenario": "s", "task_idx": 2}}])
    (out / "splits" / "split_info.json").write_text("{}")
    (out / "ws").mkdir()
    (out / "ws" / "warmstart.json").write_text("{}")
    (out / "grpo-s0").mkdir()
    (out / "grpo-s0" / "latest_checkpointed_iteration.txt").write_text("2\n")  # interrupted at step 3 of 6
    write_jsonl(out / "eval" / "ws.jsonl", episodes({1: [1]}))
    started = []

    def child(cmd, log, *, timeout_s, env=None, cwd=None):
        """Stands in for a child: records what was started and leaves the output it would leave."""
        name = log.stem
        started.append(name)
        if log.parent.name == "eval":
            write_jsonl(Path(cmd[cmd.index("--out") + 1]), episodes({1: [0]}))
        elif name.startswith(("grpo", "scaling")):
            Path(env["SAVE_DIR"], "latest_checkpointed_iteration.txt").parent.mkdir(exist_ok=True)
            Path(env["SAVE_DIR"], "latest_checkpointed_iteration.txt").write_text("5\n")
        else:
            Path(cmd[cmd.index("--out") + 1], "model").mkdir(parents=True)
            Path(cmd[cmd.index("--out") + 1], "model", "config.json").write_text("{}")
        return 0

    monkeypatch.setattr(methods, "run_logged", child)
    opts = methods.parse(["--out", str(out), "--data", "bundled", "--seeds", "0", "--arms", "grpo", "scaling",
                          "--steps", "6", "--greedy", "--offline-tasks", "0"])
    methods.run_all(opts, out)
    assert started == ["ws-greedy", "grpo-s0", "grpo-s0", "grpo-s0-greedy", "scaling-s0", "scaling-s0",
                       "scaling-s0-greedy"]  # the run's log and its evaluation's share the stem, not the folder
    assert [json.loads(line)["metadata"]["task_idx"] for line in (out / "heldout.jsonl").read_text().splitlines()] \
        == [1, 2]
    assert "awm_max_turns: 10" in (out / "eval_runtime.yaml").read_text()
    times = json.loads((out / "times.json").read_text())
    assert set(times) == {"eval ws-greedy", "grpo-s0", "eval grpo-s0", "eval grpo-s0-greedy", "scaling-s0",
                          "eval scaling-s0", "eval scaling-s0-greedy"}
    started.clear()
    methods.run_all(opts, out)  # everything is there: nothing runs again
    assert started == []
    opts = methods.parse(["--out", str(out), "--data", "bundled", "--seeds", "0", "--arms", "grpo", "dpo",
                          "--steps", "6", "--greedy", "--offline-tasks", "0"])
    methods.run_all(opts, out)  # an arm added later: only its run and evaluations
    assert started == ["dpo-s0", "dpo-s0", "dpo-s0-greedy"]
    assert methods.trained(opts, out, "dpo", 0)
    with pytest.raises(SystemExit, match="holds a --data bundled run"):  # its "before" is another start's
        methods.run_all(methods.parse(["--out", str(out)]), out)


def test_the_offline_arms_explore_a_seeded_sample_spread_over_the_split(tmp_path):
    out = tmp_path / "m"
    rows = [{"metadata": {"scenario": f"sc{i // 10}", "task_idx": i % 10}} for i in range(60)]  # sorted by scenario
    write_jsonl(out / "PS" / "train.jsonl", rows)
    opts = methods.parse(["--out", str(out), "--offline-tasks", "12"])
    methods.write_offline_prompts(opts, out)
    first = (out / "offline_train.jsonl").read_text()
    picked = [json.loads(line)["metadata"] for line in first.splitlines()]
    assert len(picked) == 12 and len({m["scenario"] for m in picked}) >= 4  # not the first scenario's tasks
    assert picked == sorted(picked, key=lambda m: (m["scenario"], m["task_idx"]))  # split order
    methods.write_offline_prompts(opts, out)
    assert (out / "offline_train.jsonl").read_text() == first  # the same sample every time (seed 42)
    assert methods.offline_prompts(methods.parse(["--offline-tasks", "0"]), out) == out / "PS" / "train.jsonl"
    with pytest.raises(SystemExit, match="has 60 tasks"):
        methods.write_offline_prompts(methods.parse(["--out", str(out), "--offline-tasks", "61"]), out)


def test_a_failed_child_stops_the_driver_and_names_its_log(tmp_path, monkeypatch):
    out = tmp_path / "m"
    monkeypatch.setattr(methods, "run_logged", lambda cmd, log, **kw: 3)
    with pytest.raises(SystemExit, match=r"data failed \(rc=3\): see .*data.log"):
        methods.run_all(methods.parse(["--out", str(out)]), out)  # the first stage: the practice set


def test_arm_figures_from_known_outcomes():
    before = episodes({0: [1, 0], 1: [0, 0]})  # 25 %
    grpo = {0: episodes({0: [1, 1], 1: [0, 0]}, infra=3), 1: episodes({0: [1, 1], 1: [1, 1]})}  # 50 %, 100 %
    dpo = {0: episodes({0: [1, 0], 1: [0, 0]}), 1: episodes({0: [1, 1], 1: [0, 0]})}  # 25 %, 50 %
    g = methods.arm_summary(before, grpo)
    assert g["before"] == 0.25 and g["after"] == {"0": 0.5, "1": 1.0}
    assert g["gain_mean_std"] == pytest.approx((0.5, math.sqrt(0.125)))
    assert g["episodes"] == {"0/0": 7, "0/1": 4}  # infrastructure failures are counted, never scored
    # one-sample t of the gains 0.25, 0.75 (t = 2, 1 df: Cauchy, p = 1 - 2 atan(2) / pi)
    assert g["vs_before_seeds"]["p"] == pytest.approx(1 - 2 * math.atan(2) / math.pi, abs=1e-6)
    # per task pooled over seeds: 1.0 and 0.5 after, 0.5 and 0.0 before: both +0.5, a sign flip of 2 tasks
    assert g["vs_before_tasks"]["diff"] == pytest.approx(0.5) and g["vs_before_tasks"]["n"] == 2
    assert g["vs_before_tasks"]["p"] == pytest.approx(0.5, abs=0.03)
    assert "vs_grpo_seeds" not in g
    d = methods.arm_summary(before, dpo, reference=grpo)
    assert d["vs_grpo_seeds"]["diff"] == pytest.approx(-0.375) and d["vs_grpo_seeds"]["n"] == 2
    assert d["vs_grpo_tasks"]["diff"] == pytest.approx(((0.75 - 1.0) + (0.0 - 0.5)) / 2)


def test_learning_curves_turns_and_turn_limit_stops_from_traces(tmp_path):
    run = tmp_path / "scaling-s0"
    write_jsonl(run / "traces" / "rollout_000000.jsonl", [
        {"step": 0, "verdict": "complete", "reward": 1.0, "turns": [{}, {}], "stop_reason": "final_answer"},
        {"step": 0, "verdict": "incomplete", "reward": 0.0, "turns": [{}, {}], "stop_reason": "max_turns"},
        {"step": 0, "verdict": None, "reward": None, "turns": [], "stop_reason": "infra_error", "infra_error": "x"}])
    write_jsonl(run / "traces" / "rollout_000001.jsonl", [
        {"step": 1, "verdict": "incomplete", "reward": 0.1, "turns": [{}] * 3, "stop_reason": "final_answer"}])
    write_jsonl(run / "metrics.jsonl", [{"kind": "train", "step": 0, "rollout/episodes_played": 40.0},
                                        {"kind": "train", "step": 1, "rollout/episodes_played": 32.0},
                                        {"kind": "eval", "step": 1}])
    c = methods.run_curves(run, {"rounds": [2, 4], "every": 1}, 4)
    assert c["success"] == {0: 0.5, 1: 0.0} and c["reward"] == {0: 0.5, 1: pytest.approx(0.1)}
    assert c["turns"] == {0: 2.0, 1: 3.0} and c["truncated"] == {0: 0.5, 1: 0.0}
    assert c["horizon"] == {0: 2, 1: 4} and c["played"] == {0: 40.0, 1: 32.0}


def test_the_report_tables_and_plots_from_a_finished_folder(tmp_path):
    out = tmp_path / "m"
    write_jsonl(out / "eval" / "ws.jsonl", episodes({0: [1, 0], 1: [0, 0]}))
    write_jsonl(out / "eval" / "ws-greedy.jsonl", episodes({0: [1], 1: [0]}))
    for arm, outcomes in (("grpo", {0: [1, 1], 1: [0, 1]}), ("scaling", {0: [1, 0], 1: [0, 0]})):
        for seed in (0, 1):
            write_jsonl(out / "eval" / f"{arm}-s{seed}.jsonl", episodes(outcomes))
            write_jsonl(out / f"{arm}-s{seed}" / "traces" / "rollout_000000.jsonl", [
                {"step": s, "verdict": "complete", "reward": 1.0, "turns": [{}], "stop_reason": "final_answer"}
                for s in range(3)])
            write_jsonl(out / f"{arm}-s{seed}" / "metrics.jsonl",
                        [{"kind": "train", "step": s, "rollout/episodes_played": 32.0} for s in range(3)])
            (out / f"{arm}-s{seed}" / "latest_checkpointed_iteration.txt").write_text("2\n")  # finished
    write_jsonl(out / "grpo-s2" / "traces" / "rollout_000000.jsonl", [{"step": 0, "verdict": "complete"}])  # running
    (out / "dpo-s0").mkdir()
    (out / "dpo-s0" / "dpo.json").write_text(json.dumps({"episodes_played": 96, "wall_s": {"total": 50.0},
                                                         "pairs": {"pairs": 7, "unpaired": 3}, "pair_list": [[1, 2]]}))
    write_jsonl(out / "eval" / "dpo-s0.jsonl", episodes({0: [0, 0], 1: [0, 0]}))
    (out / "times.json").write_text(json.dumps({"grpo-s0": 120.0, "dpo-s0": 60.0}))
    opts = methods.parse(["--out", str(out), "--seeds", "0", "1", "2", "--steps", "3", "--rounds", "5", "7", "10",
                          "--arms", "grpo", "scaling", "dpo", "agentevol", "--img-dir", str(tmp_path / "img")])
    result = methods.write_report(opts, out)
    assert set(result["arms"]) == {"grpo", "scaling", "dpo"}  # agentevol has not run: no row, no error
    assert result["arms"]["scaling"]["vs_grpo_seeds"]["diff"] == pytest.approx(-0.5)
    assert result["cost"]["grpo"]["episodes_played"] == {"0": 96, "1": 96}  # not the unfinished run of seed 2
    assert result["cost"]["dpo"] == {"episodes_played": {"0": 96}, "train_s": {"0": 60.0}}
    assert result["offline"]["dpo"]["0"] == {"episodes_played": 96, "wall_s": {"total": 50.0},
                                             "pairs": {"pairs": 7, "unpaired": 3}}
    assert "- dpo seed 0: 7 pairs" in (out / "methods.md").read_text()
    assert result["curves"]["scaling"]["0"]["horizon"] == {"0": 5, "1": 7, "2": 10}
    assert result["greedy"]["ws"] == 0.5 and "grpo mean_std" not in result["greedy"]
    md = (out / "methods.md").read_text()
    assert "| warm start (before) | 25.0%" in md and "| grpo | 75.0% | 75.0% | - | 75.0% +- 0.0% | +50.0% +- 0.0%" in md
    assert "| dpo | 0.0% | - | - |" in md and "| grpo | 96, 96, - | 2.0 min, -, - |" in md
    assert json.loads((out / "methods.json").read_text())["commands"]["scaling-s1"].startswith("HF_CKPT=")
    for name in ("methods_curves.png", "methods_held_out.png"):
        assert (out / name).stat().st_size > 10_000 and (tmp_path / "img" / name).exists()



def test_the_lora_arm_trains_adapters_and_the_report_says_what_a_step_cost(tmp_path):
    out = tmp_path / "m"
    opts = methods.parse(["--out", str(out), "--seeds", "0", "--arms", "grpo", "lora", "--steps", "2",
                          "--rounds", "1", "10", "--lora-rank", "4", "--lora-lr", "3e-3"])
    grpo, lora = (methods.rl_env(opts, out, arm, 0) for arm in ("grpo", "lora"))
    assert {k: v for k, v in lora.items() if grpo.get(k) != v} == {
        "SAVE_DIR": str(out / "lora-s0"), "LR": "0.003", "LORA_RANK": "4", "LORA_ALPHA": "16.0"}
    assert "LORA_RANK" not in grpo and methods.model_of(opts, out, "lora", 0) == out / "lora-s0/iter_0000001/model"
    write_jsonl(out / "eval" / "ws.jsonl", episodes({0: [0], 1: [0]}))
    for arm, sync in (("grpo", 1_000_000.0), ("lora", 50_000.0)):
        write_jsonl(out / "eval" / f"{arm}-s0.jsonl", episodes({0: [1], 1: [0]}))
        write_jsonl(out / f"{arm}-s0" / "traces" / "rollout_000000.jsonl", [
            {"step": s, "verdict": "complete", "reward": 1.0, "turns": [{}], "stop_reason": "final_answer"}
            for s in range(2)])
        write_jsonl(out / f"{arm}-s0" / "metrics.jsonl", [
            {"kind": "train", "step": s, "rollout/episodes_played": 32.0, "sync/bytes": sync, "train/time_s": 2.0 + s,
             "rollout/time_s": 10.0, "train/state_gib": sync / 2**20, "train/peak_memory_gib": 1.5}
            for s in range(2)])
        (out / f"{arm}-s0" / "latest_checkpointed_iteration.txt").write_text("1\n")
    result = methods.write_report(opts, out)
    assert result["curves"]["lora"]["0"]["sync_bytes"] == {"0": 50_000.0, "1": 50_000.0}
    md = (out / "methods.md").read_text()
    assert "| grpo | 1,000,000 | 2.5 | 10.0 | 0.9537 | 1.50 |" in md
    assert "| lora | 50,000 | 2.5 | 10.0 | 0.0477 | 1.50 |" in md
    assert "lora: rank 4, alpha 16.0, LR 0.003" in md and result["arms"]["lora"]["after"] == {"0": 0.5}

"""`python -m awm_grpo.learning`: the spread of the GRPO learning figure over warm starts and GRPO seeds.

The statistics are checked on outcomes whose answers are known; the commands go through the real
launcher's dry run; the slow test runs the whole driver at a toy budget (it checks the wiring:
real warm start, real launcher run, real evaluations, the report), not learning.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from awm.data import bundled_data_dir

from awm_grpo import learning

REPO = Path(__file__).resolve().parents[2]


def records(outcomes: dict[int, list[int]], infra: int = 0) -> list[dict]:
    """Episodes of task idx -> 1/0 outcomes, plus `infra` infrastructure failures (never scored)."""
    rows = [{"scenario": "s", "task_idx": t, "verdict": "complete" if ok else "incomplete"}
            for t, outs in outcomes.items() for ok in outs]
    return rows + [{"scenario": "s", "task_idx": 0, "verdict": None, "infra_error": "server died"}] * infra


def test_summary_gains_spread_and_tests_from_known_outcomes():
    before = {0: records({0: [0, 0], 1: [1, 0]}, infra=3),   # 1/4 (the failures are not scored 0)
              1: records({0: [0, 0], 1: [0, 0]})}            # 0/4
    after = {(0, 7): records({0: [1, 0], 1: [1, 1]}),        # 3/4: +0.50
             (0, 8): records({0: [0, 0], 1: [1, 1]}),        # 2/4: +0.25
             (1, 7): records({0: [1, 0], 1: [0, 0]}),        # 1/4: +0.25
             (1, 8): records({0: [0, 0], 1: [1, 0]})}        # 1/4: +0.25
    s = learning.summarize(before, after)
    assert s["before"] == {"0": 0.25, "1": 0.0}
    assert s["gain_mean_std"][0] == pytest.approx(0.3125)
    assert s["gain_mean_std"][1] == pytest.approx(0.125)
    assert s["gain_min_max"] == (0.25, 0.5)
    # over warm starts: mean_g after = 0.625 and 0.25 against 0.25 and 0: diffs 0.375 and 0.25
    assert s["test_starts"]["diff"] == pytest.approx(0.3125) and s["test_starts"]["n"] == 2
    assert 0 < s["test_starts"]["p"] < 0.2
    # over tasks: task 0 after 2/8, before 0/4; task 1 after 5/8, before 1/4
    assert s["test_tasks"]["diff"] == pytest.approx((0.25 + 0.375) / 2) and s["test_tasks"]["n"] == 2
    assert s["episodes"]["before"] == {"0": 7, "1": 4}
    md = learning.markdown(s, {"steps": 150})
    assert "| 0 | 25.0% | 75.0% | 50.0% | +50.0%, +25.0% |" in md and "+31.2% +- 12.5%" in md


def test_an_evaluation_with_only_infrastructure_failures_is_an_error_not_zero():
    with pytest.raises(ValueError, match="infrastructure"):
        learning.success(records({}, infra=2))


def test_grpo_runs_are_valid_launcher_jobs_with_a_step_budget(tmp_path):
    """The launcher's own dry run resolves every knob the driver sets (an unknown variable would be ignored,
    so the resolved command is checked)."""
    opts = learning.parse(["--out", str(tmp_path), "--steps", "37", "--lr", "3e-4"])
    env = {**os.environ, **learning.grpo_env(opts, tmp_path, warm=2, seed=9)}
    (tmp_path / "ws2").mkdir()
    (tmp_path / "ws2" / "config.json").write_text("{}")  # the dry run checks the folder, loads nothing
    (tmp_path / "PW").symlink_to(bundled_data_dir())
    (tmp_path / "PWS").mkdir()
    for name in ("train", "val", "test"):
        (tmp_path / "PWS" / f"{name}.jsonl").write_text("")
    out = subprocess.run(["bash", str(REPO / "awm_grpo" / "run_awm_grpo.sh"), "--dry-run"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout + out.stderr
    for flag in ("--num-rollout 37", "--lr 0.0003", "--seed 9", f"--hf-checkpoint {tmp_path / 'ws2'}",
                 f"--save {tmp_path / 'rl-ws2-s9'}"):
        assert flag in text, flag


def test_a_run_is_finished_at_its_last_step_and_its_model_is_that_checkpoint(tmp_path):
    with pytest.raises(SystemExit, match="no checkpoint"):
        learning.trained_model(tmp_path)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("79\n")
    assert not learning.finished(tmp_path, steps=150)  # interrupted: run again, it resumes from step 79
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("149\n")
    assert learning.finished(tmp_path, steps=150)
    assert learning.trained_model(tmp_path) == tmp_path / "iter_0000149" / "model"


@pytest.mark.slow
def test_the_driver_runs_warm_start_grpo_and_both_evaluations_then_reports(tmp_path):
    out = tmp_path / "lf"
    argv = ["--out", str(out), "--warm-seeds", "0", "--grpo-seeds", "3", "--worlds", "1", "--epochs", "1",
            "--layers", "1", "--drill", "0", "--counterfactuals", "0", "--steps", "2", "--eval-n", "1",
            "--eval-limit", "3", "--timeout", "600"]
    assert learning.main(argv) == 0
    result = json.loads((out / "learning.json").read_text())
    s = result["summary"]
    assert set(s["before"]) == {"0"} and set(s["after"]) == {"0/3"}
    assert s["episodes"] == {"before": {"0": 3}, "after": {"0/3": 3}}
    assert (out / "rl-ws0-s3" / "latest_checkpointed_iteration.txt").read_text().strip() == "1"  # rollout ids count from 0
    assert (out / "ws0" / "warmstart.json").exists() and "| 0 |" in (out / "learning.md").read_text()
    # a rerun finds every stage's output and only rewrites the report
    before = (out / "eval" / "ws0.jsonl").stat().st_mtime_ns
    assert learning.main(argv) == 0
    assert (out / "eval" / "ws0.jsonl").stat().st_mtime_ns == before

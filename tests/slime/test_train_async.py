"""`python -m slime.train_async`: one-step-off-policy runs on the tiny model with the CPU engine
under Ray: overlap, staleness, save, eval and exact resume of the data order."""

from __future__ import annotations

import json
import math

import pytest
from test_train_loop import _command, _env, _run, _train_records, toy  # noqa: F401 - toy is a fixture

SKIP_PLUGIN = '''
def log_rollout(rollout_id, args, samples, rollout_extra_metrics, rollout_time):
    return True  # slime's contract: skip the default rollout metrics
'''

EXTRA = ("--rollout-shuffle", "--save-interval", "2", "--advantage-estimator", "reinforce_plus_plus_baseline",
         "--use-tis")


def _async(cmd: list[str]) -> list[str]:
    assert cmd[2] == "slime.train"
    return [*cmd[:2], "slime.train_async", *cmd[3:]]


@pytest.fixture(scope="module")
def straight(toy, tmp_path_factory):  # noqa: F811 - fixture
    """Four async steps, saved every 2, eval every 2."""
    work = tmp_path_factory.mktemp("straight")
    _run(_async(_command(toy, work, *EXTRA, "--eval-prompt-data", "toy", str(toy / "eval.jsonl"),
                         "--eval-interval", "2", steps=4)), _env())
    return work


def test_async_steps_overlap_and_are_one_step_stale(straight):
    records = _train_records(straight)
    assert sorted(records) == [0, 1, 2, 3]
    assert [records[s]["rollout/weight_staleness"] for s in range(4)] == [0.0, 1.0, 1.0, 1.0]
    assert records[0]["async/rollout_overlap_s"] == 0.0
    for step in (1, 2, 3):  # the rollout of step k+1 ran while step k trained
        assert records[step]["async/rollout_overlap_s"] > 0.0
        assert 0.0 < records[step]["async/rollout_overlap_ratio"] <= 1.0
    # fresh weights at step 0 (the correctness gate); later steps train on the previous weights' samples
    assert records[0]["train/train_rollout_logprob_abs_diff"] < 1e-5
    assert records[1]["train/train_rollout_logprob_abs_diff"] > 1e-4
    for record in records.values():
        assert 0.0 <= record["rollout/raw_reward"] <= 1.0
        assert all(math.isfinite(v) for v in record.values() if isinstance(v, float))
    ckpt = straight / "ckpt"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    for it in (1, 3):
        assert (ckpt / f"iter_{it:07d}" / "trainer" / ".metadata").is_file()
        assert (ckpt / "rollout" / f"global_dataset_state_dict_{it}.pt").is_file()
    evals = [json.loads(line) for line in (ckpt / "metrics.jsonl").read_text().splitlines() if '"eval"' in line]
    assert [e["step"] for e in evals] == [0, 2, 4]
    assert all(0.0 <= e["eval/toy"] <= 1.0 for e in evals)
    print("async overlap:", " ".join(
        f"step {s}: rollout {records[s]['rollout/time_s']:.2f}s overlap {records[s]['async/rollout_overlap_s']:.2f}s "
        f"train {records[s]['train/time_s']:.2f}s" for s in range(4)))


@pytest.mark.slow
def test_async_resume_regenerates_the_in_flight_step_from_the_same_prompts(toy, straight, tmp_path):  # noqa: F811
    """A checkpoint written while step 2 was already generating must not skip step 2's prompts.

    The first run also hides the default rollout metrics with a rollout log hook returning True.
    """
    (tmp_path / "skip_plugin.py").write_text(SKIP_PLUGIN)
    _run(_async(_command(toy, tmp_path, *EXTRA, "--custom-rollout-log-function-path", "skip_plugin.log_rollout",
                         steps=3)), _env(tmp_path))
    latest = tmp_path / "ckpt" / "latest_checkpointed_iteration.txt"
    assert latest.read_text().strip() == "2"
    latest.write_text("1\n")  # as if the driver died right after saving step 1 (step 2 in flight)
    out = _run(_async(_command(toy, tmp_path, *EXTRA, steps=4)), _env()).stdout
    assert "next step 2" in out
    want, got = _train_records(straight), _train_records(tmp_path)
    assert sorted(got) == [0, 1, 2, 3]
    for step in (0, 1):  # logged by the first run, whose hook returned True
        assert "rollout/raw_reward" not in got[step] and "rollout/prompt_indices" not in got[step]
        assert got[step]["rollout/time_s"] > 0 and got[step]["rollout/weight_staleness"] == step
    for step in (2, 3):
        assert got[step]["rollout/prompt_indices"] == want[step]["rollout/prompt_indices"], step

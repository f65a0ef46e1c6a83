"""Resume after damage: a corrupt checkpoint is named and the newest good one is used instead;
metrics.jsonl keeps each step once after a resume."""

from __future__ import annotations

import argparse
import json
import logging

import pytest
from test_torch_backend import assert_same_params, mixed_samples, params, tiny_model

from slime.backends import checkpoint as ckpt
from slime.backends.torch_backend import TorchTrainer, TrainerConfig
from slime.utils.metrics import MetricsWriter


@pytest.fixture
def three_iterations(tmp_path):
    """Iterations 1, 2, 3 of one run under tmp_path; returns the weights after each."""
    trainer = TorchTrainer(tiny_model(), TrainerConfig(lr=1e-2))
    weights = {}
    for iteration in (1, 2, 3):
        trainer.train_step(mixed_samples(), [1.0, -1.0, 1.0, -1.0])
        trainer.save_checkpoint(tmp_path, data_state={"next_rollout_id": iteration})
        weights[iteration] = params(trainer.model)
    return tmp_path, weights


def _truncate(path, keep: int = 100) -> None:
    path.write_bytes(path.read_bytes()[:keep])


@pytest.mark.parametrize("damage", ["safetensors", "shard", "missing_shard", "dcp_metadata", "scheduler", "state",
                                    "missing_state"])
def test_damaged_latest_falls_back_to_the_previous_iteration(three_iterations, caplog, damage):
    root, weights = three_iterations
    latest = root / "iter_0000003"
    shard = latest / ckpt.TRAINER_DIR / "__0_0.distcp"
    target = {"safetensors": next((latest / "model").glob("*.safetensors")), "shard": shard, "missing_shard": shard,
              "dcp_metadata": latest / ckpt.TRAINER_DIR / ".metadata", "scheduler": latest / ckpt.SCHEDULER_FILE,
              "state": latest / ckpt.STATE_FILE, "missing_state": latest / ckpt.STATE_FILE}[damage]
    if damage.startswith("missing"):
        target.unlink()
    else:
        _truncate(target)
    resumed = TorchTrainer(tiny_model(seed=7), TrainerConfig(lr=1e-2))
    with caplog.at_level(logging.WARNING, logger="slime.backends.checkpoint"):
        info = resumed.load_checkpoint(root)
    assert info["iteration"] == 2 and info["data_state"] == {"next_rollout_id": 2}
    assert_same_params(params(resumed.model), weights[2])
    assert str(target) in caplog.text and "resuming from" in caplog.text and "iter_0000002" in caplog.text


def test_unreadable_latest_file_and_no_good_iteration(three_iterations):
    root, _ = three_iterations
    (root / ckpt.LATEST_FILE).write_text("garbage\n")
    assert ckpt.resolve_checkpoint(root).name == "iter_0000003"  # newest good one, by directory name
    for iteration in (1, 2, 3):
        _truncate(root / f"iter_{iteration:07d}" / "rng.pt", keep=10)
    with pytest.raises(ckpt.CheckpointDamaged, match=r"no loadable checkpoint.*iter_0000003/rng.pt"):
        ckpt.resolve_checkpoint(root)


def test_metrics_keep_each_step_once_after_a_resume(tmp_path):
    args = argparse.Namespace(metrics_path=None, save=str(tmp_path), use_tensorboard=False, tensorboard_dir=None,
                              use_wandb=False)
    first = MetricsWriter(args)
    for step in range(5):  # the run saved a checkpoint after step 2, logged 3 and 4, then died
        first.log(step, {"reward": step})
        first.log(step, {"eval/reward": step}, kind="eval")
    first.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "step": 5, "rew')  # torn last line of the killed run
    resumed = MetricsWriter(args)
    for step in range(3, 6):
        resumed.log(step, {"reward": 10 + step})
    resumed.close()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [(r["step"], r["reward"]) for r in lines if r["kind"] == "train"]
    assert train == [(0, 0), (1, 1), (2, 2), (3, 13), (4, 14), (5, 15)]
    assert [r["step"] for r in lines if r["kind"] == "eval"] == [0, 1, 2]

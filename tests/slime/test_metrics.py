"""Metrics sinks: JSONL always, TensorBoard event files, wandb offline (no account, no network)."""

from __future__ import annotations

import argparse
import json

import pytest


def args(tmp_path, **kw) -> argparse.Namespace:
    base = dict(metrics_path=None, save=str(tmp_path / "run"), use_tensorboard=False, tensorboard_dir=None,
                use_wandb=False, wandb_project="stateful-rl-test", wandb_group=None, wandb_dir=str(tmp_path),
                wandb_mode="offline")
    return argparse.Namespace(**{**base, **kw})


def test_wandb_offline_run_is_written_locally(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from slime.utils.metrics import MetricsWriter

    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    writer = MetricsWriter(args(tmp_path, use_wandb=True, use_tensorboard=True))
    for step in range(3):
        writer.log(step, {"reward": 0.1 * step, "note": "text is kept in the JSONL only"})
    writer.log(2, {"eval/reward": 0.5}, kind="eval")
    writer.close()

    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in lines] == [("train", 0), ("train", 1), ("train", 2), ("eval", 2)]
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, list((tmp_path / "wandb").iterdir())
    data = list(runs[0].glob("run-*.wandb"))
    assert data and data[0].stat().st_size > 0
    assert list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))

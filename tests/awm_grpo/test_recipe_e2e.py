"""The recipe end to end on CPU: `run_awm_grpo.sh` -> slime.train -> rollout on the bundled scenarios.

A shortened run of what users type after `bash setup.sh` (the tiny model, 2 steps, small groups):
it must finish, checkpoint, write traces and per-step metrics including the awm_grpo hook's, and the
resolved config. Marked slow: CI runs it (`.ci/run` includes slow tests).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_run_awm_grpo_completes_three_steps_on_cpu_saving_every_step_and_keeping_two(tiny_model_dir, tmp_path):
    save = tmp_path / "run"
    env = {**os.environ, "PYTHON": sys.executable, "HF_CKPT": str(tiny_model_dir), "SAVE_DIR": str(save),
           "AWM_SPLITS_DIR": str(tmp_path / "splits"), "NUM_ROLLOUT": "3", "ROLLOUT_BATCH_SIZE": "2",
           "N_SAMPLES_PER_PROMPT": "2", "AWM_MAX_TURNS": "3", "ROLLOUT_MAX_RESPONSE_LEN": "512",
           "AWM_MAX_TOKENS_PER_TURN": "48", "SAVE_INTERVAL": "1", "EVAL_INTERVAL": "2",
           "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.run(["bash", str(REPO / "awm_grpo" / "run_awm_grpo.sh")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    lines = [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines()]
    train = [m for m in lines if m["kind"] == "train"]
    evals = [m for m in lines if m["kind"] == "eval"]
    assert [m["step"] for m in train] == [0, 1, 2]
    assert all(m["awm/episodes"] == 4 and "awm/success_rate" in m for m in train), train
    assert evals and any(k.startswith("eval_awm/") for k in evals[-1])
    traces = sorted(p.name for p in (save / "traces").glob("*.jsonl"))
    assert "rollout_000000.jsonl" in traces and "rollout_000001.jsonl" in traces
    record = json.loads((save / "traces" / "rollout_000001.jsonl").read_text().splitlines()[0])
    assert record["turns"] and record["messages"][0]["role"] == "user" and "reward" in record
    # a save after every step, the newest two kept (training.keep_checkpoints' default), in fp32 (CPU engine)
    assert (save / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert sorted(p.name for p in save.glob("iter_*")) == ["iter_0000001", "iter_0000002"]
    assert json.loads((save / "iter_0000002" / "model" / "config.json").read_text())["dtype"] == "float32"
    assert "one save: " in proc.stdout and "the newest 2 kept (KEEP_CHECKPOINTS)" in proc.stdout
    assert (save / "awm_runtime.yaml").is_file()

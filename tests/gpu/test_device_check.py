"""The device check script (tests/gpu/device_check.sh) runs end to end on the CPU with the tiny model:
every check prints its figures and the weight stream sends every tensor of the trainer in HF names.
On a GPU machine the same script runs the full-size checks and tests/slime/test_gpu.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_device_check_script_runs_every_cpu_check_and_sends_every_weight():
    env = dict(os.environ, PYTHON=sys.executable, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(["bash", "tests/gpu/device_check.sh", "--device", "cpu", "--small"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)

    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    checks = {line["check"]: line for line in map(json.loads, (ln for ln in proc.stdout.splitlines()
                                                                  if ln.startswith('{"check"')))}
    assert sorted(checks) == ["bf16_save", "env", "fsdp_bf16_step", "offload", "tensor_sync",
                              "weight_send"]  # nccl: GPU only
    save = checks["bf16_save"]
    assert save["export_config_dtype"] == "bfloat16" and save["reload_param_dtypes"] == ["bfloat16"]
    assert save["reload_equals_bf16_weights"] and save["moved_by_a_step"] and save["restored_exactly"]
    assert set(save["save_parts_gb"]) == {"model", "trainer"} and save["save_gb"] >= save["planned_gb"] > 0
    assert checks["fsdp_bf16_step"]["finite"] and checks["fsdp_bf16_step"]["step_s"] > 0
    assert checks["offload"]["back_on_device"]
    send = checks["weight_send"]
    assert send["backend"] == "gloo" and send["every_name"] and send["tensors"] == send["model_tensors"] == 25
    sync = checks["tensor_sync"]  # shared-memory handles here, CUDA IPC on a GPU: into another process, twice
    assert sync["transport"] == "shared-memory" and sync["bytes_per_param"] == 2.0 and sync["engine_version"] == "2"
    assert sync["every_name"] and sync["bit_equal_bf16"] and sync["engine_dtypes"] == ["bfloat16"]
    assert "== device_check done: status 0" in proc.stdout

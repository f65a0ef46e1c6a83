"""The trainer's torch use under the CUDA-12 GPU set's torch (issue 35), as a slow CI leg.

The CPU venv runs torch 2.13.0 / transformers 5.19.0; a CUDA-12 GPU machine runs the cu12 set
(requirements-gpu-cu12.txt: torch 2.9.1, transformers 5.3.0). This runs the documented command
`bash tests/torch_set.sh cu12` (a side venv with exactly that set, then the trainer, FSDP2, checkpoint
and weight-sync tests in it) and fails with its output when anything there fails. The first run on a
machine downloads PyPI's CUDA build of torch (docs/gpu.md gives the cost); later ones reuse uv's cache.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SET = "cu12"


def set_pin(package: str) -> str:
    """`package`'s exact pin in requirements-gpu-<SET>.txt (what the side venv must run)."""
    text = (ROOT / f"requirements-gpu-{SET}.txt").read_text()
    match = re.search(rf"^{re.escape(package)}==([^\s;#]+)", text, re.MULTILINE)
    assert match, f"requirements-gpu-{SET}.txt has no exact pin for {package}"
    return match.group(1)


@pytest.mark.slow
def test_trainer_tests_pass_under_the_cu12_sets_torch(tmp_path: Path) -> None:
    env = dict(os.environ)
    # The inner pytest gets its own temporary root, so it cannot prune this run's folders.
    env["PYTEST_ADDOPTS"] = f"{env.get('PYTEST_ADDOPTS', '')} --basetemp={tmp_path / 'inner'}".strip()
    done = subprocess.run(["bash", str(ROOT / "tests" / "torch_set.sh"), SET], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=2400)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"bash tests/torch_set.sh {SET} failed (rc {done.returncode}):\n{output[-8000:]}"
    versions = re.search(r"^\[torch_set\] torch (\S+) .*transformers (\S+), tokenizers (\S+)$", done.stdout,
                         re.MULTILINE)
    assert versions, f"no version line in the output:\n{output[-4000:]}"
    assert versions.group(1).split("+")[0] == set_pin("torch")
    assert versions.group(2) == set_pin("transformers")
    assert versions.group(3) == set_pin("tokenizers")
    summary = done.stdout.strip().splitlines()[-1]
    assert re.search(r"\d+ passed", summary) and not re.search(r"failed|error", summary), output[-8000:]

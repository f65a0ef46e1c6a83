"""Shared set-up of the offline-method tests: a tiny warm start that solves some bundled tasks sometimes."""

from __future__ import annotations

import json
from pathlib import Path

from awm_grpo.warmstart import sft as warmstart

# Bundled train tasks the tests play: clinic_appointments_1 tasks 0-2 (info-seeking, short solutions).
TASKS = 3


def task_prompts(folder: Path, n: int = TASKS) -> Path:
    """A train.jsonl of the first n tasks of the bundled split (awm_grpo.data_prep with its default seed)."""
    from awm_grpo.data_prep import prepare

    splits = folder / "splits"
    if not (splits / "train.jsonl").exists():
        prepare(splits, split_by="task", seed=42)
    rows = (splits / "train.jsonl").read_text().splitlines()[:n]
    out = folder / f"train{n}.jsonl"
    out.write_text("\n".join(rows) + "\n")
    return out


def warm_start(folder: Path, base: Path) -> Path:
    """The tiny model fine-tuned on the tasks' reference solutions until it reproduces them often, not always
    (about 5 s on one thread): exploration then finds successes and failures of the same task."""
    prompts = task_prompts(folder)
    data = folder / "ws-data"
    data.mkdir(exist_ok=True)
    (data / "train.jsonl").write_text(prompts.read_text())
    out = folder / "ws"
    assert warmstart.main(["--data", str(data), "--base", str(base), "--out", str(out), "--epochs", "80",
                           "--lr", "3e-3", "--no-list-tools"]) == 0
    assert json.loads((out / "warmstart.json").read_text())["episodes"] == TASKS
    return out

"""The plan's state-mutating ratio ablation (R1-R3): train.jsonl changes, val/test never do."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from awm_grpo.data_prep import SplitError, Task, main, mix_train, prepare
from awm_grpo.launch import config as C
from awm_grpo.launch.job import LaunchError, ensure_splits


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWM_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "awm-cache"))


def rows(path: Path) -> list[tuple[str, int, str]]:
    return [(r["metadata"]["scenario"], r["metadata"]["task_idx"], r["metadata"]["task_type"])
            for r in map(json.loads, path.read_text().splitlines())]


@pytest.fixture(scope="module")
def mixes(tmp_path_factory) -> dict[str, Path]:
    """The bundled scenarios split by task (the CPU profile's split) under each mix."""
    base = tmp_path_factory.mktemp("mix")
    out = {}
    for mix in ("natural", "mutating_2x", "mutating_only"):
        out[mix] = base / mix
        prepare(out[mix], split_by="task", task_mix=mix)
    return out


def test_counts_follow_the_mix(mixes):
    natural = Counter(rows(mixes["natural"] / "train.jsonl"))
    mutating = {k for k in natural if k[2] == "state_mutating"}
    reading = set(natural) - mutating
    assert mutating and reading and all(n == 1 for n in natural.values())  # both types in the bundled train split
    r2 = Counter(rows(mixes["mutating_2x"] / "train.jsonl"))
    assert set(r2) == set(natural) and all(r2[k] == 2 for k in mutating) and all(r2[k] == 1 for k in reading)
    r3 = Counter(rows(mixes["mutating_only"] / "train.jsonl"))
    assert set(r3) == mutating and all(n == 1 for n in r3.values())
    info = json.loads((mixes["mutating_2x"] / "split_info.json").read_text())
    assert info["task_mix"] == "mutating_2x" and info["counts"]["train"]["tasks"] == len(natural) + len(mutating)
    assert info["train_before_mix"]["prompts"] == len(natural)


def test_held_out_splits_are_byte_identical_across_mixes(mixes):
    for split in ("val", "test"):
        texts = {(p / f"{split}.jsonl").read_bytes() for p in mixes.values()}
        assert len(texts) == 1 and texts.pop()


def test_mix_is_seeded_and_deterministic(mixes, tmp_path):
    prepare(tmp_path / "again", split_by="task", task_mix="mutating_2x")
    assert (tmp_path / "again" / "train.jsonl").read_bytes() == (mixes["mutating_2x"] / "train.jsonl").read_bytes()
    order = rows(mixes["mutating_2x"] / "train.jsonl")
    assert order != sorted(order)  # shuffled: a task's two copies are not laid side by side
    tasks = [Task("s", i, f"t{i}", "state_mutating" if i % 2 else "info_seeking") for i in range(20)]
    assert mix_train(tasks, "mutating_2x", 1) == mix_train(tasks, "mutating_2x", 1)
    assert mix_train(tasks, "mutating_2x", 1) != mix_train(tasks, "mutating_2x", 2)
    assert mix_train(tasks, "natural", 1) is tasks


def test_mix_without_task_types_says_what_to_pass():
    tasks = [Task("s", 0, "t", "state_mutating"), Task("s", 1, "u", None)]
    with pytest.raises(SplitError, match="--task-types"):
        mix_train(tasks, "mutating_only", 0)
    with pytest.raises(SplitError, match="no state_mutating task"):
        mix_train([Task("s", 1, "u", "info_seeking")], "mutating_2x", 0)
    assert mix_train([Task("s", 1, "u", None)], "natural", 0)  # R1 needs no labels


def test_cli_and_launcher_knob_write_the_mix_and_refuse_a_different_one(tmp_path, capsys):
    assert main(["--out", str(tmp_path / "cli"), "--split-by", "task", "--task-mix", "mutating_only"]) == 0
    assert {r[2] for r in rows(tmp_path / "cli" / "train.jsonl")} == {"state_mutating"}
    env = {"AWM_SPLITS_DIR": str(tmp_path / "s"), "AWM_TASK_MIX": "mutating_only"}
    cfg = C.resolve(None, gpus=[], env=env)
    assert "wrote" in ensure_splits(cfg, dry_run=False)
    assert json.loads((tmp_path / "s" / "split_info.json").read_text())["task_mix"] == "mutating_only"
    assert (tmp_path / "s" / "train.jsonl").read_bytes() == (tmp_path / "cli" / "train.jsonl").read_bytes()
    other = C.resolve(None, gpus=[], env={**env, "AWM_TASK_MIX": "natural"})
    with pytest.raises(LaunchError, match="task_mix: 'mutating_only' there, 'natural' asked"):
        ensure_splits(other, dry_run=False)

"""The recipe's train/val/test split: disjoint, seeded, stratified, and reproducible from its artefacts."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from awm.data import bundled_data_dir

from awm_grpo.data_prep import SplitError, Task, deal, main, prepare, split_tasks, target_counts

EXCERPT = Path(__file__).resolve().parents[2].parent / "shared" / "awm_1k_excerpt"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWM_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "awm-cache"))


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def keys(rows: list[dict]) -> set[tuple[str, int]]:
    return {(r["metadata"]["scenario"], r["metadata"]["task_idx"]) for r in rows}


def synthetic(n_scenarios: int, types: tuple[str, ...]) -> list[Task]:
    """Scenario i has 4 tasks of type types[i % len(types)] (so scenarios have a clear stratum)."""
    return [Task(f"s{i:02d}", j, f"task {j} of s{i:02d}", types[i % len(types)])
            for i in range(n_scenarios) for j in range(4)]


def test_target_counts_round_to_the_total():
    assert target_counts(6, (0.7, 0.15, 0.15)) == [4, 1, 1]
    assert target_counts(3, (0.7, 0.15, 0.15)) == [2, 1, 0]
    assert target_counts(60, (0.7, 0.15, 0.15)) == [42, 9, 9]


def test_bundled_split_by_scenario_is_disjoint_complete_and_recorded(tmp_path):
    info = prepare(tmp_path)
    splits = {n: read(tmp_path / f"{n}.jsonl") for n in ("train", "val", "test")}
    scenarios = {n: {r["metadata"]["scenario"] for r in rows} for n, rows in splits.items()}
    assert not scenarios["train"] & scenarios["val"] and not scenarios["train"] & scenarios["test"]
    assert not scenarios["val"] & scenarios["test"]
    assert [len(scenarios[n]) for n in ("train", "val", "test")] == [4, 1, 1]  # 6 x (0.7, 0.15, 0.15)
    assert sum(len(rows) for rows in splits.values()) == 60  # every bundled task has a verifier
    assert {n: sorted(s) for n, s in scenarios.items()} == info["scenarios"]
    saved = json.loads((tmp_path / "split_info.json").read_text())
    assert saved["scenarios"] == info["scenarios"] and saved["seed"] == 42 and saved["ratios"] == [0.7, 0.15, 0.15]
    assert saved["data_dir"] == str(bundled_data_dir().resolve()) and saved["bundled"] is True
    assert saved["stratified_by"] == "task_type"
    row = splits["val"][0]
    assert row["text"] == [{"role": "user", "content": row["metadata"]["task"]}]
    assert set(row["metadata"]) == {"scenario", "task_idx", "task", "task_type", "split", "data_dir"}
    assert row["metadata"]["split"] == "val" and row["metadata"]["task_type"] in ("info_seeking", "state_mutating")
    counts = Counter(r["metadata"]["task_type"] for r in splits["train"])
    assert saved["counts"]["train"]["task_types"] == dict(counts)


def test_split_is_deterministic_and_the_seed_matters(tmp_path):
    prepare(tmp_path / "a", seed=7)
    prepare(tmp_path / "b", seed=7)
    for name in ("train.jsonl", "val.jsonl", "test.jsonl", "split_info.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    tasks = synthetic(40, ("x",))
    by_seed = {seed: split_tasks(tasks, ratios=(0.7, 0.15, 0.15), seed=seed, split_by="scenario")["val"]
               for seed in (1, 2)}
    assert {t.scenario for t in by_seed[1]} != {t.scenario for t in by_seed[2]}


def test_split_by_task_holds_out_tasks_within_scenarios_stratified(tmp_path):
    info = prepare(tmp_path, split_by="task")
    train, val, test = (keys(read(tmp_path / f"{n}.jsonl")) for n in ("train", "val", "test"))
    assert not train & val and not train & test and not val & test
    assert len(train | val | test) == 60 and [len(train), len(val), len(test)] == [42, 9, 9]
    # 18 info-seeking / 42 state-mutating tasks: each split keeps that mix (0.15 x 18 ~ 3, 0.15 x 42 ~ 6)
    assert info["counts"]["val"]["task_types"] == {"info_seeking": 3, "state_mutating": 6}
    assert info["counts"]["test"]["task_types"] == {"info_seeking": 3, "state_mutating": 6}
    assert len(info["scenarios"]["val"]) >= 4  # held-out tasks come from most scenarios


def test_scenario_strata_are_spread_over_the_splits():
    # 20 scenarios of type a, 20 of type b: each split gets both types in proportion
    parts = split_tasks(synthetic(40, ("a", "b")), ratios=(0.5, 0.25, 0.25), seed=3, split_by="scenario")
    for name, expected in (("train", 10), ("val", 5), ("test", 5)):
        per_type = Counter(t.task_type for t in parts[name] if t.task_idx == 0)
        assert per_type == {"a": expected, "b": expected}, name


def test_deal_without_strata_follows_the_ratios():
    parts = deal([(None, i) for i in range(100)], (0.7, 0.15, 0.15), seed=0)
    assert [len(p) for p in parts] == [70, 15, 15]
    assert sorted(x for p in parts for x in p) == list(range(100))


def test_max_scenarios_is_a_seeded_sample_not_the_first_names():
    tasks = synthetic(30, ("x",))
    picked = set()
    for seed in (0, 1):
        parts = split_tasks(tasks, ratios=(0.7, 0.15, 0.15), seed=seed, split_by="scenario", max_scenarios=10)
        names = {t.scenario for p in parts.values() for t in p}
        assert len(names) == 10
        picked.add(frozenset(names))
    assert len(picked) == 2 and frozenset(f"s{i:02d}" for i in range(10)) not in picked


def test_labels_file_and_exclusions(tmp_path):
    labels = tmp_path / "labels.jsonl"
    labels.write_text("".join(json.dumps({"scenario": "library_lending_1", "task_idx": i, "task_type": "custom"}) + "\n"
                              for i in range(10)))
    audit = tmp_path / "audit.jsonl"
    audit.write_text(json.dumps({"scenario": "travel_booking_1", "task_idx": 0, "flag": "complete_at_reset"}) + "\n"
                     + json.dumps({"scenario": "travel_booking_1", "task_idx": 1, "flag": ""}) + "\n")
    info = prepare(tmp_path / "out", split_by="task", task_types_file=labels, exclude_file=audit)
    rows = [r for n in ("train", "val", "test") for r in read(tmp_path / "out" / f"{n}.jsonl")]
    assert len(rows) == 59 and ("travel_booking_1", 0) not in keys(rows) and ("travel_booking_1", 1) in keys(rows)
    assert {r["metadata"]["task_type"] for r in rows if r["metadata"]["scenario"] == "library_lending_1"} == {"custom"}
    assert info["task_types_file"] == str(labels.resolve()) and info["exclude_file"] == str(audit.resolve())


def test_bad_ratios_fail():
    with pytest.raises(SplitError, match="sum to 1"):
        split_tasks(synthetic(5, ("x",)), ratios=(0.5, 0.5, 0.5), seed=0, split_by="scenario")


def test_awm1k_excerpt_read_in_place(tmp_path, capsys):
    if not EXCERPT.is_dir():
        pytest.fail(f"the AWM-1K excerpt is not at {EXCERPT}: the shared folder beside the repository holds it")
    # The excerpt has verifiers only for e_commerce_33, whose environment code is not included.
    assert main(["--data-dir", str(EXCERPT), "--out", str(tmp_path / "a")]) == 2
    assert "--include-unrunnable" in capsys.readouterr().err
    assert main(["--data-dir", str(EXCERPT), "--out", str(tmp_path / "b"), "--include-unrunnable",
                 "--split-by", "task"]) == 0
    rows = [r for n in ("train", "val", "test") for r in read(tmp_path / "b" / f"{n}.jsonl")]
    assert keys(rows) == {("e_commerce_33", 0), ("e_commerce_33", 1), ("e_commerce_33", 2)}
    assert all(r["metadata"]["task_type"] is None and r["metadata"]["data_dir"] == str(EXCERPT.resolve())
               for r in rows)
    info = json.loads((tmp_path / "b" / "split_info.json").read_text())
    assert info["stratified_by"] is None and info["counts"]["train"]["tasks"] == 2


def test_task_split_of_the_practice_set_spreads_every_family_over_train_and_held_out(tmp_path):
    from awm.scenarios import build

    practice = tmp_path / "practice"
    assert build.main(["--practice", str(practice)]) == 0
    prepare(tmp_path / "splits", data_dir=practice, split_by="task", seed=42)
    seen: dict[tuple[str, str], set[str]] = {}
    for name in ("train", "val", "test"):
        for line in (tmp_path / "splits" / f"{name}.jsonl").read_text().splitlines():
            meta = json.loads(line)["metadata"]
            if meta.get("family"):
                seen.setdefault((meta["scenario"], meta["family"]), set()).add(name)
    assert len(seen) >= 40
    assert all("train" in s for s in seen.values())
    assert sum(bool(s & {"val", "test"}) for s in seen.values()) >= 0.9 * len(seen)


def test_renamed_worlds_are_training_data_only():
    real = [Task("shop", j, f"t{j}", "info_seeking", "price") for j in range(10)]
    renamed = [Task(f"shop_w{k}", j, f"t{j}'", "info_seeking", "price", world=k) for k in (1, 2) for j in range(10)]
    for split_by in ("task", "scenario"):
        plain = split_tasks(real, ratios=(0.6, 0.2, 0.2), seed=3, split_by=split_by)
        mixed = split_tasks(real + renamed, ratios=(0.6, 0.2, 0.2), seed=3, split_by=split_by)
        assert mixed["val"] == plain["val"] and mixed["test"] == plain["test"]  # held-out: real names only
        assert all(t.world == 0 for name in ("val", "test") for t in mixed[name])
        held_out_scenario = split_by == "scenario" and not plain["train"]
        assert len(mixed["train"]) == len(plain["train"]) + (0 if held_out_scenario else 20)
    assert renamed[0].base == "shop" and real[0].base == "shop"


def test_world_tasks_worded_as_a_held_out_task_stay_out_of_train():
    real = [Task("air", j, f"fare of flight {j}?", "info_seeking", "fare") for j in range(10)]
    worlds = [Task(f"air_w{k}", j, f"fare of flight {j}?", "info_seeking", "fare", world=k) for k in (1, 2)
              for j in range(10)]  # no name to rename: the same words, and the same fares in the world's DB
    out = split_tasks(real + worlds, ratios=(0.6, 0.2, 0.2), seed=3, split_by="task")
    held_out = {t.task for name in ("val", "test") for t in out[name]}
    assert held_out and not any(t.task in held_out for t in out["train"])
    train_worlds = [t for t in out["train"] if t.world]
    assert len(train_worlds) == 2 * (10 - len(held_out))  # the others stay

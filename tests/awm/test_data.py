"""The AWM-1K data layer: the real excerpt loads unchanged; keys, duplicates, bad lines."""

from __future__ import annotations

import json

import pytest
from awm.data import AWMDataset, DataFormatError, normalize_scenario_name, stage_of


def test_normalize_scenario_name():
    assert normalize_scenario_name("Bike Rental - City") == "bike_rental_city"
    assert normalize_scenario_name("e_commerce_33") == "e_commerce_33"
    assert normalize_scenario_name("  A__B!!c ") == "a_b_c"


def test_stage_of_shards_and_pure_code():
    assert stage_of("gen_db.jsonl") == "gen_db"
    assert stage_of("gen_db.e_commerce_33.jsonl") == "gen_db"
    assert stage_of("gen_verifier.jsonl") == "gen_verifier"
    assert stage_of("gen_verifier.pure_code.jsonl") == "gen_verifier.pure_code"
    assert stage_of("gen_verifier.pure_code.part2.jsonl") == "gen_verifier.pure_code"
    assert stage_of("gen_verifier.part2.jsonl") == "gen_verifier"
    assert stage_of("README.md") is None and stage_of("reference_solutions.jsonl") is None


def test_excerpt_loads_unchanged_and_joins_on_scenario(excerpt_dir, cache_dir):
    ds = AWMDataset(excerpt_dir, cache_dir=cache_dir)
    names = ds.scenario_names()
    assert {
        "e_commerce_33",
        "content_platform_1",
        "code_hosting_2",
        "communication_messaging_1",
        "marketplace_1",
    } <= set(names)
    assert ds.scenario_names(runnable_only=True) == ["code_hosting_2", "content_platform_1"]
    ec = ds.scenario("e_commerce_33")
    assert len(ec.tasks) == 10 and len(ec.db_schema["tables"]) == 19
    assert sum(len(t["insert_statements"]) for t in ec.sample_data["tables"]) == 133
    assert ec.full_code is None and not ec.runnable  # no gen_envs row of e_commerce_33 in the excerpt
    cp = ds.scenario("content_platform_1")
    assert cp.runnable and "FastAPI" in cp.full_code and len(cp.api_spec["api_groups"]) == 11
    assert ds.scenario("marketplace_1").description.startswith(
        json.loads((excerpt_dir / "gen_scenario.jsonl").read_text().splitlines()[0])["description"][:40]
    )
    v = ds.verifier("e_commerce_33", 1)
    assert v.code.lstrip().startswith("def verify_task_completion") and v.task == ec.tasks[1]
    assert ds.verifier("e_commerce_33", 7) is None
    with pytest.raises(KeyError, match="nope"):
        ds.scenario("nope")


def _verifier_row(idx: int, code: str | None) -> str:
    return (
        json.dumps(
            {
                "scenario": "Shop One",
                "task_idx": idx,
                "task": "t",
                "verification": {"code": code, "raw_response": ""},
            }
        )
        + "\n"
    )


def test_duplicate_verifier_rule(tmp_path, cache_dir):
    good_old = "def verify_task_completion(a, b, final_answer=None):\n    return {'result': 'others'}\n"
    good_new = "def verify_task_completion(a, b, final_answer=None):\n    return {'result': 'complete'}\n"
    (tmp_path / "gen_tasks.jsonl").write_text(
        json.dumps({"scenario": "shop_one", "tasks": ["t"] * 10}) + "\n"
    )
    (tmp_path / "gen_verifier.pure_code.jsonl").write_text(
        _verifier_row(0, good_old)
        + _verifier_row(0, good_new)
        + _verifier_row(0, "def broken(:")
        + _verifier_row(1, None)
    )
    last = AWMDataset(tmp_path, cache_dir=cache_dir)
    assert last.verifier("shop_one", 0).code == good_new  # last row that compiles and defines verify_*
    assert last.verifier("shop_one", 0).rows_for_key == 3
    assert last.duplicates["gen_verifier.pure_code"] == 2
    assert (
        AWMDataset(tmp_path, cache_dir=cache_dir, verifier_rule="first").verifier("shop_one", 0).code
        == good_old
    )
    assert last.verifier("shop_one", 1).code is None  # null code is kept and reported, not dropped silently
    assert last.task_keys(runnable_only=False) == [("shop_one", 0), ("shop_one", 1)]
    excluded = AWMDataset(tmp_path, cache_dir=cache_dir, exclude=[("Shop One", 1)])
    assert excluded.task_keys(runnable_only=False) == [("shop_one", 0)]


def test_malformed_line_names_file_and_line(tmp_path, cache_dir):
    (tmp_path / "gen_tasks.jsonl").write_text(
        '{"scenario": "a", "tasks": []}\n{"scenario": "b", "tasks": [\n'
    )
    with pytest.raises(DataFormatError, match=r"gen_tasks.jsonl:2: not valid JSON"):
        AWMDataset(tmp_path, cache_dir=cache_dir)
    (tmp_path / "gen_tasks.jsonl").write_text('{"name_wrong": "a"}\n')
    with pytest.raises(
        DataFormatError, match=r"gen_tasks.jsonl:1: expected a JSON object with a string 'scenario'"
    ):
        AWMDataset(tmp_path, cache_dir=cache_dir)


def test_large_files_are_indexed_once(tmp_path, cache_dir):
    rows = [{"scenario": f"s{i}", "tasks": ["x" * 200] * 10} for i in range(600)]
    path = tmp_path / "gen_tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))  # > 1 MB: the index is cached on disk
    AWMDataset(tmp_path, cache_dir=cache_dir)
    assert list((cache_dir / "index").glob("gen_tasks.jsonl.*.json"))
    ds = AWMDataset(tmp_path, cache_dir=cache_dir)
    assert ds.tasks("s599") == ["x" * 200] * 10 and len(ds.scenario_names()) == 600


def test_missing_directory_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="awm data download"):
        AWMDataset(tmp_path / "absent")

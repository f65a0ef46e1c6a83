"""Every wrong type in every AWM-1K field is named by file:line, the field and what was expected.

The records are the real ones of the AWM-1K excerpt (../shared/awm_1k_excerpt), each with one field
changed to a wrong type, and read by the real loader (`awm.data.AWMDataset`): before, a string
`tables` or a numeric `ddl` failed later with a bare AttributeError/TypeError in the DB build, and a
string `insert_statements` was run one character at a time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from awm.data import AWMDataset, DataFormatError


def _first_record(excerpt: Path, stage: str) -> tuple[str, dict[str, Any]]:
    """The file name and first record of a stage in the excerpt (shards of a stage: the first shard)."""
    files = sorted(p for p in excerpt.glob(f"{stage}*.jsonl")
                   if stage != "gen_verifier" or not p.name.startswith("gen_verifier.pure_code"))
    assert files, f"the excerpt has no {stage} file"
    with open(files[0]) as f:
        return files[0].name, json.loads(f.readline())


def _set(record: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy of `record` with the field at dotted `path` (`a.b[0].c`) set to `value`."""
    out = json.loads(json.dumps(record))
    parts = path.replace("[", ".[").split(".")
    node = out
    for part in parts[:-1]:
        node = node[int(part[1:-1])] if part.startswith("[") else node[part]
    last = parts[-1]
    if last.startswith("["):
        node[int(last[1:-1])] = value
    else:
        node[last] = value
    return out


# (stage, field path, wrong value, what the message must say after "file:2: ")
CASES = [
    ("gen_scenario", "description", ["a", "b"], "field 'description' is a list, expected str"),
    ("gen_scenario", "categories", "travel", "field 'categories' is a str, expected list"),
    ("gen_scenario", "suitability_score", "high", "field 'suitability_score' is a str, expected int or float"),
    ("gen_tasks", "tasks", {"0": "x"}, "field 'tasks' is a object, expected list"),
    ("gen_tasks", "tasks[3]", None, r"field 'tasks' must be a list of strings: field 'tasks\[3\]' is null"),
    ("gen_db", "db_schema.tables", "CREATE TABLE t (a);", "field 'db_schema.tables' is a str, expected list"),
    ("gen_db", "db_schema.tables[0]", "CREATE TABLE t (a);",
     r"field 'db_schema.tables\[0\]' is a str, expected an object"),
    ("gen_db", "db_schema.tables[0].ddl", 7, r"field 'db_schema.tables\[0\].ddl' is a int, expected str"),
    ("gen_db", "db_schema.tables[0].name", ["users"], r"field 'db_schema.tables\[0\].name' is a list, expected str"),
    ("gen_db", "db_schema.tables[0].indexes", "CREATE INDEX i ON t(a);",
     r"field 'db_schema.tables\[0\].indexes' is a str, expected list"),
    ("gen_db", "db_schema.tables[0].indexes", [3],
     r"field 'db_schema.tables\[0\].indexes' must be a list of strings: field 'db_schema.tables\[0\].indexes\[0\]' "
     "is a int, expected str"),
    ("gen_db", "db_schema.tables[0].examples", {"a": 1}, r"field 'db_schema.tables\[0\].examples' is a object"),
    ("gen_db", "db_path", 5, "field 'db_path' is a int, expected str"),
    ("gen_sample", "sample_data.tables", {"users": []}, "field 'sample_data.tables' is a object, expected list"),
    ("gen_sample", "sample_data.tables[0].insert_statements", "INSERT INTO users (id) VALUES (1);",
     r"field 'sample_data.tables\[0\].insert_statements' is a str, expected list"),
    ("gen_sample", "sample_data.tables[0].insert_statements[0]", {"sql": "INSERT"},
     r"field 'sample_data.tables\[0\].insert_statements' must be a list of strings: "
     r"field 'sample_data.tables\[0\].insert_statements\[0\]' is a object"),
    ("gen_sample", "sample_data.tables[0].table_name", 1, r"field 'sample_data.tables\[0\].table_name' is a int"),
    ("gen_sample", "tables_count", "19", "field 'tables_count' is a str, expected int"),
    ("gen_sample", "inserts_count", True, "field 'inserts_count' is a bool, expected int"),
    ("gen_envs", "full_code", 42, "field 'full_code' is a int, expected str"),
    ("gen_envs", "db_path", ["x"], "field 'db_path' is a list, expected str"),
    ("gen_spec", "api_spec.api_groups", "users", "field 'api_spec.api_groups' is a str, expected list"),
    ("gen_spec", "api_spec.api_groups[0].endpoints[0]", "GET /users",
     r"field 'api_spec.api_groups\[0\].endpoints\[0\]' is a str, expected object"),
    ("gen_verifier.pure_code", "task", 3, "field 'task' is a int, expected str"),
    ("gen_verifier.pure_code", "task_idx", "0", "field 'task_idx' is a str, expected int"),
    ("gen_verifier.pure_code", "task_idx", -1, "verifier row without a non-negative integer 'task_idx' \\(got -1\\)"),
    ("gen_verifier.pure_code", "verification", "def verify_task_completion(): ...",
     "field 'verification' is a str, expected an object"),
    ("gen_verifier.pure_code", "verification.raw_response", {"reasoning": "x"},
     "field 'verification.raw_response' is a object, expected str"),
]


@pytest.mark.parametrize("stage,field,value,message", CASES, ids=[f"{c[0]}:{c[1]}={type(c[2]).__name__}"
                                                                 for c in CASES])
def test_wrong_type_in_a_real_record_names_file_line_and_field(excerpt_dir, tmp_path, cache_dir, stage, field,
                                                                value, message):
    name, record = _first_record(excerpt_dir, stage)
    root = tmp_path / "data"
    root.mkdir()
    # line 1 the real record untouched (it must pass), line 2 the same record with one field wrong
    bad = _set(record, field, value)
    key = "name" if stage == "gen_scenario" else "scenario"
    bad[key] = record[key] + "_2"
    (root / name).write_text(json.dumps(record) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(DataFormatError, match=f"{name}:2: {message}"):
        AWMDataset(root, cache_dir=cache_dir)


def test_sql_verifier_rows_are_checked_too(excerpt_dir, tmp_path, cache_dir):
    """gen_verifier.jsonl (sql mode, not in the excerpt): the same shape as the pure-code file's rows."""
    _, record = _first_record(excerpt_dir, "gen_verifier.pure_code")
    root = tmp_path / "data"
    root.mkdir()
    (root / "gen_verifier.jsonl").write_text(json.dumps(_set(record, "verification.code", ["x"])) + "\n")
    with pytest.raises(DataFormatError, match="gen_verifier.jsonl:1: field 'verification.code' is a list, expected str"):
        AWMDataset(root, cache_dir=cache_dir)


def test_the_whole_excerpt_still_loads(excerpt_dir, cache_dir):
    """The shape check refuses nothing the real release holds (nulls included: they are missing, not wrong)."""
    dataset = AWMDataset(excerpt_dir, cache_dir=cache_dir)
    assert len(dataset.scenario_names()) >= 4 and dataset.verifier("e_commerce_33", 0) is not None


def test_an_index_cached_before_the_check_is_not_trusted(excerpt_dir, tmp_path, cache_dir):
    """A file indexed by the old loader (its index cached on disk) is scanned again, so a wrong type in
    it is found: the index version changed with the check."""
    name, record = _first_record(excerpt_dir, "gen_sample")
    root = tmp_path / "data"
    root.mkdir()
    bad = _set(record, "sample_data.tables[0].insert_statements", "INSERT INTO users (id) VALUES (1);")
    path = root / name
    path.write_text(json.dumps(bad) + "\n" + " " * 1_100_000 + "\n")  # over the size that gets a cached index
    import hashlib

    st = path.stat()
    tag = hashlib.sha1(f"2|{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    old = cache_dir / "index" / f"{name}.{tag}.json"
    old.parent.mkdir(parents=True, exist_ok=True)
    old.write_text(json.dumps({"keys": {record["scenario"]: [[0, len(json.dumps(bad)) + 1, 1]]},
                               "names": {record["scenario"]: record["scenario"]}}))
    with pytest.raises(DataFormatError, match=f"{name}:1: field 'sample_data.tables\\[0\\].insert_statements'"):
        AWMDataset(root, cache_dir=cache_dir)

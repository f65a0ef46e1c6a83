"""Bad data and bad ids: each is refused with a message that names where it is and what to do.

Also: a data folder as upstream's pipeline writes it (code-mode verifiers in `gen_verifier.jsonl`)
runs its code verifiers, decided per record from the code, and `awm data info` counts them.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from awm.data import AWMDataset, DataFormatError, verifier_mode
from awm.episode import EnvRuntime
from conftest import FAULT_APP, write_scenarios

TASKS = {"scenario": "notes", "tasks": ["Add a note."]}


def _write(root: Path, name: str, lines: list[bytes]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / name).write_bytes(b"".join(line + b"\n" for line in lines))
    return root


def _line(rec: dict) -> bytes:
    return json.dumps(rec).encode()


@pytest.mark.parametrize("bad,message", [
    (b'{"scenario": "caf\xe9", "tasks": []}', r"gen_tasks.jsonl:2: byte 0xe9 at column 18 is not UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000, r"gen_tasks.jsonl:2: JSON nested too deeply"),
    (_line({"scenario": "x", "tasks": "Add a note."}), r"gen_tasks.jsonl:2: field 'tasks' is a str, expected list"),
    (_line({"scenario": "x", "tasks": ["ok", 3]}), r"gen_tasks.jsonl:2: field 'tasks' must be a list of strings"),
    (_line({"scenario": "Notes", "tasks": []}), r"gen_tasks.jsonl:2: scenario 'Notes' and 'notes' "
                                                r"\(.*gen_tasks.jsonl:1\) both normalise to 'notes'"),
])
def test_malformed_line_names_file_and_line(tmp_path, cache_dir, bad, message):
    root = _write(tmp_path / "data", "gen_tasks.jsonl", [_line(TASKS), bad])
    with pytest.raises(DataFormatError, match=message):
        AWMDataset(root, cache_dir=cache_dir)


def test_wrong_types_in_other_stages(tmp_path, cache_dir):
    for name, rec, field in [
        ("gen_envs.jsonl", {"scenario": "x", "full_code": ["import os"]}, "full_code"),
        ("gen_db.jsonl", {"scenario": "x", "db_schema": "CREATE TABLE t (a)"}, "db_schema"),
        ("gen_verifier.pure_code.jsonl", {"scenario": "x", "task_idx": 0, "verification": {"code": 7}},
         "verification.code"),
    ]:
        root = _write(tmp_path / name, name, [_line(rec)])
        with pytest.raises(DataFormatError, match=f"{name}:1: field '{field}'"):
            AWMDataset(root, cache_dir=cache_dir)


def test_name_collision_across_shards_of_a_stage(tmp_path, cache_dir):
    root = _write(tmp_path / "data", "gen_tasks.a.jsonl", [_line({"scenario": "Faulty-1", "tasks": []})])
    _write(root, "gen_tasks.b.jsonl", [_line({"scenario": "faulty_1", "tasks": []})])
    with pytest.raises(DataFormatError, match="'faulty_1' and 'Faulty-1'.*both normalise to 'faulty_1'"):
        AWMDataset(root, cache_dir=cache_dir)


def test_bad_and_duplicate_episode_ids_are_refused(fault_data_dir, cache_dir, tmp_path):
    async def main():
        with EnvRuntime(fault_data_dir, num_workers=1, cache_dir=cache_dir) as rt:
            live = await rt.open("faults", episode_id="run-1")
            await live.call("add_note", {"text": "mine"})
            with pytest.raises(ValueError, match="'run-1' is already open"):
                await rt.open("faults", episode_id="run-1")
            for bad in ("../../x", "/tmp/x", ".hidden", "a/b", "x" * 200):
                with pytest.raises(ValueError, match="is not allowed"):
                    await rt.open("faults", episode_id=bad)
            assert "mine" in (await live.call("list_notes", {})).text  # the live episode's DB is untouched
            return rt.episode_dir

    episode_dir = asyncio.run(main())
    assert not (episode_dir.parent / "x.db").exists() and not Path("/tmp/x.db").exists()


def test_verifier_mode_is_read_from_the_code():
    assert verifier_mode("def verify_task_completion(initial_db_path, final_db_path, final_answer=None):", "sql") == "code"
    assert verifier_mode("def verify_task(initial_db_path, final_db_path):", "code") == "sql"
    assert verifier_mode("def verify_x(a, b, final_answer):\n    pass", "sql") == "code"
    assert verifier_mode("def verify_x(a, b):\n    pass", "code") == "sql"
    assert verifier_mode("x = 1", "code") == "code" and verifier_mode(None, "sql") == "sql"


def test_upstream_pipeline_output_runs_its_code_verifiers(tmp_path, cache_dir):
    """Upstream's pipeline writes code-mode verifiers to gen_verifier.jsonl: they load, count and run."""
    root = write_scenarios(tmp_path / "upstream", {"faults": FAULT_APP})
    (root / "gen_verifier.pure_code.jsonl").rename(root / "gen_verifier.jsonl")
    ds = AWMDataset(root, cache_dir=cache_dir)
    assert ds.task_keys() == [("faults", 0)]
    assert ds.verifier("faults", 0, mode="sql") is None

    async def main():
        with EnvRuntime(dataset=ds, num_workers=1, cache_dir=cache_dir) as rt:
            ep = await rt.open("faults", 0)
            await ep.call("add_note", {"text": "buy milk"})
            return (await ep.verify("done")).verdict

    assert asyncio.run(main()) == "complete"
    info = subprocess.run([sys.executable, "-m", "awm.cli", "data", "info", "--data-dir", str(root)],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "AWM_CACHE_DIR": str(cache_dir)})
    summary = json.loads(info.stdout)
    assert summary["tasks_with_code_verifier"] == 1
    assert summary["verifier_rows_by_mode"] == {"gen_verifier": {"code": 1, "sql": 0}}


def test_real_awm1k_verifiers_count_from_either_file(excerpt_dir, tmp_path, cache_dir):
    """The excerpt's real code verifiers, linked in place under upstream's pipeline file name."""
    root = tmp_path / "linked"
    root.mkdir()
    (root / "gen_tasks.jsonl").symlink_to(excerpt_dir / "gen_tasks.jsonl")
    (root / "gen_verifier.jsonl").symlink_to(excerpt_dir / "gen_verifier.pure_code.jsonl")
    ds = AWMDataset(root, cache_dir=cache_dir)
    assert ds.verifier_rows() == {"gen_verifier": {"code": 3, "sql": 0}}
    assert [ds.verifier("e_commerce_33", i).task_idx for i in range(3)] == [0, 1, 2]

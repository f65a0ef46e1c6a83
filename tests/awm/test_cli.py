"""The `awm` command line, run as a user would (subprocesses, JSON on stdout)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from awm.audit import read_exclusions
from awm.data import AWMDataset
from conftest import FAULT_APP, FAULT_VERIFIER, write_scenarios


def awm(*args: str, cache: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "AWM_CACHE_DIR": str(cache)}
    return subprocess.run([sys.executable, "-m", "awm.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def test_help_lists_the_commands(tmp_path):
    out = awm("--help", cache=tmp_path)
    assert out.returncode == 0
    for word in ("data", "env", "verify", "demo"):
        assert word in out.stdout
    assert "serve a scenario over MCP" in awm("env", "--help", cache=tmp_path).stdout


def test_env_check_prints_the_tool_list(excerpt_dir, tmp_path):
    out = awm("env", "check", "--data-dir", str(excerpt_dir), "--scenario", "content_platform_1", cache=tmp_path)
    assert out.returncode == 0, out.stderr
    tools = json.loads(out.stdout)
    assert len(tools) == 34 and set(tools[0]) == {"name", "description", "inputSchema"}
    missing = awm("env", "check", "--data-dir", str(excerpt_dir), "--scenario", "e_commerce_33", cache=tmp_path)
    assert missing.returncode == 1 and "no environment code" in missing.stderr


def test_env_check_all_table_on_bundled_scenarios(tmp_path):
    out = awm("env", "check_all", "--json", cache=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert len(rows) >= 6 and all(r["ok"] and r["tools"] >= 10 for r in rows)


def test_reset_db_is_byte_identical_with_a_clock(excerpt_dir, tmp_path):
    def build(dest: str) -> dict:
        out = awm("env", "reset_db", "--data-dir", str(excerpt_dir), "--scenarios", "e_commerce_33",
                  "--clock", "2025-05-05T00:00:00", "--database-dir", str(tmp_path / dest), cache=tmp_path)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)[0]

    a, b = build("a"), build("b")
    assert a["sha256"] == b["sha256"] and a["inserts"] == "133/133" and a["failed"] == 0


def test_verify_and_audit(tmp_path):
    data = write_scenarios(tmp_path / "data", {"notes": FAULT_APP})
    always = "def verify_task_completion(initial_db_path, final_db_path, final_answer=None):\n    return {'result': 'complete'}\n"
    crash = "def verify_task_completion(initial_db_path, final_db_path, final_answer=None):\n    raise KeyError('x')\n"
    hang = "def verify_task_completion(initial_db_path, final_db_path, final_answer=None):\n    while True: pass\n"
    rows = [(0, FAULT_VERIFIER), (1, always), (2, crash), (3, hang)]
    (data / "gen_verifier.pure_code.jsonl").write_text("".join(json.dumps(
        {"scenario": "notes", "task_idx": i, "task": "t", "verification": {"code": c, "raw_response": ""}}) + "\n"
        for i, c in rows))
    out = awm("verify", "audit", "--data-dir", str(data), "--timeout", "1", "--out", str(tmp_path / "audit.jsonl"),
              cache=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "notes#1: complete_at_reset" in out.stdout and "notes#2: crash" in out.stdout
    assert "notes#3: timeout" in out.stdout and "notes#0" not in out.stdout
    flagged = read_exclusions(tmp_path / "audit.jsonl")
    assert {i for _, i in flagged} == {1, 2, 3, 4, 5, 6, 7, 8, 9}  # 4-9 have no verifier at all
    assert AWMDataset(data, exclude=flagged, cache_dir=tmp_path).task_keys() == [("notes", 0)]

    import shutil
    import sqlite3
    template = next((tmp_path / "templates").glob("notes-*.db"))
    final = tmp_path / "final.db"
    shutil.copyfile(template, final)
    conn = sqlite3.connect(final)
    conn.execute("INSERT INTO notes (text) VALUES ('buy milk')")
    conn.commit()
    conn.close()
    done = awm("verify", "--data-dir", str(data), "--scenario", "notes", "--task-idx", "0", "--final-db", str(final),
               cache=tmp_path)
    assert done.returncode == 0 and json.loads(done.stdout)["verdict"] == "complete"
    crashed = awm("verify", "--data-dir", str(data), "--scenario", "notes", "--task-idx", "2", "--final-db",
                  str(final), cache=tmp_path)
    assert crashed.returncode == 3 and json.loads(crashed.stdout)["verdict"] == "judge_error"

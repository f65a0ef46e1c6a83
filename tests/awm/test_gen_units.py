"""The pieces of `awm gen`: reply parsing, data checks, probe arguments, resumable files, the client's
usage meter and embeddings, verifier and environment validation."""

from __future__ import annotations

import asyncio
import json
import math
import socket
import sqlite3

import pytest
from awm import cli
from awm.gen.arguments import SampleValues, candidate_arguments, value_for
from awm.gen.checks import Invalid, check_sample, check_schema, check_spec, check_tasks
from awm.gen.config import GenConfig
from awm.gen.execution import check_env, check_verifier
from awm.gen.records import JsonlWriter, read_records, record_key, repair_tail
from awm.gen.replies import ReplyError, parse_json, parse_python
from awm.gen.runner import run_stages
from awm.gen.scenario_stage import cosine
from awm.llm import ChatClient, LLMError
from awm.tools import ToolSpec
from awm.verifier import VerifierSandbox
from conftest import FAULT_APP
from fake_llm import FakeOpenAI

USERS = "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT NOT NULL);"
LISTS = "CREATE TABLE lists (id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL REFERENCES users(id), title TEXT);"
SCHEMA = {"tables": [{"name": "users", "ddl": USERS, "indexes": []}, {"name": "lists", "ddl": LISTS, "indexes": []}]}


# ---- replies ------------------------------------------------------------------------------
def test_parse_json_takes_whole_fenced_or_embedded_values():
    assert parse_json('{"a": 1}') == {"a": 1}
    assert parse_json('<think>plan</think>\n```json\n{"a": 2}\n```') == {"a": 2}
    assert parse_json('Sure! Here it is: [1, 2] Hope that helps.') == [1, 2]
    with pytest.raises(ReplyError, match="not valid JSON"):
        parse_json('{"tasks": ["a", "b"')
    with pytest.raises(ReplyError, match="empty"):
        parse_json("<think>only thinking</think>")


def test_parse_python_accepts_json_fenced_or_bare_code_and_reports_syntax_errors():
    assert parse_python('{"full_code": "x = 1\\n"}', "full_code") == "x = 1\n"
    assert parse_python("Code:\n```python\ny = 2\n```\n", "full_code") == "y = 2\n"
    assert parse_python("z = 3", "full_code") == "z = 3"
    with pytest.raises(ReplyError, match="line 2"):
        parse_python("```python\nok = 1\ndef f(:\n```", "full_code")


# ---- data checks --------------------------------------------------------------------------
def test_check_tasks_dedups_and_truncates():
    tasks = check_tasks({"tasks": [{"task": "A"}, "a", "B", "C"]}, 3)
    assert tasks == ["A", "B", "C"]
    with pytest.raises(Invalid, match="2 distinct"):
        check_tasks({"tasks": ["A", "A", "B"]}, 3)


def test_check_schema_executes_ddl_and_resolves_foreign_keys():
    assert [t["name"] for t in check_schema(SCHEMA)["tables"]] == ["users", "lists"]
    dangling = {"tables": [{"name": "lists", "ddl": LISTS.replace("users(id)", "owners(id)")}]}
    with pytest.raises(Invalid, match="missing table 'owners'"):
        check_schema(dangling)
    bad_index = {"tables": [{"name": "users", "ddl": USERS, "indexes": ["CREATE INDEX i ON users(nope);"]}]}
    with pytest.raises(Invalid, match="index failed: no such column: nope"):
        check_schema(bad_index)
    with pytest.raises(Invalid, match="creates 'users'"):
        check_schema({"tables": [{"name": "people", "ddl": USERS}]})


def test_check_sample_threshold_and_dropped_inserts():
    ok = [f"INSERT INTO lists (id, user_id, title) VALUES ({i}, 1, 'l{i}');" for i in range(2, 11)]
    rows = ["INSERT INTO users (id, name) VALUES (1, 'Ada');", *ok, "INSERT INTO lists (id, user_id) VALUES (99, 7);"]
    sample = {"tables": [{"table_name": "users", "insert_statements": rows[:1]},
                         {"table_name": "lists", "insert_statements": rows[1:]}]}
    clean, dropped = check_sample(sample, SCHEMA, 0.1)  # 1 failure of 11 = 9 %: accepted, failure removed
    assert dropped == 1 and sum(len(t["insert_statements"]) for t in clean["tables"]) == 10
    with pytest.raises(Invalid, match="1 of 11 INSERTs failed"):
        check_sample(sample, SCHEMA, 0.05)
    with pytest.raises(Invalid, match="names its columns"):
        check_sample({"tables": [{"table_name": "users", "insert_statements": ["INSERT INTO users VALUES (1, 'A');"]}]},
                     SCHEMA, 0.1)


def test_check_spec_flags_undeclared_path_params_and_duplicate_ids():
    endpoint = {"path": "/api/lists/{list_id}", "method": "GET", "operation_id": "get_list", "request_params": {},
                "required_tables": ["lists"]}
    with pytest.raises(Invalid) as err:
        check_spec({"api_groups": [{"endpoints": [endpoint, endpoint]}]}, SCHEMA)
    assert any("'list_id' is not declared" in r for r in err.value.reasons)
    assert any("used twice" in r for r in err.value.reasons)
    endpoint["request_params"] = {"list_id": {"type": "integer", "param_type": "path", "required": True}}
    assert check_spec({"api_groups": [{"endpoints": [endpoint]}]}, SCHEMA)["api_groups"][0]["endpoints"] == [endpoint]


# ---- probe arguments ----------------------------------------------------------------------
@pytest.fixture()
def lists_db(tmp_path):
    path = tmp_path / "lists.db"
    conn = sqlite3.connect(path)
    conn.executescript(f"{USERS}{LISTS}INSERT INTO users VALUES (7, 'Ada');"
                       "INSERT INTO lists VALUES (42, 7, 'Groceries'); INSERT INTO lists VALUES (43, 7, 'Home');")
    conn.close()
    return SampleValues(path)


def _tool(props: dict, required: list[str], path: str = "/api/lists/{list_id}") -> ToolSpec:
    return ToolSpec("t", "", {"type": "object", "properties": props, "required": required}, "GET", path)


def test_arguments_prefer_values_that_exist_in_the_database(lists_db):
    tool = _tool({"list_id": {"type": "integer"}, "title": {"type": "string"}, "user_id": {"type": "integer"}},
                 ["list_id", "title", "user_id"])
    first = candidate_arguments(tool, lists_db)[0]
    assert first == {"list_id": 42, "title": "Groceries", "user_id": 7}
    by_path = _tool({"id": {"type": "integer"}}, ["id"], "/api/lists/{id}")
    assert candidate_arguments(by_path, lists_db)[0] == {"id": 42}


def test_arguments_follow_the_schema(lists_db):
    assert value_for({"type": "string", "format": "date"}) == "2025-01-15"
    assert value_for({"anyOf": [{"type": "integer", "minimum": 5}, {"type": "null"}]}) == 5
    assert value_for({"type": "string", "enum": ["open", "done"]}, "status", "", lists_db) == "open"
    body = {"type": "object", "properties": {"n": {"type": "integer"}, "x": {"type": "string"}}, "required": ["n"]}
    assert value_for({"type": "array", "items": body, "minItems": 2}) == [{"n": 1}, {"n": 1}]
    impossible = _tool({"code": {"type": "string", "pattern": "^[0-9]{3}$"}}, ["code"])
    assert candidate_arguments(impossible, lists_db) == []  # never sends arguments that break the schema


# ---- files and resume ---------------------------------------------------------------------
def test_writer_cuts_a_partial_last_line_before_appending(tmp_path):
    path = tmp_path / "gen_tasks.jsonl"
    path.write_text('{"scenario": "a", "tasks": []}\n{"scenario": "b", "ta')
    repair_tail(path)
    assert path.read_text() == '{"scenario": "a", "tasks": []}\n'
    path.write_text(path.read_text() + '{"scen')
    writer = JsonlWriter(path)
    writer.write({"scenario": "c", "tasks": []})
    writer.close()
    assert [r["scenario"] for r in read_records(path)] == ["a", "c"]
    assert record_key("verifier", {"scenario": "Todo Board", "task_idx": 3}) == "todo_board::3"
    assert record_key("scenario", {"name": "Pet Clinic!"}) == "pet_clinic"


# ---- client -------------------------------------------------------------------------------
def test_client_meters_tokens_and_embeds_in_order():
    fake = FakeOpenAI()
    fake.script("hello", replies=["hi"])
    fake.embedding("a", [1.0, 0.0])
    fake.embedding("b", [0.0, 2.0])

    async def main():
        async with ChatClient(fake.base_url, "k", "m", retries=0) as client:
            reply = await client.chat([{"role": "user", "content": "hello"}])
            vectors = await client.embed(["b", "a"], "emb")
            with pytest.raises(LLMError, match="refused"):  # no script: HTTP 400, never retried
                await client.chat([{"role": "user", "content": "unscripted"}])
            return reply.text, vectors, client.meter.to_dict()

    try:
        text, vectors, meter = asyncio.run(main())
    finally:
        fake.close()
    assert text == "hi" and vectors == [[0.0, 2.0], [1.0, 0.0]]
    assert meter == {"requests": 2, "retried_attempts": 0, "prompt_tokens": 13, "completion_tokens": 5,
                     "total_tokens": 18}


def test_cosine():
    assert cosine([1.0, 0.0], [1.0, 1.0]) == pytest.approx(1 / math.sqrt(2))
    assert cosine([0.0, 0.0], [1.0, 0.0]) == 0.0


def test_unreachable_endpoint_leaves_records_for_the_next_run(tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "out"
    out.mkdir()
    (out / "gen_scenario.jsonl").write_text(json.dumps({"name": "a", "description": "d"}) + "\n")
    rc = cli.main(["gen", "task", "--output-dir", str(out), "--base-url", f"http://127.0.0.1:{port}/v1",
                   "--model", "m", "--http-retries", "0", "--no-progress"])
    summary = json.loads(capsys.readouterr().out)
    assert rc == 4 and summary["stages"]["task"]["endpoint_failures"] == 1
    assert summary["rejected"] == 0 and not (out / "rejects.jsonl").read_text()


def test_gen_needs_a_model(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("AWM_GEN_MODEL", raising=False)
    monkeypatch.delenv("OPENAI_MODEL", raising=False)
    assert cli.main(["gen", "task", "--output-dir", str(tmp_path)]) == 1
    assert "--model" in capsys.readouterr().err


def test_run_stages_rejects_unknown_stage(tmp_path):
    with pytest.raises(ValueError, match="unknown stage"):
        asyncio.run(run_stages(GenConfig(tmp_path), ["deploy"], ChatClient("http://127.0.0.1:9/v1", "", "m")))


# ---- executing generated code -------------------------------------------------------------
def test_check_verifier_runs_in_the_sandbox_and_refuses_complete_at_reset(tmp_path):
    db = tmp_path / "init.db"
    sqlite3.connect(db).executescript(f"{USERS}INSERT INTO users VALUES (1, 'Ada');")
    head = "def verify_task_completion(initial_db_path, final_db_path, final_answer=None):\n"

    async def main():
        async with VerifierSandbox() as sandbox:
            results = []
            for body in ("    return {'result': 'others'}\n", "    return {'result': 'complete'}\n",
                         "    raise ValueError('no table')\n", "    return 'complete'\n"):
                try:
                    results.append(await check_verifier(head + body, str(db), sandbox, 5.0))
                except Invalid as exc:
                    results.append(" ".join(exc.reasons[0].split()[:4]))
            return results

    assert asyncio.run(main()) == ["others", "the verifier says 'complete'", "the verifier failed on",
                                   "the verifier failed on"]
    with pytest.raises(Invalid, match="no top-level function"):
        asyncio.run(check_verifier("def check(a, b):\n    return {}\n", str(db), None, 5.0))


def test_check_env_calls_every_tool_and_names_each_failing_one():
    notes = {"tables": [{"name": "notes", "ddl": "CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT NOT NULL);",
                         "indexes": []}]}
    sample = {"tables": [{"table_name": "notes", "reasoning": "",
                          "insert_statements": ["INSERT INTO notes (id, text) VALUES (1, 'call mom');"]}]}
    with pytest.raises(Invalid) as err:
        asyncio.run(check_env("faults", FAULT_APP, ["t"] * 10, notes, sample, load_timeout_s=30, call_timeout_s=5))
    failing = sorted(r.split("'")[1] for r in err.value.reasons)
    # boom divides by zero, half_write raises after a flush, run_sql runs "test" as SQL, crash kills the worker;
    # list_notes, get_note, add_note, slow and read_env answer below 500.
    assert failing == ["boom", "crash", "half_write", "run_sql"]
    assert any("ZeroDivisionError" in r for r in err.value.reasons)


def test_scenario_stage_uses_seeds_as_examples_and_never_copies_them(tmp_path):
    words = " ".join(["word"] * 40)
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text(json.dumps({"name": "Todo Board", "description": f"SEED-TEXT {words}"}) + "\n")
    fake = FakeOpenAI()
    rule = fake.script("Stage: scenario", replies=[json.dumps([
        {"name": "todo board", "description": f"copied {words}"},
        {"name": "Pet Clinic", "description": f"pets {words}"},
        {"name": "Bike Rental", "description": "too short"},
    ])])
    cfg = GenConfig(tmp_path / "out", model="m", count=1, seeds=seeds, progress=False)

    async def main() -> dict:
        async with ChatClient(fake.base_url, "k", "m", retries=0) as client:
            return await run_stages(cfg, ["scenario"], client)

    try:
        summary = asyncio.run(main())
    finally:
        fake.close()
    assert [r["name"] for r in read_records(cfg.path("scenario"))] == ["pet_clinic"]
    assert summary["stages"]["scenario"]["duplicates"] == 1
    assert "SEED-TEXT" in rule.prompts[0] and len(rule.prompts) == 1

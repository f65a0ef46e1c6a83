"""`awm gen` end to end against a scripted OpenAI-compatible server on 127.0.0.1.

The script (gen_script.py) drives one good scenario through every failure the pipeline must
survive and one scenario whose DDL never executes. Expected figures, counted by hand from it:
chat requests 27 = scenario 1 + task 3 (malformed JSON, then good; pet_clinic 1) + db 4 (1 + 3
broken) + sample 2 + spec 1 + env 2 + verifier 14 (task 0: 2, task 1: 3 rejected, task 3: 2, 7 x 1);
retries 9 = task 1 + db 2 + sample 1 + env 1 + verifier 4; accepted 17 = 2 scenarios + 2 tasks +
1 db + 1 sample + 1 spec + 1 env + 9 verifiers; rejected 2 (pet_clinic db, todo_board task 1);
tokens 27 x 15 + 3 (one embeddings call) = 408.
"""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest
from awm import cli
from awm.data import AWMDataset
from awm.episode import EnvRuntime
from awm.gen.config import STAGE_ORDER, GenConfig
from awm.gen.records import read_records
from awm.gen.runner import run_stages
from awm.llm import ChatClient
from fake_llm import FakeOpenAI
from gen_script import ALWAYS_COMPLETE, script_pipeline

GEN_FLAGS = ["--model", "fake", "--count", "2", "--batch", "4", "--retries", "2", "--embedding-model", "fake-embed",
             "--no-progress", "--http-retries", "0"]


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory):
    fake = FakeOpenAI()
    script_pipeline(fake)
    out = tmp_path_factory.mktemp("gen") / "out"
    cfg = GenConfig(out, model="fake", retries=2, count=2, batch=4, embedding_model="fake-embed", progress=False,
                    concurrency=4)

    async def main() -> dict:
        async with ChatClient(fake.base_url, "sk-fake", "fake", timeout_s=10.0, retries=0) as client:
            return await run_stages(cfg, STAGE_ORDER, client)

    summary = asyncio.run(main())
    yield fake, out, summary
    fake.close()


def test_summary_counts_records_retries_and_tokens(pipeline):
    fake, out, summary = pipeline
    assert fake.unmatched == []
    assert (summary["accepted"], summary["rejected"], summary["retries"]) == (17, 2, 9)
    assert fake.chat_requests == 27 and fake.embed_requests == 1
    assert summary["llm"]["requests"] == 28
    assert summary["llm"]["total_tokens"] == 408
    stages = summary["stages"]
    assert stages["scenario"]["duplicates"] == 2  # one by name, one by embedding
    assert stages["sample"]["retries"] == 1 and stages["env"]["retries"] == 1
    assert stages["sample"]["blocked"] == 1  # pet_clinic has no accepted schema
    assert stages["verifier"]["accepted"] == 9 and stages["verifier"]["rejected"] == 1
    assert json.loads((out / "gen_summary.json").read_text())["accepted"] == 17


def test_scenarios_are_deduplicated_by_name_and_embedding(pipeline):
    _, out, _ = pipeline
    assert [r["name"] for r in read_records(out / "gen_scenario.jsonl")] == ["todo_board", "pet_clinic"]
    tasks = {r["scenario"]: r["tasks"] for r in read_records(out / "gen_tasks.jsonl")}
    assert len(tasks["todo_board"]) == 10 and len(tasks["pet_clinic"]) == 10  # 12 proposed, 10 kept


def test_failures_are_rejected_with_reasons_and_never_written(pipeline):
    _, out, _ = pipeline
    rejects = {(r["stage"], r["key"]): r for r in read_records(out / "rejects.jsonl")}
    assert set(rejects) == {("db", "pet_clinic"), ("verifier", "todo_board::1")}
    db = rejects[("db", "pet_clinic")]
    assert db["attempts"] == 3 and "syntax error" in db["reasons"][0]
    assert "'complete' on the untouched initial database" in rejects[("verifier", "todo_board::1")]["reasons"][0]
    assert [r["scenario"] for r in read_records(out / "gen_db.jsonl")] == ["todo_board"]
    (env,) = read_records(out / "gen_envs.jsonl")
    assert "COLUMN_NAME" not in env["full_code"] and "WHERE text LIKE" in env["full_code"]
    sample = read_records(out / "gen_sample.jsonl")[0]
    assert (sample["tables_count"], sample["inserts_count"]) == (3, 6)
    verifiers = {r["task_idx"]: r for r in read_records(out / "gen_verifier.pure_code.jsonl")}
    assert sorted(verifiers) == [0, 2, 3, 4, 5, 6, 7, 8, 9]
    assert verifiers[0]["verification"]["code"] != ALWAYS_COMPLETE


def test_retries_feed_the_failed_checks_back(pipeline):
    fake, _, _ = pipeline
    prompts = {rule.needles: rule.prompts for rule in fake.rules}
    task = prompts[("Stage: task", "Scenario: todo_board\n")]
    assert "ATTEMPT 1 WAS REJECTED" in task[1] and "not valid JSON" in task[1]
    sample = prompts[("Stage: sample", "Scenario: todo_board\n")]
    assert "FOREIGN KEY constraint failed" in sample[1] and "3 of 6 INSERTs failed" in sample[1]
    env = prompts[("Stage: env", "Scenario: todo_board\n")]
    assert "ATTEMPT" not in env[0]
    assert "search_items" in env[1] and "HTTP 500" in env[1] and "no such column: txt" in env[1]


def test_outputs_load_unchanged_in_the_dataset(pipeline, cache_dir):
    _, out, _ = pipeline
    ds = AWMDataset(out, cache_dir=cache_dir)
    assert ds.scenario_names(runnable_only=True) == ["todo_board"]
    assert ds.task_keys() == [("todo_board", i) for i in (0, 2, 3, 4, 5, 6, 7, 8, 9)]
    assert ds.verifier("todo_board", 0).code.startswith("def verify_task_completion")


def test_awm_env_check_lists_every_generated_tool(pipeline, capsys, monkeypatch, cache_dir):
    _, out, _ = pipeline
    monkeypatch.setenv("AWM_CACHE_DIR", str(cache_dir))
    assert cli.main(["env", "check", "--data-dir", str(out), "--scenario", "todo_board"]) == 0
    names = sorted(t["name"] for t in json.loads(capsys.readouterr().out))
    assert names == ["add_item", "complete_item", "delete_item", "list_items", "list_lists", "search_items"]


def test_generated_environment_serves_an_episode_and_its_verifier(pipeline, cache_dir):
    _, out, _ = pipeline

    async def main() -> tuple[str, str, str]:
        with EnvRuntime(out, num_workers=1, cache_dir=cache_dir) as runtime:
            async with await runtime.open("todo_board", 0) as ep:
                untouched = (await ep.verify("")).verdict
                obs = await ep.call("add_item", {"list_id": 1, "text": "buy milk"})
                assert not obs.is_error, obs.text
                found = await ep.call("search_items", {"query": "milk"})
                return untouched, (await ep.verify("Added.")).verdict, found.text

    untouched, done, found = asyncio.run(main())
    assert (untouched, done) == ("others", "complete")
    assert "buy milk" in found


def test_rerun_skips_finished_records_and_resumes_a_cut_file(pipeline, tmp_path, capsys):
    fake, out, _ = pipeline
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    before = {p.name: p.read_bytes() for p in copy.glob("*.jsonl")}
    requests = fake.chat_requests
    args = ["gen", "all", "--output-dir", str(copy), "--base-url", fake.base_url, *GEN_FLAGS]
    assert cli.main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["accepted"], summary["rejected"], fake.chat_requests) == (0, 0, requests)
    assert summary["stages"]["verifier"]["skipped"] == 10
    assert {p.name: p.read_bytes() for p in copy.glob("*.jsonl")} == before

    # An interrupted verifier stage: three rows missing, the last one half written.
    path = copy / "gen_verifier.pure_code.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-3]) + lines[-3][:40])
    assert cli.main(["gen", "verifier", "--output-dir", str(copy), "--base-url", fake.base_url, *GEN_FLAGS]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["accepted"] == 3 and fake.chat_requests == requests + 3
    rows = read_records(path)
    assert sorted(r["task_idx"] for r in rows) == [0, 2, 3, 4, 5, 6, 7, 8, 9]
    assert path.read_text().endswith("\n")


EVIDENCE = '''def verify_task(initial_db_path, final_db_path):
    import sqlite3
    def rows(path):
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        out = conn.execute("SELECT id, text FROM items ORDER BY id").fetchall()
        conn.close()
        return out
    return {"before": rows(initial_db_path), "after": rows(final_db_path)}
'''


def test_sql_mode_verifiers_must_return_evidence(pipeline, tmp_path, capsys, cache_dir):
    _, out, _ = pipeline
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    fake = FakeOpenAI()
    as_list = EVIDENCE.replace('return {"before": rows(initial_db_path), "after": rows(final_db_path)}',
                               "return rows(final_db_path)")
    reply = json.dumps({"reasoning": "r", "python_code": EVIDENCE, "function_name": "verify_task"})
    fake.script("Stage: verifier (sql mode)\n", "Task index: 0\n",
                replies=[json.dumps({"python_code": as_list}), reply])
    fake.script("Stage: verifier (sql mode)\n", replies=[reply])
    try:
        args = ["gen", "verifier", "--verifier-mode", "sql", "--output-dir", str(copy), "--base-url", fake.base_url,
                *GEN_FLAGS]
        assert cli.main(args) == 0
    finally:
        fake.close()
    summary = json.loads(capsys.readouterr().out)
    assert (summary["accepted"], summary["retries"], fake.chat_requests) == (10, 1, 11)
    assert "it must return a dict" in fake.rules[0].prompts[1]
    ds = AWMDataset(copy, cache_dir=cache_dir)
    assert ds.verifier("todo_board", 0, mode="sql").code == EVIDENCE
    assert ds.verifier("todo_board", 1, mode="code") is None  # code mode's reject is untouched


def test_generated_environment_trains_through_the_recipe_rollout(pipeline, tmp_path, monkeypatch, cache_dir):
    """A generated record is usable by awm_grpo's rollout: a scripted policy solves task 0 end to end."""
    from awm_grpo import env_client
    from awm_grpo.rollout import play
    from awm_grpo.warmstart.sft import teacher_policy
    from slime.arguments import parse_args
    from slime.models.tiny import build_tiny_model
    from slime.rollout.sglang_rollout import GenerateState
    from slime.utils.types import Sample

    _, out, _ = pipeline
    monkeypatch.setenv("AWM_CACHE_DIR", str(cache_dir))
    model = build_tiny_model(tmp_path / "tiny", seed=0)
    args = parse_args(["--hf-checkpoint", str(model), "--prompt-data", "unused.jsonl", "--rollout-batch-size", "1",
                       "--num-rollout", "1", "--rollout-max-response-len", "4096"])
    args.awm_data_dir, args.awm_tool_mode, args.awm_env_workers, args.awm_max_observation_tokens = str(out), "native", 1, 512
    task = AWMDataset(out, cache_dir=cache_dir).tasks("todo_board")[0]
    replies = ['<tool_call>\n{"name": "add_item", "arguments": {"list_id": 1, "text": "buy milk"}}\n</tool_call>',
               "Added."]
    GenerateState.clear_instances()
    try:
        sample = asyncio.run(play(args, Sample(index=0, prompt=[{"role": "user", "content": task}],
                                               metadata={"scenario": "todo_board", "task_idx": 0, "task": task}),
                                  {"max_new_tokens": 512}, teacher_policy(GenerateState(args).tokenizer, replies)))
    finally:
        GenerateState.clear_instances()
        env_client.close_runtimes()
    awm = sample.metadata["awm"]
    assert (awm["verdict"], awm["stop_reason"], awm["tool_calls"], awm["invalid_calls"]) == \
        ("complete", "final_answer", 1, 0)
    assert sum(sample.loss_mask) < sample.response_length  # the observation is in the sequence, masked out

"""awm_grpo.eval against a scripted SGLang-protocol engine and a scripted OpenAI-compatible endpoint."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from test_rollout import LIST, call

from awm_grpo import eval as awm_eval


def _split(tmp_path: Path) -> Path:
    from awm.data import AWMDataset, bundled_data_dir

    task = AWMDataset(bundled_data_dir()).tasks("library_lending_1")[3]
    record = {"text": [{"role": "user", "content": task}],
              "metadata": {"scenario": "library_lending_1", "task_idx": 3, "task": task, "task_type": "state_mutating"}}
    path = tmp_path / "test.jsonl"
    path.write_text(json.dumps(record) + "\n")
    return path


def _fake_llm():
    path = Path(__file__).resolve().parents[1] / "awm" / "fake_llm.py"
    spec = importlib.util.spec_from_file_location("awm_fake_llm", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module.FakeOpenAI()


def test_engine_eval_runs_the_training_rollout_and_reports_success(tiny_model_dir, scripted, tmp_path, capsys):
    scripted.reset()
    scripted.reply(LIST, call("checkout_copy", copy_id=1), "Checked out.", LIST, call("checkout_copy", copy_id=2),
                   "Checked out.")
    out = tmp_path / "eval.jsonl"
    assert awm_eval.main(["--split", str(_split(tmp_path)), "--model", str(tiny_model_dir), "--engine-url",
                          scripted.url, "--n", "2", "--concurrency", "1", "--out", str(out)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["verdict"] for r in records] == ["complete", "others"]
    assert "success rate 0.500 over 2 episodes" in capsys.readouterr().out


def test_openai_endpoint_eval_uses_chat_messages_and_the_same_protocol(tmp_path, capsys):
    fake = _fake_llm()
    try:
        fake.script("Project Hail Mary", replies=[LIST, call("search_books", query="Project Hail Mary"),
                                                  call("checkout_copy", copy_id=1), "Done: copy LIB-000101."])
        out = tmp_path / "eval.jsonl"
        assert awm_eval.main(["--split", str(_split(tmp_path)), "--openai-base-url", fake.base_url,
                              "--openai-model", "fake", "--out", str(out)]) == 0
        record = json.loads(out.read_text())
        assert record["verdict"] == "complete" and record["tool_calls"] == 2 and len(record["turns"]) == 4
        assert fake.chat_requests == 4
    finally:
        fake.close()


@pytest.mark.parametrize("flags", [["--engine-url", "http://127.0.0.1:9"]])
def test_engine_eval_needs_a_tokenizer(tmp_path, flags):
    with pytest.raises(SystemExit, match="--model is required"):
        awm_eval.main(["--split", str(_split(tmp_path)), *flags])

"""Document episodes (awm_grpo.context.document) and their builder (awm_grpo.context.docqa), on the real
bundled scenarios' DBs, the real document tools and the tiny model's tokenizer; the reward of each outcome."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import pytest

from awm_grpo.context import docqa
from awm_grpo.context.document import DocumentEnv, document_target, ground_truth_of, normalize_answer
from awm_grpo.reward import score
from slime.utils.types import Sample

TARGET = 1500  # tokens a document: small keeps the tests fast; the default (6000) is exercised by the CLI test


@pytest.fixture(scope="module")
def built() -> dict[str, list[dict[str, Any]]]:
    return docqa.build(9, 4, seed=3, target_tokens=TARGET)


def _record_line(row: dict[str, Any]) -> str:
    """The document line of the record the row asks about."""
    info = row["extra_info"]
    head = f"({info['source']}, table {info['table']}): "
    return next(line for line in row["document_content"].split("\n")
                if head in line and f"{info['key_field']}: {info['key_value']}" in line)


def test_rows_have_statelm_layout(built: dict[str, list[dict[str, Any]]]) -> None:
    assert [len(built["train"]), len(built["val"])] == [9, 4]
    for split, rows in built.items():
        for i, row in enumerate(rows):
            assert set(row) == {"data_source", "prompt", "reward_model", "document_content", "extra_info"}
            assert row["data_source"] == "awm_docqa"
            info, truth, doc = row["extra_info"], row["reward_model"]["ground_truth"], row["document_content"]
            assert [m["role"] for m in row["prompt"]] == ["system", "user"]
            assert row["prompt"][0]["content"] == DocumentEnv.system_prompt
            assert row["prompt"][1]["content"] == info["question"]
            assert row["reward_model"] == {"style": "rule", "ground_truth": truth}
            assert info["index"] == i and info["split"] == split and info["data_source"] == "awm_docqa"
            # the document is only in document_content: no record line, no answer in the prompt
            for message in row["prompt"]:
                assert "Record 1 (" not in message["content"] and truth.casefold() not in message["content"].casefold()
            # the answer and the value naming the record: exactly once in the whole document, as field values
            assert doc.casefold().count(truth.casefold()) == 1
            assert doc.casefold().count(info["key_value"].casefold()) == 1
            line = _record_line(row)
            assert f"{info['answer_field']}: {truth}" in line.split(": ", 1)[1].split(" | ")
            assert info["key_value"] in info["question"] and info["answer_field"] in info["question"]
            # where the asked record is
            start = round(info["position"] * len(doc))
            assert doc.index(line) == pytest.approx(start, abs=2)
            assert 0.8 * TARGET <= info["doc_tokens"] <= 1.3 * TARGET
            assert info["doc_records"] == doc.count("\n") + 1
    positions = [r["extra_info"]["position"] for r in built["train"]]
    assert min(positions) < 1 / 3 and max(positions) > 2 / 3 and any(1 / 3 <= p <= 2 / 3 for p in positions)


def test_seeded_and_splits_disjoint(built: dict[str, list[dict[str, Any]]]) -> None:
    assert docqa.build(9, 4, seed=3, target_tokens=TARGET) == built
    other = docqa.build(9, 4, seed=4, target_tokens=TARGET)
    assert other != built

    def asked(rows: list[dict[str, Any]]) -> set[tuple[str, str, int]]:
        return {(r["extra_info"]["source"], r["extra_info"]["table"], r["extra_info"]["row"]) for r in rows}

    many = docqa.build(200, 20, seed=3, target_tokens=TARGET)  # records asked several times (other fields)
    assert len(asked(many["train"])) < 200
    for rows in (built, other, many):
        assert asked(rows["train"]) and asked(rows["val"])
        assert not asked(rows["train"]) & asked(rows["val"])


def test_bad_requests_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="at least one of them > 0"):
        docqa.build(0, 0)
    with pytest.raises(ValueError, match=r"more than all \d+ records hold .*--target-tokens \d+ or less"):
        docqa.build(1, 0, target_tokens=10**7)
    with pytest.raises(ValueError, match=r"only \d+ train questions could be made .* --train"):
        docqa.build(100_000, 1, target_tokens=TARGET)


def test_cli_writes_parquet_like_its_jsonl(tmp_path: Any) -> None:
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is not installed: it is in the project's "
                             "requirements (the parquet prompt files need it); reinstall them")
    out = tmp_path / "docqa"
    assert docqa.main(["--out", str(out), "--train", "5", "--val", "2", "--seed", "1", "--jsonl"]) == 0
    for split, n in (("train", 5), ("val", 2)):
        table = pq.read_table(out / f"{split}.parquet")
        assert table.num_rows == n
        assert str(table.schema.field("prompt").type) == "list<element: struct<role: string, content: string>>"
        assert str(table.schema.field("reward_model").type) == "struct<style: string, ground_truth: string>"
        rows = table.to_pylist()
        assert rows == [json.loads(line) for line in (out / f"{split}.jsonl").read_text().splitlines()]
        assert all(r["extra_info"]["doc_tokens"] >= 0.8 * docqa.DEFAULT_TARGET_TOKENS for r in rows)
    assert rows == docqa.build(5, 2, seed=1)["val"]
    # slime's loader with the flags the launcher passes for this layout: what a document episode opens from
    from slime.rollout.data_source import load_prompts

    flags = argparse.Namespace(input_key="prompt", label_key="reward_model", metadata_key="extra_info",
                               extra_metadata_keys=["document_content"], apply_chat_template=False, tool_key=None,
                               rollout_max_prompt_len=None)
    prompts = load_prompts(flags, out / "val.parquet", None)
    assert [p.prompt for p in prompts] == [r["prompt"] for r in rows]
    for i, (prompt, row) in enumerate(zip(prompts, rows, strict=True)):
        assert document_target(prompt.metadata) == ("docqa:awm_docqa", i)
        assert prompt.metadata["document_content"] == row["document_content"]
        assert ground_truth_of(prompt.label, prompt.metadata) == row["reward_model"]["ground_truth"]


def test_cli_without_pyarrow_says_what_to_install(tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow -> ImportError
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(SystemExit) as exc:
        docqa.main(["--out", str(tmp_path / "x"), "--train", "2", "--val", "1"])
    assert exc.value.code == 2
    assert "needs pyarrow" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_document_target_and_ground_truth() -> None:
    meta = {"index": 7, "data_source": "awm_docqa", "document_content": "text"}
    assert document_target(meta) == ("docqa:awm_docqa", 7)
    assert document_target({"document_content": "text"}) == ("docqa:document", 0)
    assert document_target({"scenario": "library_lending_1", "task_idx": 3}) is None
    with pytest.raises(ValueError, match="not text"):
        document_target({"document_content": None})
    with pytest.raises(ValueError, match="integer >= 0"):
        document_target({"document_content": "t", "index": "3"})
    assert ground_truth_of({"style": "rule", "ground_truth": "Piranesi"}, {}) == "Piranesi"
    assert ground_truth_of(None, {"ground_truth": 42}) == "42"
    with pytest.raises(ValueError, match="no ground truth: give it a reward_model column"):
        ground_truth_of({"style": "rule"}, {"document_content": "t"})
    assert normalize_answer('  "Priya   NAIR". ') == "priya nair" == normalize_answer("\u201cPriya Nair.\u201d")


def _sample(verdict: Any, invalid_calls: int = 0) -> Sample:
    return Sample(metadata={"awm": {"verdict": verdict.verdict, "verifier_result": verdict.result,
                                    "invalid_calls": invalid_calls}})


def test_document_episode_through_its_tools(built: dict[str, list[dict[str, Any]]], tokenizer: Any) -> None:
    row = built["val"][0]
    info, truth = row["extra_info"], row["reward_model"]["ground_truth"]
    meta = {**info, "document_content": row["document_content"]}
    assert document_target(meta) == ("docqa:awm_docqa", 0)

    def open_env() -> DocumentEnv:
        return DocumentEnv(meta["document_content"], ground_truth_of(row["reward_model"], meta),
                           lambda text: list(tokenizer.encode(text, add_special_tokens=False)),
                           lambda ids: tokenizer.decode(ids), default_chunk_tokens=256)

    async def play(answer: str | None, final_text: str | None = None) -> tuple[Any, list[Any]]:
        env = open_env()
        assert {t["name"] for t in env.tools} == {"analyzeText", "loadDocument", "buildIndex", "readChunk",
                                                   "searchEngine", "finish"}
        results = [await env.call("analyzeText", {}),
                   await env.call("buildIndex", {"chunk_size": 256, "overlap": 128})]  # a line fits an overlap
        results.append(await env.call("searchEngine", {"keyword": info["key_value"], "size": 5}))
        for hit in json.loads(results[-1].text)["retrieved_chunks"]:  # read the hits until the record shows
            results.append(await env.call("readChunk", {"chunk_id": hit["chunk_id"]}))
            if f"{info['answer_field']}: {truth}" in json.loads(results[-1].text)["retrieved_chunk"][0]["content"]:
                break
        else:
            raise AssertionError(f"no searched chunk holds the record: {results[2].text[:500]}")
        assert await env.state() == {"answered": False, "calls": len(results)}
        if answer is not None:
            results.append(await env.call("finish", {"answer": answer}))
            assert results[-1].done and await env.state() == {"answered": True, "calls": len(results)}
        verdict = await env.verify(final_text)
        await env.close()
        return verdict, results

    verdict, results = asyncio.run(play(f' "{truth.upper()}". '))
    assert not any(r.is_error for r in results)
    assert json.loads(results[0].text)["total_tokens"] == len(tokenizer.encode(row["document_content"],
                                                                               add_special_tokens=False))
    assert json.loads(results[1].text)["total_chunks"] > 1  # the document does not fit one 256-token chunk
    assert (verdict.verdict, verdict.mode) == ("complete", "code")
    assert verdict.result == {"grading": "document_qa", "outcome": "correct", "answer": f' "{truth.upper()}". ',
                              "ground_truth": truth}
    wrong, _ = asyncio.run(play(truth + " and more"))
    assert (wrong.verdict, wrong.result["outcome"]) == ("others", "wrong")
    silent, _ = asyncio.run(play(None, final_text=truth))  # the right text, but as a plain reply: no answer
    assert (silent.verdict, silent.result["outcome"], silent.result["answer"]) == ("others", "no_answer", None)

    args = argparse.Namespace()
    assert [score(args, _sample(v)) for v in (verdict, wrong, silent)] == [1.0, -0.5, -1.0]
    knobs = argparse.Namespace(awm_reward_doc_correct=2.0, awm_reward_doc_wrong=-0.25, awm_reward_doc_none=-3.0,
                               awm_reward_complete=9.0)
    assert [score(knobs, _sample(v)) for v in (verdict, wrong, silent)] == [2.0, -0.25, -3.0]
    assert score(args, _sample(verdict, invalid_calls=1)) == 0.0  # the format penalty applies as to any episode


def test_awm_rewards_unchanged() -> None:
    args = argparse.Namespace()

    def awm(**fields: Any) -> Sample:
        return Sample(metadata={"awm": {"invalid_calls": 0, **fields}})

    assert score(args, awm(verdict="complete", verifier_result={"result": "complete"})) == 1.0
    assert score(args, awm(verdict="others", verifier_result={"result": "partial"})) == 0.1
    assert score(args, awm(verdict="others", verifier_result=None)) == 0.0
    assert score(args, awm(verdict="others", verifier_result={"result": "x"}, invalid_calls=2)) == -1.0
    assert score(args, awm(verdict="format_error", invalid_calls=1)) == -1.0
    assert score(args, awm(verdict="complete", infra_error="worker crashed")) == 0.0
    with pytest.raises(ValueError, match="outcome 'maybe' is not one of"):
        score(args, awm(verdict="others", verifier_result={"grading": "document_qa", "outcome": "maybe"}))

"""The document task's warm start (awm_grpo.context.warmstart): the scripted teacher through the real managed
rollout (awm_grpo.rollout.play with awm_grpo.context.loop.play_managed, the real document tools and grader, the
tiny model's tokenizer and chat template), the samples it trains on, and SFT on them (awm_grpo.warmstart.sft)."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from awm_grpo.context import warmstart
from awm_grpo.context.tools import STUB
from awm_grpo.rollout import TRUNCATION_MARKER
from awm_grpo.warmstart.sft import Episodes, sft
from slime.utils.types import Sample

NAMES = [f"Member{i:03d}" for i in range(300)]
DOCUMENT = "\n".join(f"Record {i + 1} (test_db, table members): id: {i + 1} | name: {name} | "
                     f"email: {name.lower()}@mail.example | city: Town{(i * 7) % 23:02d} | joined: 2024-01-{i % 28 + 1:02d}"
                     for i, name in enumerate(NAMES))


def row(key_value: str = "Member137", answer: str = "member137@mail.example") -> dict:
    """A row in awm_grpo.context.docqa's layout (StateLM's columns)."""
    question = f'In the attached document, what is the email of the members record whose name is "{key_value}"?'
    return {"data_source": "test_docs", "prompt": [{"role": "system", "content": "(the row's own)"},
                                                   {"role": "user", "content": question}],
            "reward_model": {"style": "rule", "ground_truth": answer}, "document_content": DOCUMENT,
            "extra_info": {"index": 3, "split": "train", "question": question, "source": "test_db",
                           "key_field": "name", "key_value": key_value, "answer_field": "email"}}


def play(tiny_model_dir, style: str, data: dict, limit: int | None = None) -> warmstart.Played:
    args = warmstart.rollout_args(str(tiny_model_dir), style, limit, 128, max_observation_tokens=512)
    return asyncio.run(warmstart.play_row(args, data, 0, style, {"chunk_size": 256}))


def trained(sample: Sample) -> list[int]:
    response = sample.tokens[len(sample.tokens) - sample.response_length:]
    return [t for t, m in zip(response, sample.loss_mask, strict=True) if m]


def reply_ids(tokenizer, texts: list[str]) -> list[int]:
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return [i for t in texts for i in [*tokenizer.encode(t, add_special_tokens=False), end]]


def masked_loss(model, samples: list[Sample]) -> float:
    total, count = 0.0, 0
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor([s.tokens])
            logits = model(input_ids=ids).logits[0, :-1]
            nll = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none")
            mask = torch.zeros(len(s.tokens))
            mask[len(s.tokens) - s.response_length:] = torch.tensor(s.loss_mask, dtype=torch.float32)
            total += float((nll * mask[1:]).sum())
            count += int(mask[1:].sum())
    return total / count


def test_the_plain_teacher_reads_the_top_chunk_and_finishes_correctly_in_one_sample(tiny_model_dir, tokenizer):
    played = play(tiny_model_dir, "plain", row())
    assert played.why is None and played.outcome == "correct"
    (final,) = played.samples
    awm = final.metadata["awm"]
    assert awm["verdict"] == "complete" and awm["verifier_result"]["answer"] == "member137@mail.example"
    assert awm["context"]["deletions"] == 0 and not awm["context"]["tools"]
    assert [json.loads(r.split("\n")[1])["arguments"]["tool_name"] for r in played.replies] == \
        ["buildIndex", "searchEngine", "readChunk", "finish"]
    # the chunk read is the one the search ranked first (the teacher read it off the result it was given)
    search = json.loads(played.replies[1].split("\n")[1])["arguments"]["arguments"]
    assert search["keyword"] == "Member137, email"
    text = tokenizer.decode(final.tokens)
    result = json.loads(text.split("<tool_response>\n")[2].split("\n</tool_response>")[0])
    assert result["msg_id"] == 5 and "observation truncated" in result["result"]  # cut to the 512-token cap
    top = warmstart.top_chunk(result)
    assert json.loads(played.replies[2].split("\n")[1])["arguments"]["arguments"] == {"chunk_id": top}
    # mask 1 exactly on the teacher's tokens; the tool results (mask 0) are in the response too
    assert trained(final) == reply_ids(tokenizer, played.replies) and sum(final.loss_mask) < final.response_length
    assert '\\"retrieved_chunks\\"' in text and '"retrieved_chunk"' in text and STUB not in text
    # its need: the context the finish was written in, plus the reserve
    assert played.need == len(final.tokens) - len(reply_ids(tokenizer, played.replies[-1:])) + 128


def test_the_managed_teacher_deletes_the_search_result_and_yields_a_snapshot(tiny_model_dir, tokenizer):
    played = play(tiny_model_dir, "managed", row())
    assert played.why is None and played.outcome == "correct"
    final, snapshot = played.samples
    assert final.metadata["awm"]["context"]["deletions"] == 1 and final.metadata["awm"]["context"]["tools"]
    assert snapshot.metadata["awm_segment"]["k"] == 1
    # build, search, delete in the snapshot; read, finish in the last sample: mask 1 only on those tokens
    assert trained(snapshot) == reply_ids(tokenizer, played.replies[:3])
    assert trained(final) == reply_ids(tokenizer, played.replies[3:])
    assert played.replies[2].startswith("Chunk ") and '"deleteContext"' in played.replies[2]
    # the last sample's prompt: the search result is a stub, the chunk id only in the teacher's own reply
    prompt = tokenizer.decode(final.tokens[: len(final.tokens) - final.response_length])
    assert STUB in prompt and "retrieved_chunks" not in prompt and final.response_length > 0
    chunk = int(played.replies[2].split()[1])
    assert json.loads(played.replies[3].split("\n")[1])["arguments"]["arguments"] == {"chunk_id": chunk}
    # the search result never shares the context with the chunk: less context than the plain teacher needs
    assert played.need < play(tiny_model_dir, "plain", row()).need


def test_rows_the_teacher_cannot_answer_are_dropped(tiny_model_dir):
    missing = row(key_value="Nobody999", answer="x@y")  # no chunk holds its line
    args = warmstart.rollout_args(str(tiny_model_dir), "plain", None, 128, max_observation_tokens=512)
    kept, dropped = asyncio.run(warmstart.collect(args, [row(), missing], "plain", {"chunk_size": 256}))
    assert len(kept) == 1 and len(dropped) == 1
    assert "does not hold the line of 'Nobody999'" in dropped[0].why and dropped[0].outcome == "no_answer"
    # under a limit the plain episode does not fit, the teacher's episode runs out of context and is dropped
    need = kept[0].need
    args = warmstart.rollout_args(str(tiny_model_dir), "plain", need - 1, 128, max_observation_tokens=512)
    kept, dropped = asyncio.run(warmstart.collect(args, [row()], "plain", {"chunk_size": 256}))
    assert not kept and dropped[0].samples[0].metadata["awm"]["stop_reason"] == "context_budget"


def test_helpers_read_tool_results_and_record_lines():
    context = 'x<tool_response>\n{"msg_id": 3, "a": 1}\n</tool_response>y<tool_response>\n{"msg_id": 5, ' \
              '"retrieved_chunks": [{"chunk_id": 7}]}\n</tool_response><|im_end|>'
    assert warmstart.last_tool_result(context) == {"msg_id": 5, "retrieved_chunks": [{"chunk_id": 7}]}
    assert warmstart.last_tool_result("no results yet") is None
    assert warmstart.top_chunk({"msg_id": 5, "result": 'cut {"chunk_id": 12, "rel'}) == 12
    line = "Record 4 (db, table t): id: 4 | name: Ann Lee | email: ann@x.org | nickname: Ann Lee2"
    assert warmstart.answer_in(f"a\n{line}\nb", "name", "Ann Lee", "email") == "ann@x.org"
    assert warmstart.answer_in(line, "name", "Ann", "email") is None  # not the whole value
    assert warmstart.answer_in(line[:40], "name", "Ann Lee", "email") is None  # the chunk cut the line
    # a line the chunk's end cuts is left out (its value may be cut short), unless the chunk ends the document
    cut = {"retrieved_chunk": [{"chunk_id": 2, "content": f"x\n{line[:-6]}"}]}
    assert warmstart.chunk_text(cut, 9) == "x\n" and warmstart.chunk_text(cut, 2) == f"x\n{line[:-6]}"
    raw = json.dumps({"retrieved_chunk": [{"chunk_id": 2, "content": f"{line}\n{line}\n"}]})
    capped = {"msg_id": 7, "result": raw[: raw.rindex("ann@") + 2] + TRUNCATION_MARKER.format(n=40)}
    assert warmstart.chunk_text(capped, None) == f'{{"retrieved_chunk": [{{"chunk_id": 2, "content": "{line}\n'
    assert warmstart.answer_in(warmstart.chunk_text(capped, None), "name", "Ann Lee", "email") == "ann@x.org"


def test_sft_on_the_teacher_samples_lowers_their_loss(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    samples = [s for style in ("plain", "managed") for s in play(tiny_model_dir, style, row()).samples]
    assert len(samples) == 3
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    before = masked_loss(model, samples)
    episodes = Episodes(None, 0, warmstart.UNLIMITED)
    episodes.real = samples
    losses = sft(model, episodes, epochs=2, lr=3e-3, seed=0)
    model.eval()
    after = masked_loss(model, samples)
    assert len(losses) == 2 and after < before - 0.1


def test_the_cli_writes_a_model_and_its_record(tiny_model_dir, tmp_path):
    prompts = tmp_path / "train.jsonl"
    prompts.write_text("\n".join(json.dumps(r) for r in [row(), row("Member020", "member020@mail.example")]))
    out = tmp_path / "ws"
    assert warmstart.main(["--prompts", str(prompts), "--style", "managed", "--base", str(tiny_model_dir),
                           "--out", str(out), "--epochs", "1", "--chunk-size", "256", "--max-observation-tokens", "512"]) == 0
    record = json.loads((out / "warmstart.json").read_text())
    assert record["kept"] == 2 and record["samples"] == 4 and record["need"]["episodes"] == 2
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    with pytest.raises(SystemExit, match="docqa"):
        warmstart.main(["--prompts", str(tmp_path / "none.parquet"), "--style", "plain", "--base", "x",
                        "--measure-only"])

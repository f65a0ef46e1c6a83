"""Parquet prompt files (`--prompt-data x.parquet`) read as their JSONL twins are.

- The recipe's rows (awm_grpo.data_prep's splits) and StateLM's layout (messages prompt, dict label,
  `extra_info` metadata, `document_content` copied in with our `--extra-metadata-keys`) load to the same
  `Prompt` lists from parquet as from JSONL; `file@[a:b]` slices take the same rows.
- Bad rows get the same sentences in both formats (only the `file:line` / `file row i` part differs),
  and a file that is not parquet under a .parquet name is a ValueError naming it, never a pyarrow trace.
- `python -m slime.train` trains on a parquet file exactly as on its JSONL twin: same seeds, same
  prompts drawn, same rewards and losses per step (real Ray cluster, CPU engine, tiny model).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_train_loop import _env, _run
from transformers import AutoTokenizer

from slime.models.tiny import build_tiny_model
from slime.rollout.data_source import RolloutDataSource, load_prompts

REPO = Path(__file__).resolve().parents[2]
TOY = REPO / "examples" / "toy_single_turn"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("parquet") / "tiny", seed=0)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


def _args(**overrides: Any) -> argparse.Namespace:
    values = dict(input_key="prompt", label_key=None, metadata_key="metadata", tool_key="tools",
                  extra_metadata_keys=None, apply_chat_template=False, apply_chat_template_kwargs={},
                  rollout_max_prompt_len=None)
    values.update(overrides)
    return argparse.Namespace(**values)


RECIPE = dict(input_key="text", metadata_key="metadata", apply_chat_template=True)  # what the launcher passes
STATELM = dict(input_key="prompt", label_key="reward_model", metadata_key="extra_info",
               extra_metadata_keys=["document_content"])


def twins(folder: Path, name: str, rows: list[dict[str, Any]],
          schema: pa.Schema | None = None) -> tuple[Path, Path]:
    """The same rows as name.jsonl and name.parquet (pyarrow infers the columns from the rows)."""
    jsonl, parquet = folder / f"{name}.jsonl", folder / f"{name}.parquet"
    jsonl.write_text("".join(json.dumps(row) + "\n" for row in rows))
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), parquet)
    return jsonl, parquet


def statelm_rows(count: int) -> list[dict[str, Any]]:
    """Rows in StateLM's layout: the document stays out of the prompt, the tools reach it."""
    return [{"prompt": [{"role": "system", "content": "Answer from the attached document only."},
                        {"role": "user", "content": f"Which year is named in section {i}?"}],
             "reward_model": {"style": "rule", "ground_truth": str(1990 + i)},
             "document_content": f"Section {i}. " + "Filler text. " * (20 + i)
                                 + f"It happened in {1990 + i}.",
             "extra_info": {"index": i, "question": f"Which year is named in section {i}?", "split": "train",
                            "source": "test"},
             "data_source": "docqa_test"} for i in range(count)]


# ---- the two layouts load alike ------------------------------------------------------------------

def test_recipe_rows_load_alike_from_parquet(tmp_path, tokenizer, monkeypatch):
    from awm_grpo.data_prep import prepare

    monkeypatch.setenv("AWM_CACHE_DIR", str(tmp_path / "cache"))
    prepare(tmp_path / "splits", split_by="task")
    rows = [json.loads(line) for line in (tmp_path / "splits" / "train.jsonl").read_text().splitlines()]
    jsonl, parquet = twins(tmp_path, "train", rows)

    from_jsonl = load_prompts(_args(**RECIPE), jsonl, tokenizer)
    from_parquet = load_prompts(_args(**RECIPE), parquet, tokenizer)

    assert len(from_parquet) == len(rows) > 10
    assert from_parquet == from_jsonl
    first = from_parquet[0]
    assert first.metadata == rows[0]["metadata"] and rows[0]["text"][0]["content"] in first.prompt
    assert first.token_ids == tokenizer(first.prompt, add_special_tokens=False)["input_ids"]


def test_statelm_rows_load_alike_and_carry_the_document_in_the_metadata(tmp_path, tokenizer):
    rows = statelm_rows(3)
    jsonl, parquet = twins(tmp_path, "docqa", rows)

    from_jsonl = load_prompts(_args(**STATELM), jsonl, tokenizer)
    from_parquet = load_prompts(_args(**STATELM), parquet, tokenizer)

    assert from_parquet == from_jsonl
    for prompt, row in zip(from_parquet, rows, strict=True):
        assert prompt.prompt == row["prompt"] and prompt.token_ids == []  # messages for the generate function
        assert prompt.label == row["reward_model"]
        assert prompt.metadata == {**row["extra_info"], "document_content": row["document_content"]}
        assert row["document_content"] not in json.dumps(prompt.prompt)
    # what the rollout gets: each sample's own copy of the metadata, the document included
    group = RolloutDataSource(from_parquet, 2, shuffle=False, seed=0).get_samples(1)[0]
    assert [s.metadata["document_content"] for s in group] == [rows[0]["document_content"]] * 2
    assert group[0].metadata is not group[1].metadata
    assert group[0].label == {"style": "rule", "ground_truth": "1990"}
    # more than one extra key, and without the flag nothing but the metadata object
    both = {**STATELM, "extra_metadata_keys": ["document_content", "data_source"]}
    two = load_prompts(_args(**both), parquet, tokenizer)
    assert two[1].metadata["data_source"] == "docqa_test"
    plain = load_prompts(_args(**{**STATELM, "extra_metadata_keys": None}), parquet, tokenizer)
    assert plain[0].metadata == rows[0]["extra_info"]


def test_metadata_as_json_text_or_a_map_column_reads_as_an_object(tmp_path, tokenizer):
    rows = [{"prompt": "p0", "metadata": json.dumps({"scenario": "s", "task_idx": 0})},
            {"prompt": "p1", "metadata": json.dumps({"scenario": "t", "task_idx": 1})}]
    jsonl, parquet = twins(tmp_path, "text_meta", rows)
    assert load_prompts(_args(), parquet, tokenizer) == load_prompts(_args(), jsonl, tokenizer)
    assert load_prompts(_args(), parquet, tokenizer)[1].metadata == {"scenario": "t", "task_idx": 1}

    maps = tmp_path / "map_meta.parquet"
    schema = pa.schema([("prompt", pa.string()), ("metadata", pa.map_(pa.string(), pa.string()))])
    pq.write_table(pa.Table.from_pylist([{"prompt": "p", "metadata": [("scenario", "s"), ("split", "val")]}],
                                        schema=schema), maps)
    assert load_prompts(_args(), maps, tokenizer)[0].metadata == {"scenario": "s", "split": "val"}


def test_row_slices_take_the_same_rows_from_parquet(tmp_path, tokenizer):
    jsonl, parquet = twins(tmp_path, "rows", [{"prompt": f"p{i}", "label": str(i)} for i in range(6)])
    for bounds in ("@[1:3]", "@[-2:]", "@[:1]", "@[4:]", "@[2:-1]"):
        want = load_prompts(_args(label_key="label"), f"{jsonl}{bounds}", tokenizer)
        got = load_prompts(_args(label_key="label"), f"{parquet}{bounds}", tokenizer)
        assert got == want and got, bounds
    assert [p.prompt for p in load_prompts(_args(), f"{parquet}@[1:3]", tokenizer)] == ["p1", "p2"]
    with pytest.raises(ValueError, match="holds no usable prompts"):
        load_prompts(_args(), f"{parquet}@[6:]", tokenizer)


# ---- bad rows: the same sentences ----------------------------------------------------------------

BAD_ROWS = [  # (rows: the last one is bad, loader options, words of the message)
    ([{"prompt": "ok", "other": None}, {"prompt": None, "other": 1}], {}, "has no key 'prompt'"),
    ([{"text": "x"}], {}, "has no key 'prompt'"),
    ([{"prompt": "x", "metadata": [1, 2]}], {}, "'metadata' must be an object"),
    ([{"prompt": "x", "metadata": "{not json"}], {}, "'metadata' is a string but not valid JSON"),
    ([{"prompt": "x", "metadata": "[1]"}], {}, "'metadata' must be an object"),
    ([{"prompt": 3}], {"apply_chat_template": True}, "needs a string or a list of chat messages"),
    ([{"prompt": [1, 2]}], {"apply_chat_template": True}, "needs a string or a list of chat messages"),
    ([{"prompt": "x", "tools": '{"a": 1}'}], {"apply_chat_template": True}, "must be a list of tool schemas"),
    ([{"prompt": "x", "tools": "[oops"}], {"apply_chat_template": True},
     "'tools' is a string but not valid JSON"),
    ([{"prompt": "x", "doc": "d"}, {"prompt": "y", "doc": None}], {"extra_metadata_keys": ["doc"]},
     "has no key 'doc' .*--extra-metadata-keys"),
    ([{"prompt": "x"}], {"extra_metadata_keys": ["doc"]}, "has no key 'doc' .*--extra-metadata-keys"),
    ([{"prompt": "x", "metadata": {"doc": "a"}, "doc": "b"}], {"extra_metadata_keys": ["doc"]},
     "would overwrite a different 'doc'"),
]


@pytest.mark.parametrize(("rows", "options", "words"), BAD_ROWS, ids=[w.split()[-1] + str(i) for i, (_, _, w)
                                                                       in enumerate(BAD_ROWS)])
def test_bad_rows_get_the_jsonl_sentence_naming_file_and_row(tmp_path, tokenizer, rows, options, words):
    jsonl, parquet = twins(tmp_path, "bad", rows)
    with pytest.raises(ValueError, match=words) as from_jsonl:
        load_prompts(_args(**options), jsonl, tokenizer)
    with pytest.raises(ValueError, match=words) as from_parquet:
        load_prompts(_args(**options), parquet, tokenizer)
    bad = len(rows) - 1
    jsonl_text, parquet_text = str(from_jsonl.value), str(from_parquet.value)
    assert jsonl_text.startswith(f"{jsonl}:{bad + 1}") and parquet_text.startswith(f"{parquet} row {bad}")
    assert jsonl_text.replace(f"{jsonl}:{bad + 1}", "ROW") == \
        parquet_text.replace(f"{parquet} row {bad}", "ROW")


def test_a_bad_row_in_a_slice_is_named_by_its_row_in_the_file(tmp_path, tokenizer):
    _, parquet = twins(tmp_path, "sliced", [{"prompt": p} for p in ("a", "b", "c", None)])
    with pytest.raises(ValueError, match=r"sliced\.parquet row 3 has no key 'prompt'"):
        load_prompts(_args(), f"{parquet}@[2:]", tokenizer)
    assert [p.prompt for p in load_prompts(_args(), f"{parquet}@[:3]", tokenizer)] == ["a", "b", "c"]


@pytest.mark.parametrize("content", ["jsonl", "empty", "truncated", "garbage"])
def test_a_file_that_is_not_parquet_is_a_value_error_naming_it(tmp_path, tokenizer, content):
    path = tmp_path / "train.parquet"
    if content == "jsonl":
        path.write_text('{"prompt": "a JSONL row under a parquet name"}\n')
    elif content == "empty":
        path.write_bytes(b"")
    elif content == "garbage":
        path.write_bytes(b"PAR1" + bytes(range(256)) * 4 + b"PAR1")
    else:
        good = tmp_path / "good.parquet"
        pq.write_table(pa.Table.from_pylist([{"prompt": f"p{i}" * 50} for i in range(50)]), good)
        path.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ValueError, match=rf"{path} cannot be read as a parquet file .*JSONL") as caught:
        load_prompts(_args(), path, tokenizer)
    assert "Traceback" not in str(caught.value)


def test_parquet_without_pyarrow_says_what_to_install(tmp_path, tokenizer, monkeypatch):
    _, parquet = twins(tmp_path, "rows", [{"prompt": "p"}])
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow -> ImportError
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ValueError, match=rf"{parquet} is a parquet file, which needs pyarrow"):
        load_prompts(_args(), parquet, tokenizer)


def test_a_binary_file_under_a_jsonl_name_says_it_is_not_text(tmp_path, tokenizer):
    _, parquet = twins(tmp_path, "real", [{"prompt": "p"}])
    renamed = tmp_path / "real.jsonl"
    renamed.write_bytes(parquet.read_bytes())
    with pytest.raises(ValueError, match=rf"{renamed}:1 is not UTF-8 text .*\.parquet file"):
        load_prompts(_args(), renamed, tokenizer)


# ---- through python -m slime.train ---------------------------------------------------------------

REWARD = """
async def reward(args, sample, **kwargs):
    # depends on the response and on every part of the row the loader hands over: label, metadata and
    # the --extra-metadata-keys column (a KeyError fails the run), so a row read differently shows
    text, meta = sample.response, sample.metadata
    varied = len(set(text)) / max(len(text), 1)
    bonus = 0.5 if meta["source"] == "toy" else 0.0
    return varied * (1 + int(sample.label)) / 10 + meta["index"] / 100 + bonus
"""

COMPARED = ("step", "rollout/prompt_indices", "rollout/raw_reward", "rollout/response_len_mean", "train/loss",
            "train/grad_norm", "train/tokens", "train/zero_advantage_samples")


def _train(model: Path, data: Path, work: Path) -> list[dict[str, Any]]:
    """Two GRPO steps of the toy prompts on `data` with REWARD; one train record a step."""
    (work / "plugins").mkdir(parents=True)
    (work / "plugins" / "twin_reward.py").write_text(REWARD)
    cmd = [sys.executable, "-m", "slime.train", "--hf-checkpoint", str(model), "--prompt-data", str(data),
           "--input-key", "messages", "--label-key", "label", "--metadata-key", "extra_info",
           "--extra-metadata-keys", "source", "--apply-chat-template", "--rollout-shuffle",
           "--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--num-rollout", "2",
           "--rollout-max-response-len", "6", "--custom-rm-path", "twin_reward.reward", "--lr", "5e-3",
           "--seed", "7", "--rollout-seed", "7", "--engine-seed", "7", "--sglang-server-concurrency", "1",
           "--save", str(work / "ckpt"), "--ray-num-cpus", "4"]
    _run(cmd, _env(work / "plugins"), timeout=300)
    records = [json.loads(line) for line in (work / "ckpt" / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["kind"] == "train"]


def test_a_parquet_prompt_file_trains_like_its_jsonl_twin(tmp_path):
    """Same prompts drawn, same rewards, same losses, step by step. One request at a time so that the CPU
    engine's per-arrival sampling seeds and batches are the same in both runs."""
    sys.path.insert(0, str(TOY))
    try:
        from make_data import rows
    finally:
        sys.path.remove(str(TOY))
    data = [{"messages": [{"role": "user", "content": row["input"]}], "label": row["label"],
             "extra_info": {"index": i, "split": "train"}, "source": "toy"}
            for i, row in enumerate(rows(8, 0))]
    jsonl, parquet = twins(tmp_path, "toy", data)
    model = build_tiny_model(tmp_path / "model", seed=0)

    from_jsonl = _train(model, jsonl, tmp_path / "jsonl")
    from_parquet = _train(model, parquet, tmp_path / "parquet")

    assert [r["step"] for r in from_jsonl] == [0, 1]
    for a, b in zip(from_jsonl, from_parquet, strict=True):
        assert {k: a[k] for k in COMPARED} == {k: b[k] for k in COMPARED}
        assert math.isfinite(a["train/loss"]) and a["rollout/raw_reward"] > 0.5  # the extra key arrived
    assert from_jsonl[0]["rollout/prompt_indices"] != from_jsonl[1]["rollout/prompt_indices"]
    assert all(r["train/grad_norm"] > 0 for r in from_jsonl)  # rewards differed within groups: it trained

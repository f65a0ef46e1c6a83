"""Copy drill: invented names and numbers that never repeat, tokens laid out as the rollout lays out an episode."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from awm_grpo.rollout import RolloutConfig, chat_encoder
from awm_grpo.warmstart.drill import drill_episodes
from slime.arguments import parse_args


def _encoder(model_dir):
    args = parse_args(["--hf-checkpoint", str(model_dir), "--prompt-data", "unused.jsonl",
                       "--rollout-batch-size", "1", "--num-rollout", "1"])
    args.awm_tool_mode = "meta"
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return tokenizer, chat_encoder(tokenizer, RolloutConfig.from_args(args), [])


def _split(tokenizer, sample) -> tuple[list[dict], list[dict], str]:
    """(calls the model learns, results it is shown, its final answer) of one drill episode."""
    response = sample.tokens[len(sample.tokens) - sample.response_length:]
    learned = tokenizer.decode([t for t, m in zip(response, sample.loss_mask, strict=True) if m])
    shown = tokenizer.decode([t for t, m in zip(response, sample.loss_mask, strict=True) if not m])
    calls = [json.loads(c.split("</tool_call>")[0]) for c in learned.split("<tool_call>")[1:]]
    results = [json.loads(r.split("</tool_response>")[0]) for r in shown.split("<tool_response>")[1:]]
    return calls, results, learned.split("</tool_call>")[-1].replace("<|im_end|>", "").strip()


def test_drill_episodes_mask_only_the_replies_and_copy_their_names(tiny_model_dir):
    tokenizer, encoder = _encoder(tiny_model_dir)
    episodes = drill_episodes(encoder, 50, seed=3)
    assert [s.tokens for s in drill_episodes(encoder, 50, seed=3)] == [s.tokens for s in episodes]  # seeded

    titles = set()
    for sample in episodes:
        prompt_len = len(sample.tokens) - sample.response_length
        task = sample.prompt[0]["content"]
        title = task.split("'")[1]
        titles.add(title)
        assert sample.tokens[:prompt_len] == encoder.prompt_ids(task)
        assert len(sample.loss_mask) == sample.response_length
        response = sample.tokens[prompt_len:]
        learned = tokenizer.decode([t for t, m in zip(response, sample.loss_mask, strict=True) if m])
        shown = tokenizer.decode([t for t, m in zip(response, sample.loss_mask, strict=True) if not m])
        call = json.loads(learned.split("<tool_call>")[1].split("</tool_call>")[0])
        assert call == {"name": "call_tool", "arguments": {"tool_name": "search_books", "arguments": {"query": title}}}
        result = json.loads(shown.split("<tool_response>")[1].split("</tool_response>")[0])
        assert result["books"][0]["title"] == title
        assert learned.rstrip().endswith(f"'{title}' is by {result['books'][0]['author']}.<|im_end|>")
        assert "<tool_response>" not in learned and "search_books" not in shown
    assert len(titles) > 45  # invented anew for each episode


def test_value_and_id_kinds_make_the_model_copy_numbers_from_results(tiny_model_dir):
    tokenizer, encoder = _encoder(tiny_model_dir)
    episodes = drill_episodes(encoder, 60, seed=5, kinds=("value", "id"))
    assert [s.tokens for s in drill_episodes(encoder, 60, seed=5, kinds=("value", "id"))] == [s.tokens for s in episodes]
    kinds = [s.metadata["drill"] for s in episodes]
    assert 15 < kinds.count("value") < 45 and kinds.count("value") + kinds.count("id") == 60
    numbers = set()
    for sample in episodes:
        calls, results, answer = _split(tokenizer, sample)
        title = sample.prompt[0]["content"].split("'")[1]
        assert calls[0]["arguments"]["arguments"] == {"query": title}
        row = next(iter(results[0].values()))[0]
        assert title in row.values()
        if sample.metadata["drill"] == "value":
            assert len(calls) == 1 and len(results) == 1
            shown = [json.dumps(v) for k, v in row.items() if k != "id" and isinstance(v, (int, float))
                     and not isinstance(v, bool) and json.dumps(v) in answer]
            assert shown, (answer, row)  # the answer quotes one of the row's numbers, as written there
        else:
            assert len(calls) == 2 and len(results) == 2
            (id_arg, value), = calls[1]["arguments"]["arguments"].items()
            assert id_arg.endswith("_id") and value == row["id"] == results[1][id_arg]
            assert str(results[1]["id"]) in answer and title in answer
        numbers.add(row["id"])
    assert len(numbers) > 40  # drawn anew for each episode


def test_drill_names_its_kinds():
    with pytest.raises(ValueError, match="choose from name, value, id"):
        drill_episodes(None, 1, kinds=("numbers",))

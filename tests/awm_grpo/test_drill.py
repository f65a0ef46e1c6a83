"""Copy drill: invented names that never repeat, tokens laid out as the rollout lays out an episode."""

from __future__ import annotations

import json

from transformers import AutoTokenizer

from awm_grpo.drill import drill_episodes
from awm_grpo.rollout import RolloutConfig, chat_encoder
from slime.arguments import parse_args


def test_drill_episodes_mask_only_the_replies_and_copy_their_names(tiny_model_dir):
    args = parse_args(["--hf-checkpoint", str(tiny_model_dir), "--prompt-data", "unused.jsonl",
                       "--rollout-batch-size", "1", "--num-rollout", "1"])
    args.awm_tool_mode = "meta"
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    encoder = chat_encoder(tokenizer, RolloutConfig.from_args(args), [])
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

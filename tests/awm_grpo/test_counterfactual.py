"""Counterfactual copies: a real reference episode rebuilt token for token, then renamed consistently."""

from __future__ import annotations

import asyncio
import json
import random

from awm.scenarios import build
from awm.scenarios.worlds import invent_like
from transformers import AutoTokenizer

from awm_grpo.data_prep import prepare
from awm_grpo.warmstart.counterfactual import substitute
from awm_grpo.warmstart.sft import collect
from slime.arguments import parse_args


def test_invented_names_keep_the_shape_and_replacement_respects_word_edges():
    rng = random.Random(0)
    made = invent_like("The Left Hand of Darkness", rng)
    words = made.split(" ")
    assert len(words) == 5 and words[0] == "The" and words[3] == "of" and words[1][0].isupper()
    assert invent_like("Dr. Lena Fischer 10 mg", rng).split(" ")[::4] == ["Dr.", "mg"]
    assert substitute('{"title": "Dune", "note": "Dunes of Dune_x"} Dune.', {"Dune": "Velmor"}) == \
        '{"title": "Velmor", "note": "Dunes of Dune_x"} Velmor.'


def test_renamed_copies_of_a_played_practice_episode(tmp_path, tiny_model_dir):
    practice, splits = tmp_path / "practice", tmp_path / "splits"
    assert build.main(["--practice", str(practice), "--scenarios", "library_lending_1"]) == 0
    prepare(splits, data_dir=practice, split_by="task", seed=42)
    prompts = [json.loads(line) for line in (splits / "train.jsonl").read_text().splitlines()]
    prompts = [p for p in prompts if p["metadata"].get("family") == "book_author"][:1]
    args = parse_args(["--hf-checkpoint", str(tiny_model_dir), "--prompt-data", "unused.jsonl",
                       "--rollout-batch-size", "1", "--num-rollout", "1", "--rollout-max-response-len", "2048"])
    args.awm_tool_mode, args.awm_data_dir, args.awm_env_workers = "meta", str(practice), 1
    args.awm_max_observation_tokens, args.awm_max_turns = 256, 64

    episodes = asyncio.run(collect(args, prompts, str(practice), counterfactual_copies=2))
    real, *copies = episodes.epoch(random.Random(0))

    assert real.metadata["awm"]["verdict"] == "complete" and len(copies) == 2
    again = episodes.epoch(random.Random(1))  # every epoch draws fresh names for the same episode
    assert again[0] is real and again[1].metadata["counterfactual"] != copies[0].metadata["counterfactual"]
    title = prompts[0]["metadata"]["task"].split("'")[1]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for copy in copies:
        mapping = copy.metadata["counterfactual"]
        assert title in mapping and mapping[title] != title
        assert len(copy.loss_mask) == copy.response_length and 0 < sum(copy.loss_mask) < copy.response_length
        response = copy.tokens[len(copy.tokens) - copy.response_length:]
        replies = tokenizer.decode([t for t, m in zip(response, copy.loss_mask, strict=True) if m])
        assert f'"query": "{mapping[title]}"' in replies and title not in replies  # the model's own tokens
        assert mapping[title] in copy.prompt[0]["content"] and title not in copy.prompt[0]["content"]

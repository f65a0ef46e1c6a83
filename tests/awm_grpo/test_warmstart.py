"""Warm start: the small model really has the small architecture, and SFT fits real reference episodes."""

from __future__ import annotations

import asyncio
import json
import random

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from awm_grpo.data_prep import prepare
from awm_grpo.warmstart.sft import SMALL_CONFIG, collect, domain_corpus, sft, small_base
from slime.arguments import parse_args


def _reference_setup(tmp_path, model_dir, n: int):
    """Runtime args as the warm start sets them (meta mode, bundled data) and the first n train prompts."""
    splits = tmp_path / "splits"
    prepare(splits, split_by="task", seed=42)
    prompts = [json.loads(line) for line in (splits / "train.jsonl").read_text().splitlines()][:n]
    args = parse_args(["--hf-checkpoint", str(model_dir), "--prompt-data", "unused.jsonl",
                       "--rollout-batch-size", "1", "--num-rollout", "1", "--rollout-max-response-len", "2048"])
    args.awm_tool_mode, args.awm_data_dir, args.awm_env_workers = "meta", None, 1
    args.awm_max_observation_tokens, args.awm_max_turns = 256, 64
    return args, prompts


def test_small_base_is_built_with_the_small_config(tmp_path):
    config = AutoConfig.from_pretrained(small_base(tmp_path / "base", seed=0))
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "head_dim"):
        assert getattr(config, key) == SMALL_CONFIG[key], key  # a typo in how they reach the config is silent


def test_domain_tokenizer_learns_the_scenarios_words_from_train_tasks_only(tmp_path):
    from transformers import AutoTokenizer

    splits = tmp_path / "splits"
    prepare(splits, split_by="task", seed=42)
    read = lambda name: [json.loads(line) for line in (splits / name).read_text().splitlines()]  # noqa: E731
    train, held_out = read("train.jsonl"), read("val.jsonl") + read("test.jsonl")
    corpus = domain_corpus(None, train)
    assert any("list_pharmacies" in text for text in corpus)  # scenario code
    assert {r["metadata"]["task"] for r in train} <= set(corpus)
    assert not {r["metadata"]["task"] for r in held_out} & set(corpus)

    domain = AutoTokenizer.from_pretrained(small_base(tmp_path / "domain", domain=corpus, layers=3))
    plain = AutoTokenizer.from_pretrained(small_base(tmp_path / "plain"))
    assert AutoConfig.from_pretrained(tmp_path / "domain").num_hidden_layers == 3
    assert len(domain) == len(plain) == 4096
    for words in ("list_pharmacies", "book_appointment", "search_doctors"):
        assert len(domain.encode(words, add_special_tokens=False)) < len(plain.encode(words, add_special_tokens=False))
    text = "Request a refill of my prescription at Harbor View Pharmacy."
    assert domain.decode(domain.encode(text, add_special_tokens=False)) == text


def test_sft_lowers_the_loss_on_played_reference_episodes(tmp_path, tiny_model_dir):
    args, prompts = _reference_setup(tmp_path, tiny_model_dir, 3)
    episodes = asyncio.run(collect(args, prompts, None))
    assert len(episodes.real) == 3 and not episodes.renamable
    assert all(s.metadata["awm"]["verdict"] == "complete" for s in episodes.epoch(random.Random(0)))

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    losses = sft(model, episodes, epochs=4, lr=1e-2, seed=0)
    assert len(losses) == 4 and losses[-1] < 0.7 * losses[0]


def test_reference_episodes_skip_list_tools_when_asked_and_still_verify(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    args, prompts = _reference_setup(tmp_path, tiny_model_dir, 2)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    responses = {}
    for list_tools in (True, False):
        episodes = asyncio.run(collect(args, prompts, None, list_tools=list_tools))
        assert [s.metadata["awm"]["verdict"] for s in episodes.real] == ["complete", "complete"]
        responses[list_tools] = [tokenizer.decode(s.tokens[-s.response_length:]) for s in episodes.real]
    for with_list, direct in zip(responses[True], responses[False], strict=True):
        assert '"name": "list_tools"' in with_list and '"name": "list_tools"' not in direct
        assert direct.lstrip().startswith('<tool_call>\n{"name": "call_tool"')
        assert len(direct) < len(with_list)  # the catalogue observation is gone too


def test_cli_builds_a_domain_base_drills_it_and_records_what_it_did(tmp_path, tiny_model_dir):
    import pytest

    from awm_grpo.warmstart.sft import main

    prepare(tmp_path / "splits", split_by="task", seed=42)
    out = tmp_path / "ws"
    assert main(["--data", str(tmp_path / "splits"), "--out", str(out), "--epochs", "1", "--drill", "8",
                 "--drill-epochs", "2", "--drill-kinds", "name,value,id", "--layers", "1", "--split-digits"]) == 0
    record = json.loads((out / "warmstart.json").read_text())
    assert record["tokenizer_corpus"] == "domain" and record["drill"] == 8 and len(record["drill_losses"]) == 2
    assert record["drill_kinds"] == ["name", "value", "id"] and record["split_digits"] is True
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert [tokenizer.decode([i]) for i in tokenizer("2026", add_special_tokens=False)["input_ids"]] == list("2026")
    assert record["drill_losses"][1] < record["drill_losses"][0] and len(record["losses"]) == 1
    assert AutoConfig.from_pretrained(out).num_hidden_layers == 1
    # the base is built beside `out` under a name of its own: seeds warm-starting side by side in one
    # folder never load each other's base
    assert AutoConfig.from_pretrained(tmp_path / "ws-base").num_hidden_layers == 1
    assert not (tmp_path / "small-base").exists()
    with pytest.raises(SystemExit, match="--drill-kinds 'name,copy'"):
        main(["--data", str(tmp_path / "splits"), "--out", str(tmp_path / "x"), "--drill", "8", "--drill-kinds",
              "name,copy"])
    with pytest.raises(SystemExit, match="--layers, --tokenizer-corpus, --split-whitespace, --split-digits and --chat-template shape"):
        main(["--data", str(tmp_path / "splits"), "--out", str(tmp_path / "x"), "--base", str(tiny_model_dir),
              "--layers", "3"])


def test_save_every_keeps_intermediate_starts_that_differ_from_the_final_one(tmp_path, tiny_model_dir):
    from safetensors.torch import load_file

    from awm_grpo.warmstart.sft import main

    prepare(tmp_path / "splits", split_by="task", seed=42)
    out = tmp_path / "ws"
    assert main(["--data", str(tmp_path / "splits"), "--out", str(out), "--base", str(tiny_model_dir),
                 "--epochs", "3", "--save-every", "2", "--lr", "1e-2"]) == 0
    assert sorted(p.name for p in out.glob("epoch_*")) == ["epoch_2"]  # the last epoch is OUT itself
    middle, final = json.loads((out / "epoch_2" / "warmstart.json").read_text()), json.loads(
        (out / "warmstart.json").read_text())
    assert middle["epochs"] == 2 and final["epochs"] == 3 and final["losses"][:2] == middle["losses"]
    assert (out / "epoch_2" / "tokenizer.json").is_file()
    a, b = load_file(out / "epoch_2" / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys() and any(not torch.equal(a[k], b[k]) for k in a)


def test_cli_warm_starts_a_base_that_ships_qwen3s_template(tmp_path):
    """`--chat-template` (Qwen3-4B's) + `--enable-thinking`: the episodes, the drill and the saved model use it."""
    from rollout_helpers import QWEN3_TEMPLATE, qwen3_template

    from awm_grpo.warmstart.sft import main

    prepare(tmp_path / "splits", split_by="task", seed=42)
    out = tmp_path / "ws"
    assert main(["--data", str(tmp_path / "splits"), "--out", str(out), "--epochs", "1", "--layers", "1",
                 "--drill", "4", "--drill-epochs", "1", "--chat-template", str(QWEN3_TEMPLATE),
                 "--enable-thinking"]) == 0
    record = json.loads((out / "warmstart.json").read_text())
    assert record["chat_template"] == str(QWEN3_TEMPLATE) and record["enable_thinking"] is True
    assert record["episodes"] >= 30 and len(record["losses"]) == 1 and len(record["drill_losses"]) == 1
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template == qwen3_template()


def test_recheck_plan_plays_the_plan_up_to_its_first_write_twice():
    from awm_grpo.warmstart.sft import recheck_plan

    read, write, other = {"tool": "get_cart"}, {"tool": "set_qty", "arguments": {"q": 2}}, {"tool": "set_note"}
    labels = {"get_cart": "read", "set_qty": "update", "set_note": "update"}
    assert recheck_plan([read, write, other], labels) == [read, write, read, write, other]
    assert recheck_plan([write], labels) == [write, write]
    assert recheck_plan([read, read], labels) is None  # nothing to recheck


def test_recheck_episodes_repeat_the_first_write_on_the_right_state_and_still_verify(tmp_path, tiny_model_dir):
    """--recheck-writes: the doubled plan is really played and judged; its second write is a no-op."""
    from awm.data import AWMDataset, bundled_data_dir
    from awm.predicates.tool_labels import label_tools
    from awm.solutions import load_solutions

    args, prompts = _reference_setup(tmp_path, tiny_model_dir, 40)
    solutions = load_solutions(None)
    labels = {}
    for r in prompts:
        code = AWMDataset(bundled_data_dir()).scenario(r["metadata"]["scenario"]).full_code
        labels.update({name: lab.label for name, lab in label_tools(code).items()})
    writes = [r for r in prompts if any(labels.get(c["tool"]) != "read" for c in
                                        solutions[(r["metadata"]["scenario"], r["metadata"]["task_idx"])].calls)]
    reads = [r for r in prompts if r not in writes]
    assert writes and reads
    picked = writes[:3] + reads[:1]
    episodes = asyncio.run(collect(args, picked, None, recheck=1.0, list_tools=False))
    # one recheck per write plan that the verifier still accepts; a read-only plan has none
    assert 1 <= episodes.rechecks <= 3 and len(episodes.real) == len(picked) + episodes.rechecks
    assert all(s.metadata["awm"]["verdict"] == "complete" for s in episodes.real)
    by_task: dict = {}
    for s in episodes.real:
        by_task.setdefault(s.index, []).append(s)
    doubled = [pair for pair in by_task.values() if len(pair) == 2]
    assert len(doubled) == episodes.rechecks
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for plain, recheck in doubled:
        calls = lambda s: tokenizer.decode(s.tokens[-s.response_length:]).count("<tool_call>")  # noqa: E731
        first = next(i for i, c in enumerate(solutions[(plain.metadata["scenario"], plain.metadata["task_idx"])].calls)
                     if labels.get(c["tool"]) != "read")
        assert calls(recheck) == calls(plain) + first + 1
    assert len(by_task[max(by_task)]) == 1  # the read-only plan
    assert not asyncio.run(collect(args, picked, None, recheck=0.0, list_tools=False)).rechecks

"""The pieces of `python -m awm_grpo.recovery.compare`: equal runs but for the credit, valid slime flags, checkpoint export.

The full command (train B1 and the method, evaluate on the controlled split) is the slow test at
the end; it runs one step per method with the random tiny model, so it checks wiring, not learning.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from awm_grpo.recovery import compare
from slime.arguments import parse_args


def options(**kw):
    parser_defaults = {"lam": 0.5, "beta": 0.05, "eta": 0.95, "max_turns": 6, "max_tokens_per_turn": 128,
                       "steps": 2, "batch": 2, "group": 4, "lr": 1e-5, "max_response_len": 1024,
                       "train_prompts": "train.jsonl"}
    return argparse.Namespace(**{**parser_defaults, **kw})


def test_runs_differ_only_in_the_arm_s_credit_keys(tmp_path):
    opts = options()
    b1 = compare.runtime_yaml(opts, "b1", tmp_path / "p.jsonl", tmp_path / "t")
    for arm, keys in compare.ARMS.items():
        if arm == "b2plus":
            continue
        other = compare.runtime_yaml(opts, arm, tmp_path / "p.jsonl", tmp_path / "t")
        differ = {k for k in set(b1) | set(other) if b1.get(k) != other.get(k)}
        assert differ <= set(keys) and all(k.startswith("awm_credit_") or k in compare.ACTING_KEYS
                                           for k in differ), arm
    assert b1["awm_predicates"] == str(tmp_path / "p.jsonl") and b1["awm_terminate_on_invalid_call"] is True


@pytest.mark.parametrize("arm, attribute, value", [("s1_binary", "binary_only", True),
                                                   ("potential", "progress_form", "potential"),
                                                   ("naive", "estimator", "naive"), ("v1_no_verify", "beta", 0.0),
                                                   ("b2", "method", "b2"), ("ours", "method", "ours")])
def test_each_ablation_arm_reaches_the_advantage_function_s_config(tmp_path, arm, attribute, value):
    """Through slime's own YAML loader, as a training run reads the arm's runtime YAML."""
    import yaml

    from awm_grpo.recovery.credit import CreditConfig
    from awm_grpo.recovery.plugin import credit_config
    from slime.arguments import apply_custom_config

    path = tmp_path / "rt.yaml"
    path.write_text(yaml.safe_dump(compare.runtime_yaml(options(), arm, tmp_path / "p.jsonl", tmp_path / "t")))
    args = argparse.Namespace()
    apply_custom_config(args, str(path))
    cfg, _ = credit_config(args)
    assert getattr(cfg, attribute) == value != (getattr(CreditConfig(), attribute) if arm != "ours" else None)


def test_b2plus_is_refused_without_a_judge_and_the_testbed_must_exist(tmp_path, capsys):
    with pytest.raises(SystemExit):
        compare.parse(["--arms", "b2plus", "--dry-run"])
    assert "--judge-url" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        compare.parse(["--testbed", str(tmp_path)])  # an existing folder that is not a testbed
    assert "not a testbed" in capsys.readouterr().err
    (tmp_path / "testbed.json").write_text("{}")
    opts = compare.parse(["--testbed", str(tmp_path), "--arms", "b1", "naive"])
    assert opts.split == str(tmp_path / "split") and opts.out == str(tmp_path / "compare")
    assert opts.train_prompts == str(tmp_path / "prompts" / "train.jsonl")
    yaml_keys = compare.runtime_yaml(compare.parse(["--arms", "b2plus", "--judge-url", "http://j/v1",
                                                    "--judge-model", "m"]), "b2plus", tmp_path, tmp_path)
    assert yaml_keys["awm_judge_url"] == "http://j/v1" and yaml_keys["awm_judge_model"] == "m"


def test_training_command_is_valid_for_slime_and_uses_the_custom_advantages(tmp_path):
    cmd = compare.train_command(options(), tmp_path / "model", tmp_path / "run", tmp_path / "c.yaml", seed=3)
    assert cmd[1:3] == ["-m", "slime.train"]
    (tmp_path / "c.yaml").write_text("awm_credit_method: ours\n")
    args = parse_args(cmd[3:])
    assert args.custom_advantage_function_path == "awm_grpo.recovery.advantages"
    assert args.custom_generate_function_path == "awm_grpo.rollout.generate"
    assert args.seed == args.rollout_seed == 3 and args.num_rollout == 2 and args.save_interval == 2
    assert args.dynamic_sampling_filter_path is None and args.awm_credit_method == "ours"
    assert args.calculate_per_token_loss is False


def test_b1_s_window_arm_trains_with_the_per_token_loss_the_rollout_requires(tmp_path):
    """Through slime's parser and the rollout's own config check, as the arm's training run reads them."""
    import yaml

    from awm_grpo.rollout import RolloutConfig

    opts = options()
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(compare.runtime_yaml(opts, "b1_window", tmp_path / "p.jsonl", tmp_path / "t")))
    for arm, per_token in (("b1_window", True), ("b1", False)):
        args = parse_args(compare.train_command(opts, tmp_path / "m", tmp_path / "r", config, seed=0, arm=arm)[3:])
        assert args.calculate_per_token_loss is per_token
        if per_token:
            assert RolloutConfig.from_args(args).history_window_turns == 3
        else:
            with pytest.raises(ValueError, match="--calculate-per-token-loss"):
                RolloutConfig.from_args(args)


def test_final_model_is_the_last_iteration_with_the_base_tokenizer(tmp_path, tiny_model_dir):
    it = tmp_path / "run" / "ckpt" / "iter_0000002" / "model"
    it.mkdir(parents=True)
    for f in tiny_model_dir.iterdir():
        if f.suffix in (".safetensors",) or f.name == "config.json":
            shutil.copyfile(f, it / f.name)
    (tmp_path / "run" / "ckpt" / "latest_checkpointed_iteration.txt").write_text("2")
    final = compare.final_model(tmp_path / "run", tiny_model_dir)
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(final).vocab_size > 0 and (final / "model.safetensors").exists()
    with pytest.raises(RuntimeError, match="no checkpoint"):
        compare.final_model(tmp_path / "nothing", tiny_model_dir)


def test_held_out_tasks_come_from_the_val_and_test_prompt_files(tmp_path):
    for name, tasks in (("val", [("a", 1)]), ("test", [("b", 2), ("b", 3)])):
        (tmp_path / f"{name}.jsonl").write_text("".join(
            json.dumps({"text": "t", "metadata": {"scenario": s, "task_idx": i}}) + "\n" for s, i in tasks))
    assert compare.held_out_tasks("heldout", tmp_path) == {("a", 1), ("b", 2), ("b", 3)}
    assert compare.held_out_tasks("test", tmp_path) == {("b", 2), ("b", 3)}
    assert compare.held_out_tasks("all", tmp_path) is None


def test_training_prompts_add_the_handovers_of_tasks_not_held_out(tmp_path):
    split = tmp_path / "split"
    split.mkdir()
    meta = [{"scenario": "a", "task_idx": i, "task": f"t{i}", "start_db": f"states/{i}.db"} for i in (1, 2)]
    (split / "split.jsonl").write_text("".join(json.dumps({"text": m["task"], "metadata": m}) + "\n" for m in meta))
    (tmp_path / "train.jsonl").write_text(json.dumps({"text": "x", "metadata": {"scenario": "b", "task_idx": 0}}) + "\n")
    opts = options(train_prompts=str(tmp_path / "train.jsonl"), train_from="both")
    path = compare.training_prompts(opts, split, {("a", 2)}, tmp_path / "out.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["metadata"].get("task_idx") for r in rows] == [0, 1]  # task a/2 is held out
    assert rows[1]["metadata"]["start_db"] == str((split / "states/1.db").resolve())
    assert rows[1]["text"] == [{"role": "user", "content": "t1"}]
    opts.train_from = "handovers"
    assert len(compare.training_prompts(opts, split, None, tmp_path / "o2.jsonl").read_text().splitlines()) == 2


@pytest.mark.slow
def test_compare_on_the_testbed_trains_evaluates_tests_and_plots(tmp_path, tiny_model_dir):
    """Wiring end to end (the random tiny model learns nothing): testbed, two arms, table, tests, plots."""
    from awm_grpo.recovery import testbed

    testbed.build(tmp_path / "tb", worlds=2)
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-m", "awm_grpo.recovery.compare", "--testbed", str(tmp_path / "tb"),
                          "--model", str(tiny_model_dir), "--arms", "b1", "naive", "--steps", "1", "--batch", "1",
                          "--group", "2", "--seeds", "0", "--eval-limit", "2", "--max-response-len", "512", "--train-from", "handovers",
                          "--max-tokens-per-turn", "32"], cwd=repo, env=env, capture_output=True, text=True,
                         timeout=1200)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    folder = tmp_path / "tb" / "compare"
    result = json.loads((folder / "compare.json").read_text())
    assert set(result["table"]) == {"base", "b1", "naive"}
    assert result["table"]["b1"]["SR_ordinary"][2] == 1  # the held-out tasks were played from initial states
    assert set(result["tests"]) == {"base", "naive"} and result["tests"]["naive"]["recovery_handovers"]["n"] == 2
    assert set(result["curves"]["recovery"]) == {"b1", "naive"} and result["curves"]["recovery"]["b1"][0]
    assert "| naive |" in (folder / "compare.md").read_text() and "recovery_success" in out.stdout
    for png in ("learning_curves.png", "held_out.png"):
        assert (folder / png).read_bytes()[:4] == b"\x89PNG"
        (folder / png).unlink()
    again = subprocess.run([sys.executable, "-m", "awm_grpo.recovery.compare", "--testbed", str(tmp_path / "tb"),
                            "--report-only"], cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and (folder / "held_out.png").exists(), again.stderr[-2000:]
    assert json.loads((folder / "compare.json").read_text())["table"] == result["table"]


def test_report_of_an_interrupted_comparison_keeps_what_it_measured(tmp_path):
    """write_report (also --report-only) from compare.json's runs and the runs' training traces."""
    def metrics(rec: float, sr: float) -> dict:
        return {"all": {"recovery_success": {"rate": rec, "n": 1, "of": 4}, "additional_damage": {"rate": 0.0},
                        "verification_first_rate": {"rate": None}, "SR_ordinary": {"rate": sr, "n": 2, "of": 4}}}

    runs = {"base/seed0": {"metrics": metrics(0.0, 0.25), "handovers": {"a/0": [0.0], "a/1": [0.0]}},
            "b1/seed0": {"metrics": metrics(0.25, 0.5), "handovers": {"a/0": [1.0], "a/1": [0.0]}},
            "ours/seed0": {"metrics": metrics(0.5, 0.5), "handovers": {"a/0": [1.0], "a/1": [1.0]}}}
    traces = tmp_path / "ours-seed0" / "traces"
    traces.mkdir(parents=True)
    (traces / "rollout_000000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        {"step": 0, "verdict": "complete", "handover": {"kind": "wrong_write"}},
        {"step": 0, "verdict": "others", "handover": None})))
    results = {"runs": runs, "arms": ["b1", "ours"], "seeds": [0, 1], "partial": True, "split": "s",
               "eval_tasks": "heldout", "testbed": None,
               "budget": {"steps": 2, "batch": 1, "group": 2, "lr": 1e-4, "eval_n": 1, "eval_temperature": 1.0}}
    compare.write_report(tmp_path, results)
    saved = json.loads((tmp_path / "compare.json").read_text())
    assert saved["table"]["ours"]["recovery_success"][:2] == [0.5, 0.0]
    assert saved["tests"]["ours"]["recovery_handovers"] == {"diff": 0.5, "p": saved["tests"]["ours"]
                                                            ["recovery_handovers"]["p"], "n": 2}
    assert saved["curves"]["recovery"]["ours"] == [{"0": 1.0}, {}] and saved["curves"]["ordinary"]["ours"][0] == {"0": 0.0}
    md = (tmp_path / "compare.md").read_text()
    assert "Interrupted: 3 evaluations" in md and "| ours | 0.500 +- 0.000 |" in md
    assert (tmp_path / "learning_curves.png").exists() and (tmp_path / "held_out.png").exists()

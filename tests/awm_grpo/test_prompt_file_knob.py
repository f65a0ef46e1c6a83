"""The launcher's prompt files (data.prompt_file, data.eval_prompt_file) and context.* knobs.

- `--dry-run` with PROMPT_FILE at a JSONL or parquet file in the recipe's layout gives today's row flags, in
  StateLM's layout `--input-key prompt --label-key reward_model --metadata-key extra_info
  --extra-metadata-keys document_content [data_source]` and no chat template; slime's own parser accepts
  both; the splits are neither read nor written. An unknown layout, a missing or unreadable file and eval
  prompts of another layout are refused with a sentence naming the file.
- context.tools / context.limit switch the generate function to awm_grpo.context.loop.generate and add
  --calculate-per-token-loss; the five context knobs reach the runtime YAML; limit > reserve > 0,
  max_samples >= 1, a limit to work with, and no B1 window (or other per-turn feature) beside them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from awm_grpo.launch import config as C
from awm_grpo.launch.disk import _eval_episodes
from awm_grpo.launch.job import (
    CONTEXT_GENERATE,
    LaunchError,
    check_against_slime,
    main,
    prompt_file_layout,
    runtime_config,
    slime_command,
)

RECIPE_ROW = {"text": [{"role": "user", "content": "How many refills are left?"}],
              "metadata": {"scenario": "clinic_appointments_1", "task_idx": 1, "task": "How many refills?",
                           "task_type": "info_seeking", "split": "train"}}
STATELM_ROW = {"prompt": [{"role": "system", "content": "Answer from the document."},
                          {"role": "user", "content": "Which year?"}],
               "reward_model": {"style": "rule", "ground_truth": "1994"},
               "document_content": "It happened in 1994.",
               "extra_info": {"index": 0, "question": "Which year?", "split": "train", "source": "test"},
               "data_source": "docqa_test"}
RECIPE_FLAGS = ["--input-key", "text", "--metadata-key", "metadata", "--apply-chat-template"]
STATELM_FLAGS = ["--input-key", "prompt", "--label-key", "reward_model", "--metadata-key", "extra_info",
                 "--extra-metadata-keys", "document_content", "data_source"]
BARE_STATELM_ROW = {k: v for k, v in STATELM_ROW.items() if k not in ("data_source", "extra_info")}


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def launcher_env(tmp_path, monkeypatch) -> Path:
    """What a dry run needs: a model folder and every path under tmp_path (the splits folder stays absent)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # the launcher only checks that a model folder is there
    for var in [k.env for k in C.KNOBS] + [k.alias for k in C.KNOBS if k.alias]:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_CKPT", str(model))
    monkeypatch.setenv("SAVE_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("AWM_SPLITS_DIR", str(tmp_path / "splits"))
    return tmp_path


def dry_run(capsys, *args: str) -> tuple[int, list[str], dict[str, Any], str]:
    """(exit code, slime command, runtime YAML, stderr) of `run_awm_grpo.sh --profile cpu --dry-run ARGS`."""
    code = main(["--profile", "cpu", "--dry-run", *args])
    captured = capsys.readouterr()
    if code:
        return code, [], {}, captured.err
    lines = captured.out.splitlines()
    command = lines[lines.index("command:") + 1].split()
    start = lines.index("runtime YAML (--custom-config-path):") + 1
    runtime = yaml.safe_load("\n".join(lines[start:lines.index("command:")]))
    return code, command, runtime, captured.err


def value(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


def row_flags(cmd: list[str]) -> list[str]:
    """The row-reading flags the command carries, in the order the launcher writes them."""
    names = {"--input-key", "--label-key", "--metadata-key"}
    out = []
    for i, flag in enumerate(cmd):
        if flag in names:
            out += [flag, cmd[i + 1]]
        elif flag == "--apply-chat-template":
            out.append(flag)
        elif flag == "--extra-metadata-keys":  # nargs="+": every value up to the next flag
            end = next((j for j in range(i + 1, len(cmd)) if cmd[j].startswith("--")), len(cmd))
            out += cmd[i:end]
    return out


# ---- layouts ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
@pytest.mark.parametrize(("row", "flags"), [(RECIPE_ROW, RECIPE_FLAGS), (STATELM_ROW, STATELM_FLAGS),
                                            (BARE_STATELM_ROW, STATELM_FLAGS[:-1])],
                         ids=["recipe", "statelm", "statelm-without-data-source"])
def test_a_prompt_file_gives_the_flags_of_its_layout(launcher_env, capsys, monkeypatch, suffix, row, flags):
    train = write_rows(launcher_env / f"train{suffix}", [row, row])
    monkeypatch.setenv("PROMPT_FILE", str(train))

    code, cmd, runtime, err = dry_run(capsys)

    assert code == 0, err
    assert value(cmd, "--prompt-data") == str(train) and row_flags(cmd) == flags
    assert "--eval-prompt-data" not in cmd and "--eval-interval" not in cmd  # no eval prompts: no evals
    assert value(cmd, "--custom-generate-function-path") == "awm_grpo.rollout.generate"
    assert "--calculate-per-token-loss" not in cmd and runtime["awm_context_tools"] is False
    assert not (launcher_env / "splits").exists()  # the splits are neither read nor written


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_eval_prompts_of_the_same_layout_run_evals_on_them(launcher_env, capsys, monkeypatch, suffix):
    train = write_rows(launcher_env / f"docs{suffix}", [STATELM_ROW])
    val = write_rows(launcher_env / f"docs_val{suffix}", [STATELM_ROW] * 3)
    monkeypatch.setenv("PROMPT_FILE", f"{train}@[0:1]")  # slime's row slice rides along
    monkeypatch.setenv("EVAL_PROMPT_FILE", str(val))

    code, cmd, _, err = dry_run(capsys, "--set", "training.eval_interval=2")

    assert code == 0, err
    assert value(cmd, "--prompt-data") == f"{train}@[0:1]"
    at = cmd.index("--eval-prompt-data")
    assert cmd[at + 1:at + 3] == ["val", str(val)] and value(cmd, "--eval-interval") == "2"
    assert row_flags(cmd) == STATELM_FLAGS
    cfg = C.resolve(None, gpus=[], env={"PROMPT_FILE": str(train), "EVAL_PROMPT_FILE": str(val),
                                        "EVAL_INTERVAL": "2", "NUM_ROLLOUT": "4"})
    assert _eval_episodes(cfg) == (4 // 2 + 1) * 3  # evals at steps 0, 2, 4 x 3 rows of either format


def test_eval_prompt_file_alone_evaluates_the_splits_training(launcher_env, monkeypatch):
    val = write_rows(launcher_env / "val.parquet", [RECIPE_ROW])
    env = {"EVAL_PROMPT_FILE": str(val), "AWM_SPLITS_DIR": str(launcher_env / "s")}
    cfg = C.resolve(None, gpus=[], env=env)
    cmd = slime_command(cfg, launcher_env / "rt.yaml")
    assert value(cmd, "--prompt-data") == str(launcher_env / "s" / "train.jsonl")
    at = cmd.index("--eval-prompt-data")
    assert cmd[at + 1:at + 3] == ["val", str(val)] and row_flags(cmd) == RECIPE_FLAGS
    assert check_against_slime(cmd) == []
    other = write_rows(launcher_env / "docs_val.jsonl", [STATELM_ROW])
    mixed = C.resolve(None, gpus=[], env={"EVAL_PROMPT_FILE": str(other)})
    with pytest.raises(LaunchError, match=r"docs_val\.jsonl is in the statelm layout but the training"):
        slime_command(mixed, launcher_env / "rt.yaml")


def test_the_statelm_command_passes_slimes_parser(launcher_env):
    train = write_rows(launcher_env / "docs.parquet", [STATELM_ROW])
    cfg = C.resolve(None, gpus=[], env={"PROMPT_FILE": str(train), "AWM_CONTEXT_TOOLS": "true",
                                        "AWM_CONTEXT_LIMIT": "8192"})
    cmd = slime_command(cfg, launcher_env / "rt.yaml")
    assert check_against_slime(cmd) == []  # --extra-metadata-keys is a flag of ours slime.train knows
    from slime.arguments import build_parser

    args = build_parser().parse_args(cmd[3:])
    assert args.extra_metadata_keys == ["document_content", "data_source"] and not args.apply_chat_template
    assert args.custom_generate_function_path == CONTEXT_GENERATE and args.calculate_per_token_loss


@pytest.mark.parametrize(("rows", "words"), [
    ([{"question": "q", "answer": "a"}], r"first row has keys \['answer', 'question'\], which is no layout"),
    ([{"prompt": [{"role": "user", "content": "q"}], "reward_model": {"ground_truth": "a"}}],
     r"first row has keys \['prompt', 'reward_model'\]"),  # StateLM's without the document
    ([{"text": "t", "metadata": None}], r"first row has keys \['text'\]"),
])
@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_an_unknown_layout_is_refused_naming_both_known_ones(launcher_env, capsys, monkeypatch, rows, words,
                                                             suffix):
    path = write_rows(launcher_env / f"odd{suffix}", rows)
    monkeypatch.setenv("PROMPT_FILE", str(path))
    code, _, _, err = dry_run(capsys)
    assert code == 2
    assert str(path) in err and re.search(words, err)
    assert "{text, metadata}" in err and "{prompt, reward_model, document_content, extra_info}" in err


def test_missing_unreadable_and_empty_prompt_files_are_refused(launcher_env, capsys, monkeypatch):
    monkeypatch.setenv("PROMPT_FILE", str(launcher_env / "none.parquet"))
    code, _, _, err = dry_run(capsys)
    assert code == 2 and f"data.prompt_file {launcher_env / 'none.parquet'} does not exist" in err
    fake = launcher_env / "fake.parquet"
    fake.write_text(json.dumps(RECIPE_ROW) + "\n")
    with pytest.raises(LaunchError, match=rf"{fake}: cannot read its first row \(not a parquet file"):
        prompt_file_layout(str(fake))
    broken = launcher_env / "broken.jsonl"
    broken.write_text('{"text": [\n')
    with pytest.raises(LaunchError, match=rf"{broken}: cannot read its first row"):
        prompt_file_layout(str(broken))
    empty = launcher_env / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(LaunchError, match=r"first row has keys \[\]"):
        prompt_file_layout(str(empty))


# ---- context knobs ---------------------------------------------------------------------------------

def test_context_knobs_switch_the_generate_function_and_reach_the_runtime_yaml(launcher_env, capsys):
    code, cmd, runtime, err = dry_run(capsys, "--set", "context.tools=true", "--set", "context.limit=8192",
                                      "--set", "context.reserve=1024", "--set", "context.samples=per_turn",
                                      "--set", "context.max_samples=3")
    assert code == 0, err
    assert value(cmd, "--custom-generate-function-path") == CONTEXT_GENERATE
    assert cmd.count("--calculate-per-token-loss") == 1
    assert {k: v for k, v in runtime.items() if k.startswith("awm_context_")} == {
        "awm_context_tools": True, "awm_context_limit": 8192, "awm_context_reserve": 1024,
        "awm_context_samples": "per_turn", "awm_context_max_samples": 3}


def test_a_limit_alone_runs_the_managed_rollout_and_the_defaults_do_not():
    limited = C.resolve(None, gpus=[], env={"AWM_CONTEXT_LIMIT": "4096"})
    cmd = slime_command(limited, "/tmp/rt.yaml")
    assert value(cmd, "--custom-generate-function-path") == CONTEXT_GENERATE
    assert "--calculate-per-token-loss" in cmd
    assert runtime_config(limited)["awm_context_tools"] is False
    plain = C.resolve(None, gpus=[], env={})
    assert {k: plain[k] for k in plain.values if k.startswith("context.")} == {
        "context.tools": False, "context.limit": None, "context.reserve": 2048, "context.samples": "snapshot",
        "context.max_samples": 8}
    cmd = slime_command(plain, "/tmp/rt.yaml")
    assert value(cmd, "--custom-generate-function-path") == "awm_grpo.rollout.generate"
    assert "--calculate-per-token-loss" not in cmd
    # context.tools with no context.limit takes the engine's cap, inference.max_context_len
    capped = C.resolve(None, gpus=[], env={"AWM_CONTEXT_TOOLS": "1", "ROLLOUT_MAX_CONTEXT_LEN": "6000"})
    assert value(slime_command(capped, "/tmp/rt.yaml"), "--custom-generate-function-path") == CONTEXT_GENERATE


@pytest.mark.parametrize(("env", "words"), [
    ({"AWM_CONTEXT_LIMIT": "2048"}, r"context.limit = 2048 must be larger than context.reserve = 2048"),
    ({"AWM_CONTEXT_TOOLS": "1", "ROLLOUT_MAX_CONTEXT_LEN": "1000"},
     r"inference.max_context_len = 1000 must be larger than context.reserve"),
    ({"AWM_CONTEXT_RESERVE": "0"}, r"context.reserve = 0 must be >= 1"),
    ({"AWM_CONTEXT_MAX_SAMPLES": "0"}, r"context.max_samples = 0 must be >= 1"),
    ({"AWM_CONTEXT_TOOLS": "true"}, r"context.tools needs a context limit: set context.limit"),
    ({"AWM_CONTEXT_TOOLS": "1", "AWM_CONTEXT_LIMIT": "8192", "AWM_HISTORY_WINDOW_TURNS": "3",
      "AWM_CREDIT_METHOD": "b1"},
     r"cannot run with environment.history_window_turns \(AWM_HISTORY_WINDOW_TURNS\), "
     r"recovery.credit_method"),
    ({"AWM_CONTEXT_LIMIT": "8192", "AWM_HISTORY_WINDOW_TURNS": "3"},
     r"cannot run with environment.history_window_turns"),
    ({"AWM_CONTEXT_LIMIT": "8192", "AWM_PREDICATES": "/tmp/p.jsonl"}, r"cannot run with recovery.predicates"),
    ({"AWM_CONTEXT_SAMPLES": "snapshots"},
     r"context.samples = 'snapshots': expected one of snapshot, per_turn"),
    ({"AWM_CONTEXT_LIMIT": "lots"}, r"env AWM_CONTEXT_LIMIT: context.limit = 'lots'"),
])
def test_context_knobs_are_validated(env, words):
    with pytest.raises(C.ConfigError, match=words):
        C.resolve(None, gpus=[], env=env)


def test_a_b1_window_without_context_knobs_stays_allowed():
    cfg = C.resolve(None, gpus=[], env={"AWM_HISTORY_WINDOW_TURNS": "3", "AWM_CREDIT_METHOD": "b1",
                                        "AWM_CONTEXT_RESERVE": "512", "AWM_CONTEXT_SAMPLES": "per_turn"})
    cmd = slime_command(cfg, "/tmp/rt.yaml")
    assert value(cmd, "--custom-generate-function-path") == "awm_grpo.rollout.generate"
    assert cmd.count("--calculate-per-token-loss") == 1


def test_the_context_limit_above_the_engine_cap_warns():
    cfg = C.resolve(None, gpus=[], env={"AWM_CONTEXT_LIMIT": "8192", "ROLLOUT_MAX_CONTEXT_LEN": "4096"})
    assert any("context.limit = 8192 exceeds inference.max_context_len = 4096" in w for w in cfg.warnings)


def test_the_knobs_are_documented_in_the_table_and_the_config_template():
    table, template = C.knob_table(), C.config_template()
    for key, env in (("data.prompt_file", "PROMPT_FILE"), ("data.eval_prompt_file", "EVAL_PROMPT_FILE"),
                     ("context.tools", "AWM_CONTEXT_TOOLS"), ("context.limit", "AWM_CONTEXT_LIMIT"),
                     ("context.reserve", "AWM_CONTEXT_RESERVE"), ("context.samples", "AWM_CONTEXT_SAMPLES"),
                     ("context.max_samples", "AWM_CONTEXT_MAX_SAMPLES")):
        assert f"| `{key}` | `{env}` |" in table
        assert f"  {key.split('.')[1]}: auto" in template and f"# {env}" in template
    assert "\ncontext:" in template and "yaml:awm_context_max_samples" in table


def test_data_source_is_copied_only_when_train_and_eval_rows_both_have_it(launcher_env):
    train = write_rows(launcher_env / "docs.parquet", [STATELM_ROW])
    bare = write_rows(launcher_env / "bare_val.jsonl", [BARE_STATELM_ROW])
    cfg = C.resolve(None, gpus=[], env={"PROMPT_FILE": str(train), "EVAL_PROMPT_FILE": str(bare)})
    assert row_flags(slime_command(cfg, launcher_env / "rt.yaml")) == STATELM_FLAGS[:-1]

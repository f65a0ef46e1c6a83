"""The recipe's config and launcher: precedence, loud errors, profiles, flag mapping, runtime YAML, cleanup."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from awm_grpo.launch import config as C
from awm_grpo.launch.job import (
    LaunchError,
    check_against_slime,
    check_model,
    ensure_splits,
    main,
    runtime_config,
    slime_command,
    start_mcp_servers,
)
from awm_grpo.launch.knobs import KNOBS, PROFILES
from awm_grpo.launch.processes import Children

REPO = Path(__file__).resolve().parents[2]
H100 = "81559 MiB, NVIDIA H100 80GB HBM3\n81559 MiB, NVIDIA H100 80GB HBM3\n"


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def cpu(**kw) -> C.ResolvedConfig:
    kw.setdefault("env", {})
    return C.resolve(kw.pop("config_path", None), gpus=[], **kw)


# ---- precedence ----------------------------------------------------------------------------------
def test_precedence_cli_over_env_over_file_over_profile(tmp_path):
    f = write(tmp_path / "c.yaml", """\
        training:
          num_rollout: 11
        """)
    assert cpu()["training.num_rollout"] == PROFILES["cpu"]["training.num_rollout"]
    assert cpu().sources["training.num_rollout"] == "profile cpu"
    got = cpu(config_path=f)
    assert got["training.num_rollout"] == 11 and got.sources["training.num_rollout"] == f"{f}:2"
    got = cpu(config_path=f, env={"NUM_ROLLOUT": "22"})
    assert got["training.num_rollout"] == 22 and got.sources["training.num_rollout"] == "env NUM_ROLLOUT"
    got = cpu(config_path=f, env={"NUM_ROLLOUT": "22"}, sets=C.parse_sets(["training.num_rollout=33"]))
    assert got["training.num_rollout"] == 33 and got.sources["training.num_rollout"] == "cli --set training.num_rollout"
    # `auto` at a higher layer sets nothing: the next layer decides
    got = cpu(config_path=f, env={"NUM_ROLLOUT": "auto"}, sets={"training.num_rollout": "auto"})
    assert got["training.num_rollout"] == 11


def test_set_accepts_variable_names_and_rejects_unknown_keys():
    assert C.parse_sets(["LR=2e-6", "environment.max_turns=4"]) == {"optimizer.lr": "2e-6",
                                                                    "environment.max_turns": "4"}
    with pytest.raises(C.ConfigError, match="did you mean 'training.num_rollout'"):
        C.parse_sets(["training.num_rollouts=3"])


def test_derived_defaults_follow_the_values_they_derive_from(tmp_path):
    got = cpu(env={"SAVE_DIR": str(tmp_path / "run"), "HF_CKPT": str(tmp_path / "m")})
    assert got["paths.trace_dir"] == str(tmp_path / "run" / "traces")
    assert got["paths.resume_checkpoint"] == str(tmp_path / "run")
    assert got["paths.ref_checkpoint"] == str(tmp_path / "m")
    assert got.sources["paths.ref_checkpoint"] == "profile cpu: = paths.hf_checkpoint"
    got = cpu(env={"AWM_DATA_DIR": str(tmp_path / "awm1k")})
    assert got["paths.splits_dir"].endswith("runs/awm_grpo/splits/awm1k")
    assert cpu()["inference.sglang_server_concurrency"] == 16  # every episode of a CPU step at once
    assert cpu(env={"ROLLOUT_BATCH_SIZE": "3", "N_SAMPLES_PER_PROMPT": "8"})["inference.sglang_server_concurrency"] == 24


def test_relative_paths_resolve_against_their_source(tmp_path):
    sub = tmp_path / "conf"
    sub.mkdir()
    f = write(sub / "c.yaml", "paths:\n  save_dir: ckpt\n")
    assert cpu(config_path=f)["paths.save_dir"] == str(sub / "ckpt")
    assert cpu(config_path=f, env={"SAVE_DIR": "out"}, cwd=tmp_path)["paths.save_dir"] == str(tmp_path / "out")
    assert cpu()["paths.save_dir"] == str(REPO / "runs" / "awm_grpo" / "cpu")


def test_shipped_config_documents_every_knob_and_leaves_them_to_the_profile():
    shipped = C.load_file(C.DEFAULT_CONFIG)
    assert set(shipped) == {k.key for k in KNOBS}
    assert {v for v, _ in shipped.values()} == {"auto"}  # a file value would override the profile
    for name, overrides in PROFILES.items():
        assert set(overrides) <= {k.key for k in KNOBS}, name
    assert set(PROFILES["base"]) == {k.key for k in KNOBS} - {"hardware.profile"}  # the profile picks itself


# ---- loud errors ---------------------------------------------------------------------------------
@pytest.mark.parametrize("text, line, message", [
    ("training:\n  num_rollout: 3\n   lr: 1\n", 3, "invalid YAML"),
    ("training:\n  num_rollout: [1, 2\n", 3, "invalid YAML"),
    ("training:\n  num_rollout: 3\n  num_rolout: 4\n", 3, "unknown key 'training.num_rolout'; did you mean"),
    ("trainning:\n  num_rollout: 3\n", 1, "unknown section 'trainning'"),
    ("optimizer:\n  lr: 1e-6\n  lr: 2e-6\n", 3, "set twice"),
    ("training:\n\n  num_rollout: many\n", 3, "num_rollout = 'many'"),
    ("environment:\n  tool_mode: natve\n", 2, "expected one of meta, native"),
])
def test_broken_config_fails_with_file_and_line(tmp_path, text, line, message):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(C.ConfigError, match=message) as err:
        cpu(config_path=f)
    assert f"{f}:{line}" in str(err.value)


def test_bad_environment_values_name_the_variable():
    with pytest.raises(C.ConfigError, match="env COLOCATE: hardware.colocate = 'maybe'"):
        cpu(env={"COLOCATE": "maybe"})
    with pytest.raises(C.ConfigError, match="env NUM_ROLLOUT"):
        cpu(env={"NUM_ROLLOUT": "2.5"})
    with pytest.raises(C.ConfigError, match="cannot be null"):
        cpu(env={"LR": "null"})
    with pytest.raises(C.ConfigError, match="env LR: optimizer.lr cannot be null"):
        cpu(env={"LR": ""})
    no_filter = cpu(env={"DYNAMIC_SAMPLING_FILTER_PATH": ""})  # the reference recipe's way to turn it off
    assert no_filter["training.dynamic_sampling_filter"] is None
    assert "--dynamic-sampling-filter-path" not in slime_command(no_filter, "/tmp/rt.yaml")
    with pytest.raises(C.ConfigError, match="must divide"):
        cpu(env={"GLOBAL_BATCH_SIZE": "5"})


def test_environment_values_are_parsed_by_kind():
    got = cpu(env={"COLOCATE": "1", "AWM_MCP_URLS": "http://a:1, http://b:2", "AWM_TRANSPORT": "mcp",
                   "AWM_TURN_SCHEDULE": '{"rounds": [10, 20, 30], "every": 100}', "AWM_DATA_DIR": "null"})
    assert got["hardware.colocate"] is True and got["environment.mcp_urls"] == ["http://a:1", "http://b:2"]
    assert got["environment.turn_schedule"] == {"rounds": [10, 20, 30], "every": 100}
    assert got["environment.data_dir"] is None


# ---- profiles ------------------------------------------------------------------------------------
@pytest.mark.parametrize("output, profile, count", [
    ("143771 MiB, NVIDIA H200\n" * 8, "h200", 8),
    (H100, "h100", 2),
    ("81920 MiB, NVIDIA A100-SXM4-80GB\n", "h100", 1),
    ("40960 MiB, NVIDIA A100-SXM4-40GB\n40960 MiB, NVIDIA A100-SXM4-40GB\n", "a100-40gb", 2),
    ("24564, NVIDIA GeForce RTX 4090\n", "a100-40gb", 1),  # --format=csv,noheader,nounits
    ("", "cpu", 0),
])
def test_profile_from_nvidia_smi(output, profile, count):
    gpus = C.parse_nvidia_smi(output)
    assert len(gpus) == count and C.profile_for(gpus) == profile
    got = C.resolve(None, env={}, gpus=gpus)
    assert got.profile == profile and got["hardware.num_gpus"] == count


def test_gpu_profiles_train_qwen3_4b_sharded_recomputed_and_handing_the_gpu_over():
    from slime.arguments import build_parser, finalize_args

    h100 = C.resolve(None, env={}, gpus=C.parse_nvidia_smi(H100))  # two H100s
    assert (h100["hardware.train_num_gpus"], h100["hardware.rollout_num_gpus"], h100["hardware.colocate"]) == (2, 2, True)
    cmd = slime_command(h100, "/tmp/rt.yaml")
    for flag, value in (("--train-backend", "fsdp"), ("--recompute-granularity", "full"),
                        ("--actor-num-gpus-per-node", "2")):
        assert cmd[cmd.index(flag) + 1] == value
    args = build_parser().parse_args(cmd[3:])
    finalize_args(args)
    assert args.bf16 and args.offload_train and args.offload_rollout  # --colocate with SGLang engines
    assert cpu()["training.recompute_granularity"] is None and cpu()["training.train_backend"] == "torch"
    one_40gb = C.resolve(None, env={"LORA_RANK": "0"}, gpus=C.parse_nvidia_smi("40960 MiB, NVIDIA A100-SXM4-40GB\n"))
    assert any("40 GB card needs hardware.train_num_gpus >= 2" in w for w in one_40gb.warnings)
    two_40gb = C.resolve(None, env={}, gpus=C.parse_nvidia_smi("40960 MiB, NVIDIA A100-SXM4-40GB\n" * 2))
    assert not any("40 GB card" in w for w in two_40gb.warnings)


def test_unreadable_nvidia_smi_output_fails():
    with pytest.raises(C.ConfigError, match="GPU memory"):
        C.parse_nvidia_smi("[N/A], NVIDIA H100\n")


def test_profile_values_differ_and_values_above_the_budget_warn():
    h100 = C.resolve(None, env={}, gpus=C.parse_nvidia_smi(H100))
    assert h100["inference.max_response_len"] == 8192 and h100["inference.engine_type"] == "sglang"
    assert h100.warnings == []
    big = C.resolve(None, env={"ROLLOUT_MAX_RESPONSE_LEN": "16384"}, gpus=C.parse_nvidia_smi(H100))
    assert any("inference.max_response_len = 16384 exceeds the h100 budget (8192) [env ROLLOUT_MAX_RESPONSE_LEN]"
               in w for w in big.warnings)
    forced = C.resolve(None, env={"AWM_PROFILE": "cpu"}, gpus=C.parse_nvidia_smi(H100))
    assert forced.profile == "cpu" and forced["inference.engine_type"] == "cpu"


# ---- flag mapping and the runtime YAML -----------------------------------------------------------
REFERENCE_VARIABLES = (
    "NUM_ROLLOUT ROLLOUT_BATCH_SIZE N_SAMPLES_PER_PROMPT OVER_SAMPLING_BATCH_SIZE ROLLOUT_MAX_RESPONSE_LEN "
    "ROLLOUT_TEMPERATURE GLOBAL_BATCH_SIZE MAX_TOKENS_PER_GPU NUM_GPUS ROLLOUT_NUM_GPUS TRAIN_NUM_GPUS COLOCATE "
    "ROLLOUT_NUM_GPUS_PER_ENGINE SGLANG_MEM_FRACTION_STATIC SGLANG_SERVER_CONCURRENCY SAVE_INTERVAL EVAL_INTERVAL "
    "SKIP_EVAL_BEFORE_TRAIN DYNAMIC_SAMPLING_FILTER_PATH LR WEIGHT_DECAY ADAM_BETA1 ADAM_BETA2 KL_LOSS_COEF "
    "EPS_CLIP EPS_CLIP_HIGH HF_CKPT REF_CKPT SAVE_DIR RESUME_CKPT AWM_MAX_TURNS AWM_TOOL_TIMEOUT WANDB_ENABLED "
    "WANDB_PROJECT WANDB_GROUP").split()
RUNTIME_KEYS = {
    "awm_data_dir", "awm_transport", "awm_mcp_urls", "awm_tool_mode", "awm_calls_per_turn", "awm_max_turns",
    "awm_turn_schedule", "awm_max_observation_tokens", "awm_invalid_call_penalty", "awm_terminate_on_invalid_call",
    "awm_max_repeated_calls", "awm_tool_timeout", "awm_verifier_timeout", "awm_env_workers", "awm_trace_dir",
    "awm_enable_thinking", "awm_reward_complete", "awm_reward_partial", "awm_reward_other",
    "awm_reward_doc_correct", "awm_reward_doc_wrong", "awm_reward_doc_none",
    "awm_max_tokens_per_turn", "awm_predicates", "awm_credit_method", "awm_credit_lambda", "awm_credit_beta",
    "awm_credit_eta", "awm_credit_gamma_v", "awm_credit_progress_form", "awm_credit_estimator", "awm_credit_baseline",
    "awm_credit_scale", "awm_credit_binary_only", "awm_judge_url", "awm_judge_model", "awm_judge_api_key_env",
    "awm_judge_concurrency", "awm_judge_timeout", "awm_judge_retries", "awm_history_window_turns", "awm_drift_workers",
    "awm_agentgym_envs", "awm_context_tools", "awm_context_limit", "awm_context_reserve",
    "awm_context_samples", "awm_context_max_samples"}


def test_reference_variables_are_knobs_and_names_are_unique():
    envs = [k.env for k in KNOBS]
    assert len(envs) == len(set(envs)) and len({k.key for k in KNOBS}) == len(KNOBS)
    assert set(REFERENCE_VARIABLES) <= set(envs)
    assert {k.target for k in KNOBS if k.target.startswith("yaml:")} == {f"yaml:{k}" for k in RUNTIME_KEYS}


def distinct(knob, default):
    """A value unlike the default, valid for the knob."""
    special = {"training.global_batch_size": 8, "training.over_sampling_batch_size": 9,
               "inference.engine_type": "sglang", "environment.transport": "mcp",
               "context.limit": 4096}  # above context.reserve's 2048
    if knob.key in special:
        return special[knob.key]
    if knob.choices:
        return next(c for c in knob.choices if c != default)
    return {"int": 7, "float": 0.375, "bool": not default, "str": "pkg.mod.fn", "path": "/tmp/awm-knob-test",
            "list": ["http://10.0.0.1:8001"], "dict": {"rounds": [2, 3], "every": 5}}[knob.kind]


@pytest.mark.parametrize("knob", [k for k in KNOBS if k.target != "launcher"], ids=lambda k: k.key)
def test_every_knob_reaches_its_flag_or_runtime_key(knob):
    base = {"WANDB_ENABLED": "1", "AWM_MCP_URLS": "http://10.0.0.2:8001"}
    default = cpu(env=base)[knob.key]
    value = distinct(knob, default)
    env = {**base, knob.env: json.dumps(value) if isinstance(value, (dict, list)) else str(value)}
    if knob.key in ("inference.sglang_mem_fraction_static", "inference.sglang_dtype"):
        env["AWM_ENGINE_TYPE"] = "sglang"  # a GPU-engine flag
    if knob.key == "context.tools":
        env["AWM_CONTEXT_LIMIT"] = "4096"  # the context-managed rollout needs a limit
    cfg = cpu(env=env)
    assert cfg[knob.key] == value and cfg.sources[knob.key] == f"env {knob.env}"
    cmd = slime_command(cfg, "/tmp/rt.yaml")
    if knob.target.startswith("yaml:"):
        assert runtime_config(cfg)[knob.target[5:]] == value
        return
    expected = {"training.global_batch_size": "2"}.get(knob.key, str(value))  # 4 x 4 samples / 8 = 2 steps
    if knob.kind == "bool":
        assert (knob.target in cmd) is value
        return
    at = cmd.index(knob.target)
    assert cmd[at + 1] == expected
    if knob.key == "grpo.kl_loss_coef":
        assert "--use-kl-loss" in cmd
    if knob.key == "training.seed":
        assert cmd[cmd.index("--rollout-seed") + 1] == cmd[cmd.index("--engine-seed") + 1] == "7"


def test_credit_method_switches_the_advantage_function_on():
    hook = "--custom-advantage-function-path"
    assert hook not in slime_command(cpu(), "/tmp/rt.yaml")
    cmd = slime_command(cpu(env={"AWM_CREDIT_METHOD": "ours", "AWM_PREDICATES": "/tmp/p.jsonl"}), "/tmp/rt.yaml")
    assert cmd[cmd.index(hook) + 1] == "awm_grpo.recovery.advantages"


def test_cpu_command_is_accepted_by_slime_and_carries_the_recipe_hooks(tmp_path):
    cfg = cpu(env={"NUM_ROLLOUT": "3", "SAVE_DIR": str(tmp_path)})
    cmd = slime_command(cfg, tmp_path / "rt.yaml", extra=["--rollout-top-p", "0.9"])
    assert cmd[1:3] == ["-m", "slime.train"] and cmd[-2:] == ["--rollout-top-p", "0.9"]
    assert check_against_slime(cmd) == []
    for flag, value in (("--custom-generate-function-path", "awm_grpo.rollout.generate"),
                        ("--custom-rm-path", "awm_grpo.reward.reward"),
                        ("--custom-rollout-log-function-path", "awm_grpo.traces.log_rollout"),
                        ("--custom-eval-rollout-log-function-path", "awm_grpo.traces.log_eval"),
                        ("--engine-type", "cpu"), ("--input-key", "text"), ("--metadata-key", "metadata"),
                        ("--custom-config-path", str(tmp_path / "rt.yaml"))):
        assert cmd[cmd.index(flag) + 1] == value
    assert cmd[cmd.index("--eval-prompt-data") + 1: cmd.index("--eval-prompt-data") + 3] == [
        "val", str(Path(cfg["paths.splits_dir"]) / "val.jsonl")]
    assert "--use-kl-loss" not in cmd and "--sglang-mem-fraction-static" not in cmd


def test_slime_parser_problems_are_reported():
    cmd = slime_command(cpu(), "/tmp/rt.yaml")
    assert "--no-such-flag" in check_against_slime(cmd + ["--no-such-flag", "1"])[0]
    assert check_against_slime(cmd + ["--advantage-estimator", "nonsense"])  # a bad choice
    assert "--kl-loss-coef" in check_against_slime(cmd + ["--kl-loss-coef", "-1"])[0]  # finalize_args: must be >= 0


def test_runtime_yaml_is_what_the_rollout_and_reward_read(tmp_path):
    from awm_grpo.reward import outcome
    from awm_grpo.rollout import RolloutConfig
    from slime.arguments import apply_custom_config

    cfg = cpu(env={"AWM_MAX_TURNS": "9", "AWM_TOOL_MODE": "native", "AWM_CALLS_PER_TURN": "all",
                   "AWM_TURN_SCHEDULE": '{"rounds": [2, 4], "every": 10}', "AWM_REWARD_PARTIAL": "0.25",
                   "AWM_TOOL_TIMEOUT": "12.5", "AWM_ENV_WORKERS": "2"})
    rt = runtime_config(cfg)
    assert set(rt) == RUNTIME_KEYS
    path = tmp_path / "rt.yaml"
    path.write_text(yaml.safe_dump(rt))
    args = argparse.Namespace()
    apply_custom_config(args, str(path))  # slime's own loader of --custom-config-path
    rc = RolloutConfig.from_args(args)
    assert (rc.max_turns, rc.tool_mode, rc.calls_per_turn, rc.max_turns_at(25)) == (9, "native", "all", 4)
    assert rc.env.tool_timeout_s == 12.5 and rc.env.workers == 2 and rc.env.data_dir is None
    assert outcome(args, {"verdict": "others", "verifier_result": {"result": "partial"}}) == 0.25


# ---- prerequisites -------------------------------------------------------------------------------
def test_missing_model_says_run_setup(tmp_path):
    with pytest.raises(LaunchError, match="run `bash setup.sh`"):
        check_model(str(tmp_path / "nope"), "paths.hf_checkpoint", "HF_CKPT")


def test_missing_splits_are_written_and_foreign_splits_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("AWM_CACHE_DIR", str(tmp_path / "cache"))
    cfg = cpu(env={"AWM_SPLITS_DIR": str(tmp_path / "s"), "AWM_SPLIT_BY": "scenario", "AWM_SPLIT_SEED": "5"})
    assert "missing" in ensure_splits(cfg, dry_run=True) and not (tmp_path / "s").exists()
    assert "wrote" in ensure_splits(cfg, dry_run=False)
    info = json.loads((tmp_path / "s" / "split_info.json").read_text())
    assert info["split_by"] == "scenario" and info["seed"] == 5
    assert "existing" in ensure_splits(cfg, dry_run=False)
    other = cpu(env={"AWM_SPLITS_DIR": str(tmp_path / "s"), "AWM_DATA_DIR": str(tmp_path)})
    with pytest.raises(LaunchError, match="holds other splits .*data_dir"):
        ensure_splits(other, dry_run=False)
    regrouped = cpu(env={"AWM_SPLITS_DIR": str(tmp_path / "s"), "AWM_SPLIT_BY": "task", "AWM_SPLIT_SEED": "5"})
    with pytest.raises(LaunchError, match="split_by: 'scenario' there, 'task' asked"):
        ensure_splits(regrouped, dry_run=False)


def test_dry_run_prints_config_yaml_and_command(tmp_path, monkeypatch, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # the launcher only checks that a model folder is there
    monkeypatch.setenv("AWM_CACHE_DIR", str(tmp_path / "cache"))
    for var in ("NUM_ROLLOUT", "LR", "AWM_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_CKPT", str(model))
    monkeypatch.setenv("SAVE_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("AWM_SPLITS_DIR", str(tmp_path / "splits"))
    monkeypatch.setenv("NUM_ROLLOUT", "3")
    assert main(["--profile", "cpu", "--set", "LR=3e-5", "--dry-run", "--", "--lr", "1e-4"]) == 0
    out = capsys.readouterr().out
    assert "training.num_rollout                  = 3" in out and "[env NUM_ROLLOUT]" in out
    assert "[cli --set optimizer.lr]" in out and "awm_max_turns:" in out
    lines = out.splitlines()
    command = lines[lines.index("command:") + 1]
    assert "--num-rollout 3" in command and "--lr 3e-05" in command and command.endswith("--lr 1e-4")
    assert lines[-1].startswith("engine 0: slime's CPU engine") and "engine 1:" not in out
    assert not (tmp_path / "run").exists()  # a dry run writes nothing
    assert main(["--config", str(write(tmp_path / "bad.yaml", "grpo:\n  eps: 1\n")), "--dry-run"]) == 2
    assert f"{tmp_path / 'bad.yaml'}:2" in capsys.readouterr().err


# ---- processes -----------------------------------------------------------------------------------
CHILD = """
import os, signal, subprocess, sys, time
if sys.argv[2] == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by the grandchild too
# regroup: the grandchild leaves the process group but stays in the session, as Ray's actors do
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                              process_group=0 if sys.argv[2] == "regroup" else None)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {grandchild.pid}")
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def wait_for(path: Path, timeout: float = 20.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    return [int(x) for x in path.read_text().split()]


@pytest.fixture
def bystander():
    """A process this test started itself, outside the launcher: it must survive every cleanup."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


@pytest.mark.parametrize("mode", ["polite", "stubborn", "regroup"])
def test_stop_all_ends_our_process_groups_only(tmp_path, bystander, mode):
    children = Children(record=tmp_path / "children.json")
    children.start("child", [sys.executable, "-c", CHILD, str(tmp_path / "pids"), mode])
    pids = wait_for(tmp_path / "pids")
    assert json.loads((tmp_path / "children.json").read_text())["children"][0]["pgid"] == pids[0]
    assert (os.getpgid(pids[1]) == pids[0]) == (mode != "regroup")
    assert os.getsid(pids[1]) == pids[0]
    started = time.monotonic()
    children.stop_all(grace_s=1.0)
    assert not any(alive(p) for p in pids)
    assert alive(bystander.pid)
    assert (time.monotonic() - started < 1.0) == (mode != "stubborn")  # stubborn: the grace, then KILL
    assert not (tmp_path / "children.json").exists()


def test_run_logged_logs_the_child_and_on_timeout_stops_its_whole_session(tmp_path, bystander):
    """The drivers' (compare, learning) way to run one training or evaluation child."""
    from awm_grpo.launch.processes import run_logged

    log = tmp_path / "ok.log"
    assert run_logged([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr)"], log,
                      timeout_s=30) == 0
    assert log.read_text().split() == ["out", "err"]
    assert run_logged([sys.executable, "-c", CHILD, str(tmp_path / "pids"), "polite"], tmp_path / "slow.log",
                      timeout_s=3) == 124
    assert not any(alive(p) for p in wait_for(tmp_path / "pids")) and alive(bystander.pid)


DRIVER = """
import sys
from pathlib import Path
from awm_grpo.launch import config, job as launch
cfg = config.resolve(None, env={"SAVE_DIR": sys.argv[1]}, gpus=[])
child = [sys.executable, "-c", sys.argv[2], sys.argv[1] + "/pids", "polite"]
sys.exit(launch.run(cfg, child, Path(sys.argv[1]) / "awm_runtime.yaml", grace_s=5.0))
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_launcher_stops_its_children_on_a_signal(tmp_path, bystander, sig):
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path), CHILD], cwd=REPO,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    pids = wait_for(tmp_path / "pids")
    assert yaml.safe_load((tmp_path / "awm_runtime.yaml").read_text())["awm_max_turns"] >= 1
    driver.send_signal(sig)
    assert driver.wait(timeout=30) == 128 + sig
    assert not any(alive(p) for p in pids) and alive(bystander.pid)
    assert not (tmp_path / "launcher_children.json").exists()


def test_launcher_starts_and_stops_local_mcp_servers(tmp_path, monkeypatch):
    import httpx

    from awm_grpo.data_prep import prepare

    monkeypatch.setenv("AWM_CACHE_DIR", str(tmp_path / "cache"))
    prepare(tmp_path / "splits")
    cfg = cpu(env={"AWM_SPLITS_DIR": str(tmp_path / "splits"), "AWM_TRANSPORT": "mcp", "AWM_ENV_WORKERS": "1"})
    children = Children()
    try:
        urls = start_mcp_servers(cfg, children, dict(os.environ))
        assert len(urls) == 1 and urls[0].startswith("http://127.0.0.1:")
        assert httpx.get(urls[0] + "/health", timeout=10).status_code == 200
    finally:
        children.stop_all(grace_s=10.0)
    pid = children.procs[0][1].pid
    assert not alive(pid)


def test_gpu_command_is_accepted_by_slime_and_reaches_sglang():
    from slime.arguments import build_parser, finalize_args
    from slime.engine.sglang_engine import launch_command

    cfg = C.resolve(None, env={}, gpus=C.parse_nvidia_smi(H100))
    cmd = slime_command(cfg, "/tmp/rt.yaml")
    assert cmd[cmd.index("--engine-type") + 1] == "sglang" and "--colocate" in cmd
    assert check_against_slime(cmd) == []
    args = build_parser().parse_args(cmd[3:])
    finalize_args(args)
    launch = launch_command(args, port=30000)
    assert launch[launch.index("--mem-fraction-static") + 1] == "0.7" and "--enable-memory-saver" in launch
    assert launch[launch.index("--dtype") + 1] == "bfloat16"


def test_the_knob_reference_in_docs_is_the_generated_table(capsys):
    """docs/knobs.md is `run_awm_grpo.sh --knobs`'s output: a knob or default changed in knobs.py without
    regenerating it fails here."""
    from awm_grpo.launch.config import knob_table
    from awm_grpo.launch.job import main
    from awm_grpo.launch.knobs import KNOBS

    table = knob_table()
    assert main(["--knobs"]) == 0 and capsys.readouterr().out == table
    assert all(f"`{k.env}`" in table for k in KNOBS)
    docs = Path(__file__).resolve().parents[2] / "docs" / "knobs.md"
    assert docs.read_text(encoding="utf-8") == table, "regenerate: bash awm_grpo/run_awm_grpo.sh --knobs > docs/knobs.md"


def test_config_yaml_is_generated_from_the_knobs_and_resolves_to_the_profile_defaults(capsys, tmp_path):
    """awm_grpo/config.yaml's comments state the defaults of knobs.py, never a hand-kept copy: every knob is
    there as `auto`, its comment names its variable and the defaults; the file resolves to exactly what no
    file resolves to."""
    from awm_grpo.launch.config import DEFAULT_CONFIG, config_template, load_file, resolve
    from awm_grpo.launch.job import main
    from awm_grpo.launch.knobs import KNOBS

    text = config_template()
    assert main(["--config-template"]) == 0 and capsys.readouterr().out == text
    assert DEFAULT_CONFIG.read_text(encoding="utf-8") == text, \
        "regenerate: bash awm_grpo/run_awm_grpo.sh --config-template > awm_grpo/config.yaml"
    values = load_file(DEFAULT_CONFIG)
    assert set(values) == {k.key for k in KNOBS} and {v for v, _ in values.values()} == {"auto"}
    for knob in KNOBS:
        assert f"# {knob.env}" in text
    empty = tmp_path / "empty.yaml"
    empty.write_text("paths: {}\n")
    for profile in ("cpu", "h100"):
        with_file = resolve(DEFAULT_CONFIG, sets={"hardware.profile": profile}, env={}, gpus=[])
        without = resolve(empty, sets={"hardware.profile": profile}, env={}, gpus=[])
        assert with_file.values == without.values and with_file.sources == without.sources


@pytest.mark.parametrize("smi, gpus, prompts, concurrency", [
    ("81559 MiB, NVIDIA H100 80GB HBM3\n", 4, 64, 64),
    ("81559 MiB, NVIDIA H100 80GB HBM3\n", 8, 128, 64),
    ("143771 MiB, NVIDIA H200\n", 8, 256, 128),
])
def test_gpu_profiles_size_a_step_by_the_gpus_that_generate(smi, gpus, prompts, concurrency):
    """docs/gpu.md, batch sizes: 64 episodes per H100 a step (128 per H200), about what an engine's KV
    cache holds in flight, so every episode of a step decodes at once; 8 H200s run the AWM paper's 1,024
    episodes a step."""
    got = C.resolve(None, env={}, gpus=C.parse_nvidia_smi(smi * gpus))
    assert got["training.rollout_batch_size"] == prompts and got["inference.sglang_server_concurrency"] == concurrency
    assert got["training.rollout_batch_size"] * got["training.n_samples_per_prompt"] == prompts * 4
    assert got.warnings == []
    fewer = C.resolve(None, env={"ROLLOUT_NUM_GPUS": "2", "COLOCATE": "false"}, gpus=C.parse_nvidia_smi(smi * gpus))
    assert fewer["training.rollout_batch_size"] == prompts * 2 // gpus  # the GPUs that generate, not all of them

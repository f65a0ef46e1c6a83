"""The flags five of slime's example launch scripts pass, checked against our `slime.arguments`.

For each script (upstream commit 624b824) `SCRIPT_FLAGS` lists the flag names it hands `train.py`,
those of the scripts/models/<model>.sh file it sources included. CI builds an argv from those names with
values of our own, picked from our parser's action for each flag, and checks that every flag is known,
that the CPU form parses with each value landing where plugins read it, and that parallel sizes above 1
are refused with a sentence.

When an upstream checkout is given (`SLIME_UPSTREAM=<a THUDM/slime checkout>`; not in CI) the scripts
are also read in place: bash expands their arrays and `train.py` line,
and the flags found there must be the ones listed here, so that a change upstream shows up. Without the
folder those tests skip with a reason.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from slime.arguments import _AWAITING_WIRING, ArgumentError, build_parser, finalize_args, parse_args
from slime.rollout.rm_hub import RULES

EXAMPLES = Path(os.environ.get("SLIME_UPSTREAM", "/nonexistent")) / "examples"  # a THUDM/slime checkout

SCRIPT_FLAGS: dict[str, tuple[str, ...]] = {
    "multi_agent/run-qwen3-30B-A3B-multi-agent.sh": (
        "--accumulate-allreduce-grads-in-fp32", "--actor-num-gpus-per-node", "--actor-num-nodes",
        "--adam-beta1", "--adam-beta2", "--advantage-estimator", "--apply-chat-template",
        "--attention-backend", "--attention-dropout", "--attention-softmax-in-fp32", "--balance-data",
        "--colocate", "--context-parallel-size", "--custom-generate-function-path", "--disable-bias-linear",
        "--entropy-coef", "--eps-clip", "--eps-clip-high", "--eval-max-response-len", "--eval-top-p",
        "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--ffn-hidden-size",
        "--global-batch-size", "--group-query-attention", "--hf-checkpoint", "--hidden-dropout",
        "--hidden-size", "--input-key", "--kl-loss-coef", "--kl-loss-type", "--kv-channels", "--label-key",
        "--load", "--lr", "--lr-decay-style", "--max-tokens-per-gpu", "--moe-aux-loss-coeff",
        "--moe-ffn-hidden-size", "--moe-grouped-gemm", "--moe-layer-freq", "--moe-permute-fusion",
        "--moe-router-dtype", "--moe-router-score-function", "--moe-router-topk",
        "--moe-token-dispatcher-type", "--moe-token-drop-policy", "--n-samples-per-eval-prompt",
        "--n-samples-per-prompt", "--norm-epsilon", "--normalization", "--num-attention-heads",
        "--num-experts", "--num-layers", "--num-query-groups", "--num-rollout", "--optimizer",
        "--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d", "--pipeline-model-parallel-size",
        "--position-embedding-type", "--prompt-data", "--qk-layernorm", "--recompute-granularity",
        "--recompute-method", "--recompute-num-layers", "--ref-load", "--rm-type", "--rollout-batch-size",
        "--rollout-max-context-len", "--rollout-max-response-len", "--rollout-num-gpus-per-engine",
        "--rollout-shuffle", "--rollout-temperature", "--rotary-base", "--rotary-percent", "--save",
        "--save-interval", "--sequence-parallel", "--sglang-cuda-graph-bs", "--sglang-mem-fraction-static",
        "--swiglu", "--tensor-model-parallel-size", "--untie-embeddings-and-output-weights",
        "--use-dynamic-batch-size", "--use-kl-loss", "--use-precision-aware-optimizer",
        "--use-rollout-logprobs", "--vocab-size", "--weight-decay",
    ),
    "retool/retool_qwen3_4b_rl.sh": (
        "--accumulate-allreduce-grads-in-fp32", "--actor-num-gpus-per-node", "--actor-num-nodes",
        "--adam-beta1", "--adam-beta2", "--advantage-estimator", "--apply-chat-template",
        "--attention-backend", "--attention-dropout", "--attention-softmax-in-fp32", "--balance-data",
        "--colocate", "--context-parallel-size", "--custom-generate-function-path", "--custom-rm-path",
        "--disable-bias-linear", "--entropy-coef", "--eps-clip", "--eps-clip-high", "--eval-interval",
        "--eval-max-response-len", "--eval-prompt-data", "--eval-top-p", "--expert-model-parallel-size",
        "--expert-tensor-parallel-size", "--ffn-hidden-size", "--global-batch-size",
        "--group-query-attention", "--hf-checkpoint", "--hidden-dropout", "--hidden-size", "--input-key",
        "--kl-loss-coef", "--kl-loss-type", "--kv-channels", "--label-key", "--lr", "--lr-decay-style",
        "--max-tokens-per-gpu", "--n-samples-per-eval-prompt", "--n-samples-per-prompt", "--norm-epsilon",
        "--normalization", "--num-attention-heads", "--num-layers", "--num-query-groups", "--num-rollout",
        "--optimizer", "--pipeline-model-parallel-size", "--prompt-data", "--qk-layernorm",
        "--recompute-granularity", "--recompute-method", "--recompute-num-layers", "--ref-load",
        "--reward-key", "--rollout-batch-size", "--rollout-max-response-len",
        "--rollout-num-gpus-per-engine", "--rollout-shuffle", "--rollout-temperature", "--rotary-base",
        "--save", "--save-interval", "--sequence-parallel", "--sglang-mem-fraction-static", "--swiglu",
        "--tensor-model-parallel-size", "--use-dynamic-batch-size", "--use-kl-loss",
        "--use-rotary-position-embeddings", "--use-wandb", "--vocab-size", "--wandb-group", "--wandb-key",
        "--wandb-project", "--weight-decay",
    ),
    "search-r1/run_qwen2.5_3B.sh": (
        "--accumulate-allreduce-grads-in-fp32", "--actor-num-gpus-per-node", "--actor-num-nodes",
        "--adam-beta1", "--adam-beta2", "--add-qkv-bias", "--advantage-estimator", "--apply-chat-template",
        "--attention-backend", "--attention-dropout", "--attention-softmax-in-fp32", "--balance-data",
        "--colocate", "--context-parallel-size", "--custom-generate-function-path", "--custom-rm-path",
        "--disable-bias-linear", "--entropy-coef", "--eps-clip", "--eps-clip-high",
        "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--ffn-hidden-size",
        "--global-batch-size", "--group-query-attention", "--hf-checkpoint", "--hidden-dropout",
        "--hidden-size", "--input-key", "--kl-loss-coef", "--kl-loss-type", "--label-key", "--lr",
        "--lr-decay-style", "--max-tokens-per-gpu", "--n-samples-per-prompt", "--norm-epsilon",
        "--normalization", "--num-attention-heads", "--num-layers", "--num-query-groups", "--num-rollout",
        "--optimizer", "--pipeline-model-parallel-size", "--prompt-data", "--recompute-granularity",
        "--recompute-method", "--recompute-num-layers", "--ref-load", "--rollout-batch-size",
        "--rollout-max-response-len", "--rollout-num-gpus", "--rollout-num-gpus-per-engine",
        "--rollout-shuffle", "--rollout-temperature", "--rotary-base", "--sequence-parallel",
        "--sglang-mem-fraction-static", "--swiglu", "--tensor-model-parallel-size",
        "--use-dynamic-batch-size", "--use-kl-loss", "--use-rotary-position-embeddings", "--vocab-size",
        "--weight-decay",
    ),
    "tau-bench/run_qwen3_4B.sh": (
        "--accumulate-allreduce-grads-in-fp32", "--actor-num-gpus-per-node", "--actor-num-nodes",
        "--adam-beta1", "--adam-beta2", "--advantage-estimator", "--attention-backend",
        "--attention-dropout", "--attention-softmax-in-fp32", "--balance-data", "--colocate",
        "--context-parallel-size", "--custom-generate-function-path", "--disable-bias-linear",
        "--dynamic-sampling-filter-path", "--entropy-coef", "--eps-clip", "--eps-clip-high",
        "--eval-interval", "--eval-max-response-len", "--eval-prompt-data", "--eval-top-k",
        "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--ffn-hidden-size",
        "--global-batch-size", "--group-query-attention", "--hf-checkpoint", "--hidden-dropout",
        "--hidden-size", "--input-key", "--kl-loss-coef", "--kl-loss-type", "--kv-channels", "--load",
        "--lr", "--lr-decay-style", "--max-tokens-per-gpu", "--n-samples-per-eval-prompt",
        "--n-samples-per-prompt", "--norm-epsilon", "--normalization", "--num-attention-heads",
        "--num-layers", "--num-query-groups", "--num-rollout", "--optimizer",
        "--pipeline-model-parallel-size", "--prompt-data", "--qk-layernorm", "--recompute-granularity",
        "--recompute-method", "--recompute-num-layers", "--ref-load", "--rollout-batch-size",
        "--rollout-max-response-len", "--rollout-num-gpus", "--rollout-num-gpus-per-engine",
        "--rollout-shuffle", "--rollout-temperature", "--rotary-base", "--save", "--save-interval",
        "--sequence-parallel", "--sglang-mem-fraction-static", "--swiglu", "--tensor-model-parallel-size",
        "--use-dynamic-batch-size", "--use-kl-loss", "--use-rotary-position-embeddings", "--vocab-size",
        "--weight-decay",
    ),
    "train_infer_mismatch_helper/run-qwen3-4b-mis.sh": (
        "--accumulate-allreduce-grads-in-fp32", "--actor-num-gpus-per-node", "--actor-num-nodes",
        "--adam-beta1", "--adam-beta2", "--advantage-estimator", "--apply-chat-template",
        "--attention-backend", "--attention-dropout", "--attention-softmax-in-fp32", "--balance-data",
        "--colocate", "--context-parallel-size", "--custom-config-path", "--custom-tis-function-path",
        "--disable-bias-linear", "--entropy-coef", "--eps-clip", "--eps-clip-high",
        "--eval-max-response-len", "--eval-prompt-data", "--eval-top-p", "--expert-model-parallel-size",
        "--expert-tensor-parallel-size", "--ffn-hidden-size", "--global-batch-size",
        "--group-query-attention", "--hf-checkpoint", "--hidden-dropout", "--hidden-size", "--input-key",
        "--kl-loss-coef", "--kl-loss-type", "--kv-channels", "--label-key", "--lr", "--lr-decay-style",
        "--max-tokens-per-gpu", "--n-samples-per-eval-prompt", "--n-samples-per-prompt", "--norm-epsilon",
        "--normalization", "--num-attention-heads", "--num-layers", "--num-query-groups", "--num-rollout",
        "--optimizer", "--pipeline-model-parallel-size", "--prompt-data", "--qk-layernorm",
        "--recompute-granularity", "--recompute-method", "--recompute-num-layers", "--ref-load", "--rm-type",
        "--rollout-batch-size", "--rollout-max-response-len", "--rollout-num-gpus-per-engine",
        "--rollout-shuffle", "--rollout-temperature", "--rotary-base", "--save", "--save-interval",
        "--sequence-parallel", "--sglang-mem-fraction-static", "--swiglu", "--tensor-model-parallel-size",
        "--use-dynamic-batch-size", "--use-kl-loss", "--use-rotary-position-embeddings", "--use-tis",
        "--use-wandb", "--vocab-size", "--wandb-group", "--wandb-key", "--wandb-project", "--weight-decay",
    ),
}

# The flags of the models file each script sources (not in the examples folder, so the in-place test
# adds them to what it finds in the script). The 2507 instruct file differs from qwen3-4B in a value only.
MODEL_FILE_FLAGS: dict[str, tuple[str, ...]] = {
    "qwen2.5-3B": (
        "--add-qkv-bias", "--disable-bias-linear", "--ffn-hidden-size", "--group-query-attention",
        "--hidden-size", "--norm-epsilon", "--normalization", "--num-attention-heads", "--num-layers",
        "--num-query-groups", "--rotary-base", "--swiglu", "--use-rotary-position-embeddings",
        "--vocab-size",
    ),
    "qwen3-4B": (
        "--disable-bias-linear", "--ffn-hidden-size", "--group-query-attention", "--hidden-size",
        "--kv-channels", "--norm-epsilon", "--normalization", "--num-attention-heads", "--num-layers",
        "--num-query-groups", "--qk-layernorm", "--rotary-base", "--swiglu",
        "--use-rotary-position-embeddings", "--vocab-size",
    ),
    "qwen3-30B-A3B": (
        "--disable-bias-linear", "--ffn-hidden-size", "--group-query-attention", "--hidden-size",
        "--kv-channels", "--moe-aux-loss-coeff", "--moe-ffn-hidden-size", "--moe-grouped-gemm",
        "--moe-layer-freq", "--moe-permute-fusion", "--moe-router-dtype", "--moe-router-score-function",
        "--moe-router-topk", "--moe-token-dispatcher-type", "--moe-token-drop-policy", "--norm-epsilon",
        "--normalization", "--num-attention-heads", "--num-experts", "--num-layers", "--num-query-groups",
        "--position-embedding-type", "--qk-layernorm", "--rotary-base", "--rotary-percent", "--swiglu",
        "--untie-embeddings-and-output-weights", "--vocab-size",
    ),
}
MODEL_FILE_FLAGS["qwen3-4B-Instruct-2507"] = MODEL_FILE_FLAGS["qwen3-4B"]

PARALLEL_SIZE_FLAGS = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
                       "--expert-model-parallel-size", "--expert-tensor-parallel-size")
# Flags whose value is a file or folder: given names under the test's tmp_path.
PATH_FLAGS = ("--hf-checkpoint", "--ref-load", "--load", "--save", "--prompt-data", "--eval-prompt-data")
INT_VALUE, FLOAT_VALUE = 2, 0.5

# What we write to --custom-config-path: keys a custom TIS function reads from args (the script turns TIS
# on with --use-tis itself), values chosen for this test.
TIS_CONFIG = {"use_rs": False, "tis_level": "sequence", "tis_mode": "clip", "tis_lower_bound": 0.25,
              "tis_upper_bound": 3.0, "tis_batch_normalize": False, "rs_level": "geometric",
              "rs_lower_bound": 0.8, "rs_upper_bound": 1.25, "rs_veto_threshold": 1e-3}


def parser_actions() -> dict[str, argparse.Action]:
    """Our parser's action for each option string."""
    return {flag: action for action in build_parser()._actions for flag in action.option_strings}


def own_value(flag: str, action: argparse.Action, tmp_path: Path) -> list[str]:
    """The words we pass after `flag`: chosen from how our parser reads it, not taken from any script."""
    if action.nargs == 0:
        return []
    if flag in PARALLEL_SIZE_FLAGS:
        return ["1"]  # what the CPU runs; sizes above 1 have a test of their own
    if flag == "--custom-config-path":
        config = tmp_path / "tis.yaml"
        config.write_text(yaml.safe_dump(TIS_CONFIG))
        return [str(config)]
    if flag == "--rm-type":
        return ["math"]  # a rule of our rm_hub: the default would ask for --rm-url
    if action.choices:
        return [str(next(iter(action.choices)))]
    if flag in PATH_FLAGS:
        return [str(tmp_path / action.dest)]
    if action.type is int:
        return [str(INT_VALUE)]
    if action.type is float:
        return [str(FLOAT_VALUE)]
    if flag.endswith("-path"):
        return [f"my_plugins.{action.dest}"]  # a plugin's dotted name: parsing does not import it
    return [action.dest.replace("_", "-")]


def expected_value(action: argparse.Action, words: list[str]) -> object:
    """What `parse_args` should leave at the action's dest after the flag and `words`."""
    if action.nargs == 0:
        return action.const
    convert = action.type or str
    return [convert(w) for w in words] if action.nargs == "+" else convert(words[0])


def own_argv(name: str, tmp_path: Path) -> list[str]:
    """The argv of script `name` on CPU: its flags, in sorted order, with our values."""
    actions = parser_actions()
    argv: list[str] = []
    for flag in SCRIPT_FLAGS[name]:
        argv += [flag, *own_value(flag, actions[flag], tmp_path)]
    return argv


def with_value(argv: list[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    out[out.index(flag) + 1] = value
    return out


@pytest.mark.parametrize("name", sorted(SCRIPT_FLAGS))
def test_every_flag_the_scripts_pass_is_known(name):
    actions = parser_actions()
    assert [flag for flag in SCRIPT_FLAGS[name] if flag not in actions] == []
    assert list(SCRIPT_FLAGS[name]) == sorted(set(SCRIPT_FLAGS[name]))


@pytest.mark.parametrize("name", sorted(SCRIPT_FLAGS))
def test_the_cpu_form_parses_and_every_value_lands(name, tmp_path):
    argv = own_argv(name, tmp_path)
    args = parse_args(argv)

    actions = parser_actions()
    for flag in SCRIPT_FLAGS[name]:
        action = actions[flag]
        words = own_value(flag, action, tmp_path)
        assert getattr(args, action.dest) == expected_value(action, words), flag
    samples = args.rollout_batch_size * args.n_samples_per_prompt
    assert args.num_steps_per_rollout == samples // args.global_batch_size


@pytest.mark.parametrize("name", sorted(SCRIPT_FLAGS))
def test_model_parallel_sizes_are_refused_with_a_sentence(name, tmp_path):
    argv = own_argv(name, tmp_path)
    given = [flag for flag in PARALLEL_SIZE_FLAGS if flag in SCRIPT_FLAGS[name]]
    assert given, "every script spells out its parallel sizes"
    for flag in given:
        with pytest.raises(ArgumentError, match=re.escape(f"{flag} 2: model parallelism is not implemented")):
            parse_args(with_value(argv, flag, "2"))


def test_a_missing_custom_config_is_refused_with_a_sentence():
    with pytest.raises(ArgumentError, match="cannot read it"):
        parse_args([*BASE, "--custom-config-path", "no/such/mis.yaml"])


def test_a_flag_given_twice_keeps_the_later_value():
    """A script may pass a flag its models file set already (retool's --rotary-base): the later one counts."""
    assert parse_args([*BASE, "--rotary-base", "7", "--rotary-base", "11"]).rotary_base == 11


def test_what_the_scripts_set_is_what_plugins_read(tmp_path):
    args = {name: parse_args(own_argv(name, tmp_path)) for name in SCRIPT_FLAGS}

    tau = args["tau-bench/run_qwen3_4B.sh"]
    assert "--eval-top-p" not in SCRIPT_FLAGS["tau-bench/run_qwen3_4B.sh"]
    assert tau.eval_top_p is None  # not given: the eval uses --rollout-top-p
    assert tau.input_key == "input-key" and tau.eval_top_k == INT_VALUE
    assert tau.dynamic_sampling_filter_path == "my_plugins.dynamic_sampling_filter_path"

    agents = args["multi_agent/run-qwen3-30B-A3B-multi-agent.sh"]
    assert agents.eval_max_context_len == agents.rollout_max_context_len == INT_VALUE  # eval inherits it
    assert agents.rm_type in RULES and agents.partial_rollout is False
    assert agents.ignored_sglang_cuda_graph_bs == [INT_VALUE]  # read, not passed on to SGLang (speed only)
    assert agents.num_experts == INT_VALUE and agents.moe_router_topk == INT_VALUE

    retool = args["retool/retool_qwen3_4b_rl.sh"]
    assert retool.reward_key == "reward-key" and retool.eval_reward_key == "reward-key"  # eval inherits it
    assert retool.eval_datasets == {"eval": str(tmp_path / "eval_prompt_data")}

    mis = args["train_infer_mismatch_helper/run-qwen3-4b-mis.sh"]
    assert mis.custom_tis_function_path == "my_plugins.custom_tis_function_path"
    assert {key: getattr(mis, key) for key in TIS_CONFIG} == TIS_CONFIG
    assert mis.use_tis is True and mis.wandb_key == "wandb-key"

    search = args["search-r1/run_qwen2.5_3B.sh"]
    assert search.custom_rm_path == "my_plugins.custom_rm_path" and search.label_key == "label-key"
    assert search.data_source_path == "slime.rollout.data_source.RolloutDataSourceWithBuffer"
    assert search.rollout_global_dataset is True and search.buffer_filter_path is None


# ---- the scripts read in place, when an upstream checkout is here ----------------------------------------

_ARRAY_START = re.compile(r"^[A-Z_]+=\(")
_PLAIN_ASSIGNMENT = re.compile(r"^[A-Z_]+=[^\s\"'$()]+$")


def read_script(path: Path) -> tuple[str, str, str]:
    """(sourced models file, its array and plain assignments, its `python3 train.py` arguments) of a script."""
    lines = path.read_text().splitlines()
    sourced = next(re.search(r"scripts/models/(.+)\.sh", line).group(1) for line in lines
                   if line.lstrip().startswith("source ") and "scripts/models/" in line)
    kept, i = [], 0
    while i < len(lines):
        if _ARRAY_START.match(lines[i]):
            end = next(j for j in range(i, len(lines)) if lines[j].startswith(")"))
            kept += lines[i:end + 1]
            i = end + 1
            continue
        if _PLAIN_ASSIGNMENT.match(lines[i]):
            kept.append(lines[i])
        i += 1
    start = next(k for k, line in enumerate(lines) if "python3 train.py" in line)
    train = []
    for line in lines[start + 1:]:
        train.append(line.rstrip().rstrip("\\"))
        if not line.rstrip().endswith("\\"):
            break
    return sourced, "\n".join(kept), " ".join(train)


def expand(assignments: str, train_line: str) -> list[str]:
    """The argv bash gives `train.py <train_line>` after `assignments`; the models file is not sourced (its
    array expands to nothing) and WANDB_KEY is a stand-in."""
    script = "\n".join(["set -e", "WANDB_KEY=stand-in", assignments, f"printf '%s\\0' {train_line}"])
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    return out.split("\0")[:-1]


def in_place(name: str) -> Path:
    path = EXAMPLES / name
    if not path.is_file():
        pytest.skip(f"no upstream slime examples at {EXAMPLES} (set SLIME_UPSTREAM to a THUDM/slime "
                    "checkout); SCRIPT_FLAGS is checked without them")
    return path


@pytest.mark.parametrize("name", sorted(SCRIPT_FLAGS))
def test_the_scripts_in_place_pass_the_flags_listed_here(name):
    sourced, assignments, train_line = read_script(in_place(name))
    assert sourced in MODEL_FILE_FLAGS, f"{name} now sources scripts/models/{sourced}.sh: list its flags"
    passed = {a for a in expand(assignments, train_line) if a.startswith("--")} | set(MODEL_FILE_FLAGS[sourced])

    listed = set(SCRIPT_FLAGS[name])
    assert (sorted(passed - listed), sorted(listed - passed)) == ([], []), \
        f"upstream's {name} changed its flags (new, gone): update SCRIPT_FLAGS"


@pytest.mark.parametrize("name", sorted(SCRIPT_FLAGS))
def test_the_scripts_in_place_parse_with_their_own_values(name):
    """The values upstream writes (NAME PATH eval pairs, `$(seq ...)` lists, a config next to the script)
    parse too, parallel sizes set to 1."""
    _, assignments, train_line = read_script(in_place(name))
    argv = expand(assignments, train_line)
    for flag in PARALLEL_SIZE_FLAGS:
        if flag in argv:
            argv = with_value(argv, flag, "1")
    if "--custom-config-path" in argv:
        config = EXAMPLES.parent / argv[argv.index("--custom-config-path") + 1]
        assert set(yaml.safe_load(config.read_text())) == set(TIS_CONFIG) | {"use_tis"}, \
            "upstream's TIS config has other keys now: update TIS_CONFIG"
        argv = with_value(argv, "--custom-config-path", str(config))
    parse_args(argv)


# ---- the plugin flags slime defines, with its defaults and meaning ---------------------------------

BASE = ["--hf-checkpoint", "m", "--prompt-data", "p.jsonl", "--rollout-batch-size", "4",
        "--n-samples-per-prompt", "2", "--num-rollout", "1"]

PLUGIN_PATHS = ["--custom-tis-function-path", "--custom-reward-post-process-path", "--buffer-filter-path",
                "--rollout-sample-filter-path", "--rollout-all-samples-process-path",
                "--custom-convert-samples-to-train-data-path", "--rollout-data-postprocess-path"]


@pytest.mark.parametrize("flag", PLUGIN_PATHS)
def test_plugin_path_flags_default_to_none_and_carry_the_path_or_say_they_are_not_called(flag):
    name = flag[2:].replace("-", "_")
    assert getattr(parse_args(BASE), name) is None
    assert getattr(build_parser().parse_args([*BASE, flag, "pkg.mod.fn"]), name) == "pkg.mod.fn"
    if name in _AWAITING_WIRING:  # nothing calls it yet: refused, never skipped silently
        with pytest.raises(ArgumentError, match="not supported yet"):
            parse_args([*BASE, flag, "pkg.mod.fn"])
    else:
        assert getattr(parse_args([*BASE, flag, "pkg.mod.fn"]), name) == "pkg.mod.fn"


def test_slimes_defaults_for_the_new_flags():
    args = parse_args(BASE)
    assert (args.partial_rollout, args.mask_offpolicy_in_partial_rollout) == (False, False)
    assert args.rollout_global_dataset is True and args.tool_key == "tools"
    assert args.rm_type is None and args.rm_url is None and args.eval_reward_key is None
    assert args.sglang_dp_size is None and args.sglang_enable_deterministic_inference is None
    assert args.num_steps_per_rollout == 1 and args.global_batch_size == 8
    assert parse_args([*BASE, "--disable-rollout-global-dataset"]).rollout_global_dataset is False
    assert parse_args([*BASE, "--num-steps-per-rollout", "2"]).global_batch_size == 4


@pytest.mark.parametrize(("extra", "words"), [
    (["--global-batch-size", "3"], "must divide"),
    (["--global-batch-size", "4", "--num-steps-per-rollout", "1"], "disagree"),
    (["--mask-offpolicy-in-partial-rollout"], "needs --partial-rollout"),
    (["--rm-type", "remote_rm"], "--rm-url"),
    (["--sglang-dp-size", "2"], "CPU engine runs one model copy"),
    (["--engine-type", "sglang", "--sglang-dp-size", "2"], "--sglang-enable-dp-attention"),
    (["--sglang-enable-deterministic-inference"], "--engine-max-batch-size 1"),
    (["--kl-loss-coef", "-1"], "must be >= 0"),
])
def test_contradictions_are_refused_with_a_sentence(extra, words):
    with pytest.raises(ArgumentError, match=re.escape(words)):
        parse_args([*BASE, *extra])


def test_what_each_contradiction_allows():
    assert parse_args([*BASE, "--global-batch-size", "4", "--num-steps-per-rollout", "2"]).num_steps_per_rollout == 2
    assert parse_args([*BASE, "--partial-rollout", "--mask-offpolicy-in-partial-rollout"]).partial_rollout
    assert parse_args([*BASE, "--rm-type", "remote_rm", "--rm-url", "http://x"]).rm_url == "http://x"
    deterministic = parse_args([*BASE, "--sglang-enable-deterministic-inference", "--engine-max-batch-size", "1"])
    assert deterministic.sglang_enable_deterministic_inference is True
    assert parse_args([*BASE, "--use-kl-loss", "--kl-loss-coef", "0"]).kl_loss_coef == 0.0


def test_num_epoch_needs_the_global_dataset():
    argv = [a for a in BASE if a not in ("--num-rollout", "1")] + ["--num-epoch", "1"]
    assert parse_args(argv).num_epoch == 1
    with pytest.raises(ArgumentError, match="give --num-rollout"):
        parse_args([*argv, "--disable-rollout-global-dataset"])


def test_a_flag_no_code_here_honours_is_still_refused():
    with pytest.raises(SystemExit):
        build_parser().parse_args([*BASE, "--kl-coef", "0.1"])


def test_finalize_reads_a_namespace_built_before_these_flags():
    """Callers that build the namespace themselves (awm_grpo's launcher) need not know the new flags."""
    args = build_parser().parse_args(BASE)
    for name in ("global_batch_size", "eval_reward_key", "partial_rollout", "sglang_dp_size", "rm_type"):
        delattr(args, name)
    finalize_args(args)
    assert args.num_steps_per_rollout == 1 and args.eval_reward_key is None
    assert isinstance(args, argparse.Namespace)


def test_the_sglang_flags_reach_sglangs_own_parser(sglang, tmp_path):
    """--sglang-dp-size, --sglang-enable-dp-attention and --sglang-enable-deterministic-inference are SGLang's
    server flags under slime's prefix: the launcher passes them on and the pinned sglangs read them as the
    same fields. --sglang-cuda-graph-bs is not passed on (sglang 0.5.23 has no --cuda-graph-bs)."""
    from sglang_real import qwen3_4b_folder

    from slime.engine.sglang_engine import launch_command

    model = str(qwen3_4b_folder(tmp_path / "Qwen3-4B"))
    common = ["--hf-checkpoint", model, *BASE[2:], "--engine-type", "sglang", "--rollout-num-gpus", "2",
              "--rollout-num-gpus-per-engine", "2"]
    args = parse_args([*common, "--sglang-dp-size", "2", "--sglang-enable-dp-attention",
                       "--sglang-cuda-graph-bs", "1", "2", "4"])

    parsed = sglang.parse_server_args(launch_command(args, port=30001)[3:])

    assert parsed["error"] is None, parsed["error"]
    fields = parsed["fields"]
    assert fields["dp_size"] == 2 and fields["enable_dp_attention"] is True
    assert not any(a.startswith("--cuda-graph-bs") for a in launch_command(args, port=30001))

    # deterministic inference needs one of sglang's batch-invariant attention backends (the oracle's CPU
    # stand-in would pick torch_native, which sglang refuses for it)
    argv = launch_command(parse_args([*common, "--sglang-enable-deterministic-inference",
                                      "--sglang-attention-backend", "triton"]), port=30001)[3:]
    parsed = sglang.parse_server_args(argv)
    assert parsed["error"] is None, parsed["error"]
    assert parsed["fields"]["enable_deterministic_inference"] is True
    assert parsed["fields"]["attention_backend"] == "triton"

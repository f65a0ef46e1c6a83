"""benchmarks/gpu_twin.py plays a GPU profile's step on CPU: the flags it hands slime.train must be the
launcher's for that profile, with only the printed CPU substitutions (the benchmark itself runs for minutes
and is not a test; this checks that it keeps measuring the profile it names)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from slime.arguments import build_parser, finalize_args, serving_dtype

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import gpu_twin  # noqa: E402


@pytest.mark.parametrize(("profile", "scale", "prompts", "in_flight", "response_len"),
                         [("h100", 4, 32, 128, 8192), ("h200", 8, 32, 128, 16384)])
def test_the_twin_runs_the_profiles_configuration_scaled(tmp_path: Path, profile: str, scale: int, prompts: int,
                                                         in_flight: int, response_len: int) -> None:
    cfg, notes = gpu_twin.profile_config(profile, tmp_path, str(tmp_path / "model"), scale, steps=3)
    argv = gpu_twin.slime_argv(cfg, tmp_path, tmp_path / "prompts.jsonl", turns=10)

    args = build_parser().parse_args(argv)
    finalize_args(args)
    assert (args.rollout_batch_size, args.over_sampling_batch_size) == (prompts, 2 * prompts)
    assert args.n_samples_per_prompt == 4 and args.sglang_server_concurrency == in_flight
    assert args.rollout_max_response_len == response_len and args.keep_checkpoints == 2
    assert args.update_weight_transport == "tensor" and serving_dtype(args) == "bfloat16"
    assert args.dynamic_sampling_filter_path.endswith("check_reward_nonzero_std")
    assert (args.engine_type, args.train_backend, args.save_interval) == ("cpu", "torch", 1)
    assert any(f"scale 1/{scale}" in line for line in notes)
    assert any("inference.engine_type: sglang -> cpu" in line for line in notes)

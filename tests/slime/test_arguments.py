"""slime's parser refuses what no backend implements (issue 20) instead of dropping it silently, and the
recipe's GPU profiles only produce commands it accepts, with the trainer setting measured to fit."""

from __future__ import annotations

import pytest

from slime.arguments import ArgumentError, build_parser, finalize_args, parse_args

BASE = ["--hf-checkpoint", "m", "--prompt-data", "p.jsonl", "--rollout-batch-size", "1", "--num-rollout", "1"]


def parse(*flags: str):
    return parse_args([*BASE, *flags])


@pytest.mark.parametrize("flag", ["--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                                  "--context-parallel-size", "--expert-model-parallel-size"])
def test_model_parallel_sizes_other_than_one_are_refused(flag):
    assert getattr(parse(flag, "1"), flag.lstrip("-").replace("-", "_")) == 1  # launch scripts spell out 1
    for backend in ("torch", "fsdp", "megatron"):
        with pytest.raises(ArgumentError, match=f"{flag} 2: .*Use --train-backend fsdp"):
            parse(flag, "2", "--train-backend", backend)


def test_bf16_is_accepted_with_fsdp_only():
    assert parse("--train-backend", "fsdp", "--bf16").bf16
    assert not parse("--train-backend", "megatron").bf16
    for backend in ("torch", "megatron"):
        with pytest.raises(ArgumentError, match=f"the {backend} backend trains in fp32. Use --train-backend fsdp"):
            parse("--train-backend", backend, "--bf16")


def test_nccl_weight_sync_is_refused_with_colocated_engines():
    assert parse("--engine-type", "sglang", "--update-weight-transport", "nccl").update_weight_transport == "nccl"
    with pytest.raises(ArgumentError, match="Use --update-weight-transport disk .* with --colocate"):
        parse("--engine-type", "sglang", "--update-weight-transport", "nccl", "--colocate")
    assert parse("--engine-type", "sglang", "--colocate").update_weight_transport == "disk"


@pytest.mark.parametrize("gpus", [
    "81559 MiB, NVIDIA H100 80GB HBM3\n" * 4,
    "81559 MiB, NVIDIA H100 80GB HBM3\n",
    "143771 MiB, NVIDIA H200\n" * 8,
    "40960 MiB, NVIDIA A100-SXM4-40GB\n" * 2,
])
def test_gpu_profiles_pick_the_trainer_setting_measured_to_fit(gpus):
    """README, GPU memory: Qwen3-4B's step runs out of memory without recompute (>134 GiB) and peaks at
    63 GiB with fsdp + bf16 + full recompute; the Megatron backend is fp32 and replicated (~75 GiB)."""
    from awm_grpo.launch import config as C
    from awm_grpo.launch.job import check_against_slime, slime_command

    cfg = C.resolve(None, env={}, gpus=C.parse_nvidia_smi(gpus))
    cmd = slime_command(cfg, "/tmp/rt.yaml")

    assert check_against_slime(cmd) == []
    args = build_parser().parse_args(cmd[3:])
    finalize_args(args)
    assert (args.train_backend, args.bf16, args.recompute_granularity) == ("fsdp", True, "full")
    # colocated (the GPU profiles' default): weights by CUDA-IPC handles, never through disk (issue 36)
    assert args.colocate and args.update_weight_transport == "tensor" and args.tensor_model_parallel_size == 1
    megatron = C.resolve(None, env={"TRAIN_BACKEND": "megatron"}, gpus=C.parse_nvidia_smi(gpus))
    assert any("--bf16 is implemented by --train-backend fsdp only" in p
               for p in check_against_slime(slime_command(megatron, "/tmp/rt.yaml")))

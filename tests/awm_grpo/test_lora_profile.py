"""One GPU trains LoRA adapters (awm_grpo/launch/knobs.py): the launcher's command for a one-GPU machine turns
LoRA on at rank 32 with LoRA's learning rate, slime's own parser reads it, and the KL reference is the policy's
own base (so the trainer reads it with the adapters off). The engines it launches are parsed by sglang's own
server arguments in tests/awm_grpo/test_gpu_dry_run.py (its 1xH200 machine)."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from awm_grpo.launch import config as C
from awm_grpo.launch.job import runtime_config, slime_command
from slime.arguments import parse_args
from slime.backends.train_worker import same_folder

H200 = "143771 MiB, NVIDIA H200\n"
A100_40 = "40960 MiB, NVIDIA A100-SXM4-40GB\n"


def parsed(cfg: C.ResolvedConfig, tmp_path: Path) -> argparse.Namespace:
    """What slime's parser makes of the launcher's command (the runtime YAML written as a run would)."""
    runtime = tmp_path / "awm_runtime.yaml"
    runtime.write_text(yaml.safe_dump(runtime_config(cfg)))
    return parse_args(slime_command(cfg, runtime)[3:])


def gpus(line: str, n: int) -> list[C.Gpu]:
    return C.parse_nvidia_smi(line * n)


def test_one_gpu_trains_rank_32_adapters_and_more_gpus_the_full_model(tmp_path):
    one = C.resolve(None, env={}, gpus=gpus(H200, 1))
    args = parsed(one, tmp_path)
    assert (args.lora_rank, args.lora_alpha, args.lr) == (32, 64.0, 1e-5)
    assert args.target_modules == "all-linear" and args.train_backend == "fsdp" and args.colocate
    assert "one GPU: 32" in one.sources["training.lora_rank"]
    # the KL reference is the policy's own base: the trainer reads it with the adapters off, no second copy
    assert args.use_kl_loss and same_folder(args.ref_load, args.hf_checkpoint)

    eight = parsed(C.resolve(None, env={}, gpus=gpus(H200, 8)), tmp_path)
    assert (eight.lora_rank, eight.lr) == (0, 1e-6)
    full = parsed(C.resolve(None, env={"LORA_RANK": "0"}, gpus=gpus(H200, 1)), tmp_path)
    assert (full.lora_rank, full.lr) == (0, 1e-6)  # asked for: full fine-tuning on one GPU, its rate
    mine = parsed(C.resolve(None, env={"LR": "3e-5", "LORA_ALPHA": "32"}, gpus=gpus(H200, 1)), tmp_path)
    assert (mine.lora_rank, mine.lora_alpha, mine.lr) == (32, 32.0, 3e-5)  # what the user sets wins
    cpu = C.resolve(None, env={}, gpus=[])
    assert cpu["training.lora_rank"] == 0 and cpu["optimizer.lr"] == 1e-5


def test_one_40gb_card_is_warned_only_when_it_trains_the_full_model():
    lora = C.resolve(None, env={}, gpus=gpus(A100_40, 1))
    assert lora["training.lora_rank"] == 32 and not [w for w in lora.warnings if "40 GB card" in w]
    full = C.resolve(None, env={"LORA_RANK": "0"}, gpus=gpus(A100_40, 1))
    assert any("40 GB card needs hardware.train_num_gpus >= 2" in w and "LORA_RANK" in w for w in full.warnings)

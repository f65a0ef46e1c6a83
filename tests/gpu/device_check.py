"""Figures of the trainer's GPU paths on one GPU, with the machine's own python (torch + transformers;
no Ray, no SGLang, no network). `tests/gpu/device_check.sh` runs it, then tests/slime/test_gpu.py.

    PYTHONPATH=. python tests/gpu/device_check.py [--device cuda|cpu] [--small] [--out FILE]

Checks, each printed as one JSON line `{"check": ..., ...figures}`:
  env             torch / CUDA versions and the GPU
  fsdp_bf16_step  a Qwen3-shaped model on one FSDP2 rank, bf16 compute: seconds a step, peak memory
  offload         the same trainer to host memory and back: memory left on the device, seconds each way
  weight_send     every weight the trainer holds, streamed in HF names through `trainer_hf_tensors`,
                  bucketed and broadcast over a one-rank update group formed by `init_custom_group`
                  (nccl on the GPU): tensors sent against the model's, GiB/s
  nccl_two_ranks  (GPU only) two processes on the one GPU try to form one NCCL update group: why
                  --update-weight-transport nccl is refused with --colocate
`--device cpu --small` runs the same code on the CPU with gloo (tests/gpu/test_device_check.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]
GIB = 1024**3
# A Qwen3-shaped model big enough for figures, small enough for minutes: about 0.25 B parameters.
SIZES = {"full": dict(vocab_size=32768, hidden_size=1024, intermediate_size=3072, num_hidden_layers=12,
                      num_attention_heads=16, num_key_value_heads=8, head_dim=64),
         "small": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16)}


def report(check: str, **figures: Any) -> dict[str, Any]:
    line = {"check": check, **figures}
    print(json.dumps(line), flush=True)
    return line


def peak_gib(device: str) -> float | None:
    return round(torch.cuda.max_memory_allocated() / GIB, 3) if device == "cuda" else None


def held_gib(device: str) -> float | None:
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    return round(torch.cuda.memory_allocated() / GIB, 3)


def build_model(out: Path, size: str) -> Path:
    from transformers import Qwen3ForCausalLM

    from slime.models.tiny import build_config

    shape = dict(SIZES[size])
    vocab = shape.pop("vocab_size")
    torch.manual_seed(0)
    config = build_config(vocab, eos_id=vocab - 1, pad_id=0, tie_word_embeddings=False, **shape)
    Qwen3ForCausalLM(config).save_pretrained(out)
    return out


def samples(vocab: int, count: int, length: int) -> list[Any]:
    from slime.utils.types import Sample

    rng = random.Random(0)
    return [Sample(index=i, tokens=[rng.randrange(1, vocab) for _ in range(length)], response_length=length // 2,
                   loss_mask=[1] * (length // 2)) for i in range(count)]


def fsdp_bf16_step(model_dir: Path, device: str, size: str) -> tuple[Any, dict[str, Any]]:
    from slime.algorithms.losses import PolicyLossConfig
    from slime.backends.distributed import init_data_parallel
    from slime.backends.torch_backend import TorchTrainer, TrainerConfig
    from slime.utils.ports import free_port

    dp = init_data_parallel(0, 1, "127.0.0.1", free_port("127.0.0.1"), fsdp=True)
    trainer = TorchTrainer(str(model_dir), TrainerConfig(lr=1e-4, fsdp_param_dtype="bfloat16",
                                                         gradient_checkpointing=True), device=device, dp=dp)
    length = 1024 if size == "full" else 32
    batch = samples(SIZES[size]["vocab_size"], 8, length)
    advantages = [(-1.0) ** i for i in range(len(batch))]
    times, losses = [], []
    for _ in range(3):
        started = time.perf_counter()
        metrics = trainer.train_step(batch, advantages, PolicyLossConfig(aggregation="sequence_mean"))
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
        losses.append(metrics["loss"])
    params = sum(p.numel() for p in trainer.model.parameters())
    return trainer, report("fsdp_bf16_step", params_m=round(params / 1e6, 1), tokens=len(batch) * length,
                           step_s=round(sorted(times)[1], 3), first_step_s=round(times[0], 3),
                           peak_gib=peak_gib(device), finite=all(map(math.isfinite, losses)))


def offload(trainer: Any, device: str) -> dict[str, Any]:
    before = held_gib(device)
    started = time.perf_counter()
    trainer.offload()
    out_s = time.perf_counter() - started
    after = held_gib(device)
    started = time.perf_counter()
    trainer.onload()
    back_s = time.perf_counter() - started
    on_device = all(p.device.type == device for p in trainer.model.parameters())
    return report("offload", held_gib=before, after_offload_gib=after, out_s=round(out_s, 3),
                  back_s=round(back_s, 3), back_on_device=on_device)


def weight_send(trainer: Any, device: str) -> dict[str, Any]:
    from slime.utils.ports import free_port
    from slime.weight_sync import (
        broadcast_bucket,
        bucket_named_tensors,
        hf_name,
        init_custom_group,
        trainer_hf_tensors,
    )

    backend = "nccl" if device == "cuda" else "gloo"
    group = init_custom_group(backend, f"tcp://127.0.0.1:{free_port('127.0.0.1')}", 1, 0, "device_check",
                              timeout_s=120)
    expected = [hf_name(k) for k in trainer.model.state_dict()]
    sent, nbytes = [], 0
    started = time.perf_counter()
    for bucket in bucket_named_tensors(trainer_hf_tensors(trainer), 64 * 1024**2):
        nbytes += broadcast_bucket(bucket, group, device)
        sent += [name for name, _ in bucket]
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    torch.distributed.destroy_process_group(group)
    return report("weight_send", backend=backend, tensors=len(sent), model_tensors=len(expected),
                  every_name=sorted(sent) == sorted(expected), gib=round(nbytes / GIB, 3),
                  gib_per_s=round(nbytes / GIB / seconds, 2))


RANK = """
import sys, torch, torch.distributed as dist
from slime.weight_sync import init_custom_group
torch.cuda.set_device(0)
group = init_custom_group("nccl", sys.argv[1], 2, int(sys.argv[2]), "device_check_pair", timeout_s=60)
x = torch.ones(4, device="cuda") * (1 - int(sys.argv[2]))
dist.broadcast(x, group=group, group_src=0)
torch.cuda.synchronize()
print("received", x.tolist(), flush=True)
"""


def nccl_two_ranks() -> dict[str, Any]:
    """Two ranks on one GPU in one NCCL communicator (what --colocate with nccl transport would need)."""
    from slime.utils.ports import free_port

    init = f"tcp://127.0.0.1:{free_port('127.0.0.1')}"
    procs = [subprocess.Popen([sys.executable, "-c", RANK, init, str(r)], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    outcome = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=90)
            lines = [ln for ln in (out + err).splitlines() if ln.strip()]
            errors = [ln for ln in lines if "Error" in ln or "received" in ln]  # the reason, not the exit warnings
            outcome.append({"rc": proc.returncode, "last": (errors or lines or [""])[-1][-300:]})
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            outcome.append({"rc": None, "last": "hung for 90 s"})
    formed = all(o["rc"] == 0 for o in outcome)
    return report("nccl_two_ranks", formed=formed, ranks=outcome)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    parser.add_argument("--small", action="store_true", help="the tiny model (CPU test)")
    args = parser.parse_args(argv)
    size = "small" if args.small else "full"
    lines = [report("env", torch=torch.__version__, cuda=torch.version.cuda, device=args.device,
                    gpu=torch.cuda.get_device_name(0) if args.device == "cuda" else None,
                    gpu_gib=round(torch.cuda.get_device_properties(0).total_memory / GIB, 1)
                    if args.device == "cuda" else None)]
    with tempfile.TemporaryDirectory(prefix="device-check-") as tmp:
        trainer, line = fsdp_bf16_step(build_model(Path(tmp) / "model", size), args.device, size)
        lines += [line, offload(trainer, args.device), weight_send(trainer, args.device)]
        trainer.dp.close()
    if args.device == "cuda":
        lines.append(nccl_two_ranks())
    return lines


if __name__ == "__main__":
    main()
    # Done and reported: exit without interpreter finalization, where a destroyed process group's C++
    # threads can abort the process now and then (see tests/slime/dp_worker.py).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

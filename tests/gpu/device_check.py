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
  bf16_save       a Qwen3-4B-shaped model (its layer shape and vocabulary, 12 of its 36 layers) trained
                  one step under FSDP2 + bf16: its export for engines in bf16 and reloaded (dtype in
                  config.json, bytes, seconds), then a checkpoint (bf16 model/ + fp32 master weights and
                  AdamW state, sharded) saved and restored exactly after another step: bytes, seconds, GB/s
  tensor_sync     a Qwen3-4B-shaped model (all 36 layers, fp32 on the GPU) sent by `TensorWeightSync` in bf16
                  512 MiB buckets to an engine process (tests/gpu/tensor_receiver.py, over HTTP) by CUDA IPC
                  handles, twice: bytes a parameter, seconds, GB/s, and whether the engine's weights are
                  bit-equal to the trainer's cast to bf16. No SGLang on the lent machine: the handles are
                  torch's own in sglang's wire format (`slime.engine.tensor_payload.encode`), not sglang's
                  serializer; on the CPU (`--device cpu`) the same check runs with shared-memory handles
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
# Qwen3-4B's shapes (its config.json), 12 of its 36 decoder layers: 1.6 B parameters, so that a save
# (about 14 bytes a parameter) fits the lent machine's disk twice over; figures scale with the layers.
QWEN3_4B = dict(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, tie_word_embeddings=True, rope_theta=1_000_000.0,
                max_position_embeddings=40960, rms_norm_eps=1e-6)
SAVE_SHAPES = {"full": dict(QWEN3_4B, num_hidden_layers=12),
               "small": dict(SIZES["small"], tie_word_embeddings=True)}


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
    from slime.utils.misc import free_port

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
    from slime.utils.misc import free_port
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


def _full(tensor: Any) -> torch.Tensor:
    """The whole tensor of an FSDP2 parameter (a DTensor), or the tensor itself."""
    tensor = tensor.detach()
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def bf16_save(root: Path, device: str, size: str) -> dict[str, Any]:
    """Export in bf16 and reload; save a checkpoint, train on, restore it: exact, with bytes and seconds."""
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

    from slime.algorithms.losses import PolicyLossConfig
    from slime.backends.distributed import init_data_parallel
    from slime.backends.torch_backend import TorchTrainer, TrainerConfig
    from slime.utils.misc import free_port

    torch.manual_seed(0)
    with torch.device(device):  # initialised where it trains: no 6 GB fp32 folder to write and read first
        model = Qwen3ForCausalLM(Qwen3Config(**SAVE_SHAPES[size], dtype="float32"))
    dp = init_data_parallel(0, 1, "127.0.0.1", free_port("127.0.0.1"), fsdp=True)
    trainer = TorchTrainer(model, TrainerConfig(lr=1e-5, fsdp_param_dtype="bfloat16", gradient_checkpointing=True),
                           device=device, dp=dp)
    batch = samples(SAVE_SHAPES[size]["vocab_size"], 2, 512 if size == "full" else 32)
    step = lambda: trainer.train_step(batch, [1.0, -1.0], PolicyLossConfig(aggregation="sequence_mean"))  # noqa: E731
    step()  # AdamW's moments exist from the first step on: the save holds them
    sync = torch.cuda.synchronize if device == "cuda" else lambda: None

    started = time.perf_counter()
    export = Path(trainer.export_hf(root / "export", dtype="bfloat16"))
    export_s = time.perf_counter() - started
    started = time.perf_counter()
    reloaded = AutoModelForCausalLM.from_pretrained(export, dtype="auto")
    reload_s = time.perf_counter() - started
    expected = {k: _full(v).to("cpu", torch.bfloat16) for k, v in trainer.model.state_dict().items()}
    same = all(torch.equal(v, expected[k]) for k, v in reloaded.state_dict().items())
    written_dtype = str(AutoConfig.from_pretrained(export).dtype).removeprefix("torch.")
    param_dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in reloaded.parameters()})
    del reloaded, expected

    snapshot = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    moments = [s["exp_avg"].clone() for s in trainer.optimizer.state.values()]
    sizes = trainer.checkpoint_sizes("bfloat16")
    sync()
    started = time.perf_counter()
    saved = Path(trainer.save_checkpoint(root / "ckpt", iteration=1, dtype="bfloat16", keep=2))
    save_s = time.perf_counter() - started
    parts = {name: _bytes(saved / name) for name in ("model", "trainer")}
    step()  # moves every weight and moment away from the save
    moved = not all(torch.equal(v, snapshot[k]) for k, v in trainer.model.state_dict().items())
    started = time.perf_counter()
    trainer.load_checkpoint(root / "ckpt")
    sync()
    restore_s = time.perf_counter() - started
    exact = all(torch.equal(v, snapshot[k]) for k, v in trainer.model.state_dict().items()) and all(
        torch.equal(s["exp_avg"], m) for s, m in zip(trainer.optimizer.state.values(), moments, strict=True))
    total = _bytes(saved)
    params = sum(p.numel() for p in trainer.model.parameters())
    trainer.dp.close()
    return report("bf16_save", params_m=round(params / 1e6, 1), layers=SAVE_SHAPES[size]["num_hidden_layers"],
                  export_gb=round(_bytes(export) / 1e9, 3), export_s=round(export_s, 2),
                  export_config_dtype=written_dtype, reload_param_dtypes=param_dtypes, reload_s=round(reload_s, 2),
                  reload_equals_bf16_weights=same, save_gb=round(total / 1e9, 3),
                  save_parts_gb={k: round(v / 1e9, 3) for k, v in parts.items()},
                  planned_gb=round(sum(sizes.values()) / 1e9, 3), save_s=round(save_s, 2),
                  save_gb_per_s=round(total / 1e9 / save_s, 2), restore_s=round(restore_s, 2),
                  moved_by_a_step=moved, restored_exactly=exact,
                  qwen3_4b_save_gb_at_this_rate_s=round(56.3 / (total / 1e9 / save_s), 1))


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
    from slime.utils.misc import free_port

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


SYNC_SHAPES = {"full": dict(QWEN3_4B, num_hidden_layers=36), "small": dict(SIZES["small"], tie_word_embeddings=True)}


def tensor_sync(device: str, size: str) -> dict[str, Any]:
    """The colocated weight sync of a Qwen3-4B-shaped model into another process: twice (the first
    allocates the engine's weights), the weights moved by a step in between, then checked bit for bit."""
    import httpx
    from transformers import Qwen3Config, Qwen3ForCausalLM

    import slime.weight_sync as ws
    from slime.engine.base import EngineClient
    from slime.engine.tensor_payload import TensorMetadata, encode
    from tests.gpu.tensor_receiver import checksum

    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(Qwen3Config(**SYNC_SHAPES[size], dtype="float32"))
    proc = subprocess.Popen([sys.executable, str(REPO / "tests/gpu/tensor_receiver.py")], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        if not line.startswith("listening on "):
            raise RuntimeError(f"the receiver did not start: {line}{proc.communicate(timeout=30)[1][-3000:]}")
        url = line.split()[-1]
        mode = "ipc" if device == "cuda" else "shm"
        if mode == "ipc" and not _has_sglang():  # the lent machine: torch's handles in sglang's wire format
            ws._sglang_serializer = lambda: (lambda obj: encode(obj["flattened_tensor"], obj["metadata"]),
                                             TensorMetadata)
        sync = ws.TensorWeightSync(mode, dtype="bfloat16", bucket_bytes=512 * 1024**2)
        engine = EngineClient(url)
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        seconds = []
        for version in (1, 2):
            if version == 2:
                with torch.no_grad():
                    for p in model.parameters():
                        p.mul_(1.001)  # a step's worth of change: every weight moves
            sync.sync(model, [engine], version=version)
            seconds.append(sync.seconds)
        extra_gib = round((torch.cuda.max_memory_allocated() - before) / GIB, 3) if device == "cuda" else None
        got = httpx.get(f"{url}/checksums", timeout=600).json()
        expected = {name: checksum(t.to(torch.bfloat16)) for name, t in ws.hf_named_tensors(model)}
        stats = sync.stats()
        return report("tensor_sync", transport=sync.transport, layers=SYNC_SHAPES[size]["num_hidden_layers"],
                      params_m=round(stats["parameters"] / 1e6, 1), bytes_gb=round(stats["bytes_sent"] / 1e9, 3),
                      bytes_per_param=round(stats["bytes_per_parameter"], 4), posts_per_sync=got["posts"] // 2,
                      first_s=round(seconds[0], 3), second_s=round(seconds[1], 3),
                      second_gb_per_s=round(stats["bytes_sent"] / 1e9 / seconds[1], 1),
                      engine_load_s_both=round(got["load_s"], 3), engine_dtypes=got["dtypes"],
                      engine_version=engine.weight_version(), sender_extra_peak_gib=extra_gib,
                      every_name=sorted(got["checksums"]) == sorted(expected),
                      bit_equal_bf16=got["checksums"] == expected)
    finally:
        proc.kill()
        proc.communicate(timeout=30)


def _has_sglang() -> bool:
    try:
        import sglang  # noqa: F401
    except ImportError:
        return False
    return True


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
        del trainer
        if args.device == "cuda":
            torch.cuda.empty_cache()
        lines.append(bf16_save(Path(tmp), args.device, size))
        if args.device == "cuda":
            torch.cuda.empty_cache()
        lines.append(tensor_sync(args.device, size))
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

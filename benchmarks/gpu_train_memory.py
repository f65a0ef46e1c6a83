"""GPU memory and time of one GRPO train step of a Qwen3-4B-shaped model (random weights, GPU only).

    python benchmarks/gpu_train_memory.py [--tokens 8192 16384] [--modes fp32 fp32-recompute fsdp-bf16-recompute]

What the GPU profiles must fit: `--max-tokens-per-gpu` tokens in one micro-batch (h100: 8192, h200:
16384) through `TorchTrainer.train_step` with AdamW (fp32 weights + two fp32 moments). For each mode
and token budget it prints the peak memory of a steady-state step (the second: Adam's moments exist),
the step time, and what `offload()` leaves on the GPU and how long offload / onload take (the
colocated hand-over of --offload-train). A step that does not fit prints OOM. Nothing is downloaded:
the architecture is Qwen3-4B's config, the weights are random.
"""

from __future__ import annotations

import argparse
import gc
import time

import torch
import torch.distributed as dist
from transformers import Qwen3Config, Qwen3ForCausalLM

from slime.algorithms.losses import PolicyLossConfig
from slime.backends.distributed import DataParallel, init_data_parallel
from slime.backends.torch_backend import TorchTrainer, TrainerConfig
from slime.utils.types import Sample

QWEN3_4B = dict(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                rope_theta=1_000_000.0, max_position_embeddings=40960, rms_norm_eps=1e-6)
MODES = {  # name -> (TrainerConfig overrides, FSDP2)
    "fp32": ({}, False),
    "fp32-recompute": ({"gradient_checkpointing": True}, False),
    "fsdp-bf16-recompute": ({"gradient_checkpointing": True, "fsdp_param_dtype": "bfloat16"}, True),
}
GIB = 1024**3


def samples_for(tokens: int, per_sample: int = 1024, vocab: int = 151936) -> list[Sample]:
    """tokens / per_sample samples, the second half of each a response (what one micro-batch holds)."""
    gen = torch.Generator().manual_seed(0)
    return [Sample(index=i, tokens=torch.randint(10, vocab, (per_sample,), generator=gen).tolist(),
                   response_length=per_sample // 2) for i in range(max(1, tokens // per_sample))]


def one_mode(mode: str, tokens: int, layers: int) -> str:
    overrides, fsdp = MODES[mode]
    config = TrainerConfig(lr=1e-6, max_tokens_per_micro_batch=tokens, **overrides)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(Qwen3Config(**{**QWEN3_4B, "num_hidden_layers": layers}))
    params = sum(p.numel() for p in model.parameters())
    trainer = TorchTrainer(model, config, device="cuda", dp=DataParallel(fsdp=fsdp))
    samples = samples_for(tokens)
    advantages = [1.0 if i % 2 else -1.0 for i in range(len(samples))]
    loss = PolicyLossConfig(aggregation="token_mean")
    row = f"{mode:<22} {params / 1e9:5.2f}B {tokens:>6} tok"
    try:
        trainer.train_step(samples, advantages, loss)  # Adam's moments are allocated here
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        trainer.train_step(samples, advantages, loss)
        torch.cuda.synchronize()
        step_s = time.perf_counter() - started
        peak = torch.cuda.max_memory_allocated() / GIB
        started = time.perf_counter()
        trainer.offload()
        offload_s = time.perf_counter() - started
        left = torch.cuda.memory_allocated() / GIB
        started = time.perf_counter()
        trainer.onload()
        torch.cuda.synchronize()
        onload_s = time.perf_counter() - started
        row += (f"  peak {peak:6.1f} GiB  step {step_s:6.2f} s  after offload {left:5.2f} GiB"
                f"  offload {offload_s:5.1f} s  onload {onload_s:5.1f} s")
    except torch.OutOfMemoryError:
        row += f"  OOM (peak before failing {torch.cuda.max_memory_allocated() / GIB:.1f} GiB)"
    del trainer, model
    gc.collect()
    torch.cuda.empty_cache()
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[8192, 16384], help="tokens per micro-batch")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--layers", type=int, default=36, help="decoder layers (36: Qwen3-4B)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    if any(MODES[m][1] for m in args.modes):  # FSDP2 needs a process group, even of one rank (nccl here)
        init_data_parallel(0, 1, "127.0.0.1", 0, fsdp=True)
    total = torch.cuda.get_device_properties(0).total_memory / GIB
    print(f"{torch.cuda.get_device_name(0)}, {total:.0f} GiB, torch {torch.__version__}", flush=True)
    for mode in args.modes:
        for tokens in args.tokens:
            print(one_mode(mode, tokens, args.layers), flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

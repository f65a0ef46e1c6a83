"""Trainer and engine throughput on CPU for the tiny model.

    python benchmarks/trainer_step.py [--samples 8] [--seq-len 256] [--gen-tokens 64] [--steps 3]

Prints train tokens/s (`TorchTrainer.train_step`, GRPO-style policy loss, `samples` x `seq-len`
tokens of which the last half is response) and generation tokens/s (`CPUEngine` /generate, one batch
of `samples` prompts x `gen-tokens` new tokens). When `trl` is importable it also times TRL's
GRPOTrainer on the same model and batch shape (generation + one update per step) and prints the
ratio against ours (generate + train_step); without TRL it says the comparison was skipped. Nothing
is installed by this script (TRL is a benchmark-only dependency).
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import tempfile
import time
from pathlib import Path

import httpx
import torch

from slime.backends.torch_backend import TorchTrainer, TrainerConfig
from slime.engine.cpu_server import CPUEngine
from slime.models.tiny import build_tiny_model
from slime.utils.types import Sample


def make_samples(n: int, seq_len: int, vocab: int, seed: int = 0) -> list[Sample]:
    rng = random.Random(seed)
    response = seq_len // 2
    return [Sample(index=i, tokens=[rng.randrange(10, vocab) for _ in range(seq_len)], response_length=response)
            for i in range(n)]


def bench_train(model_dir: Path, samples: list[Sample], steps: int) -> float:
    trainer = TorchTrainer(str(model_dir), TrainerConfig(lr=1e-5))
    advantages = [1.0 if i % 2 else -1.0 for i in range(len(samples))]
    trainer.train_step(samples, advantages)  # warm-up
    started = time.perf_counter()
    for _ in range(steps):
        trainer.train_step(samples, advantages)
    elapsed = time.perf_counter() - started
    return steps * sum(len(s.tokens) for s in samples) / elapsed


def bench_generate(model_dir: Path, n: int, prompt_len: int, new_tokens: int, steps: int) -> float:
    engine = CPUEngine(str(model_dir), port=0, seed=0)
    engine.start()
    rng = random.Random(1)
    try:
        with httpx.Client(timeout=600, trust_env=False) as http:
            def batch() -> int:
                prompts = [[rng.randrange(10, 4000) for _ in range(prompt_len)] for _ in range(n)]
                reply = http.post(f"{engine.url}/generate", json={
                    "input_ids": prompts, "return_logprob": True,
                    "sampling_params": {"temperature": 1.0, "max_new_tokens": new_tokens, "ignore_eos": True},
                }).json()
                return sum(r["meta_info"]["completion_tokens"] for r in reply)

            batch()  # warm-up
            started = time.perf_counter()
            tokens = sum(batch() for _ in range(steps))
            return tokens / (time.perf_counter() - started)
    finally:
        engine.shutdown()


def bench_trl(model_dir: Path, n: int, prompt_len: int, new_tokens: int, steps: int) -> float:
    """Tokens/s of TRL's GRPOTrainer steps (generation + update) on the same model and batch shape.

    Written against TRL's GRPOTrainer / GRPOConfig API; not run here (TRL is not installed in this
    environment)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rng = random.Random(2)
    prompts = [tokenizer.decode([rng.randrange(10, 4000) for _ in range(prompt_len)]) for _ in range(n)]
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-bench-"), per_device_train_batch_size=n, num_generations=n,
        max_completion_length=new_tokens, max_steps=steps + 1, learning_rate=1e-5, logging_steps=1,
        report_to=[], save_strategy="no", use_cpu=True, bf16=False, temperature=1.0,
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
        reward_funcs=lambda completions, **_: [float(len(c) % 2) for c in completions],
        args=config, train_dataset=Dataset.from_dict({"prompt": [prompts[0]] * (n * (steps + 1))}),
        processing_class=tokenizer,
    )
    times: list[float] = []

    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *args, **kwargs):
            times.append(time.perf_counter())

        def on_step_end(self, *args, **kwargs):
            times[-1] = time.perf_counter() - times[-1]

    trainer.add_callback(StepTimer())
    trainer.train()
    measured = times[1:]  # the first step warms up
    return len(measured) * n * (prompt_len + new_tokens) / sum(measured)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--gen-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="trainer-step-") as tmp:
        model_dir = build_tiny_model(Path(tmp) / "tiny", seed=0)
        samples = make_samples(args.samples, args.seq_len, vocab=4000)
        print(f"tiny Qwen3 on CPU, {torch.get_num_threads()} torch threads")
        train = bench_train(model_dir, samples, args.steps)
        print(f"train:      {train:10.1f} tokens/s  (train_step, {args.samples} x {args.seq_len} tokens, "
              f"mean of {args.steps} steps after 1 warm-up)")
        gen = bench_generate(model_dir, args.samples, args.seq_len // 2, args.gen_tokens, args.steps)
        print(f"generation: {gen:10.1f} tokens/s  (CPUEngine /generate, {args.samples} x {args.gen_tokens} new "
              f"tokens, mean of {args.steps} batches after 1 warm-up)")
        if importlib.util.find_spec("trl") is None:
            print("TRL comparison skipped: trl is not installed (benchmark-only dependency; nothing is "
                  "installed by this script)")
            return
        ours_step_s = (args.samples * args.gen_tokens / gen
                       + args.samples * (args.seq_len // 2 + args.gen_tokens) / train)
        ours = args.samples * (args.seq_len // 2 + args.gen_tokens) / ours_step_s
        trl = bench_trl(model_dir, args.samples, args.seq_len // 2, args.gen_tokens, args.steps)
        print(f"TRL GRPOTrainer: {trl:10.1f} tokens/s (generate + update); ours {ours:10.1f} tokens/s; "
              f"ratio ours / TRL = {ours / trl:.2f}")


if __name__ == "__main__":
    main()

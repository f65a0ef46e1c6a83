"""One GRPO step on CPU for the tiny model: ours (CPUEngine + TorchTrainer) against TRL's GRPOTrainer.

    python benchmarks/trainer_step.py [--samples 8] [--prompt-tokens 128] [--gen-tokens 64] [--steps 5]

A step is what TRL's GRPOTrainer does per optimizer step with its defaults (beta=0, one iteration,
no reference model): sample `samples` completions of one prompt, score them, one policy update. Ours:
/generate over HTTP -> `Sample`s -> GRPO advantages -> `TorchTrainer.train_step` -> weight sync to
the engine (`DiskWeightSync`, so the next step samples from the new policy, which TRL gets for free
by generating with the training model; `--no-sync` leaves it out). Both sides read the same prompt
ids (chosen so that TRL's text round-trips to them), generate exactly `gen-tokens` (ours ignore_eos,
TRL min_new_tokens) and use fp32 and the same torch threads; tokens/s counts the prompt and
completion tokens each step actually processed (TRL's from its `num_input_tokens_seen`) over the
median step time after one warm-up step. With `trl` importable (a benchmark-only dependency,
benchmarks/requirements-trl.txt; nothing is installed here) the steps interleave, TRL's step i then
ours, so that on a shared machine both meet about the same load; it prints ours per phase, TRL and
the ratio.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import random
import re
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import torch

from slime.backends.torch_backend import TorchTrainer, TrainerConfig
from slime.engine.cpu_server import CPUEngine
from slime.models.tiny import build_tiny_model
from slime.utils.types import Sample
from slime.weight_sync import DiskWeightSync

LR = 1e-5
TRL_GEN = {"min_new_tokens": 64}


def round_trip_prompt(tokenizer: Any, length: int, rng: random.Random) -> list[int]:
    """`length` ids whose decoded text tokenizes back to the same ids: TRL takes text, ours ids.

    Random ids do not round-trip (byte-level BPE re-merges across token boundaries); a run of
    whole-word tokens (" word", each its own encoding) does, and is checked."""
    words = [t for t in range(len(tokenizer)) if re.fullmatch(r" [A-Za-z]+", tokenizer.decode([t]))
             and tokenizer(tokenizer.decode([t]))["input_ids"] == [t]]
    ids = [rng.choice(words) for _ in range(length)]
    if tokenizer(tokenizer.decode(ids))["input_ids"] != ids:
        raise RuntimeError(f"the {length}-token prompt does not round-trip through the tokenizer")
    return ids


def rewards_of(n: int) -> list[float]:
    """The same rewards on both sides: alternating 0/1, so no group has zero spread (no skipped sample)."""
    return [float(i % 2) for i in range(n)]


def group_advantages(rewards: list[float]) -> list[float]:
    """GRPO's group-scaled advantage, TRL's default: A_i = (r_i - mean(r)) / (std(r) + 1e-4)."""
    r = torch.tensor(rewards)
    return ((r - r.mean()) / (r.std() + 1e-4)).tolist()


class Ours:
    """Our GRPO step: an in-process CPUEngine over HTTP, a TorchTrainer and the disk weight sync."""

    def __init__(self, model_dir: Path, n: int, gen_tokens: int, sync: bool):
        self.n, self.gen_tokens, self.sync = n, gen_tokens, sync
        self.engine = CPUEngine(str(model_dir), port=0, seed=0)
        self.engine.start()
        self.trainer = TorchTrainer(str(model_dir), TrainerConfig(lr=LR))
        self.weights = DiskWeightSync(tempfile.mkdtemp(prefix="trainer-step-weights-"))
        self.http = httpx.Client(timeout=600, trust_env=False)
        self.version = 0

    def step(self, prompt: list[int]) -> dict:
        """One step; returns its wall time, the tokens it processed and the time of each phase."""
        t0 = time.perf_counter()
        reply = self.http.post(f"{self.engine.url}/generate", json={
            "input_ids": [prompt] * self.n, "return_logprob": True,
            "sampling_params": {"temperature": 1.0, "max_new_tokens": self.gen_tokens, "ignore_eos": True},
        }).json()
        t1 = time.perf_counter()
        samples = [
            Sample(index=i, tokens=prompt + r["output_ids"], response_length=len(r["output_ids"]),
                   rollout_log_probs=[lp for lp, _, _ in r["meta_info"]["output_token_logprobs"]])
            for i, r in enumerate(reply)
        ]
        advantages = group_advantages(rewards_of(self.n))
        t2 = time.perf_counter()
        self.trainer.train_step(samples, advantages)
        t3 = time.perf_counter()
        if self.sync:
            self.version += 1
            self.weights.sync(self.trainer, [self.engine], version=self.version)
        t4 = time.perf_counter()
        return {"time": t4 - t0, "tokens": sum(len(s.tokens) for s in samples),
                "generate": t1 - t0, "samples": t2 - t1, "train_step": t3 - t2, "sync": t4 - t3}

    def close(self) -> None:
        self.http.close()
        self.engine.shutdown()


def bench_trl(
    model_dir: Path, prompts: list[list[int]], n: int, gen_tokens: int, after_step: Callable[[int], None]
) -> list[dict]:
    """Per TRL GRPOTrainer step (generation + scoring + update): wall time and tokens processed.

    `after_step(i)` runs after step i is timed: ours runs its step i there, so that on a shared
    machine each pair of steps meets about the same load."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-bench-"), per_device_train_batch_size=n, num_generations=n,
        max_completion_length=gen_tokens, generation_kwargs=TRL_GEN,
        max_steps=len(prompts), learning_rate=LR, logging_steps=1, report_to=[], save_strategy="no",
        use_cpu=True, bf16=False, temperature=1.0, shuffle_dataset=False, disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
        reward_funcs=lambda completions, **_: rewards_of(len(completions)),
        args=config, train_dataset=Dataset.from_dict({"prompt": [tokenizer.decode(p) for p in prompts]}),
        processing_class=tokenizer,
    )
    steps: list[dict] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            steps.append({"time": time.perf_counter(), "tokens": state.num_input_tokens_seen})

        def on_step_end(self, args, state, control, **kwargs):
            steps[-1] = {"time": time.perf_counter() - steps[-1]["time"],
                         "tokens": state.num_input_tokens_seen - steps[-1]["tokens"]}
            after_step(len(steps) - 1)

    trainer.add_callback(StepTimer())
    trainer.train()
    return steps


def summarise(steps: list[dict]) -> tuple[float, float, int]:
    """(tokens/s, median step seconds, tokens per step) over the steps after the first (warm-up)."""
    measured = steps[1:]
    tokens = {s["tokens"] for s in measured}
    if len(tokens) != 1:
        raise RuntimeError(f"steps processed different token counts {sorted(tokens)}: the workload is not fixed")
    median = statistics.median(s["time"] for s in measured)
    return tokens.pop() / median, median, measured[0]["tokens"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=8, help="completions per step (one GRPO group)")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--gen-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5, help="measured steps, after one warm-up step")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--no-sync", action="store_true", help="leave our weight sync out of the step")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="trainer-step-") as tmp:
        model_dir = build_tiny_model(Path(tmp) / "tiny", seed=0)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        rng = random.Random(2)
        prompts = [round_trip_prompt(tokenizer, args.prompt_tokens, rng) for _ in range(args.steps + 1)]
        print(f"tiny Qwen3 on CPU, fp32, {torch.get_num_threads()} torch threads; a step: {args.samples} x "
              f"({args.prompt_tokens} prompt + {args.gen_tokens} generated) tokens, median of {args.steps} "
              "steps after 1 warm-up")
        ours = Ours(model_dir, args.samples, args.gen_tokens, sync=not args.no_sync)
        ours_steps: list[dict] = []
        try:
            if importlib.util.find_spec("trl") is None:
                ours_steps = [ours.step(prompt) for prompt in prompts]
                trl_steps = None
            else:  # interleaved: TRL step i, then our step i
                def our_step(i: int) -> None:
                    gc.collect()  # neither side's garbage is collected inside the other's timed step
                    ours_steps.append(ours.step(prompts[i]))
                    gc.collect()

                trl_steps = bench_trl(model_dir, prompts, args.samples, args.gen_tokens, after_step=our_step)
        finally:
            ours.close()
        rate, step_s, tokens = summarise(ours_steps)
        phases = ["generate", "samples", "train_step", "sync"]
        split = ", ".join(f"{p} {statistics.median(s[p] for s in ours_steps[1:]) * 1e3:.0f} ms" for p in phases)
        print(f"ours: {rate:10.1f} tokens/s  ({tokens} tokens in {step_s * 1e3:.0f} ms: {split})")
        if trl_steps is None:
            print("TRL comparison skipped: trl is not installed (benchmark-only dependency; nothing is "
                  "installed by this script)")
            return
        trl, trl_s, trl_tokens = summarise(trl_steps)
        print(f"TRL:  {trl:10.1f} tokens/s  ({trl_tokens} tokens in {trl_s * 1e3:.0f} ms: GRPOTrainer step)")
        if trl_tokens != tokens:
            raise RuntimeError(f"TRL processed {trl_tokens} tokens per step, ours {tokens}: not the same workload")
        print(f"ratio ours / TRL = {rate / trl:.2f}")

if __name__ == "__main__":
    main()

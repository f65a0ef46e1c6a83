"""One train rank for tests/slime/test_data_parallel.py (run as a script, one process per rank).

    python dp_worker.py MODEL_DIR OUT RANK WORLD PORT BACKEND [--save DIR] [--load DIR] [--serving-dtype D]

Trains a fixed rollout with the policy loss (2 optimizer steps, per-token advantages on one sample,
two samples with zero advantage),
then a second rollout with the SFT loss, through `TrainWorker` (sharding, old log-probs, steps);
rank 0 writes the final full weights and both steps' metrics to OUT (torch.save). --save writes a
checkpoint after the first rollout (its model/ in --serving-dtype, as for SGLang engines serving
it); --load starts from a checkpoint and trains the second only.
"""

from __future__ import annotations

import argparse
import os
import random
import sys

import torch

from slime.arguments import parse_args
from slime.backends import state_dicts
from slime.backends.train_worker import TrainWorker
from slime.utils.types import Sample

VOCAB = 512


def samples(n: int, seed: int) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt, response = rng.randrange(2, 9), rng.randrange(1, 9)
        tokens = [rng.randrange(1, VOCAB) for _ in range(prompt + response)]
        mask = [int(rng.random() > 0.2) for _ in range(response)]
        out.append(Sample(index=i, tokens=tokens, response_length=response, loss_mask=mask,
                          rollout_log_probs=[-1.0] * response))
    return out


def advantages(batch: list[Sample]) -> list[float | list[float]]:
    adv: list[float | list[float]] = [(-1.0) ** i * (0.5 + 0.1 * i) for i in range(len(batch))]
    adv[1] = [0.2 * j - 0.3 for j in range(batch[1].response_length)]  # per-token advantages
    if len(batch) > 5:  # zero-advantage samples are left out of the step: a rank may train nothing in it
        adv[4] = adv[5] = 0.0
    return adv


def run(model_dir: str, out: str, rank: int, world: int, port: int, backend: str, *,
        save: str | None = None, load: str | None = None, serving_dtype: str | None = None) -> None:
    args = parse_args([
        "--hf-checkpoint", model_dir, "--prompt-data", "unused.jsonl", "--rollout-batch-size", "1",
        "--num-rollout", "2", "--actor-num-gpus-per-node", str(world), "--train-backend", backend,
        "--lr", "1e-2", "--adam-eps", "1e-3", "--num-steps-per-rollout", "2", "--max-tokens-per-gpu", "40",
        "--distributed-timeout-minutes", "1",
    ])
    if serving_dtype is not None:  # what `slime.arguments.serving_dtype` reads: SGLang engines serving it
        args.engine_type, args.sglang_dtype = "sglang", serving_dtype
    worker = TrainWorker(args, rank=rank, world=world, master_port=port)
    metrics = []
    if load:
        worker.load(load)
    else:
        metrics.append(worker.train(samples(7, 1), advantages(samples(7, 1))))
        if save:
            worker.save(save, 1, {"next_rollout_id": 1})
    args.loss_type = "sft_loss"
    metrics.append(worker.train(samples(5, 2), None))
    weights = state_dicts.full_model_state(worker.trainer.runner)
    if rank == 0:
        torch.save({"weights": weights, "metrics": metrics, "step": worker.trainer.step}, out)
    worker.close()


def main() -> None:
    opts = argparse.ArgumentParser()
    for name in ("model_dir", "out"):
        opts.add_argument(name)
    for name in ("rank", "world", "port"):
        opts.add_argument(name, type=int)
    opts.add_argument("backend")
    opts.add_argument("--save")
    opts.add_argument("--load")
    opts.add_argument("--serving-dtype")
    o = opts.parse_args()
    torch.set_num_threads(1)
    run(o.model_dir, o.out, o.rank, o.world, o.port, o.backend, save=o.save, load=o.load,
        serving_dtype=o.serving_dtype)
    # Everything is written and the process group is destroyed; exit without interpreter finalization.
    # About once in 30 FSDP runs a rank aborted there, after destroy_process_group had returned
    # ("terminate called without an active exception", SIGABRT, no Python frame on the stack): a C++
    # object of torch's distributed stack torn down with its thread still running.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

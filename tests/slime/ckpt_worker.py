"""One train rank that saves twice, for tests/slime/test_checkpoint_disk.py (one process per rank).

    python ckpt_worker.py MODEL_DIR SAVE_DIR OUT RANK WORLD PORT BACKEND [--fsize-limit BYTES] [--serving-dtype D]

Trains a step and saves iteration 1; then trains another step and saves iteration 2, with
--fsize-limit under a cap on the size of any file this process writes (RLIMIT_FSIZE, SIGXFSZ ignored
so that a write past it fails with EFBIG, as a full disk fails with ENOSPC). Stops at the first
failed save. Writes OUT.<rank>.json: {iteration: {"error": message or null, "kind": class}}, and
rank 0 also OUT (torch.save): the weights saved at iteration 1, to compare with what loads back.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import sys

import torch
from dp_worker import advantages, samples

from slime.arguments import parse_args
from slime.backends import state_dicts
from slime.backends.train_worker import TrainWorker


def main() -> None:
    opts = argparse.ArgumentParser()
    for name in ("model_dir", "save_dir", "out"):
        opts.add_argument(name)
    for name in ("rank", "world", "port"):
        opts.add_argument(name, type=int)
    opts.add_argument("backend")
    opts.add_argument("--fsize-limit", type=int)
    opts.add_argument("--serving-dtype")
    o = opts.parse_args()
    torch.set_num_threads(1)
    args = parse_args([
        "--hf-checkpoint", o.model_dir, "--prompt-data", "unused.jsonl", "--rollout-batch-size", "1",
        "--num-rollout", "2", "--actor-num-gpus-per-node", str(o.world), "--train-backend", o.backend,
        "--lr", "1e-2", "--max-tokens-per-gpu", "40", "--distributed-timeout-minutes", "1",
        "--keep-checkpoints", "2",
    ])
    if o.serving_dtype:
        args.engine_type, args.sglang_dtype = "sglang", o.serving_dtype
    worker = TrainWorker(args, rank=o.rank, world=o.world, master_port=o.port)
    batch = samples(6, 1)
    report: dict[str, object] = {}
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    for iteration in (1, 2):
        worker.train(batch, advantages(batch))
        if iteration == 2 and o.fsize_limit is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (o.fsize_limit, hard))
        try:
            worker.save(o.save_dir, iteration, {"next_rollout_id": iteration + 1})
        except OSError as exc:
            report[str(iteration)] = {"error": str(exc), "kind": type(exc).__name__}
            break
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
        report[str(iteration)] = {"error": None}
        weights = state_dicts.full_model_state(worker.trainer.runner)
        if o.rank == 0 and iteration == 1:
            torch.save(weights, o.out)
    with open(f"{o.out}.{o.rank}.json", "w") as f:
        json.dump(report, f)
    worker.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # see dp_worker.py: no interpreter finalization after the group is gone


if __name__ == "__main__":
    main()

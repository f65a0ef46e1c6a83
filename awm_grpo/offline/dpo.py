"""DPO on trajectory pairs the verifier labels: a success and a failure of the same task.

    python -m awm_grpo.offline.dpo --model WS --prompts SPLITS/train.jsonl --out OUT [--samples 8 --beta 0.1]

1. explore: the starting policy plays `--samples` episodes of every task through the training rollout
   (awm_grpo.offline.explore: the CPU engine serves the checkpoint, token-in/token-out, the runtime YAML
   of a CPU GRPO run, temperature 1.0); infrastructure failures are dropped and counted;
2. pair (`pair_trajectories`): within each task, every (success, failure) combination, where a success
   is a verdict of `complete` and a failure any other verdict; a task with more than
   `--pairs-per-task` combinations gets that many, drawn without replacement with the seed. A task
   with no success or no failure gives no pair and is counted (`unpaired`). Each pair is used once an
   epoch, in a seeded order;
3. reference: the frozen starting model's log-probs of every paired trajectory, computed once before
   training;
4. train with the DPO loss (Rafailov et al. 2023) over whole trajectories:

       logp(y)  = sum_t m_t log pi(y_t | y_<t)              m_t = loss mask: 1 on the model's tokens,
                                                            0 on the prompt and tool observations
       margin   = beta * ((logp_pi(y_w) - logp_ref(y_w)) - (logp_pi(y_l) - logp_ref(y_l)))
       loss     = -log sigmoid(margin)                       mean over a batch of pairs

   Reported per epoch: the mean loss, the mean margin (the "reward margin") and the accuracy (the
   fraction of pairs with margin > 0), all as measured during the epoch's updates;
5. save OUT/model (HF folder, the starting tokenizer files), OUT/dpo.json, OUT/awm_runtime.yaml
   (`python -m awm_grpo.eval --model OUT/model --config OUT/awm_runtime.yaml` plays as GRPO's eval).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from awm_grpo.offline.explore import (
    Trajectory,
    common_flags,
    explore,
    load_model,
    save_model,
    setup,
)
from slime.utils.types import Sample

DEFAULT_LR = 1e-4


def pair_trajectories(trajectories: Sequence[Trajectory], pairs_per_task: int, seed: int
                      ) -> tuple[list[tuple[int, int]], dict[str, Any]]:
    """(chosen index, rejected index) pairs into `trajectories` and the counts (module docstring, step 2).

    Tasks are taken in first-appearance order and combinations in play order, so the pairs depend on
    the seed and the trajectories only."""
    if pairs_per_task < 1:
        raise ValueError(f"pairs_per_task {pairs_per_task}: use >= 1")
    rng = random.Random(seed)
    by_task: dict[tuple[str, int], list[int]] = {}
    for i, t in enumerate(trajectories):
        by_task.setdefault(t.task, []).append(i)
    pairs: list[tuple[int, int]] = []
    no_success, no_failure, paired = [], [], 0
    for task, idx in by_task.items():
        wins = [i for i in idx if trajectories[i].success]
        losses = [i for i in idx if not trajectories[i].success]
        if not wins:
            no_success.append(f"{task[0]}#{task[1]}")
            continue
        if not losses:
            no_failure.append(f"{task[0]}#{task[1]}")
            continue
        combos = [(w, lo) for w in wins for lo in losses]
        if len(combos) > pairs_per_task:
            combos = sorted(rng.sample(combos, pairs_per_task))
        pairs += combos
        paired += 1
    counts = {"tasks": len(by_task), "paired_tasks": paired, "pairs": len(pairs),
              "unpaired": {"no_success": len(no_success), "no_failure": len(no_failure)},
              "no_success_tasks": no_success, "no_failure_tasks": no_failure}
    return pairs, counts


def sequence_logps(model: torch.nn.Module, samples: Sequence[Sample]) -> torch.Tensor:
    """logp(y) of each sample: the sum of log pi(token | prefix) over its loss-mask-1 tokens (the model's
    own), one forward pass over the batch (right-padded, padding out of attention and sum)."""
    width = max(len(s.tokens) for s in samples)
    ids = torch.zeros(len(samples), width, dtype=torch.long)
    attention = torch.zeros(len(samples), width, dtype=torch.long)
    mask = torch.zeros(len(samples), width)
    for row, s in enumerate(samples):
        n, prompt_len = len(s.tokens), len(s.tokens) - s.response_length
        if len(s.loss_mask) != s.response_length:
            raise ValueError(f"sample {s.index}: {len(s.loss_mask)} loss-mask entries for {s.response_length} "
                             "response tokens")
        ids[row, :n] = torch.tensor(s.tokens)
        attention[row, :n] = 1
        mask[row, prompt_len:n] = torch.tensor(s.loss_mask, dtype=torch.float32)
    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
    token_logps = torch.gather(F.log_softmax(logits, dim=-1), 2, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return (token_logps * mask[:, 1:]).sum(dim=1)


def dpo_loss(pi_chosen: torch.Tensor, pi_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-pair loss, per-pair margin): margin = beta * ((pi_w - ref_w) - (pi_l - ref_l)),
    loss = -log sigmoid(margin)."""
    margin = beta * ((pi_chosen - ref_chosen) - (pi_rejected - ref_rejected))
    return -F.logsigmoid(margin), margin


@torch.no_grad()
def reference_logps(model: torch.nn.Module, trajectories: Sequence[Trajectory], needed: set[int]) -> dict[int, float]:
    """logp_ref of every needed trajectory under the frozen model, one at a time."""
    was_training = model.training
    model.eval()
    out = {i: float(sequence_logps(model, [trajectories[i].sample])[0])
           for i in tqdm(sorted(needed), desc="reference log-probs", file=sys.stderr)}
    model.train(was_training)
    return out


def train(model: torch.nn.Module, trajectories: Sequence[Trajectory], pairs: list[tuple[int, int]],
          ref: dict[int, float], *, beta: float, epochs: int, lr: float, seed: int, batch_pairs: int = 1
          ) -> list[dict[str, float]]:
    """DPO updates over the pairs, `batch_pairs` pairs a step, every pair once an epoch in a seeded order;
    AdamW, gradient norm clipped to 1. Returns each epoch's mean loss, margin and accuracy."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    history = []
    bar = tqdm(range(epochs), desc="dpo epochs", file=sys.stderr)
    for epoch in bar:
        order = list(pairs)
        rng.shuffle(order)
        losses, margins = [], []
        for start in range(0, len(order), batch_pairs):
            batch = order[start:start + batch_pairs]
            samples = [trajectories[i].sample for pair in batch for i in pair]  # w0, l0, w1, l1, ...
            logps = sequence_logps(model, samples)
            ref_w = torch.tensor([ref[w] for w, _ in batch])
            ref_l = torch.tensor([ref[lo] for _, lo in batch])
            loss, margin = dpo_loss(logps[0::2], logps[1::2], ref_w, ref_l, beta)
            optimizer.zero_grad()
            loss.mean().backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses += loss.detach().tolist()
            margins += margin.detach().tolist()
        n = max(len(losses), 1)
        history.append({"epoch": epoch + 1, "loss": sum(losses) / n, "margin": sum(margins) / n,
                        "accuracy": sum(m > 0 for m in margins) / n, "pairs": len(losses)})
        bar.set_postfix(loss=f"{history[-1]['loss']:.3f}", acc=f"{history[-1]['accuracy']:.2f}")
    return history


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m awm_grpo.offline.dpo", description=__doc__.split("\n\n")[0])
    common_flags(parser, DEFAULT_LR)
    parser.add_argument("--samples", type=int, default=8, help="episodes per task played by the starting policy")
    parser.add_argument("--pairs-per-task", type=int, default=4, help="at most this many (success, failure) pairs "
                        "per task, drawn with the seed")
    parser.add_argument("--beta", type=float, default=0.1, help="DPO's beta")
    parser.add_argument("--epochs", type=int, default=2, help="passes over the pairs")
    parser.add_argument("--batch-pairs", type=int, default=1, help="pairs per update")
    opts = parser.parse_args(argv)
    if opts.lr <= 0:
        raise SystemExit(f"--lr {opts.lr}: use > 0")
    for name in ("samples", "pairs_per_task", "epochs", "batch_pairs"):
        if getattr(opts, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} {getattr(opts, name)}: use >= 1")
    if opts.beta <= 0:
        raise SystemExit(f"--beta {opts.beta}: use > 0")
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    started = time.perf_counter()
    out, records, keys = setup(opts)
    found = explore(opts.model, opts.prompts, records, samples=opts.samples, temperature=opts.temperature,
                    seed=opts.seed, config=keys, max_response_len=opts.max_response_len,
                    concurrency=opts.concurrency, desc="explore (starting policy)")
    trajectories = found.trajectories
    pairs, counts = pair_trajectories(trajectories, opts.pairs_per_task, opts.seed)
    print(f"[dpo] {found.played} episodes, {found.successes} successes; {counts['pairs']} pairs from "
          f"{counts['paired_tasks']} of {counts['tasks']} tasks ({counts['unpaired']['no_success']} without a "
          f"success, {counts['unpaired']['no_failure']} without a failure)", file=sys.stderr)
    if not pairs:
        raise SystemExit(f"no (success, failure) pair: {found.successes} successes in {len(trajectories)} scored "
                         "episodes, and no task had both. Start from a policy that solves some tasks sometimes (a "
                         "warm start: python -m awm_grpo.warmstart), play more episodes per task (--samples), or "
                         "explore at a higher --temperature")
    model = load_model(opts.model)
    needed = {i for pair in pairs for i in pair}
    ref_started = time.perf_counter()
    ref = reference_logps(model, trajectories, needed)
    ref_s = time.perf_counter() - ref_started
    gap = [abs(sum(trajectories[i].sample.rollout_log_probs or []) - ref[i]) for i in needed]
    train_started = time.perf_counter()
    history = train(model, trajectories, pairs, ref, beta=opts.beta, epochs=opts.epochs, lr=opts.lr,
                    seed=opts.seed, batch_pairs=opts.batch_pairs)
    train_s = time.perf_counter() - train_started
    save_model(model, opts.model, out / "model")
    result = {
        "method": "dpo", "model": str(opts.model), "prompts": str(opts.prompts), "seed": opts.seed,
        "hyper": {k: getattr(opts, k) for k in ("samples", "pairs_per_task", "beta", "epochs", "batch_pairs", "lr",
                                                 "temperature", "max_response_len", "limit", "tasks", "threads")},
        "exploration": found.summary(), "episodes_played": found.played, "pairs": counts,
        "pair_list": [[trajectories[w].sample.index, trajectories[lo].sample.index] for w, lo in pairs],
        "epochs": history,
        "engine_vs_trainer_logp_gap": {"mean": sum(gap) / len(gap), "max": max(gap)},
        "wall_s": {"explore": round(found.wall_s, 1), "reference": round(ref_s, 1), "train": round(train_s, 1),
                   "total": round(time.perf_counter() - started, 1)},
        "infra_failures": found.infra_failures,
        "trajectories": [t.record() for t in trajectories],
    }
    (out / "dpo.json").write_text(json.dumps(result, indent=1))
    last = history[-1]
    print(f"[dpo] saved {out / 'model'}: epoch {last['epoch']} loss {last['loss']:.4f} margin {last['margin']:.4f} "
          f"accuracy {last['accuracy']:.2f}; evaluate with python -m awm_grpo.eval --model {out / 'model'} "
          f"--config {out / 'awm_runtime.yaml'} --split SPLITS/test.jsonl", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

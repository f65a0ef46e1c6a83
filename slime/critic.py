"""The PPO critic (`--advantage-estimator ppo`): a value head on the policy's HF architecture.

V(s_t) = w . h_{P+t-1} + b, where h is the decoder's last hidden state at the position that
predicts response token t (the state the token was generated from; the same alignment as the
log-probs, slime/backends/batching.py). The head starts at zero, so the first values are 0.
Trained with PPO's clipped value loss (slime/algorithms/losses.py `value_loss`), token mean over
the step's loss-mask tokens:
    V_c = V_old + clip(V - V_old, -value_clip, value_clip);  loss = mean_t max((V_c - R)^2, (V - R)^2).

Weights come from `--critic-load` (default `--hf-checkpoint`), learning rate `--critic-lr` (default
`--lr`). State (decoder + head + AdamW + step) is saved as `{save}/critic/iter_XXXXXXX.pt` before the
policy checkpoint of the same step, and restored from `{load}/critic/` on resume.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from slime.algorithms.aggregation import masked_mean
from slime.algorithms.losses import value_loss
from slime.backends.batching import pack_micro_batch, plan_micro_batches
from slime.utils.types import Sample


class ValueModel(torch.nn.Module):
    """An HF causal LM's decoder with a scalar head in place of the LM head."""

    def __init__(self, model_path: str):
        super().__init__()
        from transformers import AutoModelForCausalLM

        lm = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        self.decoder = lm.get_decoder()
        self.head = torch.nn.Linear(lm.config.hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, mb: Any) -> torch.Tensor:
        """Values of a `MicroBatch`'s response tokens, [B, R] (0 on padding)."""
        mask = mb.response_mask
        out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
        if not bool(mask.any()):
            return out
        hidden = self.decoder(input_ids=mb.input_ids, attention_mask=mb.attention_mask,
                              position_ids=mb.position_ids, use_cache=False).last_hidden_state
        rows = torch.arange(mask.shape[0], device=mask.device)[:, None].expand_as(mask)[mask]
        values = self.head(hidden[rows, mb.logit_index[mask]]).squeeze(-1)
        return out.masked_scatter(mask, values.float())


class Critic:
    """Value estimates and value-loss steps on samples; runs in a Ray actor (`CriticActor`) in a run."""

    def __init__(self, model_path: str, *, lr: float, weight_decay: float = 0.0, clip_grad: float = 1.0,
                 value_clip: float | None = 0.2, seed: int = 0, micro_batch_size: int = 8,
                 max_tokens: int | None = None, device: str = "cpu"):
        torch.manual_seed(seed)
        self.device = device
        self.model = ValueModel(model_path).to(device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=weight_decay)
        self.clip_grad, self.value_clip = clip_grad, value_clip
        self.micro_batch_size, self.max_tokens = micro_batch_size, max_tokens
        self.step = 0

    def _plan(self, samples: Sequence[Sample]) -> list[list[int]]:
        return plan_micro_batches([len(s.tokens) for s in samples], self.max_tokens, self.micro_batch_size)

    @torch.no_grad()
    def values(self, samples: Sequence[Sample]) -> list[list[float]]:
        """V for every response token of every sample."""
        self.model.eval()
        out: list[list[float]] = [[] for _ in samples]
        for indices in self._plan(samples):
            mb = pack_micro_batch(samples, indices).to(self.device)
            values = self.model(mb).cpu()
            for row, i in enumerate(indices):
                out[i] = values[row, : samples[i].response_length].tolist()
        return out

    def train(self, samples: Sequence[Sample], returns: Sequence[Sequence[float]],
              old_values: Sequence[Sequence[float]], valid: Sequence[bool] | None = None) -> dict[str, float]:
        """One optimizer step of the clipped value loss; `valid=False` samples are left out."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        keep = list(valid) if valid is not None else [True] * len(samples)
        divisor = float(max(sum(sum(1 for m in (s.loss_mask or [1] * s.response_length) if m) * k
                                for s, k in zip(samples, keep, strict=True)), 1))
        loss_sum, clipped, tokens, values_sum = 0.0, 0.0, 0, 0.0
        for indices in self._plan(samples):
            mb = pack_micro_batch(samples, indices).to(self.device)
            mask = mb.loss_mask.bool() & torch.tensor([keep[i] for i in indices], device=self.device)[:, None]
            target = mb.pad_response(returns).to(self.device)
            values = self.model(mb)
            loss, metrics = value_loss(values, mb.pad_response(old_values).to(self.device), target, mask,
                                       value_clip=self.value_clip, aggregation="token_mean", divisor=divisor)
            loss.backward()
            n = int(mask.sum())
            loss_sum += float(loss.detach())
            clipped += float(metrics["value_clipfrac"]) * n
            tokens += n
            values_sum += float(masked_mean(values.detach(), mask)) * n
        params = [p for p in self.model.parameters() if p.grad is not None]
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.clip_grad or float("inf")))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return {"critic/value_loss": loss_sum, "critic/value_clipfrac": clipped / max(tokens, 1),
                "critic/grad_norm": grad_norm, "critic/values_mean": values_sum / max(tokens, 1)}

    # ---- checkpoints ---------------------------------------------------------------------------

    @staticmethod
    def path(root: str | os.PathLike, iteration: int) -> Path:
        return Path(root) / "critic" / f"iter_{iteration:07d}.pt"

    def save(self, root: str | os.PathLike, iteration: int) -> str:
        """Write model, optimizer and step atomically (temp file, then rename)."""
        path = self.path(root, iteration)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "step": self.step}, tmp)
        tmp.replace(path)
        return str(path)

    def load(self, root: str | os.PathLike, iteration: int) -> str:
        path = self.path(root, iteration)
        if not path.is_file():
            raise FileNotFoundError(f"no critic state {path}: the checkpoint of step {iteration} was not saved "
                                    "by a --advantage-estimator ppo run")
        state = torch.load(path, weights_only=True)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])
        return str(path)


def create_critic_actor(args: argparse.Namespace) -> Any:
    """The critic as a Ray actor (1 CPU here; 1 GPU where the cluster has GPUs: untested)."""
    import ray

    use_gpu = ray.cluster_resources().get("GPU", 0) > 0
    actor_cls = ray.remote(Critic)
    resources = {"num_gpus": 1, "num_cpus": 0} if use_gpu else {"num_cpus": 1}
    return actor_cls.options(**resources, max_restarts=0).remote(
        args.critic_load or args.hf_checkpoint, lr=args.critic_lr if args.critic_lr is not None else args.lr,
        weight_decay=args.weight_decay, clip_grad=args.clip_grad, value_clip=args.value_clip, seed=args.seed,
        micro_batch_size=args.micro_batch_size or 8, max_tokens=args.max_tokens_per_gpu,
        device="cuda" if use_gpu else "cpu",
    )

"""The `torch` training backend: log-probs, policy-gradient steps and checkpoints for any HF causal LM.

Single process. The seams for data parallelism are `_global_divisor` (all-reduce the loss divisor
across ranks) and the gradient/optimizer step (FSDP2 would wrap `model` and shard `optimizer`);
neither is implemented here.

Log-probs are computed on logits / temperature in fp32, only at the positions that score response
tokens (see `slime.backends.batching` for the alignment), and the LM head runs over those positions
in chunks so a [tokens, vocab] fp32 block of at most `logits_chunk_tokens` rows exists at a time.
"""

from __future__ import annotations

import math
import numbers
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from slime.algorithms.losses import PolicyLossConfig, entropy_from_logits, policy_loss
from slime.backends import checkpoint as ckpt
from slime.backends.batching import MicroBatch, pack_micro_batch, plan_micro_batches, scatter_back
from slime.utils.types import Sample

# Policy metrics that are already shares of the whole-batch loss (global divisor): summed over
# micro-batches. Every other metric is a token mean of its micro-batch: averaged weighted by tokens.
_SUMMED_METRICS = ("pg_loss", "kl_loss")


@dataclass(frozen=True)
class TrainerConfig:
    """Optimizer and batching settings; names follow slime's flags (--lr, --clip-grad, --max-tokens-per-gpu)."""

    lr: float = 1e-6
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    clip_grad: float | None = 1.0  # None or 0: measure the grad norm, do not clip
    lr_warmup_steps: int = 0  # linear warmup from lr / warmup to lr, then constant
    max_tokens_per_micro_batch: int | None = 16384  # padded tokens (samples x longest); None: no limit
    max_samples_per_micro_batch: int | None = None
    gradient_checkpointing: bool = False  # recompute layers and LM-head chunks in backward
    logits_chunk_tokens: int = 4096


def response_log_probs(
    model: torch.nn.Module,
    mb: MicroBatch,
    temperature: float = 1.0,
    *,
    chunk_tokens: int = 4096,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    recompute: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Log-prob of every response token, [B, R] fp32 (0 on padding), and optionally its entropy.

    lp_{i,j} = log_softmax(z_{i, P_i + j - 1})[t_{i, P_i + j}],  z = head(h) / T (tanh-softcapped
    first when the config asks, as Gemma-2 does). The decoder runs once; the LM head only on the
    N response positions, `chunk_tokens` at a time (recomputed in backward when `recompute`).
    """
    if temperature <= 0:
        raise ValueError(
            f"temperature must be > 0 (slime requires --rollout-temperature > 0); got {temperature}"
        )
    mask = mb.response_mask
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    if not bool(mask.any()):
        return out, (out.clone() if with_entropy else None)
    hidden = model.get_decoder()(
        input_ids=mb.input_ids,
        attention_mask=mb.attention_mask,
        position_ids=mb.position_ids,
        use_cache=False,
    ).last_hidden_state
    rows = torch.arange(mask.shape[0], device=mask.device)[:, None].expand_as(mask)[mask]
    selected = hidden[rows, mb.logit_index[mask]]  # [N, H]
    targets = mb.target_ids[mask]
    head = model.get_output_embeddings()
    softcap = getattr(model.config, "final_logit_softcapping", None)

    def token_stats(h: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
        logits = head(h).float()
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        z = logits / temperature
        lp = z.gather(-1, target[:, None]).squeeze(-1) - torch.logsumexp(z, dim=-1)
        if not with_entropy:
            return lp, lp.new_zeros(0)
        return lp, entropy_from_logits(logits if entropy_grad else logits.detach(), temperature=temperature)

    lps, ents = [], []
    for start in range(0, selected.shape[0], chunk_tokens):
        args = (selected[start : start + chunk_tokens], targets[start : start + chunk_tokens])
        if recompute and torch.is_grad_enabled():
            lp, ent = checkpoint(token_stats, *args, use_reentrant=False)
        else:
            lp, ent = token_stats(*args)
        lps.append(lp)
        ents.append(ent)
    log_probs = out.masked_scatter(mask, torch.cat(lps))
    entropy = torch.zeros_like(out).masked_scatter(mask, torch.cat(ents)) if with_entropy else None
    return log_probs, entropy


class TorchTrainer:
    """Policy trainer over a HF causal LM: log-probs, PPO-family steps, checkpoints, HF export.

    `model` and `ref_model` are modules or HF folders (loaded in fp32). The model stays in train
    mode during `train_step`: use configs with zero dropout (Qwen, Llama) or the ratio starts != 1.
    """

    def __init__(
        self,
        model: torch.nn.Module | str | os.PathLike,
        config: TrainerConfig | None = None,
        *,
        ref_model: torch.nn.Module | str | os.PathLike | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        self.config = config or TrainerConfig()
        self.model = _as_model(model)
        self.device = torch.device(device) if device is not None else next(self.model.parameters()).device
        self.model.to(self.device)
        self.ref_model = None
        if ref_model is not None:
            self.ref_model = _as_model(ref_model).to(self.device).eval().requires_grad_(False)
        if self.config.gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        c = self.config
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=c.lr,
            betas=(c.adam_beta1, c.adam_beta2),
            eps=c.adam_eps,
            weight_decay=c.weight_decay,
        )
        warmup = c.lr_warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0
        )
        self.step = 0  # optimizer steps taken
        self.pad_token_id = 0  # any valid id: padding is masked out of attention and losses

    # ---- log-probs ---------------------------------------------------------------------------

    def plan(self, samples: Sequence[Sample]) -> list[list[int]]:
        """Micro-batches (lists of sample indices) under the configured token budget."""
        lengths = [len(s.tokens) for s in samples]
        return plan_micro_batches(
            lengths, self.config.max_tokens_per_micro_batch, self.config.max_samples_per_micro_batch
        )

    @torch.no_grad()
    def compute_log_probs(
        self, samples: Sequence[Sample], temperature: float = 1.0, *, model: torch.nn.Module | None = None
    ) -> list[list[float]]:
        """Per response token log-probs of each sample under `model` (default: the policy), in order."""
        model = self.model if model is None else model
        was_training = model.training
        model.eval()
        plan = self.plan(samples)
        results = []
        for indices in plan:
            mb = pack_micro_batch(samples, indices, pad_token_id=self.pad_token_id).to(self.device)
            lp, _ = response_log_probs(model, mb, temperature, chunk_tokens=self.config.logits_chunk_tokens)
            results.append([row[:n] for row, n in zip(lp.cpu().tolist(), mb.response_lengths, strict=True)])
        model.train(was_training)
        return scatter_back(plan, results, len(samples))

    def compute_ref_log_probs(self, samples: Sequence[Sample], temperature: float = 1.0) -> list[list[float]]:
        """Per response token log-probs under the reference model (for the KL loss)."""
        if self.ref_model is None:
            raise ValueError("no reference model: pass ref_model= to TorchTrainer to use a KL loss")
        return self.compute_log_probs(samples, temperature, model=self.ref_model)

    # ---- training ----------------------------------------------------------------------------

    def train_step(
        self,
        samples: Sequence[Sample],
        advantages: Sequence[float | Sequence[float]],
        config: PolicyLossConfig | None = None,
        *,
        temperature: float = 1.0,
        old_log_probs: Sequence[Sequence[float]] | None = None,
        ref_log_probs: Sequence[Sequence[float]] | None = None,
        use_rollout_logprobs: bool = False,
        loss_divisor: float | None = None,
    ) -> dict[str, float]:
        """One optimizer step on `samples`, accumulating gradients over micro-batches.

        advantages: per sample, a number (spread over its response tokens) or one value per response
        token. old_log_probs: default recomputed now (or the engine's with `use_rollout_logprobs`).
        ref_log_probs: default from the reference model when `config.kl_loss_coef` is set.
        Each micro-batch's loss uses the divisor of the whole batch, so the summed gradients equal
        the gradient of the whole-batch loss whatever the micro-batching.
        """
        config = config or PolicyLossConfig()
        started = time.perf_counter()
        adv = _token_advantages(samples, advantages)
        if old_log_probs is None:
            if use_rollout_logprobs:
                if any(s.rollout_log_probs is None for s in samples):
                    raise ValueError("use_rollout_logprobs needs rollout_log_probs on every sample")
                old_log_probs = [s.rollout_log_probs for s in samples]
            else:
                old_log_probs = self.compute_log_probs(samples, temperature)
        if config.kl_loss_coef != 0.0 and ref_log_probs is None:
            ref_log_probs = self.compute_ref_log_probs(samples, temperature)
        divisor = self._global_divisor(samples, config, loss_divisor)

        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        plan = self.plan(samples)
        sums: dict[str, float] = {"loss": 0.0}
        weighted: dict[str, float] = {}
        tokens = 0
        for indices in plan:
            mb = pack_micro_batch(samples, indices, advantages=adv, pad_token_id=self.pad_token_id)
            mb = mb.to(self.device)
            lp, entropy = response_log_probs(
                self.model,
                mb,
                temperature,
                chunk_tokens=self.config.logits_chunk_tokens,
                with_entropy=True,
                entropy_grad=config.entropy_coef != 0.0,
                recompute=self.config.gradient_checkpointing,
            )
            loss, metrics = policy_loss(
                lp,
                mb.pad_response(old_log_probs).to(self.device),
                mb.advantages,
                mb.loss_mask,
                config,
                ref_log_probs=None
                if ref_log_probs is None
                else mb.pad_response(ref_log_probs).to(self.device),
                rollout_log_probs=mb.rollout_log_probs,
                entropy=entropy,
                divisor=divisor,
            )
            if loss.requires_grad:
                loss.backward()
            n = int(mb.loss_mask.bool().sum())
            tokens += n
            sums["loss"] += float(loss.detach())
            for key, value in metrics.items():
                if key in _SUMMED_METRICS:
                    sums[key] = sums.get(key, 0.0) + float(value)
                else:
                    weighted[key] = weighted.get(key, 0.0) + float(value) * n

        lr = self.optimizer.param_groups[0]["lr"]
        grad_norm = self._clip_and_step()
        result = dict(sums)
        result.update({key: value / max(tokens, 1) for key, value in weighted.items()})
        result.update(
            grad_norm=grad_norm,
            lr=lr,
            tokens=float(tokens),
            num_micro_batches=float(len(plan)),
            skipped=float(not math.isfinite(grad_norm)),
            step_time_s=time.perf_counter() - started,
        )
        return result

    def _global_divisor(
        self, samples: Sequence[Sample], config: PolicyLossConfig, loss_divisor: float | None
    ) -> float:
        """The aggregation divisor of the whole step (data parallel: all-reduce these counts)."""
        if loss_divisor is not None:
            return float(loss_divisor)
        masks = [s.loss_mask if s.loss_mask is not None else [1] * s.response_length for s in samples]
        if config.aggregation == "token_mean":
            return float(max(sum(1 for m in masks for v in m if v), 1))
        if config.aggregation == "sequence_mean":
            return float(max(sum(1 for m in masks if any(m)), 1))
        raise ValueError(
            f"aggregation {config.aggregation!r} needs loss_divisor= (Dr.GRPO: samples x max response length)"
        )

    def _clip_and_step(self) -> float:
        """Clip gradients, then step unless the norm is inf/nan (the step is skipped, as Megatron does)."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        max_norm = self.config.clip_grad or math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        if math.isfinite(grad_norm):
            self.optimizer.step()
            self.scheduler.step()
            self.step += 1
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    # ---- checkpoints -------------------------------------------------------------------------

    def save_checkpoint(
        self, save_dir: str | os.PathLike, *, iteration: int | None = None, data_state: dict | None = None
    ) -> str:
        """Atomically save weights, optimizer, RNG and `data_state` as `save_dir/iter_<iteration>`.

        iteration defaults to the optimizer step; data_state (JSON) is the caller's data position.
        """
        iteration = self.step if iteration is None else iteration
        state = {"step": self.step, "data_state": data_state or {}}
        path = ckpt.save_checkpoint(
            save_dir,
            iteration,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            state=state,
        )
        return str(path)

    def load_checkpoint(self, path: str | os.PathLike) -> dict[str, Any]:
        """Restore the latest checkpoint under `path` (or that iteration directory) for exact resume.

        Returns {"iteration", "step", "data_state", "path"}.
        """
        payload = ckpt.load_checkpoint(
            path, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler
        )
        self.step = int(payload["state"]["step"])
        return {
            "iteration": payload["iteration"],
            "step": self.step,
            "data_state": payload["state"]["data_state"],
            "path": payload["path"],
        }

    def export_hf(self, out_dir: str | os.PathLike, tokenizer: Any = None) -> str:
        """Write an HF folder (safetensors + config, tokenizer when given) for engines or release."""
        return str(ckpt.export_hf(self.model, out_dir, tokenizer))


def _as_model(model: torch.nn.Module | str | os.PathLike) -> torch.nn.Module:
    if isinstance(model, torch.nn.Module):
        return model
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)


def _token_advantages(
    samples: Sequence[Sample], advantages: Sequence[float | Sequence[float]]
) -> list[list[float]]:
    """One advantage per response token of each sample; a number is spread over the whole response."""
    if len(advantages) != len(samples):
        raise ValueError(
            f"{len(samples)} samples but {len(advantages)} advantages: give one entry per sample"
        )
    out = []
    for sample, value in zip(samples, advantages, strict=True):
        if isinstance(value, numbers.Real) or (isinstance(value, Tensor) and value.dim() == 0):
            out.append([float(value)] * sample.response_length)
        else:
            out.append([float(v) for v in value])
    return out

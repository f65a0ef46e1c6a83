"""The `torch` training backend: log-probs, policy-gradient / SFT steps and checkpoints for any HF causal LM.

One process per data-parallel rank (`slime.backends.distributed`): alone, as N replicas whose
gradients are summed, or sharded with FSDP2 (`dp.fsdp`). Every method that touches the model is
collective under data parallelism: all ranks call it, each with its own shard of the samples.

Log-probs are computed on logits / temperature in fp32, only at the positions that score response
tokens (`slime.backends.log_probs`), the LM head in chunks of `logits_chunk_tokens` rows.
"""

from __future__ import annotations

import math
import numbers
import os
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from slime.algorithms.losses import PolicyLossConfig, policy_loss
from slime.backends import checkpoint as ckpt
from slime.backends import lora as lora_mod
from slime.backends import state_dicts
from slime.backends.batching import MicroBatch, pack_micro_batch, plan_micro_batches, scatter_back
from slime.backends.distributed import (
    DataParallel,
    all_reduce_gradients,
    apply_fsdp,
    decoder_layers,
    total_norm,
)
from slime.backends.log_probs import LogProbForward, response_log_probs
from slime.backends.sft import LOSS_TYPES, sft_loss
from slime.utils.types import Sample

__all__ = ["TorchTrainer", "TrainerConfig", "response_log_probs"]

# Metrics that are already shares of the whole-batch loss (global divisor): summed over micro-batches
# and ranks. Every other metric is a token mean of its micro-batch: averaged weighted by tokens.
_SUMMED_METRICS = ("pg_loss", "kl_loss", "sft_loss")


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
    recompute_logits: bool = False  # recompute only the LM-head chunks in backward
    logits_chunk_tokens: int = 4096
    fsdp_param_dtype: str | None = None  # FSDP2 compute dtype, e.g. "bfloat16"; weights stay fp32
    # Leave samples with zero advantage on every trained token out of the forward/backward when the loss
    # has no entropy or KL term: their per-token loss is -rho * 0 = 0, so the gradient is unchanged (the
    # divisor still counts them). GRPO groups whose rewards all agree are such samples.
    skip_zero_advantage: bool = True


class TorchTrainer:
    """Policy trainer over a HF causal LM: log-probs, PPO-family and SFT steps, checkpoints, HF export.

    `model` and `ref_model` are modules or HF folders (loaded in fp32). The model stays in train
    mode during `train_step`: use configs with zero dropout (Qwen, Llama) or the ratio starts != 1.
    `dp`: this process's data-parallel rank (default: alone). With `dp.fsdp` the decoder layers and
    the root are sharded with FSDP2 and optimizer state is sharded with them.
    `lora`: train peft LoRA adapters on the frozen model instead (`slime.backends.lora`): only the
    adapters are in the optimizer and in checkpoints' trainer state; HF exports, checkpoints' model/ and
    `hf_named_tensors` hold the merged weights; `adapter_tensors` / `save_adapter` give the adapter alone.
    `ref_is_base` (LoRA only, instead of `ref_model`): the KL reference is the frozen base itself, read with
    the adapters switched off, so no second copy of the weights is held.
    """

    def __init__(
        self,
        model: torch.nn.Module | str | os.PathLike,
        config: TrainerConfig | None = None,
        *,
        ref_model: torch.nn.Module | str | os.PathLike | None = None,
        device: torch.device | str | None = None,
        dp: DataParallel | None = None,
        lora: lora_mod.LoraSettings | None = None,
        ref_is_base: bool = False,
    ) -> None:
        self.config = c = config or TrainerConfig()
        self.dp = dp or DataParallel()
        self.model = _as_model(model)
        self.device = torch.device(device) if device is not None else next(self.model.parameters()).device
        self.model.to(self.device)
        self.lora = lora
        # peft's wrapper, kept for its adapter format; self.model stays the HF model (adapters injected)
        self.peft_model = lora_mod.apply_lora(self.model, lora) if lora is not None else None
        if c.gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.runner = self._wrap(self.model)
        self.ref_model = self.ref_runner = None
        if ref_is_base and (lora is None or ref_model is not None):
            raise ValueError("ref_is_base needs lora= and no ref_model: the reference is the base under the adapters")
        self.ref_is_base = ref_is_base
        if ref_model is not None:
            self.ref_model = _as_model(ref_model).to(self.device).eval().requires_grad_(False)
            self.ref_runner = self._wrap(self.ref_model)
        self.optimizer = torch.optim.AdamW(
            [p for p in self.runner.parameters() if p.requires_grad],
            lr=c.lr,
            betas=(c.adam_beta1, c.adam_beta2),
            eps=c.adam_eps,
            weight_decay=c.weight_decay,
            # one tensor at a time: the multi-tensor (foreach) update holds a temporary the size of the
            # moments, ~15 GiB extra at the step's peak for Qwen3-4B in fp32 (benchmarks/gpu_train_memory.py)
            foreach=False,
        )
        warmup = c.lr_warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0
        )
        self.step = 0  # optimizer steps taken
        self.pad_token_id = 0  # any valid id: padding is masked out of attention and losses

    def _wrap(self, model: torch.nn.Module) -> LogProbForward:
        runner = LogProbForward(model)
        if self.dp.fsdp:
            dtype = getattr(torch, self.config.fsdp_param_dtype) if self.config.fsdp_param_dtype else None
            apply_fsdp(runner, decoder_layers(model), param_dtype=dtype)
        return runner

    # ---- log-probs ---------------------------------------------------------------------------

    def plan(self, samples: Sequence[Sample]) -> list[list[int]]:
        """Micro-batches (lists of sample indices) under the configured token budget."""
        lengths = [len(s.tokens) for s in samples]
        return plan_micro_batches(
            lengths, self.config.max_tokens_per_micro_batch, self.config.max_samples_per_micro_batch
        )

    def _padding_batches(self, count: int) -> int:
        """FSDP ranks must run equally many forwards: how many empty micro-batches this rank adds."""
        if not self.dp.fsdp or not self.dp.enabled:
            return 0
        return int(self.dp.max([count])[0]) - count

    def _empty_batch(self) -> MicroBatch:
        """A one-token micro-batch with loss mask 0: a forward/backward that changes nothing."""
        # rollout log-probs too, so that a TIS loss (which needs them) runs on it as well
        filler = Sample(tokens=[self.pad_token_id] * 2, response_length=1, loss_mask=[0], rollout_log_probs=[0.0])
        return pack_micro_batch([filler], [0], advantages=[[0.0]], pad_token_id=self.pad_token_id)

    @torch.no_grad()
    def compute_log_probs(
        self, samples: Sequence[Sample], temperature: float = 1.0, *, model: torch.nn.Module | None = None
    ) -> list[list[float]]:
        """Per response token log-probs of each sample under `model` (default: the policy), in order."""
        runner = self.runner if model is None or model is self.model or model is self.runner else None
        if model is not None and (model is self.ref_model or model is self.ref_runner):
            runner = self.ref_runner
        if runner is None:
            runner = model if isinstance(model, LogProbForward) else LogProbForward(model)
        was_training = runner.training
        runner.eval()
        plan = self.plan(samples)
        fillers = self._padding_batches(len(plan))  # agreed on before any rank starts its forwards
        results = []
        for indices in plan:
            mb = pack_micro_batch(samples, indices, pad_token_id=self.pad_token_id).to(self.device)
            lp, _ = response_log_probs(runner, mb, temperature, chunk_tokens=self.config.logits_chunk_tokens)
            results.append([row[:n] for row, n in zip(lp.cpu().tolist(), mb.response_lengths, strict=True)])
        for _ in range(fillers):
            response_log_probs(runner, self._empty_batch().to(self.device), temperature)
        runner.train(was_training)
        return scatter_back(plan, results, len(samples))

    def compute_ref_log_probs(self, samples: Sequence[Sample], temperature: float = 1.0) -> list[list[float]]:
        """Per response token log-probs under the reference model (for the KL loss)."""
        if self.ref_is_base:
            with self.peft_model.disable_adapter():  # W alone: the adapters' delta is switched off, not removed
                return self.compute_log_probs(samples, temperature)
        if self.ref_model is None:
            raise ValueError("no reference model: pass ref_model= to TorchTrainer to use a KL loss")
        return self.compute_log_probs(samples, temperature, model=self.ref_runner)

    def memory(self) -> dict[str, float]:
        """What training holds, in bytes: `state_bytes` = this rank's weights, gradients, optimizer moments and
        reference weights (exact, from the tensors; what LoRA shrinks); `peak_bytes` = the device's peak since
        the process began (CUDA: the allocator's peak; CPU: the process's peak resident memory, which also
        counts Python, torch and batches)."""
        seen: set[int] = set()
        total = 0

        def add(t: Tensor | None) -> None:
            nonlocal total
            if isinstance(t, Tensor) and id(t) not in seen:
                seen.add(id(t))
                local = getattr(t, "_local_tensor", t)  # an FSDP2 shard: this rank's part
                total += local.numel() * local.element_size()

        for module in (self.model, self.ref_model):
            for p in module.parameters() if module is not None else ():
                add(p)
                add(p.grad)
        for state in self.optimizer.state.values():
            for value in state.values():
                add(value)
        if self.device.type == "cuda":
            peak = float(torch.cuda.max_memory_allocated(self.device))
        else:
            import resource

            peak = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB
        return {"state_bytes": float(total), "peak_bytes": peak}

    # ---- training ----------------------------------------------------------------------------

    def train_step(
        self,
        samples: Sequence[Sample],
        advantages: Sequence[float | Sequence[float]] | None,
        config: PolicyLossConfig | None = None,
        *,
        temperature: float = 1.0,
        old_log_probs: Sequence[Sequence[float]] | None = None,
        ref_log_probs: Sequence[Sequence[float]] | None = None,
        use_rollout_logprobs: bool = False,
        loss_divisor: float | None = None,
        loss_type: str = "policy_loss",
    ) -> dict[str, float]:
        """One optimizer step on `samples` (this rank's shard), accumulating gradients over micro-batches.

        loss_type: "policy_loss" (`slime.algorithms.losses.policy_loss` per `config`) or "sft_loss"
        (masked NLL, `slime.backends.sft.sft_loss`, with `config.aggregation`; advantages, old and
        reference log-probs are ignored and may be None).
        advantages: per sample, a number (spread over its response tokens) or one value per response
        token. old_log_probs: default this step's own forward, detached (or the engine's with
        `use_rollout_logprobs`): the weights move only at the step's end, so the old policy of the
        first (and only) update on a batch is the current one and a separate no-grad forward would
        recompute the same values (TRL's GRPOTrainer skips it likewise at num_iterations=1). Pass them
        when a rollout is split over several optimizer steps (`train_worker` does).
        ref_log_probs: default from the reference model when `config.kl_loss_coef` is set.
        Each micro-batch's loss uses the divisor of the whole batch (all ranks' samples), so the summed
        gradients equal the gradient of the whole-batch loss whatever the micro-batching and sharding.
        """
        if loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
        config = config or PolicyLossConfig()
        sft = loss_type == "sft_loss"
        started = time.perf_counter()
        adv = None if sft else _token_advantages(samples, advantages)
        if not sft and old_log_probs is None:
            if use_rollout_logprobs:
                if any(s.rollout_log_probs is None for s in samples):
                    raise ValueError("use_rollout_logprobs needs rollout_log_probs on every sample")
                old_log_probs = [s.rollout_log_probs for s in samples]
        if not sft and config.kl_loss_coef != 0.0 and ref_log_probs is None:
            ref_log_probs = self.compute_ref_log_probs(samples, temperature)
        divisor = self._global_divisor(samples, config, loss_divisor)
        skipped = 0
        if not sft and self.skips_zero_advantage(config):
            keep = self.trained_indices(samples, adv, config)
            skipped = len(samples) - len(keep)
            samples, adv = [samples[i] for i in keep], [adv[i] for i in keep]
            old_log_probs = None if old_log_probs is None else [old_log_probs[i] for i in keep]
            ref_log_probs = None if ref_log_probs is None else [ref_log_probs[i] for i in keep]

        self.runner.train()
        self.optimizer.zero_grad(set_to_none=True)
        plan = self.plan(samples)
        sums: dict[str, float] = {"loss": 0.0}
        weighted: dict[str, float] = {}
        tokens = 0
        batches = [(indices, None) for indices in plan]
        batches += [(None, self._empty_batch()) for _ in range(self._padding_batches(len(plan)))]
        for indices, filler in batches:
            mb = filler if filler is not None else pack_micro_batch(
                samples, indices, advantages=adv, pad_token_id=self.pad_token_id)
            mb = mb.to(self.device)
            lp, entropy = response_log_probs(
                self.runner,
                mb,
                temperature,
                chunk_tokens=self.config.logits_chunk_tokens,
                with_entropy=True,
                entropy_grad=not sft and config.entropy_coef != 0.0,
                recompute=self.config.gradient_checkpointing or self.config.recompute_logits,
            )
            if sft:
                loss, metrics = sft_loss(lp, mb.loss_mask, aggregation=config.aggregation, divisor=divisor,
                                         entropy=entropy)
            else:
                old = lp.detach() if old_log_probs is None else self._per_token(mb, filler, old_log_probs)
                loss, metrics = policy_loss(
                    lp, old, mb.advantages, mb.loss_mask, config,
                    ref_log_probs=self._per_token(mb, filler, ref_log_probs),
                    rollout_log_probs=mb.rollout_log_probs, entropy=entropy, divisor=divisor,
                    response_lengths=mb.response_lengths, total_lengths=mb.attention_mask.sum(dim=1).tolist(),
                )
            if loss.requires_grad:
                loss.backward()
            if filler is not None:
                continue
            n = int(mb.loss_mask.bool().sum())
            tokens += n
            sums["loss"] += float(loss.detach())
            for key, value in metrics.items():
                if key in _SUMMED_METRICS:
                    sums[key] = sums.get(key, 0.0) + float(value)
                else:
                    weighted[key] = weighted.get(key, 0.0) + float(value) * n

        lr = self.optimizer.param_groups[0]["lr"]
        for group in self.optimizer.param_groups:  # nothing trained: a zero gradient, as the full step had
            for p in group["params"]:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
        grad_norm = self._clip_and_step()
        sums, weighted, tokens, micro_batches = self._combine_ranks(sums, weighted, tokens, len(plan))
        result = dict(sums)
        result.update({key: value / max(tokens, 1) for key, value in weighted.items()})
        result.update(
            grad_norm=grad_norm,
            lr=lr,
            tokens=float(tokens),
            num_micro_batches=float(micro_batches),
            zero_advantage_samples=self.dp.sum([skipped])[0],
            skipped=float(not math.isfinite(grad_norm)),
            step_time_s=time.perf_counter() - started,
        )
        return result

    def skips_zero_advantage(self, config: PolicyLossConfig) -> bool:
        """Whether `train_step` leaves zero-advantage samples out (exact only without entropy / KL terms).

        Never with a custom TIS function: it sees every sample of the micro-batch, as in slime (its batch
        statistics, e.g. a batch-normalised weight, and its metrics cover them all)."""
        return (self.config.skip_zero_advantage and config.entropy_coef == 0.0 and config.kl_loss_coef == 0.0
                and config.custom_tis_function is None)

    def trained_indices(
        self, samples: Sequence[Sample], advantages: Sequence[float | Sequence[float]], config: PolicyLossConfig
    ) -> list[int]:
        """Indices of the samples a policy `train_step` trains on (all, unless zero-advantage ones are skipped)."""
        if not self.skips_zero_advantage(config):
            return list(range(len(samples)))
        return [i for i, (sample, value) in enumerate(zip(samples, advantages, strict=True))
                if _trains_anything(sample, _sample_token_advantages(sample, value))]

    def _per_token(self, mb: MicroBatch, filler: MicroBatch | None, values: Any) -> Tensor | None:
        """Per-token values of the step's samples as `mb`'s [B, R] tensor (zeros for a filler batch)."""
        if values is None:
            return None
        return (mb.pad_response(values) if filler is None else torch.zeros_like(mb.loss_mask)).to(self.device)

    def _combine_ranks(
        self, sums: dict[str, float], weighted: dict[str, float], tokens: int, micro_batches: int
    ) -> tuple[dict[str, float], dict[str, float], int, int]:
        """Add up every rank's metric sums, token-weighted sums, tokens and micro-batches."""
        if not self.dp.enabled:
            return sums, weighted, tokens, micro_batches
        all_sums: dict[str, float] = {}
        all_weighted: dict[str, float] = {}
        all_tokens = all_mbs = 0
        for s, w, t, m in self.dp.gather_objects((sums, weighted, tokens, micro_batches)):
            for key, value in s.items():
                all_sums[key] = all_sums.get(key, 0.0) + value
            for key, value in w.items():
                all_weighted[key] = all_weighted.get(key, 0.0) + value
            all_tokens, all_mbs = all_tokens + t, all_mbs + m
        return all_sums, all_weighted, all_tokens, all_mbs

    def _global_divisor(
        self, samples: Sequence[Sample], config: PolicyLossConfig, loss_divisor: float | None
    ) -> float:
        """The aggregation divisor of the whole step: this rank's count, summed over ranks."""
        if loss_divisor is not None:
            return float(loss_divisor)
        masks = [s.loss_mask if s.loss_mask is not None else [1] * s.response_length for s in samples]
        if config.aggregation == "token_mean":
            count = sum(1 for m in masks for v in m if v)
        elif config.aggregation == "sequence_mean":
            count = sum(1 for m in masks if any(m))
        else:
            raise ValueError(
                f"aggregation {config.aggregation!r} needs loss_divisor= (Dr.GRPO: samples x max response length)"
            )
        return float(max(self.dp.sum([count])[0], 1))

    def _clip_and_step(self) -> float:
        """Sum gradients over replicas, clip, then step unless the norm is inf/nan (skipped, as Megatron does)."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        if not self.dp.fsdp:
            all_reduce_gradients(params, self.dp)  # FSDP2 already reduce-scattered them in backward
        max_norm = self.config.clip_grad or math.inf
        grad_norm = total_norm(torch.nn.utils.clip_grad_norm_(params, max_norm))
        if math.isfinite(grad_norm):
            self.optimizer.step()
            self.scheduler.step()
            self.step += 1
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    # ---- GPU memory hand-over (colocated engines) ---------------------------------------------

    def offload(self) -> None:
        """Move weights, reference weights and optimizer state to host memory and free the GPU for
        colocated engines (slime's --offload-train). No-op on a CPU trainer."""
        self._move(torch.device("cpu"))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()

    def onload(self) -> None:
        """Bring everything `offload` moved back to the trainer's device, before the next train step."""
        self._move(self.device)

    def _move(self, device: torch.device) -> None:
        if self.device.type == "cpu":
            return
        for runner in (self.runner, self.ref_runner):  # the runner: the FSDP2 root, whose _apply re-registers shards
            if runner is not None:
                runner.to(device)  # parameters keep their identity: the optimizer still holds them
        self.optimizer.zero_grad(set_to_none=True)  # no gradient lives across a hand-over
        for state in self.optimizer.state.values():
            for key, value in state.items():
                # Adam's 0-dim `step` counters stay where the optimizer keeps them (on the CPU)
                if isinstance(value, Tensor) and value.dim() > 0 and value.device != device:
                    state[key] = value.to(device, non_blocking=True)  # to the CPU: into pinned memory

    # ---- checkpoints -------------------------------------------------------------------------

    def save_checkpoint(
        self, save_dir: str | os.PathLike, *, iteration: int | None = None, data_state: dict | None = None,
        tokenizer_dir: str | os.PathLike | None = None, dtype: str | torch.dtype | None = None,
        keep: int | None = None,
    ) -> str:
        """Atomically save `save_dir/iter_<iteration>` (layout: `slime.backends.checkpoint`) for exact resume.

        iteration defaults to the optimizer step; data_state (JSON) is the caller's data position.
        `dtype`: model/'s dtype, the engines' serving dtype (default: the parameters', fp32); when it is
        not theirs, the fp32 master weights go to trainer/ as well. `keep`: then delete all but the
        newest `keep` iterations (None or 0: keep all). Collective: every rank writes its shard of the
        optimizer state (and master weights) in parallel; rank 0 writes model/ from the gathered weights.
        A failed write (a full disk) raises `CheckpointSaveError` on every rank, the previous save intact.
        """
        iteration = self.step if iteration is None else iteration
        dtype = ckpt.dtype_of(dtype) if dtype is not None else self._param_dtype()
        # LoRA: model/ holds the merged weights, so the exact state is the adapter in trainer/ (base: frozen)
        exact = dtype == self._param_dtype() and self.lora is None
        sizes = self.checkpoint_sizes(dtype)
        needed = sum(sizes.values())
        main = self.dp.is_main
        tmp, error = None, None
        if main:
            try:
                tmp = ckpt.start_save(save_dir, iteration, needed)
            except ckpt.CheckpointSaveError as exc:
                error = str(exc)
        tmp_name, error = self.dp.broadcast_object((str(tmp) if tmp else None, error))
        if error is not None:
            raise ckpt.CheckpointSaveError(error)
        tmp = Path(tmp_name)
        self._check_shared(save_dir, iteration, tmp, needed)
        with ckpt.writing(save_dir, iteration, tmp if main else None,
                          f"the sharded trainer state ({ckpt.TRAINER_DIR}/, every rank its shard)", needed):
            ckpt.write_trainer_state(tmp, state_dicts.sharded_state(self.runner, self.optimizer, with_weights=not exact,
                                                                    trainable_only=self.lora is not None),
                                     self.dp.group)
        adapter = self.adapter_tensors() if self.lora is not None else None  # collective under FSDP
        base = lora_mod.base_fingerprint(self.runner, self.dp) if self.lora is not None else None  # collective too
        weights = self._full_hf_state()  # collective under FSDP
        result: tuple[str | None, str | None] = (None, None)
        if main:
            try:
                with ckpt.writing(save_dir, iteration, tmp, f"the model folder (model/, {ckpt.dtype_name(dtype)})",
                                  needed):
                    ckpt.write_model_folder(tmp / "model", self._hf_writer(),
                                            weights if weights is not None else self.model.state_dict(), dtype,
                                            tokenizer_dir=tokenizer_dir)
                if adapter is not None:
                    with ckpt.writing(save_dir, iteration, tmp, f"the LoRA adapter ({lora_mod.ADAPTER_DIR}/)", needed):
                        lora_mod.save_adapter(self.peft_model, adapter, tmp / lora_mod.ADAPTER_DIR)
                payload = {"state": {"step": self.step, "data_state": data_state or {}},
                           "model_dtype": ckpt.dtype_name(dtype),
                           "master_weights": ckpt.MASTER_IN_MODEL if exact else ckpt.MASTER_IN_TRAINER,
                           "world_size": self.dp.world_size, "bytes": sizes}
                if self.lora is not None:
                    payload["lora"] = self.lora.describe()
                    payload["lora_base_fingerprint"] = base
                with ckpt.writing(save_dir, iteration, tmp, "the scheduler, RNG and state files and the rename into "
                                  "place", needed):
                    path = ckpt.finish_save(save_dir, tmp, iteration, scheduler=self.scheduler, payload=payload,
                                            keep=keep)
                result = (str(path), None)
            except ckpt.CheckpointSaveError as exc:
                result = (None, str(exc))
            except BaseException as exc:  # a bug or an interrupt: tell the waiting ranks, then raise it here
                self.dp.broadcast_object((None, f"rank 0 failed while saving into {save_dir}: {exc!r}"))
                raise
        path_name, error = self.dp.broadcast_object(result)
        if error is not None:
            raise ckpt.CheckpointSaveError(error)
        return path_name

    def _check_shared(self, save_dir: str | os.PathLike, iteration: int, tmp: Path, needed: int) -> None:
        """Every rank sees rank 0's temporary folder, or every rank raises saying which cannot: DCP
        writes each rank's shard there, so a multi-node trainer needs a filesystem all nodes mount."""
        if not self.dp.enabled:
            return
        seen = self.dp.gather_objects((tmp.is_dir(), socket.gethostname()))
        blind = [f"rank {rank} on {host}" for rank, (ok, host) in enumerate(seen) if not ok]
        if blind:
            if self.dp.is_main:
                ckpt.discard(tmp)
            raise ckpt.CheckpointSaveError(ckpt.failure_message(
                save_dir, iteration, "the sharded trainer state",
                f"{', '.join(blind)} cannot see {tmp}, which rank 0 created: every rank writes its own shard, so "
                "--save (SAVE_DIR) must be on a filesystem every trainer node mounts at the same path (NFS, "
                "Lustre, ...)", needed))

    def checkpoint_sizes(self, dtype: str | torch.dtype | None = None) -> dict[str, int]:
        """Bytes one save writes: model/ in `dtype`, master weights (when model/ is not exact), optimizer."""
        dtype = ckpt.dtype_of(dtype) if dtype is not None else self._param_dtype()
        count = sum(p.numel() for p in self.runner.parameters())  # a DTensor's numel is its global size
        if self.lora is not None:  # model/: the merged weights; trainer/: the adapter and its moments
            adapter = sum(p.numel() for _, p in lora_mod.adapter_parameters(self.runner))
            sizes = ckpt.save_sizes(count - adapter, dtype, master_dtype=self._param_dtype(), adapter=adapter)
        else:
            sizes = ckpt.save_sizes(count, dtype, master_dtype=self._param_dtype())
        state = [v for s in self.optimizer.state.values() for v in s.values() if isinstance(v, Tensor) and v.dim()]
        if state:  # the optimizer's real state (AdamW: two moments); before the first step, the estimate
            sizes["optimizer"] = sum(v.numel() * v.element_size() for v in state)
        return sizes

    def _param_dtype(self) -> torch.dtype:
        return next(self.runner.parameters()).dtype

    def load_checkpoint(self, path: str | os.PathLike) -> dict[str, Any]:
        """Restore the latest checkpoint under `path` (or that iteration directory) for exact resume.

        Any world size and sharding can load any checkpoint (DCP reshards trainer/; format 1: full
        weights and by-name optimizer state). Returns {"iteration", "step", "data_state", "path"}.
        """
        found, payload = ckpt.read_state(path)
        self._check_lora_checkpoint(found, payload)
        main = self.dp.is_main or not self.dp.fsdp  # FSDP: rank 0 reads full tensors, the others receive
        if payload["format"] == 1:
            self._load_weights_folder(found, main)
            self._load_format1_optimizer(found, main)
        else:
            master_in_trainer = payload["master_weights"] == ckpt.MASTER_IN_TRAINER
            if not master_in_trainer:
                self._load_weights_folder(found, main)
            state = state_dicts.sharded_state(self.runner, self.optimizer, with_weights=master_in_trainer,
                                              trainable_only=self.lora is not None)
            ckpt.read_trainer_state(found, state, self.dp.group)
            state_dicts.load_sharded_state(self.runner, self.optimizer, state)
        scheduler = ckpt.read_scheduler(found, payload) if main else None
        self.scheduler.load_state_dict(self.dp.broadcast_object(scheduler) if self.dp.fsdp else scheduler)
        ckpt.restore_rng(found, payload)
        self.step = int(payload["state"]["step"])
        return {
            "iteration": payload["iteration"],
            "step": self.step,
            "data_state": payload["state"]["data_state"],
            "path": payload["path"],
        }

    def _check_lora_checkpoint(self, found: Path, payload: dict[str, Any]) -> None:
        """A LoRA trainer resumes LoRA checkpoints of the same adapter shape only, and the other way round."""
        saved = payload.get("lora")
        if self.lora is None and saved is not None:
            raise ValueError(f"{found} is a LoRA checkpoint ({saved}): resume it with the same --lora-rank, "
                             f"--lora-alpha and --target-modules, or serve/train its merged model/ folder as "
                             "--hf-checkpoint")
        if self.lora is not None:
            if saved is None:
                raise ValueError(f"{found} is a full fine-tuning checkpoint: LoRA cannot resume it. To train an "
                                 "adapter on top of it, pass its model/ folder as --hf-checkpoint and start without "
                                 "--load")
            if saved != self.lora.describe():
                raise ValueError(f"{found} holds a LoRA adapter {saved}, this trainer's is {self.lora.describe()}: "
                                 "pass the checkpoint's rank, alpha, target modules and dropout")
            base = payload.get("lora_base_fingerprint")
            now = lora_mod.base_fingerprint(self.runner, self.dp)  # collective under FSDP
            if isinstance(base, float) and not lora_mod.same_base(base, now):
                raise ValueError(f"{found} holds an adapter trained on other base weights (sum |w| {base!r}, this "
                                 f"trainer's {now!r}): resume with the --hf-checkpoint that run started from")

    def _load_weights_folder(self, found: Path, main: bool) -> None:
        """The exact weights from the iteration's model/ folder (format 1, or format 2 saved in fp32)."""
        if self.dp.fsdp:
            weights = ckpt.read_hf_weights(found / "model") if main else {}
            state_dicts.load_full_model_state(self.runner, weights, broadcast=self.dp.enabled)
        else:
            self._load_hf_folder(found / "model")

    def _load_format1_optimizer(self, found: Path, main: bool) -> None:
        opt = ckpt.read_optimizer(found) if main else {}
        if not main or opt.get("optimizer_format") == ckpt.OPTIMIZER_BY_NAME:
            state_dicts.load_full_optimizer_state(
                self.runner, self.optimizer, opt.get("optimizer", {}), broadcast=self.dp.fsdp and self.dp.enabled)
        elif self.dp.fsdp:
            raise ValueError(f"{found} holds an index-keyed optimizer state (single-process save): "
                             "resume it without FSDP once and save again")
        else:
            self.optimizer.load_state_dict(opt["optimizer"])

    def export_hf(self, out_dir: str | os.PathLike, tokenizer: Any = None, dtype: str | torch.dtype | None = None) -> str:
        """Write an HF folder (safetensors + config, tokenizer when given) for engines or release.

        `dtype`: the dtype written and named in config.json (the engines' serving dtype, e.g. bfloat16);
        default the parameters' own. Collective under data parallelism: the full weights are gathered
        and rank 0 writes.
        """
        weights = self._full_hf_state()
        if self.dp.is_main:
            ckpt.export_hf(self._hf_writer(), out_dir, tokenizer, state_dict=weights, dtype=dtype)
        self.dp.barrier()
        return str(out_dir)

    # ---- LoRA: the adapter alone (slime.backends.lora) -----------------------------------------

    def adapter_tensors(self, dtype: str | torch.dtype | None = None) -> dict[str, Tensor]:
        """The LoRA adapter as peft saves it: {peft key (`base_model.model.<module>.lora_A.weight`): full
        tensor}, copies on the trainer's device, in `dtype` (default the parameters'). Collective under
        FSDP2 (every rank gets every tensor). `lora_mod.tensor_bytes(...)` is what sending them costs."""
        if self.lora is None:
            raise ValueError("adapter_tensors needs a LoRA trainer (--lora-rank > 0); this one trains the full model")
        return lora_mod.adapter_tensors(self.runner, dtype=ckpt.dtype_of(dtype) if dtype is not None else None)

    def save_adapter(self, out_dir: str | os.PathLike, dtype: str | torch.dtype | None = None) -> str:
        """Write the adapter as a peft adapter folder (adapter_config.json + adapter_model.safetensors, what
        SGLang's --lora-paths and /load_lora_adapter read), atomically; rank 0 writes. Collective."""
        tensors = self.adapter_tensors(dtype)
        if self.dp.is_main:
            lora_mod.save_adapter(self.peft_model, tensors, out_dir)
        self.dp.barrier()
        return str(out_dir)

    def hf_named_tensors(self) -> Iterator[tuple[str, Tensor]]:
        """(HF name, full tensor) for tensor weight syncs (`slime.weight_sync.trainer_hf_tensors`); with LoRA
        the merged weights, never the base under peft's names. Collective under FSDP2."""
        if self.lora is not None:
            return lora_mod.merged_named_tensors(self.model, self.lora.scaling)
        from slime.weight_sync import hf_named_tensors

        return hf_named_tensors(self.model)

    # ---- what a backend with another model class overrides (see megatron_backend) --------------

    def _full_hf_state(self) -> dict[str, Tensor] | None:
        """HF-named full weights to write, or None: `_hf_writer()` saves its own. With LoRA: merged."""
        if self.lora is not None:
            return lora_mod.merge_state(state_dicts.full_model_state(self.runner), self.lora.scaling)
        return state_dicts.full_model_state(self.runner) if self.dp.fsdp else None

    def _hf_writer(self) -> Any:
        """The object whose `save_pretrained(dir, state_dict=...)` writes the HF folder."""
        return self.model

    def _load_hf_folder(self, model_dir: os.PathLike) -> None:
        """Load a save_pretrained folder into the (unsharded) model."""
        ckpt.load_hf_weights(self.model, model_dir)


def _as_model(model: torch.nn.Module | str | os.PathLike) -> torch.nn.Module:
    if isinstance(model, torch.nn.Module):
        return model
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)


def _trains_anything(sample: Sample, advantages: Sequence[float]) -> bool:
    """Whether any loss-masked token of `sample` has a non-zero advantage (per-token `advantages`)."""
    mask = sample.loss_mask if sample.loss_mask is not None else [1] * len(advantages)
    return any(a != 0.0 and m for a, m in zip(advantages, mask, strict=True))


def _token_advantages(
    samples: Sequence[Sample], advantages: Sequence[float | Sequence[float]] | None
) -> list[list[float]]:
    """One advantage per response token of each sample; a number is spread over the whole response."""
    if advantages is None:
        raise ValueError("policy_loss needs advantages (one per sample or per response token); sft_loss does not")
    if len(advantages) != len(samples):
        raise ValueError(
            f"{len(samples)} samples but {len(advantages)} advantages: give one entry per sample"
        )
    return [_sample_token_advantages(sample, value) for sample, value in zip(samples, advantages, strict=True)]


def _sample_token_advantages(sample: Sample, value: float | Sequence[float]) -> list[float]:
    """One sample's advantage per response token; a number is spread over the whole response."""
    if isinstance(value, numbers.Real) or (isinstance(value, Tensor) and value.dim() == 0):
        return [float(value)] * sample.response_length
    return [float(v) for v in value]

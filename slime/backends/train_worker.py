"""One train rank: a `TorchTrainer` built from slime's flags, and the rollout -> optimizer-steps logic.

`slime.ray_actors.TrainActor` runs one `TrainWorker` per Ray actor; tests run them in plain
processes. Every rank receives the whole rollout and computes the same split, so no rank needs
another's samples:

    steps = --num-steps-per-rollout slices of the rollout, in order (one optimizer step each);
    each slice is split over the ranks by tokens (`shard_by_tokens`), rank r trains on part r.

Old log-probs are computed once, for all of this rank's parts, before the first step (slime's
lp_old: the weights that generated the rollout).
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

import torch

from slime.algorithms.estimators import policy_loss_type
from slime.algorithms.losses import PolicyLossConfig, opd_token_advantages, tis_options
from slime.arguments import serving_dtype
from slime.backends.distributed import init_data_parallel, shard_by_tokens
from slime.backends.lora import LoraSettings
from slime.backends.torch_backend import TorchTrainer, TrainerConfig, _sample_token_advantages
from slime.utils.types import Sample

logger = logging.getLogger(__name__)


def trainer_config(args: argparse.Namespace) -> TrainerConfig:
    """TrainerConfig from slime's flags (--lr, --clip-grad, --max-tokens-per-gpu, --recompute-granularity)."""
    granularity = getattr(args, "recompute_granularity", None)
    return TrainerConfig(
        lr=args.lr,
        weight_decay=args.weight_decay,
        adam_beta1=args.adam_beta1,
        adam_beta2=args.adam_beta2,
        adam_eps=getattr(args, "adam_eps", 1e-8),
        clip_grad=args.clip_grad,
        lr_warmup_steps=args.lr_warmup_iters,
        max_tokens_per_micro_batch=args.max_tokens_per_gpu or 16384,
        max_samples_per_micro_batch=args.micro_batch_size,
        gradient_checkpointing=granularity == "full",
        recompute_logits=granularity == "selective",
        fsdp_param_dtype="bfloat16" if getattr(args, "bf16", None) and uses_fsdp(args) else None,
    )


def collective_timeout_minutes(args: argparse.Namespace, world: int) -> float:
    """--distributed-timeout-minutes, raised for runs that save (--save) on several ranks until it
    covers one whole save at 50 MB/s: ranks wait in a collective while others write their part of a
    checkpoint (`slime.backends.checkpoint.timeout_minutes`; docs/gpu.md, Checkpoints and disk)."""
    configured = getattr(args, "distributed_timeout_minutes", 10.0)
    if world <= 1 or not getattr(args, "save", None):
        return configured
    from slime.backends import checkpoint as ckpt

    try:
        parameters = ckpt.parameter_count(args.hf_checkpoint)
    except (OSError, ValueError, KeyError, ImportError) as exc:  # not a folder the meta build understands
        logger.warning("could not size a checkpoint of %s (%s): collective timeout stays %.0f min",
                       args.hf_checkpoint, exc, configured)
        return configured
    needed = sum(ckpt.save_sizes(parameters, serving_dtype(args)).values())
    minutes = ckpt.timeout_minutes(needed, configured)
    if minutes > configured:
        logger.info("collective timeout %.0f min (one save is %s; --distributed-timeout-minutes %.0f)", minutes,
                    ckpt.human_bytes(needed), configured)
    return minutes


def same_node(url: str, node_ip: str) -> bool:
    """Whether the engine at `url` runs on the node whose IP is `node_ip` (a loopback host does)."""
    import ipaddress
    from urllib.parse import urlsplit

    host = urlsplit(url).hostname or ""
    if host == "localhost" or host == node_ip:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def uses_fsdp(args: argparse.Namespace) -> bool:
    return getattr(args, "train_backend", "torch") == "fsdp"


def world_size(args: argparse.Namespace) -> int:
    return args.actor_num_nodes * args.actor_num_gpus_per_node


class TrainWorker:
    """Rank `rank` of `world_size` train ranks (joins the process group at master_addr:master_port)."""

    def __init__(self, args: argparse.Namespace, *, rank: int = 0, world: int = 1,
                 master_addr: str | None = None, master_port: int | None = None, device: str | None = None):
        torch.manual_seed(args.seed)
        self.args = args
        self.rank, self.world = rank, world
        dp = init_data_parallel(rank, world, master_addr or "127.0.0.1", master_port or 0, fsdp=uses_fsdp(args),
                                timeout_minutes=collective_timeout_minutes(args, world))
        ref = (args.ref_load or args.hf_checkpoint) if args.use_kl_loss else None
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        trainer_cls = TorchTrainer
        if getattr(args, "train_backend", "torch") == "megatron":
            from slime.backends.megatron_backend import MegatronTrainer

            trainer_cls = MegatronTrainer
        lora = LoraSettings.from_args(args)  # None at --lora-rank 0 (full fine-tuning)
        extra: dict[str, Any] = {}
        if lora is not None:
            extra["lora"] = lora
            if ref is not None and same_folder(ref, args.hf_checkpoint):  # the base under the adapters: no copy
                ref, extra["ref_is_base"] = None, True
        self.trainer = trainer_cls(args.hf_checkpoint, trainer_config(args), ref_model=ref, device=device, dp=dp,
                                   **extra)
        self._tokenizer = None
        self._tensor_sync: Any = None

    def pid(self) -> int:
        return os.getpid()

    def load(self, path: str) -> dict[str, Any]:
        return self.trainer.load_checkpoint(path)

    def save(self, save_dir: str, iteration: int, data_state: dict[str, Any]) -> str:
        """A checkpoint whose model/ is in the engines' serving dtype; the newest --keep-checkpoints kept."""
        return self.trainer.save_checkpoint(save_dir, iteration=iteration, data_state=data_state,
                                            tokenizer_dir=self.args.hf_checkpoint, dtype=serving_dtype(self.args),
                                            keep=getattr(self.args, "keep_checkpoints", None) or None)

    def export_adapter(self, out_dir: str) -> str:
        """The LoRA adapter alone as a peft folder in the engines' serving dtype (what /load_lora_adapter reads);
        collective, rank 0 writes."""
        return self.trainer.save_adapter(out_dir, dtype=serving_dtype(self.args))

    def export(self, out_dir: str) -> str:
        """An HF folder with tokenizer in the engines' serving dtype (config.json says which), loadable by
        any engine (rank 0 writes it)."""
        if self._tokenizer is None and self.rank == 0:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.args.hf_checkpoint)
        return self.trainer.export_hf(out_dir, self._tokenizer, dtype=serving_dtype(self.args))

    def update_weights_tensor(self, engine_urls: list[str], tp_sizes: list[int], version: int, bucket_bytes: int,
                              master_address: str) -> dict[str, Any]:
        """Tensor weight sync by `--update-weight-transport` (see slime/weight_sync.py for what ran where).

        nccl: `TensorWeightSync("nccl")` broadcasts to every engine. tensor: handles to
        `/update_weights_from_tensor` -- CUDA IPC for SGLang engines, shared memory for CPU engines --
        for the engines on this node; those on other nodes (their URL's host is neither loopback nor
        `master_address`, this node's IP) are left to the caller's disk sync, listed in `skipped`.
        Tensors travel in the engines' serving dtype. Rank 0 sends; under FSDP the other ranks iterate
        the same full tensors so that every all-gather has all ranks. Returns rank 0's account: the
        sync's `stats()`, `engines` synced, `skipped` {url: why}, and `error` (None, or why the sync
        failed: the engines it paused stay paused for the caller's disk fallback).
        """
        from slime.engine.base import EngineClient
        from slime.weight_sync import TensorWeightSync, trainer_hf_tensors

        transport = getattr(self.args, "update_weight_transport", "nccl")
        mode = "nccl" if transport == "nccl" else "ipc" if getattr(self.args, "engine_type", "cpu") == "sglang" else "shm"
        if self.rank != 0:
            if self.trainer.dp.fsdp:
                for _ in trainer_hf_tensors(self.trainer):
                    pass
            return {"version": str(version)}
        skipped = {} if mode == "nccl" else {url: f"on another node than the trainer ({master_address})"
                                            for url in engine_urls if not same_node(url, master_address)}
        local = [(url, tp) for url, tp in zip(engine_urls, tp_sizes, strict=True) if url not in skipped]
        if self._tensor_sync is not None and self._tensor_sync.mode != mode:
            self.reset_tensor_sync()
        if self._tensor_sync is None:
            self._tensor_sync = TensorWeightSync(mode, bucket_bytes=bucket_bytes, engine_tp_sizes=[tp for _, tp in local],
                                                 master_address=master_address, dtype=serving_dtype(self.args),
                                                 keep_paused_on_error=mode != "nccl")
        sync = self._tensor_sync
        sync.engine_tp_sizes = [tp for _, tp in local]
        error = None
        try:
            if local:
                sync.sync(self.trainer, [EngineClient(url) for url, _ in local], version)
        except Exception as exc:  # noqa: BLE001 - reported to the pool, which falls back to disk
            if mode == "nccl":
                raise
            error = f"{type(exc).__name__}: {exc}"
            logger.error("tensor weight sync v%d failed: %s", version, error)
        if self.trainer.dp.fsdp and not sync.iterated:  # the other ranks gather every tensor: take part
            for _ in trainer_hf_tensors(self.trainer):
                pass
        return {"version": str(version), **sync.stats(), "engines": [url for url, _ in local], "skipped": skipped,
                "error": error}

    def reset_tensor_sync(self) -> None:
        if self._tensor_sync is not None:
            self._tensor_sync.close()
            self._tensor_sync = None

    def offload(self) -> None:
        """Free this rank's GPU for colocated engines (--offload-train); `onload` before training."""
        self.trainer.offload()

    def onload(self) -> None:
        self.trainer.onload()

    def close(self) -> None:
        """Drop the weight-sync group and leave the training group (all ranks call it)."""
        self.reset_tensor_sync()
        self.trainer.dp.close()

    def policy_config(self) -> PolicyLossConfig:
        args = self.args
        return PolicyLossConfig(
            loss_type=policy_loss_type(args.advantage_estimator),
            eps_clip=args.eps_clip,
            eps_clip_high=args.eps_clip_high,
            eps_clip_c=args.eps_clip_c,
            aggregation="token_mean" if args.calculate_per_token_loss else "sequence_mean",
            entropy_coef=args.entropy_coef,
            kl_loss_coef=args.kl_loss_coef if args.use_kl_loss else 0.0,
            kl_loss_type=args.kl_loss_type,
            use_unbiased_kl=args.use_unbiased_kl,
            **tis_options(args),
        )

    def parts(self, samples: Sequence[Sample]) -> list[list[int]]:
        """Indices (into `samples`) this rank trains on, one list per optimizer step."""
        steps = max(1, min(self.args.num_steps_per_rollout, len(samples)))
        bounds = [round(i * len(samples) / steps) for i in range(steps + 1)]
        out = []
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
            shard = shard_by_tokens([len(s.tokens) for s in samples[lo:hi]], self.world)[self.rank]
            out.append([lo + i for i in shard])
        return out

    def train(self, samples: list[Sample], advantages: Sequence[Any] | None = None,
              loss_type: str | None = None) -> dict[str, float]:
        """`--num-steps-per-rollout` optimizer steps on the rollout (this rank's parts of it).

        loss_type (default --loss-type): sft_loss = masked NLL, advantages ignored (None allowed);
        policy_loss = old log-probs recomputed once first (unless --use-rollout-logprobs) at
        --rollout-temperature, then the estimator's policy loss. --use-opd: the old (student) log-probs and
        each sample's `teacher_log_probs` turn every response token's advantage into
        A - --opd-kl-coef x (student - teacher) (`opd_token_advantages`), before the steps.
        """
        args = self.args
        loss_type = loss_type or getattr(args, "loss_type", "policy_loss")
        sft = loss_type == "sft_loss"
        temperature = args.rollout_temperature
        parts = self.parts(samples)
        mine = sorted(i for part in parts for i in part)
        metrics: dict[str, float] = {}
        old: dict[int, list[float]] = {}
        config = self.policy_config() if not sft else PolicyLossConfig(
            aggregation="token_mean" if args.calculate_per_token_loss else "sequence_mean")
        opd = not sft and getattr(args, "use_opd", False)
        if not sft and not args.use_rollout_logprobs:
            started = time.perf_counter()
            if opd:  # every sample gets the distillation term, a zero-advantage one too
                needed = list(mine)
            else:  # train_step leaves zero-advantage samples out when it can: they need no old log-probs
                trained = self.trainer.trained_indices([samples[i] for i in mine], [advantages[i] for i in mine],
                                                       config)
                needed = [mine[j] for j in trained]
            values = self.trainer.compute_log_probs([samples[i] for i in needed], temperature)
            old = dict(zip(needed, values, strict=True))
            old.update({i: [0.0] * samples[i].response_length for i in mine if i not in old})
            metrics["train/log_probs_time_s"] = time.perf_counter() - started
            diffs = [
                abs(a - b) for i in needed if samples[i].rollout_log_probs is not None
                for a, b, m in zip(old[i], samples[i].rollout_log_probs,
                                   samples[i].loss_mask or [1] * samples[i].response_length, strict=True)
                if m
            ]
            worst = self.trainer.dp.max([max(diffs) if diffs else -1.0])[0]
            if worst >= 0:
                metrics["train/train_rollout_logprob_abs_diff_max"] = worst
        if opd:
            student = {i: samples[i].rollout_log_probs for i in mine} if args.use_rollout_logprobs else old
            advantages, gap = opd_advantages(args, samples, mine, advantages, student)
            totals = self.trainer.dp.sum([gap, float(len(mine))])
            metrics["train/opd_reverse_kl"] = totals[0] / max(totals[1], 1.0)
        per_step = []
        for part in parts:
            per_step.append(self.trainer.train_step(
                [samples[i] for i in part],
                None if sft else [advantages[i] for i in part],
                config,
                temperature=temperature,
                old_log_probs=None if sft or args.use_rollout_logprobs else [old[i] for i in part],
                use_rollout_logprobs=args.use_rollout_logprobs,
                loss_type=loss_type,
            ))
        for key in dict.fromkeys(k for m in per_step for k in m):  # a step that trained nothing lacks token metrics
            values = [m[key] for m in per_step if key in m]
            metrics[f"train/{key}"] = sum(values) / len(values)
        if hasattr(self.trainer, "memory"):
            held = self.trainer.memory()
            metrics["train/state_gib"] = self.trainer.dp.sum([held["state_bytes"]])[0] / 2**30  # all ranks
            metrics["train/peak_memory_gib"] = self.trainer.dp.max([held["peak_bytes"]])[0] / 2**30  # the worst rank
        return metrics


def same_folder(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two checkpoint paths name the same folder (hub names compare as written)."""
    return a == b or os.path.realpath(a) == os.path.realpath(b)


def opd_advantages(
    args: argparse.Namespace, samples: Sequence[Sample], indices: Sequence[int], advantages: Sequence[Any],
    student: dict[int, Sequence[float] | None],
) -> tuple[list[Any], float]:
    """`advantages` with slime's on-policy distillation term on the samples at `indices` (per response token:
    A - --opd-kl-coef x (student - teacher log-prob)), and the sum over those samples of the loss-masked
    mean of student - teacher (slime's opd_reverse_kl metric, a mean over samples once divided)."""
    out = list(advantages)
    coef = getattr(args, "opd_kl_coef", 1.0)
    gap_sum = 0.0
    for i in indices:
        sample = samples[i]
        teacher = sample.teacher_log_probs
        if teacher is None:
            raise ValueError(
                f"--use-opd: sample {sample.index} has no teacher_log_probs. With --opd-type sglang the rollout sets "
                "them: pass --custom-rm-path slime.rollout.on_policy_distillation.reward_func, "
                "--custom-reward-post-process-path slime.rollout.on_policy_distillation.post_process_rewards and "
                "--rm-url http://TEACHER:PORT/generate")
        if student.get(i) is None:
            raise ValueError(f"--use-opd with --use-rollout-logprobs: sample {sample.index} has no rollout_log_probs")
        teacher = teacher.tolist() if isinstance(teacher, torch.Tensor) else list(teacher)
        if len(teacher) != sample.response_length:
            raise ValueError(f"--use-opd: sample {sample.index} has {len(teacher)} teacher_log_probs for its "
                             f"{sample.response_length} response tokens: give one per response token")
        base = _sample_token_advantages(sample, out[i])
        out[i], gaps = opd_token_advantages(base, student[i], teacher, coef)
        mask = sample.loss_mask if sample.loss_mask is not None else [1] * len(gaps)
        kept = [g for g, m in zip(gaps, mask, strict=True) if m]
        gap_sum += sum(kept) / len(kept) if kept else 0.0
    return out, gap_sum

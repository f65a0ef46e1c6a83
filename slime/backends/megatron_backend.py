"""`--train-backend megatron` (first stage): a megatron-core GPTModel trained by the torch backend's loop.

What it is: the HF checkpoint's architecture built as megatron-core `GPTModel` (config mapping and
weights from `megatron_convert`), wrapped so `TorchTrainer`'s log-probs, losses, micro-batching,
data parallelism over replicas (gradients summed), checkpoints (an HF model/ folder in the serving
dtype + the optimizer state and fp32 master weights sharded with torch.distributed.checkpoint) and HF
export work unchanged. Weights leave as HF safetensors, so engines load them as usual.

What it is not (yet): tensor / pipeline / context parallelism, Megatron's distributed optimizer,
DDP buckets, fused kernels or Transformer Engine specs, and Megatron's torch_dist checkpoints. The
model is built with TP = PP = 1 and the local layer spec; the optimizer is torch AdamW.

Tested on CPU only where megatron-core is importable (it is in both GPU sets): there the two shims
of platform-facts section 5 are applied (`torch.cuda.current_device` -> "cpu", no CUDA RNG fork).
On GPU it is UNTESTED HERE.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from slime.backends import checkpoint as ckpt
from slime.backends.distributed import DataParallel
from slime.backends.log_probs import LogProbForward
from slime.backends.megatron_convert import (
    gpt_model_kwargs,
    hf_to_megatron,
    iter_megatron_to_hf,
    megatron_to_hf,
    transformer_config_kwargs,
)
from slime.backends.torch_backend import TorchTrainer, TrainerConfig
from slime.utils.misc import free_port


def require_megatron() -> None:
    try:
        import megatron.core  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"--train-backend megatron needs megatron-core ({exc}): install a GPU set "
                          "(bash setup.sh --gpu) or use --train-backend torch / fsdp") from exc


def apply_cpu_shims() -> None:
    """Let megatron-core run on CPU (platform-facts section 5); a no-op when CUDA is available."""
    if torch.cuda.is_available():
        return
    from megatron.core.tensor_parallel import random as mg_random

    torch.cuda.current_device = lambda: "cpu"  # megatron asks for the current device in several places
    mg_random.CudaRNGStatesTracker.fork = lambda self, *args, **kwargs: contextlib.nullcontext()


def init_model_parallel(seed: int) -> None:
    """A process group (one rank if none exists yet), Megatron's parallel state with TP = PP = 1 and,
    on GPU, Megatron's CUDA RNG tracker (its attention forks the tracker's state even without dropout)."""
    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel

    if not dist.is_initialized():
        port = free_port("127.0.0.1")
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    if torch.cuda.is_available() and not tensor_parallel.get_cuda_rng_tracker().is_initialized():
        tensor_parallel.model_parallel_cuda_manual_seed(seed)


def build_gpt_model(hf_config: Any, *, recompute: bool = False) -> torch.nn.Module:
    """An fp32 GPTModel with the HF config's architecture (local spec, TP = PP = 1), random weights."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    kwargs = transformer_config_kwargs(hf_config)
    if recompute:
        kwargs.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    config = TransformerConfig(
        **kwargs, use_cpu_initialization=True, params_dtype=torch.float32, gradient_accumulation_fusion=False,
        bias_dropout_fusion=False, apply_rope_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False,
    )
    spec = get_gpt_layer_local_spec(qk_layernorm=kwargs["qk_layernorm"])
    return GPTModel(config, spec, **gpt_model_kwargs(hf_config))


class MegatronLogProbForward(LogProbForward):
    """`LogProbForward` over a GPTModel: full logits, then the chosen positions (vocab padding dropped).

    Right padding needs no key mask: with a causal mask real tokens never see the padding after them.
    """

    def __init__(self, gpt: torch.nn.Module, vocab_size: int):
        super().__init__(gpt)
        self.vocab_size = vocab_size

    def forward(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, rows: Tensor,
                positions: Tensor, targets: Tensor, *, temperature: float = 1.0, chunk_tokens: int = 4096,
                with_entropy: bool = False, entropy_grad: bool = False,
                recompute: bool = False) -> tuple[Tensor, Tensor | None]:
        from slime.algorithms.losses import entropy_from_logits

        length = input_ids.shape[1]
        causal = torch.triu(torch.ones(length, length, device=input_ids.device), diagonal=1).bool()[None, None]
        logits = self.lm(input_ids=input_ids, position_ids=position_ids, attention_mask=causal)
        selected = logits[rows, positions][:, : self.vocab_size].float()
        z = selected / temperature
        lp = z.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(z, dim=-1)
        if not with_entropy:
            return lp, None
        return lp, entropy_from_logits(selected if entropy_grad else selected.detach(), temperature=temperature)


class _HFWriter:
    """Writes HF folders for a GPTModel: the HF config plus safetensors of the converted weights."""

    def __init__(self, hf_config: Any):
        self.hf_config = hf_config

    def save_pretrained(self, out_dir: str | os.PathLike, state_dict: dict[str, Tensor] | None = None) -> None:
        """The HF config and `state_dict` as written (the caller casts it and sets config.json's dtype:
        `checkpoint.write_model_folder`)."""
        from safetensors.torch import save_file

        if state_dict is None:
            raise ValueError("_HFWriter writes the converted weights it is given: pass state_dict")
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        self.hf_config.save_pretrained(out_dir)
        save_file({k: v.contiguous() for k, v in state_dict.items()}, str(Path(out_dir) / "model.safetensors"),
                  metadata={"format": "pt"})


class MegatronTrainer(TorchTrainer):
    """`TorchTrainer` over a megatron-core GPTModel built from the HF folder `model_path`."""

    def __init__(self, model_path: str | os.PathLike, config: TrainerConfig | None = None, *,
                 ref_model: str | os.PathLike | None = None, device: torch.device | str | None = None,
                 dp: DataParallel | None = None):
        require_megatron()
        from transformers import AutoConfig

        if dp is not None and dp.fsdp:
            raise ValueError("--train-backend megatron shards nothing yet: drop FSDP")
        config = config or TrainerConfig()
        cuda = torch.cuda.is_available()
        device = torch.device(device if device is not None else "cuda" if cuda else "cpu")
        if cuda and device.type != "cuda":
            raise ValueError("--train-backend megatron runs on the GPU where CUDA is available: megatron-core puts "
                             "rotary embeddings and RNG state on the current CUDA device; pass device='cuda'")
        apply_cpu_shims()
        init_model_parallel(seed=torch.initial_seed() % 2**31)
        self.hf_config = AutoConfig.from_pretrained(model_path)
        recompute = config.gradient_checkpointing
        config = TrainerConfig(**{**config.__dict__, "gradient_checkpointing": False,
                                  "recompute_logits": config.recompute_logits or recompute})
        model = self._load_gpt(model_path, recompute)
        ref = self._load_gpt(ref_model, False) if ref_model is not None else None
        super().__init__(model, config, ref_model=ref, device=device, dp=dp)

    def _load_gpt(self, path: str | os.PathLike, recompute: bool) -> torch.nn.Module:
        model = build_gpt_model(self.hf_config, recompute=recompute)
        self._load_into(model, ckpt.read_hf_weights(path))
        return model

    def _load_into(self, model: torch.nn.Module, weights: dict[str, Tensor]) -> None:
        result = model.load_state_dict(hf_to_megatron(weights, self.hf_config), strict=False)
        missing = [k for k in result.missing_keys if not k.endswith("_extra_state")]
        if missing or result.unexpected_keys:
            raise ValueError(f"HF weights do not fit the GPTModel: missing {missing[:5]}, "
                             f"unexpected {result.unexpected_keys[:5]}")

    def _wrap(self, model: torch.nn.Module) -> LogProbForward:
        return MegatronLogProbForward(model, self.hf_config.vocab_size)

    def _full_hf_state(self) -> dict[str, Tensor]:
        state = {k: v.detach().cpu() for k, v in self.model.state_dict().items() if isinstance(v, Tensor)}
        return megatron_to_hf(state, self.hf_config)

    def hf_named_tensors(self) -> Iterator[tuple[str, Tensor]]:
        """The live weights in HF names, layer by layer (what a tensor weight sync sends): engines load
        `model.layers.*`, never the GPTModel's `decoder.layers.*`."""
        state = {k: v.detach() for k, v in self.model.state_dict().items() if isinstance(v, Tensor)}
        yield from iter_megatron_to_hf(state, self.hf_config)

    def _hf_writer(self) -> _HFWriter:
        return _HFWriter(self.hf_config)

    def _load_hf_folder(self, model_dir: os.PathLike) -> None:
        self._load_into(self.model, ckpt.read_hf_weights(model_dir))

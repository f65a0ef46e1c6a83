"""HF (Qwen2/Qwen3/Llama/Mistral) <-> megatron-core GPTModel: config mapping and weight conversion.

Pure functions over configs and state dicts of *full* (TP-gathered) tensors; nothing here imports
megatron. The names are megatron-core's `GPTModel` names, for the local layer spec
(`get_gpt_layer_local_spec`: separate `input_layernorm` / `pre_mlp_layernorm`) or, with
`fused_norms=True`, the Transformer-Engine spec (norm weights folded into the following linear as
`linear_qkv.layer_norm_weight` / `linear_fc1.layer_norm_weight`).

Layouts (h hidden, d head dim, nq query heads, g = KV groups, r = nq / g):

    linear_qkv.weight [(nq + 2g) d, h]: for each group j in order, its r query heads, then its key
        head, then its value head:  [q_{jr} .. q_{jr+r-1}, k_j, v_j]  (d rows per head)
    linear_fc1.weight [2 f, h] = cat(gate_proj, up_proj)   (SwiGLU: silu(gate) * up)
    embedding / output_layer: vocab rows padded to a multiple of `vocab_multiple`; padding is zero
        going to Megatron and dropped going back (slime's converters do the same).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen2", "llama", "mistral")


def _get(config: Any, name: str, default: Any = None) -> Any:
    return config.get(name, default) if isinstance(config, Mapping) else getattr(config, name, default)


def head_dim(config: Any) -> int:
    return _get(config, "head_dim") or _get(config, "hidden_size") // _get(config, "num_attention_heads")


def rope_theta(config: Any) -> float:
    """RoPE base: `rope_theta` (transformers 4) or `rope_parameters["rope_theta"]` (transformers 5)."""
    params = _get(config, "rope_parameters") or {}
    return float(params.get("rope_theta") or _get(config, "rope_theta") or 10000.0)


def padded_vocab_size(vocab_size: int, vocab_multiple: int = 128, tp: int = 1) -> int:
    """Megatron's padding: the next multiple of vocab_multiple x tp (--make-vocab-size-divisible-by)."""
    step = vocab_multiple * tp
    return -(-vocab_size // step) * step


def transformer_config_kwargs(config: Any) -> dict[str, Any]:
    """megatron.core.transformer.TransformerConfig(**kwargs) for the HF config (architecture only:
    add precision, parallelism and fusion switches at the call site)."""
    model_type = _get(config, "model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"no Megatron mapping for model_type {model_type!r}; supported: {SUPPORTED_MODEL_TYPES}")
    if _get(config, "hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {_get(config, 'hidden_act')!r}: only SwiGLU (silu) models are mapped")
    qkv_bias = bool(_get(config, "attention_bias", model_type == "qwen2"))
    return {
        "num_layers": _get(config, "num_hidden_layers"),
        "hidden_size": _get(config, "hidden_size"),
        "ffn_hidden_size": _get(config, "intermediate_size"),
        "num_attention_heads": _get(config, "num_attention_heads"),
        "num_query_groups": _get(config, "num_key_value_heads") or _get(config, "num_attention_heads"),
        "kv_channels": head_dim(config),
        "normalization": "RMSNorm",
        "layernorm_epsilon": float(_get(config, "rms_norm_eps", 1e-6)),
        "gated_linear_unit": True,
        "activation_func": torch.nn.functional.silu,
        "add_bias_linear": False,
        "add_qkv_bias": qkv_bias,
        "qk_layernorm": model_type == "qwen3",
        "hidden_dropout": 0.0,
        "attention_dropout": float(_get(config, "attention_dropout", 0.0) or 0.0),
        "init_method_std": float(_get(config, "initializer_range", 0.02)),
    }


def gpt_model_kwargs(config: Any, *, vocab_multiple: int = 128, tp: int = 1) -> dict[str, Any]:
    """megatron.core.models.gpt.GPTModel(config, spec, **kwargs) arguments beyond config and spec."""
    return {
        "vocab_size": padded_vocab_size(_get(config, "vocab_size"), vocab_multiple, tp),
        "max_sequence_length": _get(config, "max_position_embeddings"),
        "position_embedding_type": "rope",
        "rotary_base": rope_theta(config),
        "share_embeddings_and_output_weights": bool(_get(config, "tie_word_embeddings", False)),
    }


# ---- QKV and gate/up fusion --------------------------------------------------------------------


def fuse_qkv(q: Tensor, k: Tensor, v: Tensor, num_heads: int, num_groups: int) -> Tensor:
    """HF q/k/v projections ([nq d, ...], [g d, ...], [g d, ...]) -> Megatron's grouped linear_qkv."""
    d = k.shape[0] // num_groups
    r = num_heads // num_groups
    rest = q.shape[1:]
    grouped = torch.cat([q.reshape(num_groups, r * d, *rest), k.reshape(num_groups, d, *rest),
                         v.reshape(num_groups, d, *rest)], dim=1)
    return grouped.reshape(-1, *rest)


def split_qkv(qkv: Tensor, num_heads: int, num_groups: int) -> tuple[Tensor, Tensor, Tensor]:
    """Inverse of `fuse_qkv`."""
    r = num_heads // num_groups
    d = qkv.shape[0] // (num_groups * (r + 2))
    rest = qkv.shape[1:]
    grouped = qkv.reshape(num_groups, (r + 2) * d, *rest)
    q, k, v = grouped.split([r * d, d, d], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def _pad_rows(weight: Tensor, rows: int) -> Tensor:
    if weight.shape[0] == rows:
        return weight
    pad = weight.new_zeros(rows - weight.shape[0], *weight.shape[1:])
    return torch.cat([weight, pad])


# ---- whole state dicts -------------------------------------------------------------------------

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# HF per-layer name -> Megatron per-layer name, for the one-to-one tensors.
_PER_LAYER = {
    "self_attn.o_proj.weight": "self_attention.linear_proj.weight",
    "self_attn.q_norm.weight": "self_attention.q_layernorm.weight",
    "self_attn.k_norm.weight": "self_attention.k_layernorm.weight",
    "mlp.down_proj.weight": "mlp.linear_fc2.weight",
}
_NORMS = {  # HF name -> (local spec name, TE spec name)
    "input_layernorm.weight": ("input_layernorm.weight", "self_attention.linear_qkv.layer_norm_weight"),
    "post_attention_layernorm.weight": ("pre_mlp_layernorm.weight", "mlp.linear_fc1.layer_norm_weight"),
}


def hf_to_megatron(state: Mapping[str, Tensor], config: Any, *, fused_norms: bool = False,
                   vocab_multiple: int = 128, tp: int = 1) -> dict[str, Tensor]:
    """A HF state dict (full tensors) as megatron-core GPTModel's state dict (full tensors)."""
    heads, groups = _get(config, "num_attention_heads"), _get(config, "num_key_value_heads")
    rows = padded_vocab_size(_get(config, "vocab_size"), vocab_multiple, tp)
    tied = bool(_get(config, "tie_word_embeddings", False))
    out: dict[str, Tensor] = {}
    layers: dict[int, dict[str, Tensor]] = {}
    for name, tensor in state.items():
        if name == "model.embed_tokens.weight":
            out["embedding.word_embeddings.weight"] = _pad_rows(tensor, rows)
        elif name == "lm_head.weight":
            if not tied:
                out["output_layer.weight"] = _pad_rows(tensor, rows)
        elif name == "model.norm.weight":
            out["decoder.final_layernorm.weight"] = tensor
        elif m := _LAYER.match(name):
            layers.setdefault(int(m.group(1)), {})[m.group(2)] = tensor
        elif name.endswith("rotary_emb.inv_freq"):
            continue  # a buffer Megatron recomputes
        else:
            raise ValueError(f"no Megatron name for HF weight {name!r}")
    for i, layer in sorted(layers.items()):
        prefix = f"decoder.layers.{i}."
        layer = dict(layer)
        for kind in ("weight", "bias"):
            parts = [layer.pop(f"self_attn.{p}_proj.{kind}", None) for p in "qkv"]
            if all(p is not None for p in parts):
                out[prefix + f"self_attention.linear_qkv.{kind}"] = fuse_qkv(*parts, heads, groups)
            elif any(p is not None for p in parts):
                raise ValueError(f"layer {i}: q/k/v {kind} must come together")
        gate, up = layer.pop("mlp.gate_proj.weight", None), layer.pop("mlp.up_proj.weight", None)
        if gate is not None and up is not None:
            out[prefix + "mlp.linear_fc1.weight"] = torch.cat([gate, up])
        for hf, names in _NORMS.items():
            if hf in layer:
                out[prefix + names[int(fused_norms)]] = layer.pop(hf)
        for hf, mg in _PER_LAYER.items():
            if hf in layer:
                out[prefix + mg] = layer.pop(hf)
        if layer:
            raise ValueError(f"layer {i}: no Megatron name for {sorted(layer)}")
    return out


def megatron_to_hf(state: Mapping[str, Tensor], config: Any) -> dict[str, Tensor]:
    """Inverse of `hf_to_megatron`: HF names, q/k/v and gate/up split, vocab padding dropped.

    Both norm spellings (local and TE spec) are accepted; Megatron's `_extra_state` entries are skipped.
    """
    heads, groups = _get(config, "num_attention_heads"), _get(config, "num_key_value_heads")
    vocab = _get(config, "vocab_size")
    back = {mg: hf for hf, mg in _PER_LAYER.items()}
    for hf, names in _NORMS.items():
        back.update({name: hf for name in names})
    out: dict[str, Tensor] = {}
    for name, tensor in state.items():
        if name.endswith("_extra_state"):
            continue
        if name == "embedding.word_embeddings.weight":
            out["model.embed_tokens.weight"] = tensor[:vocab]
        elif name == "output_layer.weight":
            out["lm_head.weight"] = tensor[:vocab]
        elif name == "decoder.final_layernorm.weight":
            out["model.norm.weight"] = tensor
        elif m := re.match(r"^decoder\.layers\.(\d+)\.(.+)$", name):
            prefix, rest = f"model.layers.{m.group(1)}.", m.group(2)
            if rest.startswith("self_attention.linear_qkv.") and rest.rsplit(".", 1)[1] in ("weight", "bias"):
                kind = rest.rsplit(".", 1)[1]
                for p, part in zip("qkv", split_qkv(tensor, heads, groups), strict=True):
                    out[prefix + f"self_attn.{p}_proj.{kind}"] = part
            elif rest == "mlp.linear_fc1.weight":
                gate, up = tensor.chunk(2)
                out[prefix + "mlp.gate_proj.weight"], out[prefix + "mlp.up_proj.weight"] = gate, up
            elif rest in back:
                out[prefix + back[rest]] = tensor
            else:
                raise ValueError(f"no HF name for Megatron weight {name!r}")
        else:
            raise ValueError(f"no HF name for Megatron weight {name!r}")
    return out


def iter_megatron_to_hf(state: Mapping[str, Tensor], config: Any) -> Iterator[tuple[str, Tensor]]:
    """`megatron_to_hf`, one decoder layer (or one top-level weight) at a time, in state-dict order.

    A weight sync streams these into buckets: converting layer by layer keeps the copies that splitting
    q/k/v makes down to one layer's worth instead of the whole model's."""
    group: dict[str, Tensor] = {}
    current = None
    for name, tensor in state.items():
        m = re.match(r"^decoder\.layers\.(\d+)\.", name)
        key = m.group(1) if m else name
        if group and key != current:
            yield from megatron_to_hf(group, config).items()
            group = {}
        group[name], current = tensor, key
    if group:
        yield from megatron_to_hf(group, config).items()

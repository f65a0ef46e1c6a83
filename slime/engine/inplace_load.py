"""Loading a HF folder's weights into the model an engine already serves, when the architecture matches.

A weight sync sends the same architecture every step. `from_pretrained` rebuilds the whole model for
it (config parsing, module construction, key mapping): for the tiny model that is about half of a
~70 ms disk weight sync. Copying the safetensors into the served parameters gives the same weights
(`copy_` casts to the served dtype, as `from_pretrained(dtype=...)` does) without the rebuild. Any
difference, in the config or in the tensor names or shapes, answers False and changes nothing: the
caller then loads the folder the general way.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoConfig

# Config entries that say nothing about the architecture (where and how the folder was written).
_BOOKKEEPING = ("_name_or_path", "transformers_version", "dtype", "torch_dtype")


def same_architecture(model: torch.nn.Module, model_path: str | os.PathLike) -> bool:
    """Whether the folder's config equals the served model's, bookkeeping entries aside."""
    if not (Path(model_path) / "config.json").is_file():
        return False
    theirs = AutoConfig.from_pretrained(model_path).to_dict()
    ours = model.config.to_dict()
    for key in _BOOKKEEPING:
        theirs.pop(key, None)
        ours.pop(key, None)
    return theirs == ours


def load_in_place(model: torch.nn.Module, model_path: str | os.PathLike) -> bool:
    """Copy the folder's safetensors weights into `model`; False (model untouched) when they do not fit.

    Every tensor is read before any is copied, so a broken file raises with the served weights intact.
    A tied `lm_head.weight` absent from the folder is the embedding the folder does hold. Buffers no
    folder holds (RoPE's inv_freq) stay as they are: they must be valid (not from `to_empty`).
    """
    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files or not same_architecture(model, model_path):
        return False
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        weights.update(load_file(file))
    served = model.state_dict()
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    if weights.keys() - served.keys() or served.keys() - weights.keys() - tied:
        return False
    if any(weights[name].shape != served[name].shape for name in weights):
        return False
    with torch.no_grad():
        for name, tensor in weights.items():
            served[name].copy_(tensor)
    return True

"""Full (unsharded) model and optimizer states of the trainer's `LogProbForward` root, and loading them back.

Checkpoints and HF exports hold full tensors whatever the world size or sharding, so any run can
resume any checkpoint. Gathering uses `torch.distributed.checkpoint.state_dict`: collective under
FSDP2 (every rank calls; rank 0 receives the full tensors on CPU, the others an empty dict), plain
reads otherwise. Optimizer state is keyed by parameter name (`lm.model.layers.0...`), not by index.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

PREFIX = "lm."  # LogProbForward keeps the HF model as `self.lm`
_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_model_state(root: torch.nn.Module) -> dict[str, torch.Tensor]:
    """HF-named full weights (on rank 0; {} on the other FSDP ranks)."""
    state = get_model_state_dict(root, options=_FULL)
    return {key.removeprefix(PREFIX): value for key, value in state.items()}


def full_optimizer_state(root: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's full state keyed by parameter name (on rank 0; {} on the other FSDP ranks)."""
    return get_optimizer_state_dict(root, optimizer, options=_FULL)


def load_full_model_state(root: torch.nn.Module, weights: dict[str, torch.Tensor], *, broadcast: bool) -> None:
    """Load HF-named full weights; `broadcast`: rank 0 passes them, the others pass {} and receive.

    A tied tensor saved once (lm_head.weight = embed_tokens.weight) is filled in under every name.
    """
    state = {PREFIX + key: value for key, value in weights.items()}
    if state:
        state = _with_tied_names(root, state)
    set_model_state_dict(root, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=broadcast))


def load_full_optimizer_state(root: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any], *,
                              broadcast: bool) -> None:
    """Load a by-name optimizer state; `broadcast`: rank 0 passes it, the others pass {} and receive."""
    set_optimizer_state_dict(root, optimizer, state,
                             options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=broadcast))


def _with_tied_names(root: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    names_of: dict[int, list[str]] = {}
    for name, param in root.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(param), []).append(name)
    out = dict(state)
    for names in names_of.values():
        present = [n for n in names if n in out]
        for name in names:
            if name not in out and present:
                out[name] = out[present[0]]
    missing = [n for names in names_of.values() for n in names if n not in out]
    if missing:
        raise ValueError(f"the checkpoint lacks weights for {missing[:5]}: it was saved from another model")
    return out

"""Model and optimizer states of the trainer's `LogProbForward` root: full (gathered) and sharded.

HF exports and checkpoints' model/ folders hold full tensors, gathered with
`torch.distributed.checkpoint.state_dict`: collective under FSDP2 (every rank calls; rank 0 receives
the full tensors on CPU, the others an empty dict), plain reads otherwise. Checkpoints' trainer/
state is sharded (`sharded_state`): each FSDP2 rank holds and writes its own shards, which DCP
reshards on load, so any world size resumes any checkpoint. Optimizer state is keyed by parameter
name (`lm.model.layers.0...`), not by index. Format-1 checkpoints hold full by-name optimizer states
(`load_full_optimizer_state`).
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
    """HF-named full weights (on rank 0; {} on the other FSDP ranks), a tied weight under its first name
    only (lm_head.weight = model.embed_tokens.weight: the embedding), as save_pretrained writes it:
    gathered copies of one parameter no longer share memory, so nothing downstream would see the tie."""
    state = get_model_state_dict(root, options=_FULL)
    for names in _tied_groups(root):
        for name in names[1:]:
            state.pop(name, None)
    return {key.removeprefix(PREFIX): value for key, value in state.items()}


def _tied_groups(root: torch.nn.Module) -> list[list[str]]:
    """Names of each parameter reachable under several names, in module order."""
    names_of: dict[int, list[str]] = {}
    for name, param in root.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(param), []).append(name)
    return [names for names in names_of.values() if len(names) > 1]


def full_optimizer_state(root: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's full state keyed by parameter name (on rank 0; {} on the other FSDP ranks)."""
    return get_optimizer_state_dict(root, optimizer, options=_FULL)


def sharded_state(root: torch.nn.Module, optimizer: torch.optim.Optimizer, *, with_weights: bool,
                  trainable_only: bool = False) -> dict[str, Any]:
    """What a checkpoint's trainer/ holds, as this rank's shards (DTensors under FSDP2, plain tensors
    otherwise): {"optimizer": state by parameter name} and, `with_weights`, {"model": the parameters}
    (the exact master weights; views of the live parameters, so loading into them loads the model).
    `trainable_only`: only the parameters that require grad (LoRA: the adapters; the base is frozen).

    Call it on every rank: under FSDP2 the optimizer state dict is built collectively. A fresh
    optimizer gets its state tensors allocated first (torch's zero-gradient step at lr 0).
    """
    state: dict[str, Any] = {"optimizer": get_optimizer_state_dict(root, optimizer)}
    if with_weights:
        state["model"] = {name: param.detach() for name, param in root.named_parameters()
                          if param.requires_grad or not trainable_only}
    return state


def load_sharded_state(root: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Put a filled `sharded_state` into the optimizer (its "model" part is already in place)."""
    set_optimizer_state_dict(root, optimizer, state["optimizer"])


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

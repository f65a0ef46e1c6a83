"""Masked reductions: how per-token values become one number (the loss aggregation modes)."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

Aggregation = Literal["token_mean", "sequence_mean", "constant"]


def masked_mean(x: Tensor, loss_mask: Tensor) -> Tensor:
    """Mean of x over masked tokens: sum(x m) / max(sum m, 1). x, loss_mask: [B, T]. Returns a scalar."""
    mask = loss_mask.bool()
    return torch.where(mask, x, 0.0).sum() / mask.sum().clamp(min=1)


def aggregate(
    x: Tensor, loss_mask: Tensor, mode: Aggregation = "token_mean", *, divisor: float | Tensor | None = None
) -> Tensor:
    """Reduce per-token values to one number.

    token_mean (DAPO):     sum_i sum_t x m / D,  D = divisor or total mask tokens;
    sequence_mean:         sum_i (sum_t x m / max(sum_t m, 1)) / S,  S = divisor or samples with tokens;
    constant (Dr.GRPO):    sum_i sum_t x m / C,  C = divisor (required, e.g. samples x max length).
    With micro-batches or data parallelism pass the global D or S so the pieces sum to the step loss.
    x, loss_mask: [B, T]. Returns a scalar.
    """
    mask = loss_mask.bool()
    summed = torch.where(mask, x, 0.0)
    if mode == "token_mean":
        return summed.sum() / (mask.sum().clamp(min=1) if divisor is None else divisor)
    if mode == "sequence_mean":
        tokens = mask.sum(dim=1)
        per_sample = summed.sum(dim=1) / tokens.clamp(min=1)
        return per_sample.sum() / ((tokens > 0).sum().clamp(min=1) if divisor is None else divisor)
    if mode == "constant":
        if divisor is None:
            raise ValueError(
                "aggregation 'constant' needs a divisor (Dr.GRPO: num samples x max response length)"
            )
        return summed.sum() / divisor
    raise ValueError(f"unknown aggregation {mode!r}: use token_mean, sequence_mean or constant")

"""slime's context-parallel helpers (`slime.backends.megatron_utils.cp_utils`) at context-parallel size 1.

With context parallelism each rank holds two chunks of every sequence; these helpers gather a rank's
per-token values into whole responses and cut whole responses back to a rank's chunks. Every trainer
here runs at context-parallel size 1 (`--context-parallel-size` other than 1 is refused), where a rank
holds whole sequences: gathering and slicing return their input, after checking it is one value per
response token. Per-token values are in slime's flat layout: one 1-D tensor (or list) per sample, the
sample's response tokens, or all samples' concatenated.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = [
    "all_gather_with_cp",
    "get_logits_and_tokens_offset_with_cp",
    "get_sum_of_sample_mean",
    "slice_log_prob_with_cp",
    "slice_with_cp",
]

CONTEXT_PARALLEL_SIZE = 1


def _check_response(values: Sequence[Any] | torch.Tensor, total_length: int, response_length: int,
                    caller: str) -> None:
    if len(values) != response_length or not 0 <= response_length <= total_length:
        raise ValueError(
            f"{caller}: got {len(values)} per-token values for a response of {response_length} tokens (sequence "
            f"of {total_length}): pass one value per response token of the sample"
        )


def get_logits_and_tokens_offset_with_cp(total_length: int, response_length: int) -> Any:
    """slime's chunk offsets of a sequence on this context-parallel rank: defined only for sizes above 1."""
    raise ValueError(
        "get_logits_and_tokens_offset_with_cp describes context-parallel chunks; this trainer runs at "
        "context-parallel size 1, where every rank holds whole sequences (no chunk offsets to compute)"
    )


def all_gather_with_cp(tensor: torch.Tensor, total_length: int, response_length: int) -> torch.Tensor:
    """A sample's per-token values over its whole response, gathered from the context-parallel ranks.

    At size 1 this rank already holds the whole response: `tensor` itself (first dimension the response).
    """
    _check_response(tensor, total_length, response_length, "all_gather_with_cp")
    return tensor


def slice_log_prob_with_cp(
    log_prob: list[float] | torch.Tensor, total_length: int, response_length: int
) -> list[float] | torch.Tensor:
    """This rank's share of a sample's per-response-token values: all of them at size 1."""
    _check_response(log_prob, total_length, response_length, "slice_log_prob_with_cp")
    return log_prob


def slice_with_cp(tokens: torch.Tensor, pad_value: int | float | Callable[..., torch.Tensor]) -> torch.Tensor:
    """This rank's chunks of a whole sequence (padded as `pad_value` says at larger sizes): all of it at size 1."""
    return tokens


def get_sum_of_sample_mean(
    total_lengths: Sequence[int],
    response_lengths: Sequence[int],
    loss_masks: Sequence[torch.Tensor],
    sample_denoms: Sequence[torch.Tensor] | torch.Tensor | None = None,
    calculate_per_token_loss: bool = False,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """A reducer of flat per-token values `x` (all samples' response tokens concatenated).

    Default: sum over samples of sum(x_i m_i) / max(d_i, 1), d_i = `sample_denoms[i]` or sum(m_i) (each
    sample's masked mean, summed). With `calculate_per_token_loss`: sum over samples of sum(x_i m_i).
    """
    lengths = [int(n) for n in response_lengths]
    if len(loss_masks) != len(lengths):
        raise ValueError(f"{len(loss_masks)} loss masks for {len(lengths)} samples: pass one per sample")
    denoms = [m.sum() for m in loss_masks] if sample_denoms is None else list(sample_denoms)

    def pieces(x: torch.Tensor) -> list[torch.Tensor]:
        if x.shape[0] != sum(lengths):
            raise ValueError(f"the reducer got {x.shape[0]} values for {sum(lengths)} response tokens")
        return [piece * mask for piece, mask in zip(x.split(lengths, dim=0), loss_masks, strict=True)]

    def sum_of_sample_mean(x: torch.Tensor) -> torch.Tensor:
        return sum((p.sum() / torch.clamp_min(torch.as_tensor(d), 1) for p, d in zip(pieces(x), denoms, strict=True)),
                   x.new_zeros(()))

    def sum_of_token(x: torch.Tensor) -> torch.Tensor:
        return sum((p.sum() for p in pieces(x)), x.new_zeros(()))

    return sum_of_token if calculate_per_token_loss else sum_of_sample_mean

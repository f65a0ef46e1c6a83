"""Packing `Sample`s into padded micro-batches under a token budget, and scattering results back.

Alignment (the one thing to get right): a causal LM's logits at position p predict the token at
position p + 1. A sample with P prompt tokens and R response tokens has its response at token
positions P .. P+R-1, so response token j (token position P + j) is scored by the logits at
position P + j - 1:

    tokens:        t_0 ... t_{P-1} | t_P      t_{P+1} ... t_{P+R-1}
    logits used:   ...   l_{P-1}   | l_P ...  l_{P+R-2}          (l_{P+R-1} predicts nothing we train on)
    log p(t_{P+j}) = log_softmax(l_{P+j-1} / T)[t_{P+j}]

Hence a response needs at least one prompt token before it. Sequences are right-padded, so real
tokens never attend to padding and their positions are 0 .. len-1 whatever the batch. Per-token
response tensors are [B, R] with R the longest response of the micro-batch: column j of row i is
response token j of that sample (left-aligned, zero beyond its response).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from slime.utils.types import Sample

PerTokenValues = Sequence[Sequence[float]]


@dataclass
class MicroBatch:
    """A padded micro-batch; row b is sample `indices[b]` of the list it was packed from.

    input_ids, attention_mask, position_ids: [B, L] long, right-padded (mask 0 on padding).
    logit_index: [B, R] long, the position whose logits score response token j (P_i - 1 + j);
        padding columns point at position 0 and are never read as valid.
    target_ids: [B, R] long, the id of response token j.
    response_mask: [B, R] bool, True for j < R_i.
    loss_mask: [B, R] float, the sample's loss mask (all ones when None), 0 on padding.
    rollout_log_probs: [B, R] float or None when any sample of the micro-batch lacks them.
    advantages: [B, R] float (0 on padding) or None when no advantages were given.
    """

    indices: list[int]
    input_ids: Tensor
    attention_mask: Tensor
    position_ids: Tensor
    logit_index: Tensor
    target_ids: Tensor
    response_mask: Tensor
    loss_mask: Tensor
    rollout_log_probs: Tensor | None
    advantages: Tensor | None

    @property
    def response_lengths(self) -> list[int]:
        return self.response_mask.sum(dim=1).tolist()

    def pad_response(self, values: PerTokenValues) -> Tensor:
        """Per-token values of the whole list (one entry per response token) as this batch's [B, R]."""
        return _pad_rows([values[i] for i in self.indices], self.response_mask.shape[1])

    def to(self, device: torch.device | str) -> MicroBatch:
        """The same micro-batch with every tensor on `device`."""
        moved = {
            name: value.to(device) if isinstance(value, Tensor) else value
            for name, value in self.__dict__.items()
        }
        return MicroBatch(**moved)


def plan_micro_batches(
    lengths: Sequence[int], max_tokens: int | None, max_samples: int | None = None
) -> list[list[int]]:
    """Group sample indices into micro-batches whose padded size stays within `max_tokens`.

    First-fit decreasing: visit samples longest first (ties by index, so the plan is deterministic)
    and put each in the first micro-batch that still fits it; the cost of a micro-batch is
    samples x its longest length, because that is what the padded forward pass computes. A sample
    longer than the budget gets a micro-batch of its own rather than being dropped or cut.
    `max_tokens=None` means no token budget; `max_samples` caps samples per micro-batch.
    Every index appears exactly once; rows within a micro-batch are longest first.
    """
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1 or None; got {max_tokens}")
    if max_samples is not None and max_samples < 1:
        raise ValueError(f"max_samples must be >= 1 or None; got {max_samples}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    for i in order:
        for members in bins:
            # Visiting longest first, the first member of a bin is its longest.
            fits_tokens = max_tokens is None or (len(members) + 1) * lengths[members[0]] <= max_tokens
            fits_samples = max_samples is None or len(members) < max_samples
            if fits_tokens and fits_samples:
                members.append(i)
                break
        else:
            bins.append([i])
    return bins


def scatter_back(micro_batches: Sequence[Sequence[int]], results: Sequence[Sequence], n: int) -> list:
    """Undo the packing: `results[k][b]` belongs to sample `micro_batches[k][b]`; returns a list of n."""
    out: list = [None] * n
    for indices, values in zip(micro_batches, results, strict=True):
        if len(indices) != len(values):
            raise ValueError(f"micro-batch has {len(indices)} samples but {len(values)} results")
        for i, value in zip(indices, values, strict=True):
            out[i] = value
    missing = [i for i, value in enumerate(out) if value is None]
    if missing:
        raise ValueError(f"no result for samples {missing}: the micro-batches do not cover the list")
    return out


def pack_micro_batch(
    samples: Sequence[Sample],
    indices: Sequence[int],
    *,
    advantages: PerTokenValues | None = None,
    pad_token_id: int = 0,
) -> MicroBatch:
    """Build the padded tensors of `samples[i] for i in indices` (see the module docstring for alignment).

    `advantages`, when given, holds one list per sample of the whole list, one value per response token.
    """
    rows = [samples[i] for i in indices]
    for sample in rows:
        sample.validate()
        if sample.response_length > 0 and sample.response_length == len(sample.tokens):
            raise ValueError(
                f"sample {sample.index} has no prompt token before its response: the first response "
                "token would have no position to be predicted from; keep at least one prompt token (BOS)"
            )
    seq_len = max((len(s.tokens) for s in rows), default=0)
    resp_len = max((s.response_length for s in rows), default=0)
    batch = len(rows)

    input_ids = torch.full((batch, seq_len), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(batch, seq_len, dtype=torch.long)
    logit_index = torch.zeros(batch, resp_len, dtype=torch.long)
    target_ids = torch.zeros(batch, resp_len, dtype=torch.long)
    response_mask = torch.zeros(batch, resp_len, dtype=torch.bool)
    for b, sample in enumerate(rows):
        n, r = len(sample.tokens), sample.response_length
        input_ids[b, :n] = torch.tensor(sample.tokens, dtype=torch.long)
        attention_mask[b, :n] = 1
        prompt_len = n - r
        logit_index[b, :r] = torch.arange(prompt_len - 1, n - 1)
        target_ids[b, :r] = input_ids[b, prompt_len:n]
        response_mask[b, :r] = True
    position_ids = torch.arange(seq_len, dtype=torch.long).expand(batch, seq_len).clone()

    masks = [s.loss_mask if s.loss_mask is not None else [1] * s.response_length for s in rows]
    loss_mask = _pad_rows(masks, resp_len)
    rollout = None
    if all(s.rollout_log_probs is not None for s in rows):
        rollout = _pad_rows([s.rollout_log_probs for s in rows], resp_len)
    adv = None
    if advantages is not None:
        for i, sample in zip(indices, rows, strict=True):
            if len(advantages[i]) != sample.response_length:
                raise ValueError(
                    f"sample {i} has {sample.response_length} response tokens but "
                    f"{len(advantages[i])} advantages: give one value per response token"
                )
        adv = _pad_rows([advantages[i] for i in indices], resp_len)
    return MicroBatch(
        indices=list(indices),
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        logit_index=logit_index,
        target_ids=target_ids,
        response_mask=response_mask,
        loss_mask=loss_mask,
        rollout_log_probs=rollout,
        advantages=adv,
    )


def _pad_rows(rows: PerTokenValues, width: int) -> Tensor:
    """Ragged per-token float rows as a zero-padded [len(rows), width] float32 tensor."""
    out = torch.zeros(len(rows), width, dtype=torch.float32)
    for b, row in enumerate(rows):
        if len(row) > width:
            raise ValueError(f"row {b} has {len(row)} values but the micro-batch is {width} wide")
        if len(row):
            out[b, : len(row)] = torch.as_tensor(row, dtype=torch.float32)
    return out

"""Response-token log-probs (and entropy) of a HF causal LM, as one module forward.

    lp_{i,j} = log_softmax(z_{i, P_i + j - 1})[t_{i, P_i + j}],  z = head(h) / T

(tanh-softcapped first when the config asks, as Gemma-2 does; see `slime.backends.batching` for the
alignment). The decoder runs once; the LM head only on the N response positions, `chunk_tokens` at
a time (recomputed in backward when `recompute`), so a [tokens, vocab] fp32 block of at most
`chunk_tokens` rows exists at a time.

Why a module (`LogProbForward`) rather than a function: FSDP2 unshards a module's parameters in
that module's forward hooks. The trainer shards every decoder layer and makes `LogProbForward` the
root, so the embeddings, final norm and (tied) LM head are gathered by the root's hooks even though
the HF model's own `forward` (which would compute logits at every position) is never called.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from slime.algorithms.losses import entropy_given_logsumexp
from slime.backends.batching import MicroBatch


class LogProbForward(torch.nn.Module):
    """Wraps a HF causal LM (`self.lm`); forward returns flat log-probs and entropies of chosen tokens."""

    def __init__(self, lm: torch.nn.Module):
        super().__init__()
        self.lm = lm

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor,
        rows: Tensor,
        positions: Tensor,
        targets: Tensor,
        *,
        temperature: float = 1.0,
        chunk_tokens: int = 4096,
        with_entropy: bool = False,
        entropy_grad: bool = False,
        recompute: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """[N] log-probs of `targets` predicted at hidden states (rows, positions), and [N] entropies."""
        hidden = self.lm.get_decoder()(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state
        selected = hidden[rows, positions]  # [N, H]
        head = self.lm.get_output_embeddings()
        softcap = getattr(self.lm.config, "final_logit_softcapping", None)

        def token_stats(h: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
            logits = head(h).float()
            if softcap:
                logits = torch.tanh(logits / softcap) * softcap
            z = logits / temperature
            lse = torch.logsumexp(z, dim=-1)  # shared by the log-probs and the entropy
            lp = z.gather(-1, target[:, None]).squeeze(-1) - lse
            if not with_entropy:
                return lp, lp.new_zeros(0)
            if entropy_grad:
                return lp, entropy_given_logsumexp(z, lse)
            with torch.no_grad():
                return lp, entropy_given_logsumexp(z, lse)

        lps, ents = [], []
        # At least one (possibly empty) chunk: the head always joins the graph, so every rank of a
        # sharded model runs the same forward and backward whatever its tokens.
        for start in range(0, max(selected.shape[0], 1), chunk_tokens):
            chunk = (selected[start : start + chunk_tokens], targets[start : start + chunk_tokens])
            if recompute and torch.is_grad_enabled():
                lp, ent = checkpoint(token_stats, *chunk, use_reentrant=False)
            else:
                lp, ent = token_stats(*chunk)
            lps.append(lp)
            ents.append(ent)
        return torch.cat(lps), (torch.cat(ents) if with_entropy else None)


def response_log_probs(
    model: torch.nn.Module,
    mb: MicroBatch,
    temperature: float = 1.0,
    *,
    chunk_tokens: int = 4096,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    recompute: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Log-prob of every response token, [B, R] fp32 (0 on padding), and optionally its entropy.

    `model` is a HF causal LM or a `LogProbForward` around one (the trainer passes the latter).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (slime requires --rollout-temperature > 0); got {temperature}")
    runner = model if isinstance(model, LogProbForward) else LogProbForward(model)
    mask = mb.response_mask
    rows = torch.arange(mask.shape[0], device=mask.device)[:, None].expand_as(mask)[mask]
    flat_lp, flat_ent = runner(
        mb.input_ids, mb.attention_mask, mb.position_ids, rows, mb.logit_index[mask], mb.target_ids[mask],
        temperature=temperature, chunk_tokens=chunk_tokens, with_entropy=with_entropy,
        entropy_grad=entropy_grad, recompute=recompute,
    )
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    log_probs = out.masked_scatter(mask, flat_lp)
    entropy = torch.zeros_like(out).masked_scatter(mask, flat_ent) if with_entropy else None
    return log_probs, entropy

"""slime's `--loss-type sft_loss`: masked negative log-likelihood of the response tokens.

Used for warm-start SFT stages and for any batch whose response tokens should simply be imitated;
advantages, old log-probs and the reference model play no part.
"""

from __future__ import annotations

from torch import Tensor

from slime.algorithms.aggregation import Aggregation, aggregate, masked_mean

LOSS_TYPES = ("policy_loss", "sft_loss")


def sft_loss(
    log_probs: Tensor,
    loss_mask: Tensor,
    *,
    aggregation: Aggregation = "sequence_mean",
    divisor: float | Tensor | None = None,
    entropy: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """loss = agg(l),  l_t = -lp_t m_t,  with the policy loss's aggregation modes and divisor.

    m multiplies in (slime's contract: a non-binary loss mask weights its tokens); agg is
    `slime.algorithms.aggregation.aggregate` (token_mean, sequence_mean, constant). Metrics
    (detached): sft_loss (= loss, a share of the step loss when `divisor` is global), nll (token
    mean of -lp over masked tokens) and, when given, entropy. log_probs, loss_mask: [B, T].
    """
    per_token = -log_probs * loss_mask
    loss = aggregate(per_token, loss_mask, aggregation, divisor=divisor)
    metrics = {"sft_loss": loss.detach(), "nll": masked_mean(-log_probs.detach(), loss_mask)}
    if entropy is not None:
        metrics["entropy"] = masked_mean(entropy.detach(), loss_mask)
    return loss, metrics

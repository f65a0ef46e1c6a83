"""KL estimators between the policy and the reference policy, per token, from sampled log-probs."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

KLEstimator = Literal["k1", "k2", "k3", "low_var_kl"]


def kl_estimate(
    log_probs: Tensor,
    ref_log_probs: Tensor,
    estimator: KLEstimator = "low_var_kl",
    *,
    old_log_probs: Tensor | None = None,
) -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from the sampled tokens' log-probs (Schulman's k1/k2/k3).

    x = lp - lp_ref;  k1 = x;  k2 = x^2 / 2;  k3 = exp(-x) - 1 + x;  low_var_kl = clamp(k3, -10, 10).
    Unbiased KL (DeepSeek-V3.2): pass `old_log_probs` to weight by exp(lp - lp_old), which corrects
    for the tokens having been sampled from pi_old rather than pi; gradients flow through the weight.
    log_probs, ref_log_probs, old_log_probs: [B, T]. Returns [B, T] (unmasked: aggregate with a mask).
    """
    x = log_probs - ref_log_probs
    if estimator == "k1":
        kl = x
    elif estimator == "k2":
        kl = x.square() / 2
    elif estimator in ("k3", "low_var_kl"):
        kl = torch.expm1(-x) + x
        if estimator == "low_var_kl":
            kl = kl.clamp(-10.0, 10.0)
    else:
        raise ValueError(f"unknown KL estimator {estimator!r}: use one of k1, k2, k3, low_var_kl")
    if old_log_probs is not None:
        kl = torch.exp(log_probs - old_log_probs) * kl
    return kl

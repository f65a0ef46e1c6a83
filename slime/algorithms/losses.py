"""Per-token policy and value losses, importance weights and entropy; `policy_loss` combines them.

Notation per response token t of sample i: lp current log-prob, lp_old log-prob before the update
(recomputed, or the engine's), lp_roll the engine's log-prob, m the loss mask, A the advantage.
All log-probs are computed on logits / rollout_temperature. Shapes: B samples, T tokens, V vocab.
Masked-out tokens never reach a loss or a metric, whatever values they hold.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor

from slime.algorithms.aggregation import Aggregation, aggregate, masked_mean
from slime.algorithms.kl import KLEstimator, kl_estimate

PolicyLossType = Literal["ppo", "gspo", "cispo"]

# Bound on |lp - lp_old| before exp: keeps a stale or garbage token from overflowing to inf.
MAX_LOG_RATIO = 20.0


class ClipResult(NamedTuple):
    """Per-token policy loss [B, T] and where clipping bound it ([B, T] bool each)."""

    loss: Tensor
    clipped: Tensor
    dual_clipped: Tensor


def _clipped_surrogate(
    log_ratio: Tensor,
    advantages: Tensor,
    eps_clip: float,
    eps_clip_high: float | None,
    eps_clip_c: float | None,
) -> ClipResult:
    """l = max(-rho A, -clip(rho, 1-eps, 1+eps_high) A), then min(l, -c A) where A < 0."""
    eps_high = eps_clip if eps_clip_high is None else eps_clip_high
    ratio = torch.exp(log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    unclipped = -ratio * advantages
    clipped = -ratio.clamp(1 - eps_clip, 1 + eps_high) * advantages
    loss = torch.maximum(unclipped, clipped)
    is_clipped = clipped > unclipped
    is_dual = torch.zeros_like(is_clipped)
    if eps_clip_c is not None:
        if eps_clip_c <= 1:
            raise ValueError(f"dual clip constant eps_clip_c must be > 1; got {eps_clip_c}")
        bound = -eps_clip_c * advantages
        is_dual = (advantages < 0) & (loss > bound)
        loss = torch.where(is_dual, bound, loss)
    return ClipResult(loss, is_clipped, is_dual)


def ppo_clip_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    *,
    eps_clip: float = 0.2,
    eps_clip_high: float | None = None,
    eps_clip_c: float | None = None,
) -> ClipResult:
    """PPO-clip per-token loss, with DAPO clip-higher (eps_high) and dual clip (c > 1).

    rho_t = exp(lp - lp_old);  l_t = max(-rho_t A_t, -clip(rho_t, 1-eps, 1+eps_high) A_t);
    dual clip, only where A_t < 0:  l_t = min(l_t, -c A_t).  eps_high defaults to eps.
    log_probs, old_log_probs, advantages: [B, T]. Clipped tokens carry no gradient.
    """
    return _clipped_surrogate(log_probs - old_log_probs, advantages, eps_clip, eps_clip_high, eps_clip_c)


def gspo_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    eps_clip: float = 3e-4,
    eps_clip_high: float | None = 4e-4,
    eps_clip_c: float | None = None,
) -> ClipResult:
    """GSPO per-token loss: the PPO clip applied to the length-normalised sequence ratio.

    d_i = sum_t (lp_old - lp) m / max(sum_t m, 1);  every token of i uses rho = exp(-d_i), same clip.
    Written in GSPO-token form, rho_t = sg(exp(-d_i)) exp(lp_t - sg(lp_t)): the same value, and the
    same gradient as exp(-d_i) when A is constant over the sample; with per-token A each token's
    gradient carries its own advantage. Defaults are the paper's clip range.
    log_probs, old_log_probs, advantages, loss_mask: [B, T].
    """
    mask = loss_mask.bool()
    seq_log_ratio = torch.where(mask, log_probs - old_log_probs, 0.0).sum(dim=1) / mask.sum(dim=1).clamp(
        min=1
    )
    log_ratio = seq_log_ratio.detach()[:, None] + log_probs - log_probs.detach()
    return _clipped_surrogate(log_ratio, advantages, eps_clip, eps_clip_high, eps_clip_c)


def cispo_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    *,
    eps_clip: float = 0.2,
    eps_clip_high: float | None = None,
) -> ClipResult:
    """CISPO per-token loss: a clipped, stop-gradient importance weight times A times the log-prob.

    l_t = -sg(clip(rho_t, 1-eps, 1+eps_high)) A_t lp_t: every token keeps a gradient (through lp only).
    log_probs, old_log_probs, advantages: [B, T]. `clipped` marks tokens whose weight was clipped.
    """
    eps_high = eps_clip if eps_clip_high is None else eps_clip_high
    ratio = torch.exp((log_probs - old_log_probs).detach().clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    weight = ratio.clamp(1 - eps_clip, 1 + eps_high)
    loss = -weight * advantages * log_probs
    return ClipResult(loss, weight != ratio, torch.zeros_like(ratio, dtype=torch.bool))


def tis_weights(
    old_log_probs: Tensor, rollout_log_probs: Tensor, *, clip_low: float = 0.0, clip_high: float = 2.0
) -> Tensor:
    """Truncated importance-sampling weights for the train/inference mismatch (no gradient).

    w_t = clamp(exp(lp_old - lp_roll), clip_low, clip_high); the policy loss becomes w_t l_t.
    old_log_probs, rollout_log_probs: [B, T]. Returns [B, T].
    """
    log_w = (old_log_probs - rollout_log_probs).detach().clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    return torch.exp(log_w).clamp(clip_low, clip_high)


def train_rollout_logprob_abs_diff(
    old_log_probs: Tensor, rollout_log_probs: Tensor, loss_mask: Tensor
) -> Tensor:
    """Train/rollout mismatch metric: mean(|lp_old - lp_roll|) over masked tokens. Inputs [B, T]; scalar."""
    return masked_mean((old_log_probs - rollout_log_probs).abs().detach(), loss_mask)


def entropy_from_logits(logits: Tensor, *, temperature: float = 1.0) -> Tensor:
    """Per-token entropy of the softmax over logits / temperature.

    H_t = logsumexp(z_t) - sum_v softmax(z_t)_v z_{t,v},  z = logits / temperature.
    logits: [B, T, V]. Returns [B, T] (unmasked: aggregate with the loss mask).
    """
    z = logits.float() / temperature
    return entropy_given_logsumexp(z, torch.logsumexp(z, dim=-1))


def entropy_given_logsumexp(z: Tensor, lse: Tensor) -> Tensor:
    """The same entropy from z = logits / temperature and its logsumexp, for a caller that already
    has it (log-probs need it too): H = lse - sum_v exp(z_v - lse) z_v."""
    return lse - (torch.exp(z - lse.unsqueeze(-1)) * z).sum(dim=-1)


@dataclass(frozen=True)
class PolicyLossConfig:
    """Everything `policy_loss` needs to know; field names follow slime's flags (--eps-clip, ...)."""

    loss_type: PolicyLossType = "ppo"
    eps_clip: float = 0.2
    eps_clip_high: float | None = None  # None: symmetric clip; DAPO uses 0.28
    eps_clip_c: float | None = None  # dual clip constant (> 1); ppo and gspo only
    aggregation: Aggregation = "token_mean"
    entropy_coef: float = 0.0
    kl_loss_coef: float = 0.0
    kl_loss_type: KLEstimator = "low_var_kl"
    use_unbiased_kl: bool = False
    use_tis: bool = False
    tis_clip_low: float = 0.0
    tis_clip: float = 2.0
    # slime's --custom-tis-function-path, loaded (see `apply_custom_tis`): replaces the built-in TIS weights
    # under use_tis or get_mismatch_metrics; it gets `tis_function_args` (the run's args) as `args`.
    custom_tis_function: Callable[..., Any] | None = None
    tis_function_args: Any = None
    get_mismatch_metrics: bool = False  # slime's --get-mismatch-metrics: report the mismatch, weight nothing


def tis_options(args: Any) -> dict[str, Any]:
    """The PolicyLossConfig fields for slime's TIS flags: --use-tis, --tis-clip(-low),
    --custom-tis-function-path (loaded here, so a bad path fails before any step) and --get-mismatch-metrics."""
    from slime.utils.misc import load_function

    path = getattr(args, "custom_tis_function_path", None)
    return {
        "use_tis": bool(getattr(args, "use_tis", False)),
        "tis_clip_low": getattr(args, "tis_clip_low", 0.0),
        "tis_clip": getattr(args, "tis_clip", 2.0),
        "custom_tis_function": load_function(path) if path else None,
        "tis_function_args": args,
        "get_mismatch_metrics": bool(getattr(args, "get_mismatch_metrics", False)),
    }


class CustomTISResult(NamedTuple):
    """What `apply_custom_tis` makes of a custom TIS function's return, back in the [B, T] layout."""

    pg: Tensor  # the per-token policy loss as the function returned it (weighted, or not)
    keep: Tensor  # its returned masks: 1 where a token still counts, 0 where it was rejected
    metrics: dict[str, Tensor]  # its metrics, token means over the original loss mask


def _flatten_rows(x: Tensor, lengths: Sequence[int]) -> Tensor:
    """Rows of [B, T] cut to their lengths and concatenated: slime's flat per-token layout."""
    return torch.cat([x[b, :n] for b, n in enumerate(lengths)]) if len(lengths) else x.new_zeros(0)


def apply_custom_tis(
    fn: Callable[..., Any],
    args: Any,
    pg: Tensor,
    old_log_probs: Tensor,
    rollout_log_probs: Tensor,
    loss_mask: Tensor,
    *,
    response_lengths: Sequence[int],
    total_lengths: Sequence[int],
) -> CustomTISResult:
    """Call a slime-style TIS function (--custom-tis-function-path) on one micro-batch and check its answer.

    slime's contract, at context-parallel size 1: `fn(args=, pg_loss=, train_log_probs=, rollout_log_probs=,
    loss_masks=, total_lengths=, response_lengths=)` with `pg_loss` the per-token loss of all samples
    concatenated (1-D, with gradient) and the other per-token inputs one 1-D tensor per sample (old and
    rollout log-probs detached); it returns `(pg_loss, masks, metrics)`: the loss in the same layout, one mask
    per sample (0 rejects a token: it leaves the loss's numerators, the divisors stay), and a dict of
    per-token metric tensors in the flat layout. pg, old_log_probs, rollout_log_probs, loss_mask: [B, T].
    """
    name = getattr(fn, "__qualname__", repr(fn))
    lengths = [int(n) for n in response_lengths]
    rows = range(len(lengths))
    flat_pg = _flatten_rows(pg, lengths)
    result = fn(
        args=args,
        pg_loss=flat_pg,
        train_log_probs=[old_log_probs[b, : lengths[b]].detach() for b in rows],
        rollout_log_probs=[rollout_log_probs[b, : lengths[b]].detach() for b in rows],
        loss_masks=[loss_mask[b, : lengths[b]] for b in rows],
        total_lengths=[int(n) for n in total_lengths],
        response_lengths=lengths,
    )
    if not isinstance(result, tuple | list) or len(result) != 3:
        raise TypeError(f"custom TIS function {name} returned {type(result).__name__}; slime's contract is a "
                        "tuple (pg_loss, modified_loss_masks, metrics)")
    new_pg, masks, metrics = result
    if not isinstance(new_pg, Tensor) or new_pg.shape != flat_pg.shape:
        raise ValueError(f"custom TIS function {name} returned pg_loss of shape "
                         f"{getattr(new_pg, 'shape', type(new_pg).__name__)}; expected {tuple(flat_pg.shape)} "
                         "(every sample's response tokens concatenated)")
    if len(masks) != len(lengths) or any(len(m) != n for m, n in zip(masks, lengths, strict=True)):
        raise ValueError(f"custom TIS function {name} must return one mask per sample, as long as its response "
                         f"({lengths}); got lengths {[len(m) for m in masks]}")
    valid = torch.arange(pg.shape[1], device=pg.device)[None, :] < torch.tensor(lengths, device=pg.device)[:, None]
    out_pg = pg.new_zeros(pg.shape).masked_scatter(valid, new_pg.to(pg.dtype))
    keep = loss_mask.new_zeros(loss_mask.shape)
    for b, m in enumerate(masks):
        keep[b, : lengths[b]] = torch.as_tensor(m, dtype=keep.dtype, device=keep.device)
    reported = {}
    for key, value in (metrics or {}).items():
        value = torch.as_tensor(value, device=pg.device)
        if value.numel() != flat_pg.numel():
            raise ValueError(f"custom TIS function {name}: metric {key!r} has {value.numel()} values; slime's "
                             f"contract is one per response token ({flat_pg.numel()}), concatenated over samples")
        spread = pg.new_zeros(pg.shape).masked_scatter(valid, value.detach().reshape(-1).to(pg.dtype))
        reported[key] = masked_mean(spread, loss_mask)
    return CustomTISResult(out_pg, keep, reported)


def policy_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    config: PolicyLossConfig,
    *,
    ref_log_probs: Tensor | None = None,
    rollout_log_probs: Tensor | None = None,
    entropy: Tensor | None = None,
    divisor: float | Tensor | None = None,
    response_lengths: Sequence[int] | None = None,
    total_lengths: Sequence[int] | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The actor's training loss and its metrics.

    loss = agg(w l) - entropy_coef agg(H) + kl_loss_coef agg(KL(lp, lp_ref)),  w = TIS weights (or 1),
    l = the per-token ppo / gspo / cispo loss.  All inputs [B, T]; `divisor` goes to `aggregate`.
    Metrics are detached scalars, token means over masked tokens whatever the aggregation:
    pg_loss, clipfrac, dual_clipfrac, approx_kl (mean lp_old - lp), and when their inputs are
    given entropy, kl_loss, tis_weight_mean, tis_clipfrac, train_rollout_logprob_abs_diff.
    With `config.custom_tis_function` (under use_tis or get_mismatch_metrics) that function replaces the
    built-in weights (`apply_custom_tis`; needs each row's `response_lengths` and `total_lengths`): l becomes
    what it returns, tokens its masks reject leave every term's numerator, and its metrics are added, with
    ois (mean rho). get_mismatch_metrics alone reports tis_weight_mean / tis_clipfrac without weighting.
    """
    c = config
    if c.loss_type == "ppo":
        terms = ppo_clip_loss(
            log_probs,
            old_log_probs,
            advantages,
            eps_clip=c.eps_clip,
            eps_clip_high=c.eps_clip_high,
            eps_clip_c=c.eps_clip_c,
        )
    elif c.loss_type == "gspo":
        terms = gspo_loss(
            log_probs,
            old_log_probs,
            advantages,
            loss_mask,
            eps_clip=c.eps_clip,
            eps_clip_high=c.eps_clip_high,
            eps_clip_c=c.eps_clip_c,
        )
    elif c.loss_type == "cispo":
        terms = cispo_loss(
            log_probs, old_log_probs, advantages, eps_clip=c.eps_clip, eps_clip_high=c.eps_clip_high
        )
    else:
        raise ValueError(f"unknown policy loss {c.loss_type!r}: use ppo, gspo or cispo")

    pg = terms.loss
    metrics: dict[str, Tensor] = {}
    if rollout_log_probs is not None:
        metrics["train_rollout_logprob_abs_diff"] = train_rollout_logprob_abs_diff(
            old_log_probs, rollout_log_probs, loss_mask
        )
    keep = None  # a custom TIS function's masks: tokens at 0 leave the numerators (slime's rejection)
    if c.use_tis or c.get_mismatch_metrics:
        if rollout_log_probs is None:
            raise ValueError("--use-tis / --get-mismatch-metrics need rollout_log_probs (the engine's log-probs "
                             "of the sampled tokens) on every sample")
        if c.custom_tis_function is not None:
            if response_lengths is None or total_lengths is None:
                raise ValueError("a custom TIS function needs each row's response_lengths and total_lengths")
            custom = apply_custom_tis(
                c.custom_tis_function, c.tis_function_args, pg, old_log_probs, rollout_log_probs, loss_mask,
                response_lengths=response_lengths, total_lengths=total_lengths,
            )
            pg, keep = custom.pg, custom.keep
            metrics.update(custom.metrics)
            ratio = torch.exp((log_probs - old_log_probs).detach().clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
            metrics["ois"] = masked_mean(ratio, loss_mask)
        else:
            w = tis_weights(old_log_probs, rollout_log_probs, clip_low=c.tis_clip_low, clip_high=c.tis_clip)
            raw = torch.exp((old_log_probs - rollout_log_probs).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
            metrics["tis_weight_mean"] = masked_mean(w, loss_mask)
            metrics["tis_clipfrac"] = masked_mean((w != raw).float(), loss_mask)
            if c.use_tis:
                pg = pg * w

    def kept(x: Tensor) -> Tensor:
        return x if keep is None else x * keep

    pg_loss = aggregate(kept(pg), loss_mask, c.aggregation, divisor=divisor)
    loss = pg_loss
    if c.entropy_coef != 0.0 or entropy is not None:
        if entropy is None:
            raise ValueError(
                "entropy_coef is set but no per-token entropy was given: see entropy_from_logits"
            )
        loss = loss - c.entropy_coef * aggregate(kept(entropy), loss_mask, c.aggregation, divisor=divisor)
        metrics["entropy"] = masked_mean(entropy.detach(), loss_mask)
    if c.kl_loss_coef != 0.0:
        if ref_log_probs is None:
            raise ValueError("kl_loss_coef is set but no ref_log_probs were given (run the reference model)")
        kl = kl_estimate(
            log_probs,
            ref_log_probs,
            c.kl_loss_type,
            old_log_probs=old_log_probs if c.use_unbiased_kl else None,
        )
        kl_loss = aggregate(kept(kl), loss_mask, c.aggregation, divisor=divisor)
        loss = loss + c.kl_loss_coef * kl_loss
        metrics["kl_loss"] = kl_loss.detach()

    metrics.update(
        pg_loss=pg_loss.detach(),
        clipfrac=masked_mean(terms.clipped.float(), loss_mask),
        dual_clipfrac=masked_mean(terms.dual_clipped.float(), loss_mask),
        approx_kl=masked_mean((old_log_probs - log_probs).detach(), loss_mask),
    )
    return loss, metrics


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    loss_mask: Tensor,
    *,
    value_clip: float | None = 0.2,
    aggregation: Aggregation = "token_mean",
    divisor: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Critic loss with PPO value clipping; returns (loss, {"value_clipfrac"}).

    V_c = V_old + clip(V - V_old, -value_clip, value_clip);  l_t = max((V_c - R)^2, (V - R)^2);
    loss = agg(l). value_clip=None gives plain (V - R)^2. All inputs [B, T].
    """
    unclipped = (values - returns).square()
    if value_clip is None:
        per_token, clipped = unclipped, torch.zeros_like(unclipped, dtype=torch.bool)
    else:
        v_clipped = old_values + (values - old_values).clamp(-value_clip, value_clip)
        clipped_sq = (v_clipped - returns).square()
        per_token, clipped = torch.maximum(unclipped, clipped_sq), clipped_sq > unclipped
    loss = aggregate(per_token, loss_mask, aggregation, divisor=divisor)
    return loss, {"value_clipfrac": masked_mean(clipped.float(), loss_mask)}


def opd_token_advantages(
    advantages: Sequence[float], student_log_probs: Sequence[float], teacher_log_probs: Sequence[float], coef: float
) -> tuple[list[float], list[float]]:
    """On-policy distillation (slime's --use-opd): each response token's advantage minus `coef` x its
    sampled reverse-KL term d = student log-prob - teacher log-prob of the token the student drew.

    Returns (the new advantages, d). All three inputs hold one value per response token; the loss mask
    applies later, in the loss, as for the estimator's own advantages."""
    if not len(advantages) == len(student_log_probs) == len(teacher_log_probs):
        raise ValueError(f"on-policy distillation needs one value per response token: {len(advantages)} advantages, "
                         f"{len(student_log_probs)} student and {len(teacher_log_probs)} teacher log-probs")
    gaps = [float(s) - float(t) for s, t in zip(student_log_probs, teacher_log_probs, strict=True)]
    return [float(a) - coef * d for a, d in zip(advantages, gaps, strict=True)], gaps

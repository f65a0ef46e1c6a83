"""Turn-level rewards and credit of the recovery method (docs/recovery-method.md), as pure functions.

Notation: a group of n rollouts of one task; rollout i has turns t = 1..T_i; Phi_k = Phi(s_k) is the
progress potential after k turns (Phi_0 on the initial DB). Lists are 0-based: `x[t-1]` is turn t.

    Phi(s)      = (1/N) sum_i phi_i(s)                         (0 without predicates)
    R_prog(t)   = Phi_t - Phi_{t-1}        after a write turn, else 0           ("difference")
                = eta Phi_t - Phi_{t-1}    on every turn                        ("potential")
    R_verify(t) = beta  iff (error at t-1 or R_prog(t-1) < 0) and turn t is a task-relevant read
    R_fmt(t)    = -1 on the first invalid format / call (the episode ends there only with awm_terminate_on_invalid_call)
    r(t)        = lambda R_prog(t) + gamma_v R_verify(t) + R_fmt(t) + 1[t = T] R_out
    G_t         = sum_{u >= t} eta^(u-t) r(u)

Advantages come out per turn (list of lists); plugin.py's `to_token_advantages` spreads them onto each
turn's model tokens with slime's `spread_turn_values` (turn t -> turn id t-1), so the loss mask stays 0/1.
This module is plain Python (no torch): the launcher reads `CreditConfig`'s defaults from here.

Estimator choice (why "carry + leave-one-out"): with the policy deciding when a rollout stops, the
naive per-index pool A_{i,t} = (G_{i,t} - mu_t) / sigma_t over the rollouts alive at t is biased:
its mean includes the sample itself (A = (n_t-1)/n_t x the leave-one-out advantage, a weight that
shrinks with the survivors n_t and is 0 at n_t = 1) and sigma_t depends on the sample's own return.
Keeping finished rollouts in every later pool with their final return ("carry", n_t = n for all t)
and subtracting the mean of the *other* rollouts gives a baseline b_{i,t} that depends only on
rollouts independent of i, so E[grad log pi(a_{i,t}) b_{i,t}] = 0 and the estimator is unbiased
for the turn-level policy gradient sum_t grad log pi(a_t) G_t (tested against a closed form in
tests/awm_grpo/test_credit.py). Scale: none (Dr.GRPO style) by default, or one std per group of the
episode returns G_{j,1} (the GRPO convention, with GRPO's O(1/n) std bias and nothing more); with
lambda = beta = 0, eta = 1, baseline "mean" and scale "group_std" it reduces exactly to GRPO.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

TurnValues = list[list[float]]


# ---- potential and per-turn rewards -------------------------------------------------------------
def potential(values: list[float], kinds: list[str] | None = None, *, binary_only: bool = False) -> float:
    """Phi(s) = mean_i phi_i(s); with `binary_only` a scalar predicate counts 1 only when met exactly.

    values: phi_i(s) in [0, 1] (from `awm.predicates.predicate.evaluate`); kinds: "binary" / "scalar" per value.
    """
    if not values:
        return 0.0
    kinds = kinds or ["binary"] * len(values)
    vals = [float(v >= 1.0 - 1e-9) if binary_only and k == "scalar" else float(v) for v, k in zip(values, kinds,
                                                                                                  strict=True)]
    return sum(vals) / len(vals)


def progress_rewards(phis: list[float], is_write: list[bool], *, form: Literal["difference", "potential"] = "difference",
                     eta: float = 1.0) -> list[float]:
    """R_prog per turn from Phi_0..Phi_T (len T+1) and the write label of each turn (len T).

    "difference": Phi_t - Phi_{t-1} after writes, 0 after reads (the plan). Under a discount this is
    not potential-based: sum_{u>=t} eta^(u-t) R_prog(u) = eta^(T-t) Phi_T - Phi_{t-1}
    + (1-eta) sum_{k=t..T-1} eta^(k-t) Phi_k, a bonus for lingering in high-Phi states.
    "potential": eta Phi_t - Phi_{t-1} on every turn (no write gate: gating would break the
    telescoping); the discounted sum is eta^(T-t+1) Phi_T - Phi_{t-1}: a state baseline plus a
    terminal partial-credit term (Ng, Harada & Russell 1999).
    """
    if len(phis) != len(is_write) + 1:
        raise ValueError(f"need Phi_0..Phi_T (T+1 = {len(is_write) + 1} values), got {len(phis)}")
    if form == "difference":
        return [phis[t] - phis[t - 1] if is_write[t - 1] else 0.0 for t in range(1, len(phis))]
    if form == "potential":
        return [eta * phis[t] - phis[t - 1] for t in range(1, len(phis))]
    raise ValueError(f"form must be 'difference' or 'potential', got {form!r}")


def verify_bonus(errors: list[bool], r_prog: list[float], relevant_read: list[bool], beta: float) -> list[float]:
    """R_verify(t) = beta iff (turn t-1 had an explicit error or R_prog(t-1) < 0) and turn t is a relevant read."""
    out = [0.0] * len(relevant_read)
    for t in range(1, len(relevant_read)):
        if (errors[t - 1] or r_prog[t - 1] < 0) and relevant_read[t]:
            out[t] = beta
    return out


def turn_rewards(r_prog: list[float], r_verify: list[float], format_error: list[bool], outcome: float, *,
                 lam: float = 1.0, gamma_v: float = 1.0) -> list[float]:
    """r(t) = lambda R_prog(t) + gamma_v R_verify(t) + R_fmt(t) + 1[t = T] R_out, R_fmt(t) = -1 on a format error."""
    T = len(r_prog)
    return [lam * r_prog[t] + gamma_v * r_verify[t] - float(format_error[t]) + (outcome if t == T - 1 else 0.0)
            for t in range(T)]


def returns_to_go(rewards: list[float], eta: float = 1.0) -> list[float]:
    """G_t = sum_{u >= t} eta^(u-t) r(u), computed backwards."""
    out, g = [0.0] * len(rewards), 0.0
    for t in range(len(rewards) - 1, -1, -1):
        g = rewards[t] + eta * g
        out[t] = g
    return out


# ---- group-relative turn-level advantages ---------------------------------------------------------
def _std(xs: list[float], ddof: int) -> float:
    if len(xs) <= ddof:
        return 0.0
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - ddof))


def naive_turn_advantages(returns: TurnValues, *, std_normalize: bool = True, eps: float = 1e-6) -> TurnValues:
    """MT-GRPO-style per-index pools (the biased baseline estimator, kept for comparison).

    A_{i,t} = (G_{i,t} - mu_t) / (sigma_t + eps), mu_t and (population) sigma_t over rollouts alive at t.
    """
    K = max((len(g) for g in returns), default=0)
    out = [[0.0] * len(g) for g in returns]
    for t in range(K):
        alive = [i for i, g in enumerate(returns) if len(g) > t]
        pool = [returns[i][t] for i in alive]
        mu, sigma = sum(pool) / len(pool), _std(pool, ddof=0)
        for i in alive:
            a = returns[i][t] - mu
            out[i][t] = a / (sigma + eps) if std_normalize else a
    return out


def carry_turn_advantages(returns: TurnValues, *, baseline: Literal["loo", "mean"] = "loo",
                          scale: Literal["none", "group_std"] = "none", eps: float = 1e-6) -> TurnValues:
    """Absorbing "carry" pools with a leave-one-out baseline (the shipped estimator; module docstring).

    Gt~_{j,t} = G_{j,t} if t <= T_j else G_{j,T_j} (a finished rollout keeps its final return);
    b_{i,t} = mean_{j != i} Gt~_{j,t} ("loo") or mean_j Gt~_{j,t} ("mean");
    A_{i,t} = (G_{i,t} - b_{i,t}) / s, s = 1 ("none") or std_j(G_{j,1}) + eps ("group_std", Bessel).
    A group of one rollout gets 0 (nothing to compare with), as in GRPO.
    """
    n = len(returns)
    out = [[0.0] * len(g) for g in returns]
    if n < 2:
        return out
    K = max(len(g) for g in returns)
    carried = [[g[min(t, len(g) - 1)] if g else 0.0 for t in range(K)] for g in returns]
    s = 1.0
    if scale == "group_std":
        s = _std([c[0] for c in carried], ddof=1) + eps
    elif scale != "none":
        raise ValueError(f"scale must be 'none' or 'group_std', got {scale!r}")
    for t in range(K):
        total = sum(c[t] for c in carried)
        for i, g in enumerate(returns):
            if t < len(g):
                b = (total - carried[i][t]) / (n - 1) if baseline == "loo" else total / n
                out[i][t] = (g[t] - b) / s
    return out


def trajectory_advantages(episode_rewards: list[float], num_turns: list[int], *, std_normalize: bool = True,
                          eps: float = 1e-6) -> TurnValues:
    """GRPO on one scalar per rollout, copied to every turn: A_i = (R_i - mean R) / (std R + eps) (Bessel)."""
    n = len(episode_rewards)
    mean = sum(episode_rewards) / n if n else 0.0
    sd = _std(episode_rewards, ddof=1)
    out = []
    for r, T in zip(episode_rewards, num_turns, strict=True):
        a = 0.0 if n < 2 else (r - mean) / (sd + eps) if std_normalize else r - mean
        out.append([a] * T)
    return out


# ---- one entry point for the trainer: config + per-episode signals --------------------------------
@dataclass
class EpisodeSignals:
    """What credit needs from one rollout; every per-turn list has length T (Phi has T + 1)."""

    phis: list[float]  # Phi_0..Phi_T
    is_write: list[bool]
    errors: list[bool]  # explicit tool error at turn t
    relevant_read: list[bool]  # a read whose tables meet the task's predicate tables
    format_error: list[bool]
    outcome: float  # R_out: 1 complete, 0.1 partial (graded verifiers only), 0 otherwise
    call_ok: list[bool | None] | None = None  # B2: True ok call, False error, None no call (final answer)
    relevant_tool: list[bool] | None = None  # B2: the tool touches a predicate table
    judge: list[float | None] | None = None  # B2+: the judge's helpfulness score per turn (None: no tool ran)


@dataclass(frozen=True)
class CreditConfig:
    """Method and ablation switches (docs/recovery-method.md, Baselines and ablations; Defaults)."""

    method: Literal["ours", "b1", "b2", "b2plus", "traj_agg"] = "ours"
    lam: float = 0.5
    beta: float = 0.05
    gamma_v: float = 1.0
    eta: float = 0.95
    progress_form: Literal["difference", "potential"] = "difference"
    estimator: Literal["carry", "naive"] = "carry"
    baseline: Literal["loo", "mean"] = "loo"
    scale: Literal["none", "group_std"] = "none"
    binary_only: bool = False  # ablation S1: Phi from binarised predicates (the rollout records both)
    max_turns: int = 15
    eps: float = 1e-6


def judge_step_rewards(scores: list[float | None], max_turns: int) -> list[float]:
    """B2+'s step reward on B2's scale: 0.1 (2 s - 1) / max_turns for a judged call, 0 without one.

    (P) The plan gives only the score's range; s = 1 maps to B2's +0.1 and s = 0 to its -0.1, so the
    two baselines' step rewards weigh the same against the outcome. Scores: awm_grpo.recovery.judge.
    """
    return [0.0 if s is None else 0.1 * (2.0 * s - 1.0) / max_turns for s in scores]


def action_step_rewards(call_ok: list[bool | None], relevant_tool: list[bool], max_turns: int) -> list[float]:
    """B2: +0.1 per successful relevant call, 0 per error or no call, -0.1 per irrelevant tool, each / max_turns."""
    out = []
    for ok, rel in zip(call_ok, relevant_tool, strict=True):
        v = 0.0 if ok is None or ok is False else 0.1 if rel else -0.1
        out.append(v / max_turns)
    return out


def episode_rewards(ep: EpisodeSignals, cfg: CreditConfig) -> list[float]:
    """Per-turn rewards r(t) of one rollout under `cfg.method`."""
    T = len(ep.is_write)
    if cfg.method == "b1":
        return turn_rewards([0.0] * T, [0.0] * T, ep.format_error, ep.outcome, lam=0.0)
    if cfg.method == "b2":
        if ep.call_ok is None or ep.relevant_tool is None:
            raise ValueError("method b2 needs call_ok and relevant_tool per turn")
        steps = action_step_rewards(ep.call_ok, ep.relevant_tool, cfg.max_turns)
        return turn_rewards(steps, [0.0] * T, ep.format_error, ep.outcome, lam=1.0)
    if cfg.method == "b2plus":
        if ep.judge is None or len(ep.judge) != T:
            raise ValueError("method b2plus needs a judge score per turn: set awm_judge_url and awm_judge_model "
                             "(AWM_JUDGE_URL, AWM_JUDGE_MODEL) so the rollout scores each call")
        steps = judge_step_rewards(ep.judge, cfg.max_turns)
        return turn_rewards(steps, [0.0] * T, ep.format_error, ep.outcome, lam=1.0)
    r_prog = progress_rewards(ep.phis, ep.is_write, form=cfg.progress_form, eta=cfg.eta)
    r_ver = verify_bonus(ep.errors, r_prog, ep.relevant_read, cfg.beta)
    return turn_rewards(r_prog, r_ver, ep.format_error, ep.outcome, lam=cfg.lam, gamma_v=cfg.gamma_v)


def group_turn_advantages(group: list[EpisodeSignals], cfg: CreditConfig) -> TurnValues:
    """Per-turn advantages of one group (valid rollouts only: drop infrastructure failures before)."""
    rewards = [episode_rewards(ep, cfg) for ep in group]
    if cfg.method in ("b1", "traj_agg"):  # trajectory-level credit: one scalar per rollout
        return trajectory_advantages([sum(r) for r in rewards], [len(r) for r in rewards], eps=cfg.eps)
    returns = [returns_to_go(r, cfg.eta) for r in rewards]
    if cfg.estimator == "naive":
        return naive_turn_advantages(returns, eps=cfg.eps)
    return carry_turn_advantages(returns, baseline=cfg.baseline, scale=cfg.scale, eps=cfg.eps)

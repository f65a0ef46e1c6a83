"""Advantage estimators: rewards (and values) in, per-sample or per-token advantages out.

Shapes: B samples, T response tokens (right-padded), K turns. `group_index` is a [B] integer tensor
naming the prompt group of each sample; groups need not be contiguous nor numbered from 0.
`valid` is a [B] bool mask: False marks an infrastructure failure, which gets advantage 0 and never
enters a group's mean or std. `loss_mask` is [B, T] (bool or 0/1): 1 on tokens the model generated.
Every function here returns targets, so none of them tracks gradients.
"""

from __future__ import annotations

import torch
from torch import Tensor

from slime.algorithms.aggregation import masked_mean


def _group_stats(rewards: Tensor, group_index: Tensor, valid: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample view of its group's valid count, mean and Bessel-corrected std.

    n_g = sum_{j in g} v_j;  mean_g = sum_{j in g} v_j r_j / n_g;
    std_g = sqrt(sum_{j in g} v_j (r_j - mean_g)^2 / (n_g - 1))  (0 when n_g < 2).
    rewards, group_index, valid: [B]. Returns three [B] tensors (n, mean, std of each sample's group).
    """
    if rewards.dim() != 1 or group_index.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_index must both be [B]; got {tuple(rewards.shape)} and {tuple(group_index.shape)}"
        )
    v = torch.ones_like(rewards) if valid is None else valid.to(rewards.dtype)
    _, inverse = torch.unique(group_index, return_inverse=True)
    num_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    zeros = rewards.new_zeros(num_groups)
    count = zeros.index_add(0, inverse, v)
    mean = zeros.index_add(0, inverse, v * rewards) / count.clamp(min=1)
    sq_dev = v * (rewards - mean[inverse]) ** 2
    var = zeros.index_add(0, inverse, sq_dev) / (count - 1).clamp(min=1)
    return count[inverse], mean[inverse], var.sqrt()[inverse]


@torch.no_grad()
def grpo_advantages(
    rewards: Tensor,
    group_index: Tensor,
    *,
    std_normalize: bool = True,
    eps: float = 1e-6,
    valid: Tensor | None = None,
) -> Tensor:
    """GRPO group-normalised advantage per sample (Dr.GRPO with `std_normalize=False`).

    A_i = (r_i - mean_g r) / (std_g r + eps), or A_i = r_i - mean_g r without std normalisation,
    with mean and (Bessel-corrected, torch's default) std over the valid samples of i's group.
    rewards: [B] float; group_index: [B] int; valid: [B] bool or None. Returns [B].
    """
    _, mean, std = _group_stats(rewards, group_index, valid)
    adv = rewards - mean
    if std_normalize:
        adv = adv / (std + eps)
    return adv if valid is None else torch.where(valid.bool(), adv, 0.0)


@torch.no_grad()
def rloo_advantages(rewards: Tensor, group_index: Tensor, *, valid: Tensor | None = None) -> Tensor:
    """RLOO advantage per sample: its reward minus the mean reward of the other samples of its group.

    A_i = r_i - (1/(n-1)) sum_{j in g, j != i} r_j = n/(n-1) (r_i - mean_g r), n = valid samples in g;
    a sample alone in its group (n = 1) gets 0.
    rewards: [B] float; group_index: [B] int; valid: [B] bool or None. Returns [B].
    """
    count, mean, _ = _group_stats(rewards, group_index, valid)
    adv = torch.where(count > 1, count / (count - 1).clamp(min=1) * (rewards - mean), 0.0)
    return adv if valid is None else torch.where(valid.bool(), adv, 0.0)


@torch.no_grad()
def drop_zero_variance_groups(
    rewards: Tensor, group_index: Tensor, *, valid: Tensor | None = None, atol: float = 0.0
) -> Tensor:
    """Dynamic-sampling filter (DAPO): which samples belong to a group whose rewards differ.

    keep_i = valid_i and (max_{j in g} r_j - min_{j in g} r_j > atol), over the valid samples of g;
    a group whose valid rewards are all equal has zero advantage everywhere and teaches nothing.
    rewards: [B] float; group_index: [B] int; valid: [B] bool or None. Returns a [B] bool keep mask;
    the rollout loop over-samples prompts until enough groups are kept.
    """
    v = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid.bool()
    _, inverse = torch.unique(group_index, return_inverse=True)
    num_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    hi = rewards.new_full((num_groups,), -torch.inf).scatter_reduce(
        0, inverse, torch.where(v, rewards, -torch.inf), "amax"
    )
    lo = rewards.new_full((num_groups,), torch.inf).scatter_reduce(
        0, inverse, torch.where(v, rewards, torch.inf), "amin"
    )
    spread = torch.nan_to_num(hi - lo, nan=0.0, posinf=0.0, neginf=0.0)
    return (spread > atol)[inverse] & v


@torch.no_grad()
def masked_whiten(values: Tensor, loss_mask: Tensor, *, eps: float = 1e-8) -> Tensor:
    """Whiten values over all masked tokens of the batch; masked-out tokens become 0.

    A <- (A - mu) / sqrt(var + eps), mu = mean_m A, var = mean_m (A - mu)^2 (population variance).
    values, loss_mask: [B, T]. Returns [B, T]. Statistics are local: under data parallelism the
    caller whitens the gathered batch so every rank sees the same mu and var.
    """
    mask = loss_mask.bool()
    mu = masked_mean(values, mask)
    var = masked_mean((values - mu) ** 2, mask)
    return torch.where(mask, (values - mu) / torch.sqrt(var + eps), 0.0)


@torch.no_grad()
def to_token_advantages(advantages: Tensor, loss_mask: Tensor) -> Tensor:
    """Put advantages on the tokens: a per-sample value on each masked token, or per-token values as is.

    A_{i,t} = A_i m_{i,t} for advantages [B];  A_{i,t} = A_{i,t} m_{i,t} for advantages [B, T].
    loss_mask: [B, T]. Returns [B, T] with 0 on masked-out tokens.
    """
    mask = loss_mask.bool()
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(mask)
    if advantages.shape != mask.shape:
        raise ValueError(
            f"advantages must be [B] or [B, T]={tuple(mask.shape)}; got {tuple(advantages.shape)}"
        )
    return torch.where(mask, advantages, 0.0)


@torch.no_grad()
def spread_turn_values(turn_values: Tensor, turn_ids: Tensor, loss_mask: Tensor) -> Tensor:
    """Spread per-turn values (e.g. per-turn advantages of the recovery method) onto each turn's tokens.

    out_{i,t} = turn_values[i, turn_ids[i,t]] m_{i,t}; masked tokens (and turn id < 0) get 0.
    turn_values: [B, K] float (padded past each sample's last turn); turn_ids: [B, T] int in [0, K)
    on model tokens (-1 allowed on masked tokens); loss_mask: [B, T]. Returns [B, T].
    """
    mask = loss_mask.bool() & (turn_ids >= 0)
    num_turns = turn_values.shape[1]
    if bool((torch.where(mask, turn_ids, 0) >= num_turns).any()):
        raise ValueError(
            f"turn_ids reach {int(turn_ids[mask].max())} but turn_values has only {num_turns} turns"
        )
    gathered = turn_values.gather(1, turn_ids.clamp(0, num_turns - 1).long())
    return torch.where(mask, gathered, 0.0)


@torch.no_grad()
def token_rewards(
    rewards: Tensor, loss_mask: Tensor, *, kl: Tensor | None = None, kl_coef: float = 0.0
) -> Tensor:
    """Per-token rewards: the outcome reward on the last masked token (or given per-token rewards), minus KL.

    rew_{i,t} = (r_i [t = last masked token of i] or r_{i,t}) m_{i,t} - kl_coef kl_{i,t} m_{i,t}.
    rewards: [B] outcome rewards, or [B, T] per-token rewards used as given (rewards on masked tokens
    are dropped); loss_mask: [B, T]; kl: [B, T] or None. Returns [B, T].
    """
    mask = loss_mask.bool()
    if rewards.dim() == 1:
        positions = torch.arange(mask.shape[1], device=mask.device)
        last = torch.where(mask, positions, -1).argmax(dim=1)
        rewards = torch.zeros(mask.shape, dtype=rewards.dtype, device=rewards.device).scatter(
            1, last[:, None], rewards[:, None]
        )
    rew = torch.where(mask, rewards, 0.0)
    if kl is not None:
        rew = rew - kl_coef * torch.where(mask, kl, 0.0)
    return rew


@torch.no_grad()
def discounted_returns(rewards: Tensor, loss_mask: Tensor, *, gamma: float = 1.0) -> Tensor:
    """Discounted return-to-go over the model tokens of each sample.

    G_t = rew_t + gamma G_{t'} with t' the next masked token after t (G = 0 past the last one):
    masked-out tokens (observations between two model turns) are skipped and do not cost a discount.
    rewards, loss_mask: [B, T]. Returns [B, T] with 0 on masked-out tokens.
    """
    mask = loss_mask.bool()
    out = torch.zeros_like(rewards)
    running = rewards.new_zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(mask[:, t], rewards[:, t] + gamma * running, running)
        out[:, t] = torch.where(mask[:, t], running, 0.0)
    return out


@torch.no_grad()
def reinforce_pp_advantages(
    rewards: Tensor,
    loss_mask: Tensor,
    *,
    kl: Tensor | None = None,
    kl_coef: float = 0.0,
    gamma: float = 1.0,
    valid: Tensor | None = None,
    whiten: bool = True,
) -> Tensor:
    """REINFORCE++ token advantage: discounted return of KL-penalised token rewards, then whitening.

    rew_t = -kl_coef kl_t m_t + r_i [t = last masked token];  A_t = sum_k gamma^k rew_{t+k};
    A <- whiten(A) over the masked tokens of valid samples.
    rewards: [B] or [B, T] (see `token_rewards`); loss_mask, kl: [B, T]; valid: [B] bool or None.
    Returns [B, T].
    """
    mask = loss_mask.bool() if valid is None else loss_mask.bool() & valid.bool()[:, None]
    adv = discounted_returns(token_rewards(rewards, mask, kl=kl, kl_coef=kl_coef), mask, gamma=gamma)
    return masked_whiten(adv, mask) if whiten else adv


@torch.no_grad()
def reinforce_pp_baseline_advantages(
    rewards: Tensor,
    group_index: Tensor,
    loss_mask: Tensor,
    *,
    kl: Tensor | None = None,
    kl_coef: float = 0.0,
    valid: Tensor | None = None,
    whiten: bool = True,
) -> Tensor:
    """REINFORCE++-baseline token advantage: group-mean baseline minus the KL term, then whitening.

    A_{i,t} = (r_i - mean_g r) - kl_coef kl_{i,t};  A <- whiten(A) over masked tokens of valid samples.
    rewards: [B]; group_index: [B] int; loss_mask, kl: [B, T]; valid: [B] bool or None. Returns [B, T].
    """
    mask = loss_mask.bool() if valid is None else loss_mask.bool() & valid.bool()[:, None]
    centred = grpo_advantages(rewards, group_index, std_normalize=False, valid=valid)
    adv = to_token_advantages(centred, mask)
    if kl is not None:
        adv = adv - kl_coef * torch.where(mask, kl, 0.0)
    return masked_whiten(adv, mask) if whiten else adv


@torch.no_grad()
def gae_advantages(
    rewards: Tensor, values: Tensor, loss_mask: Tensor, *, gamma: float = 1.0, lam: float = 0.95
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over model tokens; returns (advantages, returns).

    delta_t = rew_t + gamma V_{t'} - V_t;  A_t = delta_t + gamma lam A_{t'};  R_t = A_t + V_t,
    where t' is the next masked token after t (V_{t'} = A_{t'} = 0 past the last one: the episode ended).
    Masked-out tokens are skipped, not treated as terminal: an observation span between two model
    turns does not break the chain, costs no discount, and its values and rewards are ignored.
    rewards, values, loss_mask: [B, T] (build rewards with `token_rewards`). Returns two [B, T]
    tensors with 0 on masked-out tokens.
    """
    mask = loss_mask.bool()
    advantages = torch.zeros_like(rewards)
    next_value = rewards.new_zeros(rewards.shape[0])
    next_adv = rewards.new_zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv_t = delta + gamma * lam * next_adv
        on = mask[:, t]
        advantages[:, t] = torch.where(on, adv_t, 0.0)
        next_value = torch.where(on, values[:, t], next_value)
        next_adv = torch.where(on, adv_t, next_adv)
    returns = torch.where(mask, advantages + values, 0.0)
    return advantages, returns

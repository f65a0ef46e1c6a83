"""Advantage estimators against values computed by hand."""

import math

import pytest
import torch

from slime.algorithms.advantages import (
    discounted_returns,
    drop_zero_variance_groups,
    gae_advantages,
    grpo_advantages,
    masked_whiten,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
    spread_turn_values,
    to_token_advantages,
    token_rewards,
)

T = torch.tensor


def close(actual: torch.Tensor, expected, atol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


def test_grpo_groups_by_index_not_by_position():
    # groups 5 = samples {0, 2} rewards {1, 0}; group 2 = samples {1, 3} rewards {0, 1}.
    # each group: mean 0.5, unbiased std sqrt((0.25 + 0.25) / 1) = 0.70711 -> A = +-0.5 / 0.70711
    adv = grpo_advantages(T([1.0, 0.0, 0.0, 1.0]), T([5, 2, 5, 2]))
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    close(adv, [a, -a, -a, a])


def test_grpo_group_of_three():
    # rewards {1, 0, 0}: mean 1/3, deviations (2/3, -1/3, -1/3), var (4/9 + 1/9 + 1/9) / 2 = 1/3
    # std 0.57735 -> A = (1.1547, -0.57735, -0.57735)
    close(grpo_advantages(T([1.0, 0.0, 0.0]), T([0, 0, 0])), [1.1547, -0.57735, -0.57735], atol=1e-4)


def test_dr_grpo_drops_std():
    # same groups as above, A = r - 0.5
    close(
        grpo_advantages(T([1.0, 0.0, 0.0, 1.0]), T([5, 2, 5, 2]), std_normalize=False), [0.5, -0.5, -0.5, 0.5]
    )


def test_grpo_equal_rewards_give_zero():
    close(grpo_advantages(T([1.0, 1.0]), T([0, 0])), [0.0, 0.0])


def test_grpo_invalid_samples_excluded_from_statistics():
    # sample 2 crashed (reward 5 is garbage): stats over {1, 0, 0} as in the group-of-three test
    adv = grpo_advantages(T([1.0, 0.0, 5.0, 0.0]), T([0, 0, 0, 0]), valid=T([True, True, False, True]))
    close(adv, [1.1547, -0.57735, 0.0, -0.57735], atol=1e-4)
    # Dr.GRPO: mean 1/3 over the valid three
    adv = grpo_advantages(
        T([1.0, 0.0, 5.0, 0.0]), T([0, 0, 0, 0]), std_normalize=False, valid=T([True, True, False, True])
    )
    close(adv, [2 / 3, -1 / 3, 0.0, -1 / 3])


def test_rloo_leave_one_out():
    # group {1, 0, 0}: A0 = 1 - (0 + 0)/2 = 1; A1 = 0 - (1 + 0)/2 = -0.5; A2 = -0.5
    # group {2, 4}: A3 = 2 - 4 = -2; A4 = 4 - 2 = 2
    adv = rloo_advantages(T([1.0, 0.0, 0.0, 2.0, 4.0]), T([0, 0, 0, 1, 1]))
    close(adv, [1.0, -0.5, -0.5, -2.0, 2.0])


def test_rloo_invalid_and_singleton():
    # group 0: sample 1 invalid -> leave-one-out over {1, 0}: A0 = 1, A2 = -1; group 1 alone -> 0
    adv = rloo_advantages(T([1.0, 9.0, 0.0, 3.0]), T([0, 0, 0, 1]), valid=T([True, False, True, True]))
    close(adv, [1.0, 0.0, -1.0, 0.0])


def test_drop_zero_variance_groups():
    # groups: {1, 1} equal -> drop; {0, 1} differ -> keep; {0.5, 0.5} equal -> drop
    keep = drop_zero_variance_groups(T([1.0, 1.0, 0.0, 1.0, 0.5, 0.5]), T([0, 0, 3, 3, 9, 9]))
    assert keep.tolist() == [False, False, True, True, False, False]


def test_drop_zero_variance_ignores_invalid_samples():
    # group 0 differs only through the invalid sample -> drop; group 1 keeps its valid samples only
    keep = drop_zero_variance_groups(
        T([1.0, 0.0, 1.0, 0.0, 1.0, 7.0]),
        T([0, 0, 0, 1, 1, 1]),
        valid=T([True, False, True, True, True, False]),
    )
    assert keep.tolist() == [False, False, False, True, True, False]


def test_masked_whiten():
    # masked values {1, 2, 3}: mean 2, population var 2/3 -> (x - 2) / 0.8165; 99 is masked out
    out = masked_whiten(T([[1.0, 2.0, 99.0], [3.0, -50.0, 0.0]]), T([[1, 1, 0], [1, 0, 0]]))
    s = math.sqrt(2 / 3 + 1e-8)
    close(out, [[-1 / s, 0.0, 0.0], [1 / s, 0.0, 0.0]])


def test_to_token_advantages_per_sample_and_per_token():
    mask = T([[1, 1, 0], [0, 1, 1]])
    close(to_token_advantages(T([2.0, -1.0]), mask), [[2.0, 2.0, 0.0], [0.0, -1.0, -1.0]])
    per_token = T([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])
    close(to_token_advantages(per_token, mask), [[0.1, 0.2, 0.0], [0.0, 0.5, 0.6]])
    with pytest.raises(ValueError, match="advantages must be"):
        to_token_advantages(T([[1.0, 2.0]]), mask)


def test_spread_turn_values():
    # turn 0 = tokens 0-1, observation token 2 (turn id -1), turn 1 = tokens 3-4; token 5 is padding
    out = spread_turn_values(
        T([[0.5, -1.0], [2.0, 0.0]]),
        T([[0, 0, -1, 1, 1, 1], [0, 0, 0, 0, 0, 0]]),
        T([[1, 1, 0, 1, 1, 0], [1, 1, 1, 0, 0, 0]]),
    )
    close(out, [[0.5, 0.5, 0.0, -1.0, -1.0, 0.0], [2.0, 2.0, 2.0, 0.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match="turn_ids reach 2"):
        spread_turn_values(T([[0.5, -1.0]]), T([[0, 2]]), T([[1, 1]]))


def test_token_rewards_outcome_on_last_masked_token_minus_kl():
    # mask (1, 1, 0, 1, 0): last masked token is 3 -> rew = (-0.05, -0.1, 0, 1 - 0.15, 0)
    rew = token_rewards(T([1.0]), T([[1, 1, 0, 1, 0]]), kl=T([[0.1, 0.2, 5.0, 0.3, 7.0]]), kl_coef=0.5)
    close(rew, [[-0.05, -0.1, 0.0, 0.85, 0.0]])
    # per-token rewards are taken as given, except on masked tokens
    close(token_rewards(T([[0.2, 0.3, 0.4]]), T([[1, 0, 1]])), [[0.2, 0.0, 0.4]])


def test_discounted_returns_skip_masked_tokens():
    # G3 = 0.85; G1 = -0.1 + 0.9 * 0.85 = 0.665; G0 = -0.05 + 0.9 * 0.665 = 0.5485 (token 2 skipped)
    out = discounted_returns(T([[-0.05, -0.1, 0.0, 0.85, 0.0]]), T([[1, 1, 0, 1, 0]]), gamma=0.9)
    close(out, [[0.5485, 0.665, 0.0, 0.85, 0.0]])


def test_reinforce_pp():
    mask = T([[1, 1, 0, 1, 0]])
    kl = T([[0.1, 0.2, 5.0, 0.3, 7.0]])
    raw = reinforce_pp_advantages(T([1.0]), mask, kl=kl, kl_coef=0.5, gamma=0.9, whiten=False)
    close(raw, [[0.5485, 0.665, 0.0, 0.85, 0.0]])  # as in the two tests above
    # whitened: {0.5485, 0.665, 0.85} has mean 0.68783, population std 0.12414
    out = reinforce_pp_advantages(T([1.0]), mask, kl=kl, kl_coef=0.5, gamma=0.9)
    close(out, [[-1.1224, -0.1839, 0.0, 1.3063, 0.0]], atol=1e-3)


def test_reinforce_pp_invalid_sample_excluded():
    mask = T([[1, 1], [1, 1]])
    out = reinforce_pp_advantages(T([1.0, 100.0]), mask, valid=T([True, False]), whiten=False)
    close(out, [[1.0, 1.0], [0.0, 0.0]])


def test_reinforce_pp_baseline():
    # r - group mean = (0.5, -0.5, -0.5, 0.5); minus 1.0 * kl (0.1 everywhere); sample 3 token 1 masked
    mask = T([[1, 1], [1, 1], [1, 1], [1, 0]])
    kl = torch.full((4, 2), 0.1)
    raw = reinforce_pp_baseline_advantages(
        T([1.0, 0.0, 0.0, 1.0]), T([0, 0, 1, 1]), mask, kl=kl, kl_coef=1.0, whiten=False
    )
    close(raw, [[0.4, 0.4], [-0.6, -0.6], [-0.6, -0.6], [0.4, 0.0]])
    # whitening: seven tokens, three at 0.4 and four at -0.6 -> mean -1.2/7, var 0.24490, std 0.49487
    out = reinforce_pp_baseline_advantages(T([1.0, 0.0, 0.0, 1.0]), T([0, 0, 1, 1]), mask, kl=kl, kl_coef=1.0)
    hi, lo = (0.4 + 1.2 / 7) / 0.49487, (-0.6 + 1.2 / 7) / 0.49487
    close(out, [[hi, hi], [lo, lo], [lo, lo], [hi, 0.0]], atol=1e-4)


def test_gae_with_masked_observation_in_the_middle():
    # model tokens 0, 1, 3; token 2 is an observation (masked): its value 9 and reward 7 are ignored.
    # gamma 0.9, lam 0.5 (gamma lam = 0.45):
    # t3: delta = 1 + 0.9*0 - 0.8 = 0.2,        A3 = 0.2
    # t1: delta = 0 + 0.9*0.8 - 0.6 = 0.12,     A1 = 0.12 + 0.45*0.2 = 0.21
    # t0: delta = 0 + 0.9*0.6 - 0.5 = 0.04,     A0 = 0.04 + 0.45*0.21 = 0.1345
    # returns = A + V = (0.6345, 0.81, 0, 1.0)
    rewards = T([[0.0, 0.0, 7.0, 1.0]])
    values = T([[0.5, 0.6, 9.0, 0.8]])
    mask = T([[1, 1, 0, 1]])
    adv, ret = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.5)
    close(adv, [[0.1345, 0.21, 0.0, 0.2]])
    close(ret, [[0.6345, 0.81, 0.0, 1.0]])


def test_gae_gamma_lambda_one_is_return_minus_value():
    # A_t = sum of future rewards - V_t = 1 - V_t on every model token; padding at the end
    adv, ret = gae_advantages(
        T([[0.0, 0.0, 1.0, 0.0]]), T([[0.2, 0.4, 0.6, 5.0]]), T([[1, 1, 1, 0]]), lam=1.0
    )
    close(adv, [[0.8, 0.6, 0.4, 0.0]])
    close(ret, [[1.0, 1.0, 1.0, 0.0]])


def test_advantages_track_no_gradient():
    values = T([[0.5, 0.6]], requires_grad=True)
    adv, ret = gae_advantages(T([[0.0, 1.0]]), values, T([[1, 1]]))
    assert not adv.requires_grad and not ret.requires_grad

"""Losses, KL estimators, importance weights and aggregation against values computed by hand."""

import math

import pytest
import torch

from slime.algorithms.aggregation import aggregate, masked_mean
from slime.algorithms.kl import kl_estimate
from slime.algorithms.losses import (
    PolicyLossConfig,
    cispo_loss,
    entropy_from_logits,
    entropy_given_logsumexp,
    gspo_loss,
    policy_loss,
    ppo_clip_loss,
    tis_weights,
    train_rollout_logprob_abs_diff,
    value_loss,
)

T = torch.tensor
LN = math.log


def close(actual: torch.Tensor, expected, atol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


# The PPO example: lp_old = 0, ratios (1.5, 0.5, 1.1, 0.5), A = (1, 1, -1, -1), eps 0.2, eps_high 0.28.
#   t0: max(-1.5, -1.28) = -1.28  clipped        t1: max(-0.5, -0.8) = -0.5  unclipped
#   t2: max(1.1, 1.1)    =  1.1   unclipped      t3: max(0.5, 0.8)   =  0.8  clipped
RATIOS = [1.5, 0.5, 1.1, 0.5]
ADV = T([[1.0, 1.0, -1.0, -1.0]])


def ppo_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return T([[LN(r) for r in RATIOS]], requires_grad=True), torch.zeros(1, 4)


# ---- aggregation ----------------------------------------------------------------------------------


def test_aggregation_modes():
    x = T([[1.0, 2.0, 3.0], [4.0, 50.0, 60.0]])
    mask = T([[1, 1, 1], [1, 0, 0]])
    close(aggregate(x, mask, "token_mean"), 10 / 4)  # (1 + 2 + 3 + 4) / 4 tokens
    close(aggregate(x, mask, "sequence_mean"), (2.0 + 4.0) / 2)  # sample means 2 and 4
    close(aggregate(x, mask, "constant", divisor=8), 10 / 8)  # Dr.GRPO: 2 samples x 4 max tokens
    close(aggregate(x, mask, "token_mean", divisor=20), 10 / 20)  # a global token count
    with pytest.raises(ValueError, match="needs a divisor"):
        aggregate(x, mask, "constant")
    with pytest.raises(ValueError, match="unknown aggregation"):
        aggregate(x, mask, "prompt_mean")  # type: ignore[arg-type]


def test_sequence_mean_ignores_samples_without_tokens():
    # sample 1 has no loss tokens: the mean is over sample 0 only -> (1 + 3) / 2 = 2
    close(aggregate(T([[1.0, 3.0], [7.0, 7.0]]), T([[1, 1], [0, 0]]), "sequence_mean"), 2.0)


def test_masked_mean_ignores_inf_and_nan_on_masked_tokens():
    close(masked_mean(T([[1.0, math.inf], [3.0, math.nan]]), T([[1, 0], [1, 0]])), 2.0)


# ---- PPO clip ------------------------------------------------------------------------------------


def test_ppo_clip_higher_values_and_zero_gradient_on_clipped_tokens():
    lp, old = ppo_inputs()
    out = ppo_clip_loss(lp, old, ADV, eps_clip=0.2, eps_clip_high=0.28)
    close(out.loss, [[-1.28, -0.5, 1.1, 0.8]])
    assert out.clipped.tolist() == [[True, False, False, True]]
    out.loss.sum().backward()
    # d(-rho A)/d lp = -rho A on unclipped tokens: t1 -0.5, t2 +1.1; clipped tokens get 0
    close(lp.grad, [[0.0, -0.5, 1.1, 0.0]])


def test_ppo_symmetric_clip_by_default():
    # ratio 1.25, A = 1: clipped to 1.2 -> loss -1.2
    out = ppo_clip_loss(T([[LN(1.25)]]), T([[0.0]]), T([[1.0]]), eps_clip=0.2)
    close(out.loss, [[-1.2]])


def test_dual_clip_bounds_negative_advantage_tokens():
    # c = 3: ratio 5, A = -1 -> min(max(5, 1.28), 3) = 3, no gradient;
    # ratio 2, A = -1 -> 2 (under the bound); ratio 5, A = +1 -> max(-5, -1.28) = -1.28 (A > 0 untouched)
    lp = T([[LN(5.0), LN(2.0), LN(5.0)]], requires_grad=True)
    out = ppo_clip_loss(lp, torch.zeros(1, 3), T([[-1.0, -1.0, 1.0]]), eps_clip_high=0.28, eps_clip_c=3.0)
    close(out.loss, [[3.0, 2.0, -1.28]])
    assert out.dual_clipped.tolist() == [[True, False, False]]
    out.loss.sum().backward()
    close(lp.grad, [[0.0, 2.0, 0.0]])  # t1: -rho A = 2


def test_dual_clip_loss_never_exceeds_c_times_abs_advantage():
    lp = torch.linspace(-5, 15, 50)[None]
    out = ppo_clip_loss(lp, torch.zeros_like(lp), torch.full_like(lp, -2.0), eps_clip_c=3.0)
    assert float(out.loss.max()) <= 3.0 * 2.0 + 1e-6


def test_dual_clip_constant_must_exceed_one():
    with pytest.raises(ValueError, match="must be > 1"):
        ppo_clip_loss(T([[0.0]]), T([[0.0]]), T([[-1.0]]), eps_clip_c=1.0)


# ---- GSPO ----------------------------------------------------------------------------------------


def test_gspo_uses_length_normalised_sequence_ratio():
    # d = -(0.1 + 0.3) / 2 = -0.2 -> rho = exp(0.2) = 1.2214 on both tokens (token 2 masked, lp 9 ignored)
    lp = T([[0.1, 0.3, 9.0]])
    out = gspo_loss(
        lp, torch.zeros(1, 3), T([[1.0, 1.0, 1.0]]), T([[1, 1, 0]]), eps_clip=0.5, eps_clip_high=0.5
    )
    close(out.loss[:, :2], [[-math.exp(0.2), -math.exp(0.2)]])
    # with the paper's tiny range 1.2214 is far past 1 + 4e-4: clipped to -1.0004
    out = gspo_loss(lp, torch.zeros(1, 3), T([[1.0, 1.0, 1.0]]), T([[1, 1, 0]]))
    close(out.loss[:, :2], [[-1.0004, -1.0004]])
    assert out.clipped[:, :2].all()


def test_gspo_gradient_matches_sequence_ratio_for_constant_advantage():
    mask = T([[1, 1, 1], [1, 1, 0]])
    old = T([[-1.0, -2.0, -0.5], [-0.3, -0.7, 0.0]])
    adv = T([[0.7, 0.7, 0.7], [-1.2, -1.2, -1.2]])
    start = old + T([[0.05, -0.02, 0.01], [0.03, 0.04, 0.0]])
    lp_a = start.clone().requires_grad_(True)
    aggregate(gspo_loss(lp_a, old, adv, mask, eps_clip=1.0, eps_clip_high=1.0).loss, mask).backward()
    # the plain form: every token's loss is -exp(mean_t (lp - lp_old)) A_i
    lp_b = start.clone().requires_grad_(True)
    seq_ratio = torch.exp(((lp_b - old) * mask).sum(1) / mask.sum(1))
    aggregate(-seq_ratio[:, None] * adv, mask).backward()
    close(lp_a.grad, lp_b.grad)


# ---- CISPO ---------------------------------------------------------------------------------------


def test_cispo_value_and_gradient_only_through_log_prob():
    # t0: ratio 1.5 -> weight clipped to 1.28; loss = -1.28 * 2 * ln 1.5 = -1.03799; d/dlp = -1.28 * 2
    # t1: ratio 1.1 -> weight 1.1; loss = -1.1 * 2 * ln 1.1 = -0.20968; d/dlp = -2.2 (no d(weight)/dlp)
    lp = T([[LN(1.5), LN(1.1)]], requires_grad=True)
    out = cispo_loss(lp, torch.zeros(1, 2), T([[2.0, 2.0]]), eps_clip=0.2, eps_clip_high=0.28)
    close(out.loss, [[-1.28 * 2 * LN(1.5), -1.1 * 2 * LN(1.1)]])
    assert out.clipped.tolist() == [[True, False]]
    out.loss.sum().backward()
    close(lp.grad, [[-2.56, -2.2]])  # a clipped token still has a gradient


# ---- KL, TIS, entropy, mismatch ------------------------------------------------------------------


def test_kl_estimators():
    lp, ref = T([[0.5, -0.5]]), T([[0.0, 0.0]])
    close(kl_estimate(lp, ref, "k1"), [[0.5, -0.5]])
    close(kl_estimate(lp, ref, "k2"), [[0.125, 0.125]])  # x^2 / 2
    # exp(-0.5) - 1 + 0.5 = 0.10653;  exp(0.5) - 1 - 0.5 = 0.14872
    close(kl_estimate(lp, ref, "k3"), [[0.10653, 0.14872]])
    close(kl_estimate(lp, ref, "low_var_kl"), [[0.10653, 0.14872]])
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_estimate(lp, ref, "k4")  # type: ignore[arg-type]


def test_low_var_kl_is_clamped_and_k3_is_not():
    # x = -20: k3 = exp(20) - 21 = 4.85e8; low_var_kl clamps to 10
    lp, ref = T([[-20.0]]), T([[0.0]])
    close(kl_estimate(lp, ref, "low_var_kl"), [[10.0]])
    assert float(kl_estimate(lp, ref, "k3")) > 1e8


def test_unbiased_kl_weights_by_policy_ratio():
    # k1 = 0.5 times exp(0.5 - 0) = 1.64872 -> 0.82436
    close(kl_estimate(T([[0.5]]), T([[0.0]]), "k1", old_log_probs=T([[0.0]])), [[0.82436]])


def test_tis_weights_are_truncated():
    # exp(ln 3) = 3 -> 2 (upper clip); exp(ln 0.5) = 0.5; exp(0) = 1; with clip_low 0.8: 0.5 -> 0.8
    old, roll = T([[LN(3.0), LN(0.5), 0.0]]), torch.zeros(1, 3)
    close(tis_weights(old, roll), [[2.0, 0.5, 1.0]])
    close(tis_weights(old, roll, clip_low=0.8), [[2.0, 0.8, 1.0]])


def test_train_rollout_mismatch_metric():
    # (|0.1 - 0| + |0.2 - 0.5|) / 2 = 0.2; token 2 masked
    close(train_rollout_logprob_abs_diff(T([[0.1, 0.2, 9.0]]), T([[0.0, 0.5, 0.0]]), T([[1, 1, 0]])), 0.2)


def test_entropy_from_logits():
    # uniform over 2: ln 2; probs (1/4, 3/4): 1/4 ln 4 + 3/4 ln(4/3) = 0.34657 + 0.21576 = 0.56233
    logits = T([[[0.0, 0.0], [0.0, LN(3.0)]]])
    close(entropy_from_logits(logits), [[LN(2.0), 0.56233]])
    # temperature 2 on doubled logits gives the same distributions
    close(entropy_from_logits(2 * logits, temperature=2.0), [[LN(2.0), 0.56233]])


def test_entropy_given_logsumexp_has_the_value_and_gradient_of_minus_sum_p_log_p():
    torch.manual_seed(0)
    z = (torch.randn(5, 37) * 2).requires_grad_(True)
    got = entropy_given_logsumexp(z, torch.logsumexp(z, dim=-1))
    (g_got,) = torch.autograd.grad(got.sum(), z)
    p = torch.softmax(z, dim=-1)
    want = -(p * torch.log_softmax(z, dim=-1)).sum(dim=-1)
    (g_want,) = torch.autograd.grad(want.sum(), z)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(g_got, g_want, atol=1e-5, rtol=0)


# ---- policy_loss and value_loss ------------------------------------------------------------------


def test_policy_loss_ppo_hand_example():
    lp, old = ppo_inputs()
    loss, metrics = policy_loss(lp, old, ADV, torch.ones(1, 4), PolicyLossConfig(eps_clip_high=0.28))
    close(loss, (-1.28 - 0.5 + 1.1 + 0.8) / 4)  # token mean = 0.03
    close(metrics["clipfrac"], 0.5)
    close(metrics["dual_clipfrac"], 0.0)
    # approx_kl = mean(lp_old - lp) = -(ln 1.5 + ln 0.5 + ln 1.1 + ln 0.5) / 4 = 0.22138
    close(metrics["approx_kl"], 0.22138)


def test_policy_loss_with_tis_entropy_and_kl():
    # rollout log-probs give TIS weights exp(lp_old - lp_roll) = (3 -> 2, 0.5, 1, 1)
    lp, old = ppo_inputs()
    roll = T([[-LN(3.0), LN(2.0), 0.0, 0.0]])
    config = PolicyLossConfig(
        eps_clip_high=0.28, use_tis=True, entropy_coef=0.01, kl_loss_coef=0.1, kl_loss_type="k1"
    )
    loss, metrics = policy_loss(
        lp, old, ADV, torch.ones(1, 4), config,
        ref_log_probs=lp.detach() - 0.5, rollout_log_probs=roll, entropy=torch.ones(1, 4),
    )  # fmt: skip
    # pg = (-1.28*2 - 0.5*0.5 + 1.1 + 0.8) / 4 = -0.2275; entropy -0.01 * 1; kl +0.1 * 0.5
    close(metrics["pg_loss"], -0.2275)
    close(loss, -0.2275 - 0.01 + 0.05)
    close(metrics["tis_weight_mean"], (2 + 0.5 + 1 + 1) / 4)
    close(metrics["tis_clipfrac"], 0.25)
    close(metrics["kl_loss"], 0.5)
    close(metrics["entropy"], 1.0)
    close(metrics["train_rollout_logprob_abs_diff"], (LN(3.0) + LN(2.0)) / 4)  # 0.44794


@pytest.mark.parametrize("loss_type", ["ppo", "gspo", "cispo"])
@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean", "constant"])
def test_masked_tokens_never_change_the_loss(loss_type, aggregation):
    gen = torch.Generator().manual_seed(0)
    mask = T([[1, 1, 0, 1], [1, 0, 0, 0]])
    lp = -torch.rand(2, 4, generator=gen)
    old, ref, roll = (lp + 0.1 * torch.randn(2, 4, generator=gen) for _ in range(3))
    adv, ent = torch.randn(2, 4, generator=gen), torch.rand(2, 4, generator=gen)
    config = PolicyLossConfig(
        loss_type=loss_type, eps_clip_c=None if loss_type == "cispo" else 3.0, aggregation=aggregation,
        entropy_coef=0.01, kl_loss_coef=0.1, use_tis=True, use_unbiased_kl=True,
    )  # fmt: skip

    def run(noise: float) -> tuple[torch.Tensor, dict, torch.Tensor]:
        junk = (1 - mask) * noise
        x = (lp + junk).requires_grad_(True)
        loss, metrics = policy_loss(
            x, old - junk, adv + junk, mask, config, ref_log_probs=ref + junk,
            rollout_log_probs=roll - junk, entropy=ent + junk, divisor=10.0,
        )  # fmt: skip
        loss.backward()
        return loss, metrics, x.grad * mask

    loss_a, metrics_a, grad_a = run(0.0)
    loss_b, metrics_b, grad_b = run(7.0)
    close(loss_b, float(loss_a.detach()))
    close(grad_b, grad_a)
    for key, value in metrics_a.items():
        close(metrics_b[key], float(value))


def test_policy_loss_rejects_missing_inputs():
    lp, old, mask = torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2)
    with pytest.raises(ValueError, match="rollout_log_probs"):
        policy_loss(lp, old, old, mask, PolicyLossConfig(use_tis=True))
    with pytest.raises(ValueError, match="ref_log_probs"):
        policy_loss(lp, old, old, mask, PolicyLossConfig(kl_loss_coef=0.1))
    with pytest.raises(ValueError, match="entropy_from_logits"):
        policy_loss(lp, old, old, mask, PolicyLossConfig(entropy_coef=0.1))
    with pytest.raises(ValueError, match="unknown policy loss"):
        policy_loss(lp, old, old, mask, PolicyLossConfig(loss_type="sapo"))  # type: ignore[arg-type]


def test_value_loss_clipping():
    # t0: V 1.5, V_old 1.0, R 2: V_c = 1.2 -> max(0.64, 0.25) = 0.64, clipped, no gradient
    # t1: V 0.5, V_old 1.0, R 2: V_c = 0.8 -> max(1.44, 2.25) = 2.25; d/dV = 2 (0.5 - 2) / 2 tokens = -1.5
    values = T([[1.5, 0.5, 3.0]], requires_grad=True)
    loss, metrics = value_loss(
        values, T([[1.0, 1.0, 0.0]]), T([[2.0, 2.0, 0.0]]), T([[1, 1, 0]]), value_clip=0.2
    )
    close(loss, (0.64 + 2.25) / 2)
    close(metrics["value_clipfrac"], 0.5)
    loss.backward()
    close(values.grad, [[0.0, -1.5, 0.0]])
    plain, _ = value_loss(values, T([[1.0, 1.0, 0.0]]), T([[2.0, 2.0, 0.0]]), T([[1, 1, 0]]), value_clip=None)
    close(plain, (0.25 + 2.25) / 2)

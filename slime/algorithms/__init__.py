"""RL algorithms as pure torch functions: advantage estimators, KL estimators, policy and value losses."""

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
from slime.algorithms.aggregation import Aggregation, aggregate, masked_mean
from slime.algorithms.estimators import ESTIMATORS, build_train_batch, builtin_advantages, policy_loss_type
from slime.algorithms.kl import KLEstimator, kl_estimate
from slime.algorithms.losses import (
    ClipResult,
    PolicyLossConfig,
    cispo_loss,
    entropy_from_logits,
    gspo_loss,
    policy_loss,
    ppo_clip_loss,
    tis_weights,
    train_rollout_logprob_abs_diff,
    value_loss,
)

__all__ = [
    "ESTIMATORS",
    "Aggregation",
    "ClipResult",
    "KLEstimator",
    "PolicyLossConfig",
    "aggregate",
    "build_train_batch",
    "builtin_advantages",
    "cispo_loss",
    "discounted_returns",
    "drop_zero_variance_groups",
    "entropy_from_logits",
    "gae_advantages",
    "grpo_advantages",
    "gspo_loss",
    "kl_estimate",
    "masked_mean",
    "masked_whiten",
    "policy_loss",
    "policy_loss_type",
    "ppo_clip_loss",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "rloo_advantages",
    "spread_turn_values",
    "tis_weights",
    "to_token_advantages",
    "token_rewards",
    "train_rollout_logprob_abs_diff",
    "value_loss",
]

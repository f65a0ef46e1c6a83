"""From a step's samples to the trainer's batch: which samples train, and their advantages.

`--advantage-estimator` picks a built-in estimator (formulas in slime/algorithms/advantages.py):

| estimator | advantage | loss |
|---|---|---|
| grpo, gspo, cispo | A_i = (r_i - mean_g r) / (std_g r + 1e-6) on every token (Dr.GRPO: no std, `--disable-grpo-std-normalization`; auto-off when n = 1) | ppo clip, gspo, cispo |
| rloo (ours) | A_i = r_i - mean_{j in g, j != i} r_j | ppo clip |
| reinforce_plus_plus | A_t = sum_k gamma^k rew_{t+k}, rew = r_i on the last model token, then whitened | ppo clip |
| reinforce_plus_plus_baseline | A_{i,t} = r_i - mean_g r, then whitened | ppo clip |
| ppo | GAE over critic values (slime/critic.py): delta_t = rew_t + gamma V_{t+1} - V_t, A_t = sum_k (gamma lambd)^k delta_{t+k}, R_t = A_t + V_t | ppo clip (+ value loss for the critic) |

`--disable-rewards-normalization` uses raw rewards instead of the group-centred ones (grpo, gspo,
cispo, reinforce_plus_plus_baseline, as slime). `--custom-reward-post-process-path` (upstream's hook,
`fn(args, samples) -> (raw_rewards, rewards)`) replaces that normalisation: its `rewards` are used as
they are (`post_processed_rewards`). `--normalize-advantages` whitens the result over all
loss-mask tokens of the step: A <- (A - mu) / sqrt(var + 1e-8) (the REINFORCE++ family always does).
Groups are the samples sharing `group_index`; ABORTED / FAILED samples get advantage 0 and stay out
of every statistic (group mean and std, whitening). The KL-in-reward term of REINFORCE++
(slime's `--kl-coef`) is not implemented: use `--use-kl-loss`.

`--custom-advantage-function-path` (ours, an extension: slime's flag of that name takes
`fn(args, rollout_data)` on the train side) replaces the estimator: `fn(args, samples) ->
list[float | list[float]]`, one number per sample (spread over its response tokens) or one value per
response token; it sees the filtered samples (response tokens present, `remove_sample` masks zeroed).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import Any

import torch

from slime.algorithms.advantages import (
    gae_advantages,
    grpo_advantages,
    masked_whiten,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
    to_token_advantages,
    token_rewards,
)
from slime.utils.misc import load_function
from slime.utils.types import Sample

Advantages = list[float | list[float]]

GROUP_NORMALIZED = ("grpo", "gspo", "cispo")
WHITENED = ("reinforce_plus_plus", "reinforce_plus_plus_baseline")
ESTIMATORS = (*GROUP_NORMALIZED, "rloo", *WHITENED, "ppo")


def policy_loss_type(estimator: str) -> str:
    """The policy loss of an estimator (`PolicyLossConfig.loss_type`): gspo and cispo have their own."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown --advantage-estimator {estimator!r}; choose one of {', '.join(ESTIMATORS)}")
    return {"gspo": "gspo", "cispo": "cispo"}.get(estimator, "ppo")


def _padded_mask(samples: Sequence[Sample]) -> torch.Tensor:
    """[B, T] bool: True on loss-mask tokens (non-zero weights count), T = longest response."""
    width = max(s.response_length for s in samples)
    mask = torch.zeros(len(samples), width, dtype=torch.bool)
    for i, s in enumerate(samples):
        values = s.loss_mask if s.loss_mask is not None else [1] * s.response_length
        mask[i, : len(values)] = torch.tensor([v != 0 for v in values], dtype=torch.bool)
    return mask


def _valid(samples: Sequence[Sample]) -> torch.Tensor:
    """[B] bool: False for infrastructure failures (ABORTED, FAILED), which no statistic may see."""
    return torch.tensor([s.status not in (Sample.Status.ABORTED, Sample.Status.FAILED) for s in samples])


def ppo_advantages(
    args: argparse.Namespace, samples: Sequence[Sample], values: Sequence[Sequence[float]]
) -> tuple[list[list[float]], list[list[float]], list[bool]]:
    """GAE advantages and returns from the critic's per-token values; also which samples are valid.

    Token reward: the outcome reward r_i on the last loss-mask token (`--kl-coef` is not implemented);
    gamma = `--gamma`, lambda = `--lambd`; `--normalize-advantages` whitens the advantages.
    ABORTED / FAILED samples get zero advantages and returns (the critic skips them).
    """
    valid = _valid(samples)
    rewards = torch.tensor([float(s.get_reward_value(args)) if v else 0.0 for s, v in zip(samples, valid.tolist(),
                                                                                          strict=True)])
    mask = _padded_mask(samples) & valid[:, None]
    padded = torch.zeros(mask.shape)
    for i, (s, v) in enumerate(zip(samples, values, strict=True)):
        if len(v) != s.response_length:
            raise ValueError(f"critic gave {len(v)} values for sample {s.index} with {s.response_length} tokens")
        padded[i, : len(v)] = torch.tensor(v, dtype=torch.float32)
    adv, returns = gae_advantages(token_rewards(rewards, mask), padded, mask, gamma=args.gamma, lam=args.lambd)
    if args.normalize_advantages:
        adv = masked_whiten(adv, mask)
    rows = [(adv[i, : s.response_length].tolist(), returns[i, : s.response_length].tolist())
            for i, s in enumerate(samples)]
    return [a for a, _ in rows], [r for _, r in rows], valid.tolist()


def builtin_advantages(
    args: argparse.Namespace, samples: Sequence[Sample], rewards: Sequence[float] | None = None
) -> Advantages:
    """Advantages of `--advantage-estimator` for `samples` (see the module docstring).

    `rewards`: already post-processed rewards (`--custom-reward-post-process-path`), used instead of the
    samples' own and, like `--disable-rewards-normalization`, not normalised again."""
    estimator = args.advantage_estimator
    policy_loss_type(estimator)  # validates the name
    if estimator == "ppo":
        raise ValueError("ppo advantages need the critic's values: use ppo_advantages(args, samples, values)")
    normalized = rewards is not None or args.disable_rewards_normalization
    if rewards is None:
        rewards = [float(s.get_reward_value(args)) for s in samples]
    rewards = torch.tensor(list(rewards), dtype=torch.float64)
    valid = _valid(samples)
    group_index = torch.tensor([s.group_index if s.group_index is not None else -1 - i for i, s in enumerate(samples)])
    raw = torch.where(valid, rewards, 0.0)
    per_sample: torch.Tensor | None = None
    per_token: torch.Tensor | None = None
    mask = _padded_mask(samples) & valid[:, None]
    if estimator in GROUP_NORMALIZED:
        if normalized:
            per_sample = raw
        else:
            std_normalize = not args.disable_grpo_std_normalization and args.n_samples_per_prompt > 1
            per_sample = grpo_advantages(rewards, group_index, std_normalize=std_normalize, valid=valid)
    elif estimator == "rloo":
        per_sample = rloo_advantages(rewards, group_index, valid=valid)
    elif estimator == "reinforce_plus_plus":
        per_token = reinforce_pp_advantages(rewards, mask, gamma=args.gamma, valid=valid)
    elif normalized:  # reinforce_plus_plus_baseline on raw (or post-processed) rewards
        per_token = masked_whiten(to_token_advantages(raw, mask), mask)
    else:
        per_token = reinforce_pp_baseline_advantages(rewards, group_index, mask, valid=valid)
    if args.normalize_advantages and per_token is None:
        per_token = masked_whiten(to_token_advantages(per_sample, mask), mask)
    if per_token is None:
        return per_sample.tolist()
    return [per_token[i, : s.response_length].tolist() for i, s in enumerate(samples)]


def _check_custom(values: Any, samples: Sequence[Sample], path: str) -> Advantages:
    """Validate a custom advantage function's output: one finite number or per-token list per sample."""
    if isinstance(values, torch.Tensor):
        values = values.tolist()
    if not isinstance(values, list | tuple) or len(values) != len(samples):
        got = len(values) if isinstance(values, list | tuple) else type(values).__name__
        raise ValueError(f"{path} returned {got} advantages for {len(samples)} samples: return one entry per sample")
    out: Advantages = []
    for i, (value, sample) in enumerate(zip(values, samples, strict=True)):
        if isinstance(value, torch.Tensor):
            value = value.tolist()
        if isinstance(value, int | float):
            entry: float | list[float] = float(value)
            flat = [entry]
        elif isinstance(value, list | tuple) and len(value) == sample.response_length:
            entry = [float(v) for v in value]
            flat = entry
        else:
            raise ValueError(
                f"{path}: advantage {i} must be a number or {sample.response_length} per-token values "
                f"(the sample's response_length); got {type(value).__name__}"
                + (f" of length {len(value)}" if isinstance(value, list | tuple) else "")
            )
        if not all(math.isfinite(v) for v in flat):
            raise ValueError(f"{path}: advantage {i} is not finite ({value!r})")
        out.append(entry)
    return out


def build_train_batch(
    args: argparse.Namespace, groups: Sequence[list[Sample]]
) -> tuple[list[Sample], Advantages | None]:
    """Samples to train on and one advantage entry each (a number or per-token values).

    None for `--advantage-estimator ppo` without a custom function: the loop asks the critic first.

    Samples without response tokens are left out; `remove_sample` zeroes a loss mask (the sample
    stays in the batch, and out of the estimators' statistics only through ABORTED/FAILED status).
    """
    samples = [s for g in groups for s in g if s.response_length > 0]
    if not samples:
        raise RuntimeError("the rollout produced no response tokens to train on")
    for s in samples:
        if s.remove_sample:
            s.loss_mask = [0] * s.response_length
    if not getattr(args, "compute_advantages_and_returns", True):  # --disable-compute-advantages-and-returns
        return samples, [0.0] * len(samples)
    path = getattr(args, "custom_advantage_function_path", None)
    if path:
        return samples, _check_custom(load_function(path)(args, samples), samples, path)
    if args.advantage_estimator == "ppo":
        return samples, None
    path = getattr(args, "custom_reward_post_process_path", None)
    if path:
        return samples, builtin_advantages(args, samples, rewards=post_processed_rewards(args, samples, path))
    return samples, builtin_advantages(args, samples)


def post_processed_rewards(args: argparse.Namespace, samples: Sequence[Sample], path: str) -> list[float]:
    """`--custom-reward-post-process-path` (upstream's hook): `fn(args, samples) -> (raw_rewards, rewards)`.

    Upstream's default post-process is the group normalisation itself, so the hook's `rewards` take the
    place of the normalised rewards: grpo/gspo/cispo use them as the advantage, reinforce_plus_plus_baseline
    whitens them, rloo and reinforce_plus_plus start from them (`builtin_advantages(..., rewards=)`)."""
    out = load_function(path)(args, list(samples))
    if not isinstance(out, tuple | list) or len(out) != 2:
        raise ValueError(f"{path} returned {type(out).__name__}; return (raw_rewards, rewards), one list each")
    rewards = out[1].tolist() if isinstance(out[1], torch.Tensor) else out[1]
    if not isinstance(rewards, list | tuple) or len(rewards) != len(samples):
        raise ValueError(f"{path} returned {len(rewards) if isinstance(rewards, list | tuple) else rewards!r} "
                         f"rewards for {len(samples)} samples: return one per sample, in order")
    values = [float(r) for r in rewards]
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"{path} returned a reward that is not finite: {rewards!r}")
    return values

"""`--advantage-estimator` choices and `--custom-advantage-function-path` on samples, against
hand-computed values (slime/algorithms/estimators.py)."""

from __future__ import annotations

import math
import sys

import pytest

from slime.algorithms.estimators import ESTIMATORS, build_train_batch, policy_loss_type
from slime.arguments import parse_args
from slime.utils.types import Sample

S3 = 1 / math.sqrt(3)  # Bessel std of rewards [1, 0, 0]


def _args(*extra: str, n: int = 3):
    return parse_args(["--hf-checkpoint", "m", "--prompt-data", "p", "--rollout-batch-size", "1",
                       "--n-samples-per-prompt", str(n), "--num-rollout", "1", *extra])


def _sample(i: int, reward: float, length: int = 1, group: int = 0, **kw) -> Sample:
    return Sample(group_index=group, index=i, tokens=[5] * (2 + length), response_length=length, reward=reward, **kw)


def _group(*rewards: float, length: int = 1) -> list[Sample]:
    return [_sample(i, r, length) for i, r in enumerate(rewards)]


def test_grpo_gspo_cispo_normalise_by_group_mean_and_std():
    for estimator in ("grpo", "gspo", "cispo"):
        _, adv = build_train_batch(_args("--advantage-estimator", estimator), [_group(1.0, 0.0, 0.0)])
        # mean 1/3, std 1/sqrt(3): (2/3) sqrt(3) = 1.1547, (-1/3) sqrt(3) = -0.5774
        assert adv == pytest.approx([(2 / 3) / S3, (-1 / 3) / S3, (-1 / 3) / S3], abs=1e-5)


def test_dr_grpo_only_centres():
    _, adv = build_train_batch(_args("--disable-grpo-std-normalization"), [_group(1.0, 0.0, 0.0)])
    assert adv == pytest.approx([2 / 3, -1 / 3, -1 / 3])


def test_disable_rewards_normalization_uses_raw_rewards():
    _, adv = build_train_batch(_args("--disable-rewards-normalization"), [_group(1.0, 0.0, 0.5)])
    assert adv == pytest.approx([1.0, 0.0, 0.5])


def test_rloo_leaves_one_out():
    _, adv = build_train_batch(_args("--advantage-estimator", "rloo"), [_group(1.0, 0.0, 0.0)])
    # 1 - mean(0, 0) = 1;  0 - mean(1, 0) = -0.5
    assert adv == pytest.approx([1.0, -0.5, -0.5])


def test_groups_are_by_group_index_and_failed_samples_stay_out():
    a = [_sample(0, 1.0), _sample(1, 0.0), _sample(2, 5.0, status=Sample.Status.FAILED)]
    b = [_sample(3, 2.0, group=7), _sample(4, 4.0, group=7), _sample(5, 9.0, group=7, status=Sample.Status.ABORTED)]
    _, adv = build_train_batch(_args("--disable-grpo-std-normalization"), [a, b])
    # group 0: valid [1, 0] -> mean 0.5; group 7: valid [2, 4] -> mean 3; failed/aborted -> 0
    assert adv == pytest.approx([0.5, -0.5, 0.0, -1.0, 1.0, 0.0])
    _, adv = build_train_batch(_args(), [a])
    assert adv == pytest.approx([0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5), 0.0], abs=1e-5)


def test_reinforce_plus_plus_discounts_then_whitens():
    group = [_sample(0, 1.0, length=2), _sample(1, 0.0, length=1)]
    _, adv = build_train_batch(_args("--advantage-estimator", "reinforce_plus_plus"), [group])
    # returns [1, 1] and [0]: mean 2/3, population var 2/9 -> (1/3)/0.4714 = 0.7071, (-2/3)/0.4714
    assert adv[0] == pytest.approx([0.70711, 0.70711], abs=1e-4)
    assert adv[1] == pytest.approx([-1.41421], abs=1e-4)
    _, adv = build_train_batch(_args("--advantage-estimator", "reinforce_plus_plus", "--gamma", "0.5"), [group])
    # returns [0.5, 1] and [0]: mean 0.5, var 1/6 -> [0, 1.2247], [-1.2247]
    assert adv[0] == pytest.approx([0.0, 1.22474], abs=1e-4)
    assert adv[1] == pytest.approx([-1.22474], abs=1e-4)


def test_reinforce_plus_plus_baseline_centres_then_whitens_and_respects_the_loss_mask():
    group = [_sample(0, 1.0, length=3, loss_mask=[1, 0, 1]), _sample(1, 0.0, length=1)]
    _, adv = build_train_batch(_args("--advantage-estimator", "reinforce_plus_plus_baseline", n=2), [group])
    # centred 0.5, -0.5 on masked tokens [.5, ., .5], [-.5]: mean 1/6, var 2/9
    assert adv[0] == pytest.approx([0.70711, 0.0, 0.70711], abs=1e-4)
    assert adv[1] == pytest.approx([-1.41421], abs=1e-4)


def test_normalize_advantages_whitens_any_estimator():
    group = [_sample(0, 1.0, length=2), _sample(1, 0.0, length=1)]
    _, adv = build_train_batch(_args("--disable-grpo-std-normalization", "--normalize-advantages", n=2), [group])
    assert adv[0] == pytest.approx([0.70711, 0.70711], abs=1e-4)
    assert adv[1] == pytest.approx([-1.41421], abs=1e-4)


def test_remove_sample_zeroes_its_mask_and_empty_responses_are_dropped():
    group = [_sample(0, 1.0, length=2, remove_sample=True), _sample(1, 0.0), _sample(2, 0.0, length=0)]
    samples, adv = build_train_batch(_args(), [group])
    assert [s.index for s in samples] == [0, 1]
    assert samples[0].loss_mask == [0, 0]
    assert len(adv) == 2


def test_policy_loss_of_each_estimator():
    assert {e: policy_loss_type(e) for e in ESTIMATORS} == {
        "grpo": "ppo", "gspo": "gspo", "cispo": "cispo", "rloo": "ppo",
        "reinforce_plus_plus": "ppo", "reinforce_plus_plus_baseline": "ppo", "ppo": "ppo",
    }
    with pytest.raises(ValueError, match="unknown --advantage-estimator"):
        policy_loss_type("ppo_critic")


PLUGIN = '''
def per_token(args, samples):
    """Reward on the first token only; removed samples arrive with a zero mask."""
    args.seen = [(s.index, list(s.loss_mask or [])) for s in samples]
    return [[float(s.reward)] + [0.0] * (s.response_length - 1) for s in samples]

def scalar(args, samples):
    return [0.25 for _ in samples]

def too_short(args, samples):
    return [[1.0] for s in samples]

def wrong_count(args, samples):
    return [1.0]

def not_finite(args, samples):
    return [float("nan") for _ in samples]
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    (tmp_path / "adv_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "adv_plugin"
    sys.modules.pop("adv_plugin", None)


def test_custom_advantage_function_per_token_and_scalar(plugin):
    group = [_sample(0, 1.0, length=3), _sample(1, 0.5, length=2, remove_sample=True)]
    args = _args("--custom-advantage-function-path", f"{plugin}.per_token", n=2)
    _, adv = build_train_batch(args, [group])
    assert adv == [[1.0, 0.0, 0.0], [0.5, 0.0]]
    assert args.seen == [(0, []), (1, [0, 0])]
    _, adv = build_train_batch(_args("--custom-advantage-function-path", f"{plugin}.scalar", n=2), [group])
    assert adv == [0.25, 0.25]


@pytest.mark.parametrize(("name", "message"), [
    ("too_short", "must be a number or 3 per-token values"),
    ("wrong_count", "returned 1 advantages for 2 samples"),
    ("not_finite", "is not finite"),
])
def test_custom_advantage_function_output_is_checked(plugin, name, message):
    group = [_sample(0, 1.0, length=3), _sample(1, 0.5, length=2)]
    with pytest.raises(ValueError, match=message):
        build_train_batch(_args("--custom-advantage-function-path", f"{plugin}.{name}", n=2), [group])

"""PPO critic (slime/critic.py) on the tiny model in process, GAE from its values, and
`--advantage-estimator ppo` through `python -m slime.train` with save and resume."""

from __future__ import annotations

import math

import pytest
import torch
from test_train_loop import _command, _env, _run, _train_records, toy  # noqa: F401 - toy is a fixture

from slime.algorithms.estimators import build_train_batch, ppo_advantages
from slime.arguments import parse_args
from slime.critic import Critic
from slime.models.tiny import build_tiny_model
from slime.utils.types import Sample


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("critic") / "model"
    build_tiny_model(path)
    return str(path)


def _samples() -> list[Sample]:
    return [
        Sample(index=0, tokens=[3, 4, 5, 6, 7], response_length=3, reward=1.0),
        Sample(index=1, tokens=[8, 9, 10], response_length=1, reward=0.0),
        Sample(index=2, tokens=[11, 12, 13, 14, 15, 16], response_length=4, reward=1.0, loss_mask=[1, 1, 0, 1]),
    ]


def _critic(model_dir: str, **kw) -> Critic:
    torch.set_num_threads(1)
    return Critic(model_dir, lr=kw.pop("lr", 1e-2), seed=0, **kw)


def test_values_start_at_zero_and_fit_the_returns(model_dir):
    critic = _critic(model_dir)
    samples = _samples()
    values = critic.values(samples)
    assert [len(v) for v in values] == [3, 1, 4] and all(x == 0.0 for v in values for x in v)
    returns = [[1.0] * s.response_length for s in samples]
    losses = []
    for _ in range(15):
        old = critic.values(samples)
        losses.append(critic.train(samples, returns, old)["critic/value_loss"])
    assert losses[0] == pytest.approx(1.0)  # V = 0, R = 1 on every token
    assert losses[-1] < 0.3 * losses[0]


def test_values_do_not_depend_on_batch_neighbours(model_dir):
    critic = _critic(model_dir, micro_batch_size=1)
    samples = _samples()
    critic.train(samples, [[1.0] * s.response_length for s in samples], critic.values(samples))
    alone = critic.values(samples)
    critic.micro_batch_size = 8
    together = critic.values(samples)
    for a, b in zip(alone, together, strict=True):
        assert a == pytest.approx(b, abs=1e-5)
    assert any(abs(x) > 1e-4 for v in alone for x in v)


def test_invalid_samples_do_not_move_the_critic(model_dir):
    samples = _samples()
    returns = [[0.5] * s.response_length for s in samples]
    zero = [[0.0] * s.response_length for s in samples]
    a, b = _critic(model_dir), _critic(model_dir)
    a.train(samples, returns, zero, valid=[True, False, True])
    b.train([samples[0], samples[2]], [returns[0], returns[2]], [zero[0], zero[2]])
    for x, y in zip(a.values(samples), b.values(samples), strict=True):
        assert x == pytest.approx(y, abs=1e-6)


def test_save_and_load_restore_the_critic(model_dir, tmp_path):
    critic = _critic(model_dir)
    samples = _samples()
    returns = [[1.0] * s.response_length for s in samples]
    critic.train(samples, returns, critic.values(samples))
    critic.save(tmp_path, 3)
    saved = critic.values(samples)
    critic.train(samples, returns, saved)
    assert critic.values(samples) != saved
    critic.load(tmp_path, 3)
    assert critic.values(samples) == saved and critic.step == 1
    with pytest.raises(FileNotFoundError, match="no critic state"):
        critic.load(tmp_path, 4)


def test_gae_from_critic_values_by_hand():
    args = parse_args(["--hf-checkpoint", "m", "--prompt-data", "p", "--rollout-batch-size", "1", "--num-rollout",
                       "1", "--advantage-estimator", "ppo", "--lambd", "0.5"])
    samples = [Sample(index=0, tokens=[1, 2, 3], response_length=2, reward=1.0),
               Sample(index=1, tokens=[1, 2], response_length=1, reward=1.0, status=Sample.Status.FAILED)]
    assert build_train_batch(args, [samples])[1] is None  # the loop asks the critic
    adv, returns, valid = ppo_advantages(args, samples, [[0.5, 0.5], [0.3]])
    # rew [0, 1]; delta_1 = 1 - 0.5 = 0.5, delta_0 = 0 + 0.5 - 0.5 = 0; A_1 = 0.5, A_0 = 0 + 0.5 * 0.5
    assert adv[0] == pytest.approx([0.25, 0.5]) and returns[0] == pytest.approx([0.75, 1.0])
    assert adv[1] == [0.0] and returns[1] == [0.0] and valid == [True, False]


@pytest.mark.slow
def test_ppo_with_critic_trains_saves_and_resumes(toy, tmp_path):  # noqa: F811 - fixture
    extra = ("--advantage-estimator", "ppo", "--save-interval", "1", "--critic-lr", "1e-3", "--lambd", "0.95")
    _run(_command(toy, tmp_path, *extra, "--num-critic-only-steps", "1", steps=2), _env())
    assert (tmp_path / "ckpt" / "critic" / "iter_0000001.pt").is_file()
    out = _run(_command(toy, tmp_path, *extra, "--num-critic-only-steps", "1", steps=3), _env()).stdout
    assert "next step 2" in out
    records = _train_records(tmp_path)
    assert sorted(records) == [0, 1, 2]
    assert "train/loss" not in records[0]  # critic-only first step
    for step in (1, 2):
        assert math.isfinite(records[step]["train/loss"])
    for record in records.values():
        assert math.isfinite(record["critic/value_loss"]) and record["critic/grad_norm"] > 0
    assert (tmp_path / "ckpt" / "critic" / "iter_0000002.pt").is_file()

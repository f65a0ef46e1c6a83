"""The engine's batched exponential-race draw picks exactly the tokens of the one-row-at-a-time draw."""

from __future__ import annotations

import pytest
import torch

from slime.engine.batcher import SamplingParams, _race, _sample_row


@pytest.mark.parametrize("vocab", [4096, 1001])
def test_batched_race_draws_the_same_tokens_as_row_by_row(vocab):
    torch.manual_seed(0)
    logprobs = torch.log_softmax(torch.randn(6, vocab) * 3, dim=-1)
    params = SamplingParams(temperature=1.0)
    seeds = [11, 12, 13, 11, 99, 7]  # two rows share a seed: each row still uses its own generator
    for _ in range(20):  # successive draws: each generator advances the same way in both paths
        solo_gens = [torch.Generator().manual_seed(s) for s in seeds]
        batch_gens = [torch.Generator().manual_seed(s) for s in seeds]
        solo = [_sample_row(row, params, g) for row, g in zip(logprobs, solo_gens, strict=True)]
        batched = _race(batch_gens, logprobs.exp()).tolist()
        assert batched == solo
        assert [g.initial_seed() for g in batch_gens] == seeds
        seeds = [s + 1 for s in seeds]


def test_batched_race_follows_the_distribution():
    probs = torch.tensor([[0.7, 0.2, 0.1, 0.0]]).repeat(4000, 1)
    gens = [torch.Generator().manual_seed(i) for i in range(4000)]
    counts = torch.bincount(_race(gens, probs), minlength=4).float() / 4000
    torch.testing.assert_close(counts, torch.tensor([0.7, 0.2, 0.1, 0.0]), atol=0.03, rtol=0)

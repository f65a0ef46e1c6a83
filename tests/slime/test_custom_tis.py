"""slime's --custom-tis-function-path contract on our trainer: a TIS function written for slime (keyword
arguments args, pg_loss, train_log_probs, rollout_log_probs, loss_masks, total_lengths, response_lengths;
returns pg_loss, masks, metrics) runs unmodified in the torch backend's policy loss, and slime's cp_utils
helpers it imports work at context-parallel size 1.

The TIS functions below are written here in slime's style. When slime's own train/inference mismatch helper
is given (SLIME_UPSTREAM=<a THUDM/slime checkout>; not in CI) it is also loaded in place and run.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from test_train_loop import _env, _run
from transformers import Qwen3ForCausalLM

from slime.algorithms.aggregation import aggregate
from slime.algorithms.losses import PolicyLossConfig, policy_loss, tis_options
from slime.backends.megatron_utils import cp_utils
from slime.backends.torch_backend import TorchTrainer, TrainerConfig
from slime.models.tiny import build_config
from slime.utils.types import Sample

UPSTREAM_EXAMPLES = Path(os.environ.get("SLIME_UPSTREAM", "/nonexistent"))  # a THUDM/slime checkout
MIS = UPSTREAM_EXAMPLES / "examples" / "train_infer_mismatch_helper"
VOCAB = 512
CALLS: list[dict[str, Any]] = []


# ---- TIS functions in slime's style (ours) -----------------------------------------------------------


def clipped_tis(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, total_lengths,
                response_lengths, **kwargs):
    """Truncated IS as slime's default does it, plus rejection of tokens whose ratio is above args.reject_above,
    going through slime's cp_utils helpers as slime's plugins do."""
    from slime.backends.megatron_utils.cp_utils import all_gather_with_cp, slice_log_prob_with_cp

    CALLS.append({"total_lengths": list(total_lengths), "response_lengths": list(response_lengths),
                  "train": [t.clone() for t in train_log_probs], "rollout": [r.clone() for r in rollout_log_probs],
                  "masks": [m.clone() for m in loss_masks], "pg_requires_grad": pg_loss.requires_grad})
    weights, masks, ratios = [], [], []
    for train, rollout, mask, total, length in zip(train_log_probs, rollout_log_probs, loss_masks, total_lengths,
                                                   response_lengths, strict=True):
        full_train = all_gather_with_cp(train, total, length)
        full_rollout = all_gather_with_cp(rollout, total, length)
        ratio = torch.exp(full_train - full_rollout)
        masks.append(mask * (ratio <= args.reject_above).float())
        weights.append(slice_log_prob_with_cp(ratio.clamp(args.tis_clip_low, args.tis_clip), total, length))
        ratios.append(ratio)
    return pg_loss * torch.cat(weights), masks, {"my_ratio": torch.cat(ratios)}


def vanilla_like(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, **kwargs):
    """slime's default TIS (clamp(exp(train - rollout)) times the loss), as a custom function."""
    weights = torch.exp(torch.cat(train_log_probs) - torch.cat(rollout_log_probs)).clamp(args.tis_clip_low,
                                                                                         args.tis_clip)
    return pg_loss * weights, loss_masks, {}


def wrong_shape(args, *, pg_loss, loss_masks, **kwargs):
    return pg_loss[:-1], loss_masks, {}


# ---- fixtures -----------------------------------------------------------------------------------------


def ragged_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """A [3, 5] padded batch with responses of 5, 3 and 4 tokens, padding garbage beyond each response."""
    g = torch.Generator().manual_seed(seed)
    lengths = [5, 3, 4]
    valid = torch.arange(5)[None, :] < torch.tensor(lengths)[:, None]
    lp = (-torch.rand(3, 5, generator=g) - 0.1).requires_grad_()
    old = lp.detach() + 0.05 * torch.randn(3, 5, generator=g)
    rollout = old + torch.tensor([[0.0, -0.9, 0.3, 0.0, 1.5], [0.2, 0.0, -0.4, 9.0, 9.0], [0.0, 0.1, -1.2, 0.0, 9.0]])
    mask = valid.float()
    mask[0, 3] = 0.0  # an environment token inside a response
    adv = torch.randn(3, 5, generator=g)
    return {"lp": lp, "old": old, "rollout": rollout, "mask": mask, "adv": adv, "lengths": lengths,
            "totals": [n + 4 for n in lengths]}


def run_loss(batch: dict, config: PolicyLossConfig) -> tuple[torch.Tensor, dict]:
    return policy_loss(batch["lp"], batch["old"], batch["adv"], batch["mask"], config,
                       rollout_log_probs=batch["rollout"], response_lengths=batch["lengths"],
                       total_lengths=batch["totals"])


def tis_args(**values: Any) -> argparse.Namespace:
    return argparse.Namespace(**{"tis_clip": 2.0, "tis_clip_low": 0.0, "use_tis": True, **values})


# ---- cp_utils at context-parallel size 1 -----------------------------------------------------------------


def test_cp_utils_return_whole_responses_at_size_one():
    x = torch.tensor([0.5, -1.0, 2.0])
    assert cp_utils.all_gather_with_cp(x, 7, 3) is x
    assert cp_utils.slice_log_prob_with_cp([0.1, 0.2, 0.3], 7, 3) == [0.1, 0.2, 0.3]
    assert cp_utils.slice_with_cp(x, 0) is x
    with pytest.raises(ValueError, match="one value per response token"):
        cp_utils.all_gather_with_cp(x, 7, 4)
    with pytest.raises(ValueError, match="context-parallel size 1"):
        cp_utils.get_logits_and_tokens_offset_with_cp(7, 3)


def test_cp_sum_of_sample_mean_is_the_sum_of_masked_means():
    masks = [torch.tensor([1.0, 0.0, 1.0]), torch.tensor([1.0, 1.0])]
    x = torch.tensor([1.0, 100.0, 3.0, 4.0, 6.0])
    assert cp_utils.get_sum_of_sample_mean([5, 4], [3, 2], masks)(x).item() == pytest.approx(2.0 + 5.0)
    per_token = cp_utils.get_sum_of_sample_mean([5, 4], [3, 2], masks, calculate_per_token_loss=True)
    assert per_token(x).item() == pytest.approx(1 + 3 + 4 + 6)
    denoms = [torch.tensor(4.0), torch.tensor(4.0)]
    assert cp_utils.get_sum_of_sample_mean([5, 4], [3, 2], masks, denoms)(x).item() == pytest.approx(4 / 4 + 10 / 4)


# ---- the hook in the policy loss ---------------------------------------------------------------------------


def test_custom_function_gets_slimes_arguments_and_its_weights_and_masks_shape_the_loss():
    CALLS.clear()
    batch = ragged_batch()
    args = tis_args(reject_above=3.0)
    config = PolicyLossConfig(use_tis=True, custom_tis_function=clipped_tis, tis_function_args=args)
    loss, metrics = run_loss(batch, config)

    (call,) = CALLS
    assert call["response_lengths"] == [5, 3, 4] and call["total_lengths"] == [9, 7, 8]
    assert call["pg_requires_grad"]
    for b, n in enumerate(batch["lengths"]):
        torch.testing.assert_close(call["train"][b], batch["old"][b, :n])
        torch.testing.assert_close(call["rollout"][b], batch["rollout"][b, :n])
        torch.testing.assert_close(call["masks"][b], batch["mask"][b, :n])

    # the same loss by hand: PPO clip, times the clamped ratio, rejected tokens out of the numerator only
    ratio_rollout = torch.exp(batch["old"] - batch["rollout"])
    keep = batch["mask"] * (ratio_rollout <= 3.0).float()
    rho = torch.exp(batch["lp"] - batch["old"])
    per_token = torch.maximum(-rho * batch["adv"], -rho.clamp(0.8, 1.2) * batch["adv"])
    expected = aggregate(per_token * ratio_rollout.clamp(0.0, 2.0) * keep, batch["mask"], "token_mean")
    torch.testing.assert_close(loss, expected)
    assert keep.sum() < batch["mask"].sum()  # the fixture really rejects a token

    loss.backward()
    grad = batch["lp"].grad
    assert torch.all(grad[keep == 0] == 0) and torch.any(grad[keep == 1] != 0)
    mean_ratio = (ratio_rollout * batch["mask"]).sum() / batch["mask"].sum()
    assert metrics["my_ratio"].item() == pytest.approx(mean_ratio.item(), rel=1e-5)
    assert "ois" in metrics and "tis_weight_mean" not in metrics


def test_a_custom_copy_of_the_default_gives_the_built_in_loss():
    batch = ragged_batch(1)
    built_in, _ = run_loss(batch, PolicyLossConfig(use_tis=True, tis_clip=1.5))
    custom, _ = run_loss(batch, PolicyLossConfig(use_tis=True, tis_clip=1.5, custom_tis_function=vanilla_like,
                                                 tis_function_args=tis_args(tis_clip=1.5)))
    torch.testing.assert_close(custom, built_in)


def test_mismatch_metrics_alone_report_without_weighting():
    batch = ragged_batch(2)
    plain, _ = run_loss(batch, PolicyLossConfig())
    measured, metrics = run_loss(batch, PolicyLossConfig(get_mismatch_metrics=True))
    torch.testing.assert_close(measured, plain)
    assert {"tis_weight_mean", "tis_clipfrac", "train_rollout_logprob_abs_diff"} <= metrics.keys()


def test_a_function_breaking_the_contract_is_named():
    batch = ragged_batch()
    config = PolicyLossConfig(use_tis=True, custom_tis_function=wrong_shape, tis_function_args=tis_args())
    with pytest.raises(ValueError, match="wrong_shape returned pg_loss of shape"):
        run_loss(batch, config)


def test_tis_options_load_the_path_and_pass_args(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    args = tis_args(custom_tis_function_path="test_custom_tis.vanilla_like", get_mismatch_metrics=False)
    options = tis_options(args)
    assert options["custom_tis_function"].__name__ == "vanilla_like" and options["tis_function_args"] is args
    assert options["use_tis"] and not options["get_mismatch_metrics"]
    with pytest.raises(ImportError):
        tis_options(tis_args(custom_tis_function_path="test_custom_tis.no_such_function"))


# ---- through the torch backend's train step ------------------------------------------------------------------


def samples(count: int = 4) -> list[Sample]:
    rng = random.Random(3)
    out = []
    for i in range(count):
        prompt, response = rng.randint(2, 6), rng.randint(2, 7)
        tokens = [rng.randrange(1, VOCAB) for _ in range(prompt + response)]
        rollout = [-rng.uniform(5.0, 7.0) for _ in range(response)]
        out.append(Sample(index=i, tokens=tokens, response_length=response, rollout_log_probs=rollout,
                          loss_mask=[1] * response))
    return out


def tiny_trainer(seed: int = 0) -> TorchTrainer:
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(build_config(VOCAB, eos_id=VOCAB - 1, pad_id=0))
    return TorchTrainer(model, TrainerConfig(lr=1e-2, max_tokens_per_micro_batch=20))


def test_train_step_runs_the_custom_function_on_every_micro_batch_and_reports_its_metrics():
    CALLS.clear()
    batch = samples()
    advantages = [1.0, 0.0, -1.0, 0.0]  # zero-advantage samples still reach the function, as in slime
    config = PolicyLossConfig(use_tis=True, custom_tis_function=clipped_tis,
                              tis_function_args=tis_args(reject_above=1e9))
    trainer = tiny_trainer()
    result = trainer.train_step(batch, advantages, config)
    seen = sorted(n for call in CALLS for n in call["response_lengths"])
    assert seen == sorted(s.response_length for s in batch)
    totals = sorted(t for call in CALLS for t in call["total_lengths"])
    assert totals == sorted(len(s.tokens) for s in batch)
    assert len(CALLS) == result["num_micro_batches"] > 1
    assert result["my_ratio"] > 1.0 and "ois" in result

    # the same step with the built-in TIS moves the weights identically (same clamp, nothing rejected)
    custom_params = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    reference = tiny_trainer()
    reference.config = TrainerConfig(lr=1e-2, max_tokens_per_micro_batch=20, skip_zero_advantage=False)
    reference.train_step(batch, advantages, PolicyLossConfig(use_tis=True))
    for key, value in reference.model.state_dict().items():
        torch.testing.assert_close(custom_params[key], value, msg=key)


# ---- slime's own mismatch helper, read in place when present --------------------------------------------------


def mis_args() -> argparse.Namespace:
    settings = yaml.safe_load((MIS / "mis.yaml").read_text())
    return argparse.Namespace(tis_clip=2.0, tis_clip_low=0.0, **settings)


@pytest.mark.skipif(not (MIS / "mis.py").is_file(),
                    reason="set SLIME_UPSTREAM to a THUDM/slime checkout to run it (CI has no copy)")
def test_slimes_mis_helper_runs_unmodified(monkeypatch):
    monkeypatch.syspath_prepend(str(UPSTREAM_EXAMPLES))
    args = mis_args()
    args.custom_tis_function_path = "examples.train_infer_mismatch_helper.mis.compute_mis_weights_with_cp"
    options = tis_options(args)
    assert options["custom_tis_function"].__name__ == "compute_mis_weights_with_cp"
    batch = ragged_batch()
    loss, metrics = run_loss(batch, PolicyLossConfig(**options))
    assert torch.isfinite(loss)
    assert {"mis_training_ppl", "mis_rollout_ppl", "mis_tis_weight_before_bound", "mis_is_ratio_mean_final"} <= set(metrics)
    valid = batch["mask"].bool()
    ppl = [torch.exp(-batch["old"][b][valid[b]].mean()) for b in range(3)]  # per sequence, spread over its tokens
    expected_ppl = sum(p * valid[b].sum() for b, p in enumerate(ppl)) / valid.sum()
    assert metrics["mis_training_ppl"].item() == pytest.approx(expected_ppl.item(), rel=1e-5)
    loss.backward()
    assert torch.isfinite(batch["lp"].grad).all()

    CALLS.clear()
    trainer = tiny_trainer()
    result = trainer.train_step(samples(), [1.0, -1.0, 0.5, -0.5], PolicyLossConfig(**options))
    assert "mis_k3_kl" in result and result["mis_rollout_ppl"] > 1.0
    assert "examples.train_infer_mismatch_helper.mis" in sys.modules


# ---- through python -m slime.train ------------------------------------------------------------------------------


def train_two_steps(tmp_path: Path, *extra: str, pythonpath: tuple[str, ...] = ()) -> list[dict]:
    import json

    from slime.models.tiny import build_tiny_model

    repo = Path(__file__).resolve().parents[2]
    toy = repo / "examples" / "toy_single_turn"
    sys.path.insert(0, str(toy))
    try:
        from make_data import rows
    finally:
        sys.path.remove(str(toy))
    build_tiny_model(tmp_path / "model")
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(8, 0)))
    cmd = [sys.executable, "-m", "slime.train", "--hf-checkpoint", str(tmp_path / "model"),
           "--prompt-data", str(tmp_path / "train.jsonl"), "--label-key", "label", "--apply-chat-template",
           "--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--num-rollout", "2",
           "--rollout-max-response-len", "6", "--custom-rm-path", "reward.reward", "--lr", "1e-3",
           "--save", str(tmp_path / "ckpt"), "--ray-num-cpus", "4", "--use-tis", *extra]
    _run(cmd, _env(Path(toy), Path(__file__).parent, *map(Path, pythonpath)), timeout=240)
    lines = (tmp_path / "ckpt" / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "train"]


def test_slime_train_runs_a_custom_tis_function(tmp_path):
    config = tmp_path / "tis.yaml"
    config.write_text("reject_above: 1.0e+9\n")
    records = train_two_steps(tmp_path, "--custom-tis-function-path", "test_custom_tis.clipped_tis",
                              "--custom-config-path", str(config))
    assert [r["step"] for r in records] == [0, 1]
    for r in records:
        # the engine and the trainer compute the same log-probs at step 0: the ratios are 1
        assert "train/my_ratio" in r and "train/ois" in r and math.isfinite(r["train/loss"])
    assert records[0]["train/my_ratio"] == pytest.approx(1.0, abs=1e-4)


@pytest.mark.skipif(not (MIS / "mis.py").is_file(),
                    reason="set SLIME_UPSTREAM to a THUDM/slime checkout to run it (CI has no copy)")
def test_slime_train_runs_slimes_mis_helper(tmp_path):
    records = train_two_steps(
        tmp_path, "--custom-tis-function-path", "examples.train_infer_mismatch_helper.mis.compute_mis_weights_with_cp",
        "--custom-config-path", str(MIS / "mis.yaml"), pythonpath=(str(UPSTREAM_EXAMPLES),))
    assert [r["step"] for r in records] == [0, 1]
    assert all("train/mis_k3_kl" in r and math.isfinite(r["train/loss"]) for r in records)

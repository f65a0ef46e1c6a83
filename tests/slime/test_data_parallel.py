"""Data parallel training (replicas and FSDP2 over gloo) and the SFT loss of the torch backend.

The multi-rank tests run `dp_worker.py` once per rank in real CPU processes (CUDA hidden from them)
forming a gloo group, and compare with one rank training on the whole batch: same loss, grad norm
and updated weights within fp32 tolerance (Adam eps 1e-3 so that summation-order noise in near-zero
gradients is not amplified into a full lr-sized step).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import Qwen3ForCausalLM

from slime.algorithms.losses import PolicyLossConfig
from slime.backends.distributed import shard_by_tokens
from slime.backends.sft import sft_loss
from slime.backends.torch_backend import TorchTrainer, TrainerConfig
from slime.models.tiny import build_config
from slime.utils.misc import free_port
from slime.utils.types import Sample

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("dp_worker.py")
VOCAB = 512


def tiny_model(seed: int = 0) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(build_config(VOCAB, eos_id=VOCAB - 1, pad_id=0))


# ---- pure pieces -------------------------------------------------------------------------------


def test_shards_balance_tokens_and_cover_every_sample_once():
    lengths = [10, 3, 7, 7, 2, 9, 1]
    shards = shard_by_tokens(lengths, 2)
    # Longest first to the lighter rank (ties: lower rank): #0 10->r0, #5 9->r1, #2 7->r1 (16),
    # #3 7->r0 (17), #1 3->r1 (19), #4 2->r0 (19), #6 1->r0 (tie, 20).
    assert shards == [[0, 3, 4, 6], [1, 2, 5]]
    assert sorted(i for s in shards for i in s) == list(range(7))
    totals = [sum(lengths[i] for i in s) for s in shards]
    assert abs(totals[0] - totals[1]) <= max(lengths)
    assert shard_by_tokens([5], 3) == [[0], [], []]  # fewer samples than ranks: empty shards
    assert shard_by_tokens(lengths, 1) == [list(range(7))]


def test_sft_loss_is_the_masked_nll_with_both_aggregations():
    lp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.5, 0.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    loss, metrics = sft_loss(lp, mask, aggregation="token_mean")
    assert loss.item() == pytest.approx((1 + 3 + 0.5 + 1.5) / 4)
    loss, _ = sft_loss(lp, mask, aggregation="sequence_mean")
    assert loss.item() == pytest.approx(((1 + 3) / 2 + (0.5 + 1.5) / 2) / 2)
    loss, _ = sft_loss(lp, mask, aggregation="token_mean", divisor=8.0)  # a global divisor
    assert loss.item() == pytest.approx(6 / 8)
    assert metrics["nll"].item() == pytest.approx(6 / 4)
    weighted, _ = sft_loss(lp, mask * 0.5, aggregation="token_mean", divisor=4.0)  # mask values weight tokens
    assert weighted.item() == pytest.approx(3 / 4)


def test_sft_step_lowers_the_nll_and_ignores_advantages():
    s = Sample(tokens=[3, 4, 5, 6, 7, 8, 9, 10], response_length=5, loss_mask=[1, 1, 0, 1, 1])
    trainer = TorchTrainer(tiny_model(), TrainerConfig(lr=1e-2))
    before = trainer.compute_log_probs([s])[0]
    first = trainer.train_step([s], None, PolicyLossConfig(aggregation="token_mean"), loss_type="sft_loss")
    expected_nll = -sum(v for v, m in zip(before, s.loss_mask, strict=True) if m) / 4
    assert first["loss"] == pytest.approx(expected_nll, abs=1e-5)
    assert first["sft_loss"] == first["loss"] and first["tokens"] == 4
    for _ in range(4):
        last = trainer.train_step([s], [123.0], loss_type="sft_loss")  # advantages are ignored
    assert last["nll"] < first["nll"] - 0.5
    with pytest.raises(ValueError, match="loss_type"):
        trainer.train_step([s], None, loss_type="custom_loss")
    with pytest.raises(ValueError, match="needs advantages"):
        trainer.train_step([s], None)


# ---- several ranks -----------------------------------------------------------------------------


def _launch(model_dir: Path, out: Path, world: int, backend: str, *extra: str) -> list[subprocess.Popen]:
    # CPU ranks over gloo even on a GPU machine: two NCCL ranks cannot share one GPU ("invalid usage")
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1", TRANSFORMERS_VERBOSITY="error", CUDA_VISIBLE_DEVICES="")
    port = str(free_port("127.0.0.1"))
    return [
        subprocess.Popen([sys.executable, str(WORKER), str(model_dir), str(out), str(rank), str(world), port, backend,
                          *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank in range(world)
    ]


def _finish(procs: list[subprocess.Popen], timeout: float = 240) -> None:
    for proc in procs:
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        assert proc.returncode == 0, output[-3000:]


def _assert_same_run(a: dict, b: dict) -> None:
    assert a["step"] == b["step"]
    for ma, mb in zip(a["metrics"], b["metrics"], strict=True):
        for key in ("train/loss", "train/grad_norm", "train/tokens"):
            assert mb[key] == pytest.approx(ma[key], rel=1e-5, abs=1e-6), key
    assert a["weights"].keys() == b["weights"].keys()
    for key, value in a["weights"].items():
        torch.testing.assert_close(b["weights"][key], value, atol=2e-6, rtol=0, msg=key)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The model, and one rank (in this process) trained on the batches, saving a checkpoint."""
    import dp_worker

    root = tmp_path_factory.mktemp("dp")
    tiny_model().save_pretrained(root / "model")
    dp_worker.run(str(root / "model"), str(root / "one.pt"), 0, 1, 0, "torch", save=str(root / "ck_one"))
    return root


def test_two_replica_ranks_match_one_rank(runs):
    _finish(_launch(runs / "model", runs / "replicas.pt", 2, "torch"))
    one, two = torch.load(runs / "one.pt"), torch.load(runs / "replicas.pt")
    assert one["metrics"][0]["train/num_micro_batches"] > 1  # the rollout really was split (mean of 2 steps)
    _assert_same_run(one, two)


@pytest.mark.slow
def test_two_fsdp_ranks_match_one_rank_and_checkpoints_move_between_them(runs):
    """FSDP2 over gloo; then a one-rank checkpoint resumed by two FSDP ranks, and the FSDP run's
    checkpoint resumed by one rank: both finish where the uninterrupted one-rank run did."""
    _finish(_launch(runs / "model", runs / "fsdp.pt", 2, "fsdp", "--save", str(runs / "ck_fsdp")))
    one = torch.load(runs / "one.pt")
    _assert_same_run(one, torch.load(runs / "fsdp.pt"))
    assert_checkpoints_move(runs, one)


def assert_checkpoints_move(runs: Path, one: dict) -> None:
    """Two FSDP ranks resume the one-rank save `ck_one`, one rank resumes the FSDP save `ck_fsdp`: both
    finish where the uninterrupted one-rank run `one` did."""
    procs = (_launch(runs / "model", runs / "fsdp_from_one.pt", 2, "fsdp", "--load", str(runs / "ck_one"))
             + _launch(runs / "model", runs / "one_from_fsdp.pt", 1, "torch", "--load", str(runs / "ck_fsdp")))
    _finish(procs)
    tail = {**one, "metrics": one["metrics"][1:]}
    _assert_same_run(tail, torch.load(runs / "fsdp_from_one.pt"))
    _assert_same_run(tail, torch.load(runs / "one_from_fsdp.pt"))


@pytest.mark.slow
def test_megatron_backend_on_two_ranks_matches_the_hf_run(runs):
    """--train-backend megatron (megatron-core GPTModel) with two replica ranks; needs megatron-core."""
    pytest.importorskip("megatron.core", reason="megatron-core is in the GPU sets only")
    from transformers import AutoConfig

    from slime.backends.megatron_convert import megatron_to_hf

    _finish(_launch(runs / "model", runs / "megatron.pt", 2, "megatron"))
    got = torch.load(runs / "megatron.pt")
    tensors = {k: v for k, v in got["weights"].items() if isinstance(v, torch.Tensor)}
    got["weights"] = megatron_to_hf(tensors, AutoConfig.from_pretrained(runs / "model"))
    one = torch.load(runs / "one.pt")
    one["weights"] = {k: v for k, v in one["weights"].items() if k in got["weights"]}  # tied head saved once
    _assert_same_run(one, got)

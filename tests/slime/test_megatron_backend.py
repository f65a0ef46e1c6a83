"""`--train-backend megatron`: a megatron-core GPTModel trained by the torch loop must behave like the
HF model it was converted from (log-probs, loss, gradient norm, updated weights), export HF folders
transformers loads, and resume exactly. Runs on the GPU where CUDA is available (megatron-core then
keeps rotary embeddings and RNG state on the GPU), else on the CPU with the shims. Skipped unless
megatron-core is importable (both GPU sets; e.g. `pip install --target DIR megatron-core==0.16.1` and
PYTHONPATH=DIR)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3ForCausalLM

from slime.algorithms.losses import PolicyLossConfig
from slime.backends.torch_backend import TorchTrainer, TrainerConfig
from slime.models.tiny import build_config
from slime.utils.types import Sample

pytest.importorskip("megatron.core", reason="megatron-core is in the GPU sets only")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def megatron_env():
    """Undo the CPU shim and the one-rank group (gloo, or nccl on GPU) the trainers set up."""
    import torch.distributed as dist

    current_device = torch.cuda.current_device
    yield
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
    torch.cuda.current_device = current_device


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("mg") / "model"
    Qwen3ForCausalLM(build_config(300, eos_id=299, pad_id=0, tie_word_embeddings=False)).save_pretrained(path)
    return path


def _samples() -> list[Sample]:
    return [Sample(index=i, tokens=[3 + (11 * i + 7 * j) % 290 for j in range(5 + 2 * i)], response_length=3 + i,
                   loss_mask=[1] * (2 + i) + [0]) for i in range(3)]


def test_megatron_model_trains_like_the_hf_model_and_round_trips(megatron_env, model_dir, tmp_path):
    from slime.backends.megatron_backend import MegatronTrainer

    config = TrainerConfig(lr=1e-2, adam_eps=1e-3, max_samples_per_micro_batch=2)
    hf = TorchTrainer(str(model_dir), config, device=DEVICE)
    mg = MegatronTrainer(str(model_dir), config, device=DEVICE)
    assert next(mg.model.parameters()).device.type == DEVICE
    samples, adv = _samples(), [1.0, -0.5, [0.1, 0.2, 0.3, -0.4, 0.5]]
    for a, b in zip(hf.compute_log_probs(samples, 0.7), mg.compute_log_probs(samples, 0.7), strict=True):
        assert b == pytest.approx(a, abs=1e-5)

    loss = PolicyLossConfig(aggregation="sequence_mean")
    m_hf, m_mg = hf.train_step(samples, adv, loss, temperature=0.7), mg.train_step(samples, adv, loss, temperature=0.7)
    for key in ("loss", "grad_norm", "entropy"):
        assert m_mg[key] == pytest.approx(m_hf[key], rel=1e-4, abs=1e-6), key
    s_hf, s_mg = hf.train_step(samples, None, loss_type="sft_loss"), mg.train_step(samples, None, loss_type="sft_loss")
    assert s_mg["loss"] == pytest.approx(s_hf["loss"], rel=1e-4)

    out = mg.export_hf(tmp_path / "hf")
    exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
    for key, value in hf.model.state_dict().items():
        torch.testing.assert_close(exported[key], value.cpu(), atol=2e-5, rtol=0, msg=key)

    mg.save_checkpoint(tmp_path / "ck", data_state={"next_rollout_id": 2})
    expected = mg.train_step(samples, adv, loss)
    resumed = MegatronTrainer(str(model_dir), config, device=DEVICE)
    assert resumed.load_checkpoint(tmp_path / "ck")["step"] == 2
    got = resumed.train_step(samples, adv, loss)
    tol = 0 if DEVICE == "cpu" else 1e-6  # exact on CPU; GPU kernels may sum in another order
    assert got["loss"] == pytest.approx(expected["loss"], rel=tol, abs=0)
    assert got["grad_norm"] == pytest.approx(expected["grad_norm"], rel=tol, abs=0)

    # model/ in the engines' bf16: the exact fp32 weights come back from trainer/ (DCP)
    saved = Path(mg.save_checkpoint(tmp_path / "ck16", dtype="bfloat16"))
    assert json.loads((saved / "model" / "config.json").read_text())["dtype"] == "bfloat16"
    expected = mg.train_step(samples, adv, loss)
    resumed = MegatronTrainer(str(model_dir), config, device=DEVICE)
    resumed.load_checkpoint(tmp_path / "ck16")
    assert resumed.train_step(samples, adv, loss)["loss"] == pytest.approx(expected["loss"], rel=tol, abs=0)


def test_tensor_weight_sync_sends_hf_names_from_the_megatron_trainer(megatron_env, model_dir):
    """Issue 20: a tensor sync from the Megatron backend sent `decoder.layers.*` names, which no engine loads."""
    from slime.backends.megatron_backend import MegatronTrainer
    from slime.weight_sync import trainer_hf_tensors

    expected = TorchTrainer(str(model_dir), TrainerConfig(), device=DEVICE).model.state_dict()
    sent = dict(trainer_hf_tensors(MegatronTrainer(str(model_dir), TrainerConfig(), device=DEVICE)))

    assert sorted(sent) == sorted(expected)
    for name, value in expected.items():
        torch.testing.assert_close(sent[name], value, atol=0, rtol=0, msg=name)

"""Weight reload into the served model: same weights as from_pretrained, or nothing changed."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3ForCausalLM

from slime.engine.inplace_load import load_in_place
from slime.models.tiny import build_config


def _model(seed: int, vocab: int = 256) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(build_config(vocab, eos_id=vocab - 1, pad_id=0)).eval()


def _served(tmp_path, seed: int = 0) -> torch.nn.Module:
    """A model loaded as the engine loads one (from a folder)."""
    _model(seed).save_pretrained(tmp_path / "served")
    return AutoModelForCausalLM.from_pretrained(tmp_path / "served", dtype=torch.float32).eval()


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_in_place_load_gives_the_weights_from_pretrained_gives(tmp_path):
    _model(1).save_pretrained(tmp_path / "new")
    served = _served(tmp_path)
    embedding = served.get_input_embeddings().weight
    assert load_in_place(served, tmp_path / "new")
    fresh = AutoModelForCausalLM.from_pretrained(tmp_path / "new", dtype=torch.float32)
    got, want = _weights(served), _weights(fresh)
    assert got.keys() == want.keys()
    for key in want:
        assert torch.equal(got[key], want[key]), key
    assert served.get_input_embeddings().weight is embedding  # the same parameters, refilled
    assert served.lm_head.weight is served.get_input_embeddings().weight  # still tied
    ids = torch.tensor([[3, 5, 7, 9]])
    assert torch.equal(served(ids).logits, fresh(ids).logits)


def test_another_architecture_or_no_folder_changes_nothing(tmp_path):
    _model(1, vocab=300).save_pretrained(tmp_path / "wider")
    served = _served(tmp_path)
    before = _weights(served)
    assert not load_in_place(served, tmp_path / "wider")
    assert not load_in_place(served, tmp_path / "missing")
    for key, value in _weights(served).items():
        assert torch.equal(value, before[key]), key


def test_a_broken_weights_file_raises_with_the_served_weights_intact(tmp_path):
    _model(1).save_pretrained(tmp_path / "new")
    (tmp_path / "new" / "model.safetensors").write_bytes(b"not a safetensors file")
    served = _served(tmp_path)
    before = _weights(served)
    with pytest.raises(Exception):  # noqa: B017 - safetensors' own error type
        load_in_place(served, tmp_path / "new")
    for key, value in _weights(served).items():
        assert torch.equal(value, before[key]), key

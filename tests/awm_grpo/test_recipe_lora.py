"""The recipe with LoRA end to end on CPU (`LORA_RANK=4 bash awm_grpo/run_awm_grpo.sh`): it trains adapters only,
syncs only them into the CPU engine with the trainer's and engine's log-probs in agreement, takes its KL
reference from the base under the adapter, resumes from its checkpoint, and the checkpoint's merged model/ gives
what the base with the checkpoint's adapter/ gives (peft's own loading). Marked slow: CI runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


def recipe(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(["bash", str(REPO / "awm_grpo" / "run_awm_grpo.sh")], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


@pytest.mark.slow
def test_the_recipe_trains_syncs_resumes_and_exports_lora(tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    save = tmp_path / "run"
    env = {**os.environ, "PYTHON": sys.executable, "HF_CKPT": str(tiny_model_dir), "SAVE_DIR": str(save),
           "AWM_SPLITS_DIR": str(tmp_path / "splits"), "NUM_ROLLOUT": "2", "ROLLOUT_BATCH_SIZE": "2",
           "N_SAMPLES_PER_PROMPT": "2", "AWM_MAX_TURNS": "3", "ROLLOUT_MAX_RESPONSE_LEN": "512",
           "AWM_MAX_TOKENS_PER_TURN": "48", "SAVE_INTERVAL": "1", "EVAL_INTERVAL": "100",
           "SKIP_EVAL_BEFORE_TRAIN": "true", "LORA_RANK": "4", "LR": "1e-2", "RAY_AUTH_MODE": "disabled",
           # the untrained model's rewards are all alike (zero advantages): the entropy term moves the adapter
           # anyway, and the KL term reads the reference from the base with the adapter off
           "ENTROPY_COEF": "0.01", "KL_LOSS_COEF": "0.01"}
    first = recipe(env, tmp_path)
    assert "lora-adapter" in first.stderr + first.stdout
    second = recipe({**env, "NUM_ROLLOUT": "3"}, tmp_path)
    assert "resumed from" in second.stderr + second.stdout

    train = [m for m in map(json.loads, (save / "metrics.jsonl").read_text().splitlines()) if m["kind"] == "train"]
    assert [m["step"] for m in train] == [0, 1, 2]
    full_bytes = 4 * sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(tiny_model_dir).parameters())
    assert all(0 < m["sync/bytes"] < full_bytes / 5 for m in train), [m["sync/bytes"] for m in train]
    assert all(m["train/state_gib"] > 0 for m in train)
    diffs = [m["train/train_rollout_logprob_abs_diff"] for m in train if "train/train_rollout_logprob_abs_diff" in m]
    assert diffs and max(diffs) < 1e-4  # the engine served base + the synced adapter
    assert abs(train[0]["train/kl_loss"]) < 1e-7 < train[-1]["train/kl_loss"]  # B starts at 0, then moves

    last = save / "iter_0000002"
    merged = AutoModelForCausalLM.from_pretrained(last / "model").eval()
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), last / "adapter").eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tokens = torch.randint(1, merged.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got, plain = (m(tokens).logits.log_softmax(-1) for m in (adapted, merged, base))
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(plain, want, atol=1e-4)  # the adapter moved the model: the check can fail

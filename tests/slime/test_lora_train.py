"""LoRA through `python -m slime.train`: adapter-only weight sync into the CPU engine, resume, merged export.

The toy task (examples/toy_single_turn) on the tiny model, `--lora-rank 4`: every step the train actor writes
the adapter as a peft folder and the engine swaps it in (`/unload_lora_adapter`, `/load_lora_adapter`), the
rollout's requests name it; the trainer's log-probs of the engine's tokens then match the engine's (the
`logprob_diff` the run logs); a second run resumes from the checkpoint; the checkpoint's merged model
folder is a plain HF model that gives what base + adapter give.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch
from test_train_loop import _env, _run
from transformers import AutoModelForCausalLM

from slime.models.tiny import build_tiny_model

REPO = Path(__file__).resolve().parents[2]
TOY = REPO / "examples" / "toy_single_turn"


def _cmd(model: Path, data: Path, work: Path, steps: int) -> list[str]:
    return [sys.executable, "-m", "slime.train", "--hf-checkpoint", str(model), "--prompt-data", str(data),
            "--input-key", "input", "--label-key", "label", "--rollout-shuffle", "--rollout-batch-size", "2",
            "--n-samples-per-prompt", "4", "--num-rollout", str(steps), "--rollout-max-response-len", "8",
            "--custom-rm-path", "reward.reward", "--lr", "5e-3", "--seed", "3",
            "--lora-rank", "4", "--lora-alpha", "8", "--save", str(work / "ckpt"), "--save-interval", "2",
            "--load", str(work / "ckpt"), "--ray-num-cpus", "4"]


@pytest.mark.slow
def test_a_lora_run_syncs_only_the_adapter_resumes_and_exports_a_merged_model(tmp_path):
    sys.path.insert(0, str(TOY))
    try:
        from make_data import rows
    finally:
        sys.path.remove(str(TOY))
    data = tmp_path / "toy.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows(8, 0)))
    model = build_tiny_model(tmp_path / "model", seed=0)
    full_bytes = sum(p.numel() * 4 for p in AutoModelForCausalLM.from_pretrained(model).parameters())

    first = _run(_cmd(model, data, tmp_path, 2), _env(), timeout=400).stdout
    syncs = [(int(v), int(b)) for v, b in re.findall(r"weight sync v(\d+): lora-adapter, (\d+) bytes", first)]
    assert [v for v, _ in syncs] == [0, 1], first[-3000:]  # before each step (none after the last)
    assert all(0 < b < full_bytes / 5 for _, b in syncs)  # the adapter only, never the model
    diffs = [float(x) for x in re.findall(r"logprob_diff=([0-9.e+-]+)", first)]
    assert diffs and all(d < 1e-4 for d in diffs), diffs  # the engine serves base + the trainer's adapter

    second = _run(_cmd(model, data, tmp_path, 3), _env(), timeout=400).stdout
    assert "resum" in second.lower() and "step 3/3" in second and "step 1/3" not in second, second[-3000:]
    assert re.search(r"weight sync v2: lora-adapter", second)  # the restored adapter goes to the new engine

    saved = sorted((tmp_path / "ckpt").glob("iter_*"))[-1]
    assert (saved / "adapter" / "adapter_config.json").is_file() and (saved / "model" / "config.json").is_file()
    from peft import PeftModel

    ids = torch.tensor([[5, 17, 42, 7, 99, 3, 11]])
    merged = AutoModelForCausalLM.from_pretrained(saved / "model", torch_dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model), saved / "adapter")
    with torch.no_grad():
        a, b = merged(ids).logits, peft_model(ids).logits
    assert torch.allclose(a, b, atol=1e-4) and not torch.allclose(
        a, AutoModelForCausalLM.from_pretrained(model)(ids).logits, atol=1e-4)  # trained, and merged faithfully

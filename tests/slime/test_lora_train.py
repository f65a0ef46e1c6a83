"""LoRA through `python -m slime.train` with upstream slime's flags: adapter-only weight sync into the CPU engine.

The toy task (examples/toy_single_turn) on the tiny model, `--lora-rank 4`: every step the train actor writes
the adapter as a peft folder and the engine swaps it in (`/unload_lora_adapter`, `/load_lora_adapter`), the
rollout's requests name it; the trainer's log-probs of the engine's tokens then match the engine's (the
`logprob_diff` the run logs). Resume and the merged export through the same `slime.train` are
tests/awm_grpo/test_recipe_lora.py's (the recipe's command line).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from test_train_loop import _env, _run
from transformers import AutoModelForCausalLM

from slime.models.tiny import build_tiny_model

REPO = Path(__file__).resolve().parents[2]
TOY = REPO / "examples" / "toy_single_turn"


def _cmd(model: Path, data: Path, steps: int) -> list[str]:
    return [sys.executable, "-m", "slime.train", "--hf-checkpoint", str(model), "--prompt-data", str(data),
            "--input-key", "input", "--label-key", "label", "--rollout-shuffle", "--rollout-batch-size", "2",
            "--n-samples-per-prompt", "4", "--num-rollout", str(steps), "--rollout-max-response-len", "8",
            "--custom-rm-path", "reward.reward", "--lr", "5e-3", "--seed", "3",
            "--lora-rank", "4", "--lora-alpha", "8", "--ray-num-cpus", "4"]


@pytest.mark.slow
def test_a_lora_run_syncs_only_the_adapter_and_the_engine_serves_it(tmp_path):
    sys.path.insert(0, str(TOY))
    try:
        from make_data import rows
    finally:
        sys.path.remove(str(TOY))
    data = tmp_path / "toy.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows(8, 0)))
    model = build_tiny_model(tmp_path / "model", seed=0)
    full_bytes = sum(p.numel() * 4 for p in AutoModelForCausalLM.from_pretrained(model).parameters())

    first = _run(_cmd(model, data, 2), _env(), timeout=400).stdout
    syncs = [(int(v), int(b)) for v, b in re.findall(r"weight sync v(\d+): lora-adapter, (\d+) bytes", first)]
    assert [v for v, _ in syncs] == [0, 1], first[-3000:]  # before each step (none after the last)
    assert all(0 < b < full_bytes / 5 for _, b in syncs)  # the adapter only, never the model
    diffs = [float(x) for x in re.findall(r"logprob_diff=([0-9.e+-]+)", first)]
    assert diffs and all(d < 1e-4 for d in diffs), diffs  # the engine serves base + the trainer's adapter


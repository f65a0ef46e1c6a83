"""Fixtures for the recipe tests: the tiny model, a scripted SGLang-protocol engine, fresh state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rollout_helpers import ScriptedEngine

from awm_grpo import env_client
from slime.models.tiny import build_tiny_model
from slime.rollout.sglang_rollout import GenerateState


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("awm-grpo") / "tiny", seed=0)


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def scripted(tokenizer: Any) -> ScriptedEngine:
    engine = ScriptedEngine(tokenizer)
    yield engine
    engine.server.stop()


@pytest.fixture(autouse=True)
def _fresh_state():
    GenerateState.clear_instances()
    yield
    GenerateState.clear_instances()
    env_client.close_runtimes()

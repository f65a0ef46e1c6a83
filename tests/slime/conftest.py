"""Fixtures shared by the trainer-side tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from slime.engine.cpu_server import CPUEngine


@pytest.fixture(scope="module")
def engine(model_dir) -> Iterator[CPUEngine]:
    """A CPU engine serving the test module's `model_dir` over HTTP for the whole module."""
    engine = CPUEngine(model_dir, port=0, seed=0)
    engine.start()
    yield engine
    engine.shutdown()

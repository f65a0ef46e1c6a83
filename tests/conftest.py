"""Fixtures shared by every test folder: the pinned sglang's own code (tests/sglang_real.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sglang_real import SglangOracle


@pytest.fixture(scope="session")
def sglang() -> Iterator[SglangOracle]:
    """A subprocess with the pinned sglang imported (installed on first use; needs PyPI then)."""
    oracle = SglangOracle()
    yield oracle
    oracle.close()

"""Fixtures shared by every test folder: the pinned sglangs' own code (tests/sglang_real.py), and a
real small filesystem (`tmpfs`) for the tests of a full disk.

`sglang` is parametrized over the GPU sets (GPU_SETS: sglang 0.5.10 of gpu-cu12, 0.5.23 of gpu-cu13),
so every test that uses it runs against both versions, with ids `sglang-0.5.10` / `sglang-0.5.23`.
Each oracle is a subprocess holding torch and sglang (about 0.6 GB resident): pytest groups the tests
by version and tears one down before starting the other, and `pytest_runtest_teardown` stops each one
after the last test that needs it instead of at the end of the session.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sglang_real import GPU_SETS, SglangOracle, sglang_id

_ORACLES: dict[str, SglangOracle] = {}  # GPU set -> its live oracle
_LAST_USER: dict[str, str] = {}  # GPU set -> nodeid of the last collected test using its oracle


@pytest.fixture(scope="session", params=GPU_SETS, ids=[sglang_id(s) for s in GPU_SETS])
def sglang(request: pytest.FixtureRequest) -> Iterator[SglangOracle]:
    """A subprocess with one GPU set's pinned sglang imported (installed on first use; needs PyPI then)."""
    oracle = _ORACLES[request.param] = SglangOracle(request.param)
    yield oracle
    oracle.close()
    _ORACLES.pop(request.param, None)


def _oracle_set(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("sglang") if callspec is not None and "sglang" in item.fixturenames else None


def pytest_collection_finish(session: pytest.Session) -> None:
    """Note each oracle's last test in the final (reordered, deselected) run order."""
    _LAST_USER.clear()
    for item in session.items:
        gpu_set = _oracle_set(item)
        if gpu_set is not None:
            _LAST_USER[gpu_set] = item.nodeid


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop an oracle once no later test needs it (its memory is then free for the rest of the run)."""
    gpu_set = _oracle_set(item)
    if gpu_set is not None and _LAST_USER.get(gpu_set) == item.nodeid and gpu_set in _ORACLES:
        _ORACLES.pop(gpu_set).close()


@pytest.fixture
def tmpfs() -> Iterator[Callable[[Path, int | str], Path]]:
    """mount(path, size): a real tmpfs of `size` (bytes, or "1g") mounted at `path`, unmounted after the
    test. Mounting needs root: without it the test is skipped, saying so."""
    mounted: list[Path] = []

    def mount(path: Path, size: int | str) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}): needs root")
        mounted.append(path)
        return path

    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", str(path)], check=False)

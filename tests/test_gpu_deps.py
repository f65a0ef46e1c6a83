"""The GPU install (`bash setup.sh --gpu`) resolves for the GPU machines: linux x86_64, Python 3.11 and 3.12.

Runs `uv pip compile` of what setup.sh --gpu installs (requirements-cpu.txt without its CPU torch,
plus the project's `gpu` extra) for the manylinux_2_34 x86_64 platform, wheels only, and reads the
lock. Needs the package index (PyPI), nothing else: no GPU, nothing installed.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from sglang_real import ROUTER_SIDE_PACKAGES, SIDE_PACKAGES, SIDE_PACKAGES_OFF_GPU_SET, _uv, pinned

ROOT = Path(__file__).resolve().parents[1]
PLATFORM = "x86_64-manylinux_2_34"
# The newest manylinux tag among the resolved wheels: sglang 0.5.23 ships manylinux_2_34 only.
GLIBC_FLOOR = (2, 34)


def gpu_requirements(tmp: Path) -> Path:
    """requirements-cpu.txt minus its torch pin, as setup.sh --gpu writes it (sglang brings its own torch)."""
    lines = (ROOT / "requirements-cpu.txt").read_text().splitlines()
    out = tmp / "requirements-gpu.txt"
    out.write_text("\n".join(line for line in lines if not line.startswith("torch==")) + "\n")
    return out


def compile_gpu_set(python: str, tmp: Path) -> tuple[subprocess.CompletedProcess, Path]:
    lock = tmp / f"pylock.py{python.replace('.', '')}.toml"
    command = [
        _uv(), "pip", "compile", str(ROOT / "pyproject.toml"), str(gpu_requirements(tmp)), "--extra", "gpu",
        "--python-platform", PLATFORM, "--python-version", python, "--only-binary", ":all:", "--no-python-downloads",
        "--no-header", "--quiet", "-o", str(lock),
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT), lock


@pytest.fixture(scope="module", params=["3.11", "3.12"])
def gpu_lock(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    done, lock = compile_gpu_set(request.param, tmp_path_factory.mktemp("gpu-lock"))
    if done.returncode != 0:
        pytest.fail(f"the gpu extra does not resolve for {PLATFORM}, Python {request.param}:\n{done.stderr}")
    return tomllib.loads(lock.read_text())


def versions(lock: dict) -> dict[str, str]:
    return {package["name"]: package["version"] for package in lock["packages"]}


def test_setup_gpu_installs_the_plain_gpu_extra() -> None:
    script = (ROOT / "setup.sh").read_text()
    assert "grep -v '^torch==' \"$ROOT/requirements-cpu.txt\"" in script
    assert '-e "$ROOT[gpu]"' in script and "sglang[" not in script


def test_gpu_extra_pins_exact_versions() -> None:
    assert (pinned("sglang"), pinned("sglang-router"), pinned("megatron-core")) == ("0.5.23", "0.3.2", "0.16.1")


def test_gpu_set_resolves_with_the_cpu_pins_and_exact_engine(gpu_lock: dict) -> None:
    found = versions(gpu_lock)
    assert found["sglang"] == pinned("sglang")
    assert found["sglang-router"] == pinned("sglang-router")
    assert found["megatron-core"] == pinned("megatron-core")
    assert found["pyyaml"] == "6.0.3"  # sglang[all]'s diffusion extra would need 6.0.1
    assert found["torch"] == "2.14.1"  # sglang's own pin: the CUDA 13 build


def test_side_install_uses_the_gpu_set_versions(gpu_lock: dict) -> None:
    """The conformance tests import sglang next to the same helper packages a GPU machine gets."""
    found = versions(gpu_lock)
    for requirement in SIDE_PACKAGES + ROUTER_SIDE_PACKAGES:
        name, version = requirement.split("==")
        if name not in SIDE_PACKAGES_OFF_GPU_SET:
            assert found.get(name) == version, f"{name}: side install {version}, GPU set {found.get(name)}"


def glibc_floor(wheel: str) -> tuple[int, int]:
    """The oldest glibc a wheel file runs on: the lowest of its manylinux tags, (0, 0) for pure Python."""
    tags = [(int(a), int(b)) for a, b in re.findall(r"manylinux_(\d+)_(\d+)_x86_64", wheel)]
    tags += [(2, 17)] * ("manylinux2014_x86_64" in wheel)
    return min(tags) if tags else (0, 0)


def test_glibc_floor_of_the_resolved_wheels(gpu_lock: dict) -> None:
    """Per package the most permissive x86_64 wheel, then the strictest package: the glibc a machine needs."""
    floors = {}
    for package in gpu_lock["packages"]:
        wheels = [Path(w.get("name") or w["url"]).name for w in package.get("wheels", [])]
        x86 = [w for w in wheels if "x86_64" in w or w.endswith("-any.whl")]
        assert x86, f"{package['name']} has no linux x86_64 wheel"
        floors[package["name"]] = min(glibc_floor(w) for w in x86)
    strictest = max(floors.values())
    assert strictest == GLIBC_FLOOR
    assert [name for name, floor in floors.items() if floor == strictest] == ["sglang"]

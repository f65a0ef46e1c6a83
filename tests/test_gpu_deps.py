"""setup.sh's GPU sets: which set a machine gets, and that what it would install resolves for it.

`bash setup.sh --gpu --dry-run` runs against a stand-in machine: `nvidia-smi` (the driver), `getconf` / `ldd`
(glibc) and the interpreter are small scripts on a PATH that holds nothing else of the host (so a real
nvidia-smi on a GPU runner cannot leak in). It must pick cu12 for an R525-R579 driver, cu13 for R580+, refuse
older drivers and unreadable ones with a sentence that says what it read and what to do, honour
`--gpu-set`, and create nothing.

Then every set's printed `requirements:` line is resolved with `uv pip compile`, with the platform and
Python of its printed `lock:` line (the set's manylinux floor, each Python it supports), wheels only: the
lock must hold the set's torch / sglang / transformers and every pin of its requirement files, the glibc
floor computed from the lock's wheels must be the one setup.sh enforces, and the sglang conformance
harness's side packages (tests/sglang_real.py) must be the set's versions. Needs the package index
(PyPI); no GPU, nothing installed. Each set x Python is compiled once per module.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import sglang_real
from sglang_real import _uv, pinned

ROOT = Path(__file__).resolve().parents[1]
BASH = shutil.which("bash") or "/bin/bash"
PYTHONS = ("3.11", "3.12")  # both sets; test_unsupported_python_is_refused bounds the list on both sides
EXPECTED = {  # the engine stack each set exists for (docs/gpu.md, "Install")
    "cu12": {"torch": "2.9.1", "sglang": "0.5.10", "transformers": "5.3.0"},
    "cu13": {"torch": "2.14.1", "sglang": "0.5.23", "transformers": "5.19.0"},
}
DRIVER_OF = {"cu12": "550.54.15", "cu13": "580.65.06"}  # a driver each set is picked for
# What the dry run runs besides the stand-ins; symlinked into the stand-in machine's PATH.
HOST_TOOLS = ("cat", "cut", "dirname", "grep", "head", "paste", "realpath", "sed", "sort", "tr", "uname", "wc")


@dataclass
class DryRun:
    returncode: int
    stdout: str
    stderr: str

    def fact(self, key: str) -> str:
        """The value of the plan line `key: value` (exactly one)."""
        found = [line.split(": ", 1)[1] for line in self.stdout.splitlines() if line.startswith(f"{key}: ")]
        assert len(found) == 1, f"expected one '{key}:' line, got {found}\n{self.stdout}\n{self.stderr}"
        return found[0]

    @property
    def requirements(self) -> list[str]:
        return shlex.split(self.fact("requirements"))

    @property
    def lock_flags(self) -> list[str]:
        """The flags setup.sh compiles the set's lock with: between `<requirements>` and `-o`."""
        words = shlex.split(self.fact("lock").split(",")[0])
        return words[words.index("<requirements>") + 1:words.index("-o")]


def script(path: Path, body: str) -> None:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def machine(root: Path, driver: str | None = "550.54.15", glibc: str | None = "2.35", ldd: str | None = None,
            python: str = "3.12.3", smi_exit: int = 0) -> tuple[Path, Path]:
    """A stand-in machine: its PATH folder and its interpreter. `driver` is what nvidia-smi prints for
    --query-gpu=driver_version (one line a GPU; None: no nvidia-smi); glibc what getconf reports (None:
    getconf fails); ldd the first line of `ldd --version` (None: no ldd)."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True)
    for tool in HOST_TOOLS:
        found = shutil.which(tool)
        assert found, f"the dry run needs {tool} on this machine"
        (bin_dir / tool).symlink_to(found)
    if driver is not None:
        lines = "".join(f"echo {shlex.quote(line)}\n" for line in driver.split("\n"))
        script(bin_dir / "nvidia-smi", f'case "$*" in\n  *driver_version*) {lines} exit {smi_exit} ;;\n'
               '  *-L*) echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)" ;;\nesac')
    script(bin_dir / "getconf", f"echo {shlex.quote(f'glibc {glibc}')}" if glibc else "echo 'getconf: unknown variable' >&2; exit 1")
    if ldd is not None:
        script(bin_dir / "ldd", f"echo {shlex.quote(ldd)}")
    interpreter = root / "python"
    script(interpreter, f"echo {python}")
    return bin_dir, interpreter


def dry_run(root: Path, *flags: str, **stand_in: object) -> DryRun:
    """`bash setup.sh [flags] --dry-run` on the stand-in machine; asserts it created nothing."""
    bin_dir, interpreter = machine(root, **stand_in)  # type: ignore[arg-type]
    venv = root / "venv"
    done = subprocess.run([BASH, str(ROOT / "setup.sh"), *flags, "--dry-run", "--venv", str(venv),
                           "--python", str(interpreter)], env={"PATH": str(bin_dir), "HOME": str(root)},
                          cwd=root, capture_output=True, text=True, timeout=60)
    assert not venv.exists(), "a dry run created the venv"
    return DryRun(done.returncode, done.stdout, done.stderr)


def set_args(gpu_set: str) -> list[str]:
    return ["pyproject.toml", f"requirements-gpu-{gpu_set}.txt", "--extra", f"gpu-{gpu_set}"]


# ---- which set a machine gets ----------------------------------------------------------------------

@pytest.mark.parametrize(("driver", "gpu_set"), [
    ("550.54.15", "cu12"), ("525.60.13", "cu12"), ("535.104.05", "cu12"), ("575.57.08", "cu12"),
    ("580.65.06", "cu13"), ("590.44.01", "cu13"),
])
def test_driver_picks_the_set(tmp_path: Path, driver: str, gpu_set: str) -> None:
    run = dry_run(tmp_path, "--gpu", driver="\n".join([driver] * 4))

    assert run.returncode == 0, run.stderr
    assert run.fact("driver").startswith(f"{driver} (nvidia-smi") and "4 GPU" in run.fact("driver")
    assert run.fact("set").startswith(f"{gpu_set} ") and driver in run.fact("set")
    assert run.requirements == set_args(gpu_set)
    assert "WARNING" not in run.stderr


def test_auto_mode_reads_the_driver_too(tmp_path: Path) -> None:
    """Without --gpu: nvidia-smi -L lists a GPU, so the GPU path, with the same pick."""
    run = dry_run(tmp_path, driver="580.65.06")
    assert run.returncode == 0 and run.fact("mode").startswith("gpu") and run.requirements == set_args("cu13")


@pytest.mark.parametrize("driver", ["470.256.02", "525.60.12", "418.226.00"])
def test_old_driver_is_refused_naming_it(tmp_path: Path, driver: str) -> None:
    run = dry_run(tmp_path, "--gpu", driver=driver)

    assert run.returncode == 2
    assert f"NVIDIA driver {driver}" in run.stderr and "525.60.13" in run.stderr and "R580" in run.stderr
    assert "Upgrade the driver" in run.stderr and "--cpu" in run.stderr
    assert "requirements:" not in run.stdout


@pytest.mark.parametrize(("driver", "smi_exit", "said"), [
    ("[N/A]", 0, "printed '[N/A]', not a driver version"),
    ("", 0, "no driver version (an empty answer)"),
    ("Failed to initialize NVML: Driver/library version mismatch", 0, "printed 'Failed to initialize NVML: Driver/library version mismatch'"),
    ("550.54.15\n535.104.05", 0, "several driver versions (535.104.05,550.54.15)"),
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver", 9,
     "failed (exit 9: 'NVIDIA-SMI has failed"),
])
def test_unreadable_driver_says_what_it_read(tmp_path: Path, driver: str, smi_exit: int, said: str) -> None:
    run = dry_run(tmp_path, "--gpu", driver=driver, smi_exit=smi_exit)

    assert run.returncode == 2
    assert said in run.stderr and "--gpu-set cu13" in run.stderr and "--gpu-set cu12" in run.stderr
    assert "requirements:" not in run.stdout


def test_gpu_without_nvidia_smi(tmp_path: Path) -> None:
    refused = dry_run(tmp_path / "a", "--gpu", driver=None)
    chosen = dry_run(tmp_path / "b", "--gpu-set", "cu13", driver=None)  # e.g. a venv built without GPUs

    assert refused.returncode == 2
    assert "nvidia-smi is not on PATH" in refused.stderr and "Install the NVIDIA driver" in refused.stderr
    assert "--gpu-set" in refused.stderr and "--cpu" in refused.stderr
    assert chosen.returncode == 0 and chosen.requirements == set_args("cu13")
    assert chosen.fact("driver").startswith("not read (nvidia-smi is not on PATH)")
    assert "WARNING" in chosen.stderr and "R580+" in chosen.stderr


def test_cpu_is_the_default_without_nvidia_smi(tmp_path: Path) -> None:
    run = dry_run(tmp_path, driver=None, python="3.11.9")

    assert run.returncode == 0, run.stderr
    assert run.fact("mode") == "cpu (nvidia-smi is not on PATH)"
    assert run.requirements[:3] == ["requirements-cpu.txt", "-c", "constraints-cpu.txt"]
    assert "driver:" not in run.stdout


@pytest.mark.parametrize(("driver", "gpu_set", "loud"), [
    ("550.54.15", "cu13", True),  # CUDA 13 on an R550 driver: torch would not see the GPUs
    ("470.256.02", "cu12", True),
    ("580.65.06", "cu12", False),  # a newer driver runs older CUDA: no contradiction
    ("550.54.15", "cu12", False),
])
def test_gpu_set_overrides_the_driver(tmp_path: Path, driver: str, gpu_set: str, loud: bool) -> None:
    run = dry_run(tmp_path, "--gpu-set", gpu_set, driver=driver)

    assert run.returncode == 0, run.stderr
    assert run.requirements == set_args(gpu_set) and run.fact("set").startswith(f"{gpu_set} (")
    assert ("CONTRADICTS THIS MACHINE'S DRIVER" in run.stderr) is loud
    if loud:
        assert driver in run.stderr


def test_bad_gpu_set_flags(tmp_path: Path) -> None:
    unknown = dry_run(tmp_path / "a", "--gpu-set", "cu11", driver="580.65.06")
    both = dry_run(tmp_path / "b", "--cpu", "--gpu-set", "cu12", driver="580.65.06")

    assert unknown.returncode == 2 and "--gpu-set takes cu12 or cu13, got 'cu11'" in unknown.stderr
    assert both.returncode == 2 and "--cpu" in both.stderr and "--gpu-set cu12" in both.stderr


def test_r580_on_old_glibc_gets_the_cuda12_set(tmp_path: Path) -> None:
    """cu13 needs glibc 2.34; an R580+ driver runs CUDA 12 too, so on glibc 2.28-2.33 the cu12 set."""
    run = dry_run(tmp_path, "--gpu", driver="580.65.06", glibc="2.31")

    assert run.returncode == 0, run.stderr
    assert run.requirements == set_args("cu12")
    assert "glibc 2.31" in run.fact("set") and "2.34" in run.fact("set") and "older CUDA" in run.fact("set")


@pytest.mark.parametrize(("flags", "driver", "glibc", "fix"), [
    (("--gpu",), "580.65.06", "2.17", "newer Linux"),
    (("--gpu",), "550.54.15", "2.27", "newer Linux"),
    (("--gpu-set", "cu13"), "580.65.06", "2.31", "--gpu-set cu12"),
])
def test_glibc_below_the_set_is_refused(tmp_path: Path, flags: tuple[str, ...], driver: str, glibc: str,
                                        fix: str) -> None:
    run = dry_run(tmp_path, *flags, driver=driver, glibc=glibc)

    assert run.returncode == 2
    assert f"glibc {glibc} (getconf GNU_LIBC_VERSION) is older than" in run.stderr and fix in run.stderr


def test_glibc_from_ldd_when_getconf_fails(tmp_path: Path) -> None:
    read = dry_run(tmp_path / "a", "--gpu", driver="550.54.15", glibc=None, ldd="ldd (GNU libc) 2.28")
    unknown = dry_run(tmp_path / "b", "--gpu", driver="550.54.15", glibc=None, ldd="musl libc (x86_64)")

    assert read.returncode == 0 and read.fact("glibc").startswith("2.28 (ldd --version)")
    assert unknown.returncode == 2
    assert "could not read the C library's version" in unknown.stderr and "musl libc" in unknown.stderr


@pytest.mark.parametrize("python", ["3.10.13", "3.13.0", "3.14.1"])
def test_unsupported_python_is_refused(tmp_path: Path, python: str) -> None:
    run = dry_run(tmp_path, "--gpu", driver="580.65.06", python=python)

    assert run.returncode == 2
    assert f"Python {python}" in run.stderr and "3.11 or 3.12" in run.stderr and "--python" in run.stderr


def test_interpreter_that_does_not_run(tmp_path: Path) -> None:
    bin_dir, _ = machine(tmp_path, driver="580.65.06")
    done = subprocess.run([BASH, str(ROOT / "setup.sh"), "--gpu", "--dry-run", "--venv", str(tmp_path / "venv"),
                           "--python", "python3.99"], env={"PATH": str(bin_dir)}, capture_output=True, text=True)
    assert done.returncode == 2 and "'python3.99' does not run" in done.stderr


def test_a_venv_keeps_its_set(tmp_path: Path) -> None:
    """Another set over a venv would leave the first set's packages (its CUDA torch, sglang) behind."""
    bin_dir, interpreter = machine(tmp_path, driver="550.54.15")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(interpreter)
    (venv / ".stateful-rl-set").write_text("gpu-cu13\n")
    done = subprocess.run([BASH, str(ROOT / "setup.sh"), "--dry-run", "--venv", str(venv)], cwd=tmp_path,
                          env={"PATH": str(bin_dir)}, capture_output=True, text=True)
    assert done.returncode == 2 and "holds the gpu-cu13 set; installing the gpu-cu12 set" in done.stderr


# ---- what each set resolves to --------------------------------------------------------------------

@dataclass
class Resolved:
    gpu_set: str
    python: str
    plan: DryRun
    lock: dict

    @property
    def versions(self) -> dict[str, str]:
        return {package["name"]: package["version"] for package in self.lock["packages"]}


_RESOLVED: dict[tuple[str, str], Resolved] = {}


@pytest.fixture(params=[(s, p) for s in EXPECTED for p in PYTHONS], ids=lambda sp: f"{sp[0]}-py{sp[1]}")
def resolved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Resolved:
    """The dry run of a machine that gets the set, and `uv pip compile` of exactly what it printed."""
    gpu_set, python = request.param
    if request.param not in _RESOLVED:
        root = tmp_path_factory.mktemp(f"{gpu_set}-py{python}")
        plan = dry_run(root, "--gpu", driver=DRIVER_OF[gpu_set], glibc="2.39", python=f"{python}.4")
        assert plan.returncode == 0, plan.stderr
        lock_file = root / f"pylock.{gpu_set}.toml"  # pylock: the lock lists each package's wheels
        command = [_uv(), "pip", "compile", *plan.requirements, *plan.lock_flags, "--no-python-downloads",
                   "--no-header", "--quiet", "-o", str(lock_file)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
        if done.returncode != 0:
            pytest.fail(f"the {gpu_set} set does not resolve:\n$ {shlex.join(command)}\n{done.stderr}")
        _RESOLVED[request.param] = Resolved(gpu_set, python, plan, tomllib.loads(lock_file.read_text()))
    return _RESOLVED[request.param]


def platform_glibc(flags: list[str]) -> tuple[int, int]:
    match = re.fullmatch(r"x86_64-manylinux_(\d+)_(\d+)", flags[flags.index("--python-platform") + 1])
    assert match, flags
    return int(match[1]), int(match[2])


def test_lock_is_the_set_for_that_python(resolved: Resolved) -> None:
    flags = resolved.plan.lock_flags
    assert flags[flags.index("--python-version") + 1] == resolved.python
    assert flags[flags.index("--only-binary") + 1] == ":all:"
    found = resolved.versions
    for package, version in EXPECTED[resolved.gpu_set].items():
        assert found.get(package) == version, f"{resolved.gpu_set}: {package} {found.get(package)}, expected {version}"
    for package in ("sglang", "sglang-router", "megatron-core"):
        assert found[package] == pinned(package, resolved.gpu_set)


def requirement_pins(path: Path) -> dict[str, str]:
    """`name==version` lines of a requirements file and the files it includes (-r), names normalised."""
    pins: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line.startswith("-r "):
            pins.update(requirement_pins(path.parent / line[3:].strip()))
        elif "==" in line:
            name, version = line.split("==")
            pins[re.sub(r"[-_.]+", "-", name.split("[")[0]).lower()] = version.strip()
    return pins


def test_lock_keeps_every_pin_of_the_requirement_files(resolved: Resolved) -> None:
    pins = requirement_pins(ROOT / f"requirements-gpu-{resolved.gpu_set}.txt")
    assert {"torch", "transformers", "tokenizers", "pyyaml"} <= pins.keys()
    found = resolved.versions
    assert {name: found.get(name) for name in pins} == pins


def glibc_floor(wheel: str) -> tuple[int, int]:
    """The oldest glibc a wheel file runs on: the lowest of its manylinux tags, (0, 0) for pure Python."""
    tags = [(int(a), int(b)) for a, b in re.findall(r"manylinux_(\d+)_(\d+)_x86_64", wheel)]
    tags += [(2, 17)] * ("manylinux2014_x86_64" in wheel) + [(2, 12)] * ("manylinux2010_x86_64" in wheel)
    tags += [(2, 5)] * ("manylinux1_x86_64" in wheel)
    return min(tags) if tags else (0, 0)


def test_setup_enforces_the_glibc_floor_of_the_resolved_wheels(resolved: Resolved, tmp_path: Path) -> None:
    """Per package the most permissive wheel the lock lists (it lists every wheel the platform accepts),
    then the strictest package: the glibc a machine needs. setup.sh must refuse exactly below it."""
    floors = {}
    for package in resolved.lock["packages"]:
        wheels = [Path(w.get("name") or w["url"]).name for w in package.get("wheels", [])]
        assert wheels, f"{package['name']} has no wheel for {resolved.plan.lock_flags}"
        floors[package["name"]] = min(glibc_floor(w) for w in wheels)
    floor = max(floors.values())
    setting = sorted(name for name, f in floors.items() if f == floor)
    assert platform_glibc(resolved.plan.lock_flags) == floor, f"wheels need glibc {floor} ({setting})"

    major, minor = floor
    gpu_set = resolved.gpu_set
    at_floor = dry_run(tmp_path / "at", "--gpu-set", gpu_set, driver=DRIVER_OF[gpu_set], glibc=f"{major}.{minor}")
    below = dry_run(tmp_path / "below", "--gpu-set", gpu_set, driver=DRIVER_OF[gpu_set],
                    glibc=f"{major}.{minor - 1}")
    assert at_floor.returncode == 0, at_floor.stderr
    assert at_floor.fact("glibc").endswith(f"{gpu_set} needs {major}.{minor}+")
    assert below.returncode == 2 and f"is older than {major}.{minor}, which the {gpu_set} set needs" in below.stderr
    # ... and the package setup.sh names as the reason is one that sets the floor, at the lock's version.
    reason = re.search(r"\((\S+) (\S+)'s wheels are manylinux_(\d+)_(\d+)", below.stderr)
    assert reason, below.stderr
    assert reason[1] in setting and resolved.versions[reason[1]] == reason[2]
    assert (int(reason[3]), int(reason[4])) == floor


def test_side_install_uses_the_set_versions(resolved: Resolved) -> None:
    """The conformance tests import each set's sglang next to the helper packages that set's machine gets."""
    side = sglang_real.SIDE_PACKAGES
    router = sglang_real.ROUTER_SIDE_PACKAGES
    off = sglang_real.SIDE_PACKAGES_OFF_GPU_SET
    if isinstance(side, dict):
        side = side[resolved.gpu_set]
    elif resolved.gpu_set != "cu13":
        pytest.skip("tests/sglang_real.py has one side install, the cu13 set's")
    if isinstance(router, dict):
        router = router[resolved.gpu_set]
    if isinstance(off, dict):
        off = off[resolved.gpu_set]
    found = resolved.versions
    wrong = {}
    for requirement in (*side, *router):
        name, version = requirement.split("==")
        if name not in off and found.get(name) != version:
            wrong[name] = (version, found.get(name))
    assert wrong == {}, f"side install vs the {resolved.gpu_set} set (side, set): {wrong}"


def test_cpu_dry_run_resolves_to_the_cpu_torch(tmp_path: Path) -> None:
    """The CPU path's `requirements:` line resolves to torch 2.13.0's CPU build and the constraints."""
    run = dry_run(tmp_path, "--cpu", driver=None, python="3.11.9")
    assert run.returncode == 0, run.stderr
    command = [_uv(), "pip", "compile", *run.requirements, "--python-version", "3.11", "--python-platform",
               "x86_64-manylinux_2_28", "--no-python-downloads", "--no-header", "--no-annotate", "--quiet"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "torch==2.13.0+cpu" in done.stdout.splitlines()

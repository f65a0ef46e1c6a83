"""The pinned sglangs' own code on a CPU test machine: side installs, used from subprocesses.

Why: the project talks to SGLang engines over HTTP and launches them with command-line flags, and
the only honest check of that contract is sglang's own `ServerArgs` parser, `io_struct` request
classes and FastAPI route table. There are two pinned sglangs, one per GPU set (GPU_SETS:
sglang 0.5.10 in gpu-cu12, 0.5.23 in gpu-cu13), and every check runs against both (tests/conftest.py's
`sglang` fixture). `pip install sglang` would replace the CPU torch with a CUDA one, so each pinned
wheel is installed *without its dependencies* into its own git-ignored side folder
(`.cache/sglang-<version>/`), with the few real packages its import chain needs (SIDE_PACKAGES[set])
and import-only stubs for libraries the checks never execute (STUBS, in tests/sglang_stubs/).

sglang is imported only in subprocesses (`sglang_env(gpu_set)`), never in the pytest process: the
stubs and sglang's import-time side effects (logging set-up, a torchvision that transformers would
then see) must not leak into the other tests. `SglangOracle(gpu_set)` keeps one such subprocess and
answers questions about sglang's real objects over JSON lines.

The install needs the package index (PyPI); without it the harness fails with a message saying so.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STUBS_DIR = Path(__file__).resolve().parent / "sglang_stubs"
CACHE_DIR = ROOT / ".cache"

GPU_SETS = ("cu12", "cu13")  # pyproject.toml's extras gpu-cu12 / gpu-cu13 (setup.sh --gpu-set)

# Per GPU set: the real packages (installed with --no-deps next to that set's sglang) that the import
# chain of sglang.srt.server_args, .managers.io_struct, .entrypoints.http_server and the weight-update
# code needs and the CPU venv lacks, or has at another version than the set. Versions are those of the
# set's resolution (`uv pip compile pyproject.toml requirements-gpu-<set>.txt --extra gpu-<set>`;
# tests/test_gpu_deps.py checks that they agree), except triton: the sets' tritons (3.5.1 with torch
# 2.9.1, 3.8.0 with torch 2.14.1) go with their CUDA torch; 3.7.1 is the one torch 2.13.0 (our CPU
# build) was released with. sglang imports it at module level; nothing here runs a kernel.
# cu12 also takes its own transformers / tokenizers: the CPU venv has cu13's (5.19.0 / 0.23.2), and
# sglang 0.5.10's model configs are checked against the transformers a cu12 machine gets.
SIDE_PACKAGES: dict[str, tuple[str, ...]] = {
    "cu12": (
        "apache-tvm-ffi==0.1.15.post2",
        "compressed-tensors==0.15.0.1",
        "dill==0.4.1",
        "einops==0.8.2",
        "gguf==0.19.0",
        "loguru==0.7.3",
        "msgspec==0.23.0",
        "openai==2.6.1",
        "partial-json-parser==0.2.1.1.post7",
        "pillow==13.0.0",
        "psutil==7.2.2",
        "pybase64==1.5.1",
        "pyzmq==27.3.0",
        "sentencepiece==0.2.3",
        "setproctitle==1.3.8",
        "soundfile==0.13.1",
        "tokenizers==0.22.2",
        "transformers==5.3.0",
        "triton==3.7.1",
        "uvloop==0.23.0",
        "xgrammar==0.1.32",
    ),
    "cu13": (
        "apache-tvm-ffi==0.1.11",
        "compressed-tensors==0.18.0",
        "dill==0.4.1",
        "einops==0.8.2",
        "gguf==0.19.0",
        "loguru==0.7.3",
        "msgspec==0.23.0",
        "openai==2.8.0",
        "partial-json-parser==0.2.1.1.post7",
        "pillow==13.0.0",
        "psutil==7.2.2",
        "pybase64==1.5.1",
        "pyzmq==27.3.0",
        "sentencepiece==0.2.1",
        "setproctitle==1.3.8",
        "soundfile==0.13.1",
        "triton==3.7.1",
        "uvloop==0.23.0",
        "xgrammar==0.2.7",
    ),
}
# sglang-router's own launcher needs these besides the CPU venv (aiohttp, orjson, uvicorn, fastapi).
# sglang-router 0.3.2 is pinned by both sets and does not depend on sglang: one install serves both.
ROUTER_SIDE_PACKAGES: tuple[str, ...] = ("setproctitle==1.3.8",)
# Packages the side install takes from the GPU set at a different version on purpose (see above).
SIDE_PACKAGES_OFF_GPU_SET = frozenset({"triton"})

# Import-only stubs: name -> (the GPU sets whose sglang needs it, why it is a stub and not the real
# package). A stub all sets need lives in tests/sglang_stubs/<name>, one set's in tests/sglang_stubs/<set>/<name>.
STUBS: dict[str, tuple[tuple[str, ...], str]] = {
    "IPython": (GPU_SETS, "sglang.utils imports IPython.display (HTML, display) for notebook output; the real "
                "IPython pulls a dozen packages (jedi, traitlets, prompt_toolkit, ...) for two names no check uses"),
    "torchvision": (GPU_SETS, "imported at module level by sglang's multimodal processors and configs (InternVL, "
                    "Qwen-VL, DeepSeek-OCR, ...) on the way to io_struct; PyPI's torchvision is built against CUDA "
                    "torch and fails to load its operators on the CPU torch, and no check touches an image"),
    "sgl_kernel": (("cu12",), "the sglang-kernel wheel (CUDA kernels): sglang 0.5.10's host KV-cache pool imports "
                   "sgl_kernel.kvcacheio at module level on every platform but NPU/XPU/MPS (0.5.23 only on "
                   "CUDA/ROCm), on the way to io_struct; its extension needs libcuda, and no check runs a kernel"),
}


class SglangUnavailable(RuntimeError):
    """The pinned sglang could not be installed into its side folder."""


def pinned(package: str, gpu_set: str = "cu13") -> str:
    """The exact version of `package` that the `gpu-<gpu_set>` extra of pyproject.toml pins (`name==X`)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    extra = extras[f"gpu-{gpu_set}"]
    for requirement in extra:
        match = re.fullmatch(rf"{re.escape(package)}==([\w.+-]+)(\s*;.*)?", requirement.strip())
        if match:
            return match.group(1)
    raise SglangUnavailable(f"pyproject.toml's gpu-{gpu_set} extra has no exact pin '{package}==<version>'")


def _check_set(gpu_set: str) -> str:
    if gpu_set not in GPU_SETS:
        raise ValueError(f"unknown GPU set {gpu_set!r}: use one of {', '.join(GPU_SETS)} (pyproject.toml's gpu-<set> extras)")
    return gpu_set


def sglang_id(gpu_set: str) -> str:
    """A test id naming the sglang version a GPU set pins: `sglang-0.5.10`."""
    return f"sglang-{pinned('sglang', _check_set(gpu_set))}"


def side_dir(gpu_set: str) -> Path:
    """Where a set's pinned sglang lives: .cache/sglang-<version>/site (git-ignored)."""
    return CACHE_DIR / sglang_id(gpu_set) / "site"


def stub_dirs(gpu_set: str) -> list[Path]:
    """The stub folders on a set's PYTHONPATH: the shared one, then the set's own (if it has stubs)."""
    own = STUBS_DIR / _check_set(gpu_set)
    return [STUBS_DIR, own] if own.is_dir() else [STUBS_DIR]


def _uv() -> str:
    """uv from the venv (setup.sh installs it there), else from PATH."""
    local = Path(sys.executable).parent / "uv"
    if local.exists():
        return str(local)
    found = shutil.which("uv")
    if found is None:
        raise SglangUnavailable("uv is not installed: run `bash setup.sh --deps-only` (it installs uv into .venv)")
    return found


def side_install(target: Path, wanted: list[str]) -> Path:
    """Install `wanted` (exact pins, no dependencies) into `target` once; return it.

    Safe for concurrent test processes (a file lock) and for interrupted installs (the folder is
    built next to its final place and renamed in when complete); reinstalled when the pins change.
    """
    stamp = hashlib.sha256("\n".join([sys.version, *wanted]).encode()).hexdigest()
    stamp_file = target / ".installed"
    if stamp_file.exists() and stamp_file.read_text() == stamp:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp_file.exists() and stamp_file.read_text() == stamp:
            return target
        building = target.parent / f"{target.name}.partial"
        shutil.rmtree(building, ignore_errors=True)
        command = [_uv(), "pip", "install", "--python", sys.executable, "--no-deps", "--quiet",
                   "--target", str(building), *wanted]
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise SglangUnavailable(
                f"installing {wanted[0]} into {building} failed (it needs the package index, PyPI):\n"
                f"$ {' '.join(command)}\n{done.stderr.strip()}"
            )
        (building / ".installed").write_text(stamp)
        shutil.rmtree(target, ignore_errors=True)
        building.rename(target)
    return target


def real_sglang(gpu_set: str) -> Path:
    """A GPU set's pinned sglang and its SIDE_PACKAGES, installed without dependencies in .cache/ (once)."""
    return side_install(side_dir(gpu_set), [f"sglang=={pinned('sglang', gpu_set)}", *SIDE_PACKAGES[gpu_set]])


def real_sglang_router() -> Path:
    """The pinned sglang-router (a Rust binary with a Python launcher, runs on CPU) in its own folder,
    so that putting it on sys.path exposes `sglang_router` and nothing of sglang. Both GPU sets pin
    the same version (tests/test_sglang_real.py checks it)."""
    version = pinned("sglang-router")
    return side_install(CACHE_DIR / f"sglang-router-{version}" / "site",
                        [f"sglang-router=={version}", *ROUTER_SIDE_PACKAGES])


def sglang_env(gpu_set: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a subprocess that imports a set's real sglang (side folder + stubs on PYTHONPATH)."""
    env = dict(os.environ if base is None else base)
    paths = [str(real_sglang(gpu_set)), *map(str, stub_dirs(gpu_set))]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("SGLANG_DISABLE_REQUEST_LOGGING", "1")
    return env


# Qwen3-4B's shape (its Hugging Face config.json), for launch-flag checks: sglang 0.5.10's ServerArgs
# reads the model folder's config while parsing (0.5.23 does not), so the checks need a real config.
QWEN3_4B_CONFIG: dict[str, Any] = dict(
    architectures=["Qwen3ForCausalLM"], vocab_size=151936, hidden_size=2560, intermediate_size=9728,
    num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
    rope_theta=1_000_000.0, max_position_embeddings=40960, rms_norm_eps=1e-6, bos_token_id=151643,
    eos_token_id=151645,
)


def qwen3_4b_folder(folder: str | os.PathLike, dtype: str = "bfloat16", **overrides: Any) -> Path:
    """Write a Hugging Face folder holding only a Qwen3-4B config.json (no weights: nothing here loads
    them) whose `dtype` is `dtype`; return it."""
    from transformers import Qwen3Config

    folder = Path(folder)
    Qwen3Config(**{**QWEN3_4B_CONFIG, "dtype": dtype, **overrides}).save_pretrained(folder)
    return folder


class SglangOracle:
    """One subprocess with a GPU set's real sglang imported, asked about its parser, structs and routes.

    Each question is a JSON line on the worker's stdin; each answer a JSON line on a private pipe
    (sglang logs to stdout and stderr freely). See tests/sglang_oracle_worker.py for the answers.
    The worker imports torch and sglang (about 0.6 GB resident): tests/conftest.py keeps at most one
    alive and stops each after its last test.
    """

    def __init__(self, gpu_set: str) -> None:
        self.gpu_set = _check_set(gpu_set)
        read_fd, write_fd = os.pipe()
        worker = Path(__file__).resolve().parent / "sglang_oracle_worker.py"
        # sglang's log lines go to a file (a pipe nobody reads would fill up and block the worker).
        self._log = tempfile.TemporaryFile(mode="w+")
        self._proc = subprocess.Popen(
            [sys.executable, str(worker), str(write_fd)], env=sglang_env(gpu_set), stdin=subprocess.PIPE,
            stdout=self._log, stderr=subprocess.STDOUT, pass_fds=(write_fd,), text=True,
        )
        os.close(write_fd)
        self._answers = os.fdopen(read_fd, "r")
        ready = self._answers.readline()
        if not ready:
            raise SglangUnavailable(f"the sglang oracle did not start (an import failed):\n{self.log()[-4000:]}")
        hello = json.loads(ready)
        self.versions: dict[str, str] = hello["versions"]
        self.version = self.versions["sglang"]
        # What this sglang version has that another lacks ({"generate_contract": bool}) and the
        # hardware probes the worker answered in sglang's place (sglang_oracle_worker._answer_device_probe).
        self.features: dict[str, bool] = hello["features"]
        self.stand_ins: list[str] = hello["stand_ins"]

    def __repr__(self) -> str:
        return f"<SglangOracle sglang {self.version} ({self.gpu_set})>"

    def ask(self, question: str, **kwargs: Any) -> Any:
        """Send one question; raise the worker's own error text if it could not answer."""
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps({"q": question, **kwargs}) + "\n")
        self._proc.stdin.flush()
        line = self._answers.readline()
        if not line:
            raise SglangUnavailable(f"the sglang oracle died:\n{self.log()[-4000:]}")
        answer = json.loads(line)
        if "crash" in answer:
            raise RuntimeError(f"sglang oracle could not answer {question}: {answer['crash']}")
        return answer["a"]

    def parse_server_args(self, argv: list[str]) -> dict[str, Any]:
        """sglang's own `prepare_server_args(argv)`: {"error": None | text, "fields": {name: value}}."""
        return self.ask("parse_server_args", argv=argv)

    def routes(self) -> dict[str, list[str]]:
        """Path -> HTTP methods of sglang's FastAPI app (sglang.srt.entrypoints.http_server.app)."""
        return self.ask("routes")

    def body_struct(self, method: str, path: str) -> str | None:
        """The io_struct class sglang's endpoint for (method, path) reads its JSON body into, if any."""
        return self.ask("body_struct", method=method, path=path)

    def validate_body(self, struct: str, body: dict[str, Any]) -> str | None:
        """None if `body` builds io_struct.<struct> exactly (no unknown or missing fields, right types)."""
        return self.ask("validate_body", struct=struct, body=body)

    def check_request(self, method: str, path: str, body: dict[str, Any] | None) -> list[str]:
        """What sglang's server would refuse about this request: no route, a body that does not build
        the endpoint's struct, /generate's JSON contract. An empty list means it would be served."""
        return self.ask("check_request", method=method, path=path, body=body)

    def serving_dtype(self, model_dir: str | os.PathLike, dtype: str = "auto") -> str:
        """The torch dtype name ("bfloat16", "float16", ...) sglang serves the Hugging Face model folder
        `model_dir` in when launched with `--dtype dtype`: sglang's own ModelConfig and its
        `_get_and_verify_dtype` rule (a float32 config under "auto" is served as float16 for Qwen3)."""
        return self.ask("serving_dtype", model_dir=str(model_dir), dtype=dtype)

    def server_info_version(self, model_dir: str | os.PathLike) -> str:
        """The `version` field of sglang's own `GET /server_info` handler's answer, for a server of the
        Hugging Face folder `model_dir` (sglang 0.5.10 reads its config while parsing its arguments)."""
        return self.ask("server_info_version", model_dir=str(model_dir))

    def alive(self) -> bool:
        return self._proc.poll() is None

    def rss_bytes(self) -> int:
        """The worker's resident memory (Linux /proc), for the memory figures in docs/gpu.md."""
        for line in Path(f"/proc/{self._proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError(f"no VmRSS for pid {self._proc.pid}")

    def log(self) -> str:
        """What the worker (sglang) printed so far."""
        self._log.seek(0)
        return self._log.read()

    def close(self) -> None:
        """Stop the worker (again: a no-op)."""
        if self._answers.closed:
            return
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._answers.close()
        self._log.close()

"""The pinned sglang's own code on a CPU test machine: a side install, used from a subprocess.

Why: the project talks to SGLang engines over HTTP and launches them with command-line flags, and
the only honest check of that contract is sglang's own `ServerArgs` parser, `io_struct` request
classes and FastAPI route table. `pip install sglang` would replace the CPU torch with a CUDA one,
so the pinned wheel is installed *without its dependencies* into a git-ignored side folder
(`.cache/sglang-<version>/`), with the few real packages its import chain needs (SIDE_PACKAGES) and
import-only stubs for two libraries the checks never execute (STUBS, in tests/sglang_stubs/).

sglang is imported only in subprocesses (`sglang_env()`), never in the pytest process: the stubs and
sglang's import-time side effects (logging set-up, a torchvision that transformers would then see)
must not leak into the other tests. `SglangOracle` keeps one such subprocess and answers questions
about sglang's real objects over JSON lines.

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

# Real packages (installed with --no-deps next to sglang) that the import chain of
# sglang.srt.server_args, .managers.io_struct and .entrypoints.http_server needs and the CPU venv
# lacks. Versions are those of the GPU resolution (tests/test_gpu_deps.py checks that they agree),
# except triton: the GPU set's triton 3.8.0 goes with torch 2.14.1; 3.7.1 is the one torch 2.13.0
# (our CPU build) was released with. sglang imports it at module level; nothing here runs a kernel.
SIDE_PACKAGES: tuple[str, ...] = (
    "apache-tvm-ffi==0.1.11",
    "compressed-tensors==0.18.0",
    "dill==0.4.1",
    "einops==0.8.2",
    "gguf==0.19.0",
    "loguru==0.7.3",
    "msgspec==0.22.0",
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
)
# Packages the side install takes from the GPU set at a different version on purpose (see above).
SIDE_PACKAGES_OFF_GPU_SET = frozenset({"triton"})

# Import-only stubs (tests/sglang_stubs/<name>): why each one is a stub and not the real package.
STUBS: dict[str, str] = {
    "IPython": "sglang.utils imports IPython.display (HTML, display) for notebook output; the real "
    "IPython pulls a dozen packages (jedi, traitlets, prompt_toolkit, ...) for two names no check uses",
    "torchvision": "imported at module level by sglang's multimodal processors and configs (InternVL, "
    "Qwen-VL, DeepSeek-OCR, ...) on the way to io_struct; PyPI's torchvision is built against CUDA "
    "torch and fails to load its operators on the CPU torch, and no check touches an image",
}


class SglangUnavailable(RuntimeError):
    """The pinned sglang could not be installed into its side folder."""


def pinned(package: str) -> str:
    """The exact version of `package` that the `gpu` extra of pyproject.toml pins (`name==X`)."""
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    for requirement in extra:
        match = re.fullmatch(rf"{re.escape(package)}==([\w.+-]+)(\s*;.*)?", requirement.strip())
        if match:
            return match.group(1)
    raise SglangUnavailable(f"pyproject.toml's gpu extra has no exact pin '{package}==<version>'")


def side_dir() -> Path:
    """Where the pinned sglang lives: .cache/sglang-<version>/site (git-ignored)."""
    return CACHE_DIR / f"sglang-{pinned('sglang')}" / "site"


def _uv() -> str:
    """uv from the venv (setup.sh installs it there), else from PATH."""
    local = Path(sys.executable).parent / "uv"
    if local.exists():
        return str(local)
    found = shutil.which("uv")
    if found is None:
        raise SglangUnavailable("uv is not installed: run `bash setup.sh --deps-only` (it installs uv into .venv)")
    return found


def _wanted() -> list[str]:
    return [f"sglang=={pinned('sglang')}", *SIDE_PACKAGES]


def _stamp() -> str:
    return hashlib.sha256("\n".join([sys.version, *_wanted()]).encode()).hexdigest()


def real_sglang() -> Path:
    """Install the pinned sglang (no dependencies) and SIDE_PACKAGES into the side folder once; return it.

    Safe for concurrent test processes (a file lock) and for interrupted installs (the folder is
    built next to its final place and renamed in when complete).
    """
    target = side_dir()
    stamp_file = target / ".installed"
    if stamp_file.exists() and stamp_file.read_text() == _stamp():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp_file.exists() and stamp_file.read_text() == _stamp():
            return target
        building = target.parent / "site.partial"
        shutil.rmtree(building, ignore_errors=True)
        command = [_uv(), "pip", "install", "--python", sys.executable, "--no-deps", "--quiet",
                   "--target", str(building), *_wanted()]
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise SglangUnavailable(
                f"installing the pinned sglang into {building} failed (it needs the package index, PyPI):\n"
                f"$ {' '.join(command)}\n{done.stderr.strip()}"
            )
        (building / ".installed").write_text(_stamp())
        shutil.rmtree(target, ignore_errors=True)
        building.rename(target)
    return target


def sglang_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a subprocess that imports the real sglang (side folder + stubs on PYTHONPATH)."""
    env = dict(os.environ if base is None else base)
    paths = [str(real_sglang()), str(STUBS_DIR)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("SGLANG_DISABLE_REQUEST_LOGGING", "1")
    return env


class SglangOracle:
    """One subprocess with the real sglang imported, asked about its parser, structs and routes.

    Each question is a JSON line on the worker's stdin; each answer a JSON line on a private pipe
    (sglang logs to stdout and stderr freely). See tests/sglang_oracle_worker.py for the answers.
    """

    def __init__(self) -> None:
        read_fd, write_fd = os.pipe()
        worker = Path(__file__).resolve().parent / "sglang_oracle_worker.py"
        # sglang's log lines go to a file (a pipe nobody reads would fill up and block the worker).
        self._log = tempfile.TemporaryFile(mode="w+")
        self._proc = subprocess.Popen(
            [sys.executable, str(worker), str(write_fd)], env=sglang_env(), stdin=subprocess.PIPE,
            stdout=self._log, stderr=subprocess.STDOUT, pass_fds=(write_fd,), text=True,
        )
        os.close(write_fd)
        self._answers = os.fdopen(read_fd, "r")
        ready = self._answers.readline()
        if not ready:
            raise SglangUnavailable(f"the sglang oracle did not start (an import failed):\n{self.log()[-4000:]}")
        self.versions: dict[str, str] = json.loads(ready)["versions"]

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

    def log(self) -> str:
        """What the worker (sglang) printed so far."""
        self._log.seek(0)
        return self._log.read()

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._answers.close()
        self._log.close()

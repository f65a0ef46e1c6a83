"""AgentGym's own BabyAI server, run here from a side venv: for tests and for CPU runs on BabyAI.

The server is third-party code (AgentGym, MIT) kept outside the repo in `../shared/agentgym/agentenv-babyai`
(or `AGENTGYM_BABYAI_SRC`). It is never copied or installed into the project: a side venv holds its
registry dependencies, and uvicorn imports the package from that folder in place (`--app-dir`).

    python -m awm_grpo.agentgym.babyai build            # the venv, once (cached; about a minute)
    python -m awm_grpo.agentgym.babyai serve --port 36001
    with BabyAIServer() as server: server.url        # a free 127.0.0.1 port, stopped on exit

The venv lives in `<repo>/.cache/agentgym-babyai` (or `AGENTGYM_BABYAI_CACHE`); a file lock lets
concurrent test processes share one build, and a stamp of the requirements marks it complete.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
SOURCE_ENV, CACHE_ENV = "AGENTGYM_BABYAI_SRC", "AGENTGYM_BABYAI_CACHE"
DEFAULT_SOURCE = REPO.parent / "shared" / "agentgym" / "agentenv-babyai"
DEFAULT_CACHE = REPO / ".cache" / "agentgym-babyai"
# agentenv-babyai's declared dependencies, with the bounds its README says run (gymnasium 1.x breaks minigrid 2.4)
REQUIREMENTS = ("fastapi", "uvicorn", "gym", "gymnasium<1.0.0", "matplotlib", "minigrid<2.5.0")
BUILD_TIMEOUT_S = 1800.0
START_TIMEOUT_S = 120.0


class BabyAIUnavailable(RuntimeError):
    """The server cannot run here: its source folder is missing, or its venv cannot be built."""


def source_dir() -> Path:
    """The agentenv-babyai folder (holding the `agentenv_babyai` package)."""
    return Path(os.environ.get(SOURCE_ENV) or DEFAULT_SOURCE)


def have_source() -> bool:
    return (source_dir() / "agentenv_babyai" / "server.py").is_file()


def _stamp() -> str:
    return hashlib.sha256(json.dumps([sys.version_info[:2], REQUIREMENTS]).encode()).hexdigest()[:16]


def ensure_venv(cache: str | Path | None = None) -> Path:
    """The side venv's python, built on first use (python3 -m venv + pip from the configured registry)."""
    cache = Path(cache or os.environ.get(CACHE_ENV) or DEFAULT_CACHE)
    venv = cache / "venv"
    python, stamp = venv / "bin" / "python", venv / ".awm-ready"
    if stamp.is_file() and stamp.read_text() == _stamp() and python.exists():
        return python
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it: wait, then reuse its venv
        if stamp.is_file() and stamp.read_text() == _stamp() and python.exists():
            return python
        shutil.rmtree(venv, ignore_errors=True)  # a half-built one (no stamp): start over
        started = time.monotonic()
        log = cache / "build.log"
        try:
            with open(log, "w") as out:
                for cmd in ([sys.executable, "-m", "venv", str(venv)],
                            [str(python), "-m", "pip", "install", "--no-input", *REQUIREMENTS]):
                    subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=True, timeout=BUILD_TIMEOUT_S)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
            tail = log.read_text(errors="replace")[-2000:] if log.is_file() else ""
            raise BabyAIUnavailable(f"building the BabyAI server's venv in {cache} failed ({exc}); pip needs the "
                                    f"package registry. Last output:\n{tail}") from None
        stamp.write_text(_stamp())  # last: only a complete venv is ever reused
        logger.info("built the BabyAI server's venv in %.0f s (%s)", time.monotonic() - started, venv)
    return python


def free_port() -> int:
    """A port that was free on 127.0.0.1 a moment ago (the server binds it next; a lost race is retried)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BabyAIServer:
    """AgentGym's BabyAI server as a child process on 127.0.0.1; `url` once started."""

    def __init__(self, port: int | None = None, cache: str | Path | None = None,
                 log_path: str | Path | None = None) -> None:
        if not have_source():
            raise BabyAIUnavailable(f"AgentGym's BabyAI server is not at {source_dir()}: put agentenv-babyai there "
                                    f"(../shared/agentgym in this checkout's parent) or set {SOURCE_ENV}")
        self.port, self.cache = port, cache
        self.log_path = Path(log_path) if log_path else None
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, timeout_s: float = START_TIMEOUT_S) -> BabyAIServer:
        python = ensure_venv(self.cache)
        for attempt in range(3):
            port = self.port or free_port()
            log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
            try:
                self.proc = subprocess.Popen(
                    [str(python), "-m", "uvicorn", "agentenv_babyai.server:app", "--host", "127.0.0.1", "--port",
                     str(port), "--app-dir", str(source_dir()), "--log-level", "warning"],
                    stdout=log, stderr=subprocess.STDOUT, cwd=str(python.parent), start_new_session=True,
                    env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "VISUAL": "false"})
            finally:
                if log is not subprocess.DEVNULL:
                    log.close()
            self.url = f"http://127.0.0.1:{port}"
            atexit.register(self.stop)  # its own session: nothing else stops it if this process ends first
            if self._wait(timeout_s):
                return self
            code = self.proc.poll()
            self.stop()
            if code is None or self.port or attempt == 2:
                raise BabyAIUnavailable(f"the BabyAI server did not answer at {self.url} within {timeout_s:g} s "
                                        f"(exit code {code}; its output: {self.log_path or 'not kept'})")
        raise AssertionError("unreachable")

    def _wait(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            with contextlib.suppress(OSError, urllib.error.URLError):
                with urllib.request.urlopen(f"{self.url}/", timeout=2) as reply:
                    if reply.status == 200:
                        return True
            time.sleep(0.2)
        return False

    def stop(self) -> None:
        """Terminate the server (and anything it started), then kill it if it lingers."""
        proc, self.proc = self.proc, None
        atexit.unregister(self.stop)
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.wait(timeout=10)

    def __enter__(self) -> BabyAIServer:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m awm_grpo.agentgym.babyai", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build", help="build the side venv (cached) and exit")
    serve = sub.add_parser("serve", help="run the server until interrupted; prints its URL")
    serve.add_argument("--port", type=int, default=None, help="default: a free port")
    serve.add_argument("--log", default=None, help="file for the server's output")
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if opts.cmd == "build":
            print(ensure_venv())
            return 0
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # a TERM stops the server too (KeyboardInterrupt)
        with BabyAIServer(opts.port, log_path=opts.log) as server:
            print(server.url, flush=True)
            while server.proc is not None and server.proc.poll() is None:
                time.sleep(1)
            return 1  # the server exited on its own
    except BabyAIUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())

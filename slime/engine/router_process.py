"""A router in front of the run's engines, as its own process: ours (`slime`) or sglang_router (`sglang`).

Both speak the same membership API (slime-contracts.md section 5): `POST /workers {"url",
"worker_type"}`, `GET /workers -> {"workers": [{"id", "url", ...}]}`, `DELETE /workers/{id}`, and
proxy `/generate`. So one class starts either and registers engines the same way:

    router = RouterProcess("slime"); url = router.start(); router.add_worker(engine_url); ...

`slime` runs `python -m slime.engine.router` (tested on CPU). `sglang` runs
`python -m sglang_router.launch_router` (the SGLang Model Gateway; needs the sglang_router package,
UNTESTED HERE). The process gets its own session so shutdown stops it and anything it forked.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import subprocess
import sys
import time

import httpx

from slime.engine.base import EngineError
from slime.utils.misc import free_port

logger = logging.getLogger(__name__)

ROUTER_KINDS = ("slime", "sglang")


def router_command(kind: str, host: str, port: int, *, policy: str | None = None,
                   python: str = sys.executable) -> list[str]:
    """The argv that starts a router of `kind` on host:port with no engines yet (pure)."""
    if kind == "slime":
        command = [python, "-m", "slime.engine.router", "--host", host, "--port", str(port)]
        if policy is not None:
            logger.warning("--router-policy %s is ignored by the slime router (round robin + session affinity)", policy)
        return command
    if kind == "sglang":
        command = [python, "-m", "sglang_router.launch_router", "--host", host, "--port", str(port)]
        return command + (["--policy", policy] if policy else [])
    raise ValueError(f"router kind must be one of {ROUTER_KINDS}, got {kind!r}")


class RouterProcess:
    """Start, feed and stop one router process."""

    def __init__(self, kind: str, *, host: str = "127.0.0.1", port: int | None = None, policy: str | None = None,
                 startup_timeout_s: float = 60.0):
        if kind not in ROUTER_KINDS:
            raise ValueError(f"router kind must be one of {ROUTER_KINDS}, got {kind!r}")
        self.kind, self.host, self.port, self.policy = kind, host, port, policy
        self.startup_timeout_s = startup_timeout_s
        self.process: subprocess.Popen | None = None
        self.url = ""
        self._http = httpx.Client(timeout=30.0, trust_env=False)

    def start(self) -> str:
        if self.kind == "sglang" and importlib.util.find_spec("sglang_router") is None:
            raise EngineError("--rollout-router sglang needs the sglang_router package: install the gpu extra "
                              "(bash setup.sh --gpu) or use --rollout-router slime")
        self.port = self.port or free_port(self.host)
        self.url = f"http://{self.host}:{self.port}"
        command = router_command(self.kind, self.host, self.port, policy=self.policy)
        logger.info("starting router: %s", " ".join(command))
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            if self.process.poll() is not None:
                raise EngineError(f"{self.kind} router exited with status {self.process.returncode} at start-up")
            try:
                if self._http.get(f"{self.url}/workers", timeout=2.0).status_code == 200:
                    return self.url
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.shutdown()
                raise EngineError(f"{self.kind} router on {self.url} not answering after {self.startup_timeout_s} s")
            time.sleep(0.2)

    def add_worker(self, url: str) -> None:
        reply = self._http.post(f"{self.url}/workers", json={"url": url, "worker_type": "regular"})
        if reply.status_code >= 300:
            raise EngineError(f"router {self.url} refused worker {url}: {reply.status_code} {reply.text}")

    def workers(self) -> list[dict]:
        return self._http.get(f"{self.url}/workers").json().get("workers", [])

    def remove_worker(self, url: str) -> None:
        for worker in self.workers():
            if worker.get("url", "").rstrip("/") == url.rstrip("/"):
                self._http.delete(f"{self.url}/workers/{worker['id']}")

    def shutdown(self) -> None:
        if self.process is not None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(self.process.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.process.wait(timeout=10)
                    break
                except subprocess.TimeoutExpired:
                    continue
            self.process = None
        self._http.close()

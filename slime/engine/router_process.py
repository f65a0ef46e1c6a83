"""A router in front of the run's engines, as its own process: ours (`slime`) or sglang_router (`sglang`).

Both speak the same membership API (docs/trainer.md, slime's contracts): `POST /workers {"url",
"worker_type"}`, `GET /workers -> {"workers": [{"id", "url", ...}]}`, `DELETE /workers/{id}`, and
proxy `/generate`. So one class starts either and registers engines the same way:

    router = RouterProcess("slime"); url = router.start(); router.add_worker(engine_url); ...

`slime` runs `python -m slime.engine.router` (tested on CPU). `sglang` runs
`python -m sglang_router.launch_router` (the SGLang Model Gateway; needs the sglang_router package of
a GPU set; its Rust router needs no GPU, so tests/slime/test_sglang_router_real.py runs the pinned
one in front of the CPU engine). The process gets its own session so shutdown stops it and anything
it forked.
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
# `--policy` choices of the pinned sglang-router (0.3.2) that start a router with no workers yet, as
# RouterProcess does; it has no consistent_hashing, and power_of_two exits without two workers.
# tests/slime/test_sglang_router_real.py starts the real router with each of them.
SGLANG_ROUTER_POLICIES = ("random", "round_robin", "cache_aware", "manual")


def router_command(kind: str, host: str, port: int, *, policy: str | None = None, metrics_port: int | None = None,
                   python: str = sys.executable) -> list[str]:
    """The argv that starts a router of `kind` on host:port with no engines yet (pure).

    `metrics_port`: sglang_router's Prometheus exporter, which otherwise binds port 29000 and makes a
    second router on the same host exit at start-up."""
    if kind == "slime":
        command = [python, "-m", "slime.engine.router", "--host", host, "--port", str(port)]
        if policy is not None:
            logger.warning("--router-policy %s is ignored by the slime router (round robin + session affinity)", policy)
        return command
    if kind == "sglang":
        command = [python, "-m", "sglang_router.launch_router", "--host", host, "--port", str(port)]
        command += ["--prometheus-port", str(metrics_port)] if metrics_port is not None else []
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
            raise EngineError("--rollout-router sglang needs the sglang_router package: install a GPU set "
                              "(bash setup.sh --gpu) or use --rollout-router slime")
        self.port = self.port or free_port(self.host)
        self.url = f"http://{self.host}:{self.port}"
        metrics_port = free_port(self.host) if self.kind == "sglang" else None
        command = router_command(self.kind, self.host, self.port, policy=self.policy, metrics_port=metrics_port)
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

    def add_worker(self, url: str, timeout_s: float = 30.0) -> None:
        """Register an engine and return once the router lists it: sglang_router answers 202 and
        registers in the background (after probing the engine), ours registers at once."""
        reply = self._http.post(f"{self.url}/workers", json={"url": url, "worker_type": "regular"})
        if reply.status_code >= 300:
            raise EngineError(f"router {self.url} refused worker {url}: {reply.status_code} {reply.text}")
        self._wait_listed(url, True, timeout_s)

    def workers(self) -> list[dict]:
        return self._http.get(f"{self.url}/workers").json().get("workers", [])

    def remove_worker(self, url: str, timeout_s: float = 30.0) -> None:
        """Deregister an engine and return once the router no longer lists it (sglang_router: 202, queued)."""
        for worker in self.workers():
            if worker.get("url", "").rstrip("/") == url.rstrip("/"):
                self._http.delete(f"{self.url}/workers/{worker['id']}")
        self._wait_listed(url, False, timeout_s)

    def _wait_listed(self, url: str, listed: bool, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while any(w.get("url", "").rstrip("/") == url.rstrip("/") for w in self.workers()) != listed:
            if time.monotonic() > deadline:
                state = "list" if listed else "drop"
                raise EngineError(f"{self.kind} router {self.url} did not {state} worker {url} within {timeout_s} s")
            time.sleep(0.05)

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

"""The engine pool's health check (`EnginePool.ensure_healthy`) on real Ray actors serving real HTTP.

SGLang answers GET /health only after generating one token, and waits up to its own window (20 s)
before it answers 503; a check that gave up after 5 s, or checked engines one at a time, killed
healthy but busy engines and stalled the step. Here: slow engines are checked at once and kept, an
engine that answers 503 or hangs is restarted, and the log line says why, loudly.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from types import SimpleNamespace
from typing import Any

import pytest
import ray
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from slime.engine.pool import EnginePool, health_window_s


@ray.remote(num_cpus=0)
class HealthEngine:
    """An engine whose /health answers 200 after `delay_s`, or 503 when `status` says so."""

    def __init__(self, delay_s: float, status: int, port: int):
        from slime.engine.router import BackgroundServer

        app = FastAPI()

        @app.get("/health")
        async def health() -> PlainTextResponse:
            await asyncio.sleep(delay_s)
            return PlainTextResponse("", status_code=status)

        self.server = BackgroundServer(app, port=port)

    def start(self) -> dict[str, Any]:
        url = self.server.start()
        return {"url": url, "port": self.server.port, "pid": os.getpid()}

    def exit_code(self) -> int | None:
        return None

    def shutdown(self) -> None:
        self.server.stop()


class ScriptedPool(EnginePool):
    """The real pool; each engine's first start follows `script` (delay, status), a restart is healthy."""

    def __init__(self, script: list[tuple[float, int]], timeout_s: float):
        placement = SimpleNamespace(engine_bundles=list(range(len(script))), use_gpu=False,
                                    options=lambda bundle, kind: {})
        super().__init__(argparse.Namespace(hf_checkpoint="/models/m", engine_type="cpu"), placement)
        self.script = script
        self.starts = [0] * len(script)
        self.health_timeout_s = timeout_s

    def _new_actor(self, i: int, port: int) -> Any:
        delay, status = self.script[i] if self.starts[i] == 0 else (0.0, 200)
        self.starts[i] += 1
        return HealthEngine.remote(delay, status, port)


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def check(script: list[tuple[float, int]], timeout_s: float) -> tuple[ScriptedPool, int, float]:
    """Start a pool, run one health check; (pool, engines restarted, seconds the check took)."""

    async def run() -> tuple[ScriptedPool, int, float]:
        pool = ScriptedPool(script, timeout_s)
        await pool.start()
        try:
            started = time.monotonic()
            restarted = await pool.ensure_healthy()
            return pool, restarted, time.monotonic() - started
        finally:
            await pool.shutdown()

    return asyncio.run(run())


def test_busy_engines_are_checked_together_and_kept(local_ray) -> None:
    pool, restarted, seconds = check([(1.5, 200)] * 3, timeout_s=5.0)

    assert restarted == 0 and pool.starts == [1, 1, 1]
    assert seconds < 3.0, f"three 1.5 s checks took {seconds:.1f} s: they ran one after another"


def test_an_engine_answering_503_is_restarted_with_its_cause_logged(local_ray, caplog) -> None:
    with caplog.at_level(logging.ERROR, logger="slime.engine.pool"):
        pool, restarted, _ = check([(0.0, 200), (0.0, 503)], timeout_s=5.0)

    assert restarted == 1 and pool.starts == [1, 2]
    (line,) = [r.getMessage() for r in caplog.records if "ENGINE RESTART" in r.getMessage()]
    assert "engine 1" in line and "answered 503" in line and "2 tries" in line
    assert "its server process is running" in line and "restarting it with weights 0" in line


def test_an_engine_past_the_window_is_restarted_and_the_timeout_is_named(local_ray, caplog) -> None:
    with caplog.at_level(logging.ERROR, logger="slime.engine.pool"):
        pool, restarted, _ = check([(30.0, 200)], timeout_s=1.0)

    assert restarted == 1 and pool.starts == [2]
    (line,) = [r.getMessage() for r in caplog.records if "ENGINE RESTART" in r.getMessage()]
    assert "no answer to GET /health within 1 s" in line


def test_sglang_engines_wait_for_sglangs_own_window(monkeypatch) -> None:
    placement = SimpleNamespace(engine_bundles=[0], use_gpu=True, options=lambda bundle, kind: {})
    sglang = EnginePool(argparse.Namespace(hf_checkpoint="/m", engine_type="sglang"), placement)
    assert health_window_s() == 20.0 and sglang.health_timeout_s == 30.0
    monkeypatch.setenv("SGLANG_HEALTH_CHECK_TIMEOUT", "45")
    assert EnginePool(argparse.Namespace(hf_checkpoint="/m", engine_type="sglang"), placement).health_timeout_s == 55.0


@ray.remote(num_cpus=0)
class ExportingTrainer:
    """The train actor's two calls a restart makes under the NCCL transport: export, reset_tensor_sync."""

    def export(self, out_dir: str) -> str:
        os.makedirs(out_dir)
        open(os.path.join(out_dir, "model.safetensors"), "wb").close()
        return out_dir

    def reset_tensor_sync(self) -> None:
        pass


def test_nccl_restarts_keep_only_the_newest_restart_export(local_ray, tmp_path) -> None:
    """Under the NCCL transport a restarted engine boots from an export of the trainer's current weights;
    each restart used to leave its export behind (8 GB each for Qwen3-4B in bf16)."""
    pool = ScriptedPool([(0.0, 200)], timeout_s=5.0)
    pool._trainer, pool._weights_root = ExportingTrainer.remote(), str(tmp_path)
    for version in ("3", "7"):
        pool.weight_version = version
        asyncio.run(pool._restore_latest_weights())

    assert sorted(p.name for p in tmp_path.iterdir()) == ["restart_v000007"]
    assert pool.weights_path == str(tmp_path / "restart_v000007") and pool._path_version == "7"

"""`--rollout-router sglang` against the real sglang-router (its Rust router runs on CPU), in front of
the CPU engine: `RouterProcess` starts it, registers the engine, routes the project's /generate body
through it and removes the engine again.

Runs once, not per sglang version: both GPU sets pin sglang-router 0.3.2, a package that does not
depend on sglang (tests/test_sglang_real.py::test_sglang_router_is_one_pin_for_both_sets). What it asks
of an engine (seen 2026-11-28 with each policy slime accepts, 12 s after registering one): GET /health,
/model_info, /server_info, all in slime.engine.base.ENGINE_ROUTES and served by both sglangs. Its binary
also names /get_load, which 0.5.10 serves and 0.5.23 does not; it was not called with these policies.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest
from sglang_real import real_sglang_router

from slime.arguments import parse_args
from slime.engine.cpu_server import CPUEngine
from slime.engine.router_process import SGLANG_ROUTER_POLICIES, RouterProcess
from slime.models.tiny import build_tiny_model


@pytest.fixture
def sglang_router_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pinned sglang-router importable here (RouterProcess checks) and in the router process."""
    side = str(real_sglang_router())
    monkeypatch.syspath_prepend(side)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (side, os.environ.get("PYTHONPATH")) if p))


@pytest.fixture
def engine(tmp_path) -> Iterator[CPUEngine]:
    engine = CPUEngine(str(build_tiny_model(tmp_path / "tiny", seed=0)), host="127.0.0.1", port=0, seed=0,
                       max_batch_size=4, prefix_cache_tokens=1024)
    engine.start()
    yield engine
    engine.shutdown()


@pytest.fixture
def router(sglang_router_installed: None) -> Iterator[RouterProcess]:
    router = RouterProcess("sglang", host="127.0.0.1")
    router.start()
    yield router
    router.shutdown()


def test_real_sglang_router_routes_generate_to_a_registered_engine(router: RouterProcess, engine: CPUEngine):
    router.add_worker(engine.url)

    assert [w["url"] for w in router.workers()] == [engine.url]  # listed when add_worker returns
    reply = httpx.post(f"{router.url}/generate", timeout=30, json={
        "input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4, "temperature": 1.0},
        "return_logprob": True})
    assert reply.status_code == 200, reply.text
    assert len(reply.json()["meta_info"]["output_token_logprobs"]) == 4

    router.remove_worker(engine.url)
    assert router.workers() == []


def test_two_sglang_routers_run_on_one_host(router: RouterProcess) -> None:
    """Each gets its own Prometheus port: on sglang_router's default (29000) the second one exits."""
    second = RouterProcess("sglang", host="127.0.0.1")
    try:
        assert second.start() != router.url
    finally:
        second.shutdown()


@pytest.mark.parametrize("policy", SGLANG_ROUTER_POLICIES)
def test_every_policy_slime_accepts_starts_the_real_router(sglang_router_installed: None, policy: str) -> None:
    router = RouterProcess("sglang", host="127.0.0.1", policy=policy)
    try:
        assert router.start()
    finally:
        router.shutdown()


@pytest.mark.parametrize("policy", ["consistent_hashing", "power_of_two"])
def test_a_policy_the_router_cannot_start_with_is_refused_at_argument_time(policy: str) -> None:
    """sglang-router 0.3.2 has no consistent_hashing; power_of_two exits without two workers at start."""
    with pytest.raises(SystemExit):
        parse_args(["--hf-checkpoint", "/m", "--prompt-data", "/p", "--rollout-batch-size", "1", "--num-rollout", "1",
                    "--rollout-router", "sglang", "--router-policy", policy])

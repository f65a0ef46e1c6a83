"""The router process in front of the engines (`--rollout-router`) and the engine client, on CPU.

`slime` (our router) really runs as a subprocess and engines (SGLang-shaped fakes) join through the
sglang_router membership API; `sglang` needs sglang_router (GPU extra): its command line is checked
and its absence reported."""

from __future__ import annotations

import importlib.util

import httpx
import pytest
from test_router import FakeEngine

from slime.engine.base import EngineClient, EngineError
from slime.engine.router_process import RouterProcess, router_command


def test_router_commands():
    assert router_command("slime", "10.0.0.1", 30000, python="py") == [
        "py", "-m", "slime.engine.router", "--host", "10.0.0.1", "--port", "30000"]
    assert router_command("sglang", "10.0.0.1", 30000, policy="round_robin", metrics_port=30001, python="py") == [
        "py", "-m", "sglang_router.launch_router", "--host", "10.0.0.1", "--port", "30000",
        "--prometheus-port", "30001", "--policy", "round_robin"]
    with pytest.raises(ValueError, match="router kind"):
        router_command("nginx", "h", 1)


def test_slime_router_process_registers_engines_and_routes():
    engines = [FakeEngine("a"), FakeEngine("b")]
    router = RouterProcess("slime")
    try:
        url = router.start()
        for engine in engines:
            router.add_worker(engine.url)
        assert sorted(w["url"] for w in router.workers()) == sorted(e.url for e in engines)
        answers = {httpx.post(f"{url}/generate", json={"input_ids": [1]}, trust_env=False).json()["text"]
                   for _ in range(4)}
        assert answers == {"a", "b"}
        client = EngineClient(url)  # the control surface the weight sync uses, through the router
        assert client.update_weights_from_disk("/w/v1", weight_version="1") == "1"
        assert all(("/update_weights_from_disk", {"model_path": "/w/v1", "weight_version": "1"}) in e.calls
                   for e in engines)
        router.remove_worker(engines[0].url)
        assert [w["url"] for w in router.workers()] == [engines[1].url]
        process = router.process
    finally:
        router.shutdown()
        for engine in engines:
            engine.stop()
    assert process.poll() is not None


@pytest.mark.skipif(importlib.util.find_spec("sglang_router") is not None, reason="sglang_router is installed")
def test_sglang_router_without_the_package_says_what_to_install():
    with pytest.raises(EngineError, match="sglang_router"):
        RouterProcess("sglang").start()

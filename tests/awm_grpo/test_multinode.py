"""The recipe on a two-node Ray cluster (RAY_ADDRESS): both nodes run on this machine, one CPU each.

`ray start --head` and `ray start --address` as the Multi-node section of docs/recipe.md has them, each
with one logical CPU, so the run's two placement bundles (one train rank, one engine) cannot both
fit one node: the trainer lands on one node and the engine on the other. The run must complete, and
Ray's own actor table (GCS) must show the TrainActor and the EngineActor on different nodes, the two
we started. The cluster's processes are this test's children (each `ray start --block` leads its own
session) and are stopped by recorded id, never with `ray stop`, which would end every Ray of the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from awm_grpo.launch.processes import Children

REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def two_nodes() -> Iterator[dict[str, str]]:
    """{"address": HEAD:PORT, "head": node id, "worker": node id} of a fresh two-node cluster."""
    import ray

    port = _free_port()
    temp = tempfile.mkdtemp(prefix="awm-ray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": f"{REPO}:{REPO / 'agent-world-model'}"}
    common = ["--block", "--num-cpus", "1", "--disable-usage-stats"]
    children = Children()
    try:
        children.start("ray-head", [RAY, "start", "--head", "--port", str(port), "--temp-dir", temp,
                                    "--include-dashboard=false", "--resources", '{"awm_test_head": 1}', *common],
                       env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        address = f"127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:  # the worker joins once the head's GCS answers
            try:
                ray.init(address=address, log_to_driver=False)
                break
            except (ConnectionError, RuntimeError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
        children.start("ray-worker", [RAY, "start", "--address", address, "--resources", '{"awm_test_worker": 1}',
                                      *common], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        nodes: dict[str, str] = {}
        while len(nodes) < 2:
            assert time.monotonic() < deadline, f"the worker node did not join: {ray.nodes()}"
            nodes = {role: n["NodeID"] for n in ray.nodes() if n["Alive"]
                     for role in ("head", "worker") if f"awm_test_{role}" in n["Resources"]}
            time.sleep(1)
        ray.shutdown()
        yield {"address": address, **nodes}
    finally:
        ray.shutdown()
        children.stop_all(grace_s=5)
        shutil.rmtree(temp, ignore_errors=True)


def actor_nodes(address: str) -> dict[str, set[str]]:
    """{actor class: node ids it ran on} from the GCS actor table (dead actors included)."""
    import ray
    from ray._private import state

    ray.init(address=address, log_to_driver=False)
    try:
        out: dict[str, set[str]] = {}
        for info in state.actors().values():
            out.setdefault(info["ActorClassName"], set()).add(info["Address"]["NodeID"])
        return out
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_recipe_runs_on_a_two_node_ray_cluster(two_nodes, tiny_model_dir, tmp_path):
    save = tmp_path / "run"
    env = {**os.environ, "PYTHON": sys.executable, "RAY_ADDRESS": two_nodes["address"],
           "HF_CKPT": str(tiny_model_dir), "SAVE_DIR": str(save), "AWM_SPLITS_DIR": str(tmp_path / "splits"), "NUM_ROLLOUT": "2",
           "ROLLOUT_BATCH_SIZE": "2", "N_SAMPLES_PER_PROMPT": "2", "AWM_MAX_TURNS": "2",
           "ROLLOUT_MAX_RESPONSE_LEN": "256", "AWM_MAX_TOKENS_PER_TURN": "32", "SKIP_EVAL_BEFORE_TRAIN": "true",
           "EVAL_INTERVAL": "100", "SAVE_INTERVAL": "100"}
    started = time.monotonic()
    proc = subprocess.run(["bash", str(REPO / "awm_grpo" / "run_awm_grpo.sh")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    train = [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines() if '"train"' in line]
    assert [m["step"] for m in train] == [0, 1]
    assert f"--ray-address {two_nodes['address']}" in log
    placed = actor_nodes(two_nodes["address"])
    trainer, engine = placed.get("TrainActor", set()), placed.get("EngineActor", set())
    assert len(trainer) == 1 and len(engine) == 1, placed
    assert trainer | engine == {two_nodes["head"], two_nodes["worker"]}, (placed, two_nodes)
    # slime's own placement line names the same two nodes
    line = next(x for x in log.splitlines() if "placement: train ranks on nodes" in x)
    assert next(iter(trainer))[:8] in line and next(iter(engine))[:8] in line
    print(f"two-node run: {time.monotonic() - started:.0f}s; trainer on {next(iter(trainer))[:8]}, "
          f"engine on {next(iter(engine))[:8]}")

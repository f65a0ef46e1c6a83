"""The Ray actor that runs one real SGLang server for `EnginePool` (`--engine-type sglang`).

GPU only, UNTESTED HERE (no GPU, no sglang in the CPU venv). The actor reserves its share of one
placement-group bundle; Ray then exposes that bundle's GPU as the actor's only device. An engine
with tensor parallelism tp > 1 spans bundles b .. b + tp - 1: the pool probes those bundles' physical
GPU ids (`bundle_gpu_ids`) and the server is started with exactly them in CUDA_VISIBLE_DEVICES.
The server listens on the node's IP so that the driver, the trainer and routers on other nodes
reach it; it runs in its own process group, which `shutdown` kills (do call it before `ray.kill`).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import ray

from slime.engine.sglang_engine import SGLangEngine
from slime.utils.misc import free_port


@ray.remote
class SGLangEngineActor:
    """Same surface as `slime.ray_actors.EngineActor`: start / update_weights_from_disk / shutdown."""

    def __init__(self, args: argparse.Namespace, model_path: str, port: int, rank: int,
                 gpu_ids: list[int] | None = None, log_dir: str | None = None):
        host = ray.util.get_node_ip_address()
        env = {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpu_ids)} if gpu_ids else {}
        engine_args = {**vars(args), "hf_checkpoint": model_path}
        log_path = os.path.join(log_dir, f"sglang_engine_{rank}.log") if log_dir else None
        self.engine = SGLangEngine(engine_args, host=host, port=port or None, base_gpu_id=0,
                                   nccl_port=free_port(host), seed_offset=rank, env=env, log_path=log_path)

    def start(self) -> dict[str, Any]:
        url = self.engine.start()
        return {"url": url, "port": self.engine.port, "pid": self.engine.process.pid}

    def update_weights_from_disk(self, path: str, version: str) -> str:
        return self.engine.update_weights_from_disk(path, weight_version=version)

    def exit_code(self) -> int | None:
        """The SGLang server process's exit code, None while it runs (the cause a restart logs)."""
        process = self.engine.process
        return None if process is None else process.poll()

    def shutdown(self) -> None:
        self.engine.shutdown()


def bundle_gpu_ids(group: Any, bundles: list[int]) -> list[list[int]]:
    """Physical GPU ids behind each bundle (a tiny task per bundle asks Ray which GPU it got)."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    @ray.remote(num_gpus=0.01, num_cpus=0)
    def probe() -> list[int]:
        return [int(g) for g in ray.get_gpu_ids()]

    refs = [probe.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
        placement_group=group, placement_group_bundle_index=b)).remote() for b in bundles]
    return ray.get(refs)

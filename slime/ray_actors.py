"""Ray placement and the actors of a run: the train ranks and the rollout engines.

One placement group of bundles, `{"GPU": 1, "CPU": 1}` on GPU machines and `{"CPU": 1}` here.
Separate mode: bundles = train ranks + rollout devices, train rank r on bundle r, engine i on
`train + i * per_engine`. Colocated (`--colocate`): bundles = max(train, rollout), engines share
the train ranks' bundles and each actor takes a fraction of them (slime: 0.4 GPU train, 0.2 GPU
engine; here 0.5 / 0.5 CPU). On 2 real cores the local cluster declares `--ray-num-cpus` logical
CPUs (platform-facts section 8), so these reservations are bookkeeping, not pinning.

`TrainActor` is train rank 0; with N > 1 ranks it starts and leads the others (data parallel, see
its docstring), so the driver holds one handle whatever N. `EnginePool` (slime/engine/pool.py,
re-exported here) owns the engine actors: start, health checks and restarts, router, weight sync.
"""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from slime.engine.pool import EngineActor, EnginePool, EngineStartError, quiet_transformers
from slime.utils.misc import free_port

__all__ = ["EngineActor", "EnginePool", "EngineStartError", "Placement", "TrainActor", "create_placement",
           "init_ray"]

logger = logging.getLogger(__name__)


def init_ray(args: argparse.Namespace) -> None:
    """Join `--ray-address` or start a local cluster without dashboard or token auth."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray.is_initialized():
        return
    if args.ray_address:
        ray.init(address=args.ray_address, log_to_driver=True)
    else:
        ray.init(num_cpus=args.ray_num_cpus, include_dashboard=False, log_to_driver=True)


@dataclass
class Placement:
    """The placement group and which bundle each actor goes to."""

    group: PlacementGroup
    use_gpu: bool
    train_bundle: int
    engine_bundles: list[int]
    colocate: bool

    def options(self, bundle: int, role: str) -> dict[str, Any]:
        """Ray actor options for `role` ("train" or "engine") in `bundle`."""
        return actor_options(self.group, bundle, role, self.use_gpu, self.colocate)


def actor_options(group: PlacementGroup, bundle: int, role: str, use_gpu: bool, colocate: bool) -> dict[str, Any]:
    """Ray actor options for `role` ("train" or "engine") in `bundle` of `group` (shares: module docstring)."""
    share = {"train": 0.4, "engine": 0.2} if colocate else {"train": 1.0, "engine": 1.0}
    resources: dict[str, Any] = (
        {"num_gpus": share[role], "num_cpus": 0} if use_gpu else {"num_cpus": 0.5 if colocate else 1}
    )
    strategy = PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=bundle)
    return {**resources, "scheduling_strategy": strategy, "max_restarts": 0}


def create_placement(args: argparse.Namespace) -> Placement:
    """Reserve the bundles of the run (see the module docstring for the layout)."""
    use_gpu = ray.cluster_resources().get("GPU", 0) > 0
    n_train = args.actor_num_nodes * args.actor_num_gpus_per_node
    n_rollout = args.rollout_num_gpus
    per_engine = args.rollout_num_gpus_per_engine
    count = max(n_train, n_rollout) if args.colocate else n_train + n_rollout
    bundle = {"GPU": 1, "CPU": 1} if use_gpu else {"CPU": 1}
    group = placement_group([dict(bundle) for _ in range(count)], strategy="PACK")
    ray.get(group.ready(), timeout=120)
    first_engine = 0 if args.colocate else n_train
    engines = [first_engine + i * per_engine for i in range(n_rollout // per_engine)]
    nodes = bundle_nodes(group)
    logger.info("placement: train ranks on nodes %s, engines on nodes %s",
                [nodes.get(b, "?") for b in range(n_train)], [nodes.get(b, "?") for b in engines])
    return Placement(group, use_gpu, 0, engines, args.colocate)


def bundle_nodes(group: PlacementGroup) -> dict[int, str]:
    """{bundle index: the first 8 hex digits of the Ray node id holding it} (which node runs what, for the log)."""
    table = ray.util.placement_group_table(group)
    return {int(b): str(node)[:8] for b, node in table.get("bundles_to_node_id", {}).items()}


@ray.remote
class TrainActor:
    """Train rank `rank` (a `slime.backends.train_worker.TrainWorker`); rank 0 also leads the others.

    The driver creates rank 0 only. With `--actor-num-nodes x --actor-num-gpus-per-node` = N > 1,
    rank 0 picks the rendezvous address (its node IP, a free port), starts ranks 1..N-1 in bundles
    1..N-1 of its own placement group, and forwards every call (train, save, load, export) to them
    while running its own part: the group looks like one actor to the driver, so `train.py` is the
    same for one rank or many. Results are rank 0's (metrics are already combined over ranks).
    """

    def __init__(self, args: argparse.Namespace, rank: int = 0, master: tuple[str, int] | None = None):
        import torch

        from slime.backends.train_worker import TrainWorker, world_size

        quiet_transformers()
        torch.set_num_threads(max(os.cpu_count() or 1, 1))
        world = world_size(args)
        self.followers: list[Any] = []
        if world > 1 and rank == 0:
            master = (ray.util.get_node_ip_address(), free_port())
            group = ray.util.get_current_placement_group()
            use_gpu = bool(ray.get_gpu_ids())
            for r in range(1, world):
                opts = {"num_cpus": 0} if group is None else actor_options(group, r, "train", use_gpu, args.colocate)
                self.followers.append(TrainActor.options(**opts).remote(args, r, master))
        addr, port = master or (None, None)
        self.worker = TrainWorker(args, rank=rank, world=world, master_addr=addr, master_port=port)
        if self.followers:
            ray.get([f.pid.remote() for f in self.followers])

    def _fan_out(self, method: str, *call_args: Any) -> Any:
        """Start `method` on every follower, run it here, then wait for them (errors surface here)."""
        pending = [getattr(f, method).remote(*call_args) for f in self.followers]
        result = getattr(self.worker, method)(*call_args)
        ray.get(pending)
        return result

    def pid(self) -> int:
        return os.getpid()

    def pids(self) -> list[int]:
        """Every rank's process id, rank order."""
        return [os.getpid(), *ray.get([f.pid.remote() for f in self.followers])]

    def load(self, path: str) -> dict[str, Any]:
        return self._fan_out("load", path)

    def save(self, save_dir: str, iteration: int, data_state: dict[str, Any]) -> str:
        return self._fan_out("save", save_dir, iteration, data_state)

    def export_adapter(self, out_dir: str) -> str:
        """The LoRA adapter as a peft folder (`--lora-rank` > 0): the adapter-only weight sync's payload."""
        return self._fan_out("export_adapter", out_dir)

    def export(self, out_dir: str) -> str:
        """An HF folder with tokenizer, loadable by any engine (rank 0 writes it)."""
        return self._fan_out("export", out_dir)

    def update_weights_tensor(self, engine_urls: list[str], tp_sizes: list[int], version: int,
                              bucket_bytes: int) -> dict[str, Any]:
        """Tensor weight sync (`--update-weight-transport tensor | nccl`; see slime/weight_sync.py): rank 0
        posts handles or broadcasts, FSDP followers take part in gathering the full tensors; rank 0's
        report of what moved comes back (`EnginePool.last_sync`)."""
        return self._fan_out("update_weights_tensor", engine_urls, tp_sizes, version, bucket_bytes,
                             ray.util.get_node_ip_address())

    def reset_tensor_sync(self) -> None:
        """Drop the NCCL update group (engines changed); the next tensor sync forms a new one."""
        self._fan_out("reset_tensor_sync")

    def offload(self) -> None:
        """Every rank moves its weights and optimizer state to host memory (--offload-train)."""
        self._fan_out("offload")

    def onload(self) -> None:
        self._fan_out("onload")

    def close(self) -> None:
        """Every rank leaves its process groups together (before Ray tears the actors down)."""
        self._fan_out("close")

    def train(self, samples: list[Any], advantages: list[Any] | None = None,
              loss_type: str | None = None) -> dict[str, float]:
        """Old log-probs once for the whole rollout, then `--num-steps-per-rollout` optimizer steps.

        loss_type overrides --loss-type for this call (sft_loss: masked NLL, advantages ignored).
        """
        if self.followers:
            samples_ref, adv_ref = ray.put(samples), ray.put(advantages)
            pending = [f.train.remote(samples_ref, adv_ref, loss_type) for f in self.followers]
            result = self.worker.train(samples, advantages, loss_type)
            ray.get(pending)
            return result
        return self.worker.train(samples, advantages, loss_type)

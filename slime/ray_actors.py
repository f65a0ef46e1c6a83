"""Ray placement and the actors of a run: one train actor and the rollout engines.

One placement group of bundles, `{"GPU": 1, "CPU": 1}` on GPU machines and `{"CPU": 1}` here.
Separate mode: bundles = train devices + rollout devices, the train actor on the first, engine i on
`train + i * per_engine`. Colocated (`--colocate`): bundles = max(train, rollout), engines share
the train actor's bundles and each actor takes a fraction of them (slime: 0.4 GPU train, 0.2 GPU
engine; here 0.5 / 0.5 CPU). On 2 real cores the local cluster declares `--ray-num-cpus` logical
CPUs (platform-facts section 8), so these reservations are bookkeeping, not pinning.

`EnginePool` owns the engine actors from the driver: start, health checks, restart of a dead engine
on its old port with the current weights (so in-flight HTTP retries reach the new process), and
the disk weight sync (`update_weights_from_disk` on every engine).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import httpx
import ray
from ray.util.placement_group import PlacementGroup, placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

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
        share = {"train": 0.4, "engine": 0.2} if self.colocate else {"train": 1.0, "engine": 1.0}
        resources: dict[str, Any] = (
            {"num_gpus": share[role], "num_cpus": 0} if self.use_gpu else {"num_cpus": 0.5 if self.colocate else 1}
        )
        strategy = PlacementGroupSchedulingStrategy(placement_group=self.group, placement_group_bundle_index=bundle)
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
    return Placement(group, use_gpu, 0, engines, args.colocate)


def _quiet_transformers() -> None:
    """No per-save / per-load progress bars from transformers in actor logs (one a weight sync)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


@ray.remote
class TrainActor:
    """Holds the `TorchTrainer`: log-probs, policy steps, checkpoints and HF export."""

    def __init__(self, args: argparse.Namespace):
        import torch

        from slime.backends.torch_backend import TorchTrainer, TrainerConfig

        _quiet_transformers()
        torch.set_num_threads(max(os.cpu_count() or 1, 1))
        torch.manual_seed(args.seed)
        self.args = args
        config = TrainerConfig(
            lr=args.lr,
            weight_decay=args.weight_decay,
            adam_beta1=args.adam_beta1,
            adam_beta2=args.adam_beta2,
            clip_grad=args.clip_grad,
            lr_warmup_steps=args.lr_warmup_iters,
            max_tokens_per_micro_batch=args.max_tokens_per_gpu or 16384,
            max_samples_per_micro_batch=args.micro_batch_size,
        )
        ref = (args.ref_load or args.hf_checkpoint) if args.use_kl_loss else None
        device = "cuda" if torch.cuda.is_available() else "cpu"
        self.trainer = TorchTrainer(args.hf_checkpoint, config, ref_model=ref, device=device)
        self._tokenizer = None

    def pid(self) -> int:
        return os.getpid()

    def load(self, path: str) -> dict[str, Any]:
        return self.trainer.load_checkpoint(path)

    def save(self, save_dir: str, iteration: int, data_state: dict[str, Any]) -> str:
        return self.trainer.save_checkpoint(save_dir, iteration=iteration, data_state=data_state)

    def export(self, out_dir: str) -> str:
        """An HF folder with tokenizer, loadable by any engine."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.args.hf_checkpoint)
        return self.trainer.export_hf(out_dir, self._tokenizer)

    def train(self, samples: list[Any], advantages: list[float]) -> dict[str, float]:
        """Old log-probs once for the whole rollout, then `--num-steps-per-rollout` optimizer steps."""
        from slime.algorithms.losses import PolicyLossConfig

        args = self.args
        temperature = args.rollout_temperature
        metrics: dict[str, float] = {}
        old = None
        if not args.use_rollout_logprobs:
            started = time.perf_counter()
            old = self.trainer.compute_log_probs(samples, temperature)
            metrics["train/log_probs_time_s"] = time.perf_counter() - started
            diffs = [
                abs(a - b) for s, lps in zip(samples, old, strict=True) if s.rollout_log_probs is not None
                for a, b, m in zip(lps, s.rollout_log_probs, s.loss_mask or [1] * s.response_length, strict=True)
                if m
            ]
            if diffs:
                metrics["train/train_rollout_logprob_abs_diff_max"] = max(diffs)
        config = PolicyLossConfig(
            loss_type={"grpo": "ppo", "gspo": "gspo", "cispo": "cispo"}[args.advantage_estimator],
            eps_clip=args.eps_clip,
            eps_clip_high=args.eps_clip_high,
            eps_clip_c=args.eps_clip_c,
            aggregation="token_mean" if args.calculate_per_token_loss else "sequence_mean",
            entropy_coef=args.entropy_coef,
            kl_loss_coef=args.kl_loss_coef if args.use_kl_loss else 0.0,
            kl_loss_type=args.kl_loss_type,
            use_unbiased_kl=args.use_unbiased_kl,
            use_tis=args.use_tis,
            tis_clip_low=args.tis_clip_low,
            tis_clip=args.tis_clip,
        )
        steps = max(1, min(args.num_steps_per_rollout, len(samples)))
        bounds = [round(i * len(samples) / steps) for i in range(steps + 1)]
        per_step = []
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
            per_step.append(self.trainer.train_step(
                samples[lo:hi], advantages[lo:hi], config, temperature=temperature,
                old_log_probs=None if old is None else old[lo:hi],
                use_rollout_logprobs=args.use_rollout_logprobs,
            ))
        for key in per_step[0]:
            metrics[f"train/{key}"] = sum(m[key] for m in per_step) / len(per_step)
        return metrics


@ray.remote
class EngineActor:
    """One rollout engine (the CPU engine here) serving SGLang's HTTP API from this actor's process."""

    def __init__(self, model_path: str, port: int, seed: int, max_batch_size: int):
        import torch

        from slime.engine.cpu_server import CPUEngine

        _quiet_transformers()
        torch.set_num_threads(max(os.cpu_count() or 1, 1))
        self.engine = CPUEngine(model_path, host="127.0.0.1", port=port, seed=seed, max_batch_size=max_batch_size)

    def start(self) -> dict[str, Any]:
        url = self.engine.start()
        return {"url": url, "port": self.engine.port, "pid": os.getpid()}

    def update_weights_from_disk(self, path: str, version: str) -> str:
        return self.engine.update_weights_from_disk(path, weight_version=version)

    def shutdown(self) -> None:
        self.engine.shutdown()


class EngineStartError(RuntimeError):
    """An engine could not be started or restarted."""


class EnginePool:
    """The engines of a run, driven from the driver's event loop.

    `args.rollout_engine_urls` (and `sglang_router_ip/port`, for plugins that post to the router
    address) always name the live engines; `args.rollout_engine_pids` their processes.
    """

    def __init__(self, args: argparse.Namespace, placement: Placement):
        self.args = args
        self.placement = placement
        self.handles: list[Any] = [None] * len(placement.engine_bundles)
        self.ports: list[int] = [0] * len(placement.engine_bundles)
        self.weights_path = args.hf_checkpoint
        self.weight_version = "0"
        self.restarts = 0
        self._info: dict[int, dict[str, Any]] = {}
        self._lock = asyncio.Lock()
        self._http = httpx.AsyncClient(timeout=5.0, trust_env=False)

    async def start(self) -> None:
        await asyncio.gather(*(self._start_one(i) for i in range(len(self.handles))))
        self._publish()

    async def _start_one(self, i: int) -> None:
        opts = self.placement.options(self.placement.engine_bundles[i], "engine")
        a = self.args
        for port in dict.fromkeys((self.ports[i], 0)):  # old port first, so HTTP retries reconnect
            handle = EngineActor.options(**opts).remote(self.weights_path, port, a.engine_seed + i,
                                                        a.engine_max_batch_size)
            try:
                info = await handle.start.remote()
            except Exception as exc:  # noqa: BLE001 - bind races surface as actor errors; try a new port
                logger.warning("engine %d did not start on port %d (%s)", i, port, exc)
                ray.kill(handle, no_restart=True)
                continue
            self.handles[i], self.ports[i] = handle, info["port"]
            self._info[i] = info
            if self.weight_version != "0":
                await handle.update_weights_from_disk.remote(self.weights_path, self.weight_version)
            logger.info("engine %d serving %s (pid %d, weights %s)", i, info["url"], info["pid"], self.weight_version)
            return
        raise EngineStartError(f"engine {i} failed to start from {self.weights_path}")

    def _publish(self) -> None:
        infos = [self._info[i] for i in range(len(self.handles))]
        self.args.rollout_engine_urls = [info["url"] for info in infos]
        self.args.rollout_engine_pids = [info["pid"] for info in infos]
        self.args.sglang_router_ip = "127.0.0.1"
        self.args.sglang_router_port = infos[0]["port"]

    async def _healthy(self, i: int) -> bool:
        url = self._info[i]["url"]
        for _ in range(2):
            try:
                if (await self._http.get(f"{url}/health")).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)
        return False

    async def ensure_healthy(self, *_: Any) -> int:
        """Restart every engine that does not answer /health; returns how many were restarted."""
        async with self._lock:
            dead = [i for i in range(len(self.handles)) if not await self._healthy(i)]
            for i in dead:
                logger.error("engine %d at %s is not answering: restarting it with weights %s",
                             i, self._info[i]["url"], self.weight_version)
                ray.kill(self.handles[i], no_restart=True)
                await self._start_one(i)
                self.restarts += 1
            if dead:
                self._publish()
            return len(dead)

    async def watch(self, interval_s: float) -> None:
        """Health-check every `interval_s` seconds until cancelled (run beside a step's generation)."""
        while True:
            await asyncio.sleep(interval_s)
            await self.ensure_healthy()

    async def update_weights(self, path: str, version: str) -> None:
        """Point every engine at the HF folder `path` (disk transport) and record it for restarts."""
        async with self._lock:
            self.weights_path, self.weight_version = path, version
            await asyncio.gather(*(h.update_weights_from_disk.remote(path, version) for h in self.handles))

    async def shutdown(self) -> None:
        for handle in self.handles:
            if handle is not None:
                try:
                    await asyncio.wait_for(handle.shutdown.remote(), timeout=20)
                except Exception:  # noqa: BLE001 - best effort at exit; the actor is killed next
                    pass
                ray.kill(handle, no_restart=True)
        await self._http.aclose()

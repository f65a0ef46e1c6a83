"""`EnginePool`: the run's rollout engines as Ray actors, driven from the driver's event loop.

Engines: `--engine-type cpu` runs `CPUEngine` inside `EngineActor`; `--engine-type sglang` runs a
real SGLang server under `SGLangEngineActor` (GPU only, UNTESTED HERE). The pool starts them,
health-checks them, restarts a dead one on its old port with the current weights (so in-flight
HTTP retries reach the new process), puts an optional router in front (`--rollout-router`), and
syncs weights:

- disk (`--update-weight-transport disk`, everywhere): the trainer exports HF safetensors, every
  engine loads them with `/update_weights_from_disk` (`update_weights` / `sync_weights`);
- tensor (`--update-weight-transport tensor`): `sync_weights` asks the train actor to post its
  weights bucket by bucket to every engine's `/update_weights_from_tensor` -- shared-memory handles
  to CPU engines (run here in training runs: tests/slime/test_weight_sync_tensor.py), CUDA IPC
  handles to colocated SGLang engines (payload checked against both sglangs' code on CPU; never run
  on a GPU here). Engines on another node than the train actor load a disk export instead (logged),
  and a failed tensor sync leaves its engines paused while every engine loads a disk export of the
  same version (logged as WEIGHT SYNC FALLBACK, tested with a real engine and train worker), so no
  engine generates on half-updated weights;
- nccl (`--update-weight-transport nccl`, SGLang engines on GPUs of their own; refused with
  --colocate): `sync_weights` asks the train actor to broadcast its weights bucket by bucket
  (`TensorWeightSync`, checked over gloo against sglang's own receiving code; never run against a
  live SGLang server here).

Under tensor and nccl an engine restarted later gets a disk export of the current weights (and the
trainer re-forms its NCCL group). `last_sync` holds what the last sync moved (transport, bytes_sent,
parameters, bytes_per_parameter, seconds; fallback details when there was one).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import ray

from slime.arguments import serving_dtype
from slime.engine.base import LOAD_LORA_ADAPTER, UNLOAD_LORA_ADAPTER, EngineError
from slime.engine.lora_adapters import adapter_name, load_adapter_body, lora_rank, unload_adapter_body

if TYPE_CHECKING:
    from slime.ray_actors import Placement

logger = logging.getLogger(__name__)
HEALTH_TRIES = 2  # a failed /health is retried once, a second later, before the engine is restarted


def health_window_s() -> float:
    """SGLang's own /health window: it answers 503 only after this many seconds without progress
    (sglang.srt.entrypoints.http_server: HEALTH_CHECK_TIMEOUT, env SGLANG_HEALTH_CHECK_TIMEOUT, 20 s)."""
    return float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))


def quiet_transformers() -> None:
    """No per-save / per-load progress bars from transformers in actor logs (one a weight sync)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


@ray.remote
class EngineActor:
    """One CPU engine serving SGLang's HTTP API from this actor's process."""

    def __init__(self, model_path: str, port: int, seed: int, max_batch_size: int, prefix_cache_tokens: int,
                 on_node_ip: bool = False, dtype: str = "float32"):
        """on_node_ip: listen on this node's IP, not loopback: the driver may run on another node (--ray-address)."""
        import torch

        from slime.engine.cpu_server import CPUEngine

        quiet_transformers()
        torch.set_num_threads(max(os.cpu_count() or 1, 1))
        host = ray.util.get_node_ip_address() if on_node_ip else "127.0.0.1"
        self.engine = CPUEngine(model_path, host=host, port=port, seed=seed, max_batch_size=max_batch_size,
                                prefix_cache_tokens=prefix_cache_tokens, dtype=dtype)

    def start(self) -> dict[str, Any]:
        url = self.engine.start()
        return {"url": url, "port": self.engine.port, "pid": os.getpid()}

    def update_weights_from_disk(self, path: str, version: str) -> str:
        return self.engine.update_weights_from_disk(path, weight_version=version)

    def exit_code(self) -> int | None:
        """None: the engine serves from this actor's own process, which is answering."""
        return None

    def shutdown(self) -> None:
        self.engine.shutdown()


class EngineStartError(RuntimeError):
    """An engine could not be started or restarted."""


class EnginePool:
    """The engines of a run.

    `args.rollout_engine_urls` always names the live engines, `args.rollout_engine_pids` their
    processes, and `args.sglang_router_ip/port` the router (`--rollout-router`), else engine 0.
    """

    def __init__(self, args: argparse.Namespace, placement: Placement):
        self.args = args
        self.placement = placement
        self.handles: list[Any] = [None] * len(placement.engine_bundles)
        self.ports: list[int] = [0] * len(placement.engine_bundles)
        self.weights_path = args.hf_checkpoint
        self.weight_version = "0"
        self.restarts = 0
        self.router: Any = None
        self._trainer: Any = None  # the train actor, once weights were synced from its memory (nccl, tensor)
        self.last_sync: dict[str, Any] = {}  # what the last weight sync moved (see sync_weights)
        self._weights_root = ""
        self._path_version = "0"  # the weight version stored at weights_path
        self.adapter_path: str | None = None  # --lora-rank > 0: the adapter every engine serves (base: hf_checkpoint)
        self._info: dict[int, dict[str, Any]] = {}
        self._gpu_ids: list[list[int] | None] = [None] * len(self.handles)
        self._lock = asyncio.Lock()
        self._http = httpx.AsyncClient(timeout=5.0, trust_env=False)
        # CPU engines answer /health at once; SGLang's may take its whole window (see `_health`).
        self.health_timeout_s = health_window_s() + 10.0 if self.engine_type == "sglang" else 5.0

    @property
    def engine_type(self) -> str:
        return getattr(self.args, "engine_type", "cpu")

    async def start(self) -> None:
        if self.engine_type == "sglang":
            self._gpu_ids = self._engine_gpus()
        await asyncio.gather(*(self._start_one(i) for i in range(len(self.handles))))
        kind = getattr(self.args, "rollout_router", "none")
        if kind != "none":
            from slime.engine.router_process import RouterProcess

            host = "127.0.0.1" if self.engine_type == "cpu" else ray.util.get_node_ip_address()
            self.router = RouterProcess(kind, host=host, policy=getattr(self.args, "router_policy", None))
            await asyncio.to_thread(self.router.start)
            for info in self._info.values():
                await asyncio.to_thread(self.router.add_worker, info["url"])
        self._publish()

    def _engine_gpus(self) -> list[list[int] | None]:
        """Per engine, the GPUs of its tp bundles (None for tp = 1: Ray's own assignment is right)."""
        tp = self.args.rollout_num_gpus_per_engine
        if tp == 1 or not self.placement.use_gpu:
            return [None] * len(self.handles)
        from slime.engine.sglang_actor import bundle_gpu_ids

        return [[g for ids in bundle_gpu_ids(self.placement.group, list(range(b, b + tp))) for g in ids]
                for b in self.placement.engine_bundles]

    def _new_actor(self, i: int, port: int) -> Any:
        a = self.args
        opts = self.placement.options(self.placement.engine_bundles[i], "engine")
        if self.engine_type == "sglang":
            from slime.engine.sglang_actor import SGLangEngineActor

            log_dir = str(Path(a.save) / "logs") if getattr(a, "save", None) else None
            return SGLangEngineActor.options(**opts).remote(a, self.weights_path, port, i, self._gpu_ids[i], log_dir)
        return EngineActor.options(**opts).remote(self.weights_path, port, a.engine_seed + i, a.engine_max_batch_size,
                                                  a.engine_prefix_cache_tokens, bool(getattr(a, "ray_address", None)),
                                                  serving_dtype(a))

    async def _start_one(self, i: int) -> None:
        for port in dict.fromkeys((self.ports[i], 0)):  # old port first, so HTTP retries reconnect
            handle = self._new_actor(i, port)
            try:
                info = await handle.start.remote()
            except Exception as exc:  # noqa: BLE001 - bind races surface as actor errors; try a new port
                logger.warning("engine %d did not start on port %d (%s)", i, port, exc)
                ray.kill(handle, no_restart=True)
                continue
            self.handles[i], self.ports[i] = handle, info["port"]
            self._info[i] = info
            if self._path_version != "0":
                await handle.update_weights_from_disk.remote(self.weights_path, self._path_version)
            if self.adapter_path is not None:  # a restarted engine of a LoRA run: the base, then the adapter
                await self._post_each([info["url"]], LOAD_LORA_ADAPTER[1],
                                      load_adapter_body(adapter_name(self.args), self.adapter_path))
            logger.info("engine %d serving %s (pid %d, weights %s)", i, info["url"], info["pid"], self.weight_version)
            return
        raise EngineStartError(f"engine {i} failed to start from {self.weights_path}")

    def _publish(self) -> None:
        infos = [self._info[i] for i in range(len(self.handles))]
        self.args.rollout_engine_urls = [info["url"] for info in infos]
        self.args.rollout_engine_pids = [info["pid"] for info in infos]
        if self.router is not None:
            self.args.rollout_router_url = self.router.url
            self.args.sglang_router_ip, self.args.sglang_router_port = self.router.host, self.router.port
        else:
            self.args.sglang_router_ip = infos[0]["url"].split("//")[1].rsplit(":", 1)[0]
            self.args.sglang_router_port = infos[0]["port"]

    async def _health(self, i: int) -> str | None:
        """None if engine `i` answers GET /health with 200, else why not (the cause a restart logs).

        SGLang's /health generates one token and waits up to its own window (SGLANG_HEALTH_CHECK_TIMEOUT,
        20 s) before answering 503, so the client waits that window plus a margin, and one failed try
        is repeated after a second: a busy or briefly stalled engine is never killed for being slow."""
        url = self._info[i]["url"]
        cause = ""
        for attempt in range(HEALTH_TRIES):
            if attempt:
                await asyncio.sleep(1.0)
            try:
                reply = await self._http.get(f"{url}/health", timeout=self.health_timeout_s)
            except httpx.TimeoutException:
                cause = (f"no answer to GET /health within {self.health_timeout_s:.0f} s (SGLang's own window "
                         f"is {health_window_s():.0f} s)")
                continue
            except httpx.HTTPError as exc:
                cause = f"GET /health failed: {type(exc).__name__}: {exc}"
                continue
            if reply.status_code == 200:
                return None
            cause = f"GET /health answered {reply.status_code} {reply.text[:200]!r}"
        exit_code = await self._exit_code(i)
        return f"{cause} ({HEALTH_TRIES} tries); {exit_code}"

    async def _exit_code(self, i: int) -> str:
        """What the engine's actor says of its server process, for the restart's log line."""
        try:
            code = await asyncio.wait_for(self.handles[i].exit_code.remote(), timeout=10.0)
        except Exception as exc:  # noqa: BLE001 - a dead actor: its error is the cause to report
            return f"its actor does not answer ({type(exc).__name__})"
        return "its server process is running" if code is None else f"its server process exited with code {code}"

    async def _stop_actor(self, handle: Any, timeout_s: float = 20) -> None:
        """Ask the actor to stop its server (SGLang runs in its own process group), then kill it."""
        try:
            await asyncio.wait_for(handle.shutdown.remote(), timeout=timeout_s)
        except Exception:  # noqa: BLE001 - a dead actor cannot answer; it is killed next anyway
            pass
        ray.kill(handle, no_restart=True)

    async def ensure_healthy(self, *_: Any) -> int:
        """Restart every engine that does not answer /health; returns how many were restarted."""
        async with self._lock:
            causes = await asyncio.gather(*(self._health(i) for i in range(len(self.handles))))
            dead = [i for i, cause in enumerate(causes) if cause is not None]
            for i in dead:
                old_url = self._info[i]["url"]
                logger.error("ENGINE RESTART: engine %d at %s failed its health check: %s; restarting it with "
                             "weights %s from %s", i, old_url, causes[i], self.weight_version, self.weights_path)
                await self._stop_actor(self.handles[i], timeout_s=5)
                await self._restore_latest_weights()
                await self._start_one(i)
                if self.router is not None:
                    await asyncio.to_thread(self.router.remove_worker, old_url)
                    await asyncio.to_thread(self.router.add_worker, self._info[i]["url"])
                self.restarts += 1
            if dead:
                self._publish()
            return len(dead)

    async def _restore_latest_weights(self) -> None:
        """nccl / tensor transports: the newest weights exist only in the trainer; export them for the restart.
        A LoRA run's base never changes: its restart loads the adapter (`_start_one`)."""
        if self._trainer is None or self._path_version == self.weight_version or self.adapter_path is not None:
            return
        self.weights_path = await self._trainer.export.remote(
            str(Path(self._weights_root) / f"restart_v{int(self.weight_version):06d}"))
        self._path_version = self.weight_version
        for old in Path(self._weights_root).glob("restart_v*"):  # one export is all a restart needs
            if old != Path(self.weights_path):
                shutil.rmtree(old, ignore_errors=True)
        await self._trainer.reset_tensor_sync.remote()  # the next sync re-forms the group with the new engine

    async def watch(self, interval_s: float, stop: asyncio.Event) -> None:
        """Health-check every `interval_s` seconds until `stop` is set (run beside a step's generation).

        Stopping lets a restart in progress finish instead of cancelling it: a cancelled restart
        would leave the engine half started and count in no step's `rollout/engine_restarts`."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=interval_s)
            except TimeoutError:
                await self.ensure_healthy()

    async def update_weights(self, path: str, version: str) -> None:
        """Point every engine at the HF folder `path` (disk transport) and record it for restarts."""
        async with self._lock:
            self.weights_path, self.weight_version = path, version
            self._path_version = version
            await asyncio.gather(*(h.update_weights_from_disk.remote(path, version) for h in self.handles))

    async def sync_weights(self, trainer: Any, version: int, out_dir: str) -> str:
        """Make every engine serve the train actor's weights as `version`, by `--update-weight-transport`.

        disk: export to `out_dir` and load it (returns the folder). nccl / tensor: from the trainer's
        memory (returns ""; `out_dir`'s parent is kept for exports that restarted engines need). The
        tensor transport loads engines on other nodes from disk, and when it fails, loads every engine
        from disk while they are still paused (returns the folder then): no engine serves half-updated
        weights. `last_sync` records what moved (transport, bytes_sent, parameters, seconds, ...).
        """
        if lora_rank(self.args):
            return await self._sync_adapter(trainer, version, out_dir)
        transport = getattr(self.args, "update_weight_transport", "disk")
        if transport == "disk":
            started = asyncio.get_running_loop().time()
            path = await trainer.export.remote(out_dir)
            await self.update_weights(path, str(version))
            from slime.weight_sync import safetensors_size

            size, count = safetensors_size(path)
            self.last_sync = {"version": str(version), "transport": "disk", "bytes_sent": size, "parameters": count,
                              "bytes_per_parameter": size / count if count else 0.0,
                              "seconds": asyncio.get_running_loop().time() - started}
            return path
        async with self._lock:
            self._trainer, self._weights_root = trainer, str(Path(out_dir).parent)
            tp = self.args.rollout_num_gpus_per_engine
            urls = [self._info[i]["url"] for i in range(len(self.handles))]
            result = await trainer.update_weights_tensor.remote(urls, [tp] * len(self.handles), version,
                                                                self.args.update_weight_buffer_size)
            result = result if isinstance(result, dict) else {"version": str(version)}
            self.last_sync = result
            skipped, error = result.get("skipped") or {}, result.get("error")
            redo = list(range(len(urls))) if error else [i for i, url in enumerate(urls) if url in skipped]
            if not redo:
                self.weight_version = str(version)
                return ""
            if error:
                logger.error("WEIGHT SYNC FALLBACK: the %s sync of weights v%d failed (%s); loading them from disk "
                             "into every engine before they generate again", result.get("transport"), version, error)
            for url, why in skipped.items():
                logger.warning("engine %s gets weights v%d from disk: %s (no shared memory with the trainer)",
                               url, version, why)
            try:
                path = await trainer.export.remote(out_dir)
                self.weights_path, self._path_version = path, str(version)
                await asyncio.gather(*(self.handles[i].update_weights_from_disk.remote(path, str(version))
                                       for i in redo))
            finally:
                if error:  # the failed sync left its engines paused
                    await self._post_each([urls[i] for i in redo if urls[i] not in skipped], "/continue_generation",
                                          {})
            self.weight_version = str(version)
            self.last_sync = {**result, "fallback": "disk", "fallback_engines": [urls[i] for i in redo]}
            return path

    async def _sync_adapter(self, trainer: Any, version: int, out_dir: str) -> str:
        """LoRA (`--lora-rank` > 0): only the adapter moves. The train actor writes it as a peft folder and every
        engine swaps it in under the run's adapter name (SGLang's /unload_lora_adapter then /load_lora_adapter;
        the CPU engine serves the same routes); requests name it in `lora_path`. Between steps, as every sync:
        nothing generates, so no request holds the old adapter. Returns the folder."""
        started = asyncio.get_running_loop().time()
        path = await trainer.export_adapter.remote(out_dir)
        name = adapter_name(self.args)
        async with self._lock:
            urls = [self._info[i]["url"] for i in range(len(self.handles))]
            if self.adapter_path is not None:
                await self._post_each(urls, UNLOAD_LORA_ADAPTER[1], unload_adapter_body(name))
            await self._post_each(urls, LOAD_LORA_ADAPTER[1], load_adapter_body(name, path))
            previous, self.adapter_path, self.weight_version = self.adapter_path, path, str(version)
        if previous is not None and previous != path:  # restarts load the newest; nothing reads the old one
            shutil.rmtree(previous, ignore_errors=True)
        from slime.weight_sync import safetensors_size

        size, count = safetensors_size(path)
        self.last_sync = {"version": str(version), "transport": "lora-adapter", "bytes_sent": size,
                          "parameters": count, "bytes_per_parameter": size / count if count else 0.0,
                          "seconds": asyncio.get_running_loop().time() - started}
        return path

    async def release_memory(self) -> None:
        """Colocated GPUs (--offload-rollout): every engine frees its weights, KV cache and CUDA graphs
        so that the trainer can use the memory. The engines refuse requests until `resume_memory`."""
        await self._post_all("/release_memory_occupation", {})

    async def resume_memory(self, tags: list[str]) -> None:
        """Re-allocate `tags` (`weights` before a weight sync, then `kv_cache` and `cuda_graph`)."""
        await self._post_all("/resume_memory_occupation", {"tags": tags})

    async def _post_all(self, path: str, body: dict[str, Any]) -> None:
        urls = [self._info[i]["url"] for i in range(len(self.handles))]
        async with self._lock:
            await self._post_each(urls, path, body)

    async def _post_each(self, urls: list[str], path: str, body: dict[str, Any]) -> None:
        replies = await asyncio.gather(*(self._http.post(f"{url}{path}", json=body, timeout=300.0) for url in urls),
                                       return_exceptions=True)
        errors = [f"{url}: {r!r}" if isinstance(r, BaseException) else f"{url}: {r.status_code} {r.text}"
                  for url, r in zip(urls, replies, strict=True)
                  if isinstance(r, BaseException) or r.status_code != 200]
        if errors:
            raise EngineError(f"{path} failed on {len(errors)} engine(s): " + "; ".join(errors))

    async def shutdown(self) -> None:
        for handle in self.handles:
            if handle is not None:
                await self._stop_actor(handle)
        if self.router is not None:
            self.router.shutdown()
        if self._trainer is not None:
            try:
                await self._trainer.reset_tensor_sync.remote()
            except Exception:  # noqa: BLE001 - best effort at exit
                pass
        await self._http.aclose()

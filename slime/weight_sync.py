"""Pushing the trainer's weights into the rollout engines: one interface, a disk path and tensor paths.

    sync = DiskWeightSync("/ckpt/weights")     # or TensorWeightSync(mode="shm" | "ipc" | "nccl")
    version = sync.sync(trainer, engines, version=step)
    sync.stats()  # {"transport", "bytes_sent", "parameters", "bytes_per_parameter", "seconds"} of that sync

Every `sync` brackets the transfer the same way (docs/trainer.md, slime's contracts): pause generation,
flush the prefix cache (fails if requests still run: drain or abort them first), transfer, continue.
`engines` are `RolloutEngine`s; a `Router` counts as one engine for the disk path (it fans the update
out and reloads engines that rejoin later), while the tensor paths need each engine's own URL.

In a training run `slime.engine.pool.EnginePool.sync_weights` picks the path from
`--update-weight-transport`: disk; tensor, where the train actor runs `TensorWeightSync("shm")` for CPU
engines and `TensorWeightSync("ipc")` for colocated SGLang engines on `EngineClient`s (engines on
other nodes, and every engine after a failed sync, load from disk instead); or nccl,
`TensorWeightSync("nccl")`.

What ran where:
- disk: everywhere (CPU tests, the GPU device checks).
- shm (`/update_weights_from_tensor` with shared-memory handles by file name, sglang's
  `flattened_bucket` format, `slime.engine.tensor_payload`): on CPU into the real CPU engine, in
  training runs through the real train actor (tests/slime/test_weight_sync_tensor.py: log-probs match
  the trainer's after every sync, 2.0 bytes a parameter in bf16, no /dev/shm object left behind);
  and read by both pinned sglangs' own `MultiprocessingSerializer.deserialize` (SafeUnpickler) and
  flattened-bucket receiving code, bit-exact (tests/slime/test_weight_sync_sglang.py).
- ipc (CUDA IPC handles, sglang's own serializer): its payload layout is rebuilt by both sglangs'
  `FlattenedTensorBucket` on CPU (a host tensor in place of the GPU one); it has NOT run on a GPU or
  against a live SGLang server.
- nccl (`/init_weights_update_group` + `/update_weights_from_distributed`): on CPU over gloo between
  this module and both sglangs' own `init_custom_process_group` and receive loops; on one GPU the
  update group forms and broadcasts (tests/gpu/device_check.sh); never against a live SGLang server.
On 0.5.21+ (0.5.23) the tensor paths run inside `/begin_weight_update` ... `/end_weight_update`
(`update_session`); 0.5.10 and the CPU engine have no session.
"""

from __future__ import annotations

import abc
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from slime.backends.checkpoint import dtype_name  # SGLang reads dtype strings with getattr(torch, name)
from slime.engine.base import (
    BEGIN_WEIGHT_UPDATE,
    DESTROY_WEIGHTS_UPDATE_GROUP,
    END_WEIGHT_UPDATE,
    INIT_WEIGHTS_UPDATE_GROUP,
    UPDATE_WEIGHTS_FROM_DISTRIBUTED,
    UPDATE_WEIGHTS_FROM_TENSOR,
    EngineError,
    RolloutEngine,
)
from slime.utils.misc import free_port

logger = logging.getLogger(__name__)

VERSION_DIR = re.compile(r"^weight_v(\d{6,})$")
DEFAULT_BUCKET_BYTES = 512 * 1024**2  # slime's --update-weight-buffer-size
# Wrappers that prefix parameter names: DDP / FSDP1 (`module.`, `_fsdp_wrapped_module.`),
# torch.compile (`_orig_mod.`), activation checkpointing (`_checkpoint_wrapped_module.`).
WRAPPER_PREFIXES = ("_orig_mod.", "module.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


class WeightSync(abc.ABC):
    """Make `engines` serve the trainer's current weights under `version`; returns the version string.

    After a sync, `transport`, `bytes_sent` (bytes of tensor data one engine received: the bucket
    bytes for the tensor paths, the safetensors files for disk), `parameters` (how many numbers they
    held) and `seconds` say what moved; `stats()` has them as one dict. With `keep_paused_on_error`
    a failed transfer leaves the engines paused (no generation on half-updated weights) for a
    fallback to load weights and `/continue_generation` them."""

    transport = ""

    def __init__(self, *, flush_timeout_s: float = 60.0, keep_paused_on_error: bool = False):
        self.flush_timeout_s = flush_timeout_s
        self.keep_paused_on_error = keep_paused_on_error
        self.bytes_sent = self.parameters = 0
        self.seconds = 0.0
        self.iterated = False

    def sync(self, trainer: Any, engines: Sequence[RolloutEngine], version: int) -> str:
        started = time.perf_counter()
        self.bytes_sent = self.parameters = 0
        self.iterated = False  # whether the trainer's tensors were iterated (FSDP ranks gather them together)
        with self._paused(engines):
            self._transfer(trainer, engines, version)
        self.seconds = time.perf_counter() - started
        return str(version)

    def stats(self) -> dict[str, Any]:
        """What the last sync moved: transport, bytes_sent, parameters, bytes_per_parameter, seconds."""
        per = self.bytes_sent / self.parameters if self.parameters else 0.0
        return {"transport": self.transport, "bytes_sent": self.bytes_sent, "parameters": self.parameters,
                "bytes_per_parameter": per, "seconds": self.seconds}

    @abc.abstractmethod
    def _transfer(self, trainer: Any, engines: Sequence[RolloutEngine], version: int) -> None:
        """Move the weights; generation is paused and the cache flushed while this runs."""

    @contextmanager
    def _paused(self, engines: Sequence[RolloutEngine]) -> Iterator[None]:
        _each(engines, lambda e: e.pause_generation())
        done = False
        try:
            _each(engines, lambda e: e.flush_cache(timeout_s=self.flush_timeout_s))
            yield
            done = True
        finally:
            if done or not self.keep_paused_on_error:
                _each(engines, lambda e: e.continue_generation())


def _each(engines: Sequence[RolloutEngine], call: Callable[[RolloutEngine], Any]) -> list[Any]:
    """Run `call` on every engine concurrently; raise one EngineError naming every engine that failed."""
    if len(engines) == 1:
        return [call(engines[0])]
    with ThreadPoolExecutor(max_workers=len(engines)) as pool:
        futures = [pool.submit(call, engine) for engine in engines]
    errors = [f"{engine.url}: {f.exception()}" for engine, f in zip(engines, futures, strict=True) if f.exception()]
    if errors:
        raise EngineError("; ".join(errors))
    return [f.result() for f in futures]


# ---- disk ----------------------------------------------------------------------------------------


class DiskWeightSync(WeightSync):
    """Export HF safetensors to `root/weight_v{version:06d}` (atomically: written aside, then renamed;
    in `dtype`, the engines' serving dtype, named in its config.json),
    have every engine load it with `/update_weights_from_disk`, check the version they report, then
    delete older version folders, keeping the newest `keep_versions` (the newest stays so that an engine
    restarting behind a router can reload it; `keep_versions=None` keeps all)."""

    transport = "disk"

    def __init__(self, root: str | os.PathLike, *, keep_versions: int | None = 1, tokenizer: Any = None,
                 flush_timeout_s: float = 60.0, dtype: str | None = None):
        super().__init__(flush_timeout_s=flush_timeout_s)
        if keep_versions is not None and keep_versions < 1:
            raise ValueError(f"keep_versions must be >= 1 or None (keep all), got {keep_versions}")
        self.root = Path(root)
        self.keep_versions = keep_versions
        self.tokenizer = tokenizer
        self.dtype = dtype  # the engines' serving dtype (`slime.arguments.serving_dtype`); None: the trainer's

    def version_dir(self, version: int) -> Path:
        return self.root / f"weight_v{version:06d}"

    def _transfer(self, trainer: Any, engines: Sequence[RolloutEngine], version: int) -> None:
        extra = {} if self.dtype is None else {"dtype": self.dtype}
        path = Path(trainer.export_hf(self.version_dir(version), self.tokenizer, **extra))
        reported = _each(engines, lambda e: e.update_weights_from_disk(str(path), weight_version=str(version)))
        wrong = {engine.url: v for engine, v in zip(engines, reported, strict=True) if v != str(version)}
        if wrong:
            raise EngineError(f"engines report weight versions {wrong} after loading {path}, expected {version}")
        self.bytes_sent, self.parameters = safetensors_size(path)
        self.prune()
        logger.info("weights v%d loaded by %d engine(s) from %s", version, len(engines), path)

    def prune(self) -> list[Path]:
        """Delete all but the newest `keep_versions` version folders (and leftovers of killed exports)."""
        if not self.root.is_dir():
            return []
        versions = sorted((int(m.group(1)), p) for p in self.root.iterdir() if (m := VERSION_DIR.match(p.name)))
        doomed = [p for _, p in versions[: -self.keep_versions]] if self.keep_versions else []
        doomed += [p for p in self.root.glob("weight_v*.tmp-*") if not p.name.endswith(f".tmp-{os.getpid()}")]
        for path in doomed:
            shutil.rmtree(path, ignore_errors=True)
        return doomed


def safetensors_size(folder: str | os.PathLike) -> tuple[int, int]:
    """(bytes on disk, numbers held) of a folder's *.safetensors files (their headers list the shapes)."""
    import json
    import struct

    size = count = 0
    for file in Path(folder).glob("*.safetensors"):
        size += file.stat().st_size
        with open(file, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        for key, entry in header.items():
            if key != "__metadata__":
                n = 1
                for dim in entry["shape"]:
                    n *= dim
                count += n
    return size, count


# ---- tensors -------------------------------------------------------------------------------------


def hf_named_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) for every weight an engine loads: wrapper prefixes stripped, a tied
    `lm_head.weight` skipped (the engine ties it to the embedding itself), DTensor shards gathered.

    A parameter reachable under two names is sent once, judged by the parameter object itself: the
    address of a gathered copy says nothing (a freed gather's memory is reused by the next one)."""
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    seen: set[int] = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        name = hf_name(name)
        if not isinstance(tensor, torch.Tensor) or (tied and name == "lm_head.weight") or id(tensor) in seen:
            continue
        seen.add(id(tensor))
        tensor = tensor.detach()  # keep_vars gave the parameter itself: no autograd graph for the gather
        if hasattr(tensor, "full_tensor"):  # FSDP2 DTensor: all-gather the shards
            tensor = tensor.full_tensor()
        yield name, tensor


def trainer_hf_tensors(trainer: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """The trainer's weights in HF names: its own `hf_named_tensors()` where its model is not an HF
    module (the Megatron backend converts `decoder.layers.*`), else `hf_named_tensors(trainer.model)`;
    an `nn.Module` passed as `trainer` is sent as it is."""
    own = getattr(trainer, "hf_named_tensors", None)
    if callable(own):
        return own()
    # An HF model is sent as itself: its `.model` attribute is the inner decoder, without the `model.` prefix.
    return hf_named_tensors(trainer if isinstance(trainer, torch.nn.Module) else trainer.model)


def hf_name(name: str) -> str:
    """Strip the prefixes that DDP / FSDP / torch.compile wrappers add to parameter names."""
    changed = True
    while changed:
        changed = False
        for prefix in WRAPPER_PREFIXES:
            if name.startswith(prefix):
                name, changed = name[len(prefix):], True
        name = name.replace("._fsdp_wrapped_module.", ".").replace("._checkpoint_wrapped_module.", ".")
    return name


def tensor_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def bucket_named_tensors(
    named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    itemsize: int | None = None,
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Greedy buckets in order, each at most `bucket_bytes` unless one tensor alone is larger (it then
    travels alone): one transfer per bucket bounds the extra memory a sync needs. `itemsize`: count
    bytes in the dtype the tensors will travel in (they are cast later), not their own."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named:
        n = tensor.numel() * itemsize if itemsize else tensor_bytes(tensor)
        if bucket and size + n > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += n
    if bucket:
        yield bucket


def distributed_update_payload(
    bucket: Sequence[tuple[str, torch.Tensor]], group_name: str, version: int, *, flush_cache: bool = False
) -> dict[str, Any]:
    """Body of `POST /update_weights_from_distributed` announcing one bucket's broadcasts, in order."""
    return {
        "names": [name for name, _ in bucket],
        "dtypes": [dtype_name(t.dtype) for _, t in bucket],
        "shapes": [list(t.shape) for _, t in bucket],
        "group_name": group_name,
        "flush_cache": flush_cache,
        "weight_version": str(version),
    }


def init_group_payload(
    master_address: str, master_port: int, rank_offset: int, world_size: int, group_name: str,
    backend: str = "nccl",
) -> dict[str, Any]:
    """Body of `POST /init_weights_update_group`: the engine's TP ranks join as rank_offset + tp_rank."""
    return {"master_address": master_address, "master_port": master_port, "rank_offset": rank_offset,
            "world_size": world_size, "group_name": group_name, "backend": backend}


def engine_rank_offsets(tp_sizes: Sequence[int]) -> tuple[list[int], int]:
    """Rank offsets of each engine in the update group (the trainer is rank 0) and the world size."""
    offsets, next_rank = [], 1
    for tp in tp_sizes:
        offsets.append(next_rank)
        next_rank += tp
    return offsets, next_rank


def flatten_bucket(bucket: Sequence[tuple[str, torch.Tensor]]) -> tuple[torch.Tensor, list[dict[str, Any]]]:
    """One uint8 buffer holding every tensor's bytes back to back, plus where each one lies (the layout
    of SGLang's FlattenedTensorBucket: name, shape, dtype, start_idx, end_idx, numel in bytes)."""
    parts, metadata, offset = [], [], 0
    for name, tensor in bucket:
        flat = tensor.contiguous().reshape(-1).view(torch.uint8)
        parts.append(flat)
        metadata.append({"name": name, "shape": tensor.shape, "dtype": tensor.dtype,
                         "start_idx": offset, "end_idx": offset + flat.numel(), "numel": flat.numel()})
        offset += flat.numel()
    return torch.cat(parts), metadata


def unflatten_bucket(flat: torch.Tensor, metadata: Sequence[dict[str, Any]]) -> list[tuple[str, torch.Tensor]]:
    """Inverse of `flatten_bucket` (what the engine side does)."""
    return [(m["name"], flat[m["start_idx"]: m["end_idx"]].view(m["dtype"]).reshape(m["shape"]))
            for m in metadata]


def tensor_update_payload(
    serialized_per_tp_rank: Sequence[str], version: int, *, load_format: str = "flattened_bucket",
    flush_cache: bool = False,
) -> dict[str, Any]:
    """Body of `POST /update_weights_from_tensor`: one serialised bucket per engine TP rank."""
    return {"serialized_named_tensors": list(serialized_per_tp_rank), "load_format": load_format,
            "flush_cache": flush_cache, "weight_version": str(version)}


def _sglang_serializer() -> tuple[Callable[[Any], str], type]:
    """SGLang's serializer and bucket metadata class (imported lazily: GPU environments only)."""
    try:
        from sglang.srt.utils import MultiprocessingSerializer
        from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorMetadata
    except ImportError as exc:
        raise EngineError(f"TensorWeightSync needs sglang ({exc}): install a GPU set (picked from the NVIDIA driver): bash setup.sh --gpu") from exc
    try:  # CUDA IPC handles that name devices by UUID, so they survive CUDA_VISIBLE_DEVICES remapping
        from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
    except ImportError:
        from sglang.srt.patch_torch import monkey_patch_torch_reductions
    monkey_patch_torch_reductions()
    return (lambda obj: MultiprocessingSerializer.serialize(obj, output_str=True)), FlattenedTensorMetadata


class TensorWeightSync(WeightSync):
    """Weights straight from trainer memory to the engines, bucket by bucket, in HF names, inside one
    `update_session` (see the module docstring for what ran where).

    mode="shm" (colocated, host memory; the CPU engine): each bucket is flattened into a /dev/shm
    object and its handle by file name (`slime.engine.tensor_payload.encode`, sglang's wire format) is
    posted to every engine's `/update_weights_from_tensor`; the engine copies from the same memory.
    Buckets are sized to fit free /dev/shm; a tensor that alone does not fit fails the sync, saying so.

    mode="ipc" (colocated GPUs): each bucket is flattened on the trainer's GPU and its CUDA IPC handle
    (sglang's serializer) is posted the same way. With engine TP > 1 the handles of the trainer ranks
    sharing the engine's GPUs are gathered over `ipc_group` (one entry per TP rank) and this rank posts them.

    Both keep a bucket alive until every engine's post returned, then free it.

    mode="nccl" (separate GPUs): `connect()` forms a process group of this trainer rank (rank 0) and
    every engine GPU (`/init_weights_update_group`); each bucket is announced with
    `/update_weights_from_distributed` and broadcast from rank 0 while the engines receive it.
    Call `close()` to destroy the group. `engine_tp_sizes` gives each engine's TP size.
    `backend="gloo"` sends from host memory instead (the CPU conformance tests; engines must have
    been asked to join with gloo too, which `init_group_payload` does). `group_timeout_s` bounds the
    rendezvous and every collective of the group.

    `dtype` (the engines' serving dtype, `slime.arguments.serving_dtype`; None: the trainer's own) is
    the dtype tensors travel in. A failed bucket does not stop the iteration over the trainer's
    tensors (FSDP ranks gather them together); the sync raises once the iteration is done.
    """

    TRANSPORTS = {"shm": "shared-memory", "ipc": "cuda-ipc", "nccl": "nccl"}

    def __init__(
        self,
        mode: str = "nccl",
        *,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        engine_tp_sizes: Sequence[int] | None = None,
        dtype: str | torch.dtype | None = None,
        master_address: str = "127.0.0.1",
        master_port: int | None = None,
        group_name: str = "slime_weight_update",
        ipc_group: Any = None,
        backend: str = "nccl",
        group_timeout_s: float = 600.0,
        flush_timeout_s: float = 60.0,
        keep_paused_on_error: bool = False,
    ):
        super().__init__(flush_timeout_s=flush_timeout_s, keep_paused_on_error=keep_paused_on_error)
        if mode not in self.TRANSPORTS:
            raise ValueError(f"mode must be 'shm' (host shared memory), 'ipc' (colocated GPUs, CUDA IPC) or 'nccl' "
                             f"(separate GPUs), got {mode!r}")
        if backend not in ("nccl", "gloo"):
            raise ValueError(f"backend must be 'nccl' (GPU) or 'gloo' (host memory, tests), got {backend!r}")
        self.mode, self.bucket_bytes, self.backend = mode, bucket_bytes, backend
        self.transport = self.TRANSPORTS[mode]
        self.dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        self.engine_tp_sizes = list(engine_tp_sizes) if engine_tp_sizes is not None else None
        self.master_address, self.master_port, self.group_name = master_address, master_port, group_name
        self.ipc_group, self.group_timeout_s = ipc_group, group_timeout_s
        self._group: Any = None
        self._engines: list[RolloutEngine] = []

    def _transfer(self, trainer: Any, engines: Sequence[RolloutEngine], version: int) -> None:
        if (self.mode == "ipc" or (self.mode == "nccl" and self.backend == "nccl")) and not torch.cuda.is_available():
            raise EngineError(f"TensorWeightSync({self.mode!r}) needs CUDA; on CPU use mode='shm' or DiskWeightSync")
        itemsize = self.dtype.itemsize if self.dtype is not None else None
        bucket_bytes = self._shm_bucket_bytes() if self.mode == "shm" else self.bucket_bytes
        buckets = bucket_named_tensors(trainer_hf_tensors(trainer), bucket_bytes, itemsize)
        if self.mode == "nccl" and self._group is None:
            self.connect(engines)
        try:
            with update_session(engines):
                if self.mode == "nccl":
                    self._send_nccl(buckets, engines, version)
                else:
                    self._send_handles(buckets, engines, version)
        finally:
            for _ in buckets:  # after a failure: the other FSDP ranks still gather every tensor with this one
                pass
            self.iterated = True
        if self.mode != "nccl":
            reported = _each(engines, lambda e: e.weight_version())
            wrong = {e.url: v for e, v in zip(engines, reported, strict=True) if v != str(version)}
            if wrong:
                raise EngineError(f"engines report weight versions {wrong} after the tensor sync, expected {version}")
        logger.info("weights v%d sent to %d engine(s) by %s: %d bytes for %d parameters", version, len(engines),
                    self.transport, self.bytes_sent, self.parameters)

    def _cast(self, bucket: Sequence[tuple[str, torch.Tensor]], device: str | torch.device | None = None
              ) -> list[tuple[str, torch.Tensor]]:
        return [(name, tensor.to(device=device, dtype=self.dtype)) for name, tensor in bucket]

    def _count(self, bucket: Sequence[tuple[str, torch.Tensor]]) -> None:
        self.bytes_sent += sum(tensor_bytes(t) for _, t in bucket)
        self.parameters += sum(t.numel() for _, t in bucket)

    # -- shared memory / CUDA IPC: handles posted to /update_weights_from_tensor --

    def _shm_bucket_bytes(self) -> int:
        """The bucket size, lowered to fit free /dev/shm (a bucket lives there until every engine copied it)."""
        from slime.engine.tensor_payload import shm_free_bytes

        free = shm_free_bytes()
        if free is None or self.bucket_bytes <= free // 2:
            return self.bucket_bytes
        fitted = max(free // 2, 1)
        logger.warning("/dev/shm has %d MB free: weight-sync buckets of %d MB instead of %d MB (docker's default is "
                       "64 MB; `docker run --shm-size=...` gives more)", free >> 20, fitted >> 20,
                       self.bucket_bytes >> 20)
        return fitted

    def _send_handles(self, buckets: Iterable[list[tuple[str, torch.Tensor]]], engines: Sequence[RolloutEngine],
                      version: int) -> None:
        tp_sizes = self.engine_tp_sizes or [1] * len(engines)
        for bucket in buckets:
            if self.mode == "shm":  # cast while copying into shared memory: no second copy of the bucket
                self._send_shm_bucket(bucket, engines, tp_sizes, version)
            else:
                bucket = self._cast(bucket)
                self._send_ipc_bucket(bucket, engines, version)
                self._count(bucket)
        if self.mode == "ipc":
            torch.cuda.synchronize()

    def _post_bodies(self, engines: Sequence[RolloutEngine], bodies: Sequence[dict[str, Any]]) -> None:
        by_engine = {id(e): body for e, body in zip(engines, bodies, strict=True)}
        _each(engines, lambda e: _post_ok(e, UPDATE_WEIGHTS_FROM_TENSOR.path, by_engine[id(e)]))

    def _send_shm_bucket(self, bucket: list[tuple[str, torch.Tensor]], engines: Sequence[RolloutEngine],
                         tp_sizes: Sequence[int], version: int) -> None:
        from slime.engine.tensor_payload import TensorMetadata, encode, release_shared, shm_free_bytes

        dtype_of = (lambda t: t.dtype) if self.dtype is None else (lambda t: self.dtype)
        total = sum(t.numel() * dtype_of(t).itemsize for _, t in bucket)
        free = shm_free_bytes()
        if free is not None and total > free:
            raise EngineError(
                f"a weight-sync bucket needs {total} bytes of /dev/shm ({bucket[0][0]}"
                f"{' and others' if len(bucket) > 1 else ''}) and {free} are free: give the container more shared "
                "memory (`docker run --shm-size=...`) or use --update-weight-transport disk")
        flat = torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_using_filename_cpu(total))
        try:
            metadata, offset = [], 0
            for name, tensor in bucket:
                dtype = dtype_of(tensor)
                n = tensor.numel() * dtype.itemsize
                if offset % dtype.itemsize == 0:
                    flat[offset: offset + n].view(dtype).copy_(tensor.reshape(-1))  # casts on the way
                else:  # mixed dtypes put this one off its alignment: copy its bytes
                    flat[offset: offset + n].copy_(tensor.to(dtype).contiguous().reshape(-1).view(torch.uint8))
                metadata.append(TensorMetadata(name, tensor.shape, dtype, offset, offset + n, n))
                offset += n
            # one handle per engine TP rank: each receiver gives back the reference its handle took
            bodies = [tensor_update_payload([encode(flat, metadata) for _ in range(tp)], version) for tp in tp_sizes]
            self._post_bodies(engines, bodies)
        finally:
            release_shared(flat)  # references of receivers that never mapped it (a refused post)
            del flat  # the last reference: its /dev/shm object is unlinked
        self.bytes_sent += total
        self.parameters += sum(t.numel() for _, t in bucket)

    def _send_ipc_bucket(self, bucket: list[tuple[str, torch.Tensor]], engines: Sequence[RolloutEngine],
                         version: int) -> None:
        serialize, metadata_cls = _sglang_serializer()
        flat, metadata = flatten_bucket([(name, tensor.cuda()) for name, tensor in bucket])
        mine = serialize({"flattened_tensor": flat, "metadata": [metadata_cls(**m) for m in metadata]})
        per_rank = [mine]
        if self.ipc_group is not None:
            import torch.distributed as dist

            per_rank = [None] * dist.get_world_size(self.ipc_group)
            dist.all_gather_object(per_rank, mine, group=self.ipc_group)
        payload = tensor_update_payload(per_rank, version)
        self._post_bodies(engines, [payload] * len(engines))
        del flat  # the engines have copied it once every post returned

    # -- NCCL --

    def connect(self, engines: Sequence[RolloutEngine]) -> None:
        """Form the update group: engines join through their endpoint while this process joins as rank 0.

        No barrier afterwards: SGLang's side returns from `/init_weights_update_group` once its ranks
        formed the group and never joins a collective it was not asked for, so a barrier here would
        wait forever. The first broadcast is the first collective both sides run."""
        self._engines = list(engines)
        tp_sizes = self.engine_tp_sizes or [1] * len(engines)
        offsets, world_size = engine_rank_offsets(tp_sizes)
        port = self.master_port or free_port()
        with ThreadPoolExecutor(max_workers=len(engines)) as pool:
            joins = [pool.submit(_post_ok, engine, INIT_WEIGHTS_UPDATE_GROUP.path,
                                 init_group_payload(self.master_address, port, offset, world_size, self.group_name,
                                                    self.backend))
                     for engine, offset in zip(engines, offsets, strict=True)]
            self._group = init_custom_group(self.backend, f"tcp://{self.master_address}:{port}", world_size, 0,
                                            self.group_name, timeout_s=self.group_timeout_s)
            for join in joins:
                join.result()

    def _send_nccl(self, buckets: Iterable[list[tuple[str, torch.Tensor]]], engines: Sequence[RolloutEngine],
                   version: int) -> None:
        device = "cuda" if self.backend == "nccl" else "cpu"
        with ThreadPoolExecutor(max_workers=len(engines)) as pool:
            for bucket in buckets:
                bucket = self._cast(bucket)
                payload = distributed_update_payload(bucket, self.group_name, version)
                posts = [pool.submit(_post_ok, e, UPDATE_WEIGHTS_FROM_DISTRIBUTED.path, payload) for e in engines]
                broadcast_bucket(bucket, self._group, device)
                for post in posts:
                    post.result()
                self._count(bucket)

    def close(self) -> None:
        if self._group is None:
            return
        import torch.distributed as dist

        for engine in self._engines:
            try:
                _post_ok(engine, DESTROY_WEIGHTS_UPDATE_GROUP.path, {"group_name": self.group_name})
            except EngineError as exc:
                logger.warning("could not destroy the weight update group on %s: %s", engine.url, exc)
        dist.destroy_process_group(self._group)
        self._group = None


def broadcast_bucket(bucket: Sequence[tuple[str, torch.Tensor]], group: Any, device: str | torch.device) -> int:
    """Broadcast a bucket's tensors from rank 0 of `group`, one by one in the announced order (SGLang's
    receive loop posts one broadcast per announced name, in order); returns the bytes sent."""
    import torch.distributed as dist

    for _, tensor in bucket:
        dist.broadcast(tensor.to(device), group=group, group_src=0)
    return sum(tensor_bytes(tensor) for _, tensor in bucket)


@contextmanager
def update_session(engines: Sequence[RolloutEngine]) -> Iterator[None]:
    """SGLang 0.5.21 and later (0.5.23, the gpu-cu13 set) load tensors only inside
    `/begin_weight_update` ... `/end_weight_update` (outside it `/update_weights_from_distributed` and
    `/update_weights_from_tensor` answer 400); earlier ones (0.5.10, the gpu-cu12 set) serve neither
    route and load at once. Each engine's version decides (`RolloutEngine.serves`, read once from
    `/server_info`), so mixed versions work. The session is closed even when the transfer fails: an
    engine left with an open session refuses the next `/begin_weight_update`."""
    sessioned = [e for e, has in zip(engines, _each(engines, lambda e: e.serves(BEGIN_WEIGHT_UPDATE)), strict=True)
                 if has]
    if sessioned:
        _each(sessioned, lambda e: _post_ok(e, BEGIN_WEIGHT_UPDATE.path, {}))
    try:
        yield
    finally:
        if sessioned:
            _each(sessioned, lambda e: _post_ok(e, END_WEIGHT_UPDATE.path, {}))


def _post_ok(engine: RolloutEngine, path: str, body: dict[str, Any]) -> dict[str, Any]:
    reply = engine._call("POST", path, body).json()
    if isinstance(reply, dict) and reply.get("success") is False:
        raise EngineError(f"{engine.url}{path} refused: {reply.get('message')}")
    return reply


def init_custom_group(backend: str, init_method: str, world_size: int, rank: int, group_name: str, *,
                      timeout_s: float = 600.0) -> Any:
    """A process group next to (not replacing) the default one, formed the way SGLang's engine side
    forms it (sglang.srt.utils.common.init_custom_process_group: `rendezvous`, the store wrapped in
    `PrefixStore(group_name, ...)`, `_new_process_group_helper` under the same group name), so both
    ends read and write the same store keys. Works with gloo too, which is how the CPU tests form it
    against SGLang's own function (tests/slime/test_weight_sync_sglang.py)."""
    from datetime import timedelta

    import torch.distributed.distributed_c10d as c10d

    timeout = timedelta(seconds=timeout_s)
    store, rank, world_size = next(c10d.rendezvous(init_method, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    store = c10d.PrefixStore(group_name, store)  # SGLang's side keys the NCCL id exchange under group_name
    group, _ = c10d._new_process_group_helper(
        world_size, rank, [], backend, store, group_name=group_name, timeout=timeout
    )
    c10d._world.pg_group_ranks[group] = {i: i for i in range(world_size)}
    return group

"""The wire format of `POST /update_weights_from_tensor` on host memory: both ends, without sglang.

SGLang's body carries, per engine TP rank, one base64 string: a `ForkingPickler` dump of

    {"flattened_tensor": uint8 tensor, "metadata": [FlattenedTensorMetadata(name, shape, dtype,
                                                                             start_idx, end_idx, numel)]}

(`load_format="flattened_bucket"`). On a GPU the tensor pickles as a CUDA IPC handle. On the CPU this
module pickles it as a shared-memory handle *by file name* (torch's `file_system` sharing strategy:
`rebuild_storage_filename` with the `/dev/shm` object's name and the sender's torch_shm_manager
socket), which any process of the same user on the same machine can open; the `file_descriptor`
strategy passes a descriptor over a connection that needs the sender's multiprocessing authkey, so
it cannot reach an unrelated server. SGLang's own `MultiprocessingSerializer.deserialize` (its
SafeUnpickler) reads what `encode` writes (tests/slime/test_weight_sync_sglang.py, both pinned versions).

Sender: `encode(flat, metadata)`. Each call takes one reference on the shared memory for the one
receiver that will open it (torch's reducer does the same); `release_shared` settles whatever the
receivers left and the bucket is freed, so no /dev/shm object outlives a sync.

Receiver (the CPU engine; its port is open to every local process, so this is a trust boundary):
`decode(text)` checks the size, then unpickles with `RestrictedUnpickler`, which admits only what the
payload needs -- torch's tensor / storage rebuild functions for shared memory by file name (wrapped:
their arguments are checked before anything is opened), torch dtypes, `torch.Size` and the metadata
class (ours or sglang's, both read into `TensorMetadata`) -- and refuses everything else, naming it.
"""

from __future__ import annotations

import base64
import binascii
import copyreg
import io
import os
import pickle
import re
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import torch
from torch.multiprocessing import reductions

SHM_DIR = Path("/dev/shm")
MAX_PAYLOAD_CHARS = 64 * 1024**2  # one TP rank's base64 text: handles and metadata, never tensor data
MAX_TENSORS = 100_000
MAX_NAME_CHARS = 1024
# What torch names its objects: "/torch_<pid>_<random>_<counter>" (libshm), and its manager's socket.
SHM_NAME = re.compile(rb"^/torch_\d{1,10}_\d{1,12}_\d{1,12}$")
MANAGER_SOCKET = re.compile(rb"^/[\w./-]{1,4000}$")
SGLANG_METADATA = ("sglang.srt.weight_sync.tensor_bucket", "FlattenedTensorMetadata")


class PayloadError(ValueError):
    """A body the engine will not load; the HTTP layer answers 400 with this message."""


@dataclass
class TensorMetadata:
    """Where one tensor lies in a flattened bucket: the fields (and pickled state) of sglang's
    `FlattenedTensorMetadata`. Offsets and `numel` count bytes of the uint8 bucket."""

    name: str
    shape: torch.Size
    dtype: torch.dtype
    start_idx: int
    end_idx: int
    numel: int

    def __setstate__(self, state: Any) -> None:
        """Pickle's BUILD step: only the six fields, each of its type (a hostile state is refused)."""
        fields = ("name", "shape", "dtype", "start_idx", "end_idx", "numel")
        if not isinstance(state, dict) or set(state) != set(fields):
            raise PayloadError(f"tensor metadata must have exactly the fields {fields}")
        name, shape, dtype = state["name"], state["shape"], state["dtype"]
        if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS:
            raise PayloadError("tensor metadata name must be a non-empty string")
        if not isinstance(shape, tuple) or not all(type(d) is int and d >= 0 for d in shape):
            raise PayloadError(f"{name}: shape must be a torch.Size of non-negative ints")
        if not isinstance(dtype, torch.dtype):
            raise PayloadError(f"{name}: dtype must be a torch dtype")
        ints = [state[k] for k in ("start_idx", "end_idx", "numel")]
        if not all(type(v) is int and v >= 0 for v in ints):
            raise PayloadError(f"{name}: start_idx, end_idx and numel must be non-negative ints")
        self.__dict__.update(state, shape=torch.Size(shape))


# ---- sender ---------------------------------------------------------------------------------------


def _reduce_shared_storage(storage: torch.UntypedStorage) -> tuple[Any, tuple[Any, ...]]:
    """A host storage as a shared-memory handle by file name, whatever the process's sharing strategy.
    One reference is taken for the receiver (torch's own reducer does the same; the receiver's
    rebuild gives it back once it has mapped the memory)."""
    if storage.device.type != "cpu":
        raise ValueError(f"shared-memory handles are for host tensors; got one on {storage.device}")
    manager, handle, size = storage._share_filename_cpu_()
    storage._shared_incref()
    return reductions.rebuild_storage_filename, (type(storage), manager, handle, size)


class _BucketPickler(pickle._Pickler):  # the pure-Python pickler: its save_global can be steered
    """ForkingPickler's reducers, host storages always by file name, and `TensorMetadata` written as
    sglang's `FlattenedTensorMetadata` global (the name sglang's SafeUnpickler admits), so the bytes are
    those of sglang's own serializer whether or not sglang is importable here."""

    def __init__(self, file: io.BytesIO):
        super().__init__(file, protocol=pickle.DEFAULT_PROTOCOL)
        # torch's tensor reducer (not sglang's CUDA patch of it, which fails on host tensors)
        reduce_tensor = getattr(reductions, "_reduce_tensor_original", reductions.reduce_tensor)
        self.dispatch_table = {**copyreg.dispatch_table, **ForkingPickler._extra_reducers,
                               torch.Tensor: reduce_tensor, torch.UntypedStorage: _reduce_shared_storage}

    def save_global(self, obj: Any, name: str | None = None) -> None:
        if obj is not TensorMetadata:
            super().save_global(obj, name)
            return
        module, qualname = SGLANG_METADATA
        if self.proto >= 4:
            self.save(module)
            self.save(qualname)
            self.write(pickle.STACK_GLOBAL)
        else:
            self.write(pickle.GLOBAL + f"{module}\n{qualname}\n".encode())
        self.memoize(obj)


def encode(flat: torch.Tensor, metadata: list[TensorMetadata]) -> str:
    """base64 of a pickle of {"flattened_tensor": flat, "metadata": metadata}: `flat` (a host uint8
    tensor) as a shared-memory handle. One call per receiving TP rank: each takes its own reference."""
    buf = io.BytesIO()
    _BucketPickler(buf).dump({"flattened_tensor": flat, "metadata": metadata})
    return base64.b64encode(buf.getvalue()).decode("ascii")


def shared_refcount(storage: torch.UntypedStorage) -> int | None:
    """The shared-memory object's reference count (libshm keeps it in the object's first 4 bytes);
    None where it cannot be read (not shared by name, no /dev/shm)."""
    try:
        _, handle, _ = storage._share_filename_cpu_()
        with open(SHM_DIR / handle.decode().lstrip("/"), "rb") as f:
            return int.from_bytes(f.read(4), "little", signed=True)
    except (OSError, RuntimeError, UnicodeDecodeError):
        return None


def release_shared(flat: torch.Tensor) -> None:
    """After every receiver answered: drop the references receivers did not give back (a refused or
    failed request never maps the memory), so that freeing `flat` unlinks its /dev/shm object."""
    storage = flat.untyped_storage()
    count = shared_refcount(storage)
    for _ in range(max((count or 1) - 1, 0)):
        storage._shared_decref()


def shm_free_bytes() -> int | None:
    """Free bytes of /dev/shm (docker gives 64 MB unless --shm-size), None where there is none."""
    try:
        stat = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


# ---- receiver -------------------------------------------------------------------------------------


class _Marker:
    """Stands for a class the payload names as an argument (never called, so never allocates)."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


_UNTYPED_STORAGE = _Marker("torch.UntypedStorage")
_TENSOR = _Marker("torch.Tensor")


def _rebuild_storage_filename(cls: Any, manager: Any, handle: Any, size: Any, dtype: Any = None) -> Any:
    if cls is not _UNTYPED_STORAGE or dtype is not None:
        raise PayloadError("a shared-memory handle must be of a torch.UntypedStorage")
    if not isinstance(handle, bytes) or not SHM_NAME.match(handle):
        raise PayloadError("a shared-memory handle must name a torch object (/torch_<pid>_<n>_<n>)")
    if not isinstance(manager, bytes) or not MANAGER_SOCKET.match(manager) or b".." in manager:
        raise PayloadError("a shared-memory handle must name torch's manager socket by an absolute path")
    if type(size) is not int or size <= 0:
        raise PayloadError("a shared-memory handle's size must be a positive int")
    try:  # mapping past the end of the object would crash this process (SIGBUS) on the first read
        available = os.stat(SHM_DIR / handle.decode().lstrip("/")).st_size
    except OSError as exc:
        raise PayloadError(f"shared-memory object {handle.decode()} cannot be opened here ({exc.strerror}): "
                           "the sender must be a process on this machine that keeps it until the reply") from exc
    if available < size:
        raise PayloadError(f"shared-memory object {handle.decode()} holds {available} bytes, the handle claims {size}")
    try:
        return reductions.rebuild_storage_filename(torch.UntypedStorage, manager, handle, size)
    except RuntimeError as exc:
        raise PayloadError(f"cannot map shared-memory object {handle.decode()}: {exc}") from exc


def _rebuild_typed_storage(storage: Any, dtype: Any) -> Any:
    if not isinstance(storage, torch.UntypedStorage) or dtype is not torch.uint8:
        raise PayloadError("the flattened bucket must be a uint8 storage in shared memory")
    return torch.TypedStorage(wrap_storage=storage, dtype=dtype, _internal=True)


def _rebuild_tensor(cls: Any, storage: Any, metadata: Any) -> torch.Tensor:
    if cls is not _TENSOR or not isinstance(storage, torch.TypedStorage):
        raise PayloadError("the flattened bucket must be a plain torch.Tensor over shared memory")
    if not (isinstance(metadata, tuple) and len(metadata) == 4):
        raise PayloadError("malformed tensor handle")
    offset, size, stride, requires_grad = metadata
    if (type(offset) is not int or offset < 0 or not isinstance(size, tuple) or len(size) != 1
            or type(size[0]) is not int or size[0] < 0 or tuple(stride) != (1,) or requires_grad is not False):
        raise PayloadError("the flattened bucket must be one contiguous 1-D uint8 tensor")
    available = storage._untyped_storage.nbytes()
    if offset + size[0] > available:
        raise PayloadError(f"the flattened bucket ({size[0]} bytes at {offset}) overruns its storage ({available})")
    return reductions.rebuild_tensor(torch.Tensor, storage, (offset, torch.Size(size), (1,), False))


_REFUSED_WHY = {
    ("torch.multiprocessing.reductions", "rebuild_storage_fd"):
        "file-descriptor handles (torch's file_descriptor sharing strategy) need the sender's multiprocessing "
        "authkey; send shared memory by file name (file_system)",
    ("multiprocessing.resource_sharer", "DupFd"): "descriptor passing is not accepted; send shared memory by file name",
    ("torch.multiprocessing.reductions", "rebuild_cuda_tensor"):
        "CUDA IPC handles cannot be opened by the CPU engine; send shared memory by file name",
    ("sglang.srt.utils.patch_torch", "_rebuild_cuda_tensor_modified"):
        "CUDA IPC handles cannot be opened by the CPU engine; send shared memory by file name",
}


class RestrictedUnpickler(pickle.Unpickler):
    """Admits exactly the globals a shared-memory flattened bucket needs (see the module docstring)."""

    ALLOWED: dict[tuple[str, str], Any] = {
        ("torch.multiprocessing.reductions", "rebuild_storage_filename"): _rebuild_storage_filename,
        ("torch.multiprocessing.reductions", "rebuild_typed_storage"): _rebuild_typed_storage,
        ("torch.multiprocessing.reductions", "rebuild_tensor"): _rebuild_tensor,
        ("torch.storage", "UntypedStorage"): _UNTYPED_STORAGE,
        ("torch", "UntypedStorage"): _UNTYPED_STORAGE,
        ("torch", "Tensor"): _TENSOR,
        ("torch", "Size"): torch.Size,
        (TensorMetadata.__module__, TensorMetadata.__qualname__): TensorMetadata,
        SGLANG_METADATA: TensorMetadata,
    }

    def find_class(self, module: str, name: str) -> Any:
        found = self.ALLOWED.get((module, name))
        if found is not None:
            return found
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        why = _REFUSED_WHY.get((module, name), "not part of a shared-memory tensor bucket")
        raise PayloadError(f"refused {module}.{name} in the serialized tensors: {why}")

    def persistent_load(self, pid: Any) -> Any:
        raise PayloadError("refused a persistent id in the serialized tensors")


def decode(text: Any, *, max_chars: int = MAX_PAYLOAD_CHARS) -> tuple[torch.Tensor, list[TensorMetadata]]:
    """One TP rank's `serialized_named_tensors` entry -> (flattened uint8 bucket, metadata), checked:
    every tensor lies inside the bucket with its shape's byte count."""
    if not isinstance(text, str):
        raise PayloadError("serialized_named_tensors entries must be base64 strings")
    if len(text) > max_chars:
        raise PayloadError(f"a serialized_named_tensors entry has {len(text)} characters, over the limit of "
                           f"{max_chars}: it should hold handles and metadata, not tensor data")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise PayloadError(f"serialized_named_tensors entry is not base64: {exc}") from exc
    try:
        obj = RestrictedUnpickler(io.BytesIO(raw)).load()
    except PayloadError:
        raise
    except Exception as exc:  # a malformed stream: pickle, struct or torch errors alike
        raise PayloadError(f"cannot read the serialized tensors: {type(exc).__name__}: {exc}") from exc
    if not isinstance(obj, dict) or set(obj) != {"flattened_tensor", "metadata"}:
        raise PayloadError('the serialized tensors must be {"flattened_tensor": ..., "metadata": [...]} '
                           '(load_format "flattened_bucket")')
    flat, metadata = obj["flattened_tensor"], obj["metadata"]
    if not isinstance(flat, torch.Tensor) or not isinstance(metadata, list) or len(metadata) > MAX_TENSORS:
        raise PayloadError("flattened_tensor must be a tensor and metadata a list")
    if not metadata or not all(isinstance(m, TensorMetadata) and hasattr(m, "numel") for m in metadata):
        raise PayloadError("metadata must be a non-empty list of FlattenedTensorMetadata")
    for m in metadata:
        size = m.shape.numel() * m.dtype.itemsize
        if not (m.end_idx - m.start_idx == m.numel == size and m.end_idx <= flat.numel()):
            raise PayloadError(f"{m.name}: bytes [{m.start_idx}, {m.end_idx}) do not hold a {m.dtype} {list(m.shape)} "
                               f"tensor inside the {flat.numel()}-byte bucket")
        if m.start_idx % m.dtype.itemsize:
            raise PayloadError(f"{m.name}: byte offset {m.start_idx} is not aligned to {m.dtype}")
    return flat, metadata


def named_tensors(flat: torch.Tensor, metadata: list[TensorMetadata]) -> list[tuple[str, torch.Tensor]]:
    """The bucket's tensors as views of `flat` (what sglang's FlattenedTensorBucket.reconstruct_tensors gives)."""
    return [(m.name, flat[m.start_idx: m.end_idx].view(m.dtype).reshape(m.shape)) for m in metadata]

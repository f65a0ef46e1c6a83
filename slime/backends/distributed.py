"""Data parallelism for the torch backend: process group, token-balanced shards, reductions, FSDP2.

N train ranks each hold the model (replicated, or sharded with FSDP2 `fully_shard`) and train on
their shard of every step's samples. Each rank's loss uses the *global* aggregation divisor D
(all-reduced counts), so the rank losses sum to the whole-batch loss and

    grad L = sum_r grad L_r        (gradients are summed across ranks, never averaged)

which makes N ranks produce the same update as one rank on the whole batch (up to fp32 summation
order). Replicas all-reduce gradients in buckets; FSDP2 reduce-scatters them with a divide factor of
1 (a sum). gloo on CPU, nccl on GPU; the rendezvous is TCP at an address/port chosen by rank 0.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

GRAD_BUCKET_BYTES = 64 * 1024**2


@dataclass
class DataParallel:
    """This process's place in the data-parallel group (`group=None`: the default process group)."""

    rank: int = 0
    world_size: int = 1
    fsdp: bool = False
    group: Any = None

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device(self) -> torch.device:
        """Where collective buffers live: the current GPU for nccl, the CPU for gloo."""
        if self.enabled and dist.get_backend(self.group) == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def sum(self, values: Sequence[float]) -> list[float]:
        return self._reduce(values, dist.ReduceOp.SUM)

    def max(self, values: Sequence[float]) -> list[float]:
        return self._reduce(values, dist.ReduceOp.MAX)

    def _reduce(self, values: Sequence[float], op: Any) -> list[float]:
        if not self.enabled:
            return [float(v) for v in values]
        buf = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device())
        dist.all_reduce(buf, op=op, group=self.group)
        return buf.tolist()

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order (small Python objects: metrics)."""
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        if not self.enabled:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier(group=self.group)

    def close(self) -> None:
        """Leave the process group together: a barrier, then destroy it.

        Every rank waits for the others so that none tears its transport down while a peer still
        talks to it. (It does not prevent a rare abort later, in interpreter finalization: see
        tests/slime/dp_worker.py.)
        """
        if self.group is None and dist.is_initialized():
            self.barrier()
            dist.destroy_process_group()


def init_data_parallel(
    rank: int,
    world_size: int,
    master_addr: str,
    master_port: int,
    *,
    fsdp: bool = False,
    backend: str | None = None,
    timeout_minutes: float = 10.0,
) -> DataParallel:
    """Join the default process group at tcp://master_addr:master_port (blocks until all ranks join).

    backend: nccl when CUDA is available, else gloo (slime's --distributed-backend names the same).
    A single FSDP rank still forms a group of one (master_port 0 picks a free port).
    """
    if (world_size > 1 or fsdp) and not dist.is_initialized():  # FSDP2 needs a group even alone
        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(0)  # Ray exposes one GPU per train actor as device 0
        dist.init_process_group(
            backend, init_method=f"tcp://{master_addr}:{master_port}", rank=rank, world_size=world_size,
            timeout=timedelta(minutes=timeout_minutes),
        )
    return DataParallel(rank=rank, world_size=world_size, fsdp=fsdp)


def shard_by_tokens(lengths: Sequence[int], world_size: int) -> list[list[int]]:
    """Split sample indices into `world_size` shards with balanced token counts.

    Longest-processing-time greedy: visit samples longest first (ties by index) and give each to the
    shard with the fewest tokens so far (ties: lowest rank). Indices inside a shard stay ascending, so
    a shard keeps the batch's order. Deterministic: every rank computes the same split.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    heap = [(0, r) for r in range(world_size)]
    shards: list[list[int]] = [[] for _ in range(world_size)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        tokens, r = heapq.heappop(heap)
        shards[r].append(i)
        heapq.heappush(heap, (tokens + int(lengths[i]), r))
    return [sorted(s) for s in shards]


def all_reduce_gradients(params: Iterable[torch.nn.Parameter], dp: DataParallel,
                         bucket_bytes: int = GRAD_BUCKET_BYTES) -> None:
    """Sum every parameter's gradient across ranks (a missing gradient counts as zeros).

    Gradients are flattened into buckets of at most `bucket_bytes` (one all-reduce each) and copied back.
    """
    if not dp.enabled:
        return
    params = [p for p in params if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    bucket: list[torch.nn.Parameter] = []
    size = 0
    for p in params:
        n = p.grad.numel() * p.grad.element_size()
        if bucket and (size + n > bucket_bytes or p.grad.dtype != bucket[0].grad.dtype):
            _reduce_bucket(bucket, dp)
            bucket, size = [], 0
        bucket.append(p)
        size += n
    if bucket:
        _reduce_bucket(bucket, dp)


def _reduce_bucket(bucket: list[torch.nn.Parameter], dp: DataParallel) -> None:
    flat = torch.cat([p.grad.reshape(-1) for p in bucket])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=dp.group)
    offset = 0
    for p in bucket:
        n = p.grad.numel()
        p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
        offset += n


def decoder_layers(lm: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a HF causal LM (`model.layers` for Qwen, Llama, Mistral, Gemma...)."""
    layers = getattr(lm.get_decoder(), "layers", None)
    if layers is None:
        raise ValueError(f"{type(lm).__name__}: no decoder `.layers` to shard; FSDP needs the block list")
    return list(layers)


def apply_fsdp(root: torch.nn.Module, layers: Sequence[torch.nn.Module], *, param_dtype: torch.dtype | None = None,
               reshard_after_forward: bool = True) -> torch.nn.Module:
    """FSDP2: `fully_shard` each block, then the root (which keeps embeddings, norm and head).

    Gradients are summed across ranks (divide factor 1, see the module docstring). `param_dtype`
    (e.g. bf16) is the compute dtype; parameters, optimizer state and gradient reduction stay fp32.
    """
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    kwargs: dict[str, Any] = {"reshard_after_forward": reshard_after_forward}
    if param_dtype is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(root, **kwargs)
    for module in root.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # plain SUM: gloo has no PREMUL_SUM
    return root


def total_norm(value: Any) -> float:
    """A grad norm as a float; FSDP2 returns a DTensor that must be reduced first."""
    if hasattr(value, "full_tensor"):
        value = value.full_tensor()
    return float(value)

"""The trainer's GPU paths on a real GPU: the torch backend on CUDA against the same model on the CPU,
FSDP2 over NCCL with bf16 compute, offloading to host memory and back (colocated engines), the
weight-sync bucket shared with another process through CUDA IPC, and the NCCL update group. (The
Megatron backend's own test, test_megatron_backend.py, runs on the GPU where CUDA is.)

Skipped where CUDA is not available (CI, the CPU machine). On a GPU machine:
    python -m pytest tests/slime/test_gpu.py tests/slime/test_megatron_backend.py -v
(megatron-core, in both GPU sets, for the Megatron tests). SGLang's side of the weight sync needs a
running SGLang server and is not covered here.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM, Qwen3ForCausalLM

from awm_grpo.launch.config import detect_gpus, profile_for
from slime.algorithms.losses import PolicyLossConfig
from slime.backends.distributed import DataParallel
from slime.backends.torch_backend import TorchTrainer, TrainerConfig
from slime.models.tiny import build_config
from slime.utils.misc import free_port
from slime.utils.types import Sample
from slime.weight_sync import (
    bucket_named_tensors,
    flatten_bucket,
    hf_named_tensors,
    init_custom_group,
    unflatten_bucket,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

VOCAB = 300
LOSS = PolicyLossConfig(aggregation="sequence_mean")


@pytest.fixture(scope="module")
def nccl_group():
    """One-rank NCCL default group, as a GPU train rank has (FSDP2 and Megatron need one)."""
    torch.cuda.set_device(0)
    if not dist.is_initialized():
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    try:
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
    except ImportError:
        pass
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("gpu") / "model"
    Qwen3ForCausalLM(build_config(VOCAB, eos_id=VOCAB - 1, pad_id=0, tie_word_embeddings=False)).save_pretrained(path)
    return path


def _samples(count: int = 6) -> list[Sample]:
    rng = random.Random(0)
    out = []
    for i in range(count):
        prompt, response = 4 + i, 5 + 2 * i
        tokens = [rng.randrange(1, VOCAB) for _ in range(prompt + response)]
        mask = [1] * (response - 2) + [0, 1]  # an observation token inside the response
        out.append(Sample(index=i, tokens=tokens, response_length=response, loss_mask=mask))
    return out


ADV = [1.0, -0.5, 0.25, -1.0, 0.75, -0.25]


def _assert_log_probs_close(a: list[list[float]], b: list[list[float]], atol: float) -> None:
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(torch.tensor(y), torch.tensor(x), atol=atol, rtol=0)


def test_this_gpu_gets_a_profile():
    gpus = detect_gpus()
    assert gpus, "CUDA is available but nvidia-smi reports no GPU"
    total = torch.cuda.get_device_properties(0).total_memory / 1024**3
    assert gpus[0].memory_gib == pytest.approx(total, rel=0.05)
    expected = "h200" if total >= 120 else "h100" if total >= 70 else "a100-40gb"
    assert profile_for(gpus) == expected


def test_torch_trainer_on_gpu_matches_cpu(model_dir, tmp_path):
    config = TrainerConfig(lr=1e-3, max_samples_per_micro_batch=4)
    cpu = TorchTrainer(str(model_dir), config)
    gpu = TorchTrainer(str(model_dir), config, device="cuda")
    assert next(gpu.model.parameters()).is_cuda
    samples = _samples()
    _assert_log_probs_close(cpu.compute_log_probs(samples, 0.8), gpu.compute_log_probs(samples, 0.8), atol=1e-4)

    m_cpu = cpu.train_step(samples, ADV, LOSS, temperature=0.8)
    m_gpu = gpu.train_step(samples, ADV, LOSS, temperature=0.8)
    for key in ("loss", "grad_norm", "entropy"):
        assert m_gpu[key] == pytest.approx(m_cpu[key], rel=1e-3, abs=1e-6), key
    for (name, p_cpu), (_, p_gpu) in zip(cpu.model.named_parameters(), gpu.model.named_parameters(), strict=True):
        torch.testing.assert_close(p_gpu.detach().cpu(), p_cpu.detach(), atol=1e-5, rtol=0, msg=name)

    gpu.save_checkpoint(tmp_path / "ck", data_state={"next_rollout_id": 1})
    expected = gpu.train_step(samples, ADV, LOSS)
    resumed = TorchTrainer(str(model_dir), config, device="cuda")
    assert resumed.load_checkpoint(tmp_path / "ck")["step"] == 1
    got = resumed.train_step(samples, ADV, LOSS)
    assert got["loss"] == pytest.approx(expected["loss"], rel=1e-5)
    assert got["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-4)


def test_fsdp2_bf16_over_nccl_trains_and_exports(nccl_group, model_dir, tmp_path):
    config = TrainerConfig(lr=1e-3, fsdp_param_dtype="bfloat16")
    fsdp = TorchTrainer(str(model_dir), config, device="cuda", dp=DataParallel(fsdp=True))
    ref = TorchTrainer(str(model_dir), TrainerConfig(lr=1e-3), device="cuda")
    samples = _samples()
    # bf16 compute: log-probs agree with fp32 to bf16 precision, not exactly
    _assert_log_probs_close(ref.compute_log_probs(samples), fsdp.compute_log_probs(samples), atol=0.1)
    first = fsdp.train_step(samples, ADV, LOSS)
    assert torch.isfinite(torch.tensor([first["loss"], first["grad_norm"]])).all()
    out = fsdp.export_hf(tmp_path / "hf")
    exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
    before = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    assert exported.keys() == before.keys()
    assert exported["lm_head.weight"].dtype == torch.float32  # master weights stay fp32
    moved = sum(not torch.equal(exported[k], before[k]) for k in before)
    assert moved >= len(before) // 2  # one Adam step at lr 1e-3 moves (almost) every tensor


def _offload_and_train(trainer: TorchTrainer, twin: TorchTrainer) -> None:
    """Offload must free the GPU; after onload the trainer must train exactly like its twin that stayed."""
    samples = _samples()
    for t in (trainer, twin):
        t.train_step(samples, ADV, LOSS)  # Adam state exists: the optimizer's state moves too
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    twin_bytes = sum(p.numel() * p.element_size() for p in twin.model.parameters()) * 3  # weights + Adam m, v
    trainer.offload()
    assert held - torch.cuda.memory_allocated() >= 0.9 * twin_bytes
    assert all(not p.is_cuda for p in trainer.model.parameters())
    trainer.onload()
    assert all(p.is_cuda for p in trainer.model.parameters())
    got, expected = trainer.train_step(samples, ADV, LOSS), twin.train_step(samples, ADV, LOSS)
    assert got["loss"] == pytest.approx(expected["loss"], rel=1e-6)
    assert got["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-5)
    for (name, a), (_, b) in zip(trainer.model.named_parameters(), twin.model.named_parameters(), strict=True):
        torch.testing.assert_close(a.detach().full_tensor() if hasattr(a, "full_tensor") else a.detach(),
                                   b.detach().full_tensor() if hasattr(b, "full_tensor") else b.detach(),
                                   atol=1e-6, rtol=0, msg=name)


def test_offload_frees_the_gpu_and_onload_trains_on(model_dir):
    config = TrainerConfig(lr=1e-3)
    _offload_and_train(TorchTrainer(str(model_dir), config, device="cuda"),
                       TorchTrainer(str(model_dir), config, device="cuda"))


def test_offload_of_an_fsdp2_trainer(nccl_group, model_dir):
    config = TrainerConfig(lr=1e-3, fsdp_param_dtype="bfloat16")
    _offload_and_train(TorchTrainer(str(model_dir), config, device="cuda", dp=DataParallel(fsdp=True)),
                       TorchTrainer(str(model_dir), config, device="cuda", dp=DataParallel(fsdp=True)))


def test_megatron_trainer_stays_off_the_cpu_where_cuda_is(nccl_group, model_dir):
    """megatron-core moves rotary embeddings to the current CUDA device: a CPU model would fail mid-forward.
    (tests/slime/test_megatron_backend.py runs the Megatron backend itself on the GPU here.)"""
    pytest.importorskip("megatron.core", reason="megatron-core is in the GPU sets only")
    from slime.backends.megatron_backend import MegatronTrainer

    with pytest.raises(ValueError, match="runs on the GPU"):
        MegatronTrainer(str(model_dir), TrainerConfig(), device="cpu")


def _engine_side(queue_in, queue_out) -> None:
    """What an engine does with a colocated bucket: map the trainer's GPU memory, cut it into tensors."""
    flat, metadata = queue_in.get()
    tensors = unflatten_bucket(flat, metadata)
    queue_out.put({name: (t.is_cuda, t.dtype, tuple(t.shape), t.double().sum().item()) for name, t in tensors})
    queue_in.get()  # hold the mapping until the trainer has read the reply


def test_weight_bucket_crosses_processes_through_cuda_ipc():
    torch.manual_seed(1)
    model = Qwen3ForCausalLM(build_config(VOCAB, eos_id=VOCAB - 1, pad_id=0)).cuda().to(torch.bfloat16)
    named = list(hf_named_tensors(model))
    buckets = list(bucket_named_tensors(iter(named), 64 * 1024))
    assert len(buckets) > 1 and sum(len(b) for b in buckets) == len(named)
    bucket = buckets[0]
    flat, metadata = flatten_bucket(bucket)
    assert flat.is_cuda and flat.dtype == torch.uint8

    ctx = mp.get_context("spawn")
    queue_in, queue_out = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_engine_side, args=(queue_in, queue_out))
    child.start()
    try:
        queue_in.put((flat, metadata))  # torch's reductions send a CUDA IPC handle, not the bytes
        seen = queue_out.get(timeout=120)
        queue_in.put("done")
    finally:
        child.join(timeout=60)
    assert child.exitcode == 0
    for name, tensor in bucket:
        is_cuda, dtype, shape, total = seen[name]
        assert is_cuda and dtype == tensor.dtype and shape == tuple(tensor.shape)
        assert total == pytest.approx(tensor.double().sum().item(), rel=1e-6, abs=1e-6), name


def test_nccl_update_group_forms_and_broadcasts(nccl_group):
    """The custom group of `TensorWeightSync.connect` on real NCCL (one rank: engines need other GPUs)."""
    group = init_custom_group("nccl", f"tcp://127.0.0.1:{free_port()}", 1, 0, "slime_gpu_test")
    try:
        tensor = torch.arange(16, dtype=torch.bfloat16, device="cuda")
        dist.broadcast(tensor, group=group, group_src=0)
        dist.barrier(group=group, device_ids=[torch.cuda.current_device()])
        assert tensor.sum().item() == 120
    finally:
        dist.destroy_process_group(group)


"""Weight sync: the disk path end to end with real CPU engines (and a router), and the CPU-checkable
parts of the GPU tensor path (bucketing, names, flattening, payloads, the update group over gloo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from slime.backends.torch_backend import TorchTrainer, TrainerConfig
from slime.engine.base import EngineError, RolloutEngine
from slime.engine.cpu_server import CPUEngine
from slime.engine.router import Router
from slime.models.tiny import build_tiny_model
from slime.utils.types import Sample
from slime.weight_sync import (
    DiskWeightSync,
    TensorWeightSync,
    bucket_named_tensors,
    distributed_update_payload,
    engine_rank_offsets,
    flatten_bucket,
    hf_name,
    hf_named_tensors,
    init_custom_group,
    init_group_payload,
    tensor_update_payload,
    unflatten_bucket,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPT = [5, 17, 99, 240, 31]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("sync") / "tiny", seed=0)


class ProcessEngine(RolloutEngine):
    """`python -m slime.engine.cpu_server` in its own process, as engines run in deployments (Ray actors,
    standalone servers). Two engines loading weights at the same moment in one process get meta tensors
    (transformers' loading is not thread-safe), so the two engines here live in two processes."""

    def __init__(self, model_dir):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "slime.engine.cpu_server", "--model-path", str(model_dir), "--port", "0",
             "--num-threads", "1"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def start(self) -> str:
        line = self.process.stdout.readline()
        assert line.startswith("cpu_server listening on "), line
        self.url = line.split()[-1]
        return self.url

    def shutdown(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def engines(model_dir):
    remote = ProcessEngine(model_dir)  # starts loading in the background while the local one starts
    local = CPUEngine(model_dir, port=0, seed=0)
    local.start()
    try:
        remote.start()
        yield [local, remote]
    finally:
        local.shutdown()
        remote.shutdown()


def engine_logprobs(url: str) -> tuple[list[int], list[float]]:
    """A greedy 8-token continuation of PROMPT and the engine's log-probs of it (T = 1)."""
    reply = httpx.post(f"{url}/generate", json={
        "input_ids": PROMPT, "return_logprob": True,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": True},
    }, timeout=60, trust_env=False).json()
    pairs = reply["meta_info"]["output_token_logprobs"]
    return [tok for _, tok, _ in pairs], [lp for lp, _, _ in pairs]


def perturb(trainer: TorchTrainer, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in trainer.model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)


def test_disk_sync_makes_engines_serve_the_trainers_weights(model_dir, engines, tmp_path):
    trainer = TorchTrainer(str(model_dir), TrainerConfig())
    sync = DiskWeightSync(tmp_path / "weights")
    _, before = engine_logprobs(engines[0].url)

    perturb(trainer, seed=1)
    assert sync.sync(trainer, engines, version=1) == "1"

    for engine in engines:
        assert engine.weight_version() == "1"
        tokens, logprobs = engine_logprobs(engine.url)
        expected = trainer.compute_log_probs([Sample(tokens=PROMPT + tokens, response_length=len(tokens))])[0]
        torch.testing.assert_close(torch.tensor(logprobs), torch.tensor(expected), atol=1e-5, rtol=0)
    assert engine_logprobs(engines[0].url)[1] != before
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["weight_v000001"]

    perturb(trainer, seed=2)
    sync.sync(trainer, engines, version=2)
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["weight_v000002"]  # v1 deleted
    assert not engines[0].batcher._paused  # generation continued


def test_disk_sync_through_a_router_reaches_every_engine(model_dir, engines, tmp_path):
    trainer = TorchTrainer(str(model_dir), TrainerConfig())
    perturb(trainer, seed=3)
    router = Router([e.url for e in engines], health_check_interval_s=60)
    router.start()
    try:
        DiskWeightSync(tmp_path / "w", keep_versions=None).sync(trainer, [router], version=7)

        assert router.weight_version() == "7"
        assert [e.weight_version() for e in engines] == ["7", "7"]
        assert engine_logprobs(router.url) == engine_logprobs(engines[1].url)
    finally:
        router.shutdown()


def test_disk_sync_in_the_serving_dtype_writes_the_bf16_weights_the_engines_then_serve(model_dir, engines, tmp_path):
    """DiskWeightSync(dtype=...) as SGLang engines get it: the export is bf16 with "dtype": "bfloat16" in its
    config.json, and an engine serves exactly the trainer's weights rounded to bf16."""
    trainer = TorchTrainer(str(model_dir), TrainerConfig())
    perturb(trainer, seed=4)
    DiskWeightSync(tmp_path / "w", dtype="bfloat16").sync(trainer, engines[:1], version=8)

    folder = tmp_path / "w" / "weight_v000008"
    assert json.loads((folder / "config.json").read_text())["dtype"] == "bfloat16"
    rounded = TorchTrainer(str(model_dir), TrainerConfig())
    with torch.no_grad():
        for mine, theirs in zip(rounded.model.parameters(), trainer.model.parameters(), strict=True):
            mine.copy_(theirs.to(torch.bfloat16))
    tokens, logprobs = engine_logprobs(engines[0].url)
    expected = rounded.compute_log_probs([Sample(tokens=PROMPT + tokens, response_length=len(tokens))])[0]
    torch.testing.assert_close(torch.tensor(logprobs), torch.tensor(expected), atol=1e-5, rtol=0)


def test_a_refused_update_raises_and_generation_continues(engines, tmp_path):
    class BrokenExport:
        def export_hf(self, out_dir, tokenizer=None):
            os.makedirs(out_dir)  # an empty folder: the engine cannot load it
            return out_dir

    with pytest.raises(EngineError, match=r"update_weights_from_disk answered 400.*Failed to update weights"):
        DiskWeightSync(tmp_path / "w").sync(BrokenExport(), engines[:1], version=9)
    assert not engines[0].batcher._paused
    assert engine_logprobs(engines[0].url)[0]  # still serving


def test_prune_keeps_the_newest_versions_and_removes_stale_temporaries(tmp_path):
    for name in ("weight_v000001", "weight_v000010", "weight_v000002", "weight_v000003.tmp-1", "other"):
        (tmp_path / name).mkdir()

    removed = DiskWeightSync(tmp_path, keep_versions=2).prune()

    assert sorted(p.name for p in removed) == ["weight_v000001", "weight_v000003.tmp-1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "weight_v000002", "weight_v000010"]


# ---- tensor path: the parts that run on CPU ------------------------------------------------------


def test_buckets_are_greedy_and_bounded():
    named = [(f"w{i}", torch.zeros(n, dtype=torch.float32)) for i, n in enumerate([10, 20, 5, 100, 1, 1])]

    buckets = list(bucket_named_tensors(named, bucket_bytes=120))  # 4 bytes per element

    assert [[name for name, _ in b] for b in buckets] == [["w0", "w1"], ["w2"], ["w3"], ["w4", "w5"]]
    with pytest.raises(ValueError):
        list(bucket_named_tensors(named, bucket_bytes=0))


def test_hf_names_drop_wrapper_prefixes_and_tied_head():
    config = Qwen3Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8, tie_word_embeddings=True)
    model = Qwen3ForCausalLM(config)

    names = [name for name, _ in hf_named_tensors(model)]

    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names
    assert set(names) == set(model.state_dict()) - {"lm_head.weight"}
    assert hf_name("_orig_mod.module.model.layers.0._fsdp_wrapped_module.mlp.up_proj.weight") == \
        "model.layers.0.mlp.up_proj.weight"
    assert hf_name("model.norm.weight") == "model.norm.weight"


def test_flattened_bucket_layout_and_round_trip():
    bucket = [("a", torch.arange(6, dtype=torch.float32).reshape(2, 3)), ("b", torch.ones(4, dtype=torch.bfloat16))]

    flat, metadata = flatten_bucket(bucket)

    assert flat.dtype == torch.uint8 and flat.numel() == 6 * 4 + 4 * 2
    assert [(m["name"], m["start_idx"], m["end_idx"], m["numel"]) for m in metadata] == [
        ("a", 0, 24, 24), ("b", 24, 32, 8)]
    for (name, original), (name2, restored) in zip(bucket, unflatten_bucket(flat, metadata), strict=True):
        assert name == name2 and restored.dtype == original.dtype
        torch.testing.assert_close(restored, original)


def test_payloads_match_sglangs_endpoints():
    bucket = [("model.norm.weight", torch.zeros(8, dtype=torch.bfloat16)),
              ("lm_head.weight", torch.zeros(3, 8))]

    assert distributed_update_payload(bucket, "g", 4) == {
        "names": ["model.norm.weight", "lm_head.weight"], "dtypes": ["bfloat16", "float32"],
        "shapes": [[8], [3, 8]], "group_name": "g", "flush_cache": False, "weight_version": "4"}
    assert tensor_update_payload(["rank0", "rank1"], 4) == {
        "serialized_named_tensors": ["rank0", "rank1"], "load_format": "flattened_bucket",
        "flush_cache": False, "weight_version": "4"}
    assert engine_rank_offsets([2, 1, 4]) == ([1, 3, 4], 8)
    assert init_group_payload("10.0.0.1", 29500, 3, 8, "g") == {
        "master_address": "10.0.0.1", "master_port": 29500, "rank_offset": 3, "world_size": 8,
        "group_name": "g", "backend": "nccl"}


def test_tensor_sync_refuses_without_cuda_or_with_a_bad_mode():
    with pytest.raises(ValueError, match="mode"):
        TensorWeightSync(mode="rdma")
    if not torch.cuda.is_available():
        with pytest.raises(EngineError, match="DiskWeightSync"):
            TensorWeightSync()._transfer(object(), [], 1)


def result_line(stdout: str) -> str:
    """The child's `RESULT ...` line: torch 2.9's gloo prints "[Gloo] Rank N is connected to ..." on
    stdout when a group forms (tests/torch_set.sh cu12), so the rest of stdout is not ours to compare."""
    lines = [line.removeprefix("RESULT ") for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, f"expected one RESULT line in the child's stdout, got:\n{stdout}"
    return lines[0]


RECEIVER = """
import sys, torch, torch.distributed as dist
from slime.weight_sync import init_custom_group
group = init_custom_group("gloo", sys.argv[1], 2, 1, "slime_test_update")
tensor = torch.zeros(3)
dist.broadcast(tensor, group=group, group_src=0)
print("RESULT", tensor.tolist(), flush=True)
dist.barrier(group=group)  # both sides are done with the group before either tears it down
dist.destroy_process_group(group)  # exiting with live gloo threads can abort the interpreter
"""


def test_update_group_forms_beside_the_default_group_and_broadcasts():
    import socket

    import torch.distributed as dist

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    init = f"tcp://127.0.0.1:{port}"
    receiver = subprocess.Popen([sys.executable, "-c", RECEIVER, init], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    group = init_custom_group("gloo", init, 2, 0, "slime_test_update")
    try:
        dist.broadcast(torch.tensor([1.0, 2.0, 3.0]), group=group, group_src=0)
        dist.barrier(group=group)
        out, err = receiver.communicate(timeout=60)
        assert receiver.returncode == 0, err
        assert result_line(out) == "[1.0, 2.0, 3.0]"
        assert not dist.is_initialized()  # the default group was never created
    finally:
        dist.destroy_process_group(group)
        if receiver.poll() is None:
            receiver.kill()


GATHERING_RANK = """
import sys
from slime.backends.distributed import init_data_parallel
from slime.backends.torch_backend import TorchTrainer, TrainerConfig
from slime.weight_sync import trainer_hf_tensors
model_dir, rank, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dp = init_data_parallel(rank, 2, "127.0.0.1", port, fsdp=True, timeout_minutes=1)
trainer = TorchTrainer(model_dir, TrainerConfig(), device="cpu", dp=dp)
names = [name for name, _ in trainer_hf_tensors(trainer)]  # each gathered copy is dropped at once
if rank == 0:
    print("RESULT", len(names), len(set(names)), flush=True)
dp.close()
# Exit without interpreter finalization: a rank of a destroyed FSDP group can abort there now and then
# ("terminate called without an active exception"; see tests/slime/dp_worker.py).
import os
os._exit(0)
"""


def test_fsdp_gathers_send_every_weight_once(model_dir):
    """Issue 20: de-duplicating by the address of freshly gathered tensors skipped weights (a freed
    gather's memory is reused by the next one); two real FSDP2 ranks must send every weight once."""
    from transformers import AutoConfig

    from slime.utils.misc import free_port

    config = AutoConfig.from_pretrained(model_dir)
    expected = [k for k in Qwen3ForCausalLM(config).state_dict() if not (config.tie_word_embeddings
                                                                         and k == "lm_head.weight")]
    port = free_port()
    ranks = [subprocess.Popen([sys.executable, "-c", GATHERING_RANK, str(model_dir), str(r), str(port)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = [rank.communicate(timeout=120) for rank in ranks]
    assert all(rank.returncode == 0 for rank in ranks), [err[-2000:] for _, err in outs]
    assert result_line(outs[0][0]).split() == [str(len(expected))] * 2

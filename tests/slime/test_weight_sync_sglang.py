"""The NCCL weight sync against SGLang's own receiving code, on the CPU over gloo (issues 20, 35).

The trainer side is the project's: a real `TorchTrainer` and `TensorWeightSync(backend="gloo")`,
calling engine routes over HTTP. The engine side (tests/slime/sglang_weight_receiver.py, in a
subprocess with a pinned sglang from tests/sglang_real.py) is that sglang's own code from the request
body on, for both pinned versions: its io_struct request structs, its scheduler side (0.5.23: the
weight-update manager with the begin/end session; 0.5.10: the scheduler mixin, no session), its
`init_custom_process_group` rendezvous and its broadcast receive loop. Only the final copy into a GPU
model is recorded instead of done.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch
from sglang_real import GPU_SETS, pinned, sglang_env, sglang_id

from slime.backends.torch_backend import TorchTrainer, TrainerConfig
from slime.engine.base import BEGIN_WEIGHT_UPDATE, EngineClient, EngineError, served_by
from slime.models.tiny import build_tiny_model
from slime.weight_sync import TensorWeightSync, distributed_update_payload, hf_name, update_session

ROOT = Path(__file__).resolve().parents[2]
RECEIVER = Path(__file__).resolve().parent / "sglang_weight_receiver.py"


@pytest.fixture(scope="module", params=GPU_SETS, ids=[sglang_id(s) for s in GPU_SETS])
def receiver(request, tmp_path_factory):
    """A pinned sglang's receiving side in its own process (one at a time); yields (url, file it writes
    after each successful weight-update call, sglang version)."""
    out = tmp_path_factory.mktemp("sglang") / "received.pt"
    proc = subprocess.Popen([sys.executable, str(RECEIVER), str(out)], cwd=ROOT, env=sglang_env(request.param),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    while line.startswith("[Gloo] "):  # torch 2.9 (the cu12 set) announces each gloo group on stdout
        line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        pytest.fail(f"sglang's receiver did not start: {line}{proc.communicate(timeout=30)[1][-4000:]}")
    try:
        yield line.split()[-1], out, pinned("sglang", request.param)
    finally:
        proc.kill()
        proc.communicate(timeout=30)


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    model = build_tiny_model(tmp_path_factory.mktemp("sync") / "tiny", seed=0, tie_word_embeddings=False)
    return TorchTrainer(str(model), TrainerConfig(), device="cpu")


def test_a_bucketed_sync_arrives_in_sglang_intact(receiver, trainer):
    url, out, version = receiver
    session = ["begin", "end"] if served_by(BEGIN_WEIGHT_UPDATE, version) else []  # none in 0.5.10
    sync = TensorWeightSync("nccl", backend="gloo", bucket_bytes=256 * 1024, group_timeout_s=60)
    half = copy.deepcopy(trainer.model).to(torch.bfloat16)  # a second sync on the same group, other dtype
    try:
        assert sync.sync(trainer, [EngineClient(url)], version=7) == "7"
        first = torch.load(out)
        sync.sync(half, [EngineClient(url)], version=8)
        second = torch.load(out)
    finally:
        sync.close()

    expected = {hf_name(k): v for k, v in trainer.model.state_dict().items()}
    assert len(first["versions"]) > 2 and set(first["versions"]) == {"7"}  # one record per bucket
    received = dict(first["loaded"])
    assert len(first["loaded"]) == len(received) == len(expected) == 25  # every tensor, once
    for name, value in expected.items():
        got = received[name]
        assert (got.shape, got.dtype) == (value.shape, torch.float32), name
        assert torch.equal(got, value), name
    assert first["sessions"] == session  # one session around all of the sync's buckets (0.5.23)
    received = dict(second["loaded"][len(first["loaded"]):])
    assert {n: (t.dtype, t.shape) for n, t in received.items()} == {
        n: (torch.bfloat16, v.shape) for n, v in expected.items()}
    assert all(torch.equal(received[n], v.to(torch.bfloat16)) for n, v in expected.items())
    assert second["sessions"] == session * 2 and second["versions"][-1] == "8"


def test_sglang_refuses_an_update_outside_a_session(receiver, trainer):
    """What the sync did before issue 20: announce a bucket without /begin_weight_update. sglang 0.5.23
    answers 400 without receiving, so the trainer's broadcast would then wait for a receiver that never
    comes. (sglang 0.5.10 has no session: its case is test_sglang_0_5_10_loads_without_a_session.)"""
    url, _, version = receiver
    if not served_by(BEGIN_WEIGHT_UPDATE, version):
        pytest.skip(f"sglang {version} has no weight-update session to refuse outside of")
    engine = EngineClient(url)
    sync = TensorWeightSync("nccl", backend="gloo", group_timeout_s=60)
    bucket = [("model.norm.weight", trainer.model.model.norm.weight.detach())]
    try:
        sync.connect([engine])
        with pytest.raises(EngineError, match="400.*must run between begin_weight_update"):
            engine._call("POST", "/update_weights_from_distributed",
                         distributed_update_payload(bucket, sync.group_name, version=1))
        with update_session([engine]):
            with pytest.raises(EngineError, match="400.*already open"):
                engine._call("POST", "/begin_weight_update", {})
    finally:
        sync.close()


def test_sglang_0_5_10_loads_without_a_session(receiver, trainer):
    """sglang 0.5.10 serves no /begin_weight_update (404) and loads an announced bucket at once: the
    sync must not open a session there (issue 35), and it need not."""
    url, out, version = receiver
    if served_by(BEGIN_WEIGHT_UPDATE, version):
        pytest.skip(f"sglang {version} loads only inside a session: see test_sglang_refuses_an_update_outside_a_session")
    engine = EngineClient(url)
    sync = TensorWeightSync("nccl", backend="gloo", group_timeout_s=60)
    bucket = [("model.norm.weight", trainer.model.model.norm.weight.detach())]
    try:
        with pytest.raises(EngineError, match="404"):
            engine._call("POST", "/begin_weight_update", {})
        sync.connect([engine])
        with update_session([engine]):  # opens nothing on 0.5.10
            sync._send_nccl([bucket], [engine], version=5)
    finally:
        sync.close()
    record = torch.load(out)
    assert record["loaded"][-1][0] == "model.norm.weight" and torch.equal(record["loaded"][-1][1], bucket[0][1])
    assert record["versions"][-1] == "5" and record["sessions"] == []


SGLANG_RANK = """
import sys, datetime, torch, torch.distributed as dist
from sglang.srt.utils.common import init_custom_process_group
group = init_custom_process_group(backend="gloo", init_method=sys.argv[1], world_size=2, rank=1,
                                  group_name="slime_weight_update", timeout=datetime.timedelta(seconds=30))
tensor = torch.zeros(3)
dist.broadcast(tensor, src=0, group=group)
print(tensor.tolist(), flush=True)
dist.destroy_process_group(group)
import os
os._exit(0)  # no interpreter finalization with gloo's threads torn down (see tests/slime/dp_worker.py)
"""


@pytest.mark.parametrize("gpu_set", GPU_SETS, ids=[sglang_id(s) for s in GPU_SETS])
def test_the_update_group_meets_sglangs_own_initialiser(gpu_set):
    """Issue 20: sglang keys the rendezvous under PrefixStore(group_name, store); without the same
    prefix on the trainer's side the two ends wait on different keys until they time out."""
    import torch.distributed as dist

    from slime.utils.misc import free_port
    from slime.weight_sync import init_custom_group

    init = f"tcp://127.0.0.1:{free_port('127.0.0.1')}"
    engine = subprocess.Popen([sys.executable, "-c", SGLANG_RANK, init], cwd=ROOT, env=sglang_env(gpu_set),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        group = init_custom_group("gloo", init, 2, 0, "slime_weight_update", timeout_s=30)
        dist.broadcast(torch.tensor([1.0, 2.0, 3.0]), group=group, group_src=0)
        out, err = engine.communicate(timeout=60)
        dist.destroy_process_group(group)
    finally:
        if engine.poll() is None:
            engine.kill()
    assert engine.returncode == 0, err[-3000:]
    assert out.strip().splitlines()[-1] == "[1.0, 2.0, 3.0]"


IPC_BUCKET = """
import torch
from torch.multiprocessing import reductions
from sglang.srt.utils import MultiprocessingSerializer
from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket
from slime.weight_sync import _sglang_serializer, flatten_bucket, tensor_update_payload

bucket = [("model.embed_tokens.weight", torch.arange(12, dtype=torch.float32).reshape(3, 4)),
          ("model.layers.0.self_attn.q_norm.weight", torch.linspace(-1, 1, 5)),
          ("model.norm.weight", torch.linspace(0, 1, 5).to(torch.bfloat16))]
serialize, metadata_cls = _sglang_serializer()  # what TensorWeightSync("ipc") posts, minus the GPU
# _sglang_serializer applied sglang's monkey_patch_torch_reductions, which rewrites the device of CUDA
# IPC handles and fails on a host tensor: torch's own tensor reduction back for this CPU run.
reductions.reduce_tensor = reductions._reduce_tensor_original
reductions.init_reductions()
flat, metadata = flatten_bucket(bucket)
theirs = FlattenedTensorBucket(named_tensors=bucket)  # sglang flattening the same bucket: the same layout
assert [metadata_cls(**m) for m in metadata] == theirs.metadata, (metadata, theirs.metadata)
assert torch.equal(flat, theirs.get_flattened_tensor())
body = tensor_update_payload([serialize({"flattened_tensor": flat, "metadata": [metadata_cls(**m) for m in metadata]})], 3)
got = MultiprocessingSerializer.deserialize(body["serialized_named_tensors"][0])  # the engine's TP rank 0
rebuilt = FlattenedTensorBucket(flattened_tensor=got["flattened_tensor"], metadata=got["metadata"]).reconstruct_tensors()
assert [n for n, _ in rebuilt] == [n for n, _ in bucket], rebuilt
for (_, want), (_, have) in zip(bucket, rebuilt):
    assert have.dtype == want.dtype and torch.equal(have, want), (want, have)
print("rebuilt", len(rebuilt), flush=True)
"""


@pytest.mark.parametrize("gpu_set", GPU_SETS, ids=[sglang_id(s) for s in GPU_SETS])
def test_a_tensor_bucket_is_rebuilt_by_sglangs_own_code(gpu_set):
    """The CUDA-IPC path's payload without the GPU: our flattened bucket, serialised with sglang's own
    serializer (slime.weight_sync._sglang_serializer, whose imports must exist in both versions), is
    read back and rebuilt by sglang's FlattenedTensorBucket, as its model runner does (`flattened_bucket`)."""
    done = subprocess.run([sys.executable, "-c", IPC_BUCKET], cwd=ROOT, env=sglang_env(gpu_set),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "rebuilt 3"


# ---- the tensor transport's host-memory payload (issue 36) ------------------------------------------

SGLANG_RECEIVES = """
import json, sys, torch
from types import SimpleNamespace
from sglang.srt.utils import MultiprocessingSerializer

body = json.loads(sys.stdin.readline())


class Model(torch.nn.Module):  # the GPU model's load step, recorded
    def __init__(self):
        super().__init__()
        self.loaded = []

    def load_weights(self, named):
        self.loaded += [(name, tensor.clone()) for name, tensor in named]


model = Model()
payload = MultiprocessingSerializer.deserialize(body["serialized_named_tensors"][0])  # its SafeUnpickler
try:  # sglang 0.5.21+: the model runner's WeightUpdater
    from sglang.srt.model_executor.model_runner_components import weight_updater as wu
except ImportError:  # sglang 0.5.10: ModelRunner's own methods
    from sglang.srt.model_executor.model_runner import ModelRunner

    class Runner:
        update_weights_from_tensor = ModelRunner.update_weights_from_tensor
        _update_weights_from_flattened_bucket = ModelRunner._update_weights_from_flattened_bucket
        model = model

    ok, message = Runner().update_weights_from_tensor(named_tensors=payload, load_format=body["load_format"])
else:
    wu.get_model = lambda: SimpleNamespace(weight_cache_mode="off")  # the server's args: no weight cache
    updater = wu.WeightUpdater(tp_rank=0, device="cpu", gpu_id=0, model_config=None, custom_weight_loaders={},
                               get_model=lambda: model, update_model_fields=lambda *a, **k: None,
                               recapture_cuda_graph=lambda: None, get_model_runner=lambda: None)
    ok, message = updater.update_weights_from_tensor(named_tensors=payload, load_format=body["load_format"])
torch.save({"ok": ok, "message": message, "loaded": model.loaded, "metadata_class": type(payload["metadata"][0]).__module__},
           sys.argv[1])
print("received", len(model.loaded), flush=True)
"""


class SglangProcessEngine(EngineClient):
    """An engine whose `/update_weights_from_tensor` is sglang's own receiving code, run in a subprocess
    while the sender holds the bucket (the reply returns once sglang has copied it, as a server's does)."""

    def __init__(self, gpu_set: str, out_dir: Path):
        super().__init__("sglang-subprocess://receiver")
        self.gpu_set, self.out_dir, self.bodies, self.records = gpu_set, out_dir, [], []

    def _call(self, method: str, path: str, body: dict | None = None) -> httpx.Response:
        assert (method, path) == ("POST", "/update_weights_from_tensor"), path
        self.bodies.append(body)
        out = self.out_dir / f"received{len(self.bodies)}.pt"
        done = subprocess.run([sys.executable, "-c", SGLANG_RECEIVES, str(out)], input=json.dumps(body) + "\n",
                              cwd=ROOT, env=sglang_env(self.gpu_set), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        self.records.append(torch.load(out))
        return httpx.Response(200, json={"success": True, "message": self.records[-1]["message"]})


def test_our_shared_memory_buckets_are_read_by_sglangs_own_code(sglang, trainer, tmp_path):
    """The body the tensor transport posts builds sglang's UpdateWeightsFromTensorReqInput (the oracle),
    and sglang's own MultiprocessingSerializer.deserialize (its SafeUnpickler, which admits sglang's
    FlattenedTensorMetadata by name: our metadata pickles as it) and its flattened-bucket receiving code
    rebuild every bf16 tensor bit-exact from the shared memory; nothing stays in /dev/shm after."""
    import glob
    import os

    from slime.weight_sync import bucket_named_tensors, trainer_hf_tensors

    own_shm = lambda: set(glob.glob(f"/dev/shm/torch_{os.getpid()}_*"))  # noqa: E731
    before = own_shm()
    engine = SglangProcessEngine(sglang.gpu_set, tmp_path)
    sync = TensorWeightSync("shm", dtype="bfloat16")
    buckets = bucket_named_tensors(trainer_hf_tensors(trainer), 1 << 30, itemsize=2)  # one bucket: one sglang run
    sync._send_handles(buckets, [engine], version=4)
    (body,) = engine.bodies
    assert sglang.check_request("POST", "/update_weights_from_tensor", body) == []  # its route and struct
    assert body["load_format"] == "flattened_bucket" and body["weight_version"] == "4"
    (record,) = engine.records
    assert record["ok"] is True and record["metadata_class"] == "sglang.srt.weight_sync.tensor_bucket"
    expected = list(trainer_hf_tensors(trainer))
    assert [name for name, _ in record["loaded"]] == [name for name, _ in expected]
    for (name, got), (_, want) in zip(record["loaded"], expected, strict=True):
        assert got.dtype == torch.bfloat16 and torch.equal(got, want.to(torch.bfloat16)), name
    assert sync.bytes_sent == 2 * sync.parameters == 2 * sum(t.numel() for _, t in expected)
    assert own_shm() == before


SGLANG_SENDS = """
import json, sys, httpx, torch
import torch.multiprocessing as mp
from sglang.srt.utils import MultiprocessingSerializer
from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket

url, spec = sys.argv[1], json.loads(sys.argv[2])
generator = torch.Generator().manual_seed(0)
named = [(name, torch.randn(shape, generator=generator).to(torch.bfloat16)) for name, shape in spec]
replies = {}
for strategy in ("file_descriptor", "file_system"):  # torch's default on Linux, then shared memory by name
    mp.set_sharing_strategy(strategy)
    bucket = FlattenedTensorBucket(named_tensors=named)
    serialized = MultiprocessingSerializer.serialize(
        {"flattened_tensor": bucket.get_flattened_tensor(), "metadata": bucket.get_metadata()}, output_str=True)
    body = {"serialized_named_tensors": [serialized], "load_format": "flattened_bucket", "flush_cache": True,
            "weight_version": "sglang-" + strategy}
    reply = httpx.post(url + "/update_weights_from_tensor", json=body, timeout=60)
    replies[strategy] = [reply.status_code, reply.json()]
torch.save(named, sys.argv[3])
print(json.dumps(replies), flush=True)
import os
os._exit(0)  # the descriptor handle's resource_sharer thread would keep the interpreter from exiting
"""


@pytest.mark.parametrize("gpu_set", GPU_SETS, ids=[sglang_id(s) for s in GPU_SETS])
def test_the_cpu_engine_loads_a_bucket_sglangs_serializer_made(gpu_set, tmp_path):
    """sglang's own FlattenedTensorBucket and MultiprocessingSerializer, in sglang's process: with
    shared memory by name the CPU engine loads the bucket (cast to its fp32) and reports the version;
    with torch's default descriptor passing it refuses, saying why, and keeps its weights."""
    from slime.engine.cpu_server import CPUEngine

    model = build_tiny_model(tmp_path / "tiny", seed=0)
    engine = CPUEngine(model, port=0)
    engine.start()
    try:
        served = engine.batcher.model.state_dict()
        spec = [(name, list(served[name].shape)) for name in ("model.norm.weight", "model.layers.0.mlp.up_proj.weight")]
        out, log = tmp_path / "sent.pt", tmp_path / "sender.log"
        # Output to a file, not a pipe: the sender's torch_shm_manager inherits it and lives on while the
        # engine (its client) does, so a pipe would not reach EOF.
        with open(log, "w") as f:
            done = subprocess.run([sys.executable, "-c", SGLANG_SENDS, engine.url, json.dumps(spec), str(out)],
                                  cwd=ROOT, env=sglang_env(gpu_set), stdout=f, stderr=subprocess.STDOUT, timeout=120)
        assert done.returncode == 0, log.read_text()[-3000:]
        replies = json.loads(log.read_text().strip().splitlines()[-1])
        status, reply = replies["file_descriptor"]
        assert status == 400 and "file-descriptor handles" in reply["message"], reply
        status, reply = replies["file_system"]
        assert status == 200 and reply["success"] is True, reply
        assert engine.weight_version() == "sglang-file_system"
        served = engine.batcher.model.state_dict()
        for name, tensor in torch.load(out):
            assert torch.equal(served[name], tensor.float()), name
    finally:
        engine.shutdown()

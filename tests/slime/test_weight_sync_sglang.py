"""The NCCL weight sync against SGLang's own receiving code, on the CPU over gloo (issue 20).

The trainer side is the project's: a real `TorchTrainer` and `TensorWeightSync(backend="gloo")`,
calling engine routes over HTTP. The engine side (tests/slime/sglang_weight_receiver.py, in a
subprocess with the pinned sglang from tests/sglang_real.py) is sglang 0.5.23's own code from the
request body on: its io_struct request structs, its scheduler-side weight-update manager (the
begin/end session), its `init_custom_process_group` rendezvous and its broadcast receive loop. Only
the final copy into a GPU model is recorded instead of done.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from sglang_real import sglang_env

from slime.backends.torch_backend import TorchTrainer, TrainerConfig
from slime.engine.base import EngineClient, EngineError
from slime.models.tiny import build_tiny_model
from slime.weight_sync import TensorWeightSync, distributed_update_payload, hf_name, update_session

ROOT = Path(__file__).resolve().parents[2]
RECEIVER = Path(__file__).resolve().parent / "sglang_weight_receiver.py"


@pytest.fixture(scope="module")
def receiver(tmp_path_factory):
    """sglang's receiving side in its own process; yields (url, file it writes at each session end)."""
    out = tmp_path_factory.mktemp("sglang") / "received.pt"
    proc = subprocess.Popen([sys.executable, str(RECEIVER), str(out)], cwd=ROOT, env=sglang_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        pytest.fail(f"sglang's receiver did not start: {line}{proc.communicate(timeout=30)[1][-4000:]}")
    try:
        yield line.split()[-1], out
    finally:
        proc.kill()
        proc.communicate(timeout=30)


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    model = build_tiny_model(tmp_path_factory.mktemp("sync") / "tiny", seed=0, tie_word_embeddings=False)
    return TorchTrainer(str(model), TrainerConfig(), device="cpu")


def test_a_bucketed_sync_arrives_in_sglang_intact(receiver, trainer):
    url, out = receiver
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
    assert first["sessions"] == ["begin", "end"]  # one session around all of the sync's buckets
    received = dict(second["loaded"][len(first["loaded"]):])
    assert {n: (t.dtype, t.shape) for n, t in received.items()} == {
        n: (torch.bfloat16, v.shape) for n, v in expected.items()}
    assert all(torch.equal(received[n], v.to(torch.bfloat16)) for n, v in expected.items())
    assert second["sessions"] == ["begin", "end", "begin", "end"] and second["versions"][-1] == "8"


def test_sglang_refuses_an_update_outside_a_session(receiver, trainer):
    """What the sync did before issue 20: announce a bucket without /begin_weight_update. sglang answers
    400 without receiving, so the trainer's broadcast would then wait for a receiver that never comes."""
    url, _ = receiver
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


def test_the_update_group_meets_sglangs_own_initialiser():
    """Issue 20: sglang keys the rendezvous under PrefixStore(group_name, store); without the same
    prefix on the trainer's side the two ends wait on different keys until they time out."""
    import torch.distributed as dist

    from slime.utils.ports import free_port
    from slime.weight_sync import init_custom_group

    init = f"tcp://127.0.0.1:{free_port('127.0.0.1')}"
    engine = subprocess.Popen([sys.executable, "-c", SGLANG_RANK, init], cwd=ROOT, env=sglang_env(),
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

"""The tensor weight sync on the CPU: the trainer's buckets in /dev/shm, handles by file name posted to
the real CPU engine's `/update_weights_from_tensor` (issue 36). What sglang's own code makes of the same
payloads is in test_weight_sync_sglang.py; here: the engine's side, its trust boundary, the bytes moved,
/dev/shm hygiene, and a training run on the tensor transport."""

from __future__ import annotations

import base64
import glob
import io
import os
import pickle
import re
from multiprocessing.reduction import ForkingPickler

import httpx
import pytest
import torch
from torch.multiprocessing import reductions
from transformers import AutoModelForCausalLM

from slime.engine import tensor_payload
from slime.engine.base import EngineError
from slime.engine.cpu_server import CPUEngine
from slime.models.tiny import build_tiny_model
from slime.weight_sync import TensorWeightSync, flatten_bucket, hf_named_tensors, tensor_update_payload


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tensor_sync") / "tiny", seed=0)


@pytest.fixture
def trainer(model_dir):
    """The engine's model, moved: what a trainer holds after a step."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(i)) * 0.01)
    return model


def _own_shm() -> set[str]:
    """This process's torch shared-memory objects (libshm names them /torch_<pid>_...)."""
    return set(glob.glob(f"/dev/shm/torch_{os.getpid()}_*"))


def _served(engine: CPUEngine) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in engine.batcher.model.state_dict().items()}


def _generate_ok(engine: CPUEngine) -> None:
    reply = httpx.post(f"{engine.url}/generate", json={"input_ids": [1, 2, 3],
                                                       "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
    assert reply.status_code == 200 and len(reply.json()["output_ids"]) == 2


def _post(engine: CPUEngine, entry: str, **extra) -> httpx.Response:
    return httpx.post(f"{engine.url}/update_weights_from_tensor",
                      json={**tensor_update_payload([entry], 3), **extra}, timeout=60)


def test_a_bf16_sync_moves_two_bytes_a_parameter_and_leaves_no_shared_memory(engine, trainer):
    before = _own_shm()
    sync = TensorWeightSync("shm", bucket_bytes=64 * 1024, dtype="bfloat16")
    assert sync.sync(trainer, [engine], version=5) == "5"
    stats = sync.stats()
    expected = dict(hf_named_tensors(trainer))
    parameters = sum(t.numel() for t in expected.values())
    assert stats["transport"] == "shared-memory" and sync.transport == "shared-memory"
    assert stats["parameters"] == parameters and stats["bytes_sent"] == 2 * parameters
    assert stats["bytes_per_parameter"] == 2.0
    assert engine.weight_version() == "5"
    served = _served(engine)
    for name, tensor in expected.items():  # bf16 on the wire, cast to the engine's fp32
        assert served[name].dtype == torch.float32
        assert torch.equal(served[name], tensor.to(torch.bfloat16).float()), name
    assert _own_shm() == before  # every bucket's /dev/shm object unlinked
    _generate_ok(engine)


def test_an_engine_serving_bf16_holds_exactly_what_the_bf16_sync_sent(model_dir, trainer):
    """`--engine-dtype bfloat16`: the CPU engine computes in what SGLang serves, so the sync's bf16 is what it
    holds, bit for bit, and `serving_dtype` (exports, checkpoints, syncs) says bfloat16."""
    from slime.arguments import parse_args, serving_dtype

    args = parse_args(["--hf-checkpoint", str(model_dir), "--prompt-data", "p.jsonl", "--rollout-batch-size", "1", "--num-rollout", "1",
                       "--engine-dtype", "bfloat16"])
    assert serving_dtype(args) == "bfloat16"
    engine = CPUEngine(model_dir, port=0, seed=0, dtype=serving_dtype(args))
    engine.start()
    try:
        sync = TensorWeightSync("shm", dtype=serving_dtype(args))
        sync.sync(trainer, [engine], version=2)
        assert sync.stats()["bytes_per_parameter"] == 2.0
        served = _served(engine)
        for name, tensor in hf_named_tensors(trainer):
            assert served[name].dtype == torch.bfloat16 and torch.equal(served[name], tensor.to(torch.bfloat16)), name
        _generate_ok(engine)
    finally:
        engine.shutdown()
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        CPUEngine(model_dir, dtype="float16")._prepare()


def test_an_fp32_sync_is_bit_exact_and_engine_tp_handles_never_opened_are_released(engine, trainer, monkeypatch):
    """Two handles per bucket for an engine that reads one (a TP mismatch): the second holds a reference
    no receiver gives back. `release_shared` settles it; without it the objects stay in /dev/shm."""
    before = _own_shm()
    sync = TensorWeightSync("shm", bucket_bytes=64 * 1024, engine_tp_sizes=[2])
    sync.sync(trainer, [engine], version=6)
    served = _served(engine)
    assert all(torch.equal(served[n], t) for n, t in hf_named_tensors(trainer))
    assert sync.stats()["bytes_per_parameter"] == 4.0
    assert _own_shm() == before
    monkeypatch.setattr(tensor_payload, "release_shared", lambda flat: None)  # the control: it leaks
    sync.sync(trainer, [engine], version=7)
    leaked = _own_shm() - before
    assert leaked, "the control should leave the unopened handles' objects behind"
    for name in leaked:  # clean up after the control
        os.unlink(name)


def test_buckets_shrink_to_fit_a_small_dev_shm(engine, trainer, monkeypatch, caplog):
    """Docker's 64 MB /dev/shm: buckets are sized to half of what is free, with a warning; a tensor
    that alone does not fit fails the sync, naming the fix."""
    monkeypatch.setattr(tensor_payload, "shm_free_bytes", lambda: 3_000_000)
    sync = TensorWeightSync("shm", bucket_bytes=512 * 1024**2)
    with caplog.at_level("WARNING"):
        sync.sync(trainer, [engine], version=8)
    assert "buckets of 1 MB instead of 512 MB" in caplog.text and engine.weight_version() == "8"
    monkeypatch.setattr(tensor_payload, "shm_free_bytes", lambda: 1000)
    with pytest.raises(EngineError, match=r"needs \d+ bytes of /dev/shm .* --shm-size"):
        TensorWeightSync("shm").sync(trainer, [engine], version=9)
    assert engine.weight_version() == "8"


def _pickled(obj) -> str:
    return base64.b64encode(pickle.dumps(obj)).decode()


class _Call:
    """Pickles as a call of `fn(*args)` (how a hostile payload runs code)."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def test_the_engine_refuses_what_is_not_a_shared_memory_bucket(engine, tmp_path):
    before = _served(engine)
    version = engine.weight_version()
    marker = tmp_path / "pwned"
    fd_handle = io.BytesIO()  # torch's default strategy on Linux: the storage's descriptor, passed on request
    assert torch.multiprocessing.get_sharing_strategy() == "file_descriptor"
    ForkingPickler(fd_handle).dump({"flattened_tensor": torch.zeros(8, dtype=torch.uint8), "metadata": []})
    cases = {
        "code": (_pickled(_Call(os.system, f"touch {marker}")), "refused posix.system"),
        "fd": (base64.b64encode(fd_handle.getvalue()).decode(), "file-descriptor handles .* authkey"),
        "cuda": (_pickled(_Call(reductions.rebuild_cuda_tensor, 0)), "CUDA IPC handles cannot be opened"),
        "path": (_pickled(_Call(reductions.rebuild_storage_filename, torch.UntypedStorage, b"/tmp/m.sock",
                                b"/../../etc/passwd", 8)), "must name a torch object"),
        "size": ("A" * (tensor_payload.MAX_PAYLOAD_CHARS + 4), "over the limit"),
        "not base64": ("not base64!", "not base64"),
    }
    for case, (entry, message) in cases.items():
        reply = _post(engine, entry)
        assert reply.status_code == 400, case
        assert reply.json()["success"] is False and re.search(message, reply.json()["message"]), (
            case, reply.json())
    assert _post(engine, "", load_format=None).json()["message"].endswith(
        "send load_format 'flattened_bucket'")
    assert "unknown fields ['evil']" in _post(engine, "", evil=1).json()["message"]
    assert not marker.exists()
    assert engine.weight_version() == version and all(torch.equal(v, before[k]) for k, v in _served(engine).items())
    _generate_ok(engine)  # still serving


def test_a_bucket_that_does_not_fit_the_model_changes_nothing(engine):
    before, version = _served(engine), engine.weight_version()
    served = engine.batcher.model.state_dict()
    for bucket, message in (
        ([("model.norm.weight", torch.ones_like(served["model.norm.weight"])), ("model.nope", torch.ones(2))],
         r"not parameters of the served model, e.g. \['model.nope'\]; nothing of this bucket was loaded"),
        ([("model.norm.weight", torch.ones(3))], "shape mismatch"),
    ):
        flat, metadata = flatten_bucket(bucket)
        entry = tensor_payload.encode(flat, [tensor_payload.TensorMetadata(**m) for m in metadata])
        reply = _post(engine, entry)
        tensor_payload.release_shared(flat)
        assert reply.status_code == 400 and re.search(message, reply.json()["message"]), reply.json()
        assert f"the engine serves weight version {version}" in reply.json()["message"]
    assert engine.weight_version() == version and all(torch.equal(v, before[k]) for k, v in _served(engine).items())


def test_a_failed_sync_leaves_the_engines_paused_for_the_fallback(engine, trainer):
    """keep_paused_on_error (what the train actor uses): no generation on half-sent weights until the
    caller's disk fallback continues the engine."""
    trainer.model.layers[0].self_attn.q_proj.weight = torch.nn.Parameter(torch.zeros(3, 3))  # wrong shape
    sync = TensorWeightSync("shm", bucket_bytes=4096, keep_paused_on_error=True)
    with pytest.raises(EngineError, match="shape mismatch"):
        sync.sync(trainer, [engine], version=11)
    assert sync.iterated and engine.batcher._paused
    engine.continue_generation()
    _generate_ok(engine)


@pytest.mark.parametrize("extra", [(), ("--offload",)], ids=["plain", "offload"])
def test_a_training_run_on_the_tensor_transport_keeps_the_engines_on_the_trainers_weights(tmp_path, extra):
    """`python -m slime.train --update-weight-transport tensor`: the real train actor and CPU engine.
    After each shared-memory sync the rollouts' log-probs equal the trainer's (the parity gate), every
    sample was generated by the version the loop expects (staleness 0: the engine reports v = step),
    and no sync fell back to disk. With --offload the engine releases its weights every step and the
    tensors refill a model whose buffers (RoPE's inv_freq, never sent) were kept across the release."""
    from test_train_loop import TOY, _assert_logprob_gate, _command, _env, _run, _train_records  # noqa: I001
    import json

    from make_data import rows

    toy = tmp_path / "toy"
    build_tiny_model(toy / "model")
    (toy / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(16, 0)))
    assert TOY.is_dir()
    out = _run(_command(toy, tmp_path, "--update-weight-transport", "tensor", "--rollout-temperature", "0.8",
                        *extra), _env()).stdout
    records = _train_records(tmp_path)
    assert sorted(records) == [0, 1, 2]
    for step in range(3):
        _assert_logprob_gate(records[step])
        assert records[step]["rollout/weight_staleness"] == 0.0
    for version in range(3):
        assert re.search(rf"weight sync v{version}: shared-memory, \d+ bytes for \d+ parameters "
                         r"\(4\.00 bytes/parameter\)", out), out[-3000:]
    assert "FALLBACK" not in out
    assert not list(tmp_path.rglob("weight_v*")), "no weights went through disk"


def test_engines_on_another_node_are_told_apart_from_local_ones():
    from slime.backends.train_worker import same_node

    assert same_node("http://127.0.0.1:30000", "10.0.0.5") and same_node("http://localhost:1", "10.0.0.5")
    assert same_node("http://[::1]:1", "10.0.0.5") and same_node("http://10.0.0.5:30000", "10.0.0.5")
    assert not same_node("http://10.0.0.6:30000", "10.0.0.5")


def test_a_failed_tensor_sync_loads_every_engine_from_disk_before_it_generates(model_dir, tmp_path):
    """The real pool, a real CPU engine actor and a real train worker whose /dev/shm is too small for a
    tensor: the sync fails, its engine stays paused, the pool exports the weights, loads them from disk,
    then lets the engine generate again -- serving the new version, never half of it."""
    import argparse
    import asyncio
    from types import SimpleNamespace

    import ray

    from slime.arguments import parse_args
    from slime.backends.train_worker import TrainWorker
    from slime.engine.base import EngineClient
    from slime.engine.pool import EnginePool

    @ray.remote(num_cpus=0)
    class StarvedTrainer(TrainWorker):
        """A train rank on a machine whose /dev/shm holds 1 kB."""

        def update_weights_tensor(self, urls, tp_sizes, version, bucket_bytes):  # TrainActor adds the node IP
            tensor_payload.shm_free_bytes = lambda: 1000
            return super().update_weights_tensor(urls, tp_sizes, version, bucket_bytes, "10.9.9.9")

    args = parse_args(["--hf-checkpoint", str(model_dir), "--prompt-data", "p", "--rollout-batch-size", "1", "--num-rollout", "1",
                       "--num-rollout", "1", "--update-weight-transport", "tensor"])
    assert isinstance(args, argparse.Namespace)
    placement = SimpleNamespace(engine_bundles=[0], use_gpu=False, options=lambda bundle, kind: {"num_cpus": 0})
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        async def run() -> tuple[str, dict]:
            pool = EnginePool(args, placement)
            await pool.start()
            try:
                trainer = StarvedTrainer.remote(args)
                path = await pool.sync_weights(trainer, 1, str(tmp_path / "weights" / "weight_v000001"))
                engine = EngineClient(args.rollout_engine_urls[0])
                version = await asyncio.to_thread(engine.weight_version)
                reply = await asyncio.to_thread(engine.generate, {"input_ids": [1, 2], "sampling_params": {
                    "max_new_tokens": 1, "temperature": 0}})
                assert reply["meta_info"]["weight_version"] == "1"
                return path, {**pool.last_sync, "served": version, "pool_version": pool.weight_version}
            finally:
                await pool.shutdown()

        path, last = asyncio.run(asyncio.wait_for(run(), timeout=120))
    finally:
        ray.shutdown()
    assert path == str(tmp_path / "weights" / "weight_v000001") and (tmp_path / "weights" / "weight_v000001").is_dir()
    assert last["fallback"] == "disk" and re.search(r"needs \d+ bytes of /dev/shm", last["error"])
    assert last["served"] == last["pool_version"] == "1" and last["transport"] == "shared-memory"


def test_an_engine_restarted_under_the_tensor_transport_gets_the_current_weights(tmp_path):
    """The engine is killed during step 1's rollout: the pool restarts it from an export of the trainer's
    current weights (the tensor transport keeps them only in the trainer), and the next tensor syncs
    reach the new engine: its log-probs match the trainer's."""
    from test_train_loop import CRASH_PLUGIN, _assert_logprob_gate, _command, _env, _run, _train_records  # noqa: I001
    import json

    from make_data import rows

    toy = tmp_path / "toy"
    build_tiny_model(toy / "model")
    (toy / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(16, 0)))
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "crash_plugin.py").write_text(CRASH_PLUGIN)
    config = tmp_path / "config.yaml"
    config.write_text(f"crash_marker: {tmp_path / 'killed_pid'}\n")
    out = _run(_command(toy, tmp_path, "--update-weight-transport", "tensor", "--custom-generate-function-path",
                        "crash_plugin.generate", "--custom-config-path", str(config),
                        "--rollout-health-check-interval", "1"), _env(plugins)).stdout
    assert (tmp_path / "killed_pid").is_file() and "restarting it with weights 1" in out
    records = _train_records(tmp_path)
    assert [records[s]["rollout/engine_restarts"] for s in range(3)] == [0.0, 1.0, 0.0]
    _assert_logprob_gate(records[1])
    _assert_logprob_gate(records[2])
    assert re.search(r"weight sync v2: shared-memory", out) and "FALLBACK" not in out

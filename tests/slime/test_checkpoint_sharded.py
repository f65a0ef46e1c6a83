"""Checkpoints of format 2: model/ in the serving dtype, trainer/ sharded by rank (DCP), the newest K kept.

Exact resume is checked by training on after a resume and comparing with a run that never stopped:
with a bf16 model/ the fp32 master weights come back from trainer/, so nothing is rounded. World sizes
move both ways (one rank <-> two FSDP2 ranks, two replicas -> one) through real gloo processes
(tests/slime/dp_worker.py). Format-1 checkpoints (full fp32 model/ + optimizer.pt) still load.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from test_data_parallel import _assert_same_run, _finish, _launch, assert_checkpoints_move
from test_torch_backend import assert_same_params, mixed_samples, params, tiny_model

from slime.arguments import parse_args
from slime.backends import checkpoint as ckpt
from slime.backends.torch_backend import TorchTrainer, TrainerConfig
from slime.backends.train_worker import TrainWorker

ADV = [1.0, -1.0, 0.5, -0.5]


def _dtypes(model_dir: Path) -> set[torch.dtype]:
    out = set()
    for file in model_dir.glob("*.safetensors"):
        with safe_open(str(file), "pt") as f:
            out |= {f.get_tensor(k).dtype for k in f.keys()}  # noqa: SIM118 - safe_open is no mapping
    return out


def _config_dtype(model_dir: Path) -> str:
    return json.loads((model_dir / "config.json").read_text())["dtype"]


# ---- one process ---------------------------------------------------------------------------------


def test_bf16_model_folder_and_exact_resume_from_the_fp32_master(tmp_path):
    config = TrainerConfig(lr=1e-2, lr_warmup_steps=3)
    trainer = TorchTrainer(tiny_model(seed=0), config)
    trainer.train_step(mixed_samples(), ADV)
    saved_optim = copy.deepcopy(trainer.optimizer.state_dict())
    path = Path(trainer.save_checkpoint(tmp_path, data_state={"at": 1}, dtype="bfloat16"))
    draw = torch.rand(3)
    expected = trainer.train_step(mixed_samples(), ADV)

    assert _dtypes(path / "model") == {torch.bfloat16} and _config_dtype(path / "model") == "bfloat16"
    state = json.loads((path / ckpt.STATE_FILE).read_text())
    assert (state["format"], state["model_dtype"], state["master_weights"]) == (2, "bfloat16", "trainer")
    assert sorted(p.name for p in path.iterdir()) == ["model", "rng.pt", "scheduler.pt", "trainer",
                                                      "trainer_state.json"]
    sizes = trainer.checkpoint_sizes("bfloat16")
    assert sizes["master"] == 2 * sizes["model"] and sizes["optimizer"] == 2 * sizes["master"]

    resumed = TorchTrainer(tiny_model(seed=99), config)
    info = resumed.load_checkpoint(tmp_path)
    assert (info["step"], info["data_state"]) == (1, {"at": 1})
    for key, value in saved_optim["state"].items():
        for name, tensor in value.items():
            torch.testing.assert_close(resumed.optimizer.state_dict()["state"][key][name], tensor, atol=0, rtol=0)
    assert torch.equal(torch.rand(3), draw)
    got = resumed.train_step(mixed_samples(), ADV)
    for key in ("loss", "grad_norm", "lr", "pg_loss"):
        assert got[key] == expected[key], key
    assert_same_params(params(resumed.model), params(trainer.model))


def test_an_fp32_model_folder_is_the_master_and_is_not_written_twice(tmp_path):
    """The CPU path (serving dtype = the trainer's fp32): trainer/ holds the optimizer state only, so one
    save is as big as before (model + two moments), and resume is exact from model/."""
    trainer = TorchTrainer(tiny_model(), TrainerConfig(lr=1e-2))
    trainer.train_step(mixed_samples(), ADV)
    path = Path(trainer.save_checkpoint(tmp_path, dtype="float32"))
    state = json.loads((path / ckpt.STATE_FILE).read_text())
    assert state["master_weights"] == "model" and _dtypes(path / "model") == {torch.float32}
    sizes = trainer.checkpoint_sizes()
    assert sizes["master"] == 0
    on_disk = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    assert sum(sizes.values()) <= on_disk < 1.1 * sum(sizes.values()) + 100_000  # framing, config, small files
    resumed = TorchTrainer(tiny_model(seed=3), TrainerConfig(lr=1e-2))
    resumed.load_checkpoint(tmp_path)
    assert_same_params(params(resumed.model), params(trainer.model))


def test_train_worker_writes_exports_and_checkpoints_in_the_serving_dtype(tmp_path):
    """What the run's engines load: bf16 for SGLang engines (config.json says so), fp32 for the CPU engine."""
    from slime.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "hf", seed=0)
    base = ["--hf-checkpoint", str(model), "--prompt-data", "p", "--rollout-batch-size", "1", "--num-rollout", "1",
            "--keep-checkpoints", "1"]
    for engine, dtype in (("cpu", torch.float32), ("sglang", torch.bfloat16)):
        worker = TrainWorker(parse_args([*base, "--engine-type", engine]))
        out = Path(worker.export(str(tmp_path / engine / "export")))
        saved = Path(worker.save(str(tmp_path / engine / "ckpt"), 0, {}))
        for folder in (out, saved / "model"):
            assert _dtypes(folder) == {dtype} and _config_dtype(folder) == str(dtype).removeprefix("torch.")
            assert (folder / "tokenizer.json").is_file()
        worker.save(str(tmp_path / engine / "ckpt"), 1, {})
        assert not saved.exists()  # --keep-checkpoints 1: iteration 0 went once iteration 1 was in place
        worker.close()


@pytest.mark.parametrize("keyed", ["by_name", "by_index"])
def test_format_1_checkpoints_still_load(tmp_path, keyed):
    """Format 1 as written before: model/ (fp32, save_pretrained), optimizer.pt holding the optimizer
    (by parameter name, or torch's index-keyed state dict) and the scheduler, rng.pt, state format 1."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    trainer = TorchTrainer(tiny_model(seed=0), TrainerConfig(lr=1e-2, lr_warmup_steps=3))
    trainer.train_step(mixed_samples(), ADV)
    it = tmp_path / "iter_0000001"
    trainer.model.save_pretrained(it / "model")
    optimizer = (get_optimizer_state_dict(trainer.runner, trainer.optimizer,
                                          options=StateDictOptions(full_state_dict=True, cpu_offload=True))
                 if keyed == "by_name" else trainer.optimizer.state_dict())
    torch.save({"scheduler": trainer.scheduler.state_dict(), "optimizer": optimizer,
                **({"optimizer_format": "by_name"} if keyed == "by_name" else {})}, it / "optimizer.pt")
    torch.save({"cpu": torch.get_rng_state()}, it / "rng.pt")
    version, internal, gauss = random.getstate()
    (it / ckpt.STATE_FILE).write_text(json.dumps({"format": 1, "iteration": 1, "python_rng": [version, list(internal),
                                                  gauss], "state": {"step": 1, "data_state": {"n": 1}}}))
    (tmp_path / ckpt.LATEST_FILE).write_text("1\n")
    expected = trainer.train_step(mixed_samples(), ADV)

    resumed = TorchTrainer(tiny_model(seed=5), TrainerConfig(lr=1e-2, lr_warmup_steps=3))
    assert resumed.load_checkpoint(tmp_path)["data_state"] == {"n": 1}
    got = resumed.train_step(mixed_samples(), ADV)
    assert (got["loss"], got["lr"]) == (expected["loss"], expected["lr"])
    assert_same_params(params(resumed.model), params(trainer.model))


def test_keep_k_deletes_the_oldest_only_after_the_new_one_is_committed(tmp_path, monkeypatch):
    trainer = TorchTrainer(tiny_model(), TrainerConfig(lr=1e-2))
    (tmp_path / "critic").mkdir()
    (tmp_path / "rollout").mkdir()
    for iteration in range(1, 5):
        (tmp_path / "critic" / f"iter_{iteration:07d}.pt").write_bytes(b"c")
        (tmp_path / "rollout" / f"global_dataset_state_dict_{iteration}.pt").write_bytes(b"r")
        trainer.save_checkpoint(tmp_path, iteration=iteration, keep=2)
    assert sorted(p.name for p in tmp_path.glob("iter_*")) == ["iter_0000003", "iter_0000004"]
    assert sorted(p.name for p in (tmp_path / "critic").iterdir()) == ["iter_0000003.pt", "iter_0000004.pt"]
    assert sorted(p.name for p in (tmp_path / "rollout").iterdir()) == [
        "global_dataset_state_dict_3.pt", "global_dataset_state_dict_4.pt"]

    def killed(tmp, final):
        raise KeyboardInterrupt("killed before the rename")

    monkeypatch.setattr(ckpt, "_commit", killed)
    with pytest.raises(KeyboardInterrupt):
        trainer.save_checkpoint(tmp_path, iteration=5, keep=2)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.glob("iter_???????")) == ["iter_0000003", "iter_0000004"]

    trainer.save_checkpoint(tmp_path, iteration=9, keep=1)  # a later iteration of another timeline...
    trainer.save_checkpoint(tmp_path, iteration=6, keep=1)  # ...is not this run's to delete
    assert sorted(p.name for p in tmp_path.glob("iter_*")) == ["iter_0000006", "iter_0000009"]
    assert TorchTrainer(tiny_model(), TrainerConfig(lr=1e-2)).load_checkpoint(tmp_path)["iteration"] == 6


# ---- several ranks (gloo) --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bf16_runs(tmp_path_factory):
    """The model, and one rank (in this process) trained on the batches, saving a bf16-serving checkpoint."""
    import dp_worker

    root = tmp_path_factory.mktemp("bf16")
    tiny_model().save_pretrained(root / "model")
    dp_worker.run(str(root / "model"), str(root / "one.pt"), 0, 1, 0, "torch", save=str(root / "ck_one"),
                  serving_dtype="bfloat16")
    return root


def _shards(checkpoint: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in (checkpoint / "iter_0000001" / ckpt.TRAINER_DIR).glob("*.distcp")}


def test_two_replica_ranks_share_the_writing_and_one_rank_resumes(bf16_runs):
    """Replicated tensors are written once each, spread over both ranks' files; one rank resumes exactly."""
    runs = bf16_runs
    _finish(_launch(runs / "model", runs / "rep.pt", 2, "torch", "--save", str(runs / "ck_rep"),
                    "--serving-dtype", "bfloat16"))
    one = torch.load(runs / "one.pt")
    _assert_same_run(one, torch.load(runs / "rep.pt"))
    shards = _shards(runs / "ck_rep")
    assert sorted(shards) == ["__0_0.distcp", "__1_0.distcp"]
    assert min(shards.values()) > 0.3 * sum(shards.values())  # both ranks wrote a fair part
    _finish(_launch(runs / "model", runs / "one_from_rep.pt", 1, "torch", "--load", str(runs / "ck_rep")))
    _assert_same_run({**one, "metrics": one["metrics"][1:]}, torch.load(runs / "one_from_rep.pt"))


@pytest.mark.slow
def test_bf16_checkpoints_move_between_one_rank_and_two_fsdp_ranks(bf16_runs):
    """Two FSDP2 ranks save (each its shards; model/ in bf16), one rank resumes it; two FSDP2 ranks
    resume the one-rank save: both finish exactly where the uninterrupted one-rank run did."""
    runs = bf16_runs
    _finish(_launch(runs / "model", runs / "fsdp.pt", 2, "fsdp", "--save", str(runs / "ck_fsdp"),
                    "--serving-dtype", "bfloat16"))
    one = torch.load(runs / "one.pt")
    _assert_same_run(one, torch.load(runs / "fsdp.pt"))
    it = runs / "ck_fsdp" / "iter_0000001"
    assert _dtypes(it / "model") == {torch.bfloat16} and _config_dtype(it / "model") == "bfloat16"
    state = json.loads((it / ckpt.STATE_FILE).read_text())
    assert (state["master_weights"], state["world_size"]) == ("trainer", 2)
    shards = _shards(runs / "ck_fsdp")
    assert sorted(shards) == ["__0_0.distcp", "__1_0.distcp"] and min(shards.values()) > 0.3 * sum(shards.values())
    assert_checkpoints_move(runs, one)


# ---- what the engines read -------------------------------------------------------------------------


def test_a_bf16_export_of_the_tiny_qwen3_reads_as_bfloat16_under_sglangs_own_rule(tmp_path, sglang):
    """sglang's own ModelConfig (`--dtype auto`) on the exports of the CPU recipe's tiny Qwen3: the
    serving-dtype export is served in bf16; an fp32 export (what every export was before) in fp16."""
    from slime.models.tiny import build_tiny_model

    trainer = TorchTrainer(str(build_tiny_model(tmp_path / "hf", seed=0)), TrainerConfig(lr=1e-2))
    bf16 = trainer.export_hf(tmp_path / "bf16", dtype="bfloat16")
    fp32 = trainer.export_hf(tmp_path / "fp32")
    assert sglang.serving_dtype(bf16) == "bfloat16"
    assert sglang.serving_dtype(fp32) == "float16"
    weights = ckpt.read_hf_weights(bf16)
    for name, value in trainer.model.state_dict().items():
        if name in weights:  # the tied head is written once, as the embedding
            assert torch.equal(weights[name], value.to(torch.bfloat16)), name
    assert "lm_head.weight" not in weights

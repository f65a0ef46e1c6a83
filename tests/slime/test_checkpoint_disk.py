"""A save that meets a full disk, a folder other ranks cannot see, or a slow disk.

Real failures, not mocks: a file-size cap (RLIMIT_FSIZE, so writes fail with EFBIG as a full disk
fails with ENOSPC) on real train ranks over gloo; a small tmpfs where mounting one is allowed (root);
a second rank in its own mount namespace, as on another node without a shared filesystem. Each time
the temporary folder is gone, the previous checkpoint still loads exactly, and every rank raises the
same sentence naming the folder, what was being written, bytes needed and free, and what to do.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_data_parallel import REPO, tiny_model
from test_torch_backend import mixed_samples
from test_train_loop import TOY, _command, _kill_group
from test_train_loop import _env as _run_env

from slime.arguments import parse_args
from slime.backends import checkpoint as ckpt
from slime.backends import state_dicts
from slime.backends.torch_backend import TorchTrainer, TrainerConfig
from slime.backends.train_worker import collective_timeout_minutes
from slime.utils.misc import free_port

WORKER = Path(__file__).with_name("ckpt_worker.py")


def _env() -> dict[str, str]:
    return dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TRANSFORMERS_VERBOSITY="error",
                CUDA_VISIBLE_DEVICES="", PYTHONPATH=os.pathsep.join([str(REPO), str(Path(__file__).parent),
                                                                     os.environ.get("PYTHONPATH", "")]))


def _ranks(model: Path, save: Path, out: Path, world: int, backend: str, *extra: str,
           wrap: dict[int, list[str]] | None = None) -> list[dict]:
    """Run `world` ckpt_worker ranks (rank r's command prefixed by wrap[r]); their reports."""
    port = str(free_port("127.0.0.1"))
    procs = [subprocess.Popen([*(wrap or {}).get(rank, []), sys.executable, str(WORKER), str(model), str(save),
                               str(out), str(rank), str(world), port, backend, *extra],
                              env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in range(world)]
    for proc in procs:
        output, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, output[-3000:]
    return [json.loads(Path(f"{out}.{rank}.json").read_text()) for rank in range(world)]


def _assert_previous_intact(save: Path, model: Path, saved_weights: dict[str, torch.Tensor]) -> None:
    """Only iteration 1 is there (no temporary folder) and it loads back exactly."""
    assert sorted(p.name for p in save.iterdir() if p.name.startswith("iter_")) == ["iter_0000001"]
    assert (save / ckpt.LATEST_FILE).read_text().strip() == "1"
    resumed = TorchTrainer(str(model), TrainerConfig(lr=1e-2))
    assert resumed.load_checkpoint(save)["iteration"] == 1
    got = state_dicts.full_model_state(resumed.runner)
    for key, value in saved_weights.items():
        torch.testing.assert_close(got[key], value, atol=0, rtol=0, msg=key)


def _assert_says_what_to_do(message: str, save: Path, what: str | None) -> None:
    """`what`: what was being written (None: refused before writing anything)."""
    assert str(save) in message and "iteration 2" in message
    assert (f"failed while writing {what}" if what else "was refused before writing anything") in message
    assert "One save needs" in message and "is free on that filesystem" in message
    assert f"{save / 'iter_0000001'} is intact" in message and f"--load {save}" in message
    assert "KEEP_CHECKPOINTS" in message and "SAVE_DIR" in message


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("model")
    tiny_model().save_pretrained(root)
    return root


@pytest.mark.parametrize(("world", "backend"), [(1, "torch"), (2, "fsdp")])
def test_a_write_past_the_file_size_cap_fails_the_save_and_keeps_the_previous(model_dir, tmp_path, world, backend):
    """EFBIG from the kernel in the middle of the sharded write (every rank writes its shard)."""
    save = tmp_path / "save"
    optimizer_bytes = 2 * 4 * sum(p.numel() for p in tiny_model().parameters())  # AdamW's two fp32 moments
    cap = optimizer_bytes // (4 * world)  # a quarter of one rank's shard of them: model/ is written after them

    reports = _ranks(model_dir, save, tmp_path / "w.pt", world, backend, "--fsize-limit", str(cap))

    for report in reports:
        assert report["1"]["error"] is None
        assert report["2"]["kind"] == "CheckpointSaveError"
        _assert_says_what_to_do(report["2"]["error"], save, "the sharded trainer state")
        # EFBIG as Python's write reports it, or as torch's archive writer does (a position mismatch)
        assert "File too large" in report["2"]["error"] or "a write came up short" in report["2"]["error"]
    assert len({r["2"]["error"].split(": rank")[0] for r in reports}) == 1  # the same sentence on every rank
    _assert_previous_intact(save, model_dir, torch.load(tmp_path / "w.pt"))


def test_a_failure_in_the_model_folder_is_reported_the_same_way(model_dir, tmp_path, monkeypatch):
    """ENOSPC raised where rank 0 writes model/ (injected: the sharded part is written before it)."""
    save = tmp_path / "save"
    trainer = TorchTrainer(str(model_dir), TrainerConfig(lr=1e-2))
    trainer.train_step(mixed_samples(), [1.0, -1.0, 1.0, -1.0])
    trainer.save_checkpoint(save, iteration=1)
    saved = {k: v.clone() for k, v in state_dicts.full_model_state(trainer.runner).items()}
    trainer.train_step(mixed_samples(), [1.0, -1.0, 1.0, -1.0])

    def full_disk(folder, *args, **kwargs):
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"\0" * 100)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder / "model.safetensors"))

    monkeypatch.setattr(ckpt, "write_model_folder", full_disk)
    with pytest.raises(ckpt.CheckpointSaveError) as caught:
        trainer.save_checkpoint(save, iteration=2)
    _assert_says_what_to_do(str(caught.value), save, "the model folder (model/, float32)")
    assert "No space left on device" in str(caught.value)
    monkeypatch.undo()
    _assert_previous_intact(save, model_dir, saved)




def test_a_disk_without_room_for_the_next_save_is_refused_before_writing(model_dir, tmp_path, tmpfs):
    """A real small filesystem (tmpfs): one save fits, the second does not (the first is not pruned
    before the second is complete), so the second is refused up front with the numbers."""
    trainer = TorchTrainer(str(model_dir), TrainerConfig(lr=1e-2))
    trainer.train_step(mixed_samples(), [1.0, -1.0, 1.0, -1.0])
    one_save = sum(trainer.checkpoint_sizes().values())
    disk = tmp_path / "disk"
    tmpfs(disk, (int(one_save * 1.6) // 4096 + 64) * 4096)
    save = disk / "save"
    trainer.save_checkpoint(save, iteration=1, keep=2)
    saved = {k: v.clone() for k, v in state_dicts.full_model_state(trainer.runner).items()}
    trainer.train_step(mixed_samples(), [1.0, -1.0, 1.0, -1.0])
    with pytest.raises(ckpt.CheckpointSaveError) as caught:
        trainer.save_checkpoint(save, iteration=2, keep=2)
    message = str(caught.value)
    assert f"{save} was refused before writing anything: not enough free space for it" in message
    _assert_says_what_to_do(message, save, None)
    _assert_previous_intact(save, model_dir, saved)


def test_a_rank_that_cannot_see_the_save_folder_is_named(model_dir, tmp_path):
    """Rank 1 in its own mount namespace with an empty filesystem over the save folder, as on a second
    node without a shared filesystem: the first save fails on both ranks, naming rank 1."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here")
    shared = tmp_path / "shared"
    shared.mkdir()
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "mount", "-t", "tmpfs", "tmpfs",
                            str(shared)], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a mount namespace here ({probe.stderr.strip()}): needs root")
    other_node = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                  'mount -t tmpfs tmpfs "$0" && exec "$@"', str(shared)]
    save = shared / "save"

    reports = _ranks(model_dir, save, tmp_path / "w.pt", 2, "fsdp", wrap={1: other_node})

    for report in reports:
        message = report["1"]["error"]
        assert report["1"]["kind"] == "CheckpointSaveError" and "rank 1 on " in message
        assert "cannot see" in message and "a filesystem every trainer node mounts" in message
    assert not list(save.glob("iter_*"))  # rank 0 removed its temporary folder


def test_the_collective_timeout_covers_a_whole_save_at_50_mb_per_s(tmp_path):
    """Qwen3-4B (real config values): a save is 56.3 GB in bf16 serving, 1,126 s at 50 MB/s -> 19 min;
    alone, or without --save, nobody waits for a save: the flag's 10 min stay."""
    from transformers import Qwen3Config

    Qwen3Config(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True).save_pretrained(
        tmp_path)
    base = ["--hf-checkpoint", str(tmp_path), "--prompt-data", "p", "--rollout-batch-size", "1", "--num-rollout", "1"]
    args = parse_args([*base, "--save", str(tmp_path / "s"), "--engine-type", "sglang"])
    assert ckpt.parameter_count(tmp_path) == 4_022_468_096
    assert sum(ckpt.save_sizes(4_022_468_096, "bfloat16").values()) == 14 * 4_022_468_096
    assert collective_timeout_minutes(args, 4) == 19
    assert collective_timeout_minutes(args, 1) == 10
    assert collective_timeout_minutes(parse_args(base), 4) == 10




@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> Path:
    """The toy task of tests/slime/test_train_loop.py (the tiny model and its prompt files)."""
    from make_data import rows  # examples/toy_single_turn, on sys.path through test_train_loop

    from slime.models.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("toy")
    build_tiny_model(root / "model")
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(16, 0)))
    assert TOY.is_dir()
    return root


def test_a_training_run_that_fills_its_disk_stops_with_the_sentence_then_resumes(toy, tmp_path, tmpfs):
    """`python -m slime.train` saving every step onto a real filesystem with room for two and a half
    saves: the third save is refused, the run stops (exit != 0) with the sentence, the second save
    loads; once the oldest save is deleted (space freed) the same command resumes and finishes."""
    trainer = TorchTrainer(str(toy / "model"), TrainerConfig())
    tokenizer = sum((toy / "model" / name).stat().st_size for name in ckpt.TOKENIZER_FILES
                    if (toy / "model" / name).is_file())
    one_save = sum(trainer.checkpoint_sizes().values()) + tokenizer
    disk = tmp_path / "disk"
    tmpfs(disk, (int(one_save * 2.5) // 4096 + 32) * 4096)
    save = disk / "ckpt"
    cmd = _command(toy, disk, "--save-interval", "1", "--update-weight-disk-dir", str(tmp_path / "weights"),
                   "--metrics-path", str(tmp_path / "metrics.jsonl"))
    failed = _run_to_end(cmd)
    assert failed.returncode != 0
    assert f"saving checkpoint iteration 2 into {save} was refused before writing anything" in failed.stdout
    assert "KEEP_CHECKPOINTS" in failed.stdout
    assert f"{save / 'iter_0000001'} is intact" in failed.stdout
    assert sorted(p.name for p in save.glob("iter_*")) == ["iter_0000000", "iter_0000001"]
    assert TorchTrainer(str(toy / "model"), TrainerConfig()).load_checkpoint(save)["iteration"] == 1

    shutil.rmtree(save / "iter_0000000")  # the user frees space
    resumed = _run_to_end(cmd)
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    assert "resumed from" in resumed.stdout and (save / ckpt.LATEST_FILE).read_text().strip() == "2"


def _run_to_end(cmd: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(cmd, cwd=REPO, env=_run_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        _kill_group(proc)
    return subprocess.CompletedProcess(cmd, proc.returncode, out)

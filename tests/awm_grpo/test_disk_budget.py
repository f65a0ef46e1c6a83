"""The launcher's disk budget: one save's size from the model's config, the run's peak, free space, and
the refusal below two saves. Through `run_awm_grpo.sh --dry-run` on a simulated 4xH100 machine (a fake
nvidia-smi on PATH) with Qwen3-4B's real config values, as tests/awm_grpo/test_gpu_dry_run.py does."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from awm_grpo.launch.disk import DiskPlan, check
from slime.backends.checkpoint import human_bytes, save_sizes

REPO = Path(__file__).resolve().parents[2]
H100 = "81559 MiB, NVIDIA H100 80GB HBM3"
QWEN3_4B = dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True,
                architectures=["Qwen3ForCausalLM"])
QWEN3_4B_PARAMETERS = 4_022_468_096


def _launch(tmp_path: Path, *argv: str, gpus: int = 4, model: dict | None = None,
            **env: str) -> subprocess.CompletedProcess:
    """run_awm_grpo.sh on `gpus` simulated H100s (0: no nvidia-smi, the CPU profile) with a config-only model."""
    from transformers import Qwen3Config

    bin_dir, folder, data = tmp_path / "bin", tmp_path / "model", tmp_path / "awm1k"
    for path in (bin_dir, data):
        path.mkdir(exist_ok=True)
    Qwen3Config(**(model or QWEN3_4B)).save_pretrained(folder)
    if gpus:
        smi = bin_dir / "nvidia-smi"
        smi.write_text("#!/bin/sh\n" + "".join(f"echo '{H100}'\n" for _ in range(gpus)))
        smi.chmod(0o755)
    full_env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHON": sys.executable,
                "HF_CKPT": str(folder), "AWM_DATA_DIR": str(data), "AWM_SPLITS_DIR": str(tmp_path / "splits"), **env}
    if not gpus:
        full_env["AWM_PROFILE"] = "cpu"
        full_env.pop("AWM_DATA_DIR")
    return subprocess.run(["bash", str(REPO / "awm_grpo/run_awm_grpo.sh"), *argv], env=full_env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=180)


def _disk_lines(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("disk (SAVE_DIR"))
    out = [lines[start]]
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        out.append(line)
    return out


def test_the_h100_plan_prints_its_disk_budget_for_200_steps(tmp_path):
    """4xH100, defaults: 200 steps, a save every 10, the newest 2 kept, bf16 engines. One save is
    4,022,468,096 x (2 + 4 + 8) bytes = 56.3 GB; the checkpoints peak at 3 saves (168.9 GB); two bf16
    exports (16.1 GB); traces at most 51,200 episodes x (8,192 + 2,048) tokens x 8 bytes (4.2 GB)."""
    save = tmp_path / "save"
    done = _launch(tmp_path, "--dry-run", SAVE_DIR=str(save))

    disk = "\n".join(_disk_lines(done.stdout))
    assert "[profile h100]" in done.stdout and "training.num_rollout                  = 200" in done.stdout
    assert f"disk (SAVE_DIR {save}):" in disk
    assert ("one save: 56.3 GB = model/ 8.0 GB (bfloat16) + fp32 master weights 16.1 GB + AdamW moments 32.2 GB "
            "(Qwen3ForCausalLM, 4,022,468,096 parameters)") in disk
    assert ("checkpoints: 20 saves in the run, the newest 2 kept (KEEP_CHECKPOINTS): 168.9 GB at the peak, 3 saves "
            "while the next is written") in disk
    assert "weight exports (disk sync, SAVE_DIR/weights): 16.1 GB at the peak (2 x 8.0 GB)" in disk
    assert "traces: at most 4.2 GB (51,200 episodes" in disk
    assert "the run's peak: 189.2 GB (keeping every save it would be 1.1 TB)" in disk
    assert done.returncode == 0, done.stderr[-2000:]  # a dry run plans: it never refuses for the disk
    command = shlex.split(done.stdout.splitlines()[done.stdout.splitlines().index("command:") + 1])
    assert command[command.index("--keep-checkpoints") + 1] == "2"
    if shutil.disk_usage(tmp_path).free < 2 * 14 * QWEN3_4B_PARAMETERS:  # a small disk: it says a run would stop
        assert "a real run here would stop" in done.stderr and "less than two saves (112.6 GB" in done.stderr


def test_keep_checkpoints_0_keeps_every_save_and_the_budget_says_so(tmp_path):
    done = _launch(tmp_path, "--dry-run", SAVE_DIR=str(tmp_path / "save"), KEEP_CHECKPOINTS="0",
                   NUM_ROLLOUT="30")
    disk = "\n".join(_disk_lines(done.stdout))
    assert "checkpoints: 3 saves in the run, all kept (KEEP_CHECKPOINTS=0): 168.9 GB" in disk


def test_the_cpu_profile_writes_fp32_saves_without_a_second_copy_and_notes_the_repository(tmp_path):
    """CPU engine: model/ is fp32, the trainer's own dtype, so no master copy; the default SAVE_DIR
    (runs/awm_grpo/cpu) is inside the repository and git-ignored, which the budget says."""
    tiny = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, vocab_size=512, tie_word_embeddings=True,
                architectures=["Qwen3ForCausalLM"])
    done = _launch(tmp_path, "--dry-run", gpus=0, model=tiny)
    assert done.returncode == 0, done.stderr[-2000:]
    disk = "\n".join(_disk_lines(done.stdout))
    from transformers import Qwen3Config, Qwen3ForCausalLM

    count = sum(p.numel() for p in Qwen3ForCausalLM(Qwen3Config(**tiny)).parameters())  # the tied head once
    one = sum(save_sizes(count, "float32").values())
    assert f", {count:,} parameters)" in disk and "(float32) + AdamW moments" in disk and "master" not in disk
    assert f"disk (SAVE_DIR {REPO / 'runs/awm_grpo/cpu'}):" in disk and one == 12 * count
    assert f"note: SAVE_DIR is inside the repository ({REPO}); git ignores it" in disk




@pytest.mark.parametrize("dry_run", [True, False])
def test_a_disk_below_two_saves_is_refused_before_anything_starts(tmp_path, dry_run, tmpfs):
    """A real 1 GB filesystem as SAVE_DIR: the h100 plan (56.3 GB a save) is refused with exit 2 and a
    sentence saying what to do by a real launch (which starts nothing); the dry run, which plans a run
    that may go to another machine, prints everything and says the same sentence as a warning."""
    disk = tmp_path / "disk"
    tmpfs(disk, "1g")
    done = _launch(tmp_path, *(["--dry-run"] if dry_run else []), SAVE_DIR=str(disk / "save"))
    assert done.returncode == (0 if dry_run else 2), done.stdout[-2000:] + done.stderr[-2000:]
    assert ("a real run here would stop" in done.stderr) is dry_run and ("engine 0:" in done.stdout) is dry_run
    assert f"SAVE_DIR {disk / 'save'}: 1.1 GB free on its filesystem ({disk}), less than two saves (112.6 GB" \
        in done.stderr
    assert "point SAVE_DIR at a larger disk" in done.stderr and "KEEP_CHECKPOINTS" in done.stderr
    assert not (disk / "save").exists()  # nothing was started or written


def _plan(free: int, existing: int = 0, keep: int = 2) -> DiskPlan:
    return DiskPlan(save_dir=Path("/data/run"), parameters=QWEN3_4B_PARAMETERS, serving_dtype="bfloat16",
                    save=save_sizes(QWEN3_4B_PARAMETERS, "bfloat16"), saves=20, keep=keep, exports=2 * 8_044_936_192,
                    traces=4_194_304_000, existing=existing, free=free, total=2 * 10**12, where=Path("/data"))


def test_the_refusal_and_the_warning_thresholds():
    one = 14 * QWEN3_4B_PARAMETERS
    refusal, warning = check(_plan(free=2 * one - 1))
    assert refusal is not None and "less than two saves" in refusal and warning is None
    refusal, warning = check(_plan(free=2 * one))  # starts, but the third save would not fit
    assert refusal is None and "the run peaks at 189.2 GB" in warning
    assert check(_plan(free=190 * 10**9)) == (None, None)
    refusal, _ = check(_plan(free=one - 1, existing=2 * one))  # resumed: the next save goes beside the two kept
    assert "less than one save beside the checkpoints already there" in refusal
    assert check(_plan(free=one, existing=2 * one))[0] is None


def _resolved_plan(tmp_path: Path, gpus: int = 4, **env: str) -> DiskPlan:
    """The launcher's plan for a config-only Qwen3-4B on `gpus` simulated H100s, resolved as the launcher does."""
    from transformers import Qwen3Config

    from awm_grpo.launch import config as C
    from awm_grpo.launch.disk import plan

    folder = tmp_path / "model"
    Qwen3Config(**QWEN3_4B).save_pretrained(folder)
    cfg = C.resolve(None, env={"HF_CKPT": str(folder), "SAVE_DIR": str(tmp_path / "save"), **env},
                    gpus=C.parse_nvidia_smi(f"{H100}\n" * gpus))
    return plan(cfg)


# r x (in + out) of the seven projections of one Qwen3-4B block, at r = 1: q, k, v, o, gate, up, down
QWEN3_4B_BLOCK = (2560 + 4096) + 2 * (2560 + 1024) + (4096 + 2560) + 2 * (2560 + 9728) + (9728 + 2560)


@pytest.mark.parametrize(("targets", "per_block"), [("all-linear", QWEN3_4B_BLOCK),
                                                     ("q_proj,v_proj", (2560 + 4096) + (2560 + 1024))])
def test_a_lora_save_is_the_merged_model_and_the_adapter_with_its_moments_not_the_base_state(tmp_path, targets,
                                                                                               per_block):
    """LORA_RANK=8 on Qwen3-4B: model/ is the merged model in bf16 (8.0 GB, as a full save's), then 4 bytes an
    adapter parameter three times (adapter/, trainer/'s fp32 adapter) plus 8 for AdamW's two moments; the
    frozen base's 4 billion weights have no master copy and no moments. Each sync exports the adapter alone."""
    lora = _resolved_plan(tmp_path, LORA_RANK="8", LORA_TARGET_MODULES=targets)
    full = _resolved_plan(tmp_path, LORA_RANK="0")
    adapter = 8 * 36 * per_block
    assert (lora.lora_rank, lora.adapter_parameters, lora.parameters) == (8, adapter, QWEN3_4B_PARAMETERS)
    assert lora.save == {"model": 2 * QWEN3_4B_PARAMETERS, "adapter": 4 * adapter, "master": 4 * adapter,
                         "optimizer": 8 * adapter}
    assert lora.one_save == 2 * QWEN3_4B_PARAMETERS + 16 * adapter
    assert lora.export_each == 2 * adapter and lora.exports == 4 * adapter  # bf16 adapter folders, two at the peak
    assert full.one_save == 14 * QWEN3_4B_PARAMETERS and full.export_each == 2 * QWEN3_4B_PARAMETERS
    assert lora.one_save < full.one_save / 6 and lora.exports < full.exports / 100
    assert lora.checkpoint_peak == 3 * lora.one_save  # the newest 2 kept + the one being written

    from awm_grpo.launch.disk import report

    text = report(lora)
    assert f"one save (LoRA rank 8, {targets}: no base weights in trainer/): " in text
    assert "model/ 8.0 GB (bfloat16, merged weights) + adapter/ " in text and "in the adapter)" in text
    assert f"{adapter:,} in the adapter" in text and "weight exports (LoRA: the adapter alone each sync" in text


def test_the_one_gpu_lora_default_r32_all_linear_save_is_9_1_gb(tmp_path):
    """One GPU turns LoRA on at rank 32 (knobs.py): 66,060,288 adapter parameters on Qwen3-4B, a save of
    8.0 GB + 16 x 66,060,288 bytes = 9.1 GB (a full save is 56.3 GB), adapter syncs of 132.1 MB in bf16;
    the launcher's dry run prints it so."""
    lora = _resolved_plan(tmp_path, gpus=1)
    assert (lora.lora_rank, lora.adapter_parameters) == (32, 32 * 36 * QWEN3_4B_BLOCK) == (32, 66_060_288)
    assert lora.one_save == 8_044_936_192 + 16 * 66_060_288 == 9_101_900_800
    assert lora.export_each == 132_120_576
    done = _launch(tmp_path, "--dry-run", gpus=1, SAVE_DIR=str(tmp_path / "save"))  # what it prints
    assert done.returncode == 0, done.stderr[-2000:]
    disk = "\n".join(_disk_lines(done.stdout))
    assert ("one save (LoRA rank 32, all-linear: no base weights in trainer/): 9.1 GB = model/ 8.0 GB (bfloat16, "
            "merged weights) + adapter/ 264.2 MB (fp32) + fp32 adapter in trainer/ 264.2 MB + its AdamW moments "
            "528.5 MB (Qwen3ForCausalLM, 4,022,468,096 parameters, 66,060,288 in the adapter)") in disk
    assert ("weight exports (LoRA: the adapter alone each sync, SAVE_DIR/weights): 264.2 MB at the peak "
            "(2 x 132.1 MB, bfloat16)") in disk


def test_the_refusal_and_the_warning_thresholds_use_the_lora_save(tmp_path):
    """Two LoRA saves (18.2 GB) fit where two full saves (112.6 GB) would not: the launcher refuses below the
    LoRA figure only, and warns below the LoRA run's peak."""
    from dataclasses import replace

    lora = _resolved_plan(tmp_path, gpus=1)
    one = lora.one_save
    refusal, warning = check(replace(lora, free=2 * one - 1, total=10**12))
    assert refusal is not None and "less than two saves (18.2 GB; one save is 9.1 GB" in refusal and warning is None
    refusal, warning = check(replace(lora, free=2 * one, total=10**12))  # far below two full saves: it starts
    assert refusal is None and warning is not None and f"the run peaks at {human_bytes(lora.peak)}" in warning
    assert check(replace(lora, free=lora.peak, total=10**12)) == (None, None)
    refusal, _ = check(replace(lora, free=one - 1, existing=2 * one, total=10**12))
    assert "less than one save beside the checkpoints already there (9.1 GB" in refusal

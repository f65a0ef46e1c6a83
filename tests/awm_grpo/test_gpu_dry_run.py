"""`bash awm_grpo/run_awm_grpo.sh --dry-run` on simulated GPU machines: every flag it prints is one
slime.train accepts, and the SGLang servers it implies launch with flags the pinned sglang's own
parser accepts (tests/sglang_real.py). The GPUs are a fake `nvidia-smi` on PATH."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from sglang_real import SglangOracle, qwen3_4b_folder

from slime.arguments import build_parser, finalize_args
from slime.engine.sglang_engine import launch_command

REPO = Path(__file__).resolve().parents[2]
MACHINES = {  # name -> (nvidia-smi line of one GPU, count, the profile it must pick)
    "4xH100": ("81559 MiB, NVIDIA H100 80GB HBM3", 4, "h100"),
    "8xH200": ("143771 MiB, NVIDIA H200", 8, "h200"),
    "4xA100-40GB": ("40960 MiB, NVIDIA A100-SXM4-40GB", 4, "a100-40gb"),
    "1xH200": ("143771 MiB, NVIDIA H200", 1, "h200"),  # one GPU: LoRA adapters (docs/lora.md)
}


def dry_run(tmp_path: Path, gpu_line: str, count: int) -> tuple[str, list[str]]:
    """The launcher's output and the slime.train command it prints, on `count` such GPUs."""
    bin_dir, model, data = tmp_path / "bin", tmp_path / "Qwen3-4B", tmp_path / "awm1k"
    for folder in (bin_dir, model, data):
        folder.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + "".join(f"echo '{gpu_line}'\n" for _ in range(count)))
    smi.chmod(0o755)
    # Qwen3-4B's config (sglang 0.5.10 reads it while parsing its flags; the launcher sizes saves from it).
    # A dry run on a machine without room for two saves warns instead of refusing: it plans the run.
    qwen3_4b_folder(model)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHON": sys.executable,
           "HF_CKPT": str(model), "AWM_DATA_DIR": str(data), "SAVE_DIR": str(tmp_path / "save")}
    done = subprocess.run(["bash", str(REPO / "awm_grpo/run_awm_grpo.sh"), "--dry-run"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    return done.stdout, shlex.split(lines[lines.index("command:") + 1])


@pytest.mark.parametrize("machine", MACHINES)
def test_dry_run_prints_flags_slime_and_sglang_accept(tmp_path: Path, sglang: SglangOracle, machine: str) -> None:
    gpu_line, count, profile = MACHINES[machine]

    output, command = dry_run(tmp_path, gpu_line, count)

    assert f"[profile {profile}]" in output and command[1:3] == ["-m", "slime.train"]
    parser = build_parser()
    inexact = [a for a in command[3:] if a.startswith("--") and a not in parser._option_string_actions]
    assert inexact == [], f"slime.train has no flags {inexact} (argparse would guess an abbreviation)"
    args = parser.parse_args(command[3:])
    finalize_args(args)
    assert (args.num_gpus_per_node, args.engine_type) == (count, "sglang")
    engines = args.rollout_num_gpus // args.rollout_num_gpus_per_engine
    printed = [line for line in output.splitlines() if line.startswith("engine ")]
    assert [line.split(":")[0] for line in printed] == [f"engine {rank}" for rank in range(engines)]
    for rank, line in enumerate(printed):  # what SGLangEngineActor starts for each engine, as printed
        argv = shlex.split(line.split(": ", 1)[1])
        assert argv[:3] == [sys.executable, "-m", "sglang.launch_server"]
        assert argv == launch_command(args, port=30000 + rank, base_gpu_id=0, nccl_port=31000 + rank,
                                      seed_offset=rank)
        parsed = sglang.parse_server_args(argv[3:])
        assert parsed["error"] is None, f"engine {rank}: {parsed['error']}"
        assert argv[argv.index("--dtype") + 1] == "bfloat16" and parsed["fields"]["dtype"] == "bfloat16"
        assert parsed["fields"]["mem_fraction_static"] == args.sglang_mem_fraction_static == 0.7
        assert parsed["fields"]["tp_size"] == args.rollout_num_gpus_per_engine
        assert parsed["fields"]["enable_memory_saver"] is bool(args.offload_rollout)
        lora = count == 1  # the engine serves the adapter the trainer syncs, at the trainer's rank and modules
        assert args.lora_rank == (32 if lora else 0) and bool(parsed["fields"]["enable_lora"]) is lora
        if lora:
            assert parsed["fields"]["max_lora_rank"] == 32 and not parsed["fields"]["lora_paths"]

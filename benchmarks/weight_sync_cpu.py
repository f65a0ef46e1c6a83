"""Seconds and bytes of one weight sync on the CPU: disk (HF safetensors + /update_weights_from_disk)
against tensor (shared-memory handles to /update_weights_from_tensor), trainer and engine in separate
processes as in a run (the engine is `python -m slime.engine.cpu_server`).

    python benchmarks/weight_sync_cpu.py [--model tiny|250m] [--repeat 3]

Prints one line per (transport, wire dtype): median seconds of `WeightSync.sync` (pause, flush,
transfer, version check, continue), bytes moved, bytes per parameter. The CPU engine serves fp32;
bf16 on the wire is what the GPU profiles move (the engine casts back to fp32 here).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slime.backends.torch_backend import TorchTrainer, TrainerConfig  # noqa: E402
from slime.engine.base import EngineClient  # noqa: E402
from slime.models.tiny import build_tiny_model  # noqa: E402
from slime.weight_sync import DiskWeightSync, TensorWeightSync  # noqa: E402

MODELS = {
    "tiny": {},  # slime.models.tiny's defaults (0.34M parameters)
    # about 254M parameters: Qwen3-shaped, 16 layers of 1024, untied 32k-vocabulary head
    "250m": dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=16,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=64, tie_word_embeddings=False),
}


def start_engine(model_dir: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "slime.engine.cpu_server", "--model-path", str(model_dir),
                             "--port", "0"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in proc.stdout:
        if line.startswith("cpu_server listening on "):
            return proc, line.split()[-1]
    raise RuntimeError("the CPU engine did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="tiny")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="weight_sync_bench_"))
    overrides = MODELS[args.model]
    model_dir = build_tiny_model(work / "model", **({"vocab_size": overrides["vocab_size"]} if overrides else {}),
                                 **{k: v for k, v in overrides.items() if k != "vocab_size"})
    trainer = TorchTrainer(str(model_dir), TrainerConfig(), device="cpu")
    parameters = sum(p.numel() for p in trainer.model.parameters())
    print(f"model {args.model}: {parameters / 1e6:.1f}M parameters (fp32 trainer), CPU engine in its own process")
    proc, url = start_engine(model_dir)
    engine = EngineClient(url)
    try:
        syncs = [
            ("disk", "float32", DiskWeightSync(work / "weights", dtype="float32")),
            ("disk", "bfloat16", DiskWeightSync(work / "weights", dtype="bfloat16")),
            ("tensor", "float32", TensorWeightSync("shm", dtype="float32")),
            ("tensor", "bfloat16", TensorWeightSync("shm", dtype="bfloat16")),
        ]
        version = 0
        for name, dtype, sync in syncs:
            seconds = []
            for _ in range(args.repeat):
                version += 1
                sync.sync(trainer, [engine], version)
                seconds.append(sync.seconds)
            s = sync.stats()
            print(f"{name:6s} {dtype:8s} {statistics.median(seconds):7.3f} s (runs {', '.join(f'{x:.3f}' for x in seconds)})"
                  f"  {s['bytes_sent'] / 1e6:9.1f} MB  {s['bytes_per_parameter']:.2f} bytes/parameter  "
                  f"(transport {s['transport']})")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()

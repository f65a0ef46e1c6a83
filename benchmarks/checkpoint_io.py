"""Checkpoint save and load on CPU: seconds and bytes, before (format 1) and after (format 2), 1 and 2 ranks.

    .venv/bin/python benchmarks/checkpoint_io.py                       # tiny + 250M models, 1 and 2 ranks
    .venv/bin/python benchmarks/checkpoint_io.py --models tiny --worlds 1

"before" is the code at git HEAD's `slime/` (copied with `git archive` into a temporary folder and put
first on PYTHONPATH): rank 0 gathers fp32 weights and the full optimizer state and writes everything.
"after" is the working tree: every rank writes its shard of the optimizer state (DCP), rank 0 the
model/ folder, in fp32 (the CPU engine's serving dtype: no second copy of the weights) and in bf16
(SGLang's: the fp32 master weights go to the shards). One rank trains with the torch backend, two with
FSDP2 over gloo, as the GPU profiles do. Each row is one process group: a train step (so that AdamW
has its moments), then a timed `save_checkpoint`; then a new group of fresh processes times
`load_checkpoint` (a resume). Models: the CPU recipe's tiny Qwen3 (slime.models.tiny, 336k parameters)
and a 250M-parameter Qwen3 (hidden 1024, 16 layers). Seconds include fsync; the page cache is not dropped.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODELS = {
    "tiny": dict(vocab_size=4096),  # slime.models.tiny.build_config's defaults: the CPU recipe's model
    "250m": dict(vocab_size=32768, hidden_size=1024, intermediate_size=3072, num_hidden_layers=16,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=64),
}


def worker(o: argparse.Namespace) -> None:
    """One rank: save (after a train step) or load, timed between barriers; rank 0 writes the figure."""
    import torch

    from slime.backends.distributed import init_data_parallel
    from slime.backends.torch_backend import TorchTrainer, TrainerConfig
    from slime.utils.types import Sample

    torch.set_num_threads(1)
    dp = init_data_parallel(o.rank, o.world, "127.0.0.1", o.port, fsdp=o.world > 1, timeout_minutes=30)
    trainer = TorchTrainer(o.model_dir, TrainerConfig(lr=1e-4, max_tokens_per_micro_batch=64), dp=dp)
    if o.phase == "save":
        sample = Sample(tokens=list(range(1, 17)), response_length=8, loss_mask=[1] * 8)
        trainer.train_step([sample], [1.0])
    dp.barrier()
    started = time.perf_counter()
    if o.phase == "save":
        extra = {} if o.dtype == "none" else {"dtype": o.dtype}
        trainer.save_checkpoint(o.save, iteration=1, **extra)
    else:
        trainer.load_checkpoint(o.save)
    dp.barrier()
    seconds = time.perf_counter() - started
    if o.rank == 0:
        Path(o.out).write_text(json.dumps({"seconds": seconds}))
    dp.close()
    sys.stdout.flush()
    os._exit(0)  # no interpreter finalization after the group is gone (see tests/slime/dp_worker.py)


def _run_group(pythonpath: Path, args: list[str], world: int, out: Path) -> float:
    from slime.utils.misc import free_port

    port = str(free_port("127.0.0.1"))
    env = dict(os.environ, PYTHONPATH=str(pythonpath), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
               TRANSFORMERS_VERBOSITY="error", HF_HUB_OFFLINE="1")
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", *args, "--rank", str(r), "--world", str(world),
                               "--port", port, "--out", str(out)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(world)]
    for proc in procs:
        output, _ = proc.communicate(timeout=3600)
        if proc.returncode != 0:
            raise RuntimeError(f"rank failed:\n{output[-3000:]}")
    return json.loads(out.read_text())["seconds"]


def _bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for name in ("model-dir", "save", "out", "phase", "dtype"):
        p.add_argument(f"--{name}", help=argparse.SUPPRESS)
    for name in ("rank", "world", "port"):
        p.add_argument(f"--{name}", type=int, help=argparse.SUPPRESS)
    p.add_argument("--models", default="tiny,250m")
    p.add_argument("--worlds", default="1,2")
    p.add_argument("--impls", default="before,after-fp32,after-bf16")
    o = p.parse_args()
    if o.worker:
        worker(o)
        return

    from slime.models.tiny import build_config

    work = Path(tempfile.mkdtemp(prefix="ckpt-bench-"))
    before = work / "before"
    before.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD", "slime"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(before)], input=archive.stdout, check=True)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, work folder {work}")
    print("| model | params | ranks | code | save s | load s | bytes |")
    print("|---|---|---|---|---|---|---|")
    for name in o.models.split(","):
        import torch
        from transformers import Qwen3ForCausalLM

        torch.manual_seed(0)
        model = Qwen3ForCausalLM(build_config(eos_id=2, pad_id=0, **MODELS[name]))
        count = sum(t.numel() for t in model.parameters())
        model_dir = work / f"model-{name}"
        model.save_pretrained(model_dir)
        del model
        for world in map(int, o.worlds.split(",")):
            for impl in o.impls.split(","):
                root = before if impl == "before" else REPO
                dtype = {"before": "none", "after-fp32": "float32", "after-bf16": "bfloat16"}[impl]
                save = work / f"save-{name}-{world}-{impl}"
                common = ["--model-dir", str(model_dir), "--save", str(save), "--dtype", dtype]
                saved = _run_group(root, [*common, "--phase", "save"], world, work / "t.json")
                size = _bytes(save / "iter_0000001")
                loaded = _run_group(root, [*common, "--phase", "load"], world, work / "t.json")
                print(f"| {name} | {count / 1e6:.1f}M | {world} | {impl} | {saved:.2f} | {loaded:.2f} | "
                      f"{size / 1e6:.1f} MB |", flush=True)
                subprocess.run(["rm", "-rf", str(save)], check=True)
    subprocess.run(["rm", "-rf", str(work)], check=True)


if __name__ == "__main__":
    main()

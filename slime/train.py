"""`python -m slime.train ...`: the synchronous RL loop with slime's flags (see slime/arguments.py).

Per step:  generate (rollout + reward + dynamic filter)  ->  advantages  ->  train  ->  save every
`--save-interval`  ->  weight sync (HF safetensors to disk, engines' update_weights_from_disk)  ->
eval every `--eval-interval`. Before the first step the trainer's weights are pushed once, so the
engines serve exactly what the trainer holds (also after a resume).

Resume: with `--load` pointing at a `--save` directory that holds a checkpoint, weights, optimizer,
RNG, the next step and the prompt source's position are restored; rerunning the same command after
a crash continues with the same prompt order. Without a checkpoint there the run starts fresh.

Fault tolerance: engines are health-checked before each step and every
`--rollout-health-check-interval` seconds during generation; a dead engine is restarted on its port
with the current weights, and the step's failed groups are generated again.

Metrics: one line per step in `--metrics-path` (JSONL, default `<save>/metrics.jsonl`), TensorBoard
event files with `--use-tensorboard` (written by this module: no tensorboard package needed), wandb
(offline unless `--wandb-mode online`) with `--use-wandb` when wandb is installed.

Not implemented: the one-step-off-policy async mode (slime's train_async.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import shutil
import socket
import struct
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from slime.algorithms.advantages import grpo_advantages
from slime.arguments import parse_args
from slime.backends.checkpoint import LATEST_FILE
from slime.rollout.base_types import call_rollout_fn
from slime.rollout.data_source import RolloutDataSourceWithBuffer, load_prompts
from slime.rollout.sglang_rollout import eval_rollout, generate_rollout
from slime.utils.http_utils import close_shared_client
from slime.utils.misc import load_function
from slime.utils.types import Sample

logger = logging.getLogger("slime.train")


# ---- metrics -----------------------------------------------------------------------------------


def _crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc_table()


def _masked_crc(data: bytes) -> int:
    crc = _crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    return _varint(tag) + _varint(len(payload)) + payload


class TensorBoardWriter:
    """Scalars as TensorBoard event files (TFRecord framing of `Event` protos), written by hand.

    Event{wall_time=1 (double), step=2 (int64), file_version=3 | summary=5}; Summary{value=1};
    Value{tag=1, simple_value=2 (float)}. Each record: len u64, masked crc32c(len), data, crc(data).
    """

    def __init__(self, log_dir: str | Path):
        self.dir = Path(log_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}"
        self._file = open(self.dir / name, "ab")  # noqa: SIM115 - kept open for the run
        self._write_event(_field(3 << 3 | 2, b"brain.Event:2"), step=0)

    def _write_event(self, body: bytes, step: int) -> None:
        event = b"\x09" + struct.pack("<d", time.time()) + b"\x10" + _varint(step) + body
        header = struct.pack("<Q", len(event))
        self._file.write(header + struct.pack("<I", _masked_crc(header)) + event
                         + struct.pack("<I", _masked_crc(event)))
        self._file.flush()

    def add_scalars(self, metrics: dict[str, float], step: int) -> None:
        values = b"".join(
            _field(1 << 3 | 2, _field(1 << 3 | 2, tag.encode()) + b"\x15" + struct.pack("<f", value))
            for tag, value in metrics.items()
        )
        self._write_event(_field(5 << 3 | 2, values), step)

    def close(self) -> None:
        self._file.close()


class MetricsWriter:
    """The one writer of a run: JSONL always (when a path is known), TensorBoard and wandb on request."""

    def __init__(self, args: argparse.Namespace):
        path = args.metrics_path or (str(Path(args.save) / "metrics.jsonl") if args.save else None)
        self.jsonl = None
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self.jsonl = open(path, "a")  # noqa: SIM115 - kept open for the run
        self.tb = None
        if args.use_tensorboard:
            tb_dir = args.tensorboard_dir or (str(Path(args.save) / "tensorboard") if args.save else "tensorboard")
            self.tb = TensorBoardWriter(tb_dir)
        self.wandb = None
        if args.use_wandb:
            try:
                import wandb
            except ImportError:
                raise SystemExit(
                    "--use-wandb needs the wandb package, which is not installed (it is not part of the CPU "
                    "set): `pip install wandb`, or drop --use-wandb; --use-tensorboard and the JSONL metrics "
                    "work without it"
                ) from None
            self.wandb = wandb.init(project=args.wandb_project, group=args.wandb_group, dir=args.wandb_dir,
                                    mode=args.wandb_mode, config=_plain(vars(args)))

    def log(self, step: int, metrics: dict[str, Any], kind: str = "train") -> None:
        scalars = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}
        if self.jsonl is not None:
            self.jsonl.write(json.dumps({"kind": kind, "step": step, **metrics}) + "\n")
            self.jsonl.flush()
        if self.tb is not None:
            self.tb.add_scalars(scalars, step)
        if self.wandb is not None:
            self.wandb.log(scalars, step=step)

    def close(self) -> None:
        for sink in (self.jsonl, self.tb):
            if sink is not None:
                sink.close()
        if self.wandb is not None:
            self.wandb.finish()


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if isinstance(v, str | int | float | bool | type(None) | list)}


# ---- advantages ----------------------------------------------------------------------------------


def build_train_batch(args: argparse.Namespace, groups: Sequence[list[Sample]]) -> tuple[list[Sample], list[float]]:
    """Samples to train on and one advantage each (GRPO-normalised rewards, grouped by group index).

    Samples without response tokens are left out; `remove_sample` zeroes a loss mask; ABORTED /
    FAILED samples get advantage 0 and stay out of their group's statistics.
    """
    samples = [s for g in groups for s in g if s.response_length > 0]
    if not samples:
        raise RuntimeError("the rollout produced no response tokens to train on")
    for s in samples:
        if s.remove_sample:
            s.loss_mask = [0] * s.response_length
    rewards = torch.tensor([float(s.get_reward_value(args)) for s in samples], dtype=torch.float64)
    valid = torch.tensor([s.status not in (Sample.Status.ABORTED, Sample.Status.FAILED) for s in samples])
    if args.disable_rewards_normalization:
        adv = torch.where(valid, rewards, 0.0)
    else:
        group_index = torch.tensor([s.group_index if s.group_index is not None else i for i, s in enumerate(samples)])
        std_normalize = not args.disable_grpo_std_normalization and args.n_samples_per_prompt > 1
        adv = grpo_advantages(rewards, group_index, std_normalize=std_normalize, valid=valid)
    return samples, adv.tolist()


# ---- the run -------------------------------------------------------------------------------------


def _has_checkpoint(path: str | None) -> bool:
    return bool(path) and (Path(path) / LATEST_FILE).is_file()


class Run:
    """Everything one training run holds; `run()` is the loop of the module docstring."""

    def __init__(self, args: argparse.Namespace):
        from transformers import AutoTokenizer

        from slime import ray_actors

        self.args = args
        self.ray_actors = ray_actors
        tokenizer = AutoTokenizer.from_pretrained(args.hf_checkpoint)
        self.prompts = load_prompts(args, args.prompt_data, tokenizer)
        self.eval_prompts = {name: load_prompts(args, path, tokenizer) for name, path in args.eval_datasets.items()}
        self.data_source = RolloutDataSourceWithBuffer(self.prompts, args.n_samples_per_prompt, args=args,
                                                       shuffle=args.rollout_shuffle, seed=args.rollout_seed)
        if args.num_rollout is None:
            args.num_rollout = args.num_epoch * len(self.prompts) // args.rollout_batch_size
        self._tmp = None
        weights_root = args.update_weight_disk_dir or (str(Path(args.save) / "weights") if args.save else None)
        if weights_root is None:
            self._tmp = tempfile.mkdtemp(prefix="slime-weights-")
            weights_root = self._tmp
        self.weights_root = Path(weights_root)
        self.metrics = MetricsWriter(args)

    async def setup(self) -> int:
        """Ray, actors, checkpoint; returns the first step to run."""
        args = self.args
        self.ray_actors.init_ray(args)
        placement = self.ray_actors.create_placement(args)
        self.trainer = self.ray_actors.TrainActor.options(**placement.options(placement.train_bundle, "train")).remote(args)
        self.engines = self.ray_actors.EnginePool(args, placement)
        start = 0
        if _has_checkpoint(args.load):
            loaded = await self.trainer.load.remote(args.load)
            state = loaded["data_state"]
            self.data_source.load_state(state["data_source"])
            start = int(state["next_rollout_id"])
            logger.info("resumed from %s: next step %d", loaded["path"], start)
        elif args.load:
            logger.info("--load %s holds no checkpoint yet: starting from %s", args.load, args.hf_checkpoint)
        if args.start_rollout_id is not None:
            start = args.start_rollout_id
        await self.engines.start()
        await self.sync_weights(start)  # engines serve the trainer's weights from the first step
        return start

    async def sync_weights(self, version: int) -> None:
        """Disk transport: export HF safetensors, point every engine at them, drop the old folder."""
        old = self.engines.weights_path
        path = await self.trainer.export.remote(str(self.weights_root / f"weight_v{version:06d}"))
        await self.engines.update_weights(path, str(version))
        if not self.args.update_weight_disk_keep_files and old != path and Path(old).parent == self.weights_root:
            shutil.rmtree(old, ignore_errors=True)

    async def evaluate(self, step: int) -> None:
        await self.engines.ensure_healthy()
        metrics: dict[str, float] = {}
        for name, prompts in self.eval_prompts.items():
            metrics.update(await eval_rollout(self.args, name, prompts))
        self.metrics.log(step, metrics, kind="eval")
        logger.info("eval after %d steps: %s", step, " ".join(f"{k}={v:.4f}" for k, v in metrics.items()))

    async def step(self, rollout_id: int) -> dict[str, Any]:
        args = self.args
        restarted = await self.engines.ensure_healthy()
        watchdog = asyncio.create_task(self.engines.watch(args.rollout_health_check_interval))
        restarts_before = self.engines.restarts
        rollout_fn = load_function(args.rollout_function_path)
        extra = {"on_failure": self.engines.ensure_healthy} if rollout_fn is generate_rollout else {}
        started = time.perf_counter()
        try:
            result = await call_rollout_fn(rollout_fn, args, rollout_id, self.data_source, evaluation=False, **extra)
        finally:
            watchdog.cancel()
        rollout_metrics = {"rollout/time_s": time.perf_counter() - started, **(result.metrics or {})}
        samples, advantages = build_train_batch(args, result.samples)
        rollout_metrics.setdefault("rollout/raw_reward", sum(float(s.get_reward_value(args)) for s in samples) / len(samples))
        started = time.perf_counter()
        train_metrics = await self.trainer.train.remote(samples, advantages)
        metrics = {**rollout_metrics, **train_metrics, "train/time_s": time.perf_counter() - started,
                   "rollout/engine_restarts": float(restarted + self.engines.restarts - restarts_before)}
        if args.ci_test and rollout_id == 0:
            diff = train_metrics.get("train/train_rollout_logprob_abs_diff", 0.0)
            if not diff < args.ci_train_rollout_logprob_abs_diff_threshold:
                raise AssertionError(f"train/rollout log-prob mismatch {diff} >= "
                                     f"{args.ci_train_rollout_logprob_abs_diff_threshold} at step 0")
        return metrics

    async def run(self) -> None:
        args = self.args
        start = await self.setup()
        if args.eval_interval and not args.skip_eval_before_train and start == 0:
            await self.evaluate(0)
        bar = tqdm(range(start, args.num_rollout), initial=start, total=args.num_rollout, desc="steps",
                   dynamic_ncols=True, file=sys.stderr)
        for rollout_id in bar:
            metrics = await self.step(rollout_id)
            self.metrics.log(rollout_id, metrics)
            reward = metrics["rollout/raw_reward"]
            bar.set_postfix(reward=f"{reward:.3f}")
            logger.info(
                "step %d/%d reward=%.4f loss=%.4g logprob_diff=%.2e grad_norm=%.3g rollout %.1fs train %.1fs",
                rollout_id + 1, args.num_rollout, reward, metrics.get("train/loss", math.nan),
                metrics.get("train/train_rollout_logprob_abs_diff", math.nan),
                metrics.get("train/grad_norm", math.nan), metrics["rollout/time_s"], metrics["train/time_s"],
            )
            last = rollout_id + 1 == args.num_rollout
            if args.save and args.save_interval and ((rollout_id + 1) % args.save_interval == 0 or last):
                state = {"data_source": self.data_source.state(), "next_rollout_id": rollout_id + 1}
                path = await self.trainer.save.remote(args.save, rollout_id, state)
                logger.info("saved %s", path)
            eval_due = bool(args.eval_interval) and (rollout_id + 1) % args.eval_interval == 0
            if eval_due or ((rollout_id + 1) % args.update_weights_interval == 0 and not last):
                await self.sync_weights(rollout_id + 1)
            if eval_due:
                await self.evaluate(rollout_id + 1)
        bar.close()

    async def close(self) -> None:
        if hasattr(self, "engines"):
            await self.engines.shutdown()
        await close_shared_client()
        self.metrics.close()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)


async def _main(args: argparse.Namespace) -> None:
    run = Run(args)
    try:
        await run.run()
    finally:
        await run.close()


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the step log
    args = parse_args(argv)
    asyncio.run(_main(args))
    import ray

    ray.shutdown()


if __name__ == "__main__":
    main()

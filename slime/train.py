"""`python -m slime.train ...`: the synchronous RL loop with slime's flags (see slime/arguments.py).

Per step:  generate (rollout + reward + dynamic filter)  ->  rollout log hook  ->  advantages  ->
train  ->  save every `--save-interval`  ->  weight sync (HF safetensors to disk, engines'
update_weights_from_disk)  ->  eval every `--eval-interval` (+ eval log hook). Before the first step
the trainer's weights are pushed once, so the engines serve exactly what the trainer holds (also
after a resume). `python -m slime.train_async` runs the same pieces one step off-policy.

Colocated GPUs (`--offload-rollout`, `--offload-train`; both on under `--colocate` with SGLang):
after the rollout the engines release weights and KV cache and the trainer's state comes back from
host memory; after training and saving the engines get their weight memory back and the weights are
synced, then the trainer moves to host memory and the engines get their KV cache back. (slime
offloads the trainer before the sync; here the sync reads the weights on the GPU, where FSDP's
gathers run.) The PPO critic is not moved.

Resume: with `--load` pointing at a `--save` directory that holds a checkpoint, weights, optimizer,
RNG and the next step come from the checkpoint and the prompt source's position from
`{load}/rollout/global_dataset_state_dict_{step}.pt` (slime's `DataSource.save/load` file);
rerunning the same command after a crash continues with the same prompt order. Without a
checkpoint there the run starts fresh.

Fault tolerance: engines are health-checked before each step and every
`--rollout-health-check-interval` seconds during generation; a dead engine is restarted on its port
with the current weights, and the step's failed groups are generated again.

Metrics: one line per step in `--metrics-path` (JSONL, default `<save>/metrics.jsonl`), TensorBoard
event files with `--use-tensorboard`, wandb (offline unless `--wandb-mode online`) with
`--use-wandb`; log hooks may add entries (slime/utils/log_hooks.py). Eval records are logged at the
number of steps trained so far (0 before training), and the eval hook gets that number as rollout_id.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from slime.algorithms.estimators import Advantages, build_train_batch, ppo_advantages
from slime.arguments import DEFAULT_DATA_SOURCE, parse_args
from slime.backends.checkpoint import LATEST_FILE, CheckpointSaveError, failure_message
from slime.rollout.base_types import call_rollout_fn, expect_output
from slime.rollout.data_source import RolloutDataSourceWithBuffer, load_prompts
from slime.rollout.rm_hub import check_reward, reward_number
from slime.rollout.sglang_rollout import GenerateState, eval_metrics, eval_prompts
from slime.utils.fd_limit import raise_open_file_limit
from slime.utils.http_utils import close_shared_client
from slime.utils.log_hooks import call_log_hook
from slime.utils.metrics import MetricsWriter, TensorBoardWriter
from slime.utils.misc import load_function
from slime.utils.types import Sample

__all__ = ["MetricsWriter", "Run", "StepBatch", "TensorBoardWriter", "build_train_batch", "main"]

logger = logging.getLogger("slime.train")

# Rollout metrics kept when a rollout log hook returns True (loop bookkeeping, not rollout statistics).
_BOOKKEEPING = ("rollout/time_s", "rollout/engine_restarts", "rollout/weight_staleness")


def _has_checkpoint(path: str | None) -> bool:
    return bool(path) and (Path(path) / LATEST_FILE).is_file()


def weight_staleness(rollout_id: int, samples: Sequence[Sample]) -> float | None:
    """Mean number of train steps the generating weights lagged behind: step - weight version.

    Engines serve weight version v after v train steps (sync_weights(v)); the synchronous loop reads 0,
    the async loop 1 from its second step on. Uses each sample's first recorded version (None if none).
    """
    lags = []
    for s in samples:
        for version in s.weight_versions[:1]:
            try:
                lags.append(rollout_id - int(version))
            except ValueError:
                pass
    return sum(lags) / len(lags) if lags else None


@dataclass
class StepBatch:
    """One step's generated data, ready to train: samples, advantages and the rollout's metrics."""

    rollout_id: int
    samples: list[Sample]
    advantages: Advantages | None  # None: ppo, computed from the critic's values at train time
    metrics: dict[str, Any]
    reward: float  # mean raw reward, for the progress line even when a hook hides the default metrics
    started: float  # time.perf_counter() bounds of the generation
    finished: float


class Run:
    """Everything one training run holds, and the pieces of a step; `run()` is the synchronous loop."""

    def __init__(self, args: argparse.Namespace):
        from transformers import AutoTokenizer

        from slime import ray_actors

        self.args = args
        self.ray_actors = ray_actors
        for path in args.eval_datasets.values():
            eval_prompts(args, path)  # fail early on a bad eval file
        if args.data_source_path == DEFAULT_DATA_SOURCE:
            tokenizer = AutoTokenizer.from_pretrained(args.hf_checkpoint)
            prompts = load_prompts(args, args.prompt_data, tokenizer) if args.rollout_global_dataset else []
            self.data_source = RolloutDataSourceWithBuffer(
                prompts, args.n_samples_per_prompt, args=args, shuffle=args.rollout_shuffle,
                seed=args.rollout_seed, save_dir=args.save, load_dir=args.load,
            )
        else:  # upstream's --data-source-path: a class built from args; checkpointed by its own save/load
            self.data_source = load_function(args.data_source_path)(args)
        if args.num_rollout is None:
            args.num_rollout = args.num_epoch * len(self.data_source) // args.rollout_batch_size
        self._tmp = None
        weights_root = args.update_weight_disk_dir or (str(Path(args.save) / "weights") if args.save else None)
        if weights_root is None:
            self._tmp = tempfile.mkdtemp(prefix="slime-weights-")
            weights_root = self._tmp
        self.weights_root = Path(weights_root)
        self.metrics = MetricsWriter(args)
        self.sync_metrics: dict[str, float] = {}  # the last weight sync's figures (`sync_weights`)
        self.bar: tqdm | None = None

    # ---- setup, weights, eval ------------------------------------------------------------------

    async def setup(self) -> int:
        """Ray, engines, trainer, checkpoint, first weight sync; returns the first step to run.

        Engines start first and (colocated, --offload-rollout) release their memory before the trainer
        is built: an SGLang engine sizes its KV cache from the GPU memory free when it starts, so a
        trainer loading its weights meanwhile would leave it too little or run the GPU out of memory
        (upstream slime starts the rollout engines and offloads them before it creates the trainer)."""
        args = self.args
        self.ray_actors.init_ray(args)
        placement = self.ray_actors.create_placement(args)
        self.engines = self.ray_actors.EnginePool(args, placement)
        await self.engines.start()
        GenerateState(args).engine_check = self._engine_check_for(asyncio.get_running_loop())
        if args.offload_rollout:
            await self.engines.release_memory()
        self.trainer = self.ray_actors.TrainActor.options(**placement.options(placement.train_bundle, "train")).remote(
            self.args)
        await self.trainer.pid.remote()  # built (weights in memory) before the engines take memory back
        self.critic = None
        if args.advantage_estimator == "ppo" and not args.custom_advantage_function_path:
            from slime.critic import create_critic_actor

            self.critic = create_critic_actor(args)
        start = 0
        if _has_checkpoint(args.load):
            loaded = await self.trainer.load.remote(args.load)
            if self.critic is not None:
                await self.critic.load.remote(args.load, int(loaded["iteration"]))
            state = loaded["data_state"]
            if not isinstance(self.data_source, RolloutDataSourceWithBuffer):
                self.data_source.load(int(loaded["iteration"]))
            elif "data_source" in state:  # checkpoints written before the data-source file existed
                self.data_source.load_state(state["data_source"])
            else:
                self.data_source.load(int(loaded["iteration"]))
            start = int(state["next_rollout_id"])
            logger.info("resumed from %s: next step %d", loaded["path"], start)
        elif args.load:
            logger.info("--load %s holds no checkpoint yet: starting from %s", args.load, args.hf_checkpoint)
        if args.start_rollout_id is not None:
            start = args.start_rollout_id
        await self.resume_engine_weights()
        await self.sync_weights(start)  # engines serve the trainer's weights from the first step
        await self.hand_gpu_to_engines()  # the first rollout has the GPU
        return start

    def _engine_check_for(self, loop: asyncio.AbstractEventLoop) -> Callable[[list[BaseException]], Awaitable[None]]:
        """The engine health check for the default rollout, which runs on the rollout loop
        (`slime.utils.async_utils`): the check itself runs on this loop, where the engine pool lives."""

        async def check(errors: list[BaseException]) -> None:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.engines.ensure_healthy(errors), loop))

        return check

    async def sync_weights(self, version: int) -> None:
        """--update-weight-transport disk (HF safetensors the engines load; old folder dropped), tensor or nccl
        (from the trainer's memory; a folder only when engines fell back to disk). `engines.last_sync` says what moved."""
        old = self.engines.weights_path
        path = await self.engines.sync_weights(self.trainer, version, str(self.weights_root / f"weight_v{version:06d}"))
        moved = getattr(self.engines, "last_sync", None) or {}
        if moved.get("parameters"):
            # on the next step's metrics row: what the weights its rollout used cost to move
            self.sync_metrics = {"sync/bytes": float(moved["bytes_sent"]), "sync/parameters": float(moved["parameters"]),
                                 "sync/time_s": float(moved["seconds"])}
            logger.info("weight sync v%d: %s%s, %d bytes for %d parameters (%.2f bytes/parameter) in %.2f s", version,
                        moved["transport"], f" (then disk: {moved['fallback_engines']})" if moved.get("fallback") else "",
                        moved["bytes_sent"], moved["parameters"], moved["bytes_per_parameter"], moved["seconds"])
        if path and not self.args.update_weight_disk_keep_files and old != path and Path(old).parent == self.weights_root:
            shutil.rmtree(old, ignore_errors=True)

    async def evaluate(self, step: int) -> None:
        """`--eval-function-path` (default: the rollout function) with evaluation=True, then the eval hook."""
        args = self.args
        await self.engines.ensure_healthy()
        path = args.eval_function_path or args.rollout_function_path
        started = time.perf_counter()
        out = expect_output(await asyncio.to_thread(call_rollout_fn, load_function(path), args, step, self.data_source,
                                                    evaluation=True), evaluation=True, path=path)
        own = eval_metrics(args, out.data)
        metrics: dict[str, Any] = {**own, **(out.metrics or {})}
        path = args.custom_eval_rollout_log_function_path
        if path:
            hook = await call_log_hook(load_function(path), path, step, args, out.data, out.metrics)
            metrics = {**({} if hook.skip_default else metrics), **hook.metrics}
        metrics["eval/time_s"] = time.perf_counter() - started
        self.metrics.log(step, metrics, kind="eval")
        shown = {k: v for k, v in metrics.items() if (k in own or k == "eval/time_s") and isinstance(v, int | float)}
        logger.info("eval after %d steps: %s (%d metrics in metrics.jsonl and TensorBoard)", step,
                    " ".join(f"{k}={v:.4g}" for k, v in shown.items()), len(metrics))

    # ---- colocated GPUs: slime's memory hand-over (--offload-rollout / --offload-train) ----------

    async def hand_gpu_to_trainer(self) -> None:
        """After a rollout: the engines release weights and KV cache, the trainer's state comes back."""
        if self.args.offload_rollout:
            await self.engines.release_memory()
        if self.args.offload_train:
            await self.trainer.onload.remote()

    async def resume_engine_weights(self) -> None:
        """After training (and saving), before the weight sync: the engines re-allocate their weights."""
        if self.args.offload_rollout:
            await self.engines.resume_memory(["weights"])

    async def hand_gpu_to_engines(self) -> None:
        """After the weight sync: the trainer moves to host memory, the engines get their KV cache back."""
        if self.args.offload_train:
            await self.trainer.offload.remote()
        if self.args.offload_rollout:
            await self.engines.resume_memory(["kv_cache", "cuda_graph"])

    # ---- the pieces of a step ------------------------------------------------------------------

    async def generate(self, rollout_id: int) -> StepBatch:
        """Rollout of step `rollout_id` (with engine health checks), rollout log hook, advantages."""
        args = self.args
        restarts_before = self.engines.restarts
        await self.engines.ensure_healthy()
        stop_watch = asyncio.Event()
        watchdog = asyncio.create_task(self.engines.watch(args.rollout_health_check_interval, stop_watch))
        rollout_fn = load_function(args.rollout_function_path)
        started = time.perf_counter()
        try:  # a plain function, as upstream's: run in a thread while this loop keeps the watchdog going
            result = expect_output(await asyncio.to_thread(call_rollout_fn, rollout_fn, args, rollout_id,
                                                           self.data_source, evaluation=False),
                                   evaluation=False, path=args.rollout_function_path)
        finally:
            stop_watch.set()
            await watchdog  # a restart it began belongs to this step
        finished = time.perf_counter()
        metrics: dict[str, Any] = {"rollout/time_s": finished - started, **(result.metrics or {})}
        flat = [s for g in result.samples for s in g]
        scored = [s for s in flat if s.reward is not None]
        for s in scored:  # whatever rollout function made them: a NaN or string never reaches the advantages
            check_reward(args, s, s.reward)
        rewards = [r for r in (reward_number(args, s) for s in scored) if r is not None]  # OPD: dicts left out
        reward = sum(rewards) / len(rewards) if rewards else math.nan
        metrics.setdefault("rollout/raw_reward", reward)
        metrics["rollout/engine_restarts"] = float(self.engines.restarts - restarts_before)
        staleness = weight_staleness(rollout_id, flat)
        if staleness is not None:
            metrics["rollout/weight_staleness"] = staleness
        path = args.custom_rollout_log_function_path
        if path:
            hook = await call_log_hook(load_function(path), path, rollout_id, args, flat, result.metrics,
                                       finished - started)
            if hook.skip_default:
                metrics = {k: v for k, v in metrics.items() if k in _BOOKKEEPING}
            metrics.update(hook.metrics)
        samples, advantages = build_train_batch(args, result.samples)
        return StepBatch(rollout_id, samples, advantages, metrics, reward, started, finished)

    async def train(self, batch: StepBatch) -> dict[str, Any]:
        """One rollout's optimizer steps on the train actor; returns the step's full metrics.

        ppo: the critic's values first (GAE advantages and returns), then the critic's value step and
        the policy step side by side; the policy waits during `--num-critic-only-steps`.
        """
        args = self.args
        started = time.perf_counter()
        advantages, critic_step = batch.advantages, None
        if advantages is None:
            values = await self.critic.values.remote(batch.samples)
            advantages, returns, valid = ppo_advantages(args, batch.samples, values)
            critic_step = self.critic.train.remote(batch.samples, returns, values, valid)
        policy_step = None
        if batch.rollout_id >= args.num_critic_only_steps or critic_step is None:
            policy_step = self.trainer.train.remote(batch.samples, advantages)
        train_metrics = await policy_step if policy_step is not None else {}
        critic_metrics = await critic_step if critic_step is not None else {}
        metrics = {**batch.metrics, **self.sync_metrics, **train_metrics, **critic_metrics,
                   "train/time_s": time.perf_counter() - started}
        if args.ci_test and batch.rollout_id == 0:
            diff = train_metrics.get("train/train_rollout_logprob_abs_diff", 0.0)
            if not diff < args.ci_train_rollout_logprob_abs_diff_threshold:
                raise AssertionError(f"train/rollout log-prob mismatch {diff} >= "
                                     f"{args.ci_train_rollout_logprob_abs_diff_threshold} at step 0")
        return metrics

    async def end_step(
        self,
        batch: StepBatch,
        metrics: dict[str, Any],
        *,
        in_flight: asyncio.Task | None = None,
        next_data_state: dict[str, Any] | None = None,
    ) -> None:
        """Log, save, sync weights and evaluate after step `batch.rollout_id` trained.

        `in_flight` (async mode) is the next step's generation: the weights are synced only after it
        finished (never in the middle of a generation), and the saved data position is
        `next_data_state`, the position before that generation drew its prompts.
        """
        args = self.args
        rollout_id = batch.rollout_id
        self.metrics.log(rollout_id, metrics)
        if self.bar is not None:
            self.bar.set_postfix(reward=f"{batch.reward:.3f}")
        skipped = metrics.get("train/zero_advantage_samples")
        logger.info(
            "step %d/%d reward=%.4f loss=%.4g logprob_diff=%.2e grad_norm=%.3g%s rollout %.1fs train %.1fs",
            rollout_id + 1, args.num_rollout, batch.reward, metrics.get("train/loss", math.nan),
            metrics.get("train/train_rollout_logprob_abs_diff", math.nan),
            metrics.get("train/grad_norm", math.nan),
            "" if skipped is None else f" zero-advantage samples {skipped:.0f}/{len(batch.samples)}",
            batch.finished - batch.started, metrics["train/time_s"],
        )
        last = rollout_id + 1 == args.num_rollout
        if args.save and args.save_interval and ((rollout_id + 1) % args.save_interval == 0 or last):
            try:
                what = "the data position (rollout/)"
                if isinstance(self.data_source, RolloutDataSourceWithBuffer):
                    self.data_source.save(rollout_id, state=next_data_state if in_flight is not None else None)
                else:
                    self.data_source.save(rollout_id)
                if self.critic is not None:
                    what = "the critic (critic/)"
                    await self.critic.save.remote(args.save, rollout_id)
                path = await self.trainer.save.remote(args.save, rollout_id, {"next_rollout_id": rollout_id + 1})
            except OSError as exc:
                # Stop rather than train on without a checkpoint: the weights and optimizer state would then
                # live only in memory, and every later save would meet the same disk. The sentence says what
                # to free or change; `--load` resumes from the save before this one.
                cause = getattr(exc, "cause", None) or exc  # Ray wraps the train actor's exception
                if not isinstance(cause, CheckpointSaveError):  # the data position's or the critic's file
                    cause = failure_message(args.save, rollout_id, what, cause, None)
                logger.error("step %d: %s", rollout_id + 1, cause)
                raise CheckpointSaveError(str(cause)) from None
            logger.info("saved %s", path)
        await self.resume_engine_weights()
        eval_due = bool(args.eval_interval) and (rollout_id + 1) % args.eval_interval == 0
        if eval_due or ((rollout_id + 1) % args.update_weights_interval == 0 and not last):
            if in_flight is not None:
                await asyncio.wait([in_flight])  # its errors surface where the loop awaits it
            await self.sync_weights(rollout_id + 1)
        await self.hand_gpu_to_engines()
        if eval_due:
            await self.evaluate(rollout_id + 1)

    # ---- loops ---------------------------------------------------------------------------------

    async def start(self) -> int:
        """Setup, optional eval before training and the progress bar; returns the first step."""
        args = self.args
        start = await self.setup()
        if args.eval_interval and not args.skip_eval_before_train and start == 0:
            await self.evaluate(0)
        self.bar = tqdm(total=args.num_rollout, initial=start, desc="steps", dynamic_ncols=True, file=sys.stderr)
        return start

    async def run(self) -> None:
        """Synchronous loop: generate -> train -> end_step, one step after the other."""
        start = await self.start()
        for rollout_id in range(start, self.args.num_rollout):
            batch = await self.generate(rollout_id)
            await self.hand_gpu_to_trainer()
            metrics = await self.train(batch)
            await self.end_step(batch, metrics)
            self.bar.update()

    async def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if hasattr(self, "trainer"):
            try:  # train ranks leave their process group together; a dead rank must not hide the real error
                await self.trainer.close.remote()
            except Exception as exc:  # noqa: BLE001
                logger.warning("train ranks did not close cleanly: %s", exc)
        if hasattr(self, "engines"):
            await self.engines.shutdown()
        await close_shared_client()
        self.metrics.close()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)


async def _main(run_cls: type[Run], args: argparse.Namespace) -> None:
    run = run_cls(args)
    try:
        await run.run()
    finally:
        await run.close()


def main(argv: Sequence[str] | None = None, run_cls: type[Run] = Run) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the step log
    args = parse_args(argv)
    raise_open_file_limit(0, "slime.train")  # before the router, engines and env workers start: they inherit it
    asyncio.run(_main(run_cls, args))
    import ray

    ray.shutdown()


if __name__ == "__main__":
    main()

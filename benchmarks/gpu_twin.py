"""A GPU profile's training step, played on CPU: what one step costs, before anyone rents the GPUs.

    .venv/bin/python benchmarks/gpu_twin.py --profile h100 --steps 3      # 1/4 of a step: ~11 min on 2 cores
    .venv/bin/python benchmarks/gpu_twin.py --profile h200 --steps 2      # 1/8 of a step: ~15 min

The profile's real configuration comes from the launcher (`awm_grpo.launch.config.resolve` on a
simulated machine of 8 such GPUs, then `slime_command`): batch sizes, samples per prompt, over-sampling,
the dynamic filter, the save cadence and checkpoints kept, the turn and token budgets, the colocated
weight-sync transport. Only what a CPU cannot do is substituted, and every substitution is printed:
the policy is the CPU recipe's tiny Qwen3 (token counts are converted to Qwen3's vocabulary for the
arithmetic) trained with the torch backend in fp32; one CPU engine (serving the profile's dtype) stands
in for the 8 SGLang engines and receives every weight sync for real; and the episodes are played by the
scripted engine (`awm_grpo.loadtest.scripted_engine`: the bundled reference solutions, stretched to
`--turns` model turns; one episode in `--wrong-every` plays the wrong solution, picked by its sampling
seed) whose replies take `tokens x` the profile's per-sequence decode time (docs/gpu.md, Batch sizes per
GPU). The rest is the training path itself: `slime.train`'s loop, Ray actors, the recipe's multi-turn
rollout with the in-process AWM runtime and verifier, its reward, traces, the dynamic filter, GRPO,
checkpoints with pruning. Where this machine forces smaller numbers (episodes a step: `--scale`; the save
interval: every step, so that pruning is seen), the factor is printed.

It prints these lines (the issue's contract), then the per-step budget table, each figure marked
measured (on this machine) or arithmetic (GPU rates from docs/gpu.md, with the twin's measured volumes):

    played per trained episode: X
    weight sync bytes per parameter: Y (transport T)
    checkpoint bytes kept / one save: Z
    rollout driver CPU per episode: W ms
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

# The simulated machine of each profile: one nvidia-smi line, 8 GPUs (the profiles' full size).
MACHINES = {"h100": "81559 MiB, NVIDIA H100 80GB HBM3", "h200": "143771 MiB, NVIDIA H200"}
NUM_GPUS = 8
# docs/gpu.md, Batch sizes per GPU (arithmetic, memory-bound decode at the profile's batch): one sequence
# decodes a token every 18 ms on an H100 (64 in flight) and every 24 ms on an H200 (128 in flight).
DECODE_MS_PER_TOKEN = {"h100": 18.0, "h200": 24.0}
# docs/gpu.md: training tokens/s per GPU (fsdp, bf16, full recompute): H200 measured 7.4k, H100 assumed 6k;
# the reference and old-policy passes add about 50 %.
TRAIN_TOKENS_PER_S = {"h100": 6000.0, "h200": 7400.0}
PASSES = 1.5
QWEN3_4B_PARAMS = 4_022_468_096  # tied head counted once (docs/gpu.md, Checkpoints and disk)
# The colocated sync of Qwen3-4B measured on the lent H200 (tests/gpu/device_check.py tensor_sync, 2026-11-28):
# 8.045 GB of bf16 by CUDA IPC in 16 posts into another process, with pause, flush and the version check.
DEVICE_SYNC_S, DEVICE_SYNC_FIRST_S = 0.111, 0.346
SAVE_BYTES_PER_S = 0.57e9  # one rank writing a checkpoint on the lent H200 (docs/gpu.md, the device check)


def profile_config(profile: str, work: Path, model: str, scale: int, steps: int) -> tuple[Any, list[str]]:
    """The launcher's resolved config for 8 GPUs of `profile`, with the CPU substitutions; the lines saying what
    was substituted."""
    from awm_grpo.launch.config import parse_nvidia_smi, resolve

    gpus = parse_nvidia_smi("\n".join([MACHINES[profile]] * NUM_GPUS))
    cfg = resolve(sets={"hardware.profile": profile, "hardware.num_gpus": str(NUM_GPUS)}, env={}, gpus=gpus)
    v = cfg.values
    engines = v["hardware.rollout_num_gpus"] // v["hardware.rollout_num_gpus_per_engine"]
    gpu = {k: v[k] for k in ("training.rollout_batch_size", "training.over_sampling_batch_size",
                             "inference.sglang_server_concurrency", "training.save_interval")}
    if v["training.rollout_batch_size"] % scale or v["training.over_sampling_batch_size"] % scale:
        raise SystemExit(f"--scale {scale} must divide rollout_batch_size {v['training.rollout_batch_size']} and "
                         f"over_sampling_batch_size {v['training.over_sampling_batch_size']}")
    changes = {
        # what a CPU cannot do
        "inference.engine_type": "cpu", "training.train_backend": "torch", "training.bf16": False,
        "training.recompute_granularity": None, "hardware.colocate": False,
        "hardware.num_gpus": 0, "hardware.train_num_gpus": 1, "hardware.rollout_num_gpus": 1,
        "hardware.ray_num_cpus": 8, "hardware.ray_address": None,
        "paths.hf_checkpoint": model, "paths.ref_checkpoint": model,
        "paths.save_dir": str(work / "save"), "paths.resume_checkpoint": None,
        "paths.trace_dir": str(work / "traces"),
        "paths.splits_dir": str(work / "splits"), "environment.data_dir": None,
        "logging.tensorboard": False, "logging.wandb_enabled": False,
        # what this machine's size forces
        "training.rollout_batch_size": gpu["training.rollout_batch_size"] // scale,
        "training.over_sampling_batch_size": gpu["training.over_sampling_batch_size"] // scale,
        "training.global_batch_size": None,
        "inference.sglang_server_concurrency": gpu["inference.sglang_server_concurrency"] * engines // scale,
        "training.save_interval": 1, "training.eval_interval": None, "training.num_rollout": steps,
    }
    notes = [f"profile {profile}, {NUM_GPUS} GPUs ({engines} engines), as the launcher resolves it; substituted:"]
    for key, value in changes.items():
        if v.get(key) != value:
            notes.append(f"  {key}: {v.get(key)} -> {value}")
    v.update(changes)
    notes.append(f"  scale 1/{scale}: {gpu['training.rollout_batch_size']} prompts a step -> "
                 f"{v['training.rollout_batch_size']}; one CPU engine admits what {engines} engines would "
                 f"({gpu['inference.sglang_server_concurrency']} each) / {scale}")
    notes.append(f"  save_interval {gpu['training.save_interval']} -> 1 (every step, so that keeping the newest "
                 f"{v['training.keep_checkpoints']} is seen); no eval")
    return cfg, notes


def slime_argv(cfg: Any, work: Path, prompts: Path, turns: int) -> list[str]:
    """The launcher's slime.train flags for `cfg`, reading the scripted tasks' prompts."""
    import yaml

    from awm_grpo.launch.job import runtime_config, slime_command

    runtime = runtime_config(cfg)
    runtime["awm_max_repeated_calls"] = max(runtime.get("awm_max_repeated_calls") or 0, turns)
    runtime_yaml = work / "runtime.yaml"
    runtime_yaml.write_text(yaml.safe_dump(runtime))
    # The CPU engine computes in what the profile's SGLang engines serve, so syncs and exports move that dtype.
    cmd = slime_command(cfg, runtime_yaml)[3:] + ["--engine-dtype", cfg["inference.sglang_dtype"]]
    at = cmd.index("--prompt-data")
    cmd[at + 1] = str(prompts)
    at = cmd.index("--eval-prompt-data")
    del cmd[at: at + 3]
    return cmd


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


class Measured:
    """What the twin's steps measured (filled by `TwinRun`, read by `print_report`)."""

    driver_cpu_s = 0.0  # this process's CPU (all threads) inside the rollout function: the rollout driver
    step_cpu_s = 0.0  # ... inside the whole generate phase (+ health checks, trace writing, advantages)
    rollout_s = 0.0
    sync_s = 0.0
    sync_bytes = sync_parameters = syncs = 0
    transport = ""
    played = trained = aborted = filtered = filtered_episodes = 0
    requests = 0  # /generate requests posted: model turns, aborted episodes' included
    train_tokens = 0
    tokens: list[int] = []
    texts: list[str] = []


def twin_run_class(stack_options: dict[str, Any]) -> type:
    """`slime.train.Run` with its rollouts played by the scripted engine; everything else is the real loop."""
    import slime.train
    from awm_grpo.loadtest.harness import ScriptedStack
    from slime.train import Run

    call_rollout_fn = slime.train.call_rollout_fn

    async def timed_rollout_fn(*args: Any, **kwargs: Any) -> Any:
        """The loop's call of the rollout function, its CPU counted: the rollout driver's share of a step."""
        cpu = time.process_time()
        try:
            return await call_rollout_fn(*args, **kwargs)
        finally:
            Measured.driver_cpu_s += time.process_time() - cpu

    slime.train.call_rollout_fn = timed_rollout_fn

    class TwinRun(Run):
        async def setup(self) -> int:
            start = await super().setup()  # Ray, the CPU engine, the train actor, the first weight sync
            self.stack = ScriptedStack(**stack_options).__enter__()
            # The rollout talks to the scripted engine (through the slime router); weight syncs and health
            # checks still go to the pool's CPU engine, which serves nothing else.
            self.args.rollout_router_url = self.stack.url
            self.args.rollout_engine_urls = [self.stack.engine_url]
            return start

        async def generate(self, rollout_id: int) -> Any:
            cpu, wall = time.process_time(), time.perf_counter()
            batch = await super().generate(rollout_id)
            Measured.step_cpu_s += time.process_time() - cpu
            Measured.rollout_s += time.perf_counter() - wall
            m = batch.metrics
            Measured.played += int(m.get("rollout/episodes_played", 0))
            Measured.aborted += int(m.get("rollout/episodes_aborted", 0))
            Measured.filtered += int(m.get("rollout/groups_filtered", 0))
            Measured.filtered_episodes += int(m.get("rollout/episodes_filtered", 0))
            Measured.requests += int(m.get("rollout/generate_requests", 0))
            Measured.trained += len(batch.samples)
            lengths = [len(s.tokens) for s in batch.samples]
            if not Measured.texts:
                Measured.texts = [self.tokenizer_decode(s.tokens) for s in batch.samples[:32]]
            Measured.train_tokens += sum(lengths)
            Measured.tokens += lengths
            return batch

        def tokenizer_decode(self, tokens: list[int]) -> str:
            if not hasattr(self, "_tokenizer"):
                from transformers import AutoTokenizer

                self._tokenizer = AutoTokenizer.from_pretrained(self.args.hf_checkpoint)
            return self._tokenizer.decode(tokens)

        async def sync_weights(self, version: int) -> None:
            started = time.perf_counter()
            await super().sync_weights(version)
            if version > 0:  # the first sync (setup) is not a step's
                Measured.sync_s += time.perf_counter() - started
                report = self.engines.last_sync
                Measured.syncs += 1
                Measured.sync_bytes += int(report["bytes_sent"])
                Measured.sync_parameters = int(report["parameters"])
                Measured.transport = str(report["transport"]) + (" then disk (fallback)" if report.get("fallback")
                                                                 else "")

        async def close(self) -> None:
            if hasattr(self, "stack"):
                self.stack.stop()
            await super().close()

    return TwinRun


def model_parameters(model: str) -> int:
    """Parameters an engine loads (a tied head is not stored twice), from the model folder's safetensors."""
    from math import prod

    from safetensors import safe_open

    total = 0
    for path in Path(model).glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            total += sum(prod(f.get_slice(name).get_shape()) for name in f.keys())
    return total


def qwen_ratio(work: Path, texts: list[str], model: str) -> float:
    """Qwen3 tokens per tiny-model token on the twin's own episodes (Qwen3's real vocabulary, built locally)."""
    from transformers import AutoTokenizer

    from slime.models.tiny import build_tiny_model

    if not texts:
        return 1.0
    qwen = AutoTokenizer.from_pretrained(build_tiny_model(work / "qwen-vocab", vocab="qwen", seed=0))
    tiny = AutoTokenizer.from_pretrained(model)
    count = lambda tok: sum(len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts)  # noqa: E731
    return count(qwen) / count(tiny)


def run_twin(opts: argparse.Namespace, scale: int, work: Path) -> dict[str, Any]:
    """Build the model and inputs, run `steps` real training steps, return what they measured."""
    from awm_grpo.loadtest.harness import write_inputs
    from awm_grpo.traces import read_records
    from slime.models.tiny import build_tiny_model
    from slime.train import main as train_main

    # The CPU recipe's tiny model (a 4,096-token BPE): with Qwen3's 151,669-token vocabulary its LM head alone
    # makes a step of hundreds of thousands of tokens take an hour on 2 cores. Token counts are converted to
    # Qwen3's with a tokenizer of its real vocabulary (`qwen_ratio`).
    model = str(build_tiny_model(work / "model", seed=0))
    prompts, scripts, tasks = write_inputs(None, work / "inputs", turns=opts.turns)
    cfg, notes = profile_config(opts.profile, work, model, scale, opts.steps)
    print("\n".join(notes))
    print(f"episodes: {tasks} bundled tasks with reference solutions, stretched to {opts.turns} model turns, "
          f"{opts.think_words} words of thinking a turn, "
          f"{DECODE_MS_PER_TOKEN[opts.profile] * opts.time_scale:g} ms a generated token")
    argv = slime_argv(cfg, work, prompts, opts.turns)
    stack = {"model_dir": model, "scripts": scripts, "think_words": opts.think_words,
             "wrong_every": opts.wrong_every, "wrong_by_seed": True,
             "token_latency_ms": DECODE_MS_PER_TOKEN[opts.profile] * opts.time_scale}
    train_main(argv, run_cls=twin_run_class(stack))
    saves = sorted((work / "save").glob("iter_*"))
    ratio = qwen_ratio(work, Measured.texts, model)
    records = read_records(work / "traces")
    return {
        "steps": opts.steps, "n_samples": cfg["training.n_samples_per_prompt"], "played": Measured.played,
        "trained": Measured.trained, "aborted": Measured.aborted,
        "filtered": Measured.filtered, "filtered_episodes": Measured.filtered_episodes,
        "requests": Measured.requests,
        "driver_cpu_s": Measured.driver_cpu_s, "step_cpu_s": Measured.step_cpu_s,
        "rollout_s": Measured.rollout_s,
        "sync_s": Measured.sync_s, "sync_bytes": Measured.sync_bytes / max(Measured.syncs, 1),
        "syncs": Measured.syncs,
        "transport": Measured.transport, "params": Measured.sync_parameters or model_parameters(model),
        "ckpt_kept": sum(dir_bytes(s) for s in saves), "ckpt_one": dir_bytes(saves[-1]) if saves else 0,
        "train_tokens": Measured.train_tokens * ratio, "qwen_ratio": ratio,
        "tokens_per_episode": statistics.mean(Measured.tokens or [0]) * ratio,
        "turns_mean": statistics.mean([len(r["turns"]) for r in records] or [0]),
        "verify_s_mean": statistics.mean([r["timings"].get("verify_s", 0.0) for r in records] or [0.0]),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", choices=sorted(MACHINES), required=True)
    p.add_argument("--steps", type=int, default=3,
                   help="training steps (each plays, trains and saves; every step but the last syncs): 2 or more")
    p.add_argument("--scale", type=int, default=None,
                   help="divide the episodes of a step by this (default: 4 for h100, 8 for h200: 32 prompts, 128 "
                        "episodes trained a step, what 2 cores train in a few minutes)")
    p.add_argument("--turns", type=int, default=10, help="model turns an episode (AWM-length: about 10)")
    p.add_argument("--wrong-every", type=int, default=2,
                   help="one episode in N plays the wrong solution (2: a policy at 50%% success, where 2 x 0.5^4 = "
                        "12.5%% of groups tie and the dynamic filter drops them)")
    p.add_argument("--think-words", type=int, default=96, help="filler thinking words before every reply")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="multiply the per-token decode time (1: the profile's rate; <1 runs faster than a GPU)")
    p.add_argument("--keep", action="store_true", help="keep the work folder (printed)")
    opts = p.parse_args()
    if opts.steps < 2:
        p.error("--steps must be 2 or more: the last step does not sync its weights")
    scale = opts.scale or (4 if opts.profile == "h100" else 8)
    work = Path(tempfile.mkdtemp(prefix=f"gpu-twin-{opts.profile}-"))
    report = run_twin(opts, scale, work)
    print_report(opts, scale, report)
    if not opts.keep:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"work folder: {work}")


def print_report(opts: argparse.Namespace, scale: int, r: dict[str, Any]) -> None:
    print()
    print(f"played per trained episode: {r['played'] / r['trained']:.3f}")
    print(f"weight sync bytes per parameter: {r['sync_bytes'] / r['params']:.3f} (transport {r['transport']})")
    print(f"checkpoint bytes kept / one save: {r['ckpt_kept'] / r['ckpt_one']:.2f}")
    per_turn_ms = r["driver_cpu_s"] * 1000 / max(r["requests"], 1)
    print(f"rollout driver CPU per episode: {per_turn_ms * r['turns_mean']:.1f} ms")
    print(f"  the rollout function's CPU in this process ({r['driver_cpu_s']:.1f} s) per model turn it posted "
          f"({r['requests']}, aborted episodes' turns included: {per_turn_ms:.2f} ms) x {r['turns_mean']:.1f} turns an "
          f"episode; divided by the episodes played to their end instead (aborted ones' work on top): "
          f"{r['driver_cpu_s'] * 1000 / r['played']:.1f} ms; the whole generate phase (+ trace writing, advantages) "
          f"per turn x turns: {r['step_cpu_s'] * 1000 / max(r['requests'], 1) * r['turns_mean']:.1f} ms")
    print(f"  model turns generated per trained episode's turns: {r['requests'] / (r['trained'] * r['turns_mean']):.2f} "
          f"({r['requests']} turns posted, aborted episodes' included, for {r['trained']} trained episodes of "
          f"{r['turns_mean']:.1f}): the engines' work, which episodes played to their end understate")
    trained_groups = r["trained"] // r["n_samples"]
    print(f"  of the played: {r['trained']} trained, {r['filtered_episodes']} in groups the dynamic filter dropped "
          f"({r['filtered']} of {trained_groups + r['filtered']} finished groups), "
          f"{r['played'] - r['trained'] - r['filtered_episodes']} surplus (their group was aborted or not needed); "
          f"{r['aborted']} episodes aborted before their end")
    print()
    n = r["steps"]
    print(f"over {n} steps at scale 1/{scale}: {r['played']} episodes played to their end, {r['aborted']} aborted, "
          f"{r['trained']} trained, {r['filtered']} groups dropped by the dynamic filter; "
          f"{r['turns_mean']:.1f} model turns an episode; {r['tokens_per_episode']:.0f} Qwen3 tokens an episode "
          f"({r['qwen_ratio']:.2f} per tiny-model token)")
    # Per step of the full profile (x scale): measured on the twin, or arithmetic from GPU rates.
    gpus = NUM_GPUS
    train_tokens = r["train_tokens"] / n * scale
    train_s = train_tokens * PASSES / (TRAIN_TOKENS_PER_S[opts.profile] * gpus)
    sync_bytes_4b = r["sync_bytes"] / r["params"] * QWEN3_4B_PARAMS
    per_post = r["sync_s"] / max(r["syncs"], 1)
    save_bytes_4b = 14 * QWEN3_4B_PARAMS  # bf16 model/ + fp32 master + AdamW moments (docs/gpu.md)
    rows = [
        ("rollout", f"{r['rollout_s'] / n:.0f} s", "measured (twin: scripted decode at "
         f"{DECODE_MS_PER_TOKEN[opts.profile] * opts.time_scale:g} ms a token, AWM runtime on this machine's 2 cores)"),
        ("verify and reward", f"{r['verify_s_mean']:.2f} s an episode, inside the rollout",
         "measured (twin: bundled verifiers, sandboxed)"),
        ("train", f"{train_s:.0f} s", f"arithmetic: {train_tokens / 1e6:.2f} M tokens (measured) x {PASSES} passes / "
         f"({TRAIN_TOKENS_PER_S[opts.profile]:.0f} tokens/s x {gpus} GPUs)"),
        ("sync", f"{DEVICE_SYNC_S:.2f} s + SGLang's loader",
         f"measured on the lent H200 (tests/gpu/device_check.py tensor_sync, 2026-11-28): Qwen3-4B's "
         f"{sync_bytes_4b / 1e9:.1f} GB (the {r['sync_bytes'] / r['params']:.2f} bytes a parameter measured here) by "
         f"CUDA IPC in buckets of 512 MiB (16 posts) into an engine process that copies them ({DEVICE_SYNC_FIRST_S:.2f} s "
         f"the first time); SGLang's own weight loader, not on that machine, comes on top; here, over "
         f"{r['transport']}: {per_post * 1000:.0f} ms a sync of {r['params'] / 1e6:.1f} M parameters"),
        ("save", f"{save_bytes_4b / SAVE_BYTES_PER_S / 10:.0f} s a step ({save_bytes_4b / 1e9:.1f} GB every 10)",
         f"arithmetic: {SAVE_BYTES_PER_S / 1e9:.2f} GB/s one rank (measured on the lent H200)"),
    ]
    width = max(len(a) for a, _, _ in rows)
    print(f"per-step budget, {opts.profile} x {gpus}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}:")
    for name, figure, how in rows:
        print(f"  {name:<{width}}  {figure:<28} {how}")


if __name__ == "__main__":
    main()

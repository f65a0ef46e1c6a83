"""Rollout capacity: 64, 256 and 1,024 concurrent multi-turn episodes through the real rollout.

    .venv/bin/python benchmarks/rollout_scale.py                                  # 64, 256, 1024 episodes
    .venv/bin/python benchmarks/rollout_scale.py --episodes 1024 --latency-ms 500 --env-workers 2
    .venv/bin/python benchmarks/rollout_scale.py --data-dir DIR                   # a practice set, say
    .venv/bin/python benchmarks/rollout_scale.py --episodes 1024 --turns 10 --think-words 256 --latency-ms 2000

Drives `awm_grpo.loadtest.harness.play_step`: slime's rollout function, the slime router (own process), the
rollout with the in-process environment runtime (worker processes, verifier sandbox), the reward
and the trace files, with `awm_grpo.loadtest.scripted_engine` (own process) replaying each task's reference
solution (every 4th episode its wrong one) in place of a model. Per size it prints episodes/s, tool
calls/s, turns, episodes open at once, peak memory (PSS) and open files of every process, failures
by kind and wall time per phase; per-episode time split into engine, environment and verifier.
`--latency-ms` holds every engine reply, as a GPU busy decoding would, so all episodes stay open
together. Without --model it builds the tiny model (slime.models.tiny) in a temporary folder.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from env_throughput import pss_bytes  # benchmarks/ is the script's folder, so first on sys.path

from awm_grpo.loadtest.harness import (
    ScriptedStack,
    StepResult,
    driver_cpu_ms_per_episode,
    open_episodes,
    play_step,
    rollout_args,
    runtime_pids,
    write_inputs,
)


class Sampler(threading.Thread):
    """Samples every process's memory and open files and the open episodes, keeping the peaks."""

    def __init__(self, stack: ScriptedStack, period_s: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.stack, self.period_s = stack, period_s
        self.peak_mb: Counter = Counter()
        self.peak_files: Counter = Counter()
        self.peak_episodes = 0
        self.cpu_s: dict[int, tuple[str, float]] = {}  # pid -> (process group, latest CPU seconds)
        self.done = threading.Event()
        self.ticks: list[tuple[float, float]] = []  # (perf_counter, this thread's CPU): its share of the driver's
        self.base = {p: cpu_seconds(p) for pids in self.groups().values() for p in pids}  # CPU before the step

    def groups(self) -> dict[str, list[int]]:
        return {"rollout": [os.getpid()], **{k: [v] for k, v in self.stack.pids.items()}, **runtime_pids()}

    def own_cpu_s(self, start: float, end: float) -> float:
        """CPU this sampling thread spent between two perf_counter times: the rollout process's, not the driver's."""
        def at(when: float) -> float:
            return max((cpu for t, cpu in self.ticks if t <= when), default=0.0)

        return at(end) - at(start)

    def run(self) -> None:
        self.ticks.append((time.perf_counter(), time.thread_time()))
        while not self.done.wait(self.period_s):
            self.peak_episodes = max(self.peak_episodes, open_episodes())
            total = 0.0
            for name, pids in self.groups().items():
                self.cpu_s.update({p: (name, cpu_seconds(p) or self.cpu_s.get(p, ("", 0.0))[1]) for p in pids})
                mb = sum(pss_bytes(p) for p in pids) / 2**20
                total += mb
                self.peak_mb[name] = max(self.peak_mb[name], mb)
                self.peak_files[name] = max(self.peak_files[name], max((open_files(p) for p in pids), default=0))
            self.peak_mb["total"] = max(self.peak_mb["total"], total)
            self.ticks.append((time.perf_counter(), time.thread_time()))


def open_files(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of `pid` and its reaped children (verifier forks), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def report(n: int, result: StepResult, sampler: Sampler) -> None:
    records = result.records
    turns = [len(r["turns"]) for r in records]
    calls = sum(r["tool_calls"] for r in records)
    wall = result.phases["rollout_s"]
    print(f"\n== {n} episodes ({len(records)} traced) ==")
    print("  wall per phase  " + "  ".join(f"{k.removesuffix('_s')} {v:.1f} s" for k, v in result.phases.items()))
    print(f"  throughput      {len(records) / wall:.1f} episodes/s  {calls / wall:.1f} tool calls/s  "
          f"{sum(turns) / wall:.1f} model turns/s")
    print(f"  turns           {sum(turns)} total, {statistics.mean(turns):.2f} mean, {max(turns)} max; "
          f"{calls} tool calls")
    print(f"  open at once    {sampler.peak_episodes} episodes (peak)")
    sampling = sampler.own_cpu_s(*result.spans["rollout_s"])
    driver = driver_cpu_ms_per_episode(result.cpu["rollout_s"] - sampling, len(records))
    print(f"  driver CPU      {driver:.1f} ms/episode  {driver * len(records) / sum(turns):.2f} ms/turn "
          f"(rollout phase, all threads but this benchmark's sampler, {1000 * sampling / len(records):.1f}; "
          f"log_rollout {1000 * result.cpu['traces_s'] / len(records):.1f})")
    for key in ("generate_s", "env_s", "verify_s"):
        values = [r["timings"].get(key, 0.0) for r in records]
        print(f"  per episode     {key.removesuffix('_s'):8s} mean {statistics.mean(values):6.2f} s  "
              f"max {max(values):6.2f} s")
    print("  peak PSS (MiB)  " + "  ".join(f"{k} {v:.0f}" for k, v in sampler.peak_mb.items()))
    cpu: Counter = Counter()
    for pid, (name, seconds) in sampler.cpu_s.items():
        cpu[name] += seconds - sampler.base.get(pid, 0.0)
    print("  CPU ms/episode  " + "  ".join(f"{k} {1000 * v / len(records):.0f}" for k, v in cpu.items()))
    print("  peak open files " + "  ".join(f"{k} {v}" for k, v in sampler.peak_files.items()))
    print(f"  verdicts        {dict(Counter(r['verdict'] for r in records))}")
    print(f"  stop reasons    {dict(Counter(r['stop_reason'] for r in records))}")
    failures = result.infra_failures()
    print(f"  infra failures  {sum(failures.values())} {dict(failures) if failures else ''}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--episodes", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument("--data-dir", default=None, help="AWM data folder with reference solutions (default: bundled)")
    p.add_argument("--model", default=None, help="HF model folder whose tokenizer to use (default: the tiny model)")
    p.add_argument("--env-workers", type=int, default=2)
    p.add_argument("--latency-ms", type=float, default=0.0, help="engine time per reply")
    p.add_argument("--think-words", type=int, default=64, help="filler thinking words before every reply")
    p.add_argument("--n-samples", type=int, default=4, help="group size")
    p.add_argument("--max-response-len", type=int, default=16384,
                   help="--rollout-max-response-len (the h100/h200 profiles' 16,384)")
    p.add_argument("--turns", type=int, default=None,
                   help="stretch every episode to this many model turns with read-only calls (AWM-length: 10)")
    opts = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="rollout-scale-") as tmp:
        model = opts.model
        if model is None:
            from slime.models.tiny import build_tiny_model

            model = str(build_tiny_model(Path(tmp) / "tiny", seed=0))
        prompts, scripts, tasks = write_inputs(opts.data_dir, Path(tmp) / "inputs", turns=opts.turns)
        padding = {"max_repeated_calls": opts.turns} if opts.turns else {}
        print(f"{tasks} tasks with reference solutions; env workers {opts.env_workers}, engine latency "
              f"{opts.latency_ms:g} ms, thinking {opts.think_words} words a turn; {os.cpu_count()} CPUs")
        with ScriptedStack(model, scripts, latency_ms=opts.latency_ms, think_words=opts.think_words) as stack:
            for n in opts.episodes:
                args = rollout_args(stack, model, prompts, Path(tmp) / f"traces-{n}", episodes=n,
                                    n_samples=opts.n_samples, env_workers=opts.env_workers,
                                    max_response_len=opts.max_response_len, **padding)
                sampler = Sampler(stack)
                sampler.start()
                started = time.perf_counter()
                result = asyncio.run(play_step(args, warmup_groups=8))
                sampler.done.set()
                sampler.join()
                report(n, result, sampler)
                print(f"  total wall      {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()

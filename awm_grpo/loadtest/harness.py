"""One real rollout step of N concurrent episodes against the scripted engine: the rollout's capacity check.

    with ScriptedStack(model_dir, scripts) as stack:                  # engine process + slime router process
        args = rollout_args(stack, model_dir, prompt_file, trace_dir, episodes=1024)
        result = asyncio.run(play_step(args))                         # slime's generate_rollout, traces to disk

Everything but the model is the training path: slime's rollout function and its request semaphore,
the router (its own process), `awm_grpo.rollout.generate` with the in-process environment runtime
(worker processes, the verifier sandbox), `awm_grpo.reward`, and `awm_grpo.traces.log_rollout`
writing the step's trace file. `benchmarks/rollout_scale.py` measures it; the tests check it.
"""

from __future__ import annotations

import argparse
import json
import select
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from awm_grpo import env_client
from awm_grpo.data_prep import load_tasks, prompt_record
from awm_grpo.launch.job import PLUGINS
from awm_grpo.loadtest.scripted_engine import scripts_from_solutions
from awm_grpo.traces import log_rollout
from slime.arguments import parse_args
from slime.engine.router_process import RouterProcess
from slime.rollout.data_source import RolloutDataSource, load_prompts
from slime.rollout.sglang_rollout import GenerateState, generate_rollout


def write_inputs(data_dir: str | None, out: Path) -> tuple[Path, Path, int]:
    """(prompt file, scripts file, tasks): every task of `data_dir` with a reference solution."""
    from awm.data import bundled_data_dir
    from awm.solutions import load_solutions

    root = Path(data_dir or bundled_data_dir()).resolve()
    solutions = load_solutions(root)
    tasks = [t for t in load_tasks(root)[0] if (t.scenario, t.task_idx) in solutions]
    if not tasks:
        raise ValueError(f"{root} has no task with both a code verifier and a reference solution to replay")
    out.mkdir(parents=True, exist_ok=True)
    prompts, scripts = out / "prompts.jsonl", out / "scripts.json"
    prompts.write_text("".join(json.dumps(prompt_record(t, "train", root)) + "\n" for t in tasks))
    scripts.write_text(json.dumps(scripts_from_solutions(solutions, {(t.scenario, t.task_idx): t.task for t in tasks})))
    return prompts, scripts, len(tasks)


class ScriptedStack:
    """The scripted engine and a slime router in front of it, each its own process, as in training."""

    def __init__(self, model_dir: str | Path, scripts: str | Path, *, latency_ms: float = 0.0, think_words: int = 0,
                 wrong_every: int = 4, start_timeout_s: float = 120.0) -> None:
        self.command = [sys.executable, "-m", "awm_grpo.loadtest.scripted_engine", "--tokenizer", str(model_dir),
                        "--scripts", str(scripts), "--latency-ms", str(latency_ms), "--think-words", str(think_words),
                        "--wrong-every", str(wrong_every)]
        self.start_timeout_s = start_timeout_s
        self.engine: subprocess.Popen | None = None
        self.router = RouterProcess("slime")
        self.engine_url = self.url = ""

    def __enter__(self) -> ScriptedStack:
        try:
            self.engine = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                           start_new_session=True)
            self.engine_url = self._announced_url()
            self.url = self.router.start()
            self.router.add_worker(self.engine_url)
        except BaseException:
            self.stop()
            raise
        return self

    def _announced_url(self) -> str:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline and self.engine.poll() is None:
            if select.select([self.engine.stdout], [], [], 0.5)[0]:
                line = self.engine.stdout.readline().decode()
                if "listening on " in line:
                    return line.rsplit("listening on ", 1)[1].strip()
        err = self.engine.stderr.read1(4000).decode(errors="replace") if self.engine.poll() is not None else ""
        raise RuntimeError(f"the scripted engine did not start within {self.start_timeout_s:g} s: {err}")

    @property
    def pids(self) -> dict[str, int]:
        """Processes outside this one: the engine and the router."""
        procs = {"engine": self.engine, "router": self.router.process}
        return {name: p.pid for name, p in procs.items() if p is not None and p.poll() is None}

    def stop(self) -> None:
        self.router.shutdown()
        if self.engine is not None and self.engine.poll() is None:
            self.engine.terminate()
            try:
                self.engine.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.engine.kill()
                self.engine.wait()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def rollout_args(stack: ScriptedStack, model_dir: str | Path, prompt_file: Path, trace_dir: Path, *,
                 episodes: int, n_samples: int = 4, max_response_len: int = 8192, **awm: Any) -> argparse.Namespace:
    """slime args for one step of `episodes` episodes, all in flight at once, as the recipe's launcher sets them."""
    if episodes % n_samples:
        raise ValueError(f"episodes ({episodes}) must be a multiple of the group size n_samples ({n_samples})")
    groups = episodes // n_samples
    args = parse_args(["--hf-checkpoint", str(model_dir), "--prompt-data", str(prompt_file),
                       "--input-key", "text", "--metadata-key", "metadata", "--apply-chat-template",
                       "--rollout-batch-size", str(groups), "--over-sampling-batch-size", str(groups),
                       "--n-samples-per-prompt", str(n_samples), "--num-rollout", "1",
                       "--sglang-server-concurrency", str(episodes), "--rollout-max-response-len",
                       str(max_response_len), "--max-step-retries", "0", *PLUGINS])
    args.rollout_router_url = stack.url
    settings = {"env_workers": 2, "trace_dir": str(trace_dir), "max_turns": 15, "terminate_on_invalid_call": False,
                "tool_timeout": 30.0, "verifier_timeout": 30.0, **awm}
    for key, value in settings.items():
        setattr(args, f"awm_{key}", value)
    return args


@dataclass
class StepResult:
    """What one step did: its trace records, wall time per phase, and group-level failures."""

    records: list[dict[str, Any]]
    phases: dict[str, float]
    group_errors: list[str] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)

    def infra_failures(self) -> Counter:
        """Infrastructure failures by kind: the first words of each episode's reason, plus groups that raised."""
        kinds = Counter(" ".join(str(r["infra_error"]).split(":")[0].split()[:2]) for r in self.records
                        if r.get("infra_error"))
        kinds.update(f"group raised {e}" for e in self.group_errors)
        return kinds


async def play_step(args: argparse.Namespace, warmup_groups: int = 0) -> StepResult:
    """Run slime's rollout function for one step (after `warmup_groups` groups that start the workers and
    load the scenarios), write its traces, and close the environment runtime."""
    GenerateState.reset()
    source = RolloutDataSource(load_prompts(args, args.prompt_data, GenerateState(args).tokenizer),
                               args.n_samples_per_prompt, shuffle=True, seed=0)
    phases: dict[str, float] = {}
    errors: list[str] = []

    async def note(failures: list[BaseException]) -> None:
        errors.extend(type(e).__name__ for e in failures)

    started = time.perf_counter()
    if warmup_groups:
        batch = args.rollout_batch_size, args.over_sampling_batch_size
        args.rollout_batch_size = args.over_sampling_batch_size = warmup_groups
        try:
            await generate_rollout(args, -1, source, on_failure=note)
        finally:
            args.rollout_batch_size, args.over_sampling_batch_size = batch
        phases["warmup_s"] = time.perf_counter() - started
        started = time.perf_counter()
    out = await generate_rollout(args, 0, source, on_failure=note)
    phases["rollout_s"] = time.perf_counter() - started
    started = time.perf_counter()
    samples = [s for group in out.samples for s in group]
    metrics = log_rollout(0, args, samples)
    phases["traces_s"] = time.perf_counter() - started
    started = time.perf_counter()
    env_client.close_runtimes()
    phases["shutdown_s"] = time.perf_counter() - started
    records = [json.loads(line) for line in (Path(args.awm_trace_dir) / "rollout_000000.jsonl").read_text().splitlines()]
    return StepResult(records, phases, errors, metrics or {})


def open_episodes() -> int:
    """Episodes open right now in this process's environment runtimes (safe to read from another thread)."""
    return sum(len(rt.episodes) for rt in list(env_client._RUNTIMES.values()))  # noqa: SLF001


def runtime_pids() -> dict[str, list[int]]:
    """The environment workers and the verifier sandbox helper (with its children) of this process."""
    out: dict[str, list[int]] = {"workers": [], "sandbox": []}
    for rt in list(env_client._RUNTIMES.values()):  # noqa: SLF001
        out["workers"] += [s.proc.pid for s in rt.pool.slots if s.proc is not None and s.proc.poll() is None]
        helper = rt._sandbox.helper_pid if rt._sandbox is not None else None  # noqa: SLF001
        if helper is not None:
            out["sandbox"] += [helper, *children(helper)]
    return out


def children(pid: int) -> list[int]:
    """Direct children of `pid` (its verifier forks), from /proc."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found

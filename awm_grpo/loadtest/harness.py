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
from dataclasses import dataclass, field, replace
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
from slime.rollout.sglang_rollout import GenerateState, play_rollout


def write_inputs(data_dir: str | None, out: Path, turns: int | None = None) -> tuple[Path, Path, int]:
    """(prompt file, scripts file, tasks): every task of `data_dir` with a reference solution.

    `turns`: stretch every script to that many model turns with read-only calls (`pad_solutions`)."""
    from awm.data import bundled_data_dir
    from awm.solutions import load_solutions

    root = Path(data_dir or bundled_data_dir()).resolve()
    solutions = load_solutions(root)
    if turns is not None:
        solutions = pad_solutions(solutions, root, turns)
    tasks = [t for t in load_tasks(root)[0] if (t.scenario, t.task_idx) in solutions]
    if not tasks:
        raise ValueError(f"{root} has no task with both a code verifier and a reference solution to replay")
    out.mkdir(parents=True, exist_ok=True)
    prompts, scripts = out / "prompts.jsonl", out / "scripts.json"
    prompts.write_text("".join(json.dumps(prompt_record(t, "train", root)) + "\n" for t in tasks))
    scripts.write_text(json.dumps(scripts_from_solutions(solutions, {(t.scenario, t.task_idx): t.task for t in tasks})))
    return prompts, scripts, len(tasks)


def pad_solutions(solutions: dict[Any, Any], root: Path, turns: int) -> dict[Any, Any]:
    """Every solution (and its wrong one) played over `turns` model turns: the solution's read-only calls
    (its tools that `tool_semantics` labels "read", same arguments) again, in turn, before the final answer.

    The bundled solutions take 2-7 turns; AWM episodes of a thinking model take about 10. Reads change no
    state, so every verdict stays what it was, while each extra turn costs the rollout what a real one does:
    a generation, an environment call, a state read and an observation to tokenise. A read can repeat
    itself in a row (a solution with one read), so run these with `max_repeated_calls` >= `turns`."""
    from awm.data import AWMDataset

    from awm_grpo.recovery.progress import tool_semantics

    if turns < 3:
        raise ValueError(f"turns {turns}: a padded reference episode needs >= 3 model turns "
                         "(list_tools, a call, the answer)")
    dataset, labels, out = AWMDataset(root), {}, {}
    for key, solution in solutions.items():
        if solution.scenario not in labels:
            labels[solution.scenario] = tool_semantics(dataset.scenario(solution.scenario).full_code)[0]
        reads = [c for c in solution.calls if labels[solution.scenario].get(c["tool"]) == "read"]
        if not reads:
            raise ValueError(f"{key}: the reference solution has no read-only call to pad the episode with")

        def padded(calls: list[dict[str, Any]], n: int, reads: list[dict[str, Any]] = reads) -> list[dict[str, Any]]:
            return list(calls) + [reads[i % len(reads)] for i in range(max(n - len(calls), 0))]

        wrong = padded(solution.wrong_calls, turns - 1) if solution.wrong_calls else solution.wrong_calls
        out[key] = replace(solution, calls=padded(solution.calls, turns - 2), wrong_calls=wrong)  # + list_tools
    return out


class ScriptedStack:
    """The scripted engine and a slime router in front of it, each its own process, as in training."""

    def __init__(self, model_dir: str | Path, scripts: str | Path, *, latency_ms: float = 0.0, think_words: int = 0,
                 wrong_every: int = 4, start_timeout_s: float = 120.0, token_latency_ms: float = 0.0,
                 wrong_by_seed: bool = False) -> None:
        self.command = [sys.executable, "-m", "awm_grpo.loadtest.scripted_engine", "--tokenizer", str(model_dir),
                        "--scripts", str(scripts), "--latency-ms", str(latency_ms), "--think-words", str(think_words),
                        "--wrong-every", str(wrong_every), "--token-latency-ms", str(token_latency_ms),
                        *(["--wrong-by-seed"] if wrong_by_seed else [])]
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
    args.rollout_engine_urls = [stack.engine_url]  # where the rollout aborts the surplus and checks the load
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
    cpu: dict[str, float] = field(default_factory=dict)  # this process's CPU seconds (all threads) per phase
    spans: dict[str, tuple[float, float]] = field(default_factory=dict)  # perf_counter (start, end) per phase

    def driver_cpu_ms_per_episode(self) -> float:
        """The rollout driver's CPU per episode: `driver_cpu_ms_per_episode(cpu["rollout_s"], records)`."""
        return driver_cpu_ms_per_episode(self.cpu["rollout_s"], len(self.records))

    def infra_failures(self) -> Counter:
        """Infrastructure failures by kind: the first words of each episode's reason, plus groups that raised."""
        kinds = Counter(" ".join(str(r["infra_error"]).split(":")[0].split()[:2]) for r in self.records
                        if r.get("infra_error"))
        kinds.update(f"group raised {e}" for e in self.group_errors)
        return kinds


async def play_step(args: argparse.Namespace, warmup_groups: int = 0) -> StepResult:
    """Run slime's rollout function for one step (after `warmup_groups` groups that start the workers and
    load the scenarios), write its traces, and close the environment runtime."""
    GenerateState.clear_instances()
    source = RolloutDataSource(load_prompts(args, args.prompt_data, GenerateState(args).tokenizer),
                               args.n_samples_per_prompt, shuffle=True, seed=0)
    phases: dict[str, float] = {}
    cpu: dict[str, float] = {}
    errors: list[str] = []

    async def note(failures: list[BaseException]) -> None:
        errors.extend(type(e).__name__ for e in failures)

    started, cpu_started = time.perf_counter(), time.process_time()
    if warmup_groups:
        batch = args.rollout_batch_size, args.over_sampling_batch_size
        args.rollout_batch_size = args.over_sampling_batch_size = warmup_groups
        try:
            await play_rollout(args, -1, source, on_failure=note)
        finally:
            args.rollout_batch_size, args.over_sampling_batch_size = batch
        phases["warmup_s"], cpu["warmup_s"] = time.perf_counter() - started, time.process_time() - cpu_started
        started, cpu_started = time.perf_counter(), time.process_time()
    out = await play_rollout(args, 0, source, on_failure=note)
    phases["rollout_s"], cpu["rollout_s"] = time.perf_counter() - started, time.process_time() - cpu_started
    spans = {"rollout_s": (started, started + phases["rollout_s"])}
    started, cpu_started = time.perf_counter(), time.process_time()
    samples = [s for group in out.samples for s in group]
    metrics = log_rollout(0, args, samples)
    phases["traces_s"], cpu["traces_s"] = time.perf_counter() - started, time.process_time() - cpu_started
    started = time.perf_counter()
    env_client.close_runtimes()
    phases["shutdown_s"] = time.perf_counter() - started
    records = [json.loads(line) for line in (Path(args.awm_trace_dir) / "rollout_000000.jsonl").read_text().splitlines()]
    return StepResult(records, phases, errors, metrics or {}, cpu, spans)


def driver_cpu_ms_per_episode(cpu_s: float, episodes: int) -> float:
    """Milliseconds of the rollout driver's CPU per episode, from `time.process_time()` (this process, all
    its threads: the event loop, the state-read and tokenizer threads; not the engine, the router, the
    environment workers or the verifier sandbox, which are other processes) taken around the step's
    `generate_rollout` call, warm-up excluded, divided by the episodes it played."""
    if episodes <= 0:
        raise ValueError(f"episodes {episodes}: the step played none, so there is no CPU per episode")
    return 1000.0 * cpu_s / episodes


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

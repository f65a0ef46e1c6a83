"""Many concurrent episodes through the real rollout: router and scripted engine processes, env workers,
the verifier sandbox, the reward and the trace files (awm_grpo.loadtest.harness).

The process starts with a low soft open-file limit, as many machines do (1,024 there, for 1,024
episodes; here just above what the test process holds already, for a few dozen): the rollout, the
router and the engine must raise it themselves, or connections fail and episodes are lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from awm.solutions import load_solutions

from awm_grpo.loadtest.harness import (
    ScriptedStack,
    StepResult,
    open_episodes,
    play_step,
    rollout_args,
    write_inputs,
)


@contextlib.contextmanager
def low_open_file_limit(extra: int) -> Iterator[int]:
    """Soft RLIMIT_NOFILE = the descriptors open now + `extra` (children started meanwhile inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = len(os.listdir("/proc/self/fd")) + extra
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        yield low
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def run_step(model_dir: Path, tmp_path: Path, episodes: int, latency_ms: float) -> tuple[StepResult, int]:
    """One step of `episodes` episodes under a low open-file limit; (result, most episodes open at once)."""
    prompts, scripts, _ = write_inputs(None, tmp_path / "inputs")
    peak = [0]
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.05):
            peak[0] = max(peak[0], open_episodes())

    watcher = threading.Thread(target=watch, daemon=True)
    with low_open_file_limit(episodes // 2), ScriptedStack(model_dir, scripts, latency_ms=latency_ms) as stack:
        args = rollout_args(stack, model_dir, prompts, tmp_path / "traces", episodes=episodes, env_workers=2)
        watcher.start()
        try:
            result = asyncio.run(asyncio.wait_for(play_step(args), timeout=300))
        finally:
            done.set()
            watcher.join()
    return result, peak[0]


def check_every_episode(result: StepResult, episodes: int) -> None:
    """No infrastructure failure, and every trace is a whole episode: the solution's calls, one after
    another, then its answer, with the verdict the script must get."""
    assert dict(result.infra_failures()) == {}
    assert len(result.records) == episodes
    solutions = load_solutions()
    verdicts = set()
    for r in result.records:
        solution = solutions[(r["scenario"], r["task_idx"])]
        reference = '"list_tools"' in r["turns"][0]["assistant"]
        calls = solution.calls if reference else solution.wrong_calls
        made = [c for t in r["turns"] for c in t.get("calls", []) if c.get("name") != "list_tools"]
        assert [(c["name"], c["arguments"]) for c in made] == [(c["tool"], c["arguments"]) for c in calls], r
        assert len(r["turns"]) == len(calls) + 1 + reference and r["tool_calls"] == len(calls)
        assert r["stop_reason"] == "final_answer" and r["status"] == "completed"
        assert r["final_answer"] == (solution.final_answer if reference else solution.wrong_final_answer)
        assert r["verdict"] == ("complete" if reference else "others"), r["verifier_detail"]
        assert r["reward"] == (1.0 if reference else 0.0)
        assert all("state" in t for t in r["turns"] if t.get("calls"))
        verdicts.add(r["verdict"])
    assert verdicts == {"complete", "others"}  # the engine plays the wrong solution in every 4th episode


def test_episodes_all_open_at_once_under_a_low_open_file_limit(tiny_model_dir, tmp_path):
    result, peak = run_step(tiny_model_dir, tmp_path, episodes=32, latency_ms=200)
    check_every_episode(result, 32)
    assert peak == 32  # the engine's latency keeps every episode of the step open together
    assert result.metrics["awm/infra_failures"] == 0.0 and result.metrics["awm/episodes"] == 32.0


@pytest.mark.slow
def test_256_concurrent_episodes(tiny_model_dir, tmp_path):
    result, peak = run_step(tiny_model_dir, tmp_path, episodes=256, latency_ms=500)
    check_every_episode(result, 256)
    assert peak == 256

"""Validation that runs generated code: environment code in the runtime's workers, verifiers in the sandbox.

Environment code passes only if it loads, exposes tools, and every tool answers at least one
schema-valid call without an HTTP 5xx (or a crash or timeout). Each call starts from the
initial database (`Episode.reset`), so a DELETE probed earlier cannot make a later probe fail.
A verifier passes only if it compiles, defines `verify_*`, returns a proper verdict on the
untouched database, and that verdict is not `complete`: with nothing done and an empty answer,
no task is complete (this is the false positive upstream ships, awm-format.md section 12).
"""

from __future__ import annotations

import ast
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from awm.episode import EnvRuntime, Episode
from awm.gen.arguments import SampleValues, candidate_arguments
from awm.gen.checks import Invalid
from awm.runtime.pool import InfraError
from awm.verifier import VerifierSandbox, code_verdict


@dataclass
class EnvReport:
    """What validating one environment did: tools found, calls made, tools that never answered cleanly."""

    tools: int = 0
    calls: int = 0
    failures: list[str] = field(default_factory=list)


def _last_line(text: str) -> str:
    """The exception part of a traceback (the lines after the last indented frame line), on one line."""
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    frames = [i for i, line in enumerate(lines) if line[:1].isspace()]
    tail = lines[frames[-1] + 1:] if frames and frames[-1] + 1 < len(lines) else lines[-1:]
    return " | ".join(line.strip() for line in tail)[:400]


def write_scenario_dir(root: Path, scenario: str, tasks: list[str], db_schema: dict, sample_data: dict,
                       code: str) -> Path:
    """A one-scenario AWM data directory, exactly as the runtime will read the accepted outputs."""
    root.mkdir(parents=True, exist_ok=True)
    rows = {
        "gen_tasks": {"scenario": scenario, "tasks": tasks},
        "gen_db": {"scenario": scenario, "db_schema": db_schema, "db_path": None},
        "gen_sample": {"scenario": scenario, "tables_count": len(sample_data["tables"]),
                       "inserts_count": sum(len(t["insert_statements"]) for t in sample_data["tables"]),
                       "sample_data": sample_data},
        "gen_envs": {"scenario": scenario, "db_path": None, "full_code": code},
    }
    for stage, row in rows.items():
        (root / f"{stage}.jsonl").write_text(json.dumps(row, ensure_ascii=False) + "\n", encoding="utf-8")
    return root


async def _probe_tool(episode: Episode, tool: Any, values: SampleValues) -> tuple[int, str | None]:
    """Call one tool with each candidate until one answers below 500; (calls made, failure or None)."""
    candidates = candidate_arguments(tool, values)
    if not candidates:
        return 0, f"tool {tool.name!r}: no schema-valid arguments could be built from its input schema"
    problem, calls = "", 0
    for args in candidates:
        await episode.reset()
        obs = await episode.call(tool.name, args)
        calls += 1
        if obs.kind == "invalid_arguments":
            problem = f"rejected schema-valid arguments {args}: {obs.text[:200]}"
            continue
        if obs.status is not None and obs.status >= 500:
            problem = f"HTTP {obs.status} for arguments {json.dumps(args)}: {_last_line(obs.detail or obs.text)}"
            continue
        return calls, None
    return calls, f"tool {tool.name!r}: {problem}"


async def check_env(scenario: str, code: str, tasks: list[str], db_schema: dict, sample_data: dict, *,
                    load_timeout_s: float, call_timeout_s: float) -> EnvReport:
    """Load `code` in a private runtime and call every tool; raise `Invalid` with every failure."""
    tmp = Path(tempfile.mkdtemp(prefix="awm-gen-env-"))
    report = EnvReport()
    try:
        data = write_scenario_dir(tmp / "data", scenario, tasks, db_schema, sample_data, code)
        with EnvRuntime(data, num_workers=1, cache_dir=tmp / "cache", episode_dir=tmp,
                        load_timeout_s=load_timeout_s, call_timeout_s=call_timeout_s) as runtime:
            try:
                episode = await runtime.open(scenario)
            except InfraError as exc:
                raise Invalid([f"the environment code does not load: {_last_line(str(exc)) or exc}"]) from None
            values = SampleValues(episode.initial_db)
            report.tools = len(episode.tool_specs)
            if not report.tools:
                raise Invalid(["the FastAPI app exposes no routes: every endpoint of the spec must be a route"])
            for tool in episode.tool_specs:
                try:
                    calls, failure = await _probe_tool(episode, tool, values)
                except InfraError as exc:  # crash or timeout: the episode is gone, open a new one
                    calls, failure = 1, f"tool {tool.name!r}: {_last_line(str(exc))}"
                    try:
                        episode = await runtime.open(scenario)
                    except InfraError as again:
                        report.failures.append(failure)
                        raise Invalid([*report.failures, f"the environment stopped loading: {again}"]) from None
                report.calls += calls
                if failure:
                    report.failures.append(failure)
            await episode.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if report.failures:
        raise Invalid(report.failures)
    return report


def check_verifier_code(code: str) -> None:
    """The code parses and defines a top-level `verify_*` function (the name the runtime calls)."""
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        raise Invalid([f"the verifier does not parse: {exc.msg} at line {exc.lineno}"]) from None
    if not any(isinstance(n, ast.FunctionDef) and n.name.startswith("verify_") for n in tree.body):
        raise Invalid(["the code defines no top-level function named verify_... (verify_task_completion in "
                       "code mode, verify_task in sql mode)"])


async def check_verifier(code: str, initial_db: str, sandbox: VerifierSandbox, timeout_s: float) -> str:
    """Run the verifier on (initial, initial) with an empty answer in the sandbox; return its verdict."""
    check_verifier_code(code)
    verdict = code_verdict(await sandbox.arun(code, initial_db, initial_db, mode="code", final_answer="",
                                              timeout_s=timeout_s))
    if verdict.verdict == "timeout":
        raise Invalid([f"the verifier ran longer than {timeout_s:g} s on the initial database"])
    if verdict.verdict == "judge_error":
        raise Invalid([f"the verifier failed on the initial database: {_last_line(verdict.detail)}"])
    if verdict.verdict == "complete":
        raise Invalid(["the verifier says 'complete' on the untouched initial database with an empty answer: "
                       "check the change the task asks for (compare initial and final rows) or the value in "
                       "final_answer, never only that a row exists"])
    return verdict.verdict


async def check_sql_verifier(code: str, initial_db: str, sandbox: VerifierSandbox, timeout_s: float) -> dict:
    """Sql mode: `verify_task` must run on (initial, initial) and return a JSON object of evidence.

    There is no verdict to check here: the judge draws it later from the evidence and the trajectory.
    """
    check_verifier_code(code)
    run = await sandbox.arun(code, initial_db, initial_db, mode="sql", timeout_s=timeout_s)
    if run.status == "timeout":
        raise Invalid([f"verify_task ran longer than {timeout_s:g} s on the initial database"])
    if run.status != "ok":
        raise Invalid([f"verify_task failed on the initial database: {_last_line(run.detail)}"])
    if not isinstance(run.value, dict):
        raise Invalid([f"verify_task returned {run.value_type or type(run.value).__name__}; it must return a dict "
                       "of evidence"])
    return run.value

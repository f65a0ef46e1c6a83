"""The per-scenario stages (task, db, sample, spec, env, verifier): which records to make, how to ask, how to check.

Every stage reads the accepted records of earlier stages from the output directory, so stages
can be run one at a time, in separate processes, or all together, and a rerun only does what
is missing. A scenario whose input is missing (rejected earlier, or not generated yet) is
counted as blocked, never guessed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from awm.data import normalize_scenario_name
from awm.database import build_db
from awm.gen import prompts
from awm.gen.checks import check_sample, check_schema, check_spec, check_tasks
from awm.gen.config import REJECTS_FILE, TASKS_PER_SCENARIO
from awm.gen.execution import check_env, check_sql_verifier, check_verifier
from awm.gen.jobs import Job, StageRun
from awm.gen.records import index_by_scenario, read_records, record_key, rejected_keys
from awm.gen.replies import ReplyError, parse_json, parse_object, parse_python

# stage -> the earlier stages whose records it reads (file of each: GenConfig.path)
NEEDS = {"task": ("scenario",), "db": ("scenario", "task"), "sample": ("task", "db"), "spec": ("task", "db"),
         "env": ("task", "db", "sample", "spec"), "verifier": ("task", "db", "sample", "env")}


def _inputs(run: StageRun) -> dict[str, dict[str, dict[str, Any]]]:
    return {s: index_by_scenario(run.cfg.path(s), "name" if s == "scenario" else "scenario")
            for s in NEEDS[run.stage]}


def _pending(run: StageRun, inputs: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """Scenarios that still need this stage's record; counts the skipped and the blocked."""
    first = NEEDS[run.stage][0]
    names = [normalize_scenario_name(s) for s in run.cfg.scenarios] or list(inputs[first])
    done = {record_key(run.stage, r) for r in read_records(run.cfg.path(run.stage))}
    if not run.cfg.retry_rejected:
        done |= rejected_keys(run.cfg.output_dir / REJECTS_FILE, run.cfg.reject_label(run.stage))
    out = []
    for name in names:
        if run.stage != "verifier" and name in done:
            run.stats.skipped += 1
        elif not all(name in inputs[s] for s in NEEDS[run.stage]):
            run.stats.blocked += 1
        else:
            out.append(name)
    return out


def _job(key: str, prompt: str, accept: Callable[[str], Awaitable[list[dict[str, Any]]]]) -> Job:
    return Job(key=key, messages=prompts.messages(prompt), accept=accept)


async def task_jobs(run: StageRun) -> list[Job]:
    inputs = _inputs(run)

    def make(name: str) -> Job:
        async def accept(text: str) -> list[dict[str, Any]]:
            return [{"scenario": name, "tasks": check_tasks(parse_json(text), TASKS_PER_SCENARIO)}]
        description = str(inputs["scenario"][name].get("description", ""))
        return _job(name, prompts.task_prompt(name, description, TASKS_PER_SCENARIO), accept)

    return [make(n) for n in _pending(run, inputs)]


async def db_jobs(run: StageRun) -> list[Job]:
    inputs = _inputs(run)

    def make(name: str) -> Job:
        async def accept(text: str) -> list[dict[str, Any]]:
            schema = await asyncio.to_thread(check_schema, parse_object(text, ("tables",)), name)
            return [{"scenario": name, "db_schema": schema, "db_path": None}]
        description = str(inputs["scenario"][name].get("description", ""))
        return _job(name, prompts.db_prompt(name, description, inputs["task"][name]["tasks"]), accept)

    return [make(n) for n in _pending(run, inputs)]


async def sample_jobs(run: StageRun) -> list[Job]:
    inputs = _inputs(run)

    def make(name: str) -> Job:
        schema = inputs["db"][name]["db_schema"]

        async def accept(text: str) -> list[dict[str, Any]]:
            value = parse_object(text, ("tables",))
            sample, dropped = await asyncio.to_thread(check_sample, value, schema,
                                                      run.cfg.insert_failure_threshold, name)
            run.stats.dropped_inserts += dropped
            inserts = sum(len(t["insert_statements"]) for t in sample["tables"])
            return [{"scenario": name, "tables_count": len(sample["tables"]), "inserts_count": inserts,
                     "sample_data": sample}]
        return _job(name, prompts.sample_prompt(name, inputs["task"][name]["tasks"], schema), accept)

    return [make(n) for n in _pending(run, inputs)]


async def spec_jobs(run: StageRun) -> list[Job]:
    inputs = _inputs(run)

    def make(name: str) -> Job:
        schema = inputs["db"][name]["db_schema"]

        async def accept(text: str) -> list[dict[str, Any]]:
            return [{"scenario": name, "api_spec": check_spec(parse_object(text, ("api_groups",)), schema)}]
        return _job(name, prompts.spec_prompt(name, inputs["task"][name]["tasks"], schema), accept)

    return [make(n) for n in _pending(run, inputs)]


async def env_jobs(run: StageRun) -> list[Job]:
    inputs = _inputs(run)
    cfg = run.cfg

    def make(name: str) -> Job:
        tasks, schema = inputs["task"][name]["tasks"], inputs["db"][name]["db_schema"]
        sample = inputs["sample"][name]["sample_data"]

        async def accept(text: str) -> list[dict[str, Any]]:
            code = parse_python(text, "full_code")
            async with run.env_gate:
                await check_env(name, code, tasks, schema, sample, load_timeout_s=cfg.load_timeout_s,
                                call_timeout_s=cfg.tool_timeout_s)
            return [{"scenario": name, "db_path": None, "full_code": code}]
        return _job(name, prompts.env_prompt(name, schema, inputs["spec"][name]["api_spec"]), accept)

    return [make(n) for n in _pending(run, inputs)]


def _verifier_code(text: str) -> str:
    """`python_code` of the JSON answer, or a bare/fenced function when the model skipped the JSON."""
    try:
        value = parse_object(text, ("python_code",))
    except ReplyError:
        return parse_python(text, "python_code")
    if not isinstance(value["python_code"], str) or not value["python_code"].strip():
        raise ReplyError("'python_code' must hold the function's source")
    return value["python_code"]


async def verifier_jobs(run: StageRun) -> list[Job]:
    inputs = _inputs(run)
    cfg = run.cfg
    done = {record_key("verifier", r) for r in read_records(cfg.path("verifier"))}
    if not cfg.retry_rejected:
        done |= rejected_keys(cfg.output_dir / REJECTS_FILE, cfg.reject_label("verifier"))
    jobs: list[Job] = []
    for name in _pending(run, inputs):
        tasks, schema = inputs["task"][name]["tasks"], inputs["db"][name]["db_schema"]
        sample = inputs["sample"][name]["sample_data"]
        todo = [i for i in range(len(tasks)) if f"{name}::{i}" not in done]
        run.stats.skipped += len(tasks) - len(todo)
        if not todo:
            continue
        db_path = cfg.output_dir / "databases" / f"{name}.db"  # the initial DB, as upstream keeps it
        await asyncio.to_thread(build_db, db_path, schema, sample, scenario=name)
        for idx in todo:
            jobs.append(_verifier_job(run, name, idx, tasks[idx], schema, sample, db_path))
    return jobs


def _verifier_job(run: StageRun, name: str, idx: int, task: str, schema: dict, sample: dict, db_path: Path) -> Job:
    sql = run.cfg.verifier_mode == "sql"
    check = check_sql_verifier if sql else check_verifier

    async def accept(text: str) -> list[dict[str, Any]]:
        code = _verifier_code(text)
        await check(code, str(db_path), run.sandbox(), run.cfg.verifier_timeout_s)
        return [{"scenario": name, "task_idx": idx, "task": task,
                 "verification": {"code": code, "raw_response": text}}]
    prompt = (prompts.sql_verifier_prompt if sql else prompts.verifier_prompt)(name, idx, task, schema, sample)
    return _job(f"{name}::{idx}", prompt, accept)


STAGE_JOBS: dict[str, Callable[[StageRun], Awaitable[list[Job]]]] = {
    "task": task_jobs, "db": db_jobs, "sample": sample_jobs, "spec": spec_jobs, "env": env_jobs,
    "verifier": verifier_jobs,
}

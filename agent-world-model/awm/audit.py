"""`awm verify audit`: run every verifier on the untouched initial DB and flag the broken ones.

A verifier that crashes, hangs, or says `complete` before the agent did anything (AWM's
known false positives: "row exists" checks on rows the sample data already has) would
hand out reward for nothing or report infrastructure failures forever. With an empty final
answer no task can be complete at reset, info-seeking ones included, so every `complete`
here is a flag. The audit file feeds `AWMDataset(exclude=...)`.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from awm.data import AWMDataset, read_jsonl
from awm.database import TemplateStore
from awm.verifier import VerifierSandbox

FLAGS = ("no_verifier", "no_database", "crash", "timeout", "complete_at_reset")


@dataclass
class AuditRow:
    """One task's audit result; `flag` is None when the verifier behaves."""

    scenario: str
    task_idx: int
    verdict: str
    flag: str | None
    detail: str = ""


async def audit(dataset: AWMDataset, templates: TemplateStore, sandbox: VerifierSandbox, *,
                clock: str | None = None, timeout_s: float = 10.0, concurrency: int = 8,
                progress: bool = True) -> list[AuditRow]:
    """Audit every task of every scenario that has tasks (runnable environment not needed)."""
    keys = [(s, i) for s in dataset.scenario_names() for i in range(len(dataset.tasks(s)))]
    gate = asyncio.Semaphore(concurrency)
    bar = tqdm(total=len(keys), desc="audit", unit="task", disable=not progress)

    async def one(scenario: str, idx: int) -> AuditRow:
        async with gate:
            try:
                row = dataset.verifier(scenario, idx)
                if row is None or not row.code:
                    return AuditRow(scenario, idx, "judge_error", "no_verifier", "no code verifier row")
                sc = dataset.scenario(scenario)
                if sc.db_schema is None:
                    return AuditRow(scenario, idx, "judge_error", "no_database", "no gen_db row")
                db, _ = await asyncio.to_thread(templates.get_or_build, sc.name, sc.db_schema, sc.sample_data,
                                                clock=clock)
                verdict = await sandbox.averify(row.code, str(db), str(db), "", timeout_s=timeout_s)
                flag = {"judge_error": "crash", "timeout": "timeout", "complete": "complete_at_reset"}.get(
                    verdict.verdict)
                return AuditRow(scenario, idx, verdict.verdict, flag, verdict.detail[-500:] if flag else "")
            finally:
                bar.update()

    try:
        return list(await asyncio.gather(*(one(s, i) for s, i in keys)))
    finally:
        bar.close()


def write_audit(rows: list[AuditRow], path: str | os.PathLike[str]) -> None:
    Path(path).write_text("".join(json.dumps(asdict(r)) + "\n" for r in rows), encoding="utf-8")


def read_exclusions(path: str | os.PathLike[str]) -> set[tuple[str, int]]:
    """The (scenario, task_idx) pairs an audit file flags, for `AWMDataset(exclude=...)`."""
    return {(r["scenario"], int(r["task_idx"])) for r in read_jsonl(path) if r.get("flag")}

"""The retry loop every stage shares, stage bookkeeping, and the run summary.

One job = one record to produce (a scenario's tasks, a task's verifier, ...). A job asks the
model, validates the reply, and on failure asks again with the failed checks added to the
prompt, up to `retries` more times; then it writes a reject with every attempt's reasons.
An unreachable endpoint (after the client's own HTTP retries) is not a verdict on the record:
the job is left unfinished, counted, and the next run picks it up.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tqdm import tqdm

from awm.gen.checks import Invalid, summarise
from awm.gen.config import REJECTS_FILE, STAGE_ORDER, SUMMARY_FILE, GenConfig
from awm.gen.prompts import with_feedback
from awm.gen.records import JsonlWriter
from awm.gen.replies import ReplyError
from awm.llm import ChatClient, LLMError
from awm.verifier import VerifierSandbox

log = logging.getLogger(__name__)


@dataclasses.dataclass
class StageStats:
    """Counts of one stage in one run."""

    stage: str
    accepted: int = 0
    rejected: int = 0
    skipped: int = 0  # finished (accepted or rejected) in an earlier run
    blocked: int = 0  # an input record is missing: an earlier stage rejected it or has not run
    retries: int = 0  # attempts made after a failed validation
    endpoint_failures: int = 0  # no reply from the endpoint: left for the next run
    duplicates: int = 0  # scenario stage: candidates dropped as duplicates
    dropped_inserts: int = 0  # sample stage: failing INSERTs removed from accepted records


@dataclasses.dataclass
class Job:
    """One record to produce: the request, and `accept` (reply text -> records, or raise ReplyError/Invalid)."""

    key: str
    messages: list[dict[str, str]]
    accept: Callable[[str], Awaitable[list[dict[str, Any]]]]


class StageRun:
    """What the jobs of one stage share: settings, client, output writers, counters, progress bar."""

    def __init__(self, stage: str, cfg: GenConfig, client: ChatClient, sandbox: Callable[[], VerifierSandbox]) -> None:
        self.stage, self.cfg, self.client, self.sandbox = stage, cfg, client, sandbox
        self.stats = StageStats(stage)
        self.writer = JsonlWriter(cfg.path(stage))
        self.rejects = JsonlWriter(cfg.output_dir / REJECTS_FILE)
        self.env_gate = asyncio.Semaphore(cfg.env_concurrency)
        self.bar: tqdm | None = None

    def close(self) -> None:
        self.writer.close()
        self.rejects.close()
        if self.bar is not None:
            self.bar.close()

    async def run_job(self, job: Job) -> list[dict[str, Any]]:
        """Ask, validate, retry with feedback; write the records or a reject. Returns the accepted records."""
        cfg, history, reasons, text = self.cfg, [], [], ""
        try:
            for attempt in range(1, cfg.retries + 2):
                request = with_feedback(job.messages, attempt - 1, summarise(reasons)) if reasons else job.messages
                try:
                    reply = await self.client.chat(request, model=cfg.model or None, temperature=cfg.temperature,
                                                   max_tokens=cfg.max_tokens)
                except LLMError as exc:
                    self.stats.endpoint_failures += 1
                    log.error("%s %s: no reply from the endpoint, left for the next run: %s", self.stage, job.key, exc)
                    return []
                text = reply.text
                try:
                    records = await job.accept(text)
                except Invalid as exc:
                    reasons = list(exc.reasons)
                except ReplyError as exc:
                    reasons = [str(exc)]
                except (KeyError, TypeError, AttributeError, IndexError) as exc:  # JSON of an unexpected shape
                    log.debug("%s %s: reply of an unexpected shape", self.stage, job.key, exc_info=True)
                    reasons = [f"the answer does not have the requested structure ({type(exc).__name__}: {exc})"]
                else:
                    for record in records:
                        self.writer.write(record)
                    self.stats.accepted += len(records)
                    return records
                if reply.finish_reason == "length":
                    reasons.insert(0, "the reply was cut off at the token limit: write a shorter answer")
                history.append({"attempt": attempt, "reasons": reasons[:20]})
                if attempt <= cfg.retries:
                    self.stats.retries += 1
                log.info("%s %s: attempt %d rejected: %s", self.stage, job.key, attempt, reasons[0][:200])
            self.rejects.write({"stage": cfg.reject_label(self.stage), "key": job.key, "attempts": len(history), "reasons": reasons,
                                "history": history, "last_reply": text[-4000:]})
            self.stats.rejected += 1
            return []
        finally:
            if self.bar is not None:
                self.bar.update()

    def start_bar(self, total: int, unit: str = "rec") -> None:
        self.bar = tqdm(total=total, desc=f"gen {self.stage}", unit=unit, file=sys.stderr,
                        disable=not self.cfg.progress)

    async def run_jobs(self, jobs: list[Job]) -> None:
        """Run jobs with at most `concurrency` in flight, under a progress bar."""
        self.start_bar(len(jobs))
        gate = asyncio.Semaphore(self.cfg.concurrency)

        async def one(job: Job) -> None:
            async with gate:
                await self.run_job(job)

        await asyncio.gather(*(one(job) for job in jobs))


async def run_stages(cfg: GenConfig, stages: list[str] | tuple[str, ...], client: ChatClient) -> dict[str, Any]:
    """Run `stages` in pipeline order against one output directory; write and return the summary."""
    from awm.gen.scenarios import run_scenario_stage
    from awm.gen.stages import STAGE_JOBS

    unknown = [s for s in stages if s not in STAGE_ORDER]
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown}: choose from {', '.join(STAGE_ORDER)}")
    cfg.output_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    holder: list[VerifierSandbox] = []

    def sandbox() -> VerifierSandbox:
        if not holder:
            holder.append(VerifierSandbox())
        return holder[0]

    results: list[StageStats] = []
    try:
        for stage in [s for s in STAGE_ORDER if s in stages]:
            run = StageRun(stage, cfg, client, sandbox)
            try:
                if stage == "scenario":
                    await run_scenario_stage(run)
                else:
                    await run.run_jobs(await STAGE_JOBS[stage](run))
            finally:
                run.close()
            results.append(run.stats)
    finally:
        for box in holder:
            await asyncio.to_thread(box.close)
    summary = {
        "output_dir": str(cfg.output_dir),
        "stages": {s.stage: dataclasses.asdict(s) for s in results},
        "accepted": sum(s.accepted for s in results),
        "rejected": sum(s.rejected for s in results),
        "retries": sum(s.retries for s in results),
        "endpoint_failures": sum(s.endpoint_failures for s in results),
        "llm": client.meter.to_dict(),
        "elapsed_s": round(time.monotonic() - started, 2),
    }
    (cfg.output_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def format_summary(summary: dict[str, Any]) -> str:
    """A table for people: one line per stage, then totals and tokens."""
    lines = [f"{'stage':10} {'accepted':>8} {'rejected':>8} {'retries':>7} {'skipped':>7} {'blocked':>7} "
             f"{'no reply':>8}"]
    for name, s in summary["stages"].items():
        lines.append(f"{name:10} {s['accepted']:8d} {s['rejected']:8d} {s['retries']:7d} {s['skipped']:7d} "
                     f"{s['blocked']:7d} {s['endpoint_failures']:8d}")
    llm = summary["llm"]
    lines.append(f"total: {summary['accepted']} accepted, {summary['rejected']} rejected, {summary['retries']} retries; "
                 f"{llm['requests']} requests ({llm['retried_attempts']} HTTP retries), "
                 f"{llm['total_tokens']} tokens ({llm['prompt_tokens']} prompt, {llm['completion_tokens']} completion); "
                 f"{summary['elapsed_s']} s")
    return "\n".join(lines)

"""One job at a time: ask the model, validate, retry with feedback; what a stage's jobs share.

One job = one record to produce (a scenario's tasks, a task's verifier, ...). A job asks the
model, validates the reply, and on failure asks again with the failed checks added to the
prompt, up to `retries` more times; then it writes a reject with every attempt's reasons.
An unreachable endpoint (after the client's own HTTP retries) is not a verdict on the record:
the job is left unfinished, counted, and the next run picks it up. The stages (awm.gen.stages,
awm.gen.scenario_stage) build jobs; awm.gen.runner runs the stages in order.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from tqdm import tqdm

from awm.gen.checks import Invalid, summarise
from awm.gen.config import REJECTS_FILE, GenConfig
from awm.gen.prompts import with_feedback
from awm.gen.records import JsonlWriter
from awm.gen.replies import ReplyError
from awm.llm import ChatClient, LLMError
from awm.verifier import VerifierSandbox

log = logging.getLogger("awm.gen.runner")


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

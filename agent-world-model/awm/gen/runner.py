"""Runs the pipeline's stages in order against one output directory, and the run summary.

The retry loop of one job and what a stage's jobs share are in awm.gen.jobs; the stages that
build the jobs in awm.gen.stages and awm.gen.scenario_stage.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from typing import Any

from awm.gen.config import STAGE_ORDER, SUMMARY_FILE, GenConfig
from awm.gen.jobs import StageRun, StageStats
from awm.gen.scenario_stage import run_scenario_stage
from awm.gen.stages import STAGE_JOBS
from awm.llm import ChatClient
from awm.verifier import VerifierSandbox

log = logging.getLogger(__name__)


async def run_stages(cfg: GenConfig, stages: list[str] | tuple[str, ...], client: ChatClient) -> dict[str, Any]:
    """Run `stages` in pipeline order against one output directory; write and return the summary."""
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

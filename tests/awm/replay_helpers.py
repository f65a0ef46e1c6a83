"""Replay reference solutions on a practice set (families and renamed worlds share the check)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from awm.episode import EnvRuntime
from awm.solutions import Solution, replay


def replay_references(data_dir: Path, solutions: dict[tuple[str, int], Solution],
                      cache_dir: Path) -> dict[tuple[str, int], tuple[str, str, list[str]]]:
    """key -> (verdict after the reference calls, verdict on the untouched DB, tool errors of the calls)."""

    async def run_one(rt: EnvRuntime, key: tuple[str, int]) -> tuple[str, str, list[str]]:
        sol = solutions[key]
        async with await rt.open(*key) as ep:
            errors = [o.text[:200] for o in await replay(ep, sol.calls) if o.is_error]
            reference = (await ep.verify(sol.final_answer)).verdict
        async with await rt.open(*key) as ep:
            untouched = (await ep.verify(sol.final_answer)).verdict  # the right words, nothing done
        return reference, untouched, errors

    async def main() -> dict[tuple[str, int], tuple[str, str, list[str]]]:
        with EnvRuntime(data_dir, num_workers=2, cache_dir=cache_dir) as rt:
            keys = sorted(solutions)
            return dict(zip(keys, await asyncio.gather(*(run_one(rt, k) for k in keys)), strict=True))

    return asyncio.run(main())

"""Reference and wrong solutions of the bundled scenarios, and replaying them on an episode.

Each bundled task ships a reference solution (tool calls + final answer) that its verifier
must accept, and a plausible wrong one it must reject; `tool_probes.jsonl` adds calls so
that every tool is exercised. These are the runtime's own conformance fixtures.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from awm.data import bundled_data_dir, read_jsonl
from awm.episode import Episode
from awm.tools import Observation


@dataclass(frozen=True)
class Solution:
    """One task's reference (`calls`, `final_answer`) and wrong (`wrong_*`) solutions."""

    scenario: str
    task_idx: int
    task_type: str
    repair: bool
    calls: list[dict[str, Any]]
    final_answer: str | None
    wrong_calls: list[dict[str, Any]]
    wrong_final_answer: str | None
    family: str | None = None  # practice set: the task family this instance comes from (awm.scenarios.families)
    slots: dict[str, Any] | None = None  # practice set: the instance's slot values
    world: int = 0  # practice set: 0 = the real scenario, k >= 1 = its renamed world k (awm.scenarios.worlds)


def load_solutions(data_dir: str | os.PathLike[str] | None = None) -> dict[tuple[str, int], Solution]:
    path = Path(data_dir or bundled_data_dir()) / "reference_solutions.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: only the bundled scenarios and their practice set "
                                "(`python -m awm.scenarios.build --practice DIR`) ship reference solutions")
    return {(r["scenario"], r["task_idx"]): Solution(**r) for r in read_jsonl(path)}


def load_probes(data_dir: str | os.PathLike[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    path = Path(data_dir or bundled_data_dir()) / "tool_probes.jsonl"
    return {r["scenario"]: r["calls"] for r in read_jsonl(path)} if path.exists() else {}


async def replay(episode: Episode, calls: list[dict[str, Any]]) -> list[Observation]:
    """Run `calls` ({"tool", "arguments"}) in order on `episode`."""
    return [await episode.call(c["tool"], c.get("arguments") or {}) for c in calls]

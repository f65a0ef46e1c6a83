"""Tool-call sequences to replay on an episode: reference and wrong solutions, recorded episodes.

Each bundled task ships a reference solution (tool calls + final answer) that its verifier
must accept, and a plausible wrong one it must reject; `tool_probes.jsonl` adds calls so
that every tool is exercised. These are the runtime's own conformance fixtures. Recorded
episodes (`read_episodes`) are the calls of any policy's episodes, read from trace files.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
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


EPISODE_FILES = ("trace JSONL of recorded episodes of any policy: <SAVE_DIR>/traces/rollout_*.jsonl or "
                 "eval_*.jsonl written by training, or the file of `python -m awm_grpo.eval --out FILE`")
_CATALOGUE = "list_tools"  # the meta tool that lists the catalogue: nothing to replay


class EpisodeFormatError(ValueError):
    """A line of an episodes file is not an episode record; the message names the file and line."""

    def __init__(self, where: str, problem: str, advice: str | None = None) -> None:
        super().__init__(f"{where}: {problem}: {advice}" if advice else f"{where}: {problem}; --episodes takes "
                         f"{EPISODE_FILES} (live.jsonl is only the live view, without the calls)")
        self.where, self.problem = where, problem


@dataclass(frozen=True)
class RecordedEpisode:
    """The part of one trace record a replay needs: which task, and the tool calls it ran in order."""

    where: str  # file:line
    scenario: str
    task_idx: int
    calls: list[dict[str, Any]]  # {"tool", "arguments"}; catalogue and invalid calls left out
    infra_error: bool
    from_handover: bool  # it started from a damaged state of a split, not from the task's initial state
    final_answer: str | None = None


def episode_paths(path: str | Path) -> list[Path]:
    """A trace file, or a trace folder's step files (rollout_*.jsonl, eval_*.jsonl; not live.jsonl)."""
    path = Path(path)
    if not path.is_dir():
        return [path]
    found = sorted(path.glob("rollout_*.jsonl")) + sorted(path.glob("eval_*.jsonl"))
    if not found:
        raise FileNotFoundError(f"--episodes {path} is a folder without rollout_*.jsonl or eval_*.jsonl: pass "
                                f"{EPISODE_FILES}")
    return found


def read_episodes(path: str | Path) -> Iterator[RecordedEpisode]:
    """The episodes of one trace file, line by line (a training step's file can be large).

    Every non-blank line must be an episode record: a trace record (`turns` with their `calls`) or a
    plain {"scenario", "task_idx", "calls": [{"tool", "arguments"}], "final_answer"} line; anything else
    raises EpisodeFormatError naming the file and line, so that no episode is dropped unnoticed."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--episodes {path} does not exist: pass {EPISODE_FILES}")
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if line.strip():
                yield _episode(line, f"{path}:{n}")


def _episode(line: str, where: str) -> RecordedEpisode:
    def bad(problem: str) -> EpisodeFormatError:
        return EpisodeFormatError(where, problem)

    try:
        r = json.loads(line)
    except json.JSONDecodeError as exc:
        raise bad(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(r, dict):
        raise bad("not a JSON object")
    if not isinstance(r.get("scenario"), str) or not r["scenario"]:
        raise bad("no 'scenario' string: not an episode record")
    if not isinstance(r.get("task_idx"), int) or isinstance(r["task_idx"], bool):
        raise bad("no integer 'task_idx': not an episode record")
    if isinstance(r.get("calls"), list):  # a plain call list
        raw = [(None, {"name": c.get("tool"), "arguments": c.get("arguments")} if isinstance(c, dict) else c)
               for c in r["calls"]]
    elif isinstance(r.get("turns"), list):
        raw = []
        for t, turn in enumerate(r["turns"]):
            if not isinstance(turn, dict) or not isinstance(turn.get("calls", []), list):
                raise bad(f"turn {t} is not an object with a 'calls' list")
            raw += [(t, c) for c in turn.get("calls") or []]
    else:
        raise bad("no 'turns' list: not an episode record")
    calls = []
    for t, c in raw:
        at = f"turn {t}" if t is not None else "'calls'"
        if not isinstance(c, dict):
            raise bad(f"{at} has a call that is not an object")
        if "name" not in c or c.get("catalogue") or c["name"] == _CATALOGUE:
            continue  # an invalid call (never reached the environment) or the tool catalogue
        args = c.get("arguments")
        if not isinstance(c["name"], str) or not (args is None or isinstance(args, dict)):
            raise bad(f"{at} has a call without a tool name string and an arguments object")
        calls.append({"tool": c["name"], "arguments": args or {}})
    answer = r.get("final_answer")
    return RecordedEpisode(where, r["scenario"], r["task_idx"], calls, bool(r.get("infra_error")),
                           bool(r.get("handover")), answer if isinstance(answer, str) else None)

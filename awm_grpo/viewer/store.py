"""Read a run directory's trace files into what the viewer shows: runs, steps, curves, episodes, turns.

A *run* is a folder holding trace JSONL (`awm_grpo.traces`: `rollout_<step>.jsonl`,
`eval_<set>_<step>.jsonl`, or any `--out` file of `python -m awm_grpo.eval`); the root given to
`traces serve` may be one run, its `traces/` folder, or a folder of runs. A *series* is one kind of
file over steps (`rollout`, `eval <set>`, or a file's own name); an episode is named by its file
and line, so a link to it stays valid while the run appends new steps.

Everything here is read-only and stdlib: the server (awm_grpo.viewer.server) and the static
export (awm_grpo.viewer.export) both answer from these functions.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from awm.data import DataFormatError

MAX_DEPTH = 4  # how deep under the root runs are looked for (root/RUN/traces/*.jsonl is depth 2)
STEP_FILE = re.compile(r"^(?P<series>rollout|eval_(?P<set>.+))_(?P<step>\d+)\.jsonl$")


class TraceError(ValueError):
    """A run, file or episode the request names does not exist (the viewer answers 404)."""


@dataclass(frozen=True)
class TraceFile:
    """One trace JSONL: its series and step (from the name; files of `eval --out` have step None)."""

    name: str
    series: str
    step: int | None


def trace_file(name: str) -> TraceFile:
    m = STEP_FILE.match(name)
    if m is None:
        return TraceFile(name, Path(name).stem, None)
    series = "rollout" if m["series"] == "rollout" else f"eval {m['set']}"
    return TraceFile(name, series, int(m["step"]))


def _is_trace(path: Path) -> bool:
    """A JSONL whose first record is an episode (a scenario and a list of turns): not metrics, prompts, or
    the live view's short lines (their `turns` is a count)."""
    try:
        with open(path) as f:
            first = f.readline()
        record = json.loads(first)
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and "scenario" in record and isinstance(record.get("turns"), list)


def find_runs(root: Path) -> dict[str, Path]:
    """{run name: folder} for every folder under `root` holding trace files; the name is the relative path."""
    root = Path(root)
    if not root.is_dir():
        raise TraceError(f"{root} is not a folder: pass a run directory (e.g. runs/awm_grpo) or its traces/ folder")
    runs: dict[str, Path] = {}
    stack = [(root, 0)]
    while stack:
        folder, depth = stack.pop()
        try:
            entries = sorted(folder.iterdir())
        except OSError:
            continue
        if any(p.suffix == ".jsonl" and p.is_file() and _is_trace(p) for p in entries):
            runs[str(folder.relative_to(root)) if folder != root else "."] = folder
        if depth < MAX_DEPTH:
            stack += [(p, depth + 1) for p in entries if p.is_dir() and not p.name.startswith(".")]
    return dict(sorted(runs.items()))


def trace_files(run_dir: Path) -> list[TraceFile]:
    """The run's trace files, series by series in step order."""
    files = [trace_file(p.name) for p in Path(run_dir).glob("*.jsonl") if _is_trace(p)]
    return sorted(files, key=lambda f: (f.series != "rollout", f.series, f.step if f.step is not None else -1, f.name))


def outcome(record: dict[str, Any]) -> str:
    """success | failure | infra: what the filters and colours use (infra failures are not scored)."""
    if record.get("infra_error"):
        return "infra"
    return "success" if record.get("verdict") == "complete" else "failure"


def episode_row(record: dict[str, Any], file: TraceFile, line: int) -> dict[str, Any]:
    """The small per-episode line of the episode list (the full record is fetched on demand)."""
    return {"id": f"{file.name}:{line}", "file": file.name, "line": line, "series": file.series,
            "step": file.step if file.step is not None else record.get("step"),
            "scenario": record.get("scenario"), "task_idx": record.get("task_idx"),
            "task": (record.get("task") or "")[:300], "task_type": record.get("task_type") or "unlabelled",
            "verdict": record.get("verdict"), "outcome": outcome(record), "reward": record.get("reward"),
            "turns": len(record.get("turns") or []), "tool_calls": record.get("tool_calls", 0),
            "stop_reason": record.get("stop_reason"), "group_index": record.get("group_index"),
            "index": record.get("index")}


def _trace_path(run_dir: Path, name: str) -> Path:
    path = Path(run_dir) / name
    if "/" in name or not path.is_file():
        raise TraceError(f"no trace file {name!r} in {run_dir}")
    return path


def parse_record(raw: bytes, where: str) -> dict[str, Any]:
    """One trace line. orjson first (a long run's traces are GBs), json where orjson refuses what
    `json.dumps` writes (NaN, Infinity); `where` names the line in the error."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise DataFormatError(f"{where} is not valid JSON ({exc})") from None


def record_lines(path: Path) -> Iterator[bytes]:
    """The raw line of every record in a trace file (blank lines are not records)."""
    with open(path, "rb") as f:
        yield from (raw for raw in f if raw.strip())


def iter_file(path: Path) -> Iterator[dict[str, Any]]:
    """The records of one trace file, one at a time. A last line that has no newline yet and does not parse
    is a record being written (`awm_grpo.traces` writes a step's records in one buffered write of many MB): it is
    left for a later read; a broken line anywhere else is an error."""
    for i, raw in enumerate(record_lines(path)):
        try:
            yield parse_record(raw, f"{path}: episode {i}")
        except DataFormatError:
            if raw.endswith(b"\n"):
                raise


def read_file(run_dir: Path, name: str) -> list[dict[str, Any]]:
    """Every record of a trace file (one being written: its complete records, `iter_file`)."""
    return list(iter_file(_trace_path(run_dir, name)))


def curves(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """{series: [{step, episodes, success_rate, reward_mean, infra}]}: infra failures counted, not scored."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["series"], r["step"] if r["step"] is not None else 0)].append(r)
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for (series, step), group in sorted(groups.items()):
        scored = [r for r in group if r["outcome"] != "infra"]
        rewards = [r["reward"] for r in scored if r["reward"] is not None]
        out[series].append({
            "step": step, "episodes": len(group), "infra": len(group) - len(scored),
            "success_rate": sum(r["outcome"] == "success" for r in scored) / len(scored) if scored else None,
            "reward_mean": sum(rewards) / len(rewards) if rewards else None})
    return dict(out)


def facets(rows: list[dict[str, Any]]) -> dict[str, list[str]]:
    """The values the filters offer."""
    return {"scenario": sorted({str(r["scenario"]) for r in rows}),
            "task_type": sorted({str(r["task_type"]) for r in rows}),
            "outcome": [o for o in ("success", "failure", "infra") if any(r["outcome"] == o for r in rows)],
            "file": sorted({r["file"] for r in rows})}


def turn_views(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Per turn, what it did to the database, derived from the trace:

    state_hash after the turn (turns that ran a tool), whether it changed, the tables whose change
    summary (cumulative since the start DB) moved this turn, the rows the turn inserted / updated /
    deleted (only with `awm_predicates`: the progress tracker records them), Phi after it and its
    difference to the value before (Phi_0 for the first turn).
    """
    recovery = record.get("recovery") or {}
    phi = recovery.get("phi0")
    prev_hash, prev_changes = None, {}
    out = []
    for turn in record.get("turns") or []:
        view: dict[str, Any] = {"turn": turn.get("turn")}
        state = turn.get("state")
        if state is not None:
            changes = state.get("changes") or {}
            view["state_hash"] = state.get("state_hash")
            view["state_changed"] = bool(changes) if prev_hash is None else state.get("state_hash") != prev_hash
            view["tables_changed"] = sorted(t for t in set(changes) | set(prev_changes)
                                            if changes.get(t) != prev_changes.get(t))
            view["changes_since_start"] = changes
            prev_hash, prev_changes = state.get("state_hash"), changes
        progress = turn.get("progress")
        if progress is not None:
            view["phi"] = progress.get("phi")
            view["phi_b"] = progress.get("phi_b")
            view["phi_delta"] = None if phi is None or progress.get("phi") is None else progress["phi"] - phi
            view["rows"] = progress.get("rows") or {}
            phi = progress.get("phi")
        out.append(view)
    return out


def episode(run_dir: Path, name: str, line: int) -> dict[str, Any]:
    """The full record of one episode plus its per-turn database view; `step` as in the list (the file's)."""
    path, count = _trace_path(run_dir, name), 0
    for count, raw in enumerate(record_lines(path), start=1):  # only the wanted line is parsed
        if count - 1 == line:
            record = parse_record(raw, f"{path}: episode {line}")
            break
    else:
        raise TraceError(f"{name} has {count} episodes, no line {line}")
    tf = trace_file(name)
    return {"id": f"{name}:{line}", "step": tf.step if tf.step is not None else record.get("step"),
            "series": tf.series, "record": record, "turns": turn_views(record)}


def _stat(path: Path) -> tuple[int, int]:
    """What says a trace file changed: a running job appends lines (size) or rewrites it (mtime)."""
    stat = path.stat()
    return stat.st_mtime_ns, stat.st_size


class RunStore:
    """The runs under one root, with each file's episode rows cached until the file changes.

    Owned by the server app (no module state): a run that is still training appends files and
    lines; a file whose size or mtime moved is read again. A run's whole summary is kept too, until any
    of its files changes: a page reload of a 200-step run then costs no work over its 200,000 rows.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._rows: dict[Path, tuple[tuple[int, int], list[dict[str, Any]]]] = {}
        self._summaries: dict[str, tuple[tuple, dict[str, Any]]] = {}  # run -> (its files' stats, summary)
        find_runs(self.root)  # fail early on a root that is not a folder

    def runs(self) -> dict[str, Path]:
        return find_runs(self.root)

    def run_dir(self, run: str) -> Path:
        runs = self.runs()
        if run not in runs:
            raise TraceError(f"no run {run!r} under {self.root}: the runs are {sorted(runs)}")
        return runs[run]

    def _episode_rows(self, run_dir: Path, files: list[TraceFile]) -> list[dict[str, Any]]:
        """Every episode of the run's trace `files` as a list row, in file then line order."""
        rows = []
        for tf in files:
            path = run_dir / tf.name
            key = _stat(path)
            cached = self._rows.get(path)
            if cached is None or cached[0] != key:
                cached = (key, [episode_row(r, tf, i) for i, r in enumerate(read_file(run_dir, tf.name))])
                self._rows[path] = cached
            rows += cached[1]
        return rows

    def episode(self, run: str, episode_id: str) -> dict[str, Any]:
        name, _, line = episode_id.rpartition(":")
        if not name or not line.isdigit():
            raise TraceError(f"episode id {episode_id!r} is not FILE:LINE (e.g. rollout_000003.jsonl:12)")
        return episode(self.run_dir(run), name, int(line))

    def summary(self, run: str) -> dict[str, Any]:
        """What the page loads for a run: its files, curves, filter values, task texts and episode rows."""
        run_dir = self.run_dir(run)
        trace = trace_files(run_dir)  # run_dir and trace_files each read every file's first line: once a call
        stats = tuple((tf.name, *_stat(run_dir / tf.name)) for tf in trace)
        cached = self._summaries.get(run)
        if cached is not None and cached[0] == stats:
            return cached[1]
        rows = self._episode_rows(run_dir, trace)
        per_file = Counter(r["file"] for r in rows)
        files = [{"name": tf.name, "series": tf.series, "step": tf.step, "episodes": per_file[tf.name]} for tf in trace]
        # each task's text once, not once per episode: a long run has thousands of episodes per task
        tasks = {f"{r['scenario']}#{r['task_idx']}": r["task"] for r in rows}
        slim = [{k: v for k, v in r.items() if k != "task"} for r in rows]
        summary = {"run": run, "files": files, "curves": curves(rows), "facets": facets(rows), "tasks": tasks,
                   "episodes": slim}
        self._summaries[run] = (stats, summary)
        return summary

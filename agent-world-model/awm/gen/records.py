"""Append-only JSONL outputs that survive interruption, and the rejects file.

Resume rule: a key already present in a stage's output is finished and skipped; so is a key in
`rejects.jsonl` for that stage (it used all its retries), unless the run asks to retry rejects.
A run killed mid-write can leave a last line without its newline: it is cut off when the file
is opened again, so the data loader never sees a broken line.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from awm.data import normalize_scenario_name

log = logging.getLogger(__name__)


def record_key(stage: str, record: dict[str, Any]) -> str:
    """The resume key: scenario id, or `scenario::task_idx` for verifiers."""
    name = normalize_scenario_name(str(record.get("name" if stage == "scenario" else "scenario", "")))
    return f"{name}::{record['task_idx']}" if stage == "verifier" else name


def repair_tail(path: Path) -> None:
    """Cut a trailing partial line (no newline, or not JSON) left by an interrupted write."""
    if not path.exists() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    tail = data[end:]
    if tail.strip():
        log.warning("%s: dropping a partial last line (%d bytes) from an interrupted run", path, len(tail))
        with open(path, "r+b") as fh:
            fh.truncate(end)


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every complete JSON line of `path` (none if it does not exist)."""
    if not path.exists():
        return []
    out = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.endswith("\n") or not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except ValueError:
                log.warning("%s:%d: skipping a line that is not JSON", path, lineno)
    return out


class JsonlWriter:
    """Appends one record per line; each line is written whole and flushed to disk before the next."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        repair_tail(path)
        self._fh = open(path, "a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self._fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()


def index_by_scenario(path: Path, field: str = "scenario") -> dict[str, dict[str, Any]]:
    """Records of a scenario-keyed file by normalised scenario id; the last row of a key wins."""
    return {normalize_scenario_name(str(r.get(field, ""))): r for r in read_records(path) if r.get(field)}


def rejected_keys(path: Path, stage: str) -> set[str]:
    return {str(r["key"]) for r in read_records(path) if r.get("stage") == stage and "key" in r}

"""AWM-1K data files: read once, index by key, fetch one record at a time.

The release is ~500 MB of JSONL whose line order differs between files, with duplicated
verifier rows and missing pieces. We scan each file once, remember the byte span of every
record under its key (`scenario`, or `(scenario, task_idx)` for verifiers), and cache that
index on disk, so that opening an episode never re-parses a 100 MB file.

A data directory holds the standard file names (`gen_db.jsonl`, ...). Shards are accepted
too: `gen_db.<anything>.jsonl` counts as part of `gen_db` (this is how the excerpt in
`../shared/awm_1k_excerpt` is laid out), except that `gen_verifier.pure_code*.jsonl` is
its own stage.

Duplicate verifier rows (documented rule): by default the **last** row of a key whose code
parses and defines a top-level `verify_*` function wins; if none does, the last row. The
`first` rule reproduces upstream's lookup. Duplicate scenario rows: the last row wins.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

STAGES = ("gen_scenario", "gen_tasks", "gen_db", "gen_sample", "gen_spec", "gen_envs",
          "gen_verifier.pure_code", "gen_verifier")
TASK_KEYED = ("gen_verifier.pure_code", "gen_verifier")
VERIFIER_RULES = ("last_valid", "first")
INDEX_VERSION = 1


class DataFormatError(ValueError):
    """A data file is malformed; the message names the file and line."""


def normalize_scenario_name(name: str) -> str:
    """Upstream's scenario id rule: lower-case, [^a-z0-9_] -> '_', runs collapsed, stripped."""
    out = re.sub(r"[^a-z0-9_]", "_", name.lower())
    return re.sub(r"_+", "_", out).strip("_")


def default_cache_dir() -> Path:
    """Where indexes and template DBs live: $AWM_CACHE_DIR or ~/.cache/awm."""
    return Path(os.environ.get("AWM_CACHE_DIR") or Path.home() / ".cache" / "awm")


def bundled_data_dir() -> Path:
    """The embedded default: the six scenarios shipped with the package."""
    return Path(__file__).resolve().parent / "scenarios" / "data"


def stage_of(filename: str) -> str | None:
    """Map a file name to its stage, or None when it is not an AWM file."""
    if not filename.endswith(".jsonl"):
        return None
    stem = filename[: -len(".jsonl")]
    for stage in sorted(STAGES, key=len, reverse=True):  # pure_code before gen_verifier
        if stem == stage or stem.startswith(stage + "."):
            if stage == "gen_verifier" and stem.startswith("gen_verifier.pure_code"):
                continue
            return stage
    return None


@dataclass(frozen=True)
class Span:
    """Where one record lives: file, byte offset, byte length, 1-based line number."""

    path: str
    offset: int
    length: int
    line: int


@dataclass(frozen=True)
class Scenario:
    """One scenario joined across files; fields are None where the release lacks them."""

    name: str
    description: str | None
    tasks: list[str]
    db_schema: dict | None
    sample_data: dict | None
    full_code: str | None
    api_spec: dict | None = None

    @property
    def runnable(self) -> bool:
        """True when the scenario has everything an episode needs."""
        return bool(self.tasks) and self.db_schema is not None and self.full_code is not None


@dataclass(frozen=True)
class Verifier:
    """One verifier row: `mode` is 'code' (pure_code file) or 'sql'."""

    scenario: str
    task_idx: int
    task: str
    code: str | None
    mode: str
    rows_for_key: int = 1


@dataclass
class _FileIndex:
    keys: dict[str, list[Span]] = field(default_factory=dict)


def _scan(path: Path, stage: str) -> dict[str, list[Span]]:
    """Parse every line of one file once and return key -> spans (in file order)."""
    keys: dict[str, list[Span]] = {}
    key_field = "name" if stage == "gen_scenario" else "scenario"
    offset = 0
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            length = len(raw)
            if raw.strip():
                try:
                    rec = json.loads(raw)
                except json.JSONDecodeError as exc:
                    raise DataFormatError(f"{path}:{lineno}: not valid JSON ({exc.msg} at column {exc.colno})") from None
                if not isinstance(rec, dict) or not isinstance(rec.get(key_field), str):
                    raise DataFormatError(f"{path}:{lineno}: expected a JSON object with a string '{key_field}'")
                key = normalize_scenario_name(rec[key_field])
                if stage in TASK_KEYED:
                    if not isinstance(rec.get("task_idx"), int):
                        raise DataFormatError(f"{path}:{lineno}: verifier row without an integer 'task_idx'")
                    key = f"{key}::{rec['task_idx']}"
                keys.setdefault(key, []).append(Span(str(path), offset, length, lineno))
            offset += length
    return keys


def _index_file(path: Path, stage: str, cache_dir: Path) -> dict[str, list[Span]]:
    """Scan a file, or load its index from the cache when size and mtime match."""
    st = path.stat()
    tag = hashlib.sha1(f"{INDEX_VERSION}|{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    cached = cache_dir / "index" / f"{path.name}.{tag}.json"
    if cached.exists():
        try:
            raw = json.loads(cached.read_text())
            return {k: [Span(str(path), *s) for s in v] for k, v in raw.items()}
        except (OSError, ValueError, TypeError):
            log.warning("ignoring unreadable index cache %s", cached)
    keys = _scan(path, stage)
    if st.st_size > 1_000_000:  # small files scan faster than a cache round trip
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps({k: [[s.offset, s.length, s.line] for s in v] for k, v in keys.items()}))
            os.replace(tmp, cached)
        except OSError as exc:
            log.warning("could not write index cache %s: %s", cached, exc)
    return keys


def _read(span: Span) -> dict[str, Any]:
    with open(span.path, "rb") as fh:
        fh.seek(span.offset)
        return json.loads(fh.read(span.length))


def _defines_verify_function(code: Any) -> bool:
    if not isinstance(code, str) or not code.strip():
        return False
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return any(isinstance(n, ast.FunctionDef) and n.name.startswith("verify_") for n in tree.body)


class AWMDataset:
    """An AWM-1K data directory, indexed once; records are read lazily by key.

    `exclude` holds (scenario, task_idx) pairs to hide from `task_keys()` (for example the
    tasks flagged by `awm verify audit`).
    """

    def __init__(self, data_dir: str | os.PathLike[str], *, verifier_rule: str = "last_valid",
                 cache_dir: str | os.PathLike[str] | None = None,
                 exclude: Iterable[tuple[str, int]] = ()) -> None:
        self.data_dir = Path(data_dir).resolve()
        if not self.data_dir.is_dir():
            raise FileNotFoundError(f"data directory {self.data_dir} does not exist: "
                                    "run `awm data download --dest DIR` or use the bundled scenarios")
        if verifier_rule not in VERIFIER_RULES:
            raise ValueError(f"verifier_rule must be one of {VERIFIER_RULES}, got {verifier_rule!r}")
        self.verifier_rule = verifier_rule
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self.exclude = {(normalize_scenario_name(s), int(i)) for s, i in exclude}
        self._index: dict[str, _FileIndex] = {s: _FileIndex() for s in STAGES}
        self.files: dict[str, list[Path]] = {s: [] for s in STAGES}
        for path in sorted(self.data_dir.iterdir()):
            stage = stage_of(path.name)
            if stage is None or not path.is_file():
                continue
            self.files[stage].append(path)
            for key, spans in _index_file(path, stage, self.cache_dir).items():
                self._index[stage].keys.setdefault(key, []).extend(spans)
        if not any(self.files.values()):
            raise FileNotFoundError(f"{self.data_dir} holds no AWM-1K files (gen_tasks.jsonl, gen_envs.jsonl, ...)")
        self.duplicates = {s: sum(len(v) - 1 for v in ix.keys.values() if len(v) > 1)
                           for s, ix in self._index.items()}
        for stage, n in self.duplicates.items():
            if n:
                log.info("%s: %d duplicated rows (resolved by rule %r)", stage, n,
                         self.verifier_rule if stage in TASK_KEYED else "last")
        names = {key.split("::")[0] for ix in self._index.values() for key in ix.keys}
        self._names = sorted(names)
        self._get = lru_cache(maxsize=256)(self._get_uncached)

    # ---- raw access -------------------------------------------------------------------
    def _spans(self, stage: str, key: str) -> list[Span]:
        return self._index[stage].keys.get(key, [])

    def _get_uncached(self, stage: str, key: str) -> dict[str, Any] | None:
        spans = self._spans(stage, key)
        return _read(spans[-1]) if spans else None

    def has(self, stage: str, scenario: str) -> bool:
        return bool(self._spans(stage, normalize_scenario_name(scenario)))

    # ---- scenarios and tasks ----------------------------------------------------------
    def scenario_names(self, *, runnable_only: bool = False) -> list[str]:
        """Every scenario named by any file (sorted); `runnable_only` keeps complete ones."""
        if not runnable_only:
            return list(self._names)
        return [n for n in self._names if all(self.has(s, n) for s in ("gen_tasks", "gen_db", "gen_envs"))]

    def scenario(self, name: str) -> Scenario:
        """Join one scenario's records across files."""
        key = normalize_scenario_name(name)
        if key not in self._names:
            raise KeyError(f"scenario {name!r} is not in {self.data_dir}")
        sc, tasks, db, sample, envs, spec = (self._get(s, key) for s in
                                             ("gen_scenario", "gen_tasks", "gen_db", "gen_sample", "gen_envs", "gen_spec"))
        return Scenario(
            name=key,
            description=(sc or {}).get("description"),
            tasks=list((tasks or {}).get("tasks") or []),
            db_schema=(db or {}).get("db_schema"),
            sample_data=(sample or {}).get("sample_data"),
            full_code=(envs or {}).get("full_code"),
            api_spec=(spec or {}).get("api_spec"),
        )

    def tasks(self, name: str) -> list[str]:
        rec = self._get("gen_tasks", normalize_scenario_name(name))
        return list((rec or {}).get("tasks") or [])

    def task_keys(self, *, runnable_only: bool = True) -> list[tuple[str, int]]:
        """(scenario, task_idx) for every task with a code verifier, minus `exclude`."""
        out = []
        for name in self.scenario_names(runnable_only=runnable_only):
            for idx in range(len(self.tasks(name))):
                if (name, idx) not in self.exclude and self._spans("gen_verifier.pure_code", f"{name}::{idx}"):
                    out.append((name, idx))
        return out

    def verifier(self, scenario: str, task_idx: int, mode: str = "code") -> Verifier | None:
        """The verifier row of a task after duplicate resolution, or None if there is none."""
        stage = {"code": "gen_verifier.pure_code", "sql": "gen_verifier"}[mode]
        spans = self._spans(stage, f"{normalize_scenario_name(scenario)}::{int(task_idx)}")
        if not spans:
            return None
        chosen = None
        if self.verifier_rule == "first":
            chosen = _read(spans[0])
        else:
            for span in reversed(spans):
                rec = _read(span)
                if _defines_verify_function((rec.get("verification") or {}).get("code")):
                    chosen = rec
                    break
            chosen = chosen or _read(spans[-1])
        verification = chosen.get("verification") or {}
        return Verifier(scenario=normalize_scenario_name(chosen["scenario"]), task_idx=int(chosen["task_idx"]),
                        task=chosen.get("task", ""), code=verification.get("code"), mode=mode,
                        rows_for_key=len(spans))

    def summary(self) -> dict[str, Any]:
        """Counts a person wants to see after loading a directory."""
        return {
            "data_dir": str(self.data_dir),
            "scenarios": len(self.scenario_names()),
            "runnable_scenarios": len(self.scenario_names(runnable_only=True)),
            "tasks_with_code_verifier": len(self.task_keys()),
            "excluded_tasks": len(self.exclude),
            "duplicated_rows": {s: n for s, n in self.duplicates.items() if n},
            "files": {s: [p.name for p in ps] for s, ps in self.files.items() if ps},
        }


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a small JSONL file whole; malformed lines raise with file and line."""
    out = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise DataFormatError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
    return out

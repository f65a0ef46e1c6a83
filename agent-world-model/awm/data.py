"""AWM-1K data files: read once, index by key, fetch one record at a time.

The release is ~500 MB of JSONL whose line order differs between files, with duplicated
verifier rows and missing pieces. We scan each file once, remember the byte span of every
record under its key (`scenario`, or `(scenario, task_idx)` for verifiers), and cache that
index on disk, so that opening an episode never re-parses a 100 MB file.

A data directory holds the standard file names (`gen_db.jsonl`, ...). Shards are accepted
too: `gen_db.<anything>.jsonl` counts as part of `gen_db` (this is how the excerpt in
`../shared/awm_1k_excerpt` is laid out), except that `gen_verifier.pure_code*.jsonl` is
its own stage.

A verifier row's mode (code: a `verify_task_completion(initial_db_path, final_db_path,
final_answer)` returning a verdict; sql: a `verify_task(initial_db_path, final_db_path)` gathering
evidence for a judge) is read from its code, not from its file name: upstream's pipeline writes
code-mode verifiers to `gen_verifier.jsonl`, the release ships them in `gen_verifier.pure_code.jsonl`.

Every record is checked once at scan time: malformed JSON, bytes that are not UTF-8, nesting too
deep to parse, fields of the wrong type and two scenario names that normalise to the same id are
errors that name the file and line.

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
INDEX_VERSION = 3  # 3: every field's shape checked at scan time
VERIFIER_MODES = ("code", "sql")
# The shape of every field of every stage (docs: ../shared/reference/awm-format.md section 3). A type
# is that type (int: never a bool); a dict is an object whose listed keys have those shapes (other keys
# are free); a one-item list is a list whose every item has that shape. A field that is absent or null
# is "missing", not wrong: consumers count missing pieces (section 2); an item of a list is never null.
_TEXTS = [str]
FIELD_TYPES: dict[str, dict[str, Any]] = {
    "gen_scenario": {"description": str, "categories": _TEXTS, "suitability_score": (int, float),
                     "suitability_level": str, "suitability_reasoning": str, "simulatable_features": _TEXTS,
                     "non_simulatable_features": _TEXTS},
    "gen_tasks": {"tasks": _TEXTS},
    "gen_db": {"db_schema": {"tables": [{"name": str, "ddl": str, "indexes": _TEXTS, "examples": _TEXTS}]},
               "db_path": str},
    "gen_sample": {"tables_count": int, "inserts_count": int,
                   "sample_data": {"tables": [{"table_name": str, "reasoning": str, "insert_statements": _TEXTS}]}},
    "gen_spec": {"api_spec": {"api_groups": [{"group_name": str, "endpoints": [dict]}]}},
    "gen_envs": {"full_code": str, "db_path": str},
    "gen_verifier.pure_code": {"task_idx": int, "task": str, "verification": {"code": str, "raw_response": str}},
    "gen_verifier": {"task_idx": int, "task": str, "verification": {"code": str, "raw_response": str}},
}
_TYPE_NAMES = {str: "str", int: "int", float: "float", dict: "object", list: "list", bool: "bool"}
_VERIFY_DEF = re.compile(r"^(?:async\s+)?def\s+(verify_\w*)\s*\(([^)]*)\)", re.MULTILINE)


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


def verifier_mode(code: Any, default: str) -> str:
    """'code' or 'sql', from the verifier's top-level function: its name (`verify_task_completion`,
    `verify_task`), else its signature (a `final_answer` or third parameter means code mode);
    `default` (the file's mode) when the code names no verify_* function."""
    if not isinstance(code, str):
        return default
    found = _VERIFY_DEF.findall(code)
    names = {name for name, _ in found}
    if "verify_task_completion" in names:
        return "code"
    if "verify_task" in names:
        return "sql"
    for _, params in found:
        args = [p for p in params.split(",") if p.strip() and not p.strip().startswith("*")]
        return "code" if "final_answer" in params or len(args) >= 3 else "sql"
    return default


def _check_fields(path: Path, lineno: int, stage: str, rec: dict[str, Any]) -> None:
    """Every field of the record against its stage's shape (FIELD_TYPES): a wrong type anywhere is an
    error naming file:line, the field's path and what was expected (a string `tasks` would otherwise be
    split into characters, a string `tables` or a numeric `ddl` fail later naming nothing)."""
    for name, shape in FIELD_TYPES.get(stage, {}).items():
        problem = _shape_problem(rec.get(name), shape, name)
        if problem is not None:
            raise DataFormatError(f"{path}:{lineno}: {problem}")


def _shape_problem(value: Any, shape: Any, where: str, *, item: bool = False) -> str | None:
    """Why `value` does not have `shape` (see FIELD_TYPES), naming the field as `where`; None when it has."""
    if value is None:
        return f"field {where!r} is null, expected {_shape_name(shape)}" if item else None
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return f"field {where!r} is a {_type_name(value)}, expected an object"
        for key, sub in shape.items():
            problem = _shape_problem(value.get(key), sub, f"{where}.{key}")
            if problem is not None:
                return problem
        return None
    if isinstance(shape, list):
        if not isinstance(value, list):
            return f"field {where!r} is a {_type_name(value)}, expected list"
        for i, entry in enumerate(value):
            problem = _shape_problem(entry, shape[0], f"{where}[{i}]", item=True)
            if problem is not None:
                if shape[0] is str:  # the wording the data tools have always used for lists of texts
                    return f"field {where!r} must be a list of strings: {problem}"
                return problem
        return None
    types = shape if isinstance(shape, tuple) else (shape,)
    if isinstance(value, bool) and bool not in types or not isinstance(value, types):
        return f"field {where!r} is a {_type_name(value)}, expected {_shape_name(shape)}"
    return None


def _type_name(value: Any) -> str:
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def _shape_name(shape: Any) -> str:
    if isinstance(shape, dict):
        return "an object"
    if isinstance(shape, list):
        return f"a list of {_shape_name(shape[0])}"
    types = shape if isinstance(shape, tuple) else (shape,)
    return " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types)


def _scan(path: Path, stage: str) -> tuple[dict[str, list[Span]], dict[str, str]]:
    """Parse every line of one file once; return key -> spans (in file order) and id -> raw name.

    Verifier keys carry the row's mode: `scenario::task_idx::code` or `...::sql`.
    """
    keys: dict[str, list[Span]] = {}
    raw_names: dict[str, tuple[str, str]] = {}
    key_field = "name" if stage == "gen_scenario" else "scenario"
    file_mode = "code" if stage == "gen_verifier.pure_code" else "sql"
    offset = 0
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            length = len(raw)
            if raw.strip():
                rec = _parse_line(raw, path, lineno)
                if not isinstance(rec, dict) or not isinstance(rec.get(key_field), str):
                    raise DataFormatError(f"{path}:{lineno}: expected a JSON object with a string '{key_field}'")
                _check_fields(path, lineno, stage, rec)
                key = normalize_scenario_name(rec[key_field])
                _claim_name(raw_names, key, rec[key_field], f"{path}:{lineno}")
                if stage in TASK_KEYED:
                    if not isinstance(rec.get("task_idx"), int) or isinstance(rec["task_idx"], bool) \
                            or rec["task_idx"] < 0:
                        raise DataFormatError(f"{path}:{lineno}: verifier row without a non-negative integer "
                                              f"'task_idx' (got {rec.get('task_idx')!r})")
                    mode = verifier_mode((rec.get("verification") or {}).get("code"), file_mode)
                    key = f"{key}::{rec['task_idx']}::{mode}"
                keys.setdefault(key, []).append(Span(str(path), offset, length, lineno))
            offset += length
    return keys, {k: raw for k, (raw, _) in raw_names.items()}


def _parse_line(raw: bytes, path: Path, lineno: int) -> Any:
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise DataFormatError(f"{path}:{lineno}: byte {exc.object[exc.start]:#04x} at column {exc.start + 1} "
                              "is not UTF-8 (JSONL files must be UTF-8)") from None
    except json.JSONDecodeError as exc:
        raise DataFormatError(f"{path}:{lineno}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise DataFormatError(f"{path}:{lineno}: JSON nested too deeply to parse") from None


def _claim_name(raw_names: dict[str, tuple[str, str]], key: str, raw: str, where: str) -> None:
    """Remember which raw name owns id `key` (and where); a different raw name for the same id is an error."""
    owner, owner_where = raw_names.setdefault(key, (raw, where))
    if owner != raw:
        raise DataFormatError(f"{where}: scenario {raw!r} and {owner!r} ({owner_where}) both normalise to "
                              f"{key!r}: rename one of them")


def _index_file(path: Path, stage: str, cache_dir: Path) -> tuple[dict[str, list[Span]], dict[str, str]]:
    """Scan a file, or load its index (and raw names) from the cache when size and mtime match."""
    st = path.stat()
    tag = hashlib.sha1(f"{INDEX_VERSION}|{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    cached = cache_dir / "index" / f"{path.name}.{tag}.json"
    if cached.exists():
        try:
            raw = json.loads(cached.read_text())
            return {k: [Span(str(path), *s) for s in v] for k, v in raw["keys"].items()}, raw["names"]
        except (OSError, ValueError, TypeError):
            log.warning("ignoring unreadable index cache %s", cached)
    keys, names = _scan(path, stage)
    if st.st_size > 1_000_000:  # small files scan faster than a cache round trip
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps({"keys": {k: [[s.offset, s.length, s.line] for s in v] for k, v in keys.items()},
                                       "names": names}))
            os.replace(tmp, cached)
        except OSError as exc:
            log.warning("could not write index cache %s: %s", cached, exc)
    return keys, names


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
        owners: dict[str, dict[str, tuple[str, str]]] = {s: {} for s in STAGES}  # per stage: id -> raw name and file
        for path in sorted(self.data_dir.iterdir()):
            stage = stage_of(path.name)
            if stage is None or not path.is_file():
                continue
            self.files[stage].append(path)
            keys, names = _index_file(path, stage, self.cache_dir)
            for key, raw in names.items():  # shards of one stage must agree on names too
                _claim_name(owners[stage], key, raw, str(path))
            for key, spans in keys.items():
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
        # A rollout step verifies each task's episodes (1,024 a step): read and parse its row once.
        self._verifier = lru_cache(maxsize=4096)(self._verifier_uncached)

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
        """(scenario, task_idx) for every task with a code verifier (in either verifier file), minus `exclude`."""
        out = []
        for name in self.scenario_names(runnable_only=runnable_only):
            for idx in range(len(self.tasks(name))):
                if (name, idx) not in self.exclude and self._verifier_spans(name, idx, "code"):
                    out.append((name, idx))
        return out

    def _verifier_spans(self, scenario: str, task_idx: int, mode: str) -> list[Span]:
        """Rows of one task in `mode`, from both verifier files (pure_code file first, file order within)."""
        key = f"{normalize_scenario_name(scenario)}::{int(task_idx)}::{mode}"
        return [span for stage in TASK_KEYED for span in self._spans(stage, key)]

    def verifier_rows(self) -> dict[str, dict[str, int]]:
        """Verifier rows per file stage and mode, as read from their code."""
        out: dict[str, dict[str, int]] = {}
        for stage in TASK_KEYED:
            for key, spans in self._index[stage].keys.items():
                counts = out.setdefault(stage, dict.fromkeys(VERIFIER_MODES, 0))
                counts[key.rsplit("::", 1)[1]] += len(spans)
        return out

    def verifier(self, scenario: str, task_idx: int, mode: str = "code") -> Verifier | None:
        """The verifier row of a task in `mode` after duplicate resolution, or None if there is none."""
        if mode not in VERIFIER_MODES:
            raise ValueError(f"verifier mode {mode!r} is unknown: use 'code' or 'sql'")
        return self._verifier(normalize_scenario_name(scenario), int(task_idx), mode)

    def _verifier_uncached(self, scenario: str, task_idx: int, mode: str) -> Verifier | None:
        spans = self._verifier_spans(scenario, task_idx, mode)
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
            "verifier_rows_by_mode": self.verifier_rows(),
            "duplicated_rows": {s: n for s, n in self.duplicates.items() if n},
            "files": {s: [p.name for p in ps] for s, ps in self.files.items() if ps},
        }


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a small JSONL file whole; malformed lines raise with file and line."""
    out = []
    with open(path, "rb") as fh:
        for lineno, line in enumerate(fh, start=1):
            if line.strip():
                out.append(_parse_line(line, Path(path), lineno))
    return out

"""Schema-valid arguments for every tool of generated environment code.

A probe that only hits "not found" proves little, so values come from the initial database
where a parameter name matches a column (`user_id` -> a `user_id` column, or the `id` of a
`users` table; a path `/api/notes/{id}` -> the `id` of `notes`), then from the documented
example, the default, the first enum value, and finally a placeholder of the right type.
Every candidate is checked against the tool's input schema with the validator the runtime
uses, so an invalid candidate is dropped here instead of being blamed on the environment.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import jsonschema

from awm.health import probe_arguments
from awm.tools import ToolSpec

_PLACEHOLDER = {"integer": 1, "number": 1.0, "boolean": True, "string": "test"}
_FORMATS = {"date": "2025-01-15", "date-time": "2025-01-15T10:00:00", "time": "10:00:00",
            "email": "user@example.com", "uri": "https://example.com", "uuid": "00000000-0000-0000-0000-000000000001"}


class SampleValues:
    """Existing values of the initial DB: per column name, and per table its `id` values."""

    def __init__(self, db_path: str | Path, per_column: int = 5) -> None:
        self.columns: dict[str, list[Any]] = {}
        self.table_ids: dict[str, list[Any]] = {}
        conn = sqlite3.connect(f"file:{Path(db_path).resolve()}?mode=ro", uri=True)
        try:
            tables = [r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]
            for table in tables:
                cols = [c[1] for c in conn.execute(f'PRAGMA table_info("{table}")')]
                rows = conn.execute(f'SELECT * FROM "{table}" LIMIT 200').fetchall()
                for i, col in enumerate(cols):
                    seen = self.columns.setdefault(col.lower(), [])
                    for row in rows:
                        if row[i] is not None and row[i] not in seen and len(seen) < per_column:
                            seen.append(row[i])
                    if col.lower() == "id":
                        self.table_ids[table.lower()] = [row[i] for row in rows[:per_column] if row[i] is not None]
        finally:
            conn.close()

    def _table_ids(self, stem: str) -> list[Any]:
        for name in (stem, stem + "s", stem + "es", stem[:-1] + "ies" if stem.endswith("y") else stem):
            if name in self.table_ids:
                return self.table_ids[name]
        return []

    def lookup(self, name: str, path: str) -> list[Any]:
        """Values in the DB that a parameter called `name` of the route `path` plausibly refers to."""
        key = name.lower()
        if key.endswith("_id"):
            found = self._table_ids(key[:-3])
            if found:
                return found
        if key == "id" or key.endswith("_id"):
            segments = [s.lower() for s in re.split(r"[/{}]", path) if s and s != name]
            for segment in reversed(segments):
                found = self._table_ids(segment.replace("-", "_"))
                if found:
                    return found
        return self.columns.get(key, [])


def _typed(schema: dict[str, Any]) -> dict[str, Any]:
    """The non-null branch of `anyOf`/`oneOf` (Optional[...] parameters)."""
    for key in ("anyOf", "oneOf"):
        options = [s for s in schema.get(key, []) if s.get("type") != "null"]
        if options and "type" not in schema:
            return {**options[0], **{k: v for k, v in schema.items() if k not in ("anyOf", "oneOf")}}
    return schema


def _fits(value: Any, typ: str | None) -> Any:
    """`value` converted to a JSON value of `typ`, or None when it cannot be."""
    if typ == "integer" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if typ == "integer" and isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    if typ == "number" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    if typ == "string" and isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    if typ == "boolean" and value in (0, 1, True, False):
        return bool(value)
    return None


def value_for(schema: dict[str, Any], name: str = "", path: str = "", values: SampleValues | None = None,
              depth: int = 0) -> Any:
    """One value for a parameter: DB value, example, default, enum, format, placeholder (in that order)."""
    schema = _typed(schema)
    typ = schema.get("type")
    if values is not None and name and typ in _PLACEHOLDER:
        for candidate in values.lookup(name, path):
            fitted = _fits(candidate, typ)
            if fitted is not None and (not schema.get("enum") or fitted in schema["enum"]):
                return fitted
    for key in ("example", "default"):
        if schema.get(key) is not None:
            return schema[key]
    if schema.get("examples"):
        return schema["examples"][0]
    if schema.get("enum"):
        return schema["enum"][0]
    if typ == "object" or "properties" in schema:
        props = schema.get("properties", {})
        return {k: value_for(props[k], k, path, values, depth + 1) for k in schema.get("required", []) if k in props} \
            if depth < 6 else {}
    if typ == "array":
        item = value_for(schema.get("items", {}), name, path, values, depth + 1) if depth < 6 else None
        return [item] * max(1, int(schema.get("minItems", 1))) if item is not None else []
    if typ == "string" and schema.get("format") in _FORMATS:
        return _FORMATS[schema["format"]]
    if typ == "string" and schema.get("minLength", 0) > 4:
        return "t" * int(schema["minLength"])
    if typ in ("integer", "number") and "minimum" in schema:
        return schema["minimum"] if typ == "number" else int(schema["minimum"])
    return _PLACEHOLDER.get(typ or "string", "test")


def candidate_arguments(tool: ToolSpec, values: SampleValues | None) -> list[dict[str, Any]]:
    """Distinct schema-valid argument sets for `tool`, most promising first (may be empty)."""
    props = tool.input_schema.get("properties", {})
    required = [n for n in tool.input_schema.get("required", []) if n in props]
    from_db = {n: value_for(props[n], n, tool.path, values) for n in required}
    with_optional = {**from_db, **{n: value_for(s, n, tool.path, values) for n, s in props.items()
                                   if n not in from_db and values is not None and values.lookup(n, tool.path)}}
    candidates = [from_db, probe_arguments(tool), probe_arguments(tool, use_examples=False), with_optional]
    validator_cls = jsonschema.validators.validator_for(tool.input_schema, default=jsonschema.Draft202012Validator)
    validator = validator_cls(tool.input_schema)
    out, seen = [], set()
    for args in candidates:
        key = json.dumps(args, sort_keys=True, default=str)
        if key not in seen and validator.is_valid(args):
            seen.add(key)
            out.append(args)
    return out

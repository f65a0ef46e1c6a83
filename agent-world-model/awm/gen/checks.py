"""Validation of the data stages (tasks, schema, sample data, API spec), by executing what can run.

Each check returns the cleaned value or raises `Invalid` with every reason found, worded for
the retry prompt: the model sees the failing statement and SQLite's message, not a stack trace.
"""

from __future__ import annotations

import re
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

from awm.database import DatabaseBuildError, build_db

HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
_OPERATION_ID = re.compile(r"^[a-z][a-z0-9_]*$")
_INSERT_WITH_COLUMNS = re.compile(r"^\s*INSERT\s+(?:OR\s+\w+\s+)?INTO\s+[\"`\[]?[\w.]+[\"`\]]?\s*\(", re.I)
_CREATE_TABLE = re.compile(r"^\s*CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?[\"`\[]?(\w+)", re.I)


class Invalid(ValueError):
    """A generated record failed validation; `reasons` go to the retry prompt and the rejects file."""

    def __init__(self, reasons: list[str]) -> None:
        super().__init__("; ".join(reasons))
        self.reasons = reasons


def summarise(reasons: list[str], limit: int = 12, max_chars: int = 3000) -> str:
    """The reasons as a bulleted list, cut to what a retry prompt can carry."""
    lines = [f"- {r}" for r in reasons[:limit]]
    if len(reasons) > limit:
        lines.append(f"- ... and {len(reasons) - limit} more problems of the same kinds")
    text = "\n".join(lines)
    return text if len(text) <= max_chars else text[:max_chars] + "\n- ..."


def check_tasks(value: Any, wanted: int) -> list[str]:
    """`{"tasks": [...]}` with at least `wanted` distinct non-empty strings; the first `wanted` are kept."""
    tasks = value.get("tasks") if isinstance(value, dict) else value
    if not isinstance(tasks, list):
        raise Invalid(['expected {"tasks": [<task>, ...]}'])
    clean, seen = [], set()
    for task in tasks:
        if isinstance(task, dict):  # {"task": "..."} items are common; take the text
            task = task.get("task") or task.get("description")
        if isinstance(task, str) and task.strip() and task.strip().lower() not in seen:
            seen.add(task.strip().lower())
            clean.append(task.strip())
    if len(clean) < wanted:
        raise Invalid([f"got {len(clean)} distinct non-empty tasks, need {wanted}"])
    return clean[:wanted]


def _build(tables: list[dict[str, Any]], sample: dict[str, Any] | None, scenario: str) -> tuple[Any, Path, Any]:
    tmp = tempfile.TemporaryDirectory(prefix="awm-gen-db-")
    path = Path(tmp.name) / f"{scenario or 'scenario'}.db"
    try:
        report = build_db(path, {"tables": tables}, sample, scenario=scenario)
    except DatabaseBuildError as exc:
        tmp.cleanup()
        raise Invalid([str(exc)]) from None
    return report, path, tmp


def check_schema(value: Any, scenario: str = "") -> dict[str, Any]:
    """`{"tables": [{name, ddl, indexes}]}` whose every DDL and index executes and whose foreign keys resolve."""
    tables = value.get("tables") if isinstance(value, dict) else None
    if not isinstance(tables, list) or not tables:
        raise Invalid(['expected {"tables": [{"name": ..., "ddl": "CREATE TABLE ...;", "indexes": [...]}, ...]}'])
    reasons: list[str] = []
    clean, names = [], set()
    for i, table in enumerate(tables):
        ddl = table.get("ddl") if isinstance(table, dict) else None
        match = _CREATE_TABLE.match(ddl or "")
        if not match:
            reasons.append(f"table #{i + 1}: 'ddl' must be one CREATE TABLE statement")
            continue
        name = str(table.get("name") or match.group(1))
        if name.lower() != match.group(1).lower():
            reasons.append(f"table {name!r}: its DDL creates {match.group(1)!r}; name and DDL must agree")
        if name.lower() in names:
            reasons.append(f"table {name!r} is defined twice")
        names.add(name.lower())
        indexes = [s for s in table.get("indexes") or [] if isinstance(s, str) and s.strip()]
        clean.append({"name": name, "ddl": ddl.strip(), "indexes": indexes})
    if reasons:
        raise Invalid(reasons)
    report, path, tmp = _build(clean, None, scenario)
    try:
        reasons += [f"{kind} failed: {err}: {stmt[:300]}" for kind, stmt, err in report.failed]
        conn = sqlite3.connect(path)
        try:
            for table in clean:
                for fk in conn.execute(f'PRAGMA foreign_key_list("{table["name"]}")'):
                    if fk[2].lower() not in names:
                        reasons.append(f"table {table['name']!r}: foreign key references missing table {fk[2]!r}")
        finally:
            conn.close()
    finally:
        tmp.cleanup()
    if reasons:
        raise Invalid(reasons)
    return {"tables": clean}


def check_sample(value: Any, db_schema: dict[str, Any], threshold: float, scenario: str = "") -> tuple[dict, int]:
    """Sample data whose INSERTs name their columns and fail at most `threshold` of the time (foreign keys on).

    Returns the sample data without the INSERTs that failed (the runtime would skip them anyway)
    and how many were dropped.
    """
    tables = value.get("tables") if isinstance(value, dict) else None
    if not isinstance(tables, list) or not tables:
        raise Invalid(['expected {"tables": [{"table_name": ..., "reasoning": ..., "insert_statements": [...]}]}'])
    known = {t["name"].lower() for t in db_schema["tables"]}
    reasons: list[str] = []
    clean = []
    for table in tables:
        if not isinstance(table, dict) or not isinstance(table.get("insert_statements"), list):
            reasons.append("every table entry needs 'table_name' and a list 'insert_statements'")
            continue
        name = str(table.get("table_name", ""))
        if name.lower() not in known:
            reasons.append(f"table {name!r} is not in the schema (tables: {sorted(known)})")
        stmts = [s.strip() for s in table["insert_statements"] if isinstance(s, str) and s.strip()]
        for stmt in stmts:
            if not _INSERT_WITH_COLUMNS.match(stmt):
                reasons.append(f"not an INSERT that names its columns: {stmt[:200]}")
        clean.append({"table_name": name, "reasoning": str(table.get("reasoning", "")), "insert_statements": stmts})
    total = sum(len(t["insert_statements"]) for t in clean)
    if not total:
        reasons.append("no INSERT statements")
    if reasons:
        raise Invalid(reasons)
    sample = {"tables": clean}
    report, _, tmp = _build(db_schema["tables"], sample, scenario)
    tmp.cleanup()
    failed = [(stmt, err) for kind, stmt, err in report.failed if kind == "insert"]
    if report.insert_failure_ratio > threshold:
        raise Invalid([f"{len(failed)} of {total} INSERTs failed (limit {threshold:.0%}); fix them all"] +
                      [f"INSERT failed: {err}: {stmt[:300]}" for stmt, err in failed])
    bad = {stmt for stmt, _ in failed}
    for table in clean:
        table["insert_statements"] = [s for s in table["insert_statements"] if s not in bad]
    sample["tables"] = [t for t in clean if t["insert_statements"]]
    return sample, len(bad)


def check_spec(value: Any, db_schema: dict[str, Any]) -> dict[str, Any]:
    """An API spec with at least one endpoint, unique snake_case operation ids and declared path parameters."""
    groups = value.get("api_groups") if isinstance(value, dict) else None
    if not isinstance(groups, list) or not groups:
        raise Invalid(['expected {"api_groups": [{"group_name": ..., "endpoints": [...]}, ...]}'])
    known = {t["name"].lower() for t in db_schema["tables"]}
    reasons: list[str] = []
    seen: set[str] = set()
    endpoints = 0
    for group in groups:
        for ep in (group.get("endpoints") if isinstance(group, dict) else None) or []:
            endpoints += 1
            if not isinstance(ep, dict):
                reasons.append("every endpoint must be a JSON object")
                continue
            op = str(ep.get("operation_id", ""))
            label = f"endpoint {ep.get('method')} {ep.get('path')} ({op or 'no operation_id'})"
            if not _OPERATION_ID.match(op):
                reasons.append(f"{label}: operation_id must be snake_case")
            elif op in seen:
                reasons.append(f"{label}: operation_id {op!r} is used twice")
            seen.add(op)
            if str(ep.get("method", "")).upper() not in HTTP_METHODS:
                reasons.append(f"{label}: method must be one of {HTTP_METHODS}")
            path = ep.get("path")
            if not isinstance(path, str) or not path.startswith("/"):
                reasons.append(f"{label}: path must start with '/'")
                continue
            params = ep.get("request_params") or {}
            if not isinstance(params, dict):
                reasons.append(f"{label}: request_params must be an object keyed by parameter name")
                continue
            for pname, spec in params.items():
                if not isinstance(spec, dict) or spec.get("param_type") not in ("query", "path", "body"):
                    reasons.append(f"{label}: parameter {pname!r} needs param_type query, path or body")
            for pname in re.findall(r"{(\w+)}", path):
                if (params.get(pname) or {}).get("param_type") != "path":
                    reasons.append(f"{label}: path parameter {pname!r} is not declared with param_type 'path'")
            for table in ep.get("required_tables") or []:
                if str(table).lower() not in known:
                    reasons.append(f"{label}: required table {table!r} is not in the schema")
    if not endpoints:
        reasons.append("the spec has no endpoints")
    if reasons:
        raise Invalid(reasons)
    return {"api_groups": groups}

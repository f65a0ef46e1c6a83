"""Tool labels (read / create / update / delete / mixed) from what the environment code does, and task types.

A tool's label comes from the AST of its route handler (and the module-level helpers it calls),
never from words in its name: `session.add(Model(...))` is a create, `session.add(obj)` of an
existing row, `obj.col = v`, `query(...).update()` and `UPDATE` SQL are updates,
`session.delete(obj)`, `query(...).delete()` and `DELETE` SQL are deletes. ORM writes count only
when the handler (or a helper) commits: without a commit the session rolls back on close. The
route's HTTP method is a weak prior, used only when the handler shows no database access at all.
A runtime probe (did the DB state hash change after a successful call?) can confirm a label or
expose a hidden side effect; disagreements are reported, not silently resolved.

Task type: `state_mutating` when the reference solution changes the DB and progress predicates
exist; `info_seeking` when it changes nothing and there are none; otherwise `ambiguous`. Without a
reference solution: progress predicates -> state_mutating; none, with a verifier that reads the
final answer and never compares the two databases -> info_seeking; else ambiguous.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import re
import sys
import threading
from dataclasses import asdict, dataclass, field
from typing import Any

LABELS = ("read", "create", "update", "delete", "mixed")
TASK_TYPES = ("info_seeking", "state_mutating", "ambiguous")
_HTTP_PRIOR = {"get": "read", "head": "read", "post": "create", "put": "update", "patch": "update", "delete": "delete"}
_SQL_VERB = re.compile(r"^\s*(INSERT|REPLACE|UPDATE|DELETE|SELECT|WITH)\b", re.IGNORECASE)
_VERB_EFFECT = {"insert": "create", "replace": "create", "update": "update", "delete": "delete"}
_SESSION_NAMES = {"session", "db", "db_session", "sess", "s"}
_QUERY_METHODS = {"query", "filter", "filter_by", "where", "join", "order_by", "limit", "offset"}
_SQL_TABLE = re.compile(r"\b(?:FROM|JOIN|INTO|UPDATE)\s+[\"`\[]?([A-Za-z_][A-Za-z0-9_]*)", re.IGNORECASE)


@dataclass
class ToolLabel:
    """One tool's label with the evidence behind it."""

    tool: str
    method: str
    label: str
    source: str  # "code" | "http_prior"
    effects: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    commits: bool = False
    runtime_calls: int | None = None
    runtime_changed: int | None = None
    runtime_agrees: bool | None = None

    @property
    def is_write(self) -> bool:
        return self.label != "read"


def _route(node: ast.AST) -> tuple[str, str] | None:
    """(method, operation_id or function name) when `node` is an `@app.<method>(...)` handler."""
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    for dec in node.decorator_list:
        if isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute) and dec.func.attr in _HTTP_PRIOR:
            op = next((k.value.value for k in dec.keywords if k.arg == "operation_id"
                       and isinstance(k.value, ast.Constant)), node.name)
            return dec.func.attr, op
    return None


def _chain_names(node: ast.AST) -> set[str]:
    """Attribute and call names along a method chain: `s.query(X).filter(...).delete` -> {query, filter, delete}."""
    names = set()
    while True:
        if isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
            node = node.value
        else:
            return names


def _sql_text(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value for v in node.values if isinstance(v, ast.Constant))
    if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Name) and node.func.id == "text":
        return _sql_text(node.args[0])
    return None


class _Effects(ast.NodeVisitor):
    """Walk one function body and collect write effects with a line of evidence each."""

    def __init__(self, models: set[str]) -> None:
        self.models = models
        self.effects: list[tuple[str, str]] = []
        self.commits = False
        self.db_access = False
        self.new_objects: set[str] = set()
        self.called: set[str] = set()

    def visit_Assign(self, node: ast.Assign) -> None:
        value = node.value
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in self.models:
            self.new_objects.update(t.id for t in node.targets if isinstance(t, ast.Name))
        for t in node.targets:
            self._attribute_write(t, node.lineno)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._attribute_write(node.target, node.lineno)
        self.generic_visit(node)

    def _attribute_write(self, target: ast.AST, line: int) -> None:
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
            base = target.value.id
            if base not in self.new_objects and base not in ("self", "body", "payload", "data"):
                self.effects.append(("update", f"line {line}: {base}.{target.attr} = ..."))

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name):
            self.called.add(func.id)
            if func.id == "setattr" and node.args and isinstance(node.args[0], ast.Name):
                if node.args[0].id not in self.new_objects:
                    self.effects.append(("update", f"line {node.lineno}: setattr({node.args[0].id}, ...)"))
            if func.id in ("insert", "update", "delete") and node.args:
                self.effects.append((_VERB_EFFECT[func.id], f"line {node.lineno}: {func.id}(...) construct"))
        if isinstance(func, ast.Attribute):
            chain = _chain_names(func.value)
            receiver = func.value.id if isinstance(func.value, ast.Name) else None
            on_session = receiver in _SESSION_NAMES or bool(chain & _QUERY_METHODS)
            if func.attr in ("query", "get", "execute", "scalars", "scalar") and (receiver or chain):
                self.db_access = True
            if func.attr in ("commit", "flush") and receiver:
                self.commits |= func.attr == "commit"
            elif func.attr in ("add", "add_all", "merge") and receiver in _SESSION_NAMES and node.args:
                arg = node.args[0]
                new = (isinstance(arg, ast.Call) and isinstance(arg.func, ast.Name) and arg.func.id in self.models) \
                    or (isinstance(arg, ast.Name) and arg.id in self.new_objects) or func.attr == "add_all"
                self.effects.append(("create" if new else "update", f"line {node.lineno}: {receiver}.{func.attr}(...)"))
            elif func.attr == "delete" and on_session:
                self.effects.append(("delete", f"line {node.lineno}: .delete()"))
            elif func.attr == "update" and chain & _QUERY_METHODS:
                self.effects.append(("update", f"line {node.lineno}: query(...).update()"))
            elif func.attr in ("execute", "exec_driver_sql") and node.args:
                text = _sql_text(node.args[0])
                verb = _SQL_VERB.match(text or "")
                if verb and verb.group(1).lower() in _VERB_EFFECT:
                    effect = _VERB_EFFECT[verb.group(1).lower()]
                    self.effects.append((effect, f"line {node.lineno}: {verb.group(1).upper()} SQL"))
                    self.commits = True  # raw statements on a connection may autocommit: do not gate them
        self.generic_visit(node)


def _model_tables(tree: ast.Module) -> dict[str, str | None]:
    """{class: table} of the classes with a `__tablename__` (the ORM models); None if it is not a constant."""
    out: dict[str, str | None] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for s in node.body:
                if isinstance(s, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__tablename__"
                                                     for t in s.targets):
                    out[node.name] = str(s.value.value) if isinstance(s.value, ast.Constant) else None
    return out


def _models(tree: ast.Module) -> set[str]:
    """The ORM models: their construction creates a row."""
    return set(_model_tables(tree))


_PARSE_LOCK = threading.Lock()


def parse(code: str) -> ast.Module:
    """ast.parse, one thread at a time: CPython 3.11's AST-to-object conversion keeps its recursion depth
    in shared module state, and concurrent parses (the rollout opens progress trackers in threads) failed
    with "SystemError: AST constructor recursion depth mismatch"."""
    with _PARSE_LOCK:
        return ast.parse(code)


def sql_tables(sql: str) -> set[str]:
    """Lower-cased table names after FROM / JOIN / INTO / UPDATE in SQL text."""
    return {t.lower() for t in _SQL_TABLE.findall(sql)}


def handler_tables(code: str) -> dict[str, frozenset[str]]:
    """{tool: tables} each route handler (and the module helpers it calls) names: ORM models or SQL text."""
    tree = parse(code)
    models = {k: v.lower() for k, v in _model_tables(tree).items() if v is not None}
    helpers = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    out: dict[str, frozenset[str]] = {}
    for node in tree.body:
        route = _route(node)
        if route is None:
            continue
        tables: set[str] = set()
        todo, seen = [node], set()
        while todo:
            fn = todo.pop()
            if fn.name in seen:
                continue
            seen.add(fn.name)
            for sub in ast.walk(fn):
                if isinstance(sub, ast.Name):
                    if sub.id in models:
                        tables.add(models[sub.id])
                    elif sub.id in helpers and sub.id not in seen:
                        todo.append(helpers[sub.id])
                elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                    tables |= sql_tables(sub.value)
        out[route[1]] = frozenset(tables)
    return out


def label_tools(code: str) -> dict[str, ToolLabel]:
    """Label every route of one environment module from its AST (see the module docstring)."""
    tree = parse(code)
    models = _models(tree)
    helpers = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    out: dict[str, ToolLabel] = {}
    for node in tree.body:
        route = _route(node)
        if route is None:
            continue
        method, name = route
        visitor = _Effects(models)
        todo, seen = [node], set()
        while todo:  # the handler, then every module-level helper it (transitively) calls
            fn = todo.pop()
            if fn.name in seen:
                continue
            seen.add(fn.name)
            for stmt in fn.body:
                visitor.visit(stmt)
            todo += [helpers[c] for c in visitor.called if c in helpers and c not in seen and _route(helpers[c]) is None]
        effects = sorted({e for e, _ in visitor.effects}) if visitor.commits else []
        evidence = [ev for _, ev in visitor.effects][:8]
        if visitor.effects and not visitor.commits:
            evidence.append("writes without commit: rolled back when the session closes")
        if not visitor.db_access and not visitor.effects:
            label, source = _HTTP_PRIOR[method], "http_prior"
        else:
            label = "read" if not effects else effects[0] if len(effects) == 1 else "mixed"
            source = "code"
        out[name] = ToolLabel(name, method.upper(), label, source, effects, evidence, visitor.commits)
    return out


async def probe_labels(runtime: Any, scenario: str, labels: dict[str, ToolLabel],
                       calls: list[dict[str, Any]]) -> None:
    """Run `calls` on one episode and record, per tool, how many successful calls changed the DB hash."""
    ep = await runtime.open(scenario)
    try:
        for call in calls:
            before = ep.state_hash()
            obs = await ep.call(call["tool"], call.get("arguments") or {})
            lab = labels.get(call["tool"])
            if lab is None or obs.is_error:
                continue
            lab.runtime_calls = (lab.runtime_calls or 0) + 1
            lab.runtime_changed = (lab.runtime_changed or 0) + int(ep.state_hash() != before)
    finally:
        await ep.close()
    for lab in labels.values():  # a write that changed nothing (a refused request) neither confirms nor refutes
        if lab.runtime_calls:
            lab.runtime_agrees = lab.is_write if lab.runtime_changed else (None if lab.is_write else True)


def task_type(n_progress: int, reference_changed_db: bool | None, *, reads_final_answer: bool,
              compares_states: bool) -> str:
    """info_seeking / state_mutating / ambiguous from predicates and probes (module docstring)."""
    if reference_changed_db is True:
        return "state_mutating" if n_progress > 0 else "ambiguous"
    if reference_changed_db is False:
        return "info_seeking" if n_progress == 0 else "ambiguous"
    if n_progress > 0:
        return "state_mutating"
    return "info_seeking" if reads_final_answer and not compares_states else "ambiguous"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="awm semantics", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    sp = sub.add_parser("tools", help="label every tool of each scenario from its environment code")
    sp.add_argument("--data-dir", help="AWM-1K data directory (default: the bundled scenarios)")
    sp.add_argument("--scenario", action="append", help="only these scenarios (repeatable)")
    sp.add_argument("--probe", action="store_true",
                    help="confirm labels at run time with the bundled reference solutions and tool probes")
    sp.add_argument("--out", help="write one JSON line per tool here (default: stdout)")
    sp = sub.add_parser("tasks", help="count task types in a predicates JSONL (from `python -m awm.predicates build`)")
    sp.add_argument("predicates", help="predicates JSONL file")
    args = parser.parse_args(argv)
    if args.action == "tasks":
        rows = [json.loads(line) for line in open(args.predicates, encoding="utf-8") if line.strip()]
        counts: dict[str, int] = {}
        for r in rows:
            counts[r.get("task_type", "ambiguous")] = counts.get(r.get("task_type", "ambiguous"), 0) + 1
        print(json.dumps({"tasks": len(rows), "task_types": counts}, indent=1))
        return 0
    return asyncio.run(_tools_command(args))


async def _tools_command(args: argparse.Namespace) -> int:
    from awm.data import AWMDataset, bundled_data_dir
    from awm.solutions import load_probes, load_solutions

    data_dir = args.data_dir or str(bundled_data_dir())
    ds = AWMDataset(data_dir)
    names = args.scenario or [n for n in ds.scenario_names() if ds.scenario(n).full_code]
    rows = []
    runtime = None
    if args.probe:
        from awm.episode import EnvRuntime
        runtime = EnvRuntime(data_dir, dataset=ds)
    try:
        for name in names:
            code = ds.scenario(name).full_code
            if not code:
                print(f"scenario {name}: no environment code (gen_envs row); skipped", file=sys.stderr)
                continue
            labels = label_tools(code)
            if runtime is not None:
                sols = [s for k, s in load_solutions(data_dir).items() if k[0] == name]
                calls = load_probes(data_dir).get(name, []) + [c for s in sols for c in s.calls + s.wrong_calls]
                await probe_labels(runtime, name, labels, calls)
            rows += [{"scenario": name, **asdict(lab)} for lab in labels.values()]
    finally:
        if runtime is not None:
            runtime.close()
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text)
        summary: dict[str, int] = {}
        for r in rows:
            summary[r["label"]] = summary.get(r["label"], 0) + 1
        print(json.dumps({"tools": len(rows), "labels": summary}, indent=1))
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What a pure-code verifier reads and compares: static analysis (ast) plus a traced sandbox run.

Static part (the code is parsed, never executed here): the SQL string literals it holds, the
column names it compares (`row["status"] != "active"`), the literal values it compares them
with, the row counts it demands (`len(rows) != 1`), and whether it reads `final_answer` or
both databases.

Dynamic part: the verifier runs in `awm.verifier.VerifierSandbox` (its own process, resource
limits, Landlock) wrapped by a few lines that attach SQLite's trace callback to every
connection it opens. The trace gives each executed statement with its parameters already
bound (SQLite's expanded SQL), the database it ran on (initial / final / other), and the
verifier lines on the stack, which tie a statement back to the variable its rows went into.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any

from awm.verifier import VerifierSandbox

_SQL_START = re.compile(r"^\s*(SELECT|WITH)\b", re.IGNORECASE)
_TABLE_REF = re.compile(r"\b(?:FROM|JOIN)\s+\"?([A-Za-z_][A-Za-z0-9_]*)\"?", re.IGNORECASE)
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LEN_OPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}

# Wrapper placed before the verifier's code. Its name comes first, so the sandbox calls it; it
# patches sqlite3.connect inside the forked sandbox child only (the child is thrown away after).
# With `observe`, the verifier's code is rewritten (`observed_code`) to report its comparisons, truth
# tests and keyed lookups through the `_awm_*` recorders below, in one log with the statements.
_TRACE_WRAPPER = '''_awm_log = []


def _awm_summary(value, depth=0):
    kind = type(value).__name__
    if kind == "Row" and hasattr(value, "keys"):  # sqlite3.Row: its values, as a tuple
        value = tuple(value)
    elif kind == "timedelta" and hasattr(value, "total_seconds"):  # as days: numbers the search can act on
        return value.total_seconds() / 86400
    elif kind in ("datetime", "date") and hasattr(value, "isoformat"):
        return value.isoformat(" ") if kind == "datetime" else value.isoformat()
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else repr(value)
    if isinstance(value, str):
        return value[:300]
    if isinstance(value, (list, tuple, set, frozenset)) and (depth == 0 or len(value) <= 12):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else list(value)
        return {"seq": [_awm_summary(v, depth + 1) for v in items[:50]], "len": len(value)} if depth < 2 \
            else {"type": type(value).__name__}
    if isinstance(value, dict) and depth == 0:
        pairs = list(value.items())[:50]
        return {"keys": [_awm_summary(k, 1) for k, _ in pairs], "vals": [_awm_summary(v, 1) for _, v in pairs],
                "len": len(value)}
    return {"type": type(value).__name__}


def _awm_add(entry):
    if len(_awm_log) < 6000:
        _awm_log.append(entry)


_AWM_OPS = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
    "is": lambda a, b: a is b, "is not": lambda a, b: a is not b,
    "in": lambda a, b: a in b, "not in": lambda a, b: a not in b,
    "subset": lambda a, b: a.issubset(b), "superset": lambda a, b: a.issuperset(b),
}


def _awm_cmp(site, op, left, right, flags):
    result = _AWM_OPS[op](left, right)
    _awm_add(["cmp", site, op, _awm_summary(left), _awm_summary(right), bool(result), flags])
    return result


def _awm_truth(site, value):
    _awm_add(["truth", site, _awm_summary(value), bool(value)])
    return value


def _awm_get(site, obj, key, *default):
    found = obj.get(key, *default)
    if isinstance(obj, dict):
        _awm_add(["lookup", site, _awm_summary(key), key in obj])
    return found


def _awm_item(site, obj, key):
    if isinstance(obj, dict) and isinstance(key, (int, str)):
        _awm_add(["lookup", site, _awm_summary(key), key in obj])
    return obj[key]


def verify_traced_by_awm(initial_db_path, final_db_path, final_answer=None):
    import sys as _sys
    _real_connect = sqlite3.connect

    def _role(database):
        text = str(database)
        if str(final_db_path) in text:
            return "final"
        if str(initial_db_path) in text:
            return "initial"
        return "other"

    def _connect(database, *args, **kwargs):
        conn = _real_connect(database, *args, **kwargs)
        role = _role(database)

        def _record(statement):
            lines, frame = [], _sys._getframe(1)
            while frame is not None:
                if frame.f_code.co_filename == "<awm-verifier>":
                    lines.append(frame.f_lineno)
                frame = frame.f_back
            _awm_add({"role": role, "sql": statement, "lines": lines})

        conn.set_trace_callback(_record)
        return conn

    sqlite3.connect = _connect
    try:
        value = __TARGET__(initial_db_path, final_db_path, final_answer)
        error = ""
    except BaseException as exc:
        value, error = None, repr(exc)[:300]
    finally:
        sqlite3.connect = _real_connect
    return {"value": value, "error": error, "trace": _awm_log}


'''
_CMP_OPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
            ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in"}


class _Observer(ast.NodeTransformer):
    """Rewrites comparisons, truth tests and keyed lookups into calls of the `_awm_*` recorders.

    Each rewritten node keeps its meaning (operands evaluated once, left to right); `site` numbers the
    node so a search can tell how far into the verifier a run got. Chained comparisons stay as they are.
    """

    def __init__(self) -> None:
        self.sites = 0

    def _site(self) -> ast.Constant:
        self.sites += 1
        return ast.Constant(self.sites)

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        self.generic_visit(node)
        if len(node.ops) != 1 or type(node.ops[0]) not in _CMP_OPS:
            return node
        flags = "".join(("L" if _is_len(node.left) else "", "R" if _is_len(node.comparators[0]) else ""))
        return ast.copy_location(ast.Call(ast.Name("_awm_cmp", ast.Load()), [
            self._site(), ast.Constant(_CMP_OPS[type(node.ops[0])]), node.left, node.comparators[0],
            ast.Constant(flags)], []), node)

    def _truth(self, test: ast.expr) -> ast.expr:
        if isinstance(test, ast.Compare | ast.BoolOp | ast.Constant) or (
                isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id.startswith("_awm_")):
            return test
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            test.operand = self._truth(test.operand)
            return test
        return ast.copy_location(ast.Call(ast.Name("_awm_truth", ast.Load()), [self._site(), test], []), test)

    def visit_If(self, node: ast.If) -> ast.AST:
        self.generic_visit(node)
        node.test = self._truth(node.test)
        return node

    visit_While = visit_If

    def visit_IfExp(self, node: ast.IfExp) -> ast.AST:
        self.generic_visit(node)
        node.test = self._truth(node.test)
        return node

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.AST:
        self.generic_visit(node)
        node.values = [self._truth(v) for v in node.values]
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        f = node.func
        if (isinstance(f, ast.Attribute) and f.attr in ("issubset", "issuperset") and len(node.args) == 1
                and not node.keywords and not isinstance(node.args[0], ast.Starred)):
            return ast.copy_location(ast.Call(ast.Name("_awm_cmp", ast.Load()), [
                self._site(), ast.Constant({"issubset": "subset", "issuperset": "superset"}[f.attr]), f.value,
                node.args[0], ast.Constant("")], []), node)
        if (isinstance(f, ast.Attribute) and f.attr == "get" and 1 <= len(node.args) <= 2 and not node.keywords
                and not any(isinstance(a, ast.Starred) for a in node.args)):
            return ast.copy_location(ast.Call(ast.Name("_awm_get", ast.Load()),
                                              [self._site(), f.value, *node.args], []), node)
        return node

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        self.generic_visit(node)
        if (isinstance(node.ctx, ast.Load) and not isinstance(node.slice, ast.Slice | ast.Constant | ast.Tuple)):
            return ast.copy_location(ast.Call(ast.Name("_awm_item", ast.Load()),
                                              [self._site(), node.value, node.slice], []), node)
        return node


def _is_len(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len"


def observed_code(code: str) -> str:
    """The verifier's code rewritten to report what it compares (see `_Observer`); raises SyntaxError."""
    tree = _Observer().visit(ast.parse(code))
    return ast.unparse(ast.fix_missing_locations(tree))


@dataclass
class StaticInfo:
    """What the verifier's source says, without running it."""

    function: str | None
    sql: list[tuple[int, str]] = field(default_factory=list)  # (line, SQL template)
    tables: set[str] = field(default_factory=set)
    columns: set[str] = field(default_factory=set)  # subscript keys and SQL words: a superset of checked columns
    literal_checks: dict[str, list[Any]] = field(default_factory=dict)  # column -> literals it is compared with
    len_checks: dict[str, tuple[str, int]] = field(default_factory=dict)  # "scope:var" -> (op, N) from len(var) op N
    assign_lines: dict[int, str] = field(default_factory=dict)  # line -> "scope:var" assigned by the statement there
    reads_final_answer: bool = False
    uses_initial: bool = False
    uses_final: bool = False
    syntax_error: str = ""


def _string_of(node: ast.AST) -> str | None:
    """The text of a string literal, a `+` chain of them, or an f-string with `{}` holes."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _string_of(node.left), _string_of(node.right)
        if left is not None and right is not None:
            return left + right
    return None


def verify_function_name(code: str) -> str | None:
    """The first top-level `verify_*` function of the code (the data loader's rule), or None."""
    tree = ast.parse(code)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("verify_"):
            return node.name
    return None


def analyse(code: str) -> StaticInfo:
    """Static facts about one verifier's source (see the module docstring)."""
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        return StaticInfo(function=None, syntax_error=f"line {exc.lineno}: {exc.msg}")
    info = StaticInfo(function=next((n.name for n in tree.body if isinstance(n, ast.FunctionDef)
                                     and n.name.startswith("verify_")), None))
    seen_strings: set[int] = set()
    for node, scope in _walk_scoped(tree, ""):
        if isinstance(node, ast.BinOp | ast.JoinedStr | ast.Constant) and id(node) not in seen_strings:
            text = _string_of(node)
            if text is not None and _SQL_START.match(text):
                info.sql.append((node.lineno, text))
                info.tables.update(_TABLE_REF.findall(text))
                info.columns.update(w.lower() for w in _WORD.findall(text))
                for child in ast.walk(node):
                    seen_strings.add(id(child))
        if isinstance(node, ast.Subscript):
            key = node.slice
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                info.columns.add(key.value.lower())
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                info.columns.add(node.args[0].value.lower())
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            info.reads_final_answer |= node.id == "final_answer"
            info.uses_initial |= node.id == "initial_db_path"
            info.uses_final |= node.id == "final_db_path"
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            _comparison(node, info, scope)
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            if names:
                for line in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                    info.assign_lines[line] = f"{scope}:{names[0]}"
    return info


def _walk_scoped(node: ast.AST, scope: str):
    """Every node with the name of its innermost enclosing function (nested functions are own scopes)."""
    for child in ast.iter_child_nodes(node):
        inner = f"{scope}.{child.name}" if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else scope
        yield child, inner
        yield from _walk_scoped(child, inner)


def _comparison(node: ast.Compare, info: StaticInfo, scope: str) -> None:
    left, right, op = node.left, node.comparators[0], type(node.ops[0])
    for a, b in ((left, right), (right, left)):
        if (isinstance(a, ast.Subscript) and isinstance(a.slice, ast.Constant) and isinstance(a.slice.value, str)
                and isinstance(b, ast.Constant) and op in (ast.Eq, ast.NotEq)):
            info.literal_checks.setdefault(a.slice.value.lower(), []).append(b.value)
        if (isinstance(a, ast.Call) and isinstance(a.func, ast.Name) and a.func.id == "len" and a.args
                and isinstance(a.args[0], ast.Name) and isinstance(b, ast.Constant)
                and isinstance(b.value, int) and op in _LEN_OPS):
            symbol = _LEN_OPS[op] if a is left else _mirror(_LEN_OPS[op])
            info.len_checks[f"{scope}:{a.args[0].id}"] = (symbol, b.value)


def _mirror(op: str) -> str:
    return {"<": ">", "<=": ">=", ">": "<", ">=": "<="}.get(op, op)


def required_count(op: str, n: int) -> tuple[str, int] | None:
    """The count a verifier demands from `len(rows) op n`, read as a failure test (`!= 1` -> == 1).

    Verifiers write both `if len(rows) != 1: return others` and `if len(rows) == 0: return`:
    a test that names a bad case. Returns (check, N) with check in count_eq / count_gte.
    """
    if op == "!=":
        return ("count_eq", n)
    if op == "==" and n == 0:
        return ("count_gte", 1)
    if op == "<":
        return ("count_gte", n)
    if op == "<=":
        return ("count_gte", n + 1)
    return None


@dataclass
class Trace:
    """One traced verifier run: its return value (or error) and the statements it executed."""

    value: Any
    error: str
    statements: list[dict[str, Any]]  # {role, sql, lines} with lines relative to the verifier's own code
    status: str = "ok"
    events: list[Any] = field(default_factory=list)  # with observe: statements and recorder entries, in order


def traced_run(sandbox: VerifierSandbox, code: str, initial_db: str, final_db: str, *,
               final_answer: str | None = None, timeout_s: float = 20.0, observe: bool = False) -> Trace:
    """Run the verifier in the sandbox with every SQLite statement it executes recorded.

    `observe`: run `observed_code(code)` instead, so `events` also holds its comparisons, truth tests
    and lookups (line numbers then refer to the rewritten code). The log is the verifier's output, so
    it is read as untrusted data: entries of the wrong shape are dropped.
    """
    target = verify_function_name(code)
    if target is None:
        return Trace(None, "the verifier code defines no top-level verify_* function", [], "error")
    if observe:
        try:
            code = observed_code(code)
        except (SyntaxError, ValueError, RecursionError) as exc:
            return Trace(None, f"the verifier code cannot be rewritten: {exc}", [], "error")
    wrapper = _TRACE_WRAPPER.replace("__TARGET__", target)
    offset = wrapper.count("\n")
    run = sandbox.run(wrapper + code, initial_db, final_db, final_answer=final_answer, timeout_s=timeout_s)
    if run.status != "ok" or not isinstance(run.value, dict):
        return Trace(None, run.detail or f"sandbox status {run.status}", [], run.status)
    statements, events = [], []
    log = run.value.get("trace")
    for st in log if isinstance(log, list) else []:
        if isinstance(st, dict) and isinstance(st.get("sql"), str):
            lines = [n - offset for n in st.get("lines") or [] if isinstance(n, int) and n > offset]
            statement = {"role": st.get("role"), "sql": st["sql"], "lines": lines}
            statements.append(statement)
            events.append(statement)
        elif isinstance(st, list) and st and st[0] in ("cmp", "truth", "lookup"):
            events.append(st)
    error = run.value.get("error")
    return Trace(run.value.get("value"), error if isinstance(error, str) else "", statements, events=events)


def variables_of(statement: dict[str, Any], info: StaticInfo) -> list[str]:
    """The variables a traced statement's rows were assigned to, innermost call site first."""
    out = []
    for line in statement.get("lines", []):
        name = info.assign_lines.get(line)
        if name is not None and name not in out:
            out.append(name)
    return out

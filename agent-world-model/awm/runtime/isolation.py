"""Episode isolation beyond the DB, inside a worker that hosts many episodes of many scenarios.

Each episode already has its own DB file; these are the other ways episodes could meet:

- Module state. Upstream runs one process per episode, so a module-level counter or cache is
  per episode there; here one module serves every episode of its scenario in a worker.
  `module_state(code)` finds module-level mutable state that functions change (a `global`
  statement, or a mutating call / item assignment on a module-level list, dict, set, counter);
  such a scenario gets a private module instance per episode (the slower path: one import per
  episode open) instead of the shared one.
- Patches of shared libraries. A scenario that replaces `Session.commit` or `time.time` at import
  would change every other scenario in the worker. `SharedPatchGuard` notices such a change,
  undoes it and the scenario is refused.
- Deferred work. A task a handler leaves running would run during another episode's call, bound
  to that episode's DB: `cancel_new_tasks` cancels what a call started; outside a call the
  engines of generated code have no connection at all (`EpisodeDB.use`).
- Raw SQLite. Code that opens `DATABASE_PATH` itself (`sqlite3.connect`) reaches the episode's
  DB file through `route_sqlite_connect`, never a file shared by episodes.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import importlib
import os
import sqlite3
import sys
from collections.abc import Callable, Iterator
from typing import Any

_MUTABLE_CALLS = {"dict", "list", "set", "defaultdict", "OrderedDict", "deque", "Counter", "count", "bytearray"}
_MUTATORS = {"append", "extend", "insert", "pop", "popleft", "remove", "clear", "update", "add", "discard",
             "setdefault", "appendleft", "sort", "reverse", "__setitem__", "__delitem__"}
# Shared library objects generated code might patch: modules (their attributes) and classes (their dicts).
_WATCHED_MODULES = ("builtins", "os", "time", "datetime", "random", "json", "sqlite3", "uuid", "sqlalchemy",
                    "sqlalchemy.orm", "sqlalchemy.engine", "fastapi", "pydantic")
_WATCHED_CLASSES = (("sqlalchemy.orm", "Session"), ("sqlalchemy.orm", "Query"), ("sqlalchemy.engine", "Engine"),
                    ("sqlalchemy.engine", "Connection"), ("sqlalchemy.orm", "DeclarativeBase"),
                    ("fastapi", "FastAPI"), ("fastapi", "APIRouter"), ("pydantic", "BaseModel"),
                    ("starlette.applications", "Starlette"), ("starlette.routing", "Router"))


def _is_mutable_value(node: ast.expr) -> bool:
    if isinstance(node, ast.List | ast.Dict | ast.Set | ast.ListComp | ast.DictComp | ast.SetComp):
        return True
    if isinstance(node, ast.Call):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        return name in _MUTABLE_CALLS
    return False


def module_state(code: str) -> list[str]:
    """Names of module-level state that the code's functions change (empty: one module may serve all)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return []
    mutable = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) and node.value is not None else []
        value = getattr(node, "value", None)
        if value is not None and _is_mutable_value(value):
            mutable.update(t.id for t in targets if isinstance(t, ast.Name))
    found = set()
    for func in ast.walk(tree):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(func):
            if isinstance(node, ast.Global):
                found.update(node.names)
            elif isinstance(node, ast.Call):
                f = node.func
                if isinstance(f, ast.Attribute) and f.attr in _MUTATORS and isinstance(f.value, ast.Name):
                    if f.value.id in mutable:
                        found.add(f.value.id)
                elif isinstance(f, ast.Name) and f.id == "next" and node.args and isinstance(node.args[0], ast.Name):
                    if node.args[0].id in mutable:
                        found.add(node.args[0].id)
            elif isinstance(node, ast.Assign | ast.AugAssign | ast.Delete):
                targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id in mutable:
                        found.add(t.value.id)
    return sorted(found)


class SharedPatchGuard:
    """Snapshot of shared library attributes; `undo()` restores any that generated code replaced."""

    def __init__(self) -> None:
        for name in {*_WATCHED_MODULES, *(module for module, _ in _WATCHED_CLASSES)}:
            with contextlib.suppress(ImportError):  # imported now, so the first scenario's patch is seen too
                importlib.import_module(name)
        self._modules = {name: dict(vars(sys.modules[name])) for name in _WATCHED_MODULES if name in sys.modules}
        self._classes = {}
        for module, cls in _WATCHED_CLASSES:
            obj = getattr(sys.modules.get(module), cls, None)
            if isinstance(obj, type):
                self._classes[f"{module}.{cls}"] = (obj, dict(vars(obj)))

    def undo(self) -> list[str]:
        """Put back every replaced, added or deleted attribute; returns their dotted names."""
        changed = []
        for name, before in self._modules.items():
            now = vars(sys.modules[name])
            for key, value in before.items():
                if now.get(key, _MISSING) is not value and not key.startswith("__"):
                    changed.append(f"{name}.{key}")
                    setattr(sys.modules[name], key, value)
        for name, (cls, before) in self._classes.items():
            now = dict(vars(cls))
            for key in set(before) | set(now):
                if now.get(key, _MISSING) is not before.get(key, _MISSING) and key not in ("__abstractmethods__",
                                                                                           "_abc_impl"):
                    changed.append(f"{name}.{key}")
                    if key in before:
                        setattr(cls, key, before[key])
                    else:
                        delattr(cls, key)
        return sorted(changed)


_MISSING = object()


def cancel_new_tasks(before: set[asyncio.Task]) -> int:
    """Cancel the tasks started since `before` was taken (work a call left behind); returns how many."""
    current = asyncio.current_task()
    stray = [t for t in asyncio.all_tasks() if t not in before and t is not current and not t.done()]
    for task in stray:
        task.cancel()
    return len(stray)


def route_sqlite_connect(sentinel: str, current_path: Callable[[], str]) -> None:
    """Make `sqlite3.connect(sentinel)` open the DB of the call running now (`current_path()`)."""
    real = sqlite3.connect
    if getattr(real, "awm_routed", False):
        return
    sentinel = os.path.abspath(sentinel)

    def connect(database: Any, *args: Any, **kwargs: Any) -> sqlite3.Connection:
        if isinstance(database, str | os.PathLike) and os.path.abspath(os.fspath(database)) == sentinel:
            database = current_path()
        return real(database, *args, **kwargs)

    connect.awm_routed = True
    sqlite3.connect = sqlite3.dbapi2.connect = connect


@contextlib.contextmanager
def guarded_import() -> Iterator[list[str]]:
    """Run an import; on exit, the list holds the shared attributes it had patched (now undone)."""
    guard = SharedPatchGuard()
    changed: list[str] = []
    try:
        yield changed
    finally:
        changed.extend(guard.undo())

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
- Process-wide state changed later, in a call: library patches, signal handlers and interval timers,
  the environment (TZ) and `tzset()`, the locale, trace and audit hooks, import hooks, warning filters,
  threads left running. `ProcessGuard` checks after every request (cheaply: see its docstring for
  what is checked when), undoes what it finds before the next request runs, and refuses the
  scenario that made the change in this worker; the request that made it fails (`SharedStateChanged`).
- Deferred work. A task a handler leaves running would run during another episode's call, bound
  to that episode's DB: `cancel_new_tasks` cancels what a call started, and `cancel_new_handles` what it
  left on the event loop that is not a task (`call_later`, `call_soon`, a future's done callback,
  `add_reader` / `add_writer`); outside a call the engines of generated code have no connection at all
  (`EpisodeDB.use`).
- Raw SQLite. Code that opens `DATABASE_PATH` itself (`sqlite3.connect`) reaches the episode's
  DB file through `route_sqlite_connect`, never a file shared by episodes.
"""

from __future__ import annotations

import _signal
import _thread
import ast
import asyncio
import collections
import contextlib
import ctypes
import functools
import gc
import importlib
import locale
import logging
import operator
import os
import signal
import sqlite3
import sys
import threading
import time
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from awm.runtime.deadline import ENV_CODE_PREFIX, CallDeadline, CallInterrupted, _runs_env_code

log = logging.getLogger(__name__)

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


_MISSING = object()
ENV_MODULE_PREFIX = "awm_env_"  # the module names of generated code (awm.runtime.envapp.load_env)
_IMMUTABLE_TYPE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE: C types nobody can patch
_CLASS_KEYS_IGNORED = frozenset({"__abstractmethods__", "_abc_impl"})
_CLASS_NAMES = frozenset({"__module__", "__qualname__", "__doc__"})
# PEP 509: CPython bumps a dict's version tag on every change; read where 3.11 keeps it (checked at start-up).
_DICT_TAG_OFFSET = 3 * ctypes.sizeof(ctypes.c_ssize_t)


def _dict_tags_work() -> bool:
    """Whether this interpreter keeps a per-dict version tag where `_DICT_TAG_OFFSET` says (CPython 3.11+)."""
    if sys.implementation.name != "cpython":
        return False
    probe, other = {"k": 0}, {}
    view = ctypes.c_uint64.from_address(id(probe) + _DICT_TAG_OFFSET)
    first = view.value
    probe["k"] = 1
    second = view.value
    other["x"] = 1  # another dict's change must not move this one's tag
    third = view.value
    del probe["k"]
    return first != second and second == third and view.value not in (second, first)


_TAGS = _dict_tags_work()


class _Watched:
    """One shared namespace (a module's or a class's dict): its contents when snapshot, and its tag."""

    __slots__ = ("name", "owner", "is_class", "d", "snap", "view", "touched")

    def __init__(self, name: str, owner: Any, d: dict) -> None:
        self.name, self.owner, self.is_class, self.d = name, owner, isinstance(owner, type), d
        self.snap = dict(d)
        self.view = ctypes.c_uint64.from_address(id(d) + _DICT_TAG_OFFSET) if _TAGS else None
        self.touched = False

    def tag(self) -> Any:
        """What changes when the namespace does: the version tag, else the values themselves (slower)."""
        return self.view.value if self.view is not None else tuple(self.d.values())

    def settle(self) -> list[str]:
        """Undo replaced and deleted attributes (and class attributes added over inherited ones); returns
        their dotted names. What libraries do by themselves is accepted into the snapshot: new module
        attributes (a submodule imported), a module global set from None (lazy initialisation:
        `urllib.parse._hextobyte`), int counters kept as module globals, class attributes added over nothing
        inherited, SQLAlchemy's lazily generated `_generated_*` class caches, a class's `__module__`
        rewritten (anyio's re-exports)."""
        d, snap, changed = self.d, self.snap, []
        for key in [k for k in set(d) | set(snap) if d.get(k, _MISSING) is not snap.get(k, _MISSING)]:
            old, new = snap.get(key, _MISSING), d.get(key, _MISSING)
            if self.is_class:
                renamed = key in _CLASS_NAMES and type(old) is str and type(new) is str
                if key in _CLASS_KEYS_IGNORED or renamed or (old is _MISSING and (
                        str(key).startswith("_generated_")
                        or not any(key in vars(base) for base in self.owner.__mro__[1:]))):
                    snap[key] = new
                    continue
                changed.append(f"{self.name}.{key}")
                if old is _MISSING:
                    type.__delattr__(self.owner, key)
                else:
                    type.__setattr__(self.owner, key, old)
                continue
            if old is _MISSING or old is None or key == "__warningregistry__" or (
                    type(old) is int and type(new) is int and self.name != "time") or _same_data(old, new):
                snap[key] = new
                continue
            changed.append(f"{self.name}.{key}")
            d[key] = old
        return changed


class _Tags:
    """Reads the tags of many namespaces at once. Where version tags work, in one C-level call that touches
    nothing but the dicts themselves: an `itemgetter` of their tags' offsets over a memoryview of the address
    range that holds them (reading a tag view object per dict costs a cache miss more each, measured: twice
    the time after a tool call has run). The dicts stay alive (watched), so every address read is valid."""

    def __init__(self, watched: list[_Watched]) -> None:
        self.watched = watched
        self._get: Callable[[Any], Any] | None = None
        if _TAGS and watched:
            addresses = [id(w.d) + _DICT_TAG_OFFSET for w in watched]
            base = min(addresses)
            span = (ctypes.c_uint8 * (max(addresses) - base + 8)).from_address(base)
            self._memory = memoryview(span).cast("B").cast("Q")  # aligned: dicts are 16-byte aligned
            offsets = [(a - base) // 8 for a in addresses]
            self._get = operator.itemgetter(*offsets) if len(offsets) > 1 else lambda m: (m[offsets[0]],)

    def read(self) -> tuple:
        if self._get is not None:
            return self._get(self._memory)
        return tuple(w.tag() for w in self.watched)


def _same_data(old: Any, new: Any) -> bool:
    """Equal plain data (what `time.tzset()` rebinds), compared without running any object's own `__eq__`."""
    plain = (int, float, str, bytes, bool)
    if type(old) is tuple and type(new) is tuple:
        return len(old) == len(new) and all(type(a) in plain and type(a) is type(b) and a == b
                                            for a, b in zip(old, new, strict=True))
    return type(old) in plain and type(old) is type(new) and old == new


def _shared_namespaces(modules: list[str] | None,
                       classes: tuple[tuple[str, str], ...] = ()) -> list[_Watched]:
    """Module and class dicts shared by every scenario: of the named modules (None: every module loaded now
    that is not generated code, and the classes in them) and of the classes named in `classes`."""
    names = modules if modules is not None else [n for n, m in list(sys.modules.items())
                                                 if isinstance(m, types.ModuleType) and n != "__main__"
                                                 and not n.startswith(ENV_MODULE_PREFIX)]
    out, seen = [], set()
    for name in names:
        module = sys.modules.get(name)
        if not isinstance(module, types.ModuleType):
            continue
        out.append(_Watched(name, module, vars(module)))
        wanted = [v for v in list(vars(module).values()) if isinstance(v, type)] if modules is None else []
        for cls in wanted:
            if id(cls) not in seen and not cls.__flags__ & _IMMUTABLE_TYPE and \
                    not str(getattr(cls, "__module__", "")).startswith(ENV_MODULE_PREFIX):
                seen.add(id(cls))
                name = f"{cls.__module__}.{cls.__qualname__}"
                out.append(_Watched(name, cls, gc.get_referents(vars(cls))[0]))
    for module, cls_name in classes:
        cls = getattr(sys.modules.get(module), cls_name, None)
        if isinstance(cls, type) and id(cls) not in seen:
            seen.add(id(cls))
            out.append(_Watched(f"{module}.{cls_name}", cls, gc.get_referents(vars(cls))[0]))
    return out


class SharedPatchGuard:
    """Snapshot of shared library attributes; `undo()` restores any that generated code replaced."""

    def __init__(self) -> None:
        for name in {*_WATCHED_MODULES, *(module for module, _ in _WATCHED_CLASSES)}:
            with contextlib.suppress(ImportError):  # imported now, so the first scenario's patch is seen too
                importlib.import_module(name)
        self.watched = _shared_namespaces(list(_WATCHED_MODULES), _WATCHED_CLASSES)

    def undo(self) -> list[str]:
        """Put back every replaced or deleted attribute (and class attributes added over inherited ones);
        returns their dotted names."""
        return sorted(name for w in self.watched for name in w.settle())


def cancel_new_tasks(before: set[asyncio.Task]) -> int:
    """Cancel the tasks started since `before` was taken (work a call left behind); returns how many."""
    current = asyncio.current_task()
    stray = [t for t in asyncio.all_tasks() if t not in before and t is not current and not t.done()]
    for task in stray:
        task.cancel()
    return len(stray)


def loop_handles(loop: asyncio.AbstractEventLoop) -> tuple[list, list, dict]:
    """What a call finds scheduled on the worker's loop: timer handles, ready callbacks, and the registered
    readers and writers (the handles are kept, not just their ids: an id freed in the call could be reused).
    About 0.3 us when nothing is scheduled (benchmarks/process_guard_cost.py)."""
    fd_to_key = getattr(getattr(loop, "_selector", None), "_fd_to_key", None)
    return (list(getattr(loop, "_scheduled", ())), list(getattr(loop, "_ready", ())),
            dict(fd_to_key) if type(fd_to_key) is dict else {})


def _task_step(handle: asyncio.Handle, tasks: tuple[type, ...]) -> bool:
    """A task's own step or wakeup: the task is cancelled (`cancel_new_tasks`) and must run to take it."""
    return type(getattr(handle._callback, "__self__", None)) in tasks  # type: ignore[attr-defined]


def cancel_new_handles(loop: asyncio.AbstractEventLoop, before: tuple[list, list, dict]) -> int:
    """Cancel what a call scheduled on the loop and left behind (`call_later`, `call_at`, `call_soon`, a done
    callback whose future completed, `add_reader` / `add_writer`): not a Task, so `cancel_new_tasks` misses
    it, and it would run during another scenario's call. Steps and wakeups of tasks are left to the task's
    cancellation. Returns how many were cancelled or removed."""
    scheduled, ready, keys = before
    tasks = tuple({asyncio.Task, getattr(asyncio.tasks, "_PyTask", asyncio.Task)})
    n = 0
    for queue, known in ((getattr(loop, "_scheduled", ()), scheduled), (getattr(loop, "_ready", ()), ready)):
        if len(queue) == len(known) and all(map(operator.is_, queue, known)):
            continue  # the common case: nothing added
        old = set(map(id, known))
        for handle in list(queue):
            if id(handle) not in old and not handle.cancelled() and not _task_step(handle, tasks):
                handle.cancel()
                n += 1
    selector = getattr(loop, "_selector", None)
    fd_to_key = getattr(selector, "_fd_to_key", None)
    if type(fd_to_key) is dict and fd_to_key != keys:  # SelectorKeys compare by value: a new or changed one
        for fd, key in list(fd_to_key.items()):
            if keys.get(fd) is key:
                continue
            kept = set(map(id, keys[fd].data or ())) if fd in keys else set()
            for handle in key.data or ():
                if isinstance(handle, asyncio.Handle) and id(handle) not in kept:
                    handle.cancel()
            if fd in keys:
                selector.modify(fd, keys[fd].events, keys[fd].data)  # type: ignore[union-attr]
            else:
                selector.unregister(fd)  # type: ignore[union-attr]
            n += 1
        for fd in set(keys) - set(fd_to_key):  # removed by the call (the loop's own self-pipe): put back
            selector.register(keys[fd].fileobj, keys[fd].events, keys[fd].data)  # type: ignore[union-attr]
            n += 1
    return n


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


class SharedStateChanged(RuntimeError):
    """A scenario's request changed process-wide state that other scenarios in the worker share (undone)."""


# What every tool call runs through and the likeliest targets, checked after every request: these modules'
# and classes' dicts (each tag read after a tool call is a cache miss or two: ~0.1-0.2 us; keep it short).
# Every other shared namespace: 1/`sweep_every` of them per request, all of them before and after a load.
_HOT_MODULES = (*_WATCHED_MODULES, "time", "starlette.responses", "fastapi.routing", "awm.runtime.envapp",
                "awm.runtime.dispatch", "awm.runtime.isolation", "__main__")
_HOT_CLASSES = (*_WATCHED_CLASSES, ("starlette.responses", "Response"), ("starlette.responses", "JSONResponse"),
                ("fastapi.routing", "APIRoute"), ("awm.runtime.isolation", "ProcessGuard"),
                ("__main__", "Worker"), ("awm.runtime.worker", "Worker"))
# Registries a library keeps in a module-level dict (changed in place, they change every later call).
_REGISTRIES = (("sqlite3", "adapters"), ("sqlite3", "converters"), ("fastapi.encoders", "ENCODERS_BY_TYPE"),
               ("copyreg", "dispatch_table"), ("pydantic.json", "ENCODERS_BY_TYPE"))
# Signals that arrive by themselves (timers) or from outside (Ctrl-C reaches the whole process group): a
# handler for one runs in whatever call is on. Checked after every request; every other handler in the sweep.
_ASYNC_SIGNALS = (signal.SIGALRM, signal.SIGVTALRM, signal.SIGPROF, signal.SIGINT, signal.SIGTERM,
                  signal.SIGPIPE)
_ALL_SIGNALS = tuple(sorted(set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}))
_TIMERS = {signal.ITIMER_REAL: "ITIMER_REAL (signal.alarm / setitimer)",
           signal.ITIMER_VIRTUAL: "ITIMER_VIRTUAL", signal.ITIMER_PROF: "ITIMER_PROF"}
_LISTS = {"sys.meta_path": sys.meta_path, "sys.path_hooks": sys.path_hooks, "sys.path": sys.path,
          "gc.callbacks": gc.callbacks, "warnings.filters": warnings.filters}
# Audit events of process-wide changes that have no cheaper tell: refused outright while the guard lives.
_REFUSED_EVENTS = {"resource.setrlimit", "resource.prlimit", "sys.settrace", "sys.setprofile",
                   "sys.addaudithook", "cpython.PyInterpreterState_New"}
_AUDITED = frozenset({*_REFUSED_EVENTS, "os.putenv", "os.unsetenv", "object.__setattr__"})
_THREAD_GRACE_S = 0.5


def _library_modules() -> set[str]:
    """Names of the modules loaded that are not generated code: every load adds its own module, which is no
    reason to snapshot all shared namespaces again (~40-70 ms, the bulk of a load's guard cost)."""
    return {name for name in sys.modules if not name.startswith(ENV_MODULE_PREFIX)}


def _from_env(value: Any) -> bool:
    """Whether a value was made by generated code: a function compiled from it (also under a staticmethod,
    classmethod, property, bound method or `functools.partial`), or a class defined in it, or an instance of
    one. Read with `type()` and the type's own attribute lookup: no object's own `__class__` or metaclass
    `__getattribute__` runs."""
    for _ in range(4):
        kind = type(value)
        if kind is staticmethod or kind is classmethod or kind is types.MethodType:
            value = value.__func__
        elif kind is functools.partial:
            value = value.func
        elif kind is property:
            return any(_from_env(f) for f in (value.fget, value.fset, value.fdel) if f is not None)
        else:
            break
    if type(value) is types.FunctionType:
        return value.__code__.co_filename.startswith(ENV_CODE_PREFIX)
    cls = value if issubclass(type(value), type) else type(value)
    return str(type.__getattribute__(cls, "__module__")).startswith(ENV_MODULE_PREFIX)


def _planted(name: str, module: Any) -> list[str]:
    """What generated code put into a library module that joined the process after the baseline: attributes
    of the module, or of a class defined in it, made by generated code (`_from_env`). The rule: a library
    module never holds generated code's functions, classes or objects, since it cannot import generated code
    and the worker hands it none; only a patch puts them there. A patch that binds a value from another
    library (`statistics.mean = max`) is not seen."""
    if _from_env(module):
        return [f"sys.modules[{name!r}]"]
    if type(module) is not types.ModuleType:
        return []
    found = []
    for key, value in list(vars(module).items()):
        if _from_env(value):
            found.append(f"{name}.{key}")
        elif issubclass(type(value), type) and type.__getattribute__(value, "__module__") == name and \
                not value.__flags__ & _IMMUTABLE_TYPE:
            found += [f"{name}.{key}.{k}" for k, v in list(type.__getattribute__(value, "__dict__").items())
                      if _from_env(v)]
    return found


def _sys_modules_tag() -> Callable[[], Any]:
    """A reader of what changes when `sys.modules` does: its dict version tag (one read), else its size and
    its hot entries."""
    if _TAGS:
        view = ctypes.c_uint64.from_address(id(sys.modules) + _DICT_TAG_OFFSET)
        return lambda: view.value
    return lambda: (len(sys.modules), *map(sys.modules.get, _HOT_MODULES))


class ProcessGuard:
    """Process-wide state that one scenario's code could change for every other scenario in its worker.

    `watch(op, scenario)` wraps each request. The boundary is between scenarios (episodes of one scenario
    run the same code, so a change one of them makes reaches only that code): before a request of another
    scenario than the one that ran last, and every `sweep_every` requests, the guard looks for changes,
    undoes them before that request runs and refuses the scenario that made them: its later loads, opens
    and calls here fail (`SharedStateChanged`, naming the change). A load is checked before and after
    (the load itself fails if it changed something). A run of one scenario's requests pays nothing; a switch
    ~3 us, ~10 us right after a call whose work evicted the caches (benchmarks/process_guard_cost.py, docs/runtime.md). What is checked:

    - At every check: the version tag of `sys.modules` (if it moved: every library module's entry is compared
      by identity and put back if replaced or deleted, and each library module new since the last check is
      looked into for what generated code planted in it: `_planted`; such a module is dropped, so the next
      import loads a clean copy, and never joins the baseline); the dict version tags (PEP 509: one read per
      namespace, whatever its size) of the modules and classes every tool call runs through and the likeliest
      targets (`_HOT_MODULES`, `_HOT_CLASSES`) and of library registries (`_REGISTRIES`); `os.environ` and
      every `putenv` (then TZ is put back and `tzset()` called: a zone loaded by a `tzset()` whose TZ was put
      back is caught too); the real interval timer (`alarm`, `setitimer`); handlers of `_ASYNC_SIGNALS`; the
      recursion limit; the number of warning filters and GC callbacks; threads started and left running
      (interrupted; if one still runs after `_THREAD_GRACE_S` the worker exits, so that it never runs during
      another scenario's call: the pool fails its episodes as infrastructure errors). Any of these moving
      triggers the whole process-state check below at once.
    - At every check, 1/`sweep_every` of all other shared namespaces (every module loaded, every class defined
      in one: ~4,300 in a worker); every `sweep_every` requests, and before and after every load, all of them
      plus the locale, every signal handler, all interval timers, the signal mask, import hooks, `sys.path`,
      the switch interval, rlimits, cwd and umask, and every `sys.modules` entry. After a load that brought
      new library modules, they are looked into (`_planted`) before they join the baseline: a scenario whose
      import patched a library module it was the first to load is refused. A change seen there is undone, but
      requests in between may have seen it (the window: at most `sweep_every` requests); it is blamed on a
      scenario only when that one alone ran since its part was last checked, and the namespace is checked at
      every check from then on.
    - Never allowed (refused when tried, by an audit hook): setting rlimits, trace and profile functions,
      audit hooks, sub-interpreters, and changing a shared function's `__code__`, `__defaults__` or
      `__kwdefaults__`.

    Not caught: changes made through `ctypes` or other native code (which can write any memory of the
    process), code that deliberately targets the guard itself (its module, its objects reached through frames
    or the garbage collector), in-place changes to library objects other than the registries above (an
    SQLAlchemy event listener on a shared class, a cache's contents), the state of `random` and of `decimal`'s
    context, a library module first loaded by a scenario and patched with another library's value rather than
    generated code's (`_planted`), a task of a call that ignores its cancellation. The complete answer to
    these is a worker per scenario.
    """

    def __init__(self, environ: dict[str, str] | None = None, sweep_every: int = 1024) -> None:
        os.environ.update(environ or {})  # what the worker sets on every load: part of the baseline
        self.sweep_every = sweep_every
        self.refused: dict[str, str] = {}
        self.requests = 0
        self.recent: collections.deque[tuple[int, str]] = collections.deque(maxlen=4 * sweep_every)
        self._known_threads = {threading.get_ident()}
        self._thread_count = _thread._count()
        self._tried: list[str] = []  # what the audit hook refused since the last check
        self._putenv: dict[bytes, bytes | None] = {}  # os.putenv / os.unsetenv calls since the last check
        self._pooled: set[int] = set()  # idle thread-pool threads (anyio's, concurrent.futures')
        self.hot: list[_Watched] = []
        self.cold: list[list[_Watched]] = []
        self._baseline()
        audit, audited = self._audit, _AUDITED

        def hook(event: str, args: tuple) -> None:  # every audited event (`id()` is one): be quick
            if event in audited:
                audit(event, args)

        sys.addaudithook(hook)

    # baseline ----------------------------------------------------------------------------------------
    def _baseline(self) -> None:
        """Snapshot everything (again: after a load, new library modules join the cold set)."""
        hot_modules = set(_HOT_MODULES)
        hot_classes = {id(c) for m, n in _HOT_CLASSES
                       if isinstance(c := getattr(sys.modules.get(m), n, None), type)}
        everything = _shared_namespaces(None)
        hot = [w for w in everything if (id(w.owner) in hot_classes if w.is_class else w.name in hot_modules)]
        hot_ids = {id(w.d) for w in hot}
        for module, name in _REGISTRIES:
            reg = getattr(sys.modules.get(module), name, None)
            if type(reg) is dict and id(reg) not in hot_ids:
                hot.append(_Watched(f"{module}.{name}", None, reg))
        cold = [w for w in everything if id(w.d) not in hot_ids]
        self._shared_functions = _functions_in(everything)
        self.hot, self._hot_reader = hot, _Tags(hot)
        self._hot_tags = self._hot_reader.read()
        self.cold = [cold[i::self.sweep_every] for i in range(self.sweep_every)]
        self._cold_readers = [_Tags(part) for part in self.cold]
        self._cold_tags = [reader.read() for reader in self._cold_readers]
        self._cold_checked = [self.requests] * self.sweep_every
        self._cold_checked_before: dict[int, int] = {}
        self._locale = locale.setlocale(locale.LC_ALL)
        self._handlers = {n: _signal.getsignal(n) for n in _ALL_SIGNALS}
        self._async_handlers = tuple(map(_signal.getsignal, _ASYNC_SIGNALS))
        self._environ = dict(os.environ._data)  # type: ignore[attr-defined]
        self._trusted_code = {CallDeadline._watch.__code__} | {  # our threads (the worker runs as __main__)
            m.ReplyBuffer._send_stale.__code__ for m in (sys.modules.get("__main__"), sys.modules.get(
                "awm.runtime.worker")) if hasattr(m, "ReplyBuffer")}
        self._lists = {name: list(lst) for name, lst in _LISTS.items()}
        self._limits = (sys.getrecursionlimit(), sys.getswitchinterval())
        self._slow = self._slow_state()
        self._env = _Watched("os.environ", None, os.environ._data)  # type: ignore[attr-defined]
        self._env_tag = self._env.tag()
        self._lists_len = (len(warnings.filters), len(gc.callbacks))
        self._modules_seen = _library_modules()
        self._module_entries = {n: m for n, m in sys.modules.items() if not n.startswith(ENV_MODULE_PREFIX)}
        self._modules_tag_of = _sys_modules_tag()
        self._modules_tag = self._modules_tag_of()
        self._last: str | None = None  # the scenario whose request ran last: a check is due when another's comes

    @staticmethod
    def _slow_state() -> dict[str, Any]:
        import resource  # noqa: PLC0415 - the worker's own import, not a scenario's

        umask = os.umask(0o22)
        os.umask(umask)
        return {"cwd": os.getcwd(), "umask": umask,
                "signal mask": signal.pthread_sigmask(signal.SIG_BLOCK, ()),
                **{f"rlimit {n}": resource.getrlimit(getattr(resource, n)) for n in dir(resource)
                   if n.startswith("RLIMIT_")}}

    # the audit hook ------------------------------------------------------------------------------------
    def _audit(self, event: str, args: tuple) -> None:
        if event == "os.putenv" or event == "os.unsetenv":
            with contextlib.suppress(TypeError, ValueError):
                self._putenv[os.fsencode(args[0])] = os.fsencode(args[1]) if event == "os.putenv" else None
        elif event in _REFUSED_EVENTS:
            self._tried.append(event)
            raise RuntimeError(f"{event} is not allowed in an environment worker: it would change every "
                               "scenario sharing this process")
        elif event == "object.__setattr__" and isinstance(args[0], types.FunctionType) and args[1] in (
                "__code__", "__defaults__", "__kwdefaults__") and id(args[0]) in self._shared_functions:
            func = args[0]
            where = f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', '?')}"
            self._tried.append(f"{where}.{args[1]}")
            raise RuntimeError(f"changing {args[1]} of a shared library function is not allowed in an "
                               "environment worker: it would change every scenario sharing this process")

    # the per-request check -------------------------------------------------------------------------------
    def watch(self, op: str, scenario: str | None) -> ProcessGuard:
        """`with guard.watch(op, scenario):` runs one request of `scenario` (None: not a scenario's);
        afterwards the guard undoes what it changed of the process, refuses the scenario that changed it, and
        fails this request (`SharedStateChanged`) if it was that scenario's. A refused scenario's loads,
        opens and calls fail."""
        if scenario is not None and scenario in self.refused and op in ("load", "open", "call"):
            raise SharedStateChanged(self.refused[scenario])
        self._op, self._scenario = op, scenario
        return self

    def __enter__(self) -> None:  # a plain context manager: @contextmanager costs a microsecond per request
        op, scenario = self._op, self._scenario
        self.requests += 1
        if op == "load":  # an import runs through much library code: nothing may be left over for it
            self._settle_before(*self.check(full=True))
        elif self.requests % self.sweep_every == 0:  # the sweep: every namespace (~0.3 ms)
            self._settle_before(*self.check(full=True))
        elif scenario is not None and scenario != self._last:
            self._settle_before(*self.check())  # another scenario's turn: undo what the last one changed
        if scenario is not None:
            self.recent.append((self.requests, scenario))
            if scenario in self.refused and op in ("load", "open", "call"):
                raise SharedStateChanged(self.refused[scenario])

    def __exit__(self, *exc: object) -> None:
        if self._scenario is not None:
            self._last = self._scenario
        if self._op == "load":  # imports: new modules, the likeliest moment for a change; blamed on the load
            now, later = self.check(True)
            if _library_modules() - self._modules_seen:
                self._baseline()  # library modules the import brought in join the watched set (40-70 ms: only then)
            if now or later:
                self._settle_changes(self._scenario, now, later)

    def _settle_before(self, now: list[str], later: dict[int, list[str]]) -> None:
        """Settle changes found before a request runs: made by the scenario that ran last (`now`), or by
        whoever ran since a cold part was checked (`later`); the request about to run is not to blame."""
        if now or later:
            try:
                self._settle_changes(self._last, now, later)
            except SharedStateChanged:  # raised for the culprit's request, which has already been answered
                pass

    def _settle_changes(self, scenario: str | None, now: list[str], later: dict[int, list[str]]) -> None:
        """Blame and refuse (the changes are undone already); raise if `scenario`'s request made them."""
        culprit = self._blame(later) if later else None
        found = [change for part in later.values() for change in part]
        if now and scenario is not None:
            self._refuse(scenario, now)
        elif now:
            log.warning("process-wide state changed outside a scenario's request (undone): %s",
                        ", ".join(now))
        if found and culprit is not None and culprit not in self.refused:
            self._refuse(culprit, found)
        elif found:
            log.warning("process-wide state changed by one of several scenarios (undone): %s",
                        ", ".join(found))
        if scenario is not None and scenario in self.refused and (now or culprit == scenario):
            raise SharedStateChanged(self.refused[scenario])

    def _refuse(self, scenario: str, changes: list[str]) -> None:
        self.refused[scenario] = (
            f"scenario {scenario!r} changed process-wide state that other scenarios in its worker share "
            f"({', '.join(changes[:6])}{', ...' if len(changes) > 6 else ''}); the change was undone and the "
            "scenario is refused in this worker")
        log.warning("%s", self.refused[scenario])

    def _blame(self, parts: dict[int, list[str]]) -> str | None:
        """The one scenario that ran since the changed parts were last checked, else None."""
        since = min(self._cold_checked_before.get(i, 0) for i in parts) if parts else 0
        suspects = {s for n, s in self.recent if n > since}
        return suspects.pop() if len(suspects) == 1 else None

    def check(self, full: bool = False) -> tuple[list[str], dict[int, list[str]]]:
        """Undo changes; returns those of the hot set and process state (made by the request just served),
        and those of cold parts by part (made at some point since that part was last checked)."""
        turn = self.requests % self.sweep_every
        now = self._process_state(full or turn == 0)
        if self._tried:
            now += [f"tried {e}" for e in self._tried]
            self._tried.clear()
        if full or self._modules_tag_of() != self._modules_tag:
            now += self._check_modules()
        tags = self._hot_reader.read()
        if tags != self._hot_tags:
            now += self._settle(self.hot, self._hot_tags, tags)
            self._hot_tags = self._hot_reader.read()
        if not full and self._cold_readers[turn].read() == self._cold_tags[turn]:  # the common case
            self._cold_checked[turn] = self.requests
            return now, {}
        later: dict[int, list[str]] = {}
        self._cold_checked_before: dict[int, int] = {}
        for i in range(self.sweep_every) if full else (turn,):
            part = self.cold[i]
            tags = self._cold_readers[i].read()
            if tags != self._cold_tags[i]:
                found = self._settle(part, self._cold_tags[i], tags)
                if found:
                    later[i] = found
                    self._cold_checked_before[i] = self._cold_checked[i]
                    self._promote(i)
                self._cold_tags[i] = self._cold_readers[i].read()
            self._cold_checked[i] = self.requests
        return now, later

    def _check_modules(self) -> list[str]:
        """`sys.modules` changed: put back every library module's entry that was replaced or deleted (an
        import would hand another scenario the replacement), and look into each library module new since
        the last check (`_planted`): one generated code patched is dropped from `sys.modules` (and from its
        package), so that the next import loads a clean copy, and never joins the baseline."""
        mods, entries, changed = sys.modules, self._module_entries, []
        for name, module in entries.items():
            if mods.get(name, _MISSING) is not module:
                changed.append(f"sys.modules[{name!r}]")
                mods[name] = module
        for name in [n for n in mods if n not in entries and not n.startswith(ENV_MODULE_PREFIX)]:
            module = mods[name]
            planted = _planted(name, module)
            if not planted:
                entries[name] = module
                continue
            changed += planted
            del mods[name]
            parent, _, child = name.rpartition(".")
            package = mods.get(parent)
            if parent and type(package) is types.ModuleType and vars(package).get(child) is module:
                del vars(package)[child]
        self._modules_tag = self._modules_tag_of()
        return changed

    def _promote(self, part: int) -> None:
        """Check the namespaces of a cold part that changed after every request from now on: a scenario that
        changes one again is caught at once (and blamed exactly): each cold namespace gives one window."""
        moved = [w for w in self.cold[part] if w.touched]
        self.cold[part] = [w for w in self.cold[part] if not w.touched]
        self.hot += moved
        for w in moved:
            w.touched = False
        self._hot_reader, self._cold_readers[part] = _Tags(self.hot), _Tags(self.cold[part])
        self._hot_tags = self._hot_reader.read()

    @staticmethod
    def _settle(watched: list[_Watched], known: tuple, tags: tuple) -> list[str]:
        changed = []
        for i, w in enumerate(watched):
            if tags[i] != known[i]:
                found = _restore_mapping(w) if w.owner is None else w.settle()  # registry: put back whole
                w.touched = bool(found)
                changed += found
        return changed

    def _process_state(self, full: bool) -> list[str]:
        if not full and not self._putenv and self._env.tag() == self._env_tag and not self._pooled and \
                _thread._count() == self._thread_count and \
                _signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0) and \
                all(map(operator.is_, map(_signal.getsignal, _ASYNC_SIGNALS), self._async_handlers)) and \
                len(warnings.filters) == self._lists_len[0] and len(gc.callbacks) == self._lists_len[1] and \
                sys.getrecursionlimit() == self._limits[0]:
            return []  # the common case, in about a microsecond: nothing moved (the rest waits for the sweep)
        changed = []
        if self._putenv or self._env.tag() != self._env_tag:
            changed += self._restore_environ()
        if locale.setlocale(locale.LC_ALL) != self._locale:
            changed.append(f"locale ({locale.setlocale(locale.LC_ALL)!r})")
            locale.setlocale(locale.LC_ALL, self._locale)
        for which, name in _TIMERS.items():
            if signal.getitimer(which) != (0.0, 0.0):
                signal.setitimer(which, 0)
                changed.append(f"interval timer {name}")
        if full or not all(map(operator.is_, map(_signal.getsignal, _ASYNC_SIGNALS), self._async_handlers)):
            changed += self._restore_handlers()
        if (sys.getrecursionlimit(), sys.getswitchinterval()) != self._limits:
            changed.append("sys.setrecursionlimit / setswitchinterval")
            sys.setrecursionlimit(self._limits[0])
            sys.setswitchinterval(self._limits[1])
        for name, lst in _LISTS.items():
            before = self._lists[name]
            if len(lst) != len(before) or not all(map(operator.is_, lst, before)):
                changed.append(name)
                lst[:] = before
                if name == "warnings.filters":
                    warnings._filters_mutated()  # type: ignore[attr-defined]
        if self._pooled or _thread._count() != self._thread_count:
            changed += self._threads()
        if full:
            now = self._slow_state()
            changed += [f"{k} ({now[k]!r})" for k in now if now[k] != self._slow[k]]
            if now["cwd"] != self._slow["cwd"]:
                os.chdir(self._slow["cwd"])
            if now["umask"] != self._slow["umask"]:
                os.umask(self._slow["umask"])
            if now["signal mask"] != self._slow["signal mask"]:
                signal.pthread_sigmask(signal.SIG_SETMASK, self._slow["signal mask"])
        return changed

    def _restore_handlers(self) -> list[str]:
        changed = []
        for n in _ALL_SIGNALS:
            if _signal.getsignal(n) is not self._handlers[n]:
                changed.append(f"handler of {signal.Signals(n).name}")
                with contextlib.suppress(TypeError, ValueError, OSError):
                    signal.signal(n, self._handlers[n])
        return changed

    def _restore_environ(self) -> list[str]:
        """Put os.environ and the C environment back, then `tzset()`: TZ may have been changed, `tzset()`
        called and TZ changed back, leaving libc's zone behind."""
        data, before = os.environ._data, self._environ  # type: ignore[attr-defined]
        for k in [k for k in data if type(k) is not bytes]:
            del data[k]
        changed = {k for k in set(data) | set(before)
                   if not _same_data(data.get(k, _MISSING), before.get(k, _MISSING))}
        changed |= {k for k, v in self._putenv.items() if v != before.get(k)}  # set in the C environment only
        keys = {os.fsdecode(k) for k in changed | set(self._putenv)}
        for key in keys:  # os.environ and the C environment both: putenv may have bypassed os.environ
            value = self._environ.get(os.fsencode(key))
            if value is None:
                os.environ.pop(key, None)
                with contextlib.suppress(OSError, ValueError):
                    os.unsetenv(key)
            else:
                os.environ[key] = os.fsdecode(value)
        self._putenv.clear()  # including our own putenv calls just now
        self._env_tag = self._env.tag()
        zone = time.tzname, time.timezone
        time.tzset()  # libc's zone follows TZ again; time.timezone & co are rebound (equal values: no change)
        out = [f"os.environ[{os.fsdecode(k)!r}]" for k in sorted(changed)]
        if not (_same_data(zone[0], time.tzname) and _same_data(zone[1], time.timezone)):  # TZ was put back
            out.append(f"the time zone (TZ and time.tzset(): {zone[0]!r})")
        return out

    def _threads(self) -> list[str]:
        """Threads started by a request and still running: interrupted; the worker exits if one survives."""
        stray, frames = [], sys._current_frames()
        self._pooled &= set(frames)
        for ident, frame in frames.items():
            if ident in self._known_threads and ident not in self._pooled:
                continue
            thread = threading._active.get(ident)  # type: ignore[attr-defined]
            target = getattr(thread, "_target", None)
            code = getattr(getattr(target, "__func__", target), "__code__", None)
            if code is not None and code in self._trusted_code:
                self._known_threads.add(ident)
            elif _pool_thread(thread) and not _runs_env_code(frame):  # idle, or running library code
                self._known_threads.add(ident)
                self._pooled.add(ident)
            else:
                stray.append(ident)
        deadline = time.monotonic() + _THREAD_GRACE_S
        names = [getattr(threading._active.get(i), "name", str(i)) for i in stray]  # type: ignore[attr-defined]
        while stray and time.monotonic() < deadline:
            for ident in stray:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident),
                                                           ctypes.py_object(CallInterrupted))
            time.sleep(0.005)
            alive = sys._current_frames()
            stray = [i for i in stray if i in alive]
        if stray:  # it would run during other scenarios' calls: no request of this worker may run again
            log.error("threads %s left by environment code survive interruption; the worker exits", names)
            sys.stderr.flush()
            os._exit(75)
        self._thread_count = _thread._count()
        return [f"thread {n!r} left running" for n in names]


def _functions_in(watched: list[_Watched]) -> set[int]:
    """Ids of the functions shared namespaces hold (as methods, static/class methods, property accessors, and
    the functions their decorators wrap): whose `__code__` or defaults no request may change."""
    found: set[int] = set()
    for w in watched:
        for value in list(w.d.values()):
            todo = [value]
            while todo:
                obj = todo.pop()
                if isinstance(obj, types.FunctionType):
                    if id(obj) in found:
                        continue
                    found.add(id(obj))
                    wrapped = obj.__dict__.get("__wrapped__") if isinstance(obj.__dict__, dict) else None
                    if wrapped is not None:
                        todo.append(wrapped)
                elif isinstance(obj, staticmethod | classmethod):
                    todo.append(obj.__func__)
                elif isinstance(obj, property):
                    todo += [obj.fget, obj.fset, obj.fdel]
    return found


def _pool_thread(thread: Any) -> bool:
    """A thread of a library's pool (anyio's, under starlette's `run_in_threadpool`; asyncio's executor)."""
    anyio_backend = sys.modules.get("anyio._backends._asyncio")
    executor = sys.modules.get("concurrent.futures.thread")
    return (anyio_backend is not None and type(thread) is getattr(anyio_backend, "WorkerThread", None)) or (
        executor is not None and type(thread) is threading.Thread
        and getattr(thread, "_target", None) is getattr(executor, "_worker", _MISSING))


def _restore_mapping(w: _Watched) -> list[str]:
    """Put a registry (or os.environ's data) back as it was; returns its name if it had changed."""
    if w.name == "os.environ":
        return []  # compared and restored by value with the C environment (`_restore_environ`)
    d = w.d
    if len(d) == len(w.snap) and all(d.get(k, _MISSING) is v for k, v in w.snap.items()):
        return []
    d.clear()
    d.update(w.snap)
    return [w.name]

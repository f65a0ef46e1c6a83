"""What runs inside the verifier sandbox: the helper process and the child it forks per verifier.

The kernel protections (`awm.lockdown.Lockdown`: network namespace, Landlock, seccomp, dropped
capabilities) are also what an environment worker (`awm.runtime.worker`) applies to itself, with a
writable directory of its own and threads allowed.

`awm.verifier` starts this file as `python -I sandbox.py CONFIG` (isolated mode: no user site, no
PYTHON* variables, no script directory on sys.path) with an allow-listed environment, so it imports
only the standard library and nothing from `awm`. The helper reads JSON requests on stdin, hands each
to a child of its own and writes one JSON reply per request on stdout. Each protection has a reason:

- A warm helper that forks (with `gc.freeze`, SQLite already initialised) starts a verifier in
  milliseconds instead of paying an interpreter start per call; the helper itself only talks over pipes.
- Children are forked and locked down ahead of demand (`spare_children`): a spare waits on its
  request pipe under every protection below except the Landlock restriction, which needs the
  request's directory; the request adds that one directory to the spare's own ruleset and restricts.
  So a verifier pays for neither the fork nor the lockdown, and still reads only its own request's
  snapshots. A child serves one request and exits: nothing a verifier leaves behind reaches another.
- The two databases in a directory per request, each on its own (`place_databases`): a hard link to
  the original where Landlock (ABI 3+) and seccomp keep the child from writing, truncating or
  re-moding it and it sits on the directory's filesystem, else a private read-only copy (a WAL file's
  recent writes folded in by an SQLite backup), the only write protection on a kernel without Landlock.
- Where Landlock and seccomp guard links, spares are handed to the caller (`awm.spares`): it places
  the databases in a spare's own directory, writes the request to it and reads the result itself;
  the helper only forks, reaps and explains deaths.
- Resource limits: memory (RLIMIT_AS), CPU time as a backstop to the wall clock, open files, no file
  growth, no core dumps and no new processes for a non-root uid.
- A wall-clock deadline per child, enforced by the helper killing the child's process group.
- Landlock, where the kernel has it: read-only access to the interpreter, system libraries and the
  request's DB copies only (not another request's, the trainer's /proc/<pid>/environ, home
  directories or /tmp); no write,
  create, delete or exec; no TCP (ABI 4+); no signals or abstract sockets out (ABI 6+).
- A seccomp filter that fails fork, vfork, clone and clone3: root is exempt from RLIMIT_NPROC, and
  a process that escaped the group would outlive the deadline kill.
- Dropped capabilities when running as root, so uid 0 bypasses no permission check.
- A network namespace for the helper and all its children: a verifier needs no network.
- A parent-death signal, so a child never outlives its helper, and no_new_privs, which Landlock and
  seccomp need.
- A self-test at start: a probe verifier under the same limits and lockdown must succeed, or the
  helper reports the failure instead of turning every verdict into judge_error.
"""

import binascii
import builtins
import dataclasses
import fcntl
import gc
import importlib.util
import inspect
import itertools
import json
import linecache
import marshal
import math
import os
import pathlib
import re
import resource
import select
import selectors
import shutil
import signal
import socket
import sqlite3
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from typing import Any, NamedTuple

# The script the caller runs as `python -I HELPER_SCRIPT CONFIG`.
HELPER_SCRIPT = os.path.abspath(__file__)


def _load_lockdown() -> Any:
    """`awm.lockdown`; for the helper script, which runs without the `awm` package on its path, the file
    beside this one loaded by location (putting its directory on sys.path would let verifiers read it)."""
    if __package__:
        return importlib.import_module(f"{__package__}.lockdown")
    path = os.path.join(os.path.dirname(HELPER_SCRIPT), "lockdown.py")
    spec = importlib.util.spec_from_file_location("awm_lockdown", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


Lockdown = _load_lockdown().Lockdown

_MAX_RESULT_BYTES = 8 << 20
_MAX_RESULT_DEPTH = 64  # containers nested in a result message: `_json_safe` cuts a value at depth 51
# A request queued this long (or a quarter of its timeout, if less) starts even when every slot is
# taken, up to _OVERFLOW_FACTOR x max_workers children: hung verifiers hold their slots until their
# own deadline, and without overflow each later request would wait about ceil(hung / slots) timeouts.
_QUEUE_GRACE_S = 0.5
_OVERFLOW_FACTOR = 4
_REAP_INTERVAL_S = 0.05  # how often the helper looks for killed children that finished exiting
_TRACEBACK_LINES = 8
_MAX_COMPILED_BYTES = 1 << 20  # a compiled verifier larger than this is compiled again each time
_COMPILED_KEPT = 256  # compiled verifiers the helper keeps (least recently used go first)
_SOURCE_NAME = "<awm-verifier>"
# Imported by the helper before it forks, so a verifier's `import` of them is a dictionary lookup.
_PRELOADED = ("collections", "datetime", "decimal", "fractions", "functools", "itertools", "statistics", "zoneinfo")

_RESULT_FD, _REQUEST_FD, _RULESET_FD = 3, 4, 5


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _write_line(fd: int, message: dict[str, Any]) -> None:
    _write_all(fd, (json.dumps(message) + "\n").encode())


def _json_safe(value: Any, depth: int = 0) -> Any:
    """A copy of a verifier's return value that json.dumps accepts (sets, bytes, NaN, objects -> str/list)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if depth > 50:
        return repr(value)[:200]
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(k): _json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(item, depth + 1) for item in value]
    if isinstance(value, set | frozenset):
        return sorted((_json_safe(item, depth + 1) for item in value), key=repr)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _traceback_tail(exc: BaseException) -> str:
    """The last lines of the verifier's traceback: this file's frames and caret lines left out, and
    the verifier's locals dropped first (they may be the memory bomb that raised)."""
    tb = exc.__traceback__
    traceback.clear_frames(tb)
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    lines = "".join(traceback.format_exception(type(exc), exc, tb)).rstrip().splitlines()
    lines = [line for line in lines if line.strip(" ^~")]
    return "\n".join(lines[-_TRACEBACK_LINES:])[-2000:]


def _call_bound(func: Any, initial: str, final: str, final_answer: str | None) -> Any:
    """Call the verifier with arguments bound by parameter name, positionally when no name matches."""
    params = inspect.signature(func).parameters
    answer = final_answer or ""
    named = (("initial_db_path", initial), ("final_db_path", final), ("final_answer", answer))
    kwargs = {name: value for name, value in named if name in params}
    if not kwargs and len(params) >= 2:
        return func(*[initial, final, answer][: min(len(params), 3)])
    return func(**kwargs)


def _run_verifier(request: dict[str, Any], initial: str, final: str) -> dict[str, Any]:
    code, name = request["code"], request["function"]
    # Register the source so tracebacks show the verifier's lines, not just their numbers.
    linecache.cache[_SOURCE_NAME] = (len(code), None, code.splitlines(True), _SOURCE_NAME)
    namespace: dict[str, Any] = {
        "__name__": "awm_verifier",
        "__builtins__": builtins,
        "sqlite3": sqlite3,
        "json": json,
        "os": os,
    }
    if request["mode"] == "code":
        namespace["re"] = re
    try:
        # A verifier runs once per episode, so the helper keeps its compiled form (0.5-1 ms of compile);
        # it is taken here, before the verifier's own code runs and could tamper with it.
        compiled = request.get("compiled")
        program = marshal.loads(binascii.a2b_base64(compiled)) if compiled else compile(code, _SOURCE_NAME, "exec")
        keep = _encode_program(program) if request.get("want_compiled") else None
        exec(program, namespace)
        func = namespace.get(name)
        if not callable(func):
            return {"ok": False, "error": f"the verifier code defines no function named {name!r}"}
        value = _call_bound(func, initial, final, request.get("final_answer"))
        reply = {"ok": True, "type": type(value).__name__, "value": _json_safe(value)}
        return {**reply, "compiled": keep} if keep else reply
    except BaseException as exc:  # SystemExit and MemoryError included: all are the verifier's failures
        namespace.clear()
        return {"ok": False, "error": _traceback_tail(exc)}


def _encode_program(program: Any) -> str | None:
    """A compiled verifier as text for the helper's cache (None when too large to keep)."""
    data = marshal.dumps(program)
    return binascii.b2a_base64(data, newline=False).decode("ascii") if len(data) <= _MAX_COMPILED_BYTES else None


def _copy_database(src: str, dst: str) -> None:
    """A self-contained copy: a plain file copy, or an SQLite backup when a WAL file holds recent writes."""
    wal = src + "-wal"
    if os.path.exists(wal) and os.path.getsize(wal) > 0:
        source = sqlite3.connect(pathlib.Path(src).resolve().as_uri() + "?mode=ro", uri=True)
        target = sqlite3.connect(dst)
        try:
            source.backup(target)
            target.execute("PRAGMA journal_mode=DELETE")
        finally:
            source.close()
            target.close()
    else:
        shutil.copyfile(src, dst)


def _rollback_journal_database(path: str) -> bool:
    """An SQLite file in rollback-journal mode with no WAL file beside it: complete in itself, so a reader
    of a hard link to it sees every committed write (a WAL database needs its -wal and -shm files)."""
    try:
        with open(path, "rb") as handle:
            header = handle.read(20)
    except OSError:
        return False
    return header[:16] == b"SQLite format 3\0" and header[18:20] == b"\1\1" and not os.path.exists(path + "-wal")


def _linkable(src: str, device: int) -> bool:
    """Whether a hard link to `src` can stand in for a copy in a directory on `device`: a link cannot
    cross filesystems, and only a rollback-journal database is complete in its one file."""
    try:
        return os.stat(src).st_dev == device and _rollback_journal_database(src)
    except OSError:
        return False


class Placed(NamedTuple):
    """The request's databases as a child sees them, and how many of the two are hard links."""

    initial: str
    final: str
    linked: int


def place_databases(request: dict[str, Any], reqdir: str, *, link: bool) -> Placed:
    """Put the request's two databases in the existing `reqdir` as initial.db and final.db, each on its
    own: a hard link to the original where `link` allows it and `_linkable` holds, else a private
    read-only copy (a WAL file's recent writes folded in). Raises OSError (FileNotFoundError naming the
    database when one is missing); what it made stays in `reqdir`, whose owner removes it.

    `link` only for a child whose lockdown `guards_linked_files`: a link is the original's inode, and
    what keeps the verifier from changing it is Landlock (no write, no truncate) and seccomp (no
    chmod, chown, utime or xattr), not a copy; on a kernel without Landlock the copies are the only
    write protection. The originals are quiescent while verified: an episode's database uses a
    rollback journal in memory and runs no tool call during `Episode.verify`, and a template is
    written (atomically, then its env-code schema folded in) before any episode of it opens.
    """
    device = os.stat(reqdir).st_dev if link else -1
    paths, linked = [], 0
    for label in ("initial", "final"):
        src, dst = request[f"{label}_db"], os.path.join(reqdir, f"{label}.db")
        if link and _linkable(src, device):
            try:
                os.link(src, dst)
                paths.append(dst)
                linked += 1
                continue
            except OSError:
                pass  # gone since the check, or a filesystem that refuses links: copy, or say it is missing
        if not os.path.isfile(src):
            raise FileNotFoundError(f"{label} database not found: {src}")
        _copy_database(src, dst)
        os.chmod(dst, 0o444)
        paths.append(dst)
    return Placed(paths[0], paths[1], linked)


def _redirect_stdio(keep: tuple[int, ...]) -> None:
    """Leave the child /dev/null as stdio and the fds in `keep` as 3, 4, ... in order, nothing else."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    # Copy all above their targets first: one may sit where another is going.
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, _RESULT_FD + len(keep)) for fd in keep]
    for target, source in enumerate(high, start=_RESULT_FD):
        os.dup2(source, target)
    os.closerange(_RESULT_FD + len(keep), resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def _apply_limits(settings: dict[str, Any]) -> None:
    """The limits a waiting child takes on; the CPU limit follows with the request (`_limit_cpu`)."""
    limits = [
        ("RLIMIT_AS", settings["memory_bytes"], settings["memory_bytes"]),
        ("RLIMIT_NOFILE", settings["max_open_files"], settings["max_open_files"]),
        ("RLIMIT_FSIZE", 0, 0),  # no file can grow, wherever the verifier manages to open one
        ("RLIMIT_CORE", 0, 0),
        ("RLIMIT_NPROC", 0, 0),  # no fork for a non-root uid (root is exempt: seccomp covers it)
    ]
    for name, soft, hard in limits:
        limit = getattr(resource, name, None)
        if limit is not None:
            resource.setrlimit(limit, (soft, hard))


def _limit_cpu(timeout_s: float) -> None:
    """CPU time as a backstop (the helper's wall-clock deadline comes first): SIGXCPU, SIGKILL 1 s later."""
    cpu_s = math.ceil(timeout_s) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))


def _warm_up(db_path: str) -> None:
    """Do what every verifier does (open SQLite read-only, read rows into dicts, run a regex, JSON)
    before the request: in the helper, so SQLite's one-time setup is inherited; in a spare, so the
    copy-on-write faults and allocator growth that a fresh fork pays fall before the clock starts."""
    conn = sqlite3.connect(pathlib.Path(db_path).as_uri() + "?mode=ro", uri=True)
    try:
        cursor = conn.execute("SELECT * FROM sqlite_master")
        columns = [d[0] for d in cursor.description]
        [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
    finally:
        conn.close()
    re.sub(r"<think>.*?</think>", " ", "<think>a</think>b", flags=re.S)
    json.loads(json.dumps({"result": "complete"}))
    _call_bound(lambda initial_db_path, final_db_path: None, "", "", None)  # inspect.signature: 0.1-0.2 ms cold


def _read_request() -> dict[str, Any] | None:
    """The one request the helper writes on fd 4, a JSON line, or None at a bare end of file. Read up
    to the newline: waiting for the end of file too would cost a second wake-up on a busy machine."""
    data = bytearray()
    while not data.endswith(b"\n"):
        chunk = os.read(_REQUEST_FD, 1 << 16)
        if not chunk:
            break
        data += chunk
    os.close(_REQUEST_FD)
    return json.loads(data) if data.strip() else None


def _child_main(server: "_Server", request_fd: int, result_fd: int, spare: bool, own_dir: str | None) -> None:
    """Body of a forked child: lock down, wait for a request, confine to its directory, run it, report
    on fd 3. Never returns. All but the last Landlock step happen before the request, off its clock;
    a spare handed to the caller has a directory of its own (`own_dir`) and takes that step too."""
    os.setpgid(0, 0)  # own process group: the helper kills the group on timeout
    setup_error: BaseException | None = None
    try:
        ruleset_fd = server.lockdown.new_ruleset()  # from the helper's open rule fds, closed just below
    except BaseException as exc:
        ruleset_fd, setup_error = -1, exc
    _redirect_stdio((result_fd, request_fd) + ((ruleset_fd,) if ruleset_fd >= 0 else ()))
    ruleset_fd = _RULESET_FD if ruleset_fd >= 0 else -1
    try:
        _apply_limits(server.settings)
        server.lockdown.prepare(server.pid)
        if spare:  # a child forked for a waiting request skips it: that would be on the request's clock
            _warm_up(server.warm_db)
        if own_dir is not None:  # a spare for the caller: its request's links will appear in its own dir
            server.lockdown.confine(ruleset_fd, own_dir)
            ruleset_fd = -1
    except BaseException as exc:
        setup_error = setup_error or exc
    request = _read_request()
    if request is None:  # retired unused
        os._exit(0)
    try:
        if setup_error is not None:
            raise setup_error
        _limit_cpu(request["timeout_s"])
        os.chdir(request["dir"])
        server.lockdown.confine(ruleset_fd, request["dir"])
        message = _run_verifier(request, request["initial"], request["final"])
    except BaseException as exc:
        message = {"ok": False, "error": f"sandbox setup failed: {exc!r}"}
    try:
        data = json.dumps(message).encode()
    except BaseException:
        data = b'{"ok": false, "error": "the verifier result could not be encoded"}'
    _write_all(_RESULT_FD, data + b"\n")  # the helper answers on this newline, before the process exit
    os.close(_RESULT_FD)
    os._exit(0)


# Run once at helper start under the full lockdown, on snapshots of a small database: a sandbox that
# cannot import a module or read its databases would turn every verdict into judge_error, so it must
# fail at start instead.
_PROBE_CODE = """
def verify_probe(initial_db_path, final_db_path):
    import decimal, fractions, statistics, zoneinfo
    for path in (initial_db_path, final_db_path):
        sqlite3.connect(f"file:{path}?mode=ro", uri=True).execute("SELECT * FROM probe").fetchall()
    return {"result": "complete"}
"""


@dataclasses.dataclass
class _Child:
    """A forked child that serves one request: it waits, locked down but for its last Landlock rule."""

    pid: int
    request_fd: int  # the helper writes one request here and closes it
    result_fd: int  # the child's answer; end of file once it exits
    own_dir: str | None = None  # a spare for the caller: where its request's databases get linked


@dataclasses.dataclass
class _Handed:
    """A spare handed to the caller (`hand_spares`): the helper keeps only a pidfd, to reap it when it ends."""

    pid: int
    pidfd: int
    own_dir: str


@dataclasses.dataclass
class _Job:
    request_id: int
    child: _Child
    deadline: float
    timeout_s: float
    reqdir: str
    code: str | None = None  # the verifier's source, when the helper asked for its compiled form
    output: bytearray = dataclasses.field(default_factory=bytearray)


def kill_group(pid: int) -> None:
    """SIGKILL a whole process group; quiet when it is already gone."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def describe_exit(returncode: int) -> str:
    """'signal SIGKILL' or 'exit code 3', from a subprocess-style return code."""
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def remove_tree(path: str) -> None:
    """Delete a request or helper directory, including the read-only ones made for children."""
    for root, dirs, _ in os.walk(path):
        for name in dirs:
            try:
                os.chmod(os.path.join(root, name), 0o700)
            except OSError:
                pass
    shutil.rmtree(path, ignore_errors=True)


def timeout_reply(timeout_s: float) -> dict[str, Any]:
    return {"status": "timeout", "detail": f"verifier ran past its {timeout_s:g} s wall-clock limit and was killed"}


def read_result(output: bytearray, chunk: bytes) -> tuple[bool, dict[str, Any] | None]:
    """Take one read from a child's result pipe into `output`: (finished, reply); finished with no reply
    means the child ended without one (its exit status tells why). The child ends its message with a
    newline (JSON has none inside): answering there, not at the end of file, saves a second wake-up."""
    if chunk and len(output) + len(chunk) <= _MAX_RESULT_BYTES:
        output += chunk
        reply = _reply_from_output(bytes(output)) if chunk.endswith(b"\n") else None
        return reply is not None, reply
    if chunk:
        return True, {"status": "error", "detail": f"verifier result is larger than {_MAX_RESULT_BYTES} bytes"}
    return True, _reply_from_output(bytes(output))


class CompiledForms:
    """Verifier source -> its compiled form (marshal, base64), the least recently used dropped past
    `_COMPILED_KEPT`. A verifier runs once per episode of its task, and compiling costs 0.5-1 ms; the
    child that first runs one hands its form back, taken before the verifier's own code runs. Whoever
    keeps the forms (the helper, or a caller that talks to children directly) never loads them."""

    def __init__(self) -> None:
        self._forms: dict[str, str] = {}
        self._lock = threading.Lock()  # a caller's threads share one

    def request_fields(self, code: Any) -> dict[str, Any]:
        """What a request carries: the kept form, or a wish for one."""
        with self._lock:
            form = self._forms.pop(code, None) if isinstance(code, str) else None
            if form is not None:
                self._forms[code] = form  # most recently used last
        return {"compiled": form} if form else {"want_compiled": isinstance(code, str)}

    def keep(self, code: str, form: Any) -> None:
        if not isinstance(form, str) or not form:
            return
        with self._lock:
            self._forms[code] = form
            while len(self._forms) > _COMPILED_KEPT:
                del self._forms[next(iter(self._forms))]


def request_payload(request: dict[str, Any], fields: dict[str, Any], reqdir: str, initial: str, final: str) -> bytes:
    """The JSON line a child reads on its request pipe."""
    return (json.dumps({**request, **fields, "dir": reqdir, "initial": initial, "final": final}) + "\n").encode()


def nested_deeper(value: Any, limit: int) -> bool:
    """Whether parsed JSON `value` nests containers more than `limit` deep; walked without recursion, so hostile
    nesting cannot raise RecursionError in its reader (verifier results here, model arguments in
    `awm_grpo.protocol`). Here, not in `awm.runtime.wire`: this file also runs alone, with the stdlib only."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def _reply_from_output(output: bytes) -> dict[str, Any] | None:
    """The reply a child's result message makes, or None when it left none.

    The message is data the verifier's code could have written itself (fd 3 is open to it): one nested
    past what the trainer's JSON code follows (RecursionError, here or when the reply is passed on) is a
    crashed verifier, an error reply (judge_error: dropped, never scored)."""
    try:
        message = json.loads(output)
    except ValueError:
        return None
    except RecursionError:
        message = None
        deep = True
    else:
        deep = nested_deeper(message, _MAX_RESULT_DEPTH)
    if deep:
        return {"status": "error", "detail": f"verifier result message nests deeper than {_MAX_RESULT_DEPTH} "
                                             "levels (not one the sandbox writes): counted as a verifier crash"}
    if not (isinstance(message, dict) and "ok" in message):
        return None
    if message["ok"]:
        reply = {"status": "ok", "value": message.get("value"), "type": message.get("type", "")}
        compiled = message.get("compiled")
        return {**reply, "compiled": compiled} if isinstance(compiled, str) else reply
    return {"status": "error", "detail": str(message.get("error", ""))}


def _reply_from_status(status: int) -> dict[str, Any]:
    """The reply for a child that ended without a result, from its wait status."""
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXCPU:
        return {"status": "timeout", "detail": "verifier exceeded its CPU time limit and was killed"}
    how = describe_exit(os.waitstatus_to_exitcode(status))
    return {"status": "error", "detail": f"verifier process ended without a result ({how})"}


class _Server:
    """The helper's loop: read requests on stdin, hand them to waiting children, collect results,
    enforce deadlines, and keep `spare_children` children forked and locked down ahead of demand."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings
        self.pid = os.getpid()
        self.workdir = settings["workdir"]
        self.lockdown = Lockdown(())  # children add their own request directory (`Lockdown.confine`)
        self.link = bool(settings.get("link_databases", True)) and self.lockdown.guards_linked_files
        self.warm_db = os.path.join(self.workdir, "probe.db")
        self.compiled = CompiledForms()
        _make_probe_db(self.warm_db)
        for name in _PRELOADED:
            __import__(name)
        _warm_up(self.warm_db)
        self.selector = selectors.DefaultSelector()
        self.inbox = bytearray()
        self.queue: deque[dict[str, Any]] = deque()
        self.jobs: dict[int, _Job] = {}
        self.spares: deque[_Child] = deque()
        self.dying: list[int] = []  # killed children not reaped yet
        # Spares handed to the caller, which writes a request to one and reads its result itself: two
        # wake-ups (child, caller) instead of five. Only where Landlock and seccomp guard links (the caller
        # links what it can into the spare's directory, and copies the rest there).
        handover = settings.get("handover_fd")
        self.handover = socket.socket(fileno=handover) if isinstance(handover, int) else None
        self.hand = self.handover is not None and self.link and hasattr(os, "pidfd_open")
        self.spare_ids = itertools.count()
        self.handed: dict[int, _Handed] = {}  # pid -> handed spare, until it ends and is reaped
        self.exited: dict[int, int] = {}  # pid -> wait status of ended handed spares (the newest few)
        self.awaiting: dict[int, int] = {}  # pid -> id of a status request that waits for it to end

    def self_test(self) -> str:
        """Run the probe verifier under the full lockdown; return "" or what went wrong."""
        probe = {
            "id": -1,
            "mode": "probe",
            "code": _PROBE_CODE,
            "function": "verify_probe",
            "initial_db": self.warm_db,
            "final_db": self.warm_db,
            "timeout_s": 10.0,
        }
        job = self._start(probe)
        if job is None:
            return "could not start the probe (see its error reply)"
        fd = job.child.result_fd
        self.selector.unregister(fd)
        while select.select([fd], [], [], max(0.0, job.deadline - time.monotonic()))[0]:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            job.output += chunk
        del self.jobs[fd]
        reply = _reply_from_output(bytes(job.output))
        if reply is None:
            reply = _reply_from_status(self._reap(job.child))
        else:
            self._retire(job.child)  # reaped by the loop: it was left a zombie for the helper's life
        remove_tree(job.reqdir)
        return "" if reply.get("value") == {"result": "complete"} else reply.get("detail") or "no answer"

    def _may_start(self, now: float) -> bool:
        """Start the head of the queue: a free slot, or an overflow slot once it waited past its grace."""
        if len(self.jobs) < self.settings["max_workers"]:
            return True
        return (len(self.jobs) < _OVERFLOW_FACTOR * self.settings["max_workers"]
                and now >= self._grace_end(self.queue[0]))

    @staticmethod
    def _grace_end(request: dict[str, Any]) -> float:
        return request["queued_at"] + min(_QUEUE_GRACE_S, request["timeout_s"] / 4)

    def serve(self) -> None:
        self.selector.register(0, selectors.EVENT_READ)
        while True:
            while self.queue and self._may_start(time.monotonic()):
                self._start(self.queue.popleft())
            wake = [job.deadline for job in self.jobs.values()]
            if self.queue:
                wake.append(self._grace_end(self.queue[0]))
            if self.dying:
                wake.append(time.monotonic() + _REAP_INTERVAL_S)
            timeout = max(0.0, min(wake) - time.monotonic()) if wake else None
            waiting = len(self.handed) if self.hand else len(self.spares)
            if not self.queue and not self.jobs and waiting < self.settings["spare_children"]:
                # Only while no verifier runs: under load a spare's setup would compete with them for
                # CPU (and a busy helper forks per request anyway). One fork per turn, so a request
                # that arrives meanwhile waits for one fork at most.
                try:
                    own_dir = os.path.join(self.workdir, f"spare-{next(self.spare_ids)}") if self.hand else None
                    child = self._fork(spare=True, own_dir=own_dir)
                    if self.hand:
                        self._hand_over(child)
                    else:
                        self.spares.append(child)
                    timeout = 0.0
                except OSError:
                    pass  # out of processes or memory: a request forks its own child when it comes
            for key, _ in self.selector.select(timeout):
                if key.fd == 0:
                    if not self._read_requests():
                        self._shutdown()
                        return
                elif isinstance(key.data, _Job):
                    self._read_child(key.data)
                elif isinstance(key.data, _Handed):
                    self._reap_handed(key.data)
                else:
                    self._drop_spare(key.data)
            self._collect_dying()
            now = time.monotonic()
            for job in [job for job in self.jobs.values() if job.deadline <= now]:
                self._finish(job, timeout_reply(job.timeout_s))

    def _read_requests(self) -> bool:
        chunk = os.read(0, 1 << 20)
        if not chunk:
            return False
        self.inbox += chunk
        *lines, rest = bytes(self.inbox).split(b"\n")
        self.inbox = bytearray(rest)
        now = time.monotonic()
        for request in (json.loads(line) for line in lines if line.strip()):
            if request.get("mode") == "status":
                self._answer_status(request["id"], request["pid"])
            else:
                self.queue.append({**request, "queued_at": now})
        return True

    def _hand_over(self, child: _Child) -> None:
        """Pass a new spare's request and result pipes and a pidfd to the caller (SCM_RIGHTS); keep a pidfd."""
        self.selector.unregister(child.result_fd)
        try:
            pidfd = os.pidfd_open(child.pid)
            try:
                socket.send_fds(self.handover, [json.dumps({"pid": child.pid, "dir": child.own_dir}).encode()],
                                [child.request_fd, child.result_fd, pidfd])
            except OSError:
                os.close(pidfd)
                raise
        except OSError:  # the caller stopped taking spares: serve every request here from now on
            self.hand = False
            os.close(child.request_fd)
            self._reap(child)
            remove_tree(child.own_dir)
            return
        os.close(child.request_fd)  # the caller's copies are the only ones now
        os.close(child.result_fd)
        handed = _Handed(child.pid, pidfd, child.own_dir)
        self.handed[child.pid] = handed
        self.selector.register(pidfd, selectors.EVENT_READ, handed)

    def _reap_handed(self, handed: _Handed) -> None:
        """A handed spare ended (served its request, killed, or died waiting): reap it, keep its status."""
        self.selector.unregister(handed.pidfd)
        os.close(handed.pidfd)
        del self.handed[handed.pid]
        kill_group(handed.pid)  # anything left in its process group
        _, status = os.waitpid(handed.pid, 0)
        remove_tree(handed.own_dir)
        request_id = self.awaiting.pop(handed.pid, None)
        if request_id is not None:
            self._answer(request_id, _reply_from_status(status))
            return
        self.exited[handed.pid] = status
        while len(self.exited) > 4 * max(1, self.settings["spare_children"]):
            del self.exited[next(iter(self.exited))]

    def _answer_status(self, request_id: int, pid: int) -> None:
        """Why a handed spare ended without a result (the caller saw its pipe close): now, or once reaped."""
        if pid in self.exited:
            self._answer(request_id, _reply_from_status(self.exited.pop(pid)))
        elif pid in self.handed:
            self.awaiting[pid] = request_id
        else:
            self._answer(request_id, {"status": "error", "detail": f"verifier process {pid} is unknown to the helper"})

    def _fork(self, spare: bool, own_dir: str | None = None) -> _Child:
        """A new child that locks itself down and waits on its request pipe (raises OSError if fork fails);
        with `own_dir`, a directory made for it that its Landlock rules let it read."""
        if own_dir is not None:
            os.mkdir(own_dir, 0o700)
        request_read, request_write = os.pipe()
        result_read, result_write = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            for fd in (request_read, request_write, result_read, result_write):
                os.close(fd)
            if own_dir is not None:
                os.rmdir(own_dir)
            raise
        if pid == 0:
            try:
                _child_main(self, request_read, result_write, spare, own_dir)
            finally:
                os._exit(70)
        os.close(request_read)
        os.close(result_write)
        child = _Child(pid, request_write, result_read, own_dir)
        self.selector.register(result_read, selectors.EVENT_READ, child)  # a spare that dies is noticed
        return child

    def _drop_spare(self, child: _Child) -> None:
        """A waiting child ended (killed from outside, or out of memory): reap it; the loop forks another."""
        self.spares.remove(child)
        self.selector.unregister(child.result_fd)
        os.close(child.request_fd)
        self._reap(child)

    def _reap(self, child: _Child) -> int:
        """Kill the child's group (it may linger after closing its pipe), wait for it, close its result pipe."""
        os.close(child.result_fd)
        kill_group(child.pid)
        _, status = os.waitpid(child.pid, 0)
        return status

    def _retire(self, child: _Child) -> None:
        """`_reap` without the wait: the exit of a large process takes a while, and nobody needs its status."""
        os.close(child.result_fd)
        kill_group(child.pid)
        self.dying.append(child.pid)

    def _collect_dying(self) -> None:
        for pid in list(self.dying):
            if os.waitpid(pid, os.WNOHANG)[0]:
                self.dying.remove(pid)

    def _answer(self, request_id: int, reply: dict[str, Any]) -> None:
        _write_line(1, {"id": request_id, **reply})

    def _start(self, request: dict[str, Any]) -> _Job | None:
        """Snapshot the request's databases and hand it to a waiting child (a new one if none waits)."""
        reqdir = os.path.join(self.workdir, f"req-{request['id']}")
        try:
            os.mkdir(reqdir, 0o700)
            initial, final, _ = place_databases(request, reqdir, link=self.link)
            os.chmod(reqdir, 0o555)
        except Exception as exc:
            remove_tree(reqdir)
            self._answer(request["id"], {"status": "error", "detail": f"could not snapshot the databases: {exc}"})
            return None
        fields = self.compiled.request_fields(request.get("code"))
        payload = request_payload(request, fields, reqdir, initial, final)
        for _ in range(3):  # a spare may have died since the loop last looked
            try:
                child = self.spares.popleft() if self.spares else self._fork(spare=False)
            except OSError as exc:
                remove_tree(reqdir)
                self._answer(request["id"], {"status": "error", "detail": f"could not fork a verifier: {exc}"})
                return None
            try:
                _write_all(child.request_fd, payload)
                break
            except OSError:
                self.selector.unregister(child.result_fd)
                self._reap(child)
            finally:
                os.close(child.request_fd)
        else:
            remove_tree(reqdir)
            self._answer(request["id"], {"status": "error", "detail": "verifier children die before they start"})
            return None
        now = time.monotonic()
        job = _Job(request["id"], child, now + request["timeout_s"], request["timeout_s"], reqdir,
                   request["code"] if fields.get("want_compiled") else None)
        self.jobs[child.result_fd] = job
        self.selector.modify(child.result_fd, selectors.EVENT_READ, job)
        return job

    def _read_child(self, job: _Job) -> None:
        finished, reply = read_result(job.output, os.read(job.child.result_fd, 1 << 16))
        if finished:
            self._finish(job, reply)

    def _finish(self, job: _Job, reply: dict[str, Any] | None) -> None:
        """Answer (first, when the reply is known: the caller waits on it), then reap the child and clean up."""
        self.selector.unregister(job.child.result_fd)
        del self.jobs[job.child.result_fd]
        if reply is not None:
            compiled = reply.pop("compiled", None)
            self._answer(job.request_id, reply)
            if job.code is not None:
                self.compiled.keep(job.code, compiled)
            self._retire(job.child)
        else:
            self._answer(job.request_id, _reply_from_status(self._reap(job.child)))
        remove_tree(job.reqdir)

    def _shutdown(self) -> None:
        for job in list(self.jobs.values()):
            self._reap(job.child)
        for child in self.spares:
            os.close(child.request_fd)
            self._reap(child)
        for handed in list(self.handed.values()):
            self._reap_handed(handed)
        for pid in self.dying:
            os.waitpid(pid, 0)
        remove_tree(self.workdir)


def _make_probe_db(path: str) -> None:
    """The small database the self-test reads and every child warms up on."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("CREATE TABLE probe (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO probe (name) VALUES ('ok')")
        conn.commit()
    finally:
        conn.close()


def _helper_main(config: str) -> None:
    """Entry point of the helper process: find the protections, prove them with a probe, then serve."""
    defaults = {"memory_bytes": 1 << 30, "max_workers": 4, "max_open_files": 64, "spare_children": 2}
    settings = {**defaults, **json.loads(config)}
    if "workdir" not in settings:  # started by hand: never reuse (and later delete) the current directory
        settings["workdir"] = tempfile.mkdtemp(prefix="awm-verifier-")
    server = _Server(settings)
    gc.freeze()  # keep the warm heap shared with children instead of copied by the collector
    failure = server.self_test()
    hello = {"pid": server.pid, "protections": server.lockdown.describe(), "self_test": failure,
             "linked_databases": server.link, "hands_spares": server.hand}
    _write_line(1, hello)
    if not failure:
        server.serve()


if __name__ == "__main__":
    _helper_main(sys.argv[1] if len(sys.argv) > 1 else "{}")

"""Run AWM verifiers outside the caller's process, with limits, and turn their output into a Verdict.

Upstream AWM `exec`s verifier code in the caller with full builtins, no timeout and the real DB
files (chmod 0444 is its only guard), so one bad verifier hangs or poisons a trainer. Here a warm
helper process (`python -I`, allow-listed environment) runs each request in a child of its own,
forked and locked down ahead of demand; the child works on the two databases (hard links where
Landlock and seccomp keep it from changing them, else private read-only copies) under resource
limits and, where the kernel offers them, Landlock (read-only allow-list: its own request's
databases, no exec, no TCP, no signals out), a seccomp filter (no fork, no chmod), dropped
capabilities (root) and a network namespace. A child's wall-clock deadline is enforced by the helper,
or by this process where it wrote the request to the child itself (`awm.spares`).

The helper's side (the lockdown, the limits, the forking loop) lives in `awm.sandbox`; this module
starts it, talks to it over pipes and turns its replies into verdicts.
"""

import asyncio
import dataclasses
import itertools
import json
import os
import re
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, InvalidStateError
from typing import Any

from awm.sandbox import (
    HELPER_SCRIPT,
    CompiledForms,
    describe_exit,
    kill_group,
    place_databases,
    remove_tree,
    request_payload,
)
from awm.spares import Spare, SparePool

CODE_VERDICTS = ("complete", "others", "judge_error", "timeout")
SQL_VERDICTS = ("complete", "incomplete", "agent_error", "server_error", "judge_error", "timeout")
# Verdicts that say nothing about the agent: the trainer drops these samples instead of scoring 0.
INFRA_FAILURES = frozenset({"judge_error", "timeout", "server_error"})
DEFAULT_FUNCTIONS = {"code": "verify_task_completion", "sql": "verify_task"}

# The only variables the helper (and so any verifier) can see: no API keys, no PYTHON* settings.
_ENV_ALLOWLIST = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ")
# Verifiers may not start threads (seccomp, RLIMIT_NPROC): keep numeric libraries single-threaded.
_ENV_FIXED = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_THINK_OPEN = re.compile(r"<think>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</think>", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The outcome of one verification, in AWM's vocabulary (see awm-format.md section 8)."""

    verdict: str
    mode: str
    detail: str = ""
    result: dict | None = None
    elapsed_s: float = 0.0

    def __post_init__(self) -> None:
        allowed = {"code": CODE_VERDICTS, "sql": SQL_VERDICTS}.get(self.mode)
        if allowed is None:
            raise ValueError(f"verdict mode {self.mode!r} is unknown: use 'code' or 'sql'")
        if self.verdict not in allowed:
            raise ValueError(
                f"verdict {self.verdict!r} is not valid in {self.mode} mode: use one of {allowed}"
            )

    @property
    def infra_failure(self) -> bool:
        """True when the verdict reflects the verifier or environment, not the agent: drop, never score 0."""
        return self.verdict in INFRA_FAILURES

    @property
    def complete(self) -> bool:
        return self.verdict == "complete"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class SandboxRun:
    """What one verifier call produced in the sandbox, before any verdict is drawn from it."""

    status: str  # "ok" | "error" | "timeout"
    value: Any = None  # the verifier's return value, made JSON-safe (status "ok")
    value_type: str = ""  # the Python type name of the value before it was made JSON-safe
    detail: str = ""
    elapsed_s: float = 0.0


@dataclasses.dataclass
class SandboxStats:
    """How a sandbox's requests reached their children, so tests and benchmarks can tell the paths
    apart: `direct` ones were written by this process to a spare the helper handed over, with their
    databases placed in its directory (`linked` and `copied` count those files); the rest went
    `through_helper`, which places their databases itself."""

    direct: int = 0
    through_helper: int = 0
    linked: int = 0
    copied: int = 0


class SandboxError(RuntimeError):
    """The sandbox cannot serve requests (closed, or its helper cannot start)."""


def strip_thinking(text: str | None) -> str:
    """Remove <think>...</think> reasoning so a verifier reads only the answer the user would see.

    Also drops reasoning whose opening tag sat in the prompt (text before an orphan `</think>`,
    as Qwen3 chat templates produce) and a block opened but never closed (the model ran out of
    tokens while thinking).
    """
    if not text:
        return ""
    answer = _THINK_BLOCK.sub("", text)
    closings = list(_THINK_CLOSE.finditer(answer))
    if closings:
        answer = answer[closings[-1].end() :]
    opening = _THINK_OPEN.search(answer)
    if opening:
        answer = answer[: opening.start()]
    return answer.strip()


def verifier_function_name(code: str, mode: str = "code") -> str:
    """The function to call, found as upstream does: the first line starting with `def verify_`."""
    for line in code.splitlines():
        stripped = line.strip()
        if stripped.startswith("def verify_") and "(" in stripped:
            return stripped[len("def ") : stripped.index("(")].strip()
    return DEFAULT_FUNCTIONS[mode]


def code_verdict(run: SandboxRun) -> Verdict:
    """Map a code-mode run to a verdict with upstream's rules (bad shape -> judge_error, odd value -> others)."""
    if run.status == "timeout":
        return Verdict("timeout", "code", run.detail, None, run.elapsed_s)
    if run.status != "ok":
        return Verdict("judge_error", "code", run.detail, None, run.elapsed_s)
    value = run.value
    if not isinstance(value, dict):
        detail = (
            f"verifier returned {run.value_type or type(value).__name__}, expected a dict with a 'result' key"
        )
        return Verdict("judge_error", "code", detail, None, run.elapsed_s)
    if "result" not in value:
        detail = f"verifier's dict has no 'result' key (keys: {sorted(value)[:10]})"
        return Verdict("judge_error", "code", detail, value, run.elapsed_s)
    if value["result"] in ("complete", "others"):
        return Verdict(value["result"], "code", "", value, run.elapsed_s)
    detail = f"verifier returned result {value['result']!r}; counted as 'others'"
    return Verdict("others", "code", detail, value, run.elapsed_s)


class _HelperGone(Exception):
    """The helper process ended before it accepted a request."""


def _resolve(future: Future, reply: dict) -> None:
    """Complete a future unless its waiter already gave up on it (cancelled)."""
    try:
        if not future.done():
            future.set_result(reply)
    except InvalidStateError:
        pass


@dataclasses.dataclass
class _Direct:
    """A request written straight to a spare the helper handed over (`awm.spares`)."""

    helper: "_Helper"
    spare: Spare
    request: dict[str, Any]
    wants_form: bool  # the child hands back the verifier's compiled form for the caller to keep
    linked: int  # of the two databases, how many the caller linked into the spare's directory (the rest: copied)

    def finish(self, reply: dict[str, Any] | None) -> dict[str, Any] | Future:
        """The reply, or (the child ended without one) the helper's answer on how it ended. The helper
        removes the spare's directory and the links in it when it reaps the child."""
        if reply is None:
            return self.helper.status(self.request["id"], self.spare.pid)
        form = reply.pop("compiled", None)
        if self.wants_form:
            self.helper.compiled.keep(self.request["code"], form)
        return reply


class _Helper:
    """One helper process, its private directory and the requests it has in flight."""

    def __init__(self, settings: dict[str, Any], start_timeout_s: float, workdir_parent: str | None) -> None:
        self.workdir = tempfile.mkdtemp(prefix="awm-verifier-", dir=workdir_parent)
        env = {key: os.environ[key] for key in _ENV_ALLOWLIST if key in os.environ}
        env.update(_ENV_FIXED, HOME=self.workdir)
        # The helper hands its spares over on this socket (`awm.spares`), where it can.
        pair = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) if settings["hand_spares"] else None
        ours, theirs = pair if pair is not None else (None, None)
        handover = {"handover_fd": theirs.fileno()} if theirs is not None else {}
        config = json.dumps({**settings, **handover, "workdir": self.workdir})
        self.proc = subprocess.Popen(
            [sys.executable, "-I", HELPER_SCRIPT, config],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=self.workdir,
            env=env,
            start_new_session=True,  # own process group: close() kills it as a whole
            pass_fds=(theirs.fileno(),) if theirs is not None else (),
        )
        if theirs is not None:
            theirs.close()
        self.pending: dict[int, Future] = {}
        self.lock = threading.Lock()  # guards pending and alive; never held while blocking on a pipe
        self.write_lock = threading.Lock()
        self.alive = True
        self.stopping = False
        self.pool: SparePool | None = None
        self.compiled = CompiledForms()  # for requests written to spares directly
        try:
            self.protections, hands_spares = self._read_hello(start_timeout_s)
        except SandboxError:
            if ours is not None:
                ours.close()
            raise
        if ours is not None and hands_spares:
            self.pool = SparePool(ours)
        elif ours is not None:
            ours.close()
        self.reader = threading.Thread(
            target=self._read_replies, name=f"awm-verifier-{self.proc.pid}", daemon=True
        )
        self.reader.start()

    def _read_hello(self, timeout_s: float) -> tuple[dict[str, Any], bool]:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline() if ready else b""
        try:
            hello = json.loads(line)
            protections, failure, hands_spares = hello["protections"], hello["self_test"], hello["hands_spares"]
        except (ValueError, KeyError, TypeError):
            self._kill()
            raise SandboxError(
                f"verifier sandbox helper did not start within {timeout_s:g} s (said {line[:200]!r}); "
                f"run `{sys.executable} -I {HELPER_SCRIPT}` by hand to see its error"
            ) from None
        if failure:
            self._kill()
            raise SandboxError(
                f"verifier sandbox failed its self-test (a probe verifier under the same limits and "
                f"lockdown): {failure}; raise memory_bytes if it ran out of memory, else report this error"
            )
        return protections, bool(hands_spares)

    def start_direct(self, request: dict[str, Any]) -> _Direct | None:
        """Place the request's databases in a handed-over spare's directory (a link where the file is on
        its filesystem and complete in itself, else a copy) and write the request to the spare; None:
        send it to the helper (no spare waiting, or it died, or a database could not be placed)."""
        if self.pool is None:
            return None
        fields = self.compiled.request_fields(request["code"])
        while (spare := self.pool.take()) is not None:
            try:  # a helper hands spares over only where Landlock and seccomp guard links
                placed = place_databases(request, spare.dir, link=True)
            except Exception:  # the spare died (its directory is gone) or a database did: the
                spare.retire()  # helper's path gives the answer it always gave
                return None
            if spare.send(request_payload(request, fields, spare.dir, placed.initial, placed.final)):
                return _Direct(self, spare, request, bool(fields.get("want_compiled")), placed.linked)
        return None

    def status(self, request_id: int, pid: int) -> Future:
        """Ask the helper how a handed-over child ended (it reaps them): a timeout by CPU limit, a crash."""
        try:
            return self.send({"id": request_id, "mode": "status", "pid": pid})
        except _HelperGone:
            future: Future = Future()
            future.set_result({"status": "error", "detail": self._gone_detail(self.proc.poll())})
            return future

    def _gone_detail(self, code: int | None) -> str:
        if self.stopping:
            return "the verifier sandbox was closed while this verifier ran"
        how = f" ({describe_exit(code)})" if code is not None else ""
        return f"the verifier sandbox helper died{how} while this verifier ran; it restarts on the next call"

    def send(self, request: dict[str, Any]) -> Future:
        future: Future = Future()
        with self.lock:
            if not self.alive:
                raise _HelperGone
            self.pending[request["id"]] = future
        line = (json.dumps(request) + "\n").encode()
        try:
            with self.write_lock:
                self.proc.stdin.write(line)
                self.proc.stdin.flush()
        except (OSError, ValueError):
            with self.lock:
                self.pending.pop(request["id"], None)
            raise _HelperGone from None
        return future

    def _read_replies(self) -> None:
        for line in self.proc.stdout:
            try:
                reply = json.loads(line)
                request_id = reply.pop("id")
            except (ValueError, KeyError, AttributeError):  # a broken helper: kill it, fail what it held
                kill_group(self.proc.pid)
                break
            with self.lock:
                future = self.pending.pop(request_id, None)
            if future is not None:
                _resolve(future, reply)
        code = self.proc.wait()
        with self.lock:
            self.alive = False
            orphans, self.pending = self.pending, {}
        detail = self._gone_detail(code)
        for future in orphans.values():
            _resolve(future, {"status": "error", "detail": detail})
        if self.pool is not None:
            self.pool.close()  # its spares died with the helper
        remove_tree(self.workdir)

    def _kill(self) -> None:
        kill_group(self.proc.pid)
        self.proc.wait()
        remove_tree(self.workdir)

    def stop(self, grace_s: float = 5.0) -> None:
        """Close the request pipe (the helper then kills its children and exits); force it after grace_s."""
        self.stopping = True
        with self.write_lock:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self._kill()
        self.reader.join(timeout=grace_s)
        if self.pool is not None:
            self.pool.close()
        if not self.reader.is_alive():
            self.proc.stdout.close()  # the reply pipe: nobody reads it any more


class VerifierSandbox:
    """Runs verifier code in forked children of one long-lived, isolated helper process.

    `spare_children` children wait forked and locked down for the next requests (0: fork per request).
    Where the kernel's Landlock (ABI 3+) and seccomp can keep a child from changing the databases, it
    reads hard links to them instead of copies (`link_databases=False` copies anyway, as kernels
    without Landlock always do), and the helper hands its spares to this process, which places the
    databases and writes requests to them and reads their results itself (`direct=False`: every
    request through the helper). A link cannot cross filesystems, so put the helper's directory
    (`workdir_parent`, default the temp dir) on the filesystem of the databases verified most (an
    episode's); a database elsewhere is copied. `stats` counts the requests by path.
    Thread-safe; `averify` lets many verifications run at once (the helper runs up to
    `max_workers` children in parallel and queues the rest; a request's timeout starts when its
    child starts, and a request queued past a short grace gets an overflow child, so verifiers that
    hang in every slot delay the others by the grace, not by their timeouts). A dead helper is restarted on the next call; its in-flight requests get
    judge_error. Use as a context manager or call close().
    """

    def __init__(
        self,
        *,
        memory_bytes: int = 1 << 30,
        max_workers: int | None = None,
        max_open_files: int = 64,
        spare_children: int = 2,
        start_timeout_s: float = 30.0,
        link_databases: bool = True,
        direct: bool = True,
        workdir_parent: str | os.PathLike[str] | None = None,
    ) -> None:
        if not hasattr(os, "fork"):
            raise SandboxError(
                "VerifierSandbox needs os.fork (Linux or macOS); run verifiers on a POSIX machine"
            )
        self._settings = {
            "memory_bytes": int(memory_bytes),
            "max_workers": int(max_workers or max(4, 2 * (os.cpu_count() or 2))),
            "max_open_files": int(max_open_files),
            "spare_children": max(0, int(spare_children)),
            "link_databases": bool(link_databases),
            "hand_spares": bool(direct and link_databases and spare_children > 0),
        }
        self._start_timeout_s = start_timeout_s
        self._workdir_parent = os.fspath(workdir_parent) if workdir_parent is not None else None
        self._lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self._stats = SandboxStats()
        self._helper: _Helper | None = None
        self._closed = False
        self._ids = itertools.count()

    @property
    def helper_pid(self) -> int | None:
        """The helper's pid, or None before the first call."""
        helper = self._helper
        return helper.proc.pid if helper is not None and helper.alive else None

    @property
    def protections(self) -> dict[str, Any]:
        """The kernel protections in force: network_isolated, landlock_abi, seccomp_no_fork, capabilities_dropped, uid."""
        return dict(self._current_helper().protections)

    @property
    def stats(self) -> SandboxStats:
        """A copy of the counts of requests by path since this sandbox was made."""
        with self._stats_lock:
            return dataclasses.replace(self._stats)

    def _count(self, direct: _Direct | None) -> None:
        with self._stats_lock:
            if direct is None:
                self._stats.through_helper += 1
            else:
                self._stats.direct += 1
                self._stats.linked += direct.linked
                self._stats.copied += 2 - direct.linked

    def _current_helper(self) -> _Helper:
        with self._lock:
            if self._closed:
                raise SandboxError("this VerifierSandbox is closed; create a new one")
            if self._helper is None or not self._helper.alive:
                self._helper = _Helper(self._settings, self._start_timeout_s, self._workdir_parent)
            return self._helper

    def _submit(self, request: dict[str, Any]) -> Future:
        for _ in range(2):  # one restart if the helper died before taking the request
            try:
                return self._current_helper().send(request)
            except _HelperGone:
                continue
        future: Future = Future()
        future.set_result(
            {"status": "error", "detail": "the verifier sandbox helper died twice in a row; see stderr"}
        )
        return future

    def _request(
        self,
        code: str | None,
        initial_db: str,
        final_db: str,
        mode: str,
        final_answer: str | None,
        timeout_s: float,
    ) -> dict[str, Any] | SandboxRun:
        """Build the request, or a finished error run when there is nothing worth sending."""
        if mode not in DEFAULT_FUNCTIONS:
            raise ValueError(f"mode {mode!r} is unknown: use 'code' or 'sql'")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        if not isinstance(code, str) or len(code.strip()) < 10:
            return SandboxRun("error", detail="no verifier code (missing or empty)")
        for label, path in (("initial", initial_db), ("final", final_db)):
            if not os.path.isfile(path):
                return SandboxRun("error", detail=f"{label} database not found: {path}")
        return {
            "id": next(self._ids),
            "mode": mode,
            "code": code,
            "function": verifier_function_name(code, mode),
            "initial_db": os.path.abspath(initial_db),
            "final_db": os.path.abspath(final_db),
            "final_answer": final_answer,
            "timeout_s": float(timeout_s),
        }

    def run(
        self,
        code: str | None,
        initial_db: str,
        final_db: str,
        *,
        mode: str = "code",
        final_answer: str | None = None,
        timeout_s: float = 10.0,
    ) -> SandboxRun:
        """Execute one verifier and return its raw outcome (no verdict, no answer stripping)."""
        started = time.monotonic()
        request = self._request(code, initial_db, final_db, mode, final_answer, timeout_s)
        if isinstance(request, SandboxRun):
            return request
        direct = self._current_helper().start_direct(request)
        self._count(direct)
        if direct is None:
            reply = self._submit(request).result()
        else:
            reply = direct.finish(direct.spare.wait(request["timeout_s"]))
            if isinstance(reply, Future):
                reply = reply.result()
        return _run_from_reply(reply, time.monotonic() - started)

    async def arun(
        self,
        code: str | None,
        initial_db: str,
        final_db: str,
        *,
        mode: str = "code",
        final_answer: str | None = None,
        timeout_s: float = 10.0,
    ) -> SandboxRun:
        """`run` for asyncio: waits without blocking the event loop."""
        started = time.monotonic()
        request = self._request(code, initial_db, final_db, mode, final_answer, timeout_s)
        if isinstance(request, SandboxRun):
            return request
        if self.helper_pid is None:  # starting the helper takes tens of ms: not on the loop
            await asyncio.to_thread(self._current_helper)
        direct = self._current_helper().start_direct(request)
        self._count(direct)
        if direct is None:
            reply = await asyncio.wrap_future(self._submit(request))
        else:
            reply = direct.finish(await direct.spare.await_reply(request["timeout_s"]))
            if isinstance(reply, Future):
                reply = await asyncio.wrap_future(reply)
        return _run_from_reply(reply, time.monotonic() - started)

    def verify(
        self,
        code: str | None,
        initial_db: str,
        final_db: str,
        final_answer: str | None = None,
        timeout_s: float = 10.0,
    ) -> Verdict:
        """Run a code-mode verifier on the final answer with its reasoning stripped."""
        run = self.run(
            code, initial_db, final_db, final_answer=strip_thinking(final_answer), timeout_s=timeout_s
        )
        return code_verdict(run)

    async def averify(
        self,
        code: str | None,
        initial_db: str,
        final_db: str,
        final_answer: str | None = None,
        timeout_s: float = 10.0,
    ) -> Verdict:
        """`verify` for asyncio; many may run concurrently."""
        run = await self.arun(
            code, initial_db, final_db, final_answer=strip_thinking(final_answer), timeout_s=timeout_s
        )
        return code_verdict(run)

    def close(self) -> None:
        """Stop the helper and every verifier it runs; later calls raise SandboxError."""
        with self._lock:
            self._closed = True
            helper, self._helper = self._helper, None
        if helper is not None:
            helper.stop()

    def __enter__(self) -> "VerifierSandbox":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> "VerifierSandbox":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.to_thread(self.close)


def verify_code(
    code: str | None,
    initial_db: str,
    final_db: str,
    final_answer: str | None = None,
    timeout_s: float = 10.0,
) -> Verdict:
    """One verification in a short-lived sandbox (for the CLI; a trainer keeps one VerifierSandbox)."""
    with VerifierSandbox() as sandbox:
        return sandbox.verify(code, initial_db, final_db, final_answer, timeout_s)


def _run_from_reply(reply: dict[str, Any], elapsed_s: float) -> SandboxRun:
    return SandboxRun(
        status=reply["status"],
        value=reply.get("value"),
        value_type=reply.get("type", ""),
        detail=reply.get("detail", ""),
        elapsed_s=elapsed_s,
    )

"""The Python API for rollouts: a runtime that serves isolated episodes of AWM scenarios.

    runtime = EnvRuntime()                       # bundled scenarios; or EnvRuntime(data_dir)
    ep = await runtime.open("library_lending_1", task_idx=3)
    ep.tools                                     # [{name, description, inputSchema}, ...]
    obs = await ep.call("search_books", {"query": "Dune"})   # Observation(text, is_error, ...)
    snap = await ep.snapshot(); ...; await ep.restore(snap)
    verdict = await ep.verify(final_answer="...")            # Verdict(verdict="complete", ...)
    await ep.close()

Every episode owns a private copy of its scenario's template DB; the environment code runs
in worker processes (`awm.runtime.pool`); verifiers run in a sandbox process (`awm.verifier`).
Failures of the machinery raise `InfraError` subclasses and mark the episode
(`ep.infra_error`), so a trainer can drop it instead of scoring it 0; mistakes of the agent
(unknown tool, bad arguments, HTTP errors) come back as error observations.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import itertools
import logging
import os
import re
import shutil
import stat
import struct
import tempfile
import threading
import uuid
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from awm.data import AWMDataset, Scenario, bundled_data_dir, default_cache_dir
from awm.database import (
    BuildReport,
    TemplateStore,
    diff_databases,
    state_hash,
)
from awm.judge import JudgeConfig, SqlJudge
from awm.runtime.pool import EnvLoadError, InfraError, WorkerPool, WorkerRequestError, WorkerSlot
from awm.tools import Observation, ToolSpec
from awm.verifier import Verdict, VerifierSandbox, strip_thinking

log = logging.getLogger(__name__)
EPISODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
SOFT_DEADLINE_SHARE = 0.8  # of call_timeout_s: a slow call is interrupted in its worker before the worker is killed


def default_episode_dir() -> Path:
    """Episode DBs live in memory-backed /dev/shm when it has room, else in the temp dir."""
    shm = Path("/dev/shm")
    try:
        if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 2 << 30:
            return shm
    except OSError:
        pass
    return Path(tempfile.gettempdir())


EPISODE_DIR_PREFIX = "awm-episodes-"
_OWNER_FILE = "owner"  # "<pid> <process start time>" of the runtime that made the dir


def _process_start(pid: int) -> str | None:
    """The start time of process `pid` (clock ticks since boot), or None when it does not exist;
    with the pid it names one process even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def remove_stale_episode_dirs(root: str | os.PathLike[str] | None = None) -> list[str]:
    """Delete `awm-episodes-*` dirs under `root` whose owning process is gone (a SIGKILLed server's).

    Only dirs with an owner file are touched: a dir without one may belong to a live runtime of an
    older version, and deleting a live episode's files would corrupt it.
    """
    removed = []
    for path in Path(root or default_episode_dir()).glob(f"{EPISODE_DIR_PREFIX}*"):
        try:
            pid, started = (path / _OWNER_FILE).read_text().split()
        except (OSError, ValueError):
            continue
        if _process_start(int(pid)) != started:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    return removed


SQLITE_SIDE_FILES = ("-journal", "-wal", "-shm")  # what SQLite may keep beside a DB (env code can make them)


def _remove(path: Path) -> None:
    """Delete whatever is at `path` without following a link: a file, a link, or a whole directory that env
    code put there (the worker may write its own dir); nothing there is fine."""
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except (IsADirectoryError, PermissionError):  # Linux says EISDIR; some systems EPERM
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)  # fd-based: a link swapped in meanwhile is removed, never followed
        else:
            raise


# SQLite's locks on a DB file (unix VFS, os_unix.c): fcntl locks on the PENDING byte at 1 GiB (the file format's
# "lock-byte page"), the RESERVED byte after it and 510 SHARED bytes after that; `struct flock` as Linux lays it
# out on 64-bit.
_PENDING_BYTE = 0x40000000
_FLOCK = struct.Struct("hhqqixxxx")


def _db_held(path: Path, for_write: bool) -> bool:
    """Whether another connection's lock on the episode DB at `path` would make a page copy wait: any lock for
    a copy into the file (`for_write`), a writer's (PENDING, EXCLUSIVE) for a copy out of it. True as well
    when `path` is no regular file.

    Between requests the worker's own connection holds no lock (each call ends its transaction; in WAL
    mode it keeps a SHARED one, so a copy into a WAL database takes the slow way round), so a lock there
    belongs to a connection env code opened itself and kept (a raw `sqlite3.connect` left in BEGIN
    EXCLUSIVE), which nothing will ever release. F_GETLK asks the kernel and takes no lock: one open, two
    fcntl, one close (about 10 us)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return True
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return True
        kind = fcntl.F_WRLCK if for_write else fcntl.F_RDLCK  # a read lock conflicts only with write locks
        for start, length in ((_PENDING_BYTE, 1), (_PENDING_BYTE + 2, 510)):  # PENDING, SHARED (not RESERVED)
            probe = _FLOCK.pack(kind, os.SEEK_SET, start, length, 0)
            if _FLOCK.unpack(fcntl.fcntl(fd, fcntl.F_GETLK, probe))[0] != fcntl.F_UNLCK:
                return True
        return False
    finally:
        os.close(fd)


def _copy_new(source: str | os.PathLike[str], dest: Path, source_in_worker_dir: bool = False) -> None:
    """Copy `source` to a file `dest` that this call creates: never through a link or into a file that env
    code placed at `dest` beforehand (such a thing is removed first). The trainer writes into worker
    directories only this way: a plain copy would follow a planted link and overwrite its target.
    `source_in_worker_dir`: env code could have put a link (to a file of the trainer's) or a FIFO there, so
    only a plain file with no other name is read."""
    if source_in_worker_dir:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            os.close(fd)
            raise OSError(errno.EPERM, "not a plain file of the worker's own", os.fspath(source))
        src = os.fdopen(fd, "rb")
    else:
        src = open(source, "rb")  # noqa: SIM115 - closed below, with `out`
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            out = os.open(dest, flags, 0o644)
        except FileExistsError:
            _remove(dest)
            out = os.open(dest, flags, 0o644)  # planted again in between: the caller fails (an OSError)
        try:
            size, offset = os.fstat(src.fileno()).st_size, 0
            while offset < size:
                sent = os.sendfile(out, src.fileno(), offset, size - offset)
                if sent == 0:
                    break
                offset += sent
        finally:
            os.close(out)
    finally:
        src.close()


@dataclass(frozen=True)
class Snapshot:
    """A saved episode state (a consistent DB copy) that `Episode.restore` can return to."""

    episode_id: str
    path: Path
    step: int


def load_reply(info: Any) -> tuple[list[str], list[ToolSpec]]:
    """(created_sql, tools) of a worker's reply to a load; ValueError for anything else. Its load ran generated
    code, which can write the reply itself, so every field is checked before the trainer uses it."""
    if type(info) is not dict or type(info.get("created_sql")) is not list or type(info.get("tools")) is not list \
            or not all(type(stmt) is str for stmt in info["created_sql"]):
        raise ValueError(f"{str(info)[:200]!r}")
    return info["created_sql"], [ToolSpec.from_reply(t) for t in info["tools"]]


class EnvRuntime:
    """Serves many concurrent episodes of many scenarios from one AWM data directory.

    Containment: `sandbox_workers` locks each worker down (turn off only to measure its cost);
    `worker_memory_limit_mb` recycles a worker past that peak RSS once its episodes are closed;
    `load_attempts` imports that crash or hang a worker before the scenario is refused.
    `direct_dispatch=False` sends every tool call through the app's ASGI stack instead of straight
    to its endpoint (`awm.runtime.dispatch`; same answers, slower): turn off only to compare the two.
    `verifier_options` are keyword arguments for the `VerifierSandbox` (e.g. `{"direct": False}` to
    compare its paths); its directory sits beside the episode directory unless they say otherwise.
    """

    def __init__(self, data_dir: str | os.PathLike[str] | None = None, *, num_workers: int | None = None,
                 episode_dir: str | os.PathLike[str] | None = None, cache_dir: str | os.PathLike[str] | None = None,
                 clock: str | None = None, seed: int = 0, call_timeout_s: float = 10.0,
                 load_timeout_s: float = 120.0, verifier_timeout_s: float = 10.0,
                 verifier_rule: str = "last_valid", exclude: Any = (), dataset: AWMDataset | None = None,
                 sandbox_workers: bool = True, worker_memory_limit_mb: int | None = 2048,
                 load_attempts: int = 1, direct_dispatch: bool = True,
                 verifier_options: dict[str, Any] | None = None) -> None:
        cache = Path(cache_dir) if cache_dir else default_cache_dir()
        self.dataset = dataset or AWMDataset(data_dir or bundled_data_dir(), verifier_rule=verifier_rule,
                                             cache_dir=cache, exclude=exclude)
        self.templates = TemplateStore(cache / "templates")
        self.clock, self.seed = clock, seed
        self.call_timeout_s, self.load_timeout_s = call_timeout_s, load_timeout_s
        self.verifier_timeout_s = verifier_timeout_s
        root = Path(episode_dir) if episode_dir else default_episode_dir()
        self.episode_dir = Path(tempfile.mkdtemp(prefix=EPISODE_DIR_PREFIX, dir=root))
        (self.episode_dir / _OWNER_FILE).write_text(f"{os.getpid()} {_process_start(os.getpid())}")
        # Episode files live in RAM (/dev/shm): delete them even if close() is never called.
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(self.episode_dir), True)
        self.pool = WorkerPool(num_workers, scratch_dir=self.episode_dir, read_dirs=(str(self.templates.root),),
                               lockdown=sandbox_workers, direct_dispatch=direct_dispatch,
                               memory_limit_bytes=worker_memory_limit_mb and worker_memory_limit_mb << 20)
        if load_attempts < 1:
            raise ValueError(f"load_attempts={load_attempts}: use 1 or more (1 refuses a scenario after the "
                             "first import that crashed or hung its worker)")
        self.load_attempts = load_attempts
        self._load_strikes: dict[str, int] = {}  # scenario -> imports that crashed or hung their worker
        self._lock = threading.Lock()
        self._template_locks: dict[str, threading.Lock] = {}
        self._templates: dict[str, tuple[Path, BuildReport]] = {}
        self._tools: dict[str, list[ToolSpec]] = {}
        self._completing: dict[str, asyncio.Future] = {}  # scenario -> folding its env-code schema into the template
        self._broken: dict[str, str] = {}  # scenario -> why its environment code does not load
        self._sandbox: VerifierSandbox | None = None
        self._verifier_options = {"workdir_parent": self.episode_dir.parent, **(verifier_options or {})}
        self._judge: SqlJudge | None = None
        self._counter = itertools.count()
        self.episodes: dict[str, Episode] = {}
        self.closed = False

    # ---- scenarios ---------------------------------------------------------------------
    def scenario(self, name: str) -> Scenario:
        return self.dataset.scenario(name)

    def template(self, scenario: str) -> tuple[Path, BuildReport]:
        """The scenario's initial DB, built once (thread-safe) and cached on disk.

        Without a gen_db row the template starts empty and the environment code's own
        `create_all` defines the schema when the scenario is first loaded (as upstream's
        server does on a fresh file); the sample INSERTs are applied after that.
        """
        with self._lock:
            if scenario in self._templates:
                return self._templates[scenario]
            lock = self._template_locks.setdefault(scenario, threading.Lock())
        with lock:
            if scenario not in self._templates:
                sc = self.dataset.scenario(scenario)
                self._templates[scenario] = self.templates.get_or_build(
                    sc.name, sc.db_schema or {"tables": []}, sc.sample_data if sc.db_schema else None,
                    clock=self.clock, seed=self.seed)
        return self._templates[scenario]

    async def _load(self, slot: WorkerSlot, scenario: str) -> list[ToolSpec]:
        if scenario in self._broken:  # import failures are deterministic: do not re-import per episode
            raise EnvLoadError(self._broken[scenario])
        loaded = slot.loaded.get(scenario)
        if loaded is not None and loaded.done() and not loaded.exception() and scenario in self._tools:
            slot.loaded.move_to_end(scenario)
            return self._tools[scenario]  # the hot path of open(): nothing to build or import
        await self.pool.start()
        path, report = self._templates.get(scenario) or await asyncio.to_thread(self.template, scenario)
        sc = self.dataset.scenario(scenario)
        if not sc.full_code:
            raise EnvLoadError(f"scenario {scenario!r} has no environment code (no gen_envs row)")
        known = [t.to_dict() for t in self._tools[scenario]] if scenario in self._tools else None
        fut = self.pool.ensure_loaded(slot, scenario, sc.full_code, str(path), self.load_timeout_s, known)
        try:
            info = await asyncio.shield(fut)
        except WorkerRequestError as exc:
            self._broken[scenario] = exc.info.get("message", str(exc))
            raise EnvLoadError(self._broken[scenario]) from None
        except InfraError as exc:
            await self._strike(scenario, exc, sc.full_code, str(path))
            raise
        try:
            created_sql, tools = load_reply(info)
        except ValueError as exc:
            error = InfraError(f"scenario {scenario!r}: the worker's reply to its load is not a load reply ({exc}); "
                               "the worker was killed")
            error.culprit = True  # the load ran alone in its worker (awm.runtime.pool): its code wrote this
            self.pool.kill_worker(slot, str(error))
            await self._strike(scenario, error, sc.full_code, str(path))
            raise error from None
        if created_sql:  # folded into the template once, off the event loop (it runs SQL: seconds, maybe)
            completing = self._completing.get(scenario)
            if completing is None:
                completing = self._completing[scenario] = asyncio.ensure_future(asyncio.to_thread(
                    self._complete_template, path, report, created_sql,
                    sc.sample_data if sc.db_schema is None else None))
            await asyncio.shield(completing)
        with self._lock:
            if scenario not in self._tools:
                self._tools[scenario] = tools
        return self._tools[scenario]

    async def _strike(self, scenario: str, exc: InfraError, code: str, template: str) -> None:
        """Count an import that crashed or hung its worker; past `load_attempts` the scenario is refused,
        so later episodes never take a shared worker (and its bystander episodes) down with it again.

        A load that only queued behind another request's crash is no strike (`exc.culprit` is False). A load
        that was running is struck only if it fails again alone, in a fresh worker of its own (`_fails_alone`):
        code loaded earlier into the shared worker can fake a load's end (a forged reply) and then take the
        worker down during the next scenario's load, or a thread it left can; the probe costs a worker start
        and an import, only when a worker died during a load."""
        if not exc.culprit:
            return
        probe = getattr(exc, "probe", None)
        if probe is None:  # concurrent openers share one failure, and one probe
            probe = exc.probe = asyncio.ensure_future(self._fails_alone(scenario, code, template))
        if not await asyncio.shield(probe) or getattr(exc, "counted", False):
            return
        exc.counted = True
        strikes = self._load_strikes[scenario] = self._load_strikes.get(scenario, 0) + 1
        if strikes >= self.load_attempts:
            self._broken[scenario] = (f"scenario {scenario!r}: environment code took its worker down at import "
                                      f"{strikes} time(s), the last time alone in a worker of its own ({exc}); "
                                      "refused for the life of this runtime")
            log.warning("%s", self._broken[scenario])

    async def _fails_alone(self, scenario: str, code: str, template: str) -> bool:
        """Whether `scenario`'s import crashes, hangs or answers with something else than a load reply in a
        fresh worker that runs nothing else (a one-worker pool of its own, closed after)."""
        probe = WorkerPool(1, scratch_dir=self.episode_dir / f"probe-{next(self._counter)}",
                           read_dirs=self.pool.read_dirs, lockdown=self.pool.lockdown,
                           direct_dispatch=self.pool.direct_dispatch, memory_limit_bytes=self.pool.memory_limit_bytes)
        try:
            await probe.start()
            info = await probe.ensure_loaded(probe.slots[0], scenario, code, template, self.load_timeout_s)
        except InfraError:
            return True
        except WorkerRequestError:  # an import error, not a crash: the next load reports it as such
            return False
        finally:
            probe.close()
            shutil.rmtree(probe.scratch_dir, ignore_errors=True)
        try:
            load_reply(info)
        except ValueError:
            return True
        return False

    def _complete_template(self, path: Path, report: BuildReport, sql: list[str], sample_data: dict | None) -> None:
        """Fold the code's import-time `create_all` into the template (upstream runs it on the live DB).

        `sql` is what a worker reported: text env code could have written (forged sqlite_master rows, a
        forged reply). `TemplateStore.complete` runs only single CREATE TABLE / CREATE INDEX statements of
        it, under the SQL guard, into a new file keyed by that DDL; the cached base template at `path`
        (shared by every run and data set with the same gen_db/gen_sample) is never written. Refused
        statements are failed statements ("env_ddl") of the completed template's report."""
        with self._lock:
            done = self.templates.complete(path, report, sql, sample_data, clock=self.clock, seed=self.seed)
            for name, (template, _) in list(self._templates.items()):
                if template == path:  # episodes opened from now on copy the completed file
                    self._templates[name] = done
        log.info("scenario %s: environment code created %d schema objects (%d refused)", report.scenario,
                 len(done[1].env_created_tables), sum(f[0] == "env_ddl" for f in done[1].failed))

    async def tools(self, scenario: str) -> list[dict[str, Any]]:
        """The scenario's tool list as MCP shows it (loads the scenario if needed)."""
        if scenario not in self._tools:
            await self.pool.start()
            await self._load(self.pool.place(scenario), scenario)
        return [t.public() for t in self._tools[scenario]]

    # ---- episodes ----------------------------------------------------------------------
    async def open(self, scenario: str, task_idx: int | None = None, *, episode_id: str | None = None) -> Episode:
        """Start an episode on a fresh copy of the scenario's initial DB."""
        if self.closed:
            raise RuntimeError("this EnvRuntime is closed")
        scenario = self.dataset.scenario(scenario).name
        task = None
        if task_idx is not None:
            tasks = self.dataset.tasks(scenario)
            if not 0 <= task_idx < len(tasks):
                raise IndexError(f"scenario {scenario!r} has {len(tasks)} tasks; task_idx {task_idx} is out of range")
            task = tasks[task_idx]
        episode_id = episode_id or f"{scenario}-{next(self._counter)}-{uuid.uuid4().hex[:8]}"
        if not EPISODE_ID.fullmatch(episode_id):
            raise ValueError(f"episode_id {episode_id!r} is not allowed: use 1-128 letters, digits, '.', '_' or "
                             "'-', starting with a letter or digit (it is part of the episode's file names)")
        await self.pool.start()
        slot = self.pool.place(scenario)
        with self._lock:
            if episode_id in self.episodes or any(episode_id in s.episodes for s in self.pool.slots):
                raise ValueError(f"episode_id {episode_id!r} is already open: close it first or pass another id")
            slot.episodes[episode_id] = scenario  # reserve before awaiting so placement sees it
        # The episode's files are `<n>-<id>.db`, `<n>-<id>.snap<k>.db`, ...: `n` is this runtime's and unique, so
        # no id (say "a.snap0") names another episode's file, and the files outlive no id's reuse.
        db_path = Path(self.pool.worker_dir(slot)) / f"{next(self._counter)}-{episode_id}.db"
        try:
            tools = await self._load(slot, scenario)
            template, _ = self._templates[scenario]
            _copy_new(template, db_path)
            generation = slot.generation
            try:
                await self._rpc(slot, generation, "open", {"episode": episode_id, "scenario": scenario,
                                                           "db_path": str(db_path)}, self.call_timeout_s)
            except WorkerRequestError as exc:  # e.g. the episode's own module instance failed to import
                raise EnvLoadError(f"scenario {scenario!r}: the worker could not open episode {episode_id}: "
                                   f"{exc.info.get('message', exc)!s:.1000}") from None
        except BaseException:
            with self._lock:
                slot.episodes.pop(episode_id, None)
            with contextlib.suppress(OSError):
                _remove(db_path)
            raise
        ep = Episode(self, episode_id, scenario, task_idx, task, db_path, template, slot, generation, tools)
        self.episodes[episode_id] = ep
        return ep

    async def _rpc(self, slot: WorkerSlot, generation: int, op: str, payload: dict, timeout_s: float) -> Any:
        return await self.pool.request(slot, op, payload, timeout_s, generation=generation)

    def sandbox(self) -> VerifierSandbox:
        """The verifier sandbox process, started on first use. Its directory sits beside the episode
        directory (in /dev/shm by default), so an episode's DB is hard-linked into a verifier's, not copied."""
        with self._lock:
            if self._sandbox is None:
                self._sandbox = VerifierSandbox(**self._verifier_options)
            return self._sandbox

    def judge(self) -> SqlJudge:
        """The sql-mode judge, configured from the environment on first use."""
        with self._lock:
            if self._judge is None:
                self._judge = SqlJudge(self.sandbox(), JudgeConfig.from_env())
            return self._judge

    def close(self) -> None:
        """Stop workers and the sandbox and delete every episode file."""
        if self.closed:
            return
        self.closed = True
        self.pool.close()
        if self._sandbox is not None:
            self._sandbox.close()
        self._cleanup()

    async def __aenter__(self) -> EnvRuntime:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __enter__(self) -> EnvRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Episode:
    """One isolated run of a scenario (optionally for one task). Not shared between tasks."""

    def __init__(self, runtime: EnvRuntime, episode_id: str, scenario: str, task_idx: int | None, task: str | None,
                 db_path: Path, template: Path, slot: WorkerSlot, generation: int, tools: list[ToolSpec]) -> None:
        self.runtime, self.id, self.scenario = runtime, episode_id, scenario
        self.task_idx, self.task = task_idx, task
        self.db_path, self.initial_db = db_path, template
        self._slot, self._generation = slot, generation
        self.tool_specs = tools
        self.tools = [t.public() for t in tools]
        self.steps = 0
        self.infra_error: str | None = None
        self.closed = False
        self._snapshots = itertools.count()
        self._snapshot_paths: list[Path] = []
        self._busy = asyncio.Lock()

    def assign_task(self, task_idx: int) -> None:
        """Bind a task to an episode opened without one (an MCP session, say); once only."""
        if self.task_idx is not None and self.task_idx != task_idx:
            raise ValueError(f"episode {self.id} is already bound to task {self.task_idx}")
        tasks = self.runtime.dataset.tasks(self.scenario)
        if not 0 <= task_idx < len(tasks):
            raise IndexError(f"scenario {self.scenario!r} has {len(tasks)} tasks; task_idx {task_idx} is out of range")
        self.task_idx, self.task = task_idx, tasks[task_idx]

    def _check(self) -> None:
        if self.closed:
            raise RuntimeError(f"episode {self.id} is closed")
        if not self.infra_error and self._slot.generation != self._generation:
            self.infra_error = self._slot.dead_reason or "its worker process was replaced"
        if self.infra_error:
            raise InfraError(f"episode {self.id} already failed: {self.infra_error}")

    async def _rpc(self, op: str, payload: dict, timeout_s: float | None = None) -> Any:
        """One request of this episode's (not a tool call: `call`). Its worker failing to serve it (a DB that
        env code keeps locked past a snapshot's patience, say) fails the episode: `InfraError`."""
        self._check()
        try:  # straight to the pool's future: one coroutine frame less per call than `EnvRuntime._rpc`
            return await self.runtime.pool.submit(self._slot, op, {"episode": self.id, **payload},
                                                  timeout_s or self.runtime.call_timeout_s, self._generation)
        except InfraError as exc:
            self.infra_error = str(exc)
            raise
        except WorkerRequestError as exc:
            self.infra_error = f"the worker failed its '{op}': {str(exc)[:500]}"
            raise InfraError(f"episode {self.id}: {self.infra_error}") from None

    async def call(self, tool: str, arguments: dict[str, Any] | str | None = None) -> Observation:
        """Run one tool call; agent mistakes come back as error observations, never as exceptions.

        Arguments no frame can carry (nested too deep for JSON, too large) are refused before they are
        sent: an `invalid_arguments` observation. A worker that fails to serve a call at all (not the
        app's HTTP error, which is an observation) is the machinery's failure: `InfraError`."""
        async with self._busy:
            self._check()
            # the worker interrupts SQL and Python past this soft deadline; the pool kills it at the hard one
            soft = self.runtime.call_timeout_s * SOFT_DEADLINE_SHARE
            fut = self.runtime.pool.submit(self._slot, "call", {"episode": self.id, "tool": tool, "arguments": arguments,
                                                                "soft_timeout_s": soft},
                                           self.runtime.call_timeout_s, self._generation)
            if fut.done() and not fut.cancelled() and isinstance(fut.exception(), WorkerRequestError):
                # failed in `submit`, before anything was sent: the request cannot be framed (awm.runtime.wire)
                return Observation(f"Input validation error: the arguments cannot be sent to the tool "
                                   f"({fut.exception().info.get('message', '')[:300]})", is_error=True,
                                   kind="invalid_arguments")
            try:
                result = await fut
            except InfraError as exc:
                self.infra_error = str(exc)
                raise
            except WorkerRequestError as exc:
                self.infra_error = f"the worker failed to serve a call to {tool[:100]!r}: {str(exc)[:500]}"
                raise InfraError(f"episode {self.id}: {self.infra_error}") from None
            try:
                obs = Observation.from_reply(result)
            except ValueError as exc:  # what env code wrote in the worker's name, not the worker's reply
                self.infra_error = f"the worker's reply to a call is not an observation ({exc})"
                raise InfraError(f"episode {self.id}: {self.infra_error}") from None
            self.steps += 1
            return obs

    async def reset(self) -> None:
        """Return the DB to the scenario's initial state (Gymnasium's reset, minus a new task).

        A page copy of the initial DB into the episode's connection, unless env code keeps a lock on the
        file (`_db_held`): then the file is replaced (`_reopen`), which waits for nobody."""
        async with self._busy:
            self._check()
            if _db_held(self.db_path, for_write=True):
                await self._reopen(self.initial_db)
            else:
                await self._rpc("restore", {"source": str(self.initial_db), "fresh_module": True})
            self.steps = 0

    async def _reopen(self, source: str | os.PathLike[str], copy_in_thread: bool = False,
                      source_in_worker_dir: bool = False) -> None:
        """Put a copy of `source` in place of the episode's DB file, then have the worker close the episode (its
        connection, its module instance if it has one) and open it afresh: nothing env code holds (a lock of a
        connection of its own, an open transaction, a journal left beside the DB) is waited for or survives,
        because the old file is replaced, not overwritten. The worker's old connection is idle meanwhile (no
        request of this episode runs), and close and open leave in one write (one round trip)."""
        self._check()
        fresh = self.db_path.with_name(self.db_path.name + ".new")
        try:
            if copy_in_thread:
                await asyncio.to_thread(_copy_new, source, fresh, source_in_worker_dir)
            else:  # a template or a snapshot: as `EnvRuntime.open` copies a template
                _copy_new(source, fresh, source_in_worker_dir)
            for side in SQLITE_SIDE_FILES:  # a journal beside the DB would be replayed into the fresh copy
                _remove(self.db_path.with_name(self.db_path.name + side))
            try:
                os.replace(fresh, self.db_path)
            except IsADirectoryError:  # env code put a directory in the DB's place
                _remove(self.db_path)
                os.replace(fresh, self.db_path)
        except OSError as exc:
            self.infra_error = f"replacing the DB of episode {self.id}: {type(exc).__name__}: {str(exc)[:500]}"
            raise InfraError(self.infra_error) from None
        pool, timeout = self.runtime.pool, self.runtime.call_timeout_s
        closing = pool.submit(self._slot, "close", {"episode": self.id}, timeout, self._generation)
        opening = pool.submit(self._slot, "open", {"episode": self.id, "scenario": self.scenario,
                                                   "db_path": str(self.db_path)}, timeout, self._generation)
        for fut in (closing, opening):
            try:
                await fut
            except (InfraError, WorkerRequestError) as exc:
                opening.add_done_callback(lambda f: f.cancelled() or f.exception())  # its failure is this one
                self.infra_error = f"reopening the DB of episode {self.id}: {str(exc)[:500]}"
                raise InfraError(self.infra_error) from None

    async def snapshot(self) -> Snapshot:
        """Save the current state; cheap (a page copy of a small DB)."""
        async with self._busy:
            self._check()
            if _db_held(self.db_path, for_write=False):
                self.infra_error = (f"environment code keeps a lock on the DB of episode {self.id} (a connection of "
                                    "its own, left in a write transaction): no snapshot can read it")
                raise InfraError(self.infra_error)
            path = self.db_path.with_name(f"{self.db_path.stem}.snap{next(self._snapshots)}.db")
            self._snapshot_paths.append(path)
            await self._rpc("snapshot", {"dest": str(path)})
            return Snapshot(self.id, path, self.steps)

    async def restore(self, snap: Snapshot) -> None:
        """Go back to a snapshot taken in this episode."""
        if snap.episode_id != self.id:
            raise ValueError(f"snapshot belongs to episode {snap.episode_id}, not {self.id}")
        async with self._busy:
            self._check()
            if _db_held(self.db_path, for_write=True):  # as `reset`: replace the file (a fresh module, too)
                await self._reopen(snap.path, source_in_worker_dir=True)
            else:
                await self._rpc("restore", {"source": str(snap.path)})
            self.steps = snap.step

    async def load_state(self, path: str | os.PathLike[str]) -> None:
        """Replace the DB with a saved state file (e.g. a damaged state of the controlled recovery split).

        The verifier still compares against the scenario's initial DB, so an episode can start
        mid-task from a state another episode produced. `steps` is left as is. The file is replaced
        (`_reopen`): an episode of a scenario with module state gets a fresh module instance, as at open.
        """
        source = Path(path).resolve()
        if not source.is_file():
            raise FileNotFoundError(f"state file {source} does not exist")
        async with self._busy:
            await self._reopen(source, copy_in_thread=True)

    def state_hash(self) -> str:
        """Logical hash of the current DB content (for traces and replay checks)."""
        return state_hash(self.db_path)

    def changes(self, since: Snapshot | None = None) -> dict[str, dict[str, Any]]:
        """Per-table summary of what changed since the initial DB (or since a snapshot)."""
        return diff_databases(since.path if since else self.initial_db, self.db_path)

    async def verify(self, final_answer: str | None = None, *, mode: str = "code",
                     trajectory: list[dict[str, Any]] | None = None, judge: SqlJudge | None = None,
                     timeout_s: float | None = None) -> Verdict:
        """Run the task's verifier on (initial DB, current DB) in the sandbox.

        mode "code": the pure-code verifier's verdict (complete / others / judge_error / timeout).
        mode "sql": the sql-mode verifier's evidence judged by an LLM (`judge`, default: one
        configured from OPENAI_BASE_URL / OPENAI_API_KEY / AWM_JUDGE_MODEL) given `trajectory`.
        """
        if self.task_idx is None:
            raise ValueError("this episode was opened without a task: nothing to verify")
        self._check()
        row = self.runtime.dataset.verifier(self.scenario, self.task_idx, mode=mode)
        code = row.code if row else None
        timeout_s = timeout_s or self.runtime.verifier_timeout_s
        async with self._busy:
            if mode == "code":
                return await self.runtime.sandbox().averify(code, str(self.initial_db), str(self.db_path),
                                                            final_answer, timeout_s=timeout_s)
            steps = list(trajectory or [])
            if final_answer:
                steps.append({"role": "assistant", "content": strip_thinking(final_answer)})
            judge = judge or self.runtime.judge()
            return await judge.averify(code, self.task or "", steps, str(self.initial_db), str(self.db_path),
                                       timeout_s=timeout_s)

    async def close(self) -> None:
        """Release the DB connection and delete the episode's files."""
        if self.closed:
            return
        self.closed = True
        rt = self.runtime
        with rt._lock:
            self._slot.episodes.pop(self.id, None)
        rt.episodes.pop(self.id, None)
        try:
            if not self.infra_error and not rt.closed:
                try:
                    info = await rt._rpc(self._slot, self._generation, "close", {"episode": self.id},
                                         rt.call_timeout_s)
                    rss = info.get("max_rss_bytes", 0) if isinstance(info, dict) else 0
                    rt.pool.episode_closed(self._slot, self._generation, rss if type(rss) is int else 0)
                except (InfraError, WorkerRequestError):
                    pass  # the worker is gone or never had it: nothing left to release
        finally:  # also when cancelled: the files are in RAM
            self._remove_files()

    def _remove_files(self) -> None:
        """Delete the episode's files, whatever env code turned them into; never raises (a rollout calls
        `close` in its `finally`), logs what it could not remove (the runtime's close removes it)."""
        for path in [self.db_path, *self._snapshot_paths]:
            for name in (path.name, path.name + ".new", *(path.name + side for side in SQLITE_SIDE_FILES)):
                try:
                    _remove(path.with_name(name))
                except OSError as exc:
                    log.warning("episode %s: cannot remove %s (%s); it goes with the runtime's directory",
                                self.id, name, exc)

    async def __aenter__(self) -> Episode:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

"""The launcher's children: each leads its own session, and is stopped by recorded id only.

Why: the reference recipe ran `pkill -9 sglang; pkill -9 ray`, killing other jobs of the same user.
Here every child is started with `start_new_session=True`, so its session and process group
(sid = pgid = its pid) hold it and whatever it forks (Ray's raylet and workers, engines) unless
they start a session of their own. Stopping sends SIGTERM to each recorded group and to the
members of its session that moved to another group (Ray actors do), waits `grace_s`, then
SIGKILLs what is left of them. Nothing is ever looked up or killed by name. On Linux each child
also gets PR_SET_PDEATHSIG(SIGTERM), so a launcher killed with SIGKILL does not leave its direct
children running.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

logger = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1


class Stopped(Exception):  # noqa: N818 - a signal, not an error
    """Raised in the main thread when the launcher gets SIGINT or SIGTERM."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _die_with_parent() -> None:
    """preexec_fn: SIGTERM this child when the launcher dies (Linux only; ignored elsewhere)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except OSError:
            pass


class Children:
    """Processes this launcher started; `stop_all` ends their process groups and nothing else."""

    def __init__(self, record: str | os.PathLike[str] | None = None) -> None:
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.record = Path(record) if record else None

    def start(self, name: str, cmd: Sequence[str], *, env: Mapping[str, str] | None = None,
              cwd: str | os.PathLike[str] | None = None, **popen: Any) -> subprocess.Popen:
        """Start `cmd` as the leader of a new session (own process group) and record its pid."""
        proc = subprocess.Popen(list(cmd), env=dict(env) if env is not None else None, cwd=cwd,
                                start_new_session=True, preexec_fn=_die_with_parent, **popen)  # noqa: PLW1509
        self.procs.append((name, proc))
        logger.info("started %s: pid %d (process group %d)", name, proc.pid, proc.pid)
        self._write_record()
        return proc

    def _write_record(self) -> None:
        if self.record is None:
            return
        self.record.parent.mkdir(parents=True, exist_ok=True)
        rows = [{"name": n, "pid": p.pid, "pgid": p.pid, "cmd": p.args if isinstance(p.args, list) else str(p.args)}
                for n, p in self.procs]
        self.record.write_text(json.dumps({"launcher_pid": os.getpid(), "children": rows}, indent=1) + "\n")

    @staticmethod
    def members(leader: int) -> list[int]:
        """Live processes in the leader's process group or session (Ray actors change group, not session)."""
        proc = Path("/proc")
        if not proc.is_dir():  # no /proc: the process group is all we can see
            try:
                os.killpg(leader, 0)
                return [leader]
            except (ProcessLookupError, PermissionError):
                return []
        out = []
        for stat in proc.glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()  # state ppid pgrp session ...
            except (OSError, IndexError):
                continue
            if leader in (int(fields[2]), int(fields[3])) and fields[0] not in ("Z", "X"):
                out.append(int(stat.parent.name))
        return [p for p in out if p != os.getpid()]

    @classmethod
    def _signal(cls, leader: int, sig: int) -> None:
        """Signal the leader's group, then any member of its session that moved to another group."""
        try:
            os.killpg(leader, sig)  # pgid == pid: the child leads its own session and group
        except (ProcessLookupError, PermissionError):  # gone, or the id is someone else's now
            pass
        for pid in cls.members(leader):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def stop_all(self, grace_s: float = 15.0) -> None:
        """SIGTERM every recorded child's group and session (newest first), wait `grace_s`, SIGKILL the rest."""
        for name, proc in reversed(self.procs):
            if proc.poll() is None or self.members(proc.pid):
                logger.info("stopping %s (process group %d)", name, proc.pid)
                self._signal(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(p.poll() is None or self.members(p.pid) for _, p in self.procs):
            time.sleep(0.05)
        for name, proc in self.procs:
            if proc.poll() is None or self.members(proc.pid):
                logger.warning("%s did not stop within %.0fs: SIGKILL to its process group", name, grace_s)
                self._signal(proc.pid, signal.SIGKILL)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                logger.error("%s (pid %d) survived SIGKILL", name, proc.pid)
            # SIGKILL is delivered asynchronously: wait until no member of the group is left running
            deadline = time.monotonic() + 5
            while self.members(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.01)
        if self.record is not None:
            self.record.unlink(missing_ok=True)


def recipe_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment plus what a child of the recipe needs: the repo's packages on PYTHONPATH, no
    model-hub downloads, Ray without its token auth."""
    repo = Path(__file__).resolve().parents[2]
    path = f"{repo}:{repo / 'agent-world-model'}"
    return {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "disabled",
            "PYTHONPATH": path + (f":{os.environ['PYTHONPATH']}" if os.environ.get("PYTHONPATH") else ""),
            **(extra or {})}


def run_logged(cmd: Sequence[str], log: Path, *, timeout_s: float, env: Mapping[str, str] | None = None,
               cwd: str | os.PathLike[str] | None = None) -> int:
    """Run one child in its own session, stdout and stderr to `log`; on timeout stop exactly what it
    started (its session, Ray workers included) and return 124."""
    children = Children()
    with open(log, "w") as out:
        proc = children.start(log.stem, cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            children.stop_all(grace_s=30)
            return 124


def raise_on_signals() -> dict[int, Any]:
    """Turn SIGINT/SIGTERM into `Stopped` in the main thread; returns the previous handlers."""
    def handler(signum: int, frame: FrameType | None) -> None:
        raise Stopped(signum)

    return {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}


def ignore_signals() -> None:
    """SIGINT/SIGTERM do nothing (while the children are being stopped)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def restore_signals(previous: dict[int, Any]) -> None:
    for sig, old in previous.items():
        signal.signal(sig, old)

"""Soft deadlines for tool calls inside a worker: a slow call fails alone instead of taking the worker down.

The pool kills a worker whose request overruns its hard deadline, and with it every episode the
worker hosts. Most overruns can be stopped earlier, inside the worker, at a soft deadline:

- SQL: each episode connection has an SQLite progress handler that aborts the running statement
  once the call's deadline has passed (a recursive CTE, a cross join), raising
  `sqlite3.OperationalError: interrupted` in the handler.
- Python: a watcher thread raises `CallInterrupted` (a BaseException, so `except Exception` does
  not swallow it) in every thread whose stack is in the scenario's code, again every poll while
  the call runs on; the handler's exception becomes an HTTP 500 observation.

What this cannot stop: a call blocked inside C code that never returns to Python or SQLite
(`time.sleep(3600)`, a blocking read, a C extension's loop). Those still reach the hard deadline,
and the worker is killed with every episode it hosts.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator

ENV_CODE_PREFIX = "<awm env "  # the filename generated code is compiled under (awm.runtime.envapp.load_env)
_POLL_S = 0.05
_SQLITE_CHECK_EVERY = 10_000  # virtual machine instructions between deadline checks


class CallInterrupted(BaseException):
    """Raised inside generated code that ran past its call's soft deadline."""


class CallDeadline:
    """The soft deadline of the call running now in this worker (one at a time), and its enforcers."""

    def __init__(self) -> None:
        self.deadline = math.inf
        self._lock = threading.Lock()
        self._hit: set[int] = set()  # threads an interrupt was sent to during this call
        self._watcher: threading.Thread | None = None

    def guard(self, conn: sqlite3.Connection) -> None:
        """Install the progress handler that interrupts `conn`'s statements past the deadline."""
        conn.set_progress_handler(self._sql_expired, _SQLITE_CHECK_EVERY)

    def _sql_expired(self) -> int:
        return time.monotonic() > self.deadline

    def passed(self) -> bool:
        """Whether the call running now has overrun its soft deadline (False between calls)."""
        return time.monotonic() > self.deadline

    @contextlib.contextmanager
    def running(self, seconds: float | None) -> Iterator[None]:
        """Bound the code run inside this block to `seconds` (None: unbounded)."""
        if not seconds:
            yield
            return
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, name="awm-call-deadline", daemon=True)
            self._watcher.start()
        self.deadline = time.monotonic() + seconds
        try:
            yield
        finally:
            with self._lock:  # an interrupt not delivered yet must not land after the call, in the worker
                self.deadline = math.inf
                for ident in self._hit:
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), None)
                self._hit.clear()

    def _watch(self) -> None:
        me = threading.get_ident()
        while True:
            time.sleep(_POLL_S)
            with self._lock:
                if time.monotonic() <= self.deadline:
                    continue
                for ident, frame in sys._current_frames().items():
                    if ident != me and _runs_env_code(frame):
                        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident),
                                                                   ctypes.py_object(CallInterrupted))
                        self._hit.add(ident)


def _runs_env_code(frame) -> bool:  # noqa: ANN001 - a frame object
    while frame is not None:
        if frame.f_code.co_filename.startswith(ENV_CODE_PREFIX):
            return True
        frame = frame.f_back
    return False

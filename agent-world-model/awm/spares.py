"""Verifier children the sandbox helper hands to its caller, so that a request skips the helper.

Through the helper a verification wakes five processes or threads in turn: caller -> helper -> child
-> helper -> reply reader -> caller. Each wake-up of a cold Python process costs 0.15-0.6 ms on the
2-core machine, more than the kernel's pipe round trip (10 us). So where Landlock and seccomp let a
child read hard links to the originals (`awm.sandbox.place_databases`), the helper forks and locks
down spares as before and passes each one's request and result pipes and a pidfd to the caller over a
Unix socket (SCM_RIGHTS). The caller places the databases in the spare's own directory (links where
the filesystem allows, copies elsewhere), writes the request to the spare and reads its result
itself: two wake-ups. The helper still forks, reaps and kills what is left of a child's
process group; the caller enforces the wall-clock deadline (SIGKILL through the pidfd, which cannot hit
a recycled pid) and kills the child once it has answered, as the helper does.
"""

import array
import asyncio
import dataclasses
import json
import os
import select
import signal
import socket
import threading
import time
from collections import deque
from typing import Any

from awm.sandbox import read_result, timeout_reply

_MESSAGE_BYTES = 256  # a hand-over message is {"pid": N}
_FDS_SPACE = socket.CMSG_SPACE(3 * array.array("i").itemsize)  # its request pipe, result pipe and pidfd


@dataclasses.dataclass
class Spare:
    """One locked-down child waiting for its request; the caller owns its pipes and pidfd."""

    pid: int
    dir: str  # its own directory, the only one it may read of its request's: the databases go here
    request_fd: int
    result_fd: int
    pidfd: int

    def send(self, payload: bytes) -> bool:
        """Write the request (then close the pipe: the child reads one); False when the child is gone."""
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(self.request_fd, view) :]
            return True
        except OSError:  # EPIPE: it died waiting (killed from outside, or its helper ended)
            self.end()
            return False
        finally:
            os.close(self.request_fd)

    def wait(self, timeout_s: float) -> dict[str, Any] | None:
        """The child's reply, a timeout reply after killing it, or None when it ended without one."""
        deadline = time.monotonic() + timeout_s
        output = bytearray()
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not select.select([self.result_fd], [], [], remaining)[0]:
                    return timeout_reply(timeout_s)
                finished, reply = read_result(output, _read(self.result_fd))
                if finished:
                    return reply
        finally:
            self.end()

    async def await_reply(self, timeout_s: float) -> dict[str, Any] | None:
        """`wait` on the event loop: the result pipe is watched by the loop itself, no thread in between."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()
        output = bytearray()

        def readable() -> None:
            finished, reply = read_result(output, _read(self.result_fd))
            if finished and not done.done():
                done.set_result(reply)

        def late() -> None:
            if not done.done():
                done.set_result(timeout_reply(timeout_s))

        loop.add_reader(self.result_fd, readable)
        timer = loop.call_later(timeout_s, late)
        try:
            return await done
        finally:  # cancelled too: the child must not outlive its caller's interest
            timer.cancel()
            loop.remove_reader(self.result_fd)
            self.end()

    def retire(self) -> None:
        """Let an unused spare go (the helper reaps it and forks another)."""
        os.close(self.request_fd)
        self.end()

    def end(self) -> None:
        """Kill the child (it has answered, ran out of time, or is not wanted) and close what is left."""
        try:
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass  # already ended; the helper reaps it
        for fd in (self.result_fd, self.pidfd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.result_fd = self.pidfd = -1


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 1 << 16)
    except OSError:
        return b""


class SparePool:
    """The spares the helper has handed over and nobody has taken yet; thread-safe.

    Taking one reads what the helper sent since (a non-blocking receive), so no thread waits on the socket.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.spares: deque[Spare] = deque()
        self.lock = threading.Lock()

    def take(self) -> Spare | None:
        with self.lock:
            self._receive()
            return self.spares.popleft() if self.spares else None

    def _receive(self) -> None:
        # Not socket.recv_fds: Python 3.11's drops its flags argument, and this receive must not block.
        flags = socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC
        while True:
            try:
                message, ancillary, _, _ = self.sock.recvmsg(_MESSAGE_BYTES, _FDS_SPACE, flags)
            except OSError:  # nothing more now (EAGAIN), or the helper is gone and its spares with it
                return
            fds = array.array("i")
            for level, kind, data in ancillary:
                if (level, kind) == (socket.SOL_SOCKET, socket.SCM_RIGHTS):
                    fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
            if not message:
                return
            if len(fds) != 3:
                for fd in fds:
                    os.close(fd)
                continue
            handed = json.loads(message)
            self.spares.append(Spare(handed["pid"], handed["dir"], *fds))

    def close(self) -> None:
        """Let the spares not taken go (the helper reaps them) and close the socket."""
        with self.lock:
            self._receive()
            for spare in self.spares:
                spare.retire()
            self.spares.clear()
            self.sock.close()

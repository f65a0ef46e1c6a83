"""Frames between the worker pool and its workers: 4-byte big-endian length + pickle.

Both ends are ours and run the same code, so pickle is safe here; the framing lets the
caller's side parse many replies from one `recv` (fewer system calls per tool call).
"""

from __future__ import annotations

import mmap
import os
import pickle
import socket
import struct
import tempfile
import time
from typing import Any

_HEADER = struct.Struct(">I")


def encode(message: Any) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


def decode_all(buffer: bytearray) -> list[Any]:
    """Remove and return every complete message at the start of `buffer`."""
    out, pos = [], 0
    while len(buffer) - pos >= _HEADER.size:
        (n,) = _HEADER.unpack_from(buffer, pos)
        if len(buffer) - pos - _HEADER.size < n:
            break
        out.append(pickle.loads(buffer[pos + _HEADER.size: pos + _HEADER.size + n]))
        pos += _HEADER.size + n
    del buffer[:pos]
    return out


def recv_messages(sock: socket.socket, buffer: bytearray) -> list[Any] | None:
    """Blocking read of at least one message; None when the peer closed the socket."""
    while True:
        messages = decode_all(buffer)
        if messages:
            return messages
        chunk = sock.recv(1 << 16)
        if not chunk:
            return None
        buffer += chunk


class Progress:
    """Which request a worker runs now, and since when: 16 bytes of memory shared by the pool and the worker.

    A worker sends the replies of one batch of requests together (`awm.runtime.worker.ReplyBuffer`), so the
    order of replies no longer tells the pool which request is running; this record does, with no system
    call on either side. The worker writes `(request id, CLOCK_MONOTONIC ns)` before each request; the pool
    reads it to time the running request and, when the worker dies or overruns, to blame that one request.
    A read torn between the two fields can only pair a new id with an older start, and the pool never times a
    request from before it was submitted.
    """

    RECORD = struct.Struct("<QQ")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.memory = mmap.mmap(fd, self.RECORD.size)

    @classmethod
    def create(cls) -> Progress:
        """A fresh record, in a memfd where the system has them (else an unlinked temporary file)."""
        if hasattr(os, "memfd_create"):
            fd = os.memfd_create("awm-worker-progress", os.MFD_CLOEXEC)
        else:  # pragma: no cover - not Linux
            fd = os.dup(tempfile.TemporaryFile().fileno())
        os.ftruncate(fd, cls.RECORD.size)
        return cls(fd)

    def started(self, request_id: int) -> None:
        self.RECORD.pack_into(self.memory, 0, request_id, time.monotonic_ns())

    def running(self) -> tuple[int, float]:
        """The last request the worker started, and when (seconds on `time.monotonic`'s clock)."""
        request_id, started_ns = self.RECORD.unpack_from(self.memory, 0)
        return request_id, started_ns / 1e9

    def close(self) -> None:
        self.memory.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

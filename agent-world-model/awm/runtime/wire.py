"""Frames between the worker pool and its workers: 4-byte big-endian length + JSON (UTF-8).

A worker runs generated environment code, so every byte it sends is input from an adversary: frames are
parsed as bounded data (JSON, at most `MAX_FRAME` bytes, nesting limited by the parser) and checked for
the message's shape, never unpickled or executed. A frame that is not valid is a protocol violation:
`decode_all` raises `FrameError`, and the pool kills the worker (its requests fail as infrastructure
errors). The framing lets the caller parse many replies from one `recv` (fewer system calls per call).
"""

from __future__ import annotations

import mmap
import os
import struct
import tempfile
import time
from typing import Any

import orjson

_HEADER = struct.Struct(">I")
MAX_FRAME = 16 << 20
"""The cap on one message either way, and so on one tool result: a worker turns a larger call result into an
error observation naming this cap (`awm.runtime.worker.serve`); a larger frame from a worker is a protocol
break (the pool kills it) and is refused from its 4-byte header, before its body is read."""


class FrameError(ValueError):
    """A frame that is not a valid message: the peer is broken or hostile."""


def encode(message: Any) -> bytes:
    """One frame; raises ValueError for values JSON cannot carry (bytes, sets, objects, a lone surrogate, a
    nesting deeper than orjson's 254 levels). Dict keys that are not strings become strings, as in `json`."""
    try:
        body = orjson.dumps(message, option=orjson.OPT_NON_STR_KEYS)
    except (TypeError, RecursionError) as exc:  # orjson.JSONEncodeError is a TypeError
        raise ValueError(f"message cannot be sent as JSON: {type(exc).__name__}: {str(exc)[:200]}") from None
    if len(body) > MAX_FRAME:
        raise ValueError(f"message of {len(body)} bytes is over the {MAX_FRAME}-byte frame limit")
    return _HEADER.pack(len(body)) + body


def decode_all(buffer: bytearray, shape: tuple[type, ...] | None = None) -> list[Any]:
    """Remove and return every complete message at the start of `buffer`.

    `shape`: the types of the message's fields (a JSON array of exactly that many); FrameError on any
    frame that is too long, not UTF-8 JSON, too deeply nested, or of another shape.
    """
    out, pos = [], 0
    try:
        while len(buffer) - pos >= _HEADER.size:
            (n,) = _HEADER.unpack_from(buffer, pos)
            if n > MAX_FRAME:
                raise FrameError(f"frame of {n} bytes is over the {MAX_FRAME}-byte limit")
            if len(buffer) - pos - _HEADER.size < n:
                break
            try:  # orjson: strict UTF-8, no NaN, nesting bounded (1,024), ~5x faster than `json` here
                message = orjson.loads(buffer[pos + _HEADER.size: pos + _HEADER.size + n])
            except (ValueError, RecursionError) as exc:
                raise FrameError(f"frame is not a JSON message: {type(exc).__name__}") from None
            if shape is not None and not _has_shape(message, shape):
                raise FrameError(f"message is not [{', '.join(t.__name__ for t in shape)}]")
            out.append(message)
            pos += _HEADER.size + n
    finally:
        del buffer[:pos]
    return out


def _has_shape(message: Any, shape: tuple[type, ...]) -> bool:
    if type(message) is not list or len(message) != len(shape):
        return False
    for value, kind in zip(message, shape, strict=True):
        if not isinstance(value, kind) or (kind is int and type(value) is bool):
            return False
    return True


REPLY = (int, bool, object)  # (request id, ok, result): what a worker sends
REQUEST = (int, str, dict)  # (request id, op, payload): what the pool sends


class Progress:
    """Which request a worker runs now, and since when: 16 bytes of memory shared by the pool and the worker.

    A HINT only: generated code runs in the worker's process and can write this memory. The pool's hard
    deadlines and the blame for a load come from what only the pool knows (when it sent each request and
    when each reply arrived, in the order the worker serves them: `awm.runtime.pool`); this record can at
    most make the pool kill a worker earlier, and name which of a batch's calls was running when it died.
    The worker writes `(request id, CLOCK_MONOTONIC ns)` before each request (no system call on either side).
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

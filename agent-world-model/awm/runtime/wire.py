"""Frames between the worker pool and its workers: 4-byte big-endian length + pickle.

Both ends are ours and run the same code, so pickle is safe here; the framing lets the
caller's side parse many replies from one `recv` (fewer system calls per tool call).
"""

from __future__ import annotations

import pickle
import socket
import struct
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

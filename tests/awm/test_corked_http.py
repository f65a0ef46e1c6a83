"""awm.serve.corked_http: the MCP server sends each reply, head and body, in one send().

Read on a raw socket: a reply sent in one send() of a few KB is in the receive buffer whole when
the first recv() returns, so each recv() below must hold a complete reply (with uvicorn's own
protocols, h11 or httptools, the head alone often arrives first). A `Connection: close` reply
must still go out whole before the connection closes.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from test_mcp_server import ServerThread


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with ServerThread(num_workers=1).running() as srv:
        yield srv


def complete(data: bytes) -> bool:
    head, _, body = data.partition(b"\r\n\r\n")
    lengths = [int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")]
    return bool(lengths) and len(body) == lengths[0]


def test_every_reply_arrives_in_one_piece(server: ServerThread) -> None:
    address = urlsplit(server.url)
    request = f"GET /health HTTP/1.1\r\nhost: {address.netloc}\r\n\r\n".encode()
    with socket.create_connection((address.hostname, address.port), timeout=10) as sock:
        for _ in range(30):
            sock.sendall(request)
            first = sock.recv(1 << 20)
            assert first.startswith(b"HTTP/1.1 200") and complete(first), first[:200]
        sock.sendall(request.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n"))
        data = b""
        while chunk := sock.recv(1 << 20):
            data += chunk
    assert complete(data) and b"open_episodes" in data

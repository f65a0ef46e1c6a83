"""A TCP port free right now, for rendezvous addresses and servers that need a number."""

from __future__ import annotations

import socket


def free_port(host: str = "") -> int:
    """A TCP port on `host` ("" = every interface) that is free right now.

    For the places that must name a port rather than bind port 0 themselves: torch.distributed
    rendezvous addresses and SGLang servers. Another process may take it before it is used, which is
    why callers bind it soon after."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]

"""How much an MCP server lets its clients hold, and who may talk to it: flags shared by the two entry
points (`python -m awm.serve.mcp_server`, `awm env start`), kept apart from the server so the CLI stays light.

Why these values (docs/runtime.md, "trust boundary", has the table):
- Sessions: each open one holds an episode (a DB copy and a connection in a worker), so they are
  capped; an abandoned one gives its episode back after the idle timeout (long enough for a model turn
  between two tool calls), and one that has made no tools/call (nor control-plane request) a few
  minutes after its initialize is closed, so initialize-only sessions cannot sit on the cap for 30 min.
- Tool results: the largest text a model could read is well under 1 MiB (a 128K-token context is
  about 0.5 MB); past the cap the agent gets an error observation naming it, the session goes on.
- Connections: a legitimate client sends a request head in microseconds and a 4 MiB body (the SDK's
  largest) in well under a second on loopback or a LAN; 10 s and 30 s leave two orders of margin.
  Connections still reading a head or body are few at any moment, so a cap on them (the oldest is
  closed to make room) bounds what slow clients hold without refusing fast ones.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, fields

SESSION_IDLE_TIMEOUT_S = 30 * 60  # an abandoned session (no DELETE) gives its episode back after this
UNUSED_SESSION_TIMEOUT_S = 5 * 60  # a session with no tools/call this long after its initialize is closed
MAX_SESSIONS = 256  # each open session holds an episode (a DB copy and a connection in a worker)
MAX_RESULT_BYTES = 1 << 20  # a tools/call result's text (UTF-8) larger than this becomes an error observation
HEADER_TIMEOUT_S = 10.0  # a request head (request line + headers) must arrive whole within this
BODY_TIMEOUT_S = 30.0  # a request body must arrive whole within this after its head
MAX_PENDING_CONNECTIONS = 64  # connections reading a request head or body at once; the oldest is dropped past it
MAX_HEAD_BYTES = 64 * 1024  # a request head larger than this gets HTTP 431 (the SDK caps bodies at 4 MiB)
KEEP_ALIVE_TIMEOUT_S = 5  # uvicorn's own: an idle keep-alive connection is closed after this
TOKEN_ENV = "AWM_MCP_TOKEN"  # the bearer token; required (or generated and printed) off loopback


@dataclass(frozen=True)
class ServerLimits:
    """Everything an MCP client can make the server hold, each with its bound (see the module docstring)."""

    max_sessions: int = MAX_SESSIONS
    session_idle_timeout_s: float = SESSION_IDLE_TIMEOUT_S
    unused_session_timeout_s: float = UNUSED_SESSION_TIMEOUT_S
    max_result_bytes: int = MAX_RESULT_BYTES
    header_timeout_s: float = HEADER_TIMEOUT_S
    body_timeout_s: float = BODY_TIMEOUT_S
    max_pending_connections: int = MAX_PENDING_CONNECTIONS
    max_head_bytes: int = MAX_HEAD_BYTES

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            flag = "--" + f.name.removesuffix("_s").replace("_", "-")
            if f.type in ("int", int):
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"{flag} {value!r}: use a whole number, 1 or more")
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    math.isfinite(value) and value > 0):
                raise ValueError(f"{flag} {value!r}: use a positive number of seconds")


def add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-sessions", type=int, default=MAX_SESSIONS,
                        help=f"open MCP sessions (episodes) at most; more get HTTP 503 (default {MAX_SESSIONS})")
    parser.add_argument("--session-idle-timeout", type=float, default=SESSION_IDLE_TIMEOUT_S,
                        help="seconds without a request after which a session and its episode are closed "
                             f"(default {SESSION_IDLE_TIMEOUT_S})")
    parser.add_argument("--unused-session-timeout", type=float, default=UNUSED_SESSION_TIMEOUT_S,
                        help="seconds after its initialize by which a session must have made a tools/call (or a "
                             f"control-plane request), else it is closed (default {UNUSED_SESSION_TIMEOUT_S})")
    parser.add_argument("--max-result-bytes", type=int, default=MAX_RESULT_BYTES,
                        help="a tool result larger than this (UTF-8 bytes) is replaced by an error observation "
                             f"naming the cap (default {MAX_RESULT_BYTES})")
    parser.add_argument("--header-timeout", type=float, default=HEADER_TIMEOUT_S,
                        help="seconds a client has to send a request's head; slower ones get 408 and are "
                             f"disconnected (default {HEADER_TIMEOUT_S:g})")
    parser.add_argument("--body-timeout", type=float, default=BODY_TIMEOUT_S,
                        help="seconds a client has to send a request's body after its head (default "
                             f"{BODY_TIMEOUT_S:g})")
    parser.add_argument("--max-pending-connections", type=int, default=MAX_PENDING_CONNECTIONS,
                        help="connections still sending a request head or body at once; past it the oldest is "
                             f"disconnected (default {MAX_PENDING_CONNECTIONS})")


def limits_from(args: argparse.Namespace) -> ServerLimits:
    return ServerLimits(args.max_sessions, args.session_idle_timeout, args.unused_session_timeout,
                        args.max_result_bytes, args.header_timeout, args.body_timeout, args.max_pending_connections)

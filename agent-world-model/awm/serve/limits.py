"""How much an MCP server lets its clients hold, and who may talk to it: flags shared by the two entry
points (`python -m awm.serve.mcp_server`, `awm env start`), kept apart from the server so the CLI stays light."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

SESSION_IDLE_TIMEOUT_S = 30 * 60  # an abandoned session (no DELETE) gives its episode back after this
MAX_SESSIONS = 256  # each open session holds an episode (a DB copy and a connection in a worker)
TOKEN_ENV = "AWM_MCP_TOKEN"  # the bearer token; required (or generated and printed) off loopback


@dataclass(frozen=True)
class ServerLimits:
    """The session cap (more get HTTP 503) and the idle time after which a session and its episode close."""

    max_sessions: int = MAX_SESSIONS
    session_idle_timeout_s: float = SESSION_IDLE_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.max_sessions < 1:
            raise ValueError(f"--max-sessions {self.max_sessions}: use 1 or more")
        if not (math.isfinite(self.session_idle_timeout_s) and self.session_idle_timeout_s > 0):
            raise ValueError(f"--session-idle-timeout {self.session_idle_timeout_s}: use a positive number of seconds")


def add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-sessions", type=int, default=MAX_SESSIONS,
                        help=f"open MCP sessions (episodes) at most; more get HTTP 503 (default {MAX_SESSIONS})")
    parser.add_argument("--session-idle-timeout", type=float, default=SESSION_IDLE_TIMEOUT_S,
                        help="seconds without a request after which a session and its episode are closed "
                             f"(default {SESSION_IDLE_TIMEOUT_S})")


def limits_from(args: argparse.Namespace) -> ServerLimits:
    return ServerLimits(args.max_sessions, args.session_idle_timeout)

"""Open-file limit: raise the soft RLIMIT_NOFILE so a thousand episodes in flight do not run out of descriptors.

Every episode in flight holds descriptors in several processes at once: its HTTP connection to the
router in the rollout process, two in the router (in and out), one in its engine, and its SQLite
connection in its environment worker. A common default soft limit is 1,024, which a step of 1,024
episodes passes at once in each of these processes (`accept` fails with EMFILE, the router and the
engines drop connections, workers cannot open DBs). The hard limit is usually far higher and any
process may raise its soft limit up to it; children inherit the raised limit, so raising it in the
process that starts the router, the engines and the workers covers them all.
"""

from __future__ import annotations

import logging
import resource

logger = logging.getLogger(__name__)


class OpenFileLimitError(RuntimeError):
    """The hard limit on open files is below what the run needs; only the administrator can raise it."""


def raise_open_file_limit(needed: int, who: str = "this process") -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; return the new soft limit.

    Raises `OpenFileLimitError` naming the fix when even the hard limit is below `needed`.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, needed, 1 << 20)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:  # e.g. the kernel's nr_open is below the hard limit
            logger.warning("%s: could not raise the open-file limit from %d to %d: %s", who, soft, target, exc)
    if soft < needed:
        raise OpenFileLimitError(
            f"{who} needs about {needed} open files but its limit is {soft} (hard limit {hard}): raise the hard "
            f"limit before starting, e.g. `ulimit -Hn {needed * 2}` in a root shell, `nofile` in "
            "/etc/security/limits.conf, `LimitNOFILE=` for a systemd unit or `docker run --ulimit "
            f"nofile={needed * 2}`; or run fewer episodes at once (--sglang-server-concurrency)")
    return soft

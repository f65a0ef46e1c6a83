"""raise_open_file_limit in a child process with a low soft limit: raised up to the hard one, or a clear error."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import os, resource, sys
    from slime.utils.fd_limit import OpenFileLimitError, raise_open_file_limit
    soft, hard = int(sys.argv[1]), int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        got = raise_open_file_limit(int(sys.argv[3]), "the test")
    except OpenFileLimitError as exc:
        print("error", exc)
        sys.exit(0)
    files = [open(os.devnull) for _ in range(int(sys.argv[3]))]  # as many as were asked for: they open
    print("raised", got, resource.getrlimit(resource.RLIMIT_NOFILE)[0], len(files))
""")


def child(soft: int, hard: int, needed: int) -> str:
    out = subprocess.run([sys.executable, "-c", CHILD, str(soft), str(hard), str(needed)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_soft_limit_is_raised_to_the_hard_limit():
    assert child(soft=64, hard=4096, needed=1500) == "raised 4096 4096 1500"


def test_a_hard_limit_below_the_need_is_an_error_naming_the_fix():
    said = child(soft=64, hard=512, needed=1500)
    assert said.startswith("error the test needs about 1500 open files but its limit is 512 (hard limit 512)")
    assert "ulimit -Hn" in said and "--ulimit nofile=" in said and "--sglang-server-concurrency" in said

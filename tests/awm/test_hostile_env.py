"""Hostile environment code run through the real runtime: each way out of the worker is tried and must fail.

The scenario's handler tries one escape per call (read the trainer's environment or memory, reach
the network or a local daemon's Unix socket, write outside its worker's directory, start a process,
signal a process outside) and reports whether the kernel refused it. A control write inside its own
directory must still work. Before workers were locked down every escape here succeeded.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys

import pytest
from awm.episode import EnvRuntime
from awm.runtime.pool import WorkerCrashed
from conftest import write_scenarios

PROBE_APP = r'''
import ctypes, os, socket, subprocess
from fastapi import FastAPI
from sqlalchemy import create_engine

engine = create_engine(os.getenv("DATABASE_PATH", "sqlite:///probe.db"))
app = FastAPI(title="probe")


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _vm_read(address):
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(16)
    local, remote = _Iovec(ctypes.cast(buf, ctypes.c_void_p), 16), _Iovec(int(address), 16)
    if libc.process_vm_readv(os.getppid(), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) < 0:
        raise OSError(ctypes.get_errno(), "process_vm_readv failed")
    return buf.raw


def _fork(_):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def _write(path):
    with open(path, "w") as f:
        f.write("pwned")
    return path


def _unix(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    return "connected"


class _Payload:
    """Unpickling this opens a file for writing: code execution in whoever unpickles it."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _forge(path):
    import pickle, struct, sys
    body = pickle.dumps((1, True, _Payload(path)))
    os.write(int(sys.argv[1]), struct.pack(">I", len(body)) + body)  # the worker's own socket to the pool
    return "sent"


PROBES = {
    "forge": _forge,
    "parent_environ": lambda arg: open(f"/proc/{os.getppid()}/environ", "rb").read(),
    "parent_mem": lambda arg: open(f"/proc/{os.getppid()}/mem", "rb").read(1),
    "vm_read": _vm_read,
    "read_file": lambda arg: open(arg, "rb").read(),
    "tcp": lambda arg: socket.create_connection(("127.0.0.1", int(arg)), timeout=2).getpeername(),
    "udp": lambda arg: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", int(arg))),
    "unix": _unix,
    "write": _write,
    "fork": _fork,
    "subprocess": lambda arg: subprocess.run(["true"]).returncode,
    "kill": lambda arg: os.kill(int(arg), 15),
}


@app.get("/probe", operation_id="probe", summary="Try one escape")
def probe(what: str, arg: str = ""):
    try:
        out = PROBES[what](arg)
    except Exception as exc:
        return {"denied": True, "detail": f"{type(exc).__name__}: {exc}"}
    return {"denied": False, "detail": repr(out)[:300]}
'''


@pytest.fixture(scope="module")
def probe_data_dir(tmp_path_factory: pytest.TempPathFactory):
    return write_scenarios(tmp_path_factory.mktemp("hostile"), {"probe": PROBE_APP})


async def _probe(ep, what: str, arg: object = "") -> dict:
    obs = await ep.call("probe", {"what": what, "arg": str(arg)})
    assert not obs.is_error, obs.text
    return json.loads(obs.text)


def test_environment_code_cannot_leave_its_worker(probe_data_dir, cache_dir, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("sk-trainer-secret")
    outside = tmp_path / "outside.txt"
    tcp = socket.create_server(("127.0.0.1", 0))
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(str(tmp_path / "daemon.sock"))
    unix.listen()
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    marker = b"parent-memory-marker"

    async def main():
        with EnvRuntime(probe_data_dir, num_workers=2, cache_dir=cache_dir) as rt:
            ep = await rt.open("probe")
            other_dir = rt.pool.worker_dir(next(s for s in rt.pool.slots if s is not ep._slot))
            protections = (await rt.pool.request(ep._slot, "ping", {}, 5.0)).get("protections", {})
            escapes = {
                "parent_environ": "", "parent_mem": "", "vm_read": id(marker),
                "read_file": secret, "tcp": tcp.getsockname()[1], "udp": 9,
                "unix": tmp_path / "daemon.sock", "write": outside,
                "write_other_worker": os.path.join(other_dir, "planted.db"),
                "write_template": ep.initial_db, "fork": "", "subprocess": "", "kill": bystander.pid,
            }
            results = {}
            for name, arg in escapes.items():
                results[name] = await _probe(ep, name.replace("_other_worker", "").replace("_template", ""), arg)
            own = await _probe(ep, "write", ep.db_path.with_name("own-scratch.txt"))
            return protections, results, own

    try:
        protections, results, own = asyncio.run(main())
    finally:
        bystander_alive = bystander.poll() is None  # before our own kill below, which poll() may reap at once
        bystander.kill()
        tcp.close()
        unix.close()
    assert not own["denied"], own  # the worker's own directory stays writable
    if protections.get("landlock_abi", 0) < 6:
        pytest.skip(f"this kernel's Landlock ABI is {protections.get('landlock_abi')}: the file and signal "
                    "rules need 6 or later")
    escaped = {name: r["detail"] for name, r in results.items() if not r["denied"]}
    assert escaped == {}
    assert protections["lockdown"] and protections["seccomp_no_fork"] and protections["network_isolated"]
    assert not outside.exists() and bystander_alive


def test_a_forged_frame_is_parsed_as_data_and_kills_its_worker(probe_data_dir, cache_dir, tmp_path):
    """Env code writes a pickle frame on its inherited socket: the pool reads frames as bounded JSON, so
    nothing runs in the trainer; the frame breaks the protocol, the worker is killed, the call fails as an
    infrastructure error, and the next episode runs on a fresh worker."""
    mark = tmp_path / "ran-in-the-trainer.txt"

    async def main():
        with EnvRuntime(probe_data_dir, num_workers=1, cache_dir=cache_dir) as rt:
            ep = await rt.open("probe")
            with pytest.raises(Exception) as caught:
                await ep.call("probe", {"what": "forge", "arg": str(mark)})
            restarts = rt.pool.restarts
            again = await rt.open("probe")
            healthy = await _probe(again, "fork")
            return caught.value, restarts, healthy

    exc, restarts, healthy = asyncio.run(main())
    assert not mark.exists()
    assert "protocol" in str(exc) or isinstance(exc, WorkerCrashed), exc
    assert restarts >= 1 and "detail" in healthy


def test_sandbox_does_not_break_a_real_scenario(fault_data_dir, cache_dir):
    """Sync handlers run in FastAPI's thread pool: threads must still start under the seccomp filter."""
    async def main():
        with EnvRuntime(fault_data_dir, num_workers=1, cache_dir=cache_dir) as rt:
            ep = await rt.open("faults", 0)
            assert not (await ep.call("add_note", {"text": "buy milk"})).is_error
            snap = await ep.snapshot()
            await ep.reset()
            await ep.restore(snap)
            assert (await ep.verify("done")).verdict == "complete"
            return os.path.dirname(ep.db_path)

    assert asyncio.run(main()).endswith("worker-0")

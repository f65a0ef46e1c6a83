"""The kernel protections a process applies to itself: Landlock, seccomp, dropped capabilities, a
network namespace, a parent-death signal and no_new_privs.

Shared by the verifier sandbox's children (`awm.sandbox`) and the environment workers
(`awm.runtime.worker`). Standard library only: the verifier helper runs as `python -I sandbox.py`,
without the `awm` package, and loads this file beside it.
"""

import ctypes
import os
import signal
import stat
import sys
from typing import Any

_PR_SET_PDEATHSIG = 1
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_GET_SECCOMP, _PR_SET_SECCOMP = 21, 22
_CLONE_NEWNET = 0x40000000
# Landlock syscalls carry the same numbers on every Linux architecture.
_SYS_LANDLOCK_CREATE_RULESET, _SYS_LANDLOCK_ADD_RULE, _SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
_LL_WRITE_FILE, _LL_READ_FILE, _LL_READ_DIR = 1 << 1, 1 << 2, 1 << 3
_LL_TRUNCATE = 1 << 14
# seccomp, per machine: audit arch; syscalls always denied (fork, vfork, socket, ptrace, process_vm_readv,
# process_vm_writev, unshare, setns; then every other way to a socket or another process's fds: socketpair
# (a datagram pair can sendto() any Unix socket path), io_uring_setup/enter/register (io_uring runs socket,
# connect, openat... as ring operations seccomp never sees), pidfd_open, pidfd_getfd (copy another
# process's fds) and pidfd_send_signal; and timer_create, whose POSIX timers outlive the call that armed
# them and signal the worker later); clone and clone3, allowed for threads only where threads are.
# "metadata" (verifier children only): chmod, chown, utime and xattr calls in every form, so that a verifier
# reading an original database through a hard link (`awm.sandbox.place_databases`) cannot change its mode,
# owner or times.
_SECCOMP_SYSCALLS = {
    "x86_64": {"arch": 0xC000003E, "deny": (57, 58, 41, 101, 310, 311, 272, 308,
                                            53, 425, 426, 427, 434, 438, 424, 222), "clone": 56, "clone3": 435,
               "metadata": (90, 91, 268, 452, 92, 93, 94, 260, 132, 235, 261, 280,
                            188, 189, 190, 197, 198, 199, 463, 466)},
    "aarch64": {"arch": 0xC00000B7, "deny": (198, 117, 270, 271, 97, 268,
                                             199, 425, 426, 427, 434, 438, 424, 107), "clone": 220, "clone3": 435,
                "metadata": (52, 53, 452, 54, 55, 88, 5, 6, 7, 14, 15, 16, 463, 466)},
}
_CLONE_THREAD = 0x10000
# What a verifier may read besides its DB copies: the interpreter and system libraries, nothing else
# (no /proc/<pid>/environ of the trainer, no home directories, no /tmp).
_SYSTEM_READ_ROOTS = ("/usr", "/lib", "/lib64", "/lib32")
_SYSTEM_READ_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/etc/timezone", "/etc/passwd", "/etc/group")
_DEVICES = {"/dev/null": "rw", "/dev/zero": "r", "/dev/urandom": "r", "/dev/random": "r"}


class _LandlockRulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _LandlockPathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _checked(result: int, what: str) -> int:
    """Raise OSError with errno for a failed libc call (they return -1 and set errno)."""
    if result < 0:
        raise OSError(ctypes.get_errno(), f"{what} failed")
    return result


def _syscall(libc: ctypes.CDLL, number: int, *args: int) -> int:
    """A raw syscall with every argument passed as a full-width integer (the variadic ABI needs that)."""
    return _checked(libc.syscall(ctypes.c_long(number), *map(ctypes.c_ulong, args)), f"syscall {number}")


def _prctl(libc: ctypes.CDLL, option: int, arg: int = 0, arg3: int = 0) -> int:
    return _checked(
        libc.prctl(ctypes.c_int(option), *map(ctypes.c_ulong, (arg, arg3, 0, 0))), f"prctl({option})"
    )


def _landlock_fs_rights(abi: int) -> int:
    """Every filesystem right the kernel knows at this ABI: handling a right and not granting it denies it."""
    rights = (1 << 13) - 1  # execute, write, read, readdir, remove, make_* (ABI 1)
    for version, bit in ((2, 13), (3, 14), (5, 15)):  # refer, truncate, ioctl_dev
        if abi >= version:
            rights |= 1 << bit
    return rights


_LL_WRITE_DIR_RIGHTS = (1 << 1) | (1 << 2) | (1 << 3) | (1 << 4) | (1 << 5) | (1 << 7) | (1 << 8)
"""write, read, readdir, remove_dir, remove_file, make_dir, make_reg: what a writable dir grants (no exec)."""


def _landlock_rules(abi: int, readable_extra: tuple[str, ...], writable: tuple[str, ...]) -> list[tuple[int, int]]:
    """(rights, O_PATH fd) per path: read-only access to the interpreter, system libraries and
    `readable_extra`; plain files and directories under `writable` (no exec, sockets, devices or links
    there). Opened once, so that a forked child builds its own ruleset without touching the filesystem."""
    readable = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *readable_extra, *sys.path}
    readable.update(_SYSTEM_READ_ROOTS, _SYSTEM_READ_FILES)
    wanted = {path: _LL_READ_FILE | _LL_READ_DIR for path in readable if path}
    write = _LL_WRITE_FILE | (_LL_TRUNCATE if abi >= 3 else 0)
    wanted.update({path: _LL_READ_FILE | (write if mode == "rw" else 0) for path, mode in _DEVICES.items()})
    wanted.update({path: _LL_WRITE_DIR_RIGHTS | (_LL_TRUNCATE if abi >= 3 else 0) for path in writable})
    rules = []
    for path, rights in wanted.items():
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue  # a missing optional path
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= _LL_READ_FILE | _LL_WRITE_FILE | _LL_TRUNCATE  # file rules take file rights only
        rules.append((rights, fd))
    return rules


def _landlock_ruleset(libc: ctypes.CDLL, abi: int, rules: list[tuple[int, int]]) -> int:
    """A Landlock ruleset granting `rules` and denying every other filesystem access it handles (write,
    create, delete, exec anywhere else); no TCP (ABI 4+); no signals or abstract sockets out (ABI 6+)."""
    attr = _LandlockRulesetAttr(_landlock_fs_rights(abi), 0b11 if abi >= 4 else 0, 0b11 if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = _syscall(libc, _SYS_LANDLOCK_CREATE_RULESET, ctypes.addressof(attr), size, 0)
    for rights, fd in rules:
        rule = _LandlockPathBeneathAttr(rights, fd)
        _syscall(libc, _SYS_LANDLOCK_ADD_RULE, ruleset, 1, ctypes.addressof(rule), 0)  # 1: path beneath
    return ruleset


def _seccomp_program(threads: bool) -> _SockFprog | None:
    """A seccomp filter that fails with EPERM: fork and vfork; clone unless it makes a thread (`threads`)
    or always; clone3 (ENOSYS when `threads`, so the C library falls back to clone, whose flags a filter
    can read); socket and socketpair (no new sockets: no TCP, UDP or connect() to a Unix socket path);
    io_uring (its ring operations would open sockets around this filter); ptrace, process_vm_readv/writev
    and the pidfd calls (no reading another process's memory or fds); unshare and setns; timer_create
    (a POSIX timer would signal a later call or import); without `threads`
    (a verifier child) also chmod, chown, utime and xattr changes. Foreign syscall ABIs are refused too.
    None off x86_64/aarch64."""
    table = _SECCOMP_SYSCALLS.get(os.uname().machine)
    if table is None:
        return None
    load, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38  # SECCOMP_RET_ALLOW / ERRNO
    # (code, k, jump-if-true label, jump-if-false label); labels: None = next instruction
    body: list[tuple[int, int, str | None, str | None]] = [
        (load, 4, None, None), (jeq, table["arch"], None, "deny"),
        (load, 0, None, None), (jge, 0x40000000, "deny", None),
        *((jeq, n, "deny", None) for n in table["deny"]),
    ]
    if threads:
        body += [(jeq, table["clone3"], "nosys", None), (jeq, table["clone"], None, "allow"),
                 (load, 16, None, None), (jset, _CLONE_THREAD, "allow", "deny")]
    else:
        body += [(jeq, n, "deny", None) for n in (table["clone"], table["clone3"], *table["metadata"])]
    ends = {"allow": allow, "deny": eperm, "nosys": enosys}
    at = {label: len(body) + i for i, label in enumerate(ends)}
    program = []
    for index, (code, k, true, false) in enumerate(body):
        jt = at[true] - index - 1 if true else 0
        jf = at[false] - index - 1 if false else 0
        program.append(_SockFilter(code, jt, jf, k))
    program += [_SockFilter(ret, 0, 0, k) for k in ends.values()]
    filters = (_SockFilter * len(program))(*program)
    fprog = _SockFprog(len(program), filters)
    fprog._keep = filters  # the filter array must outlive the struct that points to it
    return fprog


def _last_capability() -> int:
    """The highest capability number this kernel knows (63, the most there can be, if it will not say)."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as handle:
            return int(handle.read())
    except (OSError, ValueError):
        return 63


class Lockdown:
    """The kernel protections available here, built once and applied by a process to itself.

    An environment worker (`awm.runtime.worker`) builds and applies its own with `writable` (its episode
    files) and `threads` (FastAPI runs sync handlers in a thread pool). The verifier helper builds
    one and each forked child applies it in two steps: `prepare` while it waits (everything but the
    Landlock restriction, plus a ruleset of its own), then `confine` once its request names the one
    directory it may read.
    """

    def __init__(self, readable: tuple[str, ...], writable: tuple[str, ...] = (), *, threads: bool = False) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
        libc = self.libc
        # The caller only talks over pipes or sockets it already has, so it can leave the network.
        self.network_isolated = libc is not None and libc.unshare(ctypes.c_int(_CLONE_NEWNET)) == 0
        self.landlock_abi = 0
        if libc is not None:
            try:  # flag 1 asks for the ABI version
                self.landlock_abi = _syscall(libc, _SYS_LANDLOCK_CREATE_RULESET, 0, 0, 1)
            except OSError:
                pass  # no Landlock in this kernel, or disabled
        self._rules = _landlock_rules(self.landlock_abi, readable, writable) if self.landlock_abi else []
        self.ruleset_fd = self.new_ruleset()
        seccomp_ok = libc is not None and libc.prctl(_PR_GET_SECCOMP, 0, 0, 0, 0) >= 0  # kernel has it
        self.seccomp = _seccomp_program(threads) if seccomp_ok else None
        # Hard links to files a child must not change are safe only where Landlock denies writing and
        # truncating them (ABI 3+) and seccomp denies chmod, chown, utime and xattr calls (no threads).
        self.guards_linked_files = self.landlock_abi >= 3 and self.seccomp is not None and not threads
        # Root keeps uid 0 (its interpreter may live under /root) but gives up every capability.
        self.drop_capabilities = libc is not None and os.geteuid() == 0
        self.last_capability = _last_capability()

    def describe(self) -> dict[str, Any]:
        return {
            "network_isolated": self.network_isolated,
            "landlock_abi": self.landlock_abi,
            "seccomp_no_fork": self.seccomp is not None,
            "capabilities_dropped": self.drop_capabilities,
            "uid": os.geteuid(),
        }

    def new_ruleset(self) -> int:
        """A fresh Landlock ruleset fd for this lockdown's paths (-1 without Landlock).

        A forked child needs its own: rules added to an inherited fd would change its siblings' too.
        """
        if not self.landlock_abi:
            return -1
        return _landlock_ruleset(self.libc, self.landlock_abi, self._rules)

    def apply(self, parent_pid: int | None, ruleset_fd: int | None = None) -> None:
        """Lock this thread (and every thread or process it makes later) down; `parent_pid`: die with it."""
        if self.libc is None:
            return
        self._drop_privileges(parent_pid)
        self._restrict_paths(self.ruleset_fd if ruleset_fd is None else ruleset_fd)
        self._filter_syscalls()
        for _, fd in self._rules:  # the rules live on in the restriction; their paths' fds are not needed
            os.close(fd)
        self._rules = []

    def prepare(self, parent_pid: int) -> None:
        """Every protection but the Landlock restriction, for a child that learns what it may read later
        (`confine`); it builds its ruleset (`new_ruleset`) before this: root without capabilities may
        no longer reach every path."""
        if self.libc is None:
            return
        self._drop_privileges(parent_pid)
        self._filter_syscalls()

    def confine(self, ruleset_fd: int, readable_dir: str | None) -> None:
        """After `prepare`: allow reading `readable_dir` too, then restrict this process to `ruleset_fd`."""
        if ruleset_fd < 0:
            return
        if readable_dir is not None:
            fd = os.open(readable_dir, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = _LandlockPathBeneathAttr(_LL_READ_FILE | _LL_READ_DIR, fd)
                _syscall(self.libc, _SYS_LANDLOCK_ADD_RULE, ruleset_fd, 1, ctypes.addressof(rule), 0)
            finally:
                os.close(fd)
        self._restrict_paths(ruleset_fd)

    def _drop_privileges(self, parent_pid: int | None) -> None:
        """Capabilities (root), a parent-death signal, and no_new_privs (which Landlock and seccomp need)."""
        libc = self.libc
        if self.drop_capabilities:  # first: a credential change would clear the death signal set below
            for cap in range(self.last_capability + 1):
                try:
                    _prctl(libc, _PR_CAPBSET_DROP, cap)
                except OSError:
                    break  # past the last capability this kernel knows
            _checked(libc.capset(ctypes.byref(_CapHeader(0x20080522, 0)), (_CapData * 2)()), "capset")
        if parent_pid is not None:
            _prctl(libc, _PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != parent_pid:  # the parent died before the line above took effect
                os._exit(0)
        _prctl(libc, _PR_SET_NO_NEW_PRIVS, 1)

    def _restrict_paths(self, ruleset_fd: int) -> None:
        if ruleset_fd >= 0:
            _syscall(self.libc, _SYS_LANDLOCK_RESTRICT_SELF, ruleset_fd, 0)
            os.close(ruleset_fd)

    def _filter_syscalls(self) -> None:
        if self.seccomp is not None:
            _prctl(self.libc, _PR_SET_SECCOMP, 2, ctypes.addressof(self.seccomp))  # 2: filter mode

"""Small helpers plugins import from `slime.utils.misc`, with upstream slime's names and meanings.

The module stays cheap and safe to import anywhere: ray, torch and the HTTP stack are imported inside
the functions that need them, so code that only wants `load_function` (plugin loaders, upstream's
contract tests, which replace `ray` and `transformers` with small stand-ins) pulls in none of them.

Ours in addition: `free_port` (bind port 0, for rendezvous addresses) and `PluginLoadError`.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.util
import subprocess
import threading
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    import torch

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


# ---------------------------------------------------------------------------------------------- plugins


class PluginLoadError(ImportError):
    """A dotted plugin path cannot be turned into an object; the message says which part failed and why."""


@functools.cache
def load_function(path: str) -> Any:
    """The object named by a dotted path such as "pkg.mod.fn": import "pkg.mod", then take "fn" from it.

    Every plugin flag (`--custom-generate-function-path`, `--custom-rm-path`, ...) resolves through
    here. Cached because rollout code resolves per-sample override paths once per sample; a failure is
    not cached, so fixing `sys.path` and retrying works.
    """
    if not isinstance(path, str):
        raise PluginLoadError(f"plugin path must be a string like 'package.module.name', got {path!r}")
    module_name, _, attr = path.strip().rpartition(".")
    if not module_name or not attr:
        raise PluginLoadError(
            f"plugin path {path!r} must look like 'package.module.name': the module to import, a dot, "
            "then the function or class defined in it"
        )
    module = _import_plugin_module(path, module_name)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise PluginLoadError(_missing_attribute_sentence(path, module, attr)) from None


def _import_plugin_module(path: str, module_name: str) -> Any:
    """Import the module part of `path`, turning each way it can fail into its own sentence."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if not exc.name:  # raised by hand without naming a module: report it like any other error
            raise _failed_import(path, module_name, exc) from exc
        if module_name == exc.name or module_name.startswith(exc.name + "."):
            raise PluginLoadError(_not_on_path_sentence(path, module_name, exc.name)) from exc
        raise PluginLoadError(_missing_dependency_sentence(path, module_name, exc.name)) from exc
    except Exception as exc:
        raise _failed_import(path, module_name, exc) from exc


def _failed_import(path: str, module_name: str, exc: BaseException) -> PluginLoadError:
    return PluginLoadError(
        f"cannot load plugin {path!r}: module {module_name!r} was found but importing it raised "
        f"{type(exc).__name__}: {exc}; fix that error in the module (its traceback is chained above)"
    )


def _not_on_path_sentence(path: str, module_name: str, missing: str) -> str:
    """The plugin's own module (or a package above it) is nowhere on sys.path."""
    parent = missing.rpartition(".")[0]
    if parent and _find_spec(parent) is not None:
        return (
            f"cannot load plugin {path!r}: module {module_name!r} not found: package {parent!r} exists but "
            f"has no module {missing!r}; check the spelling of the module part of the path"
        )
    return (
        f"cannot load plugin {path!r}: module {module_name!r} not found: no {missing!r} on sys.path; run "
        f"from the directory that holds {missing.split('.')[0]!r} or add that directory to PYTHONPATH"
    )


def _missing_dependency_sentence(path: str, module_name: str, missing: str) -> str:
    """The plugin module exists, but something it imports does not."""
    root = missing.split(".")[0]
    parent = missing.rpartition(".")[0]
    if parent and _find_spec(parent) is not None:
        return (
            f"cannot load plugin {path!r}: module {module_name!r} imports {missing!r}, but the installed "
            f"package {parent!r} has no such module; the plugin was written for another version of "
            f"{root!r}"
        )
    return (
        f"cannot load plugin {path!r}: module {module_name!r} imports {missing!r}, which is not "
        f"installed; install the package that provides {root!r} in this environment"
    )


def _missing_attribute_sentence(path: str, module: Any, attr: str) -> str:
    where = getattr(module, "__file__", None) or "a namespace package"
    close = difflib.get_close_matches(attr, [n for n in dir(module) if not n.startswith("_")], n=3)
    hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
    return (
        f"cannot load plugin {path!r}: module {module.__name__!r} ({where}) has no attribute {attr!r}{hint}; "
        "check the name after the last dot"
    )


def _find_spec(name: str) -> Any:
    """`importlib.util.find_spec`, None instead of an error when a parent package is missing or broken."""
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


# -------------------------------------------------------------------------------------------- singletons


class SingletonMeta(type):
    """Metaclass: a class built with it has one instance per process, made by the first call.

    Later calls return that instance whatever their arguments. `Cls.clear_instances()` forgets the
    instance of `Cls` and of its subclasses, so the next call builds a fresh one (tests, reloads).
    """

    _instances: dict[type, Any] = {}
    _lock = threading.RLock()  # re-entrant: a singleton's __init__ may build another singleton

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        with SingletonMeta._lock:
            if cls not in SingletonMeta._instances:
                SingletonMeta._instances[cls] = super().__call__(*args, **kwargs)
            return SingletonMeta._instances[cls]

    def clear_instances(cls) -> None:
        with SingletonMeta._lock:
            for known in list(SingletonMeta._instances):
                if issubclass(known, cls):
                    del SingletonMeta._instances[known]


class Box(Generic[T]):
    """A plain holder: wrapping a value (e.g. a Ray object ref) keeps Ray from resolving it when passed on."""

    def __init__(self, inner: T):
        self._inner = inner

    @property
    def inner(self) -> T:
        return self._inner


# ------------------------------------------------------------------------------------------- collections


def group_by(iterable: Iterable[T], key: Callable[[T], K] | None = None) -> dict[K, list[T]]:
    """Items grouped by `key(item)` (the item itself without `key`), in first-seen order.

    Unlike `itertools.groupby` the input need not be sorted: equal keys anywhere land in one list.
    """
    groups: dict[Any, list[T]] = {}
    for item in iterable:
        groups.setdefault(item if key is None else key(item), []).append(item)
    return groups


def should_run_periodic_action(
    rollout_id: int,
    interval: int | None,
    num_rollout_per_epoch: int | None = None,
    num_rollout: int | None = None,
) -> bool:
    """Whether an every-`interval`-steps action (eval, save) runs after 0-based rollout `rollout_id`.

    Never when `interval` is None. Otherwise after the last rollout (`num_rollout - 1`), after every
    `interval`-th rollout, and at each epoch end when `num_rollout_per_epoch` is given.
    """
    if interval is None:
        return False
    if num_rollout is not None and rollout_id == num_rollout - 1:
        return True
    done = rollout_id + 1
    if done % interval == 0:
        return True
    return num_rollout_per_epoch is not None and done % num_rollout_per_epoch == 0


def chunk_named_params_by_size(
    named_params: Iterable[tuple[str, torch.Tensor]], chunk_size: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Lists of consecutive `(name, tensor)` pairs for weight updates sent in pieces.

    A list is closed before the pair that would bring its bytes to `chunk_size` or more, so every list
    holds less than `chunk_size` bytes unless it is a single tensor that is that large by itself.
    """
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive number of bytes, got {chunk_size}")
    chunk: list[tuple[str, torch.Tensor]] = []
    held = 0
    for name, tensor in named_params:
        size = tensor.nbytes
        if chunk and held + size >= chunk_size:
            yield chunk
            chunk, held = [], 0
        chunk.append((name, tensor))
        held += size
    if chunk:
        yield chunk


def decode_int32_meta_array(meta_info: dict[str, Any], keys: str | Iterable[str]) -> torch.Tensor | None:
    """The int32 array an engine reply's `meta_info` carries under the first of `keys` present, flattened.

    Engines send such arrays (routed experts, top-p token ids) as base64 text, raw bytes, lists, numpy
    arrays or tensors; all come back as a 1-D CPU int32 tensor. None when no key is present or its value
    is None.
    """
    import torch

    for key in (keys,) if isinstance(keys, str) else keys:
        if key in meta_info:
            value = meta_info[key]
            break
    else:
        return None
    if value is None:
        return None
    if isinstance(value, str):
        import base64

        value = base64.b64decode(value)
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytearray(value)
        if len(raw) % 4:
            raise ValueError(
                f"meta_info[{key!r}] holds {len(raw)} bytes, not a whole number of int32 values (4 bytes each)"
            )
        return torch.frombuffer(raw, dtype=torch.int32) if raw else torch.empty(0, dtype=torch.int32)
    if isinstance(value, torch.Tensor):
        return value.detach().to(device="cpu", dtype=torch.int32).reshape(-1)
    return torch.tensor(value, dtype=torch.int32).reshape(-1)


# ------------------------------------------------------------------------------------ processes, network


def exec_command(cmd: str, capture_output: bool = False) -> str | None:
    """Run `cmd` with bash, echoing it first; raise `CalledProcessError` if it exits non-zero.

    Returns its stdout as text when `capture_output`, else None (the output goes to this process's own).
    """
    print(f"EXEC: {cmd}", flush=True)
    try:
        done = subprocess.run(["bash", "-c", cmd], check=True, capture_output=capture_output, text=capture_output)
    except subprocess.CalledProcessError as exc:
        if capture_output:
            print(f"command failed with exit code {exc.returncode}\nstdout: {exc.stdout}\nstderr: {exc.stderr}",
                  flush=True)
        raise
    if not capture_output:
        return None
    print(f"captured stdout: {done.stdout}\ncaptured stderr: {done.stderr}", flush=True)
    return done.stdout


def get_current_node_ip() -> str:
    """This node's IP address as Ray sees it (brackets of an IPv6 address removed); needs `ray`."""
    import ray  # here, not at the top: most users of this module never start Ray

    return ray._private.services.get_node_ip_address().strip("[]")


def get_free_port(start_port: int = 10000, consecutive: int = 1) -> int:
    """The lowest port >= `start_port` such that it and the `consecutive - 1` ports after it are all free."""
    if consecutive < 1:
        raise ValueError(f"consecutive must be >= 1, got {consecutive}")
    from slime.utils.http_utils import is_port_available

    port = start_port
    while port + consecutive - 1 <= 65535:
        blocked = next((p for p in range(port, port + consecutive) if not is_port_available(p)), None)
        if blocked is None:
            return port
        port = blocked + 1  # every run that contains the busy port fails too
    raise RuntimeError(f"no {consecutive} consecutive free TCP ports from {start_port} up to 65535")


def free_port(host: str = "") -> int:
    """Ours: a TCP port on `host` ("" = every interface) that the kernel reports free right now.

    For the places that must name a port rather than bind port 0 themselves: torch.distributed
    rendezvous addresses and SGLang servers. Another process may take it before it is used, which is
    why callers bind it soon after.
    """
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]

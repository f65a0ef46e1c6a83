"""Plugins: turn a dotted plugin path from a flag into the object it names.

Every plugin flag (`--custom-generate-function-path rollout.generate`, ...) goes through
`load_function`, so the error for a bad path is written once and names the path and the flag-level fix.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any


class PluginLoadError(ImportError):
    """A dotted plugin path names a module or attribute that cannot be loaded."""


@functools.cache
def load_function(path: str) -> Any:
    """Return the object at `path` ("pkg.mod.attr": import `pkg.mod`, then `getattr(.., "attr")`).

    Cached because rollout code resolves per-sample override paths once per sample; failures are
    not cached, so fixing `sys.path` and retrying works.
    """
    module_name, dot, attr = path.rpartition(".")
    if not dot or not module_name or not attr:
        raise PluginLoadError(
            f"plugin path {path!r} must look like 'package.module.attribute' (a module and a name in it)"
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Distinguish "the plugin module is not on sys.path" from "the plugin imports something missing".
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise PluginLoadError(
                f"cannot load plugin {path!r}: module {module_name!r} not found; run from the directory "
                "that holds it or add that directory to PYTHONPATH"
            ) from exc
        raise PluginLoadError(
            f"cannot load plugin {path!r}: importing {module_name!r} failed because module "
            f"{missing!r} is missing; install it"
        ) from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise PluginLoadError(
            f"cannot load plugin {path!r}: module {module_name!r} ({module.__file__}) has no attribute "
            f"{attr!r}; check the spelling of the name after the last dot"
        ) from None

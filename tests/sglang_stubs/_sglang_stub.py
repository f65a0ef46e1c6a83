"""Shared body of the import-only stubs that let the pinned sglang import on a CPU-only test venv.

A stub answers attribute lookups with placeholders so that sglang's module-level code (imports,
default arguments, base classes) runs; calling a placeholder raises, because no conformance check
may execute the stubbed library. The list of stubs and the reason for each is `STUBS` in
tests/sglang_real.py.
"""

from __future__ import annotations

from typing import Any


class StubUsed(RuntimeError):
    """Checked sglang code called into a stubbed library: the check needs the real package."""


class Placeholder:
    """Stands for any attribute of a stubbed module; subclassable, never callable."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str) -> Placeholder:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Placeholder(f"{self._name}.{attr}")

    def __getitem__(self, key: Any) -> Placeholder:
        return Placeholder(f"{self._name}[...]")

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (object,)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise StubUsed(
            f"{self._name} is a stub of tests/sglang_stubs (an import-only stand-in): install the real "
            "package into the sglang side folder (SIDE_PACKAGES in tests/sglang_real.py) if a check needs it"
        )

    def __repr__(self) -> str:
        return f"<stub {self._name}>"


def module_getattr(module_name: str):
    """A PEP 562 module `__getattr__` that hands out placeholders named after the module."""

    def __getattr__(attr: str) -> Placeholder:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Placeholder(f"{module_name}.{attr}")

    return __getattr__

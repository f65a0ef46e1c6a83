"""Modules that moved: importing (or `python -m`) an old path fails with an error naming the new one."""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Mapping

# awm's own moves; awm/__init__.py registers them, awm_grpo registers its own.
MOVED = {f"awm.{m}": f"awm.runtime.{m}" for m in ("pool", "worker", "wire", "envapp", "isolation", "deadline")} | {
    "awm.mcp_server": "awm.serve.mcp_server", "awm.server_limits": "awm.serve.limits",
    "awm.predicate_set": "awm.predicates.predicate", "awm.semantics": "awm.predicates.tool_labels",
    "awm.verifier_analysis": "awm.predicates.verifier_analysis", "awm.gen.scenarios": "awm.gen.scenario_stage",
}


class MovedModules(importlib.abc.MetaPathFinder):
    """A finder consulted after the real ones: an old name that no longer exists raises, with its new home."""

    def __init__(self, moved: Mapping[str, str]) -> None:
        self.moved = dict(moved)

    def find_spec(self, name: str, path: object, target: object = None) -> None:
        if name in self.moved:
            raise ModuleNotFoundError(f"{name} moved to {self.moved[name]}: use that path (import or python -m)",
                                      name=name)
        return None


def register(moved: Mapping[str, str]) -> None:
    """Add these old -> new module names to the finder at the end of sys.meta_path (idempotent)."""
    for finder in sys.meta_path:
        if isinstance(finder, MovedModules):
            finder.moved.update(moved)
            return
    sys.meta_path.append(MovedModules(moved))

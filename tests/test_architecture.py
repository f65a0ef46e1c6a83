"""The import graph of the three packages: data flows one way and no module loop hides anywhere.

awm (environments) and slime (trainer) never import awm_grpo (the recipe that joins them), and
never import each other. No two modules import each other, directly or around a longer loop,
counting imports inside functions (a loop hidden by a function-local import is still a loop);
imports under `if TYPE_CHECKING:` are types only and do not count.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest
from awm import moved

import awm_grpo

REPO = Path(__file__).resolve().parents[1]
ROOTS = {"awm": REPO / "agent-world-model" / "awm", "slime": REPO / "slime", "awm_grpo": REPO / "awm_grpo"}


def modules() -> dict[str, Path]:
    found = {}
    for package, root in ROOTS.items():
        for path in root.rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            if "scenarios" in parts and path.name == "app.py":
                continue  # bundled environment code: generated-style apps, loaded by workers, not imported
            name = ".".join((package, *parts))
            found[name.removesuffix(".__init__")] = path
    return found


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for child in node.body for n in ast.walk(child))
    return skip


def imports_of(path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules `path` imports (anywhere in the file, TYPE_CHECKING blocks excepted)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_nodes(tree)
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return {name for name in names if name in known}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(path, known) - {name} for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def _is_package_init(name: str, target: str) -> bool:
    """`awm.gen.x` importing `awm.gen` (its own package's __init__) is Python's package loading, not a loop."""
    return name.startswith(target + ".")


def test_the_packages_are_found():
    found = modules()
    assert {"awm.episode", "slime.train", "awm_grpo.rollout", "awm.gen.runner"} <= set(found)


def test_data_flows_one_way_between_the_packages():
    wrong = {(a, b) for a, targets in graph().items() for b in targets
             if (a.split(".")[0], b.split(".")[0]) in {("awm", "awm_grpo"), ("slime", "awm_grpo"), ("awm", "slime"),
                                                       ("slime", "awm")}}
    assert wrong == set(), "awm and slime must not import awm_grpo or each other"


def test_no_import_loop():
    edges = {a: {b for b in targets if not _is_package_init(a, b)} for a, targets in graph().items()}
    assert cycles(edges) == []


def test_the_loop_finder_finds_a_hidden_loop(tmp_path):
    """The check itself can fail: a function-local import closing a loop is found."""
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("import slime.x\n")
    b.write_text("def f():\n    from slime.a import g\n")
    known = {"slime.a": a, "slime.x": b}
    edges = {name: imports_of(path, known) - {name} for name, path in known.items()}
    assert cycles(edges) == [["slime.a", "slime.x"]]
    b.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from slime.a import g\n")
    edges = {name: imports_of(path, known) - {name} for name, path in known.items()}
    assert cycles(edges) == []


MOVED = {**moved.MOVED, **awm_grpo.MOVED}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_a_moved_module_names_its_new_home(old: str) -> None:
    """Old import paths fail with the new path, and the new path exists. (Registered here because pytest's
    rootdir on sys.path makes tests/awm shadow the `awm` package, whose __init__ registers them.)"""
    moved.register(moved.MOVED)
    with pytest.raises(ModuleNotFoundError, match=f"moved to {MOVED[old]}"):
        importlib.import_module(old)
    importlib.import_module(MOVED[old])


@pytest.mark.parametrize("old", ["awm.mcp_server", "awm_grpo.compare"])
def test_python_m_on_a_moved_module_names_its_new_home(old: str) -> None:
    """What a user typing an old command sees: the packages' own __init__ registers the moves."""
    out = subprocess.run([sys.executable, "-m", old, "--help"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode != 0 and f"moved to {MOVED[old]}" in out.stderr

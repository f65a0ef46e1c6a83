"""Renamed worlds: a bundled scenario whose sample data carries invented names.

A practice-set family has a handful of instances per scenario (one per row of its slot query), so a
small model can memorise every name it is trained on and still not know what to do with a new one.
A renamed world is the same scenario - same tables, same environment code, same task families - built
from sample data in which every name-like string literal (a title, a person, a product, a branch) is
replaced, consistently across all tables, by an invented name of the same shape:

    'Dune', 'Frank Herbert', 'Science Fiction'  ->  'Velmor', 'Kelra Tasinor', 'Dunpri Ishka'

Its family instances are then real tasks on a real database with new names: the reference solution
is replayed and verified like any other, and an RL rollout gets real tool results. Worlds are for
training only (awm_grpo.data_prep never puts them in val/test): held-out tasks keep the real names.

Left alone: strings the environment code itself quotes (enums such as 'available', API constants),
lowercase words, codes and numbers, e-mail addresses, long text. Numbers (years, counts, ids) are the
same as in the original world, and so are amounts unless `vary_amounts`: then every value of a REAL
column (a price, a fare, a balance, a fee) is rescaled by its own random factor in [0.5, 2], keeping
its number of decimals (0 stays 0), so that an answer like "$189.00" must be read from a tool result,
not recalled from the training instances' answers. Slot queries and verifiers read the world's own
DB, so every instance stays consistent; the build replays and verifies them all.
"""

from __future__ import annotations

import ast
import random
import re
import sqlite3
from types import SimpleNamespace
from typing import Any

_SYLLABLES = ("ka lo mi ren tor vel sa nu pe dra fin gor hal ish jun kel mor nal os pri qua rus sel tam ul "
              "vor wen yas zel bri cor dun el fa gi ha ir jo ke lu ma ne ori pa ro si ta uv va xe yo zu").split()
_KEEP = re.compile(r"^(?:.{1,3}|.*\d.*|.*\.)$")  # short words, words with digits, abbreviations ("Dr.")
_LITERAL = re.compile(r"'((?:[^']|'')*)'")  # a SQL string literal ('' is an escaped quote)
_NAME_WORD = re.compile(r"^[A-Z][a-z]{2,}")
MAX_WORDS = 6
_INSERT = re.compile(r"^(INSERT INTO\s+(\w+)\s*\(([^)]*)\)\s*VALUES\s*\()(.*)(\);?\s*)$", re.S | re.I)
_NUMBER = re.compile(r"^-?\d+(?:\.(\d+))?$")
_AMOUNT_TYPES = ("REAL", "FLOA", "DOUB", "NUMERIC", "DECIMAL")  # SQLite's REAL/NUMERIC affinities


def invent_like(value: str, rng: random.Random) -> str:
    """A made-up value with the shape of `value`: same word count, case pattern, kept short/digit words."""
    def word(w: str) -> str:
        if _KEEP.match(w) or not any(c.isalpha() for c in w):
            return w
        core = "".join(rng.choice(_SYLLABLES) for _ in range(max(1, min(4, round(len(w) / 3)))))
        if w.isupper():
            return core.upper()
        return core.capitalize() if w[0].isupper() else core
    return " ".join(word(w) for w in value.split(" "))


def name_like(value: str, code_strings: set[str]) -> bool:
    """A string literal that names something of this world (see the module docstring)."""
    words = value.split(" ")
    return (value not in code_strings and len(words) <= MAX_WORDS and "@" not in value and "/" not in value
            and "'" not in value and any(_NAME_WORD.match(w) and not _KEEP.match(w) for w in words))


def code_strings(code: str) -> set[str]:
    """The string constants the environment code works with (documentation - docstrings and the
    `description=` / `examples=` / `title=` / `summary=` of its schemas - does not count)."""
    docs = {"description", "examples", "title", "summary", "example"}
    skip: set[int] = set()
    tree = ast.parse(code)
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg in docs:
            skip.update(id(n) for n in ast.walk(node.value))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skip.add(id(first.value))
    return {n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip}


def rename_sample(sample: list[dict[str, Any]], code: str, rng: random.Random) -> tuple[list[dict[str, Any]],
                                                                                      dict[str, str]]:
    """The sample tables with every name-like literal renamed consistently; returns (tables, mapping)."""
    constants = code_strings(code)
    mapping: dict[str, str] = {}
    taken: set[str] = set()

    def new_name(old: str) -> str:
        if old not in mapping:
            made = invent_like(old, rng)
            for _ in range(100):  # two names never merge into one
                if made not in taken and made != old:
                    break
                made = invent_like(old, rng)
            else:
                raise ValueError(f"cannot invent a new name for {old!r}")
            mapping[old] = made
            taken.add(made)
        return mapping[old]

    def literal(m: re.Match[str]) -> str:
        value = m.group(1).replace("''", "'")
        return f"'{new_name(value)}'" if name_like(value, constants) else m.group(0)

    tables = [{**t, "insert_statements": [_LITERAL.sub(literal, s) for s in t["insert_statements"]]}
              for t in sample]
    return tables, mapping


def amount_columns(tables: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Table -> its columns declared with a REAL or NUMERIC type (as SQLite itself reads the DDL)."""
    conn = sqlite3.connect(":memory:")
    try:
        for t in tables:
            conn.execute(t["ddl"])
        return {t["name"]: {row[1] for row in conn.execute(f'PRAGMA table_info("{t["name"]}")')
                            if any(a in (row[2] or "").upper() for a in _AMOUNT_TYPES)} for t in tables}
    finally:
        conn.close()


def split_values(text: str) -> list[str]:
    """The top-level comma-separated items of a VALUES list (quotes and parentheses respected)."""
    items, depth, quoted, start = [], 0, False, 0
    for i, c in enumerate(text):
        if c == "'":
            quoted = not quoted  # '' (an escaped quote) toggles twice
        elif not quoted and c in "()":
            depth += 1 if c == "(" else -1
        elif not quoted and depth == 0 and c == ",":
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return items


def rescale_amounts(sample: list[dict[str, Any]], tables: list[dict[str, Any]], rng: random.Random,
                    low: float = 0.5, high: float = 2.0) -> tuple[list[dict[str, Any]], int]:
    """The sample tables with every literal amount (REAL column) times its own factor in [low, high].

    Keeps the literal's decimals and sign; 0 stays 0 (free stays free); an amount written as an
    expression, or an INSERT without a column list, is left as it is. Returns (tables, amounts changed)."""
    columns = amount_columns(tables)
    changed = 0

    def rescale(statement: str) -> str:
        nonlocal changed
        m = _INSERT.match(statement.strip())
        if not m or not columns.get(m.group(2)):
            return statement
        names = [c.strip() for c in m.group(3).split(",")]
        values = split_values(m.group(4))
        if len(names) != len(values):
            raise ValueError(f"cannot match columns to values in: {statement}")
        for i, (name, value) in enumerate(zip(names, values, strict=True)):
            number = _NUMBER.match(value.strip())
            if name in columns[m.group(2)] and number and float(value) != 0:
                decimals = len(number.group(1) or "")
                new = round(float(value) * rng.uniform(low, high), decimals)
                if new == 0 or f"{new:.{decimals}f}" == value.strip():  # never 0, never unchanged
                    new = float(value) + (10 ** -decimals) * (1 if float(value) > 0 else -1)
                values[i] = f" {new:.{decimals}f}" if value.startswith(" ") else f"{new:.{decimals}f}"
                changed += 1
        return m.group(1) + ",".join(values) + m.group(5)

    out = [{**t, "insert_statements": [rescale(s) for s in t["insert_statements"]]} for t in sample]
    return out, changed


def world(scenario: Any, k: int, *, code: str, seed: int = 0, vary_amounts: bool = False) -> SimpleNamespace:
    """Renamed world number `k` (>= 1) of a scenario module: `<NAME>_w<k>`, no hand-written tasks.

    The same (seed, k) always gives the same names (and amounts); `mapping` records every renaming."""
    rng = random.Random(f"{scenario.NAME}/{seed}/{k}")
    sample, mapping = rename_sample(scenario.SAMPLE, code, rng)
    amounts = 0
    if vary_amounts:
        sample, amounts = rescale_amounts(sample, scenario.TABLES, random.Random(f"{scenario.NAME}/{seed}/{k}/amounts"))
    return SimpleNamespace(NAME=f"{scenario.NAME}_w{k}", DESCRIPTION=scenario.DESCRIPTION, TABLES=scenario.TABLES,
                           SAMPLE=sample, TASKS=[], PROBES=scenario.PROBES,
                           FAMILIES=getattr(scenario, "FAMILIES", []), world=k, mapping=mapping, amounts=amounts)

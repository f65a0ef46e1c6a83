"""The source text the bundled scenarios' verifiers are built from.

An AWM verifier is one function, `verify_task_completion(initial_db_path, final_db_path,
final_answer=None)`, stored as source code in `gen_verifier.pure_code.jsonl` and executed in a
sandbox whose only modules are sqlite3, json, os and re. It cannot import this package, so every
helper a check calls is embedded into each verifier as source text, not imported. This module keeps
that text in one place: each constant below is one helper, `prelude()` strings the chosen helpers
into the opening of `verify_task_completion`, and `verifier()` adds one task's `check()` and the
verdict.

Helpers are written at column 0 and indented into the function by `prelude()`. Some helpers share
an embedded name because they are alternatives (two `table`s, two `diff`s, two `unchanged`s): a
prelude takes one of each name.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

_SIGNATURE = "def verify_task_completion(initial_db_path, final_db_path, final_answer=None):"

# --- reading a database: read-only URIs, so a verifier can never change what it judges ---------------

# connect(path): the verification's one read-only connection to a database. Every verifier opens
# with it (`prelude()`), and `verifier()` closes them all. One connection per query cost about 0.15 ms
# each (open, schema parse, close): most of a verification, at 15-20 queries.
CONNECT = r'''
connections = {}

def connect(path):
    if path not in connections:
        connections[path] = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    return connections[path]
'''

# fetch(path, sql, params): the rows of a query.
FETCH = r'''
def fetch(path, sql, params=()):
    return connect(path).execute(sql, params).fetchall()
'''

# rows(path, sql, params): the rows of a query, as tuples.
ROWS = r'''
def rows(path, sql, params=()):
    return [tuple(r) for r in connect(path).execute(sql, params).fetchall()]
'''

# one(path, sql, params): the single value a query finds, None unless it finds exactly one row. Needs ROWS.
ONE = r'''
def one(path, sql, params=()):
    found = rows(path, sql, params)
    return found[0][0] if len(found) == 1 else None
'''

# table(path, name): a whole table as {id: {column: value}}.
TABLE_BY_ID = r'''
def table(path, name):
    cur = connect(path).execute(f'SELECT * FROM "{name}"')
    cols = [d[0] for d in cur.description]
    return {r[0]: dict(zip(cols, r)) for r in cur.fetchall()}
'''

# table(path, name): a whole table as a sorted list of row tuples. Needs ROWS.
TABLE_SORTED = r'''
def table(path, name):
    return sorted(rows(path, f"SELECT * FROM {name}"), key=repr)
'''

# table_names(path): the database's own tables, sorted. Needs FETCH.
TABLE_NAMES = r'''
def table_names(path):
    return sorted(r[0] for r in fetch(path, "SELECT name FROM sqlite_master WHERE type = 'table' "
                                            "AND name NOT LIKE 'sqlite_%'"))
'''

# --- comparing the initial and the final database -----------------------------------------------------

# diff(name) -> (before, after, added ids, removed ids, changed ids), every column compared. Needs TABLE_BY_ID.
DIFF_IDS = r'''
def diff(name):
    before, after = table(initial_db_path, name), table(final_db_path, name)
    added = sorted(k for k in after if k not in before)
    removed = sorted(k for k in before if k not in after)
    changed = sorted(k for k in before if k in after and before[k] != after[k])
    return before, after, added, removed, changed
'''

# diff(name) -> (added rows, removed rows, {id: (before row, after row)}), updated_at ignored.
# Needs TABLE_BY_ID.
DIFF_ROWS = r'''
def diff(name):
    before = table(initial_db_path, name)
    after = table(final_db_path, name)
    added = [after[k] for k in sorted(after) if k not in before]
    removed = [before[k] for k in sorted(before) if k not in after]
    changed = {}
    for k in before:
        if k in after:
            old = {c: v for c, v in before[k].items() if c != "updated_at"}
            new = {c: v for c, v in after[k].items() if c != "updated_at"}
            if old != new:
                changed[k] = (before[k], after[k])
    return added, removed, changed
'''

# unchanged_except(*names): the same set of tables, and every table not named is identical.
# Needs TABLE_BY_ID and TABLE_NAMES.
UNCHANGED_EXCEPT = r'''
def unchanged_except(*names):
    if table_names(initial_db_path) != table_names(final_db_path):
        return False
    return all(table(initial_db_path, n) == table(final_db_path, n)
               for n in table_names(initial_db_path) if n not in names)
'''

# unchanged(*names): every named table has the same rows. Needs a `table`.
UNCHANGED_TABLES = r'''
def unchanged(*names):
    return all(table(initial_db_path, n) == table(final_db_path, n) for n in names)
'''

# unchanged(*names): no named table has a row added, removed or changed, updated_at ignored. Needs DIFF_ROWS.
UNCHANGED_BY_DIFF = r'''
def unchanged(*names):
    return all(diff(t) == ([], [], {}) for t in names)
'''

# only_changed(before, after, fields): two versions of a row differ in `fields` (and updated_at) at most.
ONLY_CHANGED = r'''
def only_changed(row_before, row_after, fields):
    for c in row_before:
        if c == "updated_at" or c in fields:
            continue
        if row_before[c] != row_after[c]:
            return False
    return True
'''

# --- reading the final answer -------------------------------------------------------------------------

# answer_text(): the final answer lower-cased, without <think> blocks.
ANSWER_TEXT = r'''
def answer_text():
    text = re.sub(r"<think>.*?</think>", " ", str(final_answer or ""), flags=re.S)
    return text.lower()
'''

# answer(): the final answer lower-cased, white space folded.
ANSWER = r'''
def answer():
    return re.sub(r"\s+", " ", str(final_answer or "")).strip().lower()
'''

# norm(value): a value lower-cased, white space folded, without a trailing full stop.
NORM = r'''
def norm(value):
    return re.sub(r"\s+", " ", str(value or "")).strip().lower().rstrip(".")
'''

# mentions_number(text, value): a whole number in `text`, as digits or (0-10) as a word.
MENTIONS_NUMBER = r'''
def mentions_number(text, value):
    words = {0: "zero", 1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven",
             8: "eight", 9: "nine", 10: "ten"}
    if re.search(rf"(?<![\d.]){value}(?![\d]|\.\d)", text):
        return True
    return value in words and re.search(rf"\b{words[value]}\b", text) is not None
'''

# numbers(text): every number in `text`, thousands separators removed.
NUMBERS = r'''
def numbers(text):
    text = re.sub(r"(?<=\d),(?=\d{3})", "", text or "")
    return [float(n) for n in re.findall(r"\d+(?:\.\d+)?", text)]
'''

# mentions_amount(text, value): `text` holds `value` to the cent. Needs NUMBERS.
MENTIONS_AMOUNT = r'''
def mentions_amount(text, value):
    return any(abs(n - value) < 0.005 for n in numbers(text))
'''

# has_number(value): the final answer holds `value` to the cent. Needs ANSWER.
HAS_NUMBER = r'''
def has_number(value):
    found = re.findall(r"\d+(?:\.\d+)?", answer().replace(",", ""))
    return any(abs(float(x) - float(value)) < 0.005 for x in found)
'''

# --- comparing amounts --------------------------------------------------------------------------------

# same_money(x, y): two amounts equal to the cent, neither missing.
SAME_MONEY = r'''
def same_money(x, y):
    return x is not None and y is not None and abs(float(x) - float(y)) < 0.005
'''

# close(a, b): two amounts within a cent, neither missing.
CLOSE = r'''
def close(a, b):
    return a is not None and b is not None and abs(float(a) - float(b)) < 0.011
'''


def prelude(*blocks: str, imports: Sequence[str] = ("re", "sqlite3")) -> str:
    """The opening of a verifier: signature, imports, then each block (helpers or set-up lines).

    Blocks are written at column 0 (or any common indentation) and stand one blank line apart.
    """
    parts = [_SIGNATURE + "".join(f"\n    import {m}" for m in imports)]
    parts += [textwrap.indent(CONNECT.strip("\n"), " " * 4)]
    parts += [textwrap.indent(textwrap.dedent(b).strip("\n"), " " * 4) for b in blocks]
    return "\n\n".join(parts) + "\n\n"


# The whole opening of clinic_appointments_1's and library_lending_1's verifiers.
ID_DIFF_PRELUDE = prelude(FETCH, TABLE_BY_ID, TABLE_NAMES, DIFF_IDS, UNCHANGED_EXCEPT, ANSWER_TEXT,
                          MENTIONS_NUMBER)


def verifier(opening: str, check: str, *, check_returns_verdict: bool = False) -> str:
    """A complete verifier: `opening` (from `prelude()`), `def check():` holding `check`, the verdict.

    `check` is the body of `check()` at any common indentation. By default `check()` answers truthy
    for a completed task; with `check_returns_verdict` it returns the `{"result": ...}` dict itself.
    Any exception in `check()` is the verdict "others".
    """
    body = textwrap.indent(textwrap.dedent(check).strip("\n"), " " * 8)
    verdict = "check()" if check_returns_verdict else '{"result": "complete" if check() else "others"}'
    return (f"{opening}    def check():\n{body}\n\n"
            f"    try:\n        return {verdict}\n    except Exception:\n        return {{\"result\": \"others\"}}\n"
            f"    finally:\n        for conn in connections.values():\n            conn.close()\n")

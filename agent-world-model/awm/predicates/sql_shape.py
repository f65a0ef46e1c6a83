"""What one SELECT reads: its tables and aliases, the equalities it demands, and where each output column comes from.

The goal-state search (`awm.predicates.goal_states`) must turn a verifier's query into a row that query
would select, and a cell of its result back into the table row it came from. The queries it sees are
SQLite's expanded SQL (parameters already bound as literals), written by generated verifiers, mostly
of one shape:

    SELECT items FROM t [AS] a [JOIN u [AS] b ON a.x = b.y ...] [WHERE c1 AND c2 ...] [GROUP/ORDER/LIMIT ...]

`parse` reads that shape with a small tokenizer and returns None for anything else (compound selects,
CTEs, subqueries in FROM): the search then simply has no edit to propose from that query. A condition
is understood when it is `col = literal` (also `==`, `IS NULL`, `IN (literal, ...)`, `LOWER(col) = literal`,
`col LIKE 'text'`) or `col = col` (a join link); any other condition is kept as text, so queries built
from it still apply it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_TOKEN = re.compile(r"""
 (?P<str>'(?:[^']|'')*')
|(?P<qid>"(?:[^"]|"")*"|`[^`]*`|\[[^\]]*\])
|(?P<num>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+)
|(?P<id>[A-Za-z_][A-Za-z0-9_$]*)
|(?P<op><=|>=|!=|<>|==|\|\||[-+*/%=<>(),.;?])
|(?P<ws>\s+|--[^\n]*|/\*.*?\*/)
""", re.X | re.S)
_CLAUSE_END = {"group", "having", "order", "limit", "window"}
_COMPOUND = {"union", "intersect", "except"}
_JOIN_WORDS = {"natural", "left", "right", "full", "outer", "inner", "cross", "join"}
_NOT_ALIAS = _JOIN_WORDS | _CLAUSE_END | {"where", "on", "using", "as", "indexed", "not"}
_WRAPPERS = {"lower", "upper", "trim"}


@dataclass
class Tok:
    kind: str  # str | qid | num | id | op
    text: str  # as written
    start: int
    end: int

    @property
    def word(self) -> str:
        return self.text.lower() if self.kind == "id" else ""

    @property
    def name(self) -> str | None:
        """The identifier this token names (quotes removed), or None."""
        if self.kind == "id":
            return self.text
        if self.kind == "qid":
            inner = self.text[1:-1]
            return inner.replace('""', '"') if self.text[0] == '"' else inner
        return None


@dataclass
class Conjunct:
    """One AND-term of a WHERE or ON clause."""

    text: str
    aliases: set[str]  # aliases it mentions (lower case)
    equal: tuple[str, str, Any] | None = None  # (alias, column, value): col = literal
    link: tuple[str, str, str, str] | None = None  # (alias1, col1, alias2, col2): col = col


@dataclass
class Shape:
    """The parts of a SELECT the search needs (see the module docstring)."""

    sql: str
    tables: dict[str, str]  # alias (lower case) -> table name
    order: list[str]  # aliases in FROM order
    items: list[tuple[str | None, str | None]]  # per select item: (alias, column); ("*"|alias, "*"); (None, None)
    conjuncts: list[Conjunct] = field(default_factory=list)
    select_start: int = 0  # offset of the first select item
    from_start: int = 0  # offset of the FROM keyword
    grouped: bool = False  # GROUP BY / aggregate: output rows are not table rows

    @property
    def main(self) -> str:
        return self.order[0]

    def equalities(self, alias: str) -> dict[str, Any]:
        return {c.equal[1]: c.equal[2] for c in self.conjuncts if c.equal and c.equal[0] == alias}

    def output_columns(self, columns: dict[str, list[str]]) -> list[tuple[str, str] | None]:
        """(alias, column) of every output column, expanding `*`; None for computed columns."""
        out: list[tuple[str, str] | None] = []
        for alias, col in self.items:
            if col == "*":
                for a in (self.order if alias == "*" else [alias]):
                    out += [(a, c) for c in columns.get(self.tables.get(a, ""), [])]
            else:
                out.append((alias, col) if alias and col else None)
        return out

    def with_rowids(self) -> str | None:
        """This query with the rowid of every FROM table's row in front of its own columns (None: grouped)."""
        if self.grouped:
            return None
        ids = ", ".join(f'{_quote(a)}.rowid' for a in self.order)
        return f"{self.sql[:self.select_start]}{ids}, {self.sql[self.select_start:]}"


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def tokenize(sql: str) -> list[Tok] | None:
    """Tokens of `sql` without whitespace and comments; None when some character is not understood."""
    out, pos = [], 0
    while pos < len(sql):
        m = _TOKEN.match(sql, pos)
        if m is None:
            return None
        if m.lastgroup != "ws":
            out.append(Tok(m.lastgroup or "", m.group(), m.start(), m.end()))
        pos = m.end()
    return out


def literal(tokens: list[Tok]) -> tuple[bool, Any]:
    """(True, value) when the tokens are one SQL literal."""
    if len(tokens) == 2 and tokens[0].text == "-" and tokens[1].kind == "num":
        ok, v = literal(tokens[1:])
        return ok, -v
    if len(tokens) != 1:
        return False, None
    t = tokens[0]
    if t.kind == "str":
        return True, t.text[1:-1].replace("''", "'")
    if t.kind == "num":
        return True, float(t.text) if any(c in t.text for c in ".eE") else int(t.text)
    if t.word in ("null", "true", "false"):
        return True, {"null": None, "true": 1, "false": 0}[t.word]
    return False, None


def _split(tokens: list[Tok], sep: str) -> list[list[Tok]]:
    """Split at depth-0 separators: "," or the word "and" (the AND of a BETWEEN is not one)."""
    parts: list[list[Tok]] = [[]]
    depth, between = 0, False
    for t in tokens:
        depth += (t.text == "(") - (t.text == ")")
        if depth == 0 and t.word == "between":
            between = True
        is_sep = depth == 0 and (t.text == sep if sep == "," else t.word == sep)
        if is_sep and sep == "and" and between:
            between, is_sep = False, False
        if is_sep:
            parts.append([])
        else:
            parts[-1].append(t)
    return [p for p in parts if p]


def parse(sql: str, columns: dict[str, list[str]]) -> Shape | None:
    """The shape of one SELECT, or None when it is not of the understood form (module docstring).

    `columns`: table -> column names (to resolve unqualified columns and expand `*`).
    """
    toks = tokenize(sql)
    if not toks or toks[0].word != "select":
        return None
    depth, marks = 0, {}
    for i, t in enumerate(toks):
        depth += (t.text == "(") - (t.text == ")")
        if depth == 0 and t.word in ({"from", "where"} | _CLAUSE_END | _COMPOUND):
            marks.setdefault(t.word, i)
    if "from" not in marks or _COMPOUND & marks.keys():
        return None
    first = 1 + (toks[1].word in ("distinct", "all"))
    ends = [marks[k] for k in marks if k in _CLAUSE_END] + [len(toks)]
    where_at = marks.get("where")
    from_end = where_at if where_at is not None else min(ends)
    tables, order, conjuncts = _from_clause(toks[marks["from"] + 1:from_end])
    if not tables:
        return None
    lower_cols = {t.lower(): {c.lower(): c for c in cs} for t, cs in columns.items()}
    shape = Shape(sql, tables, order, [], select_start=toks[first].start if first < len(toks) else 0,
                  from_start=toks[marks["from"]].start, grouped="group" in marks)
    for item in _split(toks[first:marks["from"]], ","):
        shape.items.append(_item(item, shape, lower_cols))
    shape.conjuncts = [_conjunct(c, shape, lower_cols) for c in conjuncts]
    if where_at is not None:
        body = toks[where_at + 1:min(e for e in ends if e > where_at)]
        if any(t.word == "or" for t in _depth0(body)):  # a disjunction demands no single value
            shape.conjuncts.append(_conjunct(body, shape, lower_cols, understood=False))
        else:
            shape.conjuncts += [_conjunct(c, shape, lower_cols) for c in _split(body, "and")]
    items = _depth0(toks[first:marks["from"]])
    aggregate = any(t.word in ("count", "sum", "avg", "min", "max", "group_concat", "total")
                    and n + 1 < len(items) and items[n + 1].text == "(" for n, t in enumerate(items))
    shape.grouped = shape.grouped or aggregate
    return shape


def _depth0(tokens: list[Tok]) -> list[Tok]:
    out, depth = [], 0
    for t in tokens:
        if depth == 0:
            out.append(t)
        depth += (t.text == "(") - (t.text == ")")
    return out


def _from_clause(toks: list[Tok]) -> tuple[dict[str, str], list[str], list[list[Tok]]]:
    """Tables with aliases in order, and the ON conditions split into conjuncts ({} when not understood)."""
    tables: dict[str, str] = {}
    order: list[str] = []
    conds: list[list[Tok]] = []
    i = 0
    while i < len(toks):
        name = toks[i].name
        if name is None or toks[i].word in _NOT_ALIAS or (i + 1 < len(toks) and toks[i + 1].text in ("(", ".")):
            return {}, [], []
        i += 1
        alias = name
        if i < len(toks) and toks[i].word == "as":
            i += 1
        if i < len(toks) and toks[i].name and toks[i].word not in _NOT_ALIAS:
            alias = toks[i].name or name
            i += 1
        tables[alias.lower()] = name
        order.append(alias.lower())
        if i < len(toks) and toks[i].word == "on":
            j = i + 1
            while j < len(toks) and not (toks[j].text == "," or toks[j].word in _JOIN_WORDS):
                j += 1
            if any(t.word == "or" for t in _depth0(toks[i + 1:j])):
                conds.append(toks[i + 1:j])
            else:
                conds += _split(toks[i + 1:j], "and")
            i = j
        elif i < len(toks) and toks[i].word == "using":
            return {}, [], []
        if i < len(toks) and toks[i].text == ",":
            i += 1
            continue
        while i < len(toks) and toks[i].word in _JOIN_WORDS:
            i += 1
        if i < len(toks) and toks[i - 1].word != "join" and toks[i].text != ",":
            return {}, [], []
    return tables, order, conds


def _colref(tokens: list[Tok], shape: Shape, cols: dict[str, dict[str, str]]) -> tuple[str, str] | None:
    """(alias, column) when the tokens name one column of a FROM table."""
    if len(tokens) == 3 and tokens[1].text == "." and tokens[0].name and tokens[2].name:
        alias = tokens[0].name.lower()
        table = shape.tables.get(alias)
        col = cols.get((table or "").lower(), {}).get(tokens[2].name.lower())
        return (alias, col) if table and col else None
    if len(tokens) == 1 and tokens[0].name and tokens[0].kind in ("id", "qid"):
        for alias in shape.order:
            col = cols.get(shape.tables[alias].lower(), {}).get(tokens[0].name.lower())
            if col:
                return alias, col
    return None


def _item(tokens: list[Tok], shape: Shape, cols: dict[str, dict[str, str]]) -> tuple[str | None, str | None]:
    if len(tokens) >= 3 and tokens[-2].word == "as":
        tokens = tokens[:-2]
    elif len(tokens) >= 2 and tokens[-1].name and tokens[-2].text != "." and tokens[-1].kind in ("id", "qid"):
        tokens = tokens[:-1]
    if len(tokens) == 1 and tokens[0].text == "*":
        return "*", "*"
    if len(tokens) == 3 and tokens[1].text == "." and tokens[2].text == "*" and tokens[0].name:
        alias = tokens[0].name.lower()
        return (alias, "*") if alias in shape.tables else (None, None)
    ref = _colref(tokens, shape, cols)
    return ref if ref else (None, None)


def _conjunct(tokens: list[Tok], shape: Shape, cols: dict[str, dict[str, str]], understood: bool = True) -> Conjunct:
    text = shape.sql[tokens[0].start:tokens[-1].end]
    aliases = set()
    for i, t in enumerate(tokens):
        if i + 1 < len(tokens) and tokens[i + 1].text == "." and t.name and t.name.lower() in shape.tables:
            aliases.add(t.name.lower())
        elif t.name and (i == 0 or tokens[i - 1].text != "."):
            ref = _colref([t], shape, cols)
            if ref and not (i + 1 < len(tokens) and tokens[i + 1].text == "("):
                aliases.add(ref[0])
    out = Conjunct(text, aliases)
    if not understood:
        return out
    ops = [i for i, t in enumerate(tokens) if t.text in ("=", "==") and i > 0]
    if len(ops) == 1:
        left, right = tokens[:ops[0]], tokens[ops[0] + 1:]
        for a, b in ((left, right), (right, left)):
            if len(a) >= 4 and a[0].word in _WRAPPERS and a[1].text == "(" and a[-1].text == ")":
                a = a[2:-1]
            wrap = b[0].word if len(b) >= 4 and b[0].word in _WRAPPERS and b[1].text == "(" and b[-1].text == ")" else ""
            ref, (ok, value) = _colref(a, shape, cols), literal(b[2:-1] if wrap else b)
            if ok and isinstance(value, str) and wrap:  # LOWER('Text'): the value as the function makes it
                value = {"lower": value.lower(), "upper": value.upper(), "trim": value.strip()}[wrap]
            if ref and ok:
                out.equal = (ref[0], ref[1], value)
                return out
        lref, rref = _colref(left, shape, cols), _colref(right, shape, cols)
        if lref and rref and lref[0] != rref[0]:
            out.link = (lref[0], lref[1], rref[0], rref[1])
        return out
    words = [t.word for t in tokens]
    if len(tokens) >= 3 and words[-2:] == ["is", "null"]:
        ref = _colref(tokens[:-2], shape, cols)
        if ref:
            out.equal = (ref[0], ref[1], None)
    elif "in" in words and tokens[-1].text == ")":
        at = words.index("in")
        ref = _colref(tokens[:at], shape, cols)
        if ref and at + 2 < len(tokens) and tokens[at + 1].text == "(":
            values = [literal(p) for p in _split(tokens[at + 2:-1], ",")]
            if values and all(ok for ok, _ in values):
                out.equal = (ref[0], ref[1], values[0][1])
    elif "like" in words:
        at = words.index("like")
        ref, (ok, value) = _colref(tokens[:at], shape, cols), literal(tokens[at + 1:])
        if ref and ok and isinstance(value, str) and "_" not in value.strip("%"):
            out.equal = (ref[0], ref[1], value.strip("%"))
    return out

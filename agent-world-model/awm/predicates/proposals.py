"""From what an observed verifier compared to edits that may satisfy it (used by `awm.predicates.goal_states`).

`Proposer.propose` reads the log of one observed run (its statements, comparisons, truth tests and
lookups, in order) from the end: the last checks before the verifier returned say what is missing,
and each rule below turns one into candidate edit lists, most likely first. `_Cells` ties a value the
verifier compared back to the table row it came from, by running the verifier's recent final-DB
queries again with the rowid of every row they read.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from awm.predicates.edits import Edit, Schema, answer_of, max_rowid, norm, ro_rows, same, scalar
from awm.predicates.sql_shape import Shape, parse
from awm.predicates.verifier_analysis import analyse

MAX_ROWS_PER_EDIT = 3  # rows a set comparison inserts or deletes at once
MAX_ROWS_PER_COUNT = 10  # rows a count check (`len(rows) != 5`) inserts at once
_TRUTHY = object()  # "some truthy value of this column": resolved per cell


def _seq(v: Any) -> list[Any] | None:
    return v["seq"] if isinstance(v, dict) and isinstance(v.get("seq"), list) else None


def _length(v: Any) -> int | None:
    return v["len"] if isinstance(v, dict) and isinstance(v.get("len"), int) else None

_OPS = {"==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
        "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}
_MIRROR = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}


def _flip_value(op: str, result: bool, other: Any, current: Any) -> list[Any]:
    """Values x for which `x op other` is no longer `result`."""
    if op in ("is", "is not"):
        want_none = (op == "is") != result
        return [None] if want_none else ([current] if current is not None else [_TRUTHY])
    if op in ("==", "!="):
        if (op == "==") != result:  # want equal
            return [other]
        if isinstance(other, int | float) and not isinstance(other, bool):
            return [other + 1]
        return [f"{other} (changed)" if other is not None else "x"]
    if op not in _OPS or not isinstance(other, int | float) or isinstance(other, bool):
        if op in _OPS and isinstance(other, str):
            return [other] if _OPS[op](other, other) != result else []
        return []
    out = []
    for x in (other, other + 1, other - 1, other + 0.01, other - 0.01):
        try:
            if _OPS[op](x, other) != result:
                out.append(x)
        except TypeError:
            continue
    return out[:2]

class Proposer:
    """Candidate edits for one task's verifier (the rules are in the methods' docstrings)."""

    def __init__(self, schema: Schema, s0: Path, code: str, task: str = "") -> None:
        self.schema, self.s0 = schema, s0
        self._shapes: dict[str, Shape | None] = {}
        self.path: list[Edit] = []  # the edits of the state being extended
        self.static = analyse(code)
        self.reads_answer = self.static.reads_final_answer
        self.surfaces, self.task = _surfaces(task, code), task or ""
        self.constants = _answer_constants(code) if self.reads_answer else []

    def canon(self, value: Any) -> Any:
        """A string a verifier compared after normalising, in the form the task or the code writes it."""
        if not isinstance(value, str) or not value.strip():
            return value
        key = norm(value).replace(" ", "")
        found = next((s for s in self.surfaces if s != value and norm(s).replace(" ", "") == key), None)
        if found is not None:
            return found
        at = self.task.lower().find(value.lower())  # the task's own spelling (case) of the phrase
        if at >= 0 and len(value) >= 3:
            return self.task[at:at + len(value)]
        if value.isdigit() and len(value) >= 4:  # a number the verifier reads digits-only: as the task writes it
            for m in re.finditer(r"[\d][\d\s().+-]*[\d]", self.task):
                if re.sub(r"\D", "", m.group()) == value:
                    return m.group()
        return value

    def shape(self, sql: str) -> Shape | None:
        if sql not in self._shapes:
            self._shapes[sql] = parse(sql, self.schema.columns)
        return self._shapes[sql]

    # ---- proposals -------------------------------------------------------------------------------
    def propose(self, events: list[Any], state: Path, edits: list[Edit]) -> list[list[Edit]]:
        """Candidate edit lists from the last observations (`events`) before the verifier returned."""
        queries = [(i, e["sql"]) for i, e in enumerate(events) if isinstance(e, dict) and e.get("role") == "final"
                   and e["sql"].lstrip()[:6].upper() in ("SELECT", "WITH S")]
        reads = [(i, e["sql"]) for i, e in enumerate(events) if isinstance(e, dict) and e.get("role") == "initial"
                 and e["sql"].lstrip()[:6].upper() == "SELECT"]
        decisive = [i for i in range(len(events) - 1, -1, -1)
                    if isinstance(events[i], list) and len(events[i]) >= 4 and events[i][0] in ("cmp", "truth", "lookup")]
        ours = {(e.table.lower(), e.rowid) for e in edits if e.kind == "update"}
        ours |= {(e.table.lower(), e.values.get(self.schema.rowid_pk.get(self.schema.table(e.table) or "") or ""))
                 for e in edits if e.kind == "insert"}
        out_props: list[list[Edit]] = []
        seen: set[str] = set()
        for i in decisive[:4]:
            recent = [sql for j, sql in queries if j < i][::-1][:4]
            cells = _Cells(self, state, recent, ours)
            props = self._from_event(events[i], recent, cells, state, edits, events[:i])
            for p in props:
                p = self._distinct_keys(p)
                k = "|".join(e.key() for e in p)
                if p and k not in seen:
                    seen.add(k)
                    out_props.append(p)
        if self.reads_answer:  # last resort: answers naming what the verifier read from s0
            for p in self._answers([sql for _, sql in reads][::-1][:3], edits):
                k = "|".join(e.key() for e in p)
                if k not in seen:
                    seen.add(k)
                    out_props.append(p)
        return out_props

    def _from_event(self, ev: list[Any], recent: list[str], cells: _Cells, state: Path,
                    edits: list[Edit], events_before: list[Any]) -> list[list[Edit]]:
        kind = ev[0]
        if kind == "lookup":
            _, _, key, found = ev[:4]
            if found or not scalar(key) or key is None:
                return []
            return [p for sql in recent[:2] for p in self._inserts(sql, state, 1, key_value=key)]
        if kind == "truth":
            value, truthy = ev[2], bool(ev[3])
            n = _length(value)
            if n is not None:
                if n == 0 and not truthy:
                    return [p for sql in recent[:3] for p in self._inserts(sql, state, 1)]
                if n > 0 and truthy:
                    return [p for sql in recent[:2] for p in self._deletes(sql, state)]
                return []
            if not scalar(value):
                return []
            targets = [None, 0] if truthy else [_TRUTHY]
            return cells.updates(value, targets)
        if kind != "cmp" or len(ev) < 7:
            return []
        _, _, op, left, right, result, flags = ev[:7]
        flags = flags if isinstance(flags, str) else ""
        if ("L" in flags or "R" in flags) and op in _OPS:
            n, other = (left, right) if "L" in flags else (right, left)
            op = op if "L" in flags else _MIRROR[op]
            return self._count_change(n, op, other, bool(result), recent, state)
        props: list[list[Edit]] = []
        if op in ("in", "not in"):
            want_in = (op == "in") != bool(result)
            if isinstance(right, str) and isinstance(left, str):
                if want_in and cells.from_answer(right, edits):
                    props.append([Edit("answer", text=left, why=f"answer must mention {left!r}")])
                if want_in:  # the cell must contain `left`: B holds just that, so only the part is a target
                    props += [[Edit(**{**e.__dict__, "alt": {c: self.canon(left) for c in e.values}})
                               for e in p] for p in cells.updates(right, [f"{right} {self.canon(left)}"])]
                return props
            if _seq(left) is not None and _seq(right) is not None and want_in:  # a row tuple among final rows
                values = _seq(left) or []
                return props + [p for sql in recent[:3] if (p := self._insert_row(sql, state, values))]
            items, n = _seq(right), _length(right)
            if items is None and isinstance(right, dict) and isinstance(right.get("keys"), list):
                items = right["keys"]
            if items is None or not scalar(left):
                return props
            if want_in:
                props += cells.json_lists(items or [], left)  # a JSON list column, decoded by the verifier
                if items:
                    props += cells.updates(left, [items[0]])
                for sql in recent[:3]:
                    props += self._inserts(sql, state, 1, key_value=left, like=items)
                props += self._change_row(left, cells)  # a key wanted among the rows that changed
            else:
                props += cells.updates(left, _flip_value("==", True, left, left))
                props += cells.deletes(left, recent[:2])
            return props
        if scalar(left) and scalar(right):
            tolerance_failed = (op in ("<", "<=") and not result) or (op in (">", ">=") and result)
            if tolerance_failed and isinstance(right, int | float) and 0 < right <= 0.05 \
                    and isinstance(left, int | float):  # abs(a - b) < eps (or > eps: reject): make a equal b
                for x, y in self._close_values(events_before, left):
                    props += cells.updates(x, [y])
                props += cells.date_shifts(left) + cells.date_shifts(-left)  # a difference of dates it computed
            props += cells.updates(left, _flip_value(op, bool(result), right, left))
            if op in ("==", "!=") and (op == "==") != bool(result) and isinstance(left, int | float) \
                    and isinstance(right, int | float) and not isinstance(left, bool) and left != right:
                props += cells.date_shifts(right - left)  # `delta.days != 14`
            if op in _MIRROR:
                props += cells.updates(right, _flip_value(_MIRROR[op], bool(result), left, right))
            if left is None and right is not None and op in ("==", "!=", "is", "is not"):
                for sql in recent[:2]:  # a value looked up in rows that do not exist yet
                    props += self._inserts(sql, state, 1, key_value=right, like=[right])
            if left is None and right is None and ((op in ("is", "==")) == bool(result)):
                for sql in recent[:2]:  # `row = cur.fetchone(); if row is None:` -- the query found no row
                    if not ro_rows(state, sql):
                        props += self._inserts(sql, state, 1)
            for sql in recent[:2]:  # SELECT COUNT(*) ...: the number compared is a row count (or a difference)
                counted = self._counted(sql, state) if isinstance(left, int) and not isinstance(left, bool) else None
                if counted is not None and counted == left:
                    props += self._count_change(left, op, right, bool(result), [sql], state)
                elif counted is not None and isinstance(right, int) and op in ("==", "!=") and (op == "==") != bool(result):
                    props += self._count_change(counted, "==", counted + right - left, False, [sql], state)
            return props
        if right is None and _seq(left) is not None and (op in ("is not", "!=")) == bool(result):
            for sql in recent[:2]:  # `if row is not None: return others`: the row must go
                props += self._deletes(sql, state)
        if op in ("==", "!=") and (op == "==") != bool(result):  # want two collections equal
            props += self._make_equal(left, right, cells, recent, state)
        subset = {"subset": (left, right), "<=": (left, right), "superset": (right, left), ">=": (right, left)}
        if op in subset and not result and _seq(left) is not None and _seq(right) is not None:
            small, big = subset[op]  # want every element of `small` in `big` (a final collection)
            missing = [x for x in _seq(small) or [] if scalar(x) and not any(same(x, y) for y in _seq(big) or [])]
            for sql in recent[:3]:
                parts = [e for x in missing[:MAX_ROWS_PER_COUNT] for p in self._inserts(sql, state, 1, key_value=x)[:1]
                         for e in p]
                if parts:
                    props.append(parts)
        return props

    def _make_equal(self, left: Any, right: Any, cells: _Cells, recent: list[str], state: Path) -> list[list[Edit]]:
        """Edits that make a row (tuple or dict) or a list of keys read from the final DB equal the other side."""
        out: list[list[Edit]] = []
        for a, b in ((left, right), (right, left)):
            if isinstance(a, dict) and isinstance(b, dict) and isinstance(a.get("vals"), list):
                av, bv = _pairs(a), _pairs(b)
                for row in cells.best_rows(list(av.values())):
                    for k in av.keys() & bv.keys():
                        if not same(av[k], bv[k]) and scalar(bv[k]):
                            out += cells.updates(av[k], [bv[k]], rows={row}, column=k)
            if isinstance(a, dict) and isinstance(b, dict) and "vals" in a and "vals" in b:
                out += self._mapping_diff(_pairs(a), _pairs(b), cells, recent, state)
            sa, sb = _seq(a), _seq(b)
            if sa is None or sb is None:
                continue
            rows_wanted = [y for y in sb if _seq(y) is not None and not any(_seq(x) == _seq(y) for x in sa)]
            rows_extra = [x for x in sa if _seq(x) is not None and not any(_seq(x) == _seq(y) for y in sb)]
            for sql in recent[:2]:  # a set of row tuples: insert the missing rows, delete the extra ones
                adds = [self._insert_row(sql, state, _seq(y) or []) for y in rows_wanted[:MAX_ROWS_PER_EDIT]]
                drops = [cells.exact_row(_seq(x) or [], sql) for x in rows_extra[:MAX_ROWS_PER_EDIT]]
                parts = [e for p in adds if p for e in p] + [Edit("delete", r[0], rowid=r[1], why="a row the verifier "
                                                                  "does not expect") for r in drops if r]
                if parts:
                    out.append(parts)
            if len(sa) == len(sb) and len(sa) > 1 and all(scalar(x) for x in sa):  # two rows as tuples
                diffs = [(x, y) for x, y in zip(sa, sb, strict=True) if not same(x, y) and scalar(y)]
                if len(diffs) > 1:  # a column of several rows (titles of the new rows): one cell per row
                    spread = cells.spread_updates(diffs)
                    if spread:
                        out.append(spread)
                for row in cells.best_rows(sa):
                    if len(diffs) > 1:  # every differing position at once, columns matched by value
                        out += cells.assignments(row, diffs)
                    for x, y in diffs:
                        out += cells.updates(x, [y], rows={row})
            missing = [y for y in sb if scalar(y) and not any(same(y, x) for x in sa)]
            extra = [x for x in sa if scalar(x) and not any(same(y, x) for y in sb)]
            options = [self._change_row(key, cells) for key in missing[:3]]
            undo = [Edit("undo", text=e.key(), why=f"row {key} must not change") for key in extra[:2]
                    for e in self.edits_on(key)]
            for i in range(3):  # keys the verifier wants among changed rows: change all of them at once
                combined = [o[min(i, len(o) - 1)][0] for o in options if o]
                if len(combined) > 1 or (combined and undo):
                    out.append(undo + combined)
            for o in options:
                out += o
            for key in extra[:2]:  # a row one of our edits changed that must stay as it was
                out += [[Edit("undo", text=e.key(), why=f"row {key} must not change")] for e in self.edits_on(key)]
            if (missing or extra) and all(scalar(x) for x in sa + sb):  # a set of keys: rows out, rows in
                drops = [d for x in extra[:MAX_ROWS_PER_COUNT] for d in cells.deletes(x, recent[:1])[:1]]
                for sql in recent[:2]:
                    adds = [e for y in missing[:MAX_ROWS_PER_COUNT] for p in self._inserts(sql, state, 1, key_value=y)[:1]
                            for e in p]
                    if adds or drops:
                        out.append([e for p in drops for e in p] + adds)
            if len(sa) < len(sb) and not missing:
                out += [p for sql in recent[:2] for p in self._inserts(sql, state, 1)]
            if len(sa) > len(sb):
                out += [p for sql in recent[:2] for p in self._deletes(sql, state)]
        return out

    def _mapping_diff(self, have: dict[Any, Any], want: dict[Any, Any], cells: _Cells, recent: list[str],
                      state: Path) -> list[list[Edit]]:
        """A {key: value} map built from final rows (e.g. product -> quantity) made equal to the wanted one."""
        out: list[list[Edit]] = []
        for sql in recent[:2]:  # every missing key at once, then one at a time
            adds = [self._insert_row(sql, state, [k, v]) for k, v in list(want.items())[:MAX_ROWS_PER_COUNT]
                    if k not in have and scalar(v)]
            if len(adds) > 1 and all(adds):
                out.append([e for p in adds for e in p])
        for k, v in list(want.items())[:50]:
            if not scalar(v):
                continue
            if k not in have:
                out += [p for sql in recent[:2] if (p := self._insert_row(sql, state, [k, v]))]
            elif not same(have[k], v):
                for table, rowid in {(t, r) for _, t, _, r, cell in cells.cells if same(cell, k)}:
                    out += cells.updates(have[k], [v], rows={(table, rowid)})
        for k in list(have.keys() - want.keys())[:2]:
            out += cells.deletes(k, recent[:1])
        return out

    def _insert_row(self, sql: str, state: Path, values: list[Any]) -> list[Edit] | None:
        """An insert making `sql` return a row whose first output columns hold `values`."""
        shape = self.shape(sql)
        if shape is None or not values or not all(scalar(v) for v in values):
            return None
        outs = shape.output_columns(self.schema.columns)
        if len(outs) < len(values) or any(o is None for o in outs[:len(values)]):
            return None
        target = outs[0][0]
        if any(o[0] != target for o in outs[:len(values)]):
            return None
        table = self.schema.table(shape.tables[target])
        if table is None:
            return None
        forced = {**shape.equalities(target), **{o[1]: v for o, v in zip(outs, values, strict=False)}}
        return self._plan_insert(shape, target, table, state, 1, forced)

    def _close_values(self, events: list[Any], gap: float) -> list[tuple[float, float]]:
        """Pairs of numbers compared just before `abs(a - b) < eps` failed with abs(a - b) == gap."""
        nums = [x for e in events[-8:] if isinstance(e, list) and e[0] == "cmp" and len(e) > 4
                for x in (e[3], e[4]) if isinstance(x, int | float) and not isinstance(x, bool)]
        return [(x, y) for x in nums for y in nums if x != y and math.isclose(abs(x - y), gap, abs_tol=1e-6)][:4]

    def edits_on(self, key: Any) -> list[Edit]:
        """Update edits of the current path on a row whose primary key is `key`."""
        out = []
        for e in self.path:
            table = self.schema.table(e.table) if e.kind == "update" else None
            if table and len(self.schema.pk[table]) == 1:
                rows = ro_rows(self.s0, f'SELECT "{self.schema.pk[table][0]}" FROM "{table}" WHERE rowid = {int(e.rowid or 0)}')
                if rows and same(rows[0][0], key):
                    out.append(e)
        return out

    def _change_row(self, key: Any, cells: _Cells) -> list[list[Edit]]:
        """Edits that change the row whose primary key is `key`, column by column, to values the code names."""
        out = []
        for table, rowid in cells.rows_with_key(key)[:2]:
            for col in self.schema.columns[table]:
                if col.lower() not in self.static.columns or col in self.schema.pk[table]:
                    continue
                current = cells.value(table, rowid, col)
                literals = [v for v in self.static.literal_checks.get(col.lower(), []) if scalar(v)]
                for v in literals[:4] + _flip_value("==", True, current, current):
                    if not same(v, current):
                        out.append([Edit("update", table, {col: v}, rowid=rowid, why=f"change {table} row {key}")])
        return out

    def _counted(self, sql: str, state: Path) -> int | None:
        """The value of a `SELECT COUNT(...) FROM ...` on the state (None for any other query)."""
        shape = self.shape(sql)
        if shape is None or not re.match(r"\s*SELECT\s+COUNT\s*\(", sql, re.IGNORECASE):
            return None
        rows = ro_rows(state, sql)
        return rows[0][0] if rows and len(rows) == 1 and isinstance(rows[0][0], int) else None

    def _distinct_keys(self, proposal: list[Edit]) -> list[Edit]:
        """Rows one proposal inserts into a table each get their own key (each was planned on the same state)."""
        taken: dict[str, set[Any]] = {}
        out = []
        for e in proposal:
            pk = self.schema.rowid_pk.get(self.schema.table(e.table) or "") if e.kind == "insert" else None
            if pk and pk in e.values:
                used = taken.setdefault(e.table, set())
                value = e.values[pk]
                while value in used:
                    value += 1
                used.add(value)
                if value != e.values[pk]:
                    e = Edit(**{**e.__dict__, "values": {**e.values, pk: value}})
            out.append(e)
        return out

    def _answers(self, reads: list[str], edits: list[Edit]) -> list[list[Edit]]:
        """Answers that mention what the verifier last read from the initial DB (info-seeking tasks)."""
        values: list[str] = []
        for sql in reads:
            for r in (ro_rows(self.s0, sql) or [])[:5]:
                for v in r:
                    if isinstance(v, float):
                        values += [f"{v:.2f}", str(v)]
                    elif v is not None and not isinstance(v, bytes):
                        values.append(str(v))
        values += self.constants
        have = (answer_of(edits) or "").lower()
        values = [v for v in dict.fromkeys(values) if v.strip() and v.lower() not in have][:12]
        if not values and not have:
            values = ["unknown"]  # a verifier that checks for an answer before it reads anything
        out = [[Edit("answer", text=v, why="the answer names a value the verifier read")] for v in values]
        if len(values) > 1:
            out.append([Edit("answer", text=", ".join(values), why="the answer names the values the verifier read")])
        return out

    def _count_change(self, n: Any, op: str, other: Any, result: bool, recent: list[str],
                      state: Path) -> list[list[Edit]]:
        if not isinstance(n, int) or not isinstance(other, int | float) or isinstance(other, bool):
            return []
        wants = sorted({c for c in (int(other), int(other) + 1, int(other) - 1, 0, 1, n + 1, n - 1)
                        if c >= 0 and _OPS[op](c, other) != result}, key=lambda c: (abs(c - n), c))
        if not wants:
            return []
        want = wants[0]
        if want > n:
            k = min(want - n, MAX_ROWS_PER_COUNT)
            return [p for sql in recent[:3] for p in self._inserts(sql, state, k)]
        return [p for sql in recent[:3] for p in self._deletes(sql, state, keep=want)]

    def _inserts(self, sql: str, state: Path, k: int, key_value: Any = None,
                 like: list[Any] | None = None) -> list[list[Edit]]:
        """Edits that make `sql` select `k` more rows (optionally holding `key_value` in some column)."""
        shape = self.shape(sql)
        if shape is None:
            return []
        out = []
        for target in shape.order[:2]:
            table = self.schema.table(shape.tables[target])
            if table is None:
                continue
            base = shape.equalities(target)
            columns: list[str | None] = [None]
            if key_value is not None:
                outs = [c for c in shape.output_columns(self.schema.columns) if c and c[0] == target]
                columns = [c for _, c in outs if _fits(self.schema.types[table].get(c, ""), key_value)]
                if like:  # the column whose values look like the collection's
                    columns.sort(key=lambda c: -_overlap(state, table, c, like))
                columns = columns[:3]
            for col in columns:
                plan = self._plan_insert(shape, target, table, state, k, {**base, **({col: key_value} if col else {})})
                if plan:
                    out.append(plan)
        return out

    def _plan_insert(self, shape: Shape, target: str, table: str, state: Path, k: int,
                     values: dict[str, Any]) -> list[Edit] | None:
        values = {c: self.canon(v) for c, v in values.items()}
        edits: list[Edit] = []
        links = [(c.link[1], c.link[2], c.link[3]) if c.link[0] == target else (c.link[3], c.link[0], c.link[1])
                 for c in shape.conjuncts if c.link and target in (c.link[0], c.link[2])]
        others = [a for a in shape.order if a != target]
        if links and others:
            partner = _partner_row(state, shape, target, others)
            if partner is not None:
                for mine, alias, theirs in links:
                    if (alias, theirs) in partner:
                        values.setdefault(mine, partner[(alias, theirs)])
            elif len(others) == 1:  # create the partner row first, with its own conditions
                other_table = self.schema.table(shape.tables[others[0]])
                if other_table is None:
                    return None
                pk = self.schema.rowid_pk[other_table]
                new_id = max_rowid(state, other_table) + 1
                other_values = shape.equalities(others[0])
                if pk:
                    other_values.setdefault(pk, new_id)
                edits.append(Edit("insert", other_table, other_values, donors=_donors(state, shape, others[0], other_table),
                                  why=f"a {other_table} row for a {table} row to join"))
                for mine, _, theirs in links:
                    if theirs in other_values:
                        values.setdefault(mine, other_values[theirs])
            else:
                return None
        donors = _donors(state, shape, target, table)
        pk = self.schema.rowid_pk[table]
        base_id = max_rowid(state, table)
        for n in range(k):
            v = dict(values)
            if pk and pk not in v:
                v[pk] = base_id + 1 + n
            edits.append(Edit("insert", table, v, donors=donors, why=f"the verifier needs more rows of {table}"))
        return edits

    def _deletes(self, sql: str, state: Path, keep: int = 0) -> list[list[Edit]]:
        shape = self.shape(sql)
        query = shape.with_rowids() if shape else None
        if query is None:
            return []
        rows = ro_rows(state, query)
        if rows is None:
            return []
        table = self.schema.table(shape.tables[shape.main])
        ids = list(dict.fromkeys(r[0] for r in rows if isinstance(r[0], int)))
        if table is None or len(ids) <= keep:
            return []
        drop = ids[keep:]
        out = [[Edit("delete", table, rowid=i, why=f"the verifier needs fewer rows of {table}") for i in drop]]
        if len(drop) > 1:
            out.append([Edit("delete", table, rowid=drop[-1], why=f"one row fewer in {table}")])
        return out


class _Cells:
    """The cells of the recent final-DB queries' results on one state, with the table row of each."""

    def __init__(self, search: Proposer, state: Path, recent: list[str], ours: set[tuple[str, int | None]]) -> None:
        self.search, self.cells, self.state = search, [], state
        for sql in recent:
            shape = search.shape(sql)
            query = shape.with_rowids() if shape else None
            rows = ro_rows(state, query) if query else None
            if not rows:
                continue
            outs = shape.output_columns(search.schema.columns)
            k = len(shape.order)
            for r in rows[:200]:
                for pos, ref in enumerate(outs):
                    if ref is None or k + pos >= len(r):
                        continue
                    alias, col = ref
                    rowid = r[shape.order.index(alias)]
                    table = search.schema.table(shape.tables[alias])
                    if table and isinstance(rowid, int):
                        mine = (table.lower(), rowid) in ours
                        self.cells.append((not mine, table, col, rowid, r[k + pos]))
        self.cells.sort(key=lambda c: c[0])  # cells of rows an edit already touched first

    def updates(self, value: Any, targets: list[Any], rows: set[tuple[str, int]] | None = None,
                column: str | None = None) -> list[list[Edit]]:
        out, seen = [], set()
        for _, table, col, rowid, cell in self.cells:
            if not same(cell, value) or (table, col, rowid) in seen:
                continue
            if (rows is not None and (table, rowid) not in rows) or (column and col.lower() != str(column).lower()):
                continue
            seen.add((table, col, rowid))
            for t in targets:
                alt: dict[str, Any] = {}
                if t is _TRUTHY:  # any truthy value passes: B gets another one
                    t, other = self._truthy(table, col, rowid)
                    alt = {col: other}
                for form in dict.fromkeys([self.search.canon(t), t]):  # as the task writes it, then as compared
                    if not same(form, cell) and scalar(form):
                        out.append([Edit("update", table, {col: form}, rowid=rowid, alt=alt,
                                         why=f"{table}.{col} {cell!r} -> {form!r}")])
            if len(seen) >= 4:
                break
        return out

    def spread_updates(self, diffs: list[tuple[Any, Any]]) -> list[Edit]:
        """One update per (have, want) pair, each on another row's cell holding `have` (touched rows first)."""
        used: set[tuple[str, int]] = set()
        out = []
        for x, y in diffs:
            hit = next(((t, c, r) for _, t, c, r, cell in self.cells if (t, r) not in used and same(cell, x)), None)
            if hit is None:
                return []
            used.add((hit[0], hit[2]))
            out.append(Edit("update", hit[0], {hit[1]: self.search.canon(y)}, rowid=hit[2], why=f"{x!r} -> {y!r}"))
        return out

    def json_lists(self, items: list[Any], value: Any) -> list[list[Edit]]:
        """Cells holding a JSON list equal to `items`, with `value` appended."""
        import json

        out = []
        for _, table, col, rowid, cell in self.cells:
            if not isinstance(cell, str) or not cell.lstrip().startswith("["):
                continue
            try:
                decoded = json.loads(cell)
            except ValueError:
                continue
            if isinstance(decoded, list) and decoded == items and scalar(value):
                out.append([Edit("update", table, {col: json.dumps(decoded + [value])}, rowid=rowid,
                                 alt={col: json.dumps(decoded + [value], separators=(",", ":"))},  # same JSON
                                 why=f"{table}.{col}: add {value!r} to its JSON list")])
        return out[:2]

    def date_shifts(self, days: float, cap: int = 4) -> list[list[Edit]]:
        """Date cells (rows an edit touched first) moved by `days`, written in their own format."""
        import datetime as dt

        if not days or abs(days) > 3660:
            return []
        out = []
        for _, table, col, rowid, cell in self.cells:
            if not isinstance(cell, str) or not re.match(r"^\d{4}-\d{2}-\d{2}", cell):
                continue
            try:
                moved = dt.datetime.fromisoformat(cell[:19].replace("T", " ")) + dt.timedelta(days=days)
            except ValueError:
                continue
            text = moved.strftime("%Y-%m-%d")  # the cell's own separator and fractional seconds kept
            if len(cell) > 10:
                text += cell[10:11] + moved.strftime("%H:%M:%S") + cell[19:]
            out.append([Edit("update", table, {col: text}, rowid=rowid, why=f"{table}.{col} {cell} {days:+g} days")])
            if len(out) >= cap:
                break
        return out

    def best_rows(self, values: list[Any], k: int = 3) -> list[tuple[str, int]]:
        """Up to k result rows holding the most of `values` (at least half), rows an edit touched first."""
        counts: dict[tuple[str, int], int] = {}
        for _, table, _, rowid, cell in self.cells:
            if any(same(cell, v) for v in values if scalar(v)):
                counts[(table, rowid)] = counts.get((table, rowid), 0) + 1
        ranked = sorted(counts.items(), key=lambda kv: -kv[1])  # stable: touched rows stay first on ties
        return [row for row, n in ranked[:k] if n * 2 >= len(values)]

    def assignments(self, row: tuple[str, int], diffs: list[tuple[Any, Any]], cap: int = 12) -> list[list[Edit]]:
        """One update per way of giving each (have, want) pair its own column of `row` holding `have`."""
        import itertools

        table, rowid = row
        cols = [c for _, t, c, r, _ in self.cells if (t, r) == row]
        options = [[c for c in dict.fromkeys(cols) if same(self.value(table, rowid, c), x)] for x, _ in diffs]
        out: list[list[Edit]] = []
        for combo in itertools.product(*options):
            if len(set(combo)) == len(combo):
                values = {c: self.search.canon(y) for c, (_, y) in zip(combo, diffs, strict=True)}
                out.append([Edit("update", table, values, rowid=rowid, why=f"{table} row {rowid}: {values}")])
            if len(out) >= cap:
                break
        return out

    def exact_row(self, values: list[Any], sql: str) -> tuple[str, int] | None:
        """A row of `sql`'s result whose first output columns equal `values` (a row tuple the verifier built)."""
        shape = self.search.shape(sql)
        query = shape.with_rowids() if shape else None
        rows = ro_rows(self.state, query) if query else None
        table = self.search.schema.table(shape.tables[shape.main]) if shape else None
        k = len(shape.order) if shape else 0
        for r in rows or []:
            if table and len(r) >= k + len(values) and all(same(a, b) for a, b in zip(r[k:], values, strict=False)):
                return (table, r[0]) if isinstance(r[0], int) else None
        return None

    def rows_with_key(self, key: Any) -> list[tuple[str, int]]:
        pk = self.search.schema.pk
        return list(dict.fromkeys((t, r) for _, t, c, r, cell in self.cells if c in pk[t] and same(cell, key)))

    def value(self, table: str, rowid: int, col: str) -> Any:
        return next((cell for _, t, c, r, cell in self.cells if (t, r, c) == (table, rowid, col)), None)

    def _truthy(self, table: str, col: str, rowid: int) -> tuple[Any, Any]:
        """Two different truthy values for a cell: other rows' values of the column, else made up."""
        seen = list(dict.fromkeys(cell for _, t, c, r, cell in self.cells if t == table and c == col and r != rowid
                                  and cell and scalar(cell)))
        made = [1, 2] if "INT" in self.search.schema.types[table].get(col, "") else ["x", "y"]
        values = (seen + made)[:2] if seen else made
        return values[0], values[1] if len(values) > 1 and values[1] != values[0] else made[1]

    def deletes(self, value: Any, recent: list[str]) -> list[list[Edit]]:
        hits = sorted({(t, r) for _, t, _, r, cell in self.cells if same(cell, value)})
        return [[Edit("delete", t, rowid=r, why=f"a row holding {value!r}")] for t, r in hits[:2]]

    def from_answer(self, text: str, edits: list[Edit]) -> bool:
        answer = (answer_of(edits) or "").lower()
        return not text.strip() or text.strip().lower() in answer or answer in text.lower()


def _answer_constants(code: str) -> list[str]:
    """Short literals the verifier passes to calls or compares (an answer it expects may be written there)."""
    import ast

    out: list[str] = []
    for node in ast.walk(ast.parse(code)):
        args = node.args if isinstance(node, ast.Call) else [node.left, *node.comparators] \
            if isinstance(node, ast.Compare) else []
        for a in args:
            if isinstance(a, ast.Constant) and not isinstance(a.value, bool) and isinstance(a.value, int | float | str):
                text = str(a.value)
                if 0 < len(text) <= 40 and "\n" not in text and not text.lstrip().upper().startswith(("SELECT", "FILE")):
                    out.append(text)
    return list(dict.fromkeys(out))[:20]


def _surfaces(task: str, code: str) -> list[str]:
    """Phrases the task quotes and strings the verifier's code holds: how a value is written."""
    import ast

    out = [m.group(2) for m in re.finditer(r"(['\"\u2018\u201c])(.+?)(['\"\u2019\u201d])", task or "")]
    try:
        out += [n.value for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                and 0 < len(n.value) <= 80 and "\n" not in n.value]
    except SyntaxError:
        pass
    return list(dict.fromkeys(out))


def _pairs(summary: dict[str, Any]) -> dict[Any, Any]:
    """A dict summary's scalar keys with their values."""
    keys, vals = summary.get("keys"), summary.get("vals")
    if not isinstance(keys, list) or not isinstance(vals, list):
        return {}
    return {k: v for k, v in zip(keys, vals, strict=False) if scalar(k)}


def _fits(kind: str, value: Any) -> bool:
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, int | float):
        return not kind or any(k in kind for k in ("INT", "REAL", "FLOA", "DOUB", "NUM", "DEC"))
    return not any(k in kind for k in ("INT", "REAL", "FLOA", "DOUB"))

def _overlap(db: Path, table: str, col: str, values: list[Any]) -> int:
    rows = ro_rows(db, f'SELECT DISTINCT "{col}" FROM "{table}"') or []
    have = {r[0] for r in rows}
    return sum(1 for v in values if scalar(v) and v in have)


def _donors(db: Path, shape: Shape, alias: str, table: str) -> list[int]:
    """Rows of `table` that meet the query's own conditions on `alias` (first, last), else any two rows."""
    own = [c.text for c in shape.conjuncts if c.aliases == {alias}]
    quoted = f'"{alias}"'
    found = None
    if own:
        found = ro_rows(db, f'SELECT {quoted}.rowid FROM "{table}" AS {quoted} WHERE {" AND ".join(own)} '
                             f'ORDER BY {quoted}.rowid')
    if not found:
        found = ro_rows(db, f'SELECT rowid FROM "{table}" ORDER BY rowid')
    ids = [r[0] for r in found or [] if isinstance(r[0], int)]
    return [ids[0], ids[-1]] if ids else []


def _partner_row(db: Path, shape: Shape, target: str, others: list[str]) -> dict[tuple[str, str], Any] | None:
    """Column values of one row per other alias meeting every condition that does not mention `target`."""
    conds = [c.text for c in shape.conjuncts if target not in c.aliases]
    tables = ", ".join(f'"{shape.tables[a]}" AS "{a}"' for a in others)
    where = f" WHERE {' AND '.join(conds)}" if conds else ""
    needed = sorted({(c.link[2], c.link[3]) if c.link[0] == target else (c.link[0], c.link[1])
                     for c in shape.conjuncts if c.link and target in (c.link[0], c.link[2])})
    needed = [(a, col) for a, col in needed if a in others]
    if not needed:
        return None
    rows = ro_rows(db, f'SELECT {", ".join(f"{chr(34)}{a}{chr(34)}.{chr(34)}{c}{chr(34)}" for a, c in needed)} '
                        f"FROM {tables}{where} LIMIT 1")
    if not rows:
        return None
    return dict(zip(needed, rows[0], strict=True))

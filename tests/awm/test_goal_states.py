"""Predicates without reference solutions: the SQL reader, the observed verifier, the goal-state search, and
predicates built that way checked against the bundled solutions they never saw."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
from awm.data import bundled_data_dir
from awm.episode import EnvRuntime
from awm.llm import ChatClient
from awm.predicates.build import _final_state, build, main
from awm.predicates.goal_states import search
from awm.predicates.predicate import phi
from awm.predicates.sql_shape import parse
from awm.predicates.verifier_analysis import observed_code, traced_run
from awm.solutions import load_solutions
from awm.verifier import VerifierSandbox
from fake_llm import FakeOpenAI

COLUMNS = {"cart_items": ["id", "cart_id", "product_offer_id", "quantity"], "carts": ["id", "user_id", "status"],
           "orders": ["id", "user_id", "status", "total"]}


def test_sql_shape_reads_the_verifier_query_forms():
    s = parse("SELECT ci.id, ci.quantity FROM cart_items ci JOIN carts c ON ci.cart_id = c.id "
              "WHERE c.user_id = 1 AND c.status IN ('active', 'open') ORDER BY ci.id", COLUMNS)
    assert s.tables == {"ci": "cart_items", "c": "carts"} and s.main == "ci"
    assert s.items == [("ci", "id"), ("ci", "quantity")]
    assert [c.link for c in s.conjuncts if c.link] == [("ci", "cart_id", "c", "id")]
    assert s.equalities("c") == {"user_id": 1, "status": "active"}
    assert s.with_rowids().startswith('SELECT "ci".rowid, "c".rowid, ci.id')
    s = parse("SELECT id, total FROM orders WHERE LOWER(status) = 'placed' AND user_id IS NULL", COLUMNS)
    assert not s.grouped  # a column named `total` is not the aggregate
    assert s.equalities("orders") == {"status": "placed", "user_id": None}
    s = parse("SELECT id FROM orders WHERE LOWER(status) = LOWER('Placed') AND UPPER(user_id) = 3", COLUMNS)
    assert s.equalities("orders") == {"status": "placed", "user_id": 3}
    assert parse("SELECT COUNT(*) FROM orders WHERE status = 'x' OR id = 1", COLUMNS).grouped
    assert parse("SELECT * FROM orders WHERE status = 'x' OR id = 1", COLUMNS).equalities("orders") == {}
    for unsupported in ("SELECT id FROM orders UNION SELECT id FROM carts", "SELECT x FROM (SELECT 1 AS x)",
                        "WITH t AS (SELECT 1) SELECT * FROM t", "SELECT 'unterminated FROM orders"):
        assert parse(unsupported, COLUMNS) is None


def _excerpt_verifiers(excerpt_dir: Path) -> list[str]:
    return [json.loads(line)["verification"]["code"]
            for line in (excerpt_dir / "gen_verifier.pure_code.jsonl").read_text().splitlines() if line.strip()]


def test_the_observed_verifier_decides_as_the_verifier_does(excerpt_dir, cache_dir):
    """Rewriting comparisons into recorders changes no verdict (60 bundled verifiers + 3 AWM-1K ones)."""
    with EnvRuntime(cache_dir=cache_dir, num_workers=1) as rt:
        sandbox = rt.sandbox()
        cases = []
        for scenario, idx in rt.dataset.task_keys():
            s0, _ = rt.template(scenario)
            cases.append((rt.dataset.verifier(scenario, idx).code, s0))
        for code, s0 in cases:
            plain = sandbox.verify(code, str(s0), str(s0), "an answer", 10.0).verdict
            observed = traced_run(sandbox, code, str(s0), str(s0), final_answer="an answer", observe=True)
            assert observed.status == "ok" and observed.value.get("result", "others") == plain
            assert any(isinstance(e, list) for e in observed.events)  # it reported what it compared
    for code in _excerpt_verifiers(excerpt_dir):
        compile(observed_code(code), "<observed>", "exec")


HOSTILE = {
    "forges_its_log": '''def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    import sqlite3
    log = globals()["_awm_log"]
    log.extend([["cmp", 1, "==", {"seq": "x"}, None, True, 5], {"sql": 7}, ["truth"], "junk", ["lookup", 2, [1], 0]])
    log.extend([["cmp", 9, "in", "x", {"keys": [[1]], "vals": 3, "len": "n"}, False, ""]] * 50)
    sqlite3.connect(final_db_path).execute("SELECT * FROM notes").fetchall()
    return {"result": "others"}
''',
    "loops_forever": '''def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    while True:
        pass
''',
    "raises": '''def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    raise RuntimeError("broken verifier")
''',
    "accepts_anything": '''def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    return {"result": "complete"}
''',
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_verifiers_get_a_reason_not_a_crash(name, tmp_path):
    import sqlite3

    s0 = tmp_path / "s0.db"
    conn = sqlite3.connect(s0)
    conn.executescript("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT); INSERT INTO notes VALUES (1, 'a');")
    conn.close()
    before = s0.read_bytes()
    with VerifierSandbox() as sandbox:
        result = search(sandbox, HOSTILE[name], s0, tmp_path / "goal", max_runs=20)
    assert s0.read_bytes() == before  # the search works on copies
    if name == "accepts_anything":
        assert result.accepting and result.edits == []  # nothing to do: no progress predicate can come of it
    else:
        assert not result.accepting and result.reason and result.runs <= 20


def _copy_without_solutions(dest: Path) -> Path:
    shutil.copytree(bundled_data_dir(), dest)
    (dest / "reference_solutions.jsonl").unlink()
    (dest / "tool_probes.jsonl").unlink(missing_ok=True)
    return dest


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Two bundled scenarios built as AWM-1K would be (no solutions), with a scripted LLM adding one good and
    one bad predicate to a task; then the held-out reference and wrong solutions replayed."""
    root = tmp_path_factory.mktemp("nosol")
    data = _copy_without_solutions(root / "data")
    fake = FakeOpenAI()
    good = {"sql": "SELECT 1 FROM copies WHERE id = 1 AND status = 'on_loan'", "check": "exists", "expected": None}
    bad = {"sql": "SELECT 1 FROM copies WHERE id = 1 AND status = 'lost'", "check": "exists", "expected": None}
    fake.script("Project Hail Mary", replies=[json.dumps([good, bad])])
    fake.script("Task:", replies=["[]"])

    sols = load_solutions(str(bundled_data_dir()))
    episodes = root / "episodes.jsonl"  # the wrong solutions as recorded episodes: one plain, one trace-shaped
    lines = []
    for (scenario, idx), sol in sorted(sols.items()):
        if scenario == "library_lending_1":
            lines.append({"scenario": scenario, "task_idx": idx, "calls": sol.wrong_calls,
                          "final_answer": sol.wrong_final_answer})
        elif scenario == "online_grocery_1":
            lines.append({"scenario": scenario, "task_idx": idx, "infra_error": None, "final_answer": None,
                          "turns": [{"calls": [{"name": c["tool"], "arguments": c["arguments"], "is_error": False}]}
                                    for c in sol.wrong_calls]})
    episodes.write_text("".join(json.dumps(x) + "\n" for x in lines))

    async def run():
        llm = ChatClient(base_url=fake.base_url, model="fake", retries=0)
        with EnvRuntime(str(data), cache_dir=root / "cache", num_workers=1) as rt:
            records = await build(str(data), scenarios=["library_lending_1", "online_grocery_1"], llm=llm, runtime=rt,
                                  episodes=[str(episodes)])
        checks = []
        with EnvRuntime(cache_dir=root / "cache", num_workers=1) as rt:  # the same templates (their clock)
            for r in records:
                sol = sols[(r.scenario, r.task_idx)]
                for name, calls, answer in (("reference", sol.calls, sol.final_answer),
                                            ("wrong", sol.wrong_calls, sol.wrong_final_answer)):
                    dest = root / f"{r.scenario}-{r.task_idx}-{name}.db"
                    verdict = await _final_state(rt, r.scenario, r.task_idx, calls, answer, dest)
                    checks.append((r, sol.task_type, name, verdict, phi(dest, r.predicates)))
        return records, checks

    try:
        yield asyncio.run(run())
    finally:
        fake.close()


def test_predicates_built_without_solutions_hold_on_the_solutions_they_never_saw(built):
    records, checks = built
    mutating = {(r.scenario, r.task_idx) for r, t, *_ in checks if t == "state_mutating"}
    covered = {(r.scenario, r.task_idx) for r in records if r.predicates}
    assert covered <= mutating and len(covered) >= 0.8 * len(mutating)
    for r, true_type, name, verdict, value in checks:
        assert r.task_type in (true_type, "ambiguous"), (r.scenario, r.task_idx, r.evidence)
        assert r.evidence
        if r.predicates and name == "reference":
            assert verdict == "complete" and value == 1.0, (r.scenario, r.task_idx)
        if r.predicates and name == "wrong" and verdict != "complete":
            assert value < 1.0, (r.scenario, r.task_idx)
    for r in records:
        if r.predicates:
            assert r.validation["method"] == "verifier_states" and r.validation["agrees"] is True


def test_llm_predicates_are_validated_on_the_built_states(built):
    records, _ = built
    r = next(r for r in records if r.scenario == "library_lending_1" and r.task_idx == 3)
    llm = [p for p in r.predicates if p.source == "llm"]
    assert [p.sql for p in llm] == ["SELECT 1 FROM copies WHERE id = 1 AND status = 'on_loan'"]
    assert llm[0].replay == "verifier_states" and r.dropped.get("false_on_reference", 0) >= 1


def test_recorded_episodes_are_states_the_set_is_checked_on(built, tmp_path, capsys):
    records, checks = built
    for r in records:
        if r.predicates:
            assert r.validation["recorded_episodes"] >= 1 and r.validation["agrees"] is True
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"scenario": "library_lending_1", "task_idx": 0, "calls": []}\n{"turns": 5}\n')
    assert main(["build", "--scenario", "library_lending_1", "--episodes", str(bad), "--out", str(tmp_path / "p")]) == 2
    assert "bad.jsonl:2: not an episode record" in capsys.readouterr().err


STYLES = {  # upstream's LLM-written verifiers phrase the same checks in many ways: each must be searched through
    "fetchone_is_none": '''def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    import sqlite3
    cur = sqlite3.connect(final_db_path).cursor()
    cur.execute("SELECT id, status FROM tickets WHERE title = ? AND owner_id = ?", ("Printer jam", 2))
    row = cur.fetchone()
    if row is None:
        return {"result": "others"}
    if row[1].strip().lower() != "open":
        return {"result": "others"}
    return {"result": "complete"}
''',
    "count_arithmetic": '''def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    import sqlite3
    def rows(path):
        return sqlite3.connect(f"file:{path}?mode=ro", uri=True).execute(
            "SELECT id, title FROM tickets WHERE owner_id = 1").fetchall()
    before, after = rows(initial_db_path), rows(final_db_path)
    if len(after) != len(before) + 1:
        return {"result": "others"}
    new = [r for r in after if r[0] not in {b[0] for b in before}]
    return {"result": "complete" if new and new[0][1] == "VPN down" else "others"}
''',
    "count_star_and_any": '''def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    import sqlite3
    conn = sqlite3.connect(final_db_path)
    (closed,) = conn.execute("SELECT COUNT(*) FROM tickets WHERE status = 'closed'").fetchone()
    if closed != 2:
        return {"result": "others"}
    titles = conn.execute("SELECT title, status FROM tickets").fetchall()
    if not any(t == "Broken chair" and s == "closed" for t, s in titles):
        return {"result": "others"}
    return {"result": "complete"}
''',
    "row_factory": '''def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    import sqlite3
    conn = sqlite3.connect(f"file:{final_db_path}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    rows = conn.execute("SELECT title, owner_id FROM tickets WHERE status = 'open'").fetchall()
    wanted = {("Broken chair", 1), ("Monitor dead", 3)}
    if {(r["title"], r["owner_id"]) for r in rows} != wanted:
        return {"result": "others"}
    return {"result": "complete"}
''',
"datetime_after": '''def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    import sqlite3
    from datetime import datetime
    def one(p, q, a=()):
        c = sqlite3.connect(p); r = c.execute(q, a).fetchone(); c.close(); return r
    before = one(initial_db_path, "SELECT due_date FROM tasks WHERE id = ?", (2,))
    after = one(final_db_path, "SELECT due_date, status FROM tasks WHERE id = ?", (2,))
    if not after:
        return {"result": "others"}
    if datetime.fromisoformat(after[0]) - datetime.fromisoformat(before[0]) != __import__("datetime").timedelta(days=7):
        return {"result": "others"}
    return {"result": "complete" if after[1] == "in_progress" else "others"}
''',
"json_tags": '''def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    import sqlite3, json
    c = sqlite3.connect(final_db_path)
    row = c.execute("SELECT tags FROM tasks WHERE title = 'Write report'").fetchone()
    if row is None:
        return {"result": "others"}
    tags = json.loads(row[0] or "[]")
    return {"result": "complete" if "urgent" in tags else "others"}
''',
"new_row_count_by_user": '''def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    import sqlite3
    def n(p):
        return sqlite3.connect(p).execute("SELECT COUNT(*) FROM tasks WHERE owner = 'ann'").fetchone()[0]
    if n(final_db_path) - n(initial_db_path) != 2:
        return {"result": "others"}
    rows = sqlite3.connect(final_db_path).execute("SELECT title FROM tasks WHERE owner = 'ann' ORDER BY id DESC LIMIT 2").fetchall()
    titles = sorted(r[0].lower() for r in rows)
    return {"result": "complete" if titles == ["buy milk", "call bob"] else "others"}
''',
    "row_must_be_gone": '''def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    import sqlite3
    conn = sqlite3.connect(final_db_path)
    gone = conn.execute("SELECT * FROM tickets WHERE title = 'No coffee'").fetchone()
    if gone is not None:
        return {"result": "others"}
    kept = conn.execute("SELECT COUNT(*) FROM tickets").fetchone()[0]
    return {"result": "complete" if kept == 2 else "others"}
''',
}


@pytest.mark.parametrize("name", sorted(STYLES))
def test_verifier_styles_are_searched_through_to_agreeing_predicates(name, tmp_path):
    import sqlite3

    from awm.predicates.predicate import extract, validate
    from awm.predicates.verifier_analysis import analyse

    s0 = tmp_path / "s0.db"
    conn = sqlite3.connect(s0)
    conn.executescript("CREATE TABLE tickets (id INTEGER PRIMARY KEY, title TEXT NOT NULL, owner_id INTEGER, "
                       "status TEXT NOT NULL DEFAULT 'open', created_at TEXT);"
                       "INSERT INTO tickets VALUES (1, 'Broken chair', 1, 'open', '2026-01-01'), "
                       "(2, 'No coffee', 2, 'closed', '2026-01-02'), (3, 'Lamp flickers', 1, 'open', '2026-01-03');"
                       "CREATE TABLE tasks (id INTEGER PRIMARY KEY, title TEXT NOT NULL, owner TEXT, status TEXT, "
                       "due_date TEXT, cost REAL, tags TEXT);"
                       "INSERT INTO tasks VALUES (1, 'Write report', 'ann', 'todo', '2026-01-10', 10.5, '[\"work\"]'), "
                       "(2, 'Fix bike', 'bob', 'todo', '2026-02-01', 20.25, '[]'), "
                       "(3, 'Pay rent', 'ann', 'done', '2026-01-01', 1200.0, NULL);")
    conn.close()
    code = STYLES[name]
    with VerifierSandbox() as sandbox:
        goal = search(sandbox, code, s0, tmp_path / "goal")
        assert goal.accepting, goal.reason
        a, b = goal.accepting
        trace = traced_run(sandbox, code, str(s0), str(a))
    candidates, dropped = extract(trace.statements, analyse(code), s0, a, b, built=True)
    progress, _ = validate(candidates, s0, a, b, dropped)
    assert progress
    for state, verdict in goal.checked:
        assert (phi(state, progress) == 1.0) == (verdict == "complete"), (state.name, verdict)

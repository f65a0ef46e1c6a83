"""Predicates: satisfaction values, schema validation, static analysis, traced runs, extraction and replay."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections import Counter
from pathlib import Path

import pytest
from awm.episode import EnvRuntime
from awm.llm import ChatClient
from awm.predicates.build import build, coverage, main, read_predicates, write_predicates
from awm.predicates.goal_states import search
from awm.predicates.predicate import (
    Predicate,
    PredicateError,
    evaluate,
    extract,
    phi,
    phi_of_rows,
    rows_digest,
    run_query,
    validate,
)
from awm.predicates.verifier_analysis import analyse, required_count, traced_run
from awm.solutions import load_solutions
from awm.verifier import VerifierSandbox
from fake_llm import FakeOpenAI

VERIFIER = '''def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    import sqlite3

    def q(path, sql, params=()):
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()

    def table(path, name):
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        cur = conn.execute(f'SELECT * FROM "{name}"')
        cols = [d[0] for d in cur.description]
        out = {r[0]: dict(zip(cols, r)) for r in cur.fetchall()}
        conn.close()
        return out

    users = q(initial_db_path, "SELECT id FROM users WHERE name = ?", ("ann",))
    if len(users) != 1:
        return {"result": "others"}
    found = q(final_db_path, "SELECT id FROM notes WHERE user_id = ? AND body = ?", (users[0][0], "hi"))
    if len(found) != 1:
        return {"result": "others"}
    after = table(final_db_path, "accounts")
    if after[1]["balance"] != 50 or after[1]["status"] != "closed":
        return {"result": "others"}
    return {"result": "complete"}
'''


def make_db(path: Path, notes: list[tuple], balance: float, status: str, stamp: str) -> Path:
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT);"
        "CREATE TABLE notes (id INTEGER PRIMARY KEY, user_id INTEGER, body TEXT);"
        "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance REAL, status TEXT, touched_at TEXT);"
        "INSERT INTO users VALUES (1, 'ann'), (2, 'bob');")
    conn.executemany("INSERT INTO notes VALUES (?, ?, ?)", notes)
    conn.execute("INSERT INTO accounts VALUES (1, ?, ?, ?)", (balance, status, stamp))
    conn.commit()
    conn.close()
    return path


@pytest.fixture()
def states(tmp_path):
    s0 = make_db(tmp_path / "s0.db", [(1, 2, "old")], 80.0, "open", "t0")
    a = make_db(tmp_path / "a.db", [(1, 2, "old"), (2, 1, "hi")], 50.0, "closed", "t1")
    b = make_db(tmp_path / "b.db", [(1, 2, "old"), (2, 1, "hi")], 50.0, "closed", "t2")  # later replay: new stamp
    wrong = make_db(tmp_path / "w.db", [(1, 2, "old")], 65.0, "closed", "t3")
    return s0, a, b, wrong


def test_satisfaction_values():
    p = Predicate("c1", "SELECT 1", "distance", expected=50.0, initial_value=80.0, kind="scalar")
    assert phi_of_rows(p, [(80.0,)]) == pytest.approx(1e-6 / (30 + 1e-6))
    assert phi_of_rows(p, [(65.0,)]) == pytest.approx(1 - 15 / (30 + 1e-6))
    assert phi_of_rows(p, [(50.0,)]) == 1.0 and phi_of_rows(p, [(200.0,)]) == 0.0
    assert phi_of_rows(p, None) == 0.0 and phi_of_rows(p, [("x",)]) == 0.0
    assert phi_of_rows(Predicate("c", "s", "exists"), []) == 0.0
    assert phi_of_rows(Predicate("c", "s", "not_exists"), []) == 1.0
    assert phi_of_rows(Predicate("c", "s", "count_eq", 2), [(1,), (2,)]) == 1.0
    assert phi_of_rows(Predicate("c", "s", "count_gte", 3), [(1,), (2,)]) == 0.0
    assert phi_of_rows(Predicate("c", "s", "value_eq", "closed"), [("closed",)]) == 1.0
    assert phi_of_rows(Predicate("c", "s", "rows_equal", rows_digest([(2,), (1,)])), [(1,), (2,)]) == 1.0


def test_schema_is_validated_not_guessed():
    with pytest.raises(PredicateError, match="check"):
        Predicate.from_dict({"id": "c1", "sql": "SELECT 1", "check": "contains"})
    with pytest.raises(PredicateError, match="numeric"):
        Predicate.from_dict({"id": "c1", "sql": "SELECT 1", "check": "distance", "expected": "x"})
    with pytest.raises(PredicateError, match="integer"):
        Predicate.from_dict({"id": "c1", "sql": "SELECT 1", "check": "count_eq", "expected": 1.5})
    ok = Predicate.from_dict({"id": "c1", "sql": "SELECT 1", "check": "distance", "expected": 1, "initial_value": 0})
    assert ok.kind == "scalar"


def test_predicates_run_read_only_and_failures_are_unmet(states):
    s0 = states[0]
    bad = [Predicate("c1", "UPDATE accounts SET balance = 0", "exists"), Predicate("c2", "SELECT * FROM nope", "not_exists")]
    assert evaluate(s0, bad) == [0.0, 0.0]
    assert sqlite3.connect(s0).execute("SELECT balance FROM accounts").fetchone()[0] == 80.0


def test_predicate_sql_from_a_file_cannot_write_files_through_a_read_only_connection(states, tmp_path):
    """A read-only connection still lets ATTACH create a file and VACUUM INTO write a copy (issue 38)."""
    s0 = states[0]
    attached, copy = tmp_path / "attached.db", tmp_path / "copy.db"
    for sql in (f"ATTACH '{attached}' AS x", f"VACUUM INTO '{copy}'"):
        with pytest.raises(sqlite3.Error):
            run_query(s0, sql)
    assert evaluate(s0, [Predicate("c1", f"VACUUM INTO '{copy}'", "exists")]) == [0.0]
    assert not attached.exists() and not copy.exists()


def test_static_analysis():
    info = analyse(VERIFIER)
    assert info.function == "verify_task_completion" and info.uses_initial and info.uses_final
    assert not info.reads_final_answer
    assert any("FROM notes" in sql for _, sql in info.sql)
    assert {"notes", "users"} <= info.tables
    assert {"balance", "status", "body"} <= info.columns
    assert info.literal_checks["status"] == ["closed"]
    assert info.len_checks[".verify_task_completion:found"] == ("!=", 1)
    assert required_count("!=", 1) == ("count_eq", 1) and required_count("==", 0) == ("count_gte", 1)
    assert analyse("def f(:").syntax_error


def test_traced_run_extract_and_validate(states):
    s0, a, b, wrong = states
    info = analyse(VERIFIER)
    with VerifierSandbox() as sandbox:
        trace = traced_run(sandbox, VERIFIER, str(s0), str(a))
    assert trace.status == "ok" and trace.value == {"result": "complete"}
    roles = Counter(s["role"] for s in trace.statements)
    assert roles["initial"] == 1 and roles["final"] == 2
    assert any("user_id = 1 AND body = 'hi'" in s["sql"] for s in trace.statements)  # parameters bound
    candidates, dropped = extract(trace.statements, info, s0, a, b)
    progress, preservation = validate(candidates, s0, a, b, dropped)
    by_sql = {p.sql: p for p in progress}
    notes = next(p for p in progress if "FROM notes" in p.sql)
    assert notes.check == "count_eq" and notes.expected == 1  # the count the verifier demands
    bal = by_sql['SELECT "balance" FROM "accounts" WHERE "id" = 1']
    assert bal.check == "distance" and bal.expected == 50.0 and bal.initial_value == 80.0
    assert by_sql['SELECT "status" FROM "accounts" WHERE "id" = 1'].expected == "closed"
    assert not any("touched_at" in p.sql for p in progress)  # not named by the verifier; and volatile
    assert preservation == []
    assert [round(v, 3) for v in evaluate(wrong, progress)] == [0.0, 0.5, 1.0]


def test_without_a_solution_targets_come_from_states_the_verifier_accepts(states, tmp_path):
    """No replay: the goal-state search builds A and B from s0, and the same extraction runs on them."""
    s0, a_ref, _, wrong = states
    with VerifierSandbox() as sandbox:
        goal = search(sandbox, VERIFIER, s0, tmp_path / "goal")
        assert goal.accepting and goal.reason == ""
        a, b = goal.accepting
        for state in (a, b):
            assert sandbox.verify(VERIFIER, str(s0), str(state)).verdict == "complete"
        trace = traced_run(sandbox, VERIFIER, str(s0), str(a))
    candidates, dropped = extract(trace.statements, analyse(VERIFIER), s0, a, b, built=True)
    progress, _ = validate(candidates, s0, a, b, dropped)
    assert progress and evaluate(s0, progress) != [1.0] * len(progress)
    # the state a real solution leaves (never seen by the build) satisfies them; the wrong one does not
    assert evaluate(a_ref, progress) == [1.0] * len(progress)
    assert min(evaluate(wrong, progress)) < 1.0
    # every state the search vouches for: Phi = 1 exactly where the verifier accepts
    for state, verdict in goal.checked:
        assert (phi(state, progress) == 1.0) == (verdict == "complete"), (state, verdict)


@pytest.fixture(scope="module")
def bundled_records(tmp_path_factory):
    """library_lending_1 built through the runtime, with a scripted LLM adding one good and one bad predicate."""
    fake = FakeOpenAI()
    good = {"sql": "SELECT 1 FROM loans WHERE id = 1 AND renewals = 1", "check": "exists", "expected": None}
    bad = {"sql": "SELECT 1 FROM loans WHERE id = 1 AND renewals = 5", "check": "exists", "expected": None}
    fake.script("Piranesi", replies=[json.dumps([good, bad])])
    cache = tmp_path_factory.mktemp("pred-cache")

    async def run():
        llm = ChatClient(base_url=fake.base_url, model="fake", retries=0)
        with EnvRuntime(cache_dir=cache, num_workers=1) as rt:
            return await build(None, scenarios=["library_lending_1"], llm=llm, runtime=rt)

    try:
        yield asyncio.run(run())
    finally:
        fake.close()


def test_bundled_scenario_replay(bundled_records):
    sols = load_solutions()
    assert len(bundled_records) == 10
    for r in bundled_records:
        sol = sols[(r.scenario, r.task_idx)]
        assert r.task_type == sol.task_type
        assert r.replayed and r.replay_ok and r.verdict_reference == "complete"
        assert r.preservation  # the verifiers check that other tables stay as they were
        if sol.task_type == "state_mutating":
            assert r.predicates and r.phi_reference == 1.0 and r.phi_initial < 1.0
        else:
            assert r.predicates == []


def test_llm_predicates_pass_through_validation(bundled_records):
    r = next(r for r in bundled_records if r.task_idx == 4)
    llm = [p for p in r.predicates if p.source == "llm"]
    assert [p.sql for p in llm] == ["SELECT 1 FROM loans WHERE id = 1 AND renewals = 1"]
    assert r.dropped.get("false_on_reference", 0) >= 1


def test_jsonl_round_trip_and_coverage(bundled_records, tmp_path, capsys):
    path = tmp_path / "p.jsonl"
    write_predicates(bundled_records, path)
    again = read_predicates(path)
    assert [x.to_dict() for x in again] == [x.to_dict() for x in bundled_records]
    cov = coverage(again)
    n_mut = sum(r.task_type == "state_mutating" for r in again)
    assert cov["with_progress_predicate"]["with"] == n_mut and cov["reference_phi_is_1"]["share"] == 1.0
    assert main(["coverage", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["tasks"] == 10
    assert main(["coverage", str(path), "--per-task"]) == 0
    lines = capsys.readouterr().out.splitlines()
    per_task = [line for line in lines if line.startswith("library_lending_1/")]
    assert len(per_task) == 10 and all("reference_replay" in line for line in per_task)
    from awm.cli import main as awm_main  # the same command through `awm predicates ...`

    assert awm_main(["predicates", "coverage", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["progress_predicates"] == cov["progress_predicates"]
    path.write_text('{"scenario": "x", "task_idx": 0, "predicates": [{"id": "c1", "sql": "S", "check": "?"}]}\n')
    with pytest.raises(PredicateError, match="p.jsonl:1"):
        read_predicates(path)


def test_excerpt_gets_predicates_checked_against_the_verifier(excerpt_dir, cache_dir):
    """Real AWM-1K records without solutions: tasks 1 and 2 get validated predicates, task 0 (a verifier that
    rejects every final state, see the excerpt's README) none, with the reason stated."""
    async def run():
        with EnvRuntime(excerpt_dir, cache_dir=cache_dir, num_workers=1) as rt:
            return await build(str(excerpt_dir), runtime=rt)

    records = asyncio.run(run())
    assert [(r.scenario, r.task_idx) for r in records] == [("e_commerce_33", i) for i in range(3)]
    assert not any(r.replayed for r in records)
    none, reorder, wish = records
    assert none.predicates == [] and none.task_type == "ambiguous" and "further" in none.evidence
    for r in (reorder, wish):
        assert r.predicates and r.task_type == "state_mutating"
        assert r.validation["method"] == "verifier_states" and r.validation["agrees"] is True
        assert r.validation["accepted"] >= 1 and r.validation["rejected"] >= 1
        assert all(p.replay == "verifier_states" for p in r.predicates)
    assert any("Kitchen Upgrades 2025" in p.sql for p in wish.predicates)
    assert sum("wishlist_items" in p.sql for p in wish.predicates) == 3  # the three air fryers, row by row
    cov = coverage(records)
    assert cov["with_progress_predicate"]["with"] == 2 and cov["unreplayed_tasks"] == 3

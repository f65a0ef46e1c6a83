"""Task families and the practice set: every instance's reference solves it, the untouched DB does not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from awm.data import AWMDataset
from awm.scenarios import build, families
from awm.scenarios.library_lending_1 import scenario as library
from awm.solutions import load_solutions
from replay_helpers import replay_references


def test_fill_keeps_the_type_of_a_whole_slot_and_formats_the_rest():
    row = {"book_id": 8, "title": "Dune"}
    got = families.fill({"calls": [{"tool": "t", "arguments": {"book_id": "{book_id}", "q": "about {title}"}}],
                         "final_answer": "'{title}' is #{book_id}."}, row)
    assert got == {"calls": [{"tool": "t", "arguments": {"book_id": 8, "q": "about Dune"}}],
                   "final_answer": "'Dune' is #8."}


def test_bad_families_are_refused(tmp_path):
    db = families.initial_db(library, tmp_path / "lib.db")

    class Fake:
        NAME = "fake"
        FAMILIES = [{**library.FAMILIES[0], "slots": "SELECT title, author FROM books WHERE 0"}]

    with pytest.raises(ValueError, match="no slot rows"):
        families.expand(Fake, db)
    Fake.FAMILIES = [library.FAMILIES[0], library.FAMILIES[0]]
    with pytest.raises(ValueError, match="declared twice"):
        families.expand(Fake, db)
    Fake.FAMILIES = [{k: v for k, v in library.FAMILIES[0].items() if k != "check"}]
    with pytest.raises(ValueError, match="lacks check"):
        families.expand(Fake, db)


@pytest.fixture(scope="module")
def practice(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("practice")
    assert build.main(["--practice", str(out)]) == 0
    return out


def test_practice_set_keeps_the_hand_written_tasks_first(practice, cache_dir):
    ds = AWMDataset(practice, cache_dir=cache_dir)
    solutions = load_solutions(practice)
    bundled = load_solutions()
    for name in ds.scenario_names(runnable_only=True):
        tasks = ds.tasks(name)
        assert len(tasks) > 10 + 30, f"{name}: {len(tasks) - 10} family instances"
        for i in range(10):
            assert solutions[(name, i)] == bundled[(name, i)]
        assert all(solutions[(name, i)].family for i in range(10, len(tasks)))
    rows = [json.loads(line) for line in (practice / "gen_tasks.jsonl").read_text().splitlines()]
    lib = next(r for r in rows if r["scenario"] == library.NAME)
    assert lib["tasks"][:10] == [t["task"] for t in library.TASKS]


def test_every_family_instance_is_solved_by_its_reference_and_not_by_the_untouched_db(practice, cache_dir):
    solutions = {k: s for k, s in load_solutions(practice).items() if s.family}

    results = replay_references(practice, solutions, cache_dir)
    assert len(results) > 250
    assert not {k: r[2] for k, r in results.items() if r[2]}, "reference calls returned errors"
    assert [k for k, r in results.items() if r[0] != "complete"] == []
    mutating = [k for k in results if solutions[k].task_type == "state_mutating"]
    assert len(mutating) > 80 and [k for k in mutating if results[k][1] != "others"] == []


def test_testbed_only_families_stay_out_of_the_practice_set(practice):
    """The recovery testbed's companion families must not change the practice set's tasks (its split and figures)."""
    from awm.scenarios.online_grocery_1 import scenario as grocery

    marked = {f["family"] for f in grocery.FAMILIES if f.get("testbed_only")}
    assert marked == {"set_two_cart_quantities"}
    in_practice = {s.family for s in load_solutions(practice).values() if s.family}
    assert not in_practice & marked
    with_testbed = {t["family"] for t in families.expand_scenario(grocery, testbed=True)}
    assert marked <= with_testbed and with_testbed - marked == {t["family"] for t in families.expand_scenario(grocery)}

"""Renamed worlds: names replaced consistently, code constants kept, every instance still solvable."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from awm.scenarios import build, worlds
from awm.scenarios.library_lending_1 import scenario as library
from awm.scenarios.travel_booking_1 import scenario as travel
from awm.solutions import load_solutions
from replay_helpers import replay_references

LIBRARY_CODE = (Path(build.HERE) / "library_lending_1" / "app.py").read_text()
TRAVEL_CODE = (Path(build.HERE) / "travel_booking_1" / "app.py").read_text()


def literals(tables: list[dict]) -> list[str]:
    return [m.group(1) for t in tables for s in t["insert_statements"] for m in re.finditer(r"'((?:[^']|'')*)'", s)]


def test_names_are_renamed_consistently_and_code_constants_are_kept():
    tables, mapping = worlds.rename_sample(library.SAMPLE, LIBRARY_CODE, random.Random(0))
    before, after = literals(library.SAMPLE), literals(tables)
    assert len(before) == len(after)
    assert "Dune" in mapping and "Frank Herbert" in mapping and "Science Fiction" in mapping
    assert len(set(mapping.values())) == len(mapping)  # no two names merge
    for old, new in zip(before, after, strict=True):
        assert new == mapping.get(old, old)  # the same name becomes the same new name everywhere
    constants = worlds.code_strings(LIBRARY_CODE)
    assert "available" in constants and "available" in after  # enums the code compares with stay
    assert not any(old in constants for old in mapping)
    assert "Project Hail Mary" not in constants  # a schema example is documentation, not a constant
    assert worlds.rename_sample(library.SAMPLE, LIBRARY_CODE, random.Random(0))[1] == mapping  # seeded


def test_world_is_deterministic_and_has_no_hand_written_tasks():
    one, again = worlds.world(library, 1, code=LIBRARY_CODE), worlds.world(library, 1, code=LIBRARY_CODE)
    assert one.NAME == "library_lending_1_w1" and one.TASKS == [] and one.mapping == again.mapping
    assert one.mapping != worlds.world(library, 2, code=LIBRARY_CODE).mapping


def test_split_values_respects_quotes_and_calls():
    text = "1, 'Smith, Jane', datetime('now', '-2 days'), 'it''s, ok', 12.50"
    assert [v.strip() for v in worlds.split_values(text)] == [
        "1", "'Smith, Jane'", "datetime('now', '-2 days')", "'it''s, ok'", "12.50"]


def _numbers(tables: list[dict]) -> list[str]:
    """Every top-level value of every INSERT, in order."""
    return [v.strip() for t in tables for s in t["insert_statements"]
            for v in worlds.split_values(worlds._INSERT.match(s.strip()).group(4))]


def test_rescale_amounts_changes_real_columns_only_and_keeps_their_shape():
    assert worlds.amount_columns(travel.TABLES)["flights"] == {"base_fare"}
    assert worlds.amount_columns(travel.TABLES)["users"] == set()
    tables, changed = worlds.rescale_amounts(travel.SAMPLE, travel.TABLES, random.Random(0))
    before, after = _numbers(travel.SAMPLE), _numbers(tables)
    assert len(before) == len(after)
    diffs = [(b, a) for b, a in zip(before, after, strict=True) if b != a]
    assert len(diffs) == changed > 20
    for b, a in diffs:  # only plain numbers change, with the same decimals, by a factor in [0.5, 2]
        assert re.fullmatch(r"-?\d+\.\d+", b) and len(a.split(".")[1]) == len(b.split(".")[1])
        assert 0.5 - 0.01 <= float(a) / float(b) <= 2.0 + 0.01
    zero_fees = [s for s in travel.SAMPLE[3]["insert_statements"] if s.endswith(", 0.00);")]
    assert zero_fees and all(s in tables[3]["insert_statements"] for s in zero_fees)  # free stays free
    assert tables[0] == travel.SAMPLE[0]  # a table without amounts is untouched
    assert worlds.rescale_amounts(travel.SAMPLE, travel.TABLES, random.Random(0))[0] == tables  # seeded


def test_world_varies_amounts_only_when_asked():
    plain = worlds.world(travel, 1, code=TRAVEL_CODE)
    varied = worlds.world(travel, 1, code=TRAVEL_CODE, vary_amounts=True)
    assert plain.amounts == 0 and varied.amounts > 20 and plain.mapping == varied.mapping
    assert plain.SAMPLE[0] == varied.SAMPLE[0] and plain.SAMPLE[2] != varied.SAMPLE[2]


def test_vary_amounts_needs_worlds(tmp_path, capsys):
    with pytest.raises(SystemExit):
        build.main(["--practice", str(tmp_path), "--vary-amounts"])
    assert "--vary-amounts needs --worlds" in capsys.readouterr().err


@pytest.fixture(scope="module")
def practice_with_a_world(tmp_path_factory) -> Path:
    """One renamed world per scenario, amounts varied too (the replay below checks both at once)."""
    out = tmp_path_factory.mktemp("practice_worlds")
    assert build.main(["--practice", str(out), "--worlds", "1", "--vary-amounts"]) == 0
    return out


def test_every_world_instance_is_solved_by_its_reference_and_not_by_the_untouched_db(practice_with_a_world,
                                                                                   cache_dir):
    solutions = {k: s for k, s in load_solutions(practice_with_a_world).items() if s.world}
    names = {json.loads(line)["name"] for line in (practice_with_a_world / "gen_scenario.jsonl").read_text().splitlines()}
    assert {n for n in names if n.endswith("_w1")} == {f"{n}_w1" for n in build.scenario_names()}

    results = replay_references(practice_with_a_world, solutions, cache_dir)
    assert len(results) > 250
    assert not {k: r[2] for k, r in results.items() if r[2]}, "reference calls returned errors"
    assert [k for k, r in results.items() if r[0] != "complete"] == []
    mutating = [k for k in results if solutions[k].task_type == "state_mutating"]
    assert len(mutating) > 80 and [k for k in mutating if results[k][1] != "others"] == []
    renamed_tasks = sum("_w1" in k[0] and any(v in solutions[k].slots.values() for v in ("Dune", "Circe"))
                        for k in results)
    assert renamed_tasks == 0  # the real names are gone from the world's instances
    fares = {s.slots["flight_number"]: s.slots["base_fare"] for k, s in solutions.items()
             if s.family == "flight_base_fare"}
    assert fares and fares.get("NA 311") not in (None, 189.0)  # the world's own fare, read from its DB

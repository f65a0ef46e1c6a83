"""Renamed worlds: names replaced consistently, code constants kept, every instance still solvable."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from awm.scenarios import build, worlds
from awm.scenarios.library_lending_1 import scenario as library
from awm.solutions import load_solutions
from replay_helpers import replay_references

LIBRARY_CODE = (Path(build.HERE) / "library_lending_1" / "app.py").read_text()


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


@pytest.fixture(scope="module")
def practice_with_a_world(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("practice_worlds")
    assert build.main(["--practice", str(out), "--worlds", "1"]) == 0
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

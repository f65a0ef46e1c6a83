"""AWM-1K's content_platform_1 (real environment, schema, sample data and tasks, read in place from
../shared/awm_1k_excerpt) with pure-code verifiers and solutions of our own (tests/data/content_platform_1).

1. Each verifier rejects the untouched initial state, accepts the reference solution's final state and
   rejects the wrong solution's; other trajectories (tests/data/content_platform_1/variant_solutions.jsonl:
   detours, other orders, near misses) get the verdict recorded with them.
2. Progress predicates built WITHOUT the solutions (targets from states the verifier accepts) give Phi = 1
   on every held-out reference final state of a task that got predicates, Phi < 1 on the wrong one, and
   agree with the verifier on the variants' states except the documented disagreements.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from awm.database import backup, state_hash
from awm.episode import EnvRuntime
from awm.predicates.build import build, coverage
from awm.predicates.predicate import phi
from awm.solutions import load_solutions, replay
from awm1k_assembled import OURS, SCENARIO, assemble

# Measured 2026-11-28: 7 of the 8 tasks whose reference solution writes get progress predicates (task 6 gets
# none: the verifier finds the new video by its title, then its tags by the video's key, which the search
# made up; a state with another key is accepted too, so the tag predicates naming ours are dropped). A floor.
MIN_MUTATING_WITH_PREDICATES = 7
# (task_idx, variant name): states where Phi = 1 and the verdict disagree today, with why.
KNOWN_DISAGREEMENTS = {
    (3, "posted twice"):  # `len(matching) != 1`: the verifier rejects a duplicate, `exists` does not
        "exists where the verifier demands exactly one row",
    (5, "regional English code"):  # the verifier accepts any 'en-*' code (startswith), the predicate 'en' only
        "an exact-value target where the verifier tests a prefix in Python",
}


@pytest.fixture(scope="module")
def data_dirs(tmp_path_factory, excerpt_dir) -> tuple[Path, Path]:
    """(with held-out solutions, exactly as AWM-1K ships data: without them)."""
    root = tmp_path_factory.mktemp("awm1k")
    return (assemble(root / "with_solutions", excerpt=excerpt_dir),
            assemble(root / "as_shipped", solutions=False, excerpt=excerpt_dir))


def _variants() -> list[dict]:
    return [json.loads(line) for line in (OURS / "variant_solutions.jsonl").read_text(encoding="utf-8").splitlines()]


async def _final(rt: EnvRuntime, idx: int, calls: list[dict], answer: str | None, dest: Path | None = None,
                 tools: set[str] | None = None) -> tuple[str, list[str], Path | None]:
    """Replay `calls` on a fresh episode: (verdict, tool errors, a copy of the final DB at `dest`)."""
    async with await rt.open(SCENARIO, idx) as ep:
        if tools is not None:
            tools.update(t["name"] for t in ep.tools)
        errors = [f"{c['tool']}: {o.text[:120]}" for c, o in zip(calls, await replay(ep, calls), strict=True)
                  if o.is_error]
        if dest is not None:
            backup(ep.db_path, dest)
        return (await ep.verify(answer)).verdict, errors, dest


def test_verifiers_reject_s0_accept_the_reference_and_reject_the_wrong_solution(data_dirs, cache_dir):
    data, _ = data_dirs
    solutions = load_solutions(data)
    assert sorted(i for s, i in solutions if s == SCENARIO) == list(range(10))

    async def main() -> dict:
        out = {}
        with EnvRuntime(data, num_workers=1, cache_dir=cache_dir) as rt:
            assert rt.dataset.tasks(SCENARIO) == [row.task for row in
                                                  (rt.dataset.verifier(SCENARIO, i) for i in range(10))]
            for idx in range(10):
                sol, tools = solutions[(SCENARIO, idx)], set()
                s0, _, _ = await _final(rt, idx, [], None)
                ref, ref_errors, _ = await _final(rt, idx, sol.calls, sol.final_answer, tools=tools)
                wrong, wrong_errors, _ = await _final(rt, idx, sol.wrong_calls, sol.wrong_final_answer)
                used = {c["tool"] for c in sol.calls + sol.wrong_calls}
                out[idx] = (s0, ref, wrong, ref_errors + wrong_errors, sorted(used - tools))
        return out

    for idx, (s0, ref, wrong, errors, unknown) in asyncio.run(main()).items():
        assert not unknown, f"task {idx}: {unknown} are not tools of the real environment"
        assert not errors, f"task {idx}: tool calls failed: {errors}"
        assert (s0, ref, wrong) == ("others", "complete", "others"), f"task {idx}"


def test_variant_trajectories_get_the_verdict_recorded_with_them(data_dirs, cache_dir):
    data, _ = data_dirs

    async def main() -> list[tuple[dict, str, list[str]]]:
        with EnvRuntime(data, num_workers=1, cache_dir=cache_dir) as rt:
            return [(v, *(await _final(rt, v["task_idx"], v["calls"], v["final_answer"]))[:2]) for v in _variants()]

    results = asyncio.run(main())
    assert len(results) >= 15 and {v["verdict"] for v, _, _ in results} == {"complete", "others"}
    for v, verdict, errors in results:
        assert not errors, f"task {v['task_idx']} / {v['name']}: {errors}"
        assert verdict == v["verdict"], f"task {v['task_idx']} / {v['name']}"


def test_predicates_built_without_solutions_hold_on_the_held_out_solutions(data_dirs, cache_dir, tmp_path):
    with_solutions, as_shipped = data_dirs
    solutions = load_solutions(with_solutions)

    async def main() -> tuple[list, dict, list, str]:
        with EnvRuntime(as_shipped, num_workers=1, cache_dir=cache_dir) as rt:
            records = await build(str(as_shipped), runtime=rt, use_solutions=False)
            s0_hash = state_hash(rt.template(SCENARIO)[0])
            states: dict[int, tuple] = {}
            for rec in records:
                sol = solutions[(SCENARIO, rec.task_idx)]
                ref = await _final(rt, rec.task_idx, sol.calls, sol.final_answer, tmp_path / f"{rec.task_idx}-ref.db")
                wrong = await _final(rt, rec.task_idx, sol.wrong_calls, sol.wrong_final_answer,
                                     tmp_path / f"{rec.task_idx}-wrong.db")
                states[rec.task_idx] = (ref, wrong)
            variants = [(v, await _final(rt, v["task_idx"], v["calls"], v["final_answer"],
                                         tmp_path / f"{v['task_idx']}-v{n}.db")) for n, v in enumerate(_variants())]
            return records, states, variants, s0_hash

    records, states, variants, s0_hash = asyncio.run(main())
    assert len(records) == 10 and not any(rec.replayed for rec in records)  # nothing was replayed to build them
    by_idx = {rec.task_idx: rec for rec in records}
    mutating = [i for i, ((_, _, ref), _) in sorted(states.items()) if state_hash(ref) != s0_hash]  # truly writes
    covered = [i for i in mutating if by_idx[i].predicates]
    print(f"\ncontent_platform_1 without solutions: {len(covered)}/{len(mutating)} state-mutating tasks get "
          f"progress predicates ({covered}); coverage {coverage(records)['with_progress_predicate']}")
    assert len(covered) >= MIN_MUTATING_WITH_PREDICATES
    for i in covered:
        (ref_verdict, _, ref), (wrong_verdict, _, wrong) = states[i]
        assert ref_verdict == "complete" and wrong_verdict == "others"
        assert phi(ref, by_idx[i].predicates) == 1.0, f"task {i}: Phi < 1 on the held-out reference state"
        assert phi(wrong, by_idx[i].predicates) < 1.0, f"task {i}: Phi = 1 on the wrong solution's state"
    disagree = {}
    for v, (verdict, _, state) in variants:
        preds = by_idx[v["task_idx"]].predicates
        if preds and (phi(state, preds) == 1.0) != (verdict == "complete"):
            disagree[(v["task_idx"], v["name"])] = phi(state, preds)
    print("Phi disagrees with the verdict on variants:", disagree)
    new = set(disagree) - set(KNOWN_DISAGREEMENTS)
    assert not new, f"new disagreements between Phi = 1 and the verifier: {sorted(new)}"

"""The embedded default: six bundled scenarios, each task solved, untouched and done wrong."""

from __future__ import annotations

import asyncio

import pytest
from awm.data import AWMDataset, bundled_data_dir
from awm.episode import EnvRuntime
from awm.scenarios import build
from awm.solutions import load_probes, load_solutions, replay

SOLUTIONS = load_solutions()
PROBES = load_probes()


def test_bundled_data_is_built_from_sources():
    assert build.main(["--check"]) == 0, "run `python -m awm.scenarios.build`"


def test_bundled_scenarios_have_the_awm_shape(cache_dir):
    ds = AWMDataset(bundled_data_dir(), cache_dir=cache_dir)
    names = ds.scenario_names(runnable_only=True)
    assert len(names) >= 6
    for name in names:
        assert len(ds.tasks(name)) == 10
        kinds = [SOLUTIONS[(name, i)].task_type for i in range(10)]
        assert kinds.count("info_seeking") >= 2 and kinds.count("state_mutating") >= 5
        assert any(SOLUTIONS[(name, i)].repair for i in range(10)), f"{name} has no repair task"
    assert len(ds.task_keys()) == 10 * len(names)


@pytest.fixture(scope="module")
def verdicts(cache_dir):
    """For every task: verdicts of the reference solution, the untouched DB and the wrong solution."""

    async def run_one(rt: EnvRuntime, key: tuple[str, int]) -> tuple[dict, set, list]:
        sol = SOLUTIONS[key]
        out, called, server_errors = {}, set(), []
        for label, calls, answer in (("reference", sol.calls, sol.final_answer), ("untouched", [], None),
                                     ("untouched_empty", [], ""), ("wrong", sol.wrong_calls, sol.wrong_final_answer)):
            async with await rt.open(*key) as ep:
                for call, obs in zip(calls, await replay(ep, calls), strict=True):
                    called.add(call["tool"])
                    if obs.status is None or obs.status >= 500:
                        server_errors.append((key, label, call["tool"], obs.text[:200]))
                out[label] = (await ep.verify(answer)).verdict
        return out, called, server_errors

    async def probe(rt: EnvRuntime, scenario: str) -> tuple[set, list]:
        async with await rt.open(scenario) as ep:
            obs = await replay(ep, PROBES.get(scenario, []))
            return ({c["tool"] for c in PROBES.get(scenario, [])},
                    [(scenario, "probe", o.text[:200]) for o in obs if o.status is None or o.status >= 500])

    async def main():
        with EnvRuntime(num_workers=2, cache_dir=cache_dir) as rt:
            keys = sorted(SOLUTIONS)
            results = await asyncio.gather(*(run_one(rt, k) for k in keys))
            scenarios = sorted({k[0] for k in keys})
            probes = await asyncio.gather(*(probe(rt, s) for s in scenarios))
            tools = {s: {t["name"] for t in await rt.tools(s)} for s in scenarios}
        called = {s: set() for s in scenarios}
        errors = []
        for key, (_, c, e) in zip(keys, results, strict=True):
            called[key[0]] |= c
            errors += e
        for s, (c, e) in zip(scenarios, probes, strict=True):
            called[s] |= c
            errors += e
        return {k: r[0] for k, r in zip(keys, results, strict=True)}, called, tools, errors

    return asyncio.run(main())


def test_reference_solutions_are_complete(verdicts):
    bad = {k: v["reference"] for k, v in verdicts[0].items() if v["reference"] != "complete"}
    assert not bad


def test_untouched_db_is_not_complete(verdicts):
    bad = {k: (v["untouched"], v["untouched_empty"]) for k, v in verdicts[0].items()
           if (v["untouched"], v["untouched_empty"]) != ("others", "others")}
    assert not bad


def test_wrong_solutions_are_rejected(verdicts):
    bad = {k: v["wrong"] for k, v in verdicts[0].items() if v["wrong"] != "others"}
    assert not bad


def test_every_tool_is_called_without_server_errors(verdicts):
    _, called, tools, errors = verdicts
    assert not errors
    for scenario, names in tools.items():
        assert names - called[scenario] == set(), f"{scenario}: tools never called"

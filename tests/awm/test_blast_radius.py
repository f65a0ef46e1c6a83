"""One bad scenario or one bad call must not take the other episodes of its worker down.

Each test keeps bystander episodes open on the same worker (one worker per runtime) and checks
they still answer after the fault, and that the worker was not replaced when it need not be.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from awm.episode import EnvRuntime
from awm.runtime.pool import EnvLoadError, InfraError
from conftest import FAULT_APP, write_scenarios

EXTRA_ROUTES = """

LEAK = []


@app.get("/spin", operation_id="spin", summary="Spin in Python (async handler)")
async def spin():
    while True:
        try:
            pass
        except Exception:
            pass


@app.get("/spin_sync", operation_id="spin_sync", summary="Spin in Python (sync handler, thread pool)")
def spin_sync():
    n = 0
    while True:
        n += 1


class SlowToName(Exception):
    def __str__(self):  # runs in the server's own error handling, after the handler has failed
        while True:
            pass


@app.get("/slow_error", operation_id="slow_error", summary="Fail with an exception whose message never comes")
async def slow_error():
    raise SlowToName()


@app.get("/leak", operation_id="leak", summary="Keep memory in a module global")
async def leak(mb: int = 100):
    LEAK.append(bytearray(mb << 20))
    return {"held_mb": sum(len(b) for b in LEAK) >> 20}
"""

RECURSIVE_CTE = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"


@pytest.fixture(scope="module")
def blast_data_dir(tmp_path_factory: pytest.TempPathFactory):
    return write_scenarios(tmp_path_factory.mktemp("blast"), {
        "faults": FAULT_APP + EXTRA_ROUTES,
        "twin": FAULT_APP,
        "exit_at_import": "import os\nos._exit(3)\n",
        "hang_at_import": "import time\ntime.sleep(3600)\n",
    })


async def _alive(episodes) -> bool:
    for ep in episodes:
        if (await ep.call("list_notes", {})).is_error:
            return False
    return True


@pytest.mark.parametrize("scenario", ["exit_at_import", "hang_at_import"])
def test_scenario_that_kills_its_worker_at_import_is_refused_after_the_first_time(blast_data_dir, cache_dir,
                                                                                  scenario):
    async def main():
        with EnvRuntime(blast_data_dir, num_workers=1, cache_dir=cache_dir, load_timeout_s=2.0) as rt:
            first = [await rt.open("faults") for _ in range(4)]
            with pytest.raises(InfraError):  # the first import takes the worker and its episodes down
                await rt.open(scenario)
            assert rt.pool.restarts == 1
            bystanders = [await rt.open("faults") for _ in range(8)]
            for _ in range(3):
                t0 = time.monotonic()
                with pytest.raises(EnvLoadError, match=f"{scenario}.*took its worker down at import"):
                    await rt.open(scenario)
                assert time.monotonic() - t0 < 0.5  # refused at once, not retried for load_timeout_s
            assert rt.pool.restarts == 1
            assert await _alive(bystanders)
            return first

    asyncio.run(main())


def test_a_bystanders_crash_is_no_strike_against_a_loading_scenario(blast_data_dir, cache_dir):
    """The retry policy counts only the request that was running when the worker died."""
    async def main():
        with EnvRuntime(blast_data_dir, num_workers=1, cache_dir=cache_dir) as rt:
            ep = await rt.open("faults")
            rt.template("twin")  # built now, so the load below is sent without waiting
            crash = asyncio.ensure_future(ep.call("crash", {}))
            opener = asyncio.ensure_future(rt.open("twin"))  # its load queues behind the crash
            for fut in (crash, opener):
                with pytest.raises(InfraError):
                    await fut
            assert rt._load_strikes == {} and rt.pool.restarts == 1
            assert await _alive([await rt.open("twin")])

    asyncio.run(main())


@pytest.mark.parametrize("tool,arguments", [("run_sql", {"sql": RECURSIVE_CTE}), ("spin", {}), ("spin_sync", {}),
                                            ("slow_error", {})])
def test_slow_call_fails_alone_and_the_worker_survives(blast_data_dir, cache_dir, tool, arguments):
    async def main():
        with EnvRuntime(blast_data_dir, num_workers=1, cache_dir=cache_dir, call_timeout_s=2.0) as rt:
            bystanders = [await rt.open("faults") for _ in range(4)]
            ep = await rt.open("faults")
            t0 = time.monotonic()
            obs = await ep.call(tool, arguments)
            elapsed = time.monotonic() - t0
            assert obs.is_error and obs.status == 500, obs
            assert 1.5 <= elapsed < 2.0  # interrupted at the soft deadline (0.8 x call_timeout_s)
            assert rt.pool.restarts == 0
            assert await _alive(bystanders + [ep])  # the interrupted episode itself goes on too

    asyncio.run(main())


def test_leaking_worker_is_recycled_after_its_last_episode(blast_data_dir, cache_dir):
    async def main():
        with EnvRuntime(blast_data_dir, num_workers=1, cache_dir=cache_dir, worker_memory_limit_mb=300) as rt:
            leaker, bystander = await rt.open("faults"), await rt.open("faults")
            pid = rt.pool.slots[0].proc.pid
            for _ in range(3):
                assert not (await leaker.call("leak", {"mb": 100})).is_error
            await leaker.close()
            assert rt.pool.slots[0].draining and rt.pool.slots[0].proc.pid == pid  # bystander still open
            assert await _alive([bystander])
            await bystander.close()
            assert rt.pool.recycles == 1 and rt.pool.restarts == 0
            assert rt.pool.slots[0].proc.pid != pid
            fresh = await rt.open("faults")
            assert (await fresh.call("leak", {"mb": 1})).text.count('"held_mb": 1') == 1  # the leak is gone

    asyncio.run(main())

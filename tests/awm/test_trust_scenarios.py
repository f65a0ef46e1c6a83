"""Scenarios sharing one worker cannot reach each other through the process (issue 38).

Each test runs two scenarios in one worker (num_workers=1): a hostile one whose tool call changes
process-wide state during the call (not at import: import-time patches are refused already), and a
victim whose next call must not see the change. The hostile call itself fails (the worker names what it
changed) and its scenario is refused in that worker. Before `awm.runtime.isolation.ProcessGuard`, every
victim here saw the change: a lost write, a forged reply, another time zone, a timer signal, a thread
writing into its database.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import sqlite3

import pytest
from awm.episode import EnvRuntime
from awm.runtime.isolation import ProcessGuard, cancel_new_handles, loop_handles
from awm.runtime.pool import EnvLoadError, InfraError, WorkerRequestError
from conftest import FAULT_APP, write_scenarios

HOSTILE_ROUTES = '''

import signal, sqlite3 as raw_sqlite, threading


@app.post("/h/commit", operation_id="patch_commit", summary="Make every Session.commit a no-op")
def patch_commit():
    from sqlalchemy.orm import Session
    Session.commit = lambda self: None
    return {"patched": True}


@app.post("/h/render", operation_id="patch_render", summary="Forge every JSON reply")
def patch_render():
    from starlette.responses import JSONResponse
    JSONResponse.render = lambda self, content: b'{"notes": [{"id": 1, "text": "forged"}]}'
    return {"patched": True}


@app.post("/h/tz", operation_id="set_tz", summary="Move the process to another time zone")
def set_tz(sneaky: bool = False):
    before = os.environ.get("TZ")
    os.environ["TZ"] = "Etc/GMT-14"
    time.tzset()
    if sneaky:  # put TZ back: libc keeps the zone tzset() loaded
        if before is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = before
    return {"tz": time.strftime("%z")}


def _fire(signum, frame):
    raise RuntimeError("a timer armed by another scenario fired here")


@app.post("/h/timer", operation_id="arm_timer", summary="Arm a timer that fires after this call")
def arm_timer(alarm: bool = False):
    signal.signal(signal.SIGALRM, _fire)
    if alarm:
        signal.alarm(1)
    else:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
    return {"armed": True}


def _keep_writing():
    while True:
        time.sleep(0.01)
        try:
            conn = raw_sqlite.connect(os.environ["DATABASE_PATH"].removeprefix("sqlite:///"))
            conn.execute("INSERT INTO notes (text) VALUES ('written by a thread of another scenario')")
            conn.commit()
            conn.close()
        except Exception:
            pass


@app.post("/h/quote", operation_id="patch_quote", summary="Patch a library function off the hot path")
def patch_quote():
    import urllib.parse
    urllib.parse.quote = lambda text, *args, **kwargs: "forged"
    return {"patched": True}


@app.post("/h/limits", operation_id="set_limits", summary="Lower the open-file limit, trace every call")
def set_limits():
    import resource, sys
    tried = {}
    for name, fn in (("rlimit", lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (20, 20))),
                     ("trace", lambda: sys.settrace(lambda *a: None))):
        try:
            fn()
            tried[name] = "done"
        except Exception as exc:
            tried[name] = f"refused: {exc}"
    return tried


@app.post("/h/thread", operation_id="leave_thread", summary="Leave a thread running after the call")
def leave_thread():
    threading.Thread(target=_keep_writing, daemon=True).start()
    return {"started": True}


def _evil():
    time.time = lambda: 0.0
    os.environ["TZ"] = "Asia/Kathmandu"
    time.tzset()


@app.post("/h/later", operation_id="arm_later", summary="Leave a callback on the event loop, not a task")
async def arm_later(how: str = "call_later"):
    import asyncio
    loop = asyncio.get_running_loop()
    if how == "call_later":
        loop.call_later(0.3, _evil)
    else:  # a future of its own, completed by a timer: its done callback runs in whoever's call is on
        fut = loop.create_future()
        fut.add_done_callback(lambda f: _evil())
        loop.call_later(0.3, fut.set_result, None)
    return {"armed": how}


@app.post("/h/swap", operation_id="swap_module", summary="Replace the json module in sys.modules")
def swap_module():
    import json, sys, types
    fake = types.ModuleType("json")
    fake.__dict__.update(json.__dict__)
    fake.dumps = lambda *args, **kwargs: '"forged"'
    sys.modules["json"] = fake
    return {"swapped": True}


@app.post("/h/fresh", operation_id="patch_fresh", summary="First to import a library module, and patch it")
def patch_fresh():
    import graphlib
    graphlib.TopologicalSorter.static_order = lambda self: iter(["forged"])
    return {"patched": True}
'''

VICTIM_ROUTES = '''

@app.get("/quote", operation_id="quote", summary="URL-quote a text")
def quote(text: str = "a b"):
    import urllib.parse
    return {"quoted": urllib.parse.quote(text)}


@app.get("/clock", operation_id="clock", summary="Local time of the epoch")
def clock():
    t = time.localtime(0)
    return {"hour": t.tm_hour, "zone": time.strftime("%z", t)}


@app.get("/wait_clock", operation_id="wait_clock", summary="Wait, then read the clock and the zone")
async def wait_clock():
    import asyncio
    await asyncio.sleep(0.8)
    return {"late": time.time() < 1e9, "zone": time.strftime("%z", time.localtime(0))}


@app.get("/dump", operation_id="dump", summary="JSON-encode a value with the json module imported now")
def dump():
    import json as now_json
    return {"value": now_json.dumps({"a": 1})}


@app.get("/order", operation_id="order", summary="Order b after a")
def order():
    import graphlib
    return {"order": list(graphlib.TopologicalSorter({"b": {"a"}}).static_order())}
'''

# Loaded after the hostile scenario acted: what its import finds in sys.modules is what it keeps.
LATE_ROUTES = '''

import json as late_json
import statistics


@app.get("/late_dump", operation_id="late_dump", summary="JSON-encode a value")
def late_dump():
    return {"value": late_json.dumps({"a": 1})}


@app.get("/mean", operation_id="mean", summary="Mean of 1, 2, 3")
def mean():
    return {"mean": statistics.mean([1, 2, 3])}
'''

# The first to import `statistics` in the worker, and patches it in the same import.
PATCHER = '''
import statistics

statistics.mean = lambda data: "forged"
'''


@pytest.fixture(scope="module")
def trust_data_dir(tmp_path_factory: pytest.TempPathFactory):
    return write_scenarios(tmp_path_factory.mktemp("trust"), {"hostile": FAULT_APP + HOSTILE_ROUTES,
                                                              "victim": FAULT_APP + VICTIM_ROUTES,
                                                              "late": FAULT_APP + LATE_ROUTES,
                                                              "patcher": FAULT_APP + PATCHER})


async def _attack(ep, tool: str, args: dict | None = None) -> str:
    """The error the hostile call gets ('' if it went through): a failed request or an error observation."""
    try:
        obs = await ep.call(tool, args or {})
    except (WorkerRequestError, InfraError) as exc:
        return str(exc)
    return obs.text if obs.is_error else ""


def _rows(path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [r[0] for r in conn.execute("SELECT text FROM notes ORDER BY id")]
    finally:
        conn.close()


def _run(data_dir, cache_dir, body):
    async def main():
        with EnvRuntime(data_dir, num_workers=1, cache_dir=cache_dir) as rt:
            hostile, victim = await rt.open("hostile"), await rt.open("victim")
            assert hostile._slot is victim._slot  # one worker: the point of the test
            return await body(rt, hostile, victim)

    return asyncio.run(main())


def test_a_commit_patched_in_a_call_never_drops_another_scenarios_write(trust_data_dir, cache_dir):
    async def body(rt, hostile, victim):
        await _attack(hostile, "patch_commit")
        added = await victim.call("add_note", {"text": "victim's write"})
        return added, _rows(victim.db_path), await _attack(hostile, "list_notes")

    added, rows, later = _run(trust_data_dir, cache_dir, body)
    assert not added.is_error, added.text
    assert "victim's write" in rows  # on the unguarded worker the commit was a no-op: the write was lost
    assert "changed process-wide state" in later and "Session.commit" in later
    assert "refused" in later  # the hostile scenario gets no further calls in this worker


def test_b_render_patched_in_a_call_never_forges_another_scenarios_reply(trust_data_dir, cache_dir):
    async def body(rt, hostile, victim):
        await _attack(hostile, "patch_render")
        listed = await victim.call("list_notes", {})
        return await _attack(hostile, "list_notes"), listed

    error, listed = _run(trust_data_dir, cache_dir, body)
    assert [n["text"] for n in json.loads(listed.text)["notes"]] == ["call mom", "water plants"], listed.text
    assert "changed process-wide state" in error and "JSONResponse.render" in error


@pytest.mark.parametrize("sneaky", [False, True], ids=["tz-and-tzset", "tzset-then-tz-put-back"])
def test_c_time_zone_changed_in_a_call_never_moves_another_scenarios_clock(trust_data_dir, cache_dir, sneaky):
    async def body(rt, hostile, victim):
        before = json.loads((await victim.call("clock", {})).text)
        await _attack(hostile, "set_tz", {"sneaky": sneaky})
        after = json.loads((await victim.call("clock", {})).text)
        return before, await _attack(hostile, "list_notes"), after

    before, error, after = _run(trust_data_dir, cache_dir, body)
    assert after == before  # unguarded: the victim's epoch moved to 14:00 (+1400)
    assert "changed process-wide state" in error and "TZ" in error


@pytest.mark.parametrize("alarm", [False, True], ids=["setitimer", "alarm"])
def test_d_timer_armed_in_a_call_never_fires_in_another_scenario(trust_data_dir, cache_dir, alarm):
    async def body(rt, hostile, victim):
        await _attack(hostile, "arm_timer", {"alarm": alarm})
        slept = await victim.call("slow", {"seconds": 1.3 if alarm else 0.5})  # the timer would fire in here
        return await _attack(hostile, "list_notes"), slept

    error, slept = _run(trust_data_dir, cache_dir, body)
    assert not slept.is_error, slept.text  # unguarded: "a timer armed by another scenario fired here"
    assert "changed process-wide state" in error and "timer" in error


def test_e_thread_left_running_never_acts_during_another_scenarios_call(trust_data_dir, cache_dir):
    async def body(rt, hostile, victim):
        await _attack(hostile, "leave_thread")
        slept = await victim.call("slow", {"seconds": 0.3})  # the thread would write into the call's DB
        await asyncio.sleep(0.1)
        rows, listed = _rows(victim.db_path), await victim.call("list_notes", {})
        return await _attack(hostile, "list_notes"), slept, rows, listed

    error, slept, rows, listed = _run(trust_data_dir, cache_dir, body)
    assert not slept.is_error, slept.text
    assert not any("thread" in r for r in rows), rows  # unguarded: the thread wrote into the victim's DB
    assert not listed.is_error
    assert "changed process-wide state" in error and "thread" in error


def test_rlimits_and_trace_functions_cannot_be_set_in_a_call(trust_data_dir, cache_dir):
    async def body(rt, hostile, victim):
        await _attack(hostile, "set_limits")
        more = [await rt.open("victim") for _ in range(30)]  # each holds its DB open in the worker: 30+ fds
        listed = [await ep.call("list_notes", {}) for ep in more]
        return await _attack(hostile, "list_notes"), listed

    error, listed = _run(trust_data_dir, cache_dir, body)
    assert all(not o.is_error for o in listed), listed[-1].text  # unguarded: "unable to open database file"
    assert "changed process-wide state" in error and "resource.setrlimit" in error and "sys.settrace" in error


def test_a_patch_off_the_hot_path_is_undone_within_the_sweep_and_caught_at_once_the_next_time(trust_data_dir,
                                                                                               cache_dir):
    """`urllib.parse` is checked once per `sweep_every` requests (the documented window), not after every
    request: a first patch is undone by the sweep, blamed on no one if both scenarios ran since, and the
    namespace is checked at every scenario switch from then on, so the same patch again is undone before
    the victim's next request and the patcher is refused."""
    sweep = inspect.signature(ProcessGuard).parameters["sweep_every"].default

    async def body(rt, hostile, victim):
        first = await _attack(hostile, "patch_quote")
        for _ in range(sweep + 8):  # one whole sweep
            await victim.call("get_note", {"note_id": 1})
        swept = json.loads((await victim.call("quote", {})).text)
        await _attack(hostile, "patch_quote")
        after = json.loads((await victim.call("quote", {})).text)
        return first, swept, await _attack(hostile, "list_notes"), after

    first, swept, later, after = _run(trust_data_dir, cache_dir, body)
    assert swept == after == {"quoted": "a%20b"}  # unguarded: "forged" for good
    assert first == ""  # inside the window the first patch goes through
    assert "changed process-wide state" in later and "urllib.parse.quote" in later


@pytest.mark.parametrize("how", ["call_later", "future_done_callback"])
def test_f_a_loop_callback_left_by_a_call_never_runs_in_another_scenarios_call(trust_data_dir, cache_dir,
                                                                              how):
    """A callback a call leaves on the event loop (not a Task: `cancel_new_tasks` misses it) is cancelled
    when the call ends. Unguarded it fired 0.3 s later, inside the victim's call: the victim read a clock at
    0 and another zone, and the guard, seeing the change at the next switch, refused the victim."""
    async def body(rt, hostile, victim):
        before = json.loads((await victim.call("clock", {})).text)
        armed = await _attack(hostile, "arm_later", {"how": how})
        waited = await victim.call("wait_clock", {})  # the callback would fire in here
        after = await victim.call("clock", {})
        await asyncio.sleep(0.5)
        return before, armed, waited, after, await victim.call("list_notes", {})

    before, armed, waited, after, listed = _run(trust_data_dir, cache_dir, body)
    assert armed == ""
    assert not waited.is_error, waited.text
    assert json.loads(waited.text) == {"late": False, "zone": before["zone"]}, waited.text
    assert not after.is_error and json.loads(after.text) == before, after.text  # unguarded: refused
    assert not listed.is_error, listed.text


@pytest.mark.parametrize("when", ["imported-in-a-call", "imported-by-a-later-load"])
def test_g_a_sys_modules_entry_replaced_in_a_call_never_reaches_another_scenario(trust_data_dir, cache_dir,
                                                                                 when):
    """`sys.modules["json"] = fake` in a call: the entry is put back before another scenario runs (and
    before a load), the swapper refused. Unguarded, the victim's `import json` got the fake and its forged
    `dumps`."""
    async def body(rt, hostile, victim):
        await _attack(hostile, "swap_module")
        if when == "imported-in-a-call":
            out = await victim.call("dump", {})
        else:
            out = await (await rt.open("late")).call("late_dump", {})
        return out, await _attack(hostile, "list_notes")

    out, later = _run(trust_data_dir, cache_dir, body)
    assert not out.is_error and json.loads(out.text) == {"value": '{"a": 1}'}, out.text
    assert "changed process-wide state" in later and "sys.modules['json']" in later


def test_h_a_library_module_first_imported_and_patched_by_a_scenario_never_serves_another(trust_data_dir,
                                                                                          cache_dir):
    """A scenario whose import is the first to load `statistics` and patches it in the same import is
    refused, and the patched module is dropped: the next scenario to import it gets a clean copy.
    Unguarded, the guard took the patched module into its baseline after the load."""
    async def body(rt, hostile, victim):
        try:
            await rt.open("patcher")
            refused = ""
        except EnvLoadError as exc:
            refused = str(exc)
        return refused, await (await rt.open("late")).call("mean", {})

    refused, mean = _run(trust_data_dir, cache_dir, body)
    assert json.loads(mean.text) == {"mean": 2}, mean.text  # unguarded: "forged"
    assert "changed process-wide state" in refused and "statistics.mean" in refused


def test_i_a_library_module_first_imported_and_patched_in_a_call_never_serves_another(trust_data_dir,
                                                                                      cache_dir):
    """The same in a call: `graphlib` first imported by the hostile call, a method of its class patched: the
    module is dropped at the next switch (a module new in `sys.modules` is looked into), the patcher
    refused."""
    async def body(rt, hostile, victim):
        await _attack(hostile, "patch_fresh")
        return await victim.call("order", {}), await _attack(hostile, "list_notes")

    order, later = _run(trust_data_dir, cache_dir, body)
    assert not order.is_error, order.text
    assert json.loads(order.text) == {"order": ["a", "b"]}, order.text  # unguarded: ["forged"]
    assert "changed process-wide state" in later and "graphlib.TopologicalSorter.static_order" in later


def test_readers_and_writers_a_call_adds_to_the_loop_are_removed_and_the_loops_own_kept():
    """`loop.add_reader` / `add_writer` (on a new fd, or on one the loop already watches) left by a call: the
    worker's `cancel_new_handles` takes them off the real event loop, and leaves its self-pipe reader."""
    fired: list[str] = []

    async def main():
        loop = asyncio.get_running_loop()
        own = dict(loop._selector._fd_to_key)
        before = loop_handles(loop)
        r, w = os.pipe()
        loop.add_reader(r, fired.append, "reader")
        loop.add_writer(w, fired.append, "writer")
        self_pipe = next(iter(own))
        loop.add_writer(self_pipe, fired.append, "self-pipe writer")
        removed = cancel_new_handles(loop, before)
        os.write(w, b"x")
        await asyncio.sleep(0.05)
        loop.call_soon_threadsafe(fired.append, "wakeup")  # the self-pipe still wakes the loop
        await asyncio.sleep(0.05)
        after = dict(loop._selector._fd_to_key)
        os.close(r)
        os.close(w)
        return removed, own, after

    removed, own, after = asyncio.run(main())
    assert removed == 3 and fired == ["wakeup"], fired
    assert after.keys() == own.keys() and all(after[fd].data == own[fd].data for fd in own)


def test_a_clean_scenario_is_never_blamed(trust_data_dir, cache_dir):
    """Every tool of a well-behaved scenario, many times over, alongside another: no request is refused."""
    async def body(rt, hostile, victim):
        other = await rt.open("victim")
        outs = []
        for i in range(150):
            ep = victim if i % 2 else other
            outs.append(await ep.call(("add_note", "list_notes", "clock", "get_note")[i % 4],
                                      ({"text": f"n{i}"}, {}, {}, {"note_id": 1})[i % 4]))
        await victim.reset()
        outs.append(await victim.call("list_notes", {}))
        return outs

    outs = _run(trust_data_dir, cache_dir, body)
    assert all(not o.is_error for o in outs), [o.text for o in outs if o.is_error][:3]

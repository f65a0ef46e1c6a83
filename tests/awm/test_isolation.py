"""Episodes of one worker meet only through their own DB: module state, deferred tasks, raw SQLite
paths and library patches of one scenario never reach another episode (one worker per runtime)."""

from __future__ import annotations

import asyncio
import json
import sqlite3

import pytest
from awm.episode import EnvRuntime
from awm.runtime.isolation import module_state
from awm.runtime.pool import EnvLoadError
from conftest import FAULT_APP, write_scenarios

DEFERRING_ROUTES = """

import asyncio


async def _write_later(text):
    await asyncio.sleep(0.3)
    s = SessionLocal()
    s.add(Note(text=text))
    s.commit()
    s.close()


@app.post("/defer", operation_id="defer", summary="Write a note 0.3 s after answering")
async def defer(body: NoteIn):
    asyncio.get_running_loop().create_task(_write_later(body.text))
    return {"scheduled": True}


@app.get("/wait", operation_id="wait", summary="Await without blocking the worker")
async def wait(seconds: float = 0.6):
    await asyncio.sleep(seconds)
    return {"waited": seconds}
"""

STATEFUL_ROUTES = """

import sqlite3 as raw_sqlite
CALLS = {"n": 0}
hits = 0


@app.get("/count", operation_id="count", summary="Count calls in module state")
async def count():
    global hits
    hits += 1
    CALLS["n"] += 1
    return {"n": CALLS["n"], "hits": hits}


@app.post("/raw", operation_id="raw_insert", summary="Insert through a raw sqlite3 connection")
def raw_insert(body: NoteIn):
    conn = raw_sqlite.connect(os.environ["DATABASE_PATH"].removeprefix("sqlite:///"))
    conn.execute("INSERT INTO notes (text) VALUES (?)", (body.text,))
    conn.commit()
    conn.close()
    return {"ok": True}
"""

PATCHER = """
from sqlalchemy.orm import Session
from fastapi import FastAPI
Session.commit = lambda self: None  # every scenario's writes would vanish while tools answer ok
app = FastAPI()
"""


@pytest.fixture(scope="module")
def iso_data_dir(tmp_path_factory: pytest.TempPathFactory):
    return write_scenarios(tmp_path_factory.mktemp("iso"), {
        "stateful": FAULT_APP + STATEFUL_ROUTES, "deferring": FAULT_APP + DEFERRING_ROUTES, "plain": FAULT_APP,
        "patcher": PATCHER})


async def _texts(ep) -> list[str]:
    return [n["text"] for n in json.loads((await ep.call("list_notes", {})).text)["notes"]]


def test_module_state_is_per_episode_and_reset_with_it(iso_data_dir, cache_dir):
    async def main():
        with EnvRuntime(iso_data_dir, num_workers=1, cache_dir=cache_dir) as rt:
            a, b = await rt.open("stateful"), await rt.open("stateful")
            counts = [json.loads((await ep.call("count", {})).text) for ep in (a, b, a)]
            await a.reset()
            counts.append(json.loads((await a.call("count", {})).text))
            return counts

    assert asyncio.run(main()) == [{"n": 1, "hits": 1}, {"n": 1, "hits": 1}, {"n": 2, "hits": 2},
                                   {"n": 1, "hits": 1}]


def test_deferred_task_never_writes_into_another_episode(iso_data_dir, cache_dir):
    async def main():
        with EnvRuntime(iso_data_dir, num_workers=1, cache_dir=cache_dir) as rt:
            a, b = await rt.open("deferring"), await rt.open("deferring")  # one shared module (no module state)
            assert not (await a.call("defer", {"text": "from A, late"})).is_error
            await b.call("wait", {"seconds": 0.6})  # B's call is awaiting when A's task would write
            await asyncio.sleep(0.4)
            return await _texts(a), await _texts(b)

    a_notes, b_notes = asyncio.run(main())
    assert "from A, late" not in b_notes and "from A, late" not in a_notes  # cancelled at the end of A's call


def test_raw_sqlite_connect_reaches_the_episode_db_only(iso_data_dir, cache_dir):
    async def main():
        with EnvRuntime(iso_data_dir, num_workers=1, cache_dir=cache_dir) as rt:
            a, b = await rt.open("stateful"), await rt.open("stateful")
            assert not (await a.call("raw_insert", {"text": "raw A"})).is_error, "raw insert failed"
            return await _texts(a), await _texts(b), a.db_path

    a_notes, b_notes, a_path = asyncio.run(main())
    assert "raw A" in a_notes and "raw A" not in b_notes


def test_a_scenario_patching_shared_libraries_is_refused_and_others_keep_writing(iso_data_dir, cache_dir, tmp_path):
    async def main():
        with EnvRuntime(iso_data_dir, num_workers=1, cache_dir=cache_dir) as rt:
            with pytest.raises(EnvLoadError, match=r"patcher.*patches shared library code.*Session\.commit"):
                await rt.open("patcher")
            ep = await rt.open("plain")
            assert not (await ep.call("add_note", {"text": "kept"})).is_error
            conn = sqlite3.connect(ep.db_path)
            try:
                return [r[0] for r in conn.execute("SELECT text FROM notes")]
            finally:
                conn.close()

    assert "kept" in asyncio.run(main())


def test_module_state_detector():
    assert module_state(FAULT_APP) == []
    assert module_state(FAULT_APP + STATEFUL_ROUTES) == ["CALLS", "hits"]
    assert module_state(FAULT_APP + DEFERRING_ROUTES) == []
    assert module_state("import itertools\nIDS = itertools.count()\ndef f():\n    return next(IDS)\n") == ["IDS"]
    assert module_state("CACHE = {}\ndef f(k):\n    CACHE[k] = 1\n") == ["CACHE"]
    assert module_state("ROWS = []\ndef f():\n    return len(ROWS)\n") == []  # read only

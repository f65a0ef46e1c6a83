"""Bad input at the runtime's API is an observation or an infrastructure error, never another exception.

Issue 38's hostile tries, each through the real runtime (worker processes, the real app): arguments no
frame can carry, episode ids that name another episode's files, env code that turns its DB into a
directory, a FIFO or a planted link, and env code that holds a lock on its DB across a reset.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from awm.episode import EnvRuntime
from awm.runtime.pool import EnvLoadError, InfraError
from conftest import FAULT_APP, write_scenarios

# Generated-code style: a notes app whose extra routes do to the DB what env code can do in its worker dir.
HOSTILE_APP = r'''
import os, sqlite3
from fastapi import FastAPI
from pydantic import BaseModel
from sqlalchemy import Column, Integer, String, create_engine, func
from sqlalchemy.orm import declarative_base, sessionmaker

DATABASE_PATH = os.getenv("DATABASE_PATH", "sqlite:///notes.db")
engine = create_engine(DATABASE_PATH)
SessionLocal = sessionmaker(bind=engine)
Base = declarative_base()
HELD = []  # raw connections this code keeps open across calls


class Note(Base):
    __tablename__ = "notes"
    id = Column(Integer, primary_key=True)
    text = Column(String, nullable=False)


app = FastAPI(title="hostile")


class NoteIn(BaseModel):
    text: str


@app.post("/notes", operation_id="add_note", summary="Add a note")
def add_note(body: NoteIn):
    s = SessionLocal()
    s.add(Note(text=body.text))
    s.commit()
    s.close()
    return {"ok": True}


@app.get("/notes", operation_id="count_notes", summary="Count notes")
def count_notes(q: str = ""):
    s = SessionLocal()
    n = s.query(func.count(Note.id)).filter(Note.text.like(f"%{q}%")).scalar()
    s.close()
    return {"count": n}


def _db_file():
    raw = sqlite3.connect(DATABASE_PATH.removeprefix("sqlite:///"))  # the runtime routes it to this call's DB
    path = raw.execute("PRAGMA database_list").fetchone()[2]
    raw.close()
    return path


@app.post("/lock", operation_id="hold_lock", summary="Keep an exclusive lock on the DB after the call")
def hold_lock():
    raw = sqlite3.connect(DATABASE_PATH.removeprefix("sqlite:///"), timeout=0)
    raw.execute("BEGIN EXCLUSIVE")
    raw.execute("INSERT INTO notes (text) VALUES ('uncommitted')")
    HELD.append(raw)
    return {"held": len(HELD)}


@app.post("/fill", operation_id="fill_up", summary="Write until SQLite finds no room, as on a full /dev/shm")
def fill_up():
    raw = sqlite3.connect(DATABASE_PATH.removeprefix("sqlite:///"))
    pages = raw.execute("PRAGMA page_count").fetchone()[0]
    raw.execute(f"PRAGMA max_page_count = {pages}")  # SQLITE_FULL, the error a full file system gives
    try:
        raw.execute("INSERT INTO notes (text) VALUES (?)", ("x" * 100_000,))
        raw.commit()
    finally:
        raw.close()
    return {"ok": True}


@app.post("/wal", operation_id="use_wal", summary="Switch the DB to WAL mode, as some generated code does")
def use_wal():
    raw = sqlite3.connect(DATABASE_PATH.removeprefix("sqlite:///"))
    mode = raw.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    raw.close()
    return {"mode": mode}


@app.post("/vandalize", operation_id="vandalize", summary="Replace the DB file with something else")
def vandalize(kind: str):
    path = _db_file()
    os.remove(path)
    if kind == "directory":
        os.mkdir(path)
        os.mkdir(path + "-journal")
        with open(os.path.join(path, "inside"), "w") as f:
            f.write("x")
    elif kind == "fifo":
        os.mkfifo(path)
    return {"path": path}


@app.post("/plant", operation_id="plant_links", summary="Plant links at file names the trainer may write next")
def plant(target: str, names: str):
    planted = 0
    for name in names.split(","):
        try:
            os.symlink(target, os.path.join(os.path.dirname(_db_file()), name))
            planted += 1
        except FileExistsError:
            pass
    return {"planted": planted}
'''


# Module state (SEEN) gives each episode its own import of the code at open; this code imports once only.
IMPORTS_ONCE_APP = r'''
import os
from fastapi import FastAPI

SEEN = []
if os.path.exists("imported-once"):
    raise RuntimeError("this code imports only once per worker")
open("imported-once", "w").close()
app = FastAPI(title="imports once")


@app.post("/see", operation_id="see", summary="Remember a call")
def see():
    SEEN.append(1)
    return {"seen": len(SEEN)}
'''


@pytest.fixture(scope="module")
def hostile_dir(tmp_path_factory: pytest.TempPathFactory):
    return write_scenarios(tmp_path_factory.mktemp("trust-inputs"), {"hostile": HOSTILE_APP,
                                                                     "imports_once": IMPORTS_ONCE_APP})


async def _count(ep) -> int:
    obs = await ep.call("count_notes", {})
    assert not obs.is_error, obs.text
    return json.loads(obs.text)["count"]


def test_arguments_no_frame_can_carry_are_observations(hostile_dir, cache_dir):
    """A lone surrogate (the JSON escape "\\ud800") and nesting past JSON's recursion limit used to raise
    WorkerRequestError out of `Episode.call`; a non-text tool name is answered too."""
    deep: object = "x"
    for _ in range(5000):
        deep = [deep]

    async def main():
        with EnvRuntime(hostile_dir, num_workers=1, cache_dir=cache_dir) as rt:
            ep = await rt.open("hostile", 0)
            results = [await ep.call("count_notes", {"q": "\ud800"}),  # a query parameter: UTF-8 in the URL
                       await ep.call("count_notes", {"q": deep}),
                       await ep.call("add_note", {"text": "x", "extra": deep}),
                       await ep.call("\ud800", {}),
                       await ep.call(["not", "a", "name"], {})]
            after = await _count(ep)
            return results, after, ep.infra_error, rt.pool.restarts

    results, after, infra_error, restarts = asyncio.run(main())
    kinds = [(o.is_error, o.kind) for o in results]
    # a lone surrogate cannot be framed (strict UTF-8 JSON, awm.runtime.wire): refused before it is sent, in
    # the arguments or in the tool name alike
    assert kinds == [(True, "invalid_arguments")] * 4 + [(True, "unknown_tool")], results
    assert "cannot be sent" in results[0].text and "cannot be sent" in results[2].text
    for obs in results:
        obs.text.encode("utf-8")  # valid text for the tokenizer: the surrogate is shown escaped
    assert after == 2 and infra_error is None and restarts == 0


def test_episode_ids_never_name_each_others_files(hostile_dir, cache_dir):
    """An id equal to another episode's snapshot stem ("a.snap0") overwrote that snapshot, or the live DB
    of an episode named "b.snap0" was overwritten by b's snapshot; closing one deleted the other's file."""
    async def main():
        with EnvRuntime(hostile_dir, num_workers=1, cache_dir=cache_dir) as rt:
            a = await rt.open("hostile", 0, episode_id="a")
            await a.call("add_note", {"text": "a1"})
            snap = await a.snapshot()
            await a.call("add_note", {"text": "a2"})
            a_snap0 = await rt.open("hostile", 0, episode_id="a.snap0")
            await a_snap0.close()
            await a.restore(snap)
            restored = await _count(a)

            b_snap0 = await rt.open("hostile", 0, episode_id="b.snap0")
            await b_snap0.call("add_note", {"text": "b.snap0's own"})
            b = await rt.open("hostile", 0, episode_id="b")
            await b.snapshot()
            await b.close()
            live = await _count(b_snap0)
            files = {p.name for p in a.db_path.parent.iterdir() if p.is_file()}
            return restored, live, files, a, b_snap0

    restored, live, files, a, b_snap0 = asyncio.run(main())
    assert restored == 3 and live == 3
    assert a.db_path.name in files and b_snap0.db_path.name in files and a.db_path != b_snap0.db_path


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_db_replaced_by_env_code_never_makes_close_raise(hostile_dir, cache_dir, kind):
    """A DB replaced by a directory made `Episode.close()` raise IsADirectoryError (out of the rollout's
    `finally`); a FIFO in its place would block whoever opens it. Close removes whatever is there. (Landlock
    refuses a FIFO in the worker's dir, so that case runs without the lockdown: kernels without Landlock.)"""
    async def main():
        with EnvRuntime(hostile_dir, num_workers=1, cache_dir=cache_dir, sandbox_workers=kind != "fifo") as rt:
            ep = await rt.open("hostile", 0)
            await ep.call("vandalize", {"kind": kind})
            await ep.close()
            left = sorted(p.name for p in ep.db_path.parent.iterdir() if p.name.startswith(ep.db_path.stem))
            other = await rt.open("hostile", 0)
            return left, await _count(other)

    left, count = asyncio.run(main())
    assert left == [] and count == 2


def test_reset_and_load_state_do_not_wait_for_a_lock_env_code_holds(hostile_dir, cache_dir, tmp_path):
    """A raw connection of env code holding BEGIN EXCLUSIVE made reset wait for the call deadline; then the
    worker was killed and its bystander episodes failed. Reset now replaces the file instead of waiting."""
    async def main():
        with EnvRuntime(hostile_dir, num_workers=1, cache_dir=cache_dir, call_timeout_s=4.0) as rt:
            bystanders = [await rt.open("hostile", 0) for _ in range(3)]
            ep = await rt.open("hostile", 0)
            await ep.call("add_note", {"text": "before"})
            await ep.call("hold_lock", {})
            started = time.monotonic()
            await ep.reset()
            reset_s = time.monotonic() - started
            after_reset = await _count(ep)
            await ep.call("add_note", {"text": "after"})
            await ep.call("hold_lock", {})
            saved = tmp_path / "state.db"
            saved.write_bytes(ep.initial_db.read_bytes())
            await ep.load_state(saved)
            after_load = await _count(ep)
            counts = [await _count(b) for b in bystanders]
            return reset_s, after_reset, after_load, counts, rt.pool.restarts, ep.infra_error

    reset_s, after_reset, after_load, counts, restarts, infra_error = asyncio.run(main())
    assert reset_s < 2.0 and after_reset == 2 and after_load == 2
    assert counts == [2, 2, 2] and restarts == 0 and infra_error is None


def test_the_trainer_never_writes_through_a_link_env_code_planted(hostile_dir, cache_dir, tmp_path):
    """The trainer copies the template (open) and state files (load_state) into the worker's directory; a
    link planted at that name made it overwrite the link's target, a file of the trainer's choosing.
    Landlock refuses links in the worker's dir; this runs without the lockdown (kernels without Landlock):
    the trainer side must hold on its own."""
    target = tmp_path / "trainer-file.txt"
    target.write_text("the trainer's own data")
    saved = tmp_path / "state.db"

    async def main():
        with EnvRuntime(hostile_dir, num_workers=1, cache_dir=cache_dir, sandbox_workers=False) as rt:
            ep = await rt.open("hostile", 0, episode_id="planter")
            saved.write_bytes(ep.initial_db.read_bytes())
            names = ["victim.db", "planter.load.db"] + [f"{n}-victim.db" for n in range(20)] \
                + [f"{ep.db_path.name}.new"]
            planted = await ep.call("plant_links", {"target": str(target), "names": ",".join(names)})
            assert not planted.is_error, planted.text
            victim = await rt.open("hostile", 0, episode_id="victim")
            await ep.load_state(saved)
            await ep.reset()
            return await _count(victim), await _count(ep)

    counts = asyncio.run(main())
    assert target.read_bytes() == b"the trainer's own data" and counts == (2, 2)


def test_a_closed_or_failed_episode_refuses_calls_as_before(hostile_dir, cache_dir):
    """The call path's checks stay: a closed episode raises RuntimeError, a failed one InfraError."""
    async def main():
        with EnvRuntime(hostile_dir, num_workers=1, cache_dir=cache_dir) as rt:
            ep = await rt.open("hostile", 0)
            await ep.close()
            with pytest.raises(RuntimeError, match="closed"):
                await ep.call("count_notes", {})
            failed = await rt.open("hostile", 0)
            failed.infra_error = "its worker died"
            with pytest.raises(InfraError):
                await failed.call("count_notes", {})

    asyncio.run(main())


def test_snapshot_and_restore_do_not_wait_for_a_lock_env_code_holds(hostile_dir, cache_dir):
    """Snapshot and restore copy pages through SQLite's backup API, whose Python loop retries a busy step for
    ever: behind a lock env code keeps, the request ran into its deadline and the worker (with 3 bystander
    episodes) was killed. Now a restore replaces the file, as a reset does, and a snapshot that cannot read
    the DB fails that episode alone (an infrastructure error), at once."""
    async def main():
        with EnvRuntime(hostile_dir, num_workers=1, cache_dir=cache_dir, call_timeout_s=4.0) as rt:
            bystanders = [await rt.open("hostile", 0) for _ in range(3)]
            ep = await rt.open("hostile", 0)
            await ep.call("add_note", {"text": "kept"})
            snap = await ep.snapshot()
            await ep.call("hold_lock", {})
            started = time.monotonic()
            await ep.restore(snap)
            restore_s = time.monotonic() - started
            restored = await _count(ep)
            await ep.call("hold_lock", {})
            started = time.monotonic()
            with pytest.raises(InfraError, match="lock"):
                await ep.snapshot()
            snapshot_s = time.monotonic() - started
            counts = [await _count(b) for b in bystanders]
            return restore_s, restored, snapshot_s, ep.infra_error, counts, rt.pool.restarts

    restore_s, restored, snapshot_s, infra_error, counts, restarts = asyncio.run(main())
    assert restore_s < 2.0 and restored == 3 and snapshot_s < 1.0 and "lock" in infra_error
    assert counts == [2, 2, 2] and restarts == 0


def test_a_wal_mode_db_still_snapshots_restores_and_resets(hostile_dir, cache_dir):
    """Generated code may switch its DB to WAL, where the worker's own connection keeps a shared lock: the
    checks for a lock env code keeps must not refuse such an episode."""
    async def main():
        with EnvRuntime(hostile_dir, num_workers=1, cache_dir=cache_dir) as rt:
            ep = await rt.open("hostile", 0)
            assert json.loads((await ep.call("use_wal", {})).text) == {"mode": "wal"}
            await ep.call("add_note", {"text": "one"})
            snap = await ep.snapshot()
            await ep.call("add_note", {"text": "two"})
            await ep.restore(snap)
            restored = await _count(ep)
            await ep.reset()
            return restored, await _count(ep), ep.infra_error

    assert asyncio.run(main()) == (3, 2, None)


def test_an_episode_the_worker_cannot_open_is_an_infra_error(hostile_dir, cache_dir):
    """Env code that imports at load but fails in the episode's own import (module state) made `open` raise
    WorkerRequestError, which `awm_grpo`'s `open_env` does not take for an infrastructure failure."""
    async def main():
        with EnvRuntime(hostile_dir, num_workers=1, cache_dir=cache_dir) as rt:
            with pytest.raises(EnvLoadError, match="imports only once"):
                await rt.open("imports_once", 0)
            other = await rt.open("hostile", 0)
            return await _count(other), rt.pool.slots[0].episodes

    count, open_episodes = asyncio.run(main())
    assert count == 2 and len(open_episodes) == 1


def test_a_write_that_finds_no_room_is_an_infra_error_not_the_agents_error(hostile_dir, cache_dir):
    """Episode DBs share one file system (/dev/shm): once one call filled it, every episode's writes failed
    with "database or disk is full", and those came back as HTTP 500 observations, the agent's fault.
    SQLITE_FULL here comes from `max_page_count`, the same error a full file system gives."""
    async def main():
        with EnvRuntime(hostile_dir, num_workers=1, cache_dir=cache_dir) as rt:
            ep, other = await rt.open("hostile", 0), await rt.open("hostile", 0)
            before = await _count(other)
            try:
                await ep.call("fill_up", {})
            except InfraError as exc:
                return str(exc), before == await _count(other), rt.pool.restarts
            return None, None, rt.pool.restarts

    error, others_intact, restarts = asyncio.run(main())
    assert error is not None and "database or disk is full" in error, error
    assert others_intact and restarts == 0  # the worker and its other episodes go on


FORGED_LOAD_REPLY = r'''
import json as _j, mmap as _m, struct as _s, sys as _y, os as _o
_rec = _m.mmap(_j.loads(_y.argv[2])["progress_fd"], 16)
_rid, _ = _s.unpack_from("<QQ", _rec, 0)  # the id of this load request, from the pool's hint record
_body = _j.dumps([_rid, True, PAYLOAD]).encode()
_o.write(int(_y.argv[1]), _s.pack(">I", len(_body)) + _body)  # the worker's socket, inherited
'''
FORGED_PAYLOADS = {"list": "[1, 2, 3]", "null": "None", "no_keys": "{}", "sql_text": "{'created_sql': 'x', 'tools': []}",
                   "sql_dicts": "{'created_sql': [{'a': 1}], 'tools': []}",
                   "tools_text": "{'created_sql': [], 'tools': 'abc'}",
                   "tool_missing_fields": "{'created_sql': [], 'tools': [{'name': 'x'}]}",
                   "tool_wrong_types": "{'created_sql': [], 'tools': [{'name': 1, 'description': '', 'input_schema': "
                                       "{}, 'method': 'GET', 'path': '/', 'path_params': [], 'query_params': [], "
                                       "'body_params': []}]}"}


@pytest.mark.parametrize("payload", FORGED_PAYLOADS, ids=list(FORGED_PAYLOADS))
def test_a_load_reply_env_code_forged_is_an_infra_error_and_a_strike(tmp_path, payload):
    """Env code answers its own load (in order, so the pool's order check passes) with a result of another
    shape: TypeError/KeyError escaped `EnvRuntime.open`. Now the load is an InfraError, the worker is killed
    and the scenario struck (its load ran alone in the worker, so its code wrote the reply)."""
    code = FAULT_APP + FORGED_LOAD_REPLY.replace("PAYLOAD", FORGED_PAYLOADS[payload])
    data = write_scenarios(tmp_path / "data", {"forger": code})

    async def main():
        with EnvRuntime(data, num_workers=1, cache_dir=tmp_path / "cache") as rt:
            with pytest.raises(InfraError, match="not a load reply"):
                await rt.open("forger")
            with pytest.raises(EnvLoadError, match="refused"):
                await rt.open("forger")
            return rt.pool.restarts

    assert asyncio.run(main()) == 1


BLAME_SHIFTER = r'''
import json as _j, mmap as _m, struct as _s, sys as _y, os as _o, time as _t
_rec = _m.mmap(_j.loads(_y.argv[2])["progress_fd"], 16)
_rid, _ = _s.unpack_from("<QQ", _rec, 0)
_body = _j.dumps([_rid, True, {"created_sql": [], "tools": []}]).encode()
_o.write(int(_y.argv[1]), _s.pack(">I", len(_body)) + _body)  # "loaded": the pool sends the next load
_t.sleep(1.5)
_o._exit(3)  # ... during which this worker dies
'''


def test_a_forged_load_end_cannot_shift_an_import_crash_onto_the_next_scenario(tmp_path):
    """Env code answers its own load in order at the start of its import, so the pool sends the next
    scenario's load into the same worker; then it kills the worker. The innocent load was the one running:
    it was struck and refused for the runtime's life. A strike now needs the crash again in a worker of its
    own, where the innocent loads fine. (The forger's own load "succeeded": its episodes die with each worker
    it kills, as a call that crashes its worker does.)"""
    data = write_scenarios(tmp_path / "data", {"forger": BLAME_SHIFTER + FAULT_APP, "innocent": FAULT_APP})

    async def main():
        with EnvRuntime(data, num_workers=1, cache_dir=tmp_path / "cache") as rt:
            rt.template("innocent")
            rt.template("forger")
            first = await asyncio.gather(rt.open("forger"), rt.open("innocent"), return_exceptions=True)
            innocent = await rt.open("innocent")  # refused here before
            listed = await innocent.call("list_notes", {})
            return first, listed, dict(rt._load_strikes)

    first, listed, strikes = asyncio.run(main())
    assert isinstance(first[1], InfraError) and first[1].culprit, first  # it was running when the worker died
    assert not listed.is_error and "innocent" not in strikes

"""Direct dispatch answers exactly as the ASGI path: every tool of every bundled and excerpt scenario.

`dispatch_twin.py` (a separate process, as a worker is) calls each tool both ways on identical
fresh DB copies with valid arguments (health probes, reference solutions, tool probes) and with
invalid ones (a missing required argument, wrong types, an unknown argument, odd path values), and
compares status, body bytes, the server error's first line and the resulting DB state.
"""

from __future__ import annotations

import asyncio
import collections
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from awm.data import AWMDataset, bundled_data_dir
from awm.episode import EnvRuntime
from awm.runtime.dispatch import Dispatcher
from awm.tools import HttpRequest
from conftest import FAULT_APP, write_scenarios
from fastapi import FastAPI
from fastapi.routing import APIRoute

TWIN = Path(__file__).with_name("dispatch_twin.py")

# Routes that exercise what the direct path serves and what must fall back to ASGI.
FEATURE_APP = FAULT_APP.replace('app = FastAPI(title="faults")', 'app = FastAPI(title="features")') + '''
from typing import List, Optional
from fastapi import BackgroundTasks, Depends, Path, Query, Request, Response
from fastapi.responses import PlainTextResponse, StreamingResponse


class Item(BaseModel):
    id: int
    text: str
    note: Optional[str] = None


def current_user():
    return "ann"


@app.get("/items/special", operation_id="special_item")
async def special_item():
    return {"special": True}


@app.get("/items/{item_id}", operation_id="get_item", response_model=Item, response_model_exclude_none=True)
async def get_item(item_id: int = Path(..., ge=1)):
    if item_id > 100:
        raise HTTPException(status_code=404, detail={"missing": item_id}, headers={"X-Why": "absent"})
    return {"id": item_id, "text": "hello", "note": None}


@app.post("/items", operation_id="create_item", status_code=201)
def create_item(item: Item, tags: List[str] = Query([])):
    s = SessionLocal()
    s.add(Note(text=item.text))
    s.commit()
    s.close()
    return {"item": item, "tags": tags}


@app.delete("/items/{item_id}", operation_id="delete_item", status_code=204)
async def delete_item(item_id: int):
    return None


def get_session():
    s = SessionLocal()
    try:
        yield s
    finally:
        s.close()


def swallow():
    try:
        yield 1
    except Exception:
        pass


@app.get("/dep_notes/{note_id}", operation_id="get_note_with_dependency")
def get_note_with_dependency(note_id: int, s=Depends(get_session), user: str = Depends(current_user)):
    n = s.get(Note, note_id)
    if n is None:
        raise HTTPException(status_code=404, detail="no such note")
    return {"id": n.id, "text": n.text, "user": user}


@app.post("/dep_notes", operation_id="add_note_with_dependency")
async def add_note_with_dependency(body: NoteIn, s=Depends(get_session)):
    s.add(Note(text=body.text))
    s.commit()
    return {"ok": True}


@app.get("/swallowed", operation_id="swallowed")
async def swallowed(x: int = Depends(swallow)):
    raise RuntimeError("the dependency swallows this")


@app.get("/whoami", operation_id="whoami")
async def whoami(user: str = Depends(current_user)):
    return {"user": user}


@app.get("/agent", operation_id="agent")
async def agent(request: Request):
    return {"host": request.headers.get("host")}


@app.get("/plain", operation_id="plain", response_class=PlainTextResponse)
async def plain(word: str = "hi"):
    return word * 2


@app.get("/stream", operation_id="stream")
async def stream():
    return StreamingResponse(iter([b"a", b"b"]), media_type="text/plain")


@app.post("/later", operation_id="later")
async def later(background: BackgroundTasks, text: str = "x"):
    background.add_task(lambda: None)
    return {"queued": text}


@app.get("/raw", operation_id="raw")
async def raw(code: int = 200):
    return Response(content=b"raw bytes", status_code=code)


@app.get("/bad_response", operation_id="bad_response", response_model=Item)
async def bad_response():
    return {"id": "not an int"}


@app.get("/flags", operation_id="flags")
async def flags(on: bool = False, ids: List[int] = Query([]), when: Optional[str] = None):
    return {"on": on, "ids": ids, "when": when}
'''


def run_twin(cache: Path, *groups: list[str]) -> list[dict]:
    """One twin process per group of data dirs, run side by side (one per core)."""
    procs = [subprocess.Popen([sys.executable, str(TWIN), str(cache), *specs], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=Path(__file__).parent) for specs in groups]
    report = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-4000:]
        report += json.loads(out)
    return report


def differences(report: list[dict]) -> list[dict]:
    return [r for sc in report for r in sc["results"] if r.get("diff")]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory, excerpt_dir: Path, cache_dir: Path) -> list[dict]:
    synthetic = write_scenarios(tmp_path_factory.mktemp("dispatch"), {"faults": FAULT_APP, "features": FEATURE_APP})
    return run_twin(cache_dir, [str(bundled_data_dir())], [str(excerpt_dir), str(synthetic)])


def test_every_tool_answers_alike_both_ways(report: list[dict], excerpt_dir: Path, cache_dir: Path) -> None:
    found = differences(report)
    assert not found, json.dumps(found[:3], indent=1)[:6000]
    datasets = [AWMDataset(root, cache_dir=cache_dir) for root in (bundled_data_dir(), excerpt_dir)]
    with_code = {name for data in datasets for name in data.scenario_names() if data.scenario(name).full_code}
    assert {"content_platform_1", "code_hosting_2", "communication_messaging_1", "library_lending_1"} <= with_code
    assert {sc["scenario"] for sc in report} == with_code | {"faults", "features"}
    assert all(sc["results"] for sc in report)


def test_real_code_is_served_directly_with_every_kind_of_answer(report: list[dict]) -> None:
    real = [r for sc in report if sc["scenario"] not in ("faults", "features") for r in sc["results"]]
    direct = [r for r in real if r.get("direct")]
    assert len(direct) >= 0.9 * len(real)  # AWM code uses nothing that needs the ASGI stack
    statuses = collections.Counter(r["status"] for r in direct)
    assert statuses[200] and statuses[422] and statuses[404], statuses
    assert not [sc["fallback"] for sc in report if sc["scenario"] not in ("faults", "features") and sc["fallback"]]
    messaging = next(sc for sc in report if sc["scenario"] == "communication_messaging_1")
    assert all(r["direct"] for r in messaging["results"] if r["case"] == "probe")  # Depends(get_db) with yield


def test_features_that_need_asgi_fall_back_and_the_rest_is_direct(report: list[dict]) -> None:
    features = next(sc for sc in report if sc["scenario"] == "features")
    assert set(features["fallback"].values()) == {
        "the endpoint or a dependency takes a Request, Response, BackgroundTasks, WebSocket or SecurityScopes"}
    served = collections.defaultdict(set)
    for r in features["results"]:
        served[r["tool"]].add(r["direct"])
    for tool in ("get_item", "create_item", "delete_item", "plain", "stream", "raw", "bad_response", "flags",
                 "special_item", "boom", "half_write", "whoami", "get_note_with_dependency",
                 "add_note_with_dependency", "swallowed"):
        assert True in served[tool], tool
    assert served["agent"] == served["later"] == {False}
    by_case = {(r["tool"], r["case"]): r for r in features["results"]}
    assert by_case[("get_item", "path:item_id=''")]["direct"] is False  # "/items/" is no route of get_item
    assert by_case[("boom", "probe")]["status"] == 500 and by_case[("boom", "probe")]["direct"]
    assert by_case[("swallowed", "probe")]["status"] == 500  # FastAPI's "Response not awaited"


def test_a_changed_answer_is_caught(tmp_path: Path, cache_dir: Path) -> None:
    """The comparison can fail: a route whose answer depends on how it was called differs."""
    app = FAULT_APP + '''

import inspect


@app.get("/how", operation_id="how")
async def how():
    return {"asgi": any("starlette" in f.filename for f in inspect.stack())}
'''
    report = run_twin(cache_dir, [f"{write_scenarios(tmp_path, {'telltale': app})}:telltale"])
    assert {r["tool"] for r in differences(report)} == {"how"}


SPIN_ROUTES = '''

@app.get("/spin", operation_id="spin")
async def spin():
    while True:
        pass


@app.get("/spin_sync", operation_id="spin_sync")
def spin_sync():
    n = 0
    while True:
        n += 1
'''


def test_the_call_deadline_interrupts_a_direct_call_as_it_does_an_asgi_call(tmp_path: Path, cache_dir: Path) -> None:
    """Containment is the same both ways: the soft deadline interrupts the handler (an async spin, a sync
    spin, a runaway SQL statement), the call fails alone with the same answer, the episode goes on."""
    data = write_scenarios(tmp_path, {"spinning": FAULT_APP + SPIN_ROUTES})
    calls = [("spin", {}), ("spin_sync", {}),
             ("run_sql", {"sql": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"})]

    async def main(direct: bool) -> list[tuple[dict, dict]]:
        out = []
        with EnvRuntime(data, num_workers=1, cache_dir=cache_dir, call_timeout_s=1.0, direct_dispatch=direct) as rt:
            ep = await rt.open("spinning")
            for tool, args in calls:
                obs = await ep.call(tool, args)
                after = await ep.call("list_notes", {})
                out.append(({"text": obs.text, "status": obs.status, "error": obs.detail.split("\n", 1)[0]},
                            {"text": after.text, "status": after.status}))
            assert rt.pool.restarts == 0
        return out

    direct, asgi = asyncio.run(main(True)), asyncio.run(main(False))
    assert direct == asgi
    assert [(call["status"], after["status"]) for call, after in direct] == [(500, 200)] * 3


def test_an_app_changed_at_run_time_is_compiled_again() -> None:
    """A shadowing route or middleware added after the first call is honoured (no stale compiled route)."""
    def make_app() -> FastAPI:
        app = FastAPI()

        @app.get("/items/{item_id}", operation_id="get_item")
        async def get_item(item_id: str) -> dict:
            return {"id": item_id}
        return app

    class Tag:  # pure ASGI middleware that marks every response body
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            async def tagged(message: dict) -> None:
                if message["type"] == "http.response.body":
                    message = {**message, "body": message["body"] + b"#tagged"}
                await send(message)
            await self.inner(scope, receive, tagged)

    async def main() -> list[tuple[int, bytes, str]]:
        req = HttpRequest("GET", "/items/7", b"", None)
        shadowed, tagged = make_app(), make_app()
        first, second = Dispatcher(shadowed), Dispatcher(tagged)
        out = [await first.call(req, "/items/{item_id}"), await second.call(req, "/items/{item_id}")]
        shadowed.router.routes.insert(0, APIRoute("/items/7", lambda: {"shadow": True}, methods=["GET"]))
        tagged.add_middleware(Tag)
        out += [await first.call(req, "/items/{item_id}"), await second.call(req, "/items/{item_id}")]
        assert first.calls == second.calls == {"direct": 1, "asgi": 1}
        return out

    assert asyncio.run(main()) == [(200, b'{"id":"7"}', "")] * 2 + [(200, b'{"shadow":true}', ""),
                                                                   (200, b'{"id":"7"}#tagged', "")]

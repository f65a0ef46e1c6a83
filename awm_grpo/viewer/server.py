"""The trajectory viewer's local web server: the static page and a small JSON API over a run directory.

    python -m awm_grpo.traces serve RUN_DIR [--port 8765] [--host 127.0.0.1]

    GET /                                the page (static/index.html, app.js, style.css; no CDN)
    GET /api/runs                        {"root", "runs": [run names]}
    GET /api/run?run=NAME                files, curves, filter values and episode rows of one run
    GET /api/episode?run=NAME&id=F:L     one full trace record and its per-turn database view

It binds to 127.0.0.1 by default: traces hold task texts and model outputs, so exposing them is the
user's explicit choice (`--host 0.0.0.0`).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from awm_grpo.viewer.store import RunStore, TraceError

STATIC = Path(__file__).resolve().parent / "static"
STORE = web.AppKey("store", RunStore)


def to_json(data: Any) -> bytes:
    """The API's JSON (served, or embedded by the export): NaN becomes null, which the browser's JSON.parse
    reads (json.dumps writes NaN, which it refuses); anything else unknown becomes its str()."""
    return orjson.dumps(data, default=str, option=orjson.OPT_NON_STR_KEYS)


def _json(data: Any) -> web.Response:
    """A JSON answer, gzipped when the browser accepts it and it is worth it: a long run's page data is tens
    of MB of repetitive rows (a tenth of that gzipped), which over an SSH tunnel is most of the wait."""
    response = web.Response(body=to_json(data), content_type="application/json")
    if len(response.body) > 4096:
        response.enable_compression()  # only where Accept-Encoding allows it
    return response


def _query(request: web.Request, name: str) -> str:
    value = request.query.get(name)
    if value is None:
        raise web.HTTPBadRequest(text=json.dumps({"error": f"missing query parameter {name!r}"}),
                                 content_type="application/json")
    return value


async def _call(request: web.Request, fn: Any, *args: Any) -> web.Response:
    """Run a store read off the event loop; a missing run / file / episode is a 404 with the reason."""
    try:
        return _json(await asyncio.to_thread(fn, *args))
    except TraceError as exc:
        raise web.HTTPNotFound(text=json.dumps({"error": str(exc)}), content_type="application/json") from None


async def runs(request: web.Request) -> web.Response:
    store = request.app[STORE]
    return _json({"root": str(store.root), "runs": list(await asyncio.to_thread(store.runs))})


async def run(request: web.Request) -> web.Response:
    return await _call(request, request.app[STORE].summary, _query(request, "run"))


async def episode(request: web.Request) -> web.Response:
    return await _call(request, request.app[STORE].episode, _query(request, "run"), _query(request, "id"))


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "index.html")


def make_app(root: Path) -> web.Application:
    """The viewer app over the runs under `root` (raises TraceError if `root` is not a folder)."""
    app = web.Application()
    app[STORE] = RunStore(root)
    app.router.add_get("/", index)
    app.router.add_get("/api/runs", runs)
    app.router.add_get("/api/run", run)
    app.router.add_get("/api/episode", episode)
    app.router.add_static("/static/", STATIC)
    return app


def serve(root: Path, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Serve until Ctrl-C."""
    app = make_app(root)
    line = f"trajectory viewer for {Path(root).resolve()} on http://{host}:{port}/  (Ctrl-C to stop)"
    web.run_app(app, host=host, port=port, print=lambda _started: print(line, flush=True))  # once it listens

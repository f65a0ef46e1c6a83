"""ParamReader returns exactly what FastAPI's request_params_to_args returns, for every kind of parameter."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from awm.runtime.request_params import ParamReader
from fastapi import FastAPI, Path, Query
from fastapi.dependencies.utils import request_params_to_args
from pydantic import AliasChoices, BaseModel, Json
from starlette.datastructures import QueryParams

app = FastAPI()


class Filters(BaseModel):
    q: str = ""
    size: int = 10


@app.get("/things/{thing_id}/{kind}")
async def plain(thing_id: int, kind: str = Path(..., min_length=2), name: str | None = None, limit: int = Query(5, ge=1),
                flag: bool = False, tags: list[str] = Query([]), ids: list[int] | None = Query(None),
                when: dt.date | None = None, alias_q: str = Query("x", alias="q-alias"),
                choice: Annotated[str, Query(validation_alias=AliasChoices("choice", "pick"))] = "a",
                blob: Json[list[int]] | None = None, made: list[int] = Query(default_factory=lambda: [7]),
                checked: int = Query("3", validate_default=True)) -> Any:
    return {}


@app.get("/model")
async def model(filters: Annotated[Filters, Query()]) -> Any:
    return {}


def route(path: str) -> Any:
    return next(r for r in app.router.routes if getattr(r, "path", None) == path)


QUERIES = ["", "name=ann&limit=3", "limit=0", "limit=x&flag=maybe", "tags=a&tags=b&ids=1&ids=x", "ids=",
           "when=2025-02-30", "when=2025-02-03&q-alias=z&pick=b", "choice=c&pick=d", "blob=%5B1%2C2%5D", "blob=nope",
           "made=1&made=2", "checked=9", "flag=true&flag=false", "tags=", "name=&limit=&when="]
PATHS = [{"thing_id": "7", "kind": "box"}, {"thing_id": "x", "kind": "b"}, {"thing_id": "-1", "kind": "ok"}]


def test_compiled_reader_matches_fastapi_on_path_and_query_params() -> None:
    dep = route("/things/{thing_id}/{kind}").dependant
    path_reader, query_reader = ParamReader(dep.path_params), ParamReader(dep.query_params)
    assert path_reader.params is not None and query_reader.params is not None  # compiled, not deferred
    for received in PATHS:
        assert path_reader.read(received) == request_params_to_args(dep.path_params, received)
    for query in QUERIES:
        params = QueryParams(query.encode())
        got, expected = query_reader.read(params), request_params_to_args(dep.query_params, params)
        assert got == expected, query
    values, errors = query_reader.read(QueryParams(b""))
    assert values["made"] == [7] and values["checked"] == 3 and values["limit"] == 5 and not errors
    assert query_reader.read(QueryParams(b"limit=0"))[1][0]["type"] == "greater_than_equal"


def test_a_default_is_copied_per_call_as_fastapi_does() -> None:
    reader = ParamReader(route("/things/{thing_id}/{kind}").dependant.query_params)
    first, _ = reader.read(QueryParams(b""))
    first["tags"].append("leak")
    second, _ = reader.read(QueryParams(b""))
    assert second["tags"] == []


def test_parameter_models_are_left_to_fastapi() -> None:
    dep = route("/model").dependant
    reader = ParamReader(dep.query_params)
    assert reader.params is None
    for query in ("", "q=x&size=3", "size=big", "extra=1"):
        params = QueryParams(query.encode())
        assert reader.read(params) == request_params_to_args(dep.query_params, params)

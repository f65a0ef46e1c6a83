"""Tool derivation and request mapping, checked on a real FastAPI app's OpenAPI document."""

from __future__ import annotations

import json

from awm.tools import ToolSpec, build_request, example_of, observation_from_response, tools_from_openapi
from fastapi import Body, FastAPI, Path, Query
from pydantic import BaseModel, Field


class RideIn(BaseModel):
    dock_id: int = Field(..., description="Where the ride starts")
    note: str | None = None


class RideOut(BaseModel):
    ride_id: int


def _app() -> FastAPI:
    app = FastAPI()

    @app.post("/api/rides/{bike_id}", operation_id="start_ride", summary="Start a ride",
              description="Unlock a bike.", response_model=RideOut)
    async def start_ride(body: RideIn, bike_id: int = Path(..., example=9), notify: bool = Query(False)):
        return RideOut(ride_id=31)

    @app.get("/api/docks", operation_id="search_docks", summary="Search docks")
    async def search_docks(q: str = Query(..., example="Harbor"), tags: list[str] = Query(default=[])):
        return []

    @app.put("/api/limit", operation_id="set_limit", summary="Set a limit")
    async def set_limit(value: int = Body(..., embed=False)):
        return {"value": value}

    return app


def _tools() -> dict[str, ToolSpec]:
    return {t.name: t for t in tools_from_openapi(_app().openapi())}


def test_flat_input_schema_like_fastapi_mcp():
    ride = _tools()["start_ride"]
    schema = ride.input_schema
    assert list(schema["properties"]) == ["bike_id", "notify", "dock_id", "note"]
    assert schema["required"] == ["bike_id", "dock_id"]
    assert schema["properties"]["dock_id"]["description"] == "Where the ride starts"
    assert (ride.method, ride.path, ride.path_params, ride.query_params, ride.body_params) == (
        "POST", "/api/rides/{bike_id}", ("bike_id",), ("notify",), ("dock_id", "note"))
    assert ride.examples == {"bike_id": 9}
    assert ride.public() == {"name": "start_ride", "description": ride.description, "inputSchema": schema}


def test_description_has_summary_description_and_example_response():
    desc = _tools()["start_ride"].description
    assert desc.startswith("Start a ride\n\nUnlock a bike.\n\n### Responses:\n\n**200**: Successful Response")
    assert '"ride_id": 0' in desc


def test_build_request_maps_path_query_and_body():
    req = build_request(_tools()["start_ride"], {"bike_id": 9, "notify": True, "dock_id": 1, "note": "hi"})
    assert (req.method, req.path, req.query_string) == ("POST", "/api/rides/9", b"notify=true")
    assert json.loads(req.body) == {"dock_id": 1, "note": "hi"}
    get = build_request(_tools()["search_docks"], {"q": "a b&c", "tags": ["x", "y"]})
    assert get.query_string == b"q=a+b%26c&tags=x&tags=y" and get.body is None
    raw = _tools()["set_limit"]
    assert raw.raw_body == "value" and raw.input_schema["required"] == ["value"]
    assert build_request(raw, {"value": 5}).body == b"5"


def test_observation_text_follows_upstream():
    ok = observation_from_response("start_ride", 200, b'{"ride_id":31,"name":"\xc3\xa9"}')
    assert (ok.text, ok.is_error, ok.kind) == ('{\n  "ride_id": 31,\n  "name": "\u00e9"\n}', False, "ok")
    err = observation_from_response("start_ride", 422, b'{"detail":"bad"}')
    assert err.text == 'Error calling start_ride. Status code: 422. Response: {"detail":"bad"}' and err.is_error
    plain = observation_from_response("x", 200, b"hello")
    assert plain.text == "hello"


def test_example_of_schema():
    assert example_of({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "array",
                      "items": {"type": "string"}}}}) == {"a": 0, "b": ["string"]}
    assert example_of({"anyOf": [{"type": "null"}, {"type": "boolean"}]}) is True

"""Subprocess side of tests/sglang_real.SglangOracle: imports the real sglang and answers questions.

Run only through `SglangOracle` (PYTHONPATH from `sglang_env()`); argv[1] is the file descriptor
that answers go to, one JSON line each, so sglang's own prints cannot corrupt them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import sys
import traceback
import typing
from importlib.metadata import version
from typing import Any

import msgspec
import pydantic
from fastapi.routing import APIRoute
from sglang.srt.entrypoints import http_server
from sglang.srt.entrypoints.api_contract import generate_contract_error
from sglang.srt.server_args import prepare_server_args


def parse_server_args(argv: list[str]) -> dict[str, Any]:
    """sglang's launcher entry (`prepare_server_args`): argparse + `ServerArgs.from_cli_args`."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = prepare_server_args(argv)
    except SystemExit:
        return {"error": err.getvalue().strip() or "argparse exited", "fields": {}}
    fields = json.loads(json.dumps(msgspec.structs.asdict(args), default=repr))
    return {"error": None, "fields": fields}


def routes() -> dict[str, list[str]]:
    table: dict[str, set[str]] = {}
    for route in http_server.app.routes:
        if isinstance(route, APIRoute):
            table.setdefault(route.path, set()).update(route.methods)
    return {path: sorted(methods) for path, methods in table.items()}


def _find_route(method: str, path: str) -> APIRoute | None:
    for route in http_server.app.routes:
        if isinstance(route, APIRoute) and route.path == path and method in route.methods:
            return route
    return None


def _unwrap(hint: Any) -> Any:
    """Annotated[X, Body()] / Optional[X] -> X."""
    while True:
        origin = typing.get_origin(hint)
        if origin is typing.Annotated:
            hint = typing.get_args(hint)[0]
        elif origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            if len(args) != 1:
                return hint
            hint = args[0]
        else:
            return hint


def _struct_class(method: str, path: str) -> type | None:
    route = _find_route(method, path)
    if route is None:
        raise LookupError(f"sglang serves no {method} {path}")
    hints = typing.get_type_hints(route.endpoint, include_extras=True)
    for name, hint in hints.items():
        cls = _unwrap(hint)
        if name != "return" and isinstance(cls, type) and (
            dataclasses.is_dataclass(cls) or issubclass(cls, (msgspec.Struct, pydantic.BaseModel))
        ):
            return cls
    return None


def _qualified(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def body_struct(method: str, path: str) -> str | None:
    cls = _struct_class(method, path)
    return None if cls is None else _qualified(cls)


def _load(struct: str) -> type:
    module_name, _, name = struct.partition(":")
    module = sys.modules.get(module_name) or __import__(module_name, fromlist=[name])
    return getattr(module, name)


def validate_body(struct: str, body: dict[str, Any]) -> str | None:
    """Unknown or missing fields, then the type check FastAPI itself runs (pydantic), then construction."""
    cls = _load(struct)
    if issubclass(cls, msgspec.Struct):  # most io_struct request classes
        fields = {f.name for f in msgspec.structs.fields(cls)}
        required = {f.name for f in msgspec.structs.fields(cls) if f.required}
    elif dataclasses.is_dataclass(cls):  # GenerateReqInput and a few others
        fields = {f.name for f in dataclasses.fields(cls) if f.init}
        required = {
            f.name for f in dataclasses.fields(cls)
            if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
    else:
        fields = set(cls.model_fields)
        required = {name for name, f in cls.model_fields.items() if f.is_required()}
    unknown = sorted(set(body) - fields)
    missing = sorted(required - set(body))
    if unknown or missing:
        return f"{cls.__name__}: unknown fields {unknown}, missing fields {missing}"
    try:
        pydantic.TypeAdapter(cls).validate_python(body)
    except Exception as exc:  # pydantic.ValidationError or sglang's own __post_init__ check
        return f"{cls.__name__}: {type(exc).__name__}: {exc}"
    return None


def check_request(method: str, path: str, body: dict[str, Any] | None) -> list[str]:
    """Everything sglang's server would refuse about this request before serving it."""
    try:
        cls = _struct_class(method, path)
    except LookupError as exc:
        return [str(exc)]
    problems = []
    if cls is None:
        if body:
            problems.append(f"sglang's {method} {path} takes no JSON body, the project sends {sorted(body)}")
    else:
        problem = validate_body(_qualified(cls), body if body is not None else {})
        if problem:
            problems.append(problem)
    if path == "/generate":
        contract = generate_contract_error(body)
        if contract:
            problems.append(f"/generate contract (sglang.srt.entrypoints.api_contract): {contract}")
    return problems


ANSWERS = {
    "parse_server_args": parse_server_args,
    "routes": routes,
    "body_struct": body_struct,
    "validate_body": validate_body,
    "check_request": check_request,
}


def main() -> None:
    out = os.fdopen(int(sys.argv[1]), "w")
    names = ("sglang", "torch", "transformers", "fastapi", "pydantic")
    out.write(json.dumps({"versions": {name: version(name) for name in names}}) + "\n")
    out.flush()
    for line in sys.stdin:
        question = json.loads(line)
        name = question.pop("q")
        try:
            reply = {"a": ANSWERS[name](**question)}
        except Exception:
            reply = {"crash": traceback.format_exc()}
        out.write(json.dumps(reply, default=repr) + "\n")
        out.flush()


if __name__ == "__main__":
    main()

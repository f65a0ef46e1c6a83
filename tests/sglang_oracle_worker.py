"""Subprocess side of tests/sglang_real.SglangOracle: imports the real sglang and answers questions.

Run only through `SglangOracle` (PYTHONPATH from `sglang_env(gpu_set)`); argv[1] is the file descriptor
that answers go to, one JSON line each, so sglang's own prints cannot corrupt them.

One worker serves either pinned sglang (0.5.10 of the cu12 set, 0.5.23 of the cu13 set). Where the
versions really differ the worker says so in its first line instead of papering over it:
`features` (what this version has: 0.5.10 has no `sglang.srt.entrypoints.api_contract`, so its
/generate bodies are checked against GenerateReqInput and SamplingParams only) and `stand_ins` (the
one hardware probe answered in sglang's place, see `_answer_device_probe`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import io
import json
import os
import sys
import traceback
import typing
from importlib.metadata import version
from types import SimpleNamespace
from typing import Any

import msgspec
import pydantic
import sglang.srt.server_args as server_args_module
from fastapi.routing import APIRoute
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.entrypoints import http_server
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs, prepare_server_args

try:  # sglang 0.5.23: the typed JSON contract of /generate; sglang 0.5.10 has none
    from sglang.srt.entrypoints.api_contract import generate_contract_error
except ImportError:
    generate_contract_error = None

QWEN3_VOCAB_SIZE = 151936  # SamplingParams.verify checks token ids (logit_bias, stop ids) against it


def _answer_device_probe() -> list[str]:
    """sglang 0.5.10 has no CPU platform: `ServerArgs.__post_init__` asks `get_device()`, which raises
    on a machine without an accelerator (0.5.23 leaves the device unresolved there). The probe is then
    answered with "cpu", the device this machine has (what `--device cpu` would say); every other step
    of `prepare_server_args` stays sglang's. Returns what was stood in for (nothing on 0.5.23)."""
    probe = getattr(server_args_module, "get_device", None)
    if probe is None:
        return []
    try:
        probe()
    except RuntimeError as exc:
        server_args_module.get_device = lambda device_id=None: "cpu"
        return [f"sglang.srt.server_args.get_device() answers 'cpu' (sglang's own raised: {exc})"]
    return []


def _cli_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser


def _abbreviated_flags(argv: list[str]) -> list[str]:
    """Flags argparse would accept only as a prefix of a longer one (`--mem-fraction` for
    `--mem-fraction-static`): a misspelled field that happens to be a prefix must not pass."""
    known = set(_cli_parser()._option_string_actions)
    return [a for a in argv if a.startswith("--") and a.split("=")[0] not in known]


def parse_server_args(argv: list[str]) -> dict[str, Any]:
    """sglang's launcher entry (`prepare_server_args`): argparse + `ServerArgs.from_cli_args`, whose
    `__post_init__` resolves the rest (sglang 0.5.10 reads the model folder's config there). Flags are
    checked first, so a refused flag is reported as such whatever the model path."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            _cli_parser().parse_args(argv)
    except SystemExit:
        return {"error": err.getvalue().strip() or "argparse exited", "fields": {}}
    inexact = _abbreviated_flags(argv)
    if inexact:
        return {"error": f"sglang took {inexact} only as abbreviations of longer flags", "fields": {}}
    try:
        with contextlib.redirect_stderr(err):
            args = prepare_server_args(argv)
    except SystemExit:
        return {"error": err.getvalue().strip() or "argparse exited", "fields": {}}
    # ServerArgs is a msgspec Struct in 0.5.23, a dataclass in 0.5.10
    raw = msgspec.structs.asdict(args) if isinstance(args, msgspec.Struct) else {
        f.name: getattr(args, f.name) for f in dataclasses.fields(args)}
    fields = json.loads(json.dumps(raw, default=repr))
    return {"error": None, "fields": fields}


def serving_dtype(model_dir: str, dtype: str = "auto") -> str:
    """The torch dtype sglang serves a Hugging Face model folder in: its own `ModelConfig` (which loads
    the config with sglang's `get_config` and applies `_get_and_verify_dtype(hf_text_config, dtype)`),
    as `--dtype dtype` would build it. float32 under "auto" is served as float16 (bfloat16 for Gemma)."""
    config = ModelConfig(model_dir, trust_remote_code=True, dtype=dtype)
    return str(config.dtype).removeprefix("torch.")


def server_info_version(model_dir: str) -> Any:
    """The `version` field of sglang's own `GET /server_info` answer: its handler run over a ServerArgs
    parsed by sglang for `model_dir`, with the live parts a server has (tokenizer manager, scheduler
    info) stood in."""
    args = prepare_server_args(["--model-path", model_dir])

    async def internal_state() -> list[dict[str, Any]]:
        return [{}]

    manager = SimpleNamespace(server_args=args, get_internal_state=internal_state, startup_time=0.0)
    saved = http_server._global_state
    http_server._global_state = SimpleNamespace(tokenizer_manager=manager, scheduler_info={})
    try:
        answer = asyncio.run(http_server.server_info())
    finally:
        http_server._global_state = saved
    return answer["version"]


def _api_routes(routes: list[Any], prefix: str = "") -> list[tuple[str, APIRoute]]:
    """(full path, route) of every APIRoute, those of included routers too: FastAPI 0.165 keeps an
    `include_router`'s routes behind one `_IncludedRouter` entry (sglang serves /v1/loads that way)."""
    found = []
    for route in routes:
        if isinstance(route, APIRoute):
            found.append((prefix + route.path, route))
        elif hasattr(route, "original_router"):
            context = getattr(route, "include_context", None)
            found += _api_routes(route.original_router.routes, prefix + (getattr(context, "prefix", "") or ""))
    return found


def routes() -> dict[str, list[str]]:
    table: dict[str, set[str]] = {}
    for path, route in _api_routes(http_server.app.routes):
        table.setdefault(path, set()).update(route.methods)
    return {path: sorted(methods) for path, methods in table.items()}


def _find_route(method: str, path: str) -> APIRoute | None:
    for full, route in _api_routes(http_server.app.routes):
        if full == path and method in route.methods:
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
        contract = generate_contract_error(body) if generate_contract_error is not None else None
        if contract:
            problems.append(f"/generate contract (sglang.srt.entrypoints.api_contract): {contract}")
        try:  # what the tokenizer manager does with the dict (normalize() needs the tokenizer: skipped)
            SamplingParams(**(body or {}).get("sampling_params") or {}).verify(QWEN3_VOCAB_SIZE)
        except (TypeError, ValueError) as exc:
            problems.append(f"sampling_params: {type(exc).__name__}: {exc}")
    return problems


ANSWERS = {
    "parse_server_args": parse_server_args,
    "routes": routes,
    "body_struct": body_struct,
    "validate_body": validate_body,
    "check_request": check_request,
    "serving_dtype": serving_dtype,
    "server_info_version": server_info_version,
}


def main() -> None:
    out = os.fdopen(int(sys.argv[1]), "w")
    names = ("sglang", "torch", "transformers", "fastapi", "pydantic")
    ready = {"versions": {name: version(name) for name in names},
             "features": {"generate_contract": generate_contract_error is not None},
             "stand_ins": _answer_device_probe()}
    out.write(json.dumps(ready) + "\n")
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

"""The project's SGLang contract, checked against the pinned sglang's own code (tests/sglang_real.py).

Launch flags go through sglang's `prepare_server_args` (what `python -m sglang.launch_server` runs);
request bodies are produced by the project's own code, recorded on the wire, and must build the
struct that sglang's endpoint reads (no unknown or missing field, right types, /generate's contract
and SamplingParams); every route must exist in sglang's FastAPI app with that method. A route
literal anywhere in the engine-facing code that is not in `slime.engine.base.ENGINE_ROUTES` fails.
"""

from __future__ import annotations

import ast
import asyncio
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from sglang_real import SglangOracle

from slime import weight_sync
from slime.arguments import parse_args
from slime.engine import base
from slime.engine.base import ENGINE_ROUTES, EngineClient, Route
from slime.engine.sglang_engine import launch_command
from slime.rollout import sglang_rollout
from slime.utils.types import Sample

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = ["--hf-checkpoint", "/models/qwen3", "--prompt-data", "/data/train.jsonl", "--rollout-batch-size", "2",
            "--num-rollout", "1"]

# ---- launch flags -----------------------------------------------------------------------------------

LAUNCHES = {
    "defaults": [],
    "colocated, tp 2, memory fraction": ["--engine-type", "sglang", "--colocate", "--rollout-num-gpus", "4",
                                         "--rollout-num-gpus-per-engine", "2", "--sglang-mem-fraction-static",
                                         "0.45", "--seed", "7"],
    "separate engines, offload off": ["--engine-type", "sglang", "--rollout-num-gpus", "2", "--seed", "3",
                                      "--no-offload-rollout"],
}


def sglang_argv(slime_argv: list[str]) -> list[str]:
    """The flags the project gives `python -m sglang.launch_server` for engine rank 1 of this run."""
    command = launch_command(parse_args(REQUIRED + slime_argv), port=30001, host="10.0.0.2", base_gpu_id=0,
                             nccl_port=31000, seed_offset=1)
    assert command[1:3] == ["-m", "sglang.launch_server"]
    return command[3:]


@pytest.mark.parametrize("name", LAUNCHES)
def test_launch_flags_parse_with_sglangs_server_args(sglang: SglangOracle, name: str) -> None:
    slime_args = parse_args(REQUIRED + LAUNCHES[name])

    parsed = sglang.parse_server_args(sglang_argv(LAUNCHES[name]))

    assert parsed["error"] is None, parsed["error"]
    fields = parsed["fields"]
    assert (fields["model_path"], fields["host"], fields["port"]) == ("/models/qwen3", "10.0.0.2", 30001)
    assert (fields["base_gpu_id"], fields["nccl_port"]) == (0, 31000)
    assert fields["tp_size"] == slime_args.rollout_num_gpus_per_engine
    assert fields["random_seed"] == slime_args.seed + 1
    assert fields["enable_memory_saver"] == bool(slime_args.offload_rollout or slime_args.colocate)
    assert fields["trust_remote_code"] is True and fields["enable_metrics"] is True
    if slime_args.sglang_mem_fraction_static is not None:
        assert fields["mem_fraction_static"] == slime_args.sglang_mem_fraction_static


def test_a_misspelled_flag_is_refused_by_sglang(sglang: SglangOracle) -> None:
    """The check can fail: a field sglang does not have becomes a flag its parser rejects, and so
    does one that argparse would take as an abbreviation of a longer flag."""
    unknown = launch_command({"hf_checkpoint": "/m", "sglang_mem_fraction_dynamic": 0.5}, port=1)[3:]
    prefix = launch_command({"hf_checkpoint": "/m", "sglang_mem_fraction": 0.5}, port=1)[3:]

    assert "unrecognized arguments: --mem-fraction-dynamic 0.5" in sglang.parse_server_args(unknown)["error"]
    assert "['--mem-fraction'] only as abbreviations" in sglang.parse_server_args(prefix)["error"]


def test_a_bad_body_is_refused_by_sglang(sglang: SglangOracle) -> None:
    """The body check can fail: wrong type, unknown sampling parameter, out-of-range value."""
    (wrong_type,) = sglang.check_request("POST", "/update_weights_from_disk", {"model_path": ["/a"]})
    unknown = sglang.check_request("POST", "/generate", {"input_ids": [1], "sampling_params": {"max_tokens": 8}})
    top_p = sglang.check_request("POST", "/generate", {"input_ids": [1], "sampling_params": {"top_p": 0}})

    assert "model_path" in wrong_type
    assert any("max_tokens" in p for p in unknown)
    assert any("top_p must be in (0, 1]" in p for p in top_p)


# ---- requests -----------------------------------------------------------------------------------------


class Recorder:
    """An httpx transport that keeps every request and answers like a healthy SGLang server."""

    def __init__(self) -> None:
        self.requests: list[tuple[Route, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.requests.append((Route(request.method, request.url.path), body))
        if request.url.path == base.MODEL_INFO.path:
            return httpx.Response(200, json={"model_path": "/m", "weight_version": "3"})
        return httpx.Response(200, json={"success": True, "message": ""})

    def client(self) -> EngineClient:
        engine = EngineClient("http://engine:30000")
        engine._http = httpx.Client(transport=httpx.MockTransport(self))
        return engine


def engine_client_requests() -> list[tuple[Route, Any]]:
    """Every request `RolloutEngine`'s control methods send."""
    recorder = Recorder()
    engine = recorder.client()
    engine.health()
    engine.flush_cache()
    assert engine.update_weights_from_disk("/ckpt/weight_v000003", weight_version="3") == "3"
    engine.pause_generation()
    engine.continue_generation()
    engine.release_memory_occupation()
    engine.resume_memory_occupation(["weights"])
    engine.resume_memory_occupation()
    engine.abort("rid-1")
    engine.abort()
    return recorder.requests


def generate_requests(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Route, Any]]:
    """The /generate bodies of slime's default rollout and of awm_grpo's multi-turn rollout."""
    from awm_grpo import rollout as awm_rollout

    sent: list[tuple[Route, Any]] = []

    async def post(url: str, payload: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        sent.append((Route("POST", httpx.URL(url).path), payload))
        return {"text": "x", "meta_info": {"output_token_logprobs": [[-0.5, 7, None]],
                                           "finish_reason": {"type": "length"}}}

    monkeypatch.setattr(sglang_rollout, "post", post)
    monkeypatch.setattr(awm_rollout, "post", post)
    args = parse_args(REQUIRED + ["--rollout-stop", "</tool_call>", "--rollout-stop-token-ids", "151645",
                                  "--rollout-max-context-len", "64", "--eval-temperature", "0.6"])
    args.sglang_router_ip, args.sglang_router_port = "engine", 30000
    for evaluation in (False, True):
        params = sglang_rollout.sampling_params_from_args(args, evaluation=evaluation)
        asyncio.run(sglang_rollout.generate(args, Sample(tokens=[1, 2, 3]), params))
        asyncio.run(awm_rollout.engine_policy(args, Sample(tokens=[1, 2]))([1, 2, 3], params))
    return sent


def weight_sync_requests(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Route, Any]]:
    """The bodies `TensorWeightSync` posts (its payload builders, and close()'s group teardown)."""
    bucket = [("model.layers.0.mlp.up_proj.weight", torch.zeros(4, 2, dtype=torch.bfloat16)),
              ("lm_head.weight", torch.zeros(8, 2))]
    sent = [
        (base.UPDATE_WEIGHTS_FROM_TENSOR, weight_sync.tensor_update_payload(["c2VyaWFsaXNlZA=="], 3)),
        (base.INIT_WEIGHTS_UPDATE_GROUP, weight_sync.init_group_payload("10.0.0.1", 29500, 1, 3, "slime")),
        (base.UPDATE_WEIGHTS_FROM_DISTRIBUTED, weight_sync.distributed_update_payload(bucket, "slime", 3)),
    ]
    recorder = Recorder()
    sync = weight_sync.TensorWeightSync("nccl")
    sync._group, sync._engines = object(), [recorder.client()]
    monkeypatch.setattr(torch.distributed, "destroy_process_group", lambda group: None)
    sync.close()
    with weight_sync.update_session([recorder.client()]):  # every tensor update happens inside one
        pass
    return sent + recorder.requests


# Body-less GETs sent from places a CPU test cannot drive to the wire: SGLangEngine's start-up poll
# and the router relaying a client's GET (it forwards the client's method and path as they came).
BODILESS_GETS = [base.HEALTH_GENERATE, Route("GET", "/flush_cache"), Route("GET", "/get_model_info"),
                 Route("GET", "/get_server_info")]


@pytest.fixture(scope="module")
def project_requests() -> list[tuple[Route, Any]]:
    with pytest.MonkeyPatch.context() as monkeypatch:
        recorded = engine_client_requests() + generate_requests(monkeypatch) + weight_sync_requests(monkeypatch)
    return recorded + [(route, None) for route in BODILESS_GETS]


def test_every_request_body_is_one_sglang_accepts(sglang: SglangOracle, project_requests: list) -> None:
    problems = {f"{route.method} {route.path} {json.dumps(body)}": sglang.check_request(*route, body)
                for route, body in project_requests}

    assert {request: p for request, p in problems.items() if p} == {}


def test_every_engine_route_exists_in_sglang_with_that_method(sglang: SglangOracle) -> None:
    served = sglang.routes()

    missing = [f"{method} {path}" for method, path in ENGINE_ROUTES if method not in served.get(path, [])]

    assert missing == [], f"sglang {sglang.versions['sglang']} serves no {missing}"


def test_every_engine_route_has_a_checked_request(project_requests: list) -> None:
    """A route added to ENGINE_ROUTES needs a body from the code that sends it in `project_requests`."""
    assert set(ENGINE_ROUTES) == {route for route, _ in project_requests}


# ---- no route escapes the table ---------------------------------------------------------------------

# Files that send requests to engines (directly or as the router's forwarding).
ENGINE_FACING = ["slime/engine", "slime/weight_sync.py", "slime/rollout", "slime/train.py", "awm_grpo/rollout.py"]
# Route-like strings there that are not engine requests, and why.
NOT_ENGINE = {
    "/workers": "sglang-router's worker API (slime/engine/router_process.py), not an engine's",
    "/workers/": "the same API, DELETE /workers/{id}",
}
ROUTE_LIKE = re.compile(r"^/[a-z_]+/?$")
SERVING_CALLS = {"get", "post", "put", "delete", "api_route", "add_api_route"}


def _route_literals(tree: ast.AST) -> set[str]:
    """Route-like string constants (alone or inside f-strings), except the paths a server *defines*
    (decorators such as `@app.get("/x")` and `app.add_api_route("/x", ...)`) and docstrings."""
    defined: set[int] = set()
    for node in ast.walk(tree):
        calls = [d for d in getattr(node, "decorator_list", []) if isinstance(d, ast.Call)]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_api_route":
            calls.append(node)
        for call in calls:
            if isinstance(call.func, ast.Attribute) and call.func.attr in SERVING_CALLS:
                defined.update(id(a) for a in call.args[:1])
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                defined.add(id(first.value))
    return {node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in defined
            and ROUTE_LIKE.match(node.value)}


def engine_route_literals() -> dict[str, set[str]]:
    files: list[Path] = []
    for entry in ENGINE_FACING:
        path = ROOT / entry
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return {str(f.relative_to(ROOT)): _route_literals(ast.parse(f.read_text())) for f in files}


def test_no_engine_route_escapes_the_table() -> None:
    known = {path for _, path in ENGINE_ROUTES} | set(NOT_ENGINE)

    strays = {f: sorted(found - known) for f, found in engine_route_literals().items() if found - known}

    assert strays == {}, "add these requests to slime.engine.base.ENGINE_ROUTES (and a body to this test)"


def test_the_scan_sees_a_request_the_table_lacks(tmp_path: Path) -> None:
    code = 'def f(e):\n    """Calls /x."""\n    return e._call("GET", "/get_weight_version")\n'

    assert _route_literals(ast.parse(code)) == {"/get_weight_version"}


# ---- the CPU engine and the router imitate stock sglang -------------------------------------------------

ROUTER_ONLY = {"/workers", "/workers/{worker_id}"}  # sglang-router's worker API, not sglang's


def app_routes(app: Any) -> dict[str, set[str]]:
    table: dict[str, set[str]] = {}
    for route in app.routes:
        if hasattr(route, "methods") and route.path not in ("/openapi.json", "/docs", "/docs/oauth2-redirect",
                                                            "/redoc"):
            table.setdefault(route.path, set()).update(route.methods - {"HEAD"})
    return table


def unserved(ours: dict[str, set[str]], sglang: SglangOracle) -> list[str]:
    served = sglang.routes()
    return sorted(f"{m} {p}" for p, methods in ours.items() for m in methods if m not in served.get(p, []))


def test_cpu_engine_serves_only_what_stock_sglang_serves(sglang: SglangOracle) -> None:
    from slime.engine.cpu_server import build_app

    app = build_app(batcher=None, tokenizer=None, tokenizer_path="")  # routes only: nothing is served

    assert unserved(app_routes(app), sglang) == []


def test_router_serves_only_what_stock_sglang_serves(sglang: SglangOracle) -> None:
    from slime.engine.router import Router

    routes = app_routes(Router([]).build_app())
    assert unserved({p: m for p, m in routes.items() if p not in ROUTER_ONLY}, sglang) == []

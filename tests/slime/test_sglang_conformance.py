"""The project's SGLang contract, checked against both pinned sglangs' own code (tests/sglang_real.py:
0.5.10 of the gpu-cu12 set, 0.5.23 of gpu-cu13; every test using the `sglang` fixture runs twice).

Launch flags go through sglang's `prepare_server_args` (what `python -m sglang.launch_server` runs);
request bodies are produced by the project's own code, recorded on the wire against an engine that
reports that sglang's version, and must build the struct that sglang's endpoint reads (no unknown or
missing field, right types, SamplingParams, and /generate's JSON contract where sglang has one: 0.5.23);
every route must exist in sglang's FastAPI app with that method, except the version-specific ones
(`slime.engine.base.ROUTES_SINCE`), which must exist exactly in the versions the table says. A route
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
from sglang_real import SglangOracle, pinned, qwen3_4b_folder

from slime import weight_sync
from slime.arguments import build_parser, parse_args
from slime.engine import base
from slime.engine.base import ENGINE_ROUTES, ROUTES_SINCE, EngineClient, Route, served_by
from slime.engine.sglang_engine import DEFAULT_FIELDS, DERIVED_FIELDS, SLIME_SIDE_FIELDS, launch_command
from slime.rollout import sglang_rollout
from slime.utils.types import Sample

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = ["--prompt-data", "/data/train.jsonl", "--rollout-batch-size", "2", "--num-rollout", "1"]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The --hf-checkpoint: a Qwen3-4B config folder (sglang 0.5.10 reads the config while parsing)."""
    return str(qwen3_4b_folder(tmp_path_factory.mktemp("Qwen3-4B")))

# ---- launch flags -----------------------------------------------------------------------------------

LAUNCHES = {
    "defaults": [],
    "dp attention, deterministic": ["--engine-type", "sglang", "--rollout-num-gpus", "2",
                                    "--rollout-num-gpus-per-engine", "2", "--sglang-dp-size", "2",
                                    "--sglang-enable-dp-attention", "--sglang-enable-deterministic-inference",
                                    "--sglang-attention-backend", "triton"],
    "colocated, tp 2, memory fraction": ["--engine-type", "sglang", "--colocate", "--rollout-num-gpus", "4",
                                         "--rollout-num-gpus-per-engine", "2", "--sglang-mem-fraction-static",
                                         "0.45", "--seed", "7"],
    "separate engines, offload off": ["--engine-type", "sglang", "--rollout-num-gpus", "2", "--seed", "3",
                                      "--no-offload-rollout"],
    "fp16 engines": ["--engine-type", "sglang", "--sglang-dtype", "float16"],
    "fp32 engines": ["--engine-type", "sglang", "--sglang-dtype", "float32"],
}


def sglang_argv(slime_argv: list[str], model: str) -> list[str]:
    """The flags the project gives `python -m sglang.launch_server` for engine rank 1 of this run."""
    command = launch_command(parse_args(["--hf-checkpoint", model, *REQUIRED, *slime_argv]), port=30001,
                             host="10.0.0.2", base_gpu_id=0, nccl_port=31000, seed_offset=1)
    assert command[1:3] == ["-m", "sglang.launch_server"]
    return command[3:]


@pytest.mark.parametrize("name", LAUNCHES)
def test_launch_flags_parse_with_sglangs_server_args(sglang: SglangOracle, model: str, name: str) -> None:
    slime_args = parse_args(["--hf-checkpoint", model, *REQUIRED, *LAUNCHES[name]])

    parsed = sglang.parse_server_args(sglang_argv(LAUNCHES[name], model))

    assert parsed["error"] is None, parsed["error"]
    fields = parsed["fields"]
    assert (fields["model_path"], fields["host"], fields["port"]) == (model, "10.0.0.2", 30001)
    assert (fields["base_gpu_id"], fields["nccl_port"]) == (0, 31000)
    assert fields["tp_size"] == slime_args.rollout_num_gpus_per_engine
    assert fields["random_seed"] == slime_args.seed + 1
    assert fields["enable_memory_saver"] == bool(slime_args.offload_rollout or slime_args.colocate)
    assert fields["trust_remote_code"] is True and fields["enable_metrics"] is True
    if slime_args.sglang_mem_fraction_static is not None:
        assert fields["mem_fraction_static"] == slime_args.sglang_mem_fraction_static
    assert fields["dtype"] == (slime_args.sglang_dtype or DEFAULT_FIELDS["dtype"])
    # what sglang will serve the model in: the flag wins over the folder's config (bfloat16 here)
    assert sglang.serving_dtype(model, fields["dtype"]) == fields["dtype"]


def test_the_launch_cases_cover_every_flag_the_launcher_can_emit(model: str) -> None:
    """Every server flag launch_command can derive from slime's arguments appears in some LAUNCHES case
    (so each is parsed by both sglangs above): the fixed ones, the derived ones and every --sglang-*
    argument of slime that reaches the server. A new --sglang-* argument fails here until it has a case."""
    emitted = {a for case in LAUNCHES.values() for a in sglang_argv(case, model) if a.startswith("--")}
    slime_sglang = {a.dest for a in build_parser()._actions if a.dest.startswith("sglang_")} - SLIME_SIDE_FIELDS
    possible = {"--model-path", "--host", "--port", "--base-gpu-id", "--nccl-port", "--random-seed",
                "--enable-memory-saver"}
    possible |= {f"--{field.replace('_', '-')}" for field in (*DEFAULT_FIELDS, *DERIVED_FIELDS.values())}
    possible |= {f"--{dest.removeprefix('sglang_').replace('_', '-')}" for dest in slime_sglang}

    assert possible - emitted == set()


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
    """An httpx transport that keeps every request and answers like a healthy SGLang server of
    `version` (the `version` field of /server_info is what sglang's own handler answers)."""

    def __init__(self, version: str) -> None:
        self.version = version
        self.requests: list[tuple[Route, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.requests.append((Route(request.method, request.url.path), body))
        if request.url.path == base.MODEL_INFO.path:
            return httpx.Response(200, json={"model_path": "/m", "weight_version": "3"})
        if request.url.path == base.SERVER_INFO.path:
            return httpx.Response(200, json={"version": self.version})
        return httpx.Response(200, json={"success": True, "message": ""})

    def client(self) -> EngineClient:
        engine = EngineClient("http://engine:30000")
        engine._http = httpx.Client(transport=httpx.MockTransport(self))
        return engine


def engine_client_requests(version: str) -> list[tuple[Route, Any]]:
    """Every request `RolloutEngine`'s control methods send."""
    recorder = Recorder(version)
    engine = recorder.client()
    assert engine.sglang_version() == version
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
    engine.load_lora_adapter("slime-lora", "/ckpt/adapter_v000003")
    engine.unload_lora_adapter("slime-lora")
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
    args = parse_args(["--hf-checkpoint", "/models/qwen3", *REQUIRED, "--rollout-stop", "</tool_call>",
                       "--rollout-stop-token-ids", "151645", "--rollout-max-context-len", "64",
                       "--eval-temperature", "0.6"])
    args.sglang_router_ip, args.sglang_router_port = "engine", 30000
    for evaluation in (False, True):
        params = sglang_rollout.sampling_params_from_args(args, evaluation=evaluation)
        asyncio.run(sglang_rollout.generate(args, Sample(tokens=[1, 2, 3]), params))
        asyncio.run(awm_rollout.engine_policy(args, Sample(tokens=[1, 2]))([1, 2, 3], params))
    return sent


def weight_sync_requests(monkeypatch: pytest.MonkeyPatch, version: str) -> list[tuple[Route, Any]]:
    """The bodies `TensorWeightSync` posts (its payload builders, close()'s group teardown and the
    weight-update session, which it opens only where the engine's version has one)."""
    bucket = [("model.layers.0.mlp.up_proj.weight", torch.zeros(4, 2, dtype=torch.bfloat16)),
              ("lm_head.weight", torch.zeros(8, 2))]
    sent = [
        (base.UPDATE_WEIGHTS_FROM_TENSOR, weight_sync.tensor_update_payload(["c2VyaWFsaXNlZA=="], 3)),
        (base.INIT_WEIGHTS_UPDATE_GROUP, weight_sync.init_group_payload("10.0.0.1", 29500, 1, 3, "slime")),
        (base.UPDATE_WEIGHTS_FROM_DISTRIBUTED, weight_sync.distributed_update_payload(bucket, "slime", 3)),
    ]
    recorder = Recorder(version)
    sync = weight_sync.TensorWeightSync("nccl")
    sync._group, sync._engines = object(), [recorder.client()]
    monkeypatch.setattr(torch.distributed, "destroy_process_group", lambda group: None)
    sync.close()
    with weight_sync.update_session([recorder.client()]):  # every tensor update happens inside one
        pass
    return sent + recorder.requests


# Body-less GETs sent from places a CPU test cannot drive to the wire: SGLangEngine's start-up poll
# and the router relaying a client's GET (it forwards the client's method and path as they came).
BODILESS_GETS = [base.HEALTH_GENERATE, base.LOADS, Route("GET", "/flush_cache"), Route("GET", "/get_model_info"),
                 Route("GET", "/get_server_info")]


def record_requests(version: str) -> list[tuple[Route, Any]]:
    """Every request the project sends to an engine that reports sglang `version`."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        recorded = (engine_client_requests(version) + generate_requests(monkeypatch)
                    + weight_sync_requests(monkeypatch, version))
    return recorded + [(route, None) for route in BODILESS_GETS]


@pytest.fixture
def project_requests(sglang: SglangOracle, model: str) -> list[tuple[Route, Any]]:
    """What the project sends to an engine of this sglang (whose /server_info `version` is sglang's own)."""
    return record_requests(sglang.server_info_version(model))


def test_every_request_body_is_one_sglang_accepts(sglang: SglangOracle, project_requests: list) -> None:
    problems = {f"{route.method} {route.path} {json.dumps(body)}": sglang.check_request(*route, body)
                for route, body in project_requests}

    assert {request: p for request, p in problems.items() if p} == {}


def test_generate_bodies_pass_sglangs_json_contract(sglang: SglangOracle, project_requests: list) -> None:
    """sglang 0.5.23 checks /generate bodies against a typed JSON contract (api_contract) before
    GenerateReqInput; the check above includes it. It can fail: a float where the contract wants ints."""
    if not sglang.features["generate_contract"]:
        pytest.skip(f"sglang {sglang.version} has no sglang.srt.entrypoints.api_contract: its /generate bodies "
                    "are checked against GenerateReqInput and SamplingParams only (the test above)")
    bodies = [body for route, body in project_requests if route == base.GENERATE]
    assert len(bodies) == 4 and all(sglang.check_request("POST", "/generate", body) == [] for body in bodies)
    problems = sglang.check_request("POST", "/generate", {**bodies[0], "input_ids": [1.5, 2]})
    assert any("/generate contract" in p for p in problems), problems


def test_every_engine_route_exists_in_sglang_with_that_method(sglang: SglangOracle) -> None:
    """Each route in the pinned versions that ROUTES_SINCE says serve it, and a version-specific route
    absent from the versions before it (the table is exact, both ways)."""
    served = sglang.routes()

    def has(route: Route) -> bool:
        return route.method in served.get(route.path, [])

    missing = [f"{method} {path}" for method, path in ENGINE_ROUTES if served_by(Route(method, path), sglang.version)
               and not has(Route(method, path))]
    unexpected = [f"{method} {path}" for method, path in ROUTES_SINCE if not served_by(Route(method, path),
                                                                                         sglang.version)
                  and has(Route(method, path))]

    assert missing == [], f"sglang {sglang.version} serves no {missing}"
    assert unexpected == [], f"sglang {sglang.version} serves {unexpected}: lower their ROUTES_SINCE entries"


def test_every_engine_route_has_a_checked_request(sglang: SglangOracle, project_requests: list) -> None:
    """A route added to ENGINE_ROUTES needs a body from the code that sends it in `project_requests`;
    the project sends exactly the routes this version serves (no session routes to 0.5.10)."""
    assert {r for r in ENGINE_ROUTES if served_by(r, sglang.version)} == {route for route, _ in project_requests}


def test_the_session_is_opened_only_on_engines_whose_version_has_it() -> None:
    """Engines of both pinned versions behind one sync: /begin_weight_update and /end_weight_update go
    to the 0.5.23 engine only, each engine's /server_info is asked once, an engine that reports no
    version is an error that says what it expected."""
    old, new = Recorder(pinned("sglang", "cu12")), Recorder(pinned("sglang", "cu13"))
    engines = [old.client(), new.client()]
    for _ in range(2):
        with weight_sync.update_session(engines):
            pass

    assert [route for route, _ in old.requests] == [base.SERVER_INFO]
    assert [route for route, _ in new.requests] == [base.SERVER_INFO] + [base.BEGIN_WEIGHT_UPDATE,
                                                                         base.END_WEIGHT_UPDATE] * 2
    assert base.version_tuple("0.5.10.post1") == (0, 5, 10) < base.version_tuple("v0.5.21") == (0, 5, 21)
    mute = EngineClient("http://engine:30000")
    mute._http = httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(200, json={})))
    with pytest.raises(base.EngineError, match="/server_info reports no sglang version"):
        mute.serves(base.BEGIN_WEIGHT_UPDATE)


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

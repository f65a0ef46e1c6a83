"""The project's LoRA contract with SGLang, checked against both pinned sglangs' own code
(tests/sglang_real.py: 0.5.10 of gpu-cu12, 0.5.23 of gpu-cu13; each `sglang` test runs twice).

- launch flags: the command `launch_command` builds for a LoRA run is parsed by sglang's own
  `prepare_server_args` (exact flags, no abbreviations) into enable_lora, max_lora_rank,
  lora_target_modules and max_loras_per_batch with the values the run asked for (no lora_paths: adapters
  come only from the trainer's sync);
- requests: the adapter routes exist in sglang's FastAPI app (POST), our load / unload bodies build
  sglang's LoadLoRAAdapterReqInput / UnloadLoRAAdapterReqInput, and a /generate body carrying
  `lora_path` builds GenerateReqInput, passes 0.5.23's JSON contract, and is normalised by sglang's own
  `normalize_batch_and_arguments` to the same adapter per prompt as the CPU engine reads it.
"""

from __future__ import annotations

import ast
import asyncio
import json
import subprocess
import sys
import textwrap
from typing import Any

import httpx
import pytest
from sglang_real import SglangOracle, qwen3_4b_folder, sglang_env

from slime.arguments import parse_args
from slime.engine.cpu_server import GenerateRequest
from slime.engine.lora_adapters import (
    DEFAULT_ADAPTER_NAME,
    DEFAULT_MAX_LORAS_PER_BATCH,
    SGLANG_TARGET_MODULES,
    adapter_name,
    generate_lora_fields,
    load_adapter_body,
    parse_target_modules,
    sglang_target_modules,
    unload_adapter_body,
)
from slime.engine.sglang_engine import launch_command
from slime.rollout import sglang_rollout
from slime.utils.types import Sample

REQUIRED = ["--prompt-data", "/data/train.jsonl", "--rollout-batch-size", "2", "--num-rollout", "1"]
LOAD, UNLOAD = "/load_lora_adapter", "/unload_lora_adapter"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The --hf-checkpoint: a Qwen3-4B config folder (sglang 0.5.10 reads the config while parsing)."""
    return str(qwen3_4b_folder(tmp_path_factory.mktemp("Qwen3-4B")))


def run_args(model: str, *flags: str) -> dict[str, Any]:
    """slime's parsed arguments (its own parser) for an SGLang run on `model` with these flags."""
    return vars(parse_args(["--hf-checkpoint", model, *REQUIRED, "--engine-type", "sglang", *flags]))


def sglang_argv(args: dict[str, Any]) -> list[str]:
    command = launch_command(args, port=30001, host="10.0.0.2", base_gpu_id=0, nccl_port=31000)
    assert command[1:3] == ["-m", "sglang.launch_server"]
    return command[3:]


def modules_of(value: Any) -> set[str]:
    """sglang's lora_target_modules field as the oracle reports it (a list, or a set's repr)."""
    if isinstance(value, str):
        value = ast.literal_eval(value)
    return set(value)


# ---- launch flags -----------------------------------------------------------------------------------

LORA_LAUNCHES: dict[str, list[str]] = {
    "rank 16, the default targets (all-linear)": ["--lora-rank", "16"],
    "rank 8, attention subset": ["--lora-rank", "8", "--target-modules", "q_proj,v_proj"],
    "rank 8, all-linear less the MLP": ["--lora-rank", "8", "--target-modules", "all-linear",
                                        "--exclude-modules", "gate_proj,up_proj,down_proj"],
    "rank 32, every module name we map": ["--lora-rank", "32", "--target-modules", ",".join(SGLANG_TARGET_MODULES)],
    "rank 4, starting from an adapter folder": ["--lora-rank", "4", "--target-modules", "q_proj,o_proj",
                                                "--lora-adapter-path", "/ckpt/adapter_v000002"],
}


@pytest.mark.parametrize("name", LORA_LAUNCHES)
def test_lora_launch_flags_parse_with_sglangs_server_args(sglang: SglangOracle, model: str, name: str) -> None:
    args = run_args(model, *LORA_LAUNCHES[name])
    argv = sglang_argv(args)

    parsed = sglang.parse_server_args(argv)

    assert parsed["error"] is None, parsed["error"]
    fields = parsed["fields"]
    assert fields["enable_lora"] is True
    # sglang asserts at start-up (not while parsing) that without --lora-paths both of these are given
    assert "--max-lora-rank" in argv and "--lora-target-modules" in argv
    assert fields["max_lora_rank"] == args["lora_rank"]
    # exactly the modules the trainer adapts (slime.backends.lora reads the same two flags)
    assert modules_of(fields["lora_target_modules"]) == set(parse_target_modules(args["target_modules"],
                                                                                 args["exclude_modules"]))
    assert fields["max_loras_per_batch"] == DEFAULT_MAX_LORAS_PER_BATCH
    assert not fields["lora_paths"]  # also with --lora-adapter-path: the first sync loads that folder


def test_a_run_without_lora_launches_without_lora_flags(sglang: SglangOracle, model: str) -> None:
    argv = sglang_argv(run_args(model))

    parsed = sglang.parse_server_args(argv)

    assert not [a for a in argv if "lora" in a]
    assert parsed["error"] is None and parsed["fields"]["enable_lora"] in (None, False)


def test_sglang_refuses_what_we_refuse(sglang: SglangOracle, model: str) -> None:
    """The check can fail: a module sglang cannot adapt is refused by its parser, and we refuse it first
    with a message."""
    argv = sglang_argv(run_args(model, "--lora-rank", "8", "--target-modules", "q_proj"))
    at = argv.index("--lora-target-modules") + 1
    refused = sglang.parse_server_args([*argv[:at], "mlp", *argv[at + 1:]])

    assert "invalid choice: 'mlp'" in refused["error"]
    with pytest.raises(ValueError, match=r"\['mlp'\] cannot be served by SGLang"):
        sglang_target_modules("q_proj,mlp")


# ---- routes and bodies --------------------------------------------------------------------------------


def test_the_adapter_routes_exist_in_sglang(sglang: SglangOracle) -> None:
    served = sglang.routes()

    assert "POST" in served[LOAD] and "POST" in served[UNLOAD]
    assert sglang.body_struct("POST", LOAD).endswith(":LoadLoRAAdapterReqInput")
    assert sglang.body_struct("POST", UNLOAD).endswith(":UnloadLoRAAdapterReqInput")


def test_our_adapter_bodies_build_sglangs_structs(sglang: SglangOracle) -> None:
    assert sglang.check_request("POST", LOAD, load_adapter_body(DEFAULT_ADAPTER_NAME, "/ckpt/adapter_v000003")) == []
    assert sglang.check_request("POST", UNLOAD, unload_adapter_body(DEFAULT_ADAPTER_NAME)) == []
    # the check can fail: a body without the folder, a name of the wrong type
    assert sglang.check_request("POST", LOAD, {"lora_name": "x"}) != []
    assert sglang.check_request("POST", UNLOAD, {"lora_name": ["x"]}) != []


def rollout_bodies(monkeypatch: pytest.MonkeyPatch, args: Any) -> list[dict[str, Any]]:
    """The /generate bodies slime's default rollout sends for this run (recorded at `post`)."""
    sent: list[dict[str, Any]] = []

    async def post(url: str, payload: Any, *_: Any, **__: Any) -> dict[str, Any]:
        assert httpx.URL(url).path == "/generate"
        sent.append(payload)
        return {"text": "x", "meta_info": {"output_token_logprobs": [[-0.5, 7, None]],
                                           "finish_reason": {"type": "length"}}}

    monkeypatch.setattr(sglang_rollout, "post", post)
    params = sglang_rollout.sampling_params_from_args(args, evaluation=False)
    asyncio.run(sglang_rollout.generate(args, Sample(tokens=[1, 2, 3]), params))
    return sent


def test_a_lora_rollout_names_its_adapter_in_generate(sglang: SglangOracle, model: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The rollout of a LoRA run sends `lora_path` = the adapter's name, in a body sglang accepts; a run
    without LoRA sends none."""
    lora = parse_args(["--hf-checkpoint", model, *REQUIRED, "--lora-rank", "8"])
    lora.sglang_router_ip, lora.sglang_router_port = "engine", 30000
    plain = parse_args(["--hf-checkpoint", model, *REQUIRED])
    plain.sglang_router_ip, plain.sglang_router_port = "engine", 30000

    (body,) = rollout_bodies(monkeypatch, lora)
    (base,) = rollout_bodies(monkeypatch, plain)

    assert body["lora_path"] == adapter_name(lora) == generate_lora_fields(lora)["lora_path"]
    assert "lora_path" not in base
    assert sglang.check_request("POST", "/generate", body) == []


# Bodies with lora_path in each form; each must be normalised by sglang to the adapter per prompt the
# CPU engine reads (a name for all, one per prompt, nulls for base prompts, with n > 1).
LORA_BODIES: list[dict[str, Any]] = [
    {"input_ids": [5, 6, 7], "lora_path": "policy"},
    {"input_ids": [[5, 6, 7], [8, 9]], "lora_path": "policy"},
    {"input_ids": [[5, 6, 7], [8, 9]], "lora_path": ["policy", None]},
    {"input_ids": [[5, 6, 7], [8, 9], [10]], "lora_path": [None, "a", "b"]},
    {"input_ids": [5, 6, 7], "lora_path": "policy", "sampling_params": {"n": 2}},
    {"input_ids": [[5, 6, 7], [8, 9]], "lora_path": ["a", "b"], "sampling_params": {"n": 2}},
]

_SGLANG_READER = textwrap.dedent("""
    import json, sys
    from sglang.srt.managers.io_struct import GenerateReqInput
    answers = []
    for body in json.load(sys.stdin):
        req = GenerateReqInput(**body)
        req.normalize_batch_and_arguments()
        answers.append({"batch_size": req.batch_size, "n": req.parallel_sample_num, "lora_path": req.lora_path,
                        "is_single": bool(req.is_single)})
    print("ANSWERS " + json.dumps(answers))
""")


def test_sglang_normalises_lora_path_as_the_cpu_engine_reads_it(sglang: SglangOracle) -> None:
    for body in LORA_BODIES:
        assert sglang.check_request("POST", "/generate", body) == [], body
    run = subprocess.run([sys.executable, "-c", _SGLANG_READER], input=json.dumps(LORA_BODIES),
                         env=sglang_env(sglang.gpu_set), capture_output=True, text=True, timeout=600)
    lines = [line for line in run.stdout.splitlines() if line.startswith("ANSWERS ")]
    assert run.returncode == 0 and lines, run.stderr[-4000:]

    for body, theirs in zip(LORA_BODIES, json.loads(lines[-1][len("ANSWERS "):]), strict=True):
        ours = GenerateRequest.from_body(body)
        count = len(ours.prompts)
        if theirs["is_single"]:  # one prompt, n == 1: sglang keeps the one name
            assert [theirs["lora_path"]] == ours.adapters, body
            continue
        # a batch (or n > 1): one entry per result, prompt i's adapter at i (sglang repeats the list n times)
        assert len(theirs["lora_path"]) == count * theirs["n"] == count * ours.n, (body, theirs)
        assert theirs["lora_path"][:count] == ours.adapters, (body, theirs)


def test_the_cpu_engine_serves_the_adapter_routes_as_sglang_does(sglang: SglangOracle) -> None:
    from slime.engine.cpu_server import build_app

    app = build_app(batcher=None, tokenizer=None, tokenizer_path="")
    ours = {route.path: route.methods for route in app.routes if route.path in (LOAD, UNLOAD)}

    assert ours == {LOAD: {"POST"}, UNLOAD: {"POST"}}
    served = sglang.routes()
    assert all(set(methods) <= set(served[path]) for path, methods in ours.items())


def test_the_cpu_engine_reads_no_adapter_field_sglang_lacks(sglang: SglangOracle) -> None:
    """The CPU engine's accepted load / unload fields are exactly those of sglang's structs."""
    from slime.engine import cpu_server

    for path, fields in ((LOAD, cpu_server.LOAD_ADAPTER_FIELDS), (UNLOAD, cpu_server.UNLOAD_ADAPTER_FIELDS)):
        struct = sglang.body_struct("POST", path)
        full = {name: ("x" if name != "pinned" else False) for name in fields}
        assert sglang.validate_body(struct, full) is None, (path, full)
        assert sglang.validate_body(struct, {**full, "extra_field": 1}) is not None

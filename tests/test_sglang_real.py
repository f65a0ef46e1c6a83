"""The sglang side-install harness answers from each pinned sglang's real code, and refuses what sglang refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
from sglang_real import GPU_SETS, STUBS, SglangOracle, pinned, qwen3_4b_folder, side_dir, stub_dirs

PINS = {"cu12": "0.5.10", "cu13": "0.5.23"}  # pyproject.toml's gpu-<set> extras (docs/gpu.md)


@pytest.fixture(scope="module")
def qwen3_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Hugging Face folders of Qwen3-4B whose config says float32 / bfloat16 (config only: sglang's
    dtype rule reads nothing else)."""
    return {name: qwen3_4b_folder(tmp_path_factory.mktemp(f"qwen3-{name}"), name) for name in ("float32", "bfloat16")}


def test_the_oracle_runs_the_sets_pinned_sglang(sglang: SglangOracle) -> None:
    assert sglang.version == pinned("sglang", sglang.gpu_set) == PINS[sglang.gpu_set]
    assert side_dir(sglang.gpu_set).is_relative_to(Path(__file__).resolve().parents[1] / ".cache")
    assert side_dir(sglang.gpu_set).parent.name == f"sglang-{sglang.version}"


def test_version_differences_are_reported_not_hidden(sglang: SglangOracle) -> None:
    """0.5.10 lacks the /generate JSON contract and a CPU platform (its device probe raises without an
    accelerator, so the worker answers it); 0.5.23 has both. A new pin must be looked at again."""
    if sglang.version == "0.5.10":
        assert sglang.features == {"generate_contract": False}
        (probe,) = sglang.stand_ins
        assert probe.startswith("sglang.srt.server_args.get_device() answers 'cpu'") and "No accelerator" in probe
    else:
        assert (sglang.features, sglang.stand_ins) == ({"generate_contract": True}, [])


def test_server_args_parser_accepts_real_flags_and_refuses_unknown_ones(
    sglang: SglangOracle, qwen3_folders: dict[str, Path]
) -> None:
    good = sglang.parse_server_args(["--model-path", str(qwen3_folders["bfloat16"]), "--tp-size", "2",
                                     "--mem-fraction-static", "0.7", "--dtype", "bfloat16"])
    assert good["error"] is None
    assert (good["fields"]["tp_size"], good["fields"]["mem_fraction_static"]) == (2, 0.7)
    assert good["fields"]["dtype"] == "bfloat16"
    bad = sglang.parse_server_args(["--model-path", "/m", "--no-such-flag"])
    assert "unrecognized arguments: --no-such-flag" in bad["error"]
    wrong = sglang.parse_server_args(["--model-path", "/m", "--dtype", "fp8"])
    assert "argument --dtype: invalid choice: 'fp8'" in wrong["error"]


def test_requests_are_checked_against_the_endpoint_struct(sglang: SglangOracle) -> None:
    assert "POST" in sglang.routes()["/generate"]
    assert sglang.body_struct("POST", "/abort_request") == "sglang.srt.managers.io_struct:AbortReq"
    assert sglang.check_request("POST", "/abort_request", {"abort_all": True}) == []
    (unknown,) = sglang.check_request("POST", "/abort_request", {"abort_everything": True})
    assert "unknown fields ['abort_everything']" in unknown
    (missing,) = sglang.check_request("POST", "/update_weights_from_disk", {})
    assert "missing fields ['model_path']" in missing
    assert sglang.check_request("GET", "/no_such_route", None) == ["sglang serves no GET /no_such_route"]


def test_server_info_reports_the_sglang_version(sglang: SglangOracle, qwen3_folders: dict[str, Path]) -> None:
    """What slime.engine.base.RolloutEngine.sglang_version reads: sglang's own /server_info handler."""
    assert sglang.server_info_version(qwen3_folders["bfloat16"]) == sglang.version


def test_sglangs_dtype_rule_serves_a_float32_qwen3_in_float16_unless_told(
    sglang: SglangOracle, qwen3_folders: dict[str, Path]
) -> None:
    """Issue 35's bug in sglang's own words: a float32 export under `--dtype auto` is served as float16."""
    assert sglang.serving_dtype(qwen3_folders["float32"]) == "float16"
    assert sglang.serving_dtype(qwen3_folders["float32"], "bfloat16") == "bfloat16"
    assert sglang.serving_dtype(qwen3_folders["bfloat16"]) == "bfloat16"
    assert sglang.serving_dtype(qwen3_folders["bfloat16"], "auto") == "bfloat16"
    with pytest.raises(RuntimeError, match="Unknown dtype: fp8"):
        sglang.serving_dtype(qwen3_folders["bfloat16"], "fp8")


def test_sglang_router_is_one_pin_for_both_sets() -> None:
    """tests/slime/test_sglang_router_real.py runs once: both sets pin the same sglang-router, which
    does not depend on sglang (its wheel requires setproctitle, aiohttp, orjson, uvicorn, fastapi)."""
    assert pinned("sglang-router", "cu12") == pinned("sglang-router", "cu13") == "0.3.2"


def stubs_on_disk() -> dict[str, set[str]]:
    """Stub name -> the GPU sets whose PYTHONPATH (stub_dirs) carries it."""
    found: dict[str, set[str]] = {}
    for gpu_set in GPU_SETS:
        for folder in stub_dirs(gpu_set):
            for path in folder.iterdir():
                if path.is_dir() and path.name not in (*GPU_SETS, "__pycache__") and not path.name.endswith(
                        ".dist-info"):
                    found.setdefault(path.name, set()).add(gpu_set)
    return found


def test_every_stub_is_listed_with_its_reason() -> None:
    assert stubs_on_disk() == {name: set(sets) for name, (sets, _) in STUBS.items()}
    assert all(len(reason) > 40 for _, reason in STUBS.values())

"""The sglang side-install harness answers from sglang's real code, and refuses what sglang refuses."""

from __future__ import annotations

from pathlib import Path

from sglang_real import STUBS, STUBS_DIR, SglangOracle, pinned, side_dir


def test_the_oracle_runs_the_pinned_sglang(sglang: SglangOracle) -> None:
    assert sglang.versions["sglang"] == pinned("sglang") == "0.5.23"
    assert side_dir().is_relative_to(Path(__file__).resolve().parents[1] / ".cache")


def test_server_args_parser_accepts_real_flags_and_refuses_unknown_ones(sglang: SglangOracle) -> None:
    good = sglang.parse_server_args(["--model-path", "/m", "--tp-size", "2", "--mem-fraction-static", "0.7"])
    assert good["error"] is None
    assert (good["fields"]["tp_size"], good["fields"]["mem_fraction_static"]) == (2, 0.7)
    bad = sglang.parse_server_args(["--model-path", "/m", "--no-such-flag"])
    assert "unrecognized arguments: --no-such-flag" in bad["error"]


def test_requests_are_checked_against_the_endpoint_struct(sglang: SglangOracle) -> None:
    assert "POST" in sglang.routes()["/generate"]
    assert sglang.body_struct("POST", "/abort_request") == "sglang.srt.managers.io_struct:AbortReq"
    assert sglang.check_request("POST", "/abort_request", {"abort_all": True}) == []
    (unknown,) = sglang.check_request("POST", "/abort_request", {"abort_everything": True})
    assert "unknown fields ['abort_everything']" in unknown
    (missing,) = sglang.check_request("POST", "/update_weights_from_disk", {})
    assert "missing fields ['model_path']" in missing
    assert sglang.check_request("GET", "/no_such_route", None) == ["sglang serves no GET /no_such_route"]


def test_every_stub_is_listed_with_its_reason() -> None:
    on_disk = {p.name for p in STUBS_DIR.iterdir() if p.is_dir() and not p.name.endswith(".dist-info")}
    on_disk.discard("__pycache__")
    assert on_disk == set(STUBS)

"""SGLangEngine's CPU-checkable parts: the launch command (parsed by both pinned sglangs' own parsers),
the missing-sglang error, and the process handling (own group, health wait, group kill) against a
stand-in server. A real SGLang launch needs a GPU and is not tested here."""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import time

import pytest
from sglang_real import SglangOracle, qwen3_4b_folder

from slime.engine import sglang_engine
from slime.engine.base import EngineError
from slime.engine.sglang_engine import SGLangEngine, SGLangMissingError, launch_command, server_fields

# A stand-in for `sglang.launch_server`: forks a long-lived worker (as SGLang forks its scheduler),
# writes the worker's pid, and answers /health_generate on the given port.
STAND_IN = r"""
import http.server, subprocess, sys
port, pid_file = int(sys.argv[1]), sys.argv[2]
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(pid_file, "w").write(str(worker.pid))
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path in ("/health", "/health_generate") else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def slime_args(**overrides) -> argparse.Namespace:
    values = dict(hf_checkpoint="/models/Qwen3-4B", rollout_num_gpus_per_engine=2, seed=1234,
                  offload_rollout=False, colocate=False, sglang_mem_fraction_static=0.7,
                  sglang_context_length=8192, sglang_dtype="bfloat16", sglang_log_level=None)
    values.update(overrides)
    return argparse.Namespace(**values)


def test_launch_command_maps_slime_flags_to_sglang_flags():
    command = launch_command(slime_args(), port=30001, base_gpu_id=4, nccl_port=29600, seed_offset=3,
                             python="python3")

    assert command == [
        "python3", "-m", "sglang.launch_server", "--model-path", "/models/Qwen3-4B",
        "--base-gpu-id", "4", "--context-length", "8192", "--dtype", "bfloat16", "--enable-metrics",
        "--host", "127.0.0.1", "--mem-fraction-static", "0.7", "--nccl-port", "29600", "--port", "30001",
        "--random-seed", "1237", "--tp-size", "2", "--trust-remote-code",
    ]


def test_sglang_prefixed_fields_override_and_switch_off_defaults():
    fields = server_fields({"hf_checkpoint": "/m", "rollout_num_gpus_per_engine": 1, "sglang_tp": 4,
                            "sglang_enable_metrics": False, "sglang_skip_tokenizer_init": True,
                            "colocate": True, "sglang_model_path": "/other"})

    assert fields == {"model_path": "/other", "tp_size": 4, "enable_metrics": False, "trust_remote_code": True,
                      "skip_tokenizer_init": True, "enable_memory_saver": True, "dtype": "bfloat16"}
    assert server_fields({"hf_checkpoint": "/m", "sglang_dtype": "float16"})["dtype"] == "float16"
    command = launch_command({"sglang_model_path": "/m", "sglang_enable_metrics": False,
                              "sglang_json_model_override_args": {"rope_theta": 1e6}, "sglang_ep_size": 1},
                             port=1, python="py")
    assert "--enable-metrics" not in command
    assert command[command.index("--json-model-override-args") + 1] == '{"rope_theta": 1000000.0}'


def test_these_commands_parse_in_sglang(sglang: SglangOracle, tmp_path):
    """The commands above, with a real model folder (sglang 0.5.10 reads its config while parsing),
    are accepted by sglang's own parser with the values they set, in both pinned versions."""
    model = str(qwen3_4b_folder(tmp_path / "Qwen3-4B"))
    mapped = launch_command(slime_args(hf_checkpoint=model), port=30001, base_gpu_id=4, nccl_port=29600,
                            seed_offset=3)
    overridden = launch_command({"sglang_model_path": model, "sglang_enable_metrics": False,
                                 "sglang_json_model_override_args": {"rope_theta": 1e6}, "sglang_ep_size": 1,
                                 "sglang_skip_tokenizer_init": True}, port=1)

    first, second = (sglang.parse_server_args(command[3:]) for command in (mapped, overridden))

    assert (first["error"], second["error"]) == (None, None), (first["error"], second["error"])
    assert {k: first["fields"][k] for k in ("tp_size", "context_length", "dtype", "mem_fraction_static",
                                            "random_seed", "base_gpu_id", "nccl_port")} == {
        "tp_size": 2, "context_length": 8192, "dtype": "bfloat16", "mem_fraction_static": 0.7, "random_seed": 1237,
        "base_gpu_id": 4, "nccl_port": 29600}
    assert (second["fields"]["enable_metrics"], second["fields"]["skip_tokenizer_init"]) == (False, True)
    assert second["fields"]["json_model_override_args"] == '{"rope_theta": 1000000.0}'


def test_a_model_is_required():
    with pytest.raises(ValueError, match="hf_checkpoint"):
        launch_command({"sglang_dtype": "bfloat16"}, port=1)


def test_module_imports_without_sglang_and_start_says_how_to_install(monkeypatch):
    assert "sglang" not in sys.modules  # importing the module did not import sglang
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sglang" else object())

    with pytest.raises(SGLangMissingError, match=r"bash setup.sh --gpu"):
        SGLangEngine(slime_args()).start()


class StandInEngine(SGLangEngine):
    """SGLangEngine with the launch command swapped for the stand-in server."""

    def __init__(self, pid_file, script=STAND_IN, **kwargs):
        super().__init__(slime_args(), **kwargs)
        self.pid_file, self.script = str(pid_file), script

    def command(self) -> list[str]:
        return [sys.executable, "-c", self.script, str(self.port), self.pid_file]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0): check its state.
    status = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout
    return bool(status.strip()) and not status.strip().startswith("Z")


def test_start_waits_for_health_and_shutdown_kills_the_whole_group(tmp_path):
    engine = StandInEngine(tmp_path / "worker.pid", startup_timeout_s=30)

    url = engine._launch()  # start() minus the sglang check
    launcher = engine.process.pid
    worker = int((tmp_path / "worker.pid").read_text())

    assert url == f"http://127.0.0.1:{engine.port}" and engine.health()
    assert os.getpgid(worker) == launcher  # the worker sits in the launcher's own group
    engine.shutdown(timeout_s=5)
    deadline = time.monotonic() + 5
    while alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(worker) and engine.process is None


def test_a_server_that_dies_during_start_up_is_reported(tmp_path):
    engine = StandInEngine(tmp_path / "x.pid", script="import sys; sys.exit(3)", log_path=tmp_path / "sglang.log")

    with pytest.raises(EngineError, match=r"exited with status 3; see .*sglang.log"):
        engine._launch()
    assert engine.process is None


def test_import_is_cheap_and_sglang_free():
    code = "import sys, slime.engine.sglang_engine; print('sglang' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
    assert sglang_engine.INSTALL_HINT == "install a GPU set (picked from the NVIDIA driver): bash setup.sh --gpu"


def test_slimes_own_sglang_flags_stay_on_the_client_side():
    fields = server_fields(slime_args(sglang_server_concurrency=512, sglang_router_ip="10.0.0.2",
                                      sglang_router_port=30000, sglang_router_request_timeout_secs=14400))
    assert not {"server_concurrency", "router_ip", "router_port", "router_request_timeout_secs"} & fields.keys()
    assert fields["mem_fraction_static"] == 0.7

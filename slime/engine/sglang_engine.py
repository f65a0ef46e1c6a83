"""`SGLangEngine`: one real SGLang server (`python -m sglang.launch_server`) as a `RolloutEngine`.

UNTESTED HERE: SGLang needs a CUDA GPU (platform-facts.md section 6), and this machine has none.
What the CPU tests cover: the command line built from slime-style arguments (`launch_command`, a pure
function), parsed by the pinned sglang's own `prepare_server_args` (tests/slime/test_sglang_conformance.py,
tests/awm_grpo/test_gpu_dry_run.py), the error when sglang is missing, and the process handling (own
process group, wait for `/health_generate`, stop by killing the group) against a stand-in server.

The server runs in its own process group (`start_new_session=True`): SGLang forks a scheduler and a
detokenizer process per TP rank, and killing the group stops all of them, where killing the launcher
alone would leave GPU memory held by orphans. `import slime.engine.sglang_engine` never imports
sglang; `start()` checks that it is installed and says how to get it.

Flags from slime-style arguments (an `argparse.Namespace` or a mapping):

| argument | SGLang flag |
|---|---|
| `hf_checkpoint` | `--model-path` (and the tokenizer) |
| `rollout_num_gpus_per_engine` | `--tp-size` |
| `seed` (+ `seed_offset`, e.g. the engine rank) | `--random-seed` |
| `offload_rollout` / `colocate` | `--enable-memory-saver` (release / resume memory occupation) |
| `lora_rank` > 0 (+ `target_modules`, `exclude_modules`) | `--enable-lora --max-lora-rank R --lora-target-modules M.. --max-loras-per-batch 2` (`slime.engine.lora_adapters`) |
| `sglang_<field>` (any ServerArgs field) | `--<field with dashes>`; overrides the rows above |
| `sglang_server_concurrency`, `sglang_router_*` | nothing: slime's own (client/router side) flags |

`host`, `port`, `base_gpu_id` and `nccl_port` are per engine and given to the constructor.
`--trust-remote-code` and `--enable-metrics` are on unless `sglang_<field>=False`; `--dtype bfloat16` is
always passed unless `sglang_dtype` says otherwise (never SGLang's "auto": see DEFAULT_FIELDS). The tokenizer is
kept (rollouts may send `text` and read `text` back); `sglang_skip_tokenizer_init=True` drops it when
every request sends `input_ids`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from slime.engine.base import EngineError, RolloutEngine
from slime.engine.lora_adapters import lora_server_fields
from slime.utils.misc import free_port

logger = logging.getLogger(__name__)

INSTALL_HINT = "install a GPU set (picked from the NVIDIA driver): bash setup.sh --gpu"
# slime-style argument -> SGLang ServerArgs field, for arguments that are not spelled sglang_*.
DERIVED_FIELDS = {
    "hf_checkpoint": "model_path",
    "rollout_num_gpus_per_engine": "tp_size",
}
# slime's own flags spelled sglang_* that configure the trainer's side, not the server.
SLIME_SIDE_FIELDS = frozenset({"sglang_server_concurrency", "sglang_router_ip", "sglang_router_port",
                               "sglang_router_request_timeout_secs"})
# Always passed unless the caller sets them (sglang_<field>=False turns a switch off). The dtype is
# explicit because SGLang's "auto" reads it from the model folder's config, and serves a float32 config
# as float16: an engine restarted from an fp32 export would serve fp16 beside bf16 ones, silently.
DEFAULT_FIELDS: dict[str, Any] = {"trust_remote_code": True, "enable_metrics": True, "dtype": "bfloat16"}


class SGLangMissingError(EngineError):
    """sglang is not importable in this environment."""


def require_sglang() -> None:
    """Raise `SGLangMissingError` with the install command unless sglang can be imported."""
    if importlib.util.find_spec("sglang") is None:
        raise SGLangMissingError(f"SGLangEngine needs the sglang package, which is not installed: {INSTALL_HINT}")


def _as_dict(args: argparse.Namespace | Mapping[str, Any] | None) -> dict[str, Any]:
    if args is None:
        return {}
    return dict(vars(args)) if isinstance(args, argparse.Namespace) else dict(args)


def server_fields(args: argparse.Namespace | Mapping[str, Any], *, seed_offset: int = 0) -> dict[str, Any]:
    """SGLang ServerArgs fields (underscore names) from slime-style arguments, before per-engine ones."""
    values = _as_dict(args)
    fields: dict[str, Any] = dict(DEFAULT_FIELDS)
    for source, field in DERIVED_FIELDS.items():
        if values.get(source) is not None:
            fields[field] = values[source]
    if values.get("seed") is not None:
        fields["random_seed"] = int(values["seed"]) + seed_offset
    if values.get("offload_rollout") or values.get("colocate"):
        fields["enable_memory_saver"] = True
    fields.update(lora_server_fields(values))  # a LoRA run (lora_rank > 0): sglang's LoRA flags
    for key, value in values.items():
        if key.startswith("sglang_") and key not in SLIME_SIDE_FIELDS and value is not None:
            fields[key[len("sglang_"):]] = value
    if "tp" in fields:  # --sglang-tp is SGLang's alias of tp_size: keep one spelling
        fields["tp_size"] = fields.pop("tp")
    if not fields.get("model_path"):
        raise ValueError("SGLangEngine needs a model: set hf_checkpoint (--hf-checkpoint) or sglang_model_path")
    return fields


def launch_command(
    args: argparse.Namespace | Mapping[str, Any],
    *,
    port: int,
    host: str = "127.0.0.1",
    base_gpu_id: int | None = None,
    nccl_port: int | None = None,
    seed_offset: int = 0,
    python: str = sys.executable,
) -> list[str]:
    """The `python -m sglang.launch_server ...` argv for one engine (pure: no sglang import).

    Booleans become bare switches (False: omitted), lists repeat their values after one flag,
    dicts are passed as JSON, everything else as `str(value)`. Fields come out sorted, after the
    model path, so equal arguments give equal commands.
    """
    fields = server_fields(args, seed_offset=seed_offset)
    fields.update(host=host, port=port)
    if base_gpu_id is not None:
        fields["base_gpu_id"] = base_gpu_id
    if nccl_port is not None:
        fields["nccl_port"] = nccl_port
    command = [python, "-m", "sglang.launch_server", "--model-path", str(fields.pop("model_path"))]
    for field in sorted(fields):
        command += _flag(field, fields[field])
    return command


def _flag(field: str, value: Any) -> list[str]:
    flag = "--" + field.replace("_", "-")
    if isinstance(value, bool):
        return [flag] if value else []
    if isinstance(value, (list, tuple)):
        return [flag, *(str(v) for v in value)] if value else []
    if isinstance(value, dict):
        return [flag, json.dumps(value)]
    return [flag, str(value)]


class SGLangEngine(RolloutEngine):
    """Launch, health-wait and stop one SGLang server; the HTTP control surface is the base class's.

    UNTESTED HERE (no GPU): written against SGLang's `launch_server` CLI and HTTP API.
    """

    def __init__(
        self,
        args: argparse.Namespace | Mapping[str, Any],
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        base_gpu_id: int | None = None,
        nccl_port: int | None = None,
        seed_offset: int = 0,
        env: Mapping[str, str] | None = None,
        log_path: str | os.PathLike | None = None,
        startup_timeout_s: float = 1200.0,
        health_path: str = "/health_generate",
    ):
        self.args = args
        self.host, self.port = host, port
        self.base_gpu_id, self.nccl_port, self.seed_offset = base_gpu_id, nccl_port, seed_offset
        self.env = dict(env or {})
        self.log_path = Path(log_path) if log_path is not None else None
        self.startup_timeout_s = startup_timeout_s
        self.health_path = health_path
        self.process: subprocess.Popen | None = None
        self._log_file: Any = None

    def command(self) -> list[str]:
        return launch_command(self.args, port=self.port or 0, host=self.host, base_gpu_id=self.base_gpu_id,
                              nccl_port=self.nccl_port, seed_offset=self.seed_offset)

    def start(self) -> str:
        require_sglang()
        return self._launch()

    def _launch(self) -> str:
        if self.process is not None and self.process.poll() is None:
            return self.url
        if not self.port:
            self.port = free_port(self.host)
        command = self.command()
        self.url = f"http://{self.host}:{self.port}"
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_file = open(self.log_path, "ab")  # noqa: SIM115 (closed in shutdown)
        logger.info("launching SGLang: %s", " ".join(command))
        self.process = subprocess.Popen(
            command,
            env={**os.environ, **self.env},
            stdout=self._log_file or subprocess.DEVNULL,
            stderr=subprocess.STDOUT if self._log_file else subprocess.DEVNULL,
            start_new_session=True,  # own process group: shutdown kills the workers SGLang forks too
        )
        self._wait_ready()
        return self.url

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            code = self.process.poll()
            if code is not None:
                self.shutdown()
                where = f"; see {self.log_path}" if self.log_path else "; pass log_path= to keep its output"
                raise EngineError(f"SGLang server for port {self.port} exited with status {code}{where}")
            try:
                if self._client().get(f"{self.url}{self.health_path}", timeout=30.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.shutdown()
                raise EngineError(f"SGLang server on {self.url} not healthy after {self.startup_timeout_s} s")
            time.sleep(1.0)

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the whole process group, SIGKILL it if it is still there after `timeout_s`."""
        if self.process is not None:
            self._signal_group(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.process.wait(timeout=10)
            self._signal_group(signal.SIGKILL)  # workers that outlived the launcher
            self.process = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if getattr(self, "_http", None) is not None:
            self._http.close()
            self._http = None

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.process.pid, sig)  # pgid == pid: the launcher leads its own session
        except ProcessLookupError:
            pass

"""SGLang's receiving side of the NCCL weight sync, on the CPU over gloo, with sglang's own code.

    python sglang_weight_receiver.py OUT.pt      (PYTHONPATH from tests/sglang_real.sglang_env())

Prints `listening on http://127.0.0.1:PORT` and serves the engine routes `TensorWeightSync` calls.
What runs is sglang 0.5.23's code from the HTTP body on:

  body   -> sglang.srt.managers.io_struct request struct, validated as sglang's FastAPI app does (pydantic
            through the structs' own core schema): a missing or mistyped field answers 422
  struct -> SchedulerWeightUpdaterManager (sglang's scheduler side: the begin/end session, refusing
            updates outside it, the receive, the version record)
         -> TpModelWorker.init_weights_update_group / destroy_weights_update_group
         -> model runner WeightUpdater.init_weights_update_group (init_custom_process_group with its
            rendezvous and PrefixStore) and .receive_weights_from_distributed (its broadcast receive loop)

Stand-ins, for what needs a GPU model: the runner whose `load_weights_from_distributed` would copy
the received tensors into the model records them instead (written to OUT.pt at `/end_weight_update`),
the scheduler's `record_weight_version_change` records the version, and `/pause_generation`,
`/continue_generation`, `/flush_cache` answer 200 (no requests run here). The answers' status codes
are http_server's: 200 on success, 400 with {"success": false, "message": ...} otherwise.
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pydantic
import torch
import torch.distributed as dist
from sglang.srt.managers import io_struct
from sglang.srt.managers.scheduler_components.weight_updater import SchedulerWeightUpdaterManager
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.model_executor.model_runner_components.weight_updater import WeightUpdater


class RecordingRunner:
    """The model runner's load step: keeps what would be loaded into the model (a GPU model here)."""

    def __init__(self) -> None:
        self.loaded: list[tuple[str, torch.Tensor]] = []
        self.sessions: list[str] = []
        self.weight_updater = self

    def begin_weight_update(self) -> None:
        self.sessions.append("begin")

    def end_weight_update(self, *, run_post_load: bool) -> None:
        self.sessions.append("end")

    def load_weights_from_distributed(self, named_tensors: list[tuple[str, torch.Tensor]]) -> tuple[bool, str]:
        self.loaded += [(name, tensor.clone()) for name, tensor in named_tensors]
        return True, "recorded"


class TpWorker:
    """sglang's TpModelWorker methods over a model runner that holds sglang's real WeightUpdater."""

    init_weights_update_group = TpModelWorker.init_weights_update_group
    destroy_weights_update_group = TpModelWorker.destroy_weights_update_group

    def __init__(self, runner: RecordingRunner) -> None:
        updater = WeightUpdater(tp_rank=0, device="cpu", gpu_id=0, model_config=None, custom_weight_loaders={},
                                get_model=lambda: None, update_model_fields=lambda *a, **k: None,
                                recapture_cuda_graph=lambda: None, get_model_runner=lambda: None)
        self.model_runner = SimpleNamespace(weight_updater=updater)
        self.runner = runner

    def weight_update_runners(self) -> list[tuple[str, Any]]:
        return [("target", self.runner)]


def scheduler_manager(tp_worker: TpWorker, versions: list[str | None]) -> SchedulerWeightUpdaterManager:
    """sglang's manager without its __post_init__ (which reads the TP group from a running server):
    its fields set directly, the TP CPU group being this process's one-rank gloo group."""
    manager = SchedulerWeightUpdaterManager.__new__(SchedulerWeightUpdaterManager)
    fields = dict(tp_worker=tp_worker, draft_worker=None, memory_saver_adapter=None,
                  flush_cache=lambda **kw: True, is_fully_idle=lambda **kw: True,
                  scheduler=SimpleNamespace(record_weight_version_change=lambda new_version: versions.append(
                      new_version)),
                  metrics_collector=None, offload_tags=set(), stashed_model_static_state=None, _session=None,
                  tp_cpu_group=dist.group.WORLD)
    for name, value in fields.items():
        setattr(manager, name, value)
    return manager


ROUTES = {  # path -> (io_struct request class, manager method)
    "/init_weights_update_group": (io_struct.InitWeightsUpdateGroupReqInput, "init_weights_update_group"),
    "/destroy_weights_update_group": (io_struct.DestroyWeightsUpdateGroupReqInput, "destroy_weights_update_group"),
    "/begin_weight_update": (io_struct.BeginWeightUpdateReqInput, "begin_weight_update"),
    "/end_weight_update": (io_struct.EndWeightUpdateReqInput, "end_weight_update"),
    "/update_weights_from_distributed": (io_struct.UpdateWeightsFromDistributedReqInput,
                                         "update_weights_from_distributed"),
}
NO_OP = ("/pause_generation", "/continue_generation", "/flush_cache")


def serve(out: str) -> None:
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)  # sglang's TP group
    runner, versions = RecordingRunner(), []
    manager = scheduler_manager(TpWorker(runner), versions)
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if self.path in NO_OP:
                return self._answer(200, {"success": True, "message": "no requests run here"})
            if self.path not in ROUTES:
                return self._answer(404, {"detail": "Not Found"})
            struct, method = ROUTES[self.path]
            try:
                request = pydantic.TypeAdapter(struct).validate_python(body)
            except pydantic.ValidationError as exc:
                return self._answer(422, {"detail": str(exc)})
            if self.path == "/init_weights_update_group":  # blocks until the trainer meets it: no lock
                reply = getattr(manager, method)(request)
            else:
                with lock:
                    reply = getattr(manager, method)(request)
            if self.path == "/end_weight_update" and reply.success:
                torch.save({"loaded": runner.loaded, "sessions": runner.sessions, "versions": versions}, out)
            self._answer(200 if reply.success else 400, {"success": reply.success, "message": reply.message})

        def _answer(self, status: int, content: dict[str, Any]) -> None:
            data = json.dumps(content).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    serve(sys.argv[1])

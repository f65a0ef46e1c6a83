"""SGLang's receiving side of the NCCL weight sync, on the CPU over gloo, with sglang's own code.

    python sglang_weight_receiver.py OUT.pt      (PYTHONPATH from tests/sglang_real.sglang_env())

Prints `listening on http://127.0.0.1:PORT` and serves the engine routes `TensorWeightSync` calls.
What runs is sglang 0.5.23's code from the HTTP body on:

  body   -> sglang.srt.managers.io_struct request struct, as sglang's http_server declares its routes
            (FastAPI, `Annotated[<struct>, Body()]`): a missing or mistyped field answers 422
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

# No `from __future__ import annotations`: FastAPI reads each endpoint's body type from its signature.
import socket
import sys
import threading
from types import SimpleNamespace
from typing import Annotated, Any

import torch
import torch.distributed as dist
import uvicorn
from fastapi import Body, FastAPI
from fastapi.responses import JSONResponse
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


def build_app(out: str) -> FastAPI:
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)  # sglang's TP group
    runner, versions = RecordingRunner(), []
    manager = scheduler_manager(TpWorker(runner), versions)
    lock = threading.Lock()  # one weight-update call at a time, as sglang's scheduler loop runs them
    app = FastAPI()

    def add_route(path: str, struct: type, method: str) -> None:
        def endpoint(obj: Annotated[struct, Body()]) -> JSONResponse:
            if path == "/init_weights_update_group":  # blocks until the trainer meets it
                reply = getattr(manager, method)(obj)
            else:
                with lock:
                    reply = getattr(manager, method)(obj)
            if path == "/end_weight_update" and reply.success:
                torch.save({"loaded": runner.loaded, "sessions": runner.sessions, "versions": versions}, out)
            return JSONResponse({"success": reply.success, "message": reply.message},
                                status_code=200 if reply.success else 400)

        app.post(path)(endpoint)  # a plain def: FastAPI runs it in its thread pool

    for path, (struct, method) in ROUTES.items():
        add_route(path, struct, method)
    for path in NO_OP:
        app.post(path)(lambda: {"success": True, "message": "no requests run here"})
    return app


def serve(out: str) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(build_app(out), log_level="warning"))
    print(f"listening on http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    server.run(sockets=[sock])


if __name__ == "__main__":
    serve(sys.argv[1])

"""SGLang's receiving side of the NCCL weight sync, on the CPU over gloo, with sglang's own code.

    python sglang_weight_receiver.py OUT.pt      (PYTHONPATH from tests/sglang_real.sglang_env(gpu_set))

Prints `listening on http://127.0.0.1:PORT` and serves the engine routes `TensorWeightSync` calls,
exactly those of them that this sglang's own FastAPI app serves (so sglang 0.5.10 answers 404 to
`/begin_weight_update`, as its server does). What runs is the installed sglang's code from the HTTP
body on, wired the way that version wires it:

  body   -> sglang.srt.managers.io_struct request struct, as sglang's http_server declares its routes
            (FastAPI): a missing or mistyped field answers 422
  sglang 0.5.21 and later (0.5.23, gpu-cu13):
  struct -> SchedulerWeightUpdaterManager (the scheduler side: the begin/end session, refusing updates
            outside it, the receive, the version record)
         -> TpModelWorker.init_weights_update_group / destroy_weights_update_group
         -> model runner WeightUpdater.init_weights_update_group (init_custom_process_group with its
            rendezvous and PrefixStore) and .receive_weights_from_distributed (its broadcast receive loop)
  sglang 0.5.10 (gpu-cu12; no session):
  struct -> SchedulerUpdateWeightsMixin (the scheduler side) -> TpModelWorker -> ModelRunner's own
            init_weights_update_group / update_weights_from_distributed (its broadcast receive loop) /
            destroy_weights_update_group

Stand-ins, for what needs a GPU model or a running server: the model whose load step would copy the
received tensors into GPU memory records them instead (written to OUT.pt after every successful
weight-update call), the weight version is recorded where sglang records it (0.5.23: the scheduler's
`record_weight_version_change`; 0.5.10: the tokenizer manager after a successful update),
`/pause_generation`, `/continue_generation`, `/flush_cache` answer 200 (no requests run here), and
`/server_info` answers only its `version` field (tests/test_sglang_real.py runs sglang's own handler
for that field). The answers' status codes are http_server's: 200 on success, 400 with
{"success": false, "message": ...} otherwise.
"""

# No `from __future__ import annotations`: FastAPI reads each endpoint's body type from its signature.
import socket
import sys
import threading
from importlib.metadata import version
from types import SimpleNamespace
from typing import Annotated, Any

import torch
import torch.distributed as dist
import uvicorn
from fastapi import Body, FastAPI
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from sglang.srt.entrypoints import http_server
from sglang.srt.managers import io_struct
from sglang.srt.managers.tp_worker import TpModelWorker

SGLANG_VERSION = version("sglang")


class Record:
    """What reached the model's load step, the session calls and the versions recorded, in order."""

    def __init__(self) -> None:
        self.loaded: list[tuple[str, torch.Tensor]] = []
        self.sessions: list[str] = []
        self.versions: list[str | None] = []

    def load(self, named_tensors: Any) -> None:
        self.loaded += [(name, tensor.clone()) for name, tensor in named_tensors]

    def save(self, out: str) -> None:
        torch.save({"loaded": self.loaded, "sessions": self.sessions, "versions": self.versions}, out)


# ---- sglang 0.5.21 and later: the weight-update session ------------------------------------------


class RecordingRunner:
    """The model runner's load step: keeps what would be loaded into the model (a GPU model here)."""

    def __init__(self, record: Record) -> None:
        self.record = record
        self.weight_updater = self

    def begin_weight_update(self) -> None:
        self.record.sessions.append("begin")

    def end_weight_update(self, *, run_post_load: bool) -> None:
        self.record.sessions.append("end")

    def load_weights_from_distributed(self, named_tensors: list[tuple[str, torch.Tensor]]) -> tuple[bool, str]:
        self.record.load(named_tensors)
        return True, "recorded"


def session_manager(record: Record) -> Any:
    """sglang's SchedulerWeightUpdaterManager without its __post_init__ (which reads the TP group from a
    running server): its fields set directly, the TP CPU group being this process's one-rank gloo group,
    over sglang's TpModelWorker methods and a model runner holding sglang's real WeightUpdater."""
    from sglang.srt.managers.scheduler_components.weight_updater import SchedulerWeightUpdaterManager
    from sglang.srt.model_executor.model_runner_components.weight_updater import WeightUpdater

    class TpWorker:
        init_weights_update_group = TpModelWorker.init_weights_update_group
        destroy_weights_update_group = TpModelWorker.destroy_weights_update_group

        def __init__(self) -> None:
            updater = WeightUpdater(tp_rank=0, device="cpu", gpu_id=0, model_config=None, custom_weight_loaders={},
                                    get_model=lambda: None, update_model_fields=lambda *a, **k: None,
                                    recapture_cuda_graph=lambda: None, get_model_runner=lambda: None)
            self.model_runner = SimpleNamespace(weight_updater=updater)
            self.runner = RecordingRunner(record)

        def weight_update_runners(self) -> list[tuple[str, Any]]:
            return [("target", self.runner)]

    manager = SchedulerWeightUpdaterManager.__new__(SchedulerWeightUpdaterManager)
    fields = dict(tp_worker=TpWorker(), draft_worker=None, memory_saver_adapter=None,
                  flush_cache=lambda **kw: True, is_fully_idle=lambda **kw: True,
                  scheduler=SimpleNamespace(record_weight_version_change=lambda new_version: record.versions.append(
                      new_version)),
                  metrics_collector=None, offload_tags=set(), stashed_model_static_state=None, _session=None,
                  tp_cpu_group=dist.group.WORLD)
    for name, value in fields.items():
        setattr(manager, name, value)
    return manager


# ---- sglang 0.5.10: no session, the model runner receives -----------------------------------------


def direct_scheduler(record: Record) -> Any:
    """sglang 0.5.10's scheduler mixin over its TpModelWorker and ModelRunner methods; the runner's
    state is what its __init__ would set for these calls (TP rank 0, the update groups, a model)."""
    from sglang.srt.managers.scheduler_update_weights_mixin import SchedulerUpdateWeightsMixin
    from sglang.srt.model_executor.model_runner import ModelRunner

    class Runner:
        init_weights_update_group = ModelRunner.init_weights_update_group
        destroy_weights_update_group = ModelRunner.destroy_weights_update_group
        update_weights_from_distributed = ModelRunner.update_weights_from_distributed
        _update_bucketed_weights_from_distributed = ModelRunner._update_bucketed_weights_from_distributed

        def __init__(self) -> None:
            self.tp_rank, self.device, self._model_update_group = 0, "cpu", {}
            self.model = SimpleNamespace(load_weights=record.load)

    class TpWorker:
        init_weights_update_group = TpModelWorker.init_weights_update_group
        destroy_weights_update_group = TpModelWorker.destroy_weights_update_group
        update_weights_from_distributed = TpModelWorker.update_weights_from_distributed

        def __init__(self) -> None:
            self.model_runner = Runner()

    class Scheduler:
        init_weights_update_group = SchedulerUpdateWeightsMixin.init_weights_update_group
        destroy_weights_update_group = SchedulerUpdateWeightsMixin.destroy_weights_update_group
        update_weights_from_distributed = SchedulerUpdateWeightsMixin.update_weights_from_distributed

        def __init__(self) -> None:
            self.tp_worker = TpWorker()

        def flush_cache(self) -> bool:
            return True

    return Scheduler()


# ---- the HTTP side ---------------------------------------------------------------------------------

ROUTES = {  # path -> (io_struct request class name, scheduler-side method)
    "/init_weights_update_group": ("InitWeightsUpdateGroupReqInput", "init_weights_update_group"),
    "/destroy_weights_update_group": ("DestroyWeightsUpdateGroupReqInput", "destroy_weights_update_group"),
    "/begin_weight_update": ("BeginWeightUpdateReqInput", "begin_weight_update"),
    "/end_weight_update": ("EndWeightUpdateReqInput", "end_weight_update"),
    "/update_weights_from_distributed": ("UpdateWeightsFromDistributedReqInput", "update_weights_from_distributed"),
}
NO_OP = ("/pause_generation", "/continue_generation", "/flush_cache")


def served_by_sglang() -> set[str]:
    """The POST paths of this sglang's own FastAPI app."""
    return {r.path for r in http_server.app.routes if isinstance(r, APIRoute) and "POST" in r.methods}


SESSIONS = "/begin_weight_update" in served_by_sglang()  # which wiring: what this sglang's app serves


def build_app(out: str) -> FastAPI:
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)  # sglang's TP group
    record = Record()
    scheduler = session_manager(record) if SESSIONS else direct_scheduler(record)
    lock = threading.Lock()  # one weight-update call at a time, as sglang's scheduler loop runs them
    app = FastAPI()

    def add_route(path: str, struct: type, method: str) -> None:
        def endpoint(obj: Annotated[struct, Body()]) -> JSONResponse:
            if path == "/init_weights_update_group":  # blocks until the trainer meets it
                reply = getattr(scheduler, method)(obj)
            else:
                with lock:
                    reply = getattr(scheduler, method)(obj)
            if reply.success:
                if not SESSIONS and path == "/update_weights_from_distributed" and obj.weight_version is not None:
                    record.versions.append(obj.weight_version)  # 0.5.10's tokenizer manager records it here
                record.save(out)
            return JSONResponse({"success": reply.success, "message": reply.message},
                                status_code=200 if reply.success else 400)

        app.post(path)(endpoint)  # a plain def: FastAPI runs it in its thread pool

    served = served_by_sglang()
    for path, (struct, method) in ROUTES.items():
        if path in served:
            add_route(path, getattr(io_struct, struct), method)
    for path in NO_OP:
        app.post(path)(lambda: {"success": True, "message": "no requests run here"})
    app.get("/server_info")(lambda: {"version": SGLANG_VERSION})
    return app


def serve(out: str) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(build_app(out), log_level="warning"))
    print(f"listening on http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    server.run(sockets=[sock])


if __name__ == "__main__":
    serve(sys.argv[1])

"""The engine interface: start / stop are per engine, the HTTP control surface is shared."""

from __future__ import annotations

import abc
import re
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import httpx

from slime.engine.lora_adapters import load_adapter_body, unload_adapter_body


class Route(NamedTuple):
    """One kind of HTTP request the project sends to an SGLang engine."""

    method: str
    path: str


GENERATE = Route("POST", "/generate")
HEALTH = Route("GET", "/health")
HEALTH_GENERATE = Route("GET", "/health_generate")
FLUSH_CACHE = Route("POST", "/flush_cache")
MODEL_INFO = Route("GET", "/model_info")  # stock sglang's home of `weight_version` (no /get_weight_version)
SERVER_INFO = Route("GET", "/server_info")  # `version`: the engine's sglang version (RolloutEngine.sglang_version)
UPDATE_WEIGHTS_FROM_DISK = Route("POST", "/update_weights_from_disk")
PAUSE_GENERATION = Route("POST", "/pause_generation")
CONTINUE_GENERATION = Route("POST", "/continue_generation")
RELEASE_MEMORY = Route("POST", "/release_memory_occupation")
RESUME_MEMORY = Route("POST", "/resume_memory_occupation")
ABORT = Route("POST", "/abort_request")
LOADS = Route("GET", "/v1/loads")  # requests running / waiting per DP rank: is an engine idle after an abort?
UPDATE_WEIGHTS_FROM_TENSOR = Route("POST", "/update_weights_from_tensor")
INIT_WEIGHTS_UPDATE_GROUP = Route("POST", "/init_weights_update_group")
UPDATE_WEIGHTS_FROM_DISTRIBUTED = Route("POST", "/update_weights_from_distributed")
DESTROY_WEIGHTS_UPDATE_GROUP = Route("POST", "/destroy_weights_update_group")
BEGIN_WEIGHT_UPDATE = Route("POST", "/begin_weight_update")  # sglang >= 0.5.21 loads tensors only inside
END_WEIGHT_UPDATE = Route("POST", "/end_weight_update")  # a begin ... end session (slime.weight_sync)
LOAD_LORA_ADAPTER = Route("POST", "/load_lora_adapter")  # a LoRA run's adapter sync (slime.engine.lora_adapters)
UNLOAD_LORA_ADAPTER = Route("POST", "/unload_lora_adapter")

# Every request the project sends to an engine, including what the router forwards (it relays the
# client's method for /flush_cache and the deprecated info routes). tests/slime/test_sglang_conformance.py
# checks each against both pinned sglangs' own FastAPI apps and request structs (0.5.10 of the gpu-cu12
# set, 0.5.23 of gpu-cu13), and fails on an engine route named anywhere in the code that is missing here.
ENGINE_ROUTES: tuple[Route, ...] = (
    GENERATE, HEALTH, HEALTH_GENERATE, FLUSH_CACHE, Route("GET", "/flush_cache"), MODEL_INFO,
    Route("GET", "/get_model_info"), SERVER_INFO, Route("GET", "/get_server_info"), UPDATE_WEIGHTS_FROM_DISK,
    PAUSE_GENERATION, CONTINUE_GENERATION, RELEASE_MEMORY, RESUME_MEMORY, ABORT, LOADS,
    UPDATE_WEIGHTS_FROM_TENSOR, INIT_WEIGHTS_UPDATE_GROUP, UPDATE_WEIGHTS_FROM_DISTRIBUTED,
    DESTROY_WEIGHTS_UPDATE_GROUP, BEGIN_WEIGHT_UPDATE, END_WEIGHT_UPDATE, LOAD_LORA_ADAPTER, UNLOAD_LORA_ADAPTER,
)
# The routes of ENGINE_ROUTES that only newer sglang versions serve: route -> the first version that
# serves it (read from sglang's wheels). Code that sends one asks `engine.serves(route)` first; every
# other route is served by both pinned versions. sglang 0.5.21 added the weight-update session and from
# then on loads tensors only inside it; 0.5.10 has neither and loads them at once. The conformance test
# checks each entry both ways: served by the pinned versions at or after it, absent before it.
ROUTES_SINCE: dict[Route, str] = {BEGIN_WEIGHT_UPDATE: "0.5.21", END_WEIGHT_UPDATE: "0.5.21"}


CPU_ENGINE = "slime-cpu"  # the `engine` field of the CPU engine's /server_info (slime.engine.cpu_server)


def version_tuple(version: str) -> tuple[int, ...]:
    """(0, 5, 10) for "0.5.10", "0.5.10.post1" or "v0.5.10": the release numbers, compared as numbers."""
    match = re.match(r"v?(\d+(?:\.\d+)*)", version.strip())
    if match is None:
        raise EngineError(f"cannot read the sglang version {version!r}: expected numbers such as 0.5.23")
    return tuple(int(part) for part in match.group(1).split("."))


def served_by(route: Route, version: str) -> bool:
    """Whether sglang `version` serves `route` (ROUTES_SINCE; a route not listed there: always)."""
    since = ROUTES_SINCE.get(route)
    return since is None or version_tuple(version) >= version_tuple(since)


class EngineError(RuntimeError):
    """An engine control call failed (non-2xx reply or the engine is unreachable)."""


class RolloutEngine(abc.ABC):
    """start / generate / health / flush / update weights / pause / release memory / abort / shutdown over HTTP."""

    url: str = ""
    request_timeout_s: float = 600.0

    @abc.abstractmethod
    def start(self) -> str:
        """Start serving and return the base URL once `/health` answers."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Stop serving and release the model; in-flight requests end with finish_reason abort."""

    def generate(self, payload: dict[str, Any]) -> dict[str, Any] | list[dict[str, Any]]:
        """POST /generate with SGLang's body (input_ids, sampling_params, return_logprob, ...)."""
        return self._call(*GENERATE, payload).json()

    def health(self) -> bool:
        try:
            return self._client().get(f"{self.url}{HEALTH.path}", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False

    def flush_cache(self, timeout_s: float = 60.0) -> None:
        """Flush the prefix cache, retrying while requests still run (slime waits up to 60 s)."""
        deadline = time.monotonic() + timeout_s
        while True:
            reply = self._client().post(f"{self.url}{FLUSH_CACHE.path}", timeout=10.0)
            if reply.status_code == 200:
                return
            if time.monotonic() > deadline:
                raise EngineError(f"{self.url}/flush_cache still busy after {timeout_s} s: {reply.text}")
            time.sleep(0.2)

    def update_weights_from_disk(self, model_path: str, weight_version: str | None = None) -> str:
        """Reload weights from a HF folder; returns the engine's new weight version."""
        body: dict[str, Any] = {"model_path": model_path}
        if weight_version is not None:
            body["weight_version"] = weight_version
        reply = self._call(*UPDATE_WEIGHTS_FROM_DISK, body).json()
        if not reply.get("success"):
            raise EngineError(f"{self.url} refused the weights in {model_path}: {reply.get('message')}")
        return self.weight_version()

    def weight_version(self) -> str:
        """The version the engine serves, from `GET /model_info` (stock sglang has no /get_weight_version)."""
        info = self._call(*MODEL_INFO).json()
        if info.get("weight_version") is None:
            raise EngineError(f"{self.url}{MODEL_INFO.path} reports no weight_version: is it an SGLang server?")
        return str(info["weight_version"])

    def server_info(self) -> dict[str, Any]:
        """`GET /server_info`, asked once per engine object."""
        info = getattr(self, "_server_info", None)
        if info is None:
            info = self._call(*SERVER_INFO).json()
            if not isinstance(info, dict):
                raise EngineError(f"{self.url}{SERVER_INFO.path} answered {info!r}, not an object")
            self._server_info = info
        return info

    def sglang_version(self) -> str:
        """The engine's sglang version: the `version` field of `GET /server_info`, which both pinned
        versions report (0.5.10 and 0.5.23); asked once per engine object."""
        version = self.server_info().get("version")
        if not isinstance(version, str):
            raise EngineError(f"{self.url}{SERVER_INFO.path} reports no sglang version: is it an SGLang server?")
        return version

    def serves(self, route: Route) -> bool:
        """Whether this engine's sglang serves `route` (see ROUTES_SINCE; asks its version only for those).
        The CPU engine (`engine: slime-cpu` in /server_info) serves none of ROUTES_SINCE."""
        if route not in ROUTES_SINCE:
            return True
        if self.server_info().get("engine") == CPU_ENGINE:
            return False
        return served_by(route, self.sglang_version())

    def pause_generation(self) -> None:
        self._call(*PAUSE_GENERATION, {})

    def continue_generation(self) -> None:
        self._call(*CONTINUE_GENERATION, {})

    def release_memory_occupation(self) -> None:
        """Free the engine's model memory (weights, KV cache, CUDA graphs) for a colocated trainer.
        Generation fails until `resume_memory_occupation`; released weights must be re-sent."""
        self._call(*RELEASE_MEMORY, {})

    def resume_memory_occupation(self, tags: Sequence[str] | None = None) -> None:
        """Re-allocate the given memory kinds (`weights`, `kv_cache`, `cuda_graph`; all when None)."""
        self._call(*RESUME_MEMORY, {"tags": list(tags)} if tags is not None else {})

    def load_lora_adapter(self, name: str, path: str) -> dict[str, Any]:
        """Serve the peft adapter folder `path` as `name` (what /generate's `lora_path` then names);
        returns sglang's `loaded_adapters`. sglang refuses a name already loaded: unload it first."""
        reply = self._call(*LOAD_LORA_ADAPTER, load_adapter_body(name, path))
        return reply.json().get("loaded_adapters") or {}

    def unload_lora_adapter(self, name: str) -> dict[str, Any]:
        """Stop serving adapter `name`; returns sglang's `loaded_adapters`."""
        return self._call(*UNLOAD_LORA_ADAPTER, unload_adapter_body(name)).json().get("loaded_adapters") or {}

    def abort(self, rid: str | None = None) -> None:
        """Abort one request by rid, or all requests when rid is None."""
        self._call(*ABORT, {"rid": rid} if rid is not None else {"abort_all": True})

    def _client(self) -> httpx.Client:
        client = getattr(self, "_http", None)
        if client is None:
            # trust_env=False: engine URLs are local or cluster-internal, never behind a proxy.
            client = self._http = httpx.Client(timeout=self.request_timeout_s, trust_env=False)
        return client

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        if not self.url:
            raise EngineError(f"{type(self).__name__} is not started: call start() first")
        try:
            reply = self._client().request(method, f"{self.url}{path}", json=body)
        except httpx.HTTPError as exc:
            raise EngineError(f"{method} {self.url}{path} failed: {exc}") from exc
        if reply.status_code >= 300:
            raise EngineError(f"{method} {self.url}{path} answered {reply.status_code}: {reply.text}")
        return reply


class EngineClient(RolloutEngine):
    """An engine started elsewhere (another actor, another node), controlled over HTTP at `url`."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")

    def start(self) -> str:
        return self.url

    def shutdown(self) -> None:
        """Only closes this client: the engine belongs to whoever started it."""
        if getattr(self, "_http", None) is not None:
            self._http.close()
            self._http = None

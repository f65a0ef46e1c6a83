"""A CPU inference server that answers SGLang's HTTP subset for RL over any HF causal LM folder.

    python -m slime.engine.cpu_server --model-path DIR [--host 127.0.0.1] [--port 0]

prints `cpu_server listening on http://HOST:PORT` once it accepts requests and exits cleanly on
SIGTERM / SIGINT (in-flight requests end with finish_reason abort). In-process (tests, Ray actors):

    engine = CPUEngine(model_dir); url = engine.start(); ...; engine.shutdown()

`/generate` reads its body as SGLang's GenerateReqInput does (`GenerateRequest`): `text` (a string or a
list of strings) or `input_ids` (a list of ids or a list of lists), `sampling_params` / `rid` /
`return_logprob` / `logprob_start_len` as one value or one per prompt, and `sampling_params.n` (parallel sampling: each
prompt's `n` results together); one object answers a single prompt, a list anything else. A body of
another shape is a 400 that says what to send. `input_embeds` and streaming are refused.
With `return_logprob`, `meta_info` holds `output_token_logprobs` and `input_token_logprobs`: the prompt
tokens from `logprob_start_len` on (default -1: none) as [logprob, id, text or None], the first logprob
None, as SGLang answers; a scored prompt is prefilled whole, not from the prefix cache (`batcher.py`).

Batching, sampling and the log-prob definition live in `batcher.py`. Differences from SGLang: the
prefix cache keeps whole finished sequences, not a radix tree of pages (`prefix_cache.py`;
`/flush_cache` empties it when nothing runs and answers 503 otherwise, which `http_utils` retries),
no streaming, `/pause_generation` always pauses in place, `/release_memory_occupation` frees the
weights and caches in host memory (generation answers 503 until `/resume_memory_occupation`), and
`/update_weights_from_tensor` takes shared-memory handles by file name (`load_format
"flattened_bucket"`, `slime.engine.tensor_payload`) where SGLang takes CUDA IPC handles; it refuses
(400) anything else the payload names.

LoRA (`slime.engine.lora_adapters`): `/load_lora_adapter` ({"lora_name", "lora_path": a peft adapter
folder}) and `/unload_lora_adapter` ({"lora_name"}) answer as SGLang's LoRAUpdateOutput (`success`,
`error_message`, `loaded_adapters`; a folder it cannot serve is a 400 that says why), and a /generate
whose `lora_path` names a loaded adapter runs with it (one name, or one per prompt in a batch); base and
adapter requests share a batch. The prefix cache serves them too: its entries are keyed by
the weights that computed them (the base, or an adapter's name and load generation), so a multi-turn
adapter episode prefills only each turn's new tokens, and an adapter reloaded under the same name (a
weight sync) never gets the previous load's KV; unloading drops that adapter's entries. Unlike SGLang,
unloading an adapter that running or waiting requests name is refused instead of waited for.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from transformers import AutoTokenizer

from slime.engine import tensor_payload
from slime.engine.base import CPU_ENGINE, EngineError, RolloutEngine
from slime.engine.batcher import BadRequestError, Batcher, Completion, ReleasedError, SamplingParams
from slime.engine.lora_adapters import AdapterError, check_name

logger = logging.getLogger(__name__)


def _is_ids(value: Any) -> bool:
    """A non-empty list of ints (JSON true/false are not token ids)."""
    return (isinstance(value, list) and bool(value)
            and all(isinstance(t, int) and not isinstance(t, bool) for t in value))


def _per_prompt(value: Any, n: int, name: str, batch: bool) -> list[Any]:
    """A field that is one value for every prompt, or (batches only) a list with one value per prompt."""
    if isinstance(value, list):
        if not batch:
            raise BadRequestError(f"{name} is a list but the request holds one prompt: send one value")
        if len(value) != n:
            raise BadRequestError(f"{name} has {len(value)} entries for {n} prompts: send one per prompt")
        return value
    return [value] * n


@dataclass
class GenerateRequest:
    """A /generate body read as SGLang's GenerateReqInput reads it (normalize_batch_and_arguments).

    `prompts` holds one entry per prompt before the `n` expansion: token ids, or text to tokenise.
    `batch` is False for a single `text` string or a flat `input_ids` list (the answer is then one
    object, unless `n` > 1, which SGLang turns into a batch); True for lists of them (a list answer).
    """

    prompts: list[str | list[int]]
    batch: bool
    n: int
    params: list[dict[str, Any]]
    rids: list[str | None]
    return_logprob: list[bool]
    return_text_in_logprobs: bool
    logprob_start_len: list[int]
    adapters: list[str | None]  # per prompt: the LoRA adapter its `lora_path` names (None: the base model)

    @classmethod
    def from_body(cls, body: Any) -> GenerateRequest:
        """Check the body's shape; a wrong one is a `BadRequestError` (HTTP 400) that says what to send."""
        if not isinstance(body, dict):
            raise BadRequestError("the /generate body must be a JSON object (sglang's GenerateReqInput)")
        if body.get("stream"):
            raise BadRequestError("stream=true is not supported by the CPU engine: send stream false")
        if body.get("input_embeds") is not None:
            raise BadRequestError("input_embeds is not supported by the CPU engine: send text or input_ids")
        text, ids = body.get("text"), body.get("input_ids")
        if text is not None and ids is not None:
            raise BadRequestError("send one of text and input_ids, not both")
        if text is not None:
            if isinstance(text, str):
                prompts, batch = [text], False
            elif isinstance(text, list) and text and all(isinstance(t, str) for t in text):
                prompts, batch = list(text), True
            else:
                raise BadRequestError("text must be a string or a non-empty list of strings")
        elif ids is not None:
            if _is_ids(ids):
                prompts, batch = [ids], False
            elif isinstance(ids, list) and ids and all(_is_ids(p) for p in ids):
                prompts, batch = list(ids), True
            else:
                raise BadRequestError("input_ids must be a non-empty list of token ids (ints) or a non-empty "
                                      "list of such lists")
        else:
            raise BadRequestError("send text (a string or a list of strings) or input_ids (a list of ints or a "
                                  "list of lists)")
        count = len(prompts)
        raw_params = body.get("sampling_params")
        params = _per_prompt({} if raw_params is None else raw_params, count, "sampling_params", batch)
        if not all(isinstance(p, dict) for p in params):
            raise BadRequestError("sampling_params must be an object (or, for a batch, a list of objects)")
        ns = {p.get("n", 1) for p in params}
        if len(ns) != 1:
            raise BadRequestError(f"sampling_params ask for different n {sorted(ns)}: n must be the same for all")
        n = ns.pop()
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise BadRequestError(f"sampling_params.n must be an integer >= 1, got {n!r}")
        params = [{k: v for k, v in p.items() if k != "n"} for p in params]
        rid = body.get("rid")
        if rid is not None and not (isinstance(rid, str) or (isinstance(rid, list) and batch)):
            raise BadRequestError("rid must be a string (or, for a batch, a list of strings)")
        if isinstance(rid, list) and n > 1:
            raise BadRequestError("a list of rids cannot be combined with n > 1: send one rid string or none")
        if isinstance(rid, str) and (batch or n > 1):
            rids: list[str | None] = [f"{rid}_{i}" for i in range(count * n)]  # sglang's suffixes
        elif isinstance(rid, list):
            if not all(isinstance(r, str) for r in rid):
                raise BadRequestError("rid must be a string (or, for a batch, a list of strings)")
            rids = _per_prompt(rid, count, "rid", batch)
        else:
            rids = [rid] * (count * n)
        logprob = body.get("return_logprob")
        if isinstance(logprob, list) and n > 1:
            raise BadRequestError("a list of return_logprob cannot be combined with n > 1: send one value")
        want = [bool(v) for v in _per_prompt(False if logprob is None else logprob, count, "return_logprob", batch)]
        start = body.get("logprob_start_len")
        if isinstance(start, list) and n > 1:
            raise BadRequestError("a list of logprob_start_len cannot be combined with n > 1: send one value")
        starts = _per_prompt(-1 if start is None else start, count, "logprob_start_len", batch)
        if not all(isinstance(k, int) and not isinstance(k, bool) and k >= -1 for k in starts):
            raise BadRequestError(f"logprob_start_len must be an int >= -1 (or, for a batch, a list of them), "
                                  f"got {start!r}")
        # sglang ignores logprob_start_len without return_logprob
        starts = [k if w else -1 for k, w in zip(starts, want, strict=True)]
        lora = body.get("lora_path")
        adapters = _per_prompt(lora, count, "lora_path", batch)
        if not all(a is None or (isinstance(a, str) and a) for a in adapters):
            raise BadRequestError(f"lora_path must be the name of a loaded LoRA adapter (or, for a batch, a list of "
                                  f"names or nulls), got {lora!r}")
        return cls(prompts, batch or n > 1, n, params, rids, want, bool(body.get("return_text_in_logprobs")),
                   starts, adapters)

    def expanded(self) -> list[tuple[int, int]]:
        """(prompt index, result index) pairs: each prompt's `n` samples together, as SGLang answers."""
        return [(i, i * self.n + j) for i in range(len(self.prompts)) for j in range(self.n)]


def completion_json(
    completion: Completion, params: SamplingParams, tokenizer: Any, return_logprob: bool,
    return_text_in_logprobs: bool = False,
) -> dict[str, Any]:
    """One SGLang /generate result. Ids and log-probs are never trimmed; `text` drops the matched
    stop token or string unless `no_stop_trim`."""
    reason = completion.finish_reason
    matched = reason.get("matched")
    text_ids = completion.output_ids
    trim = reason["type"] == "stop" and not params.no_stop_trim
    if trim and isinstance(matched, int) and text_ids and text_ids[-1] == matched:
        text_ids = text_ids[:-1]
    text = tokenizer.decode(text_ids, skip_special_tokens=params.skip_special_tokens)
    if trim and isinstance(matched, str) and matched in text:
        text = text[: text.index(matched)]
    meta: dict[str, Any] = {
        "id": completion.rid,
        "finish_reason": reason,
        "prompt_tokens": len(completion.prompt_ids),
        "completion_tokens": len(completion.output_ids),
        "cached_tokens": completion.cached_tokens,
        "weight_version": completion.weight_version,
        "e2e_latency": completion.latency_s,
    }
    if return_logprob:
        def entries(logprobs: list[float | None], ids: list[int]) -> list[list[Any]]:
            return [[lp, tok, tokenizer.decode([tok]) if return_text_in_logprobs else None]
                    for lp, tok in zip(logprobs, ids, strict=True)]

        scored = completion.input_logprobs or []
        meta["input_token_logprobs"] = entries(scored, completion.prompt_ids[len(completion.prompt_ids) - len(scored):])
        meta["output_token_logprobs"] = entries(completion.output_logprobs, completion.output_ids)
    return {"text": text, "output_ids": completion.output_ids, "meta_info": meta}


# Fields of UpdateWeightsFromTensorReqInput in the pinned sglangs (0.5.10 and 0.5.23); others are refused.
TENSOR_REQUEST_FIELDS = {"serialized_named_tensors", "load_format", "flush_cache", "abort_all_requests",
                         "weight_version", "selector", "torch_empty_cache", "disable_draft_model"}
MAX_TENSOR_BODY_BYTES = 4 * tensor_payload.MAX_PAYLOAD_CHARS
# Fields of sglang's LoadLoRAAdapterReqInput / UnloadLoRAAdapterReqInput (both pinned versions); `pinned`
# and `lora_id` are accepted and mean nothing here (nothing is evicted; names identify adapters).
LOAD_ADAPTER_FIELDS = {"lora_name", "lora_path", "pinned", "lora_id"}
UNLOAD_ADAPTER_FIELDS = {"lora_name", "lora_id"}
MAX_ADAPTER_BODY_BYTES = 64 << 10


async def _adapter_request(request: Request, fields: set[str]) -> dict[str, Any]:
    """A /load_lora_adapter or /unload_lora_adapter body, read bounded and checked field by field."""
    route = request.url.path
    try:
        body = await _bounded_json(request, MAX_ADAPTER_BODY_BYTES)
    except tensor_payload.PayloadError as exc:
        raise AdapterError(f"{route}: {exc}") from exc
    if not isinstance(body, dict):
        raise AdapterError(f"the {route} body must be a JSON object with lora_name")
    unknown = sorted(set(body) - fields)
    if unknown:
        raise AdapterError(f"{route}: unknown fields {unknown}; sglang's request has {sorted(fields)}")
    check_name(body.get("lora_name"))
    return body


async def _bounded_json(request: Request, limit: int) -> Any:
    """The JSON body, read at most `limit` bytes far (a larger one is refused before it is all read)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise tensor_payload.PayloadError(f"the body has {declared} bytes, over the limit of {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise tensor_payload.PayloadError(f"the body is over the limit of {limit} bytes")
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except ValueError as exc:
        raise tensor_payload.PayloadError(f"the body is not JSON: {exc}") from exc


def _tensor_request(body: Any) -> tuple[str, str | None, bool]:
    """(this engine's serialized entry, weight_version, abort_all_requests) of an /update_weights_from_tensor body."""
    if not isinstance(body, dict):
        raise tensor_payload.PayloadError("the body must be a JSON object (sglang's UpdateWeightsFromTensorReqInput)")
    unknown = sorted(set(body) - TENSOR_REQUEST_FIELDS)
    if unknown:
        raise tensor_payload.PayloadError(f"unknown fields {unknown}; UpdateWeightsFromTensorReqInput has "
                                          f"{sorted(TENSOR_REQUEST_FIELDS)}")
    entries = body.get("serialized_named_tensors")
    if not isinstance(entries, list) or not entries:
        raise tensor_payload.PayloadError("serialized_named_tensors must be a list with one base64 string per TP rank")
    if body.get("load_format") != "flattened_bucket":
        raise tensor_payload.PayloadError(f"load_format {body.get('load_format')!r} is not served by the CPU engine: "
                                          "send load_format 'flattened_bucket'")
    version = body.get("weight_version")
    if version is not None and not isinstance(version, str | int):
        raise tensor_payload.PayloadError("weight_version must be a string")
    return entries[0], None if version is None else str(version), bool(body.get("abort_all_requests", False))


def build_app(batcher: Batcher, tokenizer: Any, tokenizer_path: str) -> FastAPI:
    """The FastAPI app: SGLang's endpoints over one `Batcher`."""
    app = FastAPI(title="slime CPU engine")

    @app.exception_handler(BadRequestError)
    async def bad_request(_: Request, exc: BadRequestError) -> JSONResponse:
        return JSONResponse({"error": {"message": str(exc)}}, status_code=400)

    @app.exception_handler(ReleasedError)
    async def released(_: Request, exc: ReleasedError) -> JSONResponse:
        return JSONResponse({"error": {"message": str(exc)}}, status_code=503)

    @app.post("/generate")
    async def generate(request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except ValueError as exc:
            raise BadRequestError(f"the /generate body is not JSON: {exc}") from exc
        req = GenerateRequest.from_body(body)
        prompt_ids = [p if isinstance(p, list) else tokenizer(p, add_special_tokens=False)["input_ids"]
                      for p in req.prompts]
        params = [SamplingParams.from_dict(p) for p in req.params]
        for i, ids in enumerate(prompt_ids):
            if not ids:
                raise BadRequestError(f"prompt {i} tokenises to no tokens: send at least one prompt token")
        order = req.expanded()
        rids = [r if r is not None else uuid.uuid4().hex for r in req.rids]
        futures = []
        try:
            for i, k in order:
                futures.append(batcher.submit(prompt_ids[i], params[i], rids[k], req.logprob_start_len[i],
                                              adapter=req.adapters[i]))
        except Exception:  # a later prompt was refused: the ones already queued must not run unread
            for _, k in order[:len(futures)]:
                batcher.abort(rid=rids[k])
            raise
        completions = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
        results = [
            completion_json(c, params[i], tokenizer, req.return_logprob[i], req.return_text_in_logprobs)
            for c, (i, _) in zip(completions, order, strict=True)
        ]
        return JSONResponse(results if req.batch else results[0])

    @app.get("/health")
    async def health() -> PlainTextResponse:
        return PlainTextResponse("")

    @app.get("/health_generate")
    async def health_generate() -> PlainTextResponse:
        future = batcher.submit([0], SamplingParams(max_new_tokens=1, temperature=0.0))
        try:
            await asyncio.wait_for(asyncio.wrap_future(future), timeout=20.0)
        except (TimeoutError, RuntimeError) as exc:
            return PlainTextResponse(f"generation failed: {exc!r}", status_code=503)
        return PlainTextResponse("")

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> PlainTextResponse:
        if not batcher.is_idle():
            return PlainTextResponse("Cache not flushed: requests are running; retry.", status_code=503)
        await asyncio.wrap_future(batcher.flush_prefix_cache())
        return PlainTextResponse("Cache flushed.")

    @app.post("/abort_request")
    async def abort_request(request: Request) -> PlainTextResponse:
        body = await request.json()
        batcher.abort(rid=body.get("rid"), abort_all=bool(body.get("abort_all", False)))
        return PlainTextResponse("")

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request) -> JSONResponse:
        body = await request.json()
        if not body.get("model_path"):
            raise BadRequestError("update_weights_from_disk needs model_path (a HF model folder)")
        version = body.get("weight_version")
        future = batcher.update_weights(body["model_path"], None if version is None else str(version),
                                        abort_all=bool(body.get("abort_all_requests", False)))
        try:
            new_version = await asyncio.wrap_future(future)
        except Exception as exc:  # reported in the body, as SGLang does
            return JSONResponse({"success": False, "message": f"Failed to update weights: {exc}",
                                 "num_paused_requests": 0}, status_code=400)
        return JSONResponse({"success": True, "num_paused_requests": 0,
                             "message": f"Succeeded to update model weights (version {new_version})."})

    @app.post("/update_weights_from_tensor")
    async def update_weights_from_tensor(request: Request) -> JSONResponse:
        """SGLang's UpdateWeightsFromTensorReqInput with shared-memory handles (slime.engine.tensor_payload).
        Any local process can reach this port: the body is read bounded and unpickled restrictively."""
        def refused(message: str) -> JSONResponse:
            return JSONResponse({"success": False, "message": f"Failed to update weights: {message}"}, status_code=400)

        try:
            body = await _bounded_json(request, MAX_TENSOR_BODY_BYTES)
            text, version, abort_all = _tensor_request(body)
            flat, metadata = await asyncio.to_thread(tensor_payload.decode, text)
        except tensor_payload.PayloadError as exc:
            return refused(str(exc))
        try:
            future = batcher.update_weights_from_tensors(tensor_payload.named_tensors(flat, metadata), version,
                                                         abort_all=abort_all)
            message = await asyncio.wrap_future(future)
        except Exception as exc:  # reported in the body, as SGLang does; the message says the engine's state
            return refused(f"{exc} (the engine serves weight version {batcher.weight_version})")
        finally:
            del flat, metadata  # unmaps the sender's shared memory before the reply lets it free it
        return JSONResponse({"success": True, "message": message})

    def lora_result(action: Any) -> Any:
        """Run a load / unload and answer as sglang's LoRAUpdateOutput (400 with error_message on failure)."""
        async def answer(request: Request) -> JSONResponse:
            try:
                loaded = await asyncio.wrap_future(await action(request))
            except (AdapterError, BadRequestError, ReleasedError) as exc:
                message = str(exc)
            except Exception as exc:  # whatever else a folder trips: still an answer, never a dropped request
                logger.exception("LoRA adapter request failed")
                message = f"the adapter could not be served ({type(exc).__name__}: {exc})"
            else:
                return JSONResponse({"success": True, "error_message": None, "loaded_adapters": loaded})
            return JSONResponse({"success": False, "error_message": message,
                                 "loaded_adapters": batcher.lora.loaded()}, status_code=400)
        return answer

    async def load(request: Request) -> Any:
        body = await _adapter_request(request, LOAD_ADAPTER_FIELDS)
        if not isinstance(body.get("lora_path"), str) or not body["lora_path"]:
            raise AdapterError(f"{request.url.path} needs lora_path: the folder peft's save_pretrained wrote")
        return batcher.load_adapter(body["lora_name"], body["lora_path"])

    async def unload(request: Request) -> Any:
        body = await _adapter_request(request, UNLOAD_ADAPTER_FIELDS)
        return batcher.unload_adapter(body["lora_name"])

    app.add_api_route("/load_lora_adapter", lora_result(load), methods=["POST"])
    app.add_api_route("/unload_lora_adapter", lora_result(unload), methods=["POST"])

    @app.post("/release_memory_occupation")
    async def release_memory_occupation() -> JSONResponse:
        try:
            await asyncio.wrap_future(batcher.release_memory())
        except RuntimeError as exc:
            return JSONResponse({"success": False, "message": f"Failed to release memory: {exc}"}, status_code=400)
        return JSONResponse({"success": True, "message": "Succeeded to release memory occupation."})

    @app.post("/resume_memory_occupation")
    async def resume_memory_occupation(request: Request) -> JSONResponse:
        body = await request.json() if await request.body() else {}
        try:
            await asyncio.wrap_future(batcher.resume_memory(body.get("tags")))
        except (RuntimeError, ValueError) as exc:
            return JSONResponse({"success": False, "message": f"Failed to resume memory: {exc}"}, status_code=400)
        return JSONResponse({"success": True, "message": "Succeeded to resume memory occupation."})

    @app.get("/model_info")
    @app.get("/get_model_info")  # sglang's deprecated spelling, still served by 0.5.23
    async def model_info() -> JSONResponse:
        """Where stock sglang serves `weight_version` (it has no /get_weight_version)."""
        return JSONResponse({
            "model_path": batcher.model_path,
            "tokenizer_path": tokenizer_path,
            "is_generation": True,
            "weight_version": batcher.weight_version,
        })

    @app.get("/server_info")
    @app.get("/get_server_info")  # sglang serves both spellings
    async def get_server_info() -> JSONResponse:
        return JSONResponse({
            "model_path": batcher.model_path,
            "engine": CPU_ENGINE,  # no sglang `version`: RolloutEngine.serves knows the CPU engine's routes
            "max_running_requests": batcher.max_batch_size,
            "random_seed": batcher.seed,
            "weight_version": batcher.weight_version,
            **batcher.load(),
        })

    @app.post("/pause_generation")
    async def pause_generation() -> PlainTextResponse:
        batcher.set_paused(True)
        return PlainTextResponse("")

    @app.post("/continue_generation")
    async def continue_generation() -> PlainTextResponse:
        batcher.set_paused(False)
        return PlainTextResponse("")

    return app


class _Server(uvicorn.Server):
    """uvicorn server that aborts running generations on exit, so SIGTERM does not wait on them,
    and reports when it accepts connections (`on_started`)."""

    def __init__(self, config: uvicorn.Config, batcher: Batcher, on_started: Callable[[], None] | None):
        super().__init__(config)
        self.batcher = batcher
        self.on_started = on_started

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.on_started is not None:
            self.on_started()

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.batcher.abort(abort_all=True)
        super().handle_exit(sig, frame)

    def stop(self) -> None:
        """Stop from another thread of this process (not a signal): abort generations, let serve() return.
        Not `handle_exit`: sse_starlette (imported by the MCP SDK) patches uvicorn's handle_exit so that one
        server's exit ends every event stream of the process, for good."""
        self.batcher.abort(abort_all=True)
        self.should_exit = True


class CPUEngine(RolloutEngine):
    """Batcher + HTTP server on a background thread; the same endpoints as the standalone module."""

    def __init__(
        self,
        model_path: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        seed: int = 0,
        max_batch_size: int = 64,
        batch_wait_s: float = 0.005,
        prefix_cache_tokens: int = 1 << 16,
        dtype: str = "float32",
    ):
        self.model_path = str(model_path)
        self.dtype = dtype
        self.host, self.port = host, port
        self.seed, self.max_batch_size, self.batch_wait_s = seed, max_batch_size, batch_wait_s
        self.prefix_cache_tokens = prefix_cache_tokens
        self.batcher: Batcher | None = None
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> str:
        server, sock = self._prepare()
        self._thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                                        name="cpu-engine-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.shutdown()
                raise EngineError(f"CPU engine for {self.model_path} did not start serving on {self.url}")
            time.sleep(0.01)
        return self.url

    def serve_forever(self, on_started: Callable[[], None] | None = None) -> None:
        """Serve in the calling (main) thread until SIGTERM / SIGINT, then shut down."""
        server, sock = self._prepare(on_started)
        try:
            server.run(sockets=[sock])
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.stop()
        if self._thread is not None:
            self._thread.join(timeout=15)
            self._thread = None
        if self.batcher is not None:
            self.batcher.shutdown()
        if getattr(self, "_http", None) is not None:
            self._http.close()
            self._http = None

    def _prepare(self, on_started: Callable[[], None] | None = None) -> tuple[_Server, socket.socket]:
        tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.batcher = Batcher(self.model_path, tokenizer=tokenizer, seed=self.seed,
                               max_batch_size=self.max_batch_size, batch_wait_s=self.batch_wait_s,
                               prefix_cache_tokens=self.prefix_cache_tokens, dtype=self.dtype)
        app = build_app(self.batcher, tokenizer, self.model_path)
        # Bind first so that port 0 resolves to a real port before anyone is told the URL.
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # asyncio sets TCP_NODELAY only then
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        host = f"[{self.host}]" if family == socket.AF_INET6 else self.host
        self.url = f"http://{host}:{self.port}"
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5)
        self._server = _Server(config, self.batcher, on_started)
        return self._server, sock


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve a HF causal LM on CPU with SGLang's HTTP API.")
    parser.add_argument("--model-path", required=True, help="HF model folder (config, weights, tokenizer)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000, help="0 picks a free port")
    parser.add_argument("--seed", type=int, default=0, help="server seed for requests without sampling_seed")
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--num-threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--prefix-cache-tokens", type=int, default=1 << 16,
                        help="KV of finished requests kept for prompts that extend them (tokens; 0: off)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="what the model computes in (float32: the trainer's; bfloat16: what SGLang serves)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    # uvicorn re-raises the signal that stopped it; exiting with status 0 then is the clean shutdown.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(0))
    engine = CPUEngine(args.model_path, host=args.host, port=args.port, seed=args.seed,
                       max_batch_size=args.max_batch_size, prefix_cache_tokens=args.prefix_cache_tokens,
                       dtype=args.dtype)
    engine.serve_forever(on_started=lambda: print(f"cpu_server listening on {engine.url}", flush=True))

if __name__ == "__main__":
    main()

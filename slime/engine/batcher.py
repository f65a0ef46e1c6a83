"""Continuous batching of generation requests over a Hugging Face causal LM on CPU.

One background thread owns the model. Requests wait in a queue; at every decode step the thread
admits waiting requests (prefilling only the new prompts and splicing their KV cache into the
running batch, left-padded), samples one token for every running request, retires finished ones and
runs one forward pass for the rest. Aborts, weight reloads and pauses take effect between steps.

Prefix cache (`slime.engine.prefix_cache`): the KV of every finished request is kept (LRU, a token
budget) and a new request whose first tokens match one is prefilled only past the match, alone, then
spliced into the batch; a multi-turn rollout's next turn so skips re-reading the conversation so far.
`cached_tokens` in each completion says how many prompt tokens came from it. Weight updates clear it.

Memory release (SGLang's `release_memory_occupation`, for a trainer that shares the machine): the
weights go to the meta device and the caches are dropped; requests are refused until the weights are
resumed, which re-allocates them uninitialised (as SGLang does without a CPU backup): the trainer
must send weights next (from disk, or as tensors: the buffers no update sends are kept).

LoRA (`slime.engine.lora_adapters.AdapterSet`): a request may name a loaded adapter; hooks on the
targeted Linear layers add its low-rank term to that request's rows only, so one batch mixes base and
adapter requests. The prefix cache keys KV by the weights that computed it (the base, or an adapter's
name and load generation), so a multi-turn adapter episode re-uses its own KV and never another's, nor a
previous load's of the same name. Loads and unloads run between steps like weight updates; unloading one
that running or waiting requests name is refused, and drops that adapter's cached KV.

Weight updates: from a HF folder (`update_weights`), or from tensors a trainer shares
(`update_weights_from_tensors`, one bucket of `/update_weights_from_tensor`), both on this thread.

Log-probs: the log-prob of a sampled token is `log_softmax(logits / temperature)` over the full
vocabulary, taken before top-k / top-p / min-p truncation (SGLang's default). Greedy requests
(temperature 0) count as temperature 1 there, as SGLang does. `min_new_tokens` and
`repetition_penalty` change the logits before that, so with them on the trainer cannot reproduce the
log-probs; RL rollouts leave them off.

Scoring (SGLang's `logprob_start_len`, what on-policy distillation asks a teacher for): a request
submitted with `logprob_start_len` k >= 0 is prefilled alone over its whole prompt, never from the
prefix cache, and its completion carries `input_logprobs` for prompt positions k.. : None at k (SGLang
leaves the first one unscored), then log_softmax(logits[i-1] / temperature)[prompt[i]] with the same
temperature rule as sampled tokens. With `max_new_tokens` 0 it finishes there, otherwise it generates on.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from slime.engine.inplace_load import load_in_place
from slime.engine.lora_adapters import AdapterError, AdapterSet, read_adapter
from slime.engine.prefix_cache import Hit, PrefixCache, Weights

logger = logging.getLogger(__name__)

# Accepted for compatibility but without effect here (SGLang knobs a rollout may send at defaults).
_IGNORED_PARAMS = {"custom_params", "spaces_between_special_tokens", "stream_interval", "n"}


_LOAD_LOCK = threading.Lock()  # one model load at a time per process

class BadRequestError(ValueError):
    """A generate request the engine cannot serve; the HTTP layer answers 400 with this message."""


class ReleasedError(RuntimeError):
    """The engine's memory is released; the HTTP layer answers 503 with this message."""


# What the CPU engine computes in: fp32 (the trainer's dtype: rollouts match its log-probs), or bf16 to serve
# what SGLang engines serve (benchmarks/gpu_twin.py: weight syncs then move 2 bytes a parameter).
ENGINE_DTYPES = ("float32", "bfloat16")
MEMORY_TAGS = ("weights", "kv_cache", "cuda_graph")  # SGLang's; the CPU engine has no CUDA graphs


@dataclass
class SamplingParams:
    """SGLang's sampling parameters that this engine honours, with SGLang's defaults."""

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: int | None = None

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | None) -> SamplingParams:
        values = dict(values or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known - _IGNORED_PARAMS)
        if unknown:
            raise BadRequestError(
                f"sampling_params {unknown} are not supported by the CPU engine; supported: {sorted(known)}"
            )
        kwargs = {k: v for k, v in values.items() if k in known and v is not None}
        if isinstance(kwargs.get("stop"), str):
            kwargs["stop"] = [kwargs["stop"]]
        if isinstance(kwargs.get("stop_token_ids"), int):
            kwargs["stop_token_ids"] = [kwargs["stop_token_ids"]]
        params = cls(**kwargs)
        if params.max_new_tokens < 0 or params.temperature < 0 or not 0 < params.top_p <= 1:
            raise BadRequestError(
                f"invalid sampling_params: max_new_tokens={params.max_new_tokens} must be >= 0, "
                f"temperature={params.temperature} >= 0, top_p={params.top_p} in (0, 1]"
            )
        return params

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-6 or self.top_k == 1


@dataclass
class Completion:
    """What a finished request hands back: generated ids, their log-probs and why it stopped."""

    rid: str
    prompt_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    finish_reason: dict[str, Any]
    weight_version: str
    latency_s: float
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    input_logprobs: list[float | None] | None = None  # prompt[logprob_start_len:] scored; None: not asked


@dataclass
class _Request:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    generator: torch.Generator
    future: concurrent.futures.Future
    created: float = field(default_factory=time.perf_counter)
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    stop_ids: frozenset[int] = frozenset()
    cached_tokens: int = 0
    kv_version: int = -1  # the weights its KV was computed with (Batcher._version_counter at prefill)
    kv_weights: Weights = None  # base or (adapter, load generation) at prefill: the prefix cache's key
    score_from: int | None = None  # logprob_start_len: score the prompt from here (see the module docstring)
    input_logprobs: list[float | None] | None = None
    adapter: str | None = None  # the LoRA adapter it runs with (its `lora_path`); None: the base model


class Batcher:
    """Owns the model and its batching thread; thread-safe `submit`, `abort`, `update_weights`."""

    def __init__(
        self,
        model_path: str,
        *,
        tokenizer: Any = None,
        seed: int = 0,
        max_batch_size: int = 64,
        batch_wait_s: float = 0.005,
        prefix_cache_tokens: int = 1 << 16,
        dtype: str = "float32",
        max_loaded_loras: int = 8,
    ):
        if dtype not in ENGINE_DTYPES:
            raise ValueError(f"the CPU engine serves {' or '.join(ENGINE_DTYPES)}, not {dtype!r}")
        self.model_path = model_path
        self.dtype = getattr(torch, dtype)
        self.model = self._load(model_path, self.dtype)
        self.tokenizer = tokenizer
        self.seed = seed
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.prefix_cache = PrefixCache(prefix_cache_tokens)
        self.lora = AdapterSet(max_loaded_loras)  # LoRA adapters served on top of the model (lora_adapters.py)
        self.weight_version = "0"
        self._version_counter = 0
        self._eos_ids = self._eos_token_ids()
        # read once: a HF config attribute read costs microseconds, per request per decode step
        self._max_positions = getattr(self.model.config, "max_position_embeddings", None)
        self._counter = itertools.count()
        self._cond = threading.Condition()
        self._pending: deque[_Request] = deque()
        self._abort_rids: set[str] = set()
        self._abort_all = False
        self._commands: deque[tuple[str, dict, concurrent.futures.Future]] = deque()
        self._paused = False
        self._stopping = False
        self._released: set[str] = set()  # memory tags released, see release_memory
        self._reallocated = False  # weights re-allocated uninitialised by resume_memory, buffers too
        self._buffers: dict[str, torch.Tensor] = {}  # kept across a memory release (RoPE's inv_freq)
        self._tensor_progress: tuple[str, set[str]] = ("", set())  # version, tensors received for it
        self.stats = {"decode_steps": 0, "max_running_reqs": 0, "generated_tokens": 0}
        # Running batch: requests, KV cache, attention mask (B, T), next position (B,), logits (B, V).
        self._active: list[_Request] = []
        self._cache: DynamicCache | None = None
        self._mask: torch.Tensor | None = None
        self._positions: torch.Tensor | None = None
        self._logits: torch.Tensor | None = None
        self._thread = threading.Thread(target=self._loop, name="cpu-engine-batcher", daemon=True)
        self._thread.start()

    # ----- public, called from any thread -------------------------------------------------------

    def submit(
        self, prompt_ids: list[int], params: SamplingParams, rid: str | None = None, logprob_start_len: int = -1,
        adapter: str | None = None,
    ) -> concurrent.futures.Future:
        """Queue one request; the future resolves to a `Completion` (also when aborted).

        logprob_start_len: -1 scores no prompt token; k in [0, len(prompt_ids)] scores prompt[k:].
        adapter: the name of a loaded LoRA adapter to run with (sglang's `lora_path`); None: the base."""
        if not prompt_ids:
            raise BadRequestError("input_ids is empty: send at least one prompt token")
        if (not isinstance(logprob_start_len, int) or isinstance(logprob_start_len, bool)
                or not -1 <= logprob_start_len <= len(prompt_ids)):
            raise BadRequestError(f"logprob_start_len={logprob_start_len!r} must be -1 (score no prompt token) or "
                                  f"an int from 0 to the prompt's {len(prompt_ids)} tokens")
        vocab = self.model.config.vocab_size
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise BadRequestError(f"input_ids must lie in [0, {vocab}) for this model")
        seed = params.sampling_seed
        if seed is None:  # server seed + arrival number: reproducible for the same request order
            seed = self.seed * 1_000_003 + next(self._counter)
        request = _Request(
            rid=rid or uuid.uuid4().hex,
            prompt_ids=list(prompt_ids),
            params=params,
            generator=torch.Generator().manual_seed(int(seed)),
            future=concurrent.futures.Future(),
            stop_ids=frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self._eos_ids),
            score_from=logprob_start_len if 0 <= logprob_start_len < len(prompt_ids) else None,
            adapter=adapter,
        )
        with self._cond:
            if self._stopping:
                raise RuntimeError("the engine is shut down")
            if adapter is not None and adapter not in self.lora:  # under the lock: unload checks the queue
                raise BadRequestError(f"the LoRA adapter {adapter!r} named in lora_path is not loaded (loaded: "
                                      f"{sorted(self.lora.adapters)}): POST /load_lora_adapter first")
            if self._released:
                raise ReleasedError(f"the engine's memory is released ({', '.join(sorted(self._released))}): "
                                    "POST /resume_memory_occupation, then send weights")
            self._pending.append(request)
            self._cond.notify_all()
        return request.future

    def abort(self, rid: str | None = None, abort_all: bool = False) -> None:
        """Finish the matching requests at the next step with finish_reason abort and tokens so far."""
        with self._cond:
            if abort_all:
                self._abort_all = True
            elif rid is not None:
                self._abort_rids.add(rid)
            self._cond.notify_all()

    def update_weights(
        self, model_path: str, weight_version: str | None = None, abort_all: bool = False
    ) -> concurrent.futures.Future:
        """Reload weights from a HF folder once the running batch drains (or is aborted)."""
        return self._command("update_weights", model_path=model_path, weight_version=weight_version,
                             abort_all=abort_all)

    def update_weights_from_tensors(
        self, named: list[tuple[str, torch.Tensor]], weight_version: str | None = None, abort_all: bool = False
    ) -> concurrent.futures.Future:
        """Copy `named` (HF parameter names; cast to the served dtype) into the served weights, all or
        none, between steps (at once while paused); the future resolves to a message saying what the
        engine now holds (`/update_weights_from_tensor`, one bucket of a sync)."""
        return self._command("load_tensors", named=named, weight_version=weight_version, abort_all=abort_all)

    def load_adapter(self, name: str, path: str) -> concurrent.futures.Future:
        """Read a peft LoRA folder and serve it as `name` (between steps); the future fails with an
        `AdapterError` saying why a folder cannot be served."""
        return self._command("load_adapter", adapter=name, path=path)

    def unload_adapter(self, name: str) -> concurrent.futures.Future:
        """Stop serving adapter `name` (between steps); refused while requests that name it run or wait."""
        return self._command("unload_adapter", adapter=name)

    def flush_prefix_cache(self) -> concurrent.futures.Future:
        """Empty the prefix cache (in the batching thread, between steps)."""
        return self._command("flush_cache")

    def release_memory(self) -> concurrent.futures.Future:
        """Free the weights and caches (between steps; fails while requests run or wait)."""
        return self._command("release_memory")

    def resume_memory(self, tags: list[str] | None = None) -> concurrent.futures.Future:
        """Re-allocate the released memory kinds in `tags` (all when None); weights come back uninitialised."""
        return self._command("resume_memory", tags=list(MEMORY_TAGS) if tags is None else list(tags))

    def set_paused(self, paused: bool) -> None:
        """Pause in place: running requests keep their state and resume on unpause."""
        with self._cond:
            self._paused = paused
            self._cond.notify_all()

    def is_idle(self) -> bool:
        with self._cond:
            return not self._pending and not self._active

    def load(self) -> dict[str, int]:
        with self._cond:
            return {"num_running_reqs": len(self._active), "num_waiting_reqs": len(self._pending),
                    **self.stats, **{f"prefix_cache_{k}": v for k, v in self.prefix_cache.stats.items()}}

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Abort everything, stop the thread and wait for it."""
        with self._cond:
            self._stopping = True
            self._abort_all = True
            self._cond.notify_all()
        self._thread.join(timeout_s)

    # ----- the batching thread -------------------------------------------------------------------

    def _command(self, name: str, **kwargs) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cond:
            self._commands.append((name, kwargs, future))
            if kwargs.get("abort_all"):
                self._abort_all = True
            self._cond.notify_all()
        return future

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self._commands and not self._abort_pending() and (
                    self._paused or (not self._pending and not self._active)
                ):
                    self._cond.wait()
                if self._stopping and not self._active and not self._pending:
                    break
            try:
                self._apply_aborts()
                # A weight update waits for the batch to drain, unless generation is paused: then it
                # applies at once and paused requests resume on the new weights with their old KV
                # cache (SGLang's in-place pause behaves the same).
                if self._commands and (not self._active or self._paused):
                    self._run_command()
                    continue
                if self._paused and not self._stopping:
                    continue
                if not self._commands:  # a queued weight update lets the batch drain first
                    self._admit()
                if self._active:
                    self._step()
            except Exception as exc:  # fail the batch, keep serving
                logger.exception("generation step failed; failing %d running requests", len(self._active))
                for request in self._active:
                    if not request.future.done():
                        request.future.set_exception(exc)
                self._reset_batch()
        with self._cond:
            for _, _, future in self._commands:
                future.set_exception(RuntimeError("the engine is shut down"))
            self._commands.clear()

    def _abort_pending(self) -> bool:
        return self._abort_all or bool(self._abort_rids)

    def _apply_aborts(self) -> None:
        with self._cond:
            abort_all, rids = self._abort_all, self._abort_rids
            self._abort_all, self._abort_rids = False, set()
            if not abort_all and not rids:
                return
            keep = deque()
            for request in self._pending:
                if abort_all or request.rid in rids:
                    self._finish(request, {"type": "abort", "message": "Abort in waiting queue"})
                else:
                    keep.append(request)
            self._pending = keep
        kept = []
        for i, request in enumerate(self._active):
            if abort_all or request.rid in rids:
                self._finish(request, {"type": "abort", "message": "Abort request"})
            else:
                kept.append(i)
        self._select_rows(kept)

    def _run_command(self) -> None:
        with self._cond:
            name, kwargs, future = self._commands.popleft()
        try:
            if name == "flush_cache":
                self.prefix_cache.clear()
                future.set_result(True)
                return
            if name == "release_memory":
                self._release_memory()
                future.set_result(True)
                return
            if name == "resume_memory":
                self._resume_memory(kwargs["tags"])
                future.set_result(True)
                return
            if name == "load_adapter":
                adapter = read_adapter(kwargs["adapter"], kwargs["path"], self.model, self.dtype)
                with self._cond:
                    self.lora.add(adapter, self.model)
                future.set_result(self.lora.loaded())
                return
            if name == "unload_adapter":
                with self._cond:
                    busy = sum(r.adapter == kwargs["adapter"] for r in [*self._active, *self._pending])
                    if busy:
                        raise AdapterError(f"{busy} requests that name the LoRA adapter {kwargs['adapter']!r} are "
                                           "running or waiting: finish or abort them before unloading it")
                    self.lora.remove(kwargs["adapter"], self.model)
                self.prefix_cache.drop_adapter(kwargs["adapter"])  # never hit again: free the budget
                future.set_result(self.lora.loaded())
                return
            if name == "load_tensors":
                future.set_result(self._load_tensors(kwargs.pop("named"), kwargs["weight_version"]))
                return
            if name != "update_weights":
                raise ValueError(f"unknown engine command {name!r}")
            if "weights" in self._released:
                raise ReleasedError("the weights are released: resume_memory_occupation(['weights']) first")
            # Same architecture (every sync): copy into the served weights, no rebuild. Not after a
            # resume: to_empty left the buffers that no folder holds (RoPE's inv_freq) uninitialised.
            with _LOAD_LOCK:
                in_place = not self._reallocated and load_in_place(self.model, kwargs["model_path"])
            model = self.model if in_place else self._load(kwargs["model_path"], self.dtype)
            if model.config.vocab_size != self.model.config.vocab_size:
                raise ValueError(
                    f"{kwargs['model_path']} has vocab {model.config.vocab_size}, the served model "
                    f"{self.model.config.vocab_size}: update_weights_from_disk needs the same architecture"
                )
            self.model, self._reallocated = model, False
            self.lora.bind(model)  # a rebuilt model gets the adapters' hooks again
            self._max_positions = getattr(model.config, "max_position_embeddings", None)
            self.model_path = kwargs["model_path"]
            self.prefix_cache.clear()  # KV of the old weights
            self._version_counter += 1
            self.weight_version = kwargs["weight_version"] or str(self._version_counter)
            future.set_result(self.weight_version)
        except Exception as exc:
            future.set_exception(exc)

    def _load_tensors(self, named: list[tuple[str, torch.Tensor]], weight_version: str | None) -> str:
        """Check every tensor against the served model first (name, shape), then copy them all: a
        refused bucket changes nothing. Each bucket's version counts as the engine's version (as in
        SGLang); the message says how many of the model's tensors that version has received so far."""
        if "weights" in self._released:
            raise ReleasedError("the weights are released: resume_memory_occupation(['weights']) first")
        served = self.model.state_dict()
        tied = {"lm_head.weight"} if getattr(self.model.config, "tie_word_embeddings", False) else set()
        unknown = [n for n, _ in named if n not in served]
        if unknown:
            raise ValueError(f"{len(unknown)} tensor name(s) are not parameters of the served model, e.g. "
                             f"{unknown[:3]}; nothing of this bucket was loaded (the engine is unchanged)")
        wrong = [f"{n} {list(t.shape)} (served {list(served[n].shape)})" for n, t in named if t.shape != served[n].shape]
        if wrong:
            raise ValueError(f"shape mismatch: {wrong[:3]}; nothing of this bucket was loaded (the engine is unchanged)")
        copied = 0
        try:
            with torch.no_grad():
                for name, tensor in named:
                    served[name].copy_(tensor)  # cast to the served dtype
                    copied += 1
        except Exception as exc:
            raise RuntimeError(f"copying {named[copied][0]} failed ({exc}): {copied} of this bucket's {len(named)} "
                               f"tensors were loaded, the engine holds partly updated weights: send the whole "
                               f"weights again or load them from disk") from exc
        self.prefix_cache.clear()  # KV of the old weights
        self._version_counter += 1
        version = self.weight_version if weight_version is None else str(weight_version)
        progress = self._tensor_progress if self._tensor_progress[0] == version else (version, set())
        progress[1].update(name for name, _ in named)
        self._tensor_progress = progress
        self.weight_version = version
        total = len(set(served) - tied)
        return (f"Succeeded to update model weights from {len(named)} tensors (version {version}: "
                f"{len(progress[1] & set(served))} of the model's {total} tensors received so far).")

    def _release_memory(self) -> None:
        with self._cond:
            busy = len(self._active) + len(self._pending)
        if busy:
            raise RuntimeError(f"{busy} requests are running or waiting: finish or abort them before releasing memory")
        # Buffers no weight update sends (RoPE's inv_freq) are kept, so tensor updates can refill a resumed model.
        self._buffers = {name: buf.clone() for name, buf in self.model.named_buffers()}
        self.model.to("meta")  # frees every weight; the module keeps its structure and config
        self.prefix_cache.clear()
        self._reset_batch()
        with self._cond:
            self._released = set(MEMORY_TAGS)

    def _resume_memory(self, tags: list[str]) -> None:
        unknown = sorted(set(tags) - set(MEMORY_TAGS))
        if unknown:
            raise ValueError(f"unknown memory tags {unknown}: use {list(MEMORY_TAGS)}")
        if "weights" in tags and "weights" in self._released:
            self.model.to_empty(device="cpu")
            self.model.tie_weights()  # to_empty gave a tied head and embedding separate tensors: one again
            with torch.no_grad():
                for name, buf in self.model.named_buffers():
                    if name in self._buffers:
                        buf.copy_(self._buffers[name])
            self._reallocated = True
        with self._cond:
            self._released -= set(tags)

    def _admit(self) -> None:
        with self._cond:
            if not self._pending or len(self._active) >= self.max_batch_size:
                return
        if not self._active and self.batch_wait_s > 0:
            time.sleep(self.batch_wait_s)  # let concurrent requests arrive and share the prefill
        with self._cond:
            room = self.max_batch_size - len(self._active)
            new = [self._pending.popleft() for _ in range(min(room, len(self._pending)))]
        misses = []
        for request in new:
            if request.score_from is not None:
                self._prefill_scored(request)
                continue
            if request.params.max_new_tokens == 0:
                self._finish(request, {"type": "length", "length": 0})
                continue
            # only KV of the weights this request runs with (base, or this load of its adapter)
            hit = self.prefix_cache.get(request.prompt_ids, self.lora.weights_of(request.adapter))
            if hit is None:
                misses.append(request)
            else:
                self._prefill_cached(request, hit)
        if misses:
            self._prefill(misses)

    @torch.inference_mode()
    def _prefill_cached(self, request: _Request, hit: Hit) -> None:
        """Prefill one request past its cached prefix (positions hit.n ..), then join the batch."""
        suffix = request.prompt_ids[hit.n:]
        total = len(request.prompt_ids)
        cache = DynamicCache(ddp_cache_data=hit.layers, config=self.model.config)
        mask = torch.ones((1, total), dtype=torch.long)
        self.lora.rows = [request.adapter]
        out = self.model(input_ids=torch.tensor([suffix]), attention_mask=mask,
                         position_ids=torch.arange(hit.n, total).view(1, -1), past_key_values=cache,
                         use_cache=True, logits_to_keep=1)
        request.cached_tokens = hit.n
        self._stamp(request)
        self._join([request], out.past_key_values, mask, torch.tensor([total]), out.logits[:, -1, :].float())

    @torch.inference_mode()
    def _prefill_scored(self, request: _Request) -> None:
        """Prefill one request over its whole prompt, keeping every position's logits to score
        prompt[score_from:]; then finish it (max_new_tokens 0) or join the batch."""
        prompt, start = request.prompt_ids, request.score_from
        generate = request.params.max_new_tokens > 0
        # logits of positions start.. only: [n - start, vocab] floats (the whole prompt for OPD's start 0)
        self.lora.rows = [request.adapter]
        out = self.model(input_ids=torch.tensor([prompt]), attention_mask=torch.ones((1, len(prompt)), dtype=torch.long),
                         past_key_values=DynamicCache(config=self.model.config) if generate else None,
                         use_cache=generate, logits_to_keep=len(prompt) - start)
        temperature = 1.0 if request.params.greedy else request.params.temperature
        # position i-1's logits score token i; the first scored token gets None, as SGLang answers
        logits = out.logits[0, :-1].float() / temperature
        targets = torch.tensor(prompt[start + 1:], dtype=torch.long).view(-1, 1)
        request.input_logprobs = [None, *torch.log_softmax(logits, dim=-1).gather(1, targets).squeeze(1).tolist()]
        if not generate:
            self._finish(request, {"type": "length", "length": 0})
            return
        self._stamp(request)
        self._join([request], out.past_key_values, torch.ones((1, len(prompt)), dtype=torch.long),
                   torch.tensor([len(prompt)]), out.logits[:, -1, :].float())

    @torch.inference_mode()
    def _prefill(self, requests: list[_Request]) -> None:
        width = max(len(r.prompt_ids) for r in requests)
        pad = self.model.config.pad_token_id or 0
        ids = torch.full((len(requests), width), pad, dtype=torch.long)
        mask = torch.zeros((len(requests), width), dtype=torch.long)
        for row, request in enumerate(requests):
            n = len(request.prompt_ids)
            ids[row, width - n:] = torch.tensor(request.prompt_ids)
            mask[row, width - n:] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        self.lora.rows = [r.adapter for r in requests]
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                         past_key_values=cache, use_cache=True, logits_to_keep=1)
        for request in requests:
            self._stamp(request)
        self._join(requests, out.past_key_values, mask, mask.sum(-1), out.logits[:, -1, :].float())

    def _stamp(self, request: _Request) -> None:
        """Record which weights compute this request's KV, so `_remember` caches it under them only."""
        request.kv_version = self._version_counter
        request.kv_weights = self.lora.weights_of(request.adapter)

    def _join(self, requests: list[_Request], cache: DynamicCache, mask: torch.Tensor, next_pos: torch.Tensor,
              logits: torch.Tensor) -> None:
        """Add freshly prefilled requests (their cache, mask, next positions, last logits) to the batch."""
        if not self._active:
            self._active, self._cache, self._mask = requests, cache, mask
            self._positions, self._logits = next_pos, logits
            return
        self._cache, self._mask = _merge_caches(self._cache, self._mask, cache, mask, self.model.config)
        self._active = self._active + requests
        self._positions = torch.cat([self._positions, next_pos])
        self._logits = torch.cat([self._logits, logits])

    @torch.inference_mode()
    def _step(self) -> None:
        tokens, logprobs = self._sample()
        self.stats["decode_steps"] += 1
        self.stats["generated_tokens"] += len(self._active)
        self.stats["max_running_reqs"] = max(self.stats["max_running_reqs"], len(self._active))
        kept = []
        for row, (request, token, logprob) in enumerate(zip(self._active, tokens.tolist(), logprobs.tolist(),
                                                            strict=True)):
            request.output_ids.append(token)
            request.logprobs.append(logprob)
            reason = self._finish_reason(request, token)
            if reason is None:
                kept.append(row)
            else:
                self._remember(row, request)
                self._finish(request, reason)
        self._select_rows(kept)
        if not self._active:
            return
        next_tokens = tokens[kept].view(-1, 1)
        self._mask = torch.cat([self._mask, torch.ones((len(kept), 1), dtype=torch.long)], dim=1)
        self.lora.rows = [r.adapter for r in self._active]
        out = self.model(input_ids=next_tokens, attention_mask=self._mask,
                         position_ids=self._positions.view(-1, 1), past_key_values=self._cache,
                         use_cache=True)
        self._cache = out.past_key_values
        self._positions = self._positions + 1
        self._logits = out.logits[:, -1, :].float()

    def _sample(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One token per running request and its log-prob under log_softmax(logits / temperature)."""
        logits = self._logits.clone()
        for row, request in enumerate(self._active):
            p = request.params
            if p.repetition_penalty != 1.0 and request.output_ids:
                seen = torch.tensor(sorted(set(request.output_ids)))
                values = logits[row, seen]
                logits[row, seen] = torch.where(values > 0, values / p.repetition_penalty,
                                                values * p.repetition_penalty)
            if len(request.output_ids) < p.min_new_tokens and request.stop_ids:
                logits[row, torch.tensor(sorted(request.stop_ids))] = float("-inf")
        temps = torch.tensor([1.0 if r.params.greedy else r.params.temperature for r in self._active])
        logprobs = torch.log_softmax(logits / temps.view(-1, 1), dim=-1)
        tokens = logprobs.argmax(dim=-1)  # greedy rows keep theirs
        plain = [row for row, r in enumerate(self._active) if not r.params.greedy and not _truncates(r.params)]
        if plain:  # one divide and argmax for all rows; each row's noise still from its own generator
            tokens[plain] = _race([self._active[row].generator for row in plain], logprobs[plain].exp())
        for row, request in enumerate(self._active):
            if not request.params.greedy and _truncates(request.params):
                tokens[row] = _sample_row(logprobs[row], request.params, request.generator)
        return tokens, logprobs.gather(1, tokens.view(-1, 1)).squeeze(1)

    def _finish_reason(self, request: _Request, token: int) -> dict[str, Any] | None:
        p = request.params
        if token in request.stop_ids:
            return {"type": "stop", "matched": token}
        if p.stop and self.tokenizer is not None:
            tail = self.tokenizer.decode(request.output_ids[-32:], skip_special_tokens=p.skip_special_tokens)
            for stop in p.stop:
                if stop in tail:
                    return {"type": "stop", "matched": stop}
        if len(request.output_ids) >= p.max_new_tokens:
            return {"type": "length", "length": p.max_new_tokens}
        limit = self._max_positions
        if limit and len(request.prompt_ids) + len(request.output_ids) >= limit:
            return {"type": "length", "length": len(request.output_ids)}
        return None

    def _remember(self, row: int, request: _Request) -> None:
        """Keep a finished row's KV in the prefix cache: prompt + output, but the last token (never fed)."""
        if not self.prefix_cache.enabled or request.kv_version != self._version_counter:
            return  # a request that lived through a weight update holds KV of both weights
        if request.adapter is not None and request.adapter not in self.lora:
            return  # cannot happen (unload waits for its requests); never cache KV of unknown weights
        if request.kv_weights != self.lora.weights_of(request.adapter):
            return  # its adapter was reloaded meanwhile: the KV is of the previous load
        n = len(request.prompt_ids) + len(request.output_ids) - 1
        if int(self._mask[row].sum()) != n or not bool(self._mask[row, -n:].all()):
            logger.warning("prefix cache: row %d does not hold its %d tokens contiguously; not cached", row, n)
            return
        layers = [(k[row : row + 1, :, -n:], v[row : row + 1, :, -n:]) for k, v in _cache_tensors(self._cache)]
        self.prefix_cache.put(request.prompt_ids + request.output_ids[:-1], layers, request.kv_weights)

    def _finish(self, request: _Request, reason: dict[str, Any]) -> None:
        if request.future.done():
            return
        request.future.set_result(Completion(
            rid=request.rid,
            prompt_ids=request.prompt_ids,
            output_ids=request.output_ids,
            output_logprobs=request.logprobs,
            finish_reason=reason,
            weight_version=self.weight_version,
            latency_s=time.perf_counter() - request.created,
            cached_tokens=request.cached_tokens,
            input_logprobs=request.input_logprobs,
        ))

    def _select_rows(self, rows: list[int]) -> None:
        """Keep only `rows` of the running batch and drop leading columns that are padding for all."""
        if len(rows) == len(self._active):
            return
        if not rows:
            self._reset_batch()
            return
        index = torch.tensor(rows, dtype=torch.long)
        self._active = [self._active[i] for i in rows]
        self._mask = self._mask[index]
        self._positions = self._positions[index]
        self._logits = self._logits[index]
        layers = [(k[index], v[index]) for k, v in _cache_tensors(self._cache)]
        start = int((self._mask.sum(0) == 0).long().cumprod(0).sum())  # all-padding prefix width
        if start:
            self._mask = self._mask[:, start:]
            layers = [(k[:, :, start:], v[:, :, start:]) for k, v in layers]
        self._cache = DynamicCache(ddp_cache_data=layers, config=self.model.config)

    def _reset_batch(self) -> None:
        self._active, self._cache, self._mask, self._positions, self._logits = [], None, None, None, None

    def _eos_token_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        for source in (self.model.generation_config, self.model.config):
            eos = getattr(source, "eos_token_id", None)
            ids.update([eos] if isinstance(eos, int) else (eos or []))
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return frozenset(ids)

    @staticmethod
    def _load(model_path: str, dtype: torch.dtype) -> torch.nn.Module:
        with _LOAD_LOCK:  # from_pretrained is not thread-safe: two engines in one process got meta tensors
            return AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).eval()


def _truncates(params: SamplingParams) -> bool:
    """Whether a request's draw truncates the distribution first (top-k, top-p or min-p)."""
    return 0 < params.top_k or params.top_p < 1.0 or params.min_p > 0


def _race(generators: list[torch.Generator], probs: torch.Tensor) -> torch.Tensor:
    """The exponential race of `_sample_row` for a [B, V] block of untruncated rows at once:
    argmax_v p_{b,v} / E_{b,v}, row b's E ~ Exp(1) drawn from generators[b] exactly as one row alone."""
    noise = torch.empty_like(probs)
    for row, generator in zip(noise, generators, strict=True):
        row.exponential_(generator=generator)
    return (probs / noise).argmax(dim=-1)


def _sample_row(logprobs: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """Greedy argmax, or a draw after top-k, top-p and min-p truncation with the request's RNG."""
    if params.greedy:
        return int(torch.argmax(logprobs))
    probs = logprobs.exp()
    if 0 < params.top_k < probs.numel():
        kth = torch.topk(probs, params.top_k).values[-1]
        probs = torch.where(probs >= kth, probs, 0.0)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        before = sorted_probs.cumsum(0) - sorted_probs  # mass strictly above each candidate
        sorted_probs = torch.where(before < params.top_p * sorted_probs.sum(), sorted_probs, 0.0)
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    if params.min_p > 0:
        probs = torch.where(probs >= params.min_p * probs.max(), probs, 0.0)
    # Exponential-race draw (Gumbel-max): argmax(p_i / E_i) with E_i ~ Exp(1) from the request's own RNG
    # picks i with probability p_i. Unlike an inverse-CDF draw, whose cumulative sums move by float
    # rounding when the batch composition changes, it only flips on a near-exact tie, so a request
    # samples the same tokens alone or batched (tested).
    noise = torch.empty_like(probs).exponential_(generator=generator)
    return int(torch.argmax(probs / noise))


def _cache_tensors(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _merge_caches(
    cache_a: DynamicCache, mask_a: torch.Tensor, cache_b: DynamicCache, mask_b: torch.Tensor, config: Any
) -> tuple[DynamicCache, torch.Tensor]:
    """Stack two batches' caches on the batch axis, left-padding the shorter one with masked zeros.

    Keys are stored already rotated (RoPE) with each row's own positions, so padding columns on the
    left changes nothing as long as the attention mask hides them.
    """
    width = max(mask_a.shape[1], mask_b.shape[1])

    def left_pad(t: torch.Tensor, dim: int) -> torch.Tensor:
        missing = width - t.shape[dim]
        if missing == 0:
            return t
        shape = list(t.shape)
        shape[dim] = missing
        return torch.cat([t.new_zeros(shape), t], dim=dim)

    layers = [
        (torch.cat([left_pad(ka, 2), left_pad(kb, 2)]), torch.cat([left_pad(va, 2), left_pad(vb, 2)]))
        for (ka, va), (kb, vb) in zip(_cache_tensors(cache_a), _cache_tensors(cache_b), strict=True)
    ]
    mask = torch.cat([left_pad(mask_a, 1), left_pad(mask_b, 1)])
    return DynamicCache(ddp_cache_data=layers, config=config), mask


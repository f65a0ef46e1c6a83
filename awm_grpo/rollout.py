"""Multi-turn, token-in/token-out rollout on AWM environments: slime's custom generate function.

    --custom-generate-function-path awm_grpo.rollout.generate

One call plays one episode of the task in `sample.metadata` ({"scenario", "task_idx", "task"}):

    tokens = prompt                                   (system prompt + task, chat template)
    repeat:  model turn   -> engine /generate on `tokens`;  appended with loss mask 1 + log-probs
             reply        -> final answer (no <tool_call>)  => stop
                          -> tool calls: run them (first or all), observation delta appended, mask 0
    verify the final DB (+ final answer) in the sandbox  -> sample.metadata["awm"]  -> reward.py

Stop conditions: final answer; `awm_max_turns` model turns (or the turn schedule); response budget
(`--rollout-max-response-len`, shared by model and observation tokens, and
`--rollout-max-context-len`); an invalid call with `awm_terminate_on_invalid_call`;
`awm_max_repeated_calls` identical calls (same name and arguments) in a row; engine abort; the
environment's `done` (AgentGym-protocol rows, awm_grpo.agentgym.client: stop reason "env_done").

Recovery method (optional): with `awm_predicates` (a predicates JSONL) each turn that ran a tool
gets Phi after it (awm_grpo.recovery.progress), every model turn its response-token span [start, end), and
`sample.metadata["awm"]["credit"]` the compact per-turn signals awm_grpo.recovery.advantages needs.
`sample.metadata` may carry `start_db` (a DB file loaded before the first turn) and `start_messages`
(assistant / tool messages after the task, part of the prompt): the controlled recovery split.

B1's sliding window (`awm_history_window_turns` K, with `awm_credit_method: b1` only): once the
conversation holds more than K model turns, the engine sees system prompt + task + the last K
(assistant, tool...) turns, re-rendered with the chat template. A token is trained only under the
context it was sampled from, so such a turn is masked (loss mask 0) in the episode's sample and
trained in a sample of its own (its windowed context as prompt, its tokens as response); `generate`
returns the episode's sample first, then these (`metadata["awm_segment"]`), and the advantage
function gives every one of them the episode's advantage (awm_grpo.recovery.plugin).

Infrastructure failures (environment crash or timeout, verifier crash or timeout) set status
FAILED and `remove_sample`, so the trainer keeps them out of group statistics and the loss; the
reason is in `sample.metadata["awm"]["infra_error"]` and counted by `awm_grpo.traces`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import json
import sqlite3
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from awm_grpo import drift_check, protocol
from awm_grpo.agentgym.client import (
    SCENARIO_PREFIX,
    episode_target,
    open_configured,
    parse_agentgym_envs,
    spec_for,
)
from awm_grpo.chat import ChatEncoder
from awm_grpo.context.document import DocumentEnv, document_target, ground_truth_of
from awm_grpo.env_client import EnvConfig, EnvInfraError, EnvSession, ToolResult, open_env
from awm_grpo.traces import write_trace
from slime.engine.lora_adapters import generate_lora_fields
from slime.rollout.sglang_rollout import GenerateState, count_generate_request, engine_url
from slime.utils.fd_limit import raise_open_file_limit
from slime.utils.http_utils import post
from slime.utils.types import Sample

TRUNCATION_MARKER = "\n[... observation truncated: {n} more tokens]"
FILES_BESIDES_EPISODES = 256  # libraries, the worker and sandbox pipes, trace and state files being read


@dataclass(frozen=True)
class RolloutConfig:
    """The awm_* keys of the runtime YAML (`--custom-config-path`), with their defaults."""

    env: EnvConfig = field(default_factory=EnvConfig)
    tool_mode: str = "meta"  # meta: list_tools/call_tool (upstream AWM) | native: schemas in the template
    calls_per_turn: str = "first"  # first | all
    max_turns: int = 15
    turn_schedule: dict[str, Any] | None = None  # {"rounds": [10, 20, 30], "every": 100}
    max_tokens_per_turn: int | None = None
    max_observation_tokens: int = 1024  # a tool result's cap; the tool catalogue is never cut
    terminate_on_invalid_call: bool = True
    max_repeated_calls: int = 3
    enable_thinking: bool = False
    trace_dir: str | None = None
    predicates: str | None = None  # predicates JSONL: per-turn progress (awm_grpo.recovery.progress)
    judge: Any = None  # awm_grpo.recovery.judge.JudgeConfig: B2+'s per-call helpfulness scores (awm_judge_url)
    history_window_turns: int | None = None  # B1's sliding window: the engine sees the last K turns (module doc)
    drift_workers: int = 0  # processes for the end-of-episode drift check (awm_grpo.drift_check); 0: in the driver

    def __post_init__(self) -> None:
        if self.predicates and self.env.transport != "inprocess":
            raise ValueError("awm_predicates needs awm_transport 'inprocess': progress predicates read the episode "
                             "DB directly, which MCP servers do not expose")
        if self.tool_mode not in ("meta", "native"):
            raise ValueError(f"awm_tool_mode {self.tool_mode!r} is unknown: use 'meta' or 'native'")
        if self.calls_per_turn not in ("first", "all"):
            raise ValueError(f"awm_calls_per_turn {self.calls_per_turn!r} is unknown: use 'first' or 'all'")
        if self.history_window_turns is not None and self.history_window_turns < 1:
            raise ValueError(f"awm_history_window_turns {self.history_window_turns}: use >= 1, or null for the "
                             "full history")
        if self.drift_workers < 0:
            raise ValueError(f"awm_drift_workers {self.drift_workers}: use 0 (the driver checks) or more processes")
        if self.max_turns < 1 or self.max_repeated_calls < 1:
            raise ValueError("awm_max_turns and awm_max_repeated_calls must be >= 1")
        if self.turn_schedule is not None:
            rounds, every = self.turn_schedule.get("rounds"), self.turn_schedule.get("every")
            if not rounds or not all(isinstance(r, int) and r > 0 for r in rounds) or not isinstance(every, int) \
                    or every < 1:
                raise ValueError(f"awm_turn_schedule {self.turn_schedule!r}: expected "
                                 '{"rounds": [positive ints], "every": steps >= 1}')

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RolloutConfig:
        cached = getattr(args, "_awm_rollout_config", None)
        if cached is not None:
            return cached

        def get(name: str, default: Any) -> Any:
            value = getattr(args, f"awm_{name}", None)
            return default if value is None else value

        env = EnvConfig(transport=get("transport", "inprocess"), data_dir=get("data_dir", None),
                        mcp_urls=tuple(get("mcp_urls", ())), workers=int(get("env_workers", 2)),
                        tool_timeout_s=float(get("tool_timeout", 30.0)),
                        verifier_timeout_s=float(get("verifier_timeout", 30.0)),
                        agentgym=parse_agentgym_envs(get("agentgym_envs", None)))
        cfg = cls(env=env, tool_mode=get("tool_mode", "meta"), calls_per_turn=get("calls_per_turn", "first"),
                  max_turns=int(get("max_turns", 15)), turn_schedule=get("turn_schedule", None),
                  max_tokens_per_turn=get("max_tokens_per_turn", None),
                  max_observation_tokens=int(get("max_observation_tokens", 1024)),
                  terminate_on_invalid_call=bool(get("terminate_on_invalid_call", True)),
                  max_repeated_calls=int(get("max_repeated_calls", 3)),
                  enable_thinking=bool(get("enable_thinking", False)), trace_dir=get("trace_dir", None),
                  predicates=get("predicates", None), judge=_judge_config(args),
                  history_window_turns=get("history_window_turns", None),
                  drift_workers=int(get("drift_workers", 0)))
        if cfg.history_window_turns is not None and get("credit_method", None) != "b1":
            raise ValueError("awm_history_window_turns (B1's sliding window) needs awm_credit_method b1: a windowed "
                             "episode is several samples, and only awm_grpo.recovery.advantages gives them one "
                             "episode-level advantage (AWM_CREDIT_METHOD=b1)")
        if cfg.history_window_turns is not None and not getattr(args, "calculate_per_token_loss", False):
            raise ValueError("awm_history_window_turns needs --calculate-per-token-loss (the launcher adds it): "
                             "with the default mean of per-sample means, each windowed turn's sample would weigh "
                             "as much as a whole episode")
        args._awm_rollout_config = cfg
        return cfg

    def max_turns_at(self, step: int) -> int:
        """The turn limit at training step `step`: fixed, or AgentGym-RL-style stepwise growth."""
        if self.turn_schedule is None:
            return self.max_turns
        rounds, every = self.turn_schedule["rounds"], self.turn_schedule["every"]
        return rounds[min(max(step, 0) // every, len(rounds) - 1)]


@dataclass
class Episode:
    """What one rollout did, turn by turn: becomes the trace record and sample.metadata["awm"]."""

    scenario: str
    task_idx: int
    task: str
    turns: list[dict[str, Any]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    stop_reason: str = ""
    final_answer: str | None = None
    verdict: str | None = None
    verdict_detail: str = ""
    verifier_result: dict[str, Any] | None = None
    infra_error: str | None = None
    invalid_calls: int = 0
    tool_calls: int = 0
    drift_tokens: int = 0
    recovery: dict[str, Any] | None = None  # awm_grpo.recovery.progress: Phi_0, preservation, per-turn credit signals
    judge: list[float | None] | None = None  # B2+: the judge's score per turn (None: no tool ran)
    context: dict[str, Any] | None = None  # context management (awm_grpo.context.loop): deletions, samples, tokens
    timings: dict[str, float] = field(default_factory=lambda: {"generate_s": 0.0, "env_s": 0.0, "verify_s": 0.0})

    def summary(self) -> dict[str, Any]:
        """The small part that travels with the sample (traces hold the rest)."""
        return {"scenario": self.scenario, "task_idx": self.task_idx, "turns": len(self.turns),
                "stop_reason": self.stop_reason, "verdict": self.verdict, "infra_error": self.infra_error,
                "invalid_calls": self.invalid_calls, "tool_calls": self.tool_calls,
                "drift_tokens": self.drift_tokens, "verifier_result": self.verifier_result,
                "timings": self.timings, "credit": (self.recovery or {}).get("credit"), "judge": self.judge,
                "context": self.context}


def _training_step(sample: Sample) -> int:
    """The engine's weight version is the trainer's step (slime.train syncs weights as `str(step)`)."""
    for version in reversed(sample.weight_versions or []):
        try:
            return int(version)
        except (TypeError, ValueError):
            continue
    return 0


class ToolRunner:
    """Runs the tool calls of one model reply against the environment; owns repeat detection."""

    def __init__(self, cfg: RolloutConfig, env: EnvSession, episode: Episode) -> None:
        self.cfg, self.env, self.episode = cfg, env, episode
        self.progress: Any = None  # awm_grpo.recovery.progress.ProgressTracker when awm_predicates is set
        self.last_key: str | None = None
        self.repeats = 0

    async def run(self, parsed: protocol.ParsedReply) -> tuple[list[str], list[dict[str, Any]], str | None]:
        """(observation texts, call records, stop reason or None)."""
        calls = parsed.calls if self.cfg.calls_per_turn == "all" else parsed.calls[:1]
        texts, records, stop = [], [], None
        for call in calls:
            if self.cfg.tool_mode == "meta" and isinstance(call, protocol.ToolCall):
                call = protocol.resolve_meta_call(call)
            if isinstance(call, protocol.InvalidCall):
                self.episode.invalid_calls += 1
                texts.append(protocol.invalid_call_text(call))
                records.append({"invalid": call.reason, "raw": call.raw[:2000]})
                if self.cfg.terminate_on_invalid_call:
                    return texts, records, "invalid_call"
                continue
            key = call.key()
            self.repeats = self.repeats + 1 if key == self.last_key else 1
            self.last_key = key
            started = time.perf_counter()
            catalogue = self.cfg.tool_mode == "meta" and call.name == protocol.LIST_TOOLS
            if catalogue:
                result = ToolResult(protocol.tool_catalogue(self.env.tools), False)
            else:
                result = await self.env.call(call.name, call.arguments)
                self.episode.tool_calls += 1
            self.episode.timings["env_s"] += time.perf_counter() - started
            texts.append(protocol.observation_text(result.text, result.is_error))
            records.append({"name": call.name, "arguments": call.arguments, "is_error": result.is_error,
                            "kind": result.kind, **({"catalogue": True} if catalogue else {})})
            if result.kind in ("invalid_arguments", "unknown_tool"):
                self.episode.invalid_calls += 1
                if self.cfg.terminate_on_invalid_call:
                    return texts, records, "invalid_call"
            if result.done:  # the environment ended the episode (an AgentGym server's `done`)
                return texts, records, "env_done"
            if self.repeats >= self.cfg.max_repeated_calls:
                return texts, records, "repeated_call"
        return texts, records, stop


def cap_observations(encoder: ChatEncoder, texts: list[str], calls: list[dict[str, Any]], limit: int) -> list[str]:
    """Each tool result cut to `limit` tokens, except the tool catalogue (meta mode's `list_tools`), which
    the model always sees whole: a tool it cannot see it cannot call, and AWM-1K's scenarios have 16-87
    tools (code_hosting_2's 61 take about 3k Qwen3 tokens). `calls` are the turn's call records, one per text."""
    return [text if call.get("catalogue") else _truncate(encoder, text, limit)
            for text, call in zip(texts, calls, strict=True)]


def _truncate(encoder: ChatEncoder, text: str, limit: int) -> str:
    bound = encoder.max_tokens(text)
    if bound is not None and bound <= limit:  # short enough to need no count
        return text
    ids = encoder.encode(text)
    if len(ids) <= limit:
        return text
    return encoder.decode(ids[:limit]) + TRUNCATION_MARKER.format(n=len(ids) - limit)


def turn_seed(args: argparse.Namespace, sample: Sample, turn: int, evaluation: bool) -> int | None:
    """The `sampling_seed` of one model turn: fixed by the rollout seed, the sample and the turn.

    Without it an engine seeds each request by its arrival order, and the arrival order of concurrent
    multi-turn episodes depends on tool-call timings: two runs with the same seeds sampled differently.
    The CPU engine samples each request from its own generator seeded with this; SGLang uses it under
    `--enable-deterministic-inference` and ignores it otherwise (its own `SamplingParams.sampling_seed`).
    None for a sample without an index: one seed shared by a whole group would make its episodes identical."""
    if sample.index is None:
        return None
    key = f"{getattr(args, 'rollout_seed', 0)}/{'eval' if evaluation else 'train'}/{sample.index}/{turn}"
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") >> 1  # < 2**63


Policy = Callable[[list[int], dict[str, Any]], Awaitable[dict[str, Any]]]
"""A model turn: (input ids, sampling params) -> SGLang's /generate reply ({"meta_info": {...}})."""


def engine_policy(args: argparse.Namespace, sample: Sample) -> Policy:
    """The rollout engine (SGLang, or the CPU engine) behind slime's router address."""
    url = f"{engine_url(args, sample)}/generate"

    async def turn(input_ids: list[int], params: dict[str, Any]) -> dict[str, Any]:
        count_generate_request(args)
        return await post(url, {"input_ids": input_ids, "sampling_params": params, "return_logprob": True,
                                **generate_lora_fields(args)})  # a LoRA run: lora_path = its adapter's name

    return turn


async def generate(args: argparse.Namespace, sample: Sample, sampling_params: dict[str, Any],
                   evaluation: bool = False) -> Sample:
    """slime custom generate function: one episode with the rollout engine as the policy.

    Returns the episode's sample, or (sliding window only) it followed by the windowed turns' samples.
    `--partial-rollout` is refused: an episode's database and tool history live only while it plays, so a
    half-played episode cannot be continued in a later step."""
    if getattr(args, "partial_rollout", False):
        raise NotImplementedError("--partial-rollout cannot continue AWM episodes (the environment's state ends "
                                  "with the step); drop the flag: aborted episodes are replayed from their prompt")
    segments: list[Sample] = []
    out = await play(args, sample, sampling_params, engine_policy(args, sample), evaluation=evaluation,
                     segments=None if evaluation else segments)
    return [out, *segments] if segments else out


Body = Callable[..., Awaitable[None]]
"""The turn loop of one open episode: `_play`'s signature (awm_grpo.context.loop has the context-managed one)."""


async def play(args: argparse.Namespace, sample: Sample, sampling_params: dict[str, Any], policy: Policy,
               *, evaluation: bool = False, segments: list[Sample] | None = None, body: Body | None = None) -> Sample:
    """Play one episode of `sample.metadata`'s task with `policy`; see the module docstring.

    `segments`: collects the episode's further samples (sliding window, context snapshots). `body`: the turn
    loop, `_play` by default; opening, infrastructure failures, metadata and the trace are the same for all."""
    cfg = RolloutConfig.from_args(args)
    _check_open_files(args)
    relax_gc()
    meta = sample.metadata or {}
    document = document_target(meta)  # a document-QA row (awm_grpo.context.document)
    try:
        target = document or episode_target(meta)  # an AgentGym row: scenario "agentgym:<env>", task_idx its data_idx
        scenario, task_idx = document or ((f"{SCENARIO_PREFIX}{target[0]}", target[1]) if target
                                          else (str(meta["scenario"]), int(meta["task_idx"])))
    except KeyError as exc:
        raise ValueError(f"sample {sample.index} has no {exc.args[0]!r} in its metadata: prompts must come from "
                         "awm_grpo.data_prep (metadata: scenario, task_idx, task)") from None
    episode = Episode(scenario, task_idx, str(meta.get("task", "")))
    env: EnvSession | None = None
    try:
        env = open_document(args, sample) if document else await open_env_cancellable(cfg.env, episode)
        await (body or _play)(args, cfg, sample, sampling_params, policy, env, episode, segments, evaluation)
    except EnvInfraError as exc:
        episode.infra_error = str(exc)
        episode.stop_reason = episode.stop_reason or "infra_error"
    finally:
        if env is not None:
            await env.close()
    if episode.infra_error:
        sample.status = Sample.Status.FAILED
        sample.remove_sample = True
    sample.metadata = {**meta, "awm": episode.summary()}
    for k, seg in enumerate(segments or []):  # no trace record: the episode is counted once
        seg.metadata = {**meta, "awm": sample.metadata["awm"],
                        "awm_segment": {"of": sample.index, "k": k + 1, **(seg.metadata or {}).get("awm_segment", {})}}
        seg.status, seg.remove_sample = sample.status, sample.remove_sample
    write_trace(cfg.trace_dir, "eval" if evaluation else "rollout", _training_step(sample), sample, episode)
    return sample


def open_document(args: argparse.Namespace, sample: Sample) -> EnvSession:
    """A document-QA episode (StateLM's layout): the row's document behind the document tools, graded against
    the row's ground truth. Local and cheap: nothing to open or cancel."""
    tokenizer = GenerateState(args).tokenizer
    meta = sample.metadata or {}
    return DocumentEnv(str(meta["document_content"]), ground_truth_of(sample.label, meta),
                       lambda text: list(tokenizer.encode(text, add_special_tokens=False)),
                       lambda ids: tokenizer.decode(ids), default_chunk_tokens=document_chunk_tokens(args))


def document_chunk_tokens(args: argparse.Namespace) -> int:
    """buildIndex's default chunk: StateLM's 4,000 tokens, or a quarter of a smaller context limit."""
    limit = getattr(args, "awm_context_limit", None)
    return 4000 if not limit else max(16, min(4000, int(limit) // 4))


async def open_episode(cfg: EnvConfig, episode: Episode) -> EnvSession:
    """The episode's environment: for an `agentgym:<env>` scenario one of that kind's AgentGym servers, and
    the task the model reads becomes the env's instruction and first observation; else the AWM task over
    `cfg.transport` (awm_grpo.env_client.open_env)."""
    if not episode.scenario.startswith(SCENARIO_PREFIX):
        return await open_env(cfg, episode.scenario, episode.task_idx)
    env = await open_configured(cfg.agentgym, episode.scenario, episode.task_idx, cfg.tool_timeout_s)
    episode.task = spec_for(cfg.agentgym, episode.scenario).task_text(env.initial_observation)
    return env


async def open_env_cancellable(cfg: EnvConfig, episode: Episode) -> EnvSession:
    """`open_episode`, except that a cancellation arriving while the episode opens (the step's batch filled and
    slime cancels the episodes still in flight) lets the open finish and closes the episode: by then the
    environment may hold its DB (worker) or session (MCP server), which nothing else would release."""
    opening = asyncio.ensure_future(open_episode(cfg, episode))
    try:
        return await asyncio.shield(opening)
    except asyncio.CancelledError:
        try:
            env = await opening
        except Exception:  # noqa: BLE001 - the open failed: nothing was opened to release
            raise asyncio.CancelledError from None
        await env.close()
        raise


_gc_relaxed = False
GC_YOUNG_THRESHOLD = 50_000  # container allocations between young collections (CPython's default: 700)


def relax_gc() -> None:
    """Once per process: freeze what exists (libraries, the tokenizer) out of the cyclic collector's walks
    and collect young objects every 50,000 allocations instead of 700.

    A step's episodes allocate millions of short-lived containers (an engine reply is one list per token),
    so the default thresholds ran thousands of young and dozens of full collections a step: a full one
    walks every object of torch and transformers, and the young ones walk the replies of the 1,000
    episodes in flight. That was about a third of the rollout driver's CPU (docs/performance.md, "1,024
    concurrent episodes"). Objects still die by reference count as before; only cycles wait longer."""
    global _gc_relaxed
    if _gc_relaxed:
        return
    _gc_relaxed = True
    gc.collect()
    gc.freeze()
    young, middle, old = gc.get_threshold()
    if young:  # 0: collection switched off by the caller; leave it so
        gc.set_threshold(max(young, GC_YOUNG_THRESHOLD), middle, old)


def _check_open_files(args: argparse.Namespace) -> None:
    """Raise the open-file limit for every episode the step may run at once (once per process).

    Each holds its engine connection here and its DB connection in an environment worker, which
    inherits this process's limit when the runtime starts it (so before the first episode opens).
    """
    if getattr(args, "_awm_open_files_checked", False):
        return
    raise_open_file_limit(GenerateState(args).concurrency + FILES_BESIDES_EPISODES, "the rollout")
    args._awm_open_files_checked = True


async def _play(args: argparse.Namespace, cfg: RolloutConfig, sample: Sample, sampling_params: dict[str, Any],
                policy: Policy, env: EnvSession, episode: Episode, segments: list[Sample] | None = None,
                evaluation: bool = False) -> None:
    tokenizer = GenerateState(args).tokenizer
    encoder = _shared_encoder(args, tokenizer, cfg, env.tools, getattr(env, "system_prompt", None))
    task = episode.task or (sample.prompt[-1]["content"] if isinstance(sample.prompt, list) else str(sample.prompt))
    episode.task = task
    prefix = await start_state(env, sample.metadata or {})
    episode.messages = [{"role": "user", "content": task}, *prefix]
    # The rollout owns the prompt (system prompt and tools depend on the config and the environment);
    # a start-state conversation prefix is part of the prompt, never trained on.
    pieces: dict[str, list[int]] = {}  # the conversation's encoded pieces: the drift check finds them again
    prompt = encoder.encode(encoder.render(episode.messages, add_generation_prompt=True)) if prefix \
        else encoder.prompt_ids(task, pieces)
    sample.tokens, sample.response_length, sample.response = list(prompt), 0, ""
    sample.loss_mask, sample.rollout_log_probs = [], []
    budget = args.rollout_max_response_len or sampling_params.get("max_new_tokens", 1024)
    if args.rollout_max_context_len is not None:
        budget = min(budget, args.rollout_max_context_len - len(prompt))
    turns = ToolRunner(cfg, env, episode)
    if cfg.predicates:
        from awm_grpo.recovery.progress import open_tracker

        turns.progress = await asyncio.to_thread(open_tracker, cfg.predicates, env.code, episode.scenario,
                                                 episode.task_idx, env.db_path)
    open_turn = False
    while True:
        left = budget - sample.response_length
        if left <= 0:
            sample.status, episode.stop_reason = Sample.Status.TRUNCATED, "context_budget"
            break
        params = dict(sampling_params, max_new_tokens=min(left, cfg.max_tokens_per_turn or left))
        turn = sum(m["role"] == "assistant" for m in episode.messages)  # model turns so far
        if params.get("sampling_seed") is None and (seed := turn_seed(args, sample, turn, evaluation)) is not None:
            params["sampling_seed"] = seed
        context = list(sample.tokens)
        windowed = cfg.history_window_turns is not None and turn > cfg.history_window_turns
        if windowed:
            kept = window_messages(episode.messages, cfg.history_window_turns)
            context = encoder.encode(encoder.render(kept, add_generation_prompt=True))
        started = time.perf_counter()
        output = await policy(context, params)
        episode.timings["generate_s"] += time.perf_counter() - started
        info = output["meta_info"]
        # taken out of the reply: one list per token, which would otherwise live through the tool call and
        # the next generation (a step's episodes hold millions of them, for the cyclic collector to walk)
        pairs = info.pop("output_token_logprobs", None) or []
        ids, logps = [int(p[1]) for p in pairs], [float(p[0]) for p in pairs]
        del pairs
        text = encoder.decode(ids)
        span = [sample.response_length, sample.response_length + len(ids)]  # this turn's model tokens [start, end)
        if windowed:  # trained in its own sample, under the context it was sampled from
            sample.append_response_tokens(args, ids, trainable=False, meta_info=info, text=text)
            if segments is not None:
                seg = Sample(index=sample.index, group_index=sample.group_index, prompt=sample.prompt,
                             tokens=list(context), response_length=0, loss_mask=[], rollout_log_probs=[])
                seg.append_response_tokens(args, ids, logps, meta_info=info, text=text)
                segments.append(seg)
        else:
            sample.append_response_tokens(args, ids, logps, meta_info=info, text=text)
        closed = bool(ids) and ids[-1] == encoder.end_of_turn_id
        content = text[: -len(encoder.end_of_turn)] if closed and text.endswith(encoder.end_of_turn) else text
        finish = (info.get("finish_reason") or {}).get("type")
        stop, texts = await model_turn(cfg, turns, content, finish, len(ids), _training_step(sample))
        episode.turns[-1]["span"] = span
        open_turn = False
        if stop == "engine_abort":
            return  # ABORTED: slime regenerates the group; nothing to verify
        if stop is not None:
            break
        texts = cap_observations(encoder, texts, episode.turns[-1].get("calls", []), cfg.max_observation_tokens)
        obs_ids, obs_text = encoder.observation(texts, model_closed_turn=closed, pieces=pieces)
        if sample.response_length + len(obs_ids) >= budget:
            sample.status, episode.stop_reason = Sample.Status.TRUNCATED, "context_budget"
            break
        sample.append_response_tokens(args, obs_ids, trainable=False, text=obs_text)
        episode.messages += [{"role": "tool", "content": t} for t in texts]
        open_turn = True
    if sample.status == Sample.Status.PENDING:
        sample.status = Sample.Status.COMPLETED
    drift = await drift_check.drift(encoder, cfg.drift_workers, sample.tokens, episode.messages, open_turn=open_turn,
                                    pieces=pieces)
    episode.drift_tokens = drift.mismatched_tokens
    if turns.progress is not None:
        episode.recovery = await asyncio.to_thread(turns.progress.finish, episode.turns)
        episode.recovery["prefix_turns"] = sum(m["role"] == "assistant" for m in prefix)
    await verify(cfg, env, episode)
    if cfg.judge is not None and not episode.infra_error and not evaluation:  # a training reward only
        await judge_episode(args, cfg, episode)


def window_messages(messages: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """The task message and the last k model turns, each with the tool messages after it."""
    starts = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if len(starts) <= k:
        return list(messages)
    return [messages[0], *messages[starts[-k]:]]


def _judge_config(args: argparse.Namespace) -> Any:
    from awm_grpo.recovery.judge import JudgeConfig

    return JudgeConfig.from_args(args)


async def judge_episode(args: argparse.Namespace, cfg: RolloutConfig, episode: Episode) -> None:
    """B2+: the judge's score of every turn that ran a tool; a judge failure is the episode's infra_error."""
    from awm_grpo.recovery.judge import JudgeError, score_turns, shared_client

    try:
        episode.judge = await score_turns(shared_client(args, cfg.judge), episode.task, episode.turns)
    except JudgeError as exc:
        episode.infra_error = f"judge: {exc}"[:1000]
        return
    for turn, score in zip(episode.turns, episode.judge, strict=True):
        turn["judge_score"] = score


def _shared_encoder(args: argparse.Namespace, tokenizer: Any, cfg: RolloutConfig, tools: list[dict[str, Any]],
                    preamble: str | None = None) -> ChatEncoder:
    """`chat_encoder`, built once per run, tool list (meta mode: one) and preamble: building one renders the
    template four times, which a step of 1,024 episodes would otherwise pay 1,024 times."""
    cache = args.__dict__.setdefault("_awm_encoders", {})
    key = (id(tokenizer), json.dumps(tools, sort_keys=True) if cfg.tool_mode == "native" else None, preamble)
    if key not in cache:
        cache[key] = chat_encoder(tokenizer, cfg, tools, preamble)
    return cache[key]


def chat_encoder(tokenizer: Any, cfg: RolloutConfig, tools: list[dict[str, Any]],
                 preamble: str | None = None) -> ChatEncoder:
    """The episode's chat encoding: meta mode's fixed system prompt, or native mode's with the tool schemas;
    `preamble` (a document task's or context management's instructions) goes before it."""
    native = cfg.tool_mode == "native"
    system = protocol.NATIVE_SYSTEM_PROMPT if native else protocol.META_SYSTEM_PROMPT
    return ChatEncoder(tokenizer, f"{preamble}\n\n{system}" if preamble else system,
                       protocol.native_tool_schemas(tools) if native else None, {"enable_thinking": cfg.enable_thinking})


async def start_state(env: EnvSession, meta: dict[str, Any]) -> list[dict[str, Any]]:
    """Optional start state: load `meta["start_db"]` into the episode; return `meta["start_messages"]`.

    The controlled recovery split (awm_grpo.recovery.split) starts episodes from a snapshotted
    damaged DB and the conversation that led there (assistant / tool messages after the task).
    """
    if meta.get("start_db"):
        if not hasattr(env, "load_state"):
            raise ValueError("a start_db needs awm_transport 'inprocess': MCP episodes cannot load a DB file")
        await env.load_state(str(meta["start_db"]))
    prefix = list(meta.get("start_messages") or [])
    for m in prefix:
        if m.get("role") not in ("assistant", "tool") or not isinstance(m.get("content"), str):
            raise ValueError(f"start_messages entries must be assistant / tool messages with text content, got {m!r}")
    return prefix


async def model_turn(cfg: RolloutConfig, turns: ToolRunner, content: str, finish: str | None, n_tokens: int,
                     step: int) -> tuple[str | None, list[str]]:
    """Record one model reply and run its calls: (stop reason, or None to go on; observation texts).

    Shared by the token rollout and the chat-level evaluation (awm_grpo.eval), so both apply the
    same protocol and stop conditions.
    """
    episode = turns.episode
    episode.messages.append({"role": "assistant", "content": content})
    turn: dict[str, Any] = {"turn": len(episode.turns) + 1, "assistant": content, "tokens": n_tokens,
                            "finish": finish}
    episode.turns.append(turn)
    if finish == "abort":
        episode.stop_reason = "engine_abort"
        return episode.stop_reason, []
    parsed = protocol.parse_reply(content)
    if parsed.is_final:
        episode.final_answer, episode.stop_reason = content, "final_answer"
        return episode.stop_reason, []
    if finish == "length":  # a half-written call: the budget is gone
        episode.stop_reason = "context_budget"
        return episode.stop_reason, []
    texts, records, stop = await turns.run(parsed)
    turn["calls"], turn["observations"] = records, texts
    if any("name" in r for r in records):
        turn["state"] = await turns.env.state()
        if turns.progress is not None:
            try:
                turn["progress"] = await asyncio.to_thread(turns.progress.after_tool_turn)
            except (sqlite3.Error, OSError) as exc:  # env code left a DB the predicates cannot read
                raise EnvInfraError(f"progress predicates on the episode DB: {type(exc).__name__}: {exc}") from exc
    if stop is None and len(episode.turns) >= cfg.max_turns_at(step):
        stop = "max_turns"
    if stop is not None:
        episode.stop_reason = stop
    return stop, texts


async def verify(cfg: RolloutConfig, env: EnvSession, episode: Episode) -> None:
    """Run the task's verifier on the final state, unless the episode ended on a format violation."""
    if episode.stop_reason == "invalid_call" and cfg.terminate_on_invalid_call:
        episode.verdict = "format_error"  # terminated for format: the reward is the penalty, no verifier run
        return
    started = time.perf_counter()
    verdict = await env.verify(episode.final_answer)
    episode.timings["verify_s"] = time.perf_counter() - started
    episode.verdict, episode.verdict_detail, episode.verifier_result = verdict.verdict, verdict.detail, verdict.result
    if verdict.infra_failure:
        episode.infra_error = f"verifier {verdict.verdict}: {verdict.detail[:500]}"

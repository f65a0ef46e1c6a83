"""The context-managed episode: StateLM's rollout on our environments, as slime's generate function.

    --custom-generate-function-path awm_grpo.context.loop.generate     (the launcher sets it: context.* knobs)

An episode runs like awm_grpo.rollout's (same protocol, tool runner, stop rules and verifier), except:

- **Memory tools** (`awm_context_tools`): checkBudget, note, readNote, updateNote and deleteContext sit beside
  the environment's tools (awm_grpo.context.tools); a document-QA row brings the document tools itself
  (awm_grpo.context.document). Tool results carry message ids (awm_grpo.context.history).
- **A context budget** (`awm_context_limit` L tokens, `awm_context_reserve` R of them kept for the next turn):
  the engine's context is what it sees now, not the whole episode. Before a turn, and before a tool result
  is added, context + R > L ends the episode (stop "context_budget"; a document task then has no answer).
- **Samples.** Tokens are trained only under the context they were sampled from, so an episode becomes
  several samples, each a prompt the engine saw and the model tokens it produced (mask 1; tool tokens 0):

      snapshot  (StateLM's generic mode) a deletion closes the running sample after the deleteContext turn;
                the conversation is rendered again (stubs, notes block, the deleteContext result) and is the
                next sample's prompt, with an empty response
      per_turn  (the mode of StateLM's Qwen3 scripts) every model turn that ran tools closes its sample; the
                next prompt is this one's tokens plus the results (a deletion renders it again, as above)

  The last sample is the episode's own (`generate` returns it first, then the earlier ones with
  `metadata["awm_segment"]`); all of them share the episode's metadata, so reward.py gives each the episode's
  reward, and they keep the prompt's `group_index`: GRPO normalises over every sample of the prompt's
  episodes, as StateLM does. At most `awm_context_max_samples` K are kept: the last, and K-1 of the others
  drawn at random (seeded), StateLM's default. Evaluation keeps only the last.

Where this departs from StateLM: the per-turn mode does not strip earlier think blocks (our episodes run with
thinking off, and the drift check of awm_grpo.rollout covers the template); the AWM outcome reward is kept for
AWM tasks (StateLM's +1/-0.5/-1 applies to document tasks); the episode is refused with B1's window, progress
predicates, the judge or a start state, whose per-turn bookkeeping assumes one token stream.
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass
from typing import Any

from awm_grpo.context.history import History
from awm_grpo.context.tools import MemoryTools
from awm_grpo.env_client import EnvSession, ToolResult
from awm_grpo.rollout import (
    Episode,
    Policy,
    RolloutConfig,
    ToolRunner,
    _shared_encoder,
    _training_step,
    cap_observations,
    engine_policy,
    model_turn,
    play,
    turn_seed,
    verify,
)
from slime.rollout.sglang_rollout import GenerateState
from slime.utils.types import Sample

SAMPLE_MODES = ("snapshot", "per_turn")
MEMORY_PREAMBLE = """Your context window is limited. Every tool result shows its message id ("msg_id") and the id \
of the assistant turn that called it; deleteContext(msg_id) replaces a message you no longer need with a short \
stub, and note / readNote / updateNote keep what you want to remember outside the conversation (their keys and \
summaries stay listed under the task). checkBudget tells you how many tokens and turns are left."""


@dataclass(frozen=True)
class ContextConfig:
    """The awm_context_* keys of the runtime YAML."""

    tools: bool = False  # the memory tools beside the environment's
    limit: int | None = None  # tokens the engine's context may hold (None: --rollout-max-context-len)
    reserve: int = 2048  # tokens kept for the next model turn (its max_new_tokens)
    samples: str = "snapshot"  # snapshot | per_turn
    max_samples: int = 8  # samples kept per episode

    def __post_init__(self) -> None:
        if self.samples not in SAMPLE_MODES:
            raise ValueError(f"awm_context_samples {self.samples!r} is unknown: use 'snapshot' or 'per_turn'")
        if self.max_samples < 1 or self.reserve < 1:
            raise ValueError("awm_context_max_samples and awm_context_reserve must be >= 1")
        if self.limit is not None and self.limit <= self.reserve:
            raise ValueError(f"awm_context_limit {self.limit} must be larger than awm_context_reserve {self.reserve}: "
                             "the reserve is the room left for the next turn")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ContextConfig:
        cached = getattr(args, "_awm_context_config", None)
        if cached is not None:
            return cached

        def get(name: str, default: Any) -> Any:
            value = getattr(args, f"awm_context_{name}", None)
            return default if value is None else value

        limit = get("limit", None) or getattr(args, "rollout_max_context_len", None)
        cfg = cls(tools=bool(get("tools", False)), limit=None if limit is None else int(limit),
                  reserve=int(get("reserve", 2048)), samples=str(get("samples", "snapshot")),
                  max_samples=int(get("max_samples", 8)))
        if cfg.limit is None:
            raise ValueError("the context-managed rollout needs a context limit: set context.limit "
                             "(AWM_CONTEXT_LIMIT) or --rollout-max-context-len")
        rollout = RolloutConfig.from_args(args)
        clashes = [name for name, on in (("awm_history_window_turns (B1's window)", rollout.history_window_turns),
                                         ("awm_predicates", rollout.predicates), ("awm_judge_url", rollout.judge),
                                         ("awm_credit_method", getattr(args, "awm_credit_method", None))) if on]
        if clashes:
            raise ValueError(f"the context-managed rollout cannot run with {', '.join(clashes)}: their per-turn "
                             "bookkeeping assumes one token stream per episode; turn them off or drop context.*")
        args._awm_context_config = cfg
        return cfg


class ManagedEnv:
    """The episode's environment with the memory tools beside its own: calls to those are answered here."""

    def __init__(self, env: EnvSession, memory: MemoryTools | None) -> None:
        self.env, self.memory = env, memory
        own = {t["name"] for t in env.tools}
        clash = sorted(own & memory.names) if memory else []
        if clash:
            raise ValueError(f"the environment has tools named like the memory tools ({', '.join(clash)}): turn "
                             "context.tools off for it")
        self.tools = [*env.tools, *(memory.tools if memory else [])]

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        if self.memory is not None and name in self.memory.names:
            return self.memory.call(name, arguments)
        return await self.env.call(name, arguments)

    async def state(self) -> dict[str, Any]:
        return await self.env.state()

    async def verify(self, final_answer: str | None) -> Any:
        return await self.env.verify(final_answer)

    async def close(self) -> None:
        await self.env.close()


async def generate(args: argparse.Namespace, sample: Sample, sampling_params: dict[str, Any],
                   evaluation: bool = False) -> Sample | list[Sample]:
    """slime custom generate function: one context-managed episode; its last sample, then the earlier ones."""
    if getattr(args, "partial_rollout", False):
        raise NotImplementedError("--partial-rollout cannot continue AWM episodes (the environment's state ends "
                                  "with the step); drop the flag")
    ContextConfig.from_args(args)  # a configuration error surfaces before any episode opens
    segments: list[Sample] = []
    out = await play(args, sample, sampling_params, engine_policy(args, sample), evaluation=evaluation,
                     segments=None if evaluation else segments, body=play_managed)
    return [out, *segments] if segments else out


async def play_managed(args: argparse.Namespace, cfg: RolloutConfig, sample: Sample, sampling_params: dict[str, Any],
                       policy: Policy, env: EnvSession, episode: Episode, segments: list[Sample] | None = None,
                       evaluation: bool = False) -> None:
    """The turn loop (module docstring); `sample` ends as the episode's last sample, `segments` gets the others."""
    ctx = ContextConfig.from_args(args)
    meta = sample.metadata or {}
    if meta.get("start_db") or meta.get("start_messages"):
        raise ValueError("the context-managed rollout does not load start states (start_db / start_messages)")
    tokenizer = GenerateState(args).tokenizer
    task = episode.task or (sample.prompt[-1]["content"] if isinstance(sample.prompt, list) else str(sample.prompt))
    episode.task = task
    history = History(task)
    started_at = len(history.messages)
    memory = MemoryTools(lambda: budget(ctx, len(sample.tokens), turns_so_far(), cfg.max_turns_at(step)),
                         history.deletable) if ctx.tools else None
    managed = ManagedEnv(env, memory)
    preamble = "\n\n".join(p for p in (getattr(env, "system_prompt", None), memory and MEMORY_PREAMBLE) if p)
    encoder = _shared_encoder(args, tokenizer, cfg, managed.tools, preamble or None)
    notes = memory.notes if memory else None
    step = _training_step(sample)
    runner = ToolRunner(cfg, managed, episode)

    def turns_so_far() -> int:
        return sum(m.role == "assistant" for m in history.messages[started_at:])

    def restart(prompt: list[int]) -> None:
        sample.tokens, sample.response_length, sample.response = list(prompt), 0, ""
        sample.loss_mask, sample.rollout_log_probs = [], []

    def render() -> list[int]:
        return encoder.encode(encoder.render(history.render(notes), add_generation_prompt=True))

    closed_samples: list[Sample] = []
    restart(render())
    episode.messages = [{"role": "user", "content": history.render(notes)[0]["content"]}]
    stats = {"deletions": 0, "peak_tokens": len(sample.tokens)}
    while True:
        if len(sample.tokens) + ctx.reserve > ctx.limit:
            sample.status, episode.stop_reason = Sample.Status.TRUNCATED, "context_budget"
            break
        params = dict(sampling_params, max_new_tokens=min(ctx.reserve, cfg.max_tokens_per_turn or ctx.reserve))
        turn = turns_so_far()
        if params.get("sampling_seed") is None and (seed := turn_seed(args, sample, turn, evaluation)) is not None:
            params["sampling_seed"] = seed
        started = time.perf_counter()
        output = await policy(list(sample.tokens), params)
        episode.timings["generate_s"] += time.perf_counter() - started
        info = output["meta_info"]
        pairs = info.pop("output_token_logprobs", None) or []
        ids, logps = [int(p[1]) for p in pairs], [float(p[0]) for p in pairs]
        text = encoder.decode(ids)
        sample.append_response_tokens(args, ids, logps, meta_info=info, text=text)
        stats["peak_tokens"] = max(stats["peak_tokens"], len(sample.tokens))
        closed = bool(ids) and ids[-1] == encoder.end_of_turn_id
        content = text[: -len(encoder.end_of_turn)] if closed and text.endswith(encoder.end_of_turn) else text
        invoker = history.add_assistant(content)
        stop, texts = await model_turn(cfg, runner, content, (info.get("finish_reason") or {}).get("type"), len(ids), step)
        if stop == "engine_abort":
            return  # ABORTED: slime regenerates the group
        if stop is not None:
            break
        calls = episode.turns[-1].get("calls", [])
        texts = cap_observations(encoder, texts, calls, cfg.max_observation_tokens)
        contents = [history.add_tool(t, c.get("name"), invoker) for t, c in zip(texts, calls, strict=True)]
        episode.messages += [{"role": "tool", "content": c} for c in contents]
        deleted = memory.take_deletions() if memory else []
        obs_ids: list[int] = []
        if deleted:
            history.delete(deleted)
            stats["deletions"] += len(deleted)
            episode.turns[-1]["deleted"] = deleted
            prompt = render()  # the whole conversation again: stubs, the notes block, this turn's results
        else:
            obs_ids, obs_text = encoder.observation(contents, model_closed_turn=closed)
            prompt = None if ctx.samples == "snapshot" else [*sample.tokens, *obs_ids]
        if (len(prompt) if prompt is not None else len(sample.tokens) + len(obs_ids)) + ctx.reserve > ctx.limit:
            sample.status, episode.stop_reason = Sample.Status.TRUNCATED, "context_budget"
            break  # the running sample ends at this turn's tokens, as the engine saw them
        if prompt is not None:  # the running sample closes; the next starts from `prompt`, response empty
            closed_samples.append(_snapshot(sample))
            restart(prompt)
        else:
            sample.append_response_tokens(args, obs_ids, trainable=False, text=obs_text)
        stats["peak_tokens"] = max(stats["peak_tokens"], len(sample.tokens))
    if sample.status == Sample.Status.PENDING:
        sample.status = Sample.Status.COMPLETED
    kept = keep_samples(closed_samples, ctx.max_samples - 1, (getattr(args, "rollout_seed", 0), sample.index))
    if segments is not None:
        segments.extend(kept)
    episode.context = {"deletions": stats["deletions"], "notes": len(notes or {}), "samples": len(kept) + 1,
                       "samples_made": len(closed_samples) + 1, "final_tokens": len(sample.tokens),
                       "peak_tokens": stats["peak_tokens"], "limit": ctx.limit, "mode": ctx.samples,
                       "tools": ctx.tools}
    episode.final_answer = getattr(env, "answer", None) or episode.final_answer
    await verify(cfg, managed, episode)


def budget(ctx: ContextConfig, used: int, turns: int, max_turns: int) -> dict[str, int | None]:
    """checkBudget's answer: tokens left before the limit (less the reserve), turns done and left."""
    return {"conv_rounds": turns, "available_tokens": max(ctx.limit - ctx.reserve - used, 0) if ctx.limit else None,
            "available_rounds": max(max_turns - turns, 0)}


def keep_samples(closed: list[Sample], k: int, seed: tuple[Any, ...]) -> list[Sample]:
    """At most `k` of the earlier samples, drawn at random with a fixed seed, in episode order."""
    if len(closed) <= k:
        return list(closed)
    rng = random.Random(repr(seed))
    chosen = sorted(rng.sample(range(len(closed)), k))
    return [closed[i] for i in chosen]


def _snapshot(sample: Sample) -> Sample:
    """A copy of the running sample's trajectory: its prompt, the model tokens (mask 1) and tool tokens (0)."""
    return Sample(index=sample.index, group_index=sample.group_index, prompt=sample.prompt,
                  tokens=list(sample.tokens), response_length=sample.response_length, response=sample.response,
                  loss_mask=list(sample.loss_mask or []), rollout_log_probs=list(sample.rollout_log_probs or []),
                  weight_versions=list(sample.weight_versions or []), status=sample.status)


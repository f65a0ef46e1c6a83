"""B2+ (docs/recovery-method.md, Baselines): an LLM judge scores each tool call's helpfulness in [0, 1].

After an episode, every model turn that ran a tool is scored by a chat model behind any
OpenAI-compatible endpoint (`awm.llm.ChatClient`: retries, backoff, a concurrency bound), all turns
of the episode at once. The judge sees the task, the calls and observations before the turn
(truncated), and the turn's call and observation, and must answer `SCORE: <number in [0, 1]>`.

A judge that gives no usable score (unreachable, timed out, or a reply without one number in [0, 1])
is an infrastructure failure: `JudgeError`, which the rollout records as the episode's `infra_error`
(the sample leaves every group statistic), never a silent 0.

Runtime-YAML keys (launcher knobs `AWM_JUDGE_*`): awm_judge_url (null: no judge), awm_judge_model,
awm_judge_api_key_env (the variable holding the key; unset or empty: no Authorization header),
awm_judge_concurrency (requests in flight per rollout process), awm_judge_timeout (seconds per
request), awm_judge_retries.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any

from awm.llm import ChatClient, LLMError

SYSTEM = (
    "You grade one step of a tool-using agent that works on a database-backed app. Judge only how much the "
    "given tool call, with its observation, helps complete the task from where the agent was: 1 = clearly "
    "needed and correct, 0.5 = plausible but of little use, 0 = useless, wrong or harmful (e.g. changes "
    "data the task did not ask to change). Answer with one line `SCORE: <number between 0 and 1>`."
)
SCORE = re.compile(r"score\s*[:=]?\s*([-+]?\d+(?:\.\d+)?)", re.IGNORECASE)
HISTORY_CHARS = 4000  # the history before the judged turn, newest kept
OBSERVATION_CHARS = 1500  # one observation


class JudgeError(RuntimeError):
    """The judge gave no usable score: an infrastructure failure of the episode, not a reward."""


@dataclass(frozen=True)
class JudgeConfig:
    """The judge endpoint and its limits; the defaults are the launcher's (awm_grpo.launch.knobs)."""

    url: str
    model: str
    api_key_env: str = "AWM_JUDGE_API_KEY"
    concurrency: int = 8
    timeout_s: float = 60.0
    retries: int = 2

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> JudgeConfig | None:
        """The judge of the runtime YAML, or None when awm_judge_url is not set."""
        url = getattr(args, "awm_judge_url", None)
        if not url:
            return None
        model = getattr(args, "awm_judge_model", None)
        if not model:
            raise ValueError("awm_judge_url is set but awm_judge_model is not: name the judge model (AWM_JUDGE_MODEL)")

        def get(name: str, default: Any) -> Any:
            value = getattr(args, f"awm_judge_{name}", None)
            return default if value is None else value

        cfg = cls(str(url), str(model), str(get("api_key_env", cls.api_key_env)),
                  int(get("concurrency", cls.concurrency)), float(get("timeout", cls.timeout_s)),
                  int(get("retries", cls.retries)))
        if cfg.concurrency < 1 or cfg.timeout_s <= 0 or cfg.retries < 0:
            raise ValueError(f"judge settings {cfg}: concurrency >= 1, timeout > 0 and retries >= 0 please")
        return cfg

    def client(self) -> ChatClient:
        return ChatClient(self.url, os.environ.get(self.api_key_env, ""), self.model, timeout_s=self.timeout_s,
                          retries=self.retries, max_concurrency=self.concurrency)


def shared_client(args: argparse.Namespace, cfg: JudgeConfig) -> ChatClient:
    """One client per rollout process, so `concurrency` bounds every episode's requests together."""
    cache = args.__dict__.setdefault("_awm_judge_clients", {})
    if cfg not in cache:
        cache[cfg] = cfg.client()
    return cache[cfg]


def parse_score(text: str) -> float:
    """The score of a judge reply: `SCORE: x` (last one wins) or a bare number; must lie in [0, 1]."""
    body = re.sub(r"<think>.*?</think>", "", text or "", flags=re.DOTALL).strip()
    found = SCORE.findall(body)
    if not found and re.fullmatch(r"[-+]?\d+(?:\.\d+)?", body):
        found = [body]
    if not found:
        raise JudgeError(f"judge reply has no 'SCORE: <number>': {body[:200]!r}")
    value = float(found[-1])
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise JudgeError(f"judge score {value} is outside [0, 1]: {body[:200]!r}")
    return value


def _call_text(turn: dict[str, Any]) -> str:
    parts = []
    for call, obs in zip(turn.get("calls") or [], turn.get("observations") or [], strict=False):
        head = f"{call['name']}({json.dumps(call.get('arguments'), ensure_ascii=False)})" if "name" in call \
            else f"invalid call ({call.get('invalid')})"
        parts.append(f"call: {head}\nobservation: {obs[:OBSERVATION_CHARS]}")
    return "\n".join(parts)


def judge_messages(task: str, turns: list[dict[str, Any]], t: int) -> list[dict[str, str]]:
    """The judge's prompt for turn index t (0-based) of an episode's turn records (awm_grpo.rollout.Episode)."""
    history = "\n\n".join(f"[turn {u + 1}]\n{_call_text(turns[u]) or turns[u].get('assistant', '')[:500]}"
                          for u in range(t))
    if len(history) > HISTORY_CHARS:
        history = "[... earlier turns cut]\n" + history[-HISTORY_CHARS:]
    user = (f"Task:\n{task}\n\nHistory so far:\n{history or '(none: this is the first step)'}\n\n"
            f"Step to grade (turn {t + 1}):\n{_call_text(turns[t])}\n\nHow helpful is this step? SCORE: ?")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def judged(turn: dict[str, Any]) -> bool:
    """Turns the judge scores: those that ran a tool (a final answer or an invalid call gets none)."""
    return any("name" in c for c in turn.get("calls") or [])


async def score_turns(client: ChatClient, task: str, turns: list[dict[str, Any]]) -> list[float | None]:
    """One score per turn (None where nothing ran); any failure raises JudgeError."""

    async def one(t: int) -> float | None:
        if not judged(turns[t]):
            return None
        try:
            reply = await client.chat(judge_messages(task, turns, t), temperature=0.0, max_tokens=64)
        except (LLMError, ValueError) as exc:
            raise JudgeError(f"judge request for turn {t + 1} failed: {exc}") from exc
        try:
            return parse_score(reply.text)
        except JudgeError as exc:
            raise JudgeError(f"turn {t + 1}: {exc}") from None

    results = await asyncio.gather(*(one(t) for t in range(len(turns))), return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r if isinstance(r, JudgeError) else JudgeError(f"judge failed: {r!r}")
    return list(results)  # type: ignore[arg-type]

"""Sql-mode verification: a scenario's `verify_task` gathers database evidence in the sandbox, then
an LLM judge weighs that evidence against the agent's trajectory (awm-format.md section 8).

The evidence program is generated and can be wrong, so the judge is told to check it rather than
copy it. Every way the judge can fail (endpoint down, HTTP errors after retries, a reply that is
not JSON even after repair, an unknown label) is a `judge_error` verdict: an infrastructure
failure the trainer drops, never a 0.
"""

import dataclasses
import json
import os
import re
import time
from typing import Any

import json_repair

from awm.llm import DEFAULT_BASE_URL, ChatClient, LLMError
from awm.verifier import SandboxRun, Verdict, VerifierSandbox, strip_thinking

# Upstream's priority order: the first label that applies wins.
CLASSIFICATIONS = ("complete", "server_error", "agent_error", "incomplete")
_FENCE = re.compile(r"^\s*```[a-zA-Z]*\s*|\s*```\s*$")

JUDGE_SYSTEM_PROMPT = """\
You grade one episode of an AI agent that worked through the tools of a simulated application \
backed by an SQLite database.

You receive:
- TASK: what the user asked for.
- TRAJECTORY: the conversation, with the agent's tool calls and the tool results (long texts are shortened).
- EVIDENCE: JSON written by a verification program that queried the database before and after the episode.

The verification program was generated automatically. It can check the wrong thing, miss a valid \
solution or fail with an error. Treat it as one source of facts next to the trajectory: do not adopt \
its conclusion without checking that it agrees with what the agent actually did.

Give the episode exactly one label, the first of these that applies:
1. complete: everything the task asked for was done, and the evidence confirms it or at least does \
not contradict it.
2. server_error: the application failed (HTTP 5xx, internal errors, tools that reject valid calls or \
return broken data) and that kept the agent from finishing.
3. agent_error: the agent caused the failure (wrong tool or arguments, invented values, misread \
results, stopped early, did something other than what was asked).
4. incomplete: anything else that leaves the task undone.

Answer with one JSON object and nothing else (no markdown fences):
{"reasoning": "<short explanation citing the trajectory and the evidence>",
 "confidence_score": [<complete>, <incomplete>, <server_error>, <agent_error>],
 "classification": "complete" | "incomplete" | "server_error" | "agent_error",
 "evidence": {"status": "<how the episode ended>", "iterations": <agent turns>,
              "error_signals": ["<error messages seen>"], "last_actions": ["<the agent's last actions>"],
              "database_verification": "<what the database evidence shows>"}}
confidence_score holds four integers from 0 to 100, one per label in the order shown."""


class JudgeReplyError(ValueError):
    """The judge's reply has no JSON object with a known classification, even after repair."""


@dataclasses.dataclass(frozen=True)
class JudgeConfig:
    """Where the judge model lives and how it is sampled (upstream: temperature 1.0, 4,096 tokens)."""

    base_url: str = DEFAULT_BASE_URL
    api_key: str = ""
    model: str = ""
    temperature: float = 1.0
    max_tokens: int = 4096
    timeout_s: float = 120.0
    retries: int = 3

    @classmethod
    def from_env(cls, **overrides: Any) -> "JudgeConfig":
        """Read OPENAI_BASE_URL, OPENAI_API_KEY and AWM_JUDGE_MODEL; keyword arguments win."""
        values = {
            "base_url": os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL,
            "api_key": os.environ.get("OPENAI_API_KEY", ""),
            "model": os.environ.get("AWM_JUDGE_MODEL", ""),
            **overrides,
        }
        config = cls(**values)
        if not config.model:
            raise ValueError("no judge model configured: set AWM_JUDGE_MODEL or pass model=")
        return config

    def client(self, max_concurrency: int | None = None) -> ChatClient:
        return ChatClient(
            self.base_url,
            self.api_key,
            self.model,
            timeout_s=self.timeout_s,
            retries=self.retries,
            max_concurrency=max_concurrency,
        )


def _shorten(value: Any, max_chars: int) -> Any:
    """Cut long strings anywhere in a message to head + tail, keeping the structure."""
    if isinstance(value, str) and len(value) > max_chars:
        half = max_chars // 2
        return f"{value[:half]} ...[{len(value) - 2 * half} characters cut]... {value[-half:]}"
    if isinstance(value, dict):
        return {key: _shorten(item, max_chars) for key, item in value.items()}
    if isinstance(value, list):
        return [_shorten(item, max_chars) for item in value]
    return value


def summarise_trajectory(
    messages: list[dict[str, Any]], max_messages: int = 60, max_chars: int = 2000
) -> list[dict[str, Any]]:
    """The trajectory as the judge sees it: the opening two and the latest messages, long texts shortened."""
    kept = list(messages)
    if len(kept) > max_messages:
        tail = max(1, max_messages - 2)
        omitted = len(kept) - 2 - tail
        kept = [*kept[:2], {"role": "note", "content": f"{omitted} messages omitted"}, *kept[-tail:]]
    return [_shorten(message, max_chars) for message in kept]


def judge_messages(
    task: str, trajectory: list[dict[str, Any]], evidence: dict[str, Any], max_evidence_chars: int = 20000
) -> list[dict[str, str]]:
    """The chat messages for one judgement."""
    steps = summarise_trajectory(trajectory)
    evidence_text = json.dumps(evidence, ensure_ascii=False, indent=2, default=str)
    if len(evidence_text) > max_evidence_chars:
        evidence_text = evidence_text[:max_evidence_chars] + "\n...[evidence cut]"
    user = (
        f"TASK:\n{task}\n\n"
        f"TRAJECTORY ({len(trajectory)} messages):\n{json.dumps(steps, ensure_ascii=False, indent=1, default=str)}\n\n"
        f"EVIDENCE:\n{evidence_text}"
    )
    return [{"role": "system", "content": JUDGE_SYSTEM_PROMPT}, {"role": "user", "content": user}]


def parse_judgement(text: str) -> dict[str, Any]:
    """The judge's JSON object, read strictly first and then with json_repair; the label normalised."""
    cleaned = _FENCE.sub("", strip_thinking(text))
    try:
        data = json.loads(cleaned)
    except ValueError:
        data = json_repair.loads(cleaned)
    if not isinstance(data, dict):
        raise JudgeReplyError(f"judge reply holds no JSON object: {text[:300]!r}")
    label = str(data.get("classification", "")).strip().lower().replace(" ", "_").replace("-", "_")
    if label not in CLASSIFICATIONS:
        raise JudgeReplyError(
            f"judge classification {data.get('classification')!r} is not one of {CLASSIFICATIONS}"
        )
    return {**data, "classification": label}


class SqlJudge:
    """Sql-mode verification: evidence from the sandbox, verdict from an OpenAI-compatible judge."""

    def __init__(
        self, sandbox: VerifierSandbox, config: JudgeConfig, client: ChatClient | None = None
    ) -> None:
        self.sandbox = sandbox
        self.config = config
        self.client = client or config.client()

    async def averify(
        self,
        code: str | None,
        task: str,
        trajectory: list[dict[str, Any]],
        initial_db: str,
        final_db: str,
        timeout_s: float = 10.0,
    ) -> Verdict:
        """Run the scenario's `verify_task` for evidence, then judge it with the trajectory."""
        run = await self.sandbox.arun(code, initial_db, final_db, mode="sql", timeout_s=timeout_s)
        failure = _evidence_failure(run)
        if failure is not None:
            return failure
        verdict = await self.judge(task, trajectory, run.value)
        return dataclasses.replace(verdict, elapsed_s=verdict.elapsed_s + run.elapsed_s)

    async def judge(self, task: str, trajectory: list[dict[str, Any]], evidence: dict[str, Any]) -> Verdict:
        """Ask the judge model about evidence already gathered."""
        started = time.monotonic()
        messages = judge_messages(task, trajectory, evidence)
        try:
            reply = await self.client.chat(
                messages,
                model=self.config.model,
                temperature=self.config.temperature,
                max_tokens=self.config.max_tokens,
            )
        except LLMError as exc:
            return Verdict(
                "judge_error",
                "sql",
                f"judge endpoint failed: {exc}",
                {"evidence": evidence},
                time.monotonic() - started,
            )
        try:
            judgement = parse_judgement(reply.text)
        except JudgeReplyError as exc:
            result = {"evidence": evidence, "reply": reply.text[:4000]}
            return Verdict("judge_error", "sql", str(exc), result, time.monotonic() - started)
        result = {"evidence": evidence, "judgement": judgement, "usage": reply.usage}
        return Verdict(
            judgement["classification"],
            "sql",
            str(judgement.get("reasoning", "")),
            result,
            time.monotonic() - started,
        )

    async def aclose(self) -> None:
        await self.client.aclose()


async def judge_task(
    code: str | None,
    initial_db: str,
    final_db: str,
    *,
    task: str,
    trajectory: list[dict[str, Any]],
    config: JudgeConfig,
    final_answer: str | None = None,
    timeout_s: float = 10.0,
) -> Verdict:
    """One sql-mode verification with a short-lived sandbox and client (for the CLI; a trainer keeps a SqlJudge).

    A final answer given apart from the trajectory is shown to the judge as the last assistant message.
    """
    steps = list(trajectory)
    if final_answer:
        steps.append({"role": "assistant", "content": strip_thinking(final_answer)})
    async with VerifierSandbox() as sandbox:
        judge = SqlJudge(sandbox, config)
        try:
            return await judge.averify(code, task, steps, initial_db, final_db, timeout_s=timeout_s)
        finally:
            await judge.aclose()


def _evidence_failure(run: SandboxRun) -> Verdict | None:
    """The verdict when the evidence program itself failed (no judge call is worth making then)."""
    if run.status == "timeout":
        return Verdict("timeout", "sql", run.detail, None, run.elapsed_s)
    if run.status != "ok":
        return Verdict("judge_error", "sql", run.detail, None, run.elapsed_s)
    if not isinstance(run.value, dict):
        detail = (
            f"verify_task returned {run.value_type or type(run.value).__name__}, expected a dict of evidence"
        )
        return Verdict("judge_error", "sql", detail, None, run.elapsed_s)
    return None

"""Serve AWM episodes over AgentGym's environment protocol: one env id is one isolated AWM episode.

AgentGym (and AgentGym-RL) talk to every environment through a small HTTP protocol: create an env
id, reset it onto a dataset item, send text actions, read the observation, close it. This server
speaks the dialect of its BabyAI/SciWorld/TextCraft servers (`{"id": N}` names the env id):

    POST /create                                       -> {"id": N}
    POST /reset  {"id", "data_idx"} | {"id", "scenario", "task_idx"}  -> a step payload
    POST /step   {"id", "action": str}                 -> a step payload
    GET  /observation?id=N                             -> the last step payload
    GET  /available_actions?id=N                       -> ["<tool>", ..., "finish"]
    POST /close  {"id"}                                -> {"id", "closed": true, "was_open": bool}
    GET  /tasks                                        -> [{"data_idx", "scenario", "task_idx", "task"}]
    GET  /health, GET /limits, GET /                   -> status, limits, a one-line greeting

The same episodes in the dialect of AgentGym's tool-usage servers (academia, movie, todo, sheet,
weather), whose clients send `env_idx`, under `/tool` (point such a client at `http://HOST:PORT/tool`):

    POST /tool/create {"id": data_idx}                 -> env id (a bare integer), already on that task
    POST /tool/reset  {"env_idx", "id": data_idx|null} -> the observation (a bare string); null: same task
    POST /tool/step   {"env_idx", "action"}            -> a step payload
    GET  /tool/observation?env_idx=N                   -> the observation (a bare string)
    GET  /tool/list_envs                               -> the open env ids
    POST /tool/close  {"env_idx"}                      -> as /close (upstream's tool servers have none)

A step payload is `{"observation", "reward", "score", "done"}` plus fields of ours: `id`, `data_idx`,
`scenario`, `task_idx`, `steps`, `kind` (what the last action was: reset, ok, http_error,
invalid_arguments, unknown_tool, bad_action, result_too_large, finish, step_limit), `truncated`, and
after the finish action `verdict` (the verifier's verdict as a dict) and `final_answer`.

Actions use the grammar of AgentGym's tool-using environments (academia, movie, todo, sheet, weather):
`Action: <tool name> with Action Input: <JSON object of arguments>`, optionally after free text such
as a `Thought:`; the last `Action:` line counts. `Action: finish with Action Input: {"answer": ...}`
ends the episode: the task's code verifier runs in its sandbox on the episode's DB and the final
answer, and the reward is 1.0 (complete) or 0.0. Agent mistakes (no action found, an action over
`max_action_bytes`, arguments that are not a JSON object, an unknown tool, arguments the tool refuses)
come back as observations with reward 0 and done false, and count as steps; after `max_steps` steps
the episode ends unverified (done, reward 0, `truncated: true`).

data_idx: the served scenarios' tasks that have a code verifier, ordered by scenario name, then
task_idx (`GET /tasks` lists them); the order depends only on the data and the served scenarios.

Failures: an unknown or closed env id is 404, an action before /reset or after done is 409, a bad
request body 400/413; the machinery failing (a worker crash, a tool call past its deadline, the
verifier crashing or timing out) is 502 and never a reward; the env-id cap and an episode lost to
such a failure are 503 (the id stays: /reset it). Every error is `{"error": sentence, "infra_error":
bool}`. Limits are awm.serve.limits' (`--max-sessions` caps open env ids, `--session-idle-timeout`
closes idle ones, `--unused-session-timeout` closes ids never reset, `--max-result-bytes` caps a tool
result) plus `--max-steps` and `--max-action-bytes`; the bearer token works as for the MCP server.

Command line: `awm env agentgym --port 36002 [--data-dir D] [--scenario S ...]`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import logging
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from awm.data import normalize_scenario_name
from awm.episode import EnvRuntime, Episode
from awm.runtime.pool import InfraError
from awm.serve.http_common import (
    LOOPBACK_HOST_HEADERS,
    LOOPBACK_HOSTS,
    HttpError,
    RequireToken,
    check_token,
    json_body,
    preview,
    resolve_scenarios,
    run_until_signalled,
    serve_app,
)
from awm.serve.limits import ServerLimits

log = logging.getLogger(__name__)

FINISH = "finish"  # the action that ends an episode and runs its verifier (AgentGym's tool envs use this name)
MAX_STEPS = 50  # actions per episode (malformed ones included) before it ends unverified
MAX_ACTION_BYTES = 64 * 1024  # an action's text (UTF-8); a model turn is far smaller
CLOSED_IDS_REMEMBERED = 4096  # why recent ids were closed, to say so on a late request
_TOOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,127}")
# Two linear scans (a lazy group spanning both would be quadratic on a reply full of "Action:"s)
_ACTION_HEAD = re.compile(r"Action\s*:", re.IGNORECASE)
_INPUT_HEAD = re.compile(r"\swith\s+Action\s+Input\s*:", re.IGNORECASE)
_FENCE = re.compile(r"^```[A-Za-z]*\s*(.*?)\s*```$", re.DOTALL)


def grammar_text(finish: str = FINISH) -> str:
    """How to phrase an action: shown at reset and after every malformed action."""
    return ("Reply with one action in this form (a short Thought before it is fine):\n"
            "Action: <tool name> with Action Input: <JSON object of the tool's arguments>\n"
            f"When the task is done, end the episode with\nAction: {finish} with Action Input: "
            '{"answer": "<your final answer, or an empty string if the task asked for changes only>"}')


class BadAction(ValueError):
    """An action that cannot be run as written; its message is the observation the agent gets."""

    def __init__(self, message: str, kind: str = "bad_action") -> None:
        super().__init__(message)
        self.kind = kind  # the step payload's `kind`


def _last(matches: Iterator[re.Match[str]]) -> re.Match[str] | None:
    found = None
    for found in matches:  # noqa: B007 - the loop only walks to the last one
        pass
    return found


def parse_action(text: str, max_bytes: int = MAX_ACTION_BYTES) -> tuple[str, dict[str, Any]]:
    """(tool name, arguments) of `Action: <tool> with Action Input: <json>`; BadAction says what is wrong.

    The last `Action:` in the text counts (a model may quote the grammar in its thought first). The
    arguments must be one JSON object, optionally in a ``` fence; nothing else may follow it.
    """
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise BadAction(f"Error: the action is {size} bytes, over this server's cap of {max_bytes}: send one "
                        "short action.")
    inputs = _last(_INPUT_HEAD.finditer(text))
    heads = _last(_ACTION_HEAD.finditer(text, 0, inputs.start())) if inputs else None
    if inputs is None or heads is None:
        raise BadAction("Error: no action found: the reply must contain `Action: <tool name> with Action Input: "
                        "<JSON object>`.")
    name = text[heads.end():inputs.start()].strip().strip("`'\"[]* ").strip()
    if not _TOOL_NAME.fullmatch(name):
        raise BadAction(f"Error: {name[:80]!r} is not a tool name: write the bare name after `Action:`.")
    raw = text[inputs.end():].strip()
    fenced = _FENCE.match(raw)
    if fenced:
        raw = fenced.group(1)
    if not raw:
        raise BadAction(f"Error: the Action Input of {name!r} is empty: give a JSON object, {{}} for no arguments.")
    try:
        arguments, end = json.JSONDecoder().raw_decode(raw)
    except (ValueError, RecursionError) as exc:
        detail = str(exc) if isinstance(exc, ValueError) else "nested too deeply"
        raise BadAction(f"Error: the Action Input of {name!r} is not valid JSON ({detail[:200]}): give one JSON "
                        "object with double-quoted keys.") from None
    if raw[end:].strip():
        raise BadAction(f"Error: text follows the JSON Action Input of {name!r}: end the reply with the JSON "
                        "object.")
    if not isinstance(arguments, dict):
        raise BadAction(f"Error: the Action Input of {name!r} is a JSON {type(arguments).__name__}, not an object: "
                        "give the arguments as {\"name\": value, ...}.")
    return name, arguments


def catalogue_text(tools: list[dict[str, Any]]) -> str:
    """The tools as the agent reads them: one line each, the input schema as compact JSON."""
    lines = []
    for tool in tools:
        description = " ".join(str(tool.get("description") or "").split())
        schema = json.dumps(tool.get("inputSchema") or {}, separators=(",", ":"), ensure_ascii=False)
        lines.append(f"- {tool['name']}: {description} Input schema: {schema}")
    return "\n".join(lines)


def _final_answer(arguments: dict[str, Any]) -> str | None:
    """The finish action's answer as the verifier reads it (text; other JSON values as JSON)."""
    extra = sorted(set(arguments) - {"answer"})
    if extra:
        raise BadAction(f"Error: {FINISH} takes only \"answer\", not {extra}: "
                        f"Action: {FINISH} with Action Input: {{\"answer\": \"...\"}}")
    answer = arguments.get("answer")
    if answer is None or isinstance(answer, str):
        return answer
    return json.dumps(answer, ensure_ascii=False)


@dataclass
class _Env:
    """One env id: the episode it is on (after /reset) and what the last request returned."""

    env_id: int
    created: float
    last_used: float
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    busy: int = 0  # requests in flight (the reaper leaves a busy env alone)
    episode: Episode | None = None
    failure: str | None = None  # the episode was closed after an infrastructure error
    data_idx: int | None = None
    scenario: str | None = None
    task_idx: int | None = None
    steps: int = 0
    done: bool = False
    payload: dict[str, Any] = field(default_factory=dict)

    def reply(self, observation: str, reward: float, kind: str, **extra: Any) -> dict[str, Any]:
        """Record and return a step payload: AgentGym's four fields, then ours."""
        self.payload = {"observation": observation, "reward": reward, "score": reward, "done": self.done,
                        "id": self.env_id, "data_idx": self.data_idx, "scenario": self.scenario,
                        "task_idx": self.task_idx, "steps": self.steps, "kind": kind,
                        "truncated": False, **extra}
        return self.payload


class _AgentGymService:
    """The env ids and their episodes, the protocol's handlers and the idle reaper."""

    def __init__(self, runtime: EnvRuntime, scenarios: list[str] | None, limits: ServerLimits,
                 max_steps: int, max_action_bytes: int) -> None:
        if max_steps < 1 or max_action_bytes < 1:
            raise ValueError(f"max_steps={max_steps}, max_action_bytes={max_action_bytes}: use whole numbers, "
                             "1 or more")
        self.runtime, self.limits = runtime, limits
        self.max_steps, self.max_action_bytes = max_steps, max_action_bytes
        self.scenarios, _ = resolve_scenarios(runtime, scenarios, None)
        served = set(self.scenarios)
        self.tasks = [key for key in runtime.dataset.task_keys() if key[0] in served]
        if not self.tasks:
            raise ValueError(f"scenarios {self.scenarios} have no task with a code verifier: nothing to serve")
        self._envs: dict[int, _Env] = {}
        self._ids = itertools.count()
        self._issued = 0
        self._closed: OrderedDict[int, str] = OrderedDict()  # env id -> why it was closed (the newest ones)
        self.reaped = 0
        self.results_capped = 0
        self._catalogues: dict[str, str] = {}

    # ---- env ids -----------------------------------------------------------------------------
    def _env(self, raw: Any) -> _Env:
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise HttpError(400, f"the env id (\"id\"; \"env_idx\" under /tool) must be the integer /create "
                                 f"returned, got {raw!r}")
        env = self._envs.get(raw)
        if env is not None:
            return env
        if 0 <= raw < self._issued:
            why = self._closed.get(raw, "it was closed")
            raise HttpError(404, f"env id {raw} is closed ({why}): /create a new one")
        raise HttpError(404, f"env id {raw} was never created here: POST /create first and use the id it returns")

    async def _close_env(self, env: _Env, why: str) -> None:
        if self._envs.pop(env.env_id, None) is None:
            return
        self._closed[env.env_id] = why
        while len(self._closed) > CLOSED_IDS_REMEMBERED:
            self._closed.popitem(last=False)
        episode, env.episode = env.episode, None
        if episode is not None:
            await episode.close()

    async def _fail(self, env: _Env, reason: str) -> None:
        """An infrastructure error took the episode: close it; the id stays, to be reset."""
        log.warning("env id %d: infrastructure error, episode closed: %s", env.env_id, reason)
        env.failure = reason
        episode, env.episode = env.episode, None
        if episode is not None:
            await episode.close()

    async def reap(self) -> None:
        """Close env ids idle past the idle timeout, and ids never reset within the unused timeout."""
        now = time.monotonic()
        for env in list(self._envs.values()):
            if env.busy:
                continue
            if env.episode is None and env.failure is None and env.data_idx is None:
                limit, why = self.limits.unused_session_timeout_s, "never reset within --unused-session-timeout"
            else:
                limit, why = self.limits.session_idle_timeout_s, "idle past --session-idle-timeout"
            if now - env.last_used > limit:
                self.reaped += 1
                log.info("env id %d: %s (%g s): closing it", env.env_id, why, limit)
                await self._close_env(env, f"{why}, {limit:g} s")

    async def _reaper(self) -> None:
        period = max(0.05, min(self.limits.session_idle_timeout_s, self.limits.unused_session_timeout_s, 60.0) / 4)
        while True:
            await asyncio.sleep(period)
            try:
                await self.reap()
            except Exception:  # noqa: BLE001 - the reaper must outlive one bad close
                log.exception("reaping idle env ids failed")

    # ---- handlers ----------------------------------------------------------------------------
    async def _handle(self, request: Request, action: Callable[[dict[str, Any]], Awaitable[Any]]) -> JSONResponse:
        """Run one request; every failure becomes `{"error", "infra_error"}` with a status that says whose."""
        try:
            body = await json_body(request)
            return JSONResponse(await action(body))
        except HttpError as exc:
            infra = exc.status in (502, 503)
            return JSONResponse({"error": str(exc), "infra_error": infra}, status_code=exc.status,
                                headers={"Retry-After": "1"} if exc.status == 503 else None)
        except Exception as exc:  # noqa: BLE001 - a bug here is still the machinery's, and says so in JSON
            log.exception("%s %s failed", request.method, request.url.path)
            return JSONResponse({"error": f"Infrastructure error: the server failed on this request "
                                          f"({type(exc).__name__}: {str(exc)[:300]})", "infra_error": True},
                                status_code=500)

    @contextlib.asynccontextmanager
    async def _using(self, raw_id: Any) -> AsyncIterator[_Env]:
        env = self._env(raw_id)
        env.busy += 1
        env.last_used = time.monotonic()
        try:
            async with env.lock:
                if self._envs.get(env.env_id) is not env:  # closed while this request waited
                    raise HttpError(404, f"env id {env.env_id} was closed while this request waited: "
                                          "/create a new one")
                yield env
        finally:
            env.busy -= 1
            env.last_used = time.monotonic()

    # ---- the operations both dialects share ---------------------------------------------------
    def _new_env(self) -> _Env:
        cap = self.limits.max_sessions
        if len(self._envs) >= cap:
            raise HttpError(503, f"this server holds its cap of {cap} open env ids (--max-sessions): /close "
                                  "ids you are done with, or retry after others close or go idle")
        env_id = next(self._ids)
        self._issued = env_id + 1
        now = time.monotonic()
        env = self._envs[env_id] = _Env(env_id, now, now)
        return env

    def _target(self, body: dict[str, Any]) -> tuple[int, str, int]:
        """(data_idx, scenario, task_idx) a reset asks for: by data_idx, or by scenario and task_idx."""
        data_idx, scenario, task_idx = body.get("data_idx"), body.get("scenario"), body.get("task_idx")
        n = len(self.tasks)
        if scenario is None and task_idx is None:
            if isinstance(data_idx, bool) or not isinstance(data_idx, int):
                raise HttpError(400, f"send \"data_idx\" (an integer in 0..{n - 1}; GET /tasks lists them), or "
                                     f"\"scenario\" and \"task_idx\"; got data_idx={data_idx!r}")
            if not 0 <= data_idx < n:
                raise HttpError(400, f"data_idx {data_idx} is out of range: this server has {n} tasks, "
                                     f"0..{n - 1} (GET /tasks lists them)")
            return data_idx, *self.tasks[data_idx]
        if not isinstance(scenario, str) or isinstance(task_idx, bool) or not isinstance(task_idx, int):
            raise HttpError(400, "send both \"scenario\" (a name) and \"task_idx\" (an integer), or \"data_idx\" "
                                 "alone")
        key = (normalize_scenario_name(scenario), task_idx)
        if key[0] not in self.scenarios:
            raise HttpError(404, f"scenario {scenario!r} is not served here: use one of {preview(self.scenarios)}")
        try:
            index = self.tasks.index(key)
        except ValueError:
            raise HttpError(400, f"scenario {key[0]!r} has no task {task_idx} with a code verifier: GET /tasks "
                                  "lists the served ones") from None
        if data_idx is not None and data_idx != index:
            raise HttpError(400, f"data_idx {data_idx!r} is not {key}'s index ({index}): send one or the other")
        return index, *key

    async def _catalogue(self, episode: Episode) -> str:
        text = self._catalogues.get(episode.scenario)
        if text is None:  # the same for every episode of a scenario
            text = catalogue_text(episode.tools)
            size, cap = len(text.encode("utf-8", "surrogatepass")), self.limits.max_result_bytes
            if size > cap:  # generated code writes the descriptions and schemas
                raise HttpError(502, f"the tool list of scenario {episode.scenario!r} is {size} bytes, over this "
                                     f"server's cap of {cap} bytes per observation (--max-result-bytes): the "
                                      "scenario cannot be served")
            self._catalogues[episode.scenario] = text
        return text

    async def _reset(self, raw_id: Any, target: dict[str, Any]) -> dict[str, Any]:
        """Put the env id on a fresh episode of the task `target` names (closing the one it was on)."""
        async with self._using(raw_id) as env:
            data_idx, scenario, task_idx = self._target(target)
            old, env.episode = env.episode, None
            if old is not None:
                await old.close()
            env.failure, env.done, env.steps = None, False, 0
            env.data_idx, env.scenario, env.task_idx = data_idx, scenario, task_idx
            try:
                env.episode = await self.runtime.open(scenario, task_idx)
            except InfraError as exc:
                env.failure = str(exc)
                raise HttpError(502, f"Infrastructure error: the episode could not be opened: {exc}") from None
            observation = (f"Task: {env.episode.task}\n\nTools:\n{await self._catalogue(env.episode)}\n\n"
                           f"{grammar_text()}")
            return env.reply(observation, 0.0, "reset")

    def _episode(self, env: _Env) -> Episode:
        if env.episode is not None:
            if env.done:
                raise HttpError(409, f"env id {env.env_id}'s episode is over (done): /reset it to start another")
            return env.episode
        if env.failure is not None:
            raise HttpError(503, f"Infrastructure error: env id {env.env_id}'s episode was closed after an "
                                 f"infrastructure failure ({env.failure}): /reset it to start again")
        raise HttpError(409, f"env id {env.env_id} has no episode yet: POST /reset {{\"id\": {env.env_id}, "
                              "\"data_idx\": N} first")

    async def _step(self, raw_id: Any, text: Any) -> dict[str, Any]:
        async with self._using(raw_id) as env:
            episode = self._episode(env)
            if not isinstance(text, str):
                raise HttpError(400, f"\"action\" must be a string, got {type(text).__name__}")
            env.steps += 1
            try:
                payload = await self._act(env, episode, text)
            except InfraError as exc:
                env.steps -= 1  # the machinery's failure is no step of the agent's
                await self._fail(env, str(exc))
                raise HttpError(502, f"Infrastructure error: {exc}") from None
            if not env.done and env.steps >= self.max_steps:
                env.done = True
                payload = env.reply(f"{payload['observation']}\n\nThe step limit ({self.max_steps}) is reached: "
                                    "the episode is over, unverified.", 0.0, "step_limit", truncated=True,
                                    last_kind=payload["kind"])
            return payload

    async def _act(self, env: _Env, episode: Episode, text: str) -> dict[str, Any]:
        """One action: a tool call, the finish action, or a mistake the agent reads about."""
        try:
            name, arguments = parse_action(text, self.max_action_bytes)
            if name == FINISH:
                final_answer = _final_answer(arguments)
            elif name not in {t["name"] for t in episode.tools}:
                raise BadAction(f"Error: there is no tool {name!r}: use one of "
                                f"{preview([t['name'] for t in episode.tools], 50)}, or {FINISH}.", "unknown_tool")
        except BadAction as exc:
            return env.reply(f"{exc}\n\n{grammar_text()}", 0.0, exc.kind)
        if name == FINISH:
            return await self._finish(env, episode, final_answer)
        obs = await episode.call(name, arguments)
        text, cap = obs.text, self.limits.max_result_bytes
        if len(text) * 4 > cap and len(text.encode("utf-8", "surrogatepass")) > cap:
            self.results_capped += 1
            return env.reply(f"Error: the result of {name!r} is over this server's cap of {cap} bytes per tool "
                             "result (the call did run): ask for less, e.g. filter or page.", 0.0,
                             "result_too_large", status=obs.status)
        return env.reply(text, 0.0, obs.kind, status=obs.status)

    async def _finish(self, env: _Env, episode: Episode, final_answer: str | None) -> dict[str, Any]:
        try:
            verdict = await episode.verify(final_answer)
        except InfraError:
            raise  # the episode's worker failed: `step` closes the episode
        except (OSError, RuntimeError) as exc:  # the verifier sandbox could not run it (SandboxError, say)
            raise HttpError(502, f"Infrastructure error: the verifier could not run: {exc}") from None
        if verdict.infra_failure:
            raise HttpError(502, f"Infrastructure error: the verifier gave no verdict ({verdict.verdict}: "
                                 f"{verdict.detail[:500]}); the episode is still open: retry the {FINISH} action")
        env.done = True
        reward = 1.0 if verdict.complete else 0.0
        return env.reply(f"The episode is over: the task is {'complete' if verdict.complete else 'not complete'}.",
                         reward, FINISH, verdict=verdict.to_dict(), final_answer=final_answer)

    def _current(self, raw_id: Any) -> dict[str, Any]:
        env = self._env(raw_id)
        env.last_used = time.monotonic()
        if not env.payload:
            raise HttpError(409, f"env id {env.env_id} has no episode yet: reset it first")
        return env.payload

    async def _close(self, raw_id: Any) -> dict[str, Any]:
        try:
            env = self._env(raw_id)
        except HttpError as exc:
            if exc.status == 404 and isinstance(raw_id, int) and 0 <= raw_id < self._issued:
                return {"id": raw_id, "closed": True, "was_open": False}  # closing twice is fine
            raise
        async with env.lock:  # after a request in flight on it
            await self._close_env(env, "closed by /close")
        return {"id": env.env_id, "closed": True, "was_open": True}

    # ---- AgentGym's BabyAI/SciWorld/TextCraft dialect: {"id": env id} ---------------------------
    async def create(self, request: Request) -> JSONResponse:
        async def action(body: dict[str, Any]) -> dict[str, Any]:
            return {"id": self._new_env().env_id}
        return await self._handle(request, action)

    async def reset(self, request: Request) -> JSONResponse:
        async def action(body: dict[str, Any]) -> dict[str, Any]:
            return await self._reset(body.get("id"), body)
        return await self._handle(request, action)

    async def step(self, request: Request) -> JSONResponse:
        async def action(body: dict[str, Any]) -> dict[str, Any]:
            return await self._step(body.get("id"), body.get("action"))
        return await self._handle(request, action)

    async def observation(self, request: Request) -> JSONResponse:
        async def action(body: dict[str, Any]) -> dict[str, Any]:
            return self._current(_query_id(request, "id"))
        return await self._handle(request, action)

    async def available_actions(self, request: Request) -> JSONResponse:
        async def action(body: dict[str, Any]) -> list[str]:
            env = self._env(_query_id(request, "id"))
            env.last_used = time.monotonic()
            if env.episode is None:
                self._episode(env)  # raises the reason
            return [t["name"] for t in env.episode.tools] + [FINISH]
        return await self._handle(request, action)

    async def close(self, request: Request) -> JSONResponse:
        async def action(body: dict[str, Any]) -> dict[str, Any]:
            return await self._close(body.get("id"))
        return await self._handle(request, action)

    # ---- AgentGym's tool-usage dialect (academia, movie, ...), under /tool: {"env_idx": env id} ---
    async def tool_create(self, request: Request) -> JSONResponse:
        """/create {"id": data_idx} -> the bare env id, already on that task (as upstream's tool envs)."""
        async def action(body: dict[str, Any]) -> int:
            env = self._new_env()
            try:
                await self._reset(env.env_id, {"data_idx": body.get("id", 0)})
            except BaseException:
                await self._close_env(env, "its task could not be opened at /create")
                raise
            return env.env_id
        return await self._handle(request, action)

    async def tool_reset(self, request: Request) -> JSONResponse:
        """/reset {"env_idx", "id": data_idx or null (the same task again)} -> the observation text."""
        async def action(body: dict[str, Any]) -> str:
            raw, data_idx = body.get("env_idx"), body.get("id")
            if data_idx is None:
                data_idx = self._env(raw).data_idx
            return (await self._reset(raw, {"data_idx": data_idx}))["observation"]
        return await self._handle(request, action)

    async def tool_step(self, request: Request) -> JSONResponse:
        async def action(body: dict[str, Any]) -> dict[str, Any]:
            return await self._step(body.get("env_idx"), body.get("action"))
        return await self._handle(request, action)

    async def tool_observation(self, request: Request) -> JSONResponse:
        async def action(body: dict[str, Any]) -> str:
            return self._current(_query_id(request, "env_idx"))["observation"]
        return await self._handle(request, action)

    async def tool_list_envs(self, request: Request) -> JSONResponse:
        return JSONResponse(sorted(self._envs))

    async def tool_close(self, request: Request) -> JSONResponse:
        async def action(body: dict[str, Any]) -> dict[str, Any]:
            return await self._close(body.get("env_idx"))
        return await self._handle(request, action)

    async def task_list(self, request: Request) -> JSONResponse:
        dataset = self.runtime.dataset
        return JSONResponse([{"data_idx": i, "scenario": s, "task_idx": t, "task": dataset.tasks(s)[t]}
                             for i, (s, t) in enumerate(self.tasks)])

    async def health(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "scenarios": self.scenarios, "tasks": len(self.tasks),
                             "open_envs": len(self._envs),
                             "open_episodes": sum(e.episode is not None for e in self._envs.values())})

    async def limit_counts(self, request: Request) -> JSONResponse:
        guard = getattr(request.app.state, "read_guard", None)
        return JSONResponse({"limits": {**dataclasses.asdict(self.limits), "max_steps": self.max_steps,
                                        "max_action_bytes": self.max_action_bytes},
                             "env_ids_reaped": self.reaped, "results_capped": self.results_capped,
                             "connections_closed": dict(guard.dropped) if guard else {}})

    async def hello(self, request: Request) -> JSONResponse:
        return JSONResponse(f"AWM environments over AgentGym's protocol: {len(self.tasks)} tasks of "
                            f"{len(self.scenarios)} scenarios.")

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        reaper = asyncio.ensure_future(self._reaper())
        try:
            yield
        finally:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
            for env in list(self._envs.values()):
                await self._close_env(env, "the server shut down")


def _query_id(request: Request, key: str) -> int | None:
    raw = request.query_params.get(key)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        raise HttpError(400, f"?{key}= must be the integer /create returned, got {raw!r}") from None


def build_app(runtime: EnvRuntime, scenarios: list[str] | None = None, *, limits: ServerLimits = ServerLimits(),
              max_steps: int = MAX_STEPS, max_action_bytes: int = MAX_ACTION_BYTES,
              allowed_hosts: list[str] | None = None, token: str | None = None) -> Starlette:
    """The ASGI app (routes in the module docstring). `scenarios=None` serves every runnable scenario.

    Run it in the event loop that uses `runtime`; `allowed_hosts` and `token` as for the MCP server.
    """
    service = _AgentGymService(runtime, scenarios, limits, max_steps, max_action_bytes)
    routes = [
        Route("/", service.hello, methods=["GET"]),
        Route("/create", service.create, methods=["POST"]),
        Route("/reset", service.reset, methods=["POST"]),
        Route("/step", service.step, methods=["POST"]),
        Route("/observation", service.observation, methods=["GET"]),
        Route("/available_actions", service.available_actions, methods=["GET"]),
        Route("/close", service.close, methods=["POST"]),
        Route("/tool/create", service.tool_create, methods=["POST"]),
        Route("/tool/reset", service.tool_reset, methods=["POST"]),
        Route("/tool/step", service.tool_step, methods=["POST"]),
        Route("/tool/observation", service.tool_observation, methods=["GET"]),
        Route("/tool/list_envs", service.tool_list_envs, methods=["GET"]),
        Route("/tool/close", service.tool_close, methods=["POST"]),
        Route("/tasks", service.task_list, methods=["GET"]),
        Route("/health", service.health, methods=["GET"]),
        Route("/limits", service.limit_counts, methods=["GET"]),
    ]
    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts)] if allowed_hosts else []
    if token:
        middleware.append(Middleware(RequireToken, token=token))
    app = Starlette(routes=routes, middleware=middleware, lifespan=service.lifespan)
    app.state.service = service
    return app


def _announce(url: str, tasks: int, scenarios: int) -> None:
    print(f"AWM AgentGym-protocol server at {url} ({tasks} tasks of {scenarios} scenarios; GET {url}/tasks "
          "lists them)", flush=True)


async def serve(runtime: EnvRuntime, *, host: str = "127.0.0.1", port: int = 0, scenarios: list[str] | None = None,
                stop: asyncio.Event | None = None, ready: Callable[[str, int, int], None] = _announce,
                token: str | None = None, limits: ServerLimits = ServerLimits(), max_steps: int = MAX_STEPS,
                max_action_bytes: int = MAX_ACTION_BYTES) -> None:
    """Serve `runtime` until `stop` is set; every episode is closed on the way out, the runtime is not.

    `ready(url, tasks, scenarios)` gets the actual URL once listening (port 0 picks a free port). A
    non-loopback `host` needs a `token`.
    """
    loopback = host in LOOPBACK_HOSTS
    check_token(host, token)
    stop = stop or asyncio.Event()
    app = build_app(runtime, scenarios, limits=limits, max_steps=max_steps, max_action_bytes=max_action_bytes,
                    allowed_hosts=LOOPBACK_HOST_HEADERS if loopback else None, token=token)
    service: _AgentGymService = app.state.service
    await serve_app(app, host, port, limits, stop, lambda base: ready(base, len(service.tasks), len(service.scenarios)))


def run_server(data_dir: str | None, host: str, port: int, num_workers: int | None,
               scenarios: list[str] | None = None, limits: ServerLimits = ServerLimits(),
               max_steps: int = MAX_STEPS, max_action_bytes: int = MAX_ACTION_BYTES) -> None:
    """Blocking entry point of `awm env agentgym`: serve until SIGINT/SIGTERM, then close everything."""
    run_until_signalled("AWM AgentGym server", host, data_dir, num_workers,
                        lambda runtime, stop, token: serve(runtime, host=host, port=port, scenarios=scenarios,
                                                           stop=stop, token=token, limits=limits, max_steps=max_steps,
                                                           max_action_bytes=max_action_bytes))

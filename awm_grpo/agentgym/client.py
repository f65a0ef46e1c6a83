"""The rollout's client for environments that speak AgentGym's HTTP protocol (BabyAI, TextCraft, ...).

AgentGym serves each environment kind from its own HTTP server; an episode is one environment id on it:

    POST /create                      -> {"id": N}
    POST /reset  {"id", "data_idx"}   -> {"observation", "reward", "score", "done", ...}
    POST /step   {"id", "action"}     -> the same fields, after the action
    GET  /observation?id=N            -> the same fields, now
    GET  /available_actions?id=N      (some environments)
    POST /close  {"id"}

Here an episode is an `AgentGymEnv`, which the rollout drives like any other `EnvSession`:

    env = await open_agentgym("http://127.0.0.1:36001", "babyai", 7, timeout_s=30.0)
    env.initial_observation                      # /reset's observation
    result = await env.call("act", {"action": "turn left"})   # ToolResult(observation, done=...)
    verdict = await env.verify(final_answer)     # "complete" iff the last reward > 0
    await env.close()

The model acts through one tool, `act(action: str)`; the string goes to /step verbatim (the
environment decides what it accepts). A prompt row is played here when its metadata holds
`{"agentgym": {"env": "babyai", "data_idx": 7}}`; the environment kinds and their servers come from
the recipe's `environment.agentgym_envs` knob (`parse_agentgym_envs`).

Failures of the server (refused connection, deadline, HTTP 5xx, an `{"error": ...}` reply, a body that
is not the protocol's JSON or is larger than `MAX_REPLY_BYTES`) raise `EnvInfraError`: the sample is
dropped, never scored 0. A 4xx reply to /step is about the action: the model reads it as an error
observation. Replies are parsed as untrusted data: size-capped, every field type-checked.

    python -m awm_grpo.agentgym.client prompts --env babyai --data-idx 0:40 --out DIR/train.jsonl
    python -m awm_grpo.agentgym.client prompts --env babyai --data-idx 40:48 --out DIR/val.jsonl
    python -m awm_grpo.agentgym.client prompts --env babyai --data-idx 0:40 --out AWM_SPLITS/train.jsonl --append
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import itertools
import json
import math
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from awm.verifier import Verdict

from awm_grpo.env_client import EnvInfraError, ToolResult, shared_http
from awm_grpo.http_pool import HttpError, HttpPool, Origin

ACT_TOOL = "act"
SCENARIO_PREFIX = "agentgym:"  # an episode's scenario name: "agentgym:<env>"
MAX_REPLY_BYTES = 1 << 20  # a step's observation is text of a few KB; anything past 1 MiB is not a reply
MAX_ACTION_CHARS = 4096
CLOSE_TIMEOUT_S = 5.0

ACT_TOOL_SPEC: dict[str, Any] = {
    "name": ACT_TOOL,
    "description": "Take one action in the environment. `action` is one action string, written exactly as "
                   "the environment lists its available actions; the result is the next observation.",
    "inputSchema": {"type": "object",
                    "properties": {"action": {"type": "string", "description": "one action, verbatim"}},
                    "required": ["action"]},
}

DEFAULT_INSTRUCTION = (
    "You are acting in the text environment '{env}'. Each turn, take exactly one action with the `act` tool: "
    "its `action` argument is one action string, copied exactly from the available actions the latest "
    "observation lists. The environment says when the goal is reached, which ends the episode.")


# ---- configuration --------------------------------------------------------------------------------

@dataclass(frozen=True)
class AgentGymSpec:
    """One environment kind of `environment.agentgym_envs`: its servers and how its episodes read."""

    name: str
    urls: tuple[str, ...]
    finish_action: str | None = None  # a %-format for verify(): 'Action: finish with Action Input: {"answer": %s}'
    instruction: str | None = None  # the text before the initial observation (None: DEFAULT_INSTRUCTION)

    def task_text(self, initial_observation: str) -> str:
        """What the model reads as its task: the instruction, then the environment's first observation."""
        head = self.instruction if self.instruction is not None else DEFAULT_INSTRUCTION.format(env=self.name)
        return f"{head}\n\n{initial_observation}" if head else initial_observation


def parse_agentgym_envs(value: Any) -> tuple[AgentGymSpec, ...]:
    """`environment.agentgym_envs` (a dict, its JSON text, or None) -> the specs, checked.

    {"babyai": {"urls": ["http://127.0.0.1:36001"], "finish_action": null, "instruction": null}}"""
    if value is None or value == "" or value == {}:
        return ()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"awm_agentgym_envs is not JSON ({exc}): give e.g. "
                             '{"babyai": {"urls": ["http://127.0.0.1:36001"]}}') from None
    if not isinstance(value, Mapping):
        raise ValueError(f"awm_agentgym_envs must be a JSON object of environment name -> settings, got "
                         f"{type(value).__name__}")
    specs = []
    for name, entry in value.items():
        if not isinstance(name, str) or not name or name != name.strip() or ":" in name:
            raise ValueError(f"awm_agentgym_envs: environment name {name!r} must be a non-empty word without ':'")
        if not isinstance(entry, Mapping):
            raise ValueError(f"awm_agentgym_envs[{name!r}] must be an object with 'urls'")
        unknown = set(entry) - {"urls", "finish_action", "instruction"}
        if unknown:
            raise ValueError(f"awm_agentgym_envs[{name!r}] has unknown keys {sorted(unknown)}: use urls, "
                             "finish_action, instruction")
        urls = entry.get("urls")
        if isinstance(urls, str):
            urls = [urls]
        if not isinstance(urls, list) or not urls or not all(isinstance(u, str) for u in urls):
            raise ValueError(f"awm_agentgym_envs[{name!r}]['urls'] must list the base URLs of its AgentGym servers, "
                             "e.g. ['http://127.0.0.1:36001']")
        for url in urls:
            Origin.parse(url)  # ValueError with what to write
        finish = entry.get("finish_action")
        if finish is not None:
            if not isinstance(finish, str) or finish.count("%s") != 1 or "%" in finish.replace("%s", ""):
                raise ValueError(f"awm_agentgym_envs[{name!r}]['finish_action'] must be a string with one %s (the "
                                 'answer, JSON-quoted), e.g. \'Action: finish with Action Input: {"answer": %s}\'')
        instruction = entry.get("instruction")
        if instruction is not None and not isinstance(instruction, str):
            raise ValueError(f"awm_agentgym_envs[{name!r}]['instruction'] must be text or null")
        specs.append(AgentGymSpec(name, tuple(u.rstrip("/") for u in urls), finish, instruction))
    return tuple(specs)


def episode_target(meta: Mapping[str, Any]) -> tuple[str, int] | None:
    """(env name, data_idx) of a prompt row played on an AgentGym server, or None for an AWM row."""
    target = meta.get("agentgym")
    if target is None:
        return None
    if not isinstance(target, Mapping) or not isinstance(target.get("env"), str) or not target["env"] \
            or not isinstance(target.get("data_idx"), int) or isinstance(target.get("data_idx"), bool) \
            or target["data_idx"] < 0:
        raise ValueError(f"metadata 'agentgym' must be {{'env': name, 'data_idx': int >= 0}}, got {target!r}: "
                         "write the rows with `python -m awm_grpo.agentgym.client prompts`")
    return target["env"], target["data_idx"]


def spec_for(specs: tuple[AgentGymSpec, ...], scenario: str) -> AgentGymSpec:
    """The spec of an episode's scenario `agentgym:<env>`, or a ValueError that says which knob to set."""
    name = scenario.removeprefix(SCENARIO_PREFIX)
    for spec in specs:
        if spec.name == name:
            return spec
    known = ", ".join(s.name for s in specs) or "none"
    raise ValueError(f"prompt rows ask for AgentGym environment {name!r}, but environment.agentgym_envs "
                     f"(AWM_AGENTGYM_ENVS) configures {known}: add "
                     f'{{"{name}": {{"urls": ["http://HOST:PORT"]}}}} with the URL of its server')


# ---- bounded replies ------------------------------------------------------------------------------

def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise EnvInfraError(f"{what} is not a finite number: {str(value)[:80]!r}")
    return float(value)


@dataclass(frozen=True)
class StepReply:
    """The protocol's fields of a /reset, /step or /observation reply, type-checked."""

    observation: str
    reward: float
    score: float
    done: bool

    @classmethod
    def parse(cls, data: Any, what: str) -> StepReply:
        if not isinstance(data, dict):
            raise EnvInfraError(f"{what}: the reply is {type(data).__name__}, not a JSON object")
        missing = [k for k in ("observation", "reward", "done") if k not in data]
        if missing:
            raise EnvInfraError(f"{what}: the reply lacks {missing} (has {sorted(map(str, data))[:10]})")
        if not isinstance(data["observation"], str):
            raise EnvInfraError(f"{what}: 'observation' is {type(data['observation']).__name__}, not text")
        if not isinstance(data["done"], bool):
            raise EnvInfraError(f"{what}: 'done' is {type(data['done']).__name__}, not true/false")
        reward = _number(data["reward"], f"{what}: 'reward'")
        score = _number(data["score"], f"{what}: 'score'") if data.get("score") is not None else reward
        return cls(data["observation"], reward, score, data["done"])


# ---- the episode ----------------------------------------------------------------------------------

class AgentGymEnv:
    """One environment id on an AgentGym-protocol server: one episode (see the module doc)."""

    def __init__(self, base_url: str, env_name: str, data_idx: int, *, timeout_s: float,
                 finish_action: str | None = None, http: HttpPool | None = None) -> None:
        self.base = base_url.rstrip("/")
        self.origin = Origin.parse(self.base)
        self.env_name, self.data_idx = env_name, data_idx
        self.timeout_s = timeout_s
        self.finish_action = finish_action
        self.http = http or shared_http()
        self.tools: list[dict[str, Any]] = [ACT_TOOL_SPEC]
        self.env_id: int | None = None
        self.initial_observation = ""
        self.observation = ""
        self.reward = 0.0
        self.score = 0.0
        self.done = False
        self.steps = 0
        self.closed = False

    # -- transport

    async def _request(self, method: str, path: str, body: dict[str, Any] | None,
                       timeout_s: float | None = None) -> tuple[int, Any]:
        """(status, parsed JSON) of one request; the body is read up to MAX_REPLY_BYTES, never more."""
        headers = {"content-type": "application/json"} if body is not None else {}
        payload = orjson.dumps(body) if body is not None else b""
        where = f"{method} {self.base}{path}"
        try:
            async with asyncio.timeout(timeout_s or self.timeout_s), \
                    self.http.stream(self.origin, method, path, headers, payload) as reply:
                declared = reply.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > MAX_REPLY_BYTES:
                    raise EnvInfraError(f"{where}: a reply of {int(declared)} bytes, over the "
                                        f"{MAX_REPLY_BYTES}-byte cap on AgentGym replies")
                parts, size = [], 0
                async for chunk in reply.chunks():
                    size += len(chunk)
                    if size > MAX_REPLY_BYTES:
                        raise EnvInfraError(f"{where}: the reply passed the {MAX_REPLY_BYTES}-byte cap on "
                                            "AgentGym replies")
                    parts.append(chunk)
                status = reply.status
        except TimeoutError:
            raise EnvInfraError(f"{where}: no reply within {timeout_s or self.timeout_s:g} s") from None
        except HttpError as exc:
            raise EnvInfraError(f"{where}: {exc}") from exc
        raw = b"".join(parts)
        try:
            data = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError as exc:
            raise EnvInfraError(f"{where}: HTTP {status} with a body that is not JSON ({exc}): "
                                f"{raw[:120]!r}") from None
        return status, data

    @staticmethod
    def _error_text(data: Any) -> str | None:
        """The server's error message, if the reply is one (AgentGym servers answer {"error": ...})."""
        if isinstance(data, dict):
            for key in ("error", "detail"):
                if data.get(key) not in (None, ""):
                    return str(data[key])[:2000]
        return None

    async def _checked(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        """A request whose failure of any kind is the machinery's: anything but a clean 2xx -> EnvInfraError."""
        status, data = await self._request(method, path, body)
        error = self._error_text(data)
        if status >= 300 or error is not None:
            raise EnvInfraError(f"{method} {self.base}{path}: HTTP {status}: {error or str(data)[:200]}")
        return data

    def _take(self, reply: StepReply) -> None:
        self.observation, self.reward, self.score, self.done = reply.observation, reply.reward, reply.score, \
            reply.done

    # -- the episode

    async def start(self) -> AgentGymEnv:
        """/create, then /reset to `data_idx`; closes the id again if the reset fails."""
        data = await self._checked("POST", "/create", None)
        env_id = data.get("id") if isinstance(data, dict) else data
        if isinstance(env_id, bool) or not isinstance(env_id, int):
            raise EnvInfraError(f"POST {self.base}/create: expected {{'id': int}}, got {str(data)[:200]!r}")
        self.env_id = env_id
        try:
            data = await self._checked("POST", "/reset", {"id": env_id, "data_idx": self.data_idx})
            self._take(StepReply.parse(data, f"POST {self.base}/reset"))
        except BaseException:
            await self.close()
            raise
        self.initial_observation = self.observation
        return self

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """The `act` tool: one /step with `arguments["action"]` verbatim; the result is its observation."""
        if name != ACT_TOOL:
            return ToolResult(f"Unknown tool {name!r}: the only tool is {ACT_TOOL!r} (argument 'action').", True,
                              "unknown_tool")
        action = arguments.get("action")
        extra = set(arguments) - {"action"}
        if not isinstance(action, str) or extra:
            return ToolResult(f"Input validation error: {ACT_TOOL} takes exactly one argument, 'action', a string "
                              f"(got {sorted(arguments)})", True, "invalid_arguments")
        if len(action) > MAX_ACTION_CHARS:
            return ToolResult(f"Input validation error: the action is {len(action)} characters, over the "
                              f"{MAX_ACTION_CHARS} an action may have", True, "invalid_arguments")
        if self.done:
            return ToolResult("The episode has ended: no action can be taken.", True, "http_error", done=True)
        started = time.perf_counter()
        status, data = await self._request("POST", "/step", {"id": self.env_id, "action": action})
        latency = time.perf_counter() - started
        error = self._error_text(data)
        if 400 <= status < 500:  # the server refused this action
            return ToolResult(error or f"the environment refused the action (HTTP {status})", True, "http_error",
                              latency)
        if status >= 300 or error is not None:
            raise EnvInfraError(f"POST {self.base}/step: HTTP {status}: {error or str(data)[:200]}")
        self._take(StepReply.parse(data, f"POST {self.base}/step"))
        self.steps += 1
        return ToolResult(self.observation, False, "ok", latency, done=self.done)

    async def observe(self) -> StepReply:
        """GET /observation: the environment's current fields (read-only)."""
        data = await self._checked("GET", f"/observation?id={self.env_id}", None)
        return StepReply.parse(data, f"GET {self.base}/observation")

    async def available_actions(self) -> list[str] | None:
        """GET /available_actions, where the environment has it (None: it does not)."""
        status, data = await self._request("GET", f"/available_actions?id={self.env_id}", None)
        if status in (404, 405):
            return None
        if status >= 300 or self._error_text(data) is not None:
            raise EnvInfraError(f"GET {self.base}/available_actions: HTTP {status}: {str(data)[:200]}")
        actions = data.get("available_actions", data.get("actions")) if isinstance(data, dict) else data
        if not isinstance(actions, list) or not all(isinstance(a, str) for a in actions):
            raise EnvInfraError(f"GET {self.base}/available_actions: expected a list of strings, got "
                                f"{str(data)[:200]!r}")
        return actions

    async def state(self) -> dict[str, Any]:
        """The turn's state for traces: a hash of the observation (no database here) and the env's figures."""
        digest = hashlib.sha256(self.observation.encode("utf-8", "surrogatepass")).hexdigest()
        return {"state_hash": digest, "changes": {},
                "agentgym": {"reward": self.reward, "score": self.score, "done": self.done, "steps": self.steps}}

    async def verify(self, final_answer: str | None) -> Verdict:
        """Send the finish action (if configured and the episode is still open), then judge by the reward."""
        started = time.perf_counter()
        finished_by = None
        if not self.done and self.finish_action is not None:
            finished_by = self.finish_action % json.dumps(final_answer or "", ensure_ascii=False)
            result = await self.call(ACT_TOOL, {"action": finished_by})
            if result.is_error:
                finished_by = f"{finished_by} (refused: {result.text[:200]})"
        verdict = "complete" if self.reward > 0 else "others"
        detail = (f"AgentGym {self.env_name} #{self.data_idx}: reward {self.reward:g}, score {self.score:g}, "
                  f"done {self.done}, {self.steps} steps")
        return Verdict(verdict, "code", detail,
                       {"env": self.env_name, "data_idx": self.data_idx, "reward": self.reward, "score": self.score,
                        "done": self.done, "steps": self.steps, "finish_action": finished_by},
                       time.perf_counter() - started)

    async def close(self) -> None:
        """POST /close once, best effort: a server that is gone has nothing left to free."""
        if self.closed or self.env_id is None:
            self.closed = True
            return
        self.closed = True
        with contextlib.suppress(EnvInfraError, OSError):
            await self._request("POST", "/close", {"id": self.env_id}, CLOSE_TIMEOUT_S)


_NEXT_URL = itertools.count()


async def open_agentgym(url: str, env_name: str, data_idx: int, *, timeout_s: float,
                        finish_action: str | None = None, http: HttpPool | None = None) -> AgentGymEnv:
    """A started episode (created and reset to `data_idx`) on the AgentGym server at `url`."""
    return await AgentGymEnv(url, env_name, data_idx, timeout_s=timeout_s, finish_action=finish_action,
                             http=http).start()


async def open_configured(specs: tuple[AgentGymSpec, ...], scenario: str, data_idx: int,
                          timeout_s: float) -> AgentGymEnv:
    """An episode of `agentgym:<env>` on one of that kind's configured servers (round robin)."""
    spec = spec_for(specs, scenario)
    url = spec.urls[next(_NEXT_URL) % len(spec.urls)]
    return await open_agentgym(url, spec.name, data_idx, timeout_s=timeout_s, finish_action=spec.finish_action)


# ---- prompt rows ----------------------------------------------------------------------------------

def prompt_row(env_name: str, data_idx: int, split: str) -> dict[str, Any]:
    """One prompt line in data_prep's format; the rollout replaces the text with the env's own task."""
    scenario = f"{SCENARIO_PREFIX}{env_name}"
    text = f"AgentGym {env_name} task {data_idx} (the rollout shows the environment's first observation)"
    return {"text": [{"role": "user", "content": text}],
            "metadata": {"scenario": scenario, "task_idx": data_idx, "task": "", "task_type": env_name,
                         "split": split, "agentgym": {"env": env_name, "data_idx": data_idx}}}


def parse_range(text: str) -> list[int]:
    """'0:40' (end excluded), '3', or '1,5,9' -> data indices."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        start, sep, stop = part.partition(":")
        try:
            out += list(range(int(start), int(stop))) if sep else [int(part)]
        except ValueError:
            raise ValueError(f"--data-idx {text!r}: use START:STOP (STOP excluded), N, or N,M,...") from None
    if not out or min(out) < 0:
        raise ValueError(f"--data-idx {text!r}: needs at least one index, all >= 0")
    return out


def write_prompts(out: str | Path, env_name: str, indices: list[int], split: str | None = None,
                  append: bool = False) -> int:
    """Write the rows (atomically; `append`: after the file's rows, for a mixed AWM + AgentGym set) and
    record them in the folder's split_info.json under "agentgym", which the launcher reads; a folder
    without data_prep's split_info is marked `agentgym_only` (no AWM data folder to check it against)."""
    out = Path(out)
    split = split or out.stem
    out.parent.mkdir(parents=True, exist_ok=True)
    before = out.read_text(encoding="utf-8") if append and out.is_file() else ""
    if before and not before.endswith("\n"):
        before += "\n"
    rows = "".join(json.dumps(prompt_row(env_name, i, split)) + "\n" for i in indices)
    info_path = out.parent / "split_info.json"
    info = json.loads(info_path.read_text(encoding="utf-8")) if info_path.is_file() else {"agentgym_only": True}
    entries = info.setdefault("agentgym", {}).setdefault(split, [])
    if not append:
        entries.clear()
    entries.append({"env": env_name, "data_idx": indices[:1000], "rows": len(indices)})
    for path, text in ((out, before + rows), (info_path, json.dumps(info, indent=1) + "\n")):
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    return len(indices)


def agentgym_envs_of(info: Mapping[str, Any]) -> set[str]:
    """The AgentGym environment names a splits folder's split_info.json says its rows use."""
    return {e["env"] for entries in (info.get("agentgym") or {}).values() for e in entries
            if isinstance(e, Mapping) and isinstance(e.get("env"), str)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m awm_grpo.agentgym.client", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prompts", help="write prompt rows played on an AgentGym environment")
    p.add_argument("--env", required=True, help="environment name, as in environment.agentgym_envs (e.g. babyai)")
    p.add_argument("--data-idx", required=True, help="START:STOP (STOP excluded), N, or N,M,...")
    p.add_argument("--out", required=True, help="the JSONL file to write (e.g. DIR/train.jsonl)")
    p.add_argument("--split", default=None, help="metadata split name (default: the file's stem)")
    p.add_argument("--append", action="store_true", help="add the rows after the file's own (e.g. to AWM splits "
                   "written by awm_grpo.data_prep: a mixed prompt set)")
    opts = parser.parse_args(argv)
    try:
        n = write_prompts(opts.out, opts.env, parse_range(opts.data_idx), opts.split, opts.append)
    except ValueError as exc:
        parser.error(str(exc))
    print(f"wrote {n} {opts.env} prompts to {opts.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

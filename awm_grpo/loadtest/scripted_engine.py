"""A scripted policy behind SGLang's `/generate`: plays reference solutions, for exercising the rollout at scale.

    python -m awm_grpo.loadtest.scripted_engine --tokenizer DIR --scripts scripts.json [--port 0] [--latency-ms 0]
        [--token-latency-ms 0]

prints `scripted engine listening on http://HOST:PORT`. The rollout posts the whole conversation every
turn, so the server keeps no per-episode state: it decodes the request, finds the task in the first
user turn and counts the assistant turns so far; the reply is that position of the task's script.

Scripts (`{task text: {"reference": [replies], "wrong": [replies]}}`, from `scripts_from_solutions`)
replay the data's reference solutions in the rollout's meta call format: a reference episode opens
with list_tools, then the solution's calls with their real arguments, then its final answer; a wrong
episode goes straight to the wrong solution's calls. Which one an episode plays is fixed at its first
turn (every `wrong_every`-th new episode plays wrong; with `wrong_by_seed`, the episodes whose first request's
`sampling_seed` is a multiple of `wrong_every`: a fixed choice per sample, independent of arrival order, so runs
compare) and read back from its first reply later, so
the verifier sees both outcomes. `think_words` prefixes every reply with a thinking block of that
many filler words, to give turns the length a thinking model writes.

Timing: each reply is held `latency_ms` + its token count x `token_latency_ms`, as an engine decoding one
sequence at that rate would (set the per-token figure from a GPU profile's decode rate). sglang's control
endpoints for what is held: `POST /abort_request` (`{"rid": ...}` or `{"abort_all": true}`) ends held
replies at once with finish_reason `{"type": "abort"}` and the tokens decoded so far; `/pause_generation`
keeps replies that are due until `/continue_generation`; `/flush_cache` answers 503 while anything is held;
`GET /v1/loads` (sglang's shape) and `/get_server_info` report `num_running_reqs` (held replies).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from awm_grpo import protocol

USER_OPEN, ASSISTANT_OPEN, TURN_END = "<|im_start|>user\n", "<|im_start|>assistant\n", "<|im_end|>"
LOGPROB = -0.5


def scripts_from_solutions(solutions: dict[Any, Any], tasks: dict[tuple[str, int], str]) -> dict[str, dict]:
    """{task text: {"reference": replies, "wrong": replies}} for every task in `tasks` with a solution."""
    from awm_grpo.warmstart.sft import reference_replies

    scripts: dict[str, dict[str, list[str]]] = {}
    for key, text in tasks.items():
        solution = solutions.get(key)
        if solution is None:
            continue
        wrong = solution.wrong_calls and reference_replies(
            _wrong_as_reference(solution), "meta", list_tools=False)
        scripts[text] = {"reference": reference_replies(solution, "meta"), "wrong": wrong or []}
    return scripts


def _wrong_as_reference(solution: Any) -> Any:
    return replace(solution, calls=solution.wrong_calls, final_answer=solution.wrong_final_answer)


def thinking(words: int, turn: int) -> str:
    """A thinking block of `words` filler words (empty for 0): the length of a thinking model's turn."""
    if words <= 0:
        return ""
    filler = " ".join(f"step{turn}.{i} check the records" for i in range(max(words // 4, 1)))
    return f"<think>\n{filler}\n</think>\n\n"


class ScriptedPolicy:
    """Chooses the reply to a conversation: see the module docstring."""

    def __init__(self, scripts: dict[str, dict[str, list[str]]], wrong_every: int = 4, think_words: int = 0,
                 wrong_by_seed: bool = False):
        if wrong_every < 0:
            raise ValueError(f"wrong_every must be >= 0 (0: never play the wrong solution), got {wrong_every}")
        self.scripts, self.wrong_every, self.think_words = scripts, wrong_every, think_words
        self.wrong_by_seed = wrong_by_seed
        self.new_episodes = itertools.count(1)

    def reply(self, conversation: str, seed: int | None = None) -> str:
        start = conversation.find(USER_OPEN)
        if start < 0:
            raise ValueError("the request has no user turn: expected the chat template's "
                             f"{USER_OPEN!r} before the task")
        start += len(USER_OPEN)
        task = conversation[start:conversation.find(TURN_END, start)]
        script = self.scripts.get(task)
        if script is None:
            return "I cannot help with that task."
        turns = conversation.split(ASSISTANT_OPEN)[1:-1]  # the replies so far; the last part is the open turn
        if not turns:
            if self.wrong_by_seed and seed is None:
                raise ValueError("wrong_by_seed needs sampling_params.sampling_seed on the first request "
                                 "(awm_grpo.rollout sets one per sample and turn)")
            pick = int(seed) if self.wrong_by_seed else next(self.new_episodes)
            wrong = bool(self.wrong_every and script["wrong"] and pick % self.wrong_every == 0)
        else:
            first = protocol.parse_reply(turns[0].split(TURN_END)[0])
            wrong = not any(getattr(c, "name", "") == protocol.LIST_TOOLS for c in first.calls)
        replies = script["wrong" if wrong else "reference"]
        text = replies[min(len(turns), len(replies) - 1)]
        return thinking(self.think_words, len(turns)) + text


@dataclass(eq=False)
class Held:
    """One reply being held: the time its decoding would take, and what can end it early."""

    rid: str
    tokens: int
    started: float
    due: float
    token_s: float
    decode_from: float
    aborted: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def tokens_so_far(self, now: float) -> int:
        """Tokens a decoder at `token_s` a token would have produced by `now` (none without a per-token rate)."""
        if self.token_s <= 0:
            return 0
        return min(self.tokens, int(max(now - self.decode_from, 0.0) / self.token_s))


class HeldReplies:
    """The replies being held, with sglang's abort and pause semantics over them."""

    def __init__(self, latency_s: float = 0.0, token_latency_s: float = 0.0) -> None:
        if latency_s < 0 or token_latency_s < 0:
            raise ValueError(f"latencies must be >= 0, got {latency_s} s and {token_latency_s} s a token")
        self.latency_s, self.token_latency_s = latency_s, token_latency_s
        self.held: set[Held] = set()
        self.paused = False
        self.aborted_total = 0

    async def hold(self, rid: str, tokens: int) -> int | None:
        """Hold a reply of `tokens` tokens for `latency_s + tokens x token_latency_s` (and while paused);
        None when it ran its time, else the tokens decoded when it was aborted."""
        now = time.monotonic()
        entry = Held(rid, tokens, now, now + self.latency_s + tokens * self.token_latency_s, self.token_latency_s,
                     now + self.latency_s)
        self.held.add(entry)
        try:
            while not entry.aborted:
                left = entry.due - time.monotonic()
                if left <= 0 and not self.paused:
                    return None
                entry.wake.clear()
                try:
                    await asyncio.wait_for(entry.wake.wait(), left if left > 0 else None)
                except TimeoutError:
                    continue
            self.aborted_total += 1
            return entry.tokens_so_far(time.monotonic())
        finally:
            self.held.discard(entry)

    def abort(self, rid: str | None = None, abort_all: bool = False) -> int:
        """End the held replies with this rid (or all of them); returns how many."""
        hit = [e for e in self.held if abort_all or (rid and e.rid == rid)]
        for entry in hit:
            entry.aborted = True
            entry.wake.set()
        return len(hit)

    def set_paused(self, paused: bool) -> None:
        self.paused = paused
        if not paused:
            for entry in self.held:
                entry.wake.set()


def build_app(tokenizer: Any, policy: ScriptedPolicy, latency_s: float = 0.0, token_latency_s: float = 0.0) -> FastAPI:
    """The SGLang subset the rollout and the router use: /generate, /health, /model_info, and the control
    endpoints over held replies (module docstring). `app.state.replies` is the `HeldReplies`."""
    end_id = tokenizer.convert_tokens_to_ids(TURN_END)
    replies = HeldReplies(latency_s, token_latency_s)
    app = FastAPI(title="scripted engine")
    app.state.replies = replies
    app.state.generate_total = 0  # /generate requests received (get_server_info)

    @app.post("/generate")
    async def generate(request: Request) -> dict[str, Any]:
        body = await request.json()
        app.state.generate_total += 1
        text = policy.reply(tokenizer.decode(body["input_ids"], skip_special_tokens=False),
                            (body.get("sampling_params") or {}).get("sampling_seed"))
        ids = list(tokenizer.encode(text, add_special_tokens=False)) + [end_id]
        limit = int(body.get("sampling_params", {}).get("max_new_tokens") or len(ids))
        finish: dict[str, Any] = {"type": "stop", "matched": end_id}
        if len(ids) > limit:
            ids, finish = ids[:limit], {"type": "length", "length": limit}
        rid = body.get("rid") if isinstance(body.get("rid"), str) else uuid.uuid4().hex
        if latency_s or token_latency_s or replies.paused:
            decoded = await replies.hold(rid, len(ids))
            if decoded is not None:
                ids, finish = ids[:decoded], {"type": "abort", "message": "Abort request"}
        return {"text": tokenizer.decode(ids), "meta_info": {
            "id": rid, "output_token_logprobs": [[LOGPROB, i, None] for i in ids], "finish_reason": finish,
            "weight_version": "0", "prompt_tokens": len(body["input_ids"]), "completion_tokens": len(ids)}}

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        body = await request.json()
        if not isinstance(body, dict):
            return JSONResponse({"error": {"message": "send sglang's AbortReq: {\"rid\": ...} or "
                                                      "{\"abort_all\": true}"}}, status_code=400)
        replies.abort(rid=body.get("rid") or None, abort_all=bool(body.get("abort_all", False)))
        return Response(status_code=200)

    @app.post("/pause_generation")
    async def pause_generation() -> Response:
        replies.set_paused(True)
        return Response(status_code=200)

    @app.post("/continue_generation")
    async def continue_generation() -> Response:
        replies.set_paused(False)
        return Response(status_code=200)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        if replies.held:
            return PlainTextResponse("Cache not flushed: requests are running; retry.", status_code=503)
        return PlainTextResponse("Cache flushed.")

    def load() -> dict[str, int]:
        return {"num_running_reqs": len(replies.held), "num_waiting_reqs": 0}

    @app.get("/v1/loads")
    async def loads() -> dict[str, Any]:
        return {"loads": [{"dp_rank": 0, **load()}]}

    @app.get("/get_server_info")
    async def get_server_info() -> dict[str, Any]:
        return {"engine": "scripted", "weight_version": "0", "aborted_total": replies.aborted_total,
                "generate_total": app.state.generate_total, **load()}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/model_info")
    async def model_info() -> dict[str, Any]:
        return {"weight_version": "0"}

    return app


def main(argv: list[str] | None = None) -> None:
    from transformers import AutoTokenizer

    from slime.engine.router import BackgroundServer
    from slime.utils.fd_limit import raise_open_file_limit

    p = argparse.ArgumentParser(prog="python -m awm_grpo.loadtest.scripted_engine", description=__doc__.split("\n\n")[0])
    p.add_argument("--tokenizer", required=True, help="model folder whose tokenizer the rollout uses")
    p.add_argument("--scripts", required=True, help="JSON file of scripts_from_solutions(...)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--latency-ms", type=float, default=0.0, help="hold every reply this long (the fixed part)")
    p.add_argument("--token-latency-ms", type=float, default=0.0,
                   help="and this long per generated token (a GPU profile's per-sequence decode time)")
    p.add_argument("--wrong-every", type=int, default=4, help="every N-th new episode plays the wrong solution")
    p.add_argument("--wrong-by-seed", action="store_true",
                   help="choose the wrong episodes by their sampling_seed (fixed per sample) instead of arrival order")
    p.add_argument("--think-words", type=int, default=0, help="filler words of thinking before every reply")
    p.add_argument("--max-connections", type=int, default=4096, help="open connections to allow for (file limit)")
    opts = p.parse_args(argv)
    raise_open_file_limit(opts.max_connections + 64, "scripted engine")
    policy = ScriptedPolicy(json.loads(Path(opts.scripts).read_text()), opts.wrong_every, opts.think_words,
                            opts.wrong_by_seed)
    if opts.latency_ms < 0 or opts.token_latency_ms < 0:
        p.error("--latency-ms and --token-latency-ms must be >= 0")
    server = BackgroundServer(build_app(AutoTokenizer.from_pretrained(opts.tokenizer), policy,
                                        opts.latency_ms / 1000, opts.token_latency_ms / 1000), opts.host, opts.port)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(0))
    server.run(on_started=lambda: print(f"scripted engine listening on {server.url}", flush=True))


if __name__ == "__main__":
    main()

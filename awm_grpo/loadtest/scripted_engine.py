"""A scripted policy behind SGLang's `/generate`: plays reference solutions, for exercising the rollout at scale.

    python -m awm_grpo.loadtest.scripted_engine --tokenizer DIR --scripts scripts.json [--port 0] [--latency-ms 0]

prints `scripted engine listening on http://HOST:PORT`. The rollout posts the whole conversation every
turn, so the server keeps no per-episode state: it decodes the request, finds the task in the first
user turn and counts the assistant turns so far; the reply is that position of the task's script.

Scripts (`{task text: {"reference": [replies], "wrong": [replies]}}`, from `scripts_from_solutions`)
replay the data's reference solutions in the rollout's meta call format: a reference episode opens
with list_tools, then the solution's calls with their real arguments, then its final answer; a wrong
episode goes straight to the wrong solution's calls. Which one an episode plays is fixed at its first
turn (every `wrong_every`-th new episode plays wrong) and read back from its first reply later, so
the verifier sees both outcomes. `think_words` prefixes every reply with a thinking block of that
many filler words, to give turns the length a thinking model writes; `latency_ms` holds each reply
that long, as an engine busy decoding would.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request

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

    def __init__(self, scripts: dict[str, dict[str, list[str]]], wrong_every: int = 4, think_words: int = 0):
        if wrong_every < 0:
            raise ValueError(f"wrong_every must be >= 0 (0: never play the wrong solution), got {wrong_every}")
        self.scripts, self.wrong_every, self.think_words = scripts, wrong_every, think_words
        self.new_episodes = itertools.count(1)

    def reply(self, conversation: str) -> str:
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
            wrong = bool(self.wrong_every and script["wrong"] and next(self.new_episodes) % self.wrong_every == 0)
        else:
            first = protocol.parse_reply(turns[0].split(TURN_END)[0])
            wrong = not any(getattr(c, "name", "") == protocol.LIST_TOOLS for c in first.calls)
        replies = script["wrong" if wrong else "reference"]
        text = replies[min(len(turns), len(replies) - 1)]
        return thinking(self.think_words, len(turns)) + text


def build_app(tokenizer: Any, policy: ScriptedPolicy, latency_s: float = 0.0) -> FastAPI:
    """The SGLang subset the rollout and the router use: /generate, /health, /model_info."""
    end_id = tokenizer.convert_tokens_to_ids(TURN_END)
    app = FastAPI(title="scripted engine")

    @app.post("/generate")
    async def generate(request: Request) -> dict[str, Any]:
        body = await request.json()
        text = policy.reply(tokenizer.decode(body["input_ids"], skip_special_tokens=False))
        ids = list(tokenizer.encode(text, add_special_tokens=False)) + [end_id]
        limit = int(body.get("sampling_params", {}).get("max_new_tokens") or len(ids))
        finish: dict[str, Any] = {"type": "stop", "matched": end_id}
        if len(ids) > limit:
            ids, finish = ids[:limit], {"type": "length", "length": limit}
        if latency_s:
            await asyncio.sleep(latency_s)
        return {"text": tokenizer.decode(ids), "meta_info": {
            "output_token_logprobs": [[LOGPROB, i, None] for i in ids], "finish_reason": finish,
            "weight_version": "0", "prompt_tokens": len(body["input_ids"]), "completion_tokens": len(ids)}}

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
    p.add_argument("--latency-ms", type=float, default=0.0, help="hold every reply this long")
    p.add_argument("--wrong-every", type=int, default=4, help="every N-th new episode plays the wrong solution")
    p.add_argument("--think-words", type=int, default=0, help="filler words of thinking before every reply")
    p.add_argument("--max-connections", type=int, default=4096, help="open connections to allow for (file limit)")
    opts = p.parse_args(argv)
    raise_open_file_limit(opts.max_connections + 64, "scripted engine")
    policy = ScriptedPolicy(json.loads(Path(opts.scripts).read_text()), opts.wrong_every, opts.think_words)
    server = BackgroundServer(build_app(AutoTokenizer.from_pretrained(opts.tokenizer), policy,
                                        opts.latency_ms / 1000), opts.host, opts.port)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(0))
    server.run(on_started=lambda: print(f"scripted engine listening on {server.url}", flush=True))


if __name__ == "__main__":
    main()

"""An OpenAI-compatible `/v1/chat/completions` in front of an SGLang-protocol `/generate` engine.

BFCL's harness speaks OpenAI chat with tools; our engines (the CPU engine, SGLang) speak token ids.
This server is the one translation between them, with the project's own pieces on both sides:

- in: the chat messages and tools are rendered with the checkpoint's chat template through
  `awm_grpo.chat.ChatEncoder` (Qwen3's template, `enable_thinking` as in the rollout) and sent as
  `input_ids` to `/generate`, stopping at the end-of-turn token;
- out: the reply is parsed by `awm_grpo.protocol.parse_reply`, the rollout's own parser: every valid
  `<tool_call>` block becomes an OpenAI `tool_calls` entry; a reply without one is plain content.
  Invalid blocks stay in the content, so bfcl's checker sees (and fails) them; nothing is guessed.

Each request renders the whole conversation again (as any OpenAI server does); the incremental
token-in/token-out bookkeeping of training is not needed for scoring.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from awm_grpo import protocol
from awm_grpo.chat import ChatEncoder
from slime.utils.http_utils import make_client, post


def _message(raw: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI chat message as the chat template expects it (content a string, arguments an object)."""
    role = raw.get("role")
    if role not in ("system", "user", "assistant", "tool"):
        raise ValueError(f"unsupported message role {role!r}: expected system, user, assistant or tool")
    content = raw.get("content")
    if isinstance(content, list):  # content parts: keep the text ones
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    message: dict[str, Any] = {"role": role, "content": content or ""}
    calls = []
    for call in raw.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError:
                pass  # the template writes a string as it is
        calls.append({"type": "function", "function": {"name": function.get("name", ""), "arguments": arguments}})
    if calls:
        message["tool_calls"] = calls
    return message


class ChatServer:
    """`/v1/chat/completions` on a background thread; `start()` returns the base URL (ending in /v1)."""

    def __init__(self, engine_url: str, tokenizer_dir: str, *, max_new_tokens: int = 512,
                 enable_thinking: bool = False, host: str = "127.0.0.1", port: int = 0) -> None:
        from transformers import AutoTokenizer

        self.engine_url = engine_url.rstrip("/")
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        self.max_new_tokens = max_new_tokens
        self.template_kwargs = {"enable_thinking": enable_thinking}
        self.host, self.port = host, port
        self.requests = 0
        self._encoders: dict[str, ChatEncoder] = {}  # by tool list: building one renders probe chats
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._client = None  # aiohttp session, created inside the server's loop

    def encoder(self, tools: list[dict[str, Any]] | None) -> ChatEncoder:
        key = json.dumps(tools or [], sort_keys=True)
        if key not in self._encoders:
            self._encoders[key] = ChatEncoder(self.tokenizer, None, tools, self.template_kwargs)
        return self._encoders[key]

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """One chat completion: render, generate, parse."""
        encoder = self.encoder(body.get("tools"))
        messages = [_message(m) for m in body.get("messages") or []]
        if not messages:
            raise ValueError("the request has no messages")
        input_ids = encoder.encode(encoder.render(messages, add_generation_prompt=True))
        params = {"temperature": float(body.get("temperature") or 0.0),
                  "max_new_tokens": int(body.get("max_tokens") or body.get("max_completion_tokens")
                                        or self.max_new_tokens),
                  "stop_token_ids": [encoder.end_of_turn_id], "skip_special_tokens": False, "no_stop_trim": True}
        if self._client is None:
            self._client = make_client()
        # Token ids come back as the rollout reads them (SGLang's log-prob pairs), so any SGLang-protocol
        # server that serves the rollout serves this too.
        reply = await post(f"{self.engine_url}/generate", {"input_ids": input_ids, "sampling_params": params,
                                                           "return_logprob": True}, client=self._client)
        ids = [int(p[1]) for p in (reply.get("meta_info") or {}).get("output_token_logprobs") or []]
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        if ids and ids[-1] == encoder.end_of_turn_id and text.endswith(encoder.end_of_turn):
            text = text[: -len(encoder.end_of_turn)]
        finish = ((reply.get("meta_info") or {}).get("finish_reason") or {}).get("type")
        self.requests += 1
        return self._response(body, text, finish, len(input_ids), len(ids))

    def _response(self, body: dict[str, Any], text: str, finish: str | None, n_in: int, n_out: int) -> dict:
        thinking, rest = protocol.split_thinking(text)
        parsed = protocol.parse_reply(text)
        calls = [c for c in parsed.calls if isinstance(c, protocol.ToolCall)]
        message: dict[str, Any] = {"role": "assistant", "content": rest.strip() if not calls else None}
        if calls:
            message["tool_calls"] = [{"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                                      "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                                     for c in calls]
        if thinking:
            message["reasoning_content"] = thinking
        reason = "tool_calls" if calls else ("length" if finish == "length" else "stop")
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", ""), "choices": [{"index": 0, "message": message, "finish_reason": reason}],
                "usage": {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}}

    def app(self) -> FastAPI:
        @contextlib.asynccontextmanager
        async def lifespan(_: FastAPI) -> AsyncIterator[None]:
            yield
            if self._client is not None:
                await self._client.close()

        app = FastAPI(lifespan=lifespan)

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> JSONResponse:
            try:
                return JSONResponse(await self.complete(await request.json()))
            except ValueError as exc:
                return JSONResponse({"error": {"message": str(exc), "type": "invalid_request_error"}}, 400)

        @app.get("/v1/models")
        async def models() -> JSONResponse:
            return JSONResponse({"object": "list", "data": [{"id": "engine", "object": "model"}]})

        return app

    def start(self) -> str:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(self.app(), log_level="warning", timeout_graceful_shutdown=5))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name="bfcl-chat-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the chat server did not start on {self.host}:{self.port}")
            time.sleep(0.01)
        return f"http://{self.host}:{self.port}/v1"

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=15)
            self._thread = None

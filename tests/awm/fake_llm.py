"""A real OpenAI-compatible HTTP server on 127.0.0.1 that answers from scripts (for `awm gen` tests).

Replies are scripted per request kind, not per arrival order, so concurrent pipelines stay
deterministic: a rule matches when all its needles occur in the last user message, and it
hands out its replies in order, repeating the last one. Every reply reports usage of
10 prompt + 5 completion tokens; every embeddings request 3 tokens. Unmatched requests get
HTTP 400 (the client does not retry those), so a missing script shows up as a failure.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CHAT_USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
EMBED_USAGE = {"prompt_tokens": 3, "total_tokens": 3}


@dataclass
class Rule:
    needles: tuple[str, ...]
    replies: list[str]
    served: int = 0
    prompts: list[str] = field(default_factory=list)  # the user message of every request it answered

    def next_reply(self, prompt: str) -> str:
        self.prompts.append(prompt)
        reply = self.replies[min(self.served, len(self.replies) - 1)]
        self.served += 1
        return reply


class FakeOpenAI:
    """Serve `/v1/chat/completions` and `/v1/embeddings`; `base_url` ends in /v1."""

    def __init__(self) -> None:
        self.rules: list[Rule] = []
        self.vectors: list[tuple[str, list[float]]] = []  # (needle, vector) for embeddings
        self.chat_requests = 0
        self.embed_requests = 0
        self.unmatched: list[str] = []
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
                status, payload = fake.answer(self.path, body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def script(self, *needles: str, replies: list[str]) -> Rule:
        rule = Rule(tuple(needles), list(replies))
        self.rules.append(rule)
        return rule

    def embedding(self, needle: str, vector: list[float]) -> None:
        self.vectors.append((needle, vector))

    def _vector(self, text: str) -> list[float]:
        for needle, vector in self.vectors:
            if needle in text:
                return vector
        digest = hashlib.sha256(text.encode()).digest()
        return [b / 255 - 0.5 for b in digest[:8]]

    def answer(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            if path.endswith("/embeddings"):
                self.embed_requests += 1
                data = [{"object": "embedding", "index": i, "embedding": self._vector(t)}
                        for i, t in enumerate(body["input"])]
                return 200, {"object": "list", "data": data, "model": body["model"], "usage": EMBED_USAGE}
            prompt = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
            for rule in self.rules:
                if all(n in prompt for n in rule.needles):
                    self.chat_requests += 1
                    text = rule.next_reply(prompt)
                    return 200, {"id": "chatcmpl-fake", "object": "chat.completion", "model": body["model"],
                                 "choices": [{"index": 0, "finish_reason": "stop",
                                              "message": {"role": "assistant", "content": text}}],
                                 "usage": CHAT_USAGE}
            self.unmatched.append(prompt[:200])
            return 400, {"error": {"message": f"no scripted reply for: {prompt[:120]!r}"}}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

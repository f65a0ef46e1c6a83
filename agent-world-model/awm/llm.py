"""A small client for OpenAI-compatible endpoints, shared by the sql-mode judge and synthesis.

One POST to `{base_url}/chat/completions` (or `/embeddings`) per call, with retries and
exponential backoff for the failures that retrying can fix (connection errors, timeouts,
408/409/425/429, 5xx, unreadable bodies) and none for the ones it cannot (other 4xx).
Concurrency is limited per client, by a number the caller passes in: no process-wide state.
Each client keeps a `UsageMeter` (requests, retried attempts, tokens) so a long job can report
what it spent.
"""

import asyncio
import dataclasses
import logging
import os
import random
from collections.abc import Callable
from typing import Any, TypeVar

import httpx

logger = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.openai.com/v1"
_RETRYABLE_STATUS = frozenset({408, 409, 425, 429})
T = TypeVar("T")


class LLMError(RuntimeError):
    """The endpoint gave no usable reply, after every retry that could help."""


@dataclasses.dataclass(frozen=True)
class ChatReply:
    """The first choice of a chat completion."""

    text: str
    usage: dict[str, int]
    model: str = ""
    finish_reason: str | None = None
    reasoning: str = ""  # `reasoning_content`, where a server splits reasoning out (vLLM, SGLang)


@dataclasses.dataclass
class UsageMeter:
    """What one client has spent: successful requests, retried attempts, tokens (as the server reports them)."""

    requests: int = 0
    retried_attempts: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    def add(self, usage: dict[str, int]) -> None:
        self.requests += 1
        prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        self.total_tokens += usage.get("total_tokens", prompt + completion)

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


class ChatClient:
    """Async chat client; base URL, key and model come from the arguments or OPENAI_BASE_URL,
    OPENAI_API_KEY and OPENAI_MODEL.

    `retries` counts attempts after the first. `max_concurrency` bounds requests in flight from
    this client (None: unbounded). A client may be used from one event loop at a time; moving to
    a new loop (a second `asyncio.run`) opens a new connection pool.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        model: str | None = None,
        *,
        timeout_s: float = 120.0,
        retries: int = 3,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        max_concurrency: int | None = None,
    ) -> None:
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        if max_concurrency is not None and max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1 or None, got {max_concurrency}")
        self.base_url = (base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY", "")
        self.model = model or os.environ.get("OPENAI_MODEL", "")
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_concurrency = max_concurrency
        self._loop: asyncio.AbstractEventLoop | None = None
        self._http: httpx.AsyncClient | None = None
        self._limit: asyncio.Semaphore | None = None
        self.meter = UsageMeter()

    def _session(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore | None]:
        """The connection pool and limiter of the running loop (both are bound to one loop)."""
        loop = asyncio.get_running_loop()
        if self._http is None or self._loop is not loop:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            self._http = httpx.AsyncClient(timeout=httpx.Timeout(self.timeout_s), headers=headers)
            self._limit = asyncio.Semaphore(self.max_concurrency) if self.max_concurrency else None
            self._loop = loop
        return self._http, self._limit

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        """Exponential backoff with jitter; a server's Retry-After wins when it is longer."""
        delay = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.max_backoff_s))
        return delay

    async def chat(self, messages: list[dict[str, Any]], **params: Any) -> ChatReply:
        """Send one chat completion request; `params` go into the body (temperature, max_tokens, model...)."""
        body = {"model": params.pop("model", None) or self.model, "messages": messages, **params}
        if not body["model"]:
            raise ValueError("no model for the chat request: pass model= or set OPENAI_MODEL")
        reply = await self._post("/chat/completions", body, _parse_reply)
        self.meter.add(reply.usage)
        return reply

    async def embed(self, texts: list[str], model: str | None = None) -> list[list[float]]:
        """Embedding vectors of `texts` (in order) from `{base_url}/embeddings`."""
        body = {"model": model or self.model, "input": list(texts)}
        if not body["model"]:
            raise ValueError("no model for the embeddings request: pass model=")
        vectors, usage = await self._post("/embeddings", body, _parse_embeddings)
        if len(vectors) != len(texts):
            raise LLMError(f"{self.base_url}/embeddings returned {len(vectors)} vectors for {len(texts)} inputs")
        self.meter.add(usage)
        return vectors

    async def _post(self, path: str, body: dict[str, Any], parse: Callable[[Any], T]) -> T:
        """POST `body` with retries; `parse` turns the JSON reply into the result (raising = unreadable)."""
        url = f"{self.base_url}{path}"
        http, limit = self._session()
        problem, retry_after = "", None
        for attempt in range(self.retries + 1):
            if attempt:
                self.meter.retried_attempts += 1
                delay = self._delay(attempt, retry_after)
                logger.warning("request to %s failed (%s); retry %d in %.2f s", url, problem, attempt, delay)
                await asyncio.sleep(delay)
            retry_after = None
            try:
                if limit is None:
                    response = await http.post(url, json=body)
                else:
                    async with limit:
                        response = await http.post(url, json=body)
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}"
                continue
            if response.status_code == 200:
                try:
                    return parse(response.json())
                except (ValueError, KeyError, IndexError, TypeError) as exc:
                    problem = f"unreadable reply body ({type(exc).__name__}: {exc}): {response.text[:200]!r}"
                    continue
            problem = f"HTTP {response.status_code}: {response.text[:300]!r}"
            if response.status_code not in _RETRYABLE_STATUS and response.status_code < 500:
                raise LLMError(
                    f"{url} refused the request with {problem}; check model name, key and parameters"
                )
            retry_after = _retry_after(response)
        raise LLMError(f"{url} gave no usable reply in {self.retries + 1} attempts; last problem: {problem}")

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def __aenter__(self) -> "ChatClient":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _parse_reply(data: dict[str, Any]) -> ChatReply:
    choice = data["choices"][0]
    message = choice["message"]
    usage = {key: value for key, value in (data.get("usage") or {}).items() if isinstance(value, int)}
    return ChatReply(
        text=message.get("content") or "",
        usage=usage,
        model=str(data.get("model", "")),
        finish_reason=choice.get("finish_reason"),
        reasoning=message.get("reasoning_content") or "",
    )


def _parse_embeddings(data: dict[str, Any]) -> tuple[list[list[float]], dict[str, int]]:
    rows = sorted(data["data"], key=lambda row: row.get("index", 0))
    vectors = [[float(x) for x in row["embedding"]] for row in rows]
    usage = {key: value for key, value in (data.get("usage") or {}).items() if isinstance(value, int)}
    return vectors, usage


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return float(response.headers["retry-after"])
    except (KeyError, ValueError):
        return None

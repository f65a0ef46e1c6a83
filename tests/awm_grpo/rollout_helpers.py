"""Helpers for the recipe tests (a uniquely named module: `conftest` names clash across test dirs).

The scripted engine is a real HTTP server on 127.0.0.1 answering SGLang's `/generate` subset; its
"model" replies with scripted texts (tokenised with the tiny model's tokenizer), so rollout tests can
drive every protocol path (valid, malformed, repeated calls, budgets, aborts) deterministically.
The end-to-end tests use the real CPU engine with the real tiny transformer instead.
"""

from __future__ import annotations

import argparse
import importlib.util
import threading
from collections import deque
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from slime.arguments import parse_args
from slime.engine.router import BackgroundServer

LOGPROB = -0.5
NO_END = "\x00no-end"  # suffix of a scripted reply that must not get the end-of-turn token
ABORT = "\x00abort"  # a scripted reply the engine aborts



class ScriptedEngine:
    """Replies in order from `script`; records every request's input_ids and sampling params."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.script: deque[str] = deque()
        self.requests: list[dict[str, Any]] = []
        self.outputs: list[list[int]] = []
        self.lock = threading.Lock()
        app = FastAPI()
        app.post("/generate")(self._generate)
        self.server = BackgroundServer(app)
        self.url = self.server.start()

    def _generate(self, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.requests.append(body)
            text = self.script.popleft() if self.script else "I am done."
        if text == ABORT:
            return {"text": "", "meta_info": {"output_token_logprobs": [], "finish_reason": {"type": "abort"},
                                              "weight_version": "0"}}
        end = not text.endswith(NO_END)
        text = text.removesuffix(NO_END)
        ids = list(self.tok.encode(text, add_special_tokens=False)) + ([self.end_id] if end else [])
        limit = body["sampling_params"].get("max_new_tokens", len(ids))
        finish = {"type": "stop", "matched": self.end_id} if end else {"type": "stop", "matched": "</tool_call>"}
        if len(ids) > limit:
            ids, finish = ids[:limit], {"type": "length", "length": limit}
        self.outputs.append(ids)
        return {"text": self.tok.decode(ids), "meta_info": {
            "output_token_logprobs": [[LOGPROB, i, None] for i in ids], "finish_reason": finish,
            "weight_version": "0", "prompt_tokens": len(body["input_ids"]), "completion_tokens": len(ids)}}

    def reply(self, *texts: str) -> None:
        self.script.extend(texts)

    def reset(self) -> None:
        self.script.clear()
        self.requests.clear()
        self.outputs.clear()


def make_args(model_dir: Path, engine_url: str, tmp_path: Path, **awm: Any) -> argparse.Namespace:
    """slime args for one rollout against `engine_url`, with awm_* keys as the runtime YAML sets them."""
    host, port = engine_url.removeprefix("http://").rsplit(":", 1)
    args = parse_args(["--hf-checkpoint", str(model_dir), "--prompt-data", "unused.jsonl",
                       "--rollout-batch-size", "1", "--n-samples-per-prompt", "1", "--num-rollout", "1",
                       "--rollout-max-response-len", str(awm.pop("max_response_len", 2048)),
                       "--sglang-router-ip", host, "--sglang-router-port", port])
    defaults = {"env_workers": 1, "trace_dir": str(tmp_path / "traces"), "max_turns": 6}
    for key, value in {**defaults, **awm}.items():
        setattr(args, f"awm_{key}", value)
    return args


QWEN3_TEMPLATE = Path(__file__).resolve().parents[3] / "shared" / "qwen3" / "chat_template.jinja"


def qwen3_template() -> str:
    """The chat template Qwen3-4B ships, read in place from the shared folder beside the repository."""
    if not QWEN3_TEMPLATE.is_file():
        import pytest

        pytest.fail(f"{QWEN3_TEMPLATE} is missing: the Qwen3 template tests read the template Qwen3-4B ships "
                    "from the shared folder beside the repository (see ../shared/qwen3/README.md)")
    return QWEN3_TEMPLATE.read_text(encoding="utf-8")


def awm_test_fixtures() -> Any:
    """tests/awm/conftest.py as a module (its synthetic fault scenarios), under a unique name."""
    path = Path(__file__).resolve().parents[1] / "awm" / "conftest.py"
    spec = importlib.util.spec_from_file_location("awm_test_fixtures", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

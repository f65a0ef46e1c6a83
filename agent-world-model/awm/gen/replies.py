"""Reading structured answers out of model replies.

Strict on purpose: JSON is taken from the whole reply, a fenced block, or the first balanced
value, and parsed with the standard parser. Upstream "repairs" malformed JSON, which silently
turns a reply cut off at the token limit into a shorter record; here a reply that does not
parse is a failed attempt, and the parser's message goes back to the model in the retry.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from awm.verifier import strip_thinking

_FENCE = re.compile(r"```([a-zA-Z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)


class ReplyError(ValueError):
    """The reply holds no usable answer; the message says why, for the retry prompt."""


def _fenced(text: str, languages: tuple[str, ...]) -> list[str]:
    return [body for lang, body in _FENCE.findall(text) if lang.lower() in languages]


def parse_json(text: str) -> Any:
    """The JSON value of a reply: the whole text, else a ```json block, else the first `{` or `[` value."""
    body = strip_thinking(text).strip()
    if not body:
        raise ReplyError("the reply was empty")
    candidates = [body, *_fenced(body, ("json", ""))]
    first_error = None
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except ValueError as exc:
            first_error = first_error or exc
    decoder = json.JSONDecoder()
    for match in re.finditer(r"[{\[]", body):
        try:
            value, _ = decoder.raw_decode(body, match.start())
            return value
        except ValueError:
            continue
    raise ReplyError(f"the reply is not valid JSON ({first_error}); answer with one JSON value only")


def parse_object(text: str, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """A JSON object with the `required` keys."""
    value = parse_json(text)
    if not isinstance(value, dict):
        raise ReplyError(f"expected a JSON object, got {type(value).__name__}")
    missing = [key for key in required if key not in value]
    if missing:
        raise ReplyError(f"the JSON object lacks the key(s) {missing}")
    return value


def parse_python(text: str, key: str) -> str:
    """Python source from a reply: JSON `{key: code}`, a ```python block, or the bare reply.

    The code must parse; a SyntaxError is reported with its line so the retry can fix it.
    """
    body = strip_thinking(text).strip()
    code = None
    if body.startswith("{"):
        try:
            value = json.loads(body)
        except ValueError:
            value = None
        if isinstance(value, dict) and isinstance(value.get(key), str):
            code = value[key]
    if code is None:
        blocks = _fenced(body, ("python", "py", ""))
        code = max(blocks, key=len) if blocks else body
    if not code.strip():
        raise ReplyError("the reply holds no Python code")
    try:
        ast.parse(code)
    except SyntaxError as exc:
        raise ReplyError(f"the code does not parse: {exc.msg} at line {exc.lineno}: {(exc.text or '').strip()!r}") \
            from None
    return code

"""The agent's side of the conversation: system prompts, tool-call parsing, observation text.

A reply is Qwen3-style text: optional `<think>...</think>`, then free text and zero or more
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks. Parsing never guesses:

- no `<tool_call>` tag after the thinking -> the reply is the final answer (the episode ends);
- a tag whose JSON does not parse, an unclosed tag, a missing or non-string name, arguments that
  are not an object (or a JSON string holding one) -> an `InvalidCall` the agent is told about in
  its next observation (and that the reward may penalise), never silently `{}`;
- JSON that parses but no layer below could carry (nested deeper than `MAX_ARGUMENT_DEPTH`, or text
  with a lone UTF-16 surrogate such as `"\\ud800"`, which is not Unicode and cannot be encoded as
  UTF-8) -> an `InvalidCall` too: the parser never raises, whatever the model wrote.

Two tool modes (awm-format.md section 7):

- "meta": the model sees two tools, `list_tools()` and `call_tool(tool_name, arguments)`, as
  upstream AWM's agent does; `list_tools` returns a text catalogue of the environment's tools;
- "native": the environment's tools are given to the chat template (`tools=`), called by name.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from awm.sandbox import nested_deeper

LIST_TOOLS, CALL_TOOL = "list_tools", "call_tool"

_THINK_END = "</think>"
_CALL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_OPEN_TAG = "<tool_call>"
MAX_ARGUMENT_DEPTH = 64  # nesting of a call's JSON; real tool arguments nest a few levels
# What may hide a lone surrogate: a JSON escape of one (\ud800-\udfff), or one in the text itself.
_SURROGATE_HINT = re.compile(r"\\u[dD][89a-fA-F]|[\ud800-\udfff]")

META_SYSTEM_PROMPT = """You are an assistant working inside an application on behalf of its logged-in user (user id 1). \
You act through the application's tools, which you reach with two functions:

- list_tools(): returns the catalogue of the application's tools and their parameters.
- call_tool(tool_name, arguments): runs one tool; arguments is a JSON object of its parameters.

Call a function by replying with exactly one block:
<tool_call>
{"name": "call_tool", "arguments": {"tool_name": "<tool>", "arguments": {"<param>": <value>}}}
</tool_call>
Call list_tools first. Each function result comes back in the next message. Tools change the \
application's real data: check results, and fix anything that went wrong. When the task is done, \
reply with your final answer and no <tool_call> block."""

NATIVE_SYSTEM_PROMPT = """You are an assistant working inside an application on behalf of its logged-in user (user id 1). \
Use the tools to complete the user's task; they change the application's real data, so check \
results and fix anything that went wrong. When the task is done, reply with your final answer \
and no tool call."""

META_TOOLS: list[dict[str, Any]] = [
    {"name": LIST_TOOLS, "description": "List the application's tools and their parameters.",
     "inputSchema": {"type": "object", "properties": {}, "required": []}},
    {"name": CALL_TOOL, "description": "Run one of the application's tools.",
     "inputSchema": {"type": "object", "properties": {
         "tool_name": {"type": "string", "description": "name from list_tools"},
         "arguments": {"type": "object", "description": "the tool's parameters"}},
         "required": ["tool_name"]}},
]


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: a tool name and a JSON object of arguments."""

    name: str
    arguments: dict[str, Any]

    def key(self) -> str:
        """Identity for repeat detection: name + canonical arguments (no call ids, no whitespace)."""
        return self.name + "\x00" + json.dumps(self.arguments, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class InvalidCall:
    """A `<tool_call>` block the agent wrote but that cannot be run, and why (shown to the agent)."""

    raw: str
    reason: str


@dataclass
class ParsedReply:
    """What a reply asks for: calls to run (in order), invalid blocks, or a final answer."""

    calls: list[ToolCall | InvalidCall] = field(default_factory=list)
    final_answer: str | None = None  # set iff the reply has no tool-call tag: the episode ends

    @property
    def is_final(self) -> bool:
        return self.final_answer is not None


def split_thinking(text: str) -> tuple[str, str]:
    """(thinking, rest): everything up to the last `</think>` is reasoning, never parsed for calls."""
    cut = text.rfind(_THINK_END)
    if cut < 0:
        return "", text
    return text[: cut + len(_THINK_END)], text[cut + len(_THINK_END):]


def _uncarried(text: str, value: Any) -> str | None:
    """Why JSON `value` parsed from `text` cannot be run (too deep, a lone surrogate), or None.

    The scans run only when `text` could hold such a value (more brackets than the depth limit, a
    surrogate escape), so a typical call pays two `str.count`s and one regex search."""
    if text.count("[") + text.count("{") > MAX_ARGUMENT_DEPTH and nested_deeper(value, MAX_ARGUMENT_DEPTH):
        return f"the JSON nests deeper than {MAX_ARGUMENT_DEPTH} levels"
    if _SURROGATE_HINT.search(text):
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            return "the JSON holds a lone UTF-16 surrogate (an escape such as \\ud800 without its pair), " \
                   "which is not valid text"
    return None


def _loads(text: str) -> Any:
    """json.loads, with nesting too deep for the parser reported as a JSONDecodeError (it raises RecursionError)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError(f"nested deeper than {MAX_ARGUMENT_DEPTH} levels", text, 0) from None


def _parse_block(raw: str) -> ToolCall | InvalidCall:
    body = raw.strip()
    try:
        obj = _loads(body)
    except json.JSONDecodeError as exc:
        return InvalidCall(raw, f"the tool call is not valid JSON ({exc.msg} at character {exc.pos})")
    if (why := _uncarried(body, obj)) is not None:
        return InvalidCall(raw, why)
    if not isinstance(obj, dict):
        return InvalidCall(raw, f"the tool call must be a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return InvalidCall(raw, 'the tool call needs a "name" string')
    args = obj.get("arguments", {})
    if args is None:
        args = {}
    if isinstance(args, str):
        text = args
        try:
            args = _loads(text) if text.strip() else {}
        except json.JSONDecodeError as exc:
            return InvalidCall(raw, f'"arguments" is a string that is not valid JSON ({exc.msg})')
        if (why := _uncarried(text, args)) is not None:
            return InvalidCall(raw, f'"arguments" is a string whose JSON cannot be run: {why}')
    if not isinstance(args, dict):
        return InvalidCall(raw, f'"arguments" must be a JSON object, got {type(args).__name__}')
    return ToolCall(name.strip(), args)


def parse_reply(text: str) -> ParsedReply:
    """Split a model reply into tool calls (valid or not) or a final answer; see the module doc."""
    _, rest = split_thinking(text)
    if _OPEN_TAG not in rest:
        return ParsedReply(final_answer=text)
    calls: list[ToolCall | InvalidCall] = []
    end = 0
    for match in _CALL_BLOCK.finditer(rest):
        calls.append(_parse_block(match.group(1)))
        end = match.end()
    tail = rest[end:]
    if _OPEN_TAG in tail:  # an opened block that never closed (often: the turn ran out of tokens)
        calls.append(InvalidCall(tail[tail.index(_OPEN_TAG):], "the <tool_call> block is not closed with </tool_call>"))
    return ParsedReply(calls=calls)


def resolve_meta_call(call: ToolCall) -> ToolCall | InvalidCall:
    """Turn a meta-mode `call_tool` into the environment call it names (list_tools stays as is)."""
    if call.name == LIST_TOOLS:
        return call
    if call.name != CALL_TOOL:
        return InvalidCall(json.dumps({"name": call.name, "arguments": call.arguments}),
                           f"unknown function {call.name!r}: only {LIST_TOOLS!r} and {CALL_TOOL!r} exist")
    tool = call.arguments.get("tool_name")
    if not isinstance(tool, str) or not tool.strip():
        return InvalidCall(json.dumps(call.arguments), 'call_tool needs a "tool_name" string')
    inner = call.arguments.get("arguments", {})
    if inner is None:
        inner = {}
    if isinstance(inner, str):
        text = inner
        try:
            inner = _loads(text) if text.strip() else {}
        except json.JSONDecodeError as exc:
            return InvalidCall(text, f'call_tool "arguments" is a string that is not valid JSON ({exc.msg})')
        if (why := _uncarried(text, inner)) is not None:
            return InvalidCall(text, f'call_tool "arguments" is a string whose JSON cannot be run: {why}')
    if not isinstance(inner, dict):
        return InvalidCall(json.dumps(call.arguments), 'call_tool "arguments" must be a JSON object')
    return ToolCall(tool.strip(), inner)


def _describe_schema(schema: dict[str, Any], indent: str) -> list[str]:
    props = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    lines = []
    for name, spec in props.items():
        kind = spec.get("type", "any") if isinstance(spec, dict) else "any"
        line = f"{indent}- {name}: {kind} ({'required' if name in required else 'optional'})"
        if isinstance(spec, dict):
            if spec.get("description"):
                line += f" {spec['description']}"
            if "enum" in spec:
                line += f" one of {spec['enum']}"
            if "default" in spec:
                line += f" default {json.dumps(spec['default'])}"
        lines.append(line)
        if isinstance(spec, dict) and spec.get("type") == "object" and spec.get("properties"):
            lines += _describe_schema(spec, indent + "    ")
    return lines


def tool_catalogue(tools: list[dict[str, Any]]) -> str:
    """The `list_tools` observation: each tool's name, first description line and parameters."""
    lines = [f"{len(tools)} tools:"]
    for i, tool in enumerate(tools, 1):
        description = (tool.get("description") or "").strip().splitlines()
        lines.append(f"{i}. {tool['name']}: {description[0] if description else ''}")
        params = _describe_schema(tool.get("inputSchema") or {}, "    ")
        lines += params if params else ["    (no parameters)"]
    return "\n".join(lines)


def native_tool_schemas(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """MCP tool entries -> the OpenAI/Qwen function schemas chat templates render."""
    return [{"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                              "parameters": t.get("inputSchema") or {"type": "object"}}}
            for t in tools]


def observation_text(text: str, is_error: bool) -> str:
    """What the agent reads for a tool result: errors always start with "Error"."""
    return f"Error: {text}" if is_error and not text.startswith("Error") else text


def invalid_call_text(call: InvalidCall) -> str:
    return f"Error: invalid tool call: {call.reason}. Write one JSON object " \
           '{"name": ..., "arguments": {...}} between <tool_call> and </tool_call>.'

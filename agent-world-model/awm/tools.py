"""Tools as upstream AWM exposes them, derived from a FastAPI app's OpenAPI document.

Rules (fastapi-mcp 0.4.0, which upstream mounts on every environment):
- one tool per route; name = the route's `operation_id`;
- description = summary, a blank line, the route description, then a `### Responses:`
  section with an example of the 2xx response;
- inputSchema = ONE flat object: path params + query params + the top-level properties of
  the JSON body; `required` = path params + required query params + the body's required list;
- a call substitutes path params into the path, sends query params as the query string and
  every remaining argument as the JSON body (POST/PUT/PATCH);
- success -> the response JSON dumped with indent 2; HTTP status >= 400 ->
  `Error calling <tool>. Status code: <code>. Response: <body>`; arguments that do not
  match the schema -> `Input validation error: <detail>` before the app runs.

Everything here is pure data processing, so it is tested without running any app.
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

import orjson

BODY_METHODS = {"POST", "PUT", "PATCH"}
_MAX_REF_DEPTH = 8


@dataclass(frozen=True)
class ToolSpec:
    """One tool and how a call to it becomes an HTTP request on the app."""

    name: str
    description: str
    input_schema: dict[str, Any]
    method: str
    path: str
    path_params: tuple[str, ...] = ()
    query_params: tuple[str, ...] = ()
    body_params: tuple[str, ...] = ()
    raw_body: str | None = None  # set when the body is not an object: that argument is the whole body
    examples: dict[str, Any] = field(default_factory=dict)  # documented example per argument (health checks)

    def public(self) -> dict[str, Any]:
        """The MCP view: name, description, inputSchema."""
        return {"name": self.name, "description": self.description, "inputSchema": self.input_schema}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ToolSpec:
        return cls(**{**d, "path_params": tuple(d["path_params"]), "query_params": tuple(d["query_params"]),
                      "body_params": tuple(d["body_params"])})

    @classmethod
    def from_reply(cls, d: Any) -> ToolSpec:
        """A tool spec a worker sent (`to_dict`'s output); ValueError for anything else (generated code runs in
        the worker and can write its replies, so every field the trainer reads is checked)."""
        try:
            spec = cls.from_dict(d)
        except (TypeError, KeyError, AttributeError):
            raise ValueError(f"not a tool spec: {str(d)[:200]!r}") from None
        texts = (spec.name, spec.description, spec.method, spec.path, *spec.path_params, *spec.query_params,
                 *spec.body_params)
        if not all(type(t) is str for t in texts) or type(spec.input_schema) is not dict \
                or type(spec.examples) is not dict or not (spec.raw_body is None or type(spec.raw_body) is str):
            raise ValueError(f"not a tool spec: {str(d)[:200]!r}")
        return spec

    @property
    def read_only(self) -> bool:
        """GET routes: upstream's generated code reads only there."""
        return self.method == "GET"


@dataclass(frozen=True)
class HttpRequest:
    method: str
    path: str
    query_string: bytes
    body: bytes | None


@dataclass
class Observation:
    """What the agent sees after a tool call, plus what the trainer needs to know about it.

    kind: ok | http_error | invalid_arguments | unknown_tool
    """

    text: str
    is_error: bool
    kind: str = "ok"
    status: int | None = None
    latency_s: float = 0.0
    detail: str = ""  # server-side traceback of an HTTP 500, for logs, never shown to the agent
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_reply(cls, data: Any) -> Observation:
        """The observation a worker sent (`to_dict`'s output); ValueError for anything else.

        A worker runs generated code, which can write its own replies: the caller checks the fields it
        reads instead of trusting their types (a few type checks, no copy)."""
        try:
            obs = cls(**data)
        except TypeError:
            raise ValueError(f"not an observation: {str(data)[:200]!r}") from None
        if type(obs.text) is not str or type(obs.is_error) is not bool or type(obs.kind) is not str \
                or type(obs.latency_s) not in (float, int) or type(obs.detail) is not str:
            raise ValueError(f"not an observation: {str(data)[:200]!r}")
        return obs


def _resolve(schema: Any, components: dict[str, Any], depth: int = 0) -> Any:
    """Inline `$ref`s (recursive schemas are cut at a fixed depth)."""
    if isinstance(schema, list):
        return [_resolve(s, components, depth) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if "$ref" in schema:
        name = schema["$ref"].split("/")[-1]
        if depth >= _MAX_REF_DEPTH or name not in components:
            return {"type": "object"}
        merged = {**components[name], **{k: v for k, v in schema.items() if k != "$ref"}}
        return _resolve(merged, components, depth + 1)
    return {k: _resolve(v, components, depth) for k, v in schema.items()}


def example_of(schema: Any, depth: int = 0) -> Any:
    """A small example value for a (resolved) JSON schema, used in tool descriptions."""
    if not isinstance(schema, dict) or depth > 6:
        return None
    for key in ("example", "default"):
        if key in schema:
            return schema[key]
    if schema.get("examples"):
        return schema["examples"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        options = [s for s in schema.get(key, []) if s.get("type") != "null"]
        if options:
            return example_of(options[0], depth + 1)
    typ = schema.get("type")
    if typ == "object" or "properties" in schema:
        return {k: example_of(v, depth + 1) for k, v in schema.get("properties", {}).items()}
    if typ == "array":
        return [example_of(schema.get("items", {}), depth + 1)]
    return {"string": "string", "integer": 0, "number": 0.0, "boolean": True}.get(typ)


def _description(op: dict[str, Any], components: dict[str, Any]) -> str:
    parts = [op.get("summary") or ""]
    if op.get("description"):
        parts.append(op["description"])
    text = "\n\n".join(p for p in parts if p)
    for code, resp in sorted((op.get("responses") or {}).items()):
        if not str(code).startswith("2"):
            continue
        text += f"\n\n### Responses:\n\n**{code}**: {resp.get('description', '')}"
        schema = ((resp.get("content") or {}).get("application/json") or {}).get("schema")
        if schema:
            example = example_of(_resolve(schema, components))
            text += f"\n\n**Example Response:**\n```json\n{json.dumps(example, indent=2)}\n```"
        break
    return text


def tools_from_openapi(spec: dict[str, Any]) -> list[ToolSpec]:
    """Derive the tool list from an OpenAPI document (FastAPI's `app.openapi()`)."""
    components = (spec.get("components") or {}).get("schemas") or {}
    tools: list[ToolSpec] = []
    for path, item in (spec.get("paths") or {}).items():
        for method, op in item.items():
            if method.upper() not in {"GET", "POST", "PUT", "PATCH", "DELETE"} or not isinstance(op, dict):
                continue
            name = op.get("operationId") or f"{method}_{path}".replace("/", "_").strip("_")
            props: dict[str, Any] = {}
            required: list[str] = []
            path_params, query_params = [], []
            examples: dict[str, Any] = {}
            for param in op.get("parameters") or []:
                where, pname = param.get("in"), param.get("name")
                if where not in ("path", "query"):
                    continue  # headers and cookies are not tool arguments upstream either
                schema = copy.deepcopy(_resolve(param.get("schema") or {}, components))
                if param.get("description"):
                    schema["description"] = param["description"]
                props[pname] = schema
                if "example" in param:
                    examples[pname] = param["example"]
                elif param.get("examples"):
                    first = next(iter(param["examples"].values())) if isinstance(param["examples"], dict) \
                        else param["examples"][0]
                    examples[pname] = first.get("value") if isinstance(first, dict) else first
                (path_params if where == "path" else query_params).append(pname)
                if where == "path" or param.get("required"):
                    required.append(pname)
            body_params: list[str] = []
            raw_body = None
            body = (op.get("requestBody") or {}).get("content", {}).get("application/json")
            if body:
                schema = _resolve(body.get("schema") or {}, components)
                if "properties" in schema:
                    for pname, pschema in schema["properties"].items():
                        props[pname] = pschema
                        body_params.append(pname)
                        if "example" in pschema or pschema.get("examples"):
                            examples[pname] = pschema.get("example", (pschema.get("examples") or [None])[0])
                    required += [r for r in schema.get("required", []) if r not in required]
                else:
                    raw_body = schema.get("title", "body").lower().replace(" ", "_")
                    props[raw_body] = schema
                    if (op.get("requestBody") or {}).get("required"):
                        required.append(raw_body)
            input_schema: dict[str, Any] = {"type": "object", "properties": props}
            if required:
                input_schema["required"] = required
            tools.append(ToolSpec(name=name, description=_description(op, components), input_schema=input_schema,
                                  method=method.upper(), path=path, path_params=tuple(path_params),
                                  query_params=tuple(query_params), body_params=tuple(body_params),
                                  raw_body=raw_body, examples=examples))
    return tools


def _query_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (dict, list)):
        return json.dumps(v)
    return str(v)


def build_request(tool: ToolSpec, arguments: dict[str, Any]) -> HttpRequest:
    """Turn flat tool arguments into the HTTP request upstream would send to the app."""
    path = tool.path
    for name in tool.path_params:
        path = path.replace("{" + name + "}", quote(_query_value(arguments[name]), safe=""))
    pairs: list[tuple[str, str]] = []
    for name in tool.query_params:
        value = arguments.get(name)
        if value is None:
            continue
        for item in value if isinstance(value, list) else [value]:
            pairs.append((name, _query_value(item)))
    body = None
    if tool.method in BODY_METHODS or tool.body_params or tool.raw_body:
        if tool.raw_body is not None:
            payload = arguments.get(tool.raw_body)
        else:
            used = set(tool.path_params) | set(tool.query_params)
            payload = {k: v for k, v in arguments.items() if k not in used}
        body = json.dumps(payload).encode()
    return HttpRequest(tool.method, path, urlencode(pairs).encode(), body)


def observation_from_response(tool_name: str, status: int, body: bytes) -> Observation:
    """Upstream's result text for an HTTP response."""
    text = body.decode("utf-8", errors="replace")
    if status >= 400:
        return Observation(f"Error calling {tool_name}. Status code: {status}. Response: {text}",
                           is_error=True, kind="http_error", status=status)
    try:
        text = orjson.dumps(orjson.loads(body), option=orjson.OPT_INDENT_2).decode()
    except orjson.JSONDecodeError:
        pass  # not JSON: pass the text through
    return Observation(text, is_error=False, kind="ok", status=status)

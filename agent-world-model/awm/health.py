"""Health checks of environment code: load it, list its tools, call every read-only tool.

Upstream validates generated environments only by listing their tools, so a route that
fails when called still passes. Here every GET tool is called with arguments built from
its schema (documented example, else default, else a type-based placeholder; then once
more with integer ids = 1) and a tool whose every attempt ends in HTTP status >= 500 is
reported as a server error of the environment.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from awm.episode import EnvRuntime
from awm.runtime.pool import InfraError
from awm.tools import ToolSpec

_PLACEHOLDER = {"integer": 1, "number": 1.0, "boolean": False, "string": "test", "array": [], "object": {}}


def probe_arguments(tool: ToolSpec, *, use_examples: bool = True) -> dict[str, Any]:
    """Schema-valid arguments for the required parameters of `tool`.

    With `use_examples=False` integers are 1 instead of the documented example: AWM sample
    data creates row 1 of most tables first, while examples often name rows that do not exist.
    """
    args: dict[str, Any] = {}
    props = tool.input_schema.get("properties", {})
    for name in tool.input_schema.get("required", []):
        schema = props.get(name, {})
        typ = schema.get("type") or next((s.get("type") for s in schema.get("anyOf", []) if s.get("type") != "null"),
                                         "string")
        if not use_examples and typ == "integer":
            args[name] = 1
        elif name in tool.examples and tool.examples[name] is not None:
            args[name] = tool.examples[name]
        elif "default" in schema and schema["default"] is not None:
            args[name] = schema["default"]
        elif schema.get("enum"):
            args[name] = schema["enum"][0]
        else:
            args[name] = _PLACEHOLDER.get(typ, "test")
    return args


@dataclass
class ScenarioHealth:
    """Result of checking one scenario; `ok` means it loads and no read tool fails with 5xx."""

    scenario: str
    ok: bool = False
    tools: int = 0
    read_tools: int = 0
    load_error: str = ""
    server_errors: list[dict[str, Any]] = field(default_factory=list)
    client_errors: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


async def check_scenario(runtime: EnvRuntime, scenario: str, *, call_reads: bool = True) -> ScenarioHealth:
    """Load `scenario`, then (optionally) call each read-only tool once on a fresh episode."""
    health = ScenarioHealth(scenario)
    try:
        episode = await runtime.open(scenario)
    except InfraError as exc:
        health.load_error = str(exc)
        return health
    try:
        health.tools = len(episode.tool_specs)
        reads = [t for t in episode.tool_specs if t.read_only]
        health.read_tools = len(reads)
        if call_reads:
            for tool in reads:
                for args in (probe_arguments(tool), probe_arguments(tool, use_examples=False)):
                    obs = await episode.call(tool.name, args)
                    if obs.status is None or obs.status < 500:
                        break
                if obs.status is not None and obs.status >= 500:
                    health.server_errors.append({"tool": tool.name, "arguments": args, "status": obs.status,
                                                 "error": (obs.detail or obs.text).strip().splitlines()[-1:]})
                elif obs.is_error:
                    health.client_errors += 1
        health.ok = not health.server_errors
    except InfraError as exc:
        health.load_error = f"while calling tools: {exc}"
    finally:
        await episode.close()
    return health

"""The compiled argument pre-check (awm.runtime.argcheck) never passes what jsonschema would reject.

Its contract is one-sided (True only where jsonschema finds no error), so the tests throw many
argument objects, valid and not, at real tool schemas (the bundled scenarios and the AWM-1K
excerpt, as the worker sees them) and at hand-written ones with every keyword it models.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from awm.episode import EnvRuntime
from awm.health import probe_arguments
from awm.runtime.argcheck import compile_check
from awm.tools import ToolSpec

VALUES: list[Any] = [None, True, False, 0, 1, -5, 7, 10**20, 1.0, 2.5, -0.5, float("nan"), "", "a", "abc" * 20,
                     "2024-01-01", [], [1], ["a", "b"], [None], {}, {"a": 1}]


def jsonschema_ok(schema: dict[str, Any], instance: Any) -> bool:
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return next(iter(cls(schema).iter_errors(instance)), None) is None


def instances(schema: dict[str, Any], rng: random.Random, n: int) -> list[Any]:
    """Argument objects around `schema`: every property set to every sample value, random mixes, extras."""
    names = list(schema.get("properties", {})) + ["unknown_arg"]
    out: list[Any] = [{}, None, [], "x", 3]
    for name, value in itertools.product(names, VALUES):
        out.append({name: value})
    for _ in range(n):
        out.append({name: rng.choice(VALUES) for name in rng.sample(names, rng.randint(0, len(names)))})
    return out


def check_agrees(schema: dict[str, Any], cases: list[Any]) -> int:
    """Assert the one-sided contract on every case; returns how many the pre-check passed by itself."""
    check = compile_check(schema)
    assert check is not None, f"a schema of the kind AWM produces was not compiled: {schema}"
    passed = 0
    for case in cases:
        if check(case):
            passed += 1
            assert jsonschema_ok(schema, case), f"pre-check passed what jsonschema rejects: {case!r} for {schema}"
    return passed


@pytest.fixture(scope="module")
def real_tools(cache_dir: Path, excerpt_dir: Path) -> list[ToolSpec]:
    async def collect() -> list[ToolSpec]:
        specs: list[ToolSpec] = []
        for data_dir, names in ((None, None), (excerpt_dir, ["content_platform_1", "code_hosting_2"])):
            with EnvRuntime(data_dir, num_workers=1, cache_dir=cache_dir) as rt:
                for name in names or rt.dataset.scenario_names(runnable_only=True):
                    await rt.tools(name)
                    specs += rt._tools[name]
        return specs
    return asyncio.run(collect())


def test_real_tool_schemas_compile_and_never_pass_what_jsonschema_rejects(real_tools: list[ToolSpec]) -> None:
    rng = random.Random(7)
    assert len(real_tools) > 100
    passed = total = 0
    for spec in real_tools:
        cases = instances(spec.input_schema, rng, 40)
        cases += [probe_arguments(spec), probe_arguments(spec, use_examples=False)]
        passed += check_agrees(spec.input_schema, cases)
        total += len(cases)
        for probe in cases[-2:]:  # the probes are valid: the fast path must take them itself
            if jsonschema_ok(spec.input_schema, probe):
                assert compile_check(spec.input_schema)(probe), (spec.name, probe)
    assert passed > total * 0.02  # the fast path is taken, not just always deferred


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 10}}, "required": ["n"]},
    {"type": "object", "properties": {"x": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}}},
    {"type": "object", "properties": {"s": {"type": "string", "minLength": 2, "maxLength": 5}},
     "additionalProperties": False},
    {"type": "object", "properties": {"e": {"enum": ["a", 1, None, True]}}},
    {"type": "object", "properties": {"e": {"enum": [1.0, False]}}},
    {"type": "object", "properties": {"c": {"type": "string", "pattern": "^#[0-9a-f]{2}$"}}},
    {"type": "object", "properties": {"t": {"type": ["string", "null"]}}, "additionalProperties": {"type": "integer"}},
    {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string"}},
                                      "o": {"anyOf": [{"type": "object"}, {"type": "boolean"}]}}},
])
def test_every_modelled_keyword_agrees_with_jsonschema(schema: dict[str, Any]) -> None:
    rng = random.Random(11)
    cases = instances(schema, rng, 300) + [{"n": 5}, {"n": 5.0}, {"n": True}, {"e": 1}, {"e": 1.0}, {"e": True},
                                           {"x": 0.5}, {"s": "abc"}, {"c": "#0a"}, {"c": "#0a\n"}, {"c": "x#0a"}, {"a": ["x"]}, {"o": {}}, {"t": None, "z": 3}]
    assert check_agrees(schema, cases) > 0


def test_what_is_not_modelled_is_left_to_jsonschema() -> None:
    assert compile_check({"type": "object", "properties": {"p": {"type": "string", "pattern": "(unclosed"}}}) is None
    assert compile_check({"$schema": "http://json-schema.org/draft-04/schema#", "type": "object"}) is None
    assert compile_check({"type": "object", "properties": {"r": {"$ref": "#/$defs/x"}}}) is None
    assert compile_check({"type": "decimal"}) is None


def test_a_wrong_check_is_caught() -> None:
    """The agreement check itself can fail: a schema whose pre-check is too lenient on purpose."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    lenient = {"type": "object", "properties": {"n": {"type": ["integer", "string"]}}}
    check = compile_check(lenient)
    assert check({"n": "x"}) and not jsonschema_ok(schema, {"n": "x"})

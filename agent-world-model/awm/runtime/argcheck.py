"""A cheap pre-check of tool arguments, compiled once per tool, in front of jsonschema.

jsonschema's `iter_errors` walks the schema through its generic keyword dispatch on every call
(10 to 25 us for AWM's flat argument objects, more than the rest of the in-worker plumbing). The
schemas `tools_from_openapi` produces use a handful of keywords, so each is compiled here into
plain Python checks. The contract is one-sided: `check(arguments)` is True only when jsonschema
would find no error; False means "not sure", and the caller asks jsonschema, which also writes the
error message. So answers and messages stay jsonschema's, and anything this module does not model
(another keyword, a `$schema`, a float where an integer is expected) costs only the old path.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Check = Callable[[Any], bool]
# Keywords that assert nothing under jsonschema's defaults (no format checker is installed).
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "example", "format", "deprecated",
                          "readOnly", "writeOnly", "$comment", "contentMediaType", "contentEncoding"})
_TYPES: dict[str, Check] = {  # exact where True; bool is neither integer nor number in JSON Schema
    "string": lambda v: type(v) is str,
    "integer": lambda v: type(v) is int,  # 1.0 is an integer to jsonschema too: left to it
    "number": lambda v: type(v) is int or type(v) is float,
    "boolean": lambda v: type(v) is bool,
    "null": lambda v: v is None,
    "object": lambda v: type(v) is dict,
    "array": lambda v: type(v) is list,
}
_ATOMS = (str, int, float, bool, type(None))


class Unsupported(Exception):
    """The schema uses something this module does not model: jsonschema alone checks that tool."""


def compile_check(schema: Any) -> Check | None:
    """A check for `schema` (see the module docstring), or None when only jsonschema can check it."""
    if not isinstance(schema, dict) or "$schema" in schema:
        return None
    try:
        return _compile(schema)
    except Unsupported:
        return None


def _compile(schema: Any) -> Check:
    if schema is True or schema == {}:
        return lambda v: True
    if not isinstance(schema, dict):
        raise Unsupported(repr(schema))
    checks: list[Check] = []
    for key, value in schema.items():
        if key in _ANNOTATIONS:
            continue
        make = _KEYWORDS.get(key)
        if make is None:
            raise Unsupported(key)
        checks.append(make(value, schema))
    if len(checks) == 1:
        return checks[0]
    return lambda v: all(c(v) for c in checks)


def _type(value: Any, _: dict) -> Check:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(n in _TYPES for n in names):
        raise Unsupported(f"type {value!r}")
    tests = [_TYPES[n] for n in names]
    return tests[0] if len(tests) == 1 else lambda v: any(t(v) for t in tests)


def _properties(value: Any, _: dict) -> Check:
    if not isinstance(value, dict):
        raise Unsupported("properties")
    props = {name: _compile(sub) for name, sub in value.items()}

    def check(v: Any) -> bool:
        if type(v) is not dict:
            return True  # the keyword applies to objects only
        for name, item in v.items():
            sub = props.get(name)
            if sub is not None and not sub(item):
                return False
        return True
    return check


def _required(value: Any, _: dict) -> Check:
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        raise Unsupported("required")
    names = tuple(value)
    return lambda v: type(v) is not dict or all(n in v for n in names)


def _additional(value: Any, schema: dict) -> Check:
    if "patternProperties" in schema:
        raise Unsupported("patternProperties")
    known = frozenset(schema.get("properties", {}))
    extra = _compile(value) if value is not False else None

    def check(v: Any) -> bool:
        if type(v) is not dict:
            return True
        for name, item in v.items():
            if name not in known and (extra is None or not extra(item)):
                return False
        return True
    return check


def _any_of(value: Any, _: dict) -> Check:
    if not isinstance(value, list) or not value:
        raise Unsupported("anyOf")
    options = [_compile(sub) for sub in value]
    return lambda v: any(o(v) for o in options)


def _enum(value: Any, _: dict) -> Check:
    if not isinstance(value, list) or not all(type(e) in _ATOMS for e in value):
        raise Unsupported("enum")
    allowed = [(type(e), e) for e in value]  # 1 == True == 1.0 in Python, not in JSON Schema: compare types too
    return lambda v: (type(v), v) in allowed


def _bound(compare: Callable[[Any, Any], bool]) -> Callable[[Any, dict], Check]:
    def make(value: Any, _: dict) -> Check:
        if type(value) not in (int, float):
            raise Unsupported("a bound that is not a number")
        return lambda v: not (type(v) is int or type(v) is float) or compare(v, value)
    return make


def _length(compare: Callable[[int, int], bool]) -> Callable[[Any, dict], Check]:
    def make(value: Any, _: dict) -> Check:
        if type(value) is not int:
            raise Unsupported("a length that is not an integer")
        return lambda v: type(v) is not str or compare(len(v), value)
    return make


def _pattern(value: Any, _: dict) -> Check:
    try:
        search = re.compile(value).search  # jsonschema runs `re.search(pattern, instance)`: the same engine
    except (TypeError, re.error):
        raise Unsupported("pattern") from None
    return lambda v: type(v) is not str or search(v) is not None


def _items(value: Any, _: dict) -> Check:
    if not isinstance(value, dict):
        raise Unsupported("items")  # a list of schemas (prefixItems) is another keyword in 2020-12
    item = _compile(value)
    return lambda v: type(v) is not list or all(item(x) for x in v)


_KEYWORDS: dict[str, Callable[[Any, dict], Check]] = {
    "type": _type,
    "properties": _properties,
    "required": _required,
    "additionalProperties": _additional,
    "anyOf": _any_of,
    "enum": _enum,
    "minimum": _bound(lambda v, b: v >= b),
    "maximum": _bound(lambda v, b: v <= b),
    "exclusiveMinimum": _bound(lambda v, b: v > b),
    "exclusiveMaximum": _bound(lambda v, b: v < b),
    "minLength": _length(lambda n, b: n >= b),
    "maxLength": _length(lambda n, b: n <= b),
    "pattern": _pattern,
    "items": _items,
}

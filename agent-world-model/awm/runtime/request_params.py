"""FastAPI's `request_params_to_args` with its per-field decisions taken once, for the direct dispatch path.

FastAPI re-derives, on every request and for every path or query parameter, what the field's
annotation implies (a parameter model? a sequence read with `getlist`? which aliases?): about
70 us for a route with four query parameters, while validating the four values costs 4 us.
`ParamReader` asks FastAPI's own helpers those questions when a route is compiled and keeps the
answers; per call it runs the same steps in the same order (pick the alias present, read the
value, an absent or empty-sequence value is Undefined, Undefined -> missing error or a deep copy
of the default, else `field.validate`), so values and error lists are FastAPI's.
Parameter models (`Annotated[Model, Query()]`) are not compiled: such a route's reader defers to
`request_params_to_args` itself. `tests/awm/test_request_params.py` compares both on every kind
of parameter; `tests/awm/test_dispatch.py` on every route of the bundled and excerpt scenarios.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi._compat import ModelField, field_annotation_is_sequence, get_missing_field_error
from fastapi.dependencies.utils import (
    _get_param_aliases,
    _get_param_model,
    _is_json_field,
    request_params_to_args,
)
from starlette.datastructures import ImmutableMultiDict

_ATOMIC = (type(None), bool, int, float, str, bytes)  # deepcopy returns these as they are


@dataclass(frozen=True)
class _Param:
    field: ModelField
    keys: tuple[str, ...]  # request keys in FastAPI's order of preference
    where: str  # "path" or "query": the first item of an error's loc
    sequence: bool  # a sequence annotation: an empty value counts as absent
    multi: bool  # read every value of the key (a sequence that is not Json[...])
    required: bool
    default: Any  # static default (None when `dynamic_default`)
    dynamic_default: bool  # a default_factory, or a default deepcopy would copy
    validate_default: bool


class ParamReader:
    """Path or query parameters of one route: `read(received)` == `request_params_to_args(fields, received)`."""

    def __init__(self, fields: Sequence[ModelField]) -> None:
        self.fields = list(fields)
        self.params: list[_Param] | None = []
        for field in self.fields:
            if _get_param_model(field) is not None:
                self.params = None  # a parameter model: FastAPI's own function reads it
                break
            info = field.field_info
            sequence = field_annotation_is_sequence(info.annotation)
            required = info.is_required()
            static = not required and info.default_factory is None and type(info.default) in _ATOMIC
            self.params.append(_Param(field, tuple(key for _, key in _get_param_aliases(field)), info.in_.value,
                                      sequence, sequence and not _is_json_field(field), required,
                                      field.default if static else None, not required and not static,
                                      bool(info.validate_default)))

    def read(self, received: Mapping[str, Any]) -> tuple[dict[str, Any], list[Any]]:
        """Validated values by parameter name, and FastAPI's error dicts."""
        if self.params is None:
            return request_params_to_args(self.fields, received)
        values: dict[str, Any] = {}
        errors: list[Any] = []
        multidict = isinstance(received, ImmutableMultiDict)
        for p in self.params:
            key = p.keys[0]
            if len(p.keys) > 1:
                key = next((k for k in p.keys if k in received), key)
            value = received.getlist(key) if p.multi and multidict else received.get(key, None)
            loc = (p.where, key)
            if value is None or (p.sequence and len(value) == 0):
                if p.required:
                    errors.append(get_missing_field_error(loc=loc))
                    continue
                value = copy.deepcopy(p.field.default) if p.dynamic_default else p.default
                if not p.validate_default:
                    values[p.field.name] = value
                    continue
            value, field_errors = p.field.validate(value, values, loc=loc)
            if field_errors:
                errors.extend(field_errors)
            else:
                values[p.field.name] = value
        return values, errors

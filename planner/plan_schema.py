"""A JSON Schema (draft 2020-12) for plan.toml, generated from the plan's attrs classes.

Generated, never hand-kept: every field, type, Literal choice and default comes from planner.plan, so the
schema cannot drift from what plan_from_toml accepts. TOML editors (taplo, Even Better TOML) read it through
the `#:schema` comment at the top of written plans and then validate and complete keys.
"""

from __future__ import annotations

import types
import typing
from typing import Any

import attrs

from rlplan.planner.plan import Plan

DRAFT = "https://json-schema.org/draft/2020-12/schema"
# The file name written plans point at (relative to the plan); `rlplan schema -o` writes it.
SCHEMA_FILE_NAME = "plan.schema.json"

_SCALARS: dict[Any, str] = {bool: "boolean", int: "integer", float: "number", str: "string"}


def _type_schema(hint: Any) -> dict[str, Any]:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        present = [arg for arg in args if arg is not type(None)]
        inner = _type_schema(present[0]) if len(present) == 1 else {"anyOf": [_type_schema(a) for a in present]}
        return {"anyOf": [inner, {"type": "null"}]} if type(None) in args else inner
    if origin is typing.Literal:
        kinds = sorted({_SCALARS[type(arg)] for arg in args})
        return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": list(args)}
    if origin is tuple:
        return {"type": "array", "items": _type_schema(args[0])}
    if origin is dict:
        return {"type": "object", "additionalProperties": _type_schema(args[1])}
    if attrs.has(hint):
        return _class_schema(hint)
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    raise TypeError(f"no JSON Schema for plan field type {hint!r}")


def _class_schema(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for attribute in attrs.fields(cls):
        schema = _type_schema(hints[attribute.name])
        default = attribute.default
        if default is attrs.NOTHING:
            required.append(attribute.name)
        elif isinstance(default, bool | int | float | str):
            schema["default"] = default
        elif isinstance(default, tuple) and all(isinstance(item, str) for item in default):
            schema["default"] = list(default)
        properties[attribute.name] = schema
    schema = {"type": "object", "properties": properties, "additionalProperties": False}
    if cls.__doc__:
        schema["description"] = " ".join(cls.__doc__.split())
    if required:
        schema["required"] = required
    return schema


def plan_json_schema() -> dict[str, Any]:
    """The schema of a plan.toml document (as TOML parses it to a JSON-like table)."""
    return {"$schema": DRAFT, "title": "rlplan plan.toml", **_class_schema(Plan)}

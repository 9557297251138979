"""Plan <-> TOML text and plain dicts, with errors that name the field.

Pure functions on strings and dicts; only the CLI touches files.  Unknown keys
are an error naming the key and the nearest valid one; wrong types name the
field and the type expected.
"""

from __future__ import annotations

import functools
import math
import tomllib
import types
import typing
from typing import Any

import attr
import attrs
import tomli_w

from rlplan.planner.errors import PlanError, did_you_mean
from rlplan.planner.megatron_overrides import lift_megatron_overrides, lift_mtp
from rlplan.planner.plan import Plan
from rlplan.planner.plan_schema import SCHEMA_FILE_NAME


def _strict_bool(value: Any, _type: type) -> bool:
    if isinstance(value, bool):
        return value
    raise TypeError(f"expected true or false, got {value!r}")


# TOML's own integer range; a float such as 1e308 is no integer a plan can mean.
_INT_LIMIT = 2**63


def _strict_int(value: Any, _type: type) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer() and abs(value) < _INT_LIMIT:
            return int(value)
        raise TypeError(f"expected an integer, got {value!r}")
    if abs(value) >= _INT_LIMIT:
        raise TypeError(f"expected an integer below 2**63, got {value!r}")
    return value


def _strict_float(value: Any, _type: type) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {value!r}")
    if not math.isfinite(value):
        raise TypeError(f"expected a finite number, got {value!r}")
    return float(value)


def _strict_str(value: Any, _type: type) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


@functools.cache
def _converter() -> Any:
    """Built on first read: `rlplan solve` only writes plans, and cattrs costs a start-up to import."""
    import cattrs

    converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    converter.register_structure_hook(bool, _strict_bool)
    converter.register_structure_hook(int, _strict_int)
    converter.register_structure_hook(float, _strict_float)
    converter.register_structure_hook(str, _strict_str)
    return converter


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_drop_none(v) for v in value]
    return value


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """Plain data, None-valued keys dropped (TOML has no null; absent means default).

    attrs.asdict rather than cattrs' unstructure: cattrs generates and compiles a function per
    class on first use, a tenth of a second of every `rlplan solve` process for nothing.
    """
    data = _drop_none(attr.asdict(plan, recurse=True, retain_collection_types=False))
    arch = data.get("model", {}).get("arch", {})
    for field in attrs.fields(type(plan.model.arch)):
        if field.metadata.get("written_when_set") and arch.get(field.name) == field.default:
            del arch[field.name]
    return data


def plan_to_toml(plan: Plan) -> str:
    # taplo / Even Better TOML read the first-line `#:schema` directive, relative to this file.
    header = (
        f"#:schema ./{SCHEMA_FILE_NAME}\n"
        f"# (write it beside this plan with `rlplan schema -o {SCHEMA_FILE_NAME}` for key completion and checks)\n"
        "# rlplan plan: a declarative RL fine-tuning launch plan.\n"
        "# Check it: `rlplan validate plan.toml`; see where memory goes: `rlplan explain plan.toml`.\n"
    )
    return header + tomli_w.dumps(plan_to_dict(plan))


@functools.cache
def _field_types(cls: Any) -> dict[str, Any]:
    """A section class's field types, evaluated once per class: attrs.resolve_types stores them on its fields, where
    cattrs reads them too (the annotations are strings under `from __future__ import annotations`)."""
    return {f.name: f.type for f in attrs.fields(attrs.resolve_types(cls))}


def _class_at(path: list[str]) -> type | None:
    """The attrs class a dotted path of the plan leads to, for suggesting valid keys."""
    cls: Any = Plan
    for part in path:
        if not attrs.has(cls):
            return None
        fields = {f.name: f for f in attrs.fields(cls)}
        if part not in fields:
            return None
        cls = _unwrap_optional(_field_types(cls)[part])
    return cls if attrs.has(cls) else None


def _unwrap_optional(hint: Any) -> Any:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def _dotted_prefix(path: list[str]) -> str:
    """How a key under `path` is written: `actor.` for a key of the actor section."""
    return "".join(f"{part}." for part in path)


def _first_error(exc: BaseException, path: list[str]) -> PlanError:
    """Walk cattrs' exception groups to the first leaf and name its dotted field."""
    from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError, IterableValidationError

    if isinstance(exc, PlanError):
        return exc
    if isinstance(exc, ForbiddenExtraKeysError):
        cls = _class_at(path)
        valid = sorted(f.name for f in attrs.fields(cls)) if cls else []
        key = sorted(exc.extra_fields)[0]
        where = ".".join([*path, key])
        hint = did_you_mean(key, valid, prefix=_dotted_prefix(path))
        return PlanError(field=where, message=f"unknown key `{key}`.", fix=f"remove it or rename it; {hint}")
    if isinstance(exc, ClassValidationError | IterableValidationError):
        for sub in exc.exceptions:
            note = next(iter(getattr(sub, "__notes__", [])), "")
            child = path
            name = getattr(note, "name", None)
            if name is not None:
                child = [*path, str(name)]
            elif isinstance(note, str) and "attribute" in note:
                child = [*path, note.split("attribute")[-1].strip().split()[0].strip("'`")]
            return _first_error(sub, child)
    if isinstance(exc, KeyError):
        missing = str(exc.args[0]) if exc.args else "?"
        return PlanError(
            field=".".join([*path, missing]) if path and path[-1] != missing else ".".join(path) or missing,
            message="is required but missing.",
            fix="add it to the plan, or re-create the plan with `rlplan solve`",
        )
    where = ".".join(path) or "plan"
    detail = str(exc) or type(exc).__name__
    allowed = _allowed_values(path)
    if allowed:
        given = detail.split(" not in literal", 1)[0] if " not in literal" in detail else None
        shown = f" {given}" if given else ""
        return PlanError(field=where, message=f"is{shown}, which is not one of its allowed values ({allowed}).",
                         fix=f"set {where} to {allowed}")
    if isinstance(exc, ValueError) and "is not in" in detail:
        return PlanError(field=where, message=f"has a value that is not allowed ({detail}).",
                         fix="use one of the listed values")
    return PlanError(field=where, message=f"has the wrong type or value: {detail}.", fix=f"correct {where}")


def _allowed_values(path: list[str]) -> str:
    """A fixed-choice field's values in plain words, as TOML writes them (`1 or 2`, `"fsdp" or "fsdp2"`);
    empty when the field at `path` is not a choice."""
    cls = _class_at(path[:-1]) if path else None
    if cls is None:
        return ""
    hint = _unwrap_optional(_field_types(cls).get(path[-1]))
    if typing.get_origin(hint) is not typing.Literal:
        return ""
    values = [f'"{value}"' if isinstance(value, str) else str(value).lower() for value in typing.get_args(hint)]
    return values[0] if len(values) == 1 else f"{', '.join(values[:-1])} or {values[-1]}"


def _check_keys(data: Any, cls: Any, path: list[str]) -> None:
    """Unknown keys first: a typo'd section name should not be reported as a missing one."""
    if not attrs.has(cls) or not isinstance(data, dict):
        return
    hints = _field_types(cls)
    valid = {f.name for f in attrs.fields(cls)}
    for key, value in data.items():
        if key in valid and attrs.has(_unwrap_optional(hints[key])) and not isinstance(value, dict):
            raise PlanError(field=".".join([*path, key]), message=f"is a section, not a value (got {value!r}).",
                            fix=f"write it as a [{'.'.join([*path, key])}] table, as `rlplan solve` does")
        if key not in valid:
            hint = did_you_mean(key, valid, prefix=_dotted_prefix(path))
            raise PlanError(
                field=".".join([*path, key]), message=f"unknown key `{key}`.", fix=f"remove or rename it; {hint}"
            )
        _check_keys(value, _unwrap_optional(hints[key]), [*path, key])


def plan_from_dict(data: dict[str, Any]) -> Plan:
    if not isinstance(data, dict):
        raise PlanError(field="plan", message="is not a table of sections.", fix="start from `rlplan solve ... -o plan.toml`")
    _check_keys(data, Plan, [])
    try:
        plan = _converter().structure(data, Plan)
    except PlanError:
        raise
    except Exception as exc:  # cattrs wraps every leaf failure; translate the first one.
        raise _first_error(exc, []) from None
    # A plan written before the uneven pipeline and the CPU optimizer were typed holds them as passthrough.
    return lift_mtp(lift_megatron_overrides(plan))


def check_reads_back(plan: Plan, text: str, source: str) -> None:
    """Raise what `plan_from_toml(text, source)` would raise for `text`, which `plan_to_toml(plan)` wrote.

    A plan built in this process already passed its validators; reading its text back can only fail where the
    strict reader refuses a value the classes took (a pin such as 2.5 for an integer, an unknown key cannot
    occur). When the parsed text is the plan's own data and every value has exactly its field's type, the
    strict reader takes it and this returns without building cattrs' reader (a tenth of a second of every
    `rlplan solve` process); otherwise the strict reader runs and raises as it would."""
    try:
        data = tomllib.loads(text)
    except ValueError:
        data = None
    if data is not None and data == plan_to_dict(plan) and _strictly_typed(data, Plan):
        return
    plan_from_toml(text, source=source)


def _strictly_typed(value: Any, hint: Any) -> bool:
    """Whether the strict hooks above (and cattrs' for the containers, literals and sections) take `value` as
    `hint` without converting it; False for any type this does not know, which sends the caller to cattrs."""
    hint = _unwrap_optional(hint)
    if attrs.has(hint):
        if not isinstance(value, dict):
            return False
        types_ = _field_types(hint)
        return all(key in types_ and _strictly_typed(item, types_[key]) for key, item in value.items())
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool) and abs(value) < _INT_LIMIT
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if hint is str:
        return isinstance(value, str)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return any(type(value) is type(arg) and value == arg for arg in args)
    if origin in (tuple, list) and isinstance(value, list):
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            return len(args) == len(value) and all(map(_strictly_typed, value, args))
        return all(_strictly_typed(item, args[0]) for item in value)
    if origin is dict and isinstance(value, dict):
        return all(_strictly_typed(key, args[0]) and _strictly_typed(item, args[1]) for key, item in value.items())
    return False


def plan_from_toml(text: str, source: str = "plan.toml") -> Plan:
    try:
        data = tomllib.loads(text)
    except ValueError as exc:  # TOMLDecodeError, or an integer too long to convert
        raise PlanError(
            field=source,
            message=f"is not valid TOML ({exc}).",
            fix="fix the syntax at that line, or regenerate the file with `rlplan solve`",
        ) from None
    return plan_from_dict(data)

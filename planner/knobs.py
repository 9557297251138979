"""Pinning knobs by dotted key (`--fix actor.param_offload=true`), fast enough for the solver's inner loop.

`planfile.with_overrides` goes through plain data and back, which is right at the
edges; the solver pins knobs on thousands of candidate plans, so this walks the
frozen classes with attrs.evolve instead and lets their validators check values.
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

import attrs

from rlplan.planner.errors import PlanError
from rlplan.planner.plan import Plan


def _coerce(value: Any, hint: Any, dotted: str) -> Any:
    """`--fix` values arrive as TOML scalars: accept an int for a float, a list for a tuple."""
    origin = typing.get_origin(hint)
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    target = args[0] if origin in (typing.Union, types.UnionType) and len(args) == 1 else hint
    if target is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if typing.get_origin(target) is tuple and isinstance(value, list | tuple):
        return tuple(value)
    if target is bool and not isinstance(value, bool):
        raise PlanError(field=dotted, message=f"expects true or false, got {value!r}.", fix=f"pass {dotted}=true")
    if target is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise PlanError(field=dotted, message=f"expects an integer, got {value!r}.", fix=f"pass {dotted}=<integer>")
    return value


def set_knob(obj: Any, path: list[str], value: Any, dotted: str) -> Any:
    if not attrs.has(type(obj)):
        raise PlanError(field=dotted, message="goes below a plain value; only leaf keys can be pinned.", fix="pin a leaf key such as actor.param_offload or model.lora.rank")
    names = {f.name for f in attrs.fields(type(obj))}
    head = path[0]
    if head not in names:
        near = difflib.get_close_matches(head, sorted(names), n=1, cutoff=0.5)
        prefix = dotted[: len(dotted) - len(".".join(path))]
        hint = f"did you mean `{prefix}{near[0]}`?" if near else f"valid keys here: {', '.join(sorted(names))}"
        raise PlanError(field=dotted, message="is not a plan key.", fix=hint)
    if len(path) == 1:
        if attrs.has(type(getattr(obj, head))):
            raise PlanError(field=dotted, message="is a section, not a knob; only leaf keys can be pinned.",
                            fix=f"pin a key inside it, e.g. {dotted}.{attrs.fields(type(getattr(obj, head)))[0].name}")
        hint = typing.get_type_hints(type(obj))[head]
        return attrs.evolve(obj, **{head: _coerce(value, hint, dotted)})
    return attrs.evolve(obj, **{head: set_knob(getattr(obj, head), path[1:], value, dotted)})


def apply_knobs(plan: Plan, knobs: dict[str, Any]) -> Plan:
    for dotted, value in knobs.items():
        plan = set_knob(plan, dotted.split("."), value, dotted)
    return plan

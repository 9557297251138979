"""Setting plan knobs by dotted key (`--fix actor.param_offload=true`, a rule's suggested fix, a test's
overrides): the one setter, fast enough for the solver's inner loop.

The solver pins knobs on thousands of candidate plans, so this walks the frozen classes with
attrs.evolve (rather than through plain data and back) and lets their validators check values.
"""

from __future__ import annotations

import math
import types
import typing
from typing import Any

import attrs

from rlplan.planner.errors import PlanError, did_you_mean
from rlplan.planner.plan import Plan


def _coerce(value: Any, hint: Any, dotted: str) -> Any:
    """A pinned value as the field's type (an int for a float, a list for a tuple), or a PlanError naming the key.

    attrs does not check types or Literal choices, so this is where a pin of the wrong type
    stops, before the solver writes a plan that `validate` would reject.
    """
    origin = typing.get_origin(hint)
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if value is None and type(None) in typing.get_args(hint):
        return None
    target = args[0] if origin in (typing.Union, types.UnionType) and len(args) == 1 else hint
    if typing.get_origin(target) is typing.Literal:
        choices = typing.get_args(target)
        if value not in choices or isinstance(value, bool) != isinstance(choices[0], bool):
            raise PlanError(field=dotted, message=f"must be one of {', '.join(map(repr, choices))}, got {value!r}.",
                            fix=f"pass {dotted}={choices[0]!r}".replace("'", ""))
        return value
    if target is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise PlanError(field=dotted, message=f"expects a number, got {value!r}.", fix=f"pass {dotted}=<number>")
        if not math.isfinite(value):
            raise PlanError(field=dotted, message=f"must be a finite number, got {value!r}.",
                            fix=f"pass {dotted}=<finite number>")
        return float(value)
    if typing.get_origin(target) is tuple and isinstance(value, list | tuple):
        return tuple(value)
    if target is bool and not isinstance(value, bool):
        raise PlanError(field=dotted, message=f"expects true or false, got {value!r}.", fix=f"pass {dotted}=true")
    if target is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise PlanError(field=dotted, message=f"expects an integer, got {value!r}.", fix=f"pass {dotted}=<integer>")
    if target is str and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)  # a name that reads as a number (experiment_name=7) is the text the user wrote
    if target is str and not isinstance(value, str):
        raise PlanError(field=dotted, message=f"expects a string, got {value!r}.", fix=f'pass {dotted}="<text>"')
    return value


def parse_pin(key: str, raw: str) -> tuple[str, Any]:
    """One `--fix key=value` as (plan key, value), in verl's habits as well as rlplan's.

    The value is read with Hydra's syntax (`True`, `false`, `null`, quoted strings), as every
    verl script writes it; a verl key (`actor_rollout_ref.actor.fsdp_config.param_offload`) is
    mapped to its plan field through the importer's key table and typed by it.
    """
    from rlplan.planner.verl_keys import BY_KEY, KEY_ALIASES, Interpolation, coerce, parse_value

    value = parse_value(raw)
    if isinstance(value, Interpolation):
        raise PlanError(field=key, message=f"is pinned to an interpolation {raw!r}, which only Hydra resolves.",
                        fix=f"pass the value itself, e.g. {key}=true")
    entry = BY_KEY.get(KEY_ALIASES.get(key, key))
    if entry is None:
        return key, value
    return entry.field, coerce(entry, value, raw)


_FIELD_HINTS: dict[type, dict[str, Any]] = {}


def _field_hints(section_class: type) -> dict[str, Any]:
    """A plan section's resolved field types (resolving them evaluates every annotation: the solver pins each
    candidate, so once per class; attrs.resolve_types keeps them on the fields, where planfile and cattrs read
    them too)."""
    if section_class not in _FIELD_HINTS:
        _FIELD_HINTS[section_class] = {f.name: f.type for f in attrs.fields(attrs.resolve_types(section_class))}
    return _FIELD_HINTS[section_class]


def set_knob(obj: Any, path: list[str], value: Any, dotted: str) -> Any:
    if not attrs.has(type(obj)):
        raise PlanError(field=dotted, message="goes below a plain value; only leaf keys can be pinned.", fix="pin a leaf key such as actor.param_offload or model.lora.rank")
    names = {f.name for f in attrs.fields(type(obj))}
    head = path[0]
    if head not in names:
        prefix = dotted[: len(dotted) - len(".".join(path))]
        raise PlanError(field=dotted, message="is not a plan key.", fix=did_you_mean(head, names, prefix=prefix))
    if len(path) == 1:
        if attrs.has(type(getattr(obj, head))):
            raise PlanError(field=dotted, message="is a section, not a knob; only leaf keys can be pinned.",
                            fix=f"pin a key inside it, e.g. {dotted}.{attrs.fields(type(getattr(obj, head)))[0].name}")
        hint = _field_hints(type(obj))[head]
        return attrs.evolve(obj, **{head: _coerce(value, hint, dotted)})
    section = getattr(obj, head)
    if section is None:
        # An optional section the plan leaves unset (actor.megatron): a pin inside it starts from its defaults.
        hint = _field_hints(type(obj))[head]
        section_class = next((arg for arg in typing.get_args(hint) if attrs.has(arg)), None)
        if section_class is not None:
            section = section_class()
    return attrs.evolve(obj, **{head: set_knob(section, path[1:], value, dotted)})


def knob_value(plan: Plan, dotted: str) -> Any:
    """The plan's value at a dotted key (`rollout.max_num_seqs`), read as apply_knobs would set it."""
    value: Any = plan
    for name in dotted.split("."):
        if value is None:  # inside an optional section the plan leaves unset
            return None
        value = getattr(value, name)
    return value


def evolve_fields(plan: Plan, values: dict[str, Any]) -> Plan:
    """The plan with `section.field` keys set to values the planner computed itself (the solver's inner loop):
    no coercion or key lookup, one attrs.evolve per section, whose validators still run."""
    by_section: dict[str, dict[str, Any]] = {}
    for dotted, value in values.items():
        section, name = dotted.split(".")
        by_section.setdefault(section, {})[name] = value
    return plan.evolve(**{section: attrs.evolve(getattr(plan, section), **fields)
                          for section, fields in by_section.items()})


def apply_knobs(plan: Plan, knobs: dict[str, Any]) -> Plan:
    for dotted, value in knobs.items():
        plan = set_knob(plan, dotted.split("."), value, dotted)
    return plan


def with_expected_lengths(plan: Plan, prompt: int | None, response: int | None, profile: Any = None) -> Plan:
    """The plan with the --expected-prompt-len / --expected-response-len flags applied (None: keep the plan's),
    as knobs: validate, explain and import verl take these flags; the commands call this, never re-derive it.

    Where neither the flag nor the plan states a mean, a profile fitted from a run (`calibrate --from-run`)
    supplies the mean that run saw, capped at the plan's maximum (the run may have had longer limits).
    """
    data = plan.data
    observed = {"prompt": (profile.observed_prompt_length, data.expected_prompt_length, data.max_prompt_length),
                "response": (profile.observed_response_length, data.expected_response_length,
                             data.max_response_length)} if profile is not None else {}
    overrides: dict[str, Any] = {}
    for name, flag in (("prompt", prompt), ("response", response)):
        seen, stated, maximum = observed.get(name, (0, None, 0))
        if flag is not None:
            overrides[f"data.expected_{name}_length"] = flag
        elif stated is None and seen:
            overrides[f"data.expected_{name}_length"] = min(seen, maximum)
    return apply_knobs(plan, overrides) if overrides else plan

"""attrs validators that raise the one error a user sees: a PlanError naming the field and the fix.

Every value class validates itself at construction (plan sections, architectures, GPUs, profiles,
calibration records, measured steps); each states only its test and its words here, so the error's
shape (`<prefix>.<attribute>`, a message with the value, a fix) is written once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs

from rlplan.planner.errors import PlanError

Validator = Callable[[Any, "attrs.Attribute[Any]", Any], None]


def field_check(prefix: str, ok: Callable[[Any], bool], message: str, fix: str) -> Validator:
    """An attrs validator: unless `ok(value)`, a PlanError for the field `<prefix>.<attribute>`.

    `message` and `fix` are str.format templates over {field} (the dotted name), {name} (the
    attribute) and {value}.
    """

    def check(instance: object, attribute: attrs.Attribute, value: Any) -> None:
        if not ok(value):
            field = f"{prefix}.{attribute.name}"
            words = {"field": field, "name": attribute.name, "value": value}
            raise PlanError(field=field, message=message.format(**words), fix=fix.format(**words))

    return check


def at_least(minimum: float, prefix: str) -> Validator:
    """A finite number >= minimum, or None (an unset optional knob)."""
    return field_check(
        # An int is finite however large (math.isfinite cannot take one past float's range).
        prefix, lambda value: value is None or ((isinstance(value, int) or math.isfinite(value)) and value >= minimum),
        f"must be >= {minimum}, got {{value}}.", f"set {{field}} to a value >= {minimum}",
    )

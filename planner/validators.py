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

from rlplan.planner.errors import PlanError, shorten

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


# The largest number any plan knob takes: counts (prompts, samples, batches, sequences, steps, ranks), lengths and
# token budgets in tokens (16.7M: above any model's context), megabytes, rates. A plan past it is a typo or an
# attack, and products of such numbers (prompts x samples, a percentile 1 - 1/count) stop being representable.
MAX_PLAN_NUMBER = 2**24


def _number_in(value: Any, minimum: float, maximum: float) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    # An int is compared as an int: math.isfinite cannot take one past float's range (OverflowError).
    return (isinstance(value, int) or math.isfinite(value)) and minimum <= value <= maximum


def _shown(value: Any) -> str:
    """A value for an error message, cut short; an int too long for str() (4,300+ digits) by its length."""
    if isinstance(value, int) and value.bit_length() > 10_000:
        return f"a number of about {int(value.bit_length() * 0.30103):,} digits"
    return shorten(str(value))


def at_least(minimum: float, prefix: str, maximum: float = MAX_PLAN_NUMBER) -> Validator:
    """A finite number in [minimum, maximum] (MAX_PLAN_NUMBER unless given), or None (an unset optional knob)."""

    def check(instance: object, attribute: attrs.Attribute, value: Any) -> None:
        # An int in range first: every plan the solver builds runs thousands of these (bool is no int here).
        if value is None or (type(value) is int and minimum <= value <= maximum) or _number_in(value, minimum,
                                                                                              maximum):
            return
        field = f"{prefix}.{attribute.name}"
        shown = _shown(value)
        if _number_in(value, minimum, math.inf):
            raise PlanError(field=field, message=f"must be at most {maximum:,}, got {shown}.",
                            fix=f"set {field} to a value between {minimum} and {maximum:,}")
        raise PlanError(field=field, message=f"must be >= {minimum}, got {shown}.",
                        fix=f"set {field} to a value >= {minimum}")

    return check

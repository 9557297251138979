"""A search space's choice and the plan knobs it sets, said once, on the choice's own fields.

Each field of a choice (`fsdp.TrainingChoice`, `megatron.MegatronChoice`) is declared with `knob(dotted key)`:
the plan field it sets. What the solver shows of a candidate (`solve --top`, the frontier: `space.searched_knobs`)
and which choices a `--fix` pin allows are read from those declarations, never from a list kept beside them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import attrs

KNOB = "rlplan.knob"
PINNED_AS = "rlplan.pinned_as"


def knob(key: str, *, pinned_as: Callable[[Any], Any] | None = None, **kwargs: Any) -> Any:
    """A choice's field that sets the plan knob `key` (dotted, as `--fix` spells it).

    pinned_as: the field's value a pinned plan value stands for, where the two differ (Megatron's recompute
    is a bool on the choice and `recompute_granularity = "full"` in the plan); by default the value itself."""
    return attrs.field(metadata={KNOB: key, PINNED_AS: pinned_as}, **kwargs)


def knob_fields(choice_type: type) -> Iterator[attrs.Attribute]:
    """The fields of a choice class that set a plan knob, in declaration order."""
    return (f for f in attrs.fields(choice_type) if KNOB in f.metadata)


def knob_keys(choice_type: type) -> tuple[str, ...]:
    """The dotted plan keys a choice class sets, in its fields' order."""
    return tuple(f.metadata[KNOB] for f in knob_fields(choice_type))


def pinned_value(attribute: attrs.Attribute, pin: Any) -> Any:
    """The value of the choice's field that a pin of its plan knob asks for."""
    convert = attribute.metadata[PINNED_AS]
    return pin if convert is None else convert(pin)


def pins_allow(choice: Any, pins: dict[str, Any]) -> bool:
    """Whether every pin of a knob the choice sets asks for the choice's own value."""
    return all(getattr(choice, f.name) == pinned_value(f, pins[f.metadata[KNOB]])
               for f in knob_fields(type(choice)) if f.metadata[KNOB] in pins)

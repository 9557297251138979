"""The planner's one bisection: the last value a monotone test holds for.

The solver's token budgets and rollout utilization, and memory's longest expected response, each search a knob
whose memory only grows with it, so the test "fits at this value" holds up to a point and fails past it.
"""

from __future__ import annotations

from collections.abc import Callable


def last_holding(low: int, high: int, holds: Callable[[int], bool], step: int = 1) -> int:
    """The largest of low, low + step, low + 2 step, ... below `high` for which `holds`, given that it holds at
    `low`, not at `high`, and, between them, up to a point only. Calls `holds` about log2((high - low) / step)
    times; never at `low` or `high`."""
    while high - low > step:
        middle = low + (high - low) // 2 // step * step
        if middle <= low:  # less than two steps apart: no lattice value between them
            break
        if holds(middle):
            low = middle
        else:
            high = middle
    return low

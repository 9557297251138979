"""The planner's one bisection (planner/monotone.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rlplan.planner.monotone import last_holding


@given(low=st.integers(-1000, 1000), span=st.integers(1, 5000), step=st.integers(1, 300), data=st.data())
def test_the_result_is_the_last_lattice_value_below_high_that_holds(low, span, step, data):
    """Invariant: for a test that holds up to a threshold (at low, not at high), the result is the largest
    low + k * step that is below high and at most the threshold, and the test is never asked at low or high."""
    high = low + span
    threshold = data.draw(st.integers(low, high - 1))
    asked = []

    def holds(value: int) -> bool:
        asked.append(value)
        return value <= threshold

    found = last_holding(low, high, holds, step)
    lattice = [value for value in range(low, high, step) if value <= threshold]
    # A lattice value with no lattice value between it and high is never tried: the search stops two steps short.
    assert found <= lattice[-1] and (found == lattice[-1] or high - found < 2 * step)
    assert all(low < value < high for value in asked)


def test_with_step_one_it_finds_the_threshold_exactly():
    assert last_holding(1, 1000, lambda value: value <= 618) == 618
    assert last_holding(1, 2, lambda value: False) == 1

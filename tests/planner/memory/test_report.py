"""The memory report's value classes (planner/memory/report.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rlplan.planner.memory.report import TrainerState

_SHARES = st.sampled_from([False, True, 0.0, 0.25, 1.0])


@given(params=_SHARES, grads=_SHARES, optimizer=_SHARES, ranks=st.integers(1, 16))
def test_host_copies_hold_each_offloaded_share_of_every_rank_and_nothing_that_stays_on_the_gpu(
        params, grads, optimizer, ranks):
    """Invariant: one component per part with a non-zero share, of ranks x share x that part's bytes."""
    state = TrainerState(params=1000.0, grads=2000.0, optimizer=6000.0, optimizer_step=0.0, reduce_scatter=0.0)
    host = {c.name: c.bytes for c in state.host_copies("actor", ranks, params=params, grads=grads,
                                                           optimizer=optimizer)}
    expected = {f"actor_{part}_offloaded": int(ranks * share * size)
                for part, share, size in (("params", params, 1000.0), ("grads", grads, 2000.0),
                                          ("optimizer", optimizer, 6000.0)) if share}
    assert host == expected

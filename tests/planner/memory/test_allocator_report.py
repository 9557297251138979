"""Each phase's allocated, reserved and resident figures (planner/memory/allocator_report.py)."""

from __future__ import annotations

import attrs
import pytest

from rlplan.planner.commands.this_machine import cpu_cluster
from rlplan.planner.knobs import apply_knobs
from rlplan.planner.memory import GIB, predict_memory
from rlplan.planner.memory.allocator_report import FIGURES, allocator_report, engine_in_trainer_process
from rlplan.planner.phases import Phase
from rlplan.planner.profile import DEFAULT_PROFILE
from rlplan.planner.stack import StackSection
from tests.planner.plans import make_plan


def _on(verl: str):
    plan = apply_knobs(make_plan(), {"actor.use_dynamic_bsz": True, "actor.ppo_max_token_len_per_gpu": 12000,
                                     "data.expected_response_length": 600})
    return plan.evolve(stack=StackSection(verl=verl))


def test_each_phase_reserves_what_it_allocates_and_resides_as_the_fit_says():
    plan = _on("0.9.1")
    report = predict_memory(plan)
    rows = allocator_report(plan)
    assert [r.phase for r in rows] == [p.name for p in report.phases]
    for row, phase in zip(rows, report.phases, strict=True):
        assert row.reserved >= row.allocated > 0
        assert row.resident == phase.peak_bytes
    assert set(FIGURES) == {"allocated", "reserved", "resident"}


def test_a_sleeping_in_process_pool_is_counted_by_torch_but_not_resident():
    plan = _on("0.5.0")
    assert engine_in_trainer_process(plan) and not engine_in_trainer_process(_on("0.9.1"))
    report = predict_memory(plan)
    # The sleeping pool, and the CUDA-graph pool the engine captured in torch's allocator beside it.
    pool = (report.rollout.weights_bytes + report.rollout.kv_cache_bytes
            + report.phase(Phase.ACTOR_UPDATE).bytes_of("cuda_graph_pool"))
    counted = {r.phase: r for r in allocator_report(plan, pool_counted_asleep=True)}
    apart = {r.phase: r for r in allocator_report(plan, engine_in_process=False)}
    update = Phase.ACTOR_UPDATE
    assert counted[update].allocated - apart[update].allocated == pytest.approx(pool, abs=1)
    assert counted[update].resident == apart[update].resident  # asleep, the pool holds no memory


def test_the_fitted_unlisted_cache_applies_only_in_the_regime_it_was_measured_in():
    """profile.allocator_cache_engine_workspaces: an engine in the trainer's process on fixed segments (verl < 0.6);
    nothing for verl >= 0.7 (the engine in its own process, the trainer on expandable segments)."""
    without = attrs.evolve(DEFAULT_PROFILE, allocator_cache_engine_workspaces=0.0)
    for verl, applies in (("0.5.0", True), ("0.9.1", False)):
        plan = _on(verl)
        workspace = predict_memory(plan).rollout.activation_bytes
        moved = [a.reserved - b.reserved for a, b in zip(allocator_report(plan), allocator_report(plan, without),
                                                          strict=True)]
        expected = DEFAULT_PROFILE.allocator_cache_engine_workspaces * workspace if applies else 0
        assert moved == [pytest.approx(expected, abs=GIB / 1000)] * len(moved)


def test_a_cpu_platform_has_no_caching_allocator_to_report():
    cluster, _ = cpu_cluster(2, 16.0)
    assert allocator_report(make_plan().evolve(cluster=cluster)) == ()

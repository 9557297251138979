"""The rollout's decode step (planner/steptime/rollout.py): where each TP all-reduce's cost lands."""

from __future__ import annotations

import attrs
import pytest

from rlplan.planner.memory.model_facts import model_facts
from rlplan.planner.profile import DEFAULT_PROFILE
from rlplan.planner.steptime.rates import Rates
from rlplan.planner.steptime.rollout import decode_step
from tests.planner.plans import make_plan


def _step(tp: int, eager: bool):
    plan = make_plan(overrides={"rollout.tensor_model_parallel_size": tp, "rollout.enforce_eager": eager})
    return plan, decode_step(plan, Rates(plan, DEFAULT_PROFILE), DEFAULT_PROFILE, hbm=3.35e12, flops=9.9e14,
                             concurrency=64)


def test_an_eager_engine_launches_its_tp_all_reduces_on_the_host_and_the_gpu_runs_them_at_graph_cost():
    """The fitted eager all-reduce latency is its launch from Python: host time, which overlaps the GPU's
    kernels; on the GPU each costs what a captured one does."""
    plan, step = _step(tp=2, eager=True)
    layers = model_facts(plan.model.arch).layers
    _, single = _step(tp=1, eager=True)
    launch = 2 * layers * DEFAULT_PROFILE.tp_allreduce_latency_us * 1e-6
    assert step.host_floor == pytest.approx(single.host_floor + launch)
    assert step.tp_seconds_fixed == pytest.approx(2 * layers * DEFAULT_PROFILE.tp_allreduce_graph_latency_us * 1e-6)


def test_a_graph_engine_has_no_launch_on_the_host_and_tp_1_no_all_reduce():
    _, graphs = _step(tp=2, eager=False)
    _, graphs_single = _step(tp=1, eager=False)
    assert graphs.host_floor == pytest.approx(graphs_single.host_floor)
    _, single = _step(tp=1, eager=True)
    assert single.tp_seconds_fixed == 0.0 and single.tp_seconds_per_sequence == 0.0


def test_a_slower_eager_launch_slows_only_the_host_side():
    plan, step = _step(tp=2, eager=True)
    slow = attrs.evolve(DEFAULT_PROFILE, tp_allreduce_latency_us=DEFAULT_PROFILE.tp_allreduce_latency_us * 2)
    slower = decode_step(plan, Rates(plan, slow), slow, hbm=3.35e12, flops=9.9e14, concurrency=64)
    assert slower.host_floor > step.host_floor
    assert slower.tp_seconds_fixed == step.tp_seconds_fixed

"""The runtime's platform (runtime/platform.py): knobs this machine cannot honour, and CPU threads per rank."""

from __future__ import annotations

import os

import attrs
import pytest

from rlplan.planner.errors import PlanError
from rlplan.runtime.platform import (
    Platform,
    available_cores,
    check_plan_runnable,
    cpu_threads_per_rank,
    unrunnable_knobs,
)
from tests.planner.plans import make_plan

CPU = Platform(device_type="cpu")
GPU = Platform(device_type="cuda", accelerator_count=8)


@pytest.mark.parametrize("field", ["actor.offload_policy", "critic.offload_policy"])
def test_cpu_offload_policy_is_refused_without_an_accelerator_naming_the_field(field):
    # FSDP2's CPUOffloadPolicy raises on a machine without an accelerator (runtime-facts.md).
    plan = make_plan(overrides={"algorithm.adv_estimator": "gae", "critic.ppo_micro_batch_size_per_gpu": 2,
                                "rollout.free_cache_engine": False, field: True})
    errors = unrunnable_knobs(plan, CPU)
    assert [e.field for e in errors] == [field] and errors[0].fix
    # On GPUs the trainer shards with CPUOffloadPolicy, as verl does for this key.
    assert field not in {e.field for e in unrunnable_knobs(plan, GPU)}


@pytest.mark.parametrize(("world_size", "cores", "threads"), [(1, 2, 2), (2, 2, 1), (4, 2, 1), (2, 16, 8), (3, 16, 5)])
def test_cpu_ranks_split_the_cores_and_never_get_zero_threads(world_size, cores, threads):
    assert cpu_threads_per_rank(world_size, cores) == threads


def test_available_cores_is_this_process_affinity():
    assert 1 <= available_cores() <= (os.cpu_count() or 1)


@pytest.mark.parametrize("platform", [GPU, CPU])
def test_sglang_plan_is_refused_naming_rollout_name_on_every_platform(platform):
    plan = make_plan()
    sglang = plan.evolve(rollout=attrs.evolve(plan.rollout, name="sglang"))
    with pytest.raises(PlanError) as error:
        check_plan_runnable(sglang, platform)
    assert error.value.field == "rollout.name" and "render" in error.value.fix
    assert "rollout.name" not in {e.field for e in unrunnable_knobs(plan, platform)}

"""The runtime's entry check refuses plans the bundled runtime cannot run (runtime/platform.py)."""

from __future__ import annotations

import attrs
import pytest

from rlplan.planner.errors import PlanError
from rlplan.runtime.platform import Platform, check_plan_runnable, unrunnable_knobs
from tests.planner.plans import make_plan


@pytest.mark.parametrize("platform", [Platform(device_type="cuda", accelerator_count=8), Platform(device_type="cpu")])
def test_sglang_plan_is_refused_naming_rollout_name_on_every_platform(platform):
    plan = make_plan()
    sglang = plan.evolve(rollout=attrs.evolve(plan.rollout, name="sglang"))
    with pytest.raises(PlanError) as error:
        check_plan_runnable(sglang, platform)
    assert error.value.field == "rollout.name" and "render" in error.value.fix
    assert "rollout.name" not in {e.field for e in unrunnable_knobs(plan, platform)}

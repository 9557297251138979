"""The step's composition (planner/steptime/step.py): phases summed, or with the rollout on a pool of its own,
generation overlapped with training."""

from __future__ import annotations

import attrs

from rlplan.planner.memory import predict_memory
from rlplan.planner.phases import Phase
from rlplan.planner.plan import RolloutPool
from rlplan.planner.steptime import StepTime, predict_step_time
from tests.planner.plans import make_plan


def test_an_overlapped_step_is_the_longer_of_generation_and_training_then_the_weight_sync():
    phases = {Phase.WEIGHT_SYNC: 2.0, Phase.ROLLOUT: 30.0, Phase.OLD_LOG_PROB: 5.0, Phase.ACTOR_UPDATE: 10.0,
              "adv": 1.0}
    assert StepTime(phases).total_seconds == 48.0
    assert StepTime(phases, overlapped=True).total_seconds == 30.0 + 2.0
    assert StepTime({**phases, Phase.ROLLOUT: 3.0}, overlapped=True).total_seconds == 16.0 + 2.0


def test_a_plan_with_a_rollout_pool_overlaps_its_step_and_a_colocated_one_does_not():
    plan = make_plan()
    colocated = predict_step_time(plan, predict_memory(plan))
    assert not colocated.overlapped
    apart = plan.evolve(rollout=attrs.evolve(plan.rollout, pool=RolloutPool(nodes=1, gpus_per_node=8)))
    step = predict_step_time(apart, predict_memory(apart))
    seconds = step.phase_seconds
    generation = seconds[Phase.ROLLOUT]
    training = sum(s for k, s in seconds.items() if k not in (Phase.ROLLOUT, Phase.WEIGHT_SYNC))
    assert step.overlapped and step.total_seconds == max(generation, training) + seconds[Phase.WEIGHT_SYNC]
    assert step.total_seconds < sum(seconds.values())

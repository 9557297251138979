"""The training-backend boundary of the step-time model: what a step's phases need priced by the trainer, and
which trainer a plan runs (as memory/backend.py is for the memory model).

The step (steptime.step) prices the rollout itself and asks the plan's trainer for its passes: a no_grad
forward (the old and the reference log-probs, the critic's values), an update, the trainer's side of the
weight sync (gathering full weights from its shards) and its between-phase offload traffic.  verl's FSDP and
FSDP2 workers are one backend (steptime.fsdp), Megatron's another (steptime.megatron).  A third is a module
beside them with a class that has these methods, and its strategy in TRAINER_TIMINGS below.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from rlplan.planner.layout import RoleBatchLayout
from rlplan.planner.plan import Plan
from rlplan.planner.steptime.fsdp import FSDP_TIMING
from rlplan.planner.steptime.megatron import MEGATRON_TIMING
from rlplan.planner.steptime.passes import StepContext


class TrainerTiming(Protocol):
    """The trainer of one plan, in seconds per step, as the step's phases price it."""

    def forward_seconds(self, ctx: StepContext, batch: RoleBatchLayout, *, critic: bool, entropy: bool) -> float:
        """A no_grad pass over `batch` (the critic's value model with `critic`; verl's entropy over the
        vocabulary with `entropy`)."""
        ...

    def update_seconds(self, ctx: StepContext, batch: RoleBatchLayout, *, critic: bool) -> float:
        """Every mini batch's forward, backward and optimizer step over `batch`, with its collectives."""
        ...

    def weight_sync_gather_seconds(self, ctx: StepContext) -> float:
        """The trainer's side of the weight sync: full weights (or the adapter) from its shards, once per step."""
        ...

    def offload_seconds(self, ctx: StepContext) -> float:
        """verl's between-phase loads and offloads of the trainer's state over PCIe, per step."""
        ...


# plan.actor.strategy -> its trainer timing (a rendered plan's critic runs the actor's strategy).
TRAINER_TIMINGS: Mapping[str, TrainerTiming] = {"fsdp": FSDP_TIMING, "fsdp2": FSDP_TIMING,
                                                "megatron": MEGATRON_TIMING}


def trainer_timing(plan: Plan) -> TrainerTiming:
    return TRAINER_TIMINGS[plan.actor.strategy]

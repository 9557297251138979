"""The training-backend boundary (planner/memory/backend.py) and the rollout engines' table (memory/rollout.py):
every strategy and engine a plan can name has its record, and the phases price the trainer only through it."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import attrs

from rlplan.planner.layout import PlanLayout, RoleBatchLayout
from rlplan.planner.memory import backend as backend_module
from rlplan.planner.memory import predict_memory
from rlplan.planner.memory.backend import TRAINING_BACKENDS, TrainedRole, training_backend
from rlplan.planner.memory.fsdp import FSDP, FsdpBackend
from rlplan.planner.memory.heads import LossHead
from rlplan.planner.memory.report import Component, TrainerState
from rlplan.planner.memory.rollout import ROLLOUT_ENGINES
from rlplan.planner.plan import ActorSection, Plan, RolloutEngine
from rlplan.planner.profile import Profile
from tests.planner.plans import make_plan

PHASES = Path(backend_module.__file__).with_name("phases.py")


def test_every_strategy_a_plan_can_name_has_a_training_backend():
    strategies = typing.get_args(typing.get_type_hints(ActorSection)["strategy"])
    assert set(strategies) == set(TRAINING_BACKENDS)
    assert training_backend(make_plan(overrides={"actor.strategy": "fsdp"})) is FSDP


def test_every_rollout_engine_a_plan_can_name_has_an_engine_record():
    assert set(typing.get_args(RolloutEngine)) == set(ROLLOUT_ENGINES)


def test_the_phases_never_import_a_backend_module():
    """Invariant: memory/phases.py reaches the trainer only through memory.backend, so a second backend is a module
    beside memory/fsdp.py, not a branch in the phases."""
    imported = [node.module for node in ast.walk(ast.parse(PHASES.read_text(encoding="utf-8")))
                if isinstance(node, ast.ImportFrom) and node.module]
    assert "rlplan.planner.memory.backend" in imported
    assert "rlplan.planner.memory.fsdp" not in imported


class _TwiceTheState(FsdpBackend):
    """A backend that reports twice FSDP's state, a fixed weight-sync gather and a fixed update peak."""

    def role_state(self, plan: Plan, role: TrainedRole, layout: PlanLayout) -> TrainerState:
        state = super().role_state(plan, role, layout)
        return attrs.evolve(state, params=2 * state.params, optimizer=2 * state.optimizer)

    def weight_sync_gather_bytes(self, plan: Plan, bucket_bytes: int) -> int:
        return 12345

    def update_components(self, plan: Plan, role: TrainedRole, state_on_gpu: TrainerState, batch: RoleBatchLayout,
                          head: LossHead | None, profile: Profile) -> tuple[str, list[Component]]:
        return "backward", [Component(f"{role}_params", int(state_on_gpu.params)), Component("backend_workspace", 7)]


def test_the_phases_price_what_the_plans_backend_reports(monkeypatch):
    plan = make_plan(overrides={"actor.strategy": "fsdp"})
    fsdp = predict_memory(plan)
    monkeypatch.setitem(TRAINING_BACKENDS, "fsdp", _TwiceTheState())
    twice = predict_memory(plan)
    sync, fsdp_sync = twice.phase("weight_sync"), fsdp.phase("weight_sync")
    assert sync.bytes_of("weight_sync_gather") == 12345 != fsdp_sync.bytes_of("weight_sync_gather")
    assert sync.bytes_of("actor_params") == 2 * fsdp_sync.bytes_of("actor_params")
    # The rollout holds the actor's resident optimizer state, as the backend reports it.
    assert (twice.phase("rollout").bytes_of("actor_optimizer_state")
            == 2 * fsdp.phase("rollout").bytes_of("actor_optimizer_state") > 0)
    update = twice.phase("actor_update")
    assert update.peak_at == "backward" and update.bytes_of("backend_workspace") == 7
    # The other strategy keeps FSDP's backend.
    assert predict_memory(plan.evolve(actor=attrs.evolve(plan.actor, strategy="fsdp2"))) == fsdp

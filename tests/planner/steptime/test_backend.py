"""The step-time model's training-backend boundary (planner/steptime/backend.py): every strategy a plan can name
has its trainer timing, and the step prices the trainer only through it."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

from rlplan.planner.plan import ActorSection
from rlplan.planner.steptime import backend as backend_module
from rlplan.planner.steptime.backend import TRAINER_TIMINGS, trainer_timing
from rlplan.planner.steptime.fsdp import FSDP_TIMING
from rlplan.planner.steptime.megatron import MEGATRON_TIMING
from tests.planner.plans import make_plan

STEP = Path(backend_module.__file__).with_name("step.py")


def test_every_strategy_a_plan_can_name_has_a_trainer_timing():
    strategies = typing.get_args(typing.get_type_hints(ActorSection)["strategy"])
    assert set(strategies) == set(TRAINER_TIMINGS)
    assert trainer_timing(make_plan(overrides={"actor.strategy": "fsdp"})) is FSDP_TIMING
    assert trainer_timing(make_plan(overrides={"actor.strategy": "megatron"})) is MEGATRON_TIMING


def test_the_step_never_imports_a_backend_module():
    """Invariant: steptime/step.py reaches the trainer only through steptime.backend, so a third backend is a
    module beside steptime/fsdp.py and steptime/megatron.py, not a branch in the step."""
    imported = [node.module for node in ast.walk(ast.parse(STEP.read_text(encoding="utf-8")))
                if isinstance(node, ast.ImportFrom) and node.module]
    assert not [module for module in imported
                if module.startswith(("rlplan.planner.steptime.fsdp", "rlplan.planner.steptime.megatron",
                                      "rlplan.planner.memory.fsdp", "rlplan.planner.memory.megatron"))]

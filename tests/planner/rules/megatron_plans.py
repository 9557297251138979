"""Megatron plans for the rules' tests, and what check_plan says of a plan."""

from __future__ import annotations

from rlplan.planner.knobs import apply_knobs
from rlplan.planner.presets import resolve_model
from rlplan.planner.rules import check_plan
from tests.planner.plans import make_plan

QWEN3_MOE = resolve_model("qwen3-30b-a3b").arch  # 48 layers, 32 heads, 4 KV heads, 128 experts
DEEPSEEK_V3 = resolve_model("deepseek-v3").arch
MEGATRON = {"actor.strategy": "megatron"}


def megatron_plan(arch=None, gpus: int = 8, **knobs):
    overrides = {**MEGATRON, **{key.replace("__", "."): value for key, value in knobs.items()}}
    return make_plan(arch, gpus=gpus, overrides=overrides) if arch else make_plan(gpus=gpus, overrides=overrides)


def rules_of(plan) -> set[str]:
    return {violation.rule for violation in check_plan(plan).violations}


def fixed(plan, rule: str):
    """The plan with the suggested changes of `rule`'s violations applied."""
    for violation in check_plan(plan).violations:
        if violation.rule == rule:
            plan = apply_knobs(plan, violation.suggested)
    return plan

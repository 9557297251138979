"""planner/rules/platform.py: what the bundled runtime cannot run on a machine (the planner-side half; the runtime's
detection of the machine is tests/runtime/test_platform.py)."""

from __future__ import annotations

from rlplan.planner.platform import Platform
from rlplan.planner.rules import check_plan
from tests.planner.plans import make_plan


def test_the_bundled_runtime_refuses_an_estimator_only_verl_computes_and_verl_rules_accept_it():
    plan = make_plan(overrides={"algorithm.adv_estimator": "remax", "rollout.n": 1})
    assert "runtime_computes_the_estimator" not in {v.rule for v in check_plan(plan).violations}
    platform_errors = {v.rule for v in check_plan(plan, Platform(device_type="cpu")).errors}
    assert "runtime_computes_the_estimator" in platform_errors
    grpo = {v.rule for v in check_plan(make_plan(), Platform(device_type="cpu")).errors}
    assert "runtime_computes_the_estimator" not in grpo


def test_the_bundled_runtime_refuses_a_rollout_on_a_pool_of_its_own_and_verl_rules_accept_it():
    import attrs

    from rlplan.planner.plan import RolloutPool

    plan = make_plan()
    apart = plan.evolve(rollout=attrs.evolve(plan.rollout, pool=RolloutPool(nodes=1, gpus_per_node=2)))
    gpu = Platform(device_type="cuda", accelerator_count=8)
    assert "runtime_colocates_the_rollout" not in {v.rule for v in check_plan(apart).violations}
    assert "runtime_colocates_the_rollout" in {v.rule for v in check_plan(apart, gpu).errors}
    assert "runtime_colocates_the_rollout" not in {v.rule for v in check_plan(plan, gpu).errors}


def test_the_bundled_runtime_refuses_a_recipe_plan_whose_trainer_only_verl_has():
    from rlplan.planner.plan import AlgorithmSection

    plan = make_plan().evolve(algorithm=AlgorithmSection(recipe="spin"))
    assert "runtime_computes_the_estimator" not in {v.rule for v in check_plan(plan).violations}
    (error,) = [v for v in check_plan(plan, Platform(device_type="cpu")).errors
                if v.rule == "runtime_computes_the_estimator"]
    assert "spin recipe" in error.message


def test_the_bundled_runtime_refuses_a_trtllm_rollout_and_verl_rules_accept_it():
    """rlplan's runtime drives vLLM only; a TensorRT-LLM plan is for verl (render --target verl)."""
    plan = make_plan(overrides={"rollout.name": "trtllm", "stack.verl": "0.8.0"})
    assert "runtime_rolls_out_with_vllm" not in {v.rule for v in check_plan(plan).violations}
    refused = next(v for v in check_plan(plan, Platform(device_type="cpu")).errors
                   if v.rule == "runtime_rolls_out_with_vllm")
    assert "trtllm" in refused.message and refused.suggested == {"rollout.name": "vllm"}

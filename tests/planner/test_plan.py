"""The plan's derived facts (planner/plan.py): a role's Megatron engine, derived once."""

from __future__ import annotations

import ast
from pathlib import Path

import attrs

from rlplan.planner.plan import MegatronSection
from rlplan.planner.verl_keys import REF_FOLLOWS_ACTOR
from tests.planner.plans import make_plan

PLANNER = Path(__file__).resolve().parents[2] / "planner"
ACTOR = MegatronSection(tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                        virtual_pipeline_model_parallel_size=2, param_offload=True, sequence_parallel=False,
                        recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)


def _megatron_plan(**sections):
    plan = make_plan(overrides={"actor.strategy": "megatron"})
    plan = plan.evolve(actor=attrs.evolve(plan.actor, megatron=ACTOR))
    return plan.evolve(**{role: attrs.evolve(getattr(plan, role), megatron=engine) for role, engine in sections.items()})


def test_an_unset_reference_engine_follows_the_actors_sizes_and_param_offload_and_defaults_the_rest():
    """verl's ppo_megatron_trainer.yaml: ref.megatron.* `oc.select` the actor's parallel sizes and param offload."""
    ref = _megatron_plan().engine("ref")
    assert all(getattr(ref, name) == getattr(ACTOR, name) for name in REF_FOLLOWS_ACTOR)
    defaults = MegatronSection()
    others = [a.name for a in attrs.fields(MegatronSection) if a.name not in REF_FOLLOWS_ACTOR]
    assert all(getattr(ref, name) == getattr(defaults, name) for name in others)


def test_a_roles_own_engine_wins_and_an_unset_critic_takes_megatrons_defaults():
    own = MegatronSection(tensor_model_parallel_size=4)
    plan = _megatron_plan(ref=own)
    assert plan.engine("ref") is own and plan.engine("actor") == ACTOR
    assert plan.engine("critic") == MegatronSection()


def test_no_module_but_plan_py_derives_a_roles_engine():
    """A role's engine is worked out once (Plan.engine), not again as `<role>.megatron or ...` in its readers."""
    found = []
    for path in PLANNER.rglob("*.py"):
        if path.name == "plan.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and isinstance(node.values[0], ast.Attribute)
                    and node.values[0].attr == "megatron"):
                found.append(f"{path.relative_to(PLANNER)}:{node.lineno}")
    assert found == []


def test_a_rollout_pool_refuses_a_size_below_one_naming_its_field_and_counts_its_gpus():
    import pytest

    from rlplan.planner.errors import PlanError
    from rlplan.planner.plan import RolloutPool

    assert RolloutPool(nodes=2, gpus_per_node=4).gpus == 8
    for nodes, per_node, field in ((0, 4, "rollout.pool.nodes"), (1, -2, "rollout.pool.gpus_per_node"),
                                   (1, 2.5, "rollout.pool.gpus_per_node")):
        with pytest.raises(PlanError) as error:
            RolloutPool(nodes=nodes, gpus_per_node=per_node)
        assert error.value.field == field


def test_a_plan_without_a_pool_is_colocated_and_one_with_a_pool_counts_the_rollouts_gpus_apart():
    from rlplan.planner.plan import RolloutPool

    plan = make_plan(gpus=8)
    assert not plan.rollout_is_split and plan.rollout_gpus == 8
    apart = plan.evolve(rollout=attrs.evolve(plan.rollout, pool=RolloutPool(nodes=1, gpus_per_node=2)))
    assert apart.rollout_is_split and (apart.rollout_gpus, apart.rollout_gpus_per_node) == (2, 2)
    assert apart.cluster.world_size == 8  # the trainer's GPUs are the cluster's


def test_a_rollout_pool_on_a_cpu_machine_is_refused():
    import pytest

    from rlplan.planner.errors import PlanError
    from rlplan.planner.hardware import Cluster, GpuSpec
    from rlplan.planner.plan import RolloutPool

    plan = make_plan()
    cpu = Cluster(gpu=GpuSpec(name="cpu", memory_gib=64.0), gpus_per_node=2)
    with pytest.raises(PlanError) as error:
        plan.evolve(cluster=cpu, rollout=attrs.evolve(plan.rollout, pool=RolloutPool(nodes=1, gpus_per_node=2)))
    assert error.value.field == "rollout.pool"


def test_a_recipe_and_an_estimator_exclude_each_other_and_the_recipe_builds_no_critic():
    import pytest

    from rlplan.planner.errors import PlanError
    from rlplan.planner.plan import AlgorithmSection

    assert AlgorithmSection().adv_estimator == "grpo"
    assert AlgorithmSection(recipe="sppo").adv_estimator is None  # the recipe's configs set it to null
    with pytest.raises(PlanError) as raised:
        AlgorithmSection(recipe="spin", adv_estimator="grpo")
    assert raised.value.field == "algorithm.adv_estimator"
    plan = make_plan()
    spin = plan.evolve(algorithm=AlgorithmSection(recipe="spin"),
                       critic=attrs.evolve(plan.critic, enable=True), actor=attrs.evolve(plan.actor, use_kl_loss=False))
    assert spin.uses_reference and not spin.uses_critic and spin.algorithm.name == "verl's spin recipe"
    with pytest.raises(PlanError) as raised:
        _megatron_plan().evolve(algorithm=AlgorithmSection(recipe="sppo"))
    assert raised.value.field == "algorithm.recipe"


def test_a_recipe_renders_only_for_the_releases_that_ship_it():
    import pytest

    from rlplan.planner.errors import PlanError
    from rlplan.planner.plan import AlgorithmSection
    from rlplan.planner.render import render_plan
    from rlplan.planner.stack import StackSection

    plan = make_plan().evolve(algorithm=AlgorithmSection(recipe="sppo"))
    plan = plan.evolve(model=attrs.evolve(plan.model, path="Qwen/Qwen2.5-7B-Instruct"))
    assert "python3 -m recipe.sppo.main_sppo" in render_plan(plan.evolve(stack=StackSection(verl="0.7.0")), "verl")
    with pytest.raises(PlanError) as raised:
        render_plan(plan.evolve(stack=StackSection(verl="0.8.0")), "verl")
    assert raised.value.field == "algorithm.recipe"

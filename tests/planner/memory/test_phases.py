"""The step's phases with the rollout on a pool of its own (planner/memory/phases.py, plan.RolloutPool): which GPU
holds what, and what splitting the rollout off changes."""

from __future__ import annotations

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from rlplan.planner.memory import predict_memory
from rlplan.planner.memory.phases import split_sync_tensor_bytes
from rlplan.planner.memory.rollout import rollout_budget
from rlplan.planner.phases import Phase
from rlplan.planner.plan import Plan, RolloutPool
from tests.planner.plans import make_plan
from tests.planner.test_memory import ARCHS, knob_overrides

TRAINER_STATE = ("actor_params", "actor_grads", "actor_optimizer_state", "ref_params", "critic_params",
                 "critic_optimizer_state")
TRAINING_PHASES = (Phase.OLD_LOG_PROB, Phase.REF_LOG_PROB, Phase.CRITIC_VALUES, Phase.CRITIC_UPDATE,
                   Phase.ACTOR_UPDATE)


def split(plan: Plan, gpus_per_node: int = 4) -> Plan:
    return plan.evolve(rollout=attrs.evolve(plan.rollout, pool=RolloutPool(nodes=1, gpus_per_node=gpus_per_node)))


def engine_names(plan: Plan) -> set[str]:
    engine = plan.rollout.name
    return {"kv_cache", "cuda_graph_pool", *(f"{engine}_{part}" for part in
                                             ("weights", "activation", "non_torch", "context"))}


def test_a_split_plans_training_phases_hold_no_engine_and_its_rollout_no_trainer_state():
    plan = split(make_plan(overrides={"rollout.free_cache_engine": False, "actor.use_kl_loss": True,
                                      "algorithm.adv_estimator": "gae"}))
    memory = predict_memory(plan)
    for phase in memory.phases:
        names = {c.name for c in phase.components}
        if phase.name == Phase.ROLLOUT:
            assert phase.pool == "rollout" and not names & set(TRAINER_STATE)
            assert phase.bytes_of("kv_cache") > 0
        else:
            assert phase.pool == "trainer" and not names & engine_names(plan), phase.name
    assert {p.name for p in memory.phases} >= {Phase.CRITIC_UPDATE, Phase.REF_LOG_PROB}


def test_a_colocated_plan_names_no_pool_and_keeps_the_engines_residue_on_the_trainers_gpus():
    plan = make_plan(overrides={"rollout.free_cache_engine": False})
    memory = predict_memory(plan)
    assert all(p.pool == "" for p in memory.phases)
    assert memory.phase(Phase.ACTOR_UPDATE).bytes_of("kv_cache") > 0


def test_the_engine_on_a_pool_of_its_own_is_sized_with_no_trainer_state_beside_it():
    # vLLM V0 (verl 0.4.1's stack) profiles the whole GPU: colocated, the trainer's resident state shrinks the pool.
    plan = make_plan(overrides={"stack.verl": "0.4.1", "stack.vllm": "0.8.5"})
    assert rollout_budget(plan).co_resident_bytes > 0
    assert rollout_budget(split(plan)).co_resident_bytes == 0
    assert rollout_budget(split(plan)).kv_cache_bytes > rollout_budget(plan).kv_cache_bytes


def test_a_split_weight_sync_holds_the_broadcast_tensor_on_the_trainer_and_the_rollout_pays_what_its_workspace_cannot():
    plan = split(make_plan(overrides={"rollout.free_cache_engine": False}))
    memory = predict_memory(plan)
    tensor = split_sync_tensor_bytes(plan)
    assert memory.phase(Phase.WEIGHT_SYNC).bytes_of("weight_sync_gather") == 2 * tensor
    budget = rollout_budget(plan)
    assert memory.phase(Phase.ROLLOUT).bytes_of("weight_sync_received") == max(0, tensor - budget.activation_bytes)
    # A small engine workspace: the received tensor raises the rollout pool's peak by what it lacks.
    tight = split(make_plan(overrides={"rollout.free_cache_engine": False, "rollout.max_num_batched_tokens": 256,
                                       "rollout.max_num_seqs": 8}))
    received = predict_memory(tight).phase(Phase.ROLLOUT).bytes_of("weight_sync_received")
    assert received == split_sync_tensor_bytes(tight) - rollout_budget(tight).activation_bytes > 0


@settings(max_examples=40, deadline=None)
@given(arch=st.sampled_from(ARCHS), knobs=knob_overrides(), rollout_gpus=st.sampled_from([2, 4, 8]))
def test_splitting_the_rollout_off_never_raises_a_training_phases_peak(arch, knobs, rollout_gpus):
    colocated = make_plan(arch, overrides=knobs)
    apart = split(colocated, rollout_gpus)
    before = {p.name: p.peak_bytes for p in predict_memory(colocated).phases}
    after = {p.name: p.peak_bytes for p in predict_memory(apart).phases}
    assert after.keys() == before.keys()
    assert all(after[name] <= before[name] for name in TRAINING_PHASES if name in before)

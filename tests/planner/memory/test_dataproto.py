"""The step's batch (planner/memory/dataproto.py): its bytes, and the passes whose worker holds the rank's share of it
on the GPU, per verl release and backend (stack.WORKER_HOLDS_BATCH_ON_GPU and its exceptions)."""

from __future__ import annotations

import pytest

from rlplan.planner.layout import plan_layout
from rlplan.planner.memory import predict_memory
from rlplan.planner.memory.dataproto import batch_bytes, batch_held_on_gpu, floats_sent, phase_batch_bytes
from rlplan.planner.phases import Phase
from rlplan.planner.stack import StackSection
from tests.planner.plans import make_plan

TRAINER_PHASES = (Phase.OLD_LOG_PROB, Phase.REF_LOG_PROB, Phase.CRITIC_VALUES, Phase.CRITIC_UPDATE,
                  Phase.ACTOR_UPDATE)
PPO = {"algorithm.adv_estimator": "gae", "actor.use_kl_loss": True}


def on(verl: str, megatron: bool = False, **overrides):
    knobs = {**PPO, **({"actor.strategy": "megatron"} if megatron else {}), **overrides}
    return make_plan(overrides=knobs).evolve(stack=StackSection(verl=verl))


def resident(plan, phase: Phase) -> int:
    return predict_memory(plan).phase(phase).bytes_of("resident_batch")


def test_a_sequence_holds_int64_ids_masks_and_positions_and_fp32_tensors_over_its_response():
    plan = make_plan()
    prompt, response = plan.data.max_prompt_length, plan.data.max_response_length
    ints = 3 * (prompt + response) + prompt + 2 * response  # ids, mask, positions; prompts, responses, mask
    assert batch_bytes(plan, 1, 0) == 8 * ints
    assert batch_bytes(plan, 10, 7) == 10 * (8 * ints + 7 * 4 * response)
    assert phase_batch_bytes(plan, Phase.ACTOR_UPDATE, 3) == batch_bytes(plan, 3, floats_sent(plan, Phase.ACTOR_UPDATE))


@pytest.mark.parametrize(("knobs", "values", "updates"), [
    (PPO, 2, 7),  # old and reference log-probs, values, scores, rewards, advantages, returns
    ({"algorithm.adv_estimator": "grpo", "actor.use_kl_loss": True}, 2, 6),  # no values
    ({"algorithm.adv_estimator": "grpo", "actor.use_kl_loss": False}, 1, 5),  # no reference either
])
def test_the_batch_gains_each_passs_outputs_and_the_advantage_block_before_the_updates(knobs, values, updates):
    plan = make_plan(overrides=knobs).evolve(stack=StackSection(verl="0.5.0"))
    assert floats_sent(plan, Phase.OLD_LOG_PROB) == 0 and floats_sent(plan, Phase.REF_LOG_PROB) == 1
    assert floats_sent(plan, Phase.CRITIC_VALUES) == values
    assert floats_sent(plan, Phase.ACTOR_UPDATE) == floats_sent(plan, Phase.CRITIC_UPDATE) == updates


@pytest.mark.parametrize("megatron", [False, True])
def test_verl_0_5_holds_the_ranks_share_of_the_batch_in_every_trainer_pass_and_0_6_in_none(megatron):
    old, new = on("0.5.0", megatron), on("0.6.0", megatron)
    roles = {role.role: role for role in plan_layout(old).roles}
    assert set(roles) == set(TRAINER_PHASES)
    for phase in TRAINER_PHASES:
        role = roles[phase]
        assert resident(old, phase) == int(phase_batch_bytes(old, phase, role.sequences_per_gpu)) > 0, phase
        if megatron and phase in (Phase.CRITIC_VALUES, Phase.CRITIC_UPDATE):
            continue  # the legacy Megatron critic keeps moving it until 0.8.0 (below)
        assert resident(new, phase) == 0, phase


def test_the_fsdp_actor_update_of_0_4_1_moves_micro_batches_but_its_other_passes_hold_the_batch():
    plan = on("0.4.1")
    assert resident(plan, Phase.ACTOR_UPDATE) == 0
    assert resident(plan, Phase.OLD_LOG_PROB) > 0 and resident(plan, Phase.CRITIC_UPDATE) > 0
    assert resident(on("0.4.0"), Phase.ACTOR_UPDATE) > 0 and resident(on("0.3.0.post1"), Phase.ACTOR_UPDATE) > 0
    assert resident(on("0.4.1", megatron=True), Phase.ACTOR_UPDATE) > 0  # the Megatron worker does move it


def test_the_legacy_megatron_critic_holds_the_batch_until_0_8():
    for verl in ("0.6.0", "0.7.1"):
        plan = on(verl, megatron=True)
        assert resident(plan, Phase.CRITIC_VALUES) > 0 and resident(plan, Phase.CRITIC_UPDATE) > 0, verl
        assert resident(plan, Phase.ACTOR_UPDATE) == 0, verl
    assert not batch_held_on_gpu(on("0.8.0", megatron=True), Phase.CRITIC_UPDATE)
    engine = on("0.7.1", megatron=True).evolve(passthrough={"trainer.use_legacy_worker_impl": "disable"})
    assert not batch_held_on_gpu(engine, Phase.CRITIC_UPDATE)  # the engine's TrainingWorker moves micro batches
    assert batch_held_on_gpu(on("0.7.0", megatron=True).evolve(passthrough={"trainer.use_legacy_worker_impl": "disable"}),
                             Phase.CRITIC_UPDATE)  # 0.7.0 builds the legacy Megatron critic whatever it says


def test_each_rank_holds_its_data_parallel_share_so_model_parallel_replicas_hold_more():
    dp8 = on("0.5.0", megatron=True)
    dp4 = on("0.5.0", megatron=True, **{"actor.megatron.tensor_model_parallel_size": 2})
    assert 2 * plan_layout(dp8).actor_update.sequences_per_gpu == plan_layout(dp4).actor_update.sequences_per_gpu
    assert resident(dp4, Phase.ACTOR_UPDATE) == 2 * resident(dp8, Phase.ACTOR_UPDATE)
    sp2 = on("0.5.0", **{"actor.ulysses_sequence_parallel_size": 2})  # the SP group gathers its chunks
    assert resident(sp2, Phase.ACTOR_UPDATE) == 2 * resident(on("0.5.0"), Phase.ACTOR_UPDATE)

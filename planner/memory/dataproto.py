"""The step's batch as verl's driver holds it (one DataProto of padded tensors): its bytes, what each trainer phase
is handed, and the phases whose worker moves its share of it onto the GPU for the whole pass.

One owner for memory (the batch resident on the GPU, `resident_batch`) and steptime (the call that ships it,
steptime.passes.worker_call_seconds).
"""

from __future__ import annotations

from rlplan.planner.layout import RoleBatchLayout
from rlplan.planner.memory.report import Component
from rlplan.planner.phases import Phase
from rlplan.planner.plan import Plan
from rlplan.planner.stack import (
    FSDP_ACTOR_UPDATE_BATCH_ON_HOST,
    MEGATRON_CRITIC_HOLDS_BATCH_ON_GPU,
    WORKER_HOLDS_BATCH_ON_GPU,
    Behaviour,
    holds,
)

# The fp32 tensors over the response the driver's batch gains after each trainer phase, in the order verl's
# ray_trainer.fit runs them (read at v0.5.0: old_log_probs line 1235-1236 with the entropys popped, ref_log_prob
# 1269, values 1275; the 'adv' block's token_level_scores 1282, token_level_rewards 1294, advantages and returns
# from compute_advantage, lines 254-289). token_level_rewards is token_level_scores itself without a KL in the
# reward, and GRPO's returns are its advantages (core_algos.py `return scores, scores`), but the worker's
# `data.to(device)` copies each TensorDict entry on its own, so on the GPU each is a tensor of its own.
_ADVANTAGE_TENSORS = 4  # token_level_scores, token_level_rewards, advantages, returns


def floats_sent(plan: Plan, phase: Phase) -> int:
    """The fp32 tensors over the response positions the batch holds when the driver calls `phase`: none at the
    log-prob pass; the old log-probs from the reference on; the reference's where one runs from the values on; the
    values where a critic runs, and the advantage block's four, at the updates."""
    if phase == Phase.OLD_LOG_PROB:
        return 0
    if phase == Phase.REF_LOG_PROB:
        return 1
    reference = 1 if plan.uses_reference else 0
    if phase == Phase.CRITIC_VALUES:
        return 1 + reference
    return 1 + reference + (1 if plan.uses_critic else 0) + _ADVANTAGE_TENSORS


def batch_bytes(plan: Plan, sequences: float, floats_per_position: int) -> float:
    """Bytes of verl's padded batch of `sequences`: int64 input_ids, attention_mask and position_ids over prompt +
    response, the prompts, the responses and the response mask (the rollout's TensorDict, vllm_rollout_spmd.py
    generate_sequences at v0.5.0 lines 370-379, and the trainer's response_mask, ray_trainer.py line 1203), and
    `floats_per_position` fp32 tensors over the response positions."""
    data = plan.data
    ints = 3 * data.max_sequence_length + data.max_prompt_length + 2 * data.max_response_length
    return sequences * (8.0 * ints + 4.0 * floats_per_position * data.max_response_length)


def phase_batch_bytes(plan: Plan, phase: Phase, sequences: float) -> float:
    """The batch of `sequences` as the driver hands it to `phase`'s worker call."""
    return batch_bytes(plan, sequences, floats_sent(plan, phase))


def batch_held_on_gpu(plan: Plan, phase: Phase) -> bool:
    """Whether `phase`'s worker moves its whole share of the batch onto the GPU and holds it for the pass (the
    behaviours' code paths in planner/stack.py): verl's legacy workers before 0.6.0, but not the FSDP actor's
    update at 0.4.1; the Megatron critic's until its legacy worker goes (0.8.0)."""
    def on(behaviour: Behaviour) -> bool:
        return holds(behaviour, plan.stack, plan.rollout.name, plan.passthrough)

    if plan.is_megatron and phase in (Phase.CRITIC_VALUES, Phase.CRITIC_UPDATE):
        return on(MEGATRON_CRITIC_HOLDS_BATCH_ON_GPU)
    if not plan.is_megatron and phase == Phase.ACTOR_UPDATE and on(FSDP_ACTOR_UPDATE_BATCH_ON_HOST):
        return False
    return on(WORKER_HOLDS_BATCH_ON_GPU)


def resident_batch(plan: Plan, role: RoleBatchLayout) -> list[Component]:
    """The rank's share of the step's batch, on the GPU for the whole pass where its worker moves it there.

    Each rank holds what dispatch hands its data-parallel rank (`role.sequences_per_gpu`, train_batch_size x n /
    DP): Megatron's MEGATRON_COMPUTE_PROTO gives every TP / PP / CP rank of a DP group the same chunk; FSDP's
    DP_COMPUTE_PROTO chunks over the world and the Ulysses sharding manager's preprocess_data gathers the SP
    group's chunks back onto each of its ranks."""
    if plan.cluster.gpu.is_cpu or not batch_held_on_gpu(plan, role.role):
        return []
    return [Component("resident_batch", int(phase_batch_bytes(plan, role.role, role.sequences_per_gpu)))]

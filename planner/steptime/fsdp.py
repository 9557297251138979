"""verl's FSDP / FSDP2 trainer's step time (the steptime.backend.TrainerTiming of strategy fsdp and fsdp2).

Each pass computes the tokens one GPU holds at its GPU class's MFU; FSDP's all-gathers (bf16 weights, in
forward and again in backward) and the fp32 gradient reduce-scatter run over the shard group, overlapping
compute micro batch by micro batch; CPUOffloadPolicy moves the host shards over PCIe in every pass and steps
the optimizer on the CPU; verl's between-phase offload moves each shard once per load and offload.
"""

from __future__ import annotations

from rlplan.planner.layout import RoleBatchLayout
from rlplan.planner.memory.fsdp import (
    actor_state,
    critic_state,
    offloaded_by_policy,
    ref_param_bytes,
    ref_params_on_host,
)
from rlplan.planner.memory.model_facts import lora_params, model_facts
from rlplan.planner.memory.report import TrainerState
from rlplan.planner.phases import Phase
from rlplan.planner.plan import Plan
from rlplan.planner.profile import Profile
from rlplan.planner.stack import ENTROPY_IN_EVERY_PASS, holds
from rlplan.planner.steptime.lengths import Lengths
from rlplan.planner.steptime.passes import (
    StepContext,
    compute_dtype,
    entropy_seconds,
    fixed_micro_batch_seconds,
    optimizer_step_host_seconds,
    pass_micro_batches,
    tokens_per_gpu,
    training_flops_per_token,
)
from rlplan.planner.steptime.rates import Rates, ring_seconds


def fsdp_pass_seconds(compute_seconds: float, micro_batches: int, collective_seconds_per_micro: float) -> float:
    """Micro batches whose collectives overlap compute: each takes the longer of the two."""
    if micro_batches <= 0:
        return compute_seconds
    return micro_batches * max(compute_seconds / micro_batches, collective_seconds_per_micro)


def _policy_state(plan: Plan, shard: int, critic: bool) -> TrainerState:
    return critic_state(plan, shard) if critic else actor_state(plan, shard)


def _forward_pass(plan: Plan, role: RoleBatchLayout, rates: Rates, shard: int, profile: Profile,
                  lengths: Lengths, *, critic: bool, entropy: bool) -> float:
    facts = model_facts(plan.model.arch)
    tokens = tokens_per_gpu(plan, role, lengths)
    micro_batches = pass_micro_batches(plan, role, lengths)
    compute = (tokens * training_flops_per_token(plan, facts, lengths, critic, role)
               / rates.train_flops(compute_dtype(plan, critic)))
    if entropy:
        compute += entropy_seconds(facts, tokens, rates, profile)
    params = facts.critic_params if critic else facts.params
    gather = ring_seconds(2.0 * params, shard, rates.collective(shard))
    if offloaded_by_policy(plan, "critic" if critic else "actor"):
        # CPUOffloadPolicy copies each layer's host shard to the GPU before its all-gather.
        gather += _policy_state(plan, shard, critic).params / rates.pcie
    return (fsdp_pass_seconds(compute, micro_batches, gather)
            + fixed_micro_batch_seconds(facts.layers, micro_batches, profile, passes=1.0)
            + _forward_moves(plan, role, rates, shard, profile, micro_batches))


def _update_pass(plan: Plan, role: RoleBatchLayout, rates: Rates, shard: int, profile: Profile,
                 lengths: Lengths, *, critic: bool) -> float:
    facts = model_facts(plan.model.arch)
    n_lora = 0 if critic else lora_params(plan)
    checkpointing = plan.critic.gradient_checkpointing if critic else plan.model.gradient_checkpointing
    # Backward costs 2x forward, 1x with a frozen base (activation grads only); recompute adds 1x.
    multiplier = (2.0 if n_lora else 3.0) + (1.0 if checkpointing else 0.0)
    tokens = tokens_per_gpu(plan, role, lengths) * role.epochs
    micro_batches = pass_micro_batches(plan, role, lengths)
    compute = (tokens * training_flops_per_token(plan, facts, lengths, critic, role) * multiplier
               / rates.train_flops(compute_dtype(plan, critic)))
    if not critic and (plan.actor.entropy_coeff != 0 or holds(ENTROPY_IN_EVERY_PASS, plan.stack)):
        # The entropy's forward and backward over the logits (every update's before verl 0.4).
        compute += 2.0 * entropy_seconds(facts, tokens, rates, profile)
    params = facts.critic_params if critic else facts.params
    trainable = n_lora or params
    bandwidth = rates.collective(shard)
    # bf16 all-gather in forward and again in backward (reshard after forward), fp32 reduce-scatter.
    collectives = 2 * ring_seconds(2.0 * params, shard, bandwidth) + ring_seconds(4.0 * trainable, shard, bandwidth)
    policy = offloaded_by_policy(plan, "critic" if critic else "actor")
    if policy:
        # CPUOffloadPolicy: the host shards cross PCIe into the forward and the backward all-gathers of
        # every micro batch, and each reduced gradient shard goes back to the host to accumulate there.
        state = _policy_state(plan, shard, critic)
        collectives += (2.0 * state.params + state.grads) / rates.pcie
    seconds = fsdp_pass_seconds(compute, micro_batches, collectives)
    seconds += fixed_micro_batch_seconds(facts.layers, micro_batches, profile, passes=multiplier)
    seconds += optimizer_step_host_seconds(facts.layers, role.optimizer_steps_per_step, profile)
    seconds += _update_moves(plan, rates, shard, profile, critic=critic)
    if policy:
        # The optimizer steps on the CPU, whose AdamW rate the node's ranks share.
        seconds += (role.optimizer_steps_per_step * trainable / shard * rates.gpus_per_node
                    / profile.cpu_adam_params_per_s)
    else:
        # AdamW reads params, grads and both moments and writes three of them back, all fp32.
        seconds += role.optimizer_steps_per_step * 28.0 * trainable / shard / rates.hbm
    if not critic and plan.model.activation_offload:
        offloaded_layers = max(0, facts.layers - profile.activation_offload_resident_layers)
        per_token = 2 * facts.hidden if checkpointing else facts.layer_activation_bytes_per_token
        # Every token's saved activations go to the host in forward and come back in backward.
        seconds += 2.0 * offloaded_layers * per_token * tokens / rates.pcie
    return seconds


def pageable_rate(rates: Rates, profile: Profile) -> float:
    """Bytes/s of verl's between-phase offloads, which copy to and from pageable host memory."""
    return min(rates.pcie, profile.pageable_copy_gbps * 1e9)


def _moved_by_verl(plan: Plan, role: str) -> bool:
    """verl loads and offloads a role's shards around its calls unless CPUOffloadPolicy keeps them on the host."""
    return not offloaded_by_policy(plan, role)


def _forward_moves(plan: Plan, role: RoleBatchLayout, rates: Rates, shard: int, profile: Profile,
                   micro_batches: int) -> float:
    """The loads and offloads verl runs inside a no_grad pass's call (fsdp_workers.py, v0.4.0):
    compute_log_prob loads the actor's shard and offloads it after (the LoRA reference is that same call);
    compute_values the critic's; a separate reference under param offload is FSDP's CPUOffload, which copies
    each layer's pinned shard in for every micro batch."""
    pageable = pageable_rate(rates, profile)
    if role.role == Phase.CRITIC_VALUES:
        moves = plan.critic.param_offload and _moved_by_verl(plan, "critic")
        return 2.0 * critic_state(plan, shard).params / pageable if moves else 0.0
    if role.role == Phase.REF_LOG_PROB and not plan.reference_is_actor:
        if not ref_params_on_host(plan):
            return 0.0
        return micro_batches * ref_param_bytes(plan, model_facts(plan.model.arch), shard) / rates.pcie
    moves = plan.actor.param_offload and _moved_by_verl(plan, "actor")
    return 2.0 * actor_state(plan, shard).params / pageable if moves else 0.0


def _update_moves(plan: Plan, rates: Rates, shard: int, profile: Profile, *, critic: bool) -> float:
    """update_actor / update_critic load the role's shard and optimizer state before the update and offload
    them after it."""
    role = "critic" if critic else "actor"
    if not _moved_by_verl(plan, role):
        return 0.0
    section = plan.critic if critic else plan.actor
    state = _policy_state(plan, shard, critic)
    moved = (2.0 * state.params if section.param_offload else 0.0)
    moved += 2.0 * state.optimizer if section.optimizer_offload else 0.0
    return moved / pageable_rate(rates, profile)


def offload_seconds(plan: Plan, rates: Rates, shard: int, profile: Profile) -> float:
    """verl's between-phase moves outside any phase's call: none; each load and offload is timed inside the
    call that makes it (_forward_moves, _update_moves, the weight sync's)."""
    return 0.0


class FsdpTiming:
    """FSDP's passes over the shard group (`ParallelLayout.fsdp_shard_size`)."""

    def forward_seconds(self, ctx: StepContext, batch: RoleBatchLayout, *, critic: bool, entropy: bool) -> float:
        return _forward_pass(ctx.plan, batch, ctx.rates, _shard(ctx), ctx.profile, ctx.lengths, critic=critic,
                             entropy=entropy)

    def update_seconds(self, ctx: StepContext, batch: RoleBatchLayout, *, critic: bool) -> float:
        return _update_pass(ctx.plan, batch, ctx.rates, _shard(ctx), ctx.profile, ctx.lengths, critic=critic)

    def weight_sync_gather_seconds(self, ctx: StepContext) -> float:
        """All-gather the fp32 shards (or only the adapter) for the sync; under CPUOffloadPolicy they come
        from host RAM."""
        plan, rates, shard = ctx.plan, ctx.rates, _shard(ctx)
        synced = lora_params(plan) or model_facts(plan.model.arch).params
        # Once vLLM holds the base (loaded itself, or pushed at the first sync with a dummy format),
        # each step gathers the fp32 adapter only.
        seconds = ring_seconds(4.0 * synced, shard, rates.collective(shard))
        if offloaded_by_policy(plan, "actor"):
            # The shards the sync gathers live in host RAM under CPUOffloadPolicy.
            seconds += actor_state(plan, shard).params / rates.pcie
        elif plan.actor.param_offload:
            # The rollout sharding manager loads the offloaded shard for the sync and offloads it after
            # (sharding_manager/fsdp_vllm.py __enter__, v0.4.0).
            seconds += 2.0 * actor_state(plan, shard).params / pageable_rate(rates, ctx.profile)
        return seconds

    def offload_seconds(self, ctx: StepContext) -> float:
        return offload_seconds(ctx.plan, ctx.rates, _shard(ctx), ctx.profile)


def _shard(ctx: StepContext) -> int:
    return max(1, ctx.layout.parallel.fsdp_shard_size)


FSDP_TIMING = FsdpTiming()

"""A roofline estimate of one verl step's wall time, per phase, to rank feasible plans.

Not a simulator: each phase is bound by the one resource that limits it at the
profile's achieved efficiency.  Rollout prefill runs at FLOPs x prefill MFU;
decode steps read the weights and every running sequence's KV from HBM, and the
KV cache caps how many sequences share one read of the weights.  Training and
log-prob passes run at FLOPs x training MFU (3x forward for a full backward, 2x
with a frozen LoRA base, +1x to recompute under gradient checkpointing), each
micro batch no faster than its FSDP all-gather / reduce-scatter traffic.
Offloaded state crosses PCIe each time verl moves it; weight sync gathers the
full weights, or only the adapter once vLLM holds the base.

What it must get right is the order: more KV concurrency -> faster rollout,
offload -> slower, gradient checkpointing -> slower per token.
"""

from __future__ import annotations

import math

import attrs
from attrs import frozen

from rlplan.planner.layout import PlanLayout, RoleBatchLayout, plan_layout, reuses_update_log_probs
from rlplan.planner.memory import (
    MemoryReport,
    ModelFacts,
    TrainerState,
    actor_state,
    critic_state,
    lora_params,
    model_facts,
    offloaded_by_policy,
    ref_param_bytes,
    ref_params_on_host,
)
from rlplan.planner.phases import Phase
from rlplan.planner.plan import Plan
from rlplan.planner.profile import DEFAULT_PROFILE, Profile

GB = 1e9


@frozen
class StepTime:
    phase_seconds: dict[str, float] = attrs.field(factory=dict)

    @property
    def total_seconds(self) -> float:
        return sum(self.phase_seconds.values())


class _Rates:
    """Achieved rates of one cluster under a profile, in FLOP/s and bytes/s."""

    __slots__ = ("gpu", "training_mfu", "prefill_flops", "hbm", "pcie", "intranode", "internode",
                 "gpus_per_node")

    def __init__(self, plan: Plan, profile: Profile) -> None:
        gpu = plan.cluster.gpu
        self.gpu = gpu
        self.training_mfu = profile.training_mfu
        # The engine computes in its own dtype (rollout.dtype): on a CPU bf16 and fp32 rates differ by ~2x either way.
        self.prefill_flops = gpu.tflops(plan.rollout.dtype) * 1e12 * profile.prefill_mfu
        self.hbm = gpu.hbm_gbps * GB * profile.decode_hbm_efficiency
        self.pcie = gpu.pcie_gbps * GB * profile.pcie_efficiency
        self.intranode = gpu.intranode_gbps * GB * profile.collective_efficiency
        self.internode = min(gpu.intranode_gbps, plan.cluster.internode_gbps) * GB * profile.collective_efficiency
        self.gpus_per_node = plan.cluster.gpus_per_node

    def train_flops(self, compute_dtype: str) -> float:
        """Achieved FLOP/s of a trainer pass computing in `compute_dtype` (the role's compute_dtype)."""
        return self.gpu.tflops(compute_dtype) * 1e12 * self.training_mfu

    def collective(self, group_size: int) -> float:
        """Bandwidth of a collective over `group_size` ranks: NVLink-class inside a node, the NIC across."""
        return self.intranode if group_size <= self.gpus_per_node else self.internode


def ring_seconds(total_bytes: float, group_size: int, bandwidth: float) -> float:
    """A ring all-gather or reduce-scatter of `total_bytes` (the unsharded size) over `group_size` ranks."""
    if group_size <= 1:
        return 0.0
    return total_bytes * (group_size - 1) / group_size / bandwidth


def fsdp_pass_seconds(compute_seconds: float, micro_batches: int, collective_seconds_per_micro: float) -> float:
    """Micro batches whose collectives overlap compute: each takes the longer of the two."""
    if micro_batches <= 0:
        return compute_seconds
    return micro_batches * max(compute_seconds / micro_batches, collective_seconds_per_micro)


def _tokens_per_gpu(role: RoleBatchLayout) -> float:
    return role.sequences_per_gpu * role.max_sequence_length / role.sequence_parallel_size


def _training_flops_per_token(plan: Plan, facts: ModelFacts, critic: bool) -> float:
    """Forward FLOPs per token at the average causal context of a full sequence."""
    flops = facts.forward_flops_per_token(plan.data.max_sequence_length // 2)
    if critic:
        # A value head replaces the vocabulary projection.
        flops -= 2.0 * facts.vocab * facts.hidden
    return flops


def _forward_pass(plan: Plan, role: RoleBatchLayout, rates: _Rates, shard: int, *, critic: bool) -> float:
    facts = model_facts(plan.model.arch)
    compute = (_tokens_per_gpu(role) * _training_flops_per_token(plan, facts, critic)
               / rates.train_flops(_compute_dtype(plan, critic)))
    params = facts.critic_params if critic else facts.params
    gather = ring_seconds(2.0 * params, shard, rates.collective(shard))
    if offloaded_by_policy(plan, "critic" if critic else "actor"):
        # CPUOffloadPolicy copies each layer's host shard to the GPU before its all-gather.
        gather += _policy_state(plan, shard, critic).params / rates.pcie
    return fsdp_pass_seconds(compute, role.micro_batches_per_step, gather)


def _compute_dtype(plan: Plan, critic: bool) -> str:
    # The reference pass is priced at the actor's dtype: with the default YAML both are bfloat16.
    return plan.critic.compute_dtype if critic else plan.actor.compute_dtype


def _policy_state(plan: Plan, shard: int, critic: bool) -> TrainerState:
    return critic_state(plan, shard) if critic else actor_state(plan, shard)


def _update_pass(plan: Plan, role: RoleBatchLayout, rates: _Rates, shard: int, profile: Profile, *,
                 critic: bool) -> float:
    facts = model_facts(plan.model.arch)
    n_lora = 0 if critic else lora_params(plan)
    checkpointing = plan.critic.gradient_checkpointing if critic else plan.model.gradient_checkpointing
    # Backward costs 2x forward, 1x with a frozen base (activation grads only); recompute adds 1x.
    multiplier = (2.0 if n_lora else 3.0) + (1.0 if checkpointing else 0.0)
    tokens = _tokens_per_gpu(role) * role.epochs
    compute = (tokens * _training_flops_per_token(plan, facts, critic) * multiplier
               / rates.train_flops(_compute_dtype(plan, critic)))
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
    seconds = fsdp_pass_seconds(compute, role.micro_batches_per_step, collectives)
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


def rollout_seconds(plan: Plan, memory: MemoryReport, rates: _Rates, profile: Profile, layout: PlanLayout) -> float:
    """Prefill at FLOPs, then decode steps bound by HBM reads of weights + KV, at KV-limited concurrency."""
    arch = plan.model.arch
    facts = model_facts(arch)
    rollout = plan.rollout
    t = rollout.tensor_model_parallel_size
    replicas = max(1, layout.parallel.rollout_replicas)
    prefill_flops, hbm = rates.prefill_flops, rates.hbm
    if layout.parallel.one_rollout_engine:
        # The one engine generates while the trainer ranks wait: it has every rank's share of cores and bandwidth.
        prefill_flops, hbm = prefill_flops * rates.gpus_per_node, hbm * rates.gpus_per_node
    prompt, response = plan.data.max_prompt_length, plan.data.max_response_length
    sequences = plan.data.train_batch_size * rollout.n / replicas
    prompts = plan.data.train_batch_size / replicas if rollout.enable_prefix_caching else sequences
    prefill = prompts * prompt * facts.forward_flops_per_token(prompt // 2) / (t * prefill_flops)

    concurrency = max(1.0, min(float(rollout.max_num_seqs), float(memory.max_concurrent_sequences),
                               math.ceil(sequences)))
    context = prompt + response / 2
    weight_params = float(facts.params)
    if facts.routed_expert_params:
        # Experts no sequence in the batch routed to are not read.
        untouched = (1.0 - arch.num_experts_per_token / arch.num_experts) ** concurrency
        weight_params -= facts.routed_expert_params * untouched
    weights = rollout.dtype_bytes * weight_params / t
    kv = concurrency * context * arch.kv_cache_bytes_per_token(t, rollout.dtype_bytes)
    memory_seconds = (weights + kv) / hbm
    compute_seconds = concurrency * facts.forward_flops_per_token(int(context)) / (t * prefill_flops)
    step = max(memory_seconds, compute_seconds)
    if t > 1:
        # Two all-reduces of the running batch's hidden states per layer.
        tp_bandwidth = rates.collective(t)
        per_all_reduce = profile.tp_allreduce_latency_us * 1e-6 + 2.0 * concurrency * facts.hidden * (
            rollout.dtype_bytes * (t - 1) / t / tp_bandwidth)
        step += 2 * facts.layers * per_all_reduce
    decode_steps = sequences * response / concurrency
    return prefill + decode_steps * step


def weight_sync_seconds(plan: Plan, rates: _Rates, shard: int) -> float:
    """Gather full weights (fp32 shards) or only the adapter, copy into vLLM, and move slept weights over PCIe."""
    facts = model_facts(plan.model.arch)
    rollout = plan.rollout
    t = rollout.tensor_model_parallel_size
    n_lora = lora_params(plan)
    bandwidth = rates.collective(shard)
    if n_lora:
        # Once vLLM holds the base (loaded itself, or pushed at the first sync with a dummy format),
        # each step pushes the fp32 adapter only.
        seconds = ring_seconds(4.0 * n_lora, shard, bandwidth) + rollout.dtype_bytes * n_lora / t / rates.hbm
    else:
        seconds = ring_seconds(4.0 * facts.params, shard, bandwidth) + rollout.dtype_bytes * facts.params / t / rates.hbm
    if offloaded_by_policy(plan, "actor"):
        # The shards the sync gathers live in host RAM under CPUOffloadPolicy.
        seconds += actor_state(plan, shard).params / rates.pcie
    if rollout.free_cache_engine and (rollout.sleep_level == 1 or rollout.layered_summon):
        # Level 1 copies vLLM's weights to host at sleep and back at wake.
        seconds += 2.0 * rollout.dtype_bytes * (facts.params + n_lora) / t / rates.pcie
    return seconds


def offload_seconds(plan: Plan, rates: _Rates, shard: int, profile: Profile) -> float:
    """PCIe traffic of verl's between-phase offload: each load and each offload moves the shard once."""
    moved = 0.0
    actor = actor_state(plan, shard)
    # Under offload_policy verl turns the between-phase offloads off; its traffic is priced in each pass.
    actor_moves = not offloaded_by_policy(plan, "actor")
    if plan.actor.param_offload and actor_moves:
        # Loaded and offloaded around the old-log-prob pass, the update and the weight sync.
        moved += 3 * 2 * actor.params
    if plan.actor.optimizer_offload and actor_moves:
        moved += 2 * actor.optimizer
    if plan.uses_reference and not plan.reference_is_actor and ref_params_on_host(plan):
        # FSDP's own offload copies each layer in for the reference pass; nothing is written back.
        moved += ref_param_bytes(plan, model_facts(plan.model.arch), shard)
    if plan.uses_critic and not offloaded_by_policy(plan, "critic"):
        critic = critic_state(plan, shard)
        if plan.critic.param_offload:
            moved += 2 * 2 * critic.params  # values pass and update
        if plan.critic.optimizer_offload:
            moved += 2 * critic.optimizer
    return moved / rates.pcie


def predict_step_time(plan: Plan, memory: MemoryReport, profile: Profile = DEFAULT_PROFILE,
                      layout: PlanLayout | None = None) -> StepTime:
    layout = layout or plan_layout(plan)
    rates = _Rates(plan, profile)
    shard = max(1, layout.parallel.fsdp_shard_size)
    # Phases by name, plus "offload" (verl's between-phase moves, which belong to no one phase).
    phases: dict[str, float] = {
        Phase.WEIGHT_SYNC: weight_sync_seconds(plan, rates, shard),
        Phase.ROLLOUT: rollout_seconds(plan, memory, rates, profile, layout),
    }
    # Only rlplan's runtime runs a CPU plan, and it skips the pass on-policy; verl runs it on GPUs regardless.
    if not (plan.cluster.gpu.is_cpu and reuses_update_log_probs(plan, layout)):
        phases[Phase.OLD_LOG_PROB] = _forward_pass(plan, layout.old_log_prob, rates, shard, critic=False)
    if layout.ref_log_prob is not None:
        phases[Phase.REF_LOG_PROB] = _forward_pass(plan, layout.ref_log_prob, rates, shard, critic=False)
    if layout.critic_values is not None and layout.critic_update is not None:
        phases[Phase.CRITIC_VALUES] = _forward_pass(plan, layout.critic_values, rates, shard, critic=True)
        phases[Phase.CRITIC_UPDATE] = _update_pass(plan, layout.critic_update, rates, shard, profile, critic=True)
    phases[Phase.ACTOR_UPDATE] = _update_pass(plan, layout.actor_update, rates, shard, profile, critic=False)
    phases["offload"] = offload_seconds(plan, rates, shard, profile)
    return StepTime(phases)

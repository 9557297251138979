"""Per-GPU memory of every phase of a colocated verl step (FSDP2 trainer + vLLM or SGLang rollout), and host RAM.

The formulas are those of shared/reference/memory-model.md section 2, derived
from the model's architecture (GQA KV width, tied embeddings, gated MLP width,
MoE experts and active experts, vocabulary), never from a parameter count alone.
A step runs these phases, each reported with its components:

    weight_sync    trainer weights pushed into the waking engine (multi-stage wake: KV not yet resident)
    rollout        generation: vLLM inside util x GPU; SGLang's weights + KV inside it, buffers and
                   CUDA graphs beside it; with what the trainer leaves on the GPU
    old_log_prob   actor forward, no_grad
    ref_log_prob   reference forward, no_grad (only when a KL term needs it)
    critic_values  critic forward, no_grad (PPO/GAE only)
    critic_update  critic training step (PPO/GAE only)
    actor_update   actor training step: max(P_loss, P_bwd, P_opt)

Every component has a scope.  "step" is what the phase itself allocates, the
scope a PyTorch memory tracker measures (memory-model.md 3.6); "resident" is
state other roles or the sleeping engine leave on the GPU; "overhead" is what
no tracker sees: the CUDA context / NCCL budget and the fragmentation reserve.
Component names are stable (the fidelity checks and `explain` key on them):

    actor_params, actor_grads, actor_optimizer_state, optimizer_step_temporaries,
    ref_params, critic_params, critic_grads, critic_optimizer_state,
    activations                 saved activations (checkpointed layer inputs under AC)
    layer_backward_workspace    one layer's activations recomputed / held in backward
    loss_head_hidden            final norm and hidden state at the head, T x (8h + 4)
    logits_head                 the loss head's logits / log-softmax / entropy, c x T x V (c per kernel)
    forward_transients          layer-sized temporaries of a no_grad forward, T x (4h + 6I)
    fsdp_all_gather_buffers     current + prefetched bf16 layer, 2 x 2 N_L
    fsdp_reduce_scatter_buffer  fp32 gradient reduce-scatter input of one layer
    root_group_unsharded        bf16 embedding (+ untied lm_head) gathered in late backward
    vllm_weights, vllm_activation, vllm_non_torch, kv_cache, cuda_graph_pool,
    vllm_context                what vLLM keeps on the GPU even asleep (context, NCCL)
    sglang_weights, sglang_activation, sglang_non_torch, sglang_context
                                the same for an SGLang rollout (rollout.name = "sglang")
    weight_sync_gather          full tensors / buckets gathered to push into vLLM
    cuda_context_and_nccl, fragmentation_reserve
Host components (per node): actor_params_offloaded, actor_grads_offloaded, actor_optimizer_offloaded,
ref_params_offloaded, critic_params_offloaded, critic_grads_offloaded, critic_optimizer_offloaded,
activations_offloaded, vllm_sleep_weights, model_copy_shm, process_overhead.

Entry points: `predict_memory` (every phase, host, KV budget), `predict_phase` (one
phase, for searches that bisect one knob), `rollout_budget` (the engine's KV sizing and its
start-up rule `holds_max_model_len`), `kv_cache_tokens`, `vllm_kv_cache_bytes` and `sglang_kv_cache_bytes`.
The constants (allocator margins, vLLM workspace fit, head coefficients) come from
the `Profile`, never from literals here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal, TypeVar

import attrs
from attrs import frozen

from rlplan.planner.arch import Architecture
from rlplan.planner.layout import PlanLayout, RoleBatchLayout, plan_layout
from rlplan.planner.phases import Phase
from rlplan.planner.plan import Plan, RolloutEngine
from rlplan.planner.profile import DEFAULT_PROFILE, Profile

GIB = 2**30
MIB = 2**20

Scope = Literal["step", "resident", "overhead"]
T = TypeVar("T")


@frozen
class Component:
    name: str
    bytes: int
    scope: Scope = "step"


@frozen
class PhaseMemory:
    name: str
    components: tuple[Component, ...]
    # Which sub-phase set the peak (training: "loss", "backward" or "optimizer_step").
    peak_at: str = ""

    @property
    def peak_bytes(self) -> int:
        return sum(c.bytes for c in self.components)

    def scope_bytes(self, scope: Scope) -> int:
        return sum(c.bytes for c in self.components if c.scope == scope)

    @property
    def step_bytes(self) -> int:
        """What this phase allocates itself: the total a PyTorch memory tracker reports."""
        return self.scope_bytes("step")

    def bytes_of(self, name: str) -> int:
        return sum(c.bytes for c in self.components if c.name == name)

    @property
    def largest_component(self) -> Component:
        return max(self.components, key=lambda c: c.bytes)


@frozen
class HostMemory:
    """Host RAM one node needs (pinned offload copies, sleeping-engine weights, model files, processes)."""

    components: tuple[Component, ...]

    @property
    def total_bytes(self) -> int:
        return sum(c.bytes for c in self.components)


@frozen
class BindingConstraint:
    """The tightest limit: where, which component dominates there, and the headroom (negative: over by)."""

    resource: Literal["gpu", "host", "kv_cache"]
    where: str
    component: str
    headroom_bytes: int
    capacity_bytes: int

    @property
    def relative_headroom(self) -> float:
        return self.headroom_bytes / self.capacity_bytes if self.capacity_bytes else -math.inf


@frozen
class RolloutBudget:
    """The rollout engine's KV sizing on one rank.

    vLLM V1: requested = util x GPU, KV = requested - weights - activation - non-torch.
    SGLang: requested = mem_fraction_static x GPU bounds weights + KV pool only (static memory);
    the activation buffers and CUDA graphs live in the rest of the GPU, outside the budget.
    """

    requested_bytes: int
    weights_bytes: int
    activation_bytes: int
    non_torch_bytes: int
    kv_cache_bytes_per_token: int
    block_size: int
    max_model_len: int
    sequence_length: int
    engine: RolloutEngine = "vllm"
    # vLLM's CPU backend: the KV cache is VLLM_CPU_KVCACHE_SPACE exactly (requested_bytes), whatever else
    # the process holds; weights and workspace are beside it, not carved out of it.
    on_cpu: bool = False

    @property
    def kv_cache_bytes(self) -> int:
        """Negative when the weights and workspace alone exceed the budget (vLLM: 'No available memory')."""
        if self.on_cpu:
            return self.requested_bytes
        if self.engine == "sglang":
            return int(sglang_kv_cache_bytes(self.requested_bytes, self.weights_bytes, self.non_torch_bytes))
        return int(vllm_kv_cache_bytes(self.requested_bytes, self.weights_bytes, self.activation_bytes,
                                       self.non_torch_bytes))

    @property
    def outside_budget_bytes(self) -> int:
        """What the engine allocates beyond requested_bytes while generating (SGLang's buffers)."""
        return self.activation_bytes if self.engine == "sglang" else 0

    @property
    def kv_cache_tokens(self) -> int:
        return kv_tokens_from_bytes(self.kv_cache_bytes, self.kv_cache_bytes_per_token, self.block_size)

    @property
    def usable_kv_cache_tokens(self) -> int:
        """vLLM (0.32) holds one block back as its null block; requests get the rest.

        SGLang (page size 1) caps a request at max_total_num_tokens - 1 (scheduler max_req_input_len).
        """
        return max(0, self.kv_cache_tokens - self.block_size)

    @property
    def holds_max_model_len(self) -> bool:
        """vLLM refuses to start unless (num_blocks - 1) x block_size >= max_model_len (checked on vllm-cpu)."""
        return self.usable_kv_cache_tokens >= self.max_model_len

    @property
    def shortfall_tokens(self) -> int:
        return max(0, self.max_model_len - self.usable_kv_cache_tokens)

    @property
    def bytes_needed_for_max_model_len(self) -> int:
        blocks = -(-self.max_model_len // self.block_size) + 1
        return blocks * self.block_size * self.kv_cache_bytes_per_token

    @property
    def max_concurrent_sequences(self) -> int:
        """Full-length sequences (prompt + response) the cache holds at once, per replica."""
        return self.usable_kv_cache_tokens // self.sequence_length


@frozen
class MemoryReport:
    phases: tuple[PhaseMemory, ...]
    host: HostMemory
    gpu_capacity_bytes: int
    host_capacity_bytes: int
    kv_cache_bytes: int
    kv_cache_tokens: int
    max_concurrent_sequences: int
    rollout: RolloutBudget
    notes: tuple[str, ...] = ()

    def phase(self, name: str) -> PhaseMemory:
        for phase in self.phases:
            if phase.name == name:
                return phase
        raise KeyError(name)

    @property
    def peak_phase(self) -> PhaseMemory:
        return max(self.phases, key=lambda p: p.peak_bytes)

    @property
    def gpu_peak_bytes(self) -> int:
        return max(p.peak_bytes for p in self.phases)

    @property
    def fits_gpu(self) -> bool:
        return self.gpu_peak_bytes <= self.gpu_capacity_bytes and self.rollout.holds_max_model_len

    @property
    def fits_host(self) -> bool:
        return self.host.total_bytes <= self.host_capacity_bytes

    @property
    def fits(self) -> bool:
        return self.fits_gpu and self.fits_host

    @property
    def headroom_bytes(self) -> int:
        return self.gpu_capacity_bytes - self.gpu_peak_bytes

    @property
    def binding_constraint(self) -> BindingConstraint:
        """The limit with the least headroom relative to its capacity."""
        candidates = [
            BindingConstraint("gpu", p.name, p.largest_component.name, self.gpu_capacity_bytes - p.peak_bytes,
                              self.gpu_capacity_bytes)
            for p in self.phases
        ]
        if self.host.components:
            largest = max(self.host.components, key=lambda c: c.bytes)
            candidates.append(BindingConstraint("host", "host", largest.name,
                                                self.host_capacity_bytes - self.host.total_bytes,
                                                self.host_capacity_bytes))
        needed = self.rollout.bytes_needed_for_max_model_len
        candidates.append(BindingConstraint("kv_cache", "rollout", "kv_cache", self.kv_cache_bytes - needed,
                                            self.rollout.requested_bytes))
        return min(candidates, key=lambda c: c.relative_headroom)


# --- architecture facts -------------------------------------------------------


@frozen
class ModelFacts:
    """Per-token and per-layer sizes of one architecture, derived once and cached."""

    params: int
    layer_params: int
    layers: int
    hidden: int
    vocab: int
    tied: bool
    # Saved bytes per token summed over all layers without recompute, and the largest single layer.
    activation_bytes_per_token: int
    layer_activation_bytes_per_token: int
    # No_grad forward temporaries per token, memory-model.md 2.5: 4h + 6I (I = active MLP width).
    forward_transient_bytes_per_token: int
    # Largest single weight tensor in elements (what one full_tensor() gathers at weight sync).
    largest_tensor: int
    critic_params: int
    # Parameters of routed experts (decode reads only the experts a batch touches).
    routed_expert_params: int
    # Forward FLOPs per token: matmuls, plus attention per token of context (arch.forward_flops_per_token).
    matmul_flops_per_token: float
    attention_flops_per_context_token: float

    def forward_flops_per_token(self, context_len: float) -> float:
        return self.matmul_flops_per_token + self.attention_flops_per_context_token * context_len


def _layer_activation_bytes(arch: Architecture, mlp_width: int, routed: bool) -> int:
    """Saved bytes per token of one HF decoder layer in bf16 with fp32 RMSNorm inputs (memory-model.md 2.2)."""
    h = arch.hidden_size
    nh = arch.num_attention_heads
    # Each RMSNorm: fp32 input, fp32 rsqrt, bf16 normed and weighted outputs.
    norms = arch.norms_per_layer * (8 * h + 4)
    if arch.is_mla:
        qk_head = arch.qk_nope_head_dim + arch.qk_rope_head_dim
        attention = 4 * nh * qk_head + 4 * nh * arch.v_head_dim + 2 * arch.kv_width + 2 * arch.q_lora_rank
    else:
        attention = 4 * arch.q_width + 4 * arch.kv_width
    attention += 4 * nh
    if arch.qk_norm:
        attention += 6 * (arch.q_width + arch.kv_width)
    mlp = 8 * mlp_width
    if routed:
        # fp32 router probabilities, and the hidden states permuted to and from the chosen experts.
        mlp += 6 * arch.num_experts + 4 * arch.num_experts_per_token * h
    return norms + attention + mlp


# Caches keyed by architecture identity: the solver evaluates thousands of plans sharing one
# Architecture, and hashing its thirty fields would cost more than the arithmetic it saves.
_BY_ARCH: dict[tuple[int, object], tuple[Architecture, object]] = {}


def _cached(arch: Architecture, key: object, compute: Callable[[], T]) -> T:
    entry = _BY_ARCH.get((id(arch), key))
    if entry is not None and entry[0] is arch:
        return entry[1]  # type: ignore[return-value]
    if len(_BY_ARCH) > 1024:
        _BY_ARCH.clear()
    value = compute()
    _BY_ARCH[(id(arch), key)] = (arch, value)
    return value


def model_facts(arch: Architecture) -> ModelFacts:
    return _cached(arch, None, lambda: _model_facts(arch))


def _model_facts(arch: Architecture) -> ModelFacts:
    h = arch.hidden_size
    dense = _layer_activation_bytes(arch, arch.intermediate_size, routed=False)
    active_moe_width = arch.num_experts_per_token * arch.moe_intermediate_size + arch.shared_expert_intermediate_size
    moe = _layer_activation_bytes(arch, active_moe_width, routed=True) if arch.is_moe else 0
    total = arch.num_dense_layers * dense + arch.num_moe_layers * moe
    widest_mlp = active_moe_width if arch.num_moe_layers and not arch.num_dense_layers else arch.intermediate_size
    largest_tensor = max(arch.vocab_size * h, arch.intermediate_size * h)
    routed = 0
    if arch.is_moe:
        # transformers fuses each MoE layer's experts into one 3-D gate_up tensor.
        largest_tensor = max(largest_tensor, arch.num_experts * 2 * arch.moe_intermediate_size * h)
        routed = arch.num_moe_layers * arch.num_experts * 3 * h * arch.moe_intermediate_size
    return ModelFacts(
        params=arch.total_params,
        layer_params=arch.largest_layer_params,
        layers=arch.num_layers,
        hidden=h,
        vocab=arch.vocab_size,
        tied=arch.tie_word_embeddings,
        activation_bytes_per_token=total,
        layer_activation_bytes_per_token=max(dense if arch.num_dense_layers else 0, moe),
        forward_transient_bytes_per_token=4 * h + 6 * widest_mlp,
        largest_tensor=largest_tensor,
        critic_params=arch.total_params - arch.lm_head_params + h,
        routed_expert_params=routed,
        matmul_flops_per_token=arch.forward_flops_per_token(0),
        attention_flops_per_context_token=arch.forward_flops_per_token(1) - arch.forward_flops_per_token(0),
    )


def lora_params(plan: Plan) -> int:
    lora = plan.model.lora
    if not lora.enabled:
        return 0
    arch = plan.model.arch
    targets = "all-linear" if lora.target_modules == ("all-linear",) else lora.target_modules
    return _cached(arch, (lora.rank, targets), lambda: arch.lora_params(lora.rank, targets))


# --- vLLM ---------------------------------------------------------------------


def vllm_kv_cache_bytes(requested_bytes: float, weights_bytes: float, activation_bytes: float,
                        non_torch_bytes: float) -> float:
    """vLLM V1: KV = util x GPU - weights - profiled activation - non-torch (graphs come after, outside)."""
    return requested_bytes - weights_bytes - activation_bytes - non_torch_bytes


def sglang_kv_cache_bytes(static_bytes: float, weights_bytes: float, pre_load_bytes: float) -> float:
    """SGLang: KV pool = mem_fraction_static x GPU - weights - what was in use before the load.

    sglang python/sglang/srt/model_executor/model_runner_kv_cache_mixin.py (profile_max_num_token):
    rest_memory = available_gpu_memory - total_gpu_memory * (1 - mem_fraction_static), where the
    available memory is measured after the weights are loaded; the CUDA context and NCCL buffers were
    already in use then.  Activations and CUDA graphs are not part of it.
    """
    return static_bytes - weights_bytes - pre_load_bytes


def kv_tokens_from_bytes(kv_cache_bytes: float, bytes_per_token: int, block_size: int = 16) -> int:
    if kv_cache_bytes <= 0:
        return 0
    return int(kv_cache_bytes // (block_size * bytes_per_token)) * block_size


def kv_cache_tokens(arch: Architecture, kv_cache_bytes: float, tensor_parallel_size: int, block_size: int = 16,
                    dtype_bytes: int = 2) -> int:
    """Tokens vLLM's cache holds on each rank: num_blocks = bytes // (block_size x per-token bytes)."""
    per_token = arch.kv_cache_bytes_per_token(tensor_parallel_size, dtype_bytes)
    return kv_tokens_from_bytes(kv_cache_bytes, per_token, block_size)


def vllm_activation_bytes(arch: Architecture, max_num_batched_tokens: int, max_num_seqs: int,
                          profile: Profile = DEFAULT_PROFILE) -> float:
    """vLLM's profiled activation peak: dummy forward at max_num_batched_tokens plus the sampler dummy."""
    return (
        profile.vllm_activation_base_gib * GIB
        + profile.vllm_activation_bytes_per_batched_token_hidden * max_num_batched_tokens * arch.hidden_size
        + profile.vllm_sampler_bytes_per_seq_vocab * max_num_seqs * arch.vocab_size
    )


def vllm_non_torch_bytes(tensor_parallel_size: int, profile: Profile = DEFAULT_PROFILE) -> float:
    gib = profile.vllm_non_torch_tp1_gib if tensor_parallel_size == 1 else profile.vllm_non_torch_tp_gib
    return gib * GIB


def rollout_max_model_len(plan: Plan) -> int:
    """verl passes max_model_len, or prompt + response when it is unset."""
    return plan.rollout.max_model_len or plan.data.max_sequence_length


# rlplan's runtime sizes vLLM CPU's KV space (whole GiB) for every concurrent sequence at full length,
# never below 1 GiB and never above this share of the machine's host memory.
CPU_KV_CACHE_MIN_GIB = 1
CPU_KV_CACHE_MAX_HOST_FRACTION = 0.25


def vllm_cpu_kv_space_gib(plan: Plan) -> int:
    """VLLM_CPU_KVCACHE_SPACE as rlplan's runtime sets it for this plan (runtime/rollout/engine.py).

    vllm-cpu 0.32 (vllm/platforms/cpu.py check_and_update_config) turns the variable into
    cache_config.kv_cache_memory_bytes = int(value) GiB, and CPUWorker.determine_available_memory then
    allocates exactly that; unset, it would take gpu_memory_utilization x the NUMA node's memory minus
    the process's RSS, which the runtime never leaves to chance.
    """
    arch = plan.model.arch
    bytes_needed = (plan.rollout.max_num_seqs * rollout_max_model_len(plan)
                    * arch.kv_cache_bytes_per_token(1, plan.rollout.dtype_bytes))
    host_cap = max(CPU_KV_CACHE_MIN_GIB, int(plan.cluster.host_memory_gib * CPU_KV_CACHE_MAX_HOST_FRACTION))
    return min(host_cap, max(CPU_KV_CACHE_MIN_GIB, math.ceil(bytes_needed / GIB)))


def rollout_budget(plan: Plan, profile: Profile = DEFAULT_PROFILE) -> RolloutBudget:
    """The rollout engine's budget of one rank; `holds_max_model_len` is the start-up rule the rules module reports.

    SGLang's buffers are priced with vLLM's profile-run terms: the prefill chunk (the plan's
    max_num_batched_tokens; SGLang's chunked_prefill_size) and the sampler's logits at
    max_running_requests (verl passes max_num_seqs).
    """
    arch = plan.model.arch
    rollout = plan.rollout
    t = rollout.tensor_model_parallel_size
    facts = model_facts(arch)
    sglang = rollout.name == "sglang"
    # verl starts vLLM with enable_lora, which holds one adapter at the plan's rank; SGLang gets
    # no LoRA arguments (async_sglang_server.py server args) and holds the base weights only.
    weights = rollout.dtype_bytes * (facts.params + (0 if sglang else lora_params(plan))) // t
    if plan.cluster.gpu.is_cpu:
        # vLLM's CPU backend: no profile run is subtracted from the KV space, and its default block is 128.
        return RolloutBudget(
            engine=rollout.name,
            on_cpu=True,
            requested_bytes=vllm_cpu_kv_space_gib(plan) * GIB,
            weights_bytes=weights,
            activation_bytes=0,
            non_torch_bytes=0,
            kv_cache_bytes_per_token=arch.kv_cache_bytes_per_token(t, rollout.dtype_bytes),
            block_size=profile.cpu_block_size,
            max_model_len=rollout_max_model_len(plan),
            sequence_length=plan.data.max_sequence_length,
        )
    return RolloutBudget(
        engine=rollout.name,
        requested_bytes=int(rollout.gpu_memory_utilization * plan.cluster.gpu_memory_bytes),
        weights_bytes=weights,
        activation_bytes=int(vllm_activation_bytes(arch, rollout.max_num_batched_tokens, rollout.max_num_seqs,
                                                   profile)),
        non_torch_bytes=int(vllm_non_torch_bytes(t, profile)),
        kv_cache_bytes_per_token=arch.kv_cache_bytes_per_token(t, rollout.dtype_bytes),
        block_size=profile.sglang_page_size if sglang else profile.vllm_block_size,
        max_model_len=rollout_max_model_len(plan),
        sequence_length=plan.data.max_sequence_length,
    )


# --- trainer state ------------------------------------------------------------


@frozen
class TrainerState:
    """Bytes per GPU of one role's sharded training state."""

    params: float
    grads: float
    optimizer: float
    optimizer_step: float
    # fp32 reduce-scatter input of the largest layer's trainable parameters.
    reduce_scatter: float


DTYPE_BYTES = {"fp32": 4, "bf16": 2}


def actor_state(plan: Plan, shard: int) -> TrainerState:
    """The actor's shards in verl's fsdp_config.model_dtype (N8: fp32 by default, LoRA or not).

    Gradients and AdamW moments follow the parameters' dtype. PEFT keeps adapters in fp32 over a
    bf16 base (autocast_adapter_dtype), so a LoRA adapter is fp32 whatever the base dtype is.
    """
    facts = model_facts(plan.model.arch)
    n_lora = lora_params(plan)
    d = DTYPE_BYTES[plan.actor.model_dtype]
    if n_lora:
        # frozen base in model_dtype + fp32 adapter with its grads and AdamW moments (memory-model.md 2.3, LoRA).
        return TrainerState(params=(d * facts.params + 4 * n_lora) / shard, grads=4 * n_lora / shard,
                            optimizer=8 * n_lora / shard, optimizer_step=4 * n_lora / shard,
                            reduce_scatter=4 * n_lora / facts.layers)
    n = facts.params
    return TrainerState(params=d * n / shard, grads=d * n / shard, optimizer=2 * d * n / shard,
                        optimizer_step=d * n / shard, reduce_scatter=4 * facts.layer_params)


def ref_params_on_host(plan: Plan) -> bool:
    """Whether a separate reference keeps its shards in host RAM, copied to the GPU layer by layer.

    verl does so on GPUs whatever ref.fsdp_config.param_offload says: `_build_model_optimizer` in
    verl/workers/fsdp_workers.py gives every role but the actor FSDP's own CPU offload
    (`cpu_offload = None if role == "actor" else CPUOffload(offload_params=True)`, and
    `CPUOffloadPolicy(pin_memory=True)` on the fsdp2 branch). rlplan's runtime does the same on GPUs;
    on its CPU ranks host memory is the rank's memory and ref.param_offload decides.
    """
    return plan.ref.param_offload or not plan.cluster.gpu.is_cpu


def ref_param_bytes(plan: Plan, facts: ModelFacts, shard: int) -> int:
    """The reference's shards in its own fsdp_config.model_dtype (fp32 with verl's default YAML, N8)."""
    return DTYPE_BYTES[plan.ref.model_dtype] * facts.params // shard


def offloaded_by_policy(plan: Plan, role: Literal["actor", "critic"]) -> bool:
    """Whether FSDP2's CPUOffloadPolicy keeps this role's state in host RAM (verl's fsdp_config.offload_policy).

    verl reads offload_policy only on its fsdp2 branch (fsdp_workers.py, ActorRolloutRefWorker._build_model_optimizer
    and CriticWorker._build_critic_model_optimizer); the critic's strategy follows the actor's in a rendered plan.
    """
    section = plan.actor if role == "actor" else plan.critic
    return section.offload_policy and plan.actor.strategy == "fsdp2"


def on_gpu(state: TrainerState, offloaded: bool) -> TrainerState:
    """What of a role's state the GPU holds: all of it, or under CPUOffloadPolicy none but the gradient buffer.

    CPUOffloadPolicy keeps the sharded fp32 params, their grads and AdamW's moments on the host and
    runs the optimizer step there; the GPU sees each layer's shard only inside its all-gather and the
    fp32 reduce-scatter input before the reduced shard is copied back to host.
    """
    if not offloaded:
        return state
    return TrainerState(params=0.0, grads=0.0, optimizer=0.0, optimizer_step=0.0, reduce_scatter=state.reduce_scatter)


def critic_state(plan: Plan, shard: int) -> TrainerState:
    facts = model_facts(plan.model.arch)
    n = facts.critic_params
    return TrainerState(params=4 * n / shard, grads=4 * n / shard, optimizer=8 * n / shard,
                        optimizer_step=4 * n / shard, reduce_scatter=4 * facts.layer_params)


# --- the loss head, per kernel ------------------------------------------------
#
# What each kernel holds per token x vocab, read from the code verl runs
# (verl/workers/actor/dp_actor.py::_forward_micro_batch, verl/utils/torch_functional.py,
# flash_attn/ops/triton/cross_entropy.py) and measured on its memory twin
# (runtime/head_twins.py: an autograd Function or verl's own torch code that allocates and saves
# what the GPU kernel does, under FSDPMemTracker on fake tensors).  Logits leave the model in bf16
# (2 bytes per T V; transformers no longer upcasts them) and are divided by the temperature in
# place, so every GPU head starts from one bf16 T x V tensor.  Each number is the slope of the
# tracker's peak between 4096 and 8192 tokens (tests/runtime/test_measure.py holds them to the
# twins), keyed by the entropy verl computes beside the log-probs ("none": entropy_coeff 0):
#
#   flash_attn_ce   forward allocates three fp32 values per row and saves the logits themselves;
#                   backward writes dlogits into them when inplace_backward, which verl sets only
#                   without entropy: 2.  With entropy the gradient takes a second bf16 buffer (2 + 2)
#                   and verl's entropy adds: eager 10 (softmax's saved output, then logsumexp's and
#                   softmax's backward temporaries and the summed gradient), the same under
#                   torch.utils.checkpoint (the recomputed softmax is saved again before its
#                   backward); chunked, see below.
#   torch_logprob   logprobs_from_logits_v2 on bf16 logits: one saved log_softmax row per token (2),
#                   its row gradients freed into one stacked gradient as they are built: 2 + 2; the
#                   entropy adds 12 eager or checkpointed; chunked, see below.
#   compiled        torch.compile(entropy_from_logits) (actor.use_torch_compile, verl's default);
#                   dynamo runs eagerly under a tracker, so its twin (head_twins.compiled_entropy) is measured. It
#                   fuses softmax, logsumexp and the sum into row reductions, saves its input (the
#                   logits, counted) and writes one bf16 gradient: + 2 on the head's entropy-blocked
#                   backward.  Checkpointing or chunking a compiled function leaves that unchanged.
#   fused           model.use_fused_kernels computes log-probs and entropy from the hidden states
#                   block by block inside the lm_head: no T x V tensor at all.
#   chunked         rlplan's bundled runtime (runtime/algorithms/lean_head.py): bf16 logits and
#                   their bf16 gradient, plus one of its 16 row chunks' fp32 work, entropy or not.
#   naive           rlplan's former fp32 head: tracker-measured coefficients in the Profile
#                   (memory-model.md 2.4).
#
# The no_grad passes hold the logits (2); the old-log-prob pass computes the entropy too (verl logs
# it): eager and checkpointed add softmax's output and pd * logits (+ 4); compiled adds nothing
# (a fused reduction).
#
# verl's chunked entropy (entropy_from_logits_with_chunking, 2048-row chunks, in fp32) is no fixed
# coefficient: every chunk's fp32 copy and softmax stay saved until backward (8 per T V), while one
# chunk's backward works on 20 bytes per row x V, and from the second chunk on the slices' full-size
# bf16 gradients accumulate (2 more per T V).  Beside the flash (non in-place, 2 + 2) or row-wise
# (4) log-prob head, the twins measure 30 / 20 / 15 / 14 bytes per T V at 2048 / 4096 / 8192 / 16384
# tokens; priced as max(10 T + 20 r, 12 T + 16 r) V with r = min(T, 2048) (exact at 2048, 4096 and
# 16384, +7 % at 8192).  Without grad one chunk at a time: (2 T + 12 r) V, exact at every T.
#
# The temperature, after the kernel's backward.  Between the model and the head verl runs, in every
# version read (dp_actor._forward_micro_batch v0.3 to main; the engine worker's prepare_model_outputs
# from v0.6, there with a per-token temperature tensor):
#     logits_rmpad = output.logits.squeeze(0)    # a view
#     logits_rmpad.div_(temperature)             # in place, on a view of a tensor that requires grad
# Autograd rebases the view: the model output's grad_fn becomes CopySlices around the division's
# backward.  That node runs once the head's own backward has freed everything it saved, and holds at
# once four logits-sized bf16 buffers: the gradient the head produced (flash-attn's in-place one is the
# logits' own storage), a base-sized copy of it (new_empty_strided + copy_), the slice's contiguous
# clone handed to the division, and the division's output; it returns the copy, which the lm_head's
# backward then reads (lm_head_backward_bytes).  Without remove padding verl divides the output itself,
# no view: the gradient and the quotient, two buffers.  Under no_grad the division costs nothing.  So
# an update's head holds the larger of its kernel's stage (the tables below) and this one: 8 per T V
# packed, which is above flash-attn's in-place 2, the row-wise 4 and the compiled entropy's 6, and
# below the eager, checkpointed and chunked entropies.  verl's fused kernels take the temperature
# inside the kernel and rlplan's own heads (chunked, naive) divide nothing in place: no such stage.

_NO_ENTROPY = "none"
ENTROPY_CHUNK_ROWS = 2048
# The heads verl runs on its (bf16) logits after the in-place division by the temperature.
VERL_LOGITS_HEADS = ("flash_attn_ce", "torch_logprob")
_LOGITS_BYTES_PER_TOKEN_VOCAB = 2.0
# The buffers the division's backward holds at once (see above): packed (a view of the output) or padded.
_TEMPERATURE_BACKWARD_BUFFERS = {
    True: ("gradient from the head", "CopySlices' base-sized copy", "the slice's clone", "the quotient"),
    False: ("gradient from the head", "the quotient"),
}
# The kernels' own stage: log-probs and entropy, forward and backward, from the bf16 logits.
UPDATE_HEAD_BYTES: dict[str, dict[str, float]] = {
    "flash_attn_ce": {_NO_ENTROPY: 2.0, "eager": 14.0, "checkpointed": 14.0, "compiled": 6.0},
    "torch_logprob": {_NO_ENTROPY: 4.0, "eager": 16.0, "checkpointed": 16.0, "compiled": 6.0},
    "fused": dict.fromkeys((_NO_ENTROPY, "eager", "checkpointed", "chunked", "compiled"), 0.0),
    "chunked": dict.fromkeys((_NO_ENTROPY, "eager", "checkpointed", "chunked", "compiled"), 4.75),
}
_GPU_HEAD_FORWARD_BYTES = {_NO_ENTROPY: 2.0, "eager": 6.0, "checkpointed": 6.0, "compiled": 2.0}
FORWARD_HEAD_BYTES: dict[str, dict[str, float]] = {
    "flash_attn_ce": _GPU_HEAD_FORWARD_BYTES,
    "torch_logprob": _GPU_HEAD_FORWARD_BYTES,
    "fused": UPDATE_HEAD_BYTES["fused"],
    "chunked": {_NO_ENTROPY: 2.25, **dict.fromkeys(("eager", "checkpointed", "chunked", "compiled"), 2.75)},
}


def temperature_backward_bytes_per_token_vocab(head: str, *, packed: bool = True) -> float:
    """What the backward of verl's in-place division by the temperature holds at once, per T V (see above)."""
    if head not in VERL_LOGITS_HEADS:
        return 0.0
    return _LOGITS_BYTES_PER_TOKEN_VOCAB * len(_TEMPERATURE_BACKWARD_BUFFERS[packed])


def head_bytes_per_token_vocab(head: str, entropy: str, *, grad: bool, tokens: int, packed: bool = True) -> float:
    """The peak bytes per token x vocab of a GPU head (not "naive") as autograd runs verl's sequence, at
    `tokens` per micro batch: its kernel's own stage, then under grad the temperature's backward after it.

    `entropy` is verl's entropy variant ("none": log-probs only); `packed` is remove padding."""
    if entropy == "chunked" and head in VERL_LOGITS_HEADS:
        kernel = chunked_entropy_head_bytes_per_token_vocab(tokens, grad=grad)
    else:
        kernel = (UPDATE_HEAD_BYTES if grad else FORWARD_HEAD_BYTES)[head][entropy]
    if not grad:
        return kernel
    return max(kernel, temperature_backward_bytes_per_token_vocab(head, packed=packed))


def resolved_loss_head(plan: Plan) -> str:
    """The head kernel the plan is priced with: its own choice, or what its runtime would run ("auto")."""
    head = plan.actor.loss_head
    return head if head != "auto" else runtime_loss_head(plan)


def runtime_loss_head(plan: Plan) -> str:
    """The head the plan's runtime runs: verl's on GPUs, rlplan's own on its CPU ranks.

    verl's fused kernels replace the head; rlplan's bundled runtime on CPU runs its chunked lean
    head; a GPU plan with remove padding imports flash_attn (bert_padding), so verl's
    logprobs_from_logits finds its triton CE; without it flash-attn may be absent and verl
    falls back to the row-wise torch log-prob.
    """
    if plan.model.use_fused_kernels:
        return "fused"
    if plan.cluster.gpu.is_cpu:
        return "chunked"
    return "flash_attn_ce" if plan.model.use_remove_padding else "torch_logprob"


def entropy_variant(plan: Plan) -> str:
    """How verl computes entropy: compiled unless use_torch_compile is off, then chunked / checkpointed / eager."""
    actor = plan.actor
    if actor.use_torch_compile:
        return "compiled"
    if actor.entropy_from_logits_with_chunking:
        return "chunked"
    return "checkpointed" if actor.entropy_checkpointing else "eager"


# verl's fused kernels (verl/utils/kernel/kernels.py, default BackwardEnum._Split_Dlogits_N) build the
# logits' gradient one vocab split of this many columns at a time, in bf16, beside bf16 d_hidden / d_weight.
FUSED_DLOGITS_SPLIT_VOCAB = 9504


def lm_head_backward_bytes(plan: Plan, facts: ModelFacts, tokens: int) -> float:
    """What the lm_head's backward holds at once: the logits' bf16 gradient (one vocab split of it for
    the fused kernels) and the weight's bf16 gradient (none for a LoRA actor, whose lm_head is frozen).
    Where a head holds little more than the logits (flash-attn's in-place CE, fused) this is its peak."""
    weight_grad = 0 if plan.model.lora.enabled else 2 * facts.vocab * facts.hidden
    columns = min(facts.vocab, FUSED_DLOGITS_SPLIT_VOCAB) if resolved_loss_head(plan) == "fused" else facts.vocab
    return 2 * tokens * columns + weight_grad


def chunked_entropy_head_bytes_per_token_vocab(tokens: int, *, grad: bool) -> float:
    """A GPU log-prob head with verl's chunked entropy beside it, at `tokens` per micro batch (see above)."""
    t = max(1, tokens)
    rows = min(t, ENTROPY_CHUNK_ROWS)
    if grad:
        return max(10 * t + 20 * rows, 12 * t + 16 * rows) / t
    return (2 * t + 12 * rows) / t


def _entropy_priced(plan: Plan, entropy: bool) -> str:
    return entropy_variant(plan) if entropy else _NO_ENTROPY


def actor_head_bytes_per_token_vocab(plan: Plan, profile: Profile = DEFAULT_PROFILE, *, tokens: int) -> float:
    """Bytes per token x vocab the update's head holds at `tokens` per micro batch; verl computes entropy
    only when entropy_coeff != 0."""
    head = resolved_loss_head(plan)
    entropy = plan.actor.entropy_coeff != 0
    if head == "naive":
        if not entropy:
            return profile.head_log_prob_bytes
        if plan.actor.entropy_from_logits_with_chunking:
            return profile.head_chunked_entropy_bytes
        return profile.head_entropy_bytes
    return head_bytes_per_token_vocab(head, _entropy_priced(plan, entropy), grad=True, tokens=tokens,
                                      packed=plan.model.use_remove_padding)


def forward_head_bytes_per_token_vocab(plan: Plan, profile: Profile = DEFAULT_PROFILE, *,
                                       entropy: bool, tokens: int) -> float:
    """The no_grad head of the old-log-prob (entropy computed) and ref (log-probs only) passes."""
    head = resolved_loss_head(plan)
    if head == "naive":
        return profile.head_forward_only_bytes
    return head_bytes_per_token_vocab(head, _entropy_priced(plan, entropy), grad=False, tokens=tokens)


def training_components(
    facts: ModelFacts,
    state: TrainerState,
    *,
    tokens: int,
    micro_batches_per_mini: int,
    checkpointing: bool,
    activation_offload: bool,
    head_bytes_per_token_vocab: float,
    root_group_bytes: float,
    role: str,
    root_at_loss_bytes: float = 0.0,
    profile: Profile = DEFAULT_PROFILE,
    fp32_head: bool = True,
    lm_head_backward_bytes: float = 0.0,
) -> tuple[str, list[Component]]:
    """max(P_loss, P_bwd, P_opt) of memory-model.md 2.3 for one FSDP2 training step, as components."""
    t = tokens
    layer_act = facts.layer_activation_bytes_per_token
    kept_layers = min(facts.layers, profile.activation_offload_resident_layers)
    if checkpointing:
        per_layer = 2 * facts.hidden
        saved = (kept_layers if activation_offload else facts.layers) * t * per_layer
        saved_late = saved
    else:
        saved = kept_layers * t * layer_act if activation_offload else t * facts.activation_bytes_per_token
        saved_late = t * layer_act
    # Gradients persist across micro batches of gradient accumulation.
    accumulating_grads = state.grads if micro_batches_per_mini >= 2 else 0.0
    # The head's own peak, or the lm_head's backward after it (lm_head_backward_bytes), whichever is larger.
    head = max(head_bytes_per_token_vocab * t * facts.vocab, lm_head_backward_bytes)
    hidden_at_head = t * (8 * facts.hidden + 4)
    # FSDP2 never reshards the root after forward: its bf16 lm_head (or tied embedding) is still
    # gathered at the loss (measured with the tracker: 2 V h at Qwen2.5-7B's and 0.5B's loss peaks).
    loss = state.params + state.optimizer + accumulating_grads + saved + hidden_at_head + head + root_at_loss_bytes
    gather = 4 * facts.layer_params
    backward = (state.params + state.grads + state.optimizer + saved_late + t * layer_act + gather
                + state.reduce_scatter + root_group_bytes)
    optimizer_step = state.params + state.grads + state.optimizer + state.optimizer_step
    params = Component(f"{role}_params", int(state.params))
    optimizer = Component(f"{role}_optimizer_state", int(state.optimizer))
    # A caching allocator keeps the bf16 logits' block once they are freed, but the head's backward
    # then asks for fp32 blocks twice that size, which the cached block cannot serve: the GPU holds
    # the block on top of the allocated peak (torchtitan's G3 rows: reserved ~ allocated + 2 T V).
    # No tracker sees it, so it is overhead; it only shows where the head's peak is the step's peak.
    # A head that stays in bf16 (flash CE, the torch fallback) reuses the block: nothing cached.
    cached_block = 2 * t * facts.vocab if head and fp32_head else 0
    cached_logits = max(0.0, loss + cached_block - max(loss, backward, optimizer_step))
    if loss >= backward and loss >= optimizer_step:
        components = [params, optimizer]
        if accumulating_grads:
            components.append(Component(f"{role}_grads", int(accumulating_grads)))
        components += [Component("activations", int(saved)), Component("loss_head_hidden", hidden_at_head)]
        if head:
            components.append(Component("logits_head", int(head)))
        if root_at_loss_bytes:
            components.append(Component("root_group_unsharded", int(root_at_loss_bytes)))
        if cached_logits:
            components.append(Component("cached_logits_block", int(cached_logits), "overhead"))
        return "loss", components
    grads = Component(f"{role}_grads", int(state.grads))
    cached = [Component("cached_logits_block", int(cached_logits), "overhead")] if cached_logits else []
    if backward >= optimizer_step:
        return "backward", [
            params, grads, optimizer,
            Component("activations", int(saved_late)),
            Component("layer_backward_workspace", t * layer_act),
            Component("fsdp_all_gather_buffers", gather),
            Component("fsdp_reduce_scatter_buffer", int(state.reduce_scatter)),
            Component("root_group_unsharded", int(root_group_bytes)),
            *cached,
        ]
    return "optimizer_step", [params, grads, optimizer,
                              Component("optimizer_step_temporaries", int(state.optimizer_step)), *cached]


def forward_components(facts: ModelFacts, *, params_bytes: float, params_name: str, tokens: int,
                       head_bytes_per_token_vocab: float) -> list[Component]:
    """A no_grad forward pass: the larger of two moments that are never held together.

    In the layers: weights, the current + prefetched layer all-gather, layer-sized
    transients T (4h + 6I). At the head: weights, the root group's gathered bf16 lm_head
    (FSDP2 keeps the root unsharded after forward), the hidden states and the fp32
    log-prob / entropy temporaries c T V (measured with the tracker, memory-model.md 3).
    """
    params = Component(params_name, int(params_bytes))
    layers = [
        Component("fsdp_all_gather_buffers", 4 * facts.layer_params),
        Component("forward_transients", tokens * facts.forward_transient_bytes_per_token),
    ]
    if not head_bytes_per_token_vocab:
        return [params, *layers]
    head = [
        Component("root_group_unsharded", 2 * facts.vocab * facts.hidden),
        Component("loss_head_hidden", tokens * 4 * facts.hidden),
        Component("logits_head", int(head_bytes_per_token_vocab * tokens * facts.vocab)),
    ]
    if sum(c.bytes for c in head) >= sum(c.bytes for c in layers):
        return [params, *head]
    return [params, *layers]


# --- phases -------------------------------------------------------------------


class _StepContext:
    """What every phase of one plan shares; built once per predict_memory call."""

    __slots__ = ("plan", "profile", "facts", "layout", "shard", "actor", "critic", "actor_gpu", "critic_gpu",
                 "_budget", "resident_by_role", "_vllm_resident", "overhead", "on_cpu")

    def __init__(self, plan: Plan, profile: Profile, layout: PlanLayout) -> None:
        self.plan = plan
        self.profile = profile
        self.facts = model_facts(plan.model.arch)
        self.layout = layout
        self.shard = max(1, layout.parallel.fsdp_shard_size)
        self.actor = actor_state(plan, self.shard)
        self.critic = critic_state(plan, self.shard) if plan.uses_critic else None
        # The part of each role's state on the GPU (none of it under CPUOffloadPolicy).
        self.actor_gpu = on_gpu(self.actor, offloaded_by_policy(plan, "actor"))
        self.critic_gpu = on_gpu(self.critic, offloaded_by_policy(plan, "critic")) if self.critic else None
        self._budget: RolloutBudget | None = None
        self._vllm_resident: list[Component] | None = None
        self.on_cpu = plan.cluster.gpu.is_cpu
        # On rlplan's CPU runtime a rank is a process and what it measures is its resident set: the
        # interpreter and libraries take the place of the CUDA context.
        self.overhead = (
            Component("cpu_process_baseline", int(profile.cpu_trainer_process_gib * GIB), "overhead") if self.on_cpu
            else Component("cuda_context_and_nccl", int(profile.cuda_context_and_nccl_gib * GIB), "overhead"))
        self.resident_by_role = self._resident_by_role()

    @property
    def budget(self) -> RolloutBudget:
        if self._budget is None:
            self._budget = rollout_budget(self.plan, self.profile)
        return self._budget

    @property
    def vllm_resident(self) -> list[Component]:
        if self._vllm_resident is None:
            self._vllm_resident = self._vllm_components()
        return self._vllm_resident

    def _resident_by_role(self) -> dict[str, Component]:
        """Trainer state left on the GPU while another phase runs, by name (verl offloads between phases)."""
        plan = self.plan
        resident: dict[str, Component] = {}
        # Under offload_policy verl turns param_offload / optimizer_offload off: nothing to offload between phases.
        if not plan.actor.param_offload and self.actor_gpu.params:
            resident["actor_params"] = Component("actor_params", int(self.actor_gpu.params), "resident")
        if not plan.actor.optimizer_offload and self.actor_gpu.optimizer:
            resident["actor_optimizer_state"] = Component("actor_optimizer_state", int(self.actor_gpu.optimizer),
                                                          "resident")
        if plan.uses_reference and not plan.reference_is_actor and not ref_params_on_host(plan):
            resident["ref_params"] = Component(
                "ref_params", ref_param_bytes(plan, self.facts, self.shard), "resident")
        if self.critic_gpu is not None:
            if not plan.critic.param_offload and self.critic_gpu.params:
                resident["critic_params"] = Component("critic_params", int(self.critic_gpu.params), "resident")
            if not plan.critic.optimizer_offload and self.critic_gpu.optimizer:
                resident["critic_optimizer_state"] = Component("critic_optimizer_state",
                                                               int(self.critic_gpu.optimizer), "resident")
        return resident

    def _vllm_components(self) -> list[Component]:
        """The engine's share of the GPU while the trainer runs: the sleep residue, or everything without sleep.

        Asleep, vLLM keeps its context and CUDA-graph pool.  SGLang's memory saver pauses only the
        "weights" and "kv_cache" regions (verl async_sglang_server.py sleep: release tags
        ["kv_cache", "weights"]); its context and CUDA graphs stay, its buffers are freed to the allocator.
        """
        profile = self.profile
        engine = self.plan.rollout.name
        components = [Component(f"{engine}_context", int(profile.vllm_sleep_residual_gib * GIB), "resident")]
        if graph_pool := cuda_graph_pool_bytes(self.plan, profile):
            components.append(Component("cuda_graph_pool", int(graph_pool), "resident"))
        if not self.plan.rollout.free_cache_engine:
            budget = self.budget
            components += [
                Component(f"{engine}_weights", budget.weights_bytes, "resident"),
                Component(f"{engine}_activation", budget.activation_bytes, "resident"),
                Component(f"{engine}_non_torch", budget.non_torch_bytes, "resident"),
                Component("kv_cache", max(0, budget.kv_cache_bytes), "resident"),
            ]
        return components

    def phase(self, name: str, step: list[Component], *, loaded: tuple[str, ...], peak_at: str = "",
              step_is_trainer: bool = True, vllm_extra: tuple[Component, ...] = ()) -> PhaseMemory:
        """A phase: its own components, the other roles' resident state, vLLM's share, and the overheads.

        `loaded` names the resident state this phase has on the GPU as its own step components.
        The fragmentation reserve covers the trainer's caching-allocator memory, not vLLM's pools.
        On CPU each phase is one process's resident set: the engine runs in a process of its own (so a
        trainer phase holds none of it, and the rollout none of the trainer's state), and torch's CPU
        allocator keeps no cache to reserve for.
        """
        if self.on_cpu:
            if not step_is_trainer:
                engine_process = Component(f"{self.plan.rollout.name}_cpu_process_baseline",
                                           int(self.profile.cpu_rollout_process_gib * GIB), "overhead")
                return PhaseMemory(name, (*step, engine_process), peak_at)
            resident = [c for key, c in self.resident_by_role.items() if key not in loaded]
            return PhaseMemory(name, (*step, *resident, self.overhead), peak_at)
        resident = [c for key, c in self.resident_by_role.items() if key not in loaded]
        components = step + resident
        trainer_bytes = sum(c.bytes for c in (components if step_is_trainer else resident) if c.scope != "overhead")
        if step_is_trainer:
            components += self.vllm_resident
        components += vllm_extra
        components.append(self.overhead)
        # A calibrated allocator cache (profile.allocator_cache_gib) is held in trainer phases only: verl empties
        # the cache around the engine's wake-up and sleep (FSDP-vLLM sharding manager __enter__ / __exit__), so it
        # builds up over the trainer phases between two rollouts.
        cache = self.profile.allocator_cache_gib * GIB if step_is_trainer else 0.0
        components.append(
            Component("fragmentation_reserve", int(self.profile.fragmentation_fraction * trainer_bytes + cache),
                      "overhead"))
        return PhaseMemory(name, tuple(components), peak_at)


def _actor_update(ctx: _StepContext) -> PhaseMemory:
    plan, facts = ctx.plan, ctx.facts
    role = ctx.layout.actor_update
    peak_at, step = training_components(
        facts,
        ctx.actor_gpu,
        tokens=role.tokens_per_micro_batch,
        micro_batches_per_mini=role.micro_batches_per_mini,
        checkpointing=plan.model.gradient_checkpointing,
        activation_offload=plan.model.activation_offload,
        head_bytes_per_token_vocab=actor_head_bytes_per_token_vocab(plan, ctx.profile,
                                                                    tokens=role.tokens_per_micro_batch),
        fp32_head=resolved_loss_head(plan) == "naive",
        root_group_bytes=2 * facts.vocab * facts.hidden * (1 if facts.tied else 2),
        root_at_loss_bytes=2 * facts.vocab * facts.hidden,
        role="actor",
        profile=ctx.profile,
        lm_head_backward_bytes=lm_head_backward_bytes(plan, facts, role.tokens_per_micro_batch),
    )
    return ctx.phase(Phase.ACTOR_UPDATE, step, loaded=("actor_params", "actor_optimizer_state"), peak_at=peak_at)


def _actor_forward(ctx: _StepContext, name: str, role: RoleBatchLayout, *, entropy: bool) -> PhaseMemory:
    step = forward_components(ctx.facts, params_bytes=ctx.actor_gpu.params, params_name="actor_params",
                              tokens=role.tokens_per_micro_batch,
                              head_bytes_per_token_vocab=forward_head_bytes_per_token_vocab(
                                  ctx.plan, ctx.profile, entropy=entropy, tokens=role.tokens_per_micro_batch))
    return ctx.phase(name, step, loaded=("actor_params",))


def _ref_forward(ctx: _StepContext, role: RoleBatchLayout) -> PhaseMemory:
    if ctx.plan.reference_is_actor:
        return _actor_forward(ctx, Phase.REF_LOG_PROB, role, entropy=False)
    # Offloaded by FSDP itself, the reference's shards stay in host RAM: the GPU holds the gathered layers.
    on_gpu = 0 if ref_params_on_host(ctx.plan) else ref_param_bytes(ctx.plan, ctx.facts, ctx.shard)
    step = forward_components(ctx.facts, params_bytes=on_gpu,
                              params_name="ref_params", tokens=role.tokens_per_micro_batch,
                              head_bytes_per_token_vocab=forward_head_bytes_per_token_vocab(
                                  ctx.plan, ctx.profile, entropy=False, tokens=role.tokens_per_micro_batch))
    return ctx.phase(Phase.REF_LOG_PROB, step, loaded=("ref_params",))


def _critic_values(ctx: _StepContext, role: RoleBatchLayout) -> PhaseMemory:
    assert ctx.critic_gpu is not None
    step = forward_components(ctx.facts, params_bytes=ctx.critic_gpu.params, params_name="critic_params",
                              tokens=role.tokens_per_micro_batch, head_bytes_per_token_vocab=0.0)
    return ctx.phase(Phase.CRITIC_VALUES, step, loaded=("critic_params",))


def _critic_update(ctx: _StepContext, role: RoleBatchLayout) -> PhaseMemory:
    assert ctx.critic_gpu is not None
    facts = ctx.facts
    peak_at, step = training_components(
        facts,
        ctx.critic_gpu,
        tokens=role.tokens_per_micro_batch,
        micro_batches_per_mini=role.micro_batches_per_mini,
        checkpointing=ctx.plan.critic.gradient_checkpointing,
        activation_offload=False,
        head_bytes_per_token_vocab=0.0,
        # A value model keeps the embedding but has no lm_head.
        root_group_bytes=2 * facts.vocab * facts.hidden,
        role="critic",
        profile=ctx.profile,
    )
    return ctx.phase(Phase.CRITIC_UPDATE, step, loaded=("critic_params", "critic_optimizer_state"), peak_at=peak_at)


def weight_sync_gather_bytes(plan: Plan, facts: ModelFacts, bucket_bytes: int) -> int:
    """What verl holds on the GPU at once to push weights into vLLM.

    Full weights: one tensor's fp32 full_tensor() and its copy in rollout.dtype, plus one CUDA-IPC bucket.
    LoRA with the base already loaded by vLLM (load_format != dummy) pushes adapters only: FSDP2
    gathers them one tensor at a time, layered_summon one layer at a time (on FSDP1 with the layer's
    base), and FSDP1's summon_full_params the whole model.  A dummy load format makes the first sync
    push the bf16 base too.
    """
    n_lora = lora_params(plan)
    copy_bytes = plan.rollout.dtype_bytes
    full_bucket = min(bucket_bytes, copy_bytes * facts.params)
    if not n_lora:
        return (4 + copy_bytes) * facts.largest_tensor + full_bucket
    if plan.rollout.load_format == "dummy":
        return copy_bytes * facts.largest_tensor + full_bucket
    arch = plan.model.arch
    adapter_bucket = min(bucket_bytes, 2 * n_lora)
    fsdp1 = plan.actor.strategy == "fsdp"
    if plan.rollout.layered_summon:
        layer_base = 2 * facts.layer_params if fsdp1 else 0
        return layer_base + 6 * (n_lora // facts.layers) + adapter_bucket
    if fsdp1:
        return 2 * facts.params + 6 * n_lora + adapter_bucket
    largest_adapter = plan.model.lora.rank * max(arch.hidden_size, arch.intermediate_size, arch.q_width)
    return 6 * largest_adapter + adapter_bucket


def woken_for_weight_sync(plan: Plan, budget: RolloutBudget) -> tuple[Component, ...]:
    """The sleeping engine's memory resumed before the trainer's weights are pushed into it.

    Multi-stage wake (verl fsdp_workers.py rollout_mode: resume(tags=["weights"]), update_weights,
    empty_cache, then resume(tags=["kv_cache"])): only the engine's weights are back during the sync.
    Without it both regions are resumed at once, so trainer weights, engine weights and the KV cache
    meet (sglang issue 7009, memory-model.md 5.6, G11).  Without sleep, the whole engine budget is
    already among the resident components.
    """
    rollout = plan.rollout
    if not rollout.free_cache_engine:
        return ()
    woken = [Component(f"{rollout.name}_weights", budget.weights_bytes, "resident")]
    if not rollout.multi_stage_wake_up:
        woken.append(Component("kv_cache", max(0, budget.kv_cache_bytes), "resident"))
    return tuple(woken)


def _weight_sync(ctx: _StepContext) -> PhaseMemory:
    rollout = ctx.plan.rollout
    gather = weight_sync_gather_bytes(ctx.plan, ctx.facts, rollout.update_weights_bucket_megabytes * MIB)
    step = [
        Component("actor_params", int(ctx.actor_gpu.params)),
        Component("weight_sync_gather", gather),
    ]
    return ctx.phase(Phase.WEIGHT_SYNC, step, loaded=("actor_params",),
                     vllm_extra=woken_for_weight_sync(ctx.plan, ctx.budget))


def cuda_graph_pool_bytes(plan: Plan, profile: Profile) -> float:
    """The engine's captured CUDA graphs, outside its memory budget (0 with enforce_eager, and on a CPU, where
    vLLM compiles C++ kernels instead)."""
    if plan.rollout.enforce_eager or plan.cluster.gpu.is_cpu:
        return 0.0
    gib = profile.sglang_cuda_graph_pool_gib if plan.rollout.name == "sglang" else profile.cuda_graph_pool_gib
    return gib * GIB


def _rollout(ctx: _StepContext) -> PhaseMemory:
    budget = ctx.budget
    profile = ctx.profile
    engine = ctx.plan.rollout.name
    if ctx.on_cpu:
        # vLLM CPU: weights and the KV space in the engine's process (its baseline is added by phase()).
        cpu_step = [Component(f"{engine}_weights", budget.weights_bytes),
                    Component("kv_cache", max(0, budget.kv_cache_bytes))]
        return ctx.phase(Phase.ROLLOUT, cpu_step, loaded=(), step_is_trainer=False)
    step = [
        Component(f"{engine}_weights", budget.weights_bytes),
        Component(f"{engine}_activation", budget.activation_bytes),
        Component(f"{engine}_non_torch", budget.non_torch_bytes),
        Component("kv_cache", max(0, budget.kv_cache_bytes)),
        Component(f"{engine}_context", int(profile.vllm_sleep_residual_gib * GIB)),
    ]
    if not ctx.plan.rollout.enforce_eager:
        step.append(Component("cuda_graph_pool", int(cuda_graph_pool_bytes(ctx.plan, profile))))
    return ctx.phase(Phase.ROLLOUT, step, loaded=(), step_is_trainer=False)


def _policy_offloaded(role: str, state: TrainerState, ranks: int) -> list[Component]:
    """A node's pinned host copies under CPUOffloadPolicy: every rank's param, grad and AdamW shards."""
    return [
        Component(f"{role}_params_offloaded", int(ranks * state.params)),
        Component(f"{role}_grads_offloaded", int(ranks * state.grads)),
        Component(f"{role}_optimizer_offloaded", int(ranks * state.optimizer)),
    ]


def _host(ctx: _StepContext) -> HostMemory:
    plan, facts, profile = ctx.plan, ctx.facts, ctx.profile
    ranks = plan.cluster.gpus_per_node
    components: list[Component] = []
    if offloaded_by_policy(plan, "actor"):
        components += _policy_offloaded("actor", ctx.actor, ranks)
    else:
        if plan.actor.param_offload:
            components.append(Component("actor_params_offloaded", int(ranks * ctx.actor.params)))
        if plan.actor.optimizer_offload:
            components.append(Component("actor_optimizer_offloaded", int(ranks * ctx.actor.optimizer)))
    if plan.uses_reference and not plan.reference_is_actor and ref_params_on_host(plan):
        components.append(Component("ref_params_offloaded",
                                    ranks * ref_param_bytes(plan, facts, ctx.shard)))
    if ctx.critic is not None and offloaded_by_policy(plan, "critic"):
        components += _policy_offloaded("critic", ctx.critic, ranks)
    elif ctx.critic is not None:
        if plan.critic.param_offload:
            components.append(Component("critic_params_offloaded", int(ranks * ctx.critic.params)))
        if plan.critic.optimizer_offload:
            components.append(Component("critic_optimizer_offloaded", int(ranks * ctx.critic.optimizer)))
    if plan.model.activation_offload:
        tokens = ctx.layout.actor_update.tokens_per_micro_batch
        offloaded_layers = max(0, facts.layers - profile.activation_offload_resident_layers)
        per_layer = 2 * facts.hidden if plan.model.gradient_checkpointing else facts.layer_activation_bytes_per_token
        components.append(Component("activations_offloaded", ranks * offloaded_layers * tokens * per_layer))
    rollout = plan.rollout
    # SGLang's memory saver discards paused contents (verl enables no CPU backup in hybrid mode).
    if rollout.name == "vllm" and rollout.free_cache_engine and (rollout.sleep_level == 1 or rollout.layered_summon):
        components.append(Component("vllm_sleep_weights", ranks * ctx.budget.weights_bytes))
    if profile.shm_model_copies_per_node:
        components.append(Component("model_copy_shm", profile.shm_model_copies_per_node * 2 * facts.params))
    if ctx.on_cpu:
        # Each rank's process is priced per 'device' (its share of host RAM); the engine's process, its
        # weights and its KV space come on top of them: one engine per machine (runtime.workers).
        engine = ctx.budget
        components.append(Component("vllm_cpu_engine", int(profile.cpu_rollout_process_gib * GIB)
                                    + engine.weights_bytes + max(0, engine.kv_cache_bytes)))
        return HostMemory(tuple(components))
    components.append(Component("process_overhead", int(ranks * profile.host_process_gib_per_gpu * GIB)))
    return HostMemory(tuple(components))


def _step_phases(ctx: _StepContext) -> dict[str, Callable[[], PhaseMemory]]:
    """The phases this plan's step runs, in order, each built on demand."""
    layout = ctx.layout
    phases: dict[str, Callable[[], PhaseMemory]] = {
        Phase.WEIGHT_SYNC: lambda: _weight_sync(ctx),
        Phase.ROLLOUT: lambda: _rollout(ctx),
        Phase.OLD_LOG_PROB: lambda: _actor_forward(ctx, Phase.OLD_LOG_PROB, layout.old_log_prob, entropy=True),
    }
    ref, values, update = layout.ref_log_prob, layout.critic_values, layout.critic_update
    if ref is not None:
        phases[Phase.REF_LOG_PROB] = lambda: _ref_forward(ctx, ref)
    if ctx.critic is not None and values is not None and update is not None:
        phases[Phase.CRITIC_VALUES] = lambda: _critic_values(ctx, values)
        phases[Phase.CRITIC_UPDATE] = lambda: _critic_update(ctx, update)
    phases[Phase.ACTOR_UPDATE] = lambda: _actor_update(ctx)
    return phases


def predict_phase(plan: Plan, name: str, profile: Profile = DEFAULT_PROFILE,
                  layout: PlanLayout | None = None) -> PhaseMemory:
    """One phase of predict_memory alone, for searches that bisect one phase's knob."""
    builders = _step_phases(_StepContext(plan, profile, layout or plan_layout(plan)))
    if name not in builders:
        raise KeyError(f"{name!r} is not a phase of this plan's step: {', '.join(builders)}")
    return builders[name]()


def predict_memory(plan: Plan, profile: Profile = DEFAULT_PROFILE, layout: PlanLayout | None = None) -> MemoryReport:
    """Per-GPU peak of every phase, host RAM per node, and the rollout KV budget of one plan."""
    ctx = _StepContext(plan, profile, layout or plan_layout(plan))
    phases = [build() for build in _step_phases(ctx).values()]
    budget = ctx.budget
    notes: list[str] = []
    if budget.kv_cache_bytes <= 0:
        notes.append(f"{plan.rollout.name} weights and workspace exceed gpu_memory_utilization x GPU: "
                     "no room for a KV cache")
    elif not budget.holds_max_model_len:
        notes.append(f"the KV cache holds {budget.kv_cache_tokens} tokens, below max_model_len {budget.max_model_len}")
    if plan.rollout.free_cache_engine and not plan.rollout.multi_stage_wake_up:
        notes.append("without multi_stage_wake_up the KV cache is resumed before the weight sync: trainer weights, "
                     f"rollout weights and KV cache are on the GPU at once; rollout.multi_stage_wake_up = true keeps "
                     f"the {max(0, budget.kv_cache_bytes) / GIB:.2f} GiB KV cache paused until the trainer is offloaded")
    if (plan.rollout.name == "vllm" and plan.rollout.layered_summon and plan.rollout.sleep_level == 2
            and plan.rollout.free_cache_engine):
        notes.append("layered_summon forces vLLM sleep level 1: weights are copied to host RAM")
    return MemoryReport(
        phases=tuple(phases),
        host=_host(ctx),
        gpu_capacity_bytes=plan.cluster.gpu_memory_bytes,
        host_capacity_bytes=plan.cluster.host_memory_bytes_per_node,
        kv_cache_bytes=max(0, budget.kv_cache_bytes),
        kv_cache_tokens=budget.kv_cache_tokens,
        max_concurrent_sequences=budget.max_concurrent_sequences,
        rollout=budget,
        notes=tuple(notes),
    )


def at_max_length(plan: Plan) -> Plan:
    """The plan with its expected lengths dropped: every sequence priced at the maximum (worst case)."""
    return plan.evolve(data=attrs.evolve(plan.data, expected_prompt_length=None, expected_response_length=None))


def longest_expected_response_that_fits(plan: Plan, profile: Profile = DEFAULT_PROFILE) -> int:
    """The largest mean response length (at the plan's expected prompt length) the plan fits at.

    0 when even one-token responses do not fit; max_response_length when it fits at full length.
    Memory grows monotonically with the mean length (fixed micro batches hold m x mean tokens),
    so a bisection over predict_memory finds the boundary in log2(max_response_length) calls.
    """

    def fits(response: int) -> bool:
        data = attrs.evolve(plan.data, expected_response_length=response)
        return predict_memory(plan.evolve(data=data), profile).fits

    high = plan.data.max_response_length
    if fits(high):
        return high
    if not fits(1):
        return 0
    low = 1
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low

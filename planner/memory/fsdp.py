"""The FSDP training backend (verl's fsdp / fsdp2 workers): each role's sharded state, what of it the GPU
holds under the offload settings, the training step's and a no_grad forward's components, and the weight-sync
gather of full tensors."""

from __future__ import annotations

from typing import Literal

from attrs import frozen

from rlplan.planner.memory.model_facts import ModelFacts, lora_params, model_facts
from rlplan.planner.memory.report import Component
from rlplan.planner.plan import Plan
from rlplan.planner.profile import DEFAULT_PROFILE, Profile


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

"""The FSDP training backend (verl's fsdp / fsdp2 workers): each role's sharded state, what of it the GPU
holds under the offload settings, the training step's and a no_grad forward's components, and the weight-sync
gather of full tensors."""

from __future__ import annotations

from typing import Any, Literal

from rlplan.planner.layout import PlanLayout, RoleBatchLayout
from rlplan.planner.memory.heads import LossHead, root_gathered_at_head
from rlplan.planner.memory.model_facts import ModelFacts, lora_params, model_facts
from rlplan.planner.memory.report import FSDP_ALLOCATION_SHAPE, AllocationShape, Component, TrainerState
from rlplan.planner.plan import EngineRole, Plan
from rlplan.planner.profile import DEFAULT_PROFILE, Profile

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


def root_backward_components(plan: Plan, facts: ModelFacts, state: TrainerState, *, accumulating: bool,
                             role: Literal["actor", "critic"] = "actor") -> tuple[Component, ...]:
    """What an update holds once the layers' backward is done and the root-level groups' backward runs,
    beside its params and optimizer state (the "root_backward" stage of training_components).

    FSDP2 (verl's fully_shard of the root module) gathers the root group (the lm_head, and the embedding
    when tied) for the forward and reshards it only in its post-backward, which the final callback runs
    after every layer: the actor's lm_head bf16 weight gradient, made right after the head, waits through
    the whole layers' backward.  The stage then holds every layer's sharded gradient (all of them under
    gradient accumulation) and the embedding's backward:
      tied actor: one weight, so one autograd input buffer holds the lm_head's gradient until the
            embedding's arrives; the tracker adds the two out of place (autograd adds in place only into a
            plain tensor, and its fake tensors are a subclass; a GPU's in-place add saves that sum, 2 V h)
            while the last layer's reduce-scatter buffer is still held (freed at the next reduce-scatter);
      untied actor, and the critic (a value head, no lm_head): the embedding's group, resharded first,
            reduce-scatters its gradient: the bf16 gradient, its fp32 reduce-scatter input (4 V h) and the
            shard it produces.
    A LoRA actor's lm_head and embedding are frozen: no such stage (the layers' backward prices it)."""
    if role == "actor" and plan.model.lora.enabled:
        return ()
    weight = 2 * facts.vocab * facts.hidden
    lm_head = role == "actor"
    params = facts.params if lm_head else facts.critic_params
    root_params = facts.vocab * facts.hidden * (2 if lm_head and not facts.tied else 1)
    root_grads_share = 0.0 if accumulating else state.grads * root_params / params
    layer_grads = Component(f"{role}_grads", int(state.grads - root_grads_share))
    if lm_head and facts.tied:
        return (layer_grads, Component("root_group_unsharded", weight), Component("lm_head_grads", weight),
                Component("embedding_grads", weight), Component("tied_summed_grads", weight),
                Component("fsdp_reduce_scatter_buffer", int(state.reduce_scatter)))
    lm_head_held = (Component("root_group_unsharded", weight), Component("lm_head_grads", weight)) if lm_head else ()
    embedding_shard = 0.0 if accumulating else state.grads * facts.vocab * facts.hidden / params
    return (layer_grads, *lm_head_held, Component("embedding_grads", weight),
            Component("embedding_reduce_scatter_buffer", 2 * weight),
            Component("embedding_sharded_grads", int(embedding_shard)))


def loss_head_moment(kernel_bytes: float, lm_head_backward_bytes: float, *, logits_bytes: float, root_bytes: float,
                     root_gathered_at_head: bool) -> tuple[float, float]:
    """(the head's bytes, the gathered root group's bytes) at the update's loss moment, the larger of its moments.

    The head's kernel (after the forward, on the logits), or the lm_head's backward after it
    (lm_head_backward_bytes), whichever is larger.  Where FSDP2 keeps the root gathered from the forward into
    the backward (torch < 2.8, or the fused head, which runs inside the forward) its bf16 lm_head (or tied
    embedding) is held at both (measured with the tracker: 2 V h at Qwen2.5-7B's and 0.5B's loss peaks).
    Where the root is resharded after the forward, it is gathered only while the lm_head makes the bf16 logits
    (inside the forward) and again from the root's pre-backward, which runs once the logits' gradient is
    made, through the lm_head's backward: the kernel's own stage runs without it."""
    if root_gathered_at_head:
        return max(kernel_bytes, lm_head_backward_bytes), root_bytes
    with_root = max(lm_head_backward_bytes, logits_bytes if kernel_bytes else 0.0)
    if kernel_bytes > with_root + root_bytes:
        return kernel_bytes, 0.0
    return with_root, root_bytes


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
    root_backward: tuple[Component, ...] = (),
    root_gathered_at_head: bool = True,
) -> tuple[str, list[Component]]:
    """max(P_loss, P_bwd, P_opt) of memory-model.md 2.3 for one FSDP2 training step, as components, and
    the root groups' backward after the layers (root_backward_components) where the caller prices it.
    `root_gathered_at_head` False: the root group is resharded while the head's kernel runs
    (heads.root_gathered_at_head), see loss_head_moment.  training_moments gives every moment."""
    moments = training_moments(
        facts, state, tokens=tokens, micro_batches_per_mini=micro_batches_per_mini, checkpointing=checkpointing,
        activation_offload=activation_offload, head_bytes_per_token_vocab=head_bytes_per_token_vocab,
        root_group_bytes=root_group_bytes, role=role, root_at_loss_bytes=root_at_loss_bytes, profile=profile,
        lm_head_backward_bytes=lm_head_backward_bytes, root_backward=root_backward,
        root_gathered_at_head=root_gathered_at_head)
    totals = {name: sum(c.bytes for c in components) for name, components in moments}
    peak = _peak_moment(totals)
    components = dict(moments)[peak]
    # A caching allocator keeps the bf16 logits' block once they are freed, but the head's backward
    # then asks for fp32 blocks twice that size, which the cached block cannot serve: the GPU holds
    # the block on top of the allocated peak (torchtitan's G3 rows: reserved ~ allocated + 2 T V).
    # No tracker sees it, so it is overhead; it only shows where the head's peak is the step's peak.
    # A head that stays in bf16 (flash CE, the torch fallback) reuses the block: nothing cached.
    head = sum(c.bytes for c in dict(moments)["loss"] if c.name == "logits_head")
    cached_block = 2 * tokens * facts.vocab if head and fp32_head else 0
    cached_logits = max(0.0, totals["loss"] + cached_block - max(totals.values()))
    if cached_logits:
        components = [*components, Component("cached_logits_block", int(cached_logits), "overhead")]
    return peak, components


def _peak_moment(totals: dict[str, float]) -> str:
    """The moment with the most bytes; ties go to the loss, then the root's backward, then the layers' backward."""
    others = [totals["backward"], totals["optimizer_step"]]
    if totals["loss"] >= max(others + [totals.get("root_backward", 0.0)]):
        return "loss"
    if totals.get("root_backward", 0.0) > max(others):
        return "root_backward"
    return "backward" if totals["backward"] >= totals["optimizer_step"] else "optimizer_step"


def training_moments(
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
    lm_head_backward_bytes: float = 0.0,
    root_backward: tuple[Component, ...] = (),
    root_gathered_at_head: bool = True,
) -> list[tuple[str, list[Component]]]:
    """Every moment of one micro batch's training step in the order autograd reaches them, each with the
    components it holds: the loss (saved activations and the head), the layers' backward (one layer's
    workspace, its all-gather and reduce-scatter), the root groups' backward after the layers where the caller
    prices it, and the optimizer step at the mini batch's end.  training_components takes the largest; the
    caching allocator's replay (memory.allocator_trace) walks them all."""
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
    head, root_at_loss_bytes = loss_head_moment(
        head_bytes_per_token_vocab * t * facts.vocab, lm_head_backward_bytes, logits_bytes=2 * t * facts.vocab,
        root_bytes=root_at_loss_bytes, root_gathered_at_head=root_gathered_at_head)
    hidden_at_head = t * (8 * facts.hidden + 4)
    gather = 4 * facts.layer_params
    params = Component(f"{role}_params", int(state.params))
    optimizer = Component(f"{role}_optimizer_state", int(state.optimizer))
    grads = Component(f"{role}_grads", int(state.grads))
    loss = [params, optimizer]
    if accumulating_grads:
        loss.append(Component(f"{role}_grads", int(accumulating_grads)))
    loss += [Component("activations", int(saved)), Component("loss_head_hidden", hidden_at_head)]
    if head:
        loss.append(Component("logits_head", int(head)))
    if root_at_loss_bytes:
        loss.append(Component("root_group_unsharded", int(root_at_loss_bytes)))
    moments = [("loss", loss), ("backward", [
        params, grads, optimizer,
        Component("activations", int(saved_late)),
        Component("layer_backward_workspace", t * layer_act),
        Component("fsdp_all_gather_buffers", gather),
        Component("fsdp_reduce_scatter_buffer", int(state.reduce_scatter)),
        Component("root_group_unsharded", int(root_group_bytes)),
    ])]
    if root_backward:
        moments.append(("root_backward", [params, optimizer, *root_backward]))
    moments.append(("optimizer_step", [params, grads, optimizer,
                                       Component("optimizer_step_temporaries", int(state.optimizer_step))]))
    return moments


def forward_components(facts: ModelFacts, *, params_bytes: float, params_name: str, tokens: int,
                       head_bytes_per_token_vocab: float, root_gathered_at_head: bool = True) -> list[Component]:
    """A no_grad forward pass: the largest of moments that are never held together.

    In the layers: weights, the current + prefetched layer all-gather, layer-sized
    transients T (4h + 6I). At the head: weights, the root group's gathered bf16 lm_head, the last layer's
    all-gather output (FSDP2 frees a forward all-gather result only at the next group's unshard, and after
    the last layer none comes: FSDPParamGroup.wait_for_unshard's all_gather_state), the hidden states and the
    head's log-prob / entropy temporaries c T V (measured with the tracker, memory-model.md 3).
    Where the root is resharded after the forward (`root_gathered_at_head` False, heads.root_gathered_at_head)
    the root's post-forward frees both the lm_head and that last all-gather before the head's kernel runs;
    they are held only while the lm_head makes the bf16 logits (2 T V), inside the forward.
    """
    moments = forward_moments(facts, tokens=tokens, head_bytes_per_token_vocab=head_bytes_per_token_vocab,
                              root_gathered_at_head=root_gathered_at_head)
    # On a tie the head's moment is the one shown (the layers' comes first in time, last here).
    largest = max((components for _, components in [*moments[1:], moments[0]]),
                  key=lambda moment: sum(c.bytes for c in moment))
    return [Component(params_name, int(params_bytes)), *largest]


def forward_moments(facts: ModelFacts, *, tokens: int, head_bytes_per_token_vocab: float,
                    root_gathered_at_head: bool = True) -> list[tuple[str, list[Component]]]:
    """The moments of a no_grad forward over one micro batch in the order they come (the layers, then the head's),
    each with what it holds beside the parameters (forward_components explains them and takes the largest)."""
    layers = [
        Component("fsdp_all_gather_buffers", 4 * facts.layer_params),
        Component("forward_transients", tokens * facts.forward_transient_bytes_per_token),
    ]
    if not head_bytes_per_token_vocab:
        return [("layers", layers)]
    hidden = Component("loss_head_hidden", tokens * 4 * facts.hidden)
    root_and_last_gather = [
        Component("root_group_unsharded", 2 * facts.vocab * facts.hidden),
        Component("fsdp_all_gather_buffers", 2 * facts.layer_params),
    ]
    kernel = Component("logits_head", int(head_bytes_per_token_vocab * tokens * facts.vocab))
    if root_gathered_at_head:
        return [("layers", layers), ("head", [*root_and_last_gather, hidden, kernel])]
    return [("layers", layers),
            ("logits", [*root_and_last_gather, hidden, Component("logits_head", 2 * tokens * facts.vocab)]),
            ("head", [hidden, kernel])]


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


def fsdp_shard_size(layout: PlanLayout) -> int:
    return max(1, layout.parallel.fsdp_shard_size)


class FsdpBackend:
    """verl's FSDP and FSDP2 workers as the step's phases see them (memory.backend.TrainingBackend)."""

    def role_state(self, plan: Plan, role: Literal["actor", "critic"], layout: PlanLayout) -> TrainerState:
        shard = fsdp_shard_size(layout)
        return actor_state(plan, shard) if role == "actor" else critic_state(plan, shard)

    def state_on_gpu(self, plan: Plan, role: Literal["actor", "critic"], state: TrainerState) -> TrainerState:
        return on_gpu(state, offloaded_by_policy(plan, role))

    def resident_between_phases(self, plan: Plan, role: Literal["actor", "critic"],
                                state_on_gpu: TrainerState) -> list[Component]:
        """verl offloads params and optimizer state between phases when param_offload / optimizer_offload are
        set (under offload_policy it turns both off: nothing to offload between phases)."""
        section = plan.actor if role == "actor" else plan.critic
        resident = []
        if not section.param_offload and state_on_gpu.params:
            resident.append(Component(f"{role}_params", int(state_on_gpu.params), "resident"))
        if not section.optimizer_offload and state_on_gpu.optimizer:
            resident.append(Component(f"{role}_optimizer_state", int(state_on_gpu.optimizer), "resident"))
        return resident

    def resident_at_engine_start(self, plan: Plan, role: Literal["actor", "critic"],
                                 state_on_gpu: TrainerState) -> int:
        """The parameters param_offload leaves on the GPU (fsdp_workers.py init_model): the optimizer has no
        state yet (AdamW creates it at the first step) and no gradients exist."""
        return sum(c.bytes for c in self.resident_between_phases(plan, role, state_on_gpu)
                   if c.name.endswith("_params"))

    def host_components(self, plan: Plan, role: Literal["actor", "critic"], state: TrainerState,
                        ranks: int) -> list[Component]:
        if offloaded_by_policy(plan, role):
            # CPUOffloadPolicy pins every rank's param, grad and AdamW shards in host RAM.
            return state.host_copies(role, ranks, params=True, grads=True, optimizer=True)
        section = plan.actor if role == "actor" else plan.critic
        return state.host_copies(role, ranks, params=section.param_offload, grads=False,
                                 optimizer=section.optimizer_offload)

    def reference_params_bytes(self, plan: Plan, layout: PlanLayout) -> int:
        return ref_param_bytes(plan, model_facts(plan.model.arch), fsdp_shard_size(layout))

    def reference_params_on_host(self, plan: Plan) -> bool:
        return ref_params_on_host(plan)

    def _step_arguments(self, plan: Plan, role: Literal["actor", "critic"], state_on_gpu: TrainerState,
                        batch: RoleBatchLayout, head: LossHead | None, profile: Profile) -> dict[str, Any]:
        """training_components' arguments for one role's update (a value model keeps the embedding but has no
        lm_head)."""
        facts = model_facts(plan.model.arch)
        embedding = 2 * facts.vocab * facts.hidden
        common = {"tokens": batch.tokens_per_micro_batch, "micro_batches_per_mini": batch.micro_batches_per_mini,
                  "profile": profile, "role": role}
        if role == "critic":
            return {**common, "checkpointing": plan.critic.gradient_checkpointing, "activation_offload": False,
                    "head_bytes_per_token_vocab": 0.0, "root_group_bytes": embedding,
                    "root_backward": root_backward_components(plan, facts, state_on_gpu, role="critic",
                                                              accumulating=batch.micro_batches_per_mini >= 2)}
        assert head is not None
        return {**common, "checkpointing": plan.model.gradient_checkpointing,
                "activation_offload": plan.model.activation_offload,
                "head_bytes_per_token_vocab": head.bytes_per_token_vocab,
                "root_group_bytes": embedding * (1 if facts.tied else 2), "root_at_loss_bytes": embedding,
                "lm_head_backward_bytes": head.lm_head_backward_bytes,
                "root_backward": root_backward_components(plan, facts, state_on_gpu,
                                                          accumulating=batch.micro_batches_per_mini >= 2),
                "root_gathered_at_head": root_gathered_at_head(plan)}

    def update_components(self, plan: Plan, role: Literal["actor", "critic"], state_on_gpu: TrainerState,
                          batch: RoleBatchLayout, head: LossHead | None,
                          profile: Profile) -> tuple[str, list[Component]]:
        arguments = self._step_arguments(plan, role, state_on_gpu, batch, head, profile)
        fp32_head = head is not None and head.fp32
        return training_components(model_facts(plan.model.arch), state_on_gpu, fp32_head=fp32_head, **arguments)

    def update_moments(self, plan: Plan, role: Literal["actor", "critic"], state_on_gpu: TrainerState,
                       batch: RoleBatchLayout, head: LossHead | None,
                       profile: Profile) -> list[tuple[str, list[Component]]]:
        """Every moment of the update's micro batch (training_moments), for the allocator's replay."""
        arguments = self._step_arguments(plan, role, state_on_gpu, batch, head, profile)
        return training_moments(model_facts(plan.model.arch), state_on_gpu, **arguments)

    def forward_components(self, plan: Plan, *, params_bytes: float, params_name: str, tokens: int,
                           head_bytes_per_token_vocab: float, entropy: bool = False) -> list[Component]:
        # The entropy's temporaries are in head_bytes_per_token_vocab (heads.FORWARD_HEAD_BYTES).
        return forward_components(model_facts(plan.model.arch), params_bytes=params_bytes, params_name=params_name,
                                  tokens=tokens, head_bytes_per_token_vocab=head_bytes_per_token_vocab,
                                  root_gathered_at_head=root_gathered_at_head(plan))

    def forward_moments(self, plan: Plan, *, tokens: int, head_bytes_per_token_vocab: float,
                        entropy: bool = False) -> list[tuple[str, list[Component]]]:
        return forward_moments(model_facts(plan.model.arch), tokens=tokens,
                               head_bytes_per_token_vocab=head_bytes_per_token_vocab,
                               root_gathered_at_head=root_gathered_at_head(plan))

    def allocation_shape(self, plan: Plan, role: EngineRole, batch: RoleBatchLayout | None) -> AllocationShape:
        """FSDP's tensors as the allocator's replay takes them by default (report.AllocationShape)."""
        return FSDP_ALLOCATION_SHAPE

    def weight_sync_gather_bytes(self, plan: Plan, bucket_bytes: int) -> int:
        return weight_sync_gather_bytes(plan, model_facts(plan.model.arch), bucket_bytes)


FSDP = FsdpBackend()

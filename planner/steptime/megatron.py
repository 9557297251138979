"""verl's Megatron trainer's step time (the steptime.backend.TrainerTiming of strategy megatron).

A pass runs on a model-parallel group of TP x PP x CP ranks per data-parallel replica; one GPU's share of it is:

- compute: its tokens (the CP rank's slice of its replica's sequences) at the GPU class's MFU, the dense
  layers' FLOPs split over TP, the routed experts' too with sequence parallelism (each TP rank dispatches its
  slice; over ETP without it), the layers over PP; the vocabulary-parallel
  output layer over TP only, on the last stage, which paces the pipeline (`slowest_stage_flops`).  Backward is 2x the
  forward (1x with a frozen LoRA base); recompute adds the forward it repeats: all of it under full uniform
  recompute, its recompute_num_layers of each stage under full block recompute, the attention core's share
  under selective recompute (Korthikanti et al. 2022, arXiv 2205.05198, section 4).
- tensor parallelism's collectives: two per layer and pass over the layer's activations (tokens x hidden x
  2 bytes): an all-reduce each, or under sequence parallelism an all-gather before and a reduce-scatter after
  the TP region, the same bytes (Narayanan et al. 2021, arXiv 2104.04473, section 2.3; Korthikanti et al.
  section 4.2.2).  Not overlapped with compute (verl does not enable Megatron's tp_comm_overlap).
- expert parallelism: per MoE layer and pass two all-to-alls, the dispatch and the combine, each moving
  the rank's token copies (tokens x top-k x hidden x 2 bytes) x (EP - 1) / EP (Megatron-Core's
  MoEAlltoAllTokenDispatcher), the copies for ranks in the node over NVLink and those for other nodes'
  ranks over the network at once; with ETP > 1 the dispatcher's all-gather and reduce-scatter of the received
  tokens over the ETP group around the experts.
- context parallelism: the ring attention exchange, CP - 1 sends of the rank's K and V per layer in forward
  and of K, V and their gradients in backward (Megatron-Core's attention with cp_comm_type p2p), priced
  without crediting its overlap with the attention compute (an upper bound).
- pipeline parallelism: the 1F1B schedule's bubble, (PP - 1) / (VPP x m + PP - 1) of the pipeline's time
  for m micro batches per schedule (Narayanan et al. section 2.2), and the stage boundaries' point-to-point
  activations and their gradients.
- the data-parallel gradient sync once per optimizer step: the distributed optimizer's reduce-scatter of the
  fp32 gradients and all-gather of the updated bf16 weights, or an all-reduce without it, over the dense
  data-parallel group (world / (TP x PP), CP included) and the experts' (world / (EP x ETP x PP)); then AdamW
  over the rank's optimizer shard (its CPU-offloaded fraction on the node's CPUs).

The rates (MFU, collective efficiency, the fixed cost per micro batch and layer) are the profile's, fitted to
verl's FSDP runs; against 13 published Megatron runs (out of sample) docs/steptime.md gives its error.
"""

from __future__ import annotations

from rlplan.planner.arch import Architecture
from rlplan.planner.layout import RoleBatchLayout, plan_layout
from rlplan.planner.memory.megatron import (
    GRAD_BYTES,
    WEIGHT_BYTES,
    cpu_optimizer_fraction,
    parameters_on_most_loaded_rank,
    routed_expert_params_per_layer,
    stage_share,
    state_on_most_loaded_rank,
    trainable_fraction,
)
from rlplan.planner.memory.model_facts import ModelFacts, model_facts
from rlplan.planner.phases import Phase
from rlplan.planner.plan import MegatronSection, Plan
from rlplan.planner.profile import Profile
from rlplan.planner.steptime.lengths import workload_lengths
from rlplan.planner.steptime.passes import (
    StepContext,
    compute_dtype,
    entropy_seconds,
    fixed_micro_batch_seconds,
    pass_micro_batches,
    pass_sequence_length,
    tokens_per_gpu,
    training_flops_per_token,
)
from rlplan.planner.steptime.rates import Rates, ring_seconds

# Bytes of one activation element Megatron's collectives move (bf16).
ACTIVATION_BYTES = 2
# AdamW's HBM traffic per parameter of the optimizer shard: reads the fp32 master weight, the gradient and
# both moments and writes three of them back (the FSDP backend prices its optimizer step the same).
ADAMW_BYTES_PER_PARAM = 28.0


# --- the formulas, as pure functions ------------------------------------------------------------------------


def pipeline_bubble_fraction(pp: int, vpp: int, micro_batches: int) -> float:
    """The share of a 1F1B schedule's time its stages sit idle: (PP - 1) / (VPP x m + PP - 1) for m micro
    batches and VPP model chunks per stage (Narayanan et al. 2021, section 2.2: the bubble is (PP - 1) / (VPP m)
    of the ideal time)."""
    if pp <= 1:
        return 0.0
    return (pp - 1) / (vpp * max(micro_batches, 1) + pp - 1)


def tensor_parallel_seconds(tokens: float, hidden: int, layers: float, tp: int, bandwidth: float) -> float:
    """One pass's TP collectives on one rank: two per layer over tokens x hidden activations, each an
    all-reduce (2 x (TP-1)/TP of the bytes), or with sequence parallelism an all-gather and a reduce-scatter
    of the same bytes."""
    per_collective = 2 * ring_seconds(tokens * hidden * ACTIVATION_BYTES, tp, bandwidth)
    return 2 * layers * per_collective


def expert_all_to_all_seconds(tokens: float, hidden: int, top_k: int, moe_layers: float, ep: int,
                              ep_in_node: int, intranode: float, internode: float) -> float:
    """One pass's expert-parallel all-to-alls on one rank: dispatch and combine per MoE layer.

    Balanced routing sends a rank's token copies evenly to the EP ranks, 1 / EP to each
    (MoEAlltoAllTokenDispatcher's all_to_all_single, one input split per EP rank); NCCL's all-to-all is a send
    and a receive per peer, the `ep_in_node` - 1 peers in the node over NVLink while the EP - `ep_in_node`
    beyond it share the NIC, at once: the slower of the two sets the time. (Before: all EP - 1 shares at the
    NIC's rate once the group left the node, which priced EP 16 on two nodes 1.9x its network bytes.)
    """
    copies = tokens * top_k * hidden * ACTIVATION_BYTES
    within = copies * (max(ep_in_node, 1) - 1) / ep / intranode
    across = copies * (ep - max(ep_in_node, 1)) / ep / internode
    return 2 * moe_layers * max(within, across)


def expert_tensor_parallel_seconds(tokens: float, hidden: int, top_k: int, moe_layers: float, etp: int,
                                   bandwidth: float) -> float:
    """One pass's expert-tensor-parallel collectives on one rank: per MoE layer the all-to-all dispatcher
    all-gathers the tokens it received over the ETP group before the experts and reduce-scatters their outputs
    after (MoEAlltoAllTokenDispatcher with tp_size = ETP: gather_from_sequence_parallel_region and
    reduce_scatter_to_sequence_parallel_region over the expert TP group), each a ring over ETP of the ETP
    ranks' token copies."""
    gathered = etp * tokens * top_k * hidden * ACTIVATION_BYTES
    return 2 * moe_layers * ring_seconds(gathered, etp, bandwidth)


def context_parallel_ring_seconds(tokens: float, kv_width_per_rank: float, layers: float, cp: int,
                                  bandwidth: float) -> float:
    """One forward's ring attention exchange on one rank: CP - 1 sends of its K and V per layer."""
    if cp <= 1:
        return 0.0
    kv_bytes = tokens * 2 * kv_width_per_rank * ACTIVATION_BYTES
    return layers * (cp - 1) * kv_bytes / bandwidth


def gradient_sync_seconds(trainable_params: float, dp: int, bandwidth: float, *, distributed_optimizer: bool) -> float:
    """One optimizer step's data-parallel sync of a rank's `trainable_params`: the distributed optimizer's
    reduce-scatter of fp32 gradients and all-gather of bf16 weights, or an all-reduce of the gradients."""
    reduce_scatter = ring_seconds(GRAD_BYTES * trainable_params, dp, bandwidth)
    if distributed_optimizer:
        return reduce_scatter + ring_seconds(WEIGHT_BYTES * trainable_params, dp, bandwidth)
    return 2 * reduce_scatter


def host_and_device_seconds(device: float, host: float, *, routes_tokens: bool) -> float:
    """A pass's kernels on the GPU (`device` seconds) and the host work that launches them (`host`: Python and
    kernel launches, the fixed cost per micro batch and layer).  CUDA runs the launched kernels while the host
    launches the next ones, so a dense model's pass takes the longer of the two (each micro batch as long as its
    GEMMs or its launches: small micro batches are launch-bound, large ones compute-bound).  A MoE layer's token
    dispatcher waits for the GPU once a layer (the all-to-all's split sizes copied to the host:
    MoEAlltoAllTokenDispatcher's cuda sync point, DeepEP's received-token count alike), so the host's launches
    start only as the GPU drains and the two add up."""
    return device + host if routes_tokens else max(device, host)


def recomputed_forward_fraction(engine: MegatronSection, facts: ModelFacts, context: float) -> float:
    """The share of a forward that recompute runs again in backward."""
    if engine.recompute_granularity == "full":
        if engine.recompute_method == "block":
            layers_per_chunk = facts.layers / (engine.pipeline_model_parallel_size
                                               * (engine.virtual_pipeline_model_parallel_size or 1))
            return min(1.0, (engine.recompute_num_layers or 1) / layers_per_chunk)
        return 1.0
    if engine.recompute_granularity == "selective" and "core_attn" in engine.recompute_modules:
        # The attention core (softmax(QK^T)V): its FLOPs, per token of context.
        attention = facts.attention_flops_per_context_token * context
        return attention / facts.forward_flops_per_token(context)
    return 0.0


# --- one pass ---------------------------------------------------------------------------------------------


def _engine(plan: Plan, batch: RoleBatchLayout, critic: bool) -> MegatronSection:
    """The engine that runs the pass: the critic's, the reference's or the actor's (Plan.engine: verl's defaults where unset)."""
    return plan.engine("critic" if critic else "ref" if batch.role == Phase.REF_LOG_PROB else "actor")


def _routed_flops_share(arch: Architecture, facts: ModelFacts, context: float) -> float:
    """The share of a token's forward FLOPs in its routed experts (split over ETP rather than TP)."""
    if not arch.is_moe:
        return 0.0
    active = arch.num_moe_layers * routed_expert_params_per_layer(arch) * arch.num_experts_per_token / arch.num_experts
    return 2.0 * active / facts.forward_flops_per_token(context)


def slowest_stage_flops(flops: float, head_flops: float, routed_share: float, *, tp: int, routed_split: int,
                        stage: float, pp: int) -> float:
    """One GPU's share of a pass's `flops` on the pipeline's slowest stage.

    The layers' FLOPs split over TP (the routed experts' `routed_share` of all FLOPs over `routed_split`:
    `routed_split_of`) and over the stages (`stage`: the most loaded stage's share of the layers); the vocabulary-parallel output layer's
    `head_flops` split over TP only: under PP it runs on the last stage alone, which a 1F1B schedule cannot
    hide (every micro batch waits on the slowest stage; Megatron-Core's account_for_loss_in_pipeline_split /
    num_layers_in_last_pipeline_stage exist to move layers off that stage, which verl's runs do not set:
    megatron/core/transformer/transformer_config.py). At PP 1 the head is one more part of the rank's work.
    """
    if pp <= 1:
        return flops * ((1.0 - routed_share) / tp + routed_share / routed_split)
    routed = flops * routed_share
    layers = flops - routed - head_flops
    return (layers / tp + routed / routed_split) * stage + head_flops / tp


def routed_split_of(engine: MegatronSection) -> int:
    """Over how many ranks a replica's routed-expert FLOPs spread on each of its TP ranks' share.

    With sequence parallelism each TP rank dispatches its 1 / TP slice of the tokens (MoEAlltoAllTokenDispatcher
    takes the sequence-split hidden states); at ETP 1 its experts run those copies whole, at ETP = TP the ETP
    all-gather gives each rank TP slices' copies at 1 / ETP of each expert: TP either way, with balanced routing.
    Without it every TP rank routes all the replica's tokens and only ETP splits the experts' work.
    """
    tp = engine.tensor_model_parallel_size
    return tp if engine.sequence_parallel and tp > 1 else engine.expert_tensor_size


def _communication_seconds(ctx: StepContext, engine: MegatronSection, tokens: float, *, backward: bool,
                           recompute: float) -> float:
    """TP, EP, CP and the pipeline's point-to-point traffic of a forward (repeated `recompute` of itself) and,
    in an update, a backward over `tokens`: a backward runs the forward's TP collectives and all-to-alls once
    more (on the activations' gradients, frozen base or not) and sends K, V and their gradients round the ring."""
    arch, rates, world = ctx.plan.model.arch, ctx.rates, ctx.plan.cluster.world_size
    tp, pp, cp = engine.tensor_model_parallel_size, engine.pipeline_model_parallel_size, engine.context_parallel_size
    ep, etp = engine.expert_model_parallel_size, engine.expert_tensor_size
    forwards, backwards = 1.0 + recompute, 1.0 if backward else 0.0
    stage = stage_share(arch, engine)
    stage_layers = arch.num_layers * stage
    seconds = (forwards + backwards) * tensor_parallel_seconds(tokens, arch.hidden_size, stage_layers, tp,
                                                               rates.collective(tp))
    # Sequence parallelism leaves each TP rank a slice of the tokens to dispatch and to pass between stages.
    rank_tokens = tokens / tp if engine.sequence_parallel and tp > 1 else tokens
    if arch.is_moe and ep > 1:
        # Megatron orders the expert ranks ETP innermost, then EP (parallel_state's expert rank generator):
        # a node holds gpus_per_node / ETP consecutive EP ranks.
        ep_in_node = min(ep, max(1, rates.gpus_per_node // etp))
        seconds += (forwards + backwards) * expert_all_to_all_seconds(
            rank_tokens, arch.hidden_size, arch.num_experts_per_token, arch.num_moe_layers * stage, ep,
            ep_in_node, rates.intranode, rates.internode)
    if arch.is_moe and etp > 1:
        seconds += (forwards + backwards) * expert_tensor_parallel_seconds(
            rank_tokens, arch.hidden_size, arch.num_experts_per_token, arch.num_moe_layers * stage, etp,
            rates.collective(etp))
    seconds += (forwards + 2.0 * backwards) * context_parallel_ring_seconds(
        tokens, arch.kv_width / tp, stage_layers, cp, rates.collective(tp * cp))
    if pp > 1:
        # Each model chunk's boundary sends its activations forward and their gradients back.
        chunks = engine.virtual_pipeline_model_parallel_size or 1
        boundary_bytes = rank_tokens * arch.hidden_size * ACTIVATION_BYTES
        seconds += (1.0 + backwards) * chunks * boundary_bytes / rates.collective(world)
    return seconds


def _pipeline_seconds(ctx: StepContext, batch: RoleBatchLayout, engine: MegatronSection, *, critic: bool,
                      passes: float, backward: bool, recompute: float, entropy_passes: float) -> float:
    """A pass's compute (`passes` forward-equivalents of FLOPs) and communication on one GPU, stretched by the
    pipeline's bubble."""
    plan, rates, lengths = ctx.plan, ctx.rates, ctx.lengths
    facts = model_facts(plan.model.arch)
    tp, pp = engine.tensor_model_parallel_size, engine.pipeline_model_parallel_size
    tokens = tokens_per_gpu(plan, batch, lengths) * batch.epochs
    context = pass_sequence_length(plan, lengths) / 2
    routed = _routed_flops_share(plan.model.arch, facts, context)
    flops = tokens * training_flops_per_token(plan, facts, lengths, critic) * passes
    # The critic's value head (one output) replaces the vocabulary projection: nothing left to place.
    head_flops = 0.0 if critic else tokens * 2.0 * facts.vocab * facts.hidden * passes
    if backward and not critic and plan.model.mtp_trained_layers:
        # The update's MTP depths run on the last stage after the stack: each a dense layer, its 2h -> h
        # projection and its own output layer (mtp_patch.py), at the stack's per-layer cost.
        layer = (facts.forward_flops_per_token(context) - 2.0 * facts.vocab * facts.hidden) / facts.layers
        depth = layer + 4.0 * facts.hidden * facts.hidden + 2.0 * facts.vocab * facts.hidden
        mtp_flops = tokens * plan.model.mtp_trained_layers * depth * passes
        flops += mtp_flops
        head_flops += mtp_flops
    # The most loaded stage sets the pipeline's pace (ceil(layers / PP) of them where PP does not divide).
    stage = stage_share(plan.model.arch, engine)
    compute = slowest_stage_flops(flops, head_flops, routed, tp=tp, routed_split=routed_split_of(engine),
                                  stage=stage, pp=pp)
    micro_batches = pass_micro_batches(plan, batch, lengths)
    host = fixed_micro_batch_seconds(facts.layers * stage, micro_batches, ctx.profile, passes)
    busy = host_and_device_seconds(compute / rates.train_flops(compute_dtype(plan, critic)), host,
                                   routes_tokens=plan.model.arch.is_moe)
    busy += _communication_seconds(ctx, engine, tokens, backward=backward, recompute=recompute)
    # The last stage computes the entropy over its vocabulary-parallel logits while the others wait.
    busy += entropy_passes * entropy_seconds(facts, tokens, rates, ctx.profile) / tp
    schedules = max(1, batch.mini_batches_per_epoch * batch.epochs)
    bubble = pipeline_bubble_fraction(pp, engine.virtual_pipeline_model_parallel_size or 1,
                                      micro_batches // schedules)
    return busy / (1.0 - bubble)


def largest_bubble_fraction(plan: Plan, profile: Profile) -> float:
    """The largest pipeline bubble among the actor's passes (the update's schedule per mini batch, the
    log-prob pass's), as `_pipeline_seconds` prices them: interleaving (VPP) can save at most this share of the
    trainer's time, so the solver tries it only where that could beat its best plan."""
    engine = plan.actor.mcore
    pp, vpp = engine.pipeline_model_parallel_size, engine.virtual_pipeline_model_parallel_size or 1
    if pp <= 1:
        return 0.0
    layout, lengths = plan_layout(plan), workload_lengths(plan, profile)
    bubbles = [pipeline_bubble_fraction(pp, vpp, pass_micro_batches(plan, batch, lengths)
                                        // max(1, batch.mini_batches_per_epoch * batch.epochs))
               for batch in (layout.actor_update, layout.old_log_prob)]
    return max(bubbles)


def _trainable_fraction(plan: Plan, critic: bool) -> float:
    """The share of parameters that train: a Megatron-Bridge adapter's (memory.megatron owns it), or all."""
    return trainable_fraction(plan, "critic" if critic else "actor")


def _optimizer_seconds(ctx: StepContext, batch: RoleBatchLayout, engine: MegatronSection, critic: bool) -> float:
    """Every optimizer step's gradient sync over DP and AdamW over the rank's shard."""
    plan, rates = ctx.plan, ctx.rates
    world, pp = plan.cluster.world_size, engine.pipeline_model_parallel_size
    params = parameters_on_most_loaded_rank(plan.model.arch, engine, mtp_layers=0 if critic else plan.model.mtp_layers)
    trainable = _trainable_fraction(plan, critic)
    dense_dp = max(1, world // engine.model_parallel_size)
    expert_dp = max(1, engine.expert_data_parallel_size(world))
    # The data-parallel groups span every rank but the pipeline's: a node while world / PP fits in one.
    bandwidth = rates.collective(max(1, world // pp))
    distributed = engine.use_distributed_optimizer
    sync = (gradient_sync_seconds(trainable * params.dense, dense_dp, bandwidth, distributed_optimizer=distributed)
            + gradient_sync_seconds(trainable * params.experts, expert_dp, bandwidth,
                                    distributed_optimizer=distributed))
    shard = trainable * (params.dense / (dense_dp if distributed else 1)
                         + params.experts / (expert_dp if distributed else 1))
    on_cpu = cpu_optimizer_fraction(plan, "critic" if critic else "actor")
    adamw = ((1.0 - on_cpu) * ADAMW_BYTES_PER_PARAM * shard / rates.hbm
             + on_cpu * shard * rates.gpus_per_node / ctx.profile.cpu_adam_params_per_s)
    return batch.optimizer_steps_per_step * (sync + adamw)


class MegatronTiming:
    """Megatron-Core's passes as verl's megatron workers run them (one pipeline schedule per mini batch)."""

    def forward_seconds(self, ctx: StepContext, batch: RoleBatchLayout, *, critic: bool, entropy: bool) -> float:
        engine = _engine(ctx.plan, batch, critic)
        return _pipeline_seconds(ctx, batch, engine, critic=critic, passes=1.0, backward=False, recompute=0.0,
                                 entropy_passes=1.0 if entropy else 0.0)

    def update_seconds(self, ctx: StepContext, batch: RoleBatchLayout, *, critic: bool) -> float:
        plan = ctx.plan
        engine = _engine(plan, batch, critic)
        facts = model_facts(plan.model.arch)
        frozen_base = _trainable_fraction(plan, critic) < 1.0
        recompute = recomputed_forward_fraction(engine, facts, pass_sequence_length(plan, ctx.lengths) / 2)
        # Backward costs 2x forward, 1x with a frozen base (activation grads only); recompute adds its share.
        passes = (2.0 if frozen_base else 3.0) + recompute
        entropy_passes = 2.0 if not critic and plan.actor.entropy_coeff != 0 else 0.0
        pipeline = _pipeline_seconds(ctx, batch, engine, critic=critic, passes=passes, backward=True,
                                     recompute=recompute, entropy_passes=entropy_passes)
        return pipeline + _optimizer_seconds(ctx, batch, engine, critic)

    def weight_sync_gather_seconds(self, ctx: StepContext) -> float:
        return weight_sync_gather_seconds(ctx.plan, ctx.rates)

    def offload_seconds(self, ctx: StepContext) -> float:
        return offload_seconds(ctx.plan, ctx.rates)


def weight_sync_gather_seconds(plan: Plan, rates: Rates) -> float:
    """Every rank ends the gather with the full bf16 weights, tensor by tensor (verl's per-tensor export):
    its stage's dense layers all-gathered over TP, its experts over EP x ETP, and the other stages' broadcast
    over PP.  A Megatron-Bridge adapter that is not merged is all the sync moves."""
    engine, world = plan.actor.mcore, plan.cluster.world_size
    tp, pp = engine.tensor_model_parallel_size, engine.pipeline_model_parallel_size
    lora = plan.model.lora
    if lora.enabled and not lora.merge:
        adapter = _trainable_fraction(plan, critic=False) * model_facts(plan.model.arch).params
        return ring_seconds(WEIGHT_BYTES * adapter, tp * pp, rates.collective(tp * pp))
    params = parameters_on_most_loaded_rank(plan.model.arch, engine)
    expert_group = engine.expert_model_parallel_size * engine.expert_tensor_size
    seconds = ring_seconds(WEIGHT_BYTES * params.dense * tp, tp, rates.collective(tp))
    seconds += ring_seconds(WEIGHT_BYTES * params.experts * expert_group, expert_group, rates.collective(expert_group))
    stage_bytes = WEIGHT_BYTES * (params.dense * tp + params.experts * expert_group)
    return seconds + ring_seconds(stage_bytes * pp, pp, rates.collective(world))


def _role_state_bytes(plan: Plan, engine: MegatronSection, critic: bool) -> tuple[float, float, float]:
    """A role's (weights, gradients, optimizer state on the GPU) bytes on its most loaded rank."""
    state = state_on_most_loaded_rank(plan.model.arch, engine, plan.cluster.world_size,
                                      _trainable_fraction(plan, critic),
                                      mtp_layers=0 if critic else plan.model.mtp_layers)
    on_cpu = cpu_optimizer_fraction(plan, "critic" if critic else "actor")
    return state.weights, state.grads, state.optimizer * (1.0 - on_cpu)


def offload_seconds(plan: Plan, rates: Rates) -> float:
    """PCIe traffic of verl's Megatron offload between phases (megatron_workers.py): weights loaded and
    offloaded around the old-log-prob pass, the update and the weight sync; gradients and the optimizer state
    around the update; the reference's weights copied in for its pass; the critic's around its two passes."""
    moved = 0.0
    actor = plan.actor.mcore
    weights, grads, optimizer = _role_state_bytes(plan, actor, critic=False)
    if actor.param_offload:
        moved += 3 * 2 * weights
    if actor.grad_offload or actor.param_offload:
        moved += 2 * grads
    if actor.optimizer_offload:
        moved += 2 * optimizer
    reference = plan.engine("ref")
    if plan.uses_reference and not plan.reference_is_actor and reference.param_offload:
        moved += _role_state_bytes(plan, reference, critic=False)[0]
    if plan.uses_critic:
        critic = plan.engine("critic")
        weights, grads, optimizer = _role_state_bytes(plan, critic, critic=True)
        if critic.param_offload:
            moved += 2 * 2 * weights + 2 * grads
        if critic.optimizer_offload:
            moved += 2 * optimizer
    return moved / rates.pcie


MEGATRON_TIMING = MegatronTiming()

"""The Megatron backend's search space: the discrete knobs of a Megatron plan and how a plan takes them.

What `training_choices` is for FSDP, `megatron_choices` is for verl's Megatron workers: every tensor (TP),
pipeline (PP), context (CP), expert (EP) and expert-tensor (ETP) parallel size the rules allow for the model
and the world, with the distributed optimizer on, and verl's param / optimizer offload and Megatron's full
recompute as the memory-saving steps (in the order FSDP's are tried: recompute before offload, as it costs
compute rather than host traffic). The search loop (search.py) prices each choice as it prices an FSDP one,
through `MEGATRON_SPACE` (space.py's `SEARCH_SPACES`): layout by layout, each kept at its first fitting choice,
and a fitting layout's interleaved (VPP) variants tried right after it (`MegatronSpace.next_variant`).

Sizes follow the rules in planner/rules/parallel.py (one owner each): TP within a node and dividing the attention and
KV heads (megatron_heads_divide_tp), TP x PP x CP dividing the world (megatron_world_divides), EP dividing the
experts and EP x ETP x PP the world (megatron_experts_divide), sequence parallel wherever TP > 1 (required with
MoE and EP: megatron_moe_tp_needs_sequence_parallel). A layer count no pipeline size divides (DeepSeek-V3's 61)
is placed unevenly through override_transformer_config's num_layers_in_first / last_pipeline_stage, as verl's
DeepSeek recipe does.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs
from attrs import frozen

from rlplan.planner.arch import Architecture
from rlplan.planner.hardware import Cluster
from rlplan.planner.memory.megatron import state_on_most_loaded_rank
from rlplan.planner.memory.model_facts import model_facts
from rlplan.planner.phases import Phase
from rlplan.planner.plan import LoraConfig, MegatronSection, Plan, uneven_stage_layers
from rlplan.planner.solver.budgets import gpu_limit_bytes
from rlplan.planner.solver.choices import KNOB, knob, knob_fields, pinned_value
from rlplan.planner.solver.request import STEP_TIME_TOLERANCE, Candidate, SolveRequest
from rlplan.planner.solver.workload import _mini_batch_size, lora_ranks, workload_plan
from rlplan.planner.stack import verl_sleep_level
from rlplan.planner.steptime.megatron import largest_bubble_fraction

# Megatron-Bridge's LoRA target modules (verl's Megatron LoRA examples; rule megatron_lora_targets_megatron_modules).
BRIDGE_LORA_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
BRIDGE_MLA_LORA_TARGETS = ("linear_q_down_proj", "linear_q_up_proj", "linear_kv_down_proj", "linear_kv_up_proj",
                           "linear_proj", "linear_fc1", "linear_fc2")
# Pipelines deeper than this leave each stage too few layers to hide the bubble (verl's largest recipe,
# DeepSeek-V3 671B on 256 GPUs, runs PP 16).
MAX_PIPELINE = 16
# Context parallelism is tried from this sequence length up (below it a sequence fits a rank's activations).
CONTEXT_PARALLEL_FROM = 8192
# (param_offload, optimizer_offload) of verl's Megatron engine, least memory-saving first.
OFFLOAD_STEPS = ((False, False), (False, True), (True, True))
@frozen(kw_only=True)
class MegatronChoice:
    """The discrete knobs of a Megatron plan's training side (one engine for actor, reference and critic)."""

    lora_rank: int = knob("model.lora.rank")
    tensor: int = knob("actor.megatron.tensor_model_parallel_size")
    pipeline: int = knob("actor.megatron.pipeline_model_parallel_size")
    context: int = knob("actor.megatron.context_parallel_size")
    expert: int = knob("actor.megatron.expert_model_parallel_size")
    # None: the experts take the dense layers' TP (dense models).
    expert_tensor: int | None = knob("actor.megatron.expert_tensor_parallel_size")
    # VPP model chunks per stage (None: no interleaving); tried only on a layout that already fits
    # (`next_interleaved`).
    virtual_pipeline: int | None = knob("actor.megatron.virtual_pipeline_model_parallel_size", default=None)
    param_offload: bool = knob("actor.megatron.param_offload")
    optimizer_offload: bool = knob("actor.megatron.optimizer_offload")
    # Megatron's full recompute, one layer at a time (uniform): the solver loop's "checkpointing" step.
    recompute: bool = knob("actor.megatron.recompute_granularity", pinned_as=lambda granularity: granularity == "full")

    @property
    def gradient_checkpointing(self) -> bool:
        return self.recompute

    @property
    def resident_key(self) -> tuple:
        """What the trainer leaves resident between phases: recompute and VPP change only the update's
        activations, and EP x ETP is what splits the experts' state (ETP = TP at EP holds what ETP 1 at EP x TP
        does, and gathers less for the weight sync), so the rollout sized beside one is sized for the other."""
        return (self.lora_rank, self.tensor, self.pipeline, self.context, self.expert * (self.expert_tensor or 1),
                self.param_offload, self.optimizer_offload)

    @property
    def savings(self) -> int:
        return self.param_offload + self.optimizer_offload + self.recompute

    @property
    def shape_key(self) -> tuple:
        """The choice without its memory-saving steps: one per parallel layout and LoRA rank."""
        return (self.lora_rank, self.tensor, self.pipeline, self.context, self.expert, self.expert_tensor,
                self.virtual_pipeline)


def powers_of_two(limit: int) -> Iterator[int]:
    value = 1
    while value <= limit:
        yield value
        value *= 2


def tensor_options(arch: Architecture, cluster: Cluster) -> list[int]:
    """TP within a node (its all-reduces need NVLink) dividing the world, the heads and the KV heads."""
    return [tp for tp in powers_of_two(max(cluster.gpus_per_node, 1))
            if cluster.world_size % tp == 0 and arch.num_attention_heads % tp == 0
            and (arch.is_mla or arch.num_kv_heads % tp == 0)]


def pipeline_options(arch: Architecture, world: int, tp: int) -> list[int]:
    """PP dividing the world over TP, up to MAX_PIPELINE stages of at least two layers each."""
    return [pp for pp in powers_of_two(min(MAX_PIPELINE, arch.num_layers // 2 or 1)) if world % (tp * pp) == 0]


def context_options(sequence_len: int, world: int, model_parallel: int) -> list[int]:
    """CP 1, and for long sequences 2 and 4 where the world still divides."""
    options = [1]
    if sequence_len >= CONTEXT_PARALLEL_FROM:
        options += [cp for cp in (2, 4) if world % (model_parallel * cp) == 0]
    return options


def expert_options(arch: Architecture, world: int, pp: int, tp: int = 1) -> list[tuple[int, int | None]]:
    """(EP, ETP): a dense model has none; a MoE model's routed experts over EP (dividing the experts, EP x ETP
    x PP dividing the world: megatron_experts_divide). At ETP 1, as verl's MoE examples run them, the two largest
    EPs (all-to-all within fewer ranks costs memory the search would reject anyway); at ETP = TP (Megatron's
    default: each expert split like the dense MLPs, a routed token's activations over ETP for an all-gather and
    a reduce-scatter over ETP per MoE layer) the largest EP only: it is the layout that saves memory, and a
    smaller EP there holds the experts of an ETP-1 layout with more activations."""
    if not arch.is_moe:
        return [(1, None)]
    options: list[tuple[int, int | None]] = []
    for etp, keep in ((1, 2), (tp, 1)) if tp > 1 else ((1, 2),):
        valid = [ep for ep in powers_of_two(arch.num_experts)
                 if arch.num_experts % ep == 0 and world % (ep * etp * pp) == 0]
        options += [(ep, etp) for ep in valid[-keep:]]
    return options


# Virtual pipeline sizes tried on a layout that fits: the interleaved schedule's bubble falls as 1 / VPP while its
# stage-boundary sends grow as VPP, so a few chunks take most of the gain (verl's and Megatron's examples run 2).
VIRTUAL_PIPELINE_SIZES = (2, 4)


def virtual_pipeline_options(layers: int, pp: int) -> list[int]:
    """VPP sizes for PP > 1 whose PP x VPP chunks split the layers evenly (megatron_layers_divide_pipeline),
    each chunk at least two layers (the pipeline search's floor per stage); none where the layers are placed
    unevenly over the stages, which the interleaved schedule's even chunks cannot take."""
    if pp <= 1 or layers % pp:
        return []
    return [vpp for vpp in VIRTUAL_PIPELINE_SIZES if layers % (pp * vpp) == 0 and layers // (pp * vpp) >= 2]


def next_interleaved(choice: MegatronChoice, layers: int) -> MegatronChoice | None:
    """A fitting choice's next VPP variant at the same memory-saving steps: the smallest VPP above its own.

    A variant holds the same state and more micro batches in flight (memory.megatron.in_flight_micro_batches),
    so it fits only where its base does; its bubble shrinks as 1 / VPP while its stage-boundary sends grow as
    VPP, so the search goes on to the next size only while the last one was faster (the solver's loop)."""
    larger = [vpp for vpp in virtual_pipeline_options(layers, choice.pipeline) if vpp > (choice.virtual_pipeline or 1)]
    return attrs.evolve(choice, virtual_pipeline=larger[0]) if larger else None


def megatron_choices(arch: Architecture, cluster: Cluster, sequence_len: int,
                     lora_ranks: Sequence[int]) -> Iterator[MegatronChoice]:
    """Every Megatron layout the rules allow on this model and world, each with its memory-saving steps."""
    world = cluster.world_size
    for rank in lora_ranks:
        for tp in tensor_options(arch, cluster):
            for pp in pipeline_options(arch, world, tp):
                for cp, (ep, etp) in itertools.product(context_options(sequence_len, world, tp * pp),
                                                       expert_options(arch, world, pp, tp)):
                    for (param_offload, optimizer_offload), recompute in itertools.product(OFFLOAD_STEPS,
                                                                                          (False, True)):
                        yield MegatronChoice(lora_rank=rank, tensor=tp, pipeline=pp, context=cp, expert=ep,
                                             expert_tensor=etp, param_offload=param_offload,
                                             optimizer_offload=optimizer_offload, recompute=recompute)


def pinned_choices(choices: Sequence[MegatronChoice], pins: dict[str, Any]) -> list[MegatronChoice]:
    """The choices a pin allows; a pinned size outside the space replaces the space's sizes (the rules judge it)."""
    kept = list(choices)
    for attribute in knob_fields(MegatronChoice):
        if attribute.metadata[KNOB] in pins:
            value = pinned_value(attribute, pins[attribute.metadata[KNOB]])
            matching = [c for c in kept if getattr(c, attribute.name) == value]
            kept = matching or list({attrs.evolve(c, **{attribute.name: value}) for c in kept})
    return kept


def state_fits(choice: MegatronChoice, arch: Architecture, world: int, limit_bytes: int) -> bool:
    """Whether the update's weights, gradients and optimizer shard alone (verl loads every offloaded part back
    for the update) leave room on the GPU: a layout whose state does not fit cannot fit at any token budget,
    whatever its offload or recompute, and is not priced."""
    trainable = arch.lora_params(choice.lora_rank) / model_facts(arch).params if choice.lora_rank else 1.0
    return state_on_most_loaded_rank(arch, engine_for(choice), world, trainable).total < limit_bytes


def most_saving_per_shape(choices: Sequence[MegatronChoice]) -> list[MegatronChoice]:
    """Offload and recompute only ever lower memory: if a layout fits at all, its most saving choice does."""
    groups: dict[tuple, MegatronChoice] = {}
    for choice in choices:
        if choice.shape_key not in groups or choice.savings > groups[choice.shape_key].savings:
            groups[choice.shape_key] = choice
    return list(groups.values())


def megatron_skeleton(plan: Plan) -> Plan:
    """A neutral plan made a Megatron one: verl's Megatron workers, none of FSDP's knobs."""
    return plan.evolve(
        actor=attrs.evolve(plan.actor, strategy="megatron", megatron=MegatronSection(), ulysses_sequence_parallel_size=1,
                           fsdp_size=-1, param_offload=False, optimizer_offload=False, offload_policy=False),
        ref=attrs.evolve(plan.ref, param_offload=False, megatron=None),
        critic=attrs.evolve(plan.critic, param_offload=False, optimizer_offload=False, offload_policy=False,
                            ulysses_sequence_parallel_size=1, megatron=None),
        rollout=attrs.evolve(plan.rollout, layered_summon=False),
    )


def engine_for(choice: MegatronChoice) -> MegatronSection:
    return MegatronSection(
        tensor_model_parallel_size=choice.tensor, pipeline_model_parallel_size=choice.pipeline,
        virtual_pipeline_model_parallel_size=choice.virtual_pipeline, context_parallel_size=choice.context,
        expert_model_parallel_size=choice.expert, expert_tensor_parallel_size=choice.expert_tensor, sequence_parallel=choice.tensor > 1,
        use_distributed_optimizer=True, param_offload=choice.param_offload, optimizer_offload=choice.optimizer_offload,
        recompute_granularity="full" if choice.recompute else None,
        recompute_method="uniform" if choice.recompute else None,
        recompute_num_layers=1 if choice.recompute else None,
    )


def apply_megatron_choice(plan: Plan, choice: MegatronChoice, mini_batch_size: Callable[[int], int],
                          lr_scale: float) -> Plan:
    """`plan` (a Megatron skeleton) with the choice's engine on actor, reference and critic.

    mini_batch_size: the actor's mini batch for a DP size; lr_scale: the learning rate's factor (LoRA's 10x).
    """
    arch = plan.model.arch
    targets = BRIDGE_MLA_LORA_TARGETS if arch.is_mla else BRIDGE_LORA_TARGETS
    lora = (LoraConfig(rank=choice.lora_rank, alpha=2 * choice.lora_rank, target_modules=targets)
            if choice.lora_rank else LoraConfig())
    model = attrs.evolve(plan.model, lora=lora, gradient_checkpointing=False, activation_offload=False,
                         use_remove_padding=True)
    uneven = uneven_stage_layers(arch.num_layers, choice.pipeline)
    engine = engine_for(choice)
    if uneven is not None:
        engine = attrs.evolve(engine, num_layers_in_first_pipeline_stage=uneven[0],
                              num_layers_in_last_pipeline_stage=uneven[1])
    # A pinned layout wider than the world (TP x PP x CP > GPUs) has no DP replica: its batch is sized as for one,
    # and the rule megatron's world split refuses the plan naming the pin (it divided by zero here).
    dp = max(1, engine.data_parallel_size(plan.cluster.world_size))
    # Megatron-Core's CPU optimizer is the plan's own setting, which no choice changes.
    actor = attrs.evolve(plan.actor, megatron=_with_cpu_optimizer(engine, plan.actor.mcore),
                         ppo_mini_batch_size=mini_batch_size(dp), lr=float(f"{plan.actor.lr * lr_scale:.12g}"))
    # The critic trains the whole model (no LoRA) over the same layout.
    critic = attrs.evolve(plan.critic, megatron=_with_cpu_optimizer(engine, plan.engine("critic")))
    rollout = attrs.evolve(plan.rollout, sleep_level=verl_sleep_level(plan.stack, bool(choice.lora_rank),
                                                                      plan.rollout.layered_summon),
                           load_format="safetensors" if choice.lora_rank else "dummy")
    return plan.evolve(model=model, actor=actor, critic=critic, rollout=rollout)


def _with_cpu_optimizer(engine: MegatronSection, given: MegatronSection) -> MegatronSection:
    if given.optimizer_cpu_offload is None and given.optimizer_offload_fraction is None:
        return engine  # the common case, and the search evolves hundreds of these
    return attrs.evolve(engine, optimizer_cpu_offload=given.optimizer_cpu_offload,
                        optimizer_offload_fraction=given.optimizer_offload_fraction)



def megatron_choice_text(engine: MegatronSection) -> str:
    """A layout as the diagnosis names it: "Megatron TP 8 x PP 2 x EP 32, param+optimizer offload, full recompute"."""
    sizes = [f"TP {engine.tensor_model_parallel_size}", f"PP {engine.pipeline_model_parallel_size}"]
    sizes += [f"{name} {size}" for name, size in (("VPP", engine.virtual_pipeline_model_parallel_size or 1),
                                                   ("CP", engine.context_parallel_size),
                                                   ("EP", engine.expert_model_parallel_size),
                                                   ("ETP", engine.expert_tensor_parallel_size or 1)) if size > 1]
    parts = ["Megatron " + " x ".join(sizes)]
    if engine.param_offload or engine.optimizer_offload:
        parts.append("param+optimizer offload" if engine.param_offload else "optimizer offload")
    if engine.recompute_granularity:
        parts.append(f"{engine.recompute_granularity} recompute")
    return ", ".join(parts)


def megatron_space_choices(request: SolveRequest, sequence_len: int, feasibility_only: bool) -> list[MegatronChoice]:
    """The layouts the rules and the pins allow whose state fits the GPU (each layout's most saving choice when
    none does, so the diagnosis names what binds); with `feasibility_only`, one per layout."""
    arch, cluster = request.model.arch, request.cluster
    limit = gpu_limit_bytes(workload_plan(request, request.response_len or 1, megatron_skeleton), request)
    allowed = pinned_choices(list(megatron_choices(arch, cluster, sequence_len, lora_ranks(request))),
                             request.pins)
    space = [choice for choice in allowed if state_fits(choice, arch, cluster.world_size, limit)]
    if not space:
        # Nothing can fit: price each layout's most saving choice so the diagnosis names what binds.
        return most_saving_per_shape(allowed)
    return most_saving_per_shape(space) if feasibility_only else space


def interleaving_may_pay(fastest: Candidate, best: Candidate, request: SolveRequest) -> bool:
    """Interleaving saves at most the bubble's share of the trainer's passes: a layout that cannot come within
    the tolerance of the best plan so far with none of it is not tried interleaved."""
    trainer = sum(seconds for phase, seconds in fastest.step_time.phase_seconds.items()
                  if phase not in (Phase.ROLLOUT, Phase.WEIGHT_SYNC, "offload"))
    bound = fastest.step_time.total_seconds - largest_bubble_fraction(fastest.plan, request.profile) * trainer
    return bound <= best.step_time.total_seconds * (1 + STEP_TIME_TOLERANCE)


class MegatronSpace:
    """verl's Megatron workers: searched layout by layout (`shape_key`), each layout kept at its first fitting
    choice (more offload or recompute adds host traffic and recomputed forwards for larger token budgets, a trade
    the layout search itself outweighs; this keeps solve under a second), a layout whose most saving choice cannot
    train skipped whole, and a fitting layout's VPP variants tried next while each is faster than the last."""

    strategies = ("megatron",)
    choice_type = MegatronChoice
    by_layout = True

    def skeleton(self, plan: Plan) -> Plan:
        return megatron_skeleton(plan)

    def choices(self, request: SolveRequest, sequence_len: int, feasibility_only: bool) -> list[MegatronChoice]:
        return megatron_space_choices(request, sequence_len, feasibility_only)

    def apply(self, skeleton: Plan, choice: MegatronChoice, request: SolveRequest) -> Plan:
        # LoRA needs about 10x the full-fine-tuning learning rate (verl's LoRA guide), as for FSDP.
        lr_scale = 10.0 if choice.lora_rank and request.base is None else 1.0
        return apply_megatron_choice(skeleton, choice, lambda dp: _mini_batch_size(request, dp), lr_scale)

    def resident_key(self, choice: MegatronChoice) -> tuple:
        return (*choice.resident_key, choice.context)

    def shape_key(self, choice: MegatronChoice) -> tuple:
        return choice.shape_key

    def most_saving_per_shape(self, choices: Sequence[MegatronChoice]) -> list[MegatronChoice]:
        return most_saving_per_shape(choices)

    def base_of_variant(self, choice: MegatronChoice) -> MegatronChoice | None:
        """An interleaved choice's layout without interleaving: its budgets bound the variant's (a variant holds
        more micro batches in flight at the same saving step: memory.megatron.in_flight_micro_batches)."""
        return attrs.evolve(choice, virtual_pipeline=None) if choice.virtual_pipeline is not None else None

    def next_variant(self, choice: MegatronChoice, request: SolveRequest, fastest: Candidate,
                     best: Candidate) -> MegatronChoice | None:
        """After a fitting layout (its fastest candidate `fastest`, the best plan so far `best`): its next VPP size,
        unless VPP is pinned, or interleaving cannot pay for a non-interleaved layout."""
        if "actor.megatron.virtual_pipeline_model_parallel_size" in request.pins:
            return None
        if choice.virtual_pipeline is None and request.objective == "throughput" and not interleaving_may_pay(
                fastest, best, request):
            return None
        return next_interleaved(choice, request.model.arch.num_layers)

    def describe(self, plan: Plan) -> str:
        return f"{megatron_choice_text(plan.actor.mcore)}, rollout TP {plan.rollout.tensor_model_parallel_size}"


MEGATRON_SPACE = MegatronSpace()

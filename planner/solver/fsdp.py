"""The FSDP backend's search space: the discrete knobs of an FSDP plan (`TrainingChoice`) and how a plan takes them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import attrs
from attrs import frozen

from rlplan.planner.arch import Architecture
from rlplan.planner.hardware import Cluster
from rlplan.planner.knobs import apply_knobs
from rlplan.planner.plan import LoraConfig, Plan
from rlplan.planner.solver.choices import knob, pins_allow
from rlplan.planner.solver.request import Candidate, SolveRequest
from rlplan.planner.solver.workload import _mini_batch_size, lora_ranks, workload_plan
from rlplan.planner.stack import verl_sleep_level


@frozen(kw_only=True)
class TrainingChoice:
    """The discrete knobs of an FSDP plan's training side, each field with the plan knob it sets."""

    lora_rank: int = knob("model.lora.rank")
    param_offload: bool = knob("actor.param_offload")
    optimizer_offload: bool = knob("actor.optimizer_offload")
    gradient_checkpointing: bool = knob("model.gradient_checkpointing")
    activation_offload: bool = knob("model.activation_offload")
    ulysses: int = knob("actor.ulysses_sequence_parallel_size")
    fsdp_size: int = knob("actor.fsdp_size")
    ref_param_offload: bool = knob("ref.param_offload")
    # The critic's own memory knobs (verl: critic.model.fsdp_config.*, critic.model.enable_gradient_checkpointing).
    critic_param_offload: bool = knob("critic.param_offload")
    critic_optimizer_offload: bool = knob("critic.optimizer_offload")
    critic_gradient_checkpointing: bool = knob("critic.gradient_checkpointing")
    # FSDP2's CPUOffloadPolicy per role (verl: fsdp_config.offload_policy; supersedes the two offloads above).
    offload_policy: bool = knob("actor.offload_policy", default=False)
    critic_offload_policy: bool = knob("critic.offload_policy", default=False)


def ulysses_options(arch: Architecture, cluster: Cluster, sequence_len: int) -> list[int]:
    """Ulysses sizes worth trying: 1, and splits within a node that divide the heads, for long sequences."""
    options = [1]
    if sequence_len >= 8192:
        for sp in (2, 4, 8):
            if sp <= cluster.gpus_per_node and cluster.world_size % sp == 0 and arch.splits_heads(sp):
                options.append(sp)
    return options


# The actor's (param_offload, optimizer_offload, offload_policy): each step trades host traffic for GPU
# memory; offload_policy last, as it also moves the optimizer step onto the CPU.
ACTOR_OFFLOAD_OPTIONS = ((False, False, False), (False, True, False), (True, True, False), (False, False, True))


# The critic's (param_offload, optimizer_offload, gradient_checkpointing, offload_policy); recompute off
# only where memory is plentiful.
CRITIC_OPTIONS = ((False, False, False, False), (False, False, True, False), (False, True, True, False),
                  (True, True, True, False), (False, False, True, True))


def request_uses_critic(request: SolveRequest) -> bool:
    """verl's need_critic for the request, with its pins (critic.enable may be pinned)."""
    return apply_knobs(workload_plan(request, request.response_len or 1, fsdp_skeleton), request.pins).uses_critic


def request_allows_offload_policy(request: SolveRequest) -> bool:
    """verl reads fsdp_config.offload_policy only with strategy fsdp2 (rule offload_policy_needs_fsdp2)."""
    return apply_knobs(workload_plan(request, request.response_len or 1, fsdp_skeleton),
                       request.pins).actor.strategy == "fsdp2"


def training_choices(request: SolveRequest, sequence_len: int) -> Iterator[TrainingChoice]:
    arch, cluster = request.model.arch, request.cluster
    uses_critic = request_uses_critic(request)
    policy_allowed = request_allows_offload_policy(request)
    actor_offloads = [o for o in ACTOR_OFFLOAD_OPTIONS if policy_allowed or not o[2]]
    critic_offloads = [o for o in CRITIC_OPTIONS if policy_allowed or not o[3]]
    fsdp_options = [-1]
    if cluster.nodes > 1:
        fsdp_options.append(cluster.gpus_per_node)  # HSDP keeps all-gathers inside a node
    for rank in lora_ranks(request):
        # With LoRA the reference is the actor with its adapter off: there is no separate model to offload.
        # On GPUs verl offloads a separate reference whatever the key says (memory.ref_params_on_host):
        # the plan says so too.
        ref_offload_options = [False] if rank else [True] if not cluster.gpu.is_cpu else [False, True]
        for param_offload, optimizer_offload, offload_policy in actor_offloads:
            for checkpointing, activation_offload in ((False, False), (True, False), (True, True)):
                # Without a critic its knobs change nothing: one option, the actor's, keeps the space small.
                critic_options = critic_offloads if uses_critic else (
                    (param_offload, optimizer_offload, checkpointing, offload_policy),)
                for ulysses, fsdp_size, ref_offload, critic in itertools.product(
                        ulysses_options(arch, cluster, sequence_len), fsdp_options, ref_offload_options,
                        critic_options):
                    yield TrainingChoice(
                        lora_rank=rank, param_offload=param_offload, optimizer_offload=optimizer_offload,
                        gradient_checkpointing=checkpointing, activation_offload=activation_offload,
                        ulysses=ulysses, fsdp_size=fsdp_size, ref_param_offload=ref_offload,
                        critic_param_offload=critic[0], critic_optimizer_offload=critic[1],
                        critic_gradient_checkpointing=critic[2], offload_policy=offload_policy,
                        critic_offload_policy=critic[3],
                    )


def apply_training_choice(plan: Plan, choice: TrainingChoice, request: SolveRequest) -> Plan:
    lora = LoraConfig(rank=choice.lora_rank, alpha=2 * choice.lora_rank) if choice.lora_rank else LoraConfig()
    model = attrs.evolve(
        plan.model, lora=lora, gradient_checkpointing=choice.gradient_checkpointing,
        activation_offload=choice.activation_offload, use_remove_padding=True,
    )
    dp = plan.cluster.world_size // choice.ulysses
    # LoRA needs about 10x the full-fine-tuning learning rate (verl's LoRA guide); rounded to 12 digits so that
    # 1e-6 x 10 is written 1e-05 in the plan and the script, not 9.999999999999999e-06.
    lr = float(f"{plan.actor.lr * 10:.12g}") if choice.lora_rank and request.base is None else plan.actor.lr
    actor = attrs.evolve(
        plan.actor, param_offload=choice.param_offload, optimizer_offload=choice.optimizer_offload,
        offload_policy=choice.offload_policy,
        ulysses_sequence_parallel_size=choice.ulysses, fsdp_size=choice.fsdp_size,
        ppo_mini_batch_size=_mini_batch_size(request, dp), lr=lr,
    )
    critic = attrs.evolve(
        plan.critic, param_offload=choice.critic_param_offload, optimizer_offload=choice.critic_optimizer_offload,
        offload_policy=choice.critic_offload_policy,
        gradient_checkpointing=choice.critic_gradient_checkpointing, ulysses_sequence_parallel_size=choice.ulysses,
    )
    layered_summon = bool(choice.lora_rank) and (
        plan.model.arch.total_params >= 60e9 or plan.cluster.gpu.memory_gib < 48
    )
    rollout = attrs.evolve(
        plan.rollout,
        # The level verl sleeps vLLM at on the plan's stack (an adapter-only sync keeps the base weights).
        sleep_level=verl_sleep_level(plan.stack, bool(choice.lora_rank), layered_summon),
        load_format="safetensors" if choice.lora_rank else "dummy",
        layered_summon=layered_summon,
    )
    ref = attrs.evolve(plan.ref, param_offload=choice.ref_param_offload)
    return plan.evolve(model=model, actor=actor, critic=critic, rollout=rollout, ref=ref)


def fsdp_choices(request: SolveRequest, sequence_len: int, feasibility_only: bool) -> list[TrainingChoice]:
    pins = request.pins
    choices = list(training_choices(request, sequence_len))
    pinned_rank = pins.get("model.lora.rank")
    if pinned_rank is not None and pinned_rank not in {c.lora_rank for c in choices}:
        choices = [attrs.evolve(c, lora_rank=int(pinned_rank)) for c in choices if c.lora_rank == choices[-1].lora_rank]
    pinned_sp = pins.get("actor.ulysses_sequence_parallel_size")
    if pinned_sp is not None and pinned_sp not in {c.ulysses for c in choices}:
        choices = [attrs.evolve(c, ulysses=int(pinned_sp)) for c in choices if c.ulysses == 1]
    choices = [c for c in choices if pins_allow(c, pins)]
    return most_saving_per_shape(choices) if feasibility_only else choices


def most_saving_per_shape(choices: Sequence[TrainingChoice]) -> list[TrainingChoice]:
    """Offload and checkpointing only ever lower memory: if anything fits, the most memory-saving choice of
    each (LoRA, Ulysses, HSDP) group fits."""
    groups: dict[tuple[int, int, int], TrainingChoice] = {}
    for choice in choices:
        key = (choice.lora_rank, choice.ulysses, choice.fsdp_size)
        if key not in groups or _savings(choice) > _savings(groups[key]):
            groups[key] = choice
    return list(groups.values())


def _savings(choice: TrainingChoice) -> tuple[int, ...]:
    return (choice.param_offload + choice.optimizer_offload + choice.ref_param_offload
            + choice.gradient_checkpointing + choice.activation_offload + choice.critic_param_offload
            + choice.critic_optimizer_offload + choice.critic_gradient_checkpointing
            # The policy offloads params, grads and optimizer state: more than both offloads together.
            + 3 * choice.offload_policy + 3 * choice.critic_offload_policy,)


def fsdp_skeleton(plan: Plan) -> Plan:
    """A neutral plan made an FSDP one: a Megatron plan's workload (a --from plan) becomes FSDP2, with no engine
    sections and no Megatron-only keys; an FSDP plan keeps its strategy."""
    if not plan.is_megatron:
        return plan
    passthrough = {key: value for key, value in plan.passthrough.items() if ".megatron." not in key}
    return plan.evolve(actor=attrs.evolve(plan.actor, strategy="fsdp2", megatron=None),
                       ref=attrs.evolve(plan.ref, megatron=None), critic=attrs.evolve(plan.critic, megatron=None),
                       passthrough=passthrough)


def fsdp_choice_text(plan: Plan) -> str:
    """An FSDP plan's choice as the diagnosis names it, after its LoRA: "optimizer offload, checkpointing, TP 2"."""
    actor = plan.actor
    parts = []
    if actor.offload_policy:
        parts.append("CPU offload policy")
    elif actor.param_offload or actor.optimizer_offload:
        parts.append("param+optimizer offload" if actor.param_offload else "optimizer offload")
    if plan.uses_critic and plan.critic.offload_policy:
        parts.append("critic CPU offload policy")
    elif plan.uses_critic and (plan.critic.param_offload or plan.critic.optimizer_offload):
        parts.append("critic " + ("param+optimizer offload" if plan.critic.param_offload else "optimizer offload"))
    if plan.model.gradient_checkpointing:
        parts.append("checkpointing" + (" + activation offload" if plan.model.activation_offload else ""))
    if actor.ulysses_sequence_parallel_size > 1:
        parts.append(f"Ulysses {actor.ulysses_sequence_parallel_size}")
    parts.append(f"TP {plan.rollout.tensor_model_parallel_size}")
    return ", ".join(parts)


class FsdpSpace:
    """FSDP / FSDP2 (verl's fsdp_workers): every choice priced; no layouts, no variants."""

    strategies = ("fsdp", "fsdp2")
    choice_type = TrainingChoice
    by_layout = False

    def skeleton(self, plan: Plan) -> Plan:
        return fsdp_skeleton(plan)

    def choices(self, request: SolveRequest, sequence_len: int, feasibility_only: bool) -> list[TrainingChoice]:
        return fsdp_choices(request, sequence_len, feasibility_only)

    def apply(self, skeleton: Plan, choice: TrainingChoice, request: SolveRequest) -> Plan:
        return apply_training_choice(skeleton, choice, request)

    def resident_key(self, choice: TrainingChoice) -> tuple:
        return (choice.lora_rank, choice.param_offload, choice.optimizer_offload, choice.ref_param_offload,
                choice.fsdp_size, choice.critic_param_offload, choice.critic_optimizer_offload,
                choice.offload_policy, choice.critic_offload_policy, choice.ulysses)

    def shape_key(self, choice: TrainingChoice) -> tuple:
        return (choice.lora_rank, choice.ulysses, choice.fsdp_size)

    def most_saving_per_shape(self, choices: Sequence[TrainingChoice]) -> list[TrainingChoice]:
        return most_saving_per_shape(choices)

    def base_of_variant(self, choice: TrainingChoice) -> TrainingChoice | None:
        return None

    def next_variant(self, choice: TrainingChoice, request: SolveRequest, fastest: Candidate,
                     best: Candidate) -> TrainingChoice | None:
        return None

    def describe(self, plan: Plan) -> str:
        return fsdp_choice_text(plan)


FSDP_SPACE = FsdpSpace()

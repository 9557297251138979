"""The solver: every knob of a plan, from a model, a cluster and a workload.

Discrete knobs (LoRA, offload, checkpointing, activation offload, Ulysses, HSDP,
reference offload, rollout TP) are searched exhaustively over a small space;
continuous ones are solved directly: each pass's token budget is the largest
that fits its phase (bisection on the memory model), gpu_memory_utilization
the largest the rollout phase allows, and max_num_seqs what the KV cache can
hold.  Feasible candidates are ranked by the step-time model (or by peak
memory); when none fits, `diagnose` names the binding constraint and the
smallest change that would fit.

The training side and the rollout side are solved separately and then joined,
because a pass's token budget does not depend on rollout TP: that keeps a 72B
model on 64 GPUs to a few thousand model evaluations.
"""

from __future__ import annotations

import collections
import itertools
import math
from collections.abc import Iterator
from typing import Any, Literal

import attrs
from attrs import field, frozen

from rlplan.planner.arch import Architecture
from rlplan.planner.errors import PlanError
from rlplan.planner.hardware import Cluster
from rlplan.planner.knobs import apply_knobs, evolve_fields, knob_value
from rlplan.planner.layout import plan_layout
from rlplan.planner.memory import MemoryReport, predict_memory, predict_phase, predict_phases
from rlplan.planner.memory.rollout import rollout_budget
from rlplan.planner.model_error import DEFAULT_HEADROOM, Headroom, plan_margin
from rlplan.planner.monotone import last_holding
from rlplan.planner.phases import PASS_KNOBS, TOKEN_BUDGET_KEY, Phase
from rlplan.planner.plan import (
    ActorSection,
    AlgorithmSection,
    CriticSection,
    DataSection,
    LoraConfig,
    ModelSection,
    Plan,
    Prediction,
    RefSection,
    RewardSection,
    RolloutEngine,
    RolloutSection,
    TrainerSection,
)
from rlplan.planner.profile import DEFAULT_PROFILE, Profile
from rlplan.planner.render import absent_knobs
from rlplan.planner.rules import VLLM_LORA_RANKS, Violation, check_plan
from rlplan.planner.solver_megatron import (
    MegatronChoice,
    apply_megatron_choice,
    fsdp_skeleton,
    megatron_choice_text,
    megatron_choices,
    megatron_skeleton,
    most_saving_per_shape,
    next_interleaved,
    pinned_choices,
    state_fits,
)
from rlplan.planner.steptime import StepTime, predict_step_time, rollout_concurrency, workload_lengths
from rlplan.planner.steptime.megatron import largest_bubble_fraction
from rlplan.planner.verl_keys import BY_FIELD, backend_of

GIB = 2**30
Objective = Literal["throughput", "memory"]
LoraChoice = Literal["off", "auto"] | int
# The training backend the search plans: FSDP (the plan's fsdp / fsdp2), verl's Megatron workers, or both
# (auto: each searched, the faster plan kept, as `solve_engines` does for rollout engines).
SolveStrategy = Literal["fsdp", "megatron", "auto"]

# Token budgets are solved in steps of this many tokens: finer steps buy nothing measurable.
BUDGET_GRANULARITY = 256
# verl's perf guide: a budget of 2-3x (prompt + response) keeps packing efficient; beyond the
# tokens of one mini batch per GPU a bigger budget changes nothing.
MAX_BUDGET_MULTIPLE_OF_SEQUENCE = 8
MAX_GPU_MEMORY_UTILIZATION = 0.9
MAX_NUM_SEQS_CAP = 1024
# Feasible plans kept after the best, for `solve --verify` to measure in order.
RUNNERS_UP = 2


@frozen(kw_only=True)
class SolveRequest:
    """What a user asks `rlplan solve` for."""

    model: ModelSection
    cluster: Cluster
    prompt_len: int = field()
    response_len: int | None = None
    max_response_len: int | None = None
    train_batch_size: int = 256
    n: int = 5
    algorithm: str = "grpo"
    ppo_mini_batch_size: int | None = None
    lora: LoraChoice = "auto"
    objective: Objective = "throughput"
    # The GPU memory every phase leaves free (--headroom); unset: the default rule of model_error.plan_margin.
    headroom: Headroom = DEFAULT_HEADROOM
    pins: dict[str, Any] = field(factory=dict)
    base: Plan | None = None
    profile: Profile = DEFAULT_PROFILE
    # Mean tokens the data has (data.expected_*_length); None: the maximum lengths.
    expected_prompt_len: int | None = None
    expected_response_len: int | None = None
    # data.train_files / data.val_files (verl reads them; the planner never opens them); None keeps the base's.
    train_files: tuple[str, ...] | None = None
    val_files: tuple[str, ...] | None = None
    # --strategy: which backend's knobs the search sets (solver_megatron.py for Megatron).
    strategy: SolveStrategy = "fsdp"

    @prompt_len.validator
    def _check_prompt_len(self, attribute: attrs.Attribute, value: int) -> None:
        if value < 1:
            raise PlanError(field="--prompt-len", message=f"must be >= 1, got {value}.", fix="pass --prompt-len 1024")

    def __attrs_post_init__(self) -> None:
        if self.response_len is None and self.max_response_len is None:
            raise PlanError(
                field="--response-len",
                message="the response length is needed to size the rollout and the training passes.",
                fix="pass --response-len N, or --max-response-len N to let the solver find the longest that fits",
            )
        for name, value in (("--response-len", self.response_len), ("--max-response-len", self.max_response_len),
                            ("--train-batch-size", self.train_batch_size), ("--n", self.n),
                            ("--ppo-mini-batch-size", self.ppo_mini_batch_size)):
            if value is not None and value < 1:
                raise PlanError(field=name, message=f"must be >= 1, got {value}.", fix=f"pass a positive {name}")
        # A length past the model's context is never silently cut to it: the user asked for tokens the
        # model cannot hold, and a long-context variant (e.g. a -1M model) may be what they meant.
        context = self.model.arch.max_position_embeddings
        for name, value in (("--response-len", self.response_len), ("--max-response-len", self.max_response_len)):
            if value is not None and self.prompt_len + value > context:
                room = context - self.prompt_len
                raise PlanError(
                    field=name,
                    message=(f"{self.prompt_len} prompt + {value} response tokens exceed {self.model.name}'s context "
                             f"(max_position_embeddings = {context})."),
                    fix=(f"pass {name} {room}" if room >= 1 else "pass a shorter --prompt-len")
                    + ", or a model with a longer context (its config.json via --model DIR, or a long-context "
                      "variant such as --model Qwen/Qwen2.5-7B-Instruct-1M)",
                )
        if isinstance(self.lora, int) and not 0 <= self.lora <= VLLM_LORA_RANKS[-1]:
            raise PlanError(field="--lora", message=f"rank {self.lora} is outside 0..{VLLM_LORA_RANKS[-1]}.",
                            fix="pass --lora off, auto, or a rank such as 32, 64 or 128")


@frozen(kw_only=True)
class Candidate:
    plan: Plan
    memory: MemoryReport
    step_time: StepTime


@frozen(kw_only=True)
class Suggestion:
    """One change to the request that makes it fit, re-solved: its predicted step and the GPUs it takes."""

    change: str
    detail: str
    step_time_s: float | None = None
    gpus: int = 0
    # GPUs x GiB each: the hardware bill's proxy (a bigger GPU is a pricier one).
    gpu_memory_gib: float = 0.0
    # False for changes to what is trained (LoRA, lengths, batch) rather than to the hardware.
    keeps_workload: bool = True
    # More GPUs (nodes) of the kind the request has: always among the changes shown when one fits.
    more_gpus: bool = False


@frozen(kw_only=True)
class Diagnosis:
    binding: str
    message: str
    suggestions: tuple[Suggestion, ...]


@frozen(kw_only=True)
class FrontierPoint:
    """One candidate the search priced, as `solve --frontier` plots it.

    rank: 1 for the chosen plan, 2.. for the feasible runners-up in preference order, 0 when infeasible.
    reason: why an infeasible candidate was dropped ("" when feasible).
    """

    step_time_s: float
    gpu_peak_gib: float
    feasible: bool
    rank: int
    knobs: tuple[tuple[str, Any], ...]
    reason: str = ""


@frozen(kw_only=True)
class SolveResult:
    best: Candidate | None
    evaluated: int
    feasible: int
    diagnosis: Diagnosis | None = None
    # The next-best feasible candidates after `best`, in order (for `solve --verify`).
    runners_up: tuple[Candidate, ...] = ()
    # Every priced candidate of the final search, only when `solve(..., frontier=True)` asked for it.
    frontier: tuple[FrontierPoint, ...] = ()

    @property
    def plan(self) -> Plan | None:
        return self.best.plan if self.best else None


# --- the search space ----------------------------------------------------------


@frozen(kw_only=True)
class TrainingChoice:
    """The discrete knobs of the training side."""

    lora_rank: int
    param_offload: bool
    optimizer_offload: bool
    gradient_checkpointing: bool
    activation_offload: bool
    ulysses: int
    fsdp_size: int
    ref_param_offload: bool
    # The critic's own memory knobs (verl: critic.model.fsdp_config.*, critic.model.enable_gradient_checkpointing).
    critic_param_offload: bool
    critic_optimizer_offload: bool
    critic_gradient_checkpointing: bool
    # FSDP2's CPUOffloadPolicy per role (verl: fsdp_config.offload_policy; supersedes the two offloads above).
    offload_policy: bool = False
    critic_offload_policy: bool = False


def default_lora_rank(arch: Architecture) -> int:
    """The seeds' convergence guidance: rank >= 32, and >= 128 from ~32B parameters up."""
    return 128 if arch.total_params >= 30e9 else 32


def lora_ranks(request: SolveRequest) -> list[int]:
    if request.lora == "off":
        return [0]
    if request.lora == "auto":
        return [0, default_lora_rank(request.model.arch)]
    return [int(request.lora)]


def ulysses_options(arch: Architecture, cluster: Cluster, sequence_len: int) -> list[int]:
    """Ulysses sizes worth trying: 1, and splits within a node that divide the heads, for long sequences."""
    options = [1]
    if sequence_len >= 8192:
        for sp in (2, 4, 8):
            if sp <= cluster.gpus_per_node and cluster.world_size % sp == 0 and arch.splits_heads(sp):
                options.append(sp)
    return options


def tensor_parallel_options(arch: Architecture, cluster: Cluster) -> list[int]:
    """Rollout TPs up to two nodes; beyond, up to the world, only for a model whose bf16 weights would still
    take over half a GPU at two nodes' TP (DeepSeek-V3 671B: verl's recipe rolls out at TP 32 on H100s)."""
    options = []
    tp = 1
    two_nodes = max(cluster.gpus_per_node, 1) * 2
    limit = two_nodes
    if 2 * arch.total_params / two_nodes > cluster.gpu_memory_bytes / 2:
        limit = cluster.world_size
    while tp <= limit and tp <= cluster.world_size:
        if cluster.world_size % tp == 0 and arch.splits_heads(tp, latent_kv=True):
            options.append(tp)
        tp *= 2
    return options or [1]


# The actor's (param_offload, optimizer_offload, offload_policy): each step trades host traffic for GPU
# memory; offload_policy last, as it also moves the optimizer step onto the CPU.
ACTOR_OFFLOAD_OPTIONS = ((False, False, False), (False, True, False), (True, True, False), (False, False, True))
# The critic's (param_offload, optimizer_offload, gradient_checkpointing, offload_policy); recompute off
# only where memory is plentiful.
CRITIC_OPTIONS = ((False, False, False, False), (False, False, True, False), (False, True, True, False),
                  (True, True, True, False), (False, False, True, True))


def request_uses_critic(request: SolveRequest) -> bool:
    """verl's need_critic for the request, with its pins (critic.enable may be pinned)."""
    return apply_knobs(skeleton_plan(request, request.response_len or 1), request.pins).uses_critic


def request_allows_offload_policy(request: SolveRequest) -> bool:
    """verl reads fsdp_config.offload_policy only with strategy fsdp2 (rule offload_policy_needs_fsdp2)."""
    return apply_knobs(skeleton_plan(request, request.response_len or 1), request.pins).actor.strategy == "fsdp2"


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


# --- building plans --------------------------------------------------------------


def _mini_batch_size(request: SolveRequest, dp: int) -> int:
    """Four optimizer steps per batch when the batch allows it (verl's examples), else one."""
    if request.ppo_mini_batch_size is not None:
        return request.ppo_mini_batch_size
    tbs = request.train_batch_size
    for steps in (4, 2, 1):
        mini = tbs // steps
        if mini >= 1 and tbs % mini == 0 and (mini * request.n) % dp == 0:
            return mini
    return tbs


def skeleton_plan(request: SolveRequest, response_len: int) -> Plan:
    """The workload, with every knob at a neutral value for the search to set."""
    base = request.base
    sequence_len = request.prompt_len + response_len
    max_model_len = min(sequence_len, request.model.arch.max_position_embeddings)
    total = request.train_batch_size * request.n
    data = DataSection(train_batch_size=request.train_batch_size, max_prompt_length=request.prompt_len,
                       max_response_length=response_len)
    if base is not None:
        data = attrs.evolve(base.data, train_batch_size=request.train_batch_size,
                            max_prompt_length=request.prompt_len, max_response_length=response_len,
                            expected_prompt_length=None, expected_response_length=None)
    for name in ("train_files", "val_files"):
        if getattr(request, name) is not None:
            data = attrs.evolve(data, **{name: getattr(request, name)})
    # A mean cannot exceed the maximum the search tries, so an expectation is capped at it.
    # Flags, then the base plan, then the means a calibrated profile's run saw (0 there: none).
    expected_prompt = (request.expected_prompt_len or (base.data.expected_prompt_length if base else None)
                       or request.profile.observed_prompt_length)
    expected_response = (request.expected_response_len or (base.data.expected_response_length if base else None)
                         or request.profile.observed_response_length)
    data = attrs.evolve(
        data,
        expected_prompt_length=min(expected_prompt, request.prompt_len) if expected_prompt else None,
        expected_response_length=min(expected_response, response_len) if expected_response else None,
    )
    algorithm = base.algorithm if base is not None else AlgorithmSection()
    algorithm = attrs.evolve(algorithm, adv_estimator=request.algorithm)
    actor = ActorSection(ppo_mini_batch_size=1, use_dynamic_bsz=True, entropy_from_logits_with_chunking=True)
    if base is not None:
        actor = attrs.evolve(base.actor, ppo_mini_batch_size=1)
    rollout = RolloutSection(
        n=request.n, max_model_len=max_model_len, agent_num_workers=math.gcd(total, 8),
        log_prob_use_dynamic_bsz=True,
    )
    if base is not None:
        rollout = attrs.evolve(base.rollout, n=request.n, max_model_len=max_model_len,
                               agent_num_workers=math.gcd(total, base.rollout.agent_num_workers))
    plan = Plan(
        model=request.model,
        cluster=request.cluster,
        data=data,
        actor=actor,
        rollout=rollout,
        ref=base.ref if base is not None else RefSection(log_prob_use_dynamic_bsz=True),
        critic=base.critic if base is not None else CriticSection(use_dynamic_bsz=True),
        algorithm=algorithm,
        reward=base.reward if base is not None else RewardSection(),
        trainer=base.trainer if base is not None else TrainerSection(),
        passthrough=base.passthrough if base is not None else {},
    )
    if request.strategy == "megatron":
        plan = megatron_skeleton(plan)
    elif request.strategy == "fsdp" and plan.is_megatron:
        plan = fsdp_skeleton(plan)  # --strategy fsdp (or auto's FSDP half) from a Megatron --from plan
    return with_cpu_compute(plan, request.pins) if request.cluster.gpu.is_cpu else plan


def with_cpu_compute(plan: Plan, pins: dict[str, Any]) -> Plan:
    """How a CPU plan computes; pins win.

    In the dtype this CPU's matmuls are fastest in: bf16 with native bf16 (AVX512-BF16, AMX), else fp32. The
    engine computes in the actor's dtype, so it samples the policy the trainer scores. The engine compiled
    (vLLM's default): its CPU backend's torch.compile decoded 1.4x as fast as eager in bf16 on an AVX512-BF16
    EPYC (`benchmarks/rollout_throughput.py`), for ~15 s more start-up, spent while the trainers load.
    """
    compute = pins.get("actor.compute_dtype", plan.cluster.gpu.fastest_compute_dtype)
    return plan.evolve(actor=attrs.evolve(plan.actor, compute_dtype=compute),
                       ref=attrs.evolve(plan.ref, compute_dtype=compute),
                       critic=attrs.evolve(plan.critic, compute_dtype=compute),
                       rollout=attrs.evolve(plan.rollout, dtype=compute, enforce_eager=False))


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
    rollout = attrs.evolve(
        plan.rollout,
        # An adapter-only sync relies on vLLM keeping the base weights across sleep.
        sleep_level=1 if choice.lora_rank else 2,
        load_format="safetensors" if choice.lora_rank else "dummy",
        layered_summon=bool(choice.lora_rank) and (
            plan.model.arch.total_params >= 60e9 or plan.cluster.gpu.memory_gib < 48
        ),
    )
    ref = attrs.evolve(plan.ref, param_offload=choice.ref_param_offload)
    return plan.evolve(model=model, actor=actor, critic=critic, rollout=rollout, ref=ref)


# --- continuous knobs --------------------------------------------------------------


def _largest_fitting(low: int, high: int, fits) -> int | None:
    """Largest value in [low, high] (multiples of BUDGET_GRANULARITY above low) with fits(value)."""
    if not fits(low):
        return None
    if high <= low:
        return low
    if fits(high):
        return high
    return last_holding(low, high, fits, step=BUDGET_GRANULARITY)


# `--objective memory` keeps this share of each GPU free rather than filling it with KV cache and budgets.
MEMORY_OBJECTIVE_HEADROOM = 0.1


def usable_gpu_bytes(capacity_bytes: int, objective: Objective) -> int:
    return int(capacity_bytes * (1 - MEMORY_OBJECTIVE_HEADROOM)) if objective == "memory" else capacity_bytes


def gpu_limit_bytes(plan: Plan, request: SolveRequest) -> int:
    """The most GPU memory any phase of a candidate may use: the GPU less the margin (--headroom, else the
    default rule from the model's measured error), or less 10 % with --objective memory if that keeps more."""
    capacity = plan.cluster.gpu_memory_bytes
    margin = plan_margin(plan, request.headroom, request.profile).bytes
    return min(usable_gpu_bytes(capacity, request.objective), capacity - margin)


def _peak_within_gpu(report: MemoryReport, name: Phase, objective: Objective = "throughput",
                     limit_bytes: int | None = None) -> bool:
    limit = usable_gpu_bytes(report.gpu_capacity_bytes, objective) if limit_bytes is None else limit_bytes
    return all(p.peak_bytes <= limit for p in report.phases if p.name == name)


def phase_fits(report: MemoryReport, name: Phase) -> bool:
    """One phase within the GPU; the rollout must also hold one max_model_len sequence of KV."""
    fits = _peak_within_gpu(report, name)
    if name == Phase.ROLLOUT:
        fits = fits and report.rollout.holds_max_model_len
    return fits


def _phase_fits(plan: Plan, phase: Phase, request: SolveRequest) -> bool:
    """A training or forward phase alone: its peak depends on that pass's token budget only."""
    peak = predict_phase(plan, phase, request.profile).peak_bytes
    return peak <= gpu_limit_bytes(plan, request)


def _budget_floor(plan: Plan) -> int:
    """verl R1: one whole sequence must fit a micro batch of the Ulysses (Megatron: context-parallel) group."""
    split = plan.actor.mcore.context_parallel_size if plan.is_megatron else plan.actor.ulysses_sequence_parallel_size
    return math.ceil(plan.data.max_sequence_length / split)


def _budget_caps(plan: Plan) -> tuple[int, int]:
    """Budgets beyond one mini batch (update) or the whole batch (forward) per GPU change nothing."""
    actor = plan_layout(plan).actor_update
    sequence_len, sp = actor.max_sequence_length, actor.sequence_parallel_size
    minimum = _budget_floor(plan)
    mini_tokens = math.ceil((actor.mini_batch_size_per_gpu or 0) * sequence_len / sp)
    batch_tokens = max(1, actor.sequences_per_gpu) * sequence_len // sp
    limit = MAX_BUDGET_MULTIPLE_OF_SEQUENCE * sequence_len

    def rounded(value: int) -> int:
        return max(minimum, math.ceil(value / BUDGET_GRANULARITY) * BUDGET_GRANULARITY)

    return rounded(min(limit, max(mini_tokens, minimum))), rounded(min(limit, batch_tokens))


def _largest_fitting_divisor(total: int, fits) -> int | None:
    """Largest micro batch that divides `total` sequences (verl N5) and fits its phase."""
    for size in sorted((d for d in range(1, total + 1) if total % d == 0), reverse=True):
        if fits(size):
            return size
    return None


def _solve_pass(plan: Plan, request: SolveRequest, phase: Phase, *, chunk: int, cap: int) -> Plan | None:
    """One pass's micro batches: the largest token budget (dynamic bsz) or the largest fixed micro batch
    dividing its `chunk` of sequences per GPU.

    A pinned budget or micro batch is already in `plan` and is an input here: the pass only checks that
    its phase fits with it.
    """
    # The critic's values pass runs at the batching its update is solved for.
    knobs = (PASS_KNOBS[phase], *((PASS_KNOBS[Phase.CRITIC_VALUES],) if phase is Phase.CRITIC_UPDATE else ()))

    def with_budget(budget: int) -> Plan:
        return evolve_fields(plan, {k.token_budget: budget for k in knobs})

    def with_micro(micro: int) -> Plan:
        values: dict[str, int | None] = {k.micro_batch: micro for k in knobs}
        values.update({k.legacy_micro_batch: None for k in knobs if k.legacy_micro_batch})
        return evolve_fields(plan, values)

    dynamic = bool(knob_value(plan, knobs[0].dynamic_bsz))
    if (knobs[0].token_budget if dynamic else knobs[0].micro_batch) in request.pins:
        return plan if _phase_fits(plan, phase, request) else None
    if dynamic:
        budget = _largest_fitting(_budget_floor(plan), cap, lambda b: _phase_fits(with_budget(b), phase, request))
        return None if budget is None else with_budget(budget)
    if chunk <= 0:
        return None
    micro = _largest_fitting_divisor(chunk, lambda m: _phase_fits(with_micro(m), phase, request))
    return None if micro is None else with_micro(micro)


def solve_token_budgets(plan: Plan, request: SolveRequest, *, floor_only: bool = False,
                        ceiling: Plan | None = None) -> Plan | None:
    """Per pass, the largest token budget (or fixed micro batch) that fits its phase; None if nothing does.
    floor_only: each dynamic pass at its smallest budget (whether any budget fits, without the search);
    ceiling: a plan whose budgets this one's cannot exceed (one that holds no more per token: a VPP variant's
    layout), which bounds the search."""
    cap, forward_cap = _budget_caps(plan)
    layout = plan_layout(plan)
    # (phase, sequences per GPU its micro batches divide, budget cap): an update's micro batches divide its
    # mini batch, a forward pass's the whole batch.
    passes = [(Phase.ACTOR_UPDATE, layout.actor_update.mini_batch_size_per_gpu or 0, cap),
              (Phase.OLD_LOG_PROB, layout.old_log_prob.sequences_per_gpu, forward_cap)]
    if plan.uses_reference:
        passes.append((Phase.REF_LOG_PROB, layout.old_log_prob.sequences_per_gpu, forward_cap))
    if plan.uses_critic and layout.critic_update is not None:
        passes.append((Phase.CRITIC_UPDATE, layout.critic_update.mini_batch_size_per_gpu or 0, cap))
    for phase, chunk, phase_cap in passes:
        bound = knob_value(ceiling, PASS_KNOBS[phase].token_budget) if ceiling is not None else None
        phase_cap = _budget_floor(plan) if floor_only else min(phase_cap, bound or phase_cap)
        solved = _solve_pass(plan, request, phase, chunk=chunk, cap=phase_cap)
        if solved is None:
            return None
        plan = solved
    return plan


def largest_fitting_token_budget(plan: Plan, profile: Profile = DEFAULT_PROFILE) -> tuple[str, int] | None:
    """For a plan predicted not to fit: the token-budget key of its binding phase and the largest value
    (>= one whole sequence, verl R1) at which the whole plan fits and stays valid.

    None when that one knob cannot make it fit: the binding limit is host RAM or the KV cache, the
    binding pass uses fixed micro batches, or even the smallest budget is over.
    """
    binding = predict_memory(plan, profile).binding_constraint
    role = next((r for r in plan_layout(plan).roles if r.role == binding.where), None)
    if binding.resource != "gpu" or role is None or not role.uses_dynamic_bsz:
        return None
    key = TOKEN_BUDGET_KEY[role.role]
    assert role.max_token_len_per_gpu is not None

    def fits(budget: int) -> bool:
        candidate = apply_knobs(plan, {key: budget})
        return predict_memory(candidate, profile).fits and check_plan(candidate).valid

    floor = math.ceil(plan.data.max_sequence_length / role.sequence_parallel_size)
    if floor > role.max_token_len_per_gpu:
        return None
    budget = _largest_fitting(floor, role.max_token_len_per_gpu, fits)
    return None if budget is None else (key, budget)


def _rollout_sizes(plan: Plan, pins: dict[str, Any], max_num_seqs: int) -> RolloutSection:
    """max_num_seqs and max_num_batched_tokens derived from `max_num_seqs`, unless pinned (then the pin)."""
    seqs = int(pins.get("rollout.max_num_seqs", max_num_seqs))
    tokens = int(pins.get("rollout.max_num_batched_tokens", max(8192, seqs)))
    return attrs.evolve(plan.rollout, max_num_seqs=seqs, max_num_batched_tokens=tokens)


def solve_rollout(plan: Plan, tensor_parallel_size: int, request: SolveRequest) -> Plan | None:
    """The rollout sized by `size_rollout`, with multi-stage wake-up turned on when only it fits.

    A plan without the staged wake (unless pinned so) that fits nowhere is retried with it: the
    KV cache then stays paused during the weight sync, which lowers that peak by the KV cache.
    """
    sized = size_rollout(plan, tensor_parallel_size, request)
    if sized is not None or plan.rollout.multi_stage_wake_up or "rollout.multi_stage_wake_up" in request.pins:
        return sized
    staged = plan.evolve(rollout=attrs.evolve(plan.rollout, multi_stage_wake_up=True))
    return size_rollout(staged, tensor_parallel_size, request)


def size_rollout(plan: Plan, tensor_parallel_size: int, request: SolveRequest) -> Plan | None:
    """gpu_memory_utilization as high as the rollout and sync phases allow; max_num_seqs from the KV cache.

    Pinned rollout knobs are inputs: a pinned utilization is checked rather than searched, and
    max_num_seqs is derived from the KV cache that the pinned utilization leaves.
    """
    profile, pins = request.profile, request.pins
    plan = plan.evolve(rollout=attrs.evolve(plan.rollout, tensor_model_parallel_size=tensor_parallel_size))
    sequences_per_replica = math.ceil(plan_layout(plan).sequences_per_rollout_engine)
    plan = plan.evolve(rollout=_rollout_sizes(plan, pins, max(1, min(MAX_NUM_SEQS_CAP, sequences_per_replica))))

    def with_util(hundredths: int) -> Plan:
        return plan.evolve(rollout=attrs.evolve(plan.rollout, gpu_memory_utilization=hundredths / 100))

    def excess(candidate: Plan) -> int:
        """Bytes by which the rollout or the sync phase passes the limit (<= 0: fits)."""
        phases = predict_phases(candidate, (Phase.ROLLOUT, Phase.WEIGHT_SYNC), profile)
        return max(p.peak_bytes for p in phases) - limit

    def fits(candidate: Plan) -> bool:
        return excess(candidate) <= 0

    limit = gpu_limit_bytes(plan, request)

    if "rollout.gpu_memory_utilization" in pins:
        if not fits(plan):
            return None
    else:
        lo = _largest_fitting_util(lambda hundredths: excess(with_util(hundredths)), plan.cluster.gpu_memory_bytes)
        if lo is None:
            return None
        plan = with_util(lo)
    report = predict_memory(plan, profile)
    if not report.rollout.holds_max_model_len:
        return None
    # More sequences than the KV cache holds at the expected lengths only makes vLLM preempt; fewer idles
    # the GPU (the concurrency the step-time model prices, planner/steptime.py).
    lengths = workload_lengths(plan, profile)
    concurrency = int(rollout_concurrency(plan, report, lengths, sequences_per_replica))
    max_num_seqs = max(1, min(MAX_NUM_SEQS_CAP, sequences_per_replica, concurrency))
    resized = plan.evolve(rollout=_rollout_sizes(plan, pins, max_num_seqs))
    if resized.rollout != plan.rollout and not fits(resized):
        return None
    if "rollout.gpu_memory_utilization" in pins:
        return resized
    return _least_util_at_same_concurrency(resized, min(resized.rollout.max_num_seqs, sequences_per_replica,
                                                        concurrency), profile)


def _largest_fitting_util(excess, capacity_bytes: int) -> int | None:
    """The largest utilization (hundredths, 10..90) whose `excess` is <= 0, None when even 10 % is over.

    Each of the two phases is either flat in the utilization or grows by one GPU's bytes per unit of it (vLLM
    and SGLang take util x GPU; the KV cache rounds to blocks), so where 90 % is over by E the largest that
    fits is about 90 - E / (GPU / 100): that guess and its neighbour usually settle it, bisection otherwise.
    Whether that utilization leaves room for one max_model_len sequence of KV is checked after.
    """
    low, high = 10, int(MAX_GPU_MEMORY_UTILIZATION * 100)
    if excess(low) > 0:
        return None
    at_high = excess(high)
    if at_high <= 0:
        return high
    lo, hi = low, high  # excess(lo) <= 0 < excess(hi)
    guess = high - math.ceil(at_high / (capacity_bytes / 100))
    if lo < guess < hi:
        if excess(guess) <= 0:
            lo = guess
            if excess(guess + 1) > 0:
                hi = guess + 1
        else:
            hi = guess
    return last_holding(lo, hi, lambda hundredths: excess(hundredths) <= 0)


def _least_util_at_same_concurrency(plan: Plan, concurrency: int, profile: Profile) -> Plan:
    """The smallest utilization whose KV cache still holds `concurrency` full sequences (and max_model_len).

    Decode runs at most that many sequences at once (max_num_seqs, the batch), so a larger cache buys no
    step time: the memory it would take is left free instead (lower utilization only shrinks every phase).
    """

    def holds(hundredths: int) -> bool:
        candidate = plan.evolve(rollout=attrs.evolve(plan.rollout, gpu_memory_utilization=hundredths / 100))
        budget = rollout_budget(candidate, profile)
        return budget.holds_max_model_len and budget.max_concurrent_sequences >= concurrency

    # holds(top); 9 is below the search's floor. The least that holds is one past the last that does not.
    top = round(plan.rollout.gpu_memory_utilization * 100)
    least = last_holding(9, top, lambda hundredths: not holds(hundredths)) + 1
    return plan.evolve(rollout=attrs.evolve(plan.rollout, gpu_memory_utilization=least / 100))


# --- search -------------------------------------------------------------------------


def _rank_key(candidate: Candidate, objective: Objective) -> tuple[float, ...]:
    if objective == "memory":
        return (candidate.memory.gpu_peak_bytes, candidate.step_time.total_seconds)
    return (candidate.step_time.total_seconds, candidate.memory.gpu_peak_bytes)


def _choice_text(plan: Plan) -> str:
    actor = plan.actor
    parts = [f"LoRA r{plan.model.lora.rank}" if plan.model.lora.enabled else "full fine-tuning"]
    if plan.is_megatron:
        return ", ".join([*parts, megatron_choice_text(actor.mcore), f"rollout TP {plan.rollout.tensor_model_parallel_size}"])
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


def _pinned_choice_ok(choice: TrainingChoice, pins: dict[str, Any]) -> bool:
    expected = {
        "model.lora.rank": choice.lora_rank,
        "actor.param_offload": choice.param_offload,
        "actor.optimizer_offload": choice.optimizer_offload,
        "model.gradient_checkpointing": choice.gradient_checkpointing,
        "model.activation_offload": choice.activation_offload,
        "actor.ulysses_sequence_parallel_size": choice.ulysses,
        "actor.fsdp_size": choice.fsdp_size,
        "ref.param_offload": choice.ref_param_offload,
        "critic.param_offload": choice.critic_param_offload,
        "critic.optimizer_offload": choice.critic_optimizer_offload,
        "critic.gradient_checkpointing": choice.critic_gradient_checkpointing,
        "actor.offload_policy": choice.offload_policy,
        "critic.offload_policy": choice.critic_offload_policy,
    }
    return all(expected[key] == value for key, value in pins.items() if key in expected)


def _choices_for(request: SolveRequest, sequence_len: int,
                 feasibility_only: bool) -> list[TrainingChoice] | list[MegatronChoice]:
    if request.strategy == "megatron":
        arch, cluster = request.model.arch, request.cluster
        limit = gpu_limit_bytes(skeleton_plan(request, request.response_len or 1), request)
        allowed = pinned_choices(list(megatron_choices(arch, cluster, sequence_len, lora_ranks(request))),
                                 request.pins)
        space = [choice for choice in allowed if state_fits(choice, arch, cluster.world_size, limit)]
        if not space:
            # Nothing can fit: price each layout's most saving choice so the diagnosis names what binds.
            return most_saving_per_shape(allowed)
        return most_saving_per_shape(space) if feasibility_only else space
    pins = request.pins
    choices = list(training_choices(request, sequence_len))
    pinned_rank = pins.get("model.lora.rank")
    if pinned_rank is not None and pinned_rank not in {c.lora_rank for c in choices}:
        choices = [attrs.evolve(c, lora_rank=int(pinned_rank)) for c in choices if c.lora_rank == choices[-1].lora_rank]
    pinned_sp = pins.get("actor.ulysses_sequence_parallel_size")
    if pinned_sp is not None and pinned_sp not in {c.ulysses for c in choices}:
        choices = [attrs.evolve(c, ulysses=int(pinned_sp)) for c in choices if c.ulysses == 1]
    choices = [c for c in choices if _pinned_choice_ok(c, pins)]
    if feasibility_only:
        # Offload and checkpointing only ever lower memory: if anything fits, the most
        # memory-saving choice of each (LoRA, Ulysses, HSDP) group fits.
        groups: dict[tuple[int, int, int], TrainingChoice] = {}
        for choice in choices:
            key = (choice.lora_rank, choice.ulysses, choice.fsdp_size)
            if key not in groups or _savings(choice) > _savings(groups[key]):
                groups[key] = choice
        choices = list(groups.values())
    return choices


def _savings(choice: TrainingChoice) -> tuple[int, ...]:
    return (choice.param_offload + choice.optimizer_offload + choice.ref_param_offload
            + choice.gradient_checkpointing + choice.activation_offload + choice.critic_param_offload
            + choice.critic_optimizer_offload + choice.critic_gradient_checkpointing
            # The policy offloads params, grads and optimizer state: more than both offloads together.
            + 3 * choice.offload_policy + 3 * choice.critic_offload_policy,)


def _check_pinned_shape(pinned: Plan, request: SolveRequest) -> None:
    """Pins the search cannot honour on the requested cluster, named before any division by what they set:
    a cluster pin that changes the GPU count, a rollout TP larger than it (no engine at all; a TP that does
    not divide the GPUs is the rule rollout_tp_divides_world's, with its nearest valid values)."""
    cluster = request.cluster
    if pinned.cluster.world_size != cluster.world_size:
        key = next((k for k in request.pins if k.startswith("cluster.")), "cluster")
        raise PlanError(field=key, message=f"pins a cluster of {pinned.cluster.nodes} x {pinned.cluster.gpus_per_node} "
                        f"GPUs, but the solve is for {cluster.nodes} x {cluster.gpus_per_node}.",
                        fix="describe the cluster with --gpus, --nodes and --gpus-per-node instead of --fix cluster.*")
    tp = request.pins.get("rollout.tensor_model_parallel_size")
    # A TP that only fails to divide the GPUs is a batch rule (rollout_tp_divides_world), named with the nearest
    # valid values by the diagnosis; one larger than the cluster leaves no engine at all, so nothing can be priced.
    if tp is not None and int(tp) > cluster.world_size:
        options = ", ".join(str(t) for t in tensor_parallel_options(request.model.arch, cluster))
        raise PlanError(field="rollout.tensor_model_parallel_size",
                        message=f"is pinned to {tp}, more than the {cluster.world_size} GPUs.",
                        fix=f"pin one of {options}, or leave it to the solver")


def _search(request: SolveRequest, response_len: int, *, feasibility_only: bool = False,
            dropped: list[FrontierPoint] | None = None,
            ) -> tuple[list[Candidate], int, int, Candidate | None]:
    """Feasible candidates best first, evaluations, feasible count, and the least-infeasible candidate.

    With `dropped`, every infeasible candidate is priced (memory and step time) and appended to it,
    for `solve --frontier`; without it the search does no extra work.

    Two caches keep this fast: the rollout side (util, max_num_seqs) depends only on what
    the trainer leaves resident, and checkpointing variants of a choice whose token
    budgets already reach their caps cannot be faster, so they are skipped.
    """
    skeleton = skeleton_plan(request, response_len)
    sequence_len = skeleton.data.max_sequence_length
    pins = request.pins
    # Type-check every pin against the schema once, before the choices below read them as numbers.
    _check_pinned_shape(apply_knobs(skeleton, pins), request)
    choices = _choices_for(request, sequence_len, feasibility_only)
    tp_options = tensor_parallel_options(request.model.arch, request.cluster)
    pinned_tp = pins.get("rollout.tensor_model_parallel_size")
    if pinned_tp is not None:
        tp_options = [int(pinned_tp)]
    evaluated = feasible = 0
    ranked: list[Candidate] = []
    closest: Candidate | None = None
    full_ft_feasible = False
    rollout_cache: dict[tuple, RolloutSection | None] = {}
    budgets_at_cap: set[tuple] = set()
    fitting_shapes: set[tuple] = set()
    # A Megatron layout's interleaved (VPP) variants are tried right after it fits; rollout_tp_for: the fastest
    # rollout TP beside each resident state of the Megatron layouts.
    pending = collections.deque(choices)
    rollout_tp_for: dict[tuple, int] = {}
    fastest_of: dict[tuple, tuple[tuple, Candidate]] = {}
    best: tuple[tuple, Candidate] | None = None  # (preference key, candidate) of the best plan so far
    # After a Megatron layout's first miss: whether its most saving choice trains at all (None: not probed yet;
    # not for --frontier, which prices every choice).
    trains: dict[tuple, bool | None] = {}
    most_saving = {c.shape_key: c for c in most_saving_per_shape(
        [c for c in choices if isinstance(c, MegatronChoice)])} if dropped is None else {}
    while pending:
        choice = pending.popleft()
        if request.lora == "auto" and choice.lora_rank and full_ft_feasible:
            continue  # full fine-tuning fits: LoRA is only the fallback
        resident_key = _resident_key(choice)
        if choice.gradient_checkpointing and resident_key in budgets_at_cap:
            continue  # recompute would only slow a step whose budgets are already as large as useful
        if isinstance(choice, MegatronChoice) and choice.shape_key in fitting_shapes:
            # A Megatron layout is tried least saving first and kept at its first feasible choice: more offload
            # or recompute adds host traffic and recomputed forwards (steptime/megatron.py prices both) for
            # larger token budgets, a trade the layout search itself outweighs; this keeps solve under a second.
            continue
        if isinstance(choice, MegatronChoice) and choice.shape_key in trains:
            if trains[choice.shape_key] is None:
                evaluated += 1
                missed = _probe_layout(most_saving[choice.shape_key], skeleton, request, trains)
                closest = closest if feasible or missed is None else _closer(closest, missed, request)
            if not trains[choice.shape_key]:
                continue
        plan = apply_knobs(_apply_choice(skeleton, choice, request), pins)
        evaluated += 1
        trained = solve_token_budgets(plan, request, ceiling=_interleaving_ceiling(choice, fastest_of))
        if trained is None:
            # Only a search that finds nothing reports its closest miss (solve's diagnosis).
            closest = closest if feasible else _closer(closest, plan, request)
            if dropped is not None:
                dropped.append(_dropped_point(plan, request, "training does not fit at the smallest token budget"))
            elif _shape_key(choice) in most_saving and choice != most_saving[choice.shape_key]:
                trains.setdefault(choice.shape_key, None)
            continue
        if _budgets_reach_caps(trained):
            budgets_at_cap.add(resident_key)
        fastest: tuple[tuple, Candidate] | None = None  # the same, of this choice's rollout TPs
        # A Megatron choice sharing an earlier one's resident state shares its rollout sizes and so its fastest
        # rollout TP (_queue_interleaved says why): that TP first, the others only if it does not fit there.
        shared_tp = rollout_tp_for.get(resident_key[:-1]) if isinstance(choice, MegatronChoice) else None
        for tp in tp_options if shared_tp is None else [shared_tp, *(t for t in tp_options if t != shared_tp)]:
            if fastest is not None and fastest[1].plan.rollout.tensor_model_parallel_size == shared_tp:
                break
            evaluated += 1
            rollout_key = (*resident_key[:-1], tp)
            if rollout_key not in rollout_cache:
                solved_rollout = solve_rollout(trained, tp, request)
                rollout_cache[rollout_key] = solved_rollout.rollout if solved_rollout is not None else None
            cached = rollout_cache[rollout_key]
            if cached is None:
                unsized = trained.evolve(rollout=attrs.evolve(trained.rollout, tensor_model_parallel_size=tp))
                closest = closest if feasible else _closer(closest, unsized, request)
                if dropped is not None:
                    dropped.append(_dropped_point(unsized, request, "no rollout size fits beside the trainer"))
                continue
            # Pins were inputs to every pass above: nothing is re-applied over derived values here.
            solved = trained.evolve(rollout=attrs.evolve(
                trained.rollout, tensor_model_parallel_size=tp,
                gpu_memory_utilization=cached.gpu_memory_utilization, max_num_seqs=cached.max_num_seqs,
                max_num_batched_tokens=cached.max_num_batched_tokens))
            report = predict_memory(solved, request.profile)
            within = report.gpu_peak_bytes <= gpu_limit_bytes(solved, request)
            if not (report.fits and within) or not check_plan(solved).valid:
                closest = closest if feasible else _closer(closest, solved, request)
                if dropped is not None:
                    dropped.append(_dropped_point(solved, request, "over the GPU or host memory, or a verl rule"))
                continue
            feasible += 1
            if choice.lora_rank == 0:
                full_ft_feasible = True
            if isinstance(choice, MegatronChoice):
                fitting_shapes.add(choice.shape_key)
            if feasibility_only:
                return [Candidate(plan=solved, memory=report, step_time=StepTime(phase_seconds={}))], evaluated, 1, None
            ranked.append(Candidate(plan=solved, memory=report,
                                    step_time=predict_step_time(solved, report, request.profile)))
            keyed = (_preference_key(ranked[-1], request), ranked[-1])
            fastest = min(filter(None, (fastest, keyed)), key=lambda pair: pair[0])
            best = min(filter(None, (best, keyed)), key=lambda pair: pair[0])
        if isinstance(choice, MegatronChoice) and fastest is not None and best is not None:
            rollout_tp_for.setdefault(resident_key[:-1], fastest[1].plan.rollout.tensor_model_parallel_size)
            _queue_interleaved(choice, fastest, best[1], request, pending, fastest_of)
    ranked.sort(key=lambda c: _preference_key(c, request))
    return _roomiest_first(ranked, request), evaluated, feasible, closest


def _interleaving_ceiling(choice: TrainingChoice | MegatronChoice,
                          fastest_of: dict[tuple, tuple[tuple, Candidate]]) -> Plan | None:
    """A VPP variant's budgets cannot pass its non-interleaved layout's (memory.megatron.in_flight_micro_batches:
    the interleaved schedule holds more micro batches in flight at the same saving step): that layout's plan."""
    if not isinstance(choice, MegatronChoice) or choice.virtual_pipeline is None:
        return None
    base = fastest_of.get(attrs.evolve(choice, virtual_pipeline=None).shape_key)
    return base[1].plan if base is not None and base[1].plan.actor.mcore.virtual_pipeline_model_parallel_size is None \
        else None


def _probe_layout(most_saving: MegatronChoice, skeleton: Plan, request: SolveRequest,
                  trains: dict[tuple, bool | None]) -> Plan | None:
    """Whether a Megatron layout's most saving choice trains at its smallest token budgets, recorded in `trains`;
    its plan where it does not. Offload and recompute only lower memory: where that choice cannot train, none of
    the layout's choices can, and the search skips them."""
    probe = apply_knobs(_apply_choice(skeleton, most_saving, request), request.pins)
    trains[most_saving.shape_key] = solve_token_budgets(probe, request, floor_only=True) is not None
    return None if trains[most_saving.shape_key] else probe


def _queue_interleaved(choice: MegatronChoice, keyed: tuple[tuple, Candidate], best: Candidate,
                       request: SolveRequest, pending: collections.deque,
                       fastest_of: dict[tuple, tuple[tuple, Candidate]]) -> None:
    """After a fitting Megatron layout, its next VPP size, first in line, while each size was faster than the one
    before: a variant holds the same state and more micro batches in flight, so it fits only where its layout
    does. Choices that leave the same resident state (a layout interleaved or recomputing, ETP = TP at EP and ETP 1
    at EP x TP: MegatronChoice.resident_key) share the rollout's sizes, so their steps differ by the same trainer
    seconds at every rollout TP: the search tries them at the first one's fastest rollout TP."""
    fastest = keyed[1]  # `keyed`: (preference key, candidate) of the choice's fastest rollout TP
    layout = attrs.evolve(choice, virtual_pipeline=None).shape_key
    previous = fastest_of.get(layout)
    if "actor.megatron.virtual_pipeline_model_parallel_size" in request.pins or (
            choice.virtual_pipeline is not None and previous is not None and previous[0] <= keyed[0]):
        return
    fastest_of[layout] = keyed  # the fastest of the layout's VPP sizes so far
    if choice.virtual_pipeline is None and request.objective == "throughput":
        # Interleaving saves at most the bubble's share of the trainer's passes: a layout that cannot come
        # within the tolerance of the best plan so far with none of it is not tried interleaved.
        trainer = sum(seconds for phase, seconds in fastest.step_time.phase_seconds.items()
                      if phase not in (Phase.ROLLOUT, Phase.WEIGHT_SYNC, "offload"))
        bound = fastest.step_time.total_seconds - largest_bubble_fraction(fastest.plan, request.profile) * trainer
        if bound > best.step_time.total_seconds * (1 + STEP_TIME_TOLERANCE):
            return
    variant = next_interleaved(choice, request.model.arch.num_layers)
    if variant is not None:
        pending.appendleft(variant)


def _shape_key(choice: TrainingChoice | MegatronChoice) -> tuple | None:
    return choice.shape_key if isinstance(choice, MegatronChoice) else None


def _resident_key(choice: TrainingChoice | MegatronChoice) -> tuple:
    """What a choice leaves resident between phases, its last entry the sequence split (the rollout's cache
    key drops it)."""
    if isinstance(choice, MegatronChoice):
        return (*choice.resident_key, choice.context)
    return (choice.lora_rank, choice.param_offload, choice.optimizer_offload, choice.ref_param_offload,
            choice.fsdp_size, choice.critic_param_offload, choice.critic_optimizer_offload,
            choice.offload_policy, choice.critic_offload_policy, choice.ulysses)


def _apply_choice(skeleton: Plan, choice: TrainingChoice | MegatronChoice, request: SolveRequest) -> Plan:
    if isinstance(choice, TrainingChoice):
        return apply_training_choice(skeleton, choice, request)
    # LoRA needs about 10x the full-fine-tuning learning rate (verl's LoRA guide), as for FSDP.
    lr_scale = 10.0 if choice.lora_rank and request.base is None else 1.0
    return apply_megatron_choice(skeleton, choice, lambda dp: _mini_batch_size(request, dp), lr_scale)


def _dropped_point(plan: Plan, request: SolveRequest, reason: str) -> FrontierPoint:
    report = predict_memory(plan, request.profile)
    step = predict_step_time(plan, report, request.profile)
    return FrontierPoint(step_time_s=step.total_seconds, gpu_peak_gib=report.gpu_peak_bytes / GIB, feasible=False,
                         rank=0, knobs=tuple(searched_knobs(plan).items()), reason=reason)


def _ranked_points(ranked: list[Candidate]) -> list[FrontierPoint]:
    return [FrontierPoint(step_time_s=c.step_time.total_seconds, gpu_peak_gib=c.memory.gpu_peak_bytes / GIB,
                          feasible=True, rank=rank, knobs=tuple(searched_knobs(c.plan).items()))
            for rank, c in enumerate(ranked, start=1)]


def _budgets_reach_caps(plan: Plan) -> bool:
    actor_cap, forward_cap = _budget_caps(plan)
    return plan.actor.ppo_max_token_len_per_gpu >= actor_cap


def _preference_key(candidate: Candidate, request: SolveRequest) -> tuple[float, ...]:
    # With --lora auto, full fine-tuning whenever it fits; LoRA only as the fallback.
    lora_last = float(request.lora == "auto" and candidate.plan.model.lora.enabled)
    return (lora_last, *_rank_key(candidate, request.objective))


# Candidates whose predicted step is within this fraction of the fastest count as equally fast (the step-time
# model is no finer): among them solve takes the one that leaves the most GPU memory.
STEP_TIME_TOLERANCE = 0.02


def _roomiest_first(ranked: list[Candidate], request: SolveRequest) -> list[Candidate]:
    """`ranked` with the candidate of least peak memory among those as fast as the best (within the
    tolerance, and of the best's LoRA class under --lora auto) moved to the front."""
    if request.objective == "memory" or len(ranked) < 2:
        return ranked
    best = ranked[0]
    fastest = best.step_time.total_seconds * (1 + STEP_TIME_TOLERANCE)
    near = [c for c in ranked if c.step_time.total_seconds <= fastest
            and _preference_key(c, request)[0] == _preference_key(best, request)[0]]
    roomiest = min(near, key=lambda c: (c.memory.gpu_peak_bytes, c.step_time.total_seconds))
    return [roomiest, *(c for c in ranked if c is not roomiest)]


def _closer(current: Candidate | None, plan: Plan, request: SolveRequest) -> Candidate:
    """Keep the infeasible plan that misses by the least, to name the binding constraint."""
    report = predict_memory(plan, request.profile)
    candidate = Candidate(plan=plan, memory=report, step_time=StepTime(phase_seconds={}))
    if current is None or (report.binding_constraint.relative_headroom
                           > current.memory.binding_constraint.relative_headroom):
        return candidate
    return current


def request_margin(request: SolveRequest):
    """The margin the request's plans are held to (model_error.plan_margin on its workload with its pins)."""
    skeleton = skeleton_plan(request, request.response_len or request.max_response_len or 1)
    plan = apply_knobs(skeleton.evolve(model=attrs.evolve(skeleton.model, use_remove_padding=True)), request.pins)
    return plan_margin(plan, request.headroom, request.profile)


def finalize(candidate: Candidate, profile: Profile) -> Plan:
    """Record the prediction in the plan, as `explain` and the runtime's plan-vs-actual read it."""
    report, step = candidate.memory, candidate.step_time
    prediction = Prediction(
        gpu_peak_gib=round(max(p.peak_bytes for p in report.phases) / GIB, 3),
        host_peak_gib=round(report.host.total_bytes / GIB, 3),
        step_time_s=round(step.total_seconds, 3),
        phase_peak_gib={p.name: round(p.peak_bytes / GIB, 3) for p in report.phases},
        phase_seconds={k: round(v, 3) for k, v in step.phase_seconds.items()},
        profile=profile.name,
    )
    return candidate.plan.evolve(prediction=prediction)


# The knobs the search sets, as `solve --top` shows each candidate's: the training choices, each pass's token
# budget and micro batch (phases.PASS_KNOBS, which the passes set), and the rollout engine's sizes.
PASS_SEARCHED_KNOBS = tuple(key for knobs in PASS_KNOBS.values() for key in (knobs.token_budget, knobs.micro_batch))
ROLLOUT_SEARCHED_KNOBS = ("rollout.tensor_model_parallel_size", "rollout.gpu_memory_utilization",
                          "rollout.max_num_seqs", "rollout.max_num_batched_tokens")
SEARCHED_KNOBS = (
    "model.lora.rank", "actor.param_offload", "actor.optimizer_offload", "model.gradient_checkpointing",
    "model.activation_offload", "actor.ulysses_sequence_parallel_size", "actor.fsdp_size", "ref.param_offload",
    "critic.param_offload", "critic.optimizer_offload", "critic.gradient_checkpointing", "actor.offload_policy",
    "critic.offload_policy", *PASS_SEARCHED_KNOBS, *ROLLOUT_SEARCHED_KNOBS,
)


MEGATRON_SEARCHED_KNOBS = (
    "model.lora.rank", *(f"actor.megatron.{name}" for name in (
        "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
        "expert_model_parallel_size", "expert_tensor_parallel_size", "param_offload", "optimizer_offload",
        "recompute_granularity")),
    *PASS_SEARCHED_KNOBS, *ROLLOUT_SEARCHED_KNOBS,
)


def searched_knobs(plan: Plan) -> dict[str, Any]:
    """The searched knobs of a plan by dotted key; the critic's and the reference's only when the plan has one;
    on a Megatron plan its engine's instead of FSDP's."""
    knobs = {}
    for dotted in MEGATRON_SEARCHED_KNOBS if plan.is_megatron else SEARCHED_KNOBS:
        if (dotted.startswith("critic.") and not plan.uses_critic) or (
                dotted.startswith("ref.") and not plan.uses_reference):
            continue
        knobs[dotted] = knob_value(plan, dotted)
    return knobs


def solve(request: SolveRequest, *, keep: int = RUNNERS_UP + 1, frontier: bool = False) -> SolveResult:
    """The best plan, and up to `keep` - 1 runners-up best first (for --verify and --top).

    frontier: also price every candidate of the final search, feasible or not (`solve --frontier`).
    """
    response_len = request.response_len
    evaluated_total = 0
    # A pin of the wrong type or an unknown key is bad input, whether or not any candidate gets built.
    target = apply_knobs(skeleton_plan(request, response_len or request.max_response_len or 1), request.pins)
    # The target release's space: a knob its trainer config lacks stays at what that release does (the user's
    # own pins win, and render then names the key).
    absent = absent_knobs(target)
    if "model.lora.rank" in absent and request.lora not in ("off", "auto", 0):
        added = BY_FIELD["model.lora.rank"].releases(backend_of(target.actor.strategy))[0]
        raise PlanError(field="--lora", message=f"asks for LoRA rank {request.lora}, but verl {target.stack.verl} has "
                        f"no LoRA on this backend (verl added it in {added}).",
                        fix=f"pass --lora off, or --verl-version {added} or later")
    request = attrs.evolve(request, pins={**absent, **request.pins})
    if response_len is None:
        response_len, evaluated_total = _longest_fitting_response(request)
    dropped: list[FrontierPoint] | None = [] if frontier else None
    ranked, evaluated, feasible, closest = _search(request, response_len, dropped=dropped)
    evaluated_total += evaluated
    points = (*_ranked_points(ranked), *dropped) if dropped is not None else ()
    if ranked:
        finalized = [attrs.evolve(c, plan=finalize(c, request.profile)) for c in ranked[:max(keep, 1)]]
        return SolveResult(best=finalized[0], evaluated=evaluated_total, feasible=feasible,
                           runners_up=tuple(finalized[1:]), frontier=points)
    broken = request_rule_violations(request, response_len)
    diagnosis = diagnose_rules(request, broken, response_len) if broken else diagnose(request, closest, response_len)
    return SolveResult(best=None, evaluated=evaluated_total, feasible=0, diagnosis=diagnosis, frontier=points)


def solve_engines(request: SolveRequest, engines: tuple[RolloutEngine, ...], *,
                  keep: int = RUNNERS_UP + 1, frontier: bool = False) -> SolveResult:
    """`solve` once per rollout engine (each pinned) and per strategy (both with --strategy auto), keeping the
    best plan by the request's objective.

    When no engine fits, the first engine's diagnosis is returned. The frontier holds every engine's points.
    """
    strategies: tuple[SolveStrategy, ...] = ("fsdp", "megatron") if request.strategy == "auto" else (request.strategy,)
    results = [solve(attrs.evolve(request, strategy=strategy, pins={**request.pins, "rollout.name": engine}),
                     keep=keep, frontier=frontier) for strategy in strategies for engine in engines]
    evaluated = sum(result.evaluated for result in results)
    points = tuple(point for result in results for point in result.frontier)
    # Each result beside its best candidate, so that the ranking sees a Candidate and not an Optional.
    feasible = [(result, result.best) for result in results if result.best is not None]
    if not feasible:
        return attrs.evolve(results[0], evaluated=evaluated, frontier=points)
    best, _ = min(feasible, key=lambda pair: _rank_key(pair[1], request.objective))
    return attrs.evolve(best, evaluated=evaluated, feasible=sum(result.feasible for result in results),
                        frontier=points)


def _longest_fitting_response(request: SolveRequest) -> tuple[int, int]:
    """--max-response-len alone: the longest response, in steps of 256 tokens, that fits.

    Feasibility is monotone in the response length, so bisect with feasibility-only searches;
    returns the shortest candidate length when none fits, for the diagnosis.
    """
    assert request.max_response_len is not None
    limit = max(1, min(request.max_response_len, request.model.arch.max_position_embeddings - request.prompt_len))
    lengths = sorted({min(limit, step) for step in range(256, limit + 256, 256)} | {limit})
    evaluated_total = 0
    lo, hi, found = 0, len(lengths) - 1, lengths[0]
    while lo <= hi:
        mid = (lo + hi) // 2
        ranked, evaluated, _, _ = _search(request, lengths[mid], feasibility_only=True)
        evaluated_total += evaluated
        if ranked:
            found, lo = lengths[mid], mid + 1
        else:
            hi = mid - 1
    return found, evaluated_total


# --- when nothing fits --------------------------------------------------------------

# Knobs the search itself sets: a rule whose every fix is one of these is the search's business,
# not a fault of the request.
SOLVER_SET_KEYS = frozenset({
    *(key for knobs in PASS_KNOBS.values()
      for key in (knobs.token_budget, knobs.micro_batch, knobs.legacy_micro_batch) if key is not None),
    "rollout.max_num_seqs", "rollout.max_num_batched_tokens", "rollout.gpu_memory_utilization",
    "rollout.agent_num_workers",
})


def request_rule_violations(request: SolveRequest, response_len: int) -> list[Violation]:
    """verl's rules that the request itself breaks (batch, layout, pinned parallelism), whatever the search sets.

    Checked on the workload with the pins and the most memory-saving training choice: a batch
    that does not split over the ranks fails every candidate, and memory is then beside the point.
    """
    skeleton = skeleton_plan(request, response_len)
    choices = _choices_for(request, skeleton.data.max_sequence_length, feasibility_only=True)
    if not choices:
        return []
    plan = apply_knobs(_apply_choice(skeleton, choices[0], request), request.pins)
    if "rollout.tensor_model_parallel_size" not in request.pins:
        plan = plan.evolve(rollout=attrs.evolve(plan.rollout, tensor_model_parallel_size=1))
    broken = [v for v in check_plan(plan).errors if not (v.suggested and set(v.suggested) <= SOLVER_SET_KEYS)]
    # The solver picked the mini batch when the user did not: name the rule the user's own values break first.
    solver_mini = {"actor.ppo_mini_batch_size", "critic.ppo_mini_batch_size"}
    return sorted(broken, key=lambda v: request.ppo_mini_batch_size is None and bool(v.suggested)
                  and set(v.suggested) <= solver_mini)


def _nearest_valid(value: int, valid) -> list[int]:
    """The nearest values below and above `value` (within a factor of two) for which `valid(v)` holds."""
    found = []
    for step in (-1, 1):
        candidate = value + step
        while 1 <= candidate <= 2 * value + 8:
            if valid(candidate):
                found.append(candidate)
                break
            candidate += step
    return found


def _rule_fixed_requests(request: SolveRequest, broken: list[Violation],
                         response_len: int) -> list[tuple[str, SolveRequest]]:
    """Requests at the nearest values that satisfy the broken rules, each with the flags that say it."""

    def clean(candidate: SolveRequest) -> bool:
        return not request_rule_violations(candidate, response_len)

    fixed: list[tuple[str, SolveRequest]] = []
    pins = dict(request.pins)
    pinned_fixes = {k: v for violation in broken for k, v in violation.suggested.items() if k in pins}
    if pinned_fixes:
        candidate = attrs.evolve(request, pins={**pins, **pinned_fixes})
        if clean(candidate):
            fixed.append((" ".join(f"--fix {k}={v}" for k, v in pinned_fixes.items()), candidate))
    if request.ppo_mini_batch_size is not None:
        for mini in _nearest_valid(request.ppo_mini_batch_size, lambda m: m <= request.train_batch_size and clean(
                attrs.evolve(request, ppo_mini_batch_size=m))):
            fixed.append((f"--ppo-mini-batch-size {mini}", attrs.evolve(request, ppo_mini_batch_size=mini)))

    def with_batch(size: int) -> SolveRequest:
        mini = None if request.ppo_mini_batch_size is None else min(request.ppo_mini_batch_size, size)
        return attrs.evolve(request, train_batch_size=size, ppo_mini_batch_size=mini)

    for size in _nearest_valid(request.train_batch_size, lambda b: clean(with_batch(b))):
        fixed.append((f"--train-batch-size {size}", with_batch(size)))
    return fixed


def diagnose_rules(request: SolveRequest, broken: list[Violation], response_len: int) -> Diagnosis:
    """Name the verl rule the request breaks and the nearest valid values that also fit (re-solved)."""
    first = broken[0]
    binding = f"verl rule `{first.rule}`: {first.message}"
    if len(broken) > 1:
        binding += " Also broken: " + ", ".join(f"`{v.rule}`" for v in broken[1:]) + "."
    suggestions = []
    for change, fixed in _rule_fixed_requests(request, broken, response_len):
        solved = solve(fixed) if _fits(fixed, response_len) else None
        if solved is not None and solved.best is not None:
            suggestions.append(Suggestion(change=change, detail="the nearest value verl accepts; re-solved, it fits",
                                          step_time_s=round(solved.best.step_time.total_seconds, 1),
                                          gpus=fixed.cluster.world_size,
                                          gpu_memory_gib=fixed.cluster.world_size * fixed.cluster.gpu.memory_gib))
    if suggestions:
        message = (f"Nothing fits: {binding} The nearest valid values that fit: "
                   + "; ".join(s.change for s in suggestions) + ".")
    else:
        message = f"Nothing fits: {binding} Fix: {first.fix}."
    return Diagnosis(binding=binding, message=message, suggestions=tuple(suggestions))



def _fits(request: SolveRequest, response_len: int) -> bool:
    ranked, _, _, _ = _search(request, response_len, feasibility_only=True)
    return bool(ranked)


# Suggestions shown when nothing fits: the best few, so the user can weigh them.
SUGGESTIONS_SHOWN = 3
# How far each axis is stretched looking for a fit.
GPU_COUNT_FACTORS = (2, 4, 8, 16, 32, 64)
HOST_MEMORY_FACTORS = (2, 4, 8)
HARDWARE_TIER_STEP = 0.1


def _scaled_cluster(cluster: Cluster, factor: int, gpu: Any = None) -> Cluster:
    """`factor` x the GPUs, filling nodes of up to 8 (or the current node size) first."""
    scaled = cluster_with_gpus(cluster, cluster.world_size * factor)
    assert scaled is not None  # a multiple of the current count always lays out
    return attrs.evolve(scaled, gpu=gpu or cluster.gpu)


def cluster_with_gpus(cluster: Cluster, total: int) -> Cluster | None:
    """`total` GPUs of the cluster's kind, filling nodes of up to 8 (or the current node size) first; None when
    `total` fills no whole number of such nodes."""
    per_node = min(total, max(cluster.gpus_per_node, 8))
    if total % per_node:
        per_node = cluster.gpus_per_node
    if total % per_node:
        return None
    return attrs.evolve(cluster, nodes=total // per_node, gpus_per_node=per_node)


def _gpu_count_flags(cluster: Cluster) -> str:
    """The flags that give `cluster`'s GPU count, as `solve` reads them (8 per node unless told)."""
    total = cluster.world_size
    return f"--gpus {total}" + ("" if cluster.gpus_per_node == min(total, 8)
                                else f" --gpus-per-node {cluster.gpus_per_node}")


def _fewest_more_gpus(request: SolveRequest, response_len: int) -> tuple[SolveRequest, int] | None:
    """More GPUs of the request's kind: the nearest count past the current one that verl's batch rules accept
    and that fits (with more host RAM per node where that is needed too), and its host-RAM factor.

    Doubling finds a count that fits; the counts between it and the last that did not are then tried in
    order, so 8 -> 12 is found where 12 fits and satisfies the rules, not only 16.
    """
    cluster = request.cluster
    tried = cluster.world_size
    for factor in GPU_COUNT_FACTORS:
        top = cluster.world_size * factor
        for host_factor in (1, *HOST_MEMORY_FACTORS):
            host = cluster.host_memory_gib * host_factor
            doubled = attrs.evolve(request, cluster=attrs.evolve(_scaled_cluster(cluster, factor),
                                                                 host_memory_gib=host))
            if not _fits(doubled, response_len):
                continue
            for total in range(tried + 1, top + 1):
                between = doubled.cluster if total == top else cluster_with_gpus(cluster, total)
                if between is None:
                    continue
                candidate = attrs.evolve(request, cluster=attrs.evolve(between, host_memory_gib=host))
                if not request_rule_violations(candidate, response_len) and _fits(candidate, response_len):
                    return candidate, host_factor
            # Memory fits at `top` but no count up to it splits the batch as verl needs: look further out.
            break
        tried = top
    return None


def _change_candidates(request: SolveRequest,
                       response_len: int) -> Iterator[tuple[str, str, bool, SolveRequest, bool]]:
    """(flags, detail, keeps_workload, request, more_gpus) for each axis, at the smallest step along it that fits."""
    from rlplan.planner.presets import gpu_presets  # late: only a failed solve needs the table

    cluster = request.cluster
    # The same GPU kind or one at least as fast (a bigger but slower GPU is not a fix a user wants),
    # each at the fewest GPUs that fit.
    kinds = [cluster.gpu] + sorted((g for g in gpu_presets().values() if g.name != cluster.gpu.name
                                    and g.memory_gib > cluster.gpu.memory_gib
                                    and g.bf16_tflops >= cluster.gpu.bf16_tflops), key=lambda g: g.memory_gib)
    more = _fewest_more_gpus(request, response_len)
    if more is not None:
        candidate, host_factor = more
        bigger = candidate.cluster
        flags = _gpu_count_flags(bigger) + (f" --host-mem {bigger.host_memory_gib:g}" if host_factor > 1 else "")
        detail = f"{bigger.world_size} x {cluster.gpu.name} ({cluster.gpu.memory_gib:g} GiB)" + (
            f", {bigger.host_memory_gib:g} GiB host RAM per node" if host_factor > 1 else "")
        yield flags, detail, True, candidate, True
    # More or bigger GPUs may also need more host RAM (a large model's shared-memory copy per node):
    # each GPU step tries the host steps too, so a change needing both is still found.
    for gpu in kinds[1:]:
        found = False
        for factor, host_factor in itertools.product((1, *GPU_COUNT_FACTORS), (1, *HOST_MEMORY_FACTORS)):
            host = cluster.host_memory_gib * host_factor
            bigger = attrs.evolve(_scaled_cluster(cluster, factor, gpu), host_memory_gib=host)
            candidate = attrs.evolve(request, cluster=bigger)
            if _fits(candidate, response_len):
                words = ([] if gpu is cluster.gpu else [f"--gpu {gpu.name}"]) + (
                    [f"--gpus {bigger.world_size}"] if factor > 1 else []) + (
                    [f"--host-mem {host:g}"] if host_factor > 1 else [])
                detail = f"{bigger.world_size} x {gpu.name} ({gpu.memory_gib:g} GiB)" + (
                    f", {host:g} GiB host RAM per node" if host_factor > 1 else "")
                yield " ".join(words), detail, True, candidate, False
                found = True
                break
        if found:
            continue
    for factor in HOST_MEMORY_FACTORS:
        host = cluster.host_memory_gib * factor
        candidate = attrs.evolve(request, cluster=attrs.evolve(cluster, host_memory_gib=host))
        if _fits(candidate, response_len):
            yield f"--host-mem {host:g}", f"{host:g} GiB of host RAM per node", True, candidate, False
            break
    if request.lora == "off" or request.lora == 0:
        rank = default_lora_rank(request.model.arch)
        candidate = attrs.evolve(request, lora=rank)
        if _fits(candidate, response_len):
            yield f"--lora {rank}", f"LoRA rank {rank} instead of full fine-tuning", False, candidate, False
    shorter = response_len
    while shorter > 256:
        shorter //= 2
        candidate = attrs.evolve(request, response_len=shorter, max_response_len=None)
        if _fits(candidate, shorter):
            yield (f"--response-len {shorter}", f"responses of {shorter} tokens instead of {response_len}", False,
                   candidate, False)
            break
    smaller = request.train_batch_size
    while smaller > 1:
        smaller //= 2
        mini = None if request.ppo_mini_batch_size is None else min(request.ppo_mini_batch_size, smaller)
        candidate = attrs.evolve(request, train_batch_size=smaller, ppo_mini_batch_size=mini)
        if _fits(candidate, response_len):
            yield (f"--train-batch-size {smaller}", f"{smaller} prompts per step instead of "
                   f"{request.train_batch_size}", False, candidate, False)
            break


def _hardware_tier(suggestion: Suggestion) -> int:
    """GPU memory bought, in steps of 10 %: hardware within one step costs about the same."""
    return math.floor(math.log(max(suggestion.gpu_memory_gib, 1.0)) / math.log(1 + HARDWARE_TIER_STEP))


def _margin_binding(closest: Candidate, request: SolveRequest) -> str:
    """Why a candidate within the GPU still failed: the margin it must leave, or the KV cache / a rule."""
    margin = plan_margin(closest.plan, request.headroom, request.profile)
    phase = closest.memory.peak_phase
    left = (closest.memory.gpu_capacity_bytes - phase.peak_bytes) / GIB
    if margin.bytes and left < margin.gib:
        return (f"at best ({_choice_text(closest.plan)}) the {phase.name} phase leaves {left:.2f} GiB of the GPU "
                f"free, less than the {margin.gib:.2f} GiB margin ({margin.rule}; --headroom sets it)")
    limit = closest.memory.binding_constraint
    return f"the {limit.where} phase leaves too little room for {limit.component}"


def _suggestion_rank(suggestion: Suggestion) -> tuple[bool, int, float]:
    return (not suggestion.keeps_workload, _hardware_tier(suggestion), suggestion.step_time_s or 0.0)


def _shown_suggestions(suggestions: list[Suggestion]) -> list[Suggestion]:
    """The best few, one per hardware tier (three variants of "4 x 80 GiB" are one choice, not three), with
    more GPUs of the same kind always among them when that fits: it keeps the run and the GPUs one has."""
    ranked = sorted(suggestions, key=_suggestion_rank)
    tiers: dict[tuple[bool, int], Suggestion] = {}
    for suggestion in ranked:
        tiers.setdefault((suggestion.keeps_workload, _hardware_tier(suggestion)), suggestion)
    shown = list(tiers.values())[:SUGGESTIONS_SHOWN]
    more = next((s for s in ranked if s.more_gpus), None)
    if more is not None and more not in shown:
        shown = sorted([*shown[:SUGGESTIONS_SHOWN - 1], more], key=_suggestion_rank)
    return shown


def diagnose(request: SolveRequest, closest: Candidate | None, response_len: int) -> Diagnosis:
    """The binding constraint, and the changes along each axis that fit, ranked by what they cost the user.

    Each change is re-solved in full: hardware changes, which keep the run the user asked for,
    come before changes to what is trained; within each, less GPU memory bought (GPUs x GiB, the
    price proxy), then the shorter predicted step.
    """
    if closest is not None:
        limit = closest.memory.binding_constraint
        over = -limit.headroom_bytes / GIB
        binding = (f"at best ({_choice_text(closest.plan)}) the {limit.where} phase needs {over:.1f} GiB more "
                   f"{'host RAM' if limit.resource == 'host' else 'GPU memory'} than there is, mostly "
                   f"{limit.component}" if over > 0 else _margin_binding(closest, request))
    else:
        binding = "no candidate satisfied the pinned knobs and verl's rules"
    suggestions: list[Suggestion] = []
    for change, detail, keeps_workload, candidate, more_gpus in _change_candidates(request, response_len):
        solved = solve(candidate)
        if solved.best is None:
            continue
        suggestions.append(Suggestion(change=change, detail=detail, keeps_workload=keeps_workload,
                                      more_gpus=more_gpus,
                                      step_time_s=round(solved.best.step_time.total_seconds, 1),
                                      gpus=candidate.cluster.world_size,
                                      gpu_memory_gib=candidate.cluster.world_size * candidate.cluster.gpu.memory_gib))
    suggestions = _shown_suggestions(suggestions)
    if suggestions:
        ranked = "; ".join(f"{s.change} ({s.detail}, ~{s.step_time_s:g} s per step)" for s in suggestions)
        message = f"Nothing fits: {binding}. Changes that fit, best first (each re-solved): {ranked}."
    else:
        message = (f"Nothing fits: {binding}. No change tried ({GPU_COUNT_FACTORS[-1]}x the GPUs, a bigger GPU "
                   f"at least as fast, {HOST_MEMORY_FACTORS[-1]}x the host RAM, LoRA, shorter responses, a "
                   "smaller batch) makes it fit.")
    return Diagnosis(binding=binding, message=message, suggestions=tuple(suggestions))

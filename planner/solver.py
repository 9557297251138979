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

import math
from collections.abc import Iterator
from typing import Any, Literal

import attrs
from attrs import field, frozen

from rlplan.planner.arch import Architecture
from rlplan.planner.errors import PlanError
from rlplan.planner.hardware import Cluster
from rlplan.planner.knobs import apply_knobs
from rlplan.planner.layout import plan_layout
from rlplan.planner.memory import MemoryReport, predict_memory, predict_phase
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
    RolloutSection,
    TrainerSection,
)
from rlplan.planner.profile import DEFAULT_PROFILE, Profile
from rlplan.planner.rules import VLLM_LORA_RANKS, check_plan
from rlplan.planner.steptime import StepTime, predict_step_time

GIB = 2**30
Objective = Literal["throughput", "memory"]
LoraChoice = Literal["off", "auto"] | int

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
    pins: dict[str, Any] = field(factory=dict)
    base: Plan | None = None
    profile: Profile = DEFAULT_PROFILE

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
    """One change to the request that makes it fit."""

    change: str
    detail: str
    relative_change: float


@frozen(kw_only=True)
class Diagnosis:
    binding: str
    message: str
    suggestions: tuple[Suggestion, ...]


@frozen(kw_only=True)
class SolveResult:
    best: Candidate | None
    evaluated: int
    feasible: int
    diagnosis: Diagnosis | None = None
    # The next-best feasible candidates after `best`, in order (for `solve --verify`).
    runners_up: tuple[Candidate, ...] = ()

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
            if sp <= cluster.gpus_per_node and cluster.world_size % sp == 0 and arch.num_attention_heads % sp == 0 and (
                arch.num_kv_heads % sp == 0 or sp % arch.num_kv_heads == 0
            ):
                options.append(sp)
    return options


def tensor_parallel_options(arch: Architecture, cluster: Cluster) -> list[int]:
    options = []
    tp = 1
    while tp <= max(cluster.gpus_per_node, 1) * 2 and tp <= cluster.world_size:
        kv_ok = arch.is_mla or arch.num_kv_heads % tp == 0 or tp % arch.num_kv_heads == 0
        if cluster.world_size % tp == 0 and arch.num_attention_heads % tp == 0 and kv_ok:
            options.append(tp)
        tp *= 2
    return options or [1]


def training_choices(request: SolveRequest, sequence_len: int) -> Iterator[TrainingChoice]:
    arch, cluster = request.model.arch, request.cluster
    fsdp_options = [-1]
    if cluster.nodes > 1:
        fsdp_options.append(cluster.gpus_per_node)  # HSDP keeps all-gathers inside a node
    for rank in lora_ranks(request):
        # With LoRA the reference is the actor with its adapter off: there is no separate model to offload.
        ref_offload_options = [False, True] if rank == 0 else [False]
        for param_offload, optimizer_offload in ((False, False), (False, True), (True, True)):
            for checkpointing, activation_offload in ((False, False), (True, False), (True, True)):
                for ulysses in ulysses_options(arch, cluster, sequence_len):
                    for fsdp_size in fsdp_options:
                        for ref_offload in ref_offload_options:
                            yield TrainingChoice(
                                lora_rank=rank, param_offload=param_offload, optimizer_offload=optimizer_offload,
                                gradient_checkpointing=checkpointing, activation_offload=activation_offload,
                                ulysses=ulysses, fsdp_size=fsdp_size, ref_param_offload=ref_offload,
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
                            max_prompt_length=request.prompt_len, max_response_length=response_len)
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
    return Plan(
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


def apply_training_choice(plan: Plan, choice: TrainingChoice, request: SolveRequest) -> Plan:
    lora = LoraConfig(rank=choice.lora_rank, alpha=2 * choice.lora_rank) if choice.lora_rank else LoraConfig()
    model = attrs.evolve(
        plan.model, lora=lora, gradient_checkpointing=choice.gradient_checkpointing,
        activation_offload=choice.activation_offload, use_remove_padding=True,
    )
    dp = plan.cluster.world_size // choice.ulysses
    # LoRA needs about 10x the full-fine-tuning learning rate (verl's LoRA guide).
    lr = plan.actor.lr * 10 if choice.lora_rank and request.base is None else plan.actor.lr
    actor = attrs.evolve(
        plan.actor, param_offload=choice.param_offload, optimizer_offload=choice.optimizer_offload,
        ulysses_sequence_parallel_size=choice.ulysses, fsdp_size=choice.fsdp_size,
        ppo_mini_batch_size=_mini_batch_size(request, dp), lr=lr,
    )
    critic = attrs.evolve(
        plan.critic, param_offload=choice.param_offload, optimizer_offload=choice.optimizer_offload,
        gradient_checkpointing=choice.gradient_checkpointing, ulysses_sequence_parallel_size=choice.ulysses,
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
    if fits(high):
        return high
    lo, hi = low, high  # fits(lo), not fits(hi)
    while hi - lo > BUDGET_GRANULARITY:
        mid = lo + ((hi - lo) // 2 // BUDGET_GRANULARITY) * BUDGET_GRANULARITY
        if mid <= lo:
            break
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def _peak_within_gpu(report: MemoryReport, name: str) -> bool:
    return all(p.peak_bytes <= report.gpu_capacity_bytes for p in report.phases if p.name == name)


def phase_fits(report: MemoryReport, name: str) -> bool:
    """One phase within the GPU; the rollout must also hold one max_model_len sequence of KV."""
    fits = _peak_within_gpu(report, name)
    if name == "rollout":
        fits = fits and report.rollout.holds_max_model_len
    return fits


def _phase_fits(plan: Plan, phase: str, profile: Profile) -> bool:
    """A training or forward phase alone: its peak depends on that pass's token budget only."""
    return predict_phase(plan, phase, profile).peak_bytes <= plan.cluster.gpu_memory_bytes


def _budget_floor(plan: Plan) -> int:
    """verl R1: one whole sequence must fit a micro batch of the Ulysses group."""
    return math.ceil(plan.data.max_sequence_length / plan.actor.ulysses_sequence_parallel_size)


def _budget_caps(plan: Plan) -> tuple[int, int]:
    """Budgets beyond one mini batch (update) or the whole batch (forward) per GPU change nothing."""
    sequence_len = plan.data.max_sequence_length
    sp = plan.actor.ulysses_sequence_parallel_size
    minimum = _budget_floor(plan)
    dp = max(plan.cluster.world_size // sp, 1)
    per_gpu_sequences = max(1, plan.data.train_batch_size * plan.rollout.n // dp)
    mini_tokens = math.ceil(plan.actor.ppo_mini_batch_size * plan.rollout.n * sequence_len / dp / sp)
    limit = MAX_BUDGET_MULTIPLE_OF_SEQUENCE * sequence_len

    def rounded(value: int) -> int:
        return max(minimum, math.ceil(value / BUDGET_GRANULARITY) * BUDGET_GRANULARITY)

    return rounded(min(limit, max(mini_tokens, minimum))), rounded(min(limit, per_gpu_sequences * sequence_len // sp))


def _largest_fitting_divisor(total: int, fits) -> int | None:
    """Largest micro batch that divides `total` sequences (verl N5) and fits its phase."""
    for size in sorted((d for d in range(1, total + 1) if total % d == 0), reverse=True):
        if fits(size):
            return size
    return None


def _solve_pass(plan: Plan, request: SolveRequest, *, phase: str, dynamic: bool, chunk: int, cap: int,
                with_budget, with_micro) -> Plan | None:
    """One pass's micro batches: the largest token budget (dynamic bsz) or the largest fixed micro batch."""
    profile = request.profile
    if dynamic:
        budget = _largest_fitting(_budget_floor(plan), cap,
                                  lambda b: _phase_fits(with_budget(plan, b), phase, profile))
        return None if budget is None else with_budget(plan, budget)
    if chunk <= 0:
        return None
    micro = _largest_fitting_divisor(chunk, lambda m: _phase_fits(with_micro(plan, m), phase, profile))
    return None if micro is None else with_micro(plan, micro)


def solve_token_budgets(plan: Plan, request: SolveRequest) -> Plan | None:
    """Per pass, the largest token budget (or fixed micro batch) that fits its phase; None if nothing does."""
    cap, forward_cap = _budget_caps(plan)
    layout = plan_layout(plan)
    actor_mini = layout.actor_update.mini_batch_size_per_gpu or 0
    plan = _solve_pass(
        plan, request, phase="actor_update", dynamic=plan.actor.use_dynamic_bsz, chunk=actor_mini, cap=cap,
        with_budget=lambda p, b: p.evolve(actor=attrs.evolve(p.actor, ppo_max_token_len_per_gpu=b)),
        with_micro=lambda p, m: p.evolve(actor=attrs.evolve(p.actor, ppo_micro_batch_size_per_gpu=m,
                                                            ppo_micro_batch_size=None)),
    )
    if plan is None:
        return None
    plan = _solve_pass(
        plan, request, phase="old_log_prob", dynamic=plan.rollout.log_prob_use_dynamic_bsz,
        chunk=layout.old_log_prob.sequences_per_gpu, cap=forward_cap,
        with_budget=lambda p, b: p.evolve(rollout=attrs.evolve(p.rollout, log_prob_max_token_len_per_gpu=b)),
        with_micro=lambda p, m: p.evolve(rollout=attrs.evolve(p.rollout, log_prob_micro_batch_size_per_gpu=m,
                                                              log_prob_micro_batch_size=None)),
    )
    if plan is None:
        return None
    if plan.uses_reference:
        plan = _solve_pass(
            plan, request, phase="ref_log_prob", dynamic=plan.ref.log_prob_use_dynamic_bsz,
            chunk=layout.old_log_prob.sequences_per_gpu, cap=forward_cap,
            with_budget=lambda p, b: p.evolve(ref=attrs.evolve(p.ref, log_prob_max_token_len_per_gpu=b)),
            with_micro=lambda p, m: p.evolve(ref=attrs.evolve(p.ref, log_prob_micro_batch_size_per_gpu=m,
                                                              log_prob_micro_batch_size=None)),
        )
        if plan is None:
            return None
    if plan.uses_critic:
        critic_mini = layout.critic_update.mini_batch_size_per_gpu if layout.critic_update else 0
        plan = _solve_pass(
            plan, request, phase="critic_update", dynamic=plan.critic.use_dynamic_bsz, chunk=critic_mini or 0,
            cap=cap,
            with_budget=lambda p, b: p.evolve(critic=attrs.evolve(p.critic, ppo_max_token_len_per_gpu=b,
                                                                  forward_max_token_len_per_gpu=b)),
            with_micro=lambda p, m: p.evolve(critic=attrs.evolve(p.critic, ppo_micro_batch_size_per_gpu=m,
                                                                 ppo_micro_batch_size=None,
                                                                 forward_micro_batch_size_per_gpu=m)),
        )
    return plan


def solve_rollout(plan: Plan, tensor_parallel_size: int, request: SolveRequest) -> Plan | None:
    """gpu_memory_utilization as high as the rollout and sync phases allow; max_num_seqs from the KV cache."""
    profile = request.profile
    replicas = plan.cluster.world_size // tensor_parallel_size
    sequences_per_replica = math.ceil(plan.data.train_batch_size * plan.rollout.n / replicas)
    max_num_seqs = max(1, min(MAX_NUM_SEQS_CAP, sequences_per_replica))
    rollout = attrs.evolve(
        plan.rollout, tensor_model_parallel_size=tensor_parallel_size, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max(8192, max_num_seqs),
    )
    plan = plan.evolve(rollout=rollout)

    def with_util(hundredths: int) -> Plan:
        return plan.evolve(rollout=attrs.evolve(plan.rollout, gpu_memory_utilization=hundredths / 100))

    def fits(hundredths: int) -> bool:
        # The rollout phase grows with util (vLLM takes util x GPU beside what the trainer leaves),
        # so "fits" is monotone and bisection finds the largest util; whether that util leaves room
        # for one max_model_len sequence of KV is checked after.
        report = predict_memory(with_util(hundredths), profile)
        return _peak_within_gpu(report, "rollout") and _peak_within_gpu(report, "weight_sync")

    low, high = 10, int(MAX_GPU_MEMORY_UTILIZATION * 100)
    if not fits(low):
        return None
    lo, hi = low, high
    if fits(hi):
        lo = hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    if not predict_memory(with_util(lo), profile).rollout.holds_max_model_len:
        return None
    plan = with_util(lo)
    report = predict_memory(plan, profile)
    # More sequences than the KV cache holds only makes vLLM preempt; fewer idles the GPU.
    concurrency = max(1, report.max_concurrent_sequences)
    max_num_seqs = max(1, min(MAX_NUM_SEQS_CAP, sequences_per_replica, concurrency))
    if max_num_seqs != plan.rollout.max_num_seqs:
        plan = plan.evolve(rollout=attrs.evolve(plan.rollout, max_num_seqs=max_num_seqs,
                                                max_num_batched_tokens=max(8192, max_num_seqs)))
    return plan


# --- search -------------------------------------------------------------------------


def _gpu_peak(report: MemoryReport) -> int:
    return max(p.peak_bytes for p in report.phases)


def _rank_key(candidate: Candidate, objective: Objective) -> tuple[float, ...]:
    if objective == "memory":
        return (_gpu_peak(candidate.memory), candidate.step_time.total_seconds)
    return (candidate.step_time.total_seconds, _gpu_peak(candidate.memory))


def _choice_text(plan: Plan) -> str:
    actor = plan.actor
    parts = [f"LoRA r{plan.model.lora.rank}" if plan.model.lora.enabled else "full fine-tuning"]
    if actor.param_offload or actor.optimizer_offload:
        parts.append("param+optimizer offload" if actor.param_offload else "optimizer offload")
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
    }
    return all(expected[key] == value for key, value in pins.items() if key in expected)


def _choices_for(request: SolveRequest, sequence_len: int, feasibility_only: bool) -> list[TrainingChoice]:
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
            + choice.gradient_checkpointing + choice.activation_offload,)


def _search(request: SolveRequest, response_len: int, *, feasibility_only: bool = False,
            ) -> tuple[list[Candidate], int, int, Candidate | None]:
    """Feasible candidates best first, evaluations, feasible count, and the least-infeasible candidate.

    Two caches keep this fast: the rollout side (util, max_num_seqs) depends only on what
    the trainer leaves resident, and checkpointing variants of a choice whose token
    budgets already reach their caps cannot be faster, so they are skipped.
    """
    skeleton = skeleton_plan(request, response_len)
    sequence_len = skeleton.data.max_sequence_length
    pins = request.pins
    # Type-check every pin against the schema once, before the choices below read them as numbers.
    apply_knobs(skeleton, pins)
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
    for choice in choices:
        if request.lora == "auto" and choice.lora_rank and full_ft_feasible:
            continue  # full fine-tuning fits: LoRA is only the fallback
        resident_key = (choice.lora_rank, choice.param_offload, choice.optimizer_offload, choice.ref_param_offload,
                        choice.fsdp_size, choice.ulysses)
        if choice.gradient_checkpointing and resident_key in budgets_at_cap:
            continue  # recompute would only slow a step whose budgets are already as large as useful
        plan = apply_knobs(apply_training_choice(skeleton, choice, request), pins)
        evaluated += 1
        trained = solve_token_budgets(plan, request)
        if trained is None:
            closest = _closer(closest, plan, request)
            continue
        if _budgets_reach_caps(trained):
            budgets_at_cap.add(resident_key)
        for tp in tp_options:
            evaluated += 1
            rollout_key = (*resident_key[:5], tp)
            if rollout_key not in rollout_cache:
                solved_rollout = solve_rollout(trained, tp, request)
                rollout_cache[rollout_key] = solved_rollout.rollout if solved_rollout is not None else None
            cached = rollout_cache[rollout_key]
            if cached is None:
                closest = _closer(closest, trained.evolve(
                    rollout=attrs.evolve(trained.rollout, tensor_model_parallel_size=tp)), request)
                continue
            solved = apply_knobs(trained.evolve(rollout=attrs.evolve(
                trained.rollout, tensor_model_parallel_size=tp,
                gpu_memory_utilization=cached.gpu_memory_utilization, max_num_seqs=cached.max_num_seqs,
                max_num_batched_tokens=cached.max_num_batched_tokens)), pins)
            report = predict_memory(solved, request.profile)
            if not (report.fits and report.rollout.holds_max_model_len) or not check_plan(solved).valid:
                closest = _closer(closest, solved, request)
                continue
            feasible += 1
            if choice.lora_rank == 0:
                full_ft_feasible = True
            if feasibility_only:
                return [Candidate(plan=solved, memory=report, step_time=StepTime(phase_seconds={}))], evaluated, 1, None
            ranked.append(Candidate(plan=solved, memory=report,
                                    step_time=predict_step_time(solved, report, request.profile)))
    ranked.sort(key=lambda c: _preference_key(c, request))
    return ranked, evaluated, feasible, closest


def _budgets_reach_caps(plan: Plan) -> bool:
    actor_cap, forward_cap = _budget_caps(plan)
    return plan.actor.ppo_max_token_len_per_gpu >= actor_cap


def _preference_key(candidate: Candidate, request: SolveRequest) -> tuple[float, ...]:
    # With --lora auto, full fine-tuning whenever it fits; LoRA only as the fallback.
    lora_last = float(request.lora == "auto" and candidate.plan.model.lora.enabled)
    return (lora_last, *_rank_key(candidate, request.objective))


def _closer(current: Candidate | None, plan: Plan, request: SolveRequest) -> Candidate:
    """Keep the infeasible plan that misses by the least, to name the binding constraint."""
    report = predict_memory(plan, request.profile)
    candidate = Candidate(plan=plan, memory=report, step_time=StepTime(phase_seconds={}))
    if current is None or (report.binding_constraint.relative_headroom
                           > current.memory.binding_constraint.relative_headroom):
        return candidate
    return current


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


def solve(request: SolveRequest) -> SolveResult:
    response_len = request.response_len
    evaluated_total = 0
    if response_len is None:
        response_len, evaluated_total = _longest_fitting_response(request)
    ranked, evaluated, feasible, closest = _search(request, response_len)
    evaluated_total += evaluated
    if ranked:
        finalized = [attrs.evolve(c, plan=finalize(c, request.profile)) for c in ranked[:RUNNERS_UP + 1]]
        return SolveResult(best=finalized[0], evaluated=evaluated_total, feasible=feasible,
                           runners_up=tuple(finalized[1:]))
    return SolveResult(best=None, evaluated=evaluated_total, feasible=0,
                       diagnosis=diagnose(request, closest, response_len))


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


def _fits(request: SolveRequest, response_len: int) -> bool:
    ranked, _, _, _ = _search(request, response_len, feasibility_only=True)
    return bool(ranked)


def diagnose(request: SolveRequest, closest: Candidate | None, response_len: int) -> Diagnosis:
    if closest is not None:
        limit = closest.memory.binding_constraint
        over = -limit.headroom_bytes / GIB
        binding = (f"at best ({_choice_text(closest.plan)}) the {limit.where} phase needs {over:.1f} GiB more "
                   f"{'host RAM' if limit.resource == 'host' else 'GPU memory'} than there is, mostly "
                   f"{limit.component}" if over > 0 else f"the {limit.where} phase leaves too little room for "
                   f"{limit.component}")
    else:
        binding = "no candidate satisfied the pinned knobs and verl's rules"
    suggestions: list[Suggestion] = []
    cluster = request.cluster
    for factor in (2, 4, 8):
        bigger = attrs.evolve(cluster, nodes=cluster.nodes * factor) if cluster.world_size >= cluster.gpus_per_node \
            else attrs.evolve(cluster, gpus_per_node=cluster.gpus_per_node * factor)
        if _fits(attrs.evolve(request, cluster=bigger), response_len):
            suggestions.append(Suggestion(change=f"--gpus {bigger.world_size}",
                                          detail=f"{factor}x the GPUs ({bigger.world_size})",
                                          relative_change=float(factor - 1)))
            break
    from rlplan.planner.presets import gpu_presets  # late: only a failed solve needs the table

    larger = sorted((g for g in gpu_presets().values() if g.memory_gib > cluster.gpu.memory_gib),
                    key=lambda g: g.memory_gib)
    for gpu in larger:
        if _fits(attrs.evolve(request, cluster=attrs.evolve(cluster, gpu=gpu)), response_len):
            suggestions.append(Suggestion(change=f"--gpu {gpu.name}", detail=f"{gpu.memory_gib:g} GiB per GPU",
                                          relative_change=gpu.memory_gib / cluster.gpu.memory_gib - 1))
            break
    shorter = response_len
    while shorter > 256:
        shorter //= 2
        if _fits(request, shorter):
            suggestions.append(Suggestion(change=f"--response-len {shorter}",
                                          detail=f"responses of {shorter} tokens instead of {response_len}",
                                          relative_change=1 - shorter / response_len))
            break
    smaller = request.train_batch_size
    while smaller > 1:
        smaller //= 2
        mini = None if request.ppo_mini_batch_size is None else min(request.ppo_mini_batch_size, smaller)
        if _fits(attrs.evolve(request, train_batch_size=smaller, ppo_mini_batch_size=mini), response_len):
            suggestions.append(Suggestion(change=f"--train-batch-size {smaller}",
                                          detail=f"{smaller} prompts per step instead of {request.train_batch_size}",
                                          relative_change=1 - smaller / request.train_batch_size))
            break
    if request.lora == "off" or (isinstance(request.lora, int) and request.lora == 0):
        rank = default_lora_rank(request.model.arch)
        if _fits(attrs.evolve(request, lora=rank), response_len):
            suggestions.append(Suggestion(change=f"--lora {rank}", detail=f"LoRA rank {rank} instead of full "
                                          "fine-tuning", relative_change=0.5))
    suggestions.sort(key=lambda s: s.relative_change)
    if suggestions:
        message = f"Nothing fits: {binding}. The smallest change that fits: {suggestions[0].change} ({suggestions[0].detail})."
    else:
        message = f"Nothing fits: {binding}. No single change tried (8x GPUs, a bigger GPU, shorter responses, a " \
                  "smaller batch, LoRA) makes it fit."
    return Diagnosis(binding=binding, message=message, suggestions=tuple(suggestions))

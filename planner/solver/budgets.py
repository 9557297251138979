"""Token budgets and GPU limits: the memory each phase may use, and each training pass's largest token budget (or
fixed micro batch) that fits its phase, by bisection on the memory model.
"""

from __future__ import annotations

import math

from rlplan.planner.knobs import apply_knobs, evolve_fields, knob_value
from rlplan.planner.layout import plan_layout
from rlplan.planner.memory import MemoryReport, predict_memory, predict_phase
from rlplan.planner.model_error import plan_margin
from rlplan.planner.monotone import last_holding
from rlplan.planner.phases import PASS_KNOBS, TOKEN_BUDGET_KEY, Phase
from rlplan.planner.plan import Plan
from rlplan.planner.profile import DEFAULT_PROFILE, Profile
from rlplan.planner.rules import check_plan
from rlplan.planner.solver.request import Objective, SolveRequest

# Token budgets are solved in steps of this many tokens: finer steps buy nothing measurable.
BUDGET_GRANULARITY = 256
# verl's perf guide: a budget of 2-3x (prompt + response) keeps packing efficient; beyond the
# tokens of one mini batch per GPU a bigger budget changes nothing.
MAX_BUDGET_MULTIPLE_OF_SEQUENCE = 8


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


def _budgets_reach_caps(plan: Plan) -> bool:
    actor_cap, forward_cap = _budget_caps(plan)
    return plan.actor.ppo_max_token_len_per_gpu >= actor_cap

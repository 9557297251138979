"""The rollout's sizes beside a trained plan: the engine's TP options, gpu_memory_utilization as high as the rollout
and weight-sync phases and the engine's start-up check (vLLM V1 from 0.9.1: no more than the free memory it starts
on) allow, and max_num_seqs from the KV cache.
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from rlplan.planner.arch import Architecture
from rlplan.planner.hardware import Cluster
from rlplan.planner.layout import plan_layout
from rlplan.planner.memory import predict_memory, predict_phases
from rlplan.planner.memory.rollout import requested_bytes, rollout_budget
from rlplan.planner.monotone import last_holding
from rlplan.planner.phases import Phase
from rlplan.planner.plan import Plan, RolloutSection
from rlplan.planner.profile import Profile
from rlplan.planner.rules.memory import least_batched_tokens
from rlplan.planner.solver.budgets import gpu_limit_bytes
from rlplan.planner.solver.request import SolveRequest
from rlplan.planner.steptime import rollout_concurrency, workload_lengths

MAX_GPU_MEMORY_UTILIZATION = 0.9
MAX_NUM_SEQS_CAP = 1024


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


def _rollout_sizes(plan: Plan, pins: dict[str, Any], max_num_seqs: int) -> RolloutSection:
    """max_num_seqs and max_num_batched_tokens derived from `max_num_seqs`, unless pinned (then the pin)."""
    seqs = int(pins.get("rollout.max_num_seqs", max_num_seqs))
    # At least what verl and vLLM start the engine with (rule R8): max_model_len where the release's sync rollout
    # or vLLM without chunked prefill refuses less, else vLLM's default chunk of 8192.
    least = least_batched_tokens(plan.evolve(rollout=attrs.evolve(plan.rollout, max_num_seqs=seqs)))
    tokens = int(pins.get("rollout.max_num_batched_tokens", max(8192, least)))
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

    # The engine's start-up check (vLLM V1 from 0.9.1, memory.rollout.free_at_engine_start): the free memory it
    # finds does not depend on the utilization, so it is read once, and a utilization above it is excess too.
    free_at_start = rollout_budget(plan, profile).free_at_start_bytes

    def excess(candidate: Plan) -> int:
        """Bytes by which the rollout or the sync phase passes the limit, or the engine's request passes the free
        memory it starts on (<= 0: fits and starts)."""
        phases = predict_phases(candidate, (Phase.ROLLOUT, Phase.WEIGHT_SYNC), profile)
        over = max(p.peak_bytes for p in phases) - limit
        if free_at_start is None:
            return over
        return max(over, requested_bytes(candidate) - free_at_start)

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
    fits is about 90 - E / (GPU / 100): that guess and its neighbour usually settle it, bisection otherwise
    (TensorRT-LLM grows by the free memory's hundredth, less than the GPU's, so the guess is high and bisection
    settles it).
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

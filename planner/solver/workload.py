"""The request's workload as a plan with every searched knob at a neutral value, for a search space to set.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs

from rlplan.planner.arch import Architecture
from rlplan.planner.knobs import apply_knobs
from rlplan.planner.plan import (
    ActorSection,
    AlgorithmSection,
    CriticSection,
    DataSection,
    Plan,
    RefSection,
    RewardSection,
    RolloutSection,
    TrainerSection,
)
from rlplan.planner.solver.request import SolveRequest


def default_lora_rank(arch: Architecture) -> int:
    """The seeds' convergence guidance: rank >= 32, and >= 128 from ~32B parameters up."""
    return 128 if arch.total_params >= 30e9 else 32


def lora_ranks(request: SolveRequest) -> list[int]:
    if request.lora == "off":
        return [0]
    if request.lora == "auto":
        return [0, default_lora_rank(request.model.arch)]
    return [int(request.lora)]


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


def workload_plan(request: SolveRequest, response_len: int, backend: Callable[[Plan], Plan] | None = None) -> Plan:
    """The workload, with every knob at a neutral value for the search to set; `backend`: a search space's
    `skeleton` (its training backend's sections in their neutral state), None to keep the base plan's."""
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
    # A --from recipe plan (plan.RECIPES) is solved for verl's PPO trainer with the estimator --algo names.
    algorithm = attrs.evolve(algorithm, recipe=None, adv_estimator=request.algorithm)
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
    # The target stack first: what a choice sets may depend on the release (stack.verl_sleep_level).
    stack = {key: value for key, value in request.pins.items() if key.startswith("stack.")}
    if stack:
        plan = apply_knobs(plan, stack)
    if backend is not None:
        plan = backend(plan)
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

"""The search loop: every choice of a search space priced with its token budgets and rollout sizes, ranked by the
step-time model (or by peak memory).
"""

from __future__ import annotations

import collections
from typing import Any

import attrs

from rlplan.planner.errors import PlanError
from rlplan.planner.knobs import apply_knobs
from rlplan.planner.memory import predict_memory
from rlplan.planner.model_error import plan_margin
from rlplan.planner.plan import (
    Plan,
    Prediction,
    RolloutSection,
)
from rlplan.planner.profile import Profile
from rlplan.planner.rules import check_plan
from rlplan.planner.solver.budgets import _budgets_reach_caps, gpu_limit_bytes, solve_token_budgets
from rlplan.planner.solver.request import (
    GIB,
    STEP_TIME_TOLERANCE,
    Candidate,
    FrontierPoint,
    Objective,
    SolveRequest,
)
from rlplan.planner.solver.rollout import solve_rollout, tensor_parallel_options
from rlplan.planner.solver.space import SearchSpace, search_space, searched_knobs, skeleton_plan
from rlplan.planner.steptime import StepTime, predict_step_time


def _rank_key(candidate: Candidate, objective: Objective) -> tuple[float, ...]:
    if objective == "memory":
        return (candidate.memory.gpu_peak_bytes, candidate.step_time.total_seconds)
    return (candidate.step_time.total_seconds, candidate.memory.gpu_peak_bytes)


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
    space = search_space(request)
    choices = space.choices(request, sequence_len, feasibility_only)
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
    fitting_shapes: set[tuple | None] = set()
    # A space searched by layout (space.by_layout): a layout's variants are tried right after it fits;
    # rollout_tp_for: the fastest rollout TP beside each resident state of its layouts.
    by_layout = space.by_layout
    pending = collections.deque(choices)
    rollout_tp_for: dict[tuple, int] = {}
    fastest_of: dict[tuple, _Fastest] = {}
    best: tuple[tuple, Candidate] | None = None  # (preference key, candidate) of the best plan so far
    # After a layout's first miss: whether its most saving choice trains at all (None: not probed yet; not for
    # --frontier, which prices every choice).
    trains: dict[tuple | None, bool | None] = {}
    most_saving = {space.shape_key(c): c for c in space.most_saving_per_shape(choices)} \
        if by_layout and dropped is None else {}
    while pending:
        choice = pending.popleft()
        if request.lora == "auto" and choice.lora_rank and full_ft_feasible:
            continue  # full fine-tuning fits: LoRA is only the fallback
        resident_key = space.resident_key(choice)
        if choice.gradient_checkpointing and resident_key in budgets_at_cap:
            continue  # recompute would only slow a step whose budgets are already as large as useful
        shape = space.shape_key(choice) if by_layout else None
        if shape in fitting_shapes:
            continue  # a layout is tried least saving first and kept at its first feasible choice
        if shape in trains:
            if trains[shape] is None:
                evaluated += 1
                missed = _probe_layout(space, most_saving[shape], skeleton, request, trains)
                closest = closest if feasible or missed is None else _closer(closest, missed, request)
            if not trains[shape]:
                continue
        plan = apply_knobs(space.apply(skeleton, choice, request), pins)
        evaluated += 1
        trained = solve_token_budgets(plan, request, ceiling=_variant_ceiling(space, choice, fastest_of))
        if trained is None:
            # Only a search that finds nothing reports its closest miss (solve's diagnosis).
            closest = closest if feasible else _closer(closest, plan, request)
            if dropped is not None:
                dropped.append(_dropped_point(plan, request, "training does not fit at the smallest token budget"))
            elif shape in most_saving and choice != most_saving[shape]:
                trains.setdefault(shape, None)
            continue
        if _budgets_reach_caps(trained):
            budgets_at_cap.add(resident_key)
        fastest: tuple[tuple, Candidate] | None = None  # the same, of this choice's rollout TPs
        # A choice sharing an earlier one's resident state shares its rollout sizes and so its fastest rollout TP
        # (_queue_variant says why): that TP first, the others only if it does not fit there.
        shared_tp = rollout_tp_for.get(resident_key[:-1]) if by_layout else None
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
            if by_layout:
                fitting_shapes.add(shape)
            if feasibility_only:
                return [Candidate(plan=solved, memory=report, step_time=StepTime(phase_seconds={}))], evaluated, 1, None
            ranked.append(Candidate(plan=solved, memory=report,
                                    step_time=predict_step_time(solved, report, request.profile)))
            keyed = (_preference_key(ranked[-1], request), ranked[-1])
            fastest = min(filter(None, (fastest, keyed)), key=lambda pair: pair[0])
            best = min(filter(None, (best, keyed)), key=lambda pair: pair[0])
        if by_layout and fastest is not None and best is not None:
            rollout_tp_for.setdefault(resident_key[:-1], fastest[1].plan.rollout.tensor_model_parallel_size)
            _queue_variant(space, choice, fastest, best[1], request, pending, fastest_of)
    ranked.sort(key=lambda c: _preference_key(c, request))
    return _roomiest_first(ranked, request), evaluated, feasible, closest


# The fastest candidate of a layout's variants so far (preference key, candidate) and whether it is a variant.
_Fastest = tuple[tuple, Candidate, bool]


def _variant_ceiling(space: SearchSpace[Any], choice: Any, fastest_of: dict[tuple, _Fastest]) -> Plan | None:
    """A variant's budgets cannot pass its base choice's (Megatron's VPP: the interleaved schedule holds more micro
    batches in flight at the same saving step, memory.megatron.in_flight_micro_batches): the base's plan, while
    the base is still the fastest of the layout's variants."""
    base = space.base_of_variant(choice)
    if base is None:
        return None
    found = fastest_of.get(space.shape_key(base))
    return found[1].plan if found is not None and not found[2] else None


def _probe_layout(space: SearchSpace[Any], most_saving: Any, skeleton: Plan, request: SolveRequest,
                  trains: dict[tuple | None, bool | None]) -> Plan | None:
    """Whether a layout's most saving choice trains at its smallest token budgets, recorded in `trains`; its plan
    where it does not. Offload and recompute only lower memory: where that choice cannot train, none of the
    layout's choices can, and the search skips them."""
    probe = apply_knobs(space.apply(skeleton, most_saving, request), request.pins)
    shape = space.shape_key(most_saving)
    trains[shape] = solve_token_budgets(probe, request, floor_only=True) is not None
    return None if trains[shape] else probe


def _queue_variant(space: SearchSpace[Any], choice: Any, keyed: tuple[tuple, Candidate], best: Candidate,
                   request: SolveRequest, pending: collections.deque, fastest_of: dict[tuple, _Fastest]) -> None:
    """After a fitting layout, its next variant (Megatron: VPP size), first in line, while each variant was faster
    than the one before: a variant holds the same state and more micro batches in flight, so it fits only where
    its layout does. Choices that leave the same resident state (Megatron: a layout interleaved or recomputing,
    ETP = TP at EP and ETP 1 at EP x TP, MegatronChoice.resident_key) share the rollout's sizes, so their steps
    differ by the same trainer seconds at every rollout TP: the search tries them at the first one's fastest
    rollout TP."""
    base = space.base_of_variant(choice)
    layout = space.shape_key(base if base is not None else choice)
    previous = fastest_of.get(layout)
    if base is not None and previous is not None and previous[0] <= keyed[0]:
        return
    fastest_of[layout] = (*keyed, base is not None)  # the fastest of the layout's variants so far
    variant = space.next_variant(choice, request, keyed[1], best)
    if variant is not None:
        pending.appendleft(variant)


def _dropped_point(plan: Plan, request: SolveRequest, reason: str) -> FrontierPoint:
    report = predict_memory(plan, request.profile)
    step = predict_step_time(plan, report, request.profile)
    return FrontierPoint(step_time_s=step.total_seconds, gpu_peak_gib=report.gpu_peak_bytes / GIB, feasible=False,
                         rank=0, knobs=tuple(searched_knobs(plan).items()), reason=reason)


def _ranked_points(ranked: list[Candidate]) -> list[FrontierPoint]:
    return [FrontierPoint(step_time_s=c.step_time.total_seconds, gpu_peak_gib=c.memory.gpu_peak_bytes / GIB,
                          feasible=True, rank=rank, knobs=tuple(searched_knobs(c.plan).items()))
            for rank, c in enumerate(ranked, start=1)]


def _preference_key(candidate: Candidate, request: SolveRequest) -> tuple[float, ...]:
    # With --lora auto, full fine-tuning whenever it fits; LoRA only as the fallback.
    lora_last = float(request.lora == "auto" and candidate.plan.model.lora.enabled)
    return (lora_last, *_rank_key(candidate, request.objective))


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

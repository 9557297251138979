"""`solve` and, when nothing fits, `diagnose`: the binding constraint and the smallest changes that fit, each re-solved.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any

import attrs

from rlplan.planner.errors import PlanError
from rlplan.planner.hardware import Cluster
from rlplan.planner.knobs import apply_knobs
from rlplan.planner.model_error import plan_margin
from rlplan.planner.phases import PASS_KNOBS
from rlplan.planner.plan import RolloutEngine
from rlplan.planner.render import absent_knobs
from rlplan.planner.rules import Violation, check_plan
from rlplan.planner.solver.request import (
    GIB,
    RUNNERS_UP,
    Candidate,
    Diagnosis,
    FrontierPoint,
    SolveRequest,
    SolveResult,
    Suggestion,
)
from rlplan.planner.solver.search import _rank_key, _ranked_points, _search, finalize, request_margin
from rlplan.planner.solver.space import SEARCH_SPACES, choice_text, search_space, skeleton_plan
from rlplan.planner.solver.workload import default_lora_rank
from rlplan.planner.verl_keys import BY_FIELD, backend_of


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
    floor = host_floor_diagnosis(request, response_len or request.max_response_len or 1)
    if floor is not None:  # proved before any search: no knob lowers what every plan holds in host RAM
        return SolveResult(best=None, evaluated=0, feasible=0, diagnosis=floor, frontier=())
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
    strategies = tuple(SEARCH_SPACES) if request.strategy == "auto" else (request.strategy,)
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


# Host RAM tried, as multiples of what every plan holds (memory.phases.host_floor), when that is over the node's.
HOST_FLOOR_STEPS = (1.25, 1.5, 2.0, 3.0)


def host_floor_diagnosis(request: SolveRequest, response_len: int) -> Diagnosis | None:
    """When the node's host RAM is below what every plan of the request holds there whatever its knobs (the model's
    shared-memory copy, the GPU processes), nothing fits: said at once, with the host RAM that does fit, rather
    than after a search of every layout (issue 41: 40-120 s for a 30B MoE at --host-mem 8)."""
    from rlplan.planner.memory.phases import host_floor

    cluster = request.cluster
    if cluster.gpu.is_cpu:
        return None
    floor = host_floor(skeleton_plan(request, response_len), request.profile)
    have = cluster.host_memory_bytes_per_node
    if floor.total_bytes <= have:
        return None
    parts = ", ".join(f"{c.name} {c.bytes / GIB:.1f} GiB" for c in floor.components)
    message = (f"every plan of {request.model.name} holds at least {floor.total_bytes / GIB:.1f} GiB of host RAM per "
               f"node whatever its knobs ({parts}), and the node has {cluster.host_memory_gib:g} GiB.")
    suggestions = []
    for step in HOST_FLOOR_STEPS:
        host = float(math.ceil(floor.total_bytes * step / GIB / 16) * 16)
        candidate = attrs.evolve(request, cluster=attrs.evolve(cluster, host_memory_gib=host))
        if _fits(candidate, response_len):
            suggestions.append(Suggestion(change=f"--host-mem {host:g}", detail=f"{host:g} GiB of host RAM per node",
                                          gpus=cluster.world_size,
                                          gpu_memory_gib=cluster.world_size * cluster.gpu.memory_gib))
            break
    if suggestions:
        message += f" Fix: {suggestions[0].change} (the least of {len(HOST_FLOOR_STEPS)} steps above it that fits)."
    else:
        message += (f" No host RAM up to {HOST_FLOOR_STEPS[-1]:g}x that makes it fit either: a smaller model, or "
                    "nodes with more host RAM and GPUs.")
    return Diagnosis(binding="host RAM", message=message, suggestions=tuple(suggestions))


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
    space = search_space(request)
    choices = space.choices(request, skeleton.data.max_sequence_length, feasibility_only=True)
    if not choices:
        return []
    plan = apply_knobs(space.apply(skeleton, choices[0], request), request.pins)
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
                                          kind="rule", keeps_workload=False, step_time_s=round(solved.best.step_time.total_seconds, 1),
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


@attrs.frozen(kw_only=True)
class _Change:
    """One change to try: its flags, what it means, its kind (Suggestion.kind) and the request it makes."""

    flags: str
    detail: str
    kind: str
    request: SolveRequest
    more_gpus: bool = False


def _change_candidates(request: SolveRequest, response_len: int, lora_rank: int) -> Iterator[_Change]:
    """Each axis at the smallest step along it that fits: other hardware for the run as asked, the run changed on
    the user's hardware, and a smaller margin."""
    yield from _hardware_changes(request, response_len)
    yield from _workload_changes(request, response_len, lora_rank)
    yield from _margin_changes(request, response_len)


def _hardware_changes(request: SolveRequest, response_len: int) -> Iterator[_Change]:
    """More GPUs of the kind the request has, a bigger GPU at least as fast, more host RAM."""
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
        yield _Change(flags=flags, detail=detail, kind="hardware", request=candidate, more_gpus=True)
    # More or bigger GPUs may also need more host RAM (a large model's shared-memory copy per node):
    # each GPU step tries the host steps too, so a change needing both is still found.
    for gpu in kinds[1:]:
        for factor, host_factor in itertools.product((1, *GPU_COUNT_FACTORS), (1, *HOST_MEMORY_FACTORS)):
            host = cluster.host_memory_gib * host_factor
            bigger = attrs.evolve(_scaled_cluster(cluster, factor, gpu), host_memory_gib=host)
            candidate = attrs.evolve(request, cluster=bigger)
            if _fits(candidate, response_len):
                words = [f"--gpu {gpu.name}"] + ([f"--gpus {bigger.world_size}"] if factor > 1 else []) + (
                    [f"--host-mem {host:g}"] if host_factor > 1 else [])
                detail = f"{bigger.world_size} x {gpu.name} ({gpu.memory_gib:g} GiB)" + (
                    f", {host:g} GiB host RAM per node" if host_factor > 1 else "")
                yield _Change(flags=" ".join(words), detail=detail, kind="hardware", request=candidate)
                break
    for factor in HOST_MEMORY_FACTORS:
        host = cluster.host_memory_gib * factor
        candidate = attrs.evolve(request, cluster=attrs.evolve(cluster, host_memory_gib=host))
        if _fits(candidate, response_len):
            yield _Change(flags=f"--host-mem {host:g}", detail=f"{host:g} GiB of host RAM per node", kind="hardware",
                          request=candidate)
            break


# The smallest lengths and LoRA rank a change of the run goes down to (vLLM serves LoRA ranks from 8).
SHORTEST_CHANGED_LENGTH = 128
SMALLEST_SUGGESTED_LORA_RANK = 8


def _halvings(value: int, floor: int) -> Iterator[int]:
    """value // 2, value // 4, ... while at least `floor`."""
    value //= 2
    while value >= floor:
        yield value
        value //= 2


def _workload_changes(request: SolveRequest, response_len: int, lora_rank: int) -> Iterator[_Change]:
    """The run changed so that it fits the hardware it has, each axis at its first halving that fits: LoRA for
    full fine-tuning or a smaller LoRA rank, shorter responses or prompts, fewer responses per prompt, fewer
    prompts per step."""
    def first_fit(steps: Iterator[tuple[str, str, SolveRequest]]) -> Iterator[_Change]:
        for flags, detail, candidate in steps:
            if _fits(candidate, candidate.response_len if candidate.response_len != request.response_len
                     else response_len):
                yield _Change(flags=flags, detail=detail, kind="workload", request=candidate)
                return

    if request.lora == "off" or request.lora == 0:
        rank = default_lora_rank(request.model.arch)
        yield from first_fit(iter([(f"--lora {rank}", f"LoRA rank {rank} instead of full fine-tuning",
                                    attrs.evolve(request, lora=rank))]))
    elif lora_rank:
        yield from first_fit((f"--lora {rank}", f"LoRA rank {rank} instead of {lora_rank}",
                              attrs.evolve(request, lora=rank))
                             for rank in _halvings(lora_rank, SMALLEST_SUGGESTED_LORA_RANK))
    yield from first_fit((f"--response-len {shorter}", f"responses of {shorter} tokens instead of {response_len}",
                          attrs.evolve(request, response_len=shorter, max_response_len=None))
                         for shorter in _halvings(response_len, SHORTEST_CHANGED_LENGTH))
    yield from first_fit((f"--prompt-len {shorter}", f"prompts of {shorter} tokens instead of {request.prompt_len}",
                          attrs.evolve(request, prompt_len=shorter))
                         for shorter in _halvings(request.prompt_len, SHORTEST_CHANGED_LENGTH))
    yield from first_fit((f"--n {fewer}", f"{fewer} responses per prompt instead of {request.n}",
                          attrs.evolve(request, n=fewer))
                         for fewer in _halvings(request.n, 1))
    yield from first_fit((f"--train-batch-size {smaller}", f"{smaller} prompts per step instead of "
                          f"{request.train_batch_size}", attrs.evolve(
                              request, train_batch_size=smaller,
                              ppo_mini_batch_size=None if request.ppo_mini_batch_size is None
                              else min(request.ppo_mini_batch_size, smaller)))
                         for smaller in _halvings(request.train_batch_size, 1))


def _margin_changes(request: SolveRequest, response_len: int) -> Iterator[_Change]:
    """The run and the hardware as asked, with a smaller margin: half the one it keeps, else none."""
    from rlplan.planner.model_error import Headroom

    margin = request_margin(request).gib
    for kept in (round(margin / 2, 2), 0.0) if margin > 0 else ():
        candidate = attrs.evolve(request, headroom=Headroom(gib=kept))
        if _fits(candidate, response_len):
            detail = (f"keep {kept:g} GiB free instead of the {margin:.2f} GiB margin: less room for the model's "
                      "error" if kept else f"keep no margin instead of {margin:.2f} GiB: nothing for the model's error")
            yield _Change(flags=f"--headroom {kept:g}GiB" if kept else "--headroom 0", detail=detail, kind="margin",
                          request=candidate)
            return


def _tokens_per_step(request: SolveRequest, response_len: int) -> int:
    return request.train_batch_size * request.n * (request.prompt_len + response_len)


def _hardware_tier(suggestion: Suggestion) -> int:
    """GPU memory bought, in steps of 10 %: hardware within one step costs about the same."""
    return math.floor(math.log(max(suggestion.gpu_memory_gib, 1.0)) / math.log(1 + HARDWARE_TIER_STEP))


def _margin_binding(closest: Candidate, request: SolveRequest) -> str:
    """Why a candidate within the GPU still failed: the margin it must leave, or the KV cache / a rule."""
    margin = plan_margin(closest.plan, request.headroom, request.profile)
    phase = closest.memory.peak_phase
    left = (closest.memory.gpu_capacity_bytes - phase.peak_bytes) / GIB
    if margin.bytes and left < margin.gib:
        return (f"at best ({choice_text(closest.plan)}) the {phase.name} phase leaves {left:.2f} GiB of the GPU "
                f"free, less than the {margin.gib:.2f} GiB margin ({margin.rule}; --headroom sets it)")
    limit = closest.memory.binding_constraint
    return f"the {limit.where} phase leaves too little room for {limit.component}"


# How each group of changes is ranked, as the diagnosis says it (and solve --json's "ranked_by").
RANKED_BY = {
    "hardware": "the least GPU memory bought first (GPUs x GiB), then the shorter step",
    "workload": "the most of the run kept first (its tokens per step), then the shorter step",
    "margin": "the largest margin that fits",
    "rule": "the nearest values verl accepts",
}


def _suggestion_rank(suggestion: Suggestion) -> tuple[int, ...] | tuple[float, ...]:
    if suggestion.kind == "workload":
        return (-suggestion.tokens_kept, suggestion.step_time_s or 0.0)
    return (_hardware_tier(suggestion), suggestion.step_time_s or 0.0)


def _shown_suggestions(suggestions: list[Suggestion]) -> list[Suggestion]:
    """The best few of each kind. Hardware: one per hardware tier (three variants of "4 x 80 GiB" are one choice,
    not three), with more GPUs of the same kind always among them when that fits (it keeps the run and the GPUs one
    has). The run changed: the most of it kept first. A smaller margin: the largest that fits."""
    hardware = sorted((s for s in suggestions if s.kind == "hardware"), key=_suggestion_rank)
    tiers: dict[int, Suggestion] = {}
    for suggestion in hardware:
        tiers.setdefault(_hardware_tier(suggestion), suggestion)
    shown = list(tiers.values())[:SUGGESTIONS_SHOWN]
    more = next((s for s in hardware if s.more_gpus), None)
    if more is not None and more not in shown:
        shown = sorted([*shown[:SUGGESTIONS_SHOWN - 1], more], key=_suggestion_rank)
    workload = sorted((s for s in suggestions if s.kind == "workload"), key=_suggestion_rank)[:SUGGESTIONS_SHOWN]
    return [*shown, *workload, *[s for s in suggestions if s.kind == "margin"][:1]]


def _binding_text(request: SolveRequest, closest: Candidate | None) -> str:
    if closest is None:
        return "no candidate satisfied the pinned knobs and verl's rules"
    limit = closest.memory.binding_constraint
    over = -limit.headroom_bytes / GIB
    if over <= 0:
        return _margin_binding(closest, request)
    if limit.resource == "kv_cache":
        # Not the GPU: the engine's KV pool at this utilization cannot hold one longest sequence (vLLM refuses to
        # start), whatever the margin.
        rollout = closest.plan.rollout
        return (f"at best ({choice_text(closest.plan)}, gpu_memory_utilization {rollout.gpu_memory_utilization:.2f}) "
                f"the rollout engine's KV cache is {over:.2f} GiB short of one "
                f"{rollout.max_model_len or closest.plan.fitting_max_model_len}-token sequence")
    return (f"at best ({choice_text(closest.plan)}) the {limit.where} phase needs {over:.1f} GiB more "
            f"{'host RAM' if limit.resource == 'host' else 'GPU memory'} than there is, mostly {limit.component}")


def _suggestions_text(request: SolveRequest, shown: list[Suggestion]) -> str:
    """The changes that fit, in groups, each saying how it is ranked."""
    cluster = request.cluster

    def listed(kind: str) -> str:
        return "; ".join(f"{s.change} ({s.detail}" + (f", {100 * s.tokens_kept:.0f} % of the run's tokens kept"
                                                       if s.kind == "workload" else "")
                         + f", ~{s.step_time_s:g} s per step)" for s in shown if s.kind == kind)

    groups = [(f"The run as asked on other hardware, {RANKED_BY['hardware']}", listed("hardware")),
              (f"On {cluster.world_size} x {cluster.gpu.name} with the run changed, {RANKED_BY['workload']}",
               listed("workload")),
              (f"Or the run and the hardware as asked with a smaller margin, {RANKED_BY['margin']}", listed("margin"))]
    return " ".join(f"{title}: {text}." for title, text in groups if text)


def diagnose(request: SolveRequest, closest: Candidate | None, response_len: int) -> Diagnosis:
    """The binding constraint, and the changes along each axis that fit, each re-solved in full, in three groups
    ranked as RANKED_BY says: other hardware for the run as asked (the least GPU memory bought, GPUs x GiB, the
    price proxy, then the shorter predicted step); the run changed on the user's hardware (the most of its tokens
    per step kept, then the shorter step); a smaller margin."""
    binding = _binding_text(request, closest)
    lora_rank = closest.plan.model.lora.rank if closest is not None and closest.plan.model.lora.enabled else 0
    asked = _tokens_per_step(request, response_len)
    suggestions: list[Suggestion] = []
    for change in _change_candidates(request, response_len, lora_rank):
        candidate = change.request
        solved = solve(candidate)
        if solved.best is None:
            continue
        kept = _tokens_per_step(candidate, candidate.response_len or response_len) / asked
        suggestions.append(Suggestion(change=change.flags, detail=change.detail, kind=change.kind,
                                      keeps_workload=change.kind != "workload", more_gpus=change.more_gpus,
                                      tokens_kept=round(min(kept, 1.0), 3),
                                      step_time_s=round(solved.best.step_time.total_seconds, 1),
                                      gpus=candidate.cluster.world_size,
                                      gpu_memory_gib=candidate.cluster.world_size * candidate.cluster.gpu.memory_gib))
    shown = _shown_suggestions(suggestions)
    if shown:
        message = f"Nothing fits: {binding}. Changes that fit, each re-solved. {_suggestions_text(request, shown)}"
    else:
        message = (f"Nothing fits: {binding}. No change tried ({GPU_COUNT_FACTORS[-1]}x the GPUs, a bigger GPU "
                   f"at least as fast, {HOST_MEMORY_FACTORS[-1]}x the host RAM, LoRA or a smaller LoRA rank, shorter "
                   "responses or prompts, fewer responses per prompt, a smaller batch, a smaller margin) makes it "
                   "fit.")
    return Diagnosis(binding=binding, message=message, suggestions=tuple(shown))

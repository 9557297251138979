"""Each phase's memory as the three figures a reader meets, named everywhere they are shown:

    allocated   the tensors torch's caching allocator has handed out at the phase's peak: what
                torch.cuda.max_memory_allocated() reports (verl's perf/max_memory_allocated_gb);
    reserved    the segments the allocator holds from the GPU at its peak, cache included: what
                torch.cuda.max_memory_reserved() reports (perf/max_memory_reserved_gb);
    resident    what the GPU must hold for the phase, the figure a plan is fitted with (PhaseMemory.peak_bytes):
                the allocated tensors, only the part of the cache the allocator cannot give back (a segment with no
                block in use is given back before an out-of-memory error), the CUDA context, NCCL, and the engine's
                pool as the GPU holds it (a sleeping pool's blocks stay counted by torch but hold no memory).

Allocated and reserved cover one process: the trainer's, with the engine's tensors where the engine runs in it
(`engine_in_process`) and its sleeping pool where the version keeps that counted (`pool_counted_asleep`); verl's
counters never include the CUDA context, NCCL or memory allocated outside torch.  The reserved figure's cache is
the allocator replay's (memory.allocator_trace.replay_step: the step's phases in order, two steps, verl's cache
flushes per version), plus, for a vLLM engine in the trainer's process with the trainer on fixed segments (the
regime of the public runs), `profile.allocator_cache_engine_workspaces` engine workspaces the replay does not
list one by one (unlisted_cache_bytes), plus a site's calibrated `allocator_cache_gib` (the residual of the
process-wide counter, in every phase).
"""

from __future__ import annotations

from attrs import frozen

from rlplan.planner.memory.allocator import AllocatorFigures
from rlplan.planner.memory.allocator_trace import allocator_config, replay_step
from rlplan.planner.memory.phases import MemoryReport, step_context
from rlplan.planner.memory.report import GIB, PhaseMemory
from rlplan.planner.phases import Phase
from rlplan.planner.plan import Plan
from rlplan.planner.profile import DEFAULT_PROFILE, Profile
from rlplan.planner.stack import ENGINE_IN_TRAINER_PROCESS, holds, in_range

# vLLM's CuMemAllocator sleep mode (>= 0.7.3) releases a sleeping pool's memory and keeps its blocks counted.
_VLLM_SLEEP_COUNTED_SINCE = "0.7.3"


# What each figure is, in the words every table, JSON and compare show beside it.
FIGURES = {
    "allocated": "torch.cuda.max_memory_allocated() of the phase: the tensors in use at its peak "
                 "(verl's perf/max_memory_allocated_gb)",
    "reserved": "torch.cuda.max_memory_reserved() of the phase: the caching allocator's segments, its cache "
                "included (verl's perf/max_memory_reserved_gb)",
    "resident": "what the GPU holds for the phase, the figure a plan is fitted with: the tensors, the cache the "
                "allocator cannot give back, the CUDA context, NCCL and the engine as the GPU holds it",
}


@frozen(kw_only=True)
class PhaseAllocator:
    """One phase: allocated, reserved and resident bytes (the module docstring says what each covers)."""

    phase: str
    allocated: int
    reserved: int
    resident: int
    # The phase's trainer allocations come from expandable segments.
    expandable: bool

    def as_json(self) -> dict[str, float | bool | str]:
        return {"phase": str(self.phase), "allocated_gib": round(self.allocated / GIB, 3),
                "reserved_gib": round(self.reserved / GIB, 3), "resident_gib": round(self.resident / GIB, 3),
                "expandable_segments": self.expandable}


def engine_in_trainer_process(plan: Plan) -> bool:
    """vLLM inside the trainer's process (verl before 0.7.1); SGLang always runs in a process of its own, and so
    does any engine on a pool of its own (plan.RolloutPool)."""
    return (plan.rollout.name == "vllm" and not plan.rollout_is_split
            and holds(ENGINE_IN_TRAINER_PROCESS, plan.stack, "vllm"))


def sleeping_pool_counted(plan: Plan) -> bool:
    return engine_in_trainer_process(plan) and in_range(plan.stack.version_of("vllm"), _VLLM_SLEEP_COUNTED_SINCE, None)


def torch_bytes(phase: PhaseMemory, plan: Plan, report: MemoryReport, *, engine_in_process: bool,
                pool_counted_asleep: bool) -> int:
    """The phase's bytes in torch's allocator of the trainer process at its peak: not the CUDA context or NCCL,
    not the engine's context or non-torch memory, not the engine at all when it runs in its own process, not the
    allocator's reserve; plus the engine's sleeping pool where it stays counted."""
    engine = plan.rollout.name
    non_torch = {f"{engine}_non_torch", f"{engine}_context", "cuda_context_and_nccl", "fragmentation_reserve"}
    in_process = engine_in_process and engine == "vllm"
    allocated, names = 0, set()
    for component in phase.components:
        names.add(component.name)
        if component.name in non_torch:
            continue
        is_engine = component.name.startswith(f"{engine}_") or component.name in ("kv_cache", "cuda_graph_pool")
        if is_engine and not in_process:
            continue
        allocated += component.bytes
    if phase.name != Phase.ROLLOUT and in_process and pool_counted_asleep and plan.rollout.free_cache_engine:
        if f"{engine}_weights" not in names:
            allocated += report.rollout.weights_bytes
        if "kv_cache" not in names:
            allocated += max(0, report.rollout.kv_cache_bytes)
    return allocated


def unlisted_cache_bytes(plan: Plan, profile: Profile, report: MemoryReport, *, engine_in_process: bool) -> int:
    """The reserved bytes beyond the replay in the regime the real runs measured it in: a vLLM engine in the
    trainer's process with the trainer on fixed segments.  Priced as profile.allocator_cache_engine_workspaces
    times the engine's profiled workspace (its forward at max_num_batched_tokens and its sampler at max_num_seqs x
    vocabulary): in that process the engine's forward and sampler tensors go through the trainer's caching
    allocator at every decode step's batch size, which the replay does not list one by one."""
    if not (engine_in_process and plan.rollout.name == "vllm"):
        return 0
    if allocator_config(plan, trainer_phase=True).expandable_segments:
        return 0
    return int(profile.allocator_cache_engine_workspaces * report.rollout.activation_bytes)


def allocator_report(plan: Plan, profile: Profile = DEFAULT_PROFILE, *, engine_in_process: bool | None = None,
                     pool_counted_asleep: bool | None = None) -> tuple[PhaseAllocator, ...]:
    """Every phase's allocated, reserved and resident bytes (none on a CPU platform); the engine's place in the
    process defaults to the plan's stack (compare passes what the log's verl did)."""
    if plan.cluster.gpu.is_cpu:
        return ()  # a CPU rank's allocator keeps no cache: its resident set is the whole story
    in_process = engine_in_trainer_process(plan) if engine_in_process is None else engine_in_process
    counted = sleeping_pool_counted(plan) if pool_counted_asleep is None else pool_counted_asleep
    ctx, report = step_context(plan, profile)
    figures = replay_step(ctx, report.phases, engine_in_process=in_process)
    expandable = allocator_config(plan, trainer_phase=True).expandable_segments
    unlisted = unlisted_cache_bytes(plan, profile, report, engine_in_process=in_process)
    rows = []
    for phase in report.phases:
        if phase.pool == "rollout":
            continue  # on GPUs of its own: no trainer process there, whose counters these are
        allocated = torch_bytes(phase, plan, report, engine_in_process=in_process, pool_counted_asleep=counted)
        replay = figures.get(phase.name, AllocatorFigures(allocated=0, reserved=0, needed=0))
        trainer_phase = phase.name not in (Phase.ROLLOUT, Phase.WEIGHT_SYNC)
        # A site's calibrated residual is one of the process-wide counter: every phase carries it.
        cache = replay.cache + unlisted + int(profile.allocator_cache_gib * GIB)
        rows.append(PhaseAllocator(phase=phase.name, allocated=allocated, reserved=allocated + cache,
                                   resident=phase.peak_bytes, expandable=expandable and trainer_phase))
    return tuple(rows)

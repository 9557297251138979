"""A verl step as torch's caching allocator sees it: the allocations, frees and cache flushes of each phase,
replayed through memory.allocator, giving each phase's allocated, reserved and needed bytes.

The trace is built from the phases' own moments (the backend's update_moments / forward_moments, FSDP's
memory.fsdp.training_moments or Megatron's MegatronBackend.update_moments: what an update or a no_grad forward
holds at each moment of one micro batch, priced by the backend that owns those bytes), allocated as the backend's
AllocationShape says (FSDP's per-layer shards and gradients dropped by zero_grad; Megatron-Core's contiguous DDP
grad / param buffers kept across mini batches, one activation tensor per layer and micro batch in flight, the fp32
main weights built with the optimizer, the actor worker's empty_cache after each pass), walked over the micro
batches a step really runs:

* the micro batches' token counts: the workload's response lengths (steptime.lengths, the log-normal of
  the plan's mean, cut at the maximum) drawn at fixed quantiles in a fixed shuffled order, packed as verl packs
  them (use_dynamic_bsz: ceil(tokens / budget) micro batches balanced by size, seqlen_balancing.
  rearrange_micro_batches; otherwise micro_batch_size sequences each), scaled so the largest is the token
  count the phase is priced at; a sample of them (the chunks and micro batches with the largest among them);
* per micro batch, each moment's token-sized tensors in the order autograd makes them (a layer's saved
  activations as it runs, the head's logits-sized buffers, one layer's backward workspace, all-gather and
  reduce-scatter buffers on their own streams) and frees them in reverse; a role's sharded gradients from its
  first backward to the phase's end; the optimizer's temporaries at each mini batch's end;
* the roles' state that stays on the GPU between phases from the start, the offloaded state loaded and
  offloaded around each phase (verl's offload_fsdp_model_to_cpu empties the cache), and verl's own flushes
  around the weight sync and the rollout (stack.EMPTIES_CACHE_*), per version;
* expandable segments where verl's trainer phases switch them on (stack.TRAINER_EXPANDABLE_SEGMENTS, v0.6+)
  or PYTORCH_CUDA_ALLOC_CONF does (trainer.pytorch_cuda_alloc_conf);
* each phase's capacity: the GPU less what the phase holds outside the trainer's allocator (the CUDA context,
  NCCL, the engine's pool and residue), so a cache that would overflow the GPU is given back as torch does.

Two steps are replayed (the second starts with what the first cached); a phase's figures are its peaks over
both (replay_step: the reserved counter).  A fit needs what a phase strands, which must grow with its sizes for the
solver's bisections: stranded_bytes bounds it without a replay, and replay_phase (one phase alone, fixed micro
batches) is what the bound is held to.  Replays are cached per recorded trace.  Pure Python, no torch.
"""

from __future__ import annotations

import functools
import heapq
import math
import random
from collections.abc import Callable, Iterator, Sequence
from statistics import NormalDist
from typing import TYPE_CHECKING, Any, Protocol

from rlplan.planner.layout import PlanLayout, RoleBatchLayout
from rlplan.planner.memory.allocator import (
    LARGE_PAGE,
    AllocatorConfig,
    AllocatorFigures,
    CachingAllocator,
    parse_alloc_conf,
    round_size,
)
from rlplan.planner.memory.model_facts import model_facts
from rlplan.planner.memory.report import AllocationShape, Component, PhaseMemory, TrainerState
from rlplan.planner.phases import Phase
from rlplan.planner.plan import EngineRole, Plan
from rlplan.planner.profile import Profile
from rlplan.planner.stack import (
    EMPTIES_CACHE_AFTER_ROLLOUT,
    EMPTIES_CACHE_AFTER_SYNC,
    EMPTIES_CACHE_BEFORE_SYNC,
    ENGINE_IN_TRAINER_PROCESS,
    MEGATRON_EMPTIES_CACHE_BEFORE_SYNC,
    TRAINER_EXPANDABLE_SEGMENTS,
    holds,
)

if TYPE_CHECKING:
    from rlplan.planner.steptime.lengths import Lengths

# Streams: the compute stream, FSDP's all-gather stream and its reduce-scatter stream (a block freed on one
# stream is reused by that stream only).
COMPUTE, ALL_GATHER, REDUCE_SCATTER = 0, 1, 2

# Components of a phase that are not the trainer's blocks in torch's default pools: the CUDA context and NCCL,
# the planner's own reserve, and the engine (its pool is vLLM's CuMemAllocator or SGLang's memory saver, its
# context and non-torch memory outside torch).  The engine's profile-run workspace is torch's default pool
# when the engine runs in the trainer's process: `engine_transient` below.
_CONTEXT = frozenset({"cuda_context_and_nccl", "fragmentation_reserve", "cuda_graph_pool", "kv_cache",
                      "cached_logits_block", "cpu_process_baseline"})
# Components that are a role's state, kept across micro batches (and phases, unless offloaded).
_STATE_SUFFIXES = ("_params", "_optimizer_state")
# Tensors whose size follows the micro batch's tokens.
_TOKEN_SIZED = frozenset({"activations", "loss_head_hidden", "logits_head", "forward_transients",
                          "layer_backward_workspace", "held_micro_batch_outputs"})
# Components made of one tensor per layer, replayed in groups of layers.
_LAYERWISE = frozenset({"activations", "optimizer_step_temporaries"})
# Components held on the all-gather or reduce-scatter stream.
_STREAM = {"fsdp_all_gather_buffers": ALL_GATHER, "root_group_unsharded": ALL_GATHER,
           "fsdp_reduce_scatter_buffer": REDUCE_SCATTER, "embedding_reduce_scatter_buffer": REDUCE_SCATTER}
# Replayed steps, and at most this many chunks (mini batches) of a pass and micro batches of a chunk: the cache
# settles within a few micro batches, once the largest has come (the chunks kept include the largest).
_STEPS = 2
_CHUNKS = 2
_MICRO_BATCHES = 4
# The fit's replay of one phase walks one mini batch of micro batches at these fractions of the priced tokens: the
# largest after a smaller one, then smaller ones that reuse its segments (a balanced partition's spread).  A fixed
# pattern, not the workload's draw: the stranded bytes then grow with the phase's sizes and nothing else, so a fit
# stays monotone in the lengths and batch sizes the solver bisects over.
FIT_PATTERN = (0.85, 1.0, 0.9, 0.95)
# A layer-wise component (state shards, saved activations) is replayed as this many equal blocks at most:
# blocks of one size and lifetime behave alike in the allocator, so groups of layers stand for their layers.
_LAYER_GROUPS = 4
_SEED = 20260101


def outside_the_trainer_allocator(name: str, engine: str) -> bool:
    """Whether a phase component lives outside torch's default pools of the trainer process."""
    return name in _CONTEXT or name.startswith(f"{engine}_")


def allocator_config(plan: Plan, *, trainer_phase: bool) -> AllocatorConfig:
    """The allocator's settings in a phase: the job's PYTORCH_CUDA_ALLOC_CONF, with verl's own switch of
    expandable segments for its trainer phases (v0.6+) on top."""
    config = parse_alloc_conf(plan.trainer.pytorch_cuda_alloc_conf, "trainer.pytorch_cuda_alloc_conf")
    if holds(TRAINER_EXPANDABLE_SEGMENTS, plan.stack, plan.rollout.name):
        return AllocatorConfig(expandable_segments=trainer_phase, max_split_size=config.max_split_size)
    return config


class StepShape(Protocol):
    """What memory.phases knows of a step that the replay needs (its _StepContext)."""

    plan: Plan
    profile: Profile
    layout: PlanLayout
    actor_gpu: TrainerState
    critic_gpu: TrainerState | None

    @property
    def trainer(self) -> Any: ...

    @property
    def resident_by_role(self) -> dict[str, Component]: ...


# --- micro batches ----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=512)
def _response_lengths(mean: float, log_median: float, sigma: float, cap: int, count: int, seed: int
                      ) -> tuple[int, ...]:
    """`count` response lengths of the workload at evenly spaced quantiles, in a fixed shuffled order."""
    if sigma <= 0 or count <= 1:
        values = [int(round(mean))] * count
    else:
        normal = NormalDist(log_median, sigma)
        values = [min(cap, max(1, int(math.exp(normal.inv_cdf((k + 0.5) / count))))) for k in range(count)]
    random.Random(seed).shuffle(values)
    return tuple(values)


def _balanced(lengths: Sequence[int], parts: int) -> list[int]:
    """Token totals of `parts` groups balanced by size, largest sequence first to the lightest group (how
    verl's Karmarkar-Karp partition spreads them, to within its rounding)."""
    heap = [(0, i) for i in range(parts)]
    for length in sorted(lengths, reverse=True):
        total, index = heapq.heappop(heap)
        heapq.heappush(heap, (total + length, index))
    return [total for total, _ in sorted(heap, key=lambda item: item[1])]


def micro_batch_tokens(plan: Plan, profile: Profile, role: RoleBatchLayout, seed: int = _SEED,
                       sample: tuple[int, int] = (_CHUNKS, _MICRO_BATCHES)) -> list[list[int]]:
    """Per chunk (a mini batch for an update, the whole batch for a forward), the tokens of each micro batch
    on one GPU, after the Ulysses split, the largest scaled to the phase's priced tokens (at most _CHUNKS chunks
    of _MICRO_BATCHES micro batches by default, the `sample`: the replay's, the largest among them)."""
    # Imported here: the steptime package imports memory (the lengths module itself does not).
    from rlplan.planner.steptime.lengths import workload_lengths

    return [list(chunk) for chunk in _micro_batch_tokens(workload_lengths(plan, profile), role, seed, sample)]


@functools.lru_cache(maxsize=1024)
def _micro_batch_tokens(workload: Lengths, role: RoleBatchLayout, seed: int, sample: tuple[int, int]
                        ) -> tuple[tuple[int, ...], ...]:
    chunks_kept, micro_kept = sample
    sequences = max(1, role.sequences_per_gpu)
    responses = _response_lengths(workload.response_mean, workload.log_median, workload.sigma, workload.response_max,
                                  sequences, seed + sum(map(ord, str(role.role))))
    lengths = [min(role.max_sequence_length, int(workload.prompt_mean) + r) for r in responses]
    if role.padded:
        lengths = [role.max_sequence_length] * sequences
    chunk = max(1, role.chunk_size)
    chunks: list[list[int]] = []
    for start in range(0, sequences, chunk):
        part = lengths[start:start + chunk]
        if role.max_token_len_per_gpu is not None:
            budget = role.max_token_len_per_gpu * role.sequence_parallel_size
            groups = _balanced(part, min(len(part), max(1, math.ceil(sum(part) / budget))))
            random.Random(seed + start).shuffle(groups)
        else:
            size = role.micro_batch_size_per_gpu or 1
            groups = [sum(part[i:i + size]) for i in range(0, len(part), size)]
        chunks.append([math.ceil(g / role.sequence_parallel_size) for g in groups])
    largest = max(max(c) for c in chunks)
    scale = role.tokens_per_micro_batch / largest
    kept = sorted(range(len(chunks)), key=lambda i: (max(chunks[i]) < largest, i))[:chunks_kept]
    return tuple(tuple(max(1, round(t * scale)) for t in _some(chunks[i], micro_kept)) for i in sorted(kept))


def _some(values: list[int], count: int) -> list[int]:
    """At most `count` of `values` in their order, evenly spaced, the largest always among them."""
    if len(values) <= count:
        return values
    step = len(values) / count
    picked = {int(i * step) for i in range(count - 1)} | {values.index(max(values))}
    return [values[i] for i in sorted(picked)]


# --- the trace ----------------------------------------------------------------------------------------


# One replayed operation: ("alloc", key, bytes, stream, blocks), ("free", key), ("empty",), ("phase", name,
# capacity, expandable, max_split) to open a phase and ("end", name) to close it.
Op = tuple[Any, ...]


class _Replay:
    """Records a step's allocator operations phase by phase; `figures` replays them (cached per trace)."""

    def __init__(self, ctx: StepShape, phases: dict[str, PhaseMemory]) -> None:
        self.ctx = ctx
        self.plan = ctx.plan
        self.phases = phases
        self.facts = model_facts(ctx.plan.model.arch)
        self.groups = min(self.facts.layers, _LAYER_GROUPS)
        self.ops: list[Op] = []
        self._held: set[str] = set()
        # The optimizer states created so far: torch's Adam builds a parameter's exp_avg and exp_avg_sq at its first
        # step() (torch/optim/adam.py _init_group: `if len(state) == 0`), not when verl builds the optimizer.
        self.stepped: set[str] = set()
        # Which micro batches a pass walks: the workload's sample, or FIT_PATTERN (None).
        self.sample: tuple[int, int] | None = (_CHUNKS, _MICRO_BATCHES)
        # How the pass being recorded allocates (the backend's AllocationShape of its role and batch).
        self.shape = _shape(ctx, "actor", None)

    @property
    def figures(self) -> dict[str, AllocatorFigures]:
        return dict(_simulate(tuple(self.ops)))

    def micro_batches(self, role: RoleBatchLayout) -> list[list[int]]:
        """The chunks of micro-batch tokens a pass walks (the workload's sample, or the fit's fixed pattern)."""
        if self.sample is None:
            priced = max(1, role.tokens_per_micro_batch)
            return [[max(1, round(f * priced)) for f in FIT_PATTERN]]
        return micro_batch_tokens(self.plan, self.ctx.profile, role, sample=self.sample)

    # --- primitives ---

    def alloc(self, key: str, nbytes: float, stream: int = COMPUTE, blocks: int = 1) -> None:
        if nbytes <= 0:
            return
        each = max(1, int(nbytes // blocks))
        self.ops.append(("alloc", key, round_size(each), stream, blocks))
        self._held.add(key)

    def free(self, key: str) -> None:
        if key in self._held:
            self._held.discard(key)
            self.ops.append(("free", key))

    def holds(self, key: str) -> bool:
        return key in self._held

    def empty_cache(self) -> None:
        self.ops.append(("empty",))

    def phase(self, name: str, trainer_phase: bool, body: Callable[[], None]) -> None:
        memory = self.phases.get(name)
        if memory is None:
            return
        engine = self.plan.rollout.name
        outside = sum(c.bytes for c in memory.components if outside_the_trainer_allocator(c.name, engine))
        config = allocator_config(self.plan, trainer_phase=trainer_phase)
        capacity = max(0, self.plan.cluster.gpu_memory_bytes - outside)
        self.ops.append(("phase", name, capacity, config.expandable_segments, config.max_split_size))
        body()
        self.ops.append(("end", name))


    # --- state ---

    def state(self, name: str, nbytes: float) -> None:
        """A role's state: per-layer shards (in groups of layers), or the contiguous buffers its backend makes.  An
        optimizer's state is what exists of it: the share its backend builds with the optimizer (Megatron's fp32
        main weights) from the start, the rest (Adam's moments) once it has stepped (`stepped`)."""
        blocks = _state_blocks(self.ctx, name, self.groups)
        built = _optimizer_built_share(self.ctx, name)
        if not built:
            if not self.holds(name):
                self.alloc(name, nbytes, blocks=blocks)
            return
        if not self.holds(name):
            self.alloc(name, built * nbytes, blocks=blocks)
        if name in self.stepped and not self.holds(f"{name}:moments"):
            self.alloc(f"{name}:moments", (1 - built) * nbytes, blocks=blocks)

    def load(self, names: Sequence[str], sizes: dict[str, float]) -> list[str]:
        """Load what a phase needs that is not resident between phases; returns the names to offload after."""
        loaded = []
        for name in names:
            if name in self.ctx.resident_by_role or self.holds(name) or not sizes.get(name):
                continue
            if (name.endswith("_optimizer_state") and name not in self.stepped
                    and not _optimizer_built_share(self.ctx, name)):
                continue  # load_fsdp_optimizer moves the state there is: none before the first step
            self.state(name, sizes[name])
            loaded.append(name)
        return loaded

    def offload(self, loaded: Sequence[str]) -> None:
        for name in loaded:
            self.free(name)
            self.free(f"{name}:moments")
        if loaded:
            self.empty_cache()  # offload_fsdp_model_to_cpu(empty_cache=True), every version

    # --- one micro batch ---

    def moment(self, tag: str, components: Sequence[Component], tokens: int, priced: int) -> None:
        """Allocate a moment's tensors for a micro batch of `tokens` (the moment was priced at `priced`)."""
        for c in components:
            if c.name.endswith(_STATE_SUFFIXES) or c.name.endswith("_grads") or c.scope == "overhead":
                continue
            size = c.bytes * tokens / priced if c.name in _TOKEN_SIZED else c.bytes
            self.alloc(f"{tag}:{c.name}", size, _STREAM.get(c.name, COMPUTE), self._blocks_of(tag, c, priced))

    def _blocks_of(self, moment: str, c: Component, priced: int) -> int:
        return _replayed_blocks(moment, c, priced, self.facts.vocab, self.facts.layers, self.shape)

    def release(self, tag: str, components: Sequence[Component]) -> None:
        for c in reversed(components):
            self.free(f"{tag}:{c.name}")



@functools.lru_cache(maxsize=4096)
def _simulate(ops: tuple[Op, ...]) -> tuple[tuple[str, AllocatorFigures], ...]:
    """Replay recorded operations into one allocator: each phase's peaks (the largest over its replays)."""
    allocator = CachingAllocator()
    blocks: dict[str, list[Any]] = {}
    figures: dict[str, AllocatorFigures] = {}
    opening = False  # a phase began and has allocated nothing yet: a flush there starts its peaks afresh
    for op in ops:
        kind = op[0]
        if kind == "alloc":
            _, key, size, stream, count = op
            blocks.setdefault(key, []).extend(allocator.malloc(size, stream) for _ in range(count))
            opening = False
        elif kind == "free":
            for block in reversed(blocks.pop(op[1], [])):
                allocator.free(block)
        elif kind == "empty":
            allocator.empty_cache()
            if opening:
                allocator.reset_peaks()
        elif kind == "phase":
            allocator.capacity = op[2]
            allocator.config = AllocatorConfig(expandable_segments=op[3], max_split_size=op[4])
            allocator.reset_peaks()
            opening = True
        else:
            name, old = op[1], figures.get(op[1])
            now = AllocatorFigures(allocated=allocator.peak_allocated, reserved=allocator.peak_reserved,
                                   needed=allocator.peak_needed)
            figures[name] = now if old is None else AllocatorFigures(
                allocated=max(old.allocated, now.allocated), reserved=max(old.reserved, now.reserved),
                needed=max(old.needed, now.needed))
    return tuple(figures.items())

def _grads(role: str, state: TrainerState) -> tuple[str, float]:
    return f"{role}_grads", state.grads


def _forward_pass(replay: _Replay, phase: str, role: RoleBatchLayout, params: str,
                  moments_at: Callable[[int], list[tuple[str, list[Component]]]]) -> None:
    ctx = replay.ctx
    sizes = {"actor_params": ctx.actor_gpu.params, "ref_params": ctx.resident_by_role.get(
        "ref_params", Component("ref_params", 0)).bytes,
        "critic_params": ctx.critic_gpu.params if ctx.critic_gpu else 0.0}
    priced = max(1, role.tokens_per_micro_batch)
    moments = moments_at(priced)
    shape = _shape(ctx, _role_of(params), role)

    def body() -> None:
        replay.shape = shape
        loaded = replay.load([params], sizes)
        for chunk in replay.micro_batches(role):
            for tokens in chunk:
                for name, components in moments:
                    replay.moment(name, components, tokens, priced)
                    replay.release(name, components)
                replay.alloc("outputs", tokens * 4)  # log-probs kept to the phase's end
        replay.free("outputs")
        replay.offload(loaded)
        if shape.empties_cache_after_pass:
            replay.empty_cache()

    replay.phase(phase, True, body)


def _update_pass(replay: _Replay, phase: str, role_name: str, role: RoleBatchLayout, state: TrainerState,
                 moments: list[tuple[str, list[Component]]]) -> None:
    params, optimizer = f"{role_name}_params", f"{role_name}_optimizer_state"
    grads_name, grads = _grads(role_name, state)
    priced = max(1, role.tokens_per_micro_batch)
    layers = replay.groups
    shape = _shape(replay.ctx, role_name, role)
    # Contiguous gradient buffers (Megatron's DDP) are loaded with the weights and zeroed in place, never dropped.
    buffered = shape.grad_buffers is not None
    names = [params, grads_name, optimizer] if buffered else [params, optimizer]

    def body() -> None:
        replay.shape = shape
        loaded = replay.load(names, {params: state.params, grads_name: grads, optimizer: state.optimizer})
        for _ in range(role.epochs):
            for chunk in replay.micro_batches(role):
                if not buffered:
                    replay.free(grads_name)  # zero_grad(set_to_none) at the mini batch's start
                for tokens in chunk:
                    for name, components in moments:
                        if name == "optimizer_step":
                            continue
                        replay.moment(name, components, tokens, priced)
                        if name == "backward" and not replay.holds(grads_name):
                            replay.alloc(grads_name, grads, blocks=layers)
                        replay.release(name, components)
                if any(name == "optimizer_step" for name, _ in moments):
                    replay.stepped.add(optimizer)
                    replay.state(optimizer, state.optimizer)
                    replay.alloc("optimizer_step", state.optimizer_step, blocks=layers)
                    replay.free("optimizer_step")
        if not buffered:
            replay.free(grads_name)
        if optimizer not in loaded and optimizer not in replay.ctx.resident_by_role and replay.holds(optimizer):
            loaded.append(optimizer)  # created by this pass's first step, offloaded with the rest
        replay.offload(loaded)
        if shape.empties_cache_after_pass:
            replay.empty_cache()

    replay.phase(phase, True, body)


def _weight_sync(replay: _Replay) -> None:
    plan, ctx = replay.plan, replay.ctx
    memory = replay.phases.get(Phase.WEIGHT_SYNC)
    gather = memory.bytes_of("weight_sync_gather") if memory is not None else 0
    largest = max(1, replay.facts.largest_tensor)
    layer_share = min(1.0, replay.facts.layer_params / 3 / largest)

    def body() -> None:
        flush = MEGATRON_EMPTIES_CACHE_BEFORE_SYNC if plan.actor.strategy == "megatron" else EMPTIES_CACHE_BEFORE_SYNC
        if holds(flush, plan.stack, plan.rollout.name, plan.passthrough):
            replay.empty_cache()
        loaded = replay.load(["actor_params"], {"actor_params": ctx.actor_gpu.params})
        # One tensor's full copy (and its cast) at a time: the embedding's first, then each layer's.
        replay.alloc("sync", gather, blocks=2)
        replay.free("sync")
        for _ in range(replay.facts.layers):
            replay.alloc("sync", gather * layer_share, blocks=2)
            replay.free("sync")
        replay.offload(loaded)
        if holds(EMPTIES_CACHE_AFTER_SYNC, plan.stack, plan.rollout.name):
            replay.empty_cache()

    replay.phase(Phase.WEIGHT_SYNC, False, body)


def _rollout(replay: _Replay, engine_in_process: bool) -> None:
    plan = replay.plan
    budget_activation = 0
    memory = replay.phases.get(Phase.ROLLOUT)
    if memory is not None and engine_in_process:
        budget_activation = memory.bytes_of(f"{plan.rollout.name}_activation")

    def body() -> None:
        # An engine in the trainer's process runs its forward passes on torch's default pool.
        for _ in range(2):
            replay.alloc("engine", budget_activation)
            replay.free("engine")
        if holds(EMPTIES_CACHE_AFTER_ROLLOUT, plan.stack, plan.rollout.name):
            replay.empty_cache()

    replay.phase(Phase.ROLLOUT, False, body)


def replay_step(ctx: StepShape, phases: Sequence[PhaseMemory], *, engine_in_process: bool | None = None
                ) -> dict[str, AllocatorFigures]:
    """Each phase's allocated, reserved and needed bytes over two replayed steps (the trainer's default pools):
    what torch's counters show as the step runs, each phase starting with what the phases before it cached.
    `engine_in_process` (default: the plan's stack) puts the engine's workspace in the trainer's pools."""
    replay = _start(ctx, phases)
    for _ in range(_STEPS):
        for _, run in _step(replay, ctx, engine_in_process):
            run()
    return replay.figures


def replay_phase(ctx: StepShape, phase: PhaseMemory) -> AllocatorFigures:
    """One phase replayed alone (twice, as two steps run it), from an allocator that holds only the state resident
    between phases: what it strands at its peak does not depend on what earlier phases cached (a segment with no
    block in use is given back before an out-of-memory error), so this is what a fit needs."""
    if phase.name in (Phase.WEIGHT_SYNC, Phase.ROLLOUT):
        # One gathered tensor at a time, or the engine's workspace: each freed before the next, nothing stranded.
        return AllocatorFigures(allocated=0, reserved=0, needed=0)
    replay = _start(ctx, [phase])
    replay.sample = None
    for _ in range(_STEPS):  # the second as every later step runs: after the first created the optimizer's state
        for name, run in _step(replay, ctx):
            if name == phase.name:
                run()
    return replay.figures.get(phase.name, AllocatorFigures(allocated=0, reserved=0, needed=0))


# On fixed segments a phase strands at its peak at most this share of its largest transient block: a micro batch
# smaller than the one before places its tensors in that one's segments, and best fit puts a tensor of one kind in a
# larger freed segment of another, whose rest cannot be given back while the tensor lives.  The bound is the
# largest share the phase replay (replay_phase) strands on the reference plans (the public runs, the example
# gallery on verl 0.5): 1.01, one logits-sized buffer of the 7B PPO run's update, rounded up. One gallery plan
# exceeds it, the 32B GRPO example's update with Adam's state on the GPU (1.79: the replay makes the state at the
# first step in the segments the freed activations left, stranding them from the next step's activations), and is
# not taken into the bound: raised to cover it (1.8), the bound refused the published full-parameter runs of verl's
# device-tuning tables that ran (tests/planner/test_verl_ground_truth.py, qwen2-7b on 2 x H800), so the real
# allocator does not strand that much there. tests/planner/memory/test_allocator_trace.py holds the replay to it.
STRANDED_SHARE_OF_LARGEST_BLOCK = 1.1


def stranded_bytes(ctx: StepShape, phase: PhaseMemory) -> int:
    """The bytes a phase's allocator holds at its peak beyond its live blocks and cannot give back: the fit's
    reserve.  On expandable segments only the pages its live blocks round up to (half a page each on average,
    counted over the blocks the phase's components are replayed as); on fixed segments
    STRANDED_SHARE_OF_LARGEST_BLOCK of its largest transient block.  Both grow with the phase's sizes and nothing
    else (a fit stays monotone in lengths and batch sizes) and need no replay."""
    if phase.name in (Phase.WEIGHT_SYNC, Phase.ROLLOUT):
        return 0
    config = allocator_config(ctx.plan, trainer_phase=True)
    if config.expandable_segments:
        return _most_blocks(ctx, phase) * LARGE_PAGE // 2
    return int(STRANDED_SHARE_OF_LARGEST_BLOCK * largest_transient_block(ctx, phase)
               + MANY_TENSORS_STRANDED_SHARE * _many_tensor_activations(ctx, phase))


# Saved activations a backend makes as many equal tensors (AllocationShape.activation_tensors: Megatron's, one per
# layer and micro batch its stage holds) are each placed by a smaller micro batch in a larger one's segment: the
# phase strands a share of all of them, beside what the largest block strands (the head's freed segments, which
# the layers' backward splits for its activations).  FIT_PATTERN's step down after its largest micro batch is a
# tenth; the phase replay strands at most 0.124 of the activations beyond the largest-block share over verl's
# published Megatron runs (Qwen2.5-Math-7B's tp4pp2 row, benchmarks/megatron_memory.py), rounded up here;
# tests/planner/memory/test_allocator_trace.py holds the replay to it.
MANY_TENSORS_STRANDED_SHARE = 0.125


def _many_tensor_activations(ctx: StepShape, phase: PhaseMemory) -> int:
    """The largest saved-activation bytes of the phase's moments where its backend makes them as many equal tensors
    (0 where it makes them per group of layers: the largest block bounds those)."""
    if not _shape(ctx, *_phase_role(ctx, phase.name)).activation_tensors:
        return 0
    moments = _pass_moments(ctx, phase.name, _priced_tokens(ctx, phase.name))
    return max((c.bytes for _, components in moments for c in components if c.name == "activations"), default=0)


def _most_blocks(ctx: StepShape, phase: PhaseMemory) -> int:
    """How many blocks the phase's trainer allocator holds, with its peak moment's counted as the moment of its pass
    that has the most: the peak is the moment with the most bytes, and a larger micro batch can move it to a moment
    of fewer blocks, which would shrink the reserve and the fit with it (the property test of test_memory.py)."""
    groups = min(model_facts(ctx.plan.model.arch).layers, _LAYER_GROUPS)
    shape = _shape(ctx, *_phase_role(ctx, phase.name))

    def each(c: Component, moment: str) -> int:
        if c.name == "activations":
            return shape.activation_tensors_in(moment) or groups
        if c.name.endswith(_STATE_SUFFIXES + ("_grads",)):
            return _state_blocks(ctx, c.name, groups)
        return 1

    def blocks(components: Sequence[Component], moment: str) -> int:
        return sum(each(c, moment) for c in components
                   if c.scope != "overhead" and not outside_the_trainer_allocator(c.name, ctx.plan.rollout.name))

    counted = blocks(phase.components, phase.peak_at)
    moments = _pass_moments(ctx, phase.name, _priced_tokens(ctx, phase.name))
    step_names = sorted(c.name for c in phase.components if c.scope == "step")
    peak = [(name, components) for name, components in moments
            if sorted(c.name for c in components) == step_names]
    if peak:
        counted += max(blocks(components, name) for name, components in moments) - blocks(peak[0][1], peak[0][0])
    return counted


def largest_transient_block(ctx: StepShape, phase: PhaseMemory) -> int:
    """The largest single tensor the phase's pass allocates and frees over its moments (not a role's state), as
    the replay splits its components: a layer group's activations, one logits-sized buffer of the head, else the
    component.  Over every moment, not only the peak's: the bound then grows with the sizes alone."""
    facts = model_facts(ctx.plan.model.arch)
    tokens = _priced_tokens(ctx, phase.name)
    shape = _shape(ctx, *_phase_role(ctx, phase.name))
    largest = 0.0
    for moment, components in _pass_moments(ctx, phase.name, tokens):
        for c in components:
            if c.scope != "step" or c.name.endswith(_STATE_SUFFIXES + ("_grads",)):
                continue
            largest = max(largest, c.bytes / _replayed_blocks(moment, c, tokens, facts.vocab, facts.layers, shape))
    return int(largest)


def _replayed_blocks(moment: str, c: Component, tokens: int, vocab: int, layers: int, shape: AllocationShape) -> int:
    """How many equal tensors the replay allocates a component of a moment as: saved activations as the backend's
    tensors (one per layer and micro batch its stage holds under Megatron) or in groups of layers, the optimizer's
    foreach temporaries in groups of layers, the head as its logits-sized (bf16, over the vocabulary's shards)
    buffers, else one."""
    if c.name == "activations" and shape.activation_tensors_in(moment):
        return shape.activation_tensors_in(moment)
    if c.name in _LAYERWISE:
        return min(layers, _LAYER_GROUPS)
    if c.name == "logits_head":
        return max(1, round(c.bytes * shape.vocab_shards / (2 * tokens * vocab)))
    return 1


def _role_of(state_name: str) -> EngineRole:
    """The role a state component belongs to: `actor_params` -> actor, `ref_params` -> ref."""
    role = state_name.split("_", 1)[0]
    return "ref" if role == "ref" else "critic" if role == "critic" else "actor"


def _shape(ctx: StepShape, role: EngineRole, batch: RoleBatchLayout | None) -> AllocationShape:
    shape: AllocationShape = ctx.trainer.allocation_shape(ctx.plan, role, batch)
    return shape


def _state_blocks(ctx: StepShape, name: str, groups: int) -> int:
    """The allocations a role's state component is: its backend's contiguous buffers (Megatron's DDP grad_data
    and param_data), else one per group of layers."""
    shape = _shape(ctx, _role_of(name), None)
    buffers = shape.grad_buffers if name.endswith("_grads") else shape.param_buffers if name.endswith(
        "_params") else None
    return buffers or groups


def _optimizer_built_share(ctx: StepShape, name: str) -> float:
    """The share of an optimizer state component that exists from the optimizer's build (0 for other components)."""
    if not name.endswith("_optimizer_state"):
        return 0.0
    return _shape(ctx, _role_of(name), None).optimizer_built_share


def _phase_role(ctx: StepShape, phase: str) -> tuple[EngineRole, RoleBatchLayout | None]:
    """The role a trainer phase runs and its batch layout."""
    layout = ctx.layout
    roles: dict[str, tuple[EngineRole, RoleBatchLayout | None]] = {
        Phase.OLD_LOG_PROB: ("actor", layout.old_log_prob), Phase.ACTOR_UPDATE: ("actor", layout.actor_update),
        Phase.REF_LOG_PROB: ("actor" if ctx.plan.reference_is_actor else "ref", layout.ref_log_prob),
        Phase.CRITIC_VALUES: ("critic", layout.critic_values), Phase.CRITIC_UPDATE: ("critic", layout.critic_update)}
    return roles.get(phase, ("actor", None))


def _pass_moments(ctx: StepShape, phase: str, tokens: int) -> list[tuple[str, list[Component]]]:
    """The moments of the pass a trainer phase runs, at its priced tokens (as the replay walks them)."""
    layout, plan = ctx.layout, ctx.plan
    if phase == Phase.OLD_LOG_PROB:
        return _forward_moments(ctx, entropy=True)(tokens)
    if phase == Phase.REF_LOG_PROB:
        return _forward_moments(ctx, entropy=False)(tokens)
    if phase == Phase.CRITIC_VALUES:
        return _moments(ctx.trainer, "forward_moments", plan, tokens=tokens, head_bytes_per_token_vocab=0.0)
    if phase == Phase.CRITIC_UPDATE and ctx.critic_gpu is not None and layout.critic_update is not None:
        return _update_moments(ctx, "critic", layout.critic_update, ctx.critic_gpu)
    if phase == Phase.ACTOR_UPDATE:
        return _update_moments(ctx, "actor", layout.actor_update, ctx.actor_gpu)
    return []


def _priced_tokens(ctx: StepShape, phase: str) -> int:
    role = _phase_role(ctx, phase)[1]
    return max(1, role.tokens_per_micro_batch) if role is not None else 1


def _start(ctx: StepShape, phases: Sequence[PhaseMemory]) -> _Replay:
    replay = _Replay(ctx, {p.name: p for p in phases})
    for name, component in ctx.resident_by_role.items():
        # An optimizer's state is created at its first step (_Replay.stepped), but what its backend builds with it.
        if not name.endswith("_optimizer_state") or _optimizer_built_share(ctx, name):
            replay.state(name, component.bytes)
    return replay


def _step(replay: _Replay, ctx: StepShape, engine_in_process: bool | None = None
          ) -> Iterator[tuple[str, Callable[[], None]]]:
    plan, layout, trainer = ctx.plan, ctx.layout, ctx.trainer
    if engine_in_process is None:
        engine_in_process = plan.rollout.name == "vllm" and holds(ENGINE_IN_TRAINER_PROCESS, plan.stack, "vllm")
    yield Phase.WEIGHT_SYNC, lambda: _weight_sync(replay)
    yield Phase.ROLLOUT, lambda: _rollout(replay, engine_in_process)
    yield Phase.OLD_LOG_PROB, lambda: _forward_pass(replay, Phase.OLD_LOG_PROB, layout.old_log_prob, "actor_params",
                                                    _forward_moments(ctx, entropy=True))
    if layout.ref_log_prob is not None:
        params = "actor_params" if plan.reference_is_actor else "ref_params"
        ref = layout.ref_log_prob
        yield Phase.REF_LOG_PROB, lambda: _forward_pass(replay, Phase.REF_LOG_PROB, ref, params,
                                                        _forward_moments(ctx, entropy=False))
    if ctx.critic_gpu is not None and layout.critic_values is not None and layout.critic_update is not None:
        values, update, critic = layout.critic_values, layout.critic_update, ctx.critic_gpu
        yield Phase.CRITIC_VALUES, lambda: _forward_pass(
            replay, Phase.CRITIC_VALUES, values, "critic_params",
            lambda tokens: _moments(trainer, "forward_moments", plan, tokens=tokens, head_bytes_per_token_vocab=0.0))
        yield Phase.CRITIC_UPDATE, lambda: _update_pass(replay, Phase.CRITIC_UPDATE, "critic", update, critic,
                                                        _update_moments(ctx, "critic", update, critic))
    yield Phase.ACTOR_UPDATE, lambda: _update_pass(replay, Phase.ACTOR_UPDATE, "actor", layout.actor_update,
                                                   ctx.actor_gpu,
                                                   _update_moments(ctx, "actor", layout.actor_update, ctx.actor_gpu))


def _moments(trainer: Any, method: str, plan: Plan, **kwargs: Any) -> list[tuple[str, list[Component]]]:
    """The backend's moments of a pass (memory.backend.TrainingBackend.update_moments / forward_moments)."""
    return list(getattr(trainer, method)(plan, **kwargs))


def _forward_moments(ctx: StepShape, *, entropy: bool) -> Callable[[int], list[tuple[str, list[Component]]]]:
    from rlplan.planner.memory.heads import forward_head_bytes_per_token_vocab

    def at(tokens: int) -> list[tuple[str, list[Component]]]:
        head = forward_head_bytes_per_token_vocab(ctx.plan, ctx.profile, entropy=entropy, tokens=tokens)
        return _moments(ctx.trainer, "forward_moments", ctx.plan, tokens=tokens, head_bytes_per_token_vocab=head,
                        entropy=entropy)
    return at


def _update_moments(ctx: StepShape, role: str, batch: RoleBatchLayout, state: TrainerState
                    ) -> list[tuple[str, list[Component]]]:
    from rlplan.planner.memory.heads import update_loss_head

    head = update_loss_head(ctx.plan, ctx.profile, batch.tokens_per_micro_batch) if role == "actor" else None
    moments = _moments(ctx.trainer, "update_moments", ctx.plan, role=role, state_on_gpu=state, batch=batch,
                       head=head, profile=ctx.profile)
    if not any(name == "optimizer_step" for name, _ in moments):
        moments.append(("optimizer_step", []))
    return moments

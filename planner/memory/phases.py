"""The phases of a colocated verl step, each priced per GPU with its components, and host RAM per node.

A step runs these phases (the package docstring lists the components they report):

    weight_sync    trainer weights pushed into the waking engine (multi-stage wake: KV not yet resident)
    rollout        generation: vLLM inside util x GPU; SGLang's weights + KV inside it, buffers and
                   CUDA graphs beside it; with what the trainer leaves on the GPU
    old_log_prob   actor forward, no_grad
    ref_log_prob   reference forward, no_grad (only when a KL term needs it)
    critic_values  critic forward, no_grad (PPO/GAE only)
    critic_update  critic training step (PPO/GAE only)
    actor_update   actor training step: max(P_loss, P_bwd, P_opt, P_root: the root groups' backward after the layers)

With the rollout on a pool of its own (plan.RolloutPool: verl's one-step-off and fully async recipes) the same
phases run on two kinds of GPU: rollout on a rollout GPU holding the engine alone (its weights, KV cache, buffers
and graphs; no trainer state), weight_sync and the passes on a trainer GPU holding no engine at all (no KV cache,
no sleeping weights). Each phase says its pool (`PhaseMemory.pool`); the fit is the largest phase of either.

Entry points: `predict_memory` (every phase, host, KV budget) and `predict_phase` (one
phase, for searches that bisect one knob).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
from attrs import frozen

from rlplan.planner.layout import PlanLayout, RoleBatchLayout, plan_layout
from rlplan.planner.memory.allocator_trace import stranded_bytes
from rlplan.planner.memory.backend import training_backend
from rlplan.planner.memory.cpu_process import cpu_baselines, engine_sync_component, trainer_heap_component
from rlplan.planner.memory.dataproto import resident_batch
from rlplan.planner.memory.heads import forward_head_bytes_per_token_vocab, update_loss_head
from rlplan.planner.memory.model_facts import model_facts
from rlplan.planner.memory.report import GIB, MIB, BindingConstraint, Component, HostMemory, PhaseMemory
from rlplan.planner.memory.rollout import (
    ROLLOUT_ENGINES,
    RolloutBudget,
    cuda_graph_pool_bytes,
    rollout_budget,
    stages_wake_up,
    start_refusal,
    woken_for_weight_sync,
)
from rlplan.planner.monotone import last_holding
from rlplan.planner.phases import Phase
from rlplan.planner.plan import Plan
from rlplan.planner.profile import DEFAULT_PROFILE, Profile
from rlplan.planner.stack import MICRO_OUTPUTS_HELD_TO_MINI_END, holds, vllm_engine_of


@frozen
class MemoryReport:
    phases: tuple[PhaseMemory, ...]
    host: HostMemory
    gpu_capacity_bytes: int
    host_capacity_bytes: int
    kv_cache_bytes: int
    kv_cache_tokens: int
    max_concurrent_sequences: int
    rollout: RolloutBudget
    notes: tuple[str, ...] = ()

    def phase(self, name: str) -> PhaseMemory:
        for phase in self.phases:
            if phase.name == name:
                return phase
        raise KeyError(name)

    @property
    def peak_phase(self) -> PhaseMemory:
        return max(self.phases, key=lambda p: p.peak_bytes)

    @property
    def gpu_peak_bytes(self) -> int:
        return max(p.peak_bytes for p in self.phases)

    @property
    def fits_gpu(self) -> bool:
        return (self.gpu_peak_bytes <= self.gpu_capacity_bytes and self.rollout.holds_max_model_len
                and self.rollout.starts)

    @property
    def fits_host(self) -> bool:
        return self.host.total_bytes <= self.host_capacity_bytes

    @property
    def fits(self) -> bool:
        return self.fits_gpu and self.fits_host

    @property
    def headroom_bytes(self) -> int:
        return self.gpu_capacity_bytes - self.gpu_peak_bytes

    @property
    def binding_constraint(self) -> BindingConstraint:
        """The limit with the least headroom relative to its capacity."""
        candidates = [
            BindingConstraint("gpu", p.name, p.largest_component.name, self.gpu_capacity_bytes - p.peak_bytes,
                              self.gpu_capacity_bytes)
            for p in self.phases
        ]
        if self.host.components:
            largest = max(self.host.components, key=lambda c: c.bytes)
            candidates.append(BindingConstraint("host", "host", largest.name,
                                                self.host_capacity_bytes - self.host.total_bytes,
                                                self.host_capacity_bytes))
        needed = self.rollout.bytes_needed_for_max_model_len
        candidates.append(BindingConstraint("kv_cache", "rollout", "kv_cache", self.kv_cache_bytes - needed,
                                            self.rollout.requested_bytes))
        return min(candidates, key=lambda c: c.relative_headroom)


class _StepContext:
    """What every phase of one plan shares; built once per predict_memory call."""

    __slots__ = ("plan", "profile", "facts", "layout", "trainer", "actor", "critic", "actor_gpu", "critic_gpu",
                 "_budget", "resident_by_role", "_vllm_resident", "overhead", "on_cpu", "split", "_cpu_high_water")

    def __init__(self, plan: Plan, profile: Profile, layout: PlanLayout) -> None:
        self.plan = plan
        self.profile = profile
        self.facts = model_facts(plan.model.arch)
        self.layout = layout
        # Everything about how the trainer shards and offloads comes from its backend (memory.backend).
        self.trainer = training_backend(plan)
        self.actor = self.trainer.role_state(plan, "actor", layout)
        self.critic = self.trainer.role_state(plan, "critic", layout) if plan.uses_critic else None
        # The part of each role's state on the GPU (none of it under an offload policy).
        self.actor_gpu = self.trainer.state_on_gpu(plan, "actor", self.actor)
        self.critic_gpu = self.trainer.state_on_gpu(plan, "critic", self.critic) if self.critic else None
        self._budget: RolloutBudget | None = None
        self._vllm_resident: list[Component] | None = None
        self.on_cpu = plan.cluster.gpu.is_cpu
        self.split = plan.rollout_is_split
        # On rlplan's CPU runtime a rank is a process and what it measures is its resident set: the
        # interpreter and libraries take the place of the CUDA context.
        self.overhead = (
            Component("cpu_process_baseline", cpu_baselines(profile).trainer_bytes, "overhead") if self.on_cpu
            else Component("cuda_context_and_nccl", int(profile.cuda_context_and_nccl_gib * GIB), "overhead"))
        self.resident_by_role = self._resident_by_role()
        # On a CPU: the largest trainer phase's own bytes, which every trainer phase's heap keeps (cpu_process).
        self._cpu_high_water: int | None = None

    def cpu_high_water(self) -> int:
        """The largest trainer phase's priced bytes beside the heap term: glibc keeps that phase's high-water mark,
        so after the first step every trainer phase holds at least it (memory.cpu_process)."""
        if self._cpu_high_water is None:
            self._cpu_high_water = 0  # the phases built below carry no retained part of their own
            builders = _step_phases(self)
            self._cpu_high_water = max((builders[name]().peak_bytes for name in builders if name != Phase.ROLLOUT),
                                       default=0)
        return self._cpu_high_water

    @property
    def budget(self) -> RolloutBudget:
        if self._budget is None:
            self._budget = rollout_budget(self.plan, self.profile)
        return self._budget

    @property
    def vllm_resident(self) -> list[Component]:
        if self.split:
            return []  # the engine has GPUs of its own: nothing of it on a trainer GPU
        if self._vllm_resident is None:
            self._vllm_resident = self._vllm_components()
        return self._vllm_resident

    def _resident_by_role(self) -> dict[str, Component]:
        """Trainer state left on the GPU while another phase runs, by name (verl offloads between phases)."""
        plan, trainer = self.plan, self.trainer
        resident = {c.name: c for c in trainer.resident_between_phases(plan, "actor", self.actor_gpu)}
        if plan.uses_reference and not plan.reference_is_actor and not trainer.reference_params_on_host(plan):
            resident["ref_params"] = Component(
                "ref_params", trainer.reference_params_bytes(plan, self.layout), "resident")
        if self.critic_gpu is not None:
            resident |= {c.name: c for c in trainer.resident_between_phases(plan, "critic", self.critic_gpu)}
        return resident

    def _vllm_components(self) -> list[Component]:
        """The engine's share of the GPU while the trainer runs: the sleep residue, or everything without sleep.

        Asleep, vLLM keeps its context and CUDA-graph pool.  SGLang's memory saver pauses only the
        "weights" and "kv_cache" regions (verl async_sglang_server.py sleep: release tags
        ["kv_cache", "weights"]); its context and CUDA graphs stay, its buffers are freed to the allocator.
        """
        profile = self.profile
        engine = self.plan.rollout.name
        components = [Component(f"{engine}_context", int(profile.vllm_sleep_residual_gib * GIB), "resident")]
        if graph_pool := cuda_graph_pool_bytes(self.plan, profile):
            components.append(Component("cuda_graph_pool", int(graph_pool), "resident"))
        if not self.plan.rollout.free_cache_engine:
            budget = self.budget
            components += [
                Component(f"{engine}_weights", budget.weights_bytes, "resident"),
                Component(f"{engine}_activation", budget.activation_bytes, "resident"),
                Component(f"{engine}_non_torch", budget.non_torch_bytes, "resident"),
                Component("kv_cache", max(0, budget.kv_cache_bytes), "resident"),
            ]
        return components

    def phase(self, name: str, step: list[Component], *, loaded: tuple[str, ...], peak_at: str = "",
              step_is_trainer: bool = True, vllm_extra: tuple[Component, ...] = ()) -> PhaseMemory:
        """A phase: its own components, the other roles' resident state, vLLM's share, and the overheads.

        `loaded` names the resident state this phase has on the GPU as its own step components.
        The fragmentation reserve covers the trainer's caching-allocator memory, not vLLM's pools.
        On CPU each phase is one process's resident set: the engine runs in a process of its own (so a
        trainer phase holds none of it, and the rollout none of the trainer's state), and torch's CPU
        allocator keeps no cache to reserve for.
        """
        if self.on_cpu:
            # The process's baseline and the heap beyond the priced tensors (memory.cpu_process).
            if not step_is_trainer:
                engine_process = Component(f"{self.plan.rollout.name}_cpu_process_baseline",
                                           cpu_baselines(self.profile).engine_bytes, "overhead")
                return PhaseMemory(name, (*step, engine_sync_component(self.plan, self.profile), engine_process),
                                   peak_at)
            resident = [c for key, c in self.resident_by_role.items() if key not in loaded]
            own = PhaseMemory(name, (*step, *resident, self.overhead), peak_at)
            if self._cpu_high_water == 0:  # building the high-water mark itself
                return own
            baseline = self.overhead.bytes
            heap = trainer_heap_component(self.plan, self.profile, high_water=self.cpu_high_water() - baseline,
                                          own=own.peak_bytes - baseline)
            return PhaseMemory(name, (*step, *resident, heap, self.overhead), peak_at)
        # The rollout's own pool holds no trainer state (plan.RolloutPool).
        resident = [] if self.split and not step_is_trainer else [
            c for key, c in self.resident_by_role.items() if key not in loaded]
        components = step + resident
        if step_is_trainer:
            components += self.vllm_resident
        components += vllm_extra
        components.append(self.overhead)
        reserve = self._allocator_reserve(PhaseMemory(name, tuple(components), peak_at))
        components.append(Component("fragmentation_reserve", reserve, "overhead"))
        pool = ("trainer" if step_is_trainer else "rollout") if self.split else ""
        return PhaseMemory(name, tuple(components), peak_at, pool)

    def _allocator_reserve(self, phase: PhaseMemory) -> int:
        """What the caching allocator holds beyond the phase's live tensors that it cannot give back at the peak:
        free bytes in segments with a block in use (memory.allocator_trace.stranded_bytes, over the backend's
        moments and allocation shape, FSDP's and Megatron's alike)."""
        return stranded_bytes(self, phase)


def _actor_update(ctx: _StepContext) -> PhaseMemory:
    role = ctx.layout.actor_update
    head = update_loss_head(ctx.plan, ctx.profile, role.tokens_per_micro_batch)
    peak_at, step = ctx.trainer.update_components(ctx.plan, "actor", ctx.actor_gpu, role, head, ctx.profile)
    return ctx.phase(Phase.ACTOR_UPDATE, [*step, *_held_micro_outputs(ctx.plan, role), *resident_batch(ctx.plan, role)],
                     loaded=("actor_params", "actor_optimizer_state"), peak_at=peak_at)


def _held_micro_outputs(plan: Plan, role: RoleBatchLayout) -> list[Component]:
    """Before verl PR #6984 (v0.9.0) the engine worker's forward_backward_batch kept every micro batch's
    model_output, fp32 log-probs and (with entropy_coeff) fp32 entropy per token, until the mini batch ended
    (stack.MICRO_OUTPUTS_HELD_TO_MINI_END): at the last micro batch's peak the earlier ones' are still held."""
    if not holds(MICRO_OUTPUTS_HELD_TO_MINI_END, plan.stack, plan.rollout.name, plan.passthrough):
        return []
    earlier = max(0, role.micro_batches_per_mini - 1) * role.tokens_per_micro_batch
    fp32_per_token = 4 * (2 if plan.actor.entropy_coeff != 0 else 1)
    return [Component("held_micro_batch_outputs", earlier * fp32_per_token, "step")] if earlier else []


def _actor_forward(ctx: _StepContext, name: str, role: RoleBatchLayout, *, entropy: bool) -> PhaseMemory:
    step = ctx.trainer.forward_components(
        ctx.plan, params_bytes=ctx.actor_gpu.params, params_name="actor_params", tokens=role.tokens_per_micro_batch,
        head_bytes_per_token_vocab=forward_head_bytes_per_token_vocab(
            ctx.plan, ctx.profile, entropy=entropy, tokens=role.tokens_per_micro_batch), entropy=entropy)
    return ctx.phase(name, [*step, *resident_batch(ctx.plan, role)], loaded=("actor_params",))


def _ref_forward(ctx: _StepContext, role: RoleBatchLayout) -> PhaseMemory:
    if ctx.plan.reference_is_actor:
        return _actor_forward(ctx, Phase.REF_LOG_PROB, role, entropy=False)
    # Offloaded by the trainer itself, the reference's shards stay in host RAM: the GPU holds the gathered layers.
    trainer = ctx.trainer
    on_gpu = 0 if trainer.reference_params_on_host(ctx.plan) else trainer.reference_params_bytes(ctx.plan, ctx.layout)
    step = trainer.forward_components(
        ctx.plan, params_bytes=on_gpu, params_name="ref_params", tokens=role.tokens_per_micro_batch,
        head_bytes_per_token_vocab=forward_head_bytes_per_token_vocab(
            ctx.plan, ctx.profile, entropy=False, tokens=role.tokens_per_micro_batch))
    return ctx.phase(Phase.REF_LOG_PROB, [*step, *resident_batch(ctx.plan, role)], loaded=("ref_params",))


def _critic_values(ctx: _StepContext, role: RoleBatchLayout) -> PhaseMemory:
    assert ctx.critic_gpu is not None
    step = ctx.trainer.forward_components(ctx.plan, params_bytes=ctx.critic_gpu.params, params_name="critic_params",
                                          tokens=role.tokens_per_micro_batch, head_bytes_per_token_vocab=0.0)
    return ctx.phase(Phase.CRITIC_VALUES, [*step, *resident_batch(ctx.plan, role)], loaded=("critic_params",))


def _critic_update(ctx: _StepContext, role: RoleBatchLayout) -> PhaseMemory:
    assert ctx.critic_gpu is not None
    peak_at, step = ctx.trainer.update_components(ctx.plan, "critic", ctx.critic_gpu, role, None, ctx.profile)
    return ctx.phase(Phase.CRITIC_UPDATE, [*step, *resident_batch(ctx.plan, role)],
                     loaded=("critic_params", "critic_optimizer_state"), peak_at=peak_at)


def split_sync_tensor_bytes(plan: Plan) -> int:
    """One tensor of the broadcast from the trainer to a rollout pool of its own. verl's recipes (read at v0.6.1
    recipe/one_step_off_policy/fsdp_workers.py and v0.7.0 recipe/fully_async_policy/fsdp_workers.py,
    `sync_rollout_weights`) walk the actor's state_dict one tensor at a time: every rank on both sides allocates
    `torch.empty(shape, dtype)` of the whole tensor (the trainer's dtype: FSDP's model_dtype), the trainer's ranks
    `full_tensor()` it, rank 0 copies it in, one NCCL broadcast, then the engine's `load_weights` of it. The
    largest tensor is the peak: the embedding or the LM head."""
    dtype_bytes = 4 if not plan.is_megatron and plan.actor.model_dtype == "fp32" else 2
    return dtype_bytes * model_facts(plan.model.arch).largest_tensor


def _weight_sync(ctx: _StepContext) -> PhaseMemory:
    rollout = ctx.plan.rollout
    if ctx.split:
        # The trainer's side of the broadcast (split_sync_tensor_bytes): the gathered tensor and the buffer it is
        # broadcast from; the backend's own export gather under Megatron (its detail is the colocated path's),
        # with the buffer as its bucket. The rollout's side is priced in its own pool's phase (_rollout).
        tensor = split_sync_tensor_bytes(ctx.plan)
        gather = ctx.trainer.weight_sync_gather_bytes(ctx.plan, tensor) if ctx.plan.is_megatron else 2 * tensor
        return ctx.phase(Phase.WEIGHT_SYNC, [Component("actor_params", int(ctx.actor_gpu.params)),
                                             Component("weight_sync_gather", gather)], loaded=("actor_params",))
    gather = ctx.trainer.weight_sync_gather_bytes(ctx.plan, rollout.update_weights_bucket_megabytes * MIB)
    step = [
        Component("actor_params", int(ctx.actor_gpu.params)),
        Component("weight_sync_gather", gather),
    ]
    return ctx.phase(Phase.WEIGHT_SYNC, step, loaded=("actor_params",),
                     vllm_extra=woken_for_weight_sync(ctx.plan, ctx.budget))


def _rollout(ctx: _StepContext) -> PhaseMemory:
    budget = ctx.budget
    profile = ctx.profile
    engine = ctx.plan.rollout.name
    if ctx.on_cpu:
        # vLLM CPU: weights and the KV space in the engine's process (its baseline is added by phase()).
        cpu_step = [Component(f"{engine}_weights", budget.weights_bytes),
                    Component("kv_cache", max(0, budget.kv_cache_bytes))]
        return ctx.phase(Phase.ROLLOUT, cpu_step, loaded=(), step_is_trainer=False)
    step = [
        Component(f"{engine}_weights", budget.weights_bytes),
        Component(f"{engine}_activation", budget.activation_bytes),
        Component(f"{engine}_non_torch", budget.non_torch_bytes),
        Component("kv_cache", max(0, budget.kv_cache_bytes)),
        Component(f"{engine}_context", int(profile.vllm_sleep_residual_gib * GIB)),
    ]
    if not ctx.plan.rollout.enforce_eager:
        step.append(Component("cuda_graph_pool", int(cuda_graph_pool_bytes(ctx.plan, profile))))
    if ctx.split and (received := split_sync_tensor_bytes(ctx.plan) - budget.activation_bytes) > 0:
        # The rollout's side of the weight sync, on its own GPU between generations: the engine (its KV cache
        # stays: it never sleeps) plus the received tensor, which takes the cached activation workspace first;
        # what it needs beyond that raises this pool's peak.
        step.append(Component("weight_sync_received", received))
    return ctx.phase(Phase.ROLLOUT, step, loaded=(), step_is_trainer=False)


def _host(ctx: _StepContext) -> HostMemory:
    plan, facts, profile = ctx.plan, ctx.facts, ctx.profile
    ranks = plan.cluster.gpus_per_node
    trainer = ctx.trainer
    components = trainer.host_components(plan, "actor", ctx.actor, ranks)
    if plan.uses_reference and not plan.reference_is_actor and trainer.reference_params_on_host(plan):
        components.append(Component("ref_params_offloaded",
                                    ranks * trainer.reference_params_bytes(plan, ctx.layout)))
    if ctx.critic is not None:
        components += trainer.host_components(plan, "critic", ctx.critic, ranks)
    if plan.model.activation_offload:
        tokens = ctx.layout.actor_update.tokens_per_micro_batch
        offloaded_layers = max(0, facts.layers - profile.activation_offload_resident_layers)
        per_layer = 2 * facts.hidden if plan.model.gradient_checkpointing else facts.layer_activation_bytes_per_token
        components.append(Component("activations_offloaded", ranks * offloaded_layers * tokens * per_layer))
    rollout = plan.rollout
    if (rollout.free_cache_engine and not plan.rollout_is_split
            and ROLLOUT_ENGINES[rollout.name].sleep_copies_weights_to_host(rollout)):
        components.append(Component(f"{rollout.name}_sleep_weights", ranks * ctx.budget.weights_bytes))
    components += _model_copy(plan, profile)
    if ctx.on_cpu:
        # Each rank's process is priced per 'device' (its share of host RAM); the engine's process, its
        # weights and its KV space come on top of them: one engine per machine (runtime.workers).
        engine = ctx.budget
        components.append(Component("vllm_cpu_engine", cpu_baselines(profile).engine_bytes
                                    + engine_sync_component(plan, profile).bytes
                                    + engine.weights_bytes + max(0, engine.kv_cache_bytes)))
        return HostMemory(tuple(components))
    components.append(_process_overhead(plan, profile))
    return HostMemory(tuple(components))


def _model_copy(plan: Plan, profile: Profile) -> list[Component]:
    if not profile.shm_model_copies_per_node:
        return []
    return [Component("model_copy_shm", profile.shm_model_copies_per_node * 2 * model_facts(plan.model.arch).params)]


def _process_overhead(plan: Plan, profile: Profile) -> Component:
    return Component("process_overhead", int(plan.cluster.gpus_per_node * profile.host_process_gib_per_gpu * GIB))


def host_floor(plan: Plan, profile: Profile = DEFAULT_PROFILE) -> HostMemory:
    """What every GPU plan of this model on this node holds in host RAM whatever its knobs (offload, LoRA, batch,
    lengths): the model's copy in shared memory verl's workers load from, and each GPU process's own RAM. The
    solver proves a request infeasible from it before any search (solver.solve.host_floor_diagnosis)."""
    return HostMemory(tuple([*_model_copy(plan, profile), _process_overhead(plan, profile)]))


def _step_phases(ctx: _StepContext) -> dict[str, Callable[[], PhaseMemory]]:
    """The phases this plan's step runs, in order, each built on demand."""
    layout = ctx.layout
    phases: dict[str, Callable[[], PhaseMemory]] = {
        Phase.WEIGHT_SYNC: lambda: _weight_sync(ctx),
        Phase.ROLLOUT: lambda: _rollout(ctx),
        Phase.OLD_LOG_PROB: lambda: _actor_forward(ctx, Phase.OLD_LOG_PROB, layout.old_log_prob, entropy=True),
    }
    ref, values, update = layout.ref_log_prob, layout.critic_values, layout.critic_update
    if ref is not None:
        phases[Phase.REF_LOG_PROB] = lambda: _ref_forward(ctx, ref)
    if ctx.critic is not None and values is not None and update is not None:
        phases[Phase.CRITIC_VALUES] = lambda: _critic_values(ctx, values)
        phases[Phase.CRITIC_UPDATE] = lambda: _critic_update(ctx, update)
    phases[Phase.ACTOR_UPDATE] = lambda: _actor_update(ctx)
    return phases


def predict_phase(plan: Plan, name: str, profile: Profile = DEFAULT_PROFILE,
                  layout: PlanLayout | None = None) -> PhaseMemory:
    """One phase of predict_memory alone, for searches that bisect one phase's knob."""
    builders = _step_phases(_StepContext(plan, profile, layout or plan_layout(plan)))
    if name not in builders:
        raise KeyError(f"{name!r} is not a phase of this plan's step: {', '.join(builders)}")
    return builders[name]()


def predict_phases(plan: Plan, names: tuple[str, ...], profile: Profile = DEFAULT_PROFILE) -> list[PhaseMemory]:
    """The named phases of predict_memory (those the plan's step runs) from one shared context, for searches whose
    knob moves only them (the rollout's utilization: the rollout and the weight sync)."""
    builders = _step_phases(_StepContext(plan, profile, plan_layout(plan)))
    return [builders[name]() for name in names if name in builders]


def predict_memory(plan: Plan, profile: Profile = DEFAULT_PROFILE, layout: PlanLayout | None = None) -> MemoryReport:
    """Per-GPU peak of every phase, host RAM per node, and the rollout KV budget of one plan."""
    return _report(_StepContext(plan, profile, layout or plan_layout(plan)))


def step_context(plan: Plan, profile: Profile = DEFAULT_PROFILE) -> tuple[_StepContext, MemoryReport]:
    """The step's shared context with its MemoryReport, for the allocator replay (memory.allocator_report)."""
    ctx = _StepContext(plan, profile, plan_layout(plan))
    return ctx, _report(ctx)


def _report(ctx: _StepContext) -> MemoryReport:
    plan, profile = ctx.plan, ctx.profile
    phases = [build() for build in _step_phases(ctx).values()]
    budget = ctx.budget
    notes: list[str] = []
    if budget.kv_cache_bytes <= 0:
        notes.append(f"{plan.rollout.name} weights and workspace exceed gpu_memory_utilization x GPU: "
                     "no room for a KV cache")
    elif not budget.holds_max_model_len:
        notes.append(f"the KV cache holds {budget.kv_cache_tokens} tokens, below max_model_len {budget.max_model_len}")
    refusal = start_refusal(plan, budget)
    if refusal:
        notes.append(refusal)
    if ctx.on_cpu:
        notes.append(cpu_baselines(profile).describe())
    if plan.rollout.free_cache_engine and not stages_wake_up(plan) and not plan.rollout_is_split:
        remedy = ("rollout.multi_stage_wake_up = true keeps" if not plan.rollout.multi_stage_wake_up else
                  f"verl {plan.stack.verl} has no staged wake-up; from verl 0.4.1 multi_stage_wake_up keeps")
        notes.append("without multi_stage_wake_up the KV cache is resumed before the weight sync: trainer weights, "
                     f"rollout weights and KV cache are on the GPU at once; {remedy} "
                     f"the {max(0, budget.kv_cache_bytes) / GIB:.2f} GiB KV cache paused until the trainer is offloaded")
    if budget.co_resident_bytes and not plan.cluster.gpu.is_cpu:
        formula = (f"TensorRT-LLM {plan.stack.version_of('trtllm')} takes free_gpu_memory_fraction of the memory free "
                   "after its load" if plan.rollout.name == "trtllm" else
                   f"SGLang {plan.stack.version_of('sglang')} takes mem_fraction_static of the memory free before "
                   "its load" if budget.fraction_of_free is not None else
                   f"{plan.rollout.name} {plan.stack.version_of(plan.rollout.name)} sizes its KV cache from the "
                   "whole GPU")
        notes.append(f"{formula}: the trainer's {budget.co_resident_bytes / GIB:.2f} GiB resident when verl builds "
                     f"the engine shrink{'s' if budget.fraction_of_free is None else ''} its KV pool "
                     "(docs/verl-versions.md, engine formulas)")
    if (plan.rollout.name == "vllm" and vllm_engine_of(plan.stack) == "v0"
            and not plan.cluster.gpu.is_cpu):
        notes.append(f"vLLM {plan.stack.version_of('vllm')} runs the V0 engine: its profile-run sampler is priced "
                     f"with V1's {profile.vllm_sampler_bytes_per_seq_vocab:g} bytes per sequence x vocabulary entry, "
                     "which over-states V0's (a verl run on vLLM 0.8.3 started at no more than 17, docs/accuracy.md "
                     "3b) and so under-states the KV cache; a profile calibrated on that vLLM sets it")
    if (plan.rollout.name == "vllm" and plan.rollout.layered_summon and plan.rollout.sleep_level == 2
            and plan.rollout.free_cache_engine and not plan.rollout_is_split):
        notes.append("layered_summon forces vLLM sleep level 1: weights are copied to host RAM")
    return MemoryReport(
        phases=tuple(phases),
        host=_host(ctx),
        gpu_capacity_bytes=plan.cluster.gpu_memory_bytes,
        host_capacity_bytes=plan.cluster.host_memory_bytes_per_node,
        kv_cache_bytes=max(0, budget.kv_cache_bytes),
        kv_cache_tokens=budget.kv_cache_tokens,
        max_concurrent_sequences=budget.max_concurrent_sequences,
        rollout=budget,
        notes=tuple(notes),
    )


def at_max_length(plan: Plan) -> Plan:
    """The plan with its expected lengths dropped: every sequence priced at the maximum (worst case)."""
    return plan.evolve(data=attrs.evolve(plan.data, expected_prompt_length=None, expected_response_length=None))


def longest_expected_response_that_fits(plan: Plan, profile: Profile = DEFAULT_PROFILE) -> int:
    """The largest mean response length (at the plan's expected prompt length) the plan fits at.

    0 when even one-token responses do not fit; max_response_length when it fits at full length.
    Memory grows monotonically with the mean length (fixed micro batches hold m x mean tokens),
    so a bisection over predict_memory finds the boundary in log2(max_response_length) calls.
    """

    def fits(response: int) -> bool:
        data = attrs.evolve(plan.data, expected_response_length=response)
        return predict_memory(plan.evolve(data=data), profile).fits

    high = plan.data.max_response_length
    if fits(high):
        return high
    if not fits(1):
        return 0
    return last_holding(1, high, fits)


def longest_expected_sequence_that_fits(plan: Plan, profile: Profile = DEFAULT_PROFILE) -> tuple[int, int]:
    """The largest mean (prompt, response) the plan fits at, both shrunk together in the proportion of the
    expected prompt (else the maximum) to the maximum response: what a plan that does not fit even at
    one-token responses, its prompts still at full length, fits at. (0, 0) when not even 1 + 1 tokens fit.
    Memory grows monotonically with both lengths, so a bisection over the total finds the boundary."""
    data = plan.data
    prompt_cap = data.expected_prompt_length or data.max_prompt_length
    response_cap = data.max_response_length

    def split(total: int) -> tuple[int, int]:
        prompt = min(prompt_cap, max(1, round(total * prompt_cap / (prompt_cap + response_cap))))
        return prompt, max(1, min(response_cap, total - prompt))

    def fits(total: int) -> bool:
        prompt, response = split(total)
        shrunk = attrs.evolve(data, expected_prompt_length=prompt, expected_response_length=response)
        return predict_memory(plan.evolve(data=shrunk), profile).fits

    high = prompt_cap + response_cap
    if fits(high):
        return split(high)
    if not fits(2):
        return 0, 0
    return split(last_holding(2, high, fits))

"""What `validate`, `explain`, `solve` and `presets` show: the typed reports of a plan (`PlanReports`), and the
JSON shape and rich tables both built from them.

Pure: builds dictionaries and rich renderables; the CLI prints them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import attrs
from attrs import frozen

from rlplan.planner.errors import ECHO_LIMIT, shorten
from rlplan.planner.hardware import Cluster
from rlplan.planner.layout import PlanLayout, plan_layout
from rlplan.planner.margin_report import (
    MarginReport,
    MarginWarning,
    host_note,
    margin_json,
    margin_report,
    margin_summary,
    margin_text,
    margin_warning,
)
from rlplan.planner.memory import Component, MemoryReport, predict_memory
from rlplan.planner.memory.allocator_report import FIGURES, PhaseAllocator, allocator_report
from rlplan.planner.memory.heads import resolved_loss_head
from rlplan.planner.memory.megatron import TrainedRole, cpu_optimizer_fraction
from rlplan.planner.memory.phases import (
    at_max_length,
    longest_expected_response_that_fits,
    longest_expected_sequence_that_fits,
)
from rlplan.planner.memory.rollout import largest_starting_utilization, rollout_budget, start_refusal
from rlplan.planner.model_error import DEFAULT_HEADROOM, Headroom, Margin
from rlplan.planner.plan import ENGINE_TITLES, MegatronSection, Plan
from rlplan.planner.profile import Profile
from rlplan.planner.rules import RuleReport, Violation, check_plan
from rlplan.planner.solver import (
    RANKED_BY,
    Diagnosis,
    SolveRequest,
    SolveResult,
    request_margin,
    searched_knobs,
)
from rlplan.planner.steptime import Lengths, StepTime, predict_step_time, workload_lengths
from rlplan.planner.steptime.bands import phase_band

GIB = 2**30


def gib(value: float) -> float:
    return round(value / GIB, 3)


class Finding(Protocol):
    """A line of the violations table: a rule's violation, or the margin warning."""

    @property
    def rule(self) -> str: ...

    @property
    def message(self) -> str: ...

    @property
    def fix(self) -> str: ...


@frozen(kw_only=True)
class PlanReports:
    """What validate, explain and solve say about one plan, each computed once and read by both the JSON and the
    tables: verl's rules, the memory at the expected lengths and at the maximum, the step time, the batch layout,
    the lengths the step time is priced at, and the margin against the model's error. The rounded figures the
    verdict shows are properties, which the JSON writes too."""

    plan: Plan
    profile: Profile
    rules: RuleReport
    memory: MemoryReport
    memory_at_max_length: MemoryReport
    step: StepTime
    layout: PlanLayout
    lengths: Lengths
    # The longest mean response (at the expected prompt length) at which the plan still fits.
    longest_fitting_response: int
    margin: MarginReport
    # When not even one-token responses fit at that prompt length: the longest mean (prompt, response), shrunk
    # together, that fits ((0, 0): none); None when longest_fitting_response > 0.
    longest_fitting_sequence: tuple[int, int] | None = None
    # Each phase's allocated, reserved and resident bytes (memory.allocator_report; none on a CPU platform).
    allocator: tuple[PhaseAllocator, ...] = ()

    @property
    def feasible(self) -> bool:
        return self.memory.fits  # its GPU verdict includes the KV cache holding one max_model_len sequence

    @property
    def expected_prompt_length(self) -> int:
        return self.plan.data.expected_prompt_length or self.plan.data.max_prompt_length

    @property
    def expected_response_length(self) -> int:
        return self.plan.data.expected_response_length or self.plan.data.max_response_length

    @property
    def gpu_peak_gib(self) -> float:
        return gib(self.memory.gpu_peak_bytes)

    @property
    def step_time_s(self) -> float:
        return round(self.step.total_seconds, 3)

    @property
    def warnings(self) -> tuple[Violation | MarginWarning, ...]:
        """The rules' warnings, then the margin's when a plan that fits leaves less than it."""
        below_margin = margin_warning(self.margin, self.feasible)
        return (*self.rules.warnings, *((below_margin,) if below_margin else ()))


def plan_reports(plan: Plan, profile: Profile, headroom: Headroom = DEFAULT_HEADROOM) -> PlanReports:
    memory = predict_memory(plan, profile)
    worst = memory if plan.data.expected_sequence_length == plan.data.max_sequence_length else predict_memory(
        at_max_length(plan), profile)
    longest = longest_expected_response_that_fits(plan, profile)
    return PlanReports(plan=plan, profile=profile, rules=check_plan(plan), memory=memory, memory_at_max_length=worst,
                       step=predict_step_time(plan, memory, profile), layout=plan_layout(plan),
                       lengths=workload_lengths(plan, profile), longest_fitting_response=longest,
                       margin=margin_report(plan, profile, memory, headroom),
                       longest_fitting_sequence=longest_expected_sequence_that_fits(plan, profile) if not longest
                       else None, allocator=allocator_report(plan, profile))


def _components_gib(components: tuple[Component, ...] | list[Component]) -> dict[str, float]:
    return {c.name: gib(c.bytes) for c in components}


def layout_json(plan: Plan, layout: PlanLayout | None = None) -> dict[str, Any]:
    layout = layout or plan_layout(plan)
    roles = {}
    for role in layout.roles:
        roles[role.role] = {
            "sequences_per_gpu": role.sequences_per_gpu,
            "mini_batch_size_per_gpu": role.mini_batch_size_per_gpu,
            "micro_batch_size_per_gpu": role.micro_batch_size_per_gpu,
            "max_token_len_per_gpu": role.max_token_len_per_gpu,
            "tokens_per_micro_batch": role.tokens_per_micro_batch,
            "micro_batches_per_mini": role.micro_batches_per_mini,
            "optimizer_steps_per_step": role.optimizer_steps_per_step,
        }
    parallel = layout.parallel
    return {
        "world_size": parallel.world_size,
        "dp": parallel.dp,
        "ulysses_sequence_parallel_size": parallel.ulysses_sequence_parallel_size,
        "fsdp_shard_size": parallel.fsdp_shard_size,
        "rollout_tensor_parallel_size": parallel.rollout_tensor_parallel_size,
        "rollout_replicas": parallel.rollout_replicas,
        "roles": roles,
    }


def step_time_lengths_json(plan: Plan, profile: Profile, lengths: Lengths | None = None) -> dict[str, Any]:
    lengths = lengths or workload_lengths(plan, profile)
    return {"prompt_mean": round(lengths.prompt_mean, 1), "response_mean": round(lengths.response_mean, 1),
            "response_sigma": lengths.sigma, "response_max": lengths.response_max}


def validation_json(plan: Plan, profile: Profile, headroom: Headroom = DEFAULT_HEADROOM) -> dict[str, Any]:
    """`validate --json` of a plan: rules and memory verdicts, both computed whatever the other says."""
    return reports_json(plan_reports(plan, profile, headroom))


def reports_json(reports: PlanReports) -> dict[str, Any]:
    """The JSON of validate, explain and solve, written from the typed reports."""
    payload = _validation_json(reports)
    payload["stack"] = reports.plan.stack.resolved(reports.plan.rollout.name)  # what the verdicts were computed for
    payload.update(margin_json(reports.margin))
    return payload


def _figures_json(reports: PlanReports, phase: str) -> dict[str, float]:
    """A phase's allocated, reserved and resident GiB (resident is peak_gib, the fit's figure)."""
    row = next((r for r in reports.allocator if r.phase == phase), None)
    if row is None:
        return {}
    return {"allocated_gib": gib(row.allocated), "reserved_gib": gib(row.reserved), "resident_gib": gib(row.resident)}


def _validation_json(reports: PlanReports) -> dict[str, Any]:
    plan, profile, memory, step = reports.plan, reports.profile, reports.memory, reports.step
    binding = memory.binding_constraint
    return {
        "valid": reports.rules.valid,
        "feasible": reports.feasible,
        # `feasible` is the verdict at the expected lengths; these say how far the data may grow.
        "feasible_at_max_length": reports.memory_at_max_length.fits,
        "longest_expected_response_that_fits": reports.longest_fitting_response,
        # Set when not even one-token responses fit at the expected prompt length: the longest mean prompt and
        # response, shrunk together, that fit ({"prompt": 0, "response": 0}: none).
        "longest_expected_sequence_that_fits": None if reports.longest_fitting_sequence is None else dict(
            zip(("prompt", "response"), reports.longest_fitting_sequence, strict=True)),
        "expected_prompt_length": reports.expected_prompt_length,
        "expected_response_length": reports.expected_response_length,
        "max_response_length": plan.data.max_response_length,
        "loss_head": resolved_loss_head(plan),
        "errors": [{"rule": v.rule, "message": v.message, "fix": v.fix, "stage": v.stage,
                    "suggested": v.suggested} for v in reports.rules.errors],
        "warnings": [{"rule": v.rule, "message": v.message, "fix": v.fix} for v in reports.warnings],
        "memory_figures": FIGURES,
        "phases": {
            p.name: {
                "peak_gib": gib(p.peak_bytes),
                **_figures_json(reports, p.name),
                "peak_at": p.peak_at,
                "components": _components_gib(p.components),
                **({"pool": p.pool} if p.pool else {}),
            }
            for p in memory.phases
        },
        "gpu_mem_gib": gib(memory.gpu_capacity_bytes),
        "gpu_peak_gib": reports.gpu_peak_gib,
        "host": {
            "per_node_gib": gib(memory.host.total_bytes),
            "capacity_gib": gib(memory.host_capacity_bytes),
            "components": _components_gib(memory.host.components),
        },
        "rollout": {
            "gpu_memory_utilization": plan.rollout.gpu_memory_utilization,
            "kv_cache_gib": gib(max(memory.kv_cache_bytes, 0)),
            "kv_cache_tokens": memory.kv_cache_tokens,
            "max_concurrent_sequences": memory.max_concurrent_sequences,
            "holds_max_model_len": memory.rollout.holds_max_model_len,
            # vLLM V1 from 0.9.1 refuses to start below util x GPU free (null: the stack's engine does not check).
            "free_at_start_gib": (None if memory.rollout.free_at_start_bytes is None
                                  else gib(memory.rollout.free_at_start_bytes)),
            "starts": memory.rollout.starts,
        },
        "binding": {
            # GPU (or host) memory the binding phase leaves free; negative: over by that much.
            "resource": binding.resource, "where": binding.where, "component": binding.component,
            "free_gib": gib(binding.headroom_bytes),
        },
        "step_time_s": reports.step_time_s,
        "phase_seconds": {k: round(v, 3) for k, v in step.phase_seconds.items()},
        # Each phase's (and the step's) out-of-sample error band (planner/steptime/bands.py, accuracy.md 5a).
        "phase_seconds_band": {**{k: phase_band(plan, k).to_json() for k, v in step.phase_seconds.items() if v},
                               "step": phase_band(plan, "step").to_json()},
        # The lengths the step time is priced at (planner/steptime.py; docs/steptime.md has its error).
        "step_time_lengths": step_time_lengths_json(plan, profile, reports.lengths),
        "layout": layout_json(plan, reports.layout),
        "notes": list(memory.notes),
        "profile": profile.name,
    }


# --- rich rendering --------------------------------------------------------------


def length_verdict(reports: PlanReports) -> str:
    """How the verdict depends on the response lengths the data has (empty when it does not)."""
    longest, maximum = reports.longest_fitting_response, reports.plan.data.max_response_length
    if reports.memory_at_max_length.fits or longest >= maximum:
        return ""
    if longest == 0:
        prompt, response = reports.longest_fitting_sequence or (0, 0)
        if not prompt:
            return " It does not fit at any length, not even one-token prompts and responses."
        return (f" It does not fit at {reports.expected_prompt_length}-token prompts whatever the response length; "
                f"it fits while prompt + response average <= {prompt + response} tokens ({prompt} + {response}, "
                "both shrunk together).")
    return (f" It fits while responses average <= {longest} tokens (at {reports.expected_prompt_length}-token "
            f"prompts); OOM once they reach {maximum}.")


def verdict(reports: PlanReports):
    """The verdict line: invalid, valid but over, or valid and fits (with the peak, host RAM and step time)."""
    from rich.text import Text

    memory = reports.memory
    if not reports.rules.valid:
        return Text(f"INVALID: {len(reports.rules.errors)} rule violation(s); verl would reject this plan.",
                    style="bold red")
    refusal = start_refusal(reports.plan, memory.rollout)
    if refusal:  # the engine dies at its start, before any step: no length helps
        return Text(f"VALID but predicted NOT to start: {refusal}.", style="bold yellow")
    if not reports.feasible:
        binding = memory.binding_constraint
        return Text(
            f"VALID but predicted NOT to fit: {binding.where} ({binding.resource}) is over by "
            f"{-gib(binding.headroom_bytes):.2f} GiB, mostly {binding.component}." + length_verdict(reports),
            style="bold yellow")
    return Text(
        f"VALID and fits: peak {reports.gpu_peak_gib:.2f} of {gib(memory.gpu_capacity_bytes):.2f} GiB per GPU, "
        f"host {gib(memory.host.total_bytes):.1f} of {gib(memory.host_capacity_bytes):.0f} GiB per node; "
        f"step ~{reports.step_time_s:.1f} s." + length_verdict(reports), style="bold green")


def _plain(*texts: str) -> list[Any]:
    from rich.text import Text

    return [Text(shorten(text, 4 * ECHO_LIMIT)) for text in texts]


def violations_table(errors: Sequence[Finding], warnings: Sequence[Finding]):
    from rlplan.planner.tables import FittedTable

    # Plan keys are long single words (actor.ppo_max_token_len_per_gpu): FittedTable keeps each whole, so the fix
    # stays copyable; a row is named by its severity and rule.
    table = FittedTable(title="Rule violations", show_lines=True, title_justify="left", keys=2)
    table.add_column("", no_wrap=True)
    table.add_column("rule", style="bold", overflow="fold", ratio=2)
    table.add_column("what is wrong", overflow="fold", ratio=3)
    table.add_column("smallest fix", overflow="fold", ratio=3)
    # Messages quote plan values: plain Text (not markup), cut short.
    for item in errors:
        table.add_row("[red]error[/]", *_plain(item.rule, item.message, item.fix))
    for item in warnings:
        table.add_row("[yellow]warn[/]", *_plain(item.rule, item.message, item.fix))
    return table


def phase_table(memory: MemoryReport, detailed: bool, allocator: tuple[PhaseAllocator, ...] = ()):
    """Each phase's resident peak (the fit) and, with the allocator report, torch's allocated and reserved."""
    from rlplan.planner.tables import FittedTable

    capacity = gib(memory.gpu_capacity_bytes)
    title = f"GPU memory per phase (GiB of {capacity:.2f})"
    if allocator:
        title += ": resident is what the GPU holds (the fit); allocated and reserved as torch's counters show them"
    table = FittedTable(title=title, title_justify="left")
    table.add_column("phase", style="bold")
    table.add_column("resident" if allocator else "peak", justify="right")
    figures = {row.phase: row for row in allocator}
    if allocator:
        table.add_column("allocated", justify="right")
        table.add_column("reserved", justify="right")
    table.add_column("at")
    table.add_column("components" if detailed else "largest component")
    for phase in memory.phases:
        peak = gib(phase.peak_bytes)
        components = sorted(_components_gib(phase.components).items(), key=lambda kv: -kv[1])
        style = "red" if peak > capacity else ""
        if detailed:
            text = ", ".join(f"{k} {v:.2f}" for k, v in components if v >= 0.005)
        else:
            text = f"{components[0][0]} {components[0][1]:.2f}" if components else ""
        counters = [f"{gib(figures[phase.name].allocated):.2f}", f"{gib(figures[phase.name].reserved):.2f}"] \
            if phase.name in figures else ["-", "-"] if allocator else []
        name = f"{phase.name} ({phase.pool} GPUs)" if phase.pool else phase.name
        table.add_row(name, f"[{style}]{peak:.2f}[/]" if style else f"{peak:.2f}", *counters, phase.peak_at, text)
    return table


def component_matrix(memory: MemoryReport):
    """Phases as columns, components as rows: where memory goes in each phase."""
    from rlplan.planner.tables import FittedTable

    phases = {phase.name: _components_gib(phase.components) for phase in memory.phases}
    names: list[str] = []
    for components in phases.values():
        for name in components:
            if name not in names:
                names.append(name)
    table = FittedTable(title="Where memory goes (GiB per GPU)", title_justify="left")
    table.add_column("component", style="bold", overflow="fold")
    for phase in phases:
        table.add_column(phase.replace("_", " "), justify="right", overflow="fold")
    for name in names:
        row = [components.get(name, 0.0) for components in phases.values()]
        if all(v < 0.005 for v in row):
            continue
        table.add_row(name, *[f"{v:.2f}" if v >= 0.005 else "" for v in row])
    peaks = {phase.name: gib(phase.peak_bytes) for phase in memory.phases}
    table.add_row("[bold]peak[/]", *[f"[bold]{peaks[p]:.2f}[/]" for p in phases])
    return table


def host_table(memory: MemoryReport):
    from rlplan.planner.tables import FittedTable

    table = FittedTable(title=f"Host RAM per node (GiB of {gib(memory.host_capacity_bytes):.0f})", title_justify="left")
    table.add_column("component", style="bold")
    table.add_column("GiB", justify="right")
    for name, value in sorted(_components_gib(memory.host.components).items(), key=lambda kv: -kv[1]):
        if value >= 0.005:
            table.add_row(name, f"{value:.2f}")
    table.add_row("[bold]total[/]", f"[bold]{gib(memory.host.total_bytes):.2f}[/]")
    return table


def layout_table(layout: PlanLayout, *, megatron: bool = False):
    from rlplan.planner.tables import FittedTable

    parallel = layout.parallel
    # A Megatron layout's sequence split is its context parallel size; its weights span TP x PP (no FSDP shard).
    trainer = (f"TP x PP {parallel.model_parallel_size}, CP {parallel.ulysses_sequence_parallel_size}" if megatron
               else f"Ulysses {parallel.ulysses_sequence_parallel_size}, FSDP shard {parallel.fsdp_shard_size}")
    table = FittedTable(
        title=(f"Batch layout: {parallel.world_size} GPUs, dp {parallel.dp}, {trainer}, rollout TP "
               f"{parallel.rollout_tensor_parallel_size} x {parallel.rollout_replicas} replicas"),
        title_justify="left")
    # Headers of words apart, so a narrow terminal wraps them between words.
    for column in ("pass", "seqs per GPU", "mini per GPU", "micro per GPU", "token budget", "tokens per micro",
                   "micro per mini", "optim steps"):
        table.add_column(column, justify="right" if column != "pass" else "left", overflow="fold")

    def show(value: Any) -> str:
        return "-" if value is None else str(value)

    # One row per pass, as layout_json keys them (a later pass of the same role would replace an earlier one).
    roles = {role.role: role for role in layout.roles}
    for name, role in roles.items():
        table.add_row(name, show(role.sequences_per_gpu), show(role.mini_batch_size_per_gpu),
                      show(role.micro_batch_size_per_gpu), show(role.max_token_len_per_gpu),
                      show(role.tokens_per_micro_batch), show(role.micro_batches_per_mini),
                      show(role.optimizer_steps_per_step or None))
    return table


def time_table(step: StepTime, lengths: Lengths | None, plan: Plan):
    from rlplan.planner.tables import FittedTable

    at = (f"at mean prompt {round(lengths.prompt_mean, 1):.0f} + response {round(lengths.response_mean, 1):.0f} "
          "tokens" if lengths else "at the expected lengths")
    step_seconds = round(step.total_seconds, 3)
    title = f"Step time estimate {at}: {step_seconds:.2f} s ({phase_band(plan, 'step').text()})"
    caption = ("error band: the model's largest under- and over-prediction of that verl timing key on published "
               "runs left out of its fit (docs/accuracy.md 5a)")
    if step.overlapped:
        caption += ("; the rollout's own GPUs generate the next batch while the trainer trains on this one: the step "
                    "is the longer of generation and training, then the weight sync (shares are of that step)")
    table = FittedTable(title=title, caption=caption, title_justify="left", caption_justify="left")
    table.add_column("phase", style="bold")
    table.add_column("seconds", justify="right")
    table.add_column("share", justify="right")
    table.add_column("error band", justify="right")
    total = step_seconds or 1.0
    for name, seconds in step.phase_seconds.items():
        seconds = round(seconds, 3)
        table.add_row(name, f"{seconds:.2f}", f"{100 * seconds / total:.0f}%",
                      phase_band(plan, name).text() if seconds else "")
    return table


def on(value: bool) -> str:
    """A switch as the tables say it: on or off (never Python's True / False)."""
    return "on" if value else "off"


def _fsdp_rows(plan: Plan) -> list[tuple[str, str]]:
    """The FSDP workers' offload, activation and parallel knobs."""
    actor, model = plan.actor, plan.model
    return [
        ("offload", f"params {on(actor.param_offload)}, optimizer {on(actor.optimizer_offload)}, "
                    f"policy {on(actor.offload_policy)}, ref params {on(plan.ref.param_offload)}"
                    + (f"; critic params {on(plan.critic.param_offload)}, optimizer "
                       f"{on(plan.critic.optimizer_offload)}, policy {on(plan.critic.offload_policy)}"
                       if plan.uses_critic else "")),
        ("activations", f"checkpointing {on(model.gradient_checkpointing)}, offload {on(model.activation_offload)}, "
                        f"remove padding {on(model.use_remove_padding)}"),
        ("parallel", f"Ulysses {actor.ulysses_sequence_parallel_size}, fsdp_size {actor.fsdp_size}"),
    ]


def _megatron_offload(engine: MegatronSection, plan: Plan, role: TrainedRole) -> str:
    """verl's offload of a Megatron role between phases, and the optimizer share Megatron's CPU optimizer keeps
    on the host through the update (override_optimizer_config.optimizer_cpu_offload)."""
    grads = "unset" if engine.grad_offload is None else on(engine.grad_offload)
    cpu_share = cpu_optimizer_fraction(plan, role)
    return (f"params {on(engine.param_offload)}, grads {grads}, optimizer {on(engine.optimizer_offload)}"
            + (f" (CPU optimizer {100 * cpu_share:g}%)" if cpu_share else ""))


def _megatron_recompute(engine: MegatronSection) -> str:
    if engine.recompute_granularity is None:
        return "recompute off"
    if engine.recompute_granularity == "selective":
        return f"recompute selective ({', '.join(engine.recompute_modules)})"
    return f"recompute full, {engine.recompute_method}, {engine.recompute_num_layers} layer(s)"


def _megatron_rows(plan: Plan) -> list[tuple[str, str]]:
    """A Megatron plan's own offload, recompute and parallel knobs (its FSDP fields are unused: rule
    fsdp_knobs_on_a_megatron_plan)."""
    engine, ref = plan.engine("actor"), plan.engine("ref")
    offload = f"{_megatron_offload(engine, plan, 'actor')}; ref params {on(ref.param_offload)}"
    if plan.uses_critic:
        offload += f"; critic {_megatron_offload(plan.engine('critic'), plan, 'critic')}"
    vpp = engine.virtual_pipeline_model_parallel_size
    return [
        ("offload", offload),
        ("activations", f"{_megatron_recompute(engine)}, remove padding {on(plan.model.use_remove_padding)}"),
        ("parallel", f"TP {engine.tensor_model_parallel_size}, PP {engine.pipeline_model_parallel_size}"
                     + (f", VPP {vpp}" if vpp else "") + f", CP {engine.context_parallel_size}, "
                     f"EP {engine.expert_model_parallel_size}, ETP {engine.expert_tensor_size}, "
                     f"sequence parallel {on(engine.sequence_parallel and engine.tensor_model_parallel_size > 1)}, "
                     f"distributed optimizer {on(engine.use_distributed_optimizer)}"),
    ]


def knobs_table(plan: Plan):
    from rlplan.planner.tables import FittedTable

    actor, rollout, model = plan.actor, plan.rollout, plan.model
    rows = [
        ("model", f"{model.name} ({model.arch.total_params / 1e9:.2f}B params, {model.arch.family})"),
        ("cluster", f"{plan.cluster.nodes} x {plan.cluster.gpus_per_node} {plan.cluster.gpu.name} "
                    f"({plan.cluster.gpu.memory_gib:g} GiB), host {plan.cluster.host_memory_gib:g} GiB/node"
                    + (f"; the rollout on {rollout.pool.nodes} x {rollout.pool.gpus_per_node} of its own"
                       if rollout.pool else "")),
        ("workload", f"{plan.algorithm.name}: {plan.data.train_batch_size} prompts x n {rollout.n}, "
                     f"prompt {plan.data.max_prompt_length} + response {plan.data.max_response_length} tokens, "
                     f"mini batch {actor.ppo_mini_batch_size} prompts"),
        ("LoRA", f"rank {model.lora.rank}, alpha {model.lora.alpha}" if model.lora.enabled else "off (full fine-tuning)"),
        *(_megatron_rows(plan) if plan.is_megatron else _fsdp_rows(plan)),
        ("micro batches", f"dynamic bsz, {actor.ppo_max_token_len_per_gpu} tokens/GPU (update), "
                          f"{rollout.log_prob_max_token_len_per_gpu} (log-prob)" if actor.use_dynamic_bsz
         else f"{actor.ppo_micro_batch_size_per_gpu} per GPU"),
        ("rollout", f"{ENGINE_TITLES[rollout.name]} TP {rollout.tensor_model_parallel_size}, "
                    f"util {rollout.gpu_memory_utilization:.2f}, "
                    f"max_num_seqs {rollout.max_num_seqs}, max_num_batched_tokens {rollout.max_num_batched_tokens}, "
                    f"max_model_len {rollout.max_model_len}, sleep level {rollout.sleep_level}, "
                    f"multi-stage wake {on(rollout.multi_stage_wake_up)}, "
                    f"load_format {rollout.load_format}, layered_summon {on(rollout.layered_summon)}"),
        ("stack", plan.stack.describe(rollout.name)),
    ]
    table = FittedTable(title="Plan", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for key, value in rows:
        table.add_row(key, *_plain(value))  # names and paths from the plan are text, never markup
    return table


def fit_fix(plan: Plan, profile: Profile, plan_path: str) -> str:
    """The fix `validate` prints for a valid plan predicted not to fit."""
    from rlplan.planner.solver import largest_fitting_token_budget

    resolve = f"run `rlplan solve --from {plan_path} -o {plan_path}`"
    engine = rollout_budget(plan, profile)
    if not engine.starts:  # no token budget helps an engine that dies at its start
        lower = largest_starting_utilization(engine, plan.cluster.gpu_memory_bytes)
        first = (f"set rollout.gpu_memory_utilization <= {lower:.2f} (vLLM refuses to start above it) or offload the "
                 "trainer's state before the engine starts, then validate again; or " if lower else
                 "offload the trainer's state before the engine starts; or ")
        return f"{first}{resolve} to re-solve every knob"
    budget = largest_fitting_token_budget(plan, profile)
    if budget is not None:
        key, value = budget
        return f"set {key} <= {value} (the largest token budget at which it fits), or {resolve} to re-solve every knob"
    return f"{resolve}: it keeps the workload and re-solves every knob (no single token budget makes it fit)"


def _violations(reports: PlanReports) -> list[Any]:
    """The violations table, when a rule or the margin has something to say."""
    errors, warnings = reports.rules.errors, reports.warnings
    return [violations_table(errors, warnings)] if errors or warnings else []


def validation_tables(reports: PlanReports, fix: str | None = None) -> list[Any]:
    """validate's tables: the verdict and the margin, the fix of a plan that does not fit, the violations (the
    margin warning among them) and the memory per phase."""
    from rich.text import Text

    out: list[Any] = [verdict(reports), Text(margin_summary(reports.margin))]
    if fix:
        out.append(Text(f"Fix: {fix}", style="bold"))
    out.extend(_violations(reports))
    out.append(phase_table(reports.memory, detailed=False, allocator=reports.allocator))
    return out


def _linear_attention_state_note(plan: Plan) -> str:
    """A hybrid model's pool also holds each running sequence's linear-attention state (memory/rollout.py)."""
    if not plan.model.arch.linear_attention_layers:
        return ""
    from rlplan.planner.memory.rollout import rollout_budget

    budget = rollout_budget(plan)
    return (f", each also holding {budget.state_bytes_per_sequence / 2**20:.1f} MiB of linear-attention state "
            f"({budget.state_tokens_per_sequence} tokens of the pool, in {budget.block_size}-token blocks)")


def explain_tables(reports: PlanReports) -> list[Any]:
    plan, memory = reports.plan, reports.memory
    out: list[Any] = [knobs_table(plan), layout_table(reports.layout, megatron=plan.is_megatron),
                      component_matrix(memory), host_table(memory),
                      time_table(reports.step, reports.lengths, reports.plan)]
    from rich.text import Text

    out.append(Text(
        f"KV cache per rank: {gib(max(memory.kv_cache_bytes, 0)):.2f} GiB = {memory.kv_cache_tokens} tokens, "
        f"{memory.max_concurrent_sequences} full-length sequences at once (util "
        f"{plan.rollout.gpu_memory_utilization:.2f}){_linear_attention_state_note(plan)}."))
    batches = ("micro batches filled to their token budgets (dynamic batch size)" if plan.actor.use_dynamic_bsz
               else "fixed micro batches")
    out.append(Text(
        f"Loss head priced: {resolved_loss_head(plan)}; {batches} at {reports.expected_prompt_length} prompt + "
        f"{reports.expected_response_length} response tokens per sequence on average "
        f"(max {plan.data.max_prompt_length} + {plan.data.max_response_length})."))
    for note in memory.notes:
        out.append(Text(f"note: {note}", style="dim"))
    out.extend(_violations(reports))
    out.append(verdict(reports))
    out.append(Text(margin_text(reports.margin)))
    return out


def solve_summary(plan: Plan, result: SolveResult, output: str | None, profile: Profile,
                  headroom: Headroom = DEFAULT_HEADROOM, host_assumption: str | None = None) -> list[Any]:
    from rich.text import Text

    prediction = plan.prediction
    assert prediction is not None
    out: list[Any] = [knobs_table(plan)]
    reports = plan_reports(plan, profile, headroom)
    out.append(phase_table(reports.memory, detailed=False, allocator=reports.allocator))
    out.append(time_table(reports.step, reports.lengths, reports.plan))
    where = f"written to {output}" if output else "not written"
    out.append(Text(
        f"Solved: {result.feasible} feasible of {result.evaluated} candidates evaluated; plan {where}. "
        f"Peak {prediction.gpu_peak_gib:.2f} GiB per GPU, step ~{prediction.step_time_s:.1f} s.", style="bold green"))
    out.append(Text(margin_summary(reports.margin)))
    note = host_note(plan, reports.memory, host_assumption)
    if note:
        out.append(Text(note, style="yellow" if "offloads" in note else ""))
    if not plan.data.train_files:
        out.append(Text("note: data.train_files is empty, so a rendered verl script would train on "
                        "data.train_files=[]: pass --train-files PATH[,PATH] (and --val-files).", style="yellow"))
    return out


@frozen(kw_only=True)
class TopCandidate:
    """One row of `solve --top`: a candidate's step, its peak per phase, its searched knobs and what it leaves."""

    rank: int
    step_time_s: float
    gpu_peak_gib: float
    phase_peak_gib: dict[str, float]
    knobs: dict[str, Any]
    phase_seconds: dict[str, float]
    # Each phase's out-of-sample step-time error band (steptime/bands.py: under, over, runs), and the step's.
    phase_seconds_band: dict[str, dict[str, float | int]]
    # GPU memory the candidate leaves free, and the margin every candidate keeps (the same for all).
    left_gib: float
    headroom_gib: float

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self, recurse=False)


@frozen(kw_only=True)
class VerifiedCandidate:
    """One row of `solve --verify`: a candidate's training step as the CPU tracker measured it against the
    prediction, and whether its phase fits the GPU with the measured step in place of the predicted one."""

    rank: int
    predicted_step_gib: float
    measured_step_gib: float
    # (predicted - measured) / measured, as `rlplan measure` reports it.
    error: float
    measured_phase_peak_gib: float
    fits: bool

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self, recurse=False)


def top_candidates(result: SolveResult, request: SolveRequest, top: int) -> list[TopCandidate]:
    """The `top` best candidates, best first (none when nothing fits)."""
    ranked = [result.best, *result.runners_up][:top] if result.best is not None else []
    if not ranked:
        return []
    margin_gib = round(request_margin(request).gib, 3)
    rows = []
    for rank, candidate in enumerate(ranked, start=1):
        assert candidate is not None
        prediction = candidate.plan.prediction
        assert prediction is not None
        rows.append(TopCandidate(
            rank=rank, step_time_s=prediction.step_time_s, gpu_peak_gib=prediction.gpu_peak_gib,
            phase_peak_gib=prediction.phase_peak_gib, knobs=searched_knobs(candidate.plan),
            phase_seconds=prediction.phase_seconds,
            phase_seconds_band={**{name: phase_band(candidate.plan, name).to_json()
                                   for name, value in prediction.phase_seconds.items() if value},
                                "step": phase_band(candidate.plan, "step").to_json()},
            left_gib=round(request.cluster.gpu.memory_gib - prediction.gpu_peak_gib, 3), headroom_gib=margin_gib))
    return rows


def infeasible_json(result: SolveResult, margin: Margin, host_assumption: str | None) -> dict[str, Any]:
    """`solve --json` when nothing fits: what binds, and the changes that fit, each re-solved."""
    diagnosis = result.diagnosis
    assert diagnosis is not None
    return {
        "feasible": False, "binding": diagnosis.binding, "message": diagnosis.message,
        "suggestions": [{"change": s.change, "detail": s.detail, "step_time_s": s.step_time_s,
                         "gpus": s.gpus, "more_gpus": s.more_gpus, "kind": s.kind, "tokens_kept": s.tokens_kept}
                        for s in diagnosis.suggestions],
        "ranked_by": {kind: RANKED_BY[kind] for kind in dict.fromkeys(s.kind for s in diagnosis.suggestions)},
        "evaluated": result.evaluated, "headroom_gib": round(margin.gib, 3),
        "host_memory_assumed": host_assumption,
    }


def infeasible_lines(diagnosis: Diagnosis, cluster: Cluster) -> list[str]:
    """`solve` when nothing fits, as text: what binds, then the changes that fit in their groups (other hardware,
    the run changed on this hardware, a smaller margin), each group saying how it is ranked (solver.RANKED_BY)."""
    groups = {"hardware": f"The run as asked on other hardware, {RANKED_BY['hardware']}:",
              "workload": f"On {cluster.world_size} x {cluster.gpu.name} with the run changed, {RANKED_BY['workload']}:",
              "margin": f"Or the run and the hardware as asked with a smaller margin, {RANKED_BY['margin']}:"}
    if not any(s.kind in groups for s in diagnosis.suggestions):
        return [diagnosis.message]
    lines = [f"Nothing fits: {diagnosis.binding}.", "Changes that fit, each re-solved:"]
    for kind, title in groups.items():
        shown = [s for s in diagnosis.suggestions if s.kind == kind]
        if shown:
            lines.append(f"  {title}")
        for s in shown:
            kept = f"; {100 * s.tokens_kept:.0f} % of the run's tokens per step" if kind == "workload" else ""
            lines.append(f"    {s.change}   {s.detail}{kept}; ~{s.step_time_s:g} s per step")
    return lines


def solved_json(plan: Plan, result: SolveResult, request: SolveRequest, *, output: str | None,
                top: list[TopCandidate] | None, cluster_notes: tuple[str, str | None],
                verification: list[VerifiedCandidate] | None) -> dict[str, Any]:
    """`solve --json`: validate's JSON of the plan, its knobs (without the architecture, an input), the search's
    counts, and what --top, a CPU plan, the host RAM assumption and --verify add."""
    from rlplan.planner.planfile import plan_to_dict

    cpu_note, host_assumption = cluster_notes
    payload = validation_json(plan, request.profile, request.headroom)
    knobs = plan_to_dict(plan)
    knobs["model"].pop("arch", None)  # the architecture is an input, not a knob; --json stays readable
    knobs.pop("prediction", None)
    payload.update({"plan_file": output, "evaluated": result.evaluated, "feasible_candidates": result.feasible,
                    "plan": knobs})
    if top:
        payload["top"] = [row.to_json() for row in top]
    if cpu_note:
        payload["cpu_rates"] = cpu_note
    payload["host_memory_assumed"] = host_assumption
    if verification is not None:
        payload["verification"] = [row.to_json() for row in verification]
    return payload


def top_candidates_table(rows: list[TopCandidate]):
    """`solve --top N`: each candidate's knobs, peak GiB per phase, step time and its phases, best first.

    The phase seconds are the step-time model's at the plan's expected lengths (planner/steptime.py).

    The best shows every searched knob; the others only where they differ from it, so the
    trade-off each one makes is readable at a glance.
    """
    from rlplan.planner.tables import FittedTable

    def shown(value: Any) -> str:
        return str(value).lower() if isinstance(value, bool) else str(value)

    margin = f"; every one leaves at least the {rows[0].headroom_gib:.2f} GiB margin" if rows else ""
    table = FittedTable(title=f"The {len(rows)} best candidates (seconds per phase at the expected lengths){margin}",
                  title_justify="left")
    table.add_column("#")
    table.add_column("step s", justify="right")
    table.add_column("free GiB", justify="right")
    table.add_column("s per phase (error band out of sample)", overflow="fold")
    table.add_column("peak GiB per phase", overflow="fold")
    table.add_column("knobs (after #1: what differs)", overflow="fold")
    best = rows[0].knobs if rows else {}
    for row in rows:
        phases = "\n".join(f"{name} {peak:.1f}" for name, peak in row.phase_peak_gib.items())
        knobs = "\n".join(f"{key} = {shown(value)}" for key, value in row.knobs.items()
                          if value is not None and (row.rank == 1 or best.get(key) != value))
        seconds = "\n".join(f"{name} {value:.1f}{_band_text(row.phase_seconds_band.get(name))}"
                            for name, value in row.phase_seconds.items() if value)
        step = f"{row.step_time_s:.1f}{_band_text(row.phase_seconds_band.get('step'))}"
        table.add_row(str(row.rank), step, f"{row.left_gib:.2f}", seconds, phases,
                      knobs or "(same knobs)")
    return table


def _band_text(band: dict[str, float | int] | None) -> str:
    """A phase's step-time band as `solve --top` prints it beside the seconds (docs/accuracy.md 5a)."""
    if not band:
        return ""
    return f" (-{100 * band['under']:.0f}/+{100 * band['over']:.0f} %)"


def presets_json(kind: str) -> dict[str, Any]:
    from rlplan.planner.presets import gpu_presets, model_presets

    if kind == "gpus":
        from rlplan.planner.presets import typical_host_memory

        return {name: {"memory_gib": g.memory_gib, "bf16_tflops": g.bf16_tflops, "hbm_gbps": g.hbm_gbps,
                       "pcie_gbps": g.pcie_gbps, "intranode_gbps": g.intranode_gbps,
                       "host_memory_gib_per_gpu": typical_host_memory(g, 1).gib,
                       "host_memory_source": typical_host_memory(g, 1).source.removesuffix(", scaled to 1 GPU")}
                for name, g in gpu_presets().items()}
    return {name: {"params_b": round(p.arch.total_params / 1e9, 3),
                   "active_params_b": round(p.arch.active_params / 1e9, 3),
                   "family": p.arch.family, "repo_ids": list(p.repo_ids)}
            for name, p in model_presets().items()}


def preset_table(kind: str):
    from rlplan.planner.tables import FittedTable

    data = presets_json(kind)
    if kind == "gpus":
        table = FittedTable(title="GPU presets (--gpu)", title_justify="left")
        for column in ("name", "memory GiB", "bf16 TFLOP/s", "HBM GB/s", "PCIe GB/s", "intra-node GB/s",
                       "host GiB/GPU"):
            table.add_column(column, justify="left" if column == "name" else "right")
        for name, g in data.items():
            table.add_row(name, f"{g['memory_gib']:g}", f"{g['bf16_tflops']:g}", f"{g['hbm_gbps']:g}",
                          f"{g['pcie_gbps']:g}", f"{g['intranode_gbps']:g}", f"{g['host_memory_gib_per_gpu']:g}")
        return table
    table = FittedTable(title="Model presets (--model takes the name or any listed repo id)", title_justify="left")
    for column in ("name", "family", "params B", "active B", "repo ids"):
        table.add_column(column, justify="right" if "B" in column else "left")
    for name, p in data.items():
        active = f"{p['active_params_b']:.2f}" if p["active_params_b"] != p["params_b"] else ""
        table.add_row(name, p["family"], f"{p['params_b']:.2f}", active, ", ".join(p["repo_ids"][:3])
                      + (f" (+{len(p['repo_ids']) - 3})" if len(p["repo_ids"]) > 3 else ""))
    return table

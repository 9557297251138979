"""`rlplan measure`: a plan's training step measured on the CPU beside the planner's prediction of it.

The plan's actor step (its layout's per-GPU micro batch, its sharding and loss head) becomes a
`TrainingStep` that runtime/measured_step.py runs under runtime/emulation.py's fake tensors and tracker;
the planner prices the same plan, with the head measured, and the two are compared per component group.

Imports no torch at module level: runtime.metrics and the planner's CPU tests read `with_runtime_head`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast, get_args

import attrs
from attrs import frozen

from rlplan.planner.errors import PlanError
from rlplan.planner.phases import Phase
from rlplan.planner.plan import LossHead, Plan
from rlplan.runtime.measured_step import GROUPS, MEASURED_PHASES, MeasuredStep, TrainingStep, run_measurement

if TYPE_CHECKING:
    from rich.console import Console

    from rlplan.planner.profile import Profile

# The words of `rlplan measure --phase` (and its JSON's "phase") for the phases it measures.
PHASE_FLAGS: dict[Phase, str] = {Phase.ACTOR_UPDATE: "update", Phase.OLD_LOG_PROB: "logprob"}
PHASE_OF_FLAG: dict[str, Phase] = {flag: phase for phase, flag in PHASE_FLAGS.items()}

# The planner's step-scope component names (planner/memory.py) -> the same groups.
_GROUP_OF_PLANNER_COMPONENT = {
    "optimizer_step_temporaries": "optimizer",
    "fsdp_all_gather_buffers": "fsdp_buffers",
    "fsdp_reduce_scatter_buffer": "fsdp_buffers",
    "embedding_reduce_scatter_buffer": "fsdp_buffers",
    "root_group_unsharded": "fsdp_buffers",
    "activations": "activations",
    "layer_backward_workspace": "activations",
    "loss_head_hidden": "activations",
    "logits_head": "activations",
    "forward_transients": "activations",
}

def planner_component_group(name: str) -> str:
    for suffix, group in (("_params", "params"), ("_grads", "grads"), ("_optimizer_state", "optimizer")):
        if name.endswith(suffix):
            return group
    return _GROUP_OF_PLANNER_COMPONENT.get(name, "other")


# --- a plan's step, measured beside its prediction ----------------------------------


@frozen(kw_only=True)
class MeasuredVsPredicted:
    """One plan phase: the tracker's peak next to the planner's step-scope prediction."""

    phase: Phase
    measured: MeasuredStep
    predicted_bytes: int
    predicted_components: dict[str, int]
    predicted_peak_at: str

    @property
    def planner_phase(self) -> Phase:
        """The planner phase the measurement is compared with: the measured phase itself."""
        return self.phase

    @property
    def error(self) -> float:
        """(predicted - measured) / measured: negative is an under-prediction, an OOM risk."""
        return (self.predicted_bytes - self.measured.peak_bytes) / self.measured.peak_bytes

    def to_dict(self) -> dict[str, Any]:
        step = self.measured.step
        return {
            "phase": PHASE_FLAGS[self.phase],
            "planner_phase": str(self.phase),
            "model_family": step.arch.family,
            "shard_size": step.shard_size,
            "tokens_per_micro_batch": step.tokens_per_micro_batch,
            "micro_batches": step.micro_batches,
            "gradient_checkpointing": step.gradient_checkpointing,
            "lora_rank": step.lora_rank,
            "loss_head": step.loss_head,
            "entropy": step.entropy_variant if step.calculate_entropy else None,
            "measured_bytes": self.measured.peak_bytes,
            "predicted_bytes": self.predicted_bytes,
            "error": self.error,
            "measured_peak_at": attrs.asdict(self.measured.location),
            "predicted_peak_at": self.predicted_peak_at,
            "measured_components": self.measured.components,
            "predicted_components": self.predicted_components,
            "tracker_categories": self.measured.tracker_bytes,
            "seconds": self.measured.seconds,
        }


def training_step_of_plan(plan: Plan, phase: Phase) -> TrainingStep:
    """The step a plan's actor runs in one phase, with the layout's per-GPU numbers and its loss head
    (planner.memory.heads.resolved_loss_head; see plan_as_measured for the head of `rlplan measure`)."""
    from rlplan.planner.layout import plan_layout
    from rlplan.planner.memory.heads import entropy_variant, resolved_loss_head

    if phase not in MEASURED_PHASES:
        raise PlanError(field="--phase", message=f"cannot measure the {str(phase)!r} phase.",
                        fix=f"use one of {', '.join(MEASURED_PHASES)}")
    updates = phase == Phase.ACTOR_UPDATE
    layout = plan_layout(plan)
    role = layout.actor_update if updates else layout.old_log_prob
    tokens = role.tokens_per_micro_batch
    padded_rows = not plan.model.use_remove_padding and tokens % role.max_sequence_length == 0
    lora = plan.model.lora
    return TrainingStep(
        arch=plan.model.arch,
        shard_size=layout.parallel.fsdp_shard_size,
        tokens_per_micro_batch=tokens,
        phase=phase,
        gradient_checkpointing=plan.model.gradient_checkpointing,
        lora_rank=lora.rank,
        lora_alpha=lora.alpha,
        target_modules=lora.target_modules,
        use_remove_padding=not padded_rows,
        sequence_length=role.max_sequence_length if padded_rows else None,
        # verl's update computes entropy only for a nonzero coefficient; log-prob passes always do.
        calculate_entropy=plan.actor.entropy_coeff != 0 if updates else True,
        loss_head=resolved_loss_head(plan),
        # rlplan's naive head only ever chunked its fp32 entropy; verl's heads take the plan's variant.
        entropy_variant=(("chunked" if plan.actor.entropy_from_logits_with_chunking else "eager")
                         if resolved_loss_head(plan) in ("naive", "chunked", "fused") else entropy_variant(plan)),
        micro_batches=min(2, role.micro_batches_per_mini) if updates else 1,
    )


def with_runtime_head(plan: Plan) -> Plan:
    """The plan priced with the head rlplan's bundled runtime runs: its chunked lean head
    (runtime/algorithms/lean_head.py), whatever verl would run on the plan's GPUs."""
    return plan.evolve(actor=attrs.evolve(plan.actor, loss_head="chunked"))


def plan_as_measured(plan: Plan, head: LossHead | None = None) -> Plan:
    """The plan with the head a measurement runs: the bundled runtime's (None), verl's for the plan
    ("auto") or a named kernel.  A compiled entropy (actor.use_torch_compile, verl's default) runs
    as its twin (runtime.head_twins.compiled_entropy)."""
    return with_runtime_head(plan) if head is None else plan.evolve(actor=attrs.evolve(plan.actor, loss_head=head))


def as_emulated(plan: Plan) -> Plan:
    """The plan priced as this emulation runs it: base_dtype's shards (fp32 for full fine-tuning, a bf16
    frozen base under LoRA)."""
    return plan.evolve(actor=attrs.evolve(plan.actor, model_dtype="bf16" if plan.model.lora.enabled else "fp32"))


def predicted_step(plan: Plan, phase: Phase, profile: Profile | None = None) -> tuple[int, dict[str, int], str]:
    """The planner's step-scope bytes of a phase (what a tracker sees), grouped like the measurement."""
    from rlplan.planner.memory import predict_phase
    from rlplan.planner.profile import DEFAULT_PROFILE

    memory = predict_phase(as_emulated(plan), phase, profile or DEFAULT_PROFILE)
    groups = dict.fromkeys(GROUPS, 0)
    for component in memory.components:
        if component.scope == "step":
            group = planner_component_group(component.name)
            groups[group] = groups.get(group, 0) + component.bytes
    return memory.step_bytes, groups, memory.peak_at


def measure_plan(plan: Plan, phase: Phase = Phase.ACTOR_UPDATE, profile: Profile | None = None,
                 head: LossHead | None = None) -> MeasuredVsPredicted:
    """Measure a plan's actor step on the CPU with a loss head (plan_as_measured) and compare it with
    the planner's prediction for that head."""
    plan = plan_as_measured(plan, head)
    step = training_step_of_plan(plan, phase)
    measured = run_measurement(step)
    predicted, groups, peak_at = predicted_step(plan, phase, profile)
    return MeasuredVsPredicted(phase=phase, measured=measured, predicted_bytes=predicted,
                               predicted_components=groups, predicted_peak_at=peak_at)


def measure_command(plan_path: str, phase: str, json_output: bool, head: str | None = None) -> int:
    """`rlplan measure`: a table of measured vs predicted bytes per component group, or one JSON object;
    `phase` is the --phase word (PHASE_FLAGS)."""
    import json
    import sys

    from rlplan.planner.commands.commands_io import ExitCode, load_plan, make_console, report_error

    try:
        if phase not in PHASE_OF_FLAG:
            raise PlanError(field="--phase", message=f"{phase!r} is not a phase rlplan can measure.",
                            fix=f"pass --phase {' or '.join(PHASE_OF_FLAG)}")
        plan = load_plan(plan_path)
        heads = get_args(LossHead)
        if head is not None and head not in heads:
            raise PlanError(field="--head", message=f"{head!r} is not a loss head rlplan can measure.",
                            fix=f"pass --head runtime or one of {', '.join(heads)}")
        comparison = measure_plan(plan, PHASE_OF_FLAG[phase], head=cast(LossHead, head))
    except PlanError as error:
        return report_error(error, as_json=json_output)
    if json_output:
        sys.stdout.write(json.dumps(comparison.to_dict(), indent=2) + "\n")
        return ExitCode.OK
    _print_comparison(make_console(), comparison)
    return ExitCode.OK


def _print_comparison(console: Console, comparison: MeasuredVsPredicted) -> None:
    from rlplan.planner.tables import FittedTable

    step = comparison.measured.step
    mib = 2**20
    entropy = f", {step.entropy_variant} entropy" if step.calculate_entropy else ""
    table = FittedTable(title=(f"{comparison.planner_phase}: {step.arch.family}, shard {step.shard_size}, "
                         f"{step.tokens_per_micro_batch} tokens/micro batch, {step.loss_head} head{entropy}"))
    table.add_column("component")
    table.add_column("measured MiB", justify="right")
    table.add_column("predicted MiB", justify="right")
    measured = comparison.measured.components
    for group in sorted(set(measured) | set(comparison.predicted_components), key=_group_order):
        table.add_row(group, f"{measured.get(group, 0) / mib:,.0f}",
                      f"{comparison.predicted_components.get(group, 0) / mib:,.0f}")
    table.add_row("[bold]peak[/]", f"[bold]{comparison.measured.peak_bytes / mib:,.0f}[/]",
                  f"[bold]{comparison.predicted_bytes / mib:,.0f}[/]")
    console.print(table)
    console.print(f"error {comparison.error:+.1%} (predicted vs measured; negative = under-predicted)")
    console.print(f"measured peak: {comparison.measured.location.describe()}; "
                  f"predicted peak: {comparison.predicted_peak_at or 'forward'}")
    console.print(f"measured in {comparison.measured.seconds:.0f} s; per-GPU bytes a PyTorch tracker sees, "
                  "without CUDA context, NCCL buffers and allocator fragmentation")


def _group_order(group: str) -> int:
    return GROUPS.index(group) if group in GROUPS else len(GROUPS)


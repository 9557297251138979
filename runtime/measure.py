"""Measure one FSDP2 training step's per-GPU memory on a CPU, without a GPU and without weights.

The recipe is memory-model.md section 3: the plan's real architecture is built on
the meta device, sharded with FSDP2 over a fake process group of the plan's shard
size, materialised as FakeTensors on device ``cpu`` and run under PyTorch's
``FSDPMemTracker``.  Nothing is allocated, yet every tensor the step would create
is counted with its real size; a 7-8B model measures in tens of seconds on a CPU.

Three patches keep the emulation faithful (memory-model.md section 3.3); they are
applied only for the duration of a measurement:

1. DTensor sharding propagation reuses an ambient FakeTensorMode and computes on
   global-shape tensors, which the tracker would count as allocations (the
   optimizer step was overcounted 4-14x).  Propagation is given a fresh mode.
2. transformers treats FakeTensors as "tracing" and, unable to rule out packed
   sequences, builds an S x S attention mask the real run never allocates.
3. ``Module.to()`` fails under FakeTensorMode, so the model (and any LoRA adapter)
   is built on ``meta`` outside it, with the wanted dtype as the default dtype.

torch, transformers and peft are imported inside functions only: this module is
imported by the ``rlplan measure`` command, never by solve or validate.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any, Literal, cast, get_args

import attrs
from attrs import field, frozen

from rlplan.planner.arch import Architecture
from rlplan.planner.errors import PlanError
from rlplan.planner.plan import LossHead, Plan
from rlplan.planner.validators import field_check

Phase = Literal["update", "logprob"]
PHASES: tuple[Phase, ...] = ("update", "logprob")
Stage = Literal["forward", "loss", "backward", "optimizer"]

# HF config classes the tracker recipe is verified on (SDPA attention; Qwen3-MoE experts via grouped_mm,
# whose memory does not depend on the routing fake tensors cannot know).
_CONFIG_CLASSES = {
    "qwen2": "Qwen2Config",
    "llama": "LlamaConfig",
    "mistral": "MistralConfig",
    "qwen3": "Qwen3Config",
    "qwen3_moe": "Qwen3MoeConfig",
}
MEASURABLE_FAMILIES = tuple(_CONFIG_CLASSES)

# The heads a step can be measured with (runtime/head_twins.py): rlplan's runtime heads as they run,
# verl's GPU kernels through their memory twins.
MEASURABLE_HEADS = ("naive", "chunked", "flash_attn_ce", "torch_logprob", "fused")

# FSDPMemTracker categories -> the groups measured and predicted bytes are compared in.
# Temporaries (the loss head's fp32 logits, recomputed layers, foreach AdamW lists) sit with
# the activations: the tracker labels by the phase that allocates, not by what a tensor is.
_GROUP_OF_CATEGORY = {
    "Sharded Param": "params",
    "Buffer": "params",
    "Sharded Grad": "grads",
    "OptState": "optimizer",
    "Unsharded Param": "fsdp_buffers",
    "Unsharded Grad": "fsdp_buffers",
    "All Gather": "fsdp_buffers",
    "Reduce Scatter": "fsdp_buffers",
    "Activation": "activations",
    "Inputs": "activations",
    "Temp": "activations",
}
GROUPS = ("params", "grads", "optimizer", "fsdp_buffers", "activations")

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

# The planner phase each measured phase is compared with.
PLANNER_PHASE = {"update": "actor_update", "logprob": "old_log_prob"}


def planner_component_group(name: str) -> str:
    for suffix, group in (("_params", "params"), ("_grads", "grads"), ("_optimizer_state", "optimizer")):
        if name.endswith(suffix):
            return group
    return _GROUP_OF_PLANNER_COMPONENT.get(name, "other")


_check_positive = field_check("measure", lambda value: not value <= 0, "must be a positive integer, got {value}.",
                              "pass a positive {name}")


@frozen(kw_only=True)
class TrainingStep:
    """What one measured step runs: the model, its sharding, its micro batch and its loss head."""

    arch: Architecture
    shard_size: int = field(validator=_check_positive)
    tokens_per_micro_batch: int = field(validator=_check_positive)
    phase: Phase = "update"
    gradient_checkpointing: bool = True
    lora_rank: int = 0
    lora_alpha: int = 16
    target_modules: tuple[str, ...] = ("all-linear",)
    # Packed rows (verl's remove-padding) or padded rows of `sequence_length` tokens.
    use_remove_padding: bool = True
    sequence_length: int | None = None
    calculate_entropy: bool = False
    # The loss head (MEASURABLE_HEADS) and how verl computes the entropy beside it
    # (head_twins.MEASURABLE_ENTROPY_VARIANTS; the naive head chunks its fp32 entropy for "chunked").
    loss_head: str = "naive"
    entropy_variant: str = "eager"
    # Micro batches per optimizer step; two already show gradients persisting between them.
    micro_batches: int = field(default=1, validator=_check_positive)

    def __attrs_post_init__(self) -> None:
        if self.phase not in PHASES:
            raise PlanError(
                field="phase",
                message=f"unknown phase {self.phase!r}.",
                fix=f"use one of {', '.join(PHASES)}",
            )
        if self.arch.family not in _CONFIG_CLASSES:
            raise PlanError(
                field="model.arch.family",
                message=(
                    f"cannot measure the {self.arch.family!r} family: the CPU tracker recipe is verified "
                    f"only for {', '.join(MEASURABLE_FAMILIES)}."
                ),
                fix="measure a model of a supported family, or rely on the analytic prediction (`rlplan explain`)",
            )
        from rlplan.runtime.head_twins import MEASURABLE_ENTROPY_VARIANTS

        if self.loss_head not in MEASURABLE_HEADS:
            raise PlanError(field="--head", message=f"no memory twin for the loss head {self.loss_head!r}.",
                            fix=f"use one of {', '.join(MEASURABLE_HEADS)}")
        if self.entropy_variant not in MEASURABLE_ENTROPY_VARIANTS:
            raise PlanError(
                field="actor.use_torch_compile",
                message=(f"the {self.entropy_variant!r} entropy cannot be measured: dynamo runs compiled code "
                         "eagerly under the tracker's dispatch mode."),
                fix=f"measure one of {', '.join(MEASURABLE_ENTROPY_VARIANTS)} (set actor.use_torch_compile = false)",
            )
        if self.lora_rank < 0:
            raise PlanError(field="model.lora.rank", message="must be >= 0.", fix="set model.lora.rank to 0 or more")
        if not self.use_remove_padding:
            length = self.sequence_length or self.tokens_per_micro_batch
            if self.tokens_per_micro_batch % length:
                raise PlanError(
                    field="measure.sequence_length",
                    message=(
                        f"padded rows of {length} tokens do not divide the {self.tokens_per_micro_batch} "
                        "tokens of the micro batch."
                    ),
                    fix="pass tokens_per_micro_batch = rows x sequence_length",
                )

    @property
    def input_shape(self) -> tuple[int, int]:
        """(rows, tokens per row) of input_ids: one packed row, or padded rows."""
        if self.use_remove_padding:
            return 1, self.tokens_per_micro_batch
        length = self.sequence_length or self.tokens_per_micro_batch
        return self.tokens_per_micro_batch // length, length


@frozen(kw_only=True)
class PeakLocation:
    """Where in the step the per-GPU peak was reached."""

    stage: Stage
    # Innermost module running at the peak ("" when outside the model, e.g. in the loss head).
    module: str
    iteration: int

    @property
    def place(self) -> str:
        """The module, or what runs outside every module at that stage."""
        if self.module:
            return self.module
        return "the AdamW step" if self.stage == "optimizer" else "the loss head"

    def describe(self) -> str:
        return f"{self.stage} of iteration {self.iteration}, in {self.place}"


@frozen(kw_only=True)
class MeasuredStep:
    """The tracker's per-GPU peak of one step, broken down two ways."""

    step: TrainingStep
    peak_bytes: int
    location: PeakLocation
    # Bytes per FSDPMemTracker category at the peak.
    tracker_bytes: dict[str, int]
    seconds: float

    @property
    def components(self) -> dict[str, int]:
        """The peak's bytes by component group (GROUPS)."""
        totals = dict.fromkeys(GROUPS, 0)
        for category, size in self.tracker_bytes.items():
            group = _GROUP_OF_CATEGORY.get(category, "other")
            totals[group] = totals.get(group, 0) + size
        return totals


def measure_training_step(
    arch: Architecture,
    *,
    shard_size: int,
    tokens_per_micro_batch: int,
    gradient_checkpointing: bool = True,
    lora_rank: int = 0,
    lora_alpha: int = 16,
    target_modules: tuple[str, ...] | str = ("all-linear",),
    use_remove_padding: bool = True,
    sequence_length: int | None = None,
    calculate_entropy: bool = False,
    loss_head: str = "naive",
    entropy_variant: str = "eager",
    phase: Phase = "update",
    micro_batches: int = 1,
    fake: bool = True,
) -> MeasuredStep:
    """Measure one step's per-GPU peak: an update (loss, backward, AdamW) or a forward-only log-prob pass.

    ``fake=False`` runs the same step on real CPU tensors (random weights); it exists to
    check the fake emulation and is only practical for small models.
    """
    if isinstance(target_modules, str):
        target_modules = (target_modules,)
    step = TrainingStep(
        arch=arch,
        shard_size=shard_size,
        tokens_per_micro_batch=tokens_per_micro_batch,
        phase=phase,
        gradient_checkpointing=gradient_checkpointing,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        target_modules=tuple(target_modules),
        use_remove_padding=use_remove_padding,
        sequence_length=sequence_length,
        calculate_entropy=calculate_entropy,
        loss_head=loss_head,
        entropy_variant=entropy_variant,
        micro_batches=micro_batches,
    )
    return run_measurement(step, fake=fake)


def run_measurement(step: TrainingStep, *, fake: bool = True) -> MeasuredStep:
    started = time.perf_counter()
    with fake_process_group(step.shard_size), faithful_emulation(), default_dtype(base_dtype(step)):
        mode = _fake_mode() if fake else None
        model = build_sharded_model(step, mode)
        if step.loss_head == "fused":
            _hidden_states_out_of_lm_head(model)
        optimizer = make_optimizer(model) if step.phase == "update" else None
        tracker = _locating_tracker(model, optimizer)
        with mode if mode is not None else contextlib.nullcontext():
            input_ids, position_ids = make_inputs(step)
            tracker.track_inputs((input_ids, position_ids))
            with tracker:
                # Two iterations, so that the second runs with AdamW's state in place.
                for iteration in range(2):
                    tracker.iteration = iteration
                    if step.phase == "update":
                        update_iteration(model, optimizer, step, input_ids, position_ids, tracker.enter_stage)
                    else:
                        logprob_iteration(model, step, input_ids, position_ids, tracker.enter_stage)
        ((_, peak_snapshot),) = tracker.get_tracker_snapshot("peak").items()
    tracker_bytes = {
        getattr(category, "value", str(category)): int(size)
        for category, size in peak_snapshot.items()
        if category != "Total"
    }
    return MeasuredStep(
        step=step,
        peak_bytes=int(peak_snapshot["Total"]),
        location=tracker.peak_location,
        tracker_bytes=tracker_bytes,
        seconds=time.perf_counter() - started,
    )


# --- a plan's step, measured beside its prediction ----------------------------------


@frozen(kw_only=True)
class MeasuredVsPredicted:
    """One plan phase: the tracker's peak next to the planner's step-scope prediction."""

    phase: Phase
    planner_phase: str
    measured: MeasuredStep
    predicted_bytes: int
    predicted_components: dict[str, int]
    predicted_peak_at: str

    @property
    def error(self) -> float:
        """(predicted - measured) / measured: negative is an under-prediction, an OOM risk."""
        return (self.predicted_bytes - self.measured.peak_bytes) / self.measured.peak_bytes

    def to_dict(self) -> dict[str, Any]:
        step = self.measured.step
        return {
            "phase": self.phase,
            "planner_phase": self.planner_phase,
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
    (planner.memory.resolved_loss_head; see plan_as_measured for the head of `rlplan measure`)."""
    from rlplan.planner.layout import plan_layout
    from rlplan.planner.memory.heads import entropy_variant, resolved_loss_head

    if phase not in PHASES:
        raise PlanError(field="--phase", message=f"unknown phase {phase!r}.", fix=f"use one of {', '.join(PHASES)}")
    layout = plan_layout(plan)
    role = layout.actor_update if phase == "update" else layout.old_log_prob
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
        calculate_entropy=plan.actor.entropy_coeff != 0 if phase == "update" else True,
        loss_head=resolved_loss_head(plan),
        # rlplan's naive head only ever chunked its fp32 entropy; verl's heads take the plan's variant.
        entropy_variant=(("chunked" if plan.actor.entropy_from_logits_with_chunking else "eager")
                         if resolved_loss_head(plan) in ("naive", "chunked", "fused") else entropy_variant(plan)),
        micro_batches=min(2, role.micro_batches_per_mini) if phase == "update" else 1,
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


def predicted_step(plan: Plan, phase: Phase, profile: Any = None) -> tuple[int, dict[str, int], str]:
    """The planner's step-scope bytes of a phase (what a tracker sees), grouped like the measurement."""
    from rlplan.planner.memory import predict_phase
    from rlplan.planner.profile import DEFAULT_PROFILE

    memory = predict_phase(as_emulated(plan), PLANNER_PHASE[phase], profile or DEFAULT_PROFILE)
    groups = dict.fromkeys(GROUPS, 0)
    for component in memory.components:
        if component.scope == "step":
            group = planner_component_group(component.name)
            groups[group] = groups.get(group, 0) + component.bytes
    return memory.step_bytes, groups, memory.peak_at


def measure_plan(plan: Plan, phase: Phase = "update", profile: Any = None,
                 head: LossHead | None = None) -> MeasuredVsPredicted:
    """Measure a plan's actor step on the CPU with a loss head (plan_as_measured) and compare it with
    the planner's prediction for that head."""
    plan = plan_as_measured(plan, head)
    step = training_step_of_plan(plan, phase)
    measured = run_measurement(step)
    predicted, groups, peak_at = predicted_step(plan, phase, profile)
    return MeasuredVsPredicted(phase=phase, planner_phase=PLANNER_PHASE[phase], measured=measured,
                               predicted_bytes=predicted, predicted_components=groups, predicted_peak_at=peak_at)


def measure_command(plan_path: str, phase: str, json_output: bool, head: str | None = None) -> int:
    """`rlplan measure`: a table of measured vs predicted bytes per component group, or one JSON object."""
    import json
    import sys

    from rlplan.planner.commands_io import ExitCode, load_plan, make_console, report_error

    try:
        plan = load_plan(plan_path)
        heads = get_args(LossHead)
        if head is not None and head not in heads:
            raise PlanError(field="--head", message=f"{head!r} is not a loss head rlplan can measure.",
                            fix=f"pass --head runtime or one of {', '.join(heads)}")
        comparison = measure_plan(plan, phase, head=cast(LossHead, head))  # type: ignore[arg-type]
    except PlanError as error:
        return report_error(error, as_json=json_output)
    if json_output:
        sys.stdout.write(json.dumps(comparison.to_dict(), indent=2) + "\n")
        return ExitCode.OK
    _print_comparison(make_console(), comparison)
    return ExitCode.OK


def _print_comparison(console: Any, comparison: MeasuredVsPredicted) -> None:
    from rich.table import Table

    step = comparison.measured.step
    mib = 2**20
    entropy = f", {step.entropy_variant} entropy" if step.calculate_entropy else ""
    table = Table(title=(f"{comparison.planner_phase}: {step.arch.family}, shard {step.shard_size}, "
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


# --- the step ----------------------------------------------------------------


def update_iteration(model: Any, optimizer: Any, step: TrainingStep, input_ids: Any, position_ids: Any,
                     on_stage: Callable[[Stage], None]) -> None:
    """One optimizer step over the step's micro batches; `on_stage` hears where the step is."""
    for _ in range(step.micro_batches):
        on_stage("forward")
        logits = model(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits
        on_stage("loss")
        loss = _policy_loss(logits, input_ids, step, model)
        del logits
        on_stage("backward")
        loss.backward()
        del loss
    on_stage("optimizer")
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def logprob_iteration(model: Any, step: TrainingStep, input_ids: Any, position_ids: Any,
                      on_stage: Callable[[Stage], None]) -> None:
    import torch

    with torch.no_grad():
        on_stage("forward")
        logits = model(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits
        on_stage("loss")
        log_probs, entropy = _head(logits, input_ids, step, model)
        del logits, log_probs, entropy


def _head(outputs: Any, input_ids: Any, step: TrainingStep, model: Any) -> tuple[Any, Any]:
    """Per-token log-probs of the labels (and the entropy) by the step's head (runtime/head_twins.py).

    `outputs` are the model's logits, which verl's logits heads read through verl's in-place division by
    the temperature (head_twins.verl_scaled_logits), or its hidden states for the fused head, which
    applies the lm_head itself."""
    import torch

    from rlplan.runtime.head_twins import fused_log_probs_and_entropy, logits_head, model_output_logits

    labels = torch.roll(input_ids, shifts=-1, dims=-1).flatten()
    if step.loss_head == "fused":
        weight = _causal_lm(model).lm_head.weight
        log_probs, entropy = fused_log_probs_and_entropy(outputs.flatten(0, 1), weight, labels)
        return log_probs, entropy if step.calculate_entropy else None
    return logits_head(step.loss_head, model_output_logits(step.loss_head, outputs), labels,
                       entropy=step.calculate_entropy, entropy_variant=step.entropy_variant)


def _hidden_states_out_of_lm_head(model: Any) -> None:
    """Make the model return its final hidden states: verl's fused kernels apply the lm_head inside the
    loss, chunk by chunk.  FSDP2 still gathers the root group (lm_head included) for the forward."""
    _causal_lm(model).lm_head.forward = lambda hidden_states: hidden_states


def _policy_loss(logits: Any, input_ids: Any, step: TrainingStep, model: Any) -> Any:
    # A PPO-style surrogate: the memory is in the head, not in the few per-token terms after it.
    log_probs, entropy = _head(logits, input_ids, step, model)
    loss = -log_probs.mean()
    if entropy is not None:
        loss = loss - 0.001 * entropy.mean()
    return loss


# --- building the sharded model ----------------------------------------------


def base_dtype(step: TrainingStep) -> Any:
    import torch

    # Full fine-tuning keeps fp32 master weights; a LoRA base is frozen in bf16 (memory-model.md 2.3).
    return torch.bfloat16 if step.lora_rank > 0 else torch.float32


def hf_config(arch: Architecture) -> Any:
    """A transformers config with the Architecture's shapes."""
    import transformers

    config_class = getattr(transformers, _CONFIG_CLASSES[arch.family])
    config = config_class(
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_hidden_layers=arch.num_layers,
        num_attention_heads=arch.num_attention_heads,
        num_key_value_heads=arch.num_kv_heads,
        head_dim=arch.head_dim,
        vocab_size=arch.vocab_size,
        tie_word_embeddings=arch.tie_word_embeddings,
        max_position_embeddings=arch.max_position_embeddings,
    )
    if arch.family == "llama":
        config.attention_bias = arch.qkv_bias
    if arch.is_moe:
        config.moe_intermediate_size = arch.moe_intermediate_size
        config.num_experts = arch.num_experts
        config.num_experts_per_tok = arch.num_experts_per_token
        config.mlp_only_layers = list(range(arch.first_dense_layers))
    config._attn_implementation = "sdpa"
    return config


def build_sharded_model(step: TrainingStep, mode: Any, device: str = "cpu") -> Any:
    """The step's HF model on `device`, FSDP2-sharded over the (fake) process group; fake under `mode`."""
    import torch
    import transformers
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    config = hf_config(step.arch)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    if step.lora_rank > 0:
        model = _with_lora(model, step)
    if step.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mesh = init_device_mesh(device, (step.shard_size,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    with mode if mode is not None else contextlib.nullcontext():
        # verl's wrap: every decoder layer, then an untied input embedding, then the root.
        for layer in _decoder_layers(model):
            fully_shard(layer, mesh=mesh, mp_policy=policy)
        if not step.arch.tie_word_embeddings:
            fully_shard(_causal_lm(model).model.embed_tokens, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        model.to_empty(device=device)
    if mode is None:
        _initialise(model)
    return model


def _causal_lm(model: Any) -> Any:
    """The HF *ForCausalLM under a peft wrapper, or the model itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _decoder_layers(model: Any) -> Any:
    return _causal_lm(model).model.layers


def _with_lora(model: Any, step: TrainingStep) -> Any:
    import peft

    targets: str | list[str] = "all-linear" if step.target_modules == ("all-linear",) else list(step.target_modules)
    lora = peft.LoraConfig(r=step.lora_rank, lora_alpha=step.lora_alpha, target_modules=targets, lora_dropout=0.0)
    # peft keeps adapter weights in fp32 over a bf16 base (autocast_adapter_dtype), as verl trains them.
    return peft.get_peft_model(model, lora)


def _initialise(model: Any) -> None:
    """Random weights for a real (non-fake) run; the values do not change the memory."""
    import torch

    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.02)
        for buffer in model.buffers():
            buffer.fill_(0.01)


def make_optimizer(model: Any) -> Any:
    import torch

    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    # PyTorch picks the foreach implementation for CUDA parameters (verl's default AdamW on a GPU) but the
    # per-tensor loop for CPU ones; the emulation on device cpu must ask for foreach to hold its temporaries.
    return torch.optim.AdamW(trainable, lr=1e-6, weight_decay=0.01, foreach=True)


def make_inputs(step: TrainingStep, device: str = "cpu") -> tuple[Any, Any]:
    import torch

    rows, length = step.input_shape
    input_ids = torch.randint(0, step.arch.vocab_size, (rows, length), device=device)
    position_ids = torch.arange(length, device=device).unsqueeze(0).expand(rows, -1).contiguous()
    return input_ids, position_ids


# --- the tracker ---------------------------------------------------------------


def _locating_tracker(model: Any, optimizer: Any) -> Any:
    """An FSDPMemTracker that also records where in the step its peak was reached."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    class LocatingTracker(FSDPMemTracker):
        def __init__(self, module: Any, optim: Any) -> None:
            super().__init__(module, optim)
            self.stage: Stage = "forward"
            self.iteration = 0
            self.peak_location = PeakLocation(stage="forward", module="", iteration=0)

        def enter_stage(self, stage: Stage) -> None:
            if stage == "forward":
                # The tracker keeps per-module stats for one call of each module; its global peak survives.
                self.reset_mod_stats()
            self.stage = stage

        def _update_peak_stats(self, peak_state: Any) -> None:
            before = dict(self._peak_mem)
            super()._update_peak_stats(peak_state)
            if self._peak_mem != before:
                self.peak_location = PeakLocation(
                    stage=self._current_stage(), module=self._innermost_module(), iteration=self.iteration
                )

        def _current_stage(self) -> Stage:
            if self._in_opt:
                return "optimizer"
            if self._mod_tracker.is_bw:
                return "backward"
            return self.stage

        def _innermost_module(self) -> str:
            active = [name for name in self._mod_tracker.parents if name != "Global"]
            innermost = max(active, key=lambda name: name.count("."), default="")
            # Drop the root's class name (e.g. "FSDPQwen2ForCausalLM.") and peft's wrapper path.
            path = innermost.partition(".")[2]
            return path.removeprefix("base_model.model.")

    return LocatingTracker(model, optimizer)


# --- context managers for the emulation -----------------------------------------


@contextlib.contextmanager
def fake_process_group(world_size: int) -> Iterator[None]:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def faithful_emulation() -> Iterator[None]:
    """Apply workarounds 1 and 2 of memory-model.md 3.3 for the duration of a measurement."""
    import torch.distributed.tensor._sharding_prop as sharding_prop
    import transformers.masking_utils as masking_utils

    saved_detect = sharding_prop.detect_fake_mode
    saved_packed = masking_utils.find_packed_sequence_indices
    sharding_prop.detect_fake_mode = lambda *args, **kwargs: None
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        sharding_prop.detect_fake_mode = saved_detect
        masking_utils.find_packed_sequence_indices = saved_packed


@contextlib.contextmanager
def default_dtype(dtype: Any) -> Iterator[None]:
    import torch

    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


def _fake_mode() -> Any:
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=True)

"""One FSDP2 training step of a model's architecture, measured per GPU on a CPU without a GPU or weights.

The model is the one the runtime trains (runtime/trainer/role_model.py's wrappers and sharding: LoRA,
gradient checkpointing, FSDP2 over every decoder layer, an untied embedding, then the root), built from
the plan's architecture on the meta device instead of loaded, sharded over a fake process group of the
plan's shard size and materialised as FakeTensors on device ``cpu`` (runtime/emulation.py). The step
runs a forward, the loss head (runtime/head_twins.py) and, for an update, the backward and AdamW, twice,
under the tracker. A 7-8B model measures in tens of seconds on a CPU.

torch, transformers and peft are imported inside functions only: this module is imported by the
``rlplan measure`` command, never by solve or validate.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from attrs import field, frozen

from rlplan.planner.arch import Architecture
from rlplan.planner.errors import PlanError
from rlplan.planner.phases import Phase
from rlplan.planner.validators import field_check
from rlplan.runtime.emulation import (
    MeasuredStage,
    PeakLocation,
    default_dtype,
    faithful_emulation,
    fake_mode,
    fake_process_group,
    locating_tracker,
)
from rlplan.runtime.trainer.model import base_model

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import PretrainedConfig

    from rlplan.runtime.trainer.role_model import RoleModelSpec

# The phases a step can be measured in: the actor's update and its forward-only log-prob pass.
MEASURED_PHASES = (Phase.ACTOR_UPDATE, Phase.OLD_LOG_PROB)

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


_check_positive = field_check("measure", lambda value: not value <= 0, "must be a positive integer, got {value}.",
                              "pass a positive {name}")


def _module_names(names: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """LoRA target modules as a tuple: one name ("all-linear") or several."""
    return (names,) if isinstance(names, str) else tuple(names)


@frozen(kw_only=True)
class TrainingStep:
    """What one measured step runs: the model, its sharding, its micro batch and its loss head."""

    arch: Architecture
    shard_size: int = field(validator=_check_positive)
    tokens_per_micro_batch: int = field(validator=_check_positive)
    phase: Phase = Phase.ACTOR_UPDATE
    gradient_checkpointing: bool = True
    lora_rank: int = 0
    lora_alpha: int = 16
    target_modules: tuple[str, ...] = field(default=("all-linear",), converter=_module_names)
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
        if self.phase not in MEASURED_PHASES:
            raise PlanError(
                field="phase",
                message=f"cannot measure the {str(self.phase)!r} phase.",
                fix=f"use one of {', '.join(MEASURED_PHASES)}",
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


def measure_training_step(arch: Architecture, *, fake: bool = True, **settings: Any) -> MeasuredStep:
    """Measure one step's per-GPU peak: an update (loss, backward, AdamW) or a forward-only log-prob pass;
    `settings` are TrainingStep's fields.

    ``fake=False`` runs the same step on real CPU tensors (random weights); it exists to
    check the fake emulation and is only practical for small models.
    """
    return run_measurement(TrainingStep(arch=arch, **settings), fake=fake)


def run_measurement(step: TrainingStep, *, fake: bool = True) -> MeasuredStep:
    started = time.perf_counter()
    with fake_process_group(step.shard_size), faithful_emulation(), default_dtype(base_dtype(step)):
        mode = fake_mode() if fake else None
        model = build_sharded_model(step, mode)
        optimizer = make_optimizer(model, step) if step.phase == Phase.ACTOR_UPDATE else None
        tracker = locating_tracker(model, optimizer)
        with mode if mode is not None else contextlib.nullcontext():
            input_ids, position_ids = make_inputs(step)
            if step.loss_head == "fused":
                _fused_head_in_lm_head(model, input_ids)
            tracker.track_inputs((input_ids, position_ids))
            with tracker:
                # Two iterations, so that the second runs with AdamW's state in place.
                for iteration in range(2):
                    tracker.iteration = iteration
                    if optimizer is not None:
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


# --- the step ----------------------------------------------------------------


def update_iteration(model: nn.Module, optimizer: torch.optim.Optimizer, step: TrainingStep, input_ids: Tensor,
                     position_ids: Tensor, on_stage: Callable[[MeasuredStage], None]) -> None:
    """One optimizer step over the step's micro batches; `on_stage` hears where the step is."""
    for _ in range(step.micro_batches):
        on_stage(MeasuredStage.FORWARD)
        logits = model(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits
        on_stage(MeasuredStage.LOSS)
        loss = _policy_loss(logits, input_ids, step, model)
        del logits
        on_stage(MeasuredStage.BACKWARD)
        loss.backward()
        del loss
    on_stage(MeasuredStage.OPTIMIZER)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def logprob_iteration(model: nn.Module, step: TrainingStep, input_ids: Tensor, position_ids: Tensor,
                      on_stage: Callable[[MeasuredStage], None]) -> None:
    import torch

    with torch.no_grad():
        on_stage(MeasuredStage.FORWARD)
        logits = model(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits
        on_stage(MeasuredStage.LOSS)
        log_probs, entropy = _head(logits, input_ids, step, model)
        del logits, log_probs, entropy


def _head(outputs: Tensor, input_ids: Tensor, step: TrainingStep, model: nn.Module) -> tuple[Tensor, Tensor | None]:
    """Per-token log-probs of the labels (and the entropy) by the step's head (runtime/head_twins.py).

    `outputs` are the model's logits, which verl's logits heads read through verl's in-place division by
    the temperature (head_twins.verl_scaled_logits), or for the fused head the log-probs and entropy its
    lm_head computed inside the forward (_fused_head_in_lm_head)."""
    import torch

    from rlplan.runtime.head_twins import logits_head, model_output_logits

    if step.loss_head == "fused":
        log_probs, entropy = outputs
        return log_probs, entropy if step.calculate_entropy else None
    labels = torch.roll(input_ids, shifts=-1, dims=-1).flatten()
    return logits_head(step.loss_head, model_output_logits(step.loss_head, outputs), labels,
                       entropy=step.calculate_entropy, entropy_variant=step.entropy_variant)


def _fused_head_in_lm_head(model: nn.Module, input_ids: Tensor) -> None:
    """Make the lm_head compute the fused log-probs and entropy of `input_ids`' next tokens from the final
    hidden states, inside the root's forward as verl's fused kernels do (the model's forward is patched
    there): FSDP2 holds the root group gathered while it runs, and its pre-backward gathers it again for
    the head's backward, whatever reshard_after_forward says."""
    import torch

    from rlplan.runtime.head_twins import fused_log_probs_and_entropy

    lm_head = base_model(model).lm_head
    labels = torch.roll(input_ids, shifts=-1, dims=-1).flatten()
    lm_head.forward = lambda hidden_states: fused_log_probs_and_entropy(hidden_states.flatten(0, 1),
                                                                        lm_head.weight, labels)


def _policy_loss(logits: Tensor, input_ids: Tensor, step: TrainingStep, model: nn.Module) -> Tensor:
    # A PPO-style surrogate: the memory is in the head, not in the few per-token terms after it.
    log_probs, entropy = _head(logits, input_ids, step, model)
    loss = -log_probs.mean()
    if entropy is not None:
        loss = loss - 0.001 * entropy.mean()
    return loss


# --- building the sharded model ----------------------------------------------


def base_dtype(step: TrainingStep) -> torch.dtype:
    import torch

    # Full fine-tuning keeps fp32 master weights; a LoRA base is frozen in bf16 (memory-model.md 2.3).
    return torch.bfloat16 if step.lora_rank > 0 else torch.float32


def hf_config(arch: Architecture) -> PretrainedConfig:
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


def measured_role_spec(step: TrainingStep, device: str) -> RoleModelSpec:
    """The actor's RoleModelSpec for the step: what role_model builds for `rlplan run`, with the sharding
    verl's GPU run has (bf16 compute over the shards, foreach AdamW). Its ShardingSpec is the runtime's
    (role_model.sharding_spec), reshard_after_forward included: verl's apply_fsdp2 passes its explicit
    fsdp_config.reshard_after_forward (True) to the root as well, which the installed torch honours
    (stack.ROOT_RESHARDS_AFTER_FORWARD: torch >= 2.8)."""
    from rlplan.planner.layout import ParallelLayout
    from rlplan.planner.plan import LoraConfig
    from rlplan.runtime.trainer.optimization import OptimizerSettings
    from rlplan.runtime.trainer.role_model import RoleModelSpec, sharding_spec

    lora = LoraConfig(rank=step.lora_rank, alpha=step.lora_alpha, target_modules=step.target_modules)
    return RoleModelSpec(
        path="",  # built from the architecture on the meta device, never loaded
        value_head=False,
        init_seed=0,
        ulysses_size=1,
        remove_padding=step.use_remove_padding,
        lora=lora if lora.enabled else None,
        gradient_checkpointing=step.gradient_checkpointing,
        sharding=sharding_spec(ParallelLayout(world_size=step.shard_size, gpus_per_node=step.shard_size), device,
                               param_offload=False, compute_dtype="bfloat16"),
        # PyTorch picks the foreach implementation for CUDA parameters (verl's default AdamW on a GPU) but the
        # per-tensor loop for CPU ones; the emulation on device cpu must ask for foreach to hold its temporaries.
        optimizer=OptimizerSettings(lr=1e-6, weight_decay=0.01, foreach=True),
    )


def build_sharded_model(step: TrainingStep, mode: FakeTensorMode | None, device: str = "cpu") -> nn.Module:
    """The step's HF model on `device`, wrapped and sharded as role_model does for `rlplan run`, over the
    (fake) process group; fake under `mode`, else real with random weights."""
    from rlplan.runtime.trainer.model import device_mesh, hf_model_on_meta
    from rlplan.runtime.trainer.role_model import shard_on_meta, wrap_for_training

    spec = measured_role_spec(step, device)
    model = hf_model_on_meta(hf_config(step.arch))
    model = wrap_for_training(model, lora=spec.lora, gradient_checkpointing=spec.gradient_checkpointing)
    mesh = device_mesh(spec.sharding)
    with mode if mode is not None else contextlib.nullcontext():
        model = shard_on_meta(model, spec.sharding, mesh, device)
    if mode is None:
        _initialise(model)
    return model


def _initialise(model: nn.Module) -> None:
    """Random weights for a real (non-fake) run; the values do not change the memory."""
    import torch

    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.02)
        for buffer in model.buffers():
            buffer.fill_(0.01)


def make_optimizer(model: nn.Module, step: TrainingStep) -> torch.optim.Optimizer:
    from rlplan.runtime.trainer.model import trainable_parameters
    from rlplan.runtime.trainer.optimization import adamw

    return adamw(trainable_parameters(model), measured_role_spec(step, "cpu").optimizer)


def make_inputs(step: TrainingStep, device: str = "cpu") -> tuple[Tensor, Tensor]:
    import torch

    rows, length = step.input_shape
    input_ids = torch.randint(0, step.arch.vocab_size, (rows, length), device=device)
    position_ids = torch.arange(length, device=device).unsqueeze(0).expand(rows, -1).contiguous()
    return input_ids, position_ids

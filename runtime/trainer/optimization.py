"""Optimizer, warmup schedule and one guarded optimizer step, shared by actor and critic."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from attrs import frozen

if TYPE_CHECKING:
    import contextlib
    from collections.abc import Callable

    import torch
    from torch import Tensor, nn
    from torch.optim.lr_scheduler import LRScheduler

    from rlplan.planner.layout import RoleBatchLayout
    from rlplan.runtime.trainer.token_batch import TokenBatch


@frozen(kw_only=True)
class OptimizerSettings:
    lr: float
    weight_decay: float = 0.0
    warmup_steps: int = 0
    grad_clip: float = 1.0
    # Keep Adam moments in host memory between steps (verl's optimizer_offload).
    offload_state: bool = False
    # AdamW's multi-tensor implementation; None lets PyTorch choose (foreach for CUDA parameters, a
    # per-tensor loop for CPU ones). rlplan measure emulates a GPU on device cpu, so it asks for foreach.
    foreach: bool | None = None


@frozen(kw_only=True)
class StepOutcome:
    grad_norm: float
    skipped: bool
    lr: float


def warmup_factor(step: int, warmup_steps: int) -> float:
    """Linear warmup from 1/warmup to 1 over `warmup_steps` optimizer steps, then constant."""
    if warmup_steps <= 0:
        return 1.0
    return min(1.0, (step + 1) / warmup_steps)


def adamw(parameters: list[nn.Parameter], settings: OptimizerSettings) -> torch.optim.Optimizer:
    """The optimizer every trained role steps (and `rlplan measure` emulates)."""
    import torch

    return torch.optim.AdamW(parameters, lr=settings.lr, weight_decay=settings.weight_decay, betas=(0.9, 0.999),
                             foreach=settings.foreach)


def build_optimizer(parameters: list[nn.Parameter], settings: OptimizerSettings) -> tuple[torch.optim.Optimizer, LRScheduler]:
    import torch

    optimizer = adamw(parameters, settings)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda=lambda step: warmup_factor(step, settings.warmup_steps)
    )
    return optimizer, scheduler


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device | str) -> None:
    for state in optimizer.state.values():
        for key, value in state.items():
            if hasattr(value, "to") and getattr(value, "dim", lambda: 0)() > 0:
                state[key] = value.to(device, non_blocking=True)


def guarded_step(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: LRScheduler, settings: OptimizerSettings, device: torch.device | str) -> StepOutcome:
    """Clip, then step unless the gradient norm is not finite (one bad batch must not poison the weights)."""
    import torch

    parameters = [p for p in model.parameters() if p.requires_grad]
    total = torch.nn.utils.clip_grad_norm_(parameters, max_norm=settings.grad_clip if settings.grad_clip > 0 else math.inf)
    if hasattr(total, "full_tensor"):
        total = total.full_tensor()
    grad_norm = float(total.item())
    lr = float(scheduler.get_last_lr()[0])
    if not math.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        return StepOutcome(grad_norm=grad_norm, skipped=True, lr=lr)
    if settings.offload_state:
        move_optimizer_state(optimizer, device)
    optimizer.step()
    if settings.offload_state:
        move_optimizer_state(optimizer, "cpu")
    optimizer.zero_grad(set_to_none=True)
    scheduler.step()
    return StepOutcome(grad_norm=grad_norm, skipped=False, lr=lr)


@frozen(kw_only=True)
class UpdateSummary:
    """What one update pass did, averaged for the step's metrics."""

    # Sum over micro batches of each reported number, and how many micro batches reported.
    totals: dict[str, float]
    micro_batches: int
    grad_norms: tuple[float, ...]
    skipped_steps: int
    lr: float

    def metrics(self, prefix: str, *, summed: tuple[str, ...] = ()) -> dict[str, float]:
        """Means per micro batch, except `summed` keys (micro losses that add up to a mini batch's loss)."""
        steps = max(len(self.grad_norms), 1)
        out = {
            f"{prefix}/{key}": value / (steps if key in summed else max(self.micro_batches, 1))
            for key, value in self.totals.items()
        }
        finite = [g for g in self.grad_norms if math.isfinite(g)]
        out[f"{prefix}/grad_norm"] = sum(finite) / len(finite) if finite else float("nan")
        out[f"{prefix}/skipped_steps"] = float(self.skipped_steps)
        out[f"{prefix}/lr"] = self.lr
        return out


def ppo_update(
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    settings: OptimizerSettings,
    batch: TokenBatch,
    role: RoleBatchLayout,
    loss_agg_mode: str,
    world_size: int,
    device: torch.device | str,
    shuffle: bool,
    generator: torch.Generator,
    micro_loss: Callable[[TokenBatch, float], tuple[Tensor, dict[str, float]]],
    activation_offload: bool = False,
) -> UpdateSummary:
    """epochs x mini batches of optimizer steps; each mini batch's gradient accumulates over micro batches.

    The loss normalizer is the mini batch's global token (or sequence) count, so the gradient is that of
    the whole mini batch however it was cut; gradient sync runs only on the last micro batch.
    """
    from rlplan.runtime.algorithms import loss_normalizer
    from rlplan.runtime.trainer.micro_batches import all_reduce_sum, micro_batch_indices, mini_batch_indices

    model.train()
    totals: dict[str, float] = {}
    micro_count, grad_norms, skipped = 0, [], 0
    for _ in range(role.epochs):
        for mini_rows in mini_batch_indices(len(batch), role.chunk_size, shuffle=shuffle, generator=generator):
            mini = batch.select(mini_rows)
            local = loss_normalizer(mini.response_mask, loss_agg_mode)
            # FSDP averages gradients over all ranks, and the all-reduced count holds each sample once per
            # rank of its Ulysses group (sp x the global count): dividing by the world size turns that
            # average into the mean over the global mini batch, with or without sequence parallelism.
            normalizer = max(all_reduce_sum(local, device), 1.0) / world_size
            groups = micro_batch_indices(mini, role, device)
            for index, rows in enumerate(groups):
                model.set_requires_gradient_sync(index == len(groups) - 1)
                with activation_offload_context(activation_offload):
                    loss, numbers = micro_loss(mini.select(rows), normalizer)
                loss.backward()
                for key, value in numbers.items():
                    totals[key] = totals.get(key, 0.0) + value
                micro_count += 1
            outcome = guarded_step(model, optimizer, scheduler, settings, device)
            grad_norms.append(outcome.grad_norm)
            skipped += int(outcome.skipped)
    return UpdateSummary(
        totals=totals,
        micro_batches=micro_count,
        grad_norms=tuple(grad_norms),
        skipped_steps=skipped,
        lr=float(scheduler.get_last_lr()[0]),
    )


def activation_offload_context(enabled: bool) -> contextlib.AbstractContextManager[object]:
    import contextlib

    import torch

    if enabled:
        return torch.autograd.graph.save_on_cpu(pin_memory=True)
    return contextlib.nullcontext()

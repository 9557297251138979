"""The CPU emulation a measured training step runs under, and the memory tracker that reads it.

The recipe is memory-model.md section 3: a fake process group of the plan's shard size, FakeTensors on
device ``cpu`` and PyTorch's ``FSDPMemTracker``. Nothing is allocated, yet every tensor the step would
create is counted with its real size.

Three patches keep the emulation faithful (memory-model.md section 3.3); they are applied only for the
duration of a measurement:

1. DTensor sharding propagation reuses an ambient FakeTensorMode and computes on global-shape tensors,
   which the tracker would count as allocations (the optimizer step was overcounted 4-14x).  Propagation
   is given a fresh mode (`faithful_emulation`).
2. transformers treats FakeTensors as "tracing" and, unable to rule out packed sequences, builds an S x S
   attention mask the real run never allocates (`faithful_emulation`).
3. ``Module.to()`` fails under FakeTensorMode, so the model (and any LoRA adapter) is built on ``meta``
   outside it, with the wanted dtype as the default dtype (`default_dtype`; runtime.measured_step builds it).

torch and transformers are imported inside functions only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from enum import StrEnum
from typing import TYPE_CHECKING

from attrs import field, frozen

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker


class MeasuredStage(StrEnum):
    """Where inside one measured training step the tracker is (planner/phases.py's glossary)."""

    FORWARD = "forward"
    LOSS = "loss"  # the loss head, outside every module
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"  # the AdamW step


@frozen(kw_only=True)
class PeakLocation:
    """Where in the step the per-GPU peak was reached."""

    stage: MeasuredStage = field(converter=MeasuredStage)
    # Innermost module running at the peak ("" when outside the model, e.g. in the loss head).
    module: str
    iteration: int

    @property
    def place(self) -> str:
        """The module, or what runs outside every module at that stage."""
        if self.module:
            return self.module
        return "the AdamW step" if self.stage == MeasuredStage.OPTIMIZER else "the loss head"

    def describe(self) -> str:
        return f"{self.stage} of iteration {self.iteration}, in {self.place}"


# --- the tracker ---------------------------------------------------------------


def locating_tracker(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> FSDPMemTracker:
    """An FSDPMemTracker that also records where in the step its peak was reached (`peak_location`); the
    step tells it its stage through `enter_stage` and its iteration through `iteration`."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    class LocatingTracker(FSDPMemTracker):
        def __init__(self, module: nn.Module, optim: torch.optim.Optimizer | None) -> None:
            super().__init__(module, optim)
            self.stage = MeasuredStage.FORWARD
            self.iteration = 0
            self.peak_location = PeakLocation(stage=MeasuredStage.FORWARD, module="", iteration=0)

        def enter_stage(self, stage: MeasuredStage) -> None:
            if stage == MeasuredStage.FORWARD:
                # The tracker keeps per-module stats for one call of each module; its global peak survives.
                self.reset_mod_stats()
            self.stage = stage

        def _update_peak_stats(self, peak_state: object) -> None:
            before = dict(self._peak_mem)
            super()._update_peak_stats(peak_state)  # type: ignore[arg-type]
            if self._peak_mem != before:
                self.peak_location = PeakLocation(
                    stage=self._current_stage(), module=self._innermost_module(), iteration=self.iteration
                )

        def _current_stage(self) -> MeasuredStage:
            if self._in_opt:
                return MeasuredStage.OPTIMIZER
            if self._mod_tracker.is_bw:
                return MeasuredStage.BACKWARD
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
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    import torch

    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


def fake_mode() -> FakeTensorMode:
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=True)

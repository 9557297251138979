"""The memory model's result types: components with their scope, a phase's and the host's memory, the limit
that binds, a role's per-rank training state.  Pure values: every other module of the package builds them."""

from __future__ import annotations

import math
from typing import Literal

from attrs import frozen

GIB = 2**30
MIB = 2**20

Scope = Literal["step", "resident", "overhead"]


@frozen
class Component:
    name: str
    bytes: int
    scope: Scope = "step"


@frozen
class PhaseMemory:
    name: str
    components: tuple[Component, ...]
    # Which sub-phase set the peak (training: "loss", "backward" or "optimizer_step").
    peak_at: str = ""
    # The GPUs it runs on where the rollout has a pool of its own (plan.RolloutPool): "trainer" or "rollout";
    # "" colocated (every phase on the same GPUs).
    pool: str = ""

    @property
    def peak_bytes(self) -> int:
        return sum(c.bytes for c in self.components)

    def scope_bytes(self, scope: Scope) -> int:
        return sum(c.bytes for c in self.components if c.scope == scope)

    @property
    def step_bytes(self) -> int:
        """What this phase allocates itself: the total a PyTorch memory tracker reports."""
        return self.scope_bytes("step")

    def bytes_of(self, name: str) -> int:
        return sum(c.bytes for c in self.components if c.name == name)

    @property
    def largest_component(self) -> Component:
        return max(self.components, key=lambda c: c.bytes)


@frozen
class HostMemory:
    """Host RAM one node needs (pinned offload copies, sleeping-engine weights, model files, processes)."""

    components: tuple[Component, ...]

    @property
    def total_bytes(self) -> int:
        return sum(c.bytes for c in self.components)


@frozen
class BindingConstraint:
    """The tightest limit: where, which component dominates there, and the headroom (negative: over by)."""

    resource: Literal["gpu", "host", "kv_cache"]
    where: str
    component: str
    headroom_bytes: int
    capacity_bytes: int

    @property
    def relative_headroom(self) -> float:
        return self.headroom_bytes / self.capacity_bytes if self.capacity_bytes else -math.inf


@frozen
class TrainerState:
    """Bytes per GPU of one role's sharded training state, as a training backend (memory.backend) reports it."""

    params: float
    grads: float
    optimizer: float
    optimizer_step: float
    # fp32 reduce-scatter input of the largest layer's trainable parameters.
    reduce_scatter: float

    def host_copies(self, role: str, ranks: int, *, params: float, grads: float,
                    optimizer: float) -> list[Component]:
        """One node's host RAM for the parts of this state a backend keeps there: each of its `ranks` ranks'
        copy of the share (1 or True: all of it, 0 or False: none) of its params, grads and optimizer state, as
        `<role>_params_offloaded`, `_grads_offloaded`, `_optimizer_offloaded` (the host table's names)."""
        parts = (("params", params, self.params), ("grads", grads, self.grads),
                 ("optimizer", optimizer, self.optimizer))
        return [Component(f"{role}_{part}_offloaded", int(ranks * share * size)) for part, share, size in parts
                if share]


@frozen(kw_only=True)
class AllocationShape:
    """How one role's tensors reach torch's caching allocator under a training backend, for the allocator's replay
    (memory.allocator_trace): how many allocations its state and a pass's saved activations are, and the cache
    flushes its worker makes.  The defaults are FSDP's (per-layer state shards, gradients made at the first
    backward and dropped by zero_grad, saved activations per group of layers)."""

    # The contiguous buffers a role's gradients are (None: per-layer tensors): Megatron-Core's DDP allocates one
    # grad_data per buffer when it wraps the model and zeroes it in place between mini batches.
    grad_buffers: int | None = None
    # The contiguous buffers its weights are (None: per-layer tensors): DDP's param_data, with the distributed
    # optimizer only.
    param_buffers: int | None = None
    # The equal tensors a moment's saved activations are (0: the replay's groups of layers): one per layer and
    # micro batch in flight on a pipeline stage.
    activation_tensors: int = 0
    # Those of the loss head's moment where they differ (0: the same): under a pipeline the most loaded rank's loss
    # moment is the last stage's, which holds one micro batch, its backward's the first stage's in-flight ones.
    activation_tensors_at_loss: int = 0
    # What a logits-sized buffer is split over (the vocabulary-parallel output layer's TP).
    vocab_shards: int = 1
    # The share of the optimizer's state built with the optimizer (the rest, Adam's moments, comes at its first
    # step, torch/optim/adam.py _init_group): 0 where all of it waits for the step.
    optimizer_built_share: float = 0.0
    # The worker empties the cache at the end of each of the role's passes, offloaded or not.
    empties_cache_after_pass: bool = False

    def __attrs_post_init__(self) -> None:
        if (self.vocab_shards < 1 or min(self.activation_tensors, self.activation_tensors_at_loss) < 0
                or not 0 <= self.optimizer_built_share < 1):
            raise ValueError(f"AllocationShape: vocab_shards >= 1, activation_tensors >= 0 and an optimizer share "
                             f"in [0, 1), got {self!r}")
        for buffers in (self.grad_buffers, self.param_buffers):
            if buffers is not None and buffers < 1:
                raise ValueError(f"AllocationShape: a buffer count is at least 1, got {self!r}")


    def activation_tensors_in(self, moment: str) -> int:
        """The equal tensors a moment's saved activations are (0: the replay's groups of layers)."""
        return (self.activation_tensors_at_loss or self.activation_tensors) if moment == "loss" else \
            self.activation_tensors


FSDP_ALLOCATION_SHAPE = AllocationShape()

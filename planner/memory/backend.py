"""The training-backend boundary: what the step's phases need from the trainer, and which trainer a plan runs.

The phases (memory.phases) price a step without knowing how the trainer shards: they ask its backend for a
role's per-rank state (params, grads, optimizer moments; what of it the GPU holds, what sits in host RAM,
what stays resident between phases), the reference's parameters, the components of an update and of a
no_grad forward over a micro batch of N tokens, and the bytes the weight sync gathers.  verl's FSDP and
FSDP2 workers are one backend (memory.fsdp.FsdpBackend), its Megatron workers another
(memory.megatron.MegatronBackend).

A second backend is a module beside memory/fsdp.py with a class that has these methods, and its strategy
in TRAINING_BACKENDS below: no function of memory.phases changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, Protocol

from rlplan.planner.layout import PlanLayout, RoleBatchLayout
from rlplan.planner.memory.fsdp import FSDP
from rlplan.planner.memory.heads import LossHead
from rlplan.planner.memory.megatron import MEGATRON
from rlplan.planner.memory.report import AllocationShape, Component, TrainerState
from rlplan.planner.plan import EngineRole, Plan
from rlplan.planner.profile import Profile

TrainedRole = Literal["actor", "critic"]


class TrainingBackend(Protocol):
    """The trainer of one plan, per rank, as the step's phases price it."""

    def role_state(self, plan: Plan, role: TrainedRole, layout: PlanLayout) -> TrainerState:
        """The role's whole training state on one rank, wherever it lives (GPU or host)."""
        ...

    def state_on_gpu(self, plan: Plan, role: TrainedRole, state: TrainerState) -> TrainerState:
        """The part of `state` the GPU holds while the role trains (an offload policy keeps the rest on the host)."""
        ...

    def resident_between_phases(self, plan: Plan, role: TrainedRole,
                                state_on_gpu: TrainerState) -> list[Component]:
        """What of the role's state stays on the GPU while other phases run ("resident" components named
        `<role>_params` and `<role>_optimizer_state`, the names the phases load back)."""
        ...

    def resident_at_engine_start(self, plan: Plan, role: TrainedRole, state_on_gpu: TrainerState) -> int:
        """What of the role's state is on the GPU when verl builds the rollout engine (after the worker's init
        offloads), which an engine that profiles the whole GPU subtracts from its budget."""
        ...

    def host_components(self, plan: Plan, role: TrainedRole, state: TrainerState, ranks: int) -> list[Component]:
        """The role's state in one node's host RAM, for its `ranks` ranks."""
        ...

    def reference_params_bytes(self, plan: Plan, layout: PlanLayout) -> int:
        """A separate reference model's parameters on one rank."""
        ...

    def reference_params_on_host(self, plan: Plan) -> bool:
        """Whether the reference's parameters live in host RAM, copied to the GPU as its forward runs."""
        ...

    def update_components(self, plan: Plan, role: TrainedRole, state_on_gpu: TrainerState, batch: RoleBatchLayout,
                          head: LossHead | None, profile: Profile) -> tuple[str, list[Component]]:
        """One training step's peak over a micro batch of `batch.tokens_per_micro_batch` tokens: the sub-phase
        that sets it ("loss", "backward", "optimizer_step") and its components.  `head` is the actor's loss
        head (memory.heads.update_loss_head); None for the critic, a value model without an lm_head."""
        ...

    def forward_components(self, plan: Plan, *, params_bytes: float, params_name: str, tokens: int,
                           head_bytes_per_token_vocab: float, entropy: bool = False) -> list[Component]:
        """A no_grad forward over `tokens` tokens with `params_bytes` of parameters on the GPU (0 for no head);
        `entropy`: the pass computes the entropy beside the log-probs (verl's old-log-prob pass)."""
        ...

    def update_moments(self, plan: Plan, role: TrainedRole, state_on_gpu: TrainerState, batch: RoleBatchLayout,
                       head: LossHead | None, profile: Profile) -> list[tuple[str, list[Component]]]:
        """Every moment of the update's micro batch in the order it comes, each with its components
        (update_components' peak is one of them); the allocator's replay walks them all."""
        ...

    def forward_moments(self, plan: Plan, *, tokens: int, head_bytes_per_token_vocab: float,
                        entropy: bool = False) -> list[tuple[str, list[Component]]]:
        """A no_grad forward's moments in their order, each with what it holds beside the parameters."""
        ...

    def allocation_shape(self, plan: Plan, role: EngineRole, batch: RoleBatchLayout | None) -> AllocationShape:
        """How the role's tensors reach torch's caching allocator (`batch`: the pass's, None outside a pass): what
        the allocator's replay (memory.allocator_trace) allocates its state and activations as."""
        ...

    def weight_sync_gather_bytes(self, plan: Plan, bucket_bytes: int) -> int:
        """What the trainer holds on the GPU at once to push its weights into the rollout engine."""
        ...


# plan.actor.strategy -> its backend (a rendered plan's critic runs the actor's strategy).
TRAINING_BACKENDS: Mapping[str, TrainingBackend] = {"fsdp": FSDP, "fsdp2": FSDP, "megatron": MEGATRON}


def training_backend(plan: Plan) -> TrainingBackend:
    return TRAINING_BACKENDS[plan.actor.strategy]

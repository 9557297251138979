"""The search spaces: the `SearchSpace` protocol each training backend's choices implement, and `SEARCH_SPACES`,
the one place a strategy picks its space (beside memory's `TRAINING_BACKENDS` and steptime's `TRAINER_TIMINGS`).

The search loop (search.py) and `solve` (solve.py) reach a backend only through this module: a new backend is a
module beside fsdp.py and megatron.py with a space implementing the protocol, and one entry here
(tests/planner/solver/test_space.py checks that the loop imports no space and that every strategy has one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeVar

from rlplan.planner.knobs import knob_value
from rlplan.planner.phases import PASS_KNOBS
from rlplan.planner.plan import Plan
from rlplan.planner.solver.choices import knob_keys
from rlplan.planner.solver.fsdp import FSDP_SPACE
from rlplan.planner.solver.megatron import MEGATRON_SPACE
from rlplan.planner.solver.request import Candidate, SolveRequest
from rlplan.planner.solver.workload import workload_plan


class Choice(Protocol):
    """What the loop reads of a choice: its LoRA rank (full fine-tuning is tried before LoRA with --lora auto)
    and whether it recomputes activations (skipped where the budgets already reach their caps)."""

    @property
    def lora_rank(self) -> int: ...

    @property
    def gradient_checkpointing(self) -> bool: ...


ChoiceT = TypeVar("ChoiceT", bound=Choice)


class SearchSpace(Protocol[ChoiceT]):
    """One training backend's discrete knobs, as the search loop prices them.

    A choice is a frozen attrs class whose fields are declared with `choices.knob(dotted key)`: the knobs it
    sets are read from it (`searched_knobs`, the `--fix` pins it allows), never listed again.
    """

    # The plan strategies (actor.strategy) a choice of this space makes, and the choice's class.
    strategies: tuple[str, ...]
    choice_type: type[ChoiceT]
    # Whether the loop searches layout by layout (`shape_key`): each layout kept at its first fitting choice,
    # skipped whole where its most saving choice cannot train, its variants tried right after it fits.
    by_layout: bool

    def skeleton(self, plan: Plan) -> Plan:
        """A neutral plan (the workload) made one of this backend, every knob of it at a neutral value."""
        ...

    def choices(self, request: SolveRequest, sequence_len: int, feasibility_only: bool) -> Sequence[ChoiceT]:
        """The choices to price, least memory-saving first, the pins honoured; with `feasibility_only` only those
        that decide whether anything fits."""
        ...

    def apply(self, skeleton: Plan, choice: ChoiceT, request: SolveRequest) -> Plan:
        """The skeleton taking the choice."""
        ...

    def resident_key(self, choice: ChoiceT) -> tuple:
        """What the choice leaves resident between phases, its last entry the sequence split: choices with the
        same key (the split dropped) share the rollout's sizes."""
        ...

    def shape_key(self, choice: ChoiceT) -> tuple:
        """The choice without its memory-saving steps (offload, recompute): its layout."""
        ...

    def most_saving_per_shape(self, choices: Sequence[ChoiceT]) -> list[ChoiceT]:
        """Each layout's most memory-saving choice: if a layout fits at all, that one does."""
        ...

    def base_of_variant(self, choice: ChoiceT) -> ChoiceT | None:
        """The choice this one is a variant of (whose token budgets bound its own), None for a base choice."""
        ...

    def next_variant(self, choice: ChoiceT, request: SolveRequest, fastest: Candidate,
                     best: Candidate) -> ChoiceT | None:
        """After `choice` fits (`fastest`: its fastest candidate, `best`: the best so far): the variant to try
        next, None for none."""
        ...

    def describe(self, plan: Plan) -> str:
        """The plan's choice as the diagnosis names it, after its LoRA ("optimizer offload, TP 2")."""
        ...


SEARCH_SPACES: Mapping[str, SearchSpace[Any]] = {"fsdp": FSDP_SPACE, "megatron": MEGATRON_SPACE}


def search_space(request: SolveRequest) -> SearchSpace[Any]:
    """The space of the request's strategy (`solve_engines` runs each of them for --strategy auto)."""
    return SEARCH_SPACES[request.strategy]


def plan_space(plan: Plan) -> SearchSpace[Any]:
    """The space whose choices make plans of `plan`'s strategy."""
    return next(space for space in SEARCH_SPACES.values() if plan.actor.strategy in space.strategies)


def skeleton_plan(request: SolveRequest, response_len: int) -> Plan:
    """The workload, with every knob at a neutral value for the search to set, as a plan of the request's
    backend (with --strategy auto not yet split per backend: the base plan's)."""
    space = SEARCH_SPACES.get(request.strategy)
    return workload_plan(request, response_len, space.skeleton if space is not None else None)


def choice_text(plan: Plan) -> str:
    """A plan's choice as the diagnosis names it: "full fine-tuning, optimizer offload, TP 2"."""
    lora = f"LoRA r{plan.model.lora.rank}" if plan.model.lora.enabled else "full fine-tuning"
    return f"{lora}, {plan_space(plan).describe(plan)}"


# The knobs the search sets, as `solve --top` shows each candidate's: the training choice's (its fields'), each
# pass's token budget and micro batch (phases.PASS_KNOBS, which the passes set), and the rollout engine's sizes.
PASS_SEARCHED_KNOBS = tuple(key for knobs in PASS_KNOBS.values() for key in (knobs.token_budget, knobs.micro_batch))
ROLLOUT_SEARCHED_KNOBS = ("rollout.tensor_model_parallel_size", "rollout.gpu_memory_utilization",
                          "rollout.max_num_seqs", "rollout.max_num_batched_tokens")


def searched_knobs(plan: Plan) -> dict[str, Any]:
    """The searched knobs of a plan by dotted key: its backend's choice, then the passes' and the rollout's; the
    critic's and the reference's only when the plan has one."""
    knobs = {}
    for dotted in (*knob_keys(plan_space(plan).choice_type), *PASS_SEARCHED_KNOBS, *ROLLOUT_SEARCHED_KNOBS):
        if (dotted.startswith("critic.") and not plan.uses_critic) or (
                dotted.startswith("ref.") and not plan.uses_reference):
            continue
        knobs[dotted] = knob_value(plan, dotted)
    return knobs

"""The solver's records: what a user asks `rlplan solve` for (`SolveRequest`), and what it answers: the candidates it
ranks, the frontier it priced, and the diagnosis with its suggestions when nothing fits.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs
from attrs import field, frozen

from rlplan.planner.errors import PlanError
from rlplan.planner.hardware import Cluster
from rlplan.planner.memory import MemoryReport
from rlplan.planner.model_error import DEFAULT_HEADROOM, Headroom
from rlplan.planner.plan import ModelSection, Plan
from rlplan.planner.profile import DEFAULT_PROFILE, Profile
from rlplan.planner.rules import VLLM_LORA_RANKS
from rlplan.planner.steptime import StepTime

GIB = 2**30
Objective = Literal["throughput", "memory"]
LoraChoice = Literal["off", "auto"] | int
# The training backend the search plans: FSDP (the plan's fsdp / fsdp2), verl's Megatron workers, or both
# (auto: each searched, the faster plan kept, as `solve_engines` does for rollout engines).
SolveStrategy = Literal["fsdp", "megatron", "auto"]


# Feasible plans kept after the best, for `solve --verify` to measure in order.
RUNNERS_UP = 2
# Candidates whose predicted step is within this fraction of the fastest count as equally fast (the step-time
# model is no finer): among them solve takes the one that leaves the most GPU memory.
STEP_TIME_TOLERANCE = 0.02


@frozen(kw_only=True)
class SolveRequest:
    """What a user asks `rlplan solve` for."""

    model: ModelSection
    cluster: Cluster
    prompt_len: int = field()
    response_len: int | None = None
    max_response_len: int | None = None
    train_batch_size: int = 256
    n: int = 5
    algorithm: str = "grpo"
    ppo_mini_batch_size: int | None = None
    lora: LoraChoice = "auto"
    objective: Objective = "throughput"
    # The GPU memory every phase leaves free (--headroom); unset: the default rule of model_error.plan_margin.
    headroom: Headroom = DEFAULT_HEADROOM
    pins: dict[str, Any] = field(factory=dict)
    base: Plan | None = None
    profile: Profile = DEFAULT_PROFILE
    # Mean tokens the data has (data.expected_*_length); None: the maximum lengths.
    expected_prompt_len: int | None = None
    expected_response_len: int | None = None
    # data.train_files / data.val_files (verl reads them; the planner never opens them); None keeps the base's.
    train_files: tuple[str, ...] | None = None
    val_files: tuple[str, ...] | None = None
    # --strategy: which backend's knobs the search sets (space.py's SEARCH_SPACES: fsdp.py, megatron.py).
    strategy: SolveStrategy = "fsdp"

    @prompt_len.validator
    def _check_prompt_len(self, attribute: attrs.Attribute, value: int) -> None:
        if value < 1:
            raise PlanError(field="--prompt-len", message=f"must be >= 1, got {value}.", fix="pass --prompt-len 1024")

    def __attrs_post_init__(self) -> None:
        if self.response_len is None and self.max_response_len is None:
            raise PlanError(
                field="--response-len",
                message="the response length is needed to size the rollout and the training passes.",
                fix="pass --response-len N, or --max-response-len N to let the solver find the longest that fits",
            )
        for name, value in (("--response-len", self.response_len), ("--max-response-len", self.max_response_len),
                            ("--train-batch-size", self.train_batch_size), ("--n", self.n),
                            ("--ppo-mini-batch-size", self.ppo_mini_batch_size)):
            if value is not None and value < 1:
                raise PlanError(field=name, message=f"must be >= 1, got {value}.", fix=f"pass a positive {name}")
        # A length past the model's context is never silently cut to it: the user asked for tokens the
        # model cannot hold, and a long-context variant (e.g. a -1M model) may be what they meant.
        context = self.model.arch.max_position_embeddings
        for name, value in (("--response-len", self.response_len), ("--max-response-len", self.max_response_len)):
            if value is not None and self.prompt_len + value > context:
                room = context - self.prompt_len
                raise PlanError(
                    field=name,
                    message=(f"{self.prompt_len} prompt + {value} response tokens exceed {self.model.name}'s context "
                             f"(max_position_embeddings = {context})."),
                    fix=(f"pass {name} {room}" if room >= 1 else "pass a shorter --prompt-len")
                    + ", or a model with a longer context (its config.json via --model DIR, or a long-context "
                      "variant such as --model Qwen/Qwen2.5-7B-Instruct-1M)",
                )
        if isinstance(self.lora, int) and not 0 <= self.lora <= VLLM_LORA_RANKS[-1]:
            raise PlanError(field="--lora", message=f"rank {self.lora} is outside 0..{VLLM_LORA_RANKS[-1]}.",
                            fix="pass --lora off, auto, or a rank such as 32, 64 or 128")


@frozen(kw_only=True)
class Candidate:
    plan: Plan
    memory: MemoryReport
    step_time: StepTime


@frozen(kw_only=True)
class Suggestion:
    """One change to the request that makes it fit, re-solved: its predicted step and the GPUs it takes."""

    change: str
    detail: str
    step_time_s: float | None = None
    gpus: int = 0
    # GPUs x GiB each: the hardware bill's proxy (a bigger GPU is a pricier one).
    gpu_memory_gib: float = 0.0
    # False for changes to what is trained (LoRA, lengths, batch) rather than to the hardware.
    keeps_workload: bool = True
    # More GPUs (nodes) of the kind the request has: always among the changes shown when one fits.
    more_gpus: bool = False
    # What the change asks of the user: other "hardware" for the run as asked, the run changed on the user's own
    # hardware ("workload"), a smaller "margin" (both kept, the model's error less guarded), or the nearest values
    # a broken verl "rule" accepts.
    kind: str = "hardware"
    # The share of the run's tokens per step (prompts x responses per prompt x their lengths) the change keeps.
    tokens_kept: float = 1.0


@frozen(kw_only=True)
class Diagnosis:
    binding: str
    message: str
    suggestions: tuple[Suggestion, ...]


@frozen(kw_only=True)
class FrontierPoint:
    """One candidate the search priced, as `solve --frontier` plots it.

    rank: 1 for the chosen plan, 2.. for the feasible runners-up in preference order, 0 when infeasible.
    reason: why an infeasible candidate was dropped ("" when feasible).
    """

    step_time_s: float
    gpu_peak_gib: float
    feasible: bool
    rank: int
    knobs: tuple[tuple[str, Any], ...]
    reason: str = ""


@frozen(kw_only=True)
class SolveResult:
    best: Candidate | None
    evaluated: int
    feasible: int
    diagnosis: Diagnosis | None = None
    # The next-best feasible candidates after `best`, in order (for `solve --verify`).
    runners_up: tuple[Candidate, ...] = ()
    # Every priced candidate of the final search, only when `solve(..., frontier=True)` asked for it.
    frontier: tuple[FrontierPoint, ...] = ()

    @property
    def plan(self) -> Plan | None:
        return self.best.plan if self.best else None

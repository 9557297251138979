"""The solver: every knob of a plan, from a model, a cluster and a workload.

Discrete knobs (LoRA, offload, checkpointing, Ulysses, HSDP, reference offload; Megatron's TP, PP, VPP, CP, EP,
ETP, offload and recompute; the rollout's TP) are searched exhaustively over a small space; continuous ones are
solved directly: each pass's token budget is the largest that fits its phase (bisection on the memory model),
gpu_memory_utilization the largest the rollout phase allows, and max_num_seqs what the KV cache can hold.
Feasible candidates are ranked by the step-time model (or by peak memory); when none fits, `diagnose` names the
binding constraint and the smallest change that would fit.

The training side and the rollout side are solved separately and then joined, because a pass's token budget
does not depend on rollout TP: that keeps a 72B model on 64 GPUs to a few thousand model evaluations.

- `request.py`: `SolveRequest` and the records `solve` answers with (`SolveResult`, `Candidate`, `Diagnosis`, ...);
- `workload.py`: the request's workload as a plan with neutral knobs;
- `space.py`: the `SearchSpace` protocol and `SEARCH_SPACES`, one space per training backend: `fsdp.py`, `megatron.py`
  (their choices declare the knobs they set: `choices.py`);
- `budgets.py`: GPU limits and each pass's token budget; `rollout.py`: the rollout's TP, utilization, max_num_seqs;
- `search.py`: the search loop over a space's choices (it imports no space);
- `solve.py`: `solve`, `solve_engines` and, when nothing fits, `diagnose`.
"""

from __future__ import annotations

from rlplan.planner.solver.budgets import gpu_limit_bytes, largest_fitting_token_budget
from rlplan.planner.solver.request import (
    GIB,
    RUNNERS_UP,
    STEP_TIME_TOLERANCE,
    Candidate,
    Diagnosis,
    FrontierPoint,
    LoraChoice,
    Objective,
    SolveRequest,
    SolveResult,
    SolveStrategy,
    Suggestion,
)
from rlplan.planner.solver.search import finalize, request_margin
from rlplan.planner.solver.solve import RANKED_BY, diagnose, solve, solve_engines
from rlplan.planner.solver.space import SEARCH_SPACES, SearchSpace, searched_knobs, skeleton_plan

__all__ = ["GIB", "RANKED_BY", "RUNNERS_UP", "SEARCH_SPACES", "STEP_TIME_TOLERANCE", "Candidate", "Diagnosis", "FrontierPoint",
           "LoraChoice", "Objective", "SearchSpace", "SolveRequest", "SolveResult", "SolveStrategy", "Suggestion",
           "diagnose", "finalize", "gpu_limit_bytes", "largest_fitting_token_budget", "request_margin",
           "searched_knobs", "skeleton_plan", "solve", "solve_engines"]

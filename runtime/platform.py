"""This machine as a `Platform`, the gate of `rlplan run`, and CPU threads per rank.

The runtime never drops a knob silently: a plan asking for something this
platform cannot do (CPU offload without an accelerator, sleep mode on vLLM's
CPU backend, an unsupported parallelism) fails at start with a PlanError that
names the field and the fix, before any worker starts or anything is written.
What cannot run where is said once, as "platform" rules in planner/rules.py.
"""

from __future__ import annotations

import os

from rlplan.planner.errors import PlanError
from rlplan.planner.plan import Plan
from rlplan.planner.platform import Platform
from rlplan.planner.rules import Violation, check_plan


def available_cores() -> int:
    """Cores this process may run on (its affinity mask, which containers and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_threads_per_rank(world_size: int, cores: int | None = None) -> int:
    """Intra-op threads for one CPU trainer rank: its share of the machine's cores.

    Trainer ranks run their passes at the same time and the rollout engine runs between them, never
    beside them, so the ranks split the cores between them; one thread per rank left a one-rank
    run on a 2-core machine training on half the machine (issue 12).
    """
    return max(1, (cores if cores is not None else available_cores()) // max(1, world_size))


def detect_platform() -> Platform:
    import torch

    if torch.cuda.is_available():
        return Platform(device_type="cuda", accelerator_count=torch.cuda.device_count())
    return Platform(device_type="cpu", has_cpp_compiler=has_cpp_compiler())


def has_cpp_compiler() -> bool:
    """Whether inductor finds its C++ compiler: $CXX, else g++ (torch/_inductor/config.py cpp.cxx on Linux)."""
    import shutil

    return shutil.which(os.environ.get("CXX") or "g++") is not None


# The rules about which machine a plan is for: when one fails, most others are its consequences, so it is said first.
MACHINE_RULES = ("gpu_plan_needs_a_gpu_machine", "plan_gpus_on_this_machine")


def blocking_errors(plan: Plan, platform: Platform) -> list[PlanError]:
    """Every error of every registered rule, the platform rules included, as the paragraphs `rlplan run` prints:
    the machine the plan is for first, then what this platform cannot run, then verl's own rules."""
    errors = check_plan(plan, platform).errors

    def order(violation: Violation) -> int:
        if violation.rule in MACHINE_RULES:
            return 0
        return 1 if violation.stage == "platform" else 2

    return [violation.as_plan_error() for violation in sorted(errors, key=order)]


def check_plan_runnable(plan: Plan, platform: Platform) -> None:
    """The gate of `rlplan run`: every registered rule, the platform rules included, before any worker
    starts or anything is written. Raises the first error (`blocking_errors` lists them all)."""
    errors = blocking_errors(plan, platform)
    if errors:
        raise errors[0]

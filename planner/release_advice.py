"""What a newer verl release would give a request solved for an older one: said beside the plan, never in it.

`solve --verl-version X` searches only the knobs X's trainer config has (render.absent_knobs holds the others at
what X does). Where a knob X lacks would make the request fit, or run faster, the user should hear it: the
request is solved again on the newest release read; if that plan sets knobs X lacks, it is solved once more on the
first release that has them all (so the claim is about that release's own behaviour), and the result is a
`NewerRelease` ("on verl >= 0.4.0: LoRA r32 fits on 2 GPUs"). The plan for X is not changed. Pure: the commands
layer prints it.
"""

from __future__ import annotations

from typing import Any

import attrs
from attrs import frozen

from rlplan.planner.knobs import apply_knobs, knob_value
from rlplan.planner.plan import Plan, RolloutEngine
from rlplan.planner.render import absent_knobs
from rlplan.planner.solver import SolveRequest, SolveResult, solve_engines
from rlplan.planner.solver.space import choice_text, skeleton_plan
from rlplan.planner.stack import DEFAULT_STACK, parse_version, solve_pins
from rlplan.planner.verl_inventory import TrainerBackend
from rlplan.planner.verl_keys import BY_FIELD, backend_of

# A newer release is worth naming for speed when it is at least this much faster (step-time model noise aside).
FASTER_BY = 0.05


@frozen(kw_only=True)
class NewerRelease:
    verl: str  # the first release with every knob the better plan sets
    knobs: tuple[str, ...]  # those knobs (plan fields), each one the target release lacks
    choice: str  # the solver's one-line description of the plan on `verl`
    step_time_s: float
    fits_only_there: bool  # the request does not fit on the target release at all

    def text(self, target: str, target_step_s: float | None) -> str:
        needs = ", ".join(self.knobs)
        if self.fits_only_there:
            return (f"on verl >= {self.verl} the request fits ({self.choice}; step ~{self.step_time_s:.1f} s): it "
                    f"needs {needs}, which verl {target} does not have")
        return (f"on verl >= {self.verl} the request runs faster ({self.choice}): step ~{self.step_time_s:.1f} s "
                f"instead of ~{target_step_s:.1f} s, with {needs}, which verl {target} does not have")

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


def _retargeted(request: SolveRequest, target: str, verl: str) -> SolveRequest:
    """The request with its stack pins (solve_pins of the target) replaced by those of `verl`."""
    old = solve_pins(DEFAULT_STACK, target, None, None)
    pins = {key: value for key, value in request.pins.items()
            if not key.startswith("stack.") and not (key in old and old[key] == value)}
    return attrs.evolve(request, pins={**pins, **solve_pins(DEFAULT_STACK, verl, None, None)})


def newer_release(request: SolveRequest, result: SolveResult,
                  engines: tuple[RolloutEngine, ...]) -> NewerRelease | None:
    """The first newer release whose knobs make the request fit, or run at least FASTER_BY faster; None when the
    target release lacks no knob, or none would help."""
    skeleton = apply_knobs(skeleton_plan(request, request.response_len or request.max_response_len or 1),
                           request.pins)
    target, backend = skeleton.stack.verl, backend_of(skeleton.actor.strategy)
    absent = absent_knobs(skeleton)
    if not absent or target == DEFAULT_STACK.verl:
        return None
    newest = solve_engines(_retargeted(request, target, DEFAULT_STACK.verl), engines, keep=1)
    if newest.best is None or not _better(newest, result):
        return None
    needed = _needed(newest.best.plan, absent, request)
    firsts = sorted({_first_after(field, backend, target) for field in needed} - {None}, key=parse_version)
    for first in firsts:  # the earliest release that has some of the knobs first: the claim names the least upgrade
        assert first is not None
        there = solve_engines(_retargeted(request, target, first), engines, keep=1)
        if there.best is None or not _better(there, result):
            continue
        return NewerRelease(verl=first, knobs=_needed(there.best.plan, absent, request) or needed,
                            choice=choice_text(there.best.plan), step_time_s=round(there.best.step_time.total_seconds, 1),
                            fits_only_there=result.best is None)
    return None


def _better(there: SolveResult, here: SolveResult) -> bool:
    """`there` fits where `here` does not, or steps at least FASTER_BY faster."""
    if there.best is None:
        return False
    return here.best is None or (there.best.step_time.total_seconds
                                 <= (1 - FASTER_BY) * here.best.step_time.total_seconds)


def _needed(plan: Plan, absent: dict[str, Any], request: SolveRequest) -> tuple[str, ...]:
    """The knobs the target release lacks that `plan` sets away from what that release does (a critic's only on a
    plan with a critic), the user's pins aside."""
    return tuple(field for field, value in absent.items() if knob_value(plan, field) != value
                 and field not in request.pins and (plan.uses_critic or not field.startswith("critic.")))


def _first_after(field: str, backend: TrainerBackend, target: str) -> str | None:
    """The first release after `target` whose trainer config has the knob."""
    return next((release for release in BY_FIELD[field].releases(backend)
                 if parse_version(release) > parse_version(target)), None)

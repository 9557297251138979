"""The rules' registry: what a rule is, how one is registered, and `check_plan`, which runs them all.

A rule is a named function over the plan and its layout that yields `Violation`s: the numbers involved, the
smallest change that fixes it, and that change as data (`suggested`) so the solver and the tests can apply it.
Each lives once, in the module of what it is about (`TOPICS`: batch.py, parallel.py, memory.py, engines.py,
platform.py); importing `rlplan.planner.rules` registers every one of them here.

`stage` says where verl would fail: "config" (validate_config and the config dataclasses), "worker"
(worker-constructor normalization), "runtime" (dispatch, dynamic batching, vLLM start-up), or "rlplan" (what
verl accepts but produces a broken or wasteful run); "platform" rules say what rlplan's bundled runtime cannot
run on one machine, and run only when `check_plan` is given that machine's `Platform`. `check_plan` reports in
that order of stages (the order verl meets them), each stage's rules in `TOPICS` order and, within a module, in
the order they are written.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any, Literal, get_args

from attrs import field, frozen

from rlplan.planner.errors import PlanError
from rlplan.planner.layout import PlanLayout, plan_layout
from rlplan.planner.plan import ActorSection, CriticSection, Plan
from rlplan.planner.platform import Platform
from rlplan.planner.stack import Behaviour, holds

Severity = Literal["error", "warning"]
# In the order verl meets them: check_plan reports in this order.
Stage = Literal["config", "worker", "runtime", "rlplan", "platform"]
STAGES: tuple[Stage, ...] = get_args(Stage)
# The modules of rules, by what they are about; within a stage, check_plan reports in this order, each module's
# rules as they are written there (the order the modules are imported in does not matter).
TOPICS = ("batch", "parallel", "memory", "engines", "platform")


@frozen(kw_only=True)
class Violation:
    rule: str
    message: str
    fix: str
    severity: Severity = "error"
    stage: Stage = "config"
    suggested: dict[str, Any] = field(factory=dict)

    @property
    def plan_key(self) -> str:
        """The plan key this is about: the first key its fix changes, else the rule's name."""
        return next(iter(self.suggested), self.rule)

    def as_plan_error(self) -> PlanError:
        """The one paragraph a command that refuses the plan prints (`rlplan run`)."""
        return PlanError(field=self.plan_key, message=self.message, fix=self.fix)


@frozen(kw_only=True)
class RuleContext:
    """What one rule reads, and the rule it is for: `violation` stamps its name and stage."""

    plan: Plan
    layout: PlanLayout
    # The machine the bundled runtime is about to run on; None outside `rlplan run`, and then the
    # "platform" rules are not run.
    platform: Platform | None = None
    # The rule being checked: check_plan hands each registered rule its own copy of the context.
    rule: str = ""
    stage: Stage = "config"

    def violation(self, message: str, fix: str, severity: Any = "error", **suggested: Any) -> Violation:
        """A violation of this context's rule; `suggested` keys are dotted with "__" (actor__fsdp_size)."""
        # `severity` is typed loosely only because fixes arrive as **{"section__key": value} mappings.
        assert severity in ("error", "warning"), severity
        return Violation(
            rule=self.rule, stage=self.stage, message=message, fix=fix, severity=severity,
            suggested={k.replace("__", "."): v for k, v in suggested.items()},
        )


Check = Callable[[RuleContext], Iterator[Violation]]


@frozen(kw_only=True)
class Rule:
    name: str
    stage: Stage
    summary: str
    check: Check
    # The verl behaviour the rule belongs to (planner/stack.py): checked only on stacks where it holds.
    # None: every stack.
    applies: Behaviour | None = None

    def applies_to(self, plan: Plan) -> bool:
        return self.applies is None or holds(self.applies, plan.stack, plan.rollout.name, plan.passthrough)


RULES: list[Rule] = []


def rule(stage: Stage, summary: str, applies: Behaviour | None = None) -> Callable[[Check], Check]:
    """Register a check as a rule named after its function (`_fsdp_size_divides_world` is
    "fsdp_size_divides_world"): the name is written once, and its violations carry it and the stage.
    `applies`: the version-dependent verl behaviour the rule belongs to; on other target stacks it is not run."""

    def register(check: Check) -> Check:
        RULES.append(Rule(name=check.__name__.lstrip("_"), stage=stage, summary=summary, check=check,
                          applies=applies))
        RULES.sort(key=_report_order)
        return check

    return register


def _report_order(registered: Rule) -> tuple[int, int, int]:
    """Stage, then topic module, then place in that module."""
    topic = registered.check.__module__.rpartition(".")[2]
    return STAGES.index(registered.stage), TOPICS.index(topic), registered.check.__code__.co_firstlineno


@frozen(kw_only=True)
class RuleReport:
    violations: tuple[Violation, ...]

    @property
    def errors(self) -> tuple[Violation, ...]:
        return tuple(v for v in self.violations if v.severity == "error")

    @property
    def warnings(self) -> tuple[Violation, ...]:
        return tuple(v for v in self.violations if v.severity == "warning")

    @property
    def valid(self) -> bool:
        return not self.errors


def check_plan(plan: Plan, platform: Platform | None = None) -> RuleReport:
    """Every registered rule over `plan`; the "platform" rules too when the runtime passes its `platform`."""
    layout = plan_layout(plan)
    found: list[Violation] = []
    for registered in RULES:
        if (registered.stage == "platform" and platform is None) or not registered.applies_to(plan):
            continue
        # Built directly rather than evolved from one context: the solver checks every candidate it ranks.
        found.extend(registered.check(RuleContext(plan=plan, layout=layout, platform=platform, rule=registered.name,
                                                  stage=registered.stage)))
    return RuleReport(violations=tuple(found))


def rule_names() -> tuple[str, ...]:
    return tuple(r.name for r in RULES)


def _next_multiple(value: int, step: int) -> int:
    return max(step, math.ceil(value / step) * step)


def _largest_divisor_at_most(value: int, limit: int) -> int:
    best = 1
    for candidate in range(1, min(value, max(limit, 1)) + 1):
        if value % candidate == 0:
            best = candidate
    return best


def _smallest_train_batch(train_batch: int, n: int, divisor: int) -> int:
    """Smallest train_batch_size >= the current one with train_batch * n divisible by `divisor`."""
    step = divisor // math.gcd(divisor, n)
    return _next_multiple(train_batch, step)


def _trained_sections(plan: Plan) -> Iterator[tuple[Literal["actor", "critic"], ActorSection | CriticSection]]:
    """The sections verl trains with their own FSDP state: the actor's, and the critic's when the plan has one."""
    yield "actor", plan.actor
    if plan.uses_critic:
        yield "critic", plan.critic


# verl's rollout mode (sync up to v0.6.1 by default, async only from v0.7.0): rlplan keeps it as passthrough.
ROLLOUT_MODE_KEY = "actor_rollout_ref.rollout.mode"


def passthrough_value(plan: Plan, key: str, default: str) -> str:
    """An unmodeled verl key's value as text, however the script spelled the override: `key=`, `+key=` (how
    real scripts add keys verl's YAML lacks) or `++key=`; Hydra applies them in order, so `++` wins."""
    for spelling in ("++" + key, "+" + key, key):
        if spelling in plan.passthrough:
            return str(plan.passthrough[spelling])
    return default

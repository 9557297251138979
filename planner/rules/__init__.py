"""Every verl rule rlplan enforces, each once, with a name, in this package.

verl checks a config in six places (validate_config, config dataclasses, worker constructors, runtime asserts
in data dispatch and dynamic batching, vLLM's own scheduler checks) and mostly reports them as bare asserts
after minutes of model loading. Here each rule is a named function over the plan and its layout that reports
the numbers involved and the smallest change that fixes it, with that change as data (`suggested`) so the
solver and the tests can apply it. Rule references in brackets are sections of
shared/reference/verl-rules.md.

One registry (`registry.py`: `RULES`, `check_plan`), and a module per what the rules are about:

- `batch.py`: batch sizes, micro batches, token budgets, dispatch, the groups an advantage compares;
- `parallel.py`: FSDP's mesh, Ulysses, the rollout engine's TP, Megatron's TP / PP / VPP / CP / EP groups;
- `memory.py`: where the state lives and what memory is priced at (loss head, offload policy, lengths);
- `engines.py`: what one rollout engine or training backend reads and ignores, and keys a verl release lacks;
- `platform.py`: what rlplan's bundled runtime cannot run on one machine (`check_plan(plan, platform)` only).

The CLI, validate, solve and the runtime (`rlplan run`, with its Platform) all call `check_plan`.
"""

from __future__ import annotations

# Importing a topic module registers its rules (in registry.TOPICS order, whatever the order here).
from rlplan.planner.rules import batch, engines, memory, parallel, platform  # noqa: F401
from rlplan.planner.rules.engines import VLLM_LORA_RANKS
from rlplan.planner.rules.registry import (
    RULES,
    Rule,
    RuleContext,
    RuleReport,
    Severity,
    Stage,
    Violation,
    check_plan,
    rule,
    rule_names,
)

__all__ = ["RULES", "VLLM_LORA_RANKS", "Rule", "RuleContext", "RuleReport", "Severity", "Stage", "Violation",
           "check_plan", "rule", "rule_names"]

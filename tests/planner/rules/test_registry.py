"""The rules' registry (planner/rules/registry.py): one named rule each, its stage on every violation, the
order check_plan reports in, and every rule the planner's comments cite is registered."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

from rlplan.planner.rules import RULES, check_plan, registry, rule_names
from rlplan.planner.rules.registry import STAGES, TOPICS
from tests.planner.plans import make_plan


def test_every_rule_has_a_unique_name_and_a_summary():
    names = [r.name for r in RULES]
    assert len(names) == len(set(names))
    assert all(r.summary for r in RULES)


def test_default_test_plan_is_valid():
    report = check_plan(make_plan())
    assert report.valid, [v.message for v in report.errors]


@pytest.mark.parametrize(("rule", "overrides"), [
    ("offload_policy_needs_fsdp2", {"actor.strategy": "fsdp", "critic.offload_policy": True}),
    ("offload_policy_supersedes_offloads", {"critic.offload_policy": True, "critic.optimizer_offload": True}),
    ("ulysses_divides_world", {"critic.ulysses_sequence_parallel_size": 3}),
])
def test_the_critics_fsdp_rules_check_its_section_only_when_the_plan_trains_a_critic(rule, overrides):
    """Invariant: a critic section a plan does not train (GRPO) is never the subject of a rule on trained state."""
    ppo = check_plan(make_plan(overrides={**overrides, "algorithm.adv_estimator": "gae"}))
    assert [v.message.split(".")[0] for v in ppo.violations if v.rule == rule] == ["critic"]
    grpo = check_plan(make_plan(overrides={**overrides, "algorithm.adv_estimator": "grpo"}))
    assert not [v for v in grpo.violations if v.rule == rule]


def test_every_violation_carries_the_name_and_stage_of_the_rule_that_found_it():
    from rlplan.planner.platform import Platform

    plan = make_plan(overrides={"actor.fsdp_size": 3, "rollout.n": 1, "actor.strategy": "fsdp",
                                "actor.offload_policy": True, "rollout.max_model_len": 40000})
    stages = {r.name: r.stage for r in RULES}
    violations = check_plan(plan, Platform(device_type="cpu")).violations
    assert len({v.rule for v in violations}) >= 5
    assert all(stages[v.rule] == v.stage for v in violations)


# A rule cited in the planner's comments and docstrings: "rule name", "rules: name", "rules.py name" or "name rule".
_CITED_RULE = re.compile(r"(?:\brules?(?:\.py)?[:,]?\s*\(?|\brule\s+)`?([a-z][a-z0-9]*(?:_[a-z0-9]+)+)`?"
                         r"|`?\b([a-z][a-z0-9]*(?:_[a-z0-9]+)+)`?\s+rule\b")


def _cited_rule_names(source: str) -> set[str]:
    """The rule names a module's comments and string literals cite."""
    cited = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.COMMENT, tokenize.STRING):
            cited.update(first or second for first, second in _CITED_RULE.findall(token.string))
    return cited


def test_every_rule_a_planner_comment_cites_is_a_registered_rule():
    """A comment naming a rule that planner/rules/ does not have sends a reader looking for nothing (issue 25)."""
    planner = Path(__file__).resolve().parents[3] / "planner"
    unknown = {f"{path.relative_to(planner)}: {name}" for path in planner.rglob("*.py")
               for name in _cited_rule_names(path.read_text(encoding="utf-8")) if name not in rule_names()}
    assert unknown == set()


def test_a_cited_rule_name_is_found_in_each_spelling():
    source = ('# the platform rule runtime_rolls_out_with_vllm\n'
              'x = "(rules: rollout_dtype_matches_cpu_trainer)"  # a batch rule (rollout_tp_divides_world)\n'
              '# the `holds_max_model_len` rule\n')
    assert _cited_rule_names(source) == {"runtime_rolls_out_with_vllm", "rollout_dtype_matches_cpu_trainer",
                                         "rollout_tp_divides_world", "holds_max_model_len"}


def test_the_topics_are_the_rule_modules_and_each_registers_a_rule():
    """A new module of rules is named in registry.TOPICS (its place in the report order), and only then."""
    folder = Path(registry.__file__).parent
    modules = {path.stem for path in folder.glob("*.py")} - {"__init__", "registry"}
    assert set(TOPICS) == modules
    assert {r.check.__module__.rpartition(".")[2] for r in RULES} == modules


@pytest.mark.parametrize("platform", [None, "cpu"])
def test_violations_come_in_the_order_verl_meets_them_stage_by_stage(platform):
    """Invariant: check_plan lists a config error before a worker one, a worker one before a runtime one, ...,
    whichever module the rules live in."""
    from rlplan.planner.platform import Platform

    plan = make_plan(overrides={"actor.fsdp_size": 3, "rollout.n": 1, "actor.strategy": "fsdp",
                                "actor.offload_policy": True, "rollout.max_model_len": 40000,
                                "actor.ppo_micro_batch_size_per_gpu": 3, "model.lora.rank": 1024})
    violations = check_plan(plan, Platform(device_type=platform) if platform else None).violations
    stages = [STAGES.index(v.stage) for v in violations]
    assert len(set(stages)) >= 4 and stages == sorted(stages)
    assert [r.stage for r in RULES] == sorted((r.stage for r in RULES), key=STAGES.index)

"""verl's batch-normalization and validation rules (planner/rules.py)."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlplan.planner.hardware import Cluster, GpuSpec
from rlplan.planner.knobs import apply_knobs
from rlplan.planner.layout import plan_layout
from rlplan.planner.rules import RULES, check_plan, rule_names
from tests.planner.plans import make_plan

BATCH_RULES = {
    "real_batch_divisible_by_world",
    "mini_batch_within_train_batch",
    "actor_micro_batch_exactly_one",
    "actor_global_micro_batch_consistent",
    "ulysses_divides_world",
    "actor_micro_batch_divides_mini",
    "dispatch_divisible_by_dp",
    "token_budget_fits_longest_sequence",
}


@st.composite
def batch_requests(draw):
    """Any world size, sp, n, train/mini/micro sizes, fixed or dynamic micro batches, per-GPU or global keys."""
    world = draw(st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64]))
    sp = draw(st.sampled_from([1, 2, 4, 7, 8]))
    n = draw(st.integers(1, 16))
    train = draw(st.integers(1, 512))
    mini = draw(st.integers(1, 512))
    dynamic = draw(st.booleans())
    use_global_micro = draw(st.booleans())
    micro = draw(st.integers(1, 64))
    budget = draw(st.integers(256, 32768))
    overrides = {
        "data.train_batch_size": train,
        "rollout.n": n,
        "actor.ppo_mini_batch_size": mini,
        "actor.ulysses_sequence_parallel_size": sp,
        "actor.use_dynamic_bsz": dynamic,
        "actor.ppo_max_token_len_per_gpu": budget,
        "rollout.agent_num_workers": 1,
    }
    if use_global_micro:
        overrides["actor.ppo_micro_batch_size"] = micro
        overrides["actor.ppo_micro_batch_size_per_gpu"] = None
    else:
        overrides["actor.ppo_micro_batch_size_per_gpu"] = micro
    plan = make_plan(overrides={k: v for k, v in overrides.items() if v is not None})
    if use_global_micro:
        plan = plan.evolve(actor=attrs.evolve(plan.actor, ppo_micro_batch_size_per_gpu=None))
    cluster = Cluster(gpu=GpuSpec(name="test", memory_gib=80), nodes=1, gpus_per_node=world)
    return plan.evolve(cluster=cluster)


def simulate_actor_step(plan):
    """Run one PPO epoch the way verl's dispatch and dp_actor.update_policy do, counting samples.

    Dispatch splits the batch into dp equal chunks (DataProto.chunk); each rank splits its
    chunk into mini batches (optimizer steps) and each mini batch into micro batches
    (gradient-accumulation steps) or, with dynamic bsz, into token-budget micro batches.
    """
    layout = plan_layout(plan)
    role = layout.actor_update
    dp = layout.parallel.dp
    total = plan.data.train_batch_size * plan.rollout.n
    seen = [0] * total
    optimizer_steps = 0
    accumulation_steps = []
    for rank in range(dp):
        rank_samples = list(range(rank * total // dp, (rank + 1) * total // dp))
        assert len(rank_samples) == role.sequences_per_gpu
        for start in range(0, len(rank_samples), role.mini_batch_size_per_gpu):
            mini = rank_samples[start : start + role.mini_batch_size_per_gpu]
            optimizer_steps += 1
            if role.uses_dynamic_bsz:
                per_micro = max(1, role.token_budget_per_sp_group // plan.data.max_sequence_length)
            else:
                per_micro = role.micro_batch_size_per_gpu
            micro_batches = [mini[i : i + per_micro] for i in range(0, len(mini), per_micro)]
            accumulation_steps.append(len(micro_batches))
            for micro in micro_batches:
                for sample in micro:
                    seen[sample] += 1
    return seen, optimizer_steps, accumulation_steps, role


@settings(max_examples=400, deadline=None)
@given(batch_requests())
def test_normalizer_rejects_with_a_named_rule_or_every_sample_is_consumed_exactly_once(plan):
    report = check_plan(plan)
    batch_errors = [v for v in report.errors if v.rule in BATCH_RULES]
    for violation in report.violations:
        assert violation.rule in rule_names()
        assert violation.message and violation.fix
    if batch_errors:
        return
    seen, optimizer_steps, accumulation_steps, role = simulate_actor_step(plan)
    assert all(count == 1 for count in seen), "a sample was skipped or seen twice"
    assert optimizer_steps == role.mini_batches_per_epoch * plan_layout(plan).parallel.dp
    assert all(steps >= 1 for steps in accumulation_steps)
    evenly = not any(v.rule == "mini_batches_split_evenly" for v in report.warnings)
    if evenly and not role.uses_dynamic_bsz:
        # Equal mini batches, each an integral number of equal micro batches.
        assert role.sequences_per_gpu == role.mini_batches_per_epoch * role.mini_batch_size_per_gpu
        assert role.mini_batch_size_per_gpu == role.micro_batch_size_per_gpu * role.micro_batches_per_mini
        assert set(accumulation_steps) == {role.micro_batches_per_mini}


@settings(max_examples=200, deadline=None)
@given(batch_requests())
def test_applying_every_suggested_fix_never_adds_an_error_it_names(plan):
    """A suggested fix removes the violation it belongs to (it may surface a different rule)."""
    report = check_plan(plan)
    for violation in report.errors:
        if not violation.suggested:
            continue
        fixed = apply_knobs(plan, violation.suggested)
        same = [
            v for v in check_plan(fixed).errors
            if v.rule == violation.rule and v.message == violation.message
        ]
        assert not same, f"{violation.rule}: fix {violation.suggested} did not remove it"


def test_every_rule_has_a_unique_name_and_a_summary():
    names = [r.name for r in RULES]
    assert len(names) == len(set(names))
    assert all(r.summary for r in RULES)


def test_default_test_plan_is_valid():
    report = check_plan(make_plan())
    assert report.valid, [v.message for v in report.errors]


def test_micro_batch_not_dividing_mini_names_the_rule_and_the_fix():
    plan = make_plan(overrides={"actor.ppo_micro_batch_size_per_gpu": 3})  # mini 16*4/8 = 8 per GPU
    errors = {v.rule: v for v in check_plan(plan).errors}
    violation = errors["actor_micro_batch_divides_mini"]
    assert "8 sequences" in violation.message
    assert violation.suggested == {"actor.ppo_micro_batch_size_per_gpu": 2}


def test_deprecated_global_micro_is_divided_by_dp_not_multiplied_by_n():
    # verl N4: 4 // 8 = 0 per GPU, a ZeroDivisionError in verl's worker.
    plan = make_plan(overrides={"actor.ppo_micro_batch_size": 4})
    plan = plan.evolve(actor=attrs.evolve(plan.actor, ppo_micro_batch_size_per_gpu=None))
    rules = {v.rule for v in check_plan(plan).errors}
    assert "actor_micro_batch_divides_mini" in rules
    assert "actor_global_micro_batch_consistent" in rules  # 4 * sp 1 < 8 GPUs


def test_both_micro_keys_set_is_rejected():
    plan = make_plan()
    plan = plan.evolve(actor=attrs.evolve(plan.actor, ppo_micro_batch_size=8))
    assert "actor_micro_batch_exactly_one" in {v.rule for v in check_plan(plan).errors}


def test_dynamic_budget_below_longest_sequence_is_rejected():
    plan = make_plan(overrides={"actor.use_dynamic_bsz": True, "actor.ppo_max_token_len_per_gpu": 1000})
    violation = next(v for v in check_plan(plan).errors if v.rule == "token_budget_fits_longest_sequence")
    assert violation.suggested == {"actor.ppo_max_token_len_per_gpu": 1536}


def test_ulysses_needs_heads_and_remove_padding():
    plan = make_plan(overrides={"actor.ulysses_sequence_parallel_size": 8, "model.use_remove_padding": False})
    rules = {v.rule for v in check_plan(plan).errors}
    assert {"ulysses_needs_remove_padding", "ulysses_divides_heads"} <= rules  # 28 heads % 8 != 0


def test_grpo_with_one_sample_is_rejected():
    plan = make_plan(overrides={"rollout.n": 1})
    assert "group_advantage_needs_samples" in {v.rule for v in check_plan(plan).errors}


def test_ignore_eos_with_a_shorter_expected_response_is_an_error_and_unsetting_it_clears_it():
    plan = make_plan(overrides={"rollout.ignore_eos": True, "data.expected_response_length": 256})
    violation = next(v for v in check_plan(plan).errors if v.rule == "ignore_eos_fills_every_response")
    assert "1024 tokens" in violation.message
    fixed = apply_knobs(plan, violation.suggested)
    assert fixed.data.expected_response_length is None
    assert "ignore_eos_fills_every_response" not in {v.rule for v in check_plan(fixed).violations}
    # Without ignore_eos a mean below the maximum is what the data says, not a contradiction.
    assert "ignore_eos_fills_every_response" not in {
        v.rule for v in check_plan(make_plan(overrides={"data.expected_response_length": 256})).violations}


def test_lora_with_sleep_level_2_names_the_fix():
    plan = make_plan(overrides={"model.lora.rank": 32, "rollout.sleep_level": 2, "rollout.load_format": "safetensors"})
    violation = next(v for v in check_plan(plan).errors if v.rule == "adapter_sync_keeps_base_weights")
    assert violation.suggested == {"rollout.sleep_level": 1}


def test_vllm_scheduler_rules():
    plan = make_plan(overrides={"rollout.max_num_batched_tokens": 128, "rollout.max_num_seqs": 256,
                                "rollout.enable_chunked_prefill": False, "stack.verl": "0.8.0"})
    messages = [v.message for v in check_plan(plan).errors if v.rule == "batched_tokens_cover_sequences"]
    assert len(messages) == 2
    # verl 0.9.1 raises max_num_batched_tokens to max_model_len itself: said, not refused.
    raised = check_plan(apply_knobs(plan, {"stack.verl": "0.9.1"}))
    assert [v.severity for v in raised.violations if v.rule == "batched_tokens_cover_sequences"] == ["error",
                                                                                                      "warning"]


def test_rollout_tp_must_divide_heads_and_world():
    plan = make_plan(overrides={"rollout.tensor_model_parallel_size": 3})
    rules = {v.rule for v in check_plan(plan).errors}
    assert {"rollout_tp_divides_world", "rollout_tp_divides_heads"} <= rules


def test_a_pinned_loss_head_the_config_does_not_run_is_a_warning_naming_the_fix():
    assert not [v for v in check_plan(make_plan()).warnings if v.rule == "loss_head_is_what_the_runtime_runs"]
    report = check_plan(make_plan(overrides={"actor.loss_head": "fused"}))
    warnings = [v for v in report.warnings if v.rule == "loss_head_is_what_the_runtime_runs"]
    assert report.valid and len(warnings) == 1 and "use_fused_kernels" in warnings[0].fix
    # Pinning the head the GPU config runs anyway is no warning.
    pinned = check_plan(make_plan(overrides={"actor.loss_head": "flash_attn_ce"}))
    assert all(v.rule != "loss_head_is_what_the_runtime_runs" for v in pinned.warnings)


def test_offload_policy_on_fsdp1_is_an_error_and_beside_phase_offloads_a_warning():
    fsdp1 = check_plan(make_plan(overrides={"actor.strategy": "fsdp", "actor.offload_policy": True}))
    [violation] = [v for v in fsdp1.violations if v.rule == "offload_policy_needs_fsdp2"]
    assert violation.severity == "error" and violation.suggested == {"actor.strategy": "fsdp2"}
    both = check_plan(make_plan(overrides={"actor.offload_policy": True, "actor.param_offload": True}))
    [warning] = [v for v in both.violations if v.rule == "offload_policy_supersedes_offloads"]
    assert warning.severity == "warning" and warning.suggested["actor.param_offload"] is False
    assert not [v for v in check_plan(make_plan(overrides={"actor.offload_policy": True})).violations
                if v.rule.startswith("offload_policy")]


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
    """A comment naming a rule that rules.py does not have sends a reader looking for nothing (issue 25)."""
    planner = Path(__file__).resolve().parents[2] / "planner"
    unknown = {f"{path.relative_to(planner)}: {name}" for path in planner.rglob("*.py")
               for name in _cited_rule_names(path.read_text(encoding="utf-8")) if name not in rule_names()}
    assert unknown == set()


def test_a_cited_rule_name_is_found_in_each_spelling():
    source = ('# the platform rule runtime_rolls_out_with_vllm\n'
              'x = "(rules: rollout_dtype_matches_cpu_trainer)"  # a batch rule (rollout_tp_divides_world)\n'
              '# the `holds_max_model_len` rule\n')
    assert _cited_rule_names(source) == {"runtime_rolls_out_with_vllm", "rollout_dtype_matches_cpu_trainer",
                                         "rollout_tp_divides_world", "holds_max_model_len"}


def test_the_bundled_runtime_refuses_an_estimator_only_verl_computes_and_verl_rules_accept_it():
    from rlplan.planner.platform import Platform

    plan = make_plan(overrides={"algorithm.adv_estimator": "remax", "rollout.n": 1})
    assert "runtime_computes_the_estimator" not in {v.rule for v in check_plan(plan).violations}
    platform_errors = {v.rule for v in check_plan(plan, Platform(device_type="cpu")).errors}
    assert "runtime_computes_the_estimator" in platform_errors
    grpo = {v.rule for v in check_plan(make_plan(), Platform(device_type="cpu")).errors}
    assert "runtime_computes_the_estimator" not in grpo

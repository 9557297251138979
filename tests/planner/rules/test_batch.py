"""The batch rules (planner/rules/batch.py): verl's batch normalization, micro batches, token budgets and dispatch."""

from __future__ import annotations

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from rlplan.planner.hardware import Cluster, GpuSpec
from rlplan.planner.knobs import apply_knobs
from rlplan.planner.layout import plan_layout
from rlplan.planner.plan import RolloutPool
from rlplan.planner.rules import check_plan, rule_names
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


def test_grpo_with_one_sample_is_a_warning_as_verl_runs_it_on_the_raw_score():
    plan = make_plan(overrides={"rollout.n": 1})
    warned = [v for v in check_plan(plan).violations if v.rule == "group_advantage_needs_samples"]
    assert warned and all(v.severity == "warning" for v in warned) and "raw score" in warned[0].message
    assert "group_advantage_needs_samples" not in {v.rule for v in check_plan(plan).errors}


def test_spin_with_an_odd_pair_batch_is_an_error_and_its_fix_removes_it():
    from rlplan.planner.knobs import apply_knobs
    from rlplan.planner.plan import AlgorithmSection

    odd = make_plan(overrides={"data.train_batch_size": 63, "rollout.n": 1, "actor.ppo_mini_batch_size": 63})
    odd = odd.evolve(algorithm=AlgorithmSection(recipe="spin"))
    (error,) = [v for v in check_plan(odd).errors if v.rule == "spin_pairs_responses"]
    assert "63 is odd" in error.message and "skips every actor update" in error.message
    fixed = apply_knobs(odd, error.suggested)
    assert "spin_pairs_responses" not in {v.rule for v in check_plan(fixed).violations}
    grpo = make_plan(overrides={"data.train_batch_size": 63, "rollout.n": 1, "actor.ppo_mini_batch_size": 63})
    assert "spin_pairs_responses" not in {v.rule for v in check_plan(grpo).violations}


def test_the_fully_async_trainers_step_that_does_not_split_over_its_gpus_names_require_batches():
    # verl's recipe/fully_async_policy/shell/dapo_7b_math_fsdp2_4_12.sh (v0.6.1, v0.7.0): 4 x 32 prompts x 16 = 2048
    # sequences over 12 trainer GPUs; _balance_batch's equal partitions assert 2048 % 12 == 0.
    plan = make_plan(overrides={"data.train_batch_size": 128, "actor.ppo_mini_batch_size": 32, "rollout.n": 16})
    plan = plan.evolve(cluster=Cluster(gpu=GpuSpec(name="test", memory_gib=80), nodes=2, gpus_per_node=6),
                       rollout=attrs.evolve(plan.rollout, pool=RolloutPool(nodes=2, gpus_per_node=2, streams=True)))
    refusal = next(v for v in check_plan(plan).errors if v.rule == "dispatch_divisible_by_dp")
    assert "karmarkar_karp" in refusal.message and "async_training.require_batches 4" in refusal.message
    assert "require_batches to a multiple of 3" in refusal.fix
    three = plan.evolve(data=attrs.evolve(plan.data, train_batch_size=3 * 32))
    assert "dispatch_divisible_by_dp" not in {v.rule for v in check_plan(three).errors}

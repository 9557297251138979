"""A step's fixed costs (issue 40): what verl times inside its phases beside the passes, each booked in the phase
whose timer holds it (planner/steptime/passes.py, fsdp.py, rollout.py, step.py; docs/steptime.md)."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlplan.planner.memory import predict_memory
from rlplan.planner.phases import Phase
from rlplan.planner.plan import Plan
from rlplan.planner.profile import DEFAULT_PROFILE, Profile
from rlplan.planner.steptime import StepTime, predict_step_time, verl_timing_seconds
from rlplan.planner.steptime.bands import TimeBand, phase_band, time_band
from tests.planner.plans import make_plan


def step_time(plan: Plan, profile: Profile = DEFAULT_PROFILE) -> StepTime:
    return predict_step_time(plan, predict_memory(plan), profile)


def test_offloaded_shards_cost_the_phases_that_load_them_not_a_phase_of_their_own():
    """verl loads and offloads the actor's shard inside compute_log_prob, update_actor and the sync."""
    plain = make_plan(overrides={"actor.use_kl_loss": True})
    offloaded = make_plan(overrides={"actor.use_kl_loss": True, "actor.param_offload": True,
                                     "actor.optimizer_offload": True})
    before, after = step_time(plain).phase_seconds, step_time(offloaded).phase_seconds
    for phase in (Phase.OLD_LOG_PROB, Phase.ACTOR_UPDATE, Phase.WEIGHT_SYNC):
        assert after[phase] > before[phase], phase
    assert after["offload"] == 0.0
    assert after[Phase.ROLLOUT] == pytest.approx(before[Phase.ROLLOUT])


def test_a_slower_pageable_copy_slows_only_the_phases_that_offload():
    plan = make_plan(overrides={"actor.param_offload": True, "algorithm.adv_estimator": "gae",
                                "critic.ppo_micro_batch_size_per_gpu": 2})
    fast = step_time(plan).phase_seconds
    slow = step_time(plan, attrs.evolve(DEFAULT_PROFILE, pageable_copy_gbps=1.0)).phase_seconds
    assert slow[Phase.OLD_LOG_PROB] > fast[Phase.OLD_LOG_PROB]
    assert slow[Phase.CRITIC_VALUES] == pytest.approx(fast[Phase.CRITIC_VALUES])


def test_a_critic_without_remove_padding_computes_the_padded_sequences():
    """verl's critic has its own use_remove_padding (False by default): its passes run the maximum length."""
    base = {"algorithm.adv_estimator": "gae", "critic.ppo_micro_batch_size_per_gpu": 2,
            "data.expected_prompt_length": 100, "data.expected_response_length": 200}
    # Without the step's fixed costs, what is left is the tokens computed: 1536 padded against 300.
    compute_only = attrs.evolve(DEFAULT_PROFILE, worker_call_seconds=0.0, dataproto_gbps=1e3,
                                micro_batch_seconds_per_layer=0.0, optimizer_step_seconds_per_layer=0.0)
    packed = step_time(make_plan(overrides=base), compute_only).phase_seconds
    padded = step_time(make_plan(overrides={**base, "critic.use_remove_padding": False}), compute_only).phase_seconds
    assert padded[Phase.CRITIC_VALUES] > 2 * packed[Phase.CRITIC_VALUES]
    assert padded[Phase.CRITIC_UPDATE] > 2 * packed[Phase.CRITIC_UPDATE]
    assert padded[Phase.ACTOR_UPDATE] == pytest.approx(packed[Phase.ACTOR_UPDATE])


def test_verl_before_0_4_runs_the_reference_pass_without_a_kl_term():
    plan = make_plan(overrides={"actor.use_kl_loss": False, "algorithm.use_kl_in_reward": False})
    assert Phase.REF_LOG_PROB not in step_time(plan).phase_seconds
    old = plan.evolve(stack=attrs.evolve(plan.stack, verl="0.3.0.post1"))
    assert old.uses_reference
    assert step_time(old).phase_seconds[Phase.REF_LOG_PROB] > 0


@settings(max_examples=25, deadline=None)
@given(batch=st.sampled_from([32, 64, 256]), n=st.sampled_from([1, 4, 8]), estimator=st.sampled_from(["gae", "grpo"]))
def test_the_drivers_reward_and_advantage_grow_with_the_responses_they_score(batch, n, estimator):
    def driver(train_batch: int) -> dict[str, float]:
        plan = make_plan(overrides={"data.train_batch_size": train_batch, "rollout.n": n,
                                    "actor.ppo_mini_batch_size": 16, "algorithm.adv_estimator": estimator,
                                    "critic.ppo_micro_batch_size_per_gpu": 2})
        timings = verl_timing_seconds(step_time(plan))
        assert timings["step"] == pytest.approx(sum(step_time(plan).phase_seconds.values()))
        return timings

    small, large = driver(batch), driver(2 * batch)
    assert large["reward"] > small["reward"] > 0
    assert large["adv"] > small["adv"] > 0


def test_every_worker_call_costs_at_least_its_fixed_host_time():
    plan = make_plan(overrides={"actor.use_kl_loss": True})
    cheap = step_time(plan, attrs.evolve(DEFAULT_PROFILE, worker_call_seconds=0.0)).phase_seconds
    dear = step_time(plan, attrs.evolve(DEFAULT_PROFILE, worker_call_seconds=1.0)).phase_seconds
    for phase in (Phase.OLD_LOG_PROB, Phase.REF_LOG_PROB, Phase.ACTOR_UPDATE):
        assert dear[phase] - cheap[phase] == pytest.approx(1.0), phase


def test_the_rollout_pays_the_engines_wake_up_and_sleep_only_when_it_frees_its_cache():
    sleeping = make_plan(overrides={"rollout.free_cache_engine": True})
    awake = make_plan(overrides={"rollout.free_cache_engine": False})
    assert step_time(sleeping).phase_seconds[Phase.ROLLOUT] > step_time(awake).phase_seconds[Phase.ROLLOUT]


@given(under=st.floats(0.0, 0.95), over=st.floats(0.0, 5.0), predicted=st.floats(0.01, 1e4))
def test_a_band_holds_exactly_the_measurements_its_errors_allow(under, over, predicted):
    band = TimeBand(under=under, over=over, runs=3)
    low, high = band.seconds(predicted)
    assert low <= predicted <= high
    assert band.holds(predicted, low) and band.holds(predicted, high)
    assert not band.holds(predicted, low * 0.99) and not band.holds(predicted, high * 1.01 + 1e-9)


def test_every_fsdp_phase_has_a_band_and_a_key_nobody_measured_gets_the_widest():
    plan = make_plan()
    bands = {key: time_band(plan, key) for key in ("gen", "old_log_prob", "update_actor", "step")}
    assert all(band.runs > 0 for band in bands.values())
    unmeasured = time_band(plan, "no-such-key")
    assert unmeasured.runs == 0
    assert all(unmeasured.under >= b.under and unmeasured.over >= b.over for b in bands.values())
    assert phase_band(plan, Phase.ROLLOUT) == bands["gen"]


def test_verl_before_0_4_times_the_reward_inside_adv_and_computes_the_entropy_in_every_pass():
    plan = make_plan(overrides={"actor.use_kl_loss": True, "actor.entropy_coeff": 0.0})
    old = plan.evolve(stack=attrs.evolve(plan.stack, verl="0.3.0.post1"))
    new, before = step_time(plan).phase_seconds, step_time(old).phase_seconds
    assert "reward" in new and "reward" not in before
    assert before["adv"] == pytest.approx(new["adv"] + new["reward"])
    # The reference pass and the update (entropy_coeff 0) compute the entropy over the vocabulary too; this
    # update's micro batches wait on FSDP's collectives, which hide it.
    assert before[Phase.REF_LOG_PROB] > new[Phase.REF_LOG_PROB]
    assert before[Phase.ACTOR_UPDATE] >= new[Phase.ACTOR_UPDATE]

"""One step's seconds per phase: the rollout priced here, every trainer pass through the plan's training
backend (steptime.backend), and the same under verl's `timing_s/*` keys."""

from __future__ import annotations

import attrs
from attrs import frozen

from rlplan.planner.layout import PlanLayout, plan_layout, reuses_update_log_probs
from rlplan.planner.memory import MemoryReport
from rlplan.planner.phases import Phase
from rlplan.planner.plan import Plan
from rlplan.planner.profile import DEFAULT_PROFILE, Profile
from rlplan.planner.stack import ENTROPY_IN_EVERY_PASS, REWARD_TIMED_IN_ADV, holds
from rlplan.planner.steptime.backend import trainer_timing
from rlplan.planner.steptime.lengths import workload_lengths
from rlplan.planner.steptime.passes import StepContext, worker_call_seconds
from rlplan.planner.steptime.rates import Rates
from rlplan.planner.steptime.rollout import engine_weight_load_seconds, rollout_host_seconds, rollout_seconds


@frozen
class StepTime:
    phase_seconds: dict[str, float] = attrs.field(factory=dict)
    # The rollout on a pool of its own (plan.RolloutPool) generates the next batch while the trainer trains on
    # this one: see total_seconds.
    overlapped: bool = False

    @property
    def total_seconds(self) -> float:
        """The phases' sum; overlapped, the longer of generation and training, then the weight sync. verl's
        one-step-off recipe (v0.6.1 recipe/one_step_off_policy/ray_trainer.py fit: wait for the previous batch's
        generation, sync_rollout_weights on both pools, launch the next batch's generate_sequences asynchronously
        (_async_gen_next_batch), then this batch's log-probs and updates) and the fully async one
        (v0.7.0 recipe/fully_async_policy: the rollouter streams samples while the trainer trains, and pauses for
        the parameter sync) hide the shorter of the two behind the longer."""
        if not self.overlapped:
            return sum(self.phase_seconds.values())
        generation_keys = (Phase.ROLLOUT, GREEDY_BASELINE)
        generation = sum(s for k, s in self.phase_seconds.items() if k in generation_keys)
        sync = self.phase_seconds.get(Phase.WEIGHT_SYNC, 0.0)
        training = sum(s for k, s in self.phase_seconds.items()
                       if k not in generation_keys and k != Phase.WEIGHT_SYNC)
        return max(generation, training) + sync


def predict_step_time(plan: Plan, memory: MemoryReport, profile: Profile = DEFAULT_PROFILE,
                      layout: PlanLayout | None = None) -> StepTime:
    """Seconds of each phase of one step of `plan` at its expected lengths (keys: Phase names, "offload", and
    the driver's "reward" and "adv")."""
    layout = layout or plan_layout(plan)
    rates = Rates(plan, profile)
    lengths = workload_lengths(plan, profile)
    ctx = StepContext(plan=plan, layout=layout, rates=rates, profile=profile, lengths=lengths)
    trainer = trainer_timing(plan)
    # Phases by name, plus "offload" (verl's between-phase moves, which belong to no one phase).
    phases: dict[str, float] = {
        Phase.WEIGHT_SYNC: trainer.weight_sync_gather_seconds(ctx) + engine_weight_load_seconds(plan, rates),
        Phase.ROLLOUT: (rollout_seconds(plan, memory, rates, profile, layout, lengths)
                        + rollout_host_seconds(plan, profile, layout)),
    }
    # Only rlplan's runtime runs a CPU plan, and it skips the pass on-policy; verl runs it on GPUs regardless.
    if not (plan.cluster.gpu.is_cpu and reuses_update_log_probs(plan, layout)):
        phases[Phase.OLD_LOG_PROB] = trainer.forward_seconds(ctx, layout.old_log_prob, critic=False, entropy=True)
    if layout.ref_log_prob is not None:
        # Before verl 0.4 every pass computes the entropy, the reference's too (stack.ENTROPY_IN_EVERY_PASS).
        phases[Phase.REF_LOG_PROB] = trainer.forward_seconds(ctx, layout.ref_log_prob, critic=False,
                                                             entropy=holds(ENTROPY_IN_EVERY_PASS, plan.stack))
    if layout.critic_values is not None and layout.critic_update is not None:
        phases[Phase.CRITIC_VALUES] = trainer.forward_seconds(ctx, layout.critic_values, critic=True, entropy=False)
        phases[Phase.CRITIC_UPDATE] = trainer.update_seconds(ctx, layout.critic_update, critic=True)
    phases[Phase.ACTOR_UPDATE] = trainer.update_seconds(ctx, layout.actor_update, critic=False)
    for phase in TRAINER_CALLS:
        if phase in phases:
            phases[phase] += worker_call_seconds(ctx, phase)
    phases["offload"] = trainer.offload_seconds(ctx)
    phases.update(driver_seconds(plan, profile))
    if plan.algorithm.estimator.greedy_baseline:
        # ReMax: a second generate_sequences of the batch's prompts, greedy, one response each, behind its own
        # wake-up and weight load (each call enters the rollout's sharding manager, or the agent loop's wake/sleep).
        phases[GREEDY_BASELINE] = phases[Phase.WEIGHT_SYNC] + rollout_seconds(
            plan, memory, rates, profile, layout, lengths, responses_per_prompt=1)
    return StepTime(phases, overlapped=plan.rollout_is_split)


# ReMax's greedy baseline generation (verl's `timing_s/gen_max`): the rollout engine's footprint, at most the
# rollout phase's sequences, so the memory model's rollout phase bounds it; its time is its own.
GREEDY_BASELINE = "greedy_baseline"


# The trainer phases verl runs as one call to a worker group each (ray_trainer.fit).
TRAINER_CALLS = (Phase.OLD_LOG_PROB, Phase.REF_LOG_PROB, Phase.CRITIC_VALUES, Phase.CRITIC_UPDATE,
                 Phase.ACTOR_UPDATE)


def driver_seconds(plan: Plan, profile: Profile) -> dict[str, float]:
    """The driver's own phases (ray_trainer.fit's `reward` and `adv` timers): a rule reward scores every
    response in a Python loop; GAE steps back over the response positions on the batch's columns, a group
    advantage (GRPO, RLOO, ...) loops over the responses by prompt."""
    if plan.cluster.gpu.is_cpu:
        return {}
    sequences = plan.data.train_batch_size * plan.rollout.n
    positions = plan.data.max_response_length
    if plan.algorithm.adv_estimator == "gae":
        advantage = positions * (profile.gae_seconds_per_position + sequences * profile.gae_seconds_per_token)
    else:
        advantage = sequences * profile.grouped_advantage_seconds_per_sequence
    reward = sequences * profile.reward_seconds_per_sequence
    if holds(REWARD_TIMED_IN_ADV, plan.stack):
        # Before verl 0.4 the reward function runs inside the `adv` timer.
        return {"adv": reward + advantage}
    return {"reward": reward, "adv": advantage}


# verl's `timing_s/<key>` each phase falls under: gen times the weight sync and sleep/wake beside generation
# (in the versions of the published runs), and the actor's loads and offloads run inside its worker calls,
# of which the update moves the most.
VERL_TIMING_OF_PHASE: dict[str, str] = {
    Phase.ROLLOUT: "gen",
    Phase.WEIGHT_SYNC: "gen",
    Phase.OLD_LOG_PROB: "old_log_prob",
    Phase.REF_LOG_PROB: "ref",
    Phase.CRITIC_VALUES: "values",
    Phase.CRITIC_UPDATE: "update_critic",
    Phase.ACTOR_UPDATE: "update_actor",
    "offload": "update_actor",
    "reward": "reward",
    "adv": "adv",
    GREEDY_BASELINE: "gen_max",
}


def verl_timing_seconds(step: StepTime) -> dict[str, float]:
    """Predicted seconds under verl's `timing_s/*` keys (gen, old_log_prob, ref, values, update_critic,
    update_actor) and `step`, their sum: what a verl console log prints to compare with."""
    timings: dict[str, float] = {}
    for phase, seconds in step.phase_seconds.items():
        key = VERL_TIMING_OF_PHASE.get(str(phase), str(phase))
        timings[key] = timings.get(key, 0.0) + seconds
    timings["step"] = step.total_seconds
    return timings

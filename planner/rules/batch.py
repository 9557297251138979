"""The batch rules: verl's batch sizes, micro batches, token budgets and dispatch, and the groups an advantage
compares (shared/reference/verl-rules.md sections 1-4, cited in brackets).

verl checks them in validate_config and its config dataclasses, normalizes the global sizes to per-GPU ones in
the worker constructors, and asserts the rest when it dispatches and packs a batch, mostly as bare asserts after
minutes of model loading; here each is named, with its numbers and its smallest fix.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from rlplan.planner.knobs import knob_value
from rlplan.planner.layout import normalized_micro_batch
from rlplan.planner.phases import PASS_KNOBS, TOKEN_BUDGET_KEY, Phase
from rlplan.planner.plan import Plan
from rlplan.planner.rules.registry import (
    ROLLOUT_MODE_KEY,
    RuleContext,
    Violation,
    _largest_divisor_at_most,
    _next_multiple,
    _smallest_train_batch,
    passthrough_value,
    rule,
)
from rlplan.planner.stack import (
    AGENT_LOOP,
    ASYNC_ROLLOUT_DEFAULT,
    ENGINE_MICRO_SPLIT_ASSERT,
    ENGINE_WORKER,
    MEGATRON_MICRO_SPLIT_ASSERT,
    PROMPTS_DISPATCHED_BEFORE_REPEAT,
    REAL_BATCH_CHECKED_UNDER_DYNAMIC_BSZ,
    holds,
)


@rule("config", "[V2] without dynamic bsz (with it too before verl 0.6), train_batch_size * n % n_gpus == 0")
def _real_batch_divisible_by_world(ctx: RuleContext) -> Iterator[Violation]:
    plan = ctx.plan
    world, n, tbs = plan.cluster.world_size, plan.rollout.n, plan.data.train_batch_size
    checked = not plan.actor.use_dynamic_bsz or holds(REAL_BATCH_CHECKED_UNDER_DYNAMIC_BSZ, plan.stack)
    if checked and (tbs * n) % world:
        better = _smallest_train_batch(tbs, n, world)
        yield ctx.violation(
            f"train_batch_size * rollout.n = {tbs} * {n} = {tbs * n} sequences is not divisible by the {world} GPUs.",
            f"set data.train_batch_size = {better} (or enable actor.use_dynamic_bsz)",
            data__train_batch_size=better,
        )


@rule("runtime", "the sync rollout's train_batch_size prompts split evenly over the GPUs (verl < 0.5)",
      applies=PROMPTS_DISPATCHED_BEFORE_REPEAT)
def _prompts_dispatch_divisible_by_world(ctx: RuleContext) -> Iterator[Violation]:
    """Before the agent loop (v0.5.0) every rollout was the sync one, and its prompts reach the workers before the
    n-fold repeat (stack.PROMPTS_DISPATCHED_BEFORE_REPEAT): DataProto.chunk asserts they split evenly."""
    plan = ctx.plan
    world, tbs = plan.cluster.world_size, plan.data.train_batch_size
    if tbs % world:
        better = _next_multiple(tbs, world)
        yield ctx.violation(
            f"verl {plan.stack.verl} sends the {tbs} prompts of a step to the rollout before repeating them n times, "
            f"split over the {world} GPUs, and they do not split evenly (its DataProto.chunk asserts they do).",
            f"set data.train_batch_size = {better}", data__train_batch_size=better,
        )


@rule("config", "[V3] train_batch_size >= ppo_mini_batch_size (prompts)")
def _mini_batch_within_train_batch(ctx: RuleContext) -> Iterator[Violation]:
    plan = ctx.plan
    tbs, mini = plan.data.train_batch_size, plan.actor.ppo_mini_batch_size
    if not plan.actor.use_dynamic_bsz and tbs < mini:
        yield ctx.violation(
            f"actor.ppo_mini_batch_size ({mini} prompts) exceeds data.train_batch_size ({tbs} prompts).",
            f"set actor.ppo_mini_batch_size = {tbs}",
            actor__ppo_mini_batch_size=tbs,
        )


# Where verl refuses a pass's micro-batch keys, before any worker starts (read at v0.5.0 and v0.6.1).
_MICRO_KEY_CHECK = (": verl's config check raises on it (ray_trainer.py _validate_config check_mutually_exclusive "
                    "before v0.6.0; from v0.6.0 verl/workers/config/actor.py ActorConfig.__post_init__ for the actor "
                    "and verl/utils/config.py validate_config for the log-prob passes).")


def _exactly_one(ctx: RuleContext, what: str, phase: Phase,
                 per_gpu: int | None, global_value: int | None, default_per_gpu: int) -> Iterator[Violation]:
    per_gpu_key, global_key = PASS_KNOBS[phase].micro_batch, PASS_KNOBS[phase].legacy_micro_batch
    if per_gpu is not None and global_value is not None:
        yield ctx.violation(
            f"both {global_key} = {global_value} (deprecated, global) and {per_gpu_key} = {per_gpu} are set for {what}"
            f"{_MICRO_KEY_CHECK}",
            f"remove {global_key}",
        )
    elif per_gpu is None and global_value is None:
        yield ctx.violation(
            f"neither {per_gpu_key} nor {global_key} is set for {what}, and dynamic batch size is off"
            f"{_MICRO_KEY_CHECK}",
            f"set {per_gpu_key} = {default_per_gpu} (or enable dynamic batch size)",
            **{per_gpu_key.replace(".", "__"): default_per_gpu},
        )


@rule("config", "[3 ActorConfig] without dynamic bsz, exactly one actor micro-batch key")
def _actor_micro_batch_exactly_one(ctx: RuleContext) -> Iterator[Violation]:
    actor = ctx.plan.actor
    if not actor.use_dynamic_bsz:
        yield from _exactly_one(
            ctx, "the actor update", Phase.ACTOR_UPDATE,
            actor.ppo_micro_batch_size_per_gpu, actor.ppo_micro_batch_size, 1,
        )


@rule("config",
      "[V3] a global ppo_micro_batch_size divides ppo_mini_batch_size and micro * sp >= n_gpus")
def _actor_global_micro_batch_consistent(ctx: RuleContext) -> Iterator[Violation]:
    plan, actor = ctx.plan, ctx.plan.actor
    micro = actor.ppo_micro_batch_size
    if actor.use_dynamic_bsz or micro is None:
        return
    world, sp = plan.cluster.world_size, actor.ulysses_sequence_parallel_size
    if actor.ppo_mini_batch_size % micro:
        better = _largest_divisor_at_most(actor.ppo_mini_batch_size, micro)
        yield ctx.violation(
            f"actor.ppo_mini_batch_size ({actor.ppo_mini_batch_size}) is not divisible by the global "
            f"actor.ppo_micro_batch_size ({micro}).",
            f"replace actor.ppo_micro_batch_size with actor.ppo_micro_batch_size_per_gpu, or set it to {better}",
            actor__ppo_micro_batch_size=better,
        )
    if micro * sp < world:
        yield ctx.violation(
            f"the global actor.ppo_micro_batch_size ({micro}) times Ulysses sp ({sp}) is below the {world} GPUs, "
            "so some GPUs would get no micro batch.",
            f"set actor.ppo_micro_batch_size >= {math.ceil(world / sp)}, or use actor.ppo_micro_batch_size_per_gpu",
            actor__ppo_micro_batch_size=math.ceil(world / sp),
        )


@rule("config",
      "[V4] without actor dynamic bsz, exactly one log-prob micro-batch key for rollout (and ref when used)")
def _log_prob_micro_batch_exactly_one(ctx: RuleContext) -> Iterator[Violation]:
    plan = ctx.plan
    if plan.actor.use_dynamic_bsz:
        return
    yield from _exactly_one(
        ctx, "the old-log-prob pass", Phase.OLD_LOG_PROB,
        plan.rollout.log_prob_micro_batch_size_per_gpu, plan.rollout.log_prob_micro_batch_size, 1,
    )
    if plan.uses_reference:
        yield from _exactly_one(
            ctx, "the reference log-prob pass", Phase.REF_LOG_PROB,
            plan.ref.log_prob_micro_batch_size_per_gpu, plan.ref.log_prob_micro_batch_size, 1,
        )


@rule("config",
      "[V7, 3 CriticConfig] critic mini <= train batch, exactly one micro key, global micro divides mini and covers GPUs")
def _critic_batch_consistent(ctx: RuleContext) -> Iterator[Violation]:
    plan = ctx.plan
    if not plan.uses_critic or plan.critic.use_dynamic_bsz:
        return
    critic = plan.critic
    mini = ctx.layout.critic_ppo_mini_batch_size
    assert mini is not None, "the layout has a critic whenever the plan uses one"
    if plan.data.train_batch_size < mini:
        yield ctx.violation(
            f"critic.ppo_mini_batch_size ({mini}) exceeds data.train_batch_size ({plan.data.train_batch_size}).",
            f"set critic.ppo_mini_batch_size = {plan.data.train_batch_size}",
            critic__ppo_mini_batch_size=plan.data.train_batch_size,
        )
    yield from _exactly_one(
        ctx, "the critic update", Phase.CRITIC_UPDATE,
        critic.ppo_micro_batch_size_per_gpu, critic.ppo_micro_batch_size, 1,
    )
    micro = critic.ppo_micro_batch_size
    if micro is not None:
        world, sp = plan.cluster.world_size, critic.ulysses_sequence_parallel_size
        if mini % micro:
            yield ctx.violation(
                f"critic mini batch ({mini}) is not divisible by the global critic.ppo_micro_batch_size ({micro}).",
                f"set critic.ppo_micro_batch_size = {_largest_divisor_at_most(mini, micro)}",
                critic__ppo_micro_batch_size=_largest_divisor_at_most(mini, micro),
            )
        if micro * sp < world:
            yield ctx.violation(
                f"the global critic.ppo_micro_batch_size ({micro}) times sp ({sp}) is below the {world} GPUs.",
                f"set critic.ppo_micro_batch_size >= {math.ceil(world / sp)}",
                critic__ppo_micro_batch_size=math.ceil(world / sp),
            )


def _micro_key(phase: Phase, per_gpu: int | None) -> str:
    """The micro-batch key a pass's plan sets: the per-GPU one, else verl's older global one."""
    knobs = PASS_KNOBS[phase]
    key = knobs.micro_batch if per_gpu is not None else knobs.legacy_micro_batch
    assert key is not None, f"{phase} has no global micro-batch key"
    return key


def _mini_micro_assert(plan: Plan) -> str:
    """Which verl code refuses a micro batch that does not divide the mini batch per GPU ("" where nothing does).
    The legacy FSDP workers assert it at start (fsdp_workers.py __init__, the actor's and the critic's, v0.3 on);
    the engine worker's prepare_micro_batches asserts it (stack.ENGINE_MICRO_SPLIT_ASSERT). verl's legacy Megatron
    workers assert it only before v0.4.0 (stack.MEGATRON_MICRO_SPLIT_ASSERT); from v0.4.0 megatron_actor.py /
    megatron_critic.py split the mini batch with `batch.split(micro_batch_size)` and run a short last one."""
    if holds(ENGINE_MICRO_SPLIT_ASSERT, plan.stack):
        return (": verl's engine worker asserts it (verl/workers/engine/utils.py prepare_micro_batches: "
                "total_data_size % micro_batch_size_per_gpu == 0)")
    if plan.is_megatron:
        return (": verl's Megatron worker asserts it (megatron_actor.py split_dict_tensor_into_batches)"
                if holds(MEGATRON_MICRO_SPLIT_ASSERT, plan.stack) else "")
    return (": verl's FSDP worker asserts it at start (fsdp_workers.py __init__: \"normalized ppo_mini_batch_size "
            "... should be divisible by ppo_micro_batch_size_per_gpu\")")


def _micro_rules(ctx: RuleContext, section: str, mini_prompts: int, mini_per_gpu: int, micro_key: str,
                 micro_per_gpu: int | None, from_global: bool) -> Iterator[Violation]:
    """[N3, N5] normalized mini > 0; a set micro batch divides it and is at most it."""
    if mini_per_gpu <= 0:
        yield ctx.violation(
            f"{section}.ppo_mini_batch_size = {mini_prompts} prompts normalizes to 0 sequences per data-parallel rank.",
            f"raise {section}.ppo_mini_batch_size so that ppo_mini_batch_size * n >= dp",
        )
        return
    if micro_per_gpu is None:
        return
    if micro_per_gpu <= 0:
        yield ctx.violation(
            f"the global {micro_key} normalizes to 0 per GPU (it is divided by dp, not multiplied by n).",
            f"use {section}.ppo_micro_batch_size_per_gpu = 1 instead",
            **{f"{section}__ppo_micro_batch_size_per_gpu": 1},
        )
        return
    if mini_per_gpu % micro_per_gpu or mini_per_gpu // micro_per_gpu == 0:
        asserted = _mini_micro_assert(ctx.plan)
        if not asserted:
            return
        better = _largest_divisor_at_most(mini_per_gpu, micro_per_gpu)
        source = f"the global {micro_key} normalized to" if from_global else f"{micro_key} ="
        yield ctx.violation(
            f"the mini batch per GPU ({section}.ppo_mini_batch_size * n / dp = {mini_per_gpu} sequences) is not a "
            f"multiple of the micro batch ({source} {micro_per_gpu}){asserted}.",
            f"set {section}.ppo_micro_batch_size_per_gpu = {better}",
            **{f"{section}__ppo_micro_batch_size_per_gpu": better},
        )


@rule("worker",
      "[N3, N5] normalized actor mini > 0, and a set micro batch per GPU divides it")
def _actor_micro_batch_divides_mini(ctx: RuleContext) -> Iterator[Violation]:
    plan, dp = ctx.plan, ctx.layout.parallel.dp
    if dp <= 0:
        return
    actor = plan.actor
    micro = normalized_micro_batch(actor.ppo_micro_batch_size_per_gpu, actor.ppo_micro_batch_size, dp)
    mini_per_gpu = ctx.layout.actor_update.mini_batch_size_per_gpu
    assert mini_per_gpu is not None, "an update pass has a mini batch"
    yield from _micro_rules(
        ctx, "actor", actor.ppo_mini_batch_size, mini_per_gpu,
        _micro_key(Phase.ACTOR_UPDATE, actor.ppo_micro_batch_size_per_gpu),
        micro, actor.ppo_micro_batch_size_per_gpu is None,
    )


@rule("worker",
      "[2b] normalized critic mini > 0, and a set critic micro batch per GPU divides it")
def _critic_micro_batch_divides_mini(ctx: RuleContext) -> Iterator[Violation]:
    plan = ctx.plan
    if not plan.uses_critic or ctx.layout.critic_parallel is None or ctx.layout.critic_parallel.dp <= 0:
        return
    critic, dp, mini = plan.critic, ctx.layout.critic_parallel.dp, ctx.layout.critic_ppo_mini_batch_size
    update = ctx.layout.critic_update
    assert mini is not None and update is not None and update.mini_batch_size_per_gpu is not None, (
        "the layout has a critic whenever the plan uses one")
    micro = normalized_micro_batch(critic.ppo_micro_batch_size_per_gpu, critic.ppo_micro_batch_size, dp)
    yield from _micro_rules(
        ctx, "critic", mini, update.mini_batch_size_per_gpu,
        _micro_key(Phase.CRITIC_UPDATE, critic.ppo_micro_batch_size_per_gpu),
        micro, critic.ppo_micro_batch_size_per_gpu is None,
    )


@rule("worker", "[N6] a global log-prob micro batch must not normalize to 0")
def _log_prob_micro_batch_positive(ctx: RuleContext) -> Iterator[Violation]:
    plan, dp = ctx.plan, ctx.layout.parallel.dp
    pairs = [(Phase.OLD_LOG_PROB, plan.rollout.log_prob_micro_batch_size, plan.rollout.log_prob_use_dynamic_bsz)]
    if plan.uses_reference:
        pairs.append((Phase.REF_LOG_PROB, plan.ref.log_prob_micro_batch_size, plan.ref.log_prob_use_dynamic_bsz))
    for phase, global_size, dynamic in pairs:
        if global_size is not None and not dynamic and dp > 0 and global_size // dp == 0:
            knobs = PASS_KNOBS[phase]
            yield ctx.violation(
                f"the global {knobs.legacy_micro_batch} = {global_size} normalizes to 0 per GPU over "
                f"{dp} data-parallel ranks.",
                f"replace it with {knobs.micro_batch} = 1",
                **{knobs.micro_batch.replace(".", "__"): 1},
            )


@rule("worker",
      "[2e] verl's engine worker asserts actor.use_dynamic_bsz == rollout.log_prob_use_dynamic_bsz",
      applies=ENGINE_WORKER)
def _dynamic_bsz_flags_agree(ctx: RuleContext) -> Iterator[Violation]:
    plan = ctx.plan
    if plan.actor.use_dynamic_bsz != plan.rollout.log_prob_use_dynamic_bsz:
        yield ctx.violation(
            f"actor.use_dynamic_bsz = {str(plan.actor.use_dynamic_bsz).lower()} but "
            f"rollout.log_prob_use_dynamic_bsz = {str(plan.rollout.log_prob_use_dynamic_bsz).lower()}; verl's "
            f"engine worker (the default from verl 0.8; this plan targets {plan.stack.verl}) asserts they agree.",
            f"set rollout.log_prob_use_dynamic_bsz = {str(plan.actor.use_dynamic_bsz).lower()}",
            rollout__log_prob_use_dynamic_bsz=plan.actor.use_dynamic_bsz,
        )


@rule("worker",
      "[2e] ppo_mini_batch_size * n splits evenly over the dp ranks (engine worker's train_mini_batch)",
      applies=ENGINE_WORKER)
def _mini_batch_divisible_by_dp(ctx: RuleContext) -> Iterator[Violation]:
    """verl/workers/engine_workers.py train_mini_batch asserts `mini_batch_size % dp == 0` (v0.8.0 on). The legacy
    workers (fsdp_workers.py / megatron_workers.py __init__, v0.3-v0.7.x) floor-divide ppo_mini_batch_size * n by
    dp and run a short last mini batch (rule mini_batches_split_evenly warns of it)."""
    plan = ctx.plan
    pairs = [("actor", plan.actor.ppo_mini_batch_size, ctx.layout.parallel.dp)]
    critic_mini = ctx.layout.critic_ppo_mini_batch_size
    if plan.uses_critic and ctx.layout.critic_parallel is not None and critic_mini is not None:
        pairs.append(("critic", critic_mini, ctx.layout.critic_parallel.dp))
    n = plan.rollout.n
    for section, mini, dp in pairs:
        if dp > 0 and (mini * n) % dp:
            better = _next_multiple(mini, dp // math.gcd(dp, n))
            yield ctx.violation(
                f"{section}.ppo_mini_batch_size * n = {mini} * {n} = {mini * n} sequences per optimizer step do "
                f"not split evenly over {dp} data-parallel ranks (verl 0.8 silently floor-divides, 0.9 asserts).",
                f"set {section}.ppo_mini_batch_size = {better}",
                **{f"{section}__ppo_mini_batch_size": better},
            )


@rule("config",
      "[N4, N6] global micro-batch keys: normalized per GPU by verl <= 0.7's worker, unread by verl >= 0.8's engine")
def _deprecated_global_micro_batch_keys(ctx: RuleContext) -> Iterator[Violation]:
    """The legacy worker (v0.3-v0.7.x fsdp_workers.py __init__) divides a global micro batch by dp; the engine worker
    (stack.ENGINE_WORKER, v0.8.0 on) passes only the *_per_gpu keys on and, without dynamic batch size, asserts the
    actor's and the rollout's are set (engine_workers.py ActorRolloutRefWorker.init_model, v0.8.0 lines 563-577);
    the reference's arrives as None and prepare_micro_batches fails on it at the first step (engine/utils.py)."""
    plan, dp = ctx.plan, max(ctx.layout.parallel.dp, 1)
    engine = holds(ENGINE_WORKER, plan.stack, plan.rollout.name, plan.passthrough)
    for phase in (Phase.ACTOR_UPDATE, Phase.OLD_LOG_PROB, Phase.REF_LOG_PROB):
        knobs = PASS_KNOBS[phase]
        key, per_gpu_key = knobs.legacy_micro_batch, knobs.micro_batch
        value = knob_value(plan, key) if key else None
        if value is None:
            continue
        per_gpu = max(1, value // dp)
        if engine and not knob_value(plan, knobs.dynamic_bsz) and knob_value(plan, per_gpu_key) is None:
            yield ctx.violation(
                f"{key} = {value} is a deprecated global key that verl {plan.stack.verl}'s engine worker does not "
                f"read: it needs {per_gpu_key}, which is unset (it asserts it at start-up, or fails at the first "
                "step).", f"replace it with {per_gpu_key} = {per_gpu}",
                **{per_gpu_key.replace(".", "__"): per_gpu, key.replace(".", "__"): None},
            )
            continue
        yield ctx.violation(
            f"{key} = {value} is a deprecated global key: verl <= 0.7's worker turns it into {per_gpu} per GPU "
            f"(divided by dp = {dp}, not multiplied by n); from verl 0.8 the engine worker reads only {per_gpu_key}.",
            f"replace it with {per_gpu_key} = {per_gpu}", severity="warning",
        )


@rule("runtime",
      "[R1] with dynamic bsz, max_token_len_per_gpu * sp >= max_prompt_length + max_response_length")
def _token_budget_fits_longest_sequence(ctx: RuleContext) -> Iterator[Violation]:
    longest = ctx.plan.data.max_sequence_length
    for role in ctx.layout.roles:
        budget = role.token_budget_per_sp_group
        if budget is not None and budget < longest:
            needed = math.ceil(longest / role.sequence_parallel_size)
            key = TOKEN_BUDGET_KEY[role.role]
            yield ctx.violation(
                f"{key} = {role.max_token_len_per_gpu} (x sp {role.sequence_parallel_size} = {budget} "
                f"tokens) cannot hold one full sequence of {longest} tokens (prompt + response).",
                f"set {key} >= {needed} (verl recommends 2-3x that)",
                **{key.replace(".", "__"): needed},
            )


@rule("runtime",
      "[R3, R4] train_batch_size * n sequences split evenly over the dp ranks (dispatch and balance_batch)")
def _dispatch_divisible_by_dp(ctx: RuleContext) -> Iterator[Violation]:
    plan, dp = ctx.plan, ctx.layout.parallel.dp
    if dp <= 0:
        return
    total = plan.data.train_batch_size * plan.rollout.n
    if not total % dp and total >= dp:
        return
    why = (f"do not split evenly over {dp} data-parallel ranks: verl balances the step's batch over them in "
           "equal parts (ray_trainer.py _balance_batch: seqlen_balancing.karmarkar_karp asserts len % k_partitions "
           "== 0) and dispatches it with DataProto.chunk (protocol.py asserts len % chunks == 0).")
    pool = plan.rollout.pool
    if pool is not None and pool.streams:  # the fully async recipe: the step is require_batches mini batches
        mini = plan.actor.ppo_mini_batch_size
        step = dp // math.gcd(dp, mini * plan.rollout.n)
        yield ctx.violation(
            f"{total} sequences per step (async_training.require_batches {plan.data.train_batch_size // mini} x "
            f"ppo_mini_batch_size {mini} x n {plan.rollout.n}, verl's fully async trainer) {why}",
            f"set async_training.require_batches to a multiple of {step}, or give the trainer a number of GPUs "
            f"that divides {total}")
        return
    better = _smallest_train_batch(plan.data.train_batch_size, plan.rollout.n, dp)
    yield ctx.violation(
        f"{total} sequences per step (train_batch_size {plan.data.train_batch_size} x n {plan.rollout.n}) {why}",
        f"set data.train_batch_size = {better}", data__train_batch_size=better,
    )


@rule("runtime",
      "[2e] a fixed log-prob micro batch divides each rank's share of the batch (engine worker's split)",
      applies=ENGINE_MICRO_SPLIT_ASSERT)
def _log_prob_micro_batch_divides_batch(ctx: RuleContext) -> Iterator[Violation]:
    """verl/workers/engine/utils.py prepare_micro_batches asserts `total_data_size % (force_group_size *
    micro_batch_size_per_gpu) == 0` (v0.7.1 on, the engine worker's). The legacy workers (v0.3-v0.7.x:
    dp_actor.py compute_log_prob, `batch.split(micro_batch_size)`) take a short last micro batch instead."""
    for role in (ctx.layout.old_log_prob, ctx.layout.ref_log_prob):
        if role is None:  # no reference pass
            continue
        micro = role.micro_batch_size_per_gpu
        if micro is None or micro <= 0 or role.sequences_per_gpu <= 0:
            continue
        if role.sequences_per_gpu % micro:
            better = _largest_divisor_at_most(role.sequences_per_gpu, micro)
            key = PASS_KNOBS[role.role].micro_batch
            yield ctx.violation(
                f"{role.sequences_per_gpu} sequences per GPU do not split into log-prob micro batches of {micro}.",
                f"set {key} = {better}", **{key.replace(".", "__"): better},
            )


@rule("runtime",
      "[R2] train_batch_size * n splits evenly over rollout.agent_num_workers (verl's agent loop)",
      applies=AGENT_LOOP)
def _agent_loop_chunks_evenly(ctx: RuleContext) -> Iterator[Violation]:
    """The agent loop (v0.5.0 on) runs only for an async rollout: rollout.mode=async in v0.5.0-v0.6.1, always from
    v0.7.0 (stack.ASYNC_ROLLOUT_DEFAULT); the sync rollout generates the whole batch in the trainer's process."""
    plan = ctx.plan
    if not holds(ASYNC_ROLLOUT_DEFAULT, plan.stack) and \
            passthrough_value(plan, ROLLOUT_MODE_KEY, "sync").strip("'\"") != "async":
        return
    total, workers = plan.data.train_batch_size * plan.rollout.n, plan.rollout.agent_num_workers
    if total % workers:
        better = math.gcd(total, workers)
        yield ctx.violation(
            f"{total} sequences per step do not split evenly over rollout.agent_num_workers = {workers} (verl's "
            f"actor_rollout_ref.rollout.agent.num_workers): verl "
            f"{plan.stack.verl}'s AgentLoopManager.generate_sequences splits the batch with "
            "prompts.chunk(num_workers) (verl/experimental/agent_loop/agent_loop.py) and DataProto.chunk asserts "
            "len % chunks == 0 (verl/protocol.py), so the first step fails.",
            f"set rollout.agent_num_workers = {better}", rollout__agent_num_workers=better,
        )


@rule("rlplan", "GRPO/RLOO compare n > 1 responses per prompt")
def _group_advantage_needs_samples(ctx: RuleContext) -> Iterator[Violation]:
    plan = ctx.plan
    if plan.algorithm.adv_estimator in ("grpo", "rloo") and plan.rollout.n < 2:
        # verl runs it: a one-response group gets mean 0 and std 1 (core_algos.py
        # compute_grpo_outcome_advantage, and RLOO's leave-one-out needs two), so the advantage is the raw score.
        yield ctx.violation(
            f"{plan.algorithm.adv_estimator} compares the responses of each prompt's group, and rollout.n = "
            f"{plan.rollout.n} leaves one per group: verl then uses the raw score as the advantage (no baseline, "
            "REINFORCE without variance reduction).",
            "set rollout.n >= 2 (GRPO commonly uses 5-16)", severity="warning", rollout__n=5,
        )
    if plan.algorithm.adv_estimator in ("grpo", "rloo") and plan.rollout.temperature == 0:
        yield ctx.violation(
            "rollout.temperature = 0 samples the same response n times, so group advantages are all zero.",
            "set rollout.temperature = 1.0", severity="warning", rollout__temperature=1.0,
        )


@rule("rlplan", "the per-GPU batch is a whole number of equal mini batches")
def _mini_batches_split_evenly(ctx: RuleContext) -> Iterator[Violation]:
    for role in (ctx.layout.actor_update, ctx.layout.critic_update):
        if role is None or not role.mini_batch_size_per_gpu or role.sequences_per_gpu <= 0:
            continue
        if role.sequences_per_gpu % role.mini_batch_size_per_gpu:
            section = "actor" if role.role == Phase.ACTOR_UPDATE else "critic"
            yield ctx.violation(
                f"{role.sequences_per_gpu} sequences per GPU split into mini batches of "
                f"{role.mini_batch_size_per_gpu}: the last optimizer step sees a smaller batch.",
                f"make data.train_batch_size a multiple of {section}.ppo_mini_batch_size", severity="warning",
            )


@rule("config", "SPIN pairs adjacent responses: train_batch_size * n is even")
def _spin_pairs_responses(ctx: RuleContext) -> Iterator[Violation]:
    # recipe/spin/core_algos.py compute_onlinedpo_pref raises on an odd batch (scores.view(-1, 2));
    # spin_trainer.py compute_onlineDPO_pref catches it and sets no preferences, and fit_dpo then skips
    # update_actor_dpo: the run goes on without a single update (read at v0.4.1-v0.7.0).
    plan = ctx.plan
    sequences = plan.data.train_batch_size * plan.rollout.n
    if plan.algorithm.recipe == "spin" and sequences % 2:
        yield ctx.violation(
            f"verl's SPIN recipe pairs adjacent responses into chosen and rejected, and train_batch_size x "
            f"rollout.n = {sequences} is odd: its preference step fails, the trainer catches the error and skips "
            "every actor update, so the run trains nothing.",
            "make data.train_batch_size x rollout.n even (rollout.n = 2 pairs each prompt's own responses)",
            rollout__n=2,
        )


@rule("rlplan", "[V6] a KL term in both the reward and the loss counts it twice")
def _kl_in_reward_and_loss(ctx: RuleContext) -> Iterator[Violation]:
    plan = ctx.plan
    if plan.algorithm.use_kl_in_reward and plan.actor.use_kl_loss:
        yield ctx.violation(
            "both algorithm.use_kl_in_reward and actor.use_kl_loss are on; the KL penalty applies twice.",
            "turn one of them off", severity="warning",
        )

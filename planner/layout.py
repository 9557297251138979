"""How a plan's global batch and GPUs map onto each rank: verl's normalization, once.

verl takes batch sizes in prompts over the whole job and rewrites them, inside
its worker constructors, into sequences per data-parallel rank.  This module is
that rewrite as value classes: `ParallelLayout` (world, Ulysses, FSDP shard,
rollout TP) and one `RoleBatchLayout` per pass over the batch (actor update,
old log-probs, reference log-probs, critic update, critic values).

The numbers are exactly verl's, floor divisions included; whether they are
acceptable is `planner.rules`' job, so a layout can be computed for any plan
and every violation reported at once.
"""

from __future__ import annotations

import math

import attrs
from attrs import frozen

from rlplan.planner.phases import Phase
from rlplan.planner.plan import RECIPES, Plan, RefSection, RolloutSection
from rlplan.planner.stack import SOFT_TOKEN_BUDGET, holds


@frozen(kw_only=True)
class ParallelLayout:
    """Device-mesh facts (verl N1, N2, R6)."""

    world_size: int
    gpus_per_node: int
    ulysses_sequence_parallel_size: int = 1
    fsdp_size: int = -1
    rollout_tensor_parallel_size: int = 1
    # rlplan's CPU runtime starts one engine for the whole machine, whatever the ranks and TP
    # (runtime.workers.rollout_replicas): it generates while the trainer ranks wait.
    one_rollout_engine: bool = False
    # Megatron: the ranks one model replica's weights span (TP x PP); the sequence-parallel size above is then
    # Megatron's context parallel size (the group a token budget is split over). 1 under FSDP.
    model_parallel_size: int = 1
    # The rollout's GPUs (and per node) where it runs on a pool of its own (plan.RolloutPool); 0: the trainer's.
    rollout_gpus: int = 0
    rollout_gpus_per_node: int = 0

    @property
    def dp(self) -> int:
        """Data-parallel ranks: verl's `world_size // sp` for FSDP, `world // (TP x PP x CP)` for Megatron."""
        return self.world_size // (self.ulysses_sequence_parallel_size * self.model_parallel_size)

    @property
    def fsdp_shard_size(self) -> int:
        """Ranks one parameter is sharded over: FULL_SHARD over all, or the HSDP inner dimension."""
        if self.fsdp_size < 0 or self.fsdp_size >= self.world_size:
            return self.world_size
        return self.fsdp_size

    @property
    def fsdp_replicas(self) -> int:
        return self.world_size // self.fsdp_shard_size

    @property
    def rollout_replicas(self) -> int:
        """Engines generating the batch between them, each taking an equal share of the sequences."""
        if self.one_rollout_engine:
            return 1
        return (self.rollout_gpus or self.world_size) // self.rollout_tensor_parallel_size

    @property
    def rollout_spans_nodes(self) -> bool:
        return self.rollout_tensor_parallel_size > (self.rollout_gpus_per_node or self.gpus_per_node)

    @property
    def fsdp_spans_nodes(self) -> bool:
        return self.fsdp_shard_size > self.gpus_per_node


@frozen(kw_only=True)
class RoleBatchLayout:
    """One pass over the step's batch, per data-parallel rank, in verl's normalized units.

    `sequences_per_gpu` is what dispatch hands each DP rank (train_batch_size * n / dp).
    For update passes `mini_batch_size_per_gpu` is verl's normalized ppo_mini_batch_size
    (sequences per DP rank per optimizer step); forward-only passes have none.
    Exactly one of `micro_batch_size_per_gpu` (fixed micro batches) and
    `max_token_len_per_gpu` (dynamic batch size) describes the micro batches.
    """

    # The trainer pass described: a Phase other than the rollout and the weight sync.
    role: Phase
    sequences_per_gpu: int
    max_sequence_length: int
    # Mean prompt + response tokens of the data (data.expected_*_length); the maximum if unstated.
    expected_sequence_length: int | None = None
    sequence_parallel_size: int = 1
    mini_batch_size_per_gpu: int | None = None
    micro_batch_size_per_gpu: int | None = None
    max_token_len_per_gpu: int | None = None
    epochs: int = 1
    # Without remove padding verl runs (micro batch x (max prompt + max response)) padded positions through the
    # model and the head, whatever the real lengths.
    padded: bool = False
    # The target verl's token budget is not a hard cap (stack.SOFT_TOKEN_BUDGET, before verl PR #7553): a micro
    # batch may hold one sequence more than the budget (tokens_per_micro_batch).
    soft_token_budget: bool = False

    @property
    def uses_dynamic_bsz(self) -> bool:
        return self.max_token_len_per_gpu is not None

    @property
    def is_update(self) -> bool:
        return self.mini_batch_size_per_gpu is not None

    @property
    def tokens_per_micro_batch(self) -> int:
        """T: tokens one GPU holds in one micro batch, after the Ulysses split.

        Dynamic bsz packs up to max_token_len_per_gpu * sp tokens per sp group, which
        Ulysses splits over sp ranks, and at most the chunk it splits (priced at the expected
        mean length, as fixed micro batches are). Fixed micro batches hold real sequences (remove padding
        packs them), priced at the expected mean length: a micro batch of m sequences holds
        m x mean tokens.  The spread around the mean is not added: over m sequences it shrinks
        like 1/sqrt(m), and for small m a batch of long sequences can exceed this, which is why
        validate also reports the verdict at the maximum length and the longest mean that fits.
        """
        length = min(self.expected_sequence_length or self.max_sequence_length, self.max_sequence_length)
        if self.padded:
            length = self.max_sequence_length
        if self.max_token_len_per_gpu is not None:
            # verl's rearrange_micro_batches packs one chunk (a mini batch, or the whole batch for a
            # forward pass) of this rank: a micro batch never holds more than the chunk's tokens.
            chunk_tokens = math.ceil(self.chunk_size * length / self.sequence_parallel_size)
            # Before the cap, Karmarkar-Karp balances ceil(tokens / budget) micro batches: one may exceed the
            # budget, priced as one sequence of the priced length over it. At the maximum length that is the
            # bound of the worst mix of lengths (the partition's spread stays under its longest sequence); at a
            # mean length it is above what the partition gives lengths spread around that mean (docs/megatron.md,
            # "The soft token budget").
            overshoot = math.ceil(length / self.sequence_parallel_size) if self.soft_token_budget else 0
            return min(self.max_token_len_per_gpu + overshoot, chunk_tokens)
        micro = self.micro_batch_size_per_gpu or 1
        return math.ceil(micro * length / self.sequence_parallel_size)

    @property
    def token_budget_per_sp_group(self) -> int | None:
        """verl's `*_max_token_len_per_gpu * sp`, the packing budget a sequence must fit in (R1)."""
        if self.max_token_len_per_gpu is None:
            return None
        return self.max_token_len_per_gpu * self.sequence_parallel_size

    @property
    def chunk_size(self) -> int:
        """Sequences per chunk that splits this pass: the mini batch for updates, the whole batch otherwise."""
        return self.mini_batch_size_per_gpu if self.mini_batch_size_per_gpu is not None else self.sequences_per_gpu

    @property
    def mini_batches_per_epoch(self) -> int:
        if self.chunk_size <= 0:
            return 0
        return math.ceil(self.sequences_per_gpu / self.chunk_size)

    @property
    def micro_batches_per_mini(self) -> int:
        """Gradient-accumulation steps per optimizer step (worst case for dynamic bsz)."""
        if self.chunk_size <= 0:
            return 0
        if self.max_token_len_per_gpu is not None:
            tokens = self.chunk_size * self.max_sequence_length
            return max(1, math.ceil(tokens / (self.max_token_len_per_gpu * self.sequence_parallel_size)))
        micro = self.micro_batch_size_per_gpu or 0
        return math.ceil(self.chunk_size / micro) if micro > 0 else 0

    @property
    def micro_batches_per_step(self) -> int:
        return self.mini_batches_per_epoch * self.micro_batches_per_mini * self.epochs

    @property
    def optimizer_steps_per_step(self) -> int:
        return self.mini_batches_per_epoch * self.epochs if self.is_update else 0

    @property
    def is_on_policy(self) -> bool:
        """One optimizer step per RL step (one epoch, one mini batch): the update's first forward runs the
        very weights that an old-log-prob pass would, so its detached log-probs are the old ones (verl's
        on_policy in dp_actor.update_policy)."""
        return self.optimizer_steps_per_step == 1


@frozen(kw_only=True)
class PlanLayout:
    parallel: ParallelLayout
    actor_update: RoleBatchLayout
    old_log_prob: RoleBatchLayout
    ref_log_prob: RoleBatchLayout | None
    critic_update: RoleBatchLayout | None
    critic_values: RoleBatchLayout | None
    critic_parallel: ParallelLayout | None = None
    # The critic's ppo_mini_batch_size in prompts: verl's critic config defaults it to the actor's
    # (ppo_trainer.yaml: critic.ppo_mini_batch_size: ${actor_rollout_ref.actor.ppo_mini_batch_size}).
    critic_ppo_mini_batch_size: int | None = None

    @property
    def roles(self) -> tuple[RoleBatchLayout, ...]:
        candidates = (self.actor_update, self.old_log_prob, self.ref_log_prob, self.critic_update, self.critic_values)
        return tuple(r for r in candidates if r is not None)

    # Prompts the rollout generates per step (data.gen_batch_size where a recipe over-generates, else the train
    # batch), and responses per prompt.
    generated_prompts: int
    responses_per_prompt: int

    @property
    def prompts_per_rollout_engine(self) -> float:
        """Each engine's share of the generated prompts (the engines split the batch evenly)."""
        return self.generated_prompts / max(1, self.parallel.rollout_replicas)

    @property
    def sequences_per_rollout_engine(self) -> float:
        """Each engine's share of the sequences generated per step: what the solver sizes max_num_seqs from and
        the step-time model decodes."""
        return self.generated_prompts * self.responses_per_prompt / max(1, self.parallel.rollout_replicas)


def normalized_micro_batch(per_gpu: int | None, global_size: int | None, dp: int) -> int | None:
    """verl N4/N6: the deprecated global micro batch is divided by dp (not multiplied by n)."""
    if per_gpu is not None:
        return per_gpu
    if global_size is not None:
        return global_size // dp
    return None


def reuses_update_log_probs(plan: Plan, layout: PlanLayout | None = None) -> bool:
    """Whether rlplan's runtime skips the old-log-prob pass and takes the update's own detached log-probs.

    Exact when the update is on-policy (one epoch, one mini batch), as TRL does. Not with the KL in the
    reward: the advantages need the old log-probs before the update runs. verl's trainer runs the pass
    anyway (compute_log_prob, for its entropy metric) and only uses the shortcut inside the update, so a
    plan rendered for verl keeps the pass.
    """
    layout = layout or plan_layout(plan)
    return layout.actor_update.is_on_policy and not plan.algorithm.use_kl_in_reward


def _sequence_and_model_parallel(plan: Plan, role: str) -> tuple[int, int]:
    """A role's (sequence-parallel, model-parallel) sizes: (Ulysses sp, 1) under FSDP, (CP, TP x PP) under Megatron."""
    section = plan.critic if role == "critic" else plan.actor
    if not plan.is_megatron:
        return section.ulysses_sequence_parallel_size, 1
    engine = plan.engine("critic" if role == "critic" else "actor")
    return engine.context_parallel_size, engine.model_parallel_size


def plan_layout(plan: Plan) -> PlanLayout:
    world = plan.cluster.world_size
    actor = plan.actor
    sp, model_parallel = _sequence_and_model_parallel(plan, "actor")
    parallel = ParallelLayout(
        world_size=world,
        gpus_per_node=plan.cluster.gpus_per_node,
        ulysses_sequence_parallel_size=sp,
        fsdp_size=actor.fsdp_size,
        rollout_tensor_parallel_size=plan.rollout.tensor_model_parallel_size,
        one_rollout_engine=plan.cluster.gpu.is_cpu,
        model_parallel_size=model_parallel,
        rollout_gpus=plan.rollout.pool.gpus if plan.rollout.pool else 0,
        rollout_gpus_per_node=plan.rollout.pool.gpus_per_node if plan.rollout.pool else 0,
    )
    n = plan.rollout.n
    dp = max(parallel.dp, 1)
    seq_len = plan.data.max_sequence_length

    def role(name: Phase, *, mini: int | None, micro: int | None, budget: int | None, dynamic: bool,
             sp_size: int = sp, dp_size: int = dp, epochs: int = 1,
             remove_padding: bool = plan.model.use_remove_padding) -> RoleBatchLayout:
        return RoleBatchLayout(
            role=name,
            sequences_per_gpu=plan.data.train_batch_size * n // dp_size,
            max_sequence_length=seq_len,
            expected_sequence_length=plan.data.expected_sequence_length,
            sequence_parallel_size=sp_size,
            mini_batch_size_per_gpu=mini,
            micro_batch_size_per_gpu=None if dynamic else micro,
            max_token_len_per_gpu=budget if dynamic else None,
            epochs=epochs,
            padded=not remove_padding,
            soft_token_budget=holds(SOFT_TOKEN_BUDGET, plan.stack, plan.rollout.name),
        )

    actor_update = role(
        Phase.ACTOR_UPDATE,
        mini=actor.ppo_mini_batch_size * n // dp,
        micro=normalized_micro_batch(actor.ppo_micro_batch_size_per_gpu, actor.ppo_micro_batch_size, dp),
        budget=actor.ppo_max_token_len_per_gpu,
        dynamic=actor.use_dynamic_bsz,
        epochs=actor.ppo_epochs,
    )
    recipe = plan.algorithm.recipe
    if recipe is not None and RECIPES[recipe].pair_update:
        # SPIN's update_policy_dpo_with_ref (plan.RECIPES): a micro batch is ppo_micro_batch_size_per_gpu chosen
        # and as many rejected sequences, run padded through the model itself (no remove padding, no Ulysses
        # split, no token budget), and the rank's whole share of the batch is one optimizer step.
        pair_micro = normalized_micro_batch(actor.ppo_micro_batch_size_per_gpu, actor.ppo_micro_batch_size, dp) or 1
        actor_update = role(Phase.ACTOR_UPDATE, mini=plan.data.train_batch_size * n // dp, micro=2 * pair_micro,
                            budget=None, dynamic=False, sp_size=1, remove_padding=False)

    def log_prob_pass(name: Phase, section: RolloutSection | RefSection) -> RoleBatchLayout:
        """A forward-only log-prob pass: the rollout's and the reference's sections name its knobs alike."""
        return role(
            name,
            mini=None,
            micro=normalized_micro_batch(section.log_prob_micro_batch_size_per_gpu, section.log_prob_micro_batch_size,
                                         dp),
            budget=section.log_prob_max_token_len_per_gpu,
            dynamic=section.log_prob_use_dynamic_bsz,
        )

    old_log_prob = log_prob_pass(Phase.OLD_LOG_PROB, plan.rollout)
    ref_log_prob = log_prob_pass(Phase.REF_LOG_PROB, plan.ref) if plan.uses_reference else None
    critic_update = critic_values = critic_parallel = critic_mini = None
    if plan.uses_critic:
        critic = plan.critic
        critic_sp, critic_model_parallel = _sequence_and_model_parallel(plan, "critic")
        critic_parallel = attrs.evolve(parallel, ulysses_sequence_parallel_size=critic_sp,
                                       model_parallel_size=critic_model_parallel)
        critic_dp = max(critic_parallel.dp, 1)
        critic_micro = normalized_micro_batch(critic.ppo_micro_batch_size_per_gpu, critic.ppo_micro_batch_size, critic_dp)
        critic_mini = critic.ppo_mini_batch_size if critic.ppo_mini_batch_size is not None else actor.ppo_mini_batch_size
        critic_update = role(
            Phase.CRITIC_UPDATE,
            mini=critic_mini * n // critic_dp,
            micro=critic_micro,
            budget=critic.ppo_max_token_len_per_gpu,
            dynamic=critic.use_dynamic_bsz,
            sp_size=critic_sp,
            dp_size=critic_dp,
            epochs=critic.ppo_epochs,
            remove_padding=critic.use_remove_padding,
        )
        forward_micro = critic.forward_micro_batch_size_per_gpu
        critic_values = role(
            Phase.CRITIC_VALUES,
            mini=None,
            micro=forward_micro if forward_micro is not None else critic_micro,
            budget=critic.forward_max_token_len_per_gpu,
            dynamic=critic.use_dynamic_bsz,
            sp_size=critic_sp,
            dp_size=critic_dp,
            remove_padding=critic.use_remove_padding,
        )
    return PlanLayout(
        parallel=parallel,
        actor_update=actor_update,
        old_log_prob=old_log_prob,
        ref_log_prob=ref_log_prob,
        critic_update=critic_update,
        critic_values=critic_values,
        critic_parallel=critic_parallel,
        critic_ppo_mini_batch_size=critic_mini,
        generated_prompts=plan.data.gen_batch_size or plan.data.train_batch_size,
        responses_per_prompt=plan.rollout.n,
    )

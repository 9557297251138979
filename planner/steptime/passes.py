"""What every training backend's passes share: the step's context (plan, layout, rates, profile, lengths),
the tokens and micro batches one GPU processes in a pass, the FLOPs per token, and the costs that do not
depend on how the trainer shards (the fixed cost per micro batch and layer, the entropy over the vocabulary)."""

from __future__ import annotations

import math

from attrs import frozen

from rlplan.planner.layout import PlanLayout, RoleBatchLayout
from rlplan.planner.memory.dataproto import phase_batch_bytes
from rlplan.planner.memory.model_facts import ModelFacts
from rlplan.planner.phases import Phase
from rlplan.planner.plan import Plan
from rlplan.planner.profile import Profile
from rlplan.planner.steptime.lengths import Lengths
from rlplan.planner.steptime.rates import Rates


@frozen(kw_only=True)
class StepContext:
    """What pricing one step's phases reads: the plan, its batch layout, the cluster's rates, the profile
    and the workload's lengths."""

    plan: Plan
    layout: PlanLayout
    rates: Rates
    profile: Profile
    lengths: Lengths


def pass_sequence_length(plan: Plan, lengths: Lengths, role: RoleBatchLayout | None = None) -> float:
    """Tokens per sequence a trainer pass computes: the mean with remove padding, the padded maximum
    without (the role's own flag: verl's critic has its own `use_remove_padding`, False by default up to
    its HEAD, verl/trainer/config/critic/dp_critic.yaml)."""
    padded = role.padded if role is not None else not plan.model.use_remove_padding
    return float(plan.data.max_sequence_length) if padded else lengths.sequence_mean


def tokens_per_gpu(plan: Plan, role: RoleBatchLayout, lengths: Lengths) -> float:
    return role.sequences_per_gpu * pass_sequence_length(plan, lengths, role) / role.sequence_parallel_size


def pass_micro_batches(plan: Plan, role: RoleBatchLayout, lengths: Lengths) -> int:
    """Micro batches one GPU runs in the pass: dynamic batches pack the chunk's real tokens into the
    budget (verl's rearrange_micro_batches counts `attention_mask.sum()`, so even a padded pass is split by
    its real tokens, each micro batch then computing its sequences at the padded length)."""
    if role.max_token_len_per_gpu is None:
        return role.micro_batches_per_step
    chunk_tokens = role.chunk_size * lengths.sequence_mean
    per_chunk = max(1, math.ceil(chunk_tokens / (role.max_token_len_per_gpu * role.sequence_parallel_size)))
    return role.mini_batches_per_epoch * min(per_chunk, max(1, role.chunk_size)) * role.epochs


def training_flops_per_token(plan: Plan, facts: ModelFacts, lengths: Lengths, critic: bool,
                             role: RoleBatchLayout | None = None) -> float:
    """Forward FLOPs per token at the mean causal context of a packed sequence (half its length)."""
    flops = facts.forward_flops_per_token(pass_sequence_length(plan, lengths, role) / 2)
    if critic:
        # A value head replaces the vocabulary projection.
        flops -= 2.0 * facts.vocab * facts.hidden
    return flops


def compute_dtype(plan: Plan, critic: bool) -> str:
    # The reference pass is priced at the actor's dtype: with the default YAML both are bfloat16.
    return plan.critic.compute_dtype if critic else plan.actor.compute_dtype


def fixed_micro_batch_seconds(layers: float, micro_batches: int, profile: Profile, passes: float) -> float:
    """Python, kernel launches and the trainer's hooks per micro batch and layer one GPU runs; `passes`:
    1 forward, 3 with backward."""
    return micro_batches * layers * profile.micro_batch_seconds_per_layer * passes


def entropy_seconds(facts: ModelFacts, tokens: float, rates: Rates, profile: Profile) -> float:
    """verl's old-log-prob pass also computes the entropy: memory-bound passes over fp32 logits."""
    return tokens * facts.vocab * profile.entropy_bytes_per_token_vocab / rates.hbm


# --- what verl times around every trainer pass: the worker call and its data (ray_trainer.fit, v0.4.0) ---

# What each trainer phase's call returns per position (what it is sent: memory.dataproto.floats_sent): log-probs
# and entropies, the reference's log-probs, the values; the updates return their metrics only.
_FLOATS_RETURNED = {Phase.OLD_LOG_PROB: 2, Phase.REF_LOG_PROB: 1, Phase.CRITIC_VALUES: 1, Phase.CRITIC_UPDATE: 0,
                    Phase.ACTOR_UPDATE: 0}


def transfer_seconds(plan: Plan, profile: Profile, sent_bytes: float, returned_bytes: float) -> float:
    """One worker-group call: its fixed host cost, and the driver's DataProto out to the ranks and back."""
    if plan.cluster.gpu.is_cpu:
        # rlplan's own CPU runtime: its fixed costs are in the constants `calibrate --cpu` fits.
        return 0.0
    return profile.worker_call_seconds + (sent_bytes + returned_bytes) / (profile.dataproto_gbps * 1e9)


def worker_call_seconds(ctx: StepContext, phase: Phase) -> float:
    """What a trainer phase's timer holds beside the pass: the call to every rank and the batch it ships."""
    plan = ctx.plan
    sequences = plan.data.train_batch_size * plan.rollout.n
    return transfer_seconds(plan, ctx.profile, phase_batch_bytes(plan, phase, sequences),
                            sequences * 4.0 * _FLOATS_RETURNED[phase] * plan.data.max_response_length)


def optimizer_step_host_seconds(layers: float, optimizer_steps: int, profile: Profile) -> float:
    """The host work of every optimizer step beside AdamW's HBM pass (grad-norm clip and its sync, launches)."""
    return optimizer_steps * layers * profile.optimizer_step_seconds_per_layer

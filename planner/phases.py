"""The shared vocabulary of one RL step: its phases and how weights reach the rollout engine.

StrEnums, as torchtitan's MeshAxisName: each member is its string, so TOML, JSON, metrics keys and
older callers that pass plain strings read and compare unchanged, while new code names them once.
"""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    """The phases of one colocated step in the order they run (memory, step time, metrics and charts key on them)."""

    WEIGHT_SYNC = "weight_sync"  # trainer weights pushed into the waking engine
    ROLLOUT = "rollout"  # generation
    OLD_LOG_PROB = "old_log_prob"  # actor forward, no_grad
    REF_LOG_PROB = "ref_log_prob"  # reference forward, only with a KL term
    CRITIC_VALUES = "critic_values"  # critic forward, PPO/GAE only
    CRITIC_UPDATE = "critic_update"  # critic training step
    ACTOR_UPDATE = "actor_update"  # actor training step


class SyncMode(StrEnum):
    """What the trainer sends the rollout engine after an update."""

    ADAPTER = "adapter"  # LoRA tensors only; the engine keeps its base
    BASE = "base"  # the frozen base weights, LoRA excluded (a LoRA run's first sync or a resume)
    MERGED = "merged"  # full weights with any adapter folded in


# The plan key that caps each trainer pass's tokens per GPU under dynamic batch sizes: one table that
# rules, the solver's diagnosis and the runtime's batching read.
TOKEN_BUDGET_KEY: dict[Phase, str] = {
    Phase.ACTOR_UPDATE: "actor.ppo_max_token_len_per_gpu",
    Phase.OLD_LOG_PROB: "rollout.log_prob_max_token_len_per_gpu",
    Phase.REF_LOG_PROB: "ref.log_prob_max_token_len_per_gpu",
    Phase.CRITIC_UPDATE: "critic.ppo_max_token_len_per_gpu",
    Phase.CRITIC_VALUES: "critic.forward_max_token_len_per_gpu",
}

"""The pure-torch math of RL fine-tuning: advantage estimators and losses. No model code, no I/O."""

from rlplan.runtime.algorithms.advantages import (
    discounted_returns,
    gae_advantages,
    grpo_advantages,
    reinforce_plus_plus_advantages,
    rloo_advantages,
    token_level_rewards,
)
from rlplan.runtime.algorithms.losses import (
    KL_KINDS,
    LOSS_AGG_MODES,
    PolicyLossStats,
    ValueLossStats,
    aggregate_loss,
    entropy_from_logits,
    kl_penalty,
    log_probs_from_logits,
    loss_normalizer,
    policy_loss,
    value_loss,
)
from rlplan.runtime.algorithms.masked import masked_mean, masked_whiten

__all__ = [
    "KL_KINDS",
    "LOSS_AGG_MODES",
    "PolicyLossStats",
    "ValueLossStats",
    "aggregate_loss",
    "discounted_returns",
    "entropy_from_logits",
    "gae_advantages",
    "grpo_advantages",
    "kl_penalty",
    "log_probs_from_logits",
    "loss_normalizer",
    "masked_mean",
    "masked_whiten",
    "policy_loss",
    "reinforce_plus_plus_advantages",
    "rloo_advantages",
    "token_level_rewards",
    "value_loss",
]

"""Advantage estimators: GRPO (with Dr.GRPO and leave-one-out variants), RLOO, REINFORCE++ and GAE.

Every estimator takes the response mask [B, T] (1 on generated tokens, 0 on padding) and returns
[B, T] advantages that are exactly 0 on padding, so a loss never sees a padded position.
Outcome estimators (GRPO, RLOO) score whole sequences and broadcast one number over the response;
REINFORCE++ and GAE work per token on the rewards built by `token_level_rewards`.
Formulas follow verl's core_algos.py; deviations are named where they occur.
"""

from __future__ import annotations

import torch

from rlplan.runtime.algorithms.masked import masked_whiten


def _check_outcome_batch(
    scores: torch.Tensor, group_index: torch.Tensor, response_mask: torch.Tensor
) -> None:
    if scores.dim() != 1 or group_index.shape != scores.shape:
        raise ValueError(
            f"scores and group_index must both be [B]; got {tuple(scores.shape)} and {tuple(group_index.shape)}"
        )
    if response_mask.dim() != 2 or response_mask.shape[0] != scores.shape[0]:
        raise ValueError(
            f"response_mask must be [B, T] with B={scores.shape[0]}; got {tuple(response_mask.shape)}"
        )


def _check_token_batch(response_mask: torch.Tensor, **token_tensors: torch.Tensor) -> None:
    for name, tensor in token_tensors.items():
        if tensor.shape != response_mask.shape:
            raise ValueError(
                f"{name} must match response_mask {tuple(response_mask.shape)}; got {tuple(tensor.shape)}"
            )


def grpo_advantages(
    scores: torch.Tensor,
    group_index: torch.Tensor,
    response_mask: torch.Tensor,
    norm_by_std: bool = True,
    leave_one_out: bool = False,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Group-relative advantage: (score - baseline) / (group std + eps), broadcast over the response.

    `group_index` holds any integer id per sample; samples with the same id answered the same prompt.
    The baseline is the group mean, or with `leave_one_out` the mean of the *other* samples (NeMo-RL's
    default; it makes each sample's baseline independent of its own reward). The std is the unbiased
    std of the whole group in both cases; `norm_by_std=False` drops it (Dr.GRPO). Either way the
    advantages of a group sum to zero.

    A group of one sample has no baseline to compare against and gets advantage 0 (verl would hand it
    its raw score, which turns a lone sample into a REINFORCE update with no baseline).
    """
    _check_outcome_batch(scores, group_index, response_mask)
    scores = scores.float() if not scores.is_floating_point() else scores
    _, group, counts = torch.unique(group_index, return_inverse=True, return_counts=True)
    group_size = counts[group].to(scores.dtype)
    num_groups = counts.shape[0]

    def per_group_sum(values: torch.Tensor) -> torch.Tensor:
        return torch.zeros(num_groups, dtype=values.dtype, device=values.device).index_add_(0, group, values)[
            group
        ]

    group_sum = per_group_sum(scores)
    mean = group_sum / group_size
    others = (group_size - 1.0).clamp(min=1.0)
    baseline = (group_sum - scores) / others if leave_one_out else mean
    advantages = scores - baseline
    if norm_by_std:
        std = torch.sqrt(per_group_sum((scores - mean) ** 2) / others)
        advantages = advantages / (std + eps)
    advantages = torch.where(group_size > 1, advantages, torch.zeros_like(advantages))
    return advantages[:, None] * response_mask.to(advantages.dtype)


def rloo_advantages(
    scores: torch.Tensor, group_index: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """REINFORCE leave-one-out: score minus the mean score of the other samples of the same prompt."""
    return grpo_advantages(scores, group_index, response_mask, norm_by_std=False, leave_one_out=True)


def discounted_returns(
    token_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float
) -> torch.Tensor:
    """G_t = r_t + gamma * G_{t+1} over valid tokens; the sum restarts after a padded position."""
    _check_token_batch(response_mask, token_rewards=token_rewards)
    mask = response_mask.to(token_rewards.dtype)
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.shape[1])):
        running = token_rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * mask[:, t]
    return returns * mask


def reinforce_plus_plus_advantages(
    token_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float
) -> torch.Tensor:
    """REINFORCE++: discounted returns, whitened over every valid token of the batch (no critic)."""
    return masked_whiten(discounted_returns(token_rewards, response_mask, gamma), response_mask)


def gae_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation for PPO with a critic: (whitened advantages, returns).

    The recursion skips padded positions: their value and TD error neither count nor break the chain
    (verl's handling of tool/observation tokens inside a response). Returns are the *unwhitened*
    advantages plus the values, the critic's regression target.
    """
    _check_token_batch(response_mask, token_rewards=token_rewards, values=values)
    mask = response_mask.to(token_rewards.dtype)
    values = values.to(token_rewards.dtype)
    advantages = torch.zeros_like(token_rewards)
    next_value = torch.zeros_like(token_rewards[:, 0])
    next_advantage = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.shape[1])):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        valid = mask[:, t]
        next_value = values[:, t] * valid + (1.0 - valid) * next_value
        next_advantage = advantage * valid + (1.0 - valid) * next_advantage
        advantages[:, t] = next_advantage
    returns = (advantages + values) * mask
    return masked_whiten(advantages, mask), returns


def token_level_rewards(
    scores: torch.Tensor,
    response_mask: torch.Tensor,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> torch.Tensor:
    """Per-token rewards: the sequence score on the last valid token, minus kl_coef * kl on every valid one.

    Pass `kl` (e.g. `kl_penalty(logp, ref_logp, kind)`) only when the KL is part of the reward
    (verl's algorithm.use_kl_in_reward); a KL *loss* belongs to the actor's loss instead.
    A response with no valid token receives nothing.
    """
    if scores.dim() != 1 or response_mask.dim() != 2 or response_mask.shape[0] != scores.shape[0]:
        raise ValueError(
            f"scores must be [B] and response_mask [B, T]; got {tuple(scores.shape)} and {tuple(response_mask.shape)}"
        )
    scores = scores.float() if not scores.is_floating_point() else scores
    mask = response_mask.to(scores.dtype)
    positions = torch.arange(1, mask.shape[1] + 1, device=mask.device, dtype=scores.dtype)
    # argmax of position*mask is the last valid token; rows with none are zeroed by the mask below.
    last_valid = (mask * positions).argmax(dim=1)
    rewards = torch.zeros_like(mask)
    rewards[torch.arange(mask.shape[0], device=mask.device), last_valid] = scores
    rewards = rewards * mask
    if kl is not None:
        _check_token_batch(response_mask, kl=kl)
        rewards = rewards - kl_coef * kl.to(scores.dtype) * mask
    return rewards

"""Advantage estimators: hand-computed cases and the invariants every batch must satisfy."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch", reason="the runtime extra (torch) is not installed")

from rlplan.runtime.algorithms import (  # noqa: E402
    discounted_returns,
    gae_advantages,
    grpo_advantages,
    reinforce_plus_plus_advantages,
    rloo_advantages,
    token_level_rewards,
)
from tests.runtime.exact import assert_close, tensor  # noqa: E402

pytestmark = pytest.mark.runtime
FAST = settings(max_examples=25, deadline=None)


@st.composite
def outcome_batches(draw):
    """Scores of B samples from a few prompts, each response with 1..T valid tokens."""
    batch = draw(st.integers(1, 12))
    width = draw(st.integers(1, 6))
    scores = draw(st.lists(st.floats(-5, 5, allow_nan=False), min_size=batch, max_size=batch))
    groups = draw(st.lists(st.integers(0, 3), min_size=batch, max_size=batch))
    lengths = draw(st.lists(st.integers(1, width), min_size=batch, max_size=batch))
    mask = torch.tensor(
        [[1.0] * length + [0.0] * (width - length) for length in lengths], dtype=torch.float64
    )
    return tensor(scores), torch.tensor(groups), mask


@st.composite
def token_batches(draw):
    """Per-token rewards and values with a mask whose valid tokens may be anywhere (not only a prefix)."""
    batch, width = draw(st.integers(1, 5)), draw(st.integers(1, 6))
    cells = batch * width
    rewards = draw(st.lists(st.floats(-3, 3, allow_nan=False), min_size=cells, max_size=cells))
    values = draw(st.lists(st.floats(-3, 3, allow_nan=False), min_size=cells, max_size=cells))
    mask = draw(st.lists(st.booleans(), min_size=cells, max_size=cells))
    mask[0] = True
    shape = (batch, width)
    return tensor(rewards).reshape(shape), tensor(values).reshape(shape), tensor(mask).reshape(shape)


# --- hand-computed cases -------------------------------------------------------------------------

# Two prompts: scores 1, 2, 3 (mean 2, unbiased std 1) and a lone sample scoring 5.
SCORES = [1.0, 2.0, 3.0, 5.0]
GROUPS = [7, 7, 7, 9]
MASK = [[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]]


def test_grpo_divides_the_centered_score_by_the_group_std():
    advantages = grpo_advantages(tensor(SCORES), torch.tensor(GROUPS), tensor(MASK))
    scale = 1.0 / (1.0 + 1e-6)
    assert_close(advantages, [[-scale, -scale, 0], [0, 0, 0], [scale, scale, scale], [0, 0, 0]])


def test_dr_grpo_only_centers_the_score():
    advantages = grpo_advantages(tensor(SCORES), torch.tensor(GROUPS), tensor(MASK), norm_by_std=False)
    assert_close(advantages, [[-1, -1, 0], [0, 0, 0], [1, 1, 1], [0, 0, 0]])


def test_leave_one_out_baseline_is_the_mean_of_the_other_samples():
    # Baselines 2.5, 2.0, 1.5 -> -1.5, 0, 1.5; divided by the group std 1.
    advantages = grpo_advantages(
        tensor(SCORES), torch.tensor(GROUPS), tensor(MASK), leave_one_out=True, eps=0.0
    )
    assert_close(advantages, [[-1.5, -1.5, 0], [0, 0, 0], [1.5, 1.5, 1.5], [0, 0, 0]])


def test_rloo_is_leave_one_out_without_std():
    # Group 0, 4, 8 (std 4): baselines 6, 4, 2 -> -6, 0, 6 with no division.
    advantages = rloo_advantages(tensor([0.0, 4.0, 8.0]), torch.tensor([0, 0, 0]), tensor([[1], [1], [1]]))
    assert_close(advantages, [[-6], [0], [6]])


def test_integer_scores_are_accepted():
    advantages = grpo_advantages(
        torch.tensor([0, 1]), torch.tensor([0, 0]), torch.ones(2, 1), norm_by_std=False
    )
    assert_close(advantages, [[-0.5], [0.5]])


def test_mismatched_shapes_are_rejected():
    with pytest.raises(ValueError, match="group_index"):
        grpo_advantages(tensor([1.0, 2.0]), torch.tensor([0]), torch.ones(2, 1))
    with pytest.raises(ValueError, match="response_mask"):
        grpo_advantages(tensor([1.0, 2.0]), torch.tensor([0, 0]), torch.ones(3, 1))


def test_reinforce_plus_plus_whitens_discounted_returns():
    # gamma 0.5. Row 0: returns 0.25, 0.5, 1. Row 1 (last token padded): 1, 2.
    # Valid returns {0.25, 0.5, 1, 1, 2}: mean 0.95, unbiased variance 1.8 / 4 = 0.45.
    rewards = tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    mask = tensor([[1, 1, 1], [1, 1, 0]])
    std = math.sqrt(0.45 + 1e-8)
    expected = [[-0.7 / std, -0.45 / std, 0.05 / std], [0.05 / std, 1.05 / std, 0.0]]
    assert_close(reinforce_plus_plus_advantages(rewards, mask, gamma=0.5), expected)


def test_gae_hand_computed_with_a_padded_token():
    # gamma 0.9, lam 0.8 (gamma*lam = 0.72).
    # Row 0: delta_1 = 1 - 0.5 = 0.5 -> A_1 = 0.5; delta_0 = 0.9*0.5 - 0.2 = 0.25 -> A_0 = 0.25 + 0.72*0.5 = 0.61.
    # Row 1 (token 1 padded, its value 9 ignored): A_0 = 1 - 0.4 = 0.6.
    # Valid A {0.61, 0.5, 0.6}: mean 0.57, unbiased variance 0.0074 / 2 = 0.0037.
    rewards = tensor([[0.0, 1.0], [1.0, 0.0]])
    values = tensor([[0.2, 0.5], [0.4, 9.0]])
    mask = tensor([[1, 1], [1, 0]])
    advantages, returns = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.8)
    std = math.sqrt(0.0037 + 1e-8)  # masked_whiten adds 1e-8 to the variance
    assert_close(advantages, [[0.04 / std, -0.07 / std], [0.03 / std, 0.0]])
    assert_close(returns, [[0.81, 1.0], [1.0, 0.0]])


def test_token_level_rewards_put_the_score_on_the_last_valid_token_and_subtract_kl():
    scores = tensor([1.0, 2.0, 3.0])
    mask = tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    kl = tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6], [0.7, 0.8, 0.9]])
    assert_close(token_level_rewards(scores, mask), [[0, 1, 0], [0, 0, 2], [0, 0, 0]])
    assert_close(
        token_level_rewards(scores, mask, kl=kl, kl_coef=0.5),
        [[-0.05, 0.9, 0], [-0.2, -0.25, 1.7], [0, 0, 0]],
    )


# --- invariants ----------------------------------------------------------------------------------


@FAST
@given(outcome_batches(), st.booleans(), st.booleans())
def test_grpo_advantages_sum_to_zero_within_each_group(batch, norm_by_std, leave_one_out):
    scores, groups, mask = batch
    advantages = grpo_advantages(scores, groups, mask, norm_by_std=norm_by_std, leave_one_out=leave_one_out)
    per_sample = advantages[:, 0]  # every response has a valid first token
    for group in groups.unique():
        assert abs(float(per_sample[groups == group].sum())) < 1e-6


@FAST
@given(outcome_batches(), st.booleans(), st.booleans())
def test_grpo_advantages_are_constant_over_each_response_and_zero_on_padding(
    batch, norm_by_std, leave_one_out
):
    scores, groups, mask = batch
    advantages = grpo_advantages(scores, groups, mask, norm_by_std=norm_by_std, leave_one_out=leave_one_out)
    assert torch.equal(advantages * (1 - mask), torch.zeros_like(advantages))
    torch.testing.assert_close(advantages, advantages[:, :1] * mask)


@FAST
@given(outcome_batches(), st.floats(-10, 10, allow_nan=False))
def test_grpo_advantages_are_invariant_to_shifting_every_score(batch, shift):
    scores, groups, mask = batch
    torch.testing.assert_close(
        grpo_advantages(scores + shift, groups, mask),
        grpo_advantages(scores, groups, mask),
        atol=1e-6,
        rtol=1e-6,
    )


@FAST
@given(outcome_batches(), st.booleans())
def test_grpo_gives_a_lone_sample_zero_advantage(batch, leave_one_out):
    scores, groups, mask = batch
    lone = torch.tensor([int((groups == group).sum()) == 1 for group in groups])
    advantages = grpo_advantages(scores, groups, mask, leave_one_out=leave_one_out)
    assert torch.equal(advantages[lone], torch.zeros_like(advantages[lone]))


@FAST
@given(outcome_batches())
def test_leave_one_out_advantage_is_the_group_mean_advantage_scaled_by_n_over_n_minus_one(batch):
    scores, groups, mask = batch
    sizes = torch.tensor([float((groups == group).sum()) for group in groups])
    scale = torch.where(sizes > 1, sizes / (sizes - 1).clamp(min=1), torch.zeros_like(sizes))
    mean_centered = grpo_advantages(scores, groups, mask, norm_by_std=False)
    torch.testing.assert_close(rloo_advantages(scores, groups, mask), mean_centered * scale[:, None])


@FAST
@given(token_batches(), st.floats(0.0, 1.0))
def test_reinforce_plus_plus_advantages_have_zero_mean_and_unit_variance_over_valid_tokens(batch, gamma):
    rewards, _, mask = batch
    advantages = reinforce_plus_plus_advantages(rewards, mask, gamma)
    valid = advantages[mask.bool()]
    assert torch.equal(advantages[~mask.bool()], torch.zeros_like(advantages[~mask.bool()]))
    assert abs(float(valid.mean())) < 1e-6
    valid_returns = discounted_returns(rewards, mask, gamma)[mask.bool()]
    if valid_returns.numel() > 1:
        # Unit variance up to the whitening epsilon: var / (var + 1e-8), so a constant batch whitens to 0.
        variance = float(valid_returns.var(unbiased=True))
        assert abs(float(valid.var(unbiased=True)) - variance / (variance + 1e-8)) < 1e-6


@FAST
@given(token_batches())
def test_gae_returns_equal_reward_to_go_when_gamma_and_lam_are_one(batch):
    rewards, values, mask = batch
    _, returns = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0)
    # Reward-to-go over valid tokens only: padded positions neither add reward nor break the sum.
    valid_rewards = rewards * mask
    reward_to_go = valid_rewards.flip(1).cumsum(1).flip(1) * mask
    torch.testing.assert_close(returns, reward_to_go)


@FAST
@given(token_batches(), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_gae_advantages_are_whitened_and_zero_on_padding(batch, gamma, lam):
    rewards, values, mask = batch
    advantages, returns = gae_advantages(rewards, values, mask, gamma=gamma, lam=lam)
    padding = ~mask.bool()
    assert torch.equal(advantages[padding], torch.zeros_like(advantages[padding]))
    assert torch.equal(returns[padding], torch.zeros_like(returns[padding]))
    assert abs(float(advantages[mask.bool()].mean())) < 1e-6


@FAST
@given(outcome_batches(), st.sampled_from([1e-6, 1e-4]))
def test_grpo_advantages_equal_verl_and_trl_group_scaling_with_their_epsilon(batch, eps):
    """verl's compute_grpo_outcome_advantage (eps 1e-6) and TRL's scale_rewards="group" (eps 1e-4) both
    divide the group-centered score by the unbiased group std plus eps; the epsilon is their only
    difference, and it matters only for groups whose std is not far above it."""
    scores, groups, mask = batch
    expected = torch.zeros_like(scores)
    for group in groups.unique():
        members = groups == group
        if int(members.sum()) > 1:  # a lone sample: 0 here, its raw score in verl; TRL groups hold >= 2 samples
            group_scores = scores[members]
            expected[members] = (group_scores - group_scores.mean()) / (group_scores.std(unbiased=True) + eps)
    advantages = grpo_advantages(scores, groups, mask, eps=eps)
    torch.testing.assert_close(advantages, expected[:, None] * mask)

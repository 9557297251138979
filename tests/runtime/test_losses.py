"""Losses: hand-computed cases, the dual clip, and gradients that do not depend on the micro-batch split."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch", reason="the runtime extra (torch) is not installed")

from rlplan.runtime.algorithms import (  # noqa: E402
    LOSS_AGG_MODES,
    aggregate_loss,
    entropy_from_logits,
    kl_penalty,
    log_probs_from_logits,
    loss_normalizer,
    policy_loss,
    value_loss,
)
from rlplan.runtime.batching import token_budget_micro_batches  # noqa: E402
from tests.runtime.exact import assert_close, tensor  # noqa: E402

pytestmark = pytest.mark.runtime
FAST = settings(max_examples=25, deadline=None)
SEQ_MEAN_MODES = [mode for mode in LOSS_AGG_MODES if mode != "token-mean"]


@st.composite
def right_padded_batches(draw, max_batch=8, max_width=6):
    """A [B, T] loss matrix and a right-padded response mask (some responses may be empty)."""
    batch, width = draw(st.integers(1, max_batch)), draw(st.integers(1, max_width))
    lengths = draw(st.lists(st.integers(0, width), min_size=batch, max_size=batch))
    cells = batch * width
    losses = draw(st.lists(st.floats(-4, 4, allow_nan=False), min_size=cells, max_size=cells))
    mask = tensor([[1.0] * length + [0.0] * (width - length) for length in lengths])
    return tensor(losses).reshape(batch, width), mask, lengths


@st.composite
def random_splits(draw, size):
    """A shuffled cut of range(size) into consecutive non-empty micro batches."""
    order = draw(st.permutations(range(size)))
    cuts = sorted(draw(st.sets(st.integers(1, max(size - 1, 1)), max_size=size - 1))) if size > 1 else []
    bounds = [0, *cuts, size]
    return [list(order[start:end]) for start, end in zip(bounds, bounds[1:], strict=False) if end > start]


def trimmed(matrix, mask, rows):
    """Rows of one micro batch, cut to the widest response in it, as a padded micro batch would be."""
    width = max(int(mask[rows].sum(dim=1).max()), 1)
    return matrix[rows, :width], mask[rows, :width]


# --- KL ------------------------------------------------------------------------------------------


def test_kl_estimators_hand_computed():
    logp, ref = tensor([-1.0]), tensor([-1.5])
    assert_close(kl_penalty(logp, ref, "kl"), [0.5])
    assert_close(kl_penalty(logp, ref, "k1"), [0.5])
    assert_close(kl_penalty(ref, logp, "abs"), [0.5])
    assert_close(kl_penalty(logp, ref, "mse"), [0.125])
    assert_close(kl_penalty(logp, ref, "k2"), [0.125])
    # k3 = exp(ref - logp) - (ref - logp) - 1 = exp(-0.5) + 0.5 - 1
    assert_close(kl_penalty(logp, ref, "low_var_kl"), [math.exp(-0.5) - 0.5])
    assert_close(kl_penalty(logp, ref, "k3"), [math.exp(-0.5) - 0.5])


def test_k3_clamps_the_log_ratio_at_20_and_the_value_at_10():
    # ref - logp = 30 -> clamped to 20 -> exp(20) - 21, then clamped to 10.
    assert_close(kl_penalty(tensor([-30.0]), tensor([0.0]), "k3"), [10.0])
    # ref - logp = -30 -> clamped to -20 -> exp(-20) + 20 - 1 = 19.000000002, then clamped to 10.
    assert_close(kl_penalty(tensor([0.0]), tensor([-30.0]), "k3"), [10.0])
    # Just inside both clamps: ref - logp = -5 -> exp(-5) + 4.
    assert_close(kl_penalty(tensor([0.0]), tensor([-5.0]), "k3"), [math.exp(-5.0) + 4.0])


def test_straight_through_kl_has_the_k3_value_and_the_k2_gradient():
    logp = tensor([-1.0, -2.0, -0.3]).requires_grad_()
    ref = tensor([-1.5, -1.0, -0.3])
    straight_through = kl_penalty(logp, ref, "k3+")
    torch.testing.assert_close(straight_through, kl_penalty(logp, ref, "k3"))
    straight_through.sum().backward()
    torch.testing.assert_close(logp.grad, (logp - ref).detach())  # d/dlogp of (logp - ref)^2 / 2


def test_unknown_kl_kind_is_rejected():
    with pytest.raises(ValueError, match="low_var_kl"):
        kl_penalty(tensor([0.0]), tensor([0.0]), "k4")


@FAST
@given(st.lists(st.tuples(st.floats(-30, 0), st.floats(-30, 0)), min_size=1, max_size=10))
def test_k3_is_non_negative_and_at_most_10(pairs):
    logp, ref = tensor([p for p, _ in pairs]), tensor([r for _, r in pairs])
    k3 = kl_penalty(logp, ref, "k3")
    assert bool((k3 >= 0).all()) and bool((k3 <= 10).all())


# --- aggregation ---------------------------------------------------------------------------------

LOSSES = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]]
LOSS_MASK = [[1, 1, 0], [1, 0, 0], [0, 0, 0]]  # the third sequence is empty and is not counted


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", (1 + 2 + 4) / 3),
        ("seq-mean-token-sum", (3 + 4) / 2),
        ("seq-mean-token-mean", (1.5 + 4) / 2),
        ("seq-mean-token-sum-norm", (3 / 3 + 4 / 3) / 2),
    ],
)
def test_aggregate_loss_hand_computed(mode, expected):
    assert_close(aggregate_loss(tensor(LOSSES), tensor(LOSS_MASK), mode), expected)
    assert loss_normalizer(tensor(LOSS_MASK), mode) == (3.0 if mode == "token-mean" else 2.0)


def test_token_sum_norm_divides_by_the_given_response_length():
    loss = aggregate_loss(
        tensor(LOSSES), tensor(LOSS_MASK), "seq-mean-token-sum-norm", max_response_length=10
    )
    assert_close(loss, (3 / 10 + 4 / 10) / 2)


def test_local_token_mean_depends_on_the_split_and_the_global_normalizer_removes_that():
    losses, mask = tensor([[1.0, 1.0], [3.0, 0.0]]), tensor([[1, 1], [1, 0]])
    whole = aggregate_loss(losses, mask, "token-mean")  # (1 + 1 + 3) / 3
    local = [aggregate_loss(losses[[row]], mask[[row]], "token-mean") for row in range(2)]  # 1 and 3
    assert_close(whole, 5 / 3)
    assert_close(sum(local) / 2, 2.0)  # averaging per-micro means weights the short sequence's token up
    glob = [
        aggregate_loss(losses[[row]], mask[[row]], "token-mean", global_normalizer=3.0) for row in range(2)
    ]
    assert_close(sum(glob), 5 / 3)


def test_aggregate_loss_rejects_unknown_mode_and_non_positive_normalizer():
    with pytest.raises(ValueError, match="token-mean"):
        aggregate_loss(tensor(LOSSES), tensor(LOSS_MASK), "sum")
    with pytest.raises(ValueError, match="positive"):
        aggregate_loss(tensor(LOSSES), tensor(LOSS_MASK), "token-mean", global_normalizer=0.0)


def _assert_split_matches_whole(losses, mask, mode, micro_batches):
    width = losses.shape[1]
    whole_input = losses.clone().requires_grad_()
    whole = aggregate_loss(whole_input, mask, mode, max_response_length=width)
    whole.backward()

    split_input = losses.clone().requires_grad_()
    normalizer = max(loss_normalizer(mask, mode), 1.0)
    total = sum(
        aggregate_loss(*trimmed(split_input, mask, rows), mode, normalizer, max_response_length=width)
        for rows in micro_batches
    )
    total.backward()
    torch.testing.assert_close(total, whole)
    torch.testing.assert_close(split_input.grad, whole_input.grad)


@FAST
@given(st.data())
def test_token_mean_loss_is_invariant_to_micro_batch_split(data):
    losses, mask, _ = data.draw(right_padded_batches())
    _assert_split_matches_whole(losses, mask, "token-mean", data.draw(random_splits(losses.shape[0])))


@pytest.mark.parametrize("mode", SEQ_MEAN_MODES)
@FAST
@given(data=st.data())
def test_seq_mean_losses_are_invariant_to_micro_batch_split(mode, data):
    losses, mask, _ = data.draw(right_padded_batches())
    _assert_split_matches_whole(losses, mask, mode, data.draw(random_splits(losses.shape[0])))


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@FAST
@given(data=st.data())
def test_policy_loss_gradient_is_invariant_to_token_budget_micro_batching(mode, data):
    # The drawn matrix drives the log-prob drift and, rearranged, the advantages (mixed signs, so both
    # clips and the dual clip fire); each micro batch is trimmed to its widest response.
    drift, mask, lengths = data.draw(right_padded_batches())
    advantages = drift.flip(0) - drift.roll(1, dims=1)
    width = drift.shape[1]
    logp_values = -(drift.abs() + 0.1)
    old_logp = logp_values + drift / 2
    budget = data.draw(st.integers(width + 1, 4 * width))  # every prompt is one token here
    micro_batches = token_budget_micro_batches([length + 1 for length in lengths], budget)
    clip = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0, "loss_agg_mode": mode}

    whole_logp = logp_values.clone().requires_grad_()
    whole, _ = policy_loss(whole_logp, old_logp, advantages, mask, **clip, max_response_length=width)
    whole.backward()

    split_logp = logp_values.clone().requires_grad_()
    normalizer = max(loss_normalizer(mask, mode), 1.0)
    total = 0.0
    for rows in micro_batches:
        micro_mask = trimmed(mask, mask, rows)[1]
        cut = micro_mask.shape[1]
        micro_loss, _ = policy_loss(
            split_logp[rows, :cut],
            old_logp[rows, :cut],
            advantages[rows, :cut],
            micro_mask,
            **clip,
            global_normalizer=normalizer,
            max_response_length=width,
        )
        total = total + micro_loss
    total.backward()
    torch.testing.assert_close(total, whole)
    torch.testing.assert_close(split_logp.grad, whole_logp.grad)


# --- policy and value loss -----------------------------------------------------------------------


def test_policy_loss_hand_computed_with_clip_and_dual_clip():
    # Per token (ratio r, advantage A), clip 0.2 / 0.2, c = 3:
    #   r 1.5, A +1: max(-1.5, -1.2)          = -1.2  (upper clip)
    #   r 0.5, A -1: max(0.5, 0.8) = 0.8, min(0.8, 3) = 0.8  (lower clip)
    #   r 4.0, A -1: max(4.0, 1.2) = 4.0, min(4.0, 3) = 3.0  (dual clip)
    #   r 1.0, A +2: -2
    # token-mean: 0.6 / 4 = 0.15; padding (A 100) is ignored.
    old_logp = tensor([[-2.0, -2.0, -2.0, -2.0, -2.0]])
    ratios = [1.5, 0.5, 4.0, 1.0, 1.0]
    logp = (old_logp + tensor([[math.log(r) for r in ratios]])).requires_grad_()
    advantages = tensor([[1.0, -1.0, -1.0, 2.0, 100.0]])
    mask = tensor([[1, 1, 1, 1, 0]])
    loss, stats = policy_loss(logp, old_logp, advantages, mask, 0.2, 0.2, 3.0, "token-mean")
    assert_close(loss, 0.15)
    assert_close(stats.clip_fraction, 0.5)
    assert_close(stats.lower_clip_fraction, 0.25)
    assert_close(stats.approx_kl, -math.log(1.5 * 0.5 * 4.0) / 4)
    loss.backward()
    # Clipped tokens carry no gradient; the unclipped one carries -A r / N = -2 / 4.
    assert_close(logp.grad, [[0.0, 0.0, 0.0, -0.5, 0.0]])


def test_policy_loss_requires_a_dual_clip_above_one():
    with pytest.raises(ValueError, match="clip_ratio_c"):
        policy_loss(
            tensor([[0.0]]), tensor([[0.0]]), tensor([[1.0]]), tensor([[1]]), 0.2, 0.2, 1.0, "token-mean"
        )


log_probs = st.floats(-25, 0)


def one_token_loss(logp, old_logp, advantage, clip_ratio_high=0.28, clip_ratio_c=3.0):
    loss, _ = policy_loss(
        tensor([[logp]]), tensor([[old_logp]]), tensor([[advantage]]), tensor([[1]]),
        0.2, clip_ratio_high, clip_ratio_c, "token-mean",
    )  # fmt: skip
    return float(loss)


@FAST
@given(log_probs, log_probs, st.floats(-5, -0.01), st.floats(1.01, 10))
def test_dual_clip_bounds_negative_advantage_loss(logp, old_logp, advantage, clip_ratio_c):
    assert (
        one_token_loss(logp, old_logp, advantage, clip_ratio_c=clip_ratio_c)
        <= -advantage * clip_ratio_c + 1e-9
    )


@FAST
@given(log_probs, log_probs, st.floats(0.01, 5), st.floats(0.0, 0.5))
def test_upper_clip_bounds_positive_advantage_gain(logp, old_logp, advantage, clip_ratio_high):
    loss = one_token_loss(logp, old_logp, advantage, clip_ratio_high=clip_ratio_high)
    assert float(loss) >= -advantage * (1 + clip_ratio_high) - 1e-9


@FAST
@given(right_padded_batches())
def test_on_policy_gradient_is_minus_advantage_over_valid_tokens(batch):
    advantages, mask, _ = batch
    logp = torch.full_like(mask, -1.0).requires_grad_()
    loss, stats = policy_loss(logp, logp.detach(), advantages, mask, 0.2, 0.2, 3.0, "token-mean")
    loss.backward()
    tokens = max(float(mask.sum()), 1.0)
    torch.testing.assert_close(logp.grad, -advantages * mask / tokens)
    assert float(stats.clip_fraction) == 0.0 and float(stats.approx_kl) == 0.0


def trl_dapo_loss(logp, old_logp, advantages, mask, epsilon_low, epsilon_high):
    """TRL 1.16 GRPOTrainer's default loss (loss_type "dapo", no delta), written from its definition:
    -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) summed over the batch's tokens / its token count."""
    ratio = torch.exp(logp - old_logp)
    per_token = -torch.min(ratio * advantages, torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) * advantages)
    return (per_token * mask).sum() / mask.sum().clamp(min=1.0)


@FAST
@given(right_padded_batches(), st.floats(-3, 3), st.floats(0.05, 0.3), st.floats(0.05, 0.4))
def test_token_mean_policy_loss_equals_trl_dapo_where_the_dual_clip_is_inactive(batch, shift, low, high):
    """Same value and gradient as TRL's default loss; verl's dual clip is the one addition, and it only
    caps negative-advantage tokens whose ratio passed clip_ratio_c (TRL has no dual clip)."""
    losses, mask, _ = batch
    advantages = losses  # any signs and sizes
    old_logp = torch.full_like(mask, -2.0)
    logp = (old_logp + shift * torch.tanh(losses.flip(0))).requires_grad_()
    ours, _ = policy_loss(logp, old_logp, advantages, mask, low, high, 3.0, "token-mean")
    theirs = trl_dapo_loss(logp, old_logp, advantages, mask, low, high)
    dual_clipped = ((torch.exp(logp - old_logp) > 3.0) & (advantages < 0) & (mask > 0)).any()
    if dual_clipped:
        assert float(ours) <= float(theirs) + 1e-9
        return
    torch.testing.assert_close(ours, theirs)
    (ours_grad,) = torch.autograd.grad(ours, logp)
    (theirs_grad,) = torch.autograd.grad(theirs, logp)
    torch.testing.assert_close(ours_grad, theirs_grad)


def test_value_loss_hand_computed():
    # Token 0: clip(1.0, 0.3, 0.7) = 0.7 -> max((1-2)^2, (0.7-2)^2) = 1.69 (clipped).
    # Token 1: 2.0 lies inside [1.8, 2.2]   -> 1.0.   0.5 * (1.69 + 1.0) / 2 = 0.6725.
    values = tensor([[1.0, 2.0, 50.0]]).requires_grad_()
    loss, stats = value_loss(
        values, tensor([[0.5, 2.0, 0.0]]), tensor([[2.0, 1.0, 0.0]]), tensor([[1, 1, 0]]), 0.2, "token-mean"
    )
    assert_close(loss, 0.6725)
    assert_close(stats.clip_fraction, 0.5)
    loss.backward()
    # The clipped token's loss is constant in v; token 1: 0.5 * 2 * (2 - 1) / 2.
    assert_close(values.grad, [[0.0, 0.5, 0.0]])


# --- entropy and log-probs -----------------------------------------------------------------------


def test_entropy_hand_computed():
    logits = tensor([[0.0, 0.0], [0.0, math.log(3.0)]])
    # Uniform over 2 -> ln 2; probabilities 1/4, 3/4 -> -(1/4 ln 1/4 + 3/4 ln 3/4).
    assert_close(
        entropy_from_logits(logits), [math.log(2.0), -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))]
    )


def test_log_probs_hand_computed_and_in_fp32_for_bf16_logits():
    logits = tensor([[0.0, 0.0, math.log(2.0)], [5.0, 5.0, 5.0]])
    assert_close(log_probs_from_logits(logits, torch.tensor([2, 0])), [math.log(0.5), math.log(1 / 3)])
    bf16 = logits.to(torch.bfloat16)
    result = log_probs_from_logits(bf16, torch.tensor([2, 0]))
    assert result.dtype == torch.float32
    torch.testing.assert_close(result, log_probs_from_logits(bf16.float(), torch.tensor([2, 0])))


@st.composite
def logits_batches(draw):
    shape = (draw(st.integers(1, 3)), draw(st.integers(1, 5)), draw(st.integers(2, 9)))
    seed = draw(st.integers(0, 2**16))
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(shape, generator=generator, dtype=torch.float32) * 4
    labels = torch.randint(0, shape[2], shape[:2], generator=generator)
    return logits, labels, draw(st.integers(1, 8))


@FAST
@given(logits_batches())
def test_chunked_entropy_equals_unchunked_in_value_and_gradient(batch):
    logits, _, chunk_size = batch
    whole_input, chunked_input = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    whole, chunked = (
        entropy_from_logits(whole_input),
        entropy_from_logits(chunked_input, chunk_size=chunk_size),
    )
    torch.testing.assert_close(chunked, whole)
    whole.sum().backward()
    chunked.sum().backward()
    torch.testing.assert_close(chunked_input.grad, whole_input.grad)


@FAST
@given(logits_batches())
def test_chunked_log_probs_equal_the_log_softmax_of_the_label(batch):
    logits, labels, chunk_size = batch
    reference = torch.log_softmax(logits.double(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(
        log_probs_from_logits(logits, labels, chunk_size=chunk_size), reference.float()
    )
    torch.testing.assert_close(log_probs_from_logits(logits, labels), reference.float())

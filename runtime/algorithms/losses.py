"""Losses of the actor and critic, their aggregation over tokens, and fp32 log-prob / entropy.

Aggregation contract (`aggregate_loss`), the property that makes gradients independent of how a
mini-batch is cut into micro batches:

    Let a mini-batch M (on one rank) be split into micro batches m_1..m_k, fixed-size or by token
    budget, each possibly trimmed to its own padded width. With

        global_normalizer = loss_normalizer(mask_of_M, mode)

    (the number of valid tokens for token-mean, the number of sequences with at least one valid
    token for the seq-mean-* modes), the per-micro-batch losses add up to the loss of M:

        sum_i aggregate_loss(loss_i, mask_i, mode, global_normalizer) == aggregate_loss(loss_M, mask_M, mode)

    so calling backward() on each micro loss accumulates exactly the gradient of the unsplit batch.
    No extra micro/mini rescaling may be applied on top. seq-mean-token-sum-norm (Dr.GRPO) divides each
    sequence's token sum by a constant, `max_response_length`; pass the configured response length,
    because the default (the micro batch's padded width) changes with the split.

    Across data-parallel ranks, FSDP averages gradients over the dp_size ranks. To get the gradient of
    the global batch, pass the normalizer summed over all ranks (an all-reduce SUM) divided by dp_size
    (verl multiplies by dp_size instead; it is the same number).

The trainer's total actor loss is then, all with the same mode and normalizer:
    policy_loss(...) - entropy_coeff * aggregate_loss(entropy, ...) + kl_loss_coef * aggregate_loss(kl_penalty(...), ...)
"""

from __future__ import annotations

from typing import Final

import torch
from attrs import frozen

from rlplan.runtime.algorithms.masked import masked_mean

LOSS_AGG_MODES: Final = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_KINDS: Final = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")

# verl/NeMo-RL clamps for the k3 estimator: exp() of a log-ratio above 20 overflows bf16/fp16
# and a single runaway token must not dominate the batch KL.
K3_LOG_RATIO_CLAMP: Final = 20.0
K3_VALUE_CLAMP: Final = 10.0
# The PPO ratio is exp(logp - old_logp); clamping the log-ratio keeps it finite (verl: +-20).
LOG_RATIO_CLAMP: Final = 20.0


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL(policy || reference) estimate from sampled-token log-probs.

    "kl"/"k1": logp - ref; "abs": |logp - ref|; "mse"/"k2": (logp - ref)^2 / 2;
    "low_var_kl"/"k3": exp(ref - logp) - (ref - logp) - 1, clamped (Schulman's unbiased, non-negative
    estimator). A trailing "+" (e.g. "k3+") keeps the value of that estimator but takes the gradient of
    k2, which is unbiased for the KL gradient (verl's straight-through variant).
    """
    if kind.endswith("+"):
        value = kl_penalty(logp, ref_logp, kind[:-1])
        k2 = kl_penalty(logp, ref_logp, "k2")
        return k2 - k2.detach() + value.detach()
    log_ratio = logp - ref_logp
    if kind in ("kl", "k1"):
        return log_ratio
    if kind == "abs":
        return log_ratio.abs()
    if kind in ("mse", "k2"):
        return 0.5 * log_ratio.square()
    if kind in ("low_var_kl", "k3"):
        ref_log_ratio = torch.clamp(-log_ratio, min=-K3_LOG_RATIO_CLAMP, max=K3_LOG_RATIO_CLAMP)
        k3 = torch.exp(ref_log_ratio) - ref_log_ratio - 1.0
        return torch.clamp(k3, min=-K3_VALUE_CLAMP, max=K3_VALUE_CLAMP)
    raise ValueError(f"unknown KL kind {kind!r}; expected one of {', '.join(KL_KINDS)} (optionally with '+')")


def _check_mode(mode: str) -> None:
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; expected one of {', '.join(LOSS_AGG_MODES)}")


def loss_normalizer(mask: torch.Tensor, mode: str) -> float:
    """What `aggregate_loss` divides by for this mask: valid tokens (token-mean) or non-empty sequences."""
    _check_mode(mode)
    if mode == "token-mean":
        return float(mask.sum())
    return float((mask.sum(dim=-1) > 0).sum())


def aggregate_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    global_normalizer: float | None = None,
    *,
    max_response_length: int | None = None,
) -> torch.Tensor:
    """Reduce a [B, T] per-token loss to a scalar; see the module docstring for the split contract.

    token-mean:              sum of valid-token losses / valid tokens
    seq-mean-token-sum:      per sequence the token sum, then / sequences
    seq-mean-token-mean:     per sequence the token mean, then / sequences
    seq-mean-token-sum-norm: per sequence the token sum / max_response_length, then / sequences (Dr.GRPO)

    Without `global_normalizer` the divisor is this batch's own `loss_normalizer(mask, mode)`.
    Sequences with no valid token contribute 0 and are not counted.
    """
    _check_mode(mode)
    if loss_mat.shape != mask.shape or loss_mat.dim() != 2:
        raise ValueError(
            f"loss_mat and mask must both be [B, T]; got {tuple(loss_mat.shape)} and {tuple(mask.shape)}"
        )
    if (
        global_normalizer is not None
        and isinstance(global_normalizer, (int, float))
        and global_normalizer <= 0
    ):
        raise ValueError(f"global_normalizer must be positive, got {global_normalizer}")
    mask = mask.to(loss_mat.dtype)
    # An empty local batch has nothing to average; dividing its zero sum by 1 keeps it at 0.
    normalizer = global_normalizer if global_normalizer is not None else max(loss_normalizer(mask, mode), 1.0)
    token_sums = (loss_mat * mask).sum(dim=-1)
    if mode == "token-mean":
        return token_sums.sum() / normalizer
    if mode == "seq-mean-token-sum":
        sequence_losses = token_sums
    elif mode == "seq-mean-token-mean":
        sequence_losses = token_sums / mask.sum(dim=-1).clamp(min=1.0)
    else:
        length = max_response_length if max_response_length is not None else loss_mat.shape[-1]
        sequence_losses = token_sums / length
    return sequence_losses.sum() / normalizer


@frozen(eq=False)
class PolicyLossStats:
    """Diagnostics of one policy-loss call, as detached scalar tensors (no host sync).

    Means over this call's valid tokens: clip_fraction (the ratio clip was active, verl's pg_clipfrac),
    lower_clip_fraction (the dual clip capped a negative-advantage token, pg_clipfrac_lower) and
    approx_kl (mean of old_logp - logp, verl's ppo_kl).
    """

    clip_fraction: torch.Tensor
    lower_clip_fraction: torch.Tensor
    approx_kl: torch.Tensor


@frozen(eq=False)
class ValueLossStats:
    """clip_fraction: share of valid tokens whose clipped value prediction gave the larger loss."""

    clip_fraction: torch.Tensor


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float,
    loss_agg_mode: str,
    global_normalizer: float | None = None,
    *,
    max_response_length: int | None = None,
) -> tuple[torch.Tensor, PolicyLossStats]:
    """PPO clipped surrogate with asymmetric clip (DAPO clip-higher) and dual clip.

    Per token: max(-A r, -A clip(r, 1 - low, 1 + high)) with r = exp(logp - old_logp); where A < 0
    that is further capped at -A c (dual clip, c > 1), so a token whose probability already grew far
    past the old policy cannot produce an unbounded loss.

    This is verl's compute_policy_loss_vanilla. TRL's GRPOTrainer default (loss_type "dapo", token-mean
    over the batch) is the same without the dual clip; on-policy (ratio 1) no clip is active in either.
    """
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for the dual clip, got {clip_ratio_c}")
    mask = response_mask.to(logp.dtype)
    log_ratio = torch.clamp(logp - old_logp, min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    clipped_loss = torch.maximum(unclipped, clipped)
    dual_clip_cap = -advantages * clip_ratio_c
    negative = advantages < 0
    per_token = torch.where(negative, torch.minimum(clipped_loss, dual_clip_cap), clipped_loss)
    loss = aggregate_loss(
        per_token, mask, loss_agg_mode, global_normalizer, max_response_length=max_response_length
    )
    with torch.no_grad():
        stats = PolicyLossStats(
            clip_fraction=masked_mean((clipped > unclipped).to(mask.dtype), mask),
            lower_clip_fraction=masked_mean(((clipped_loss > dual_clip_cap) & negative).to(mask.dtype), mask),
            approx_kl=masked_mean(-log_ratio, mask),
        )
    return loss, stats


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str,
    global_normalizer: float | None = None,
    *,
    max_response_length: int | None = None,
) -> tuple[torch.Tensor, ValueLossStats]:
    """Clipped value loss: 0.5 * max((v - R)^2, (clip(v, v_old - c, v_old + c) - R)^2), aggregated."""
    mask = response_mask.to(values.dtype)
    clipped_values = torch.clamp(values, old_values - cliprange_value, old_values + cliprange_value)
    unclipped_error = (values - returns).square()
    clipped_error = (clipped_values - returns).square()
    per_token = torch.maximum(unclipped_error, clipped_error)
    loss = 0.5 * aggregate_loss(
        per_token, mask, loss_agg_mode, global_normalizer, max_response_length=max_response_length
    )
    with torch.no_grad():
        stats = ValueLossStats(
            clip_fraction=masked_mean((clipped_error > unclipped_error).to(mask.dtype), mask)
        )
    return loss, stats


def _row_chunks(flat: torch.Tensor, chunk_size: int | None) -> tuple[torch.Tensor, ...]:
    if chunk_size is None:
        return (flat,)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    return flat.split(chunk_size, dim=0)


def entropy_from_logits(logits: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim, in fp32; shape logits.shape[:-1].

    With `chunk_size`, rows (all leading dims flattened) are processed chunk_size at a time, so the fp32
    copy and the softmax exist for one chunk only (verl's entropy_from_logits_with_chunking); the
    result is the same as unchunked.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    pieces = []
    for chunk in _row_chunks(flat, chunk_size):
        chunk = chunk.float()
        probs = torch.softmax(chunk, dim=-1)
        pieces.append(torch.logsumexp(chunk, dim=-1) - (probs * chunk).sum(dim=-1))
    return torch.cat(pieces).reshape(logits.shape[:-1])


def log_probs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, chunk_size: int | None = None
) -> torch.Tensor:
    """log softmax(logits)[label] in fp32 (bf16 logits are upcast first); shape labels.shape.

    Computed as logit[label] - logsumexp(logits), which never materializes the full log-softmax.
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(
            f"labels {tuple(labels.shape)} must match logits {tuple(logits.shape)} without the vocab dim"
        )
    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_labels = labels.reshape(-1, 1)
    chunk_labels = (flat_labels,) if chunk_size is None else flat_labels.split(chunk_size, dim=0)
    pieces = []
    for chunk, chunk_label in zip(_row_chunks(flat_logits, chunk_size), chunk_labels, strict=True):
        chunk = chunk.float()
        pieces.append(chunk.gather(-1, chunk_label).squeeze(-1) - torch.logsumexp(chunk, dim=-1))
    return torch.cat(pieces).reshape(labels.shape)

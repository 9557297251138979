"""Reductions over the valid (response) tokens of a padded [B, T] batch."""

from __future__ import annotations

import torch

# verl's masked_whiten epsilon: keeps a constant batch finite without visibly rescaling a real one.
WHITEN_EPS = 1e-8


def masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum()


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over valid tokens; 0 when there are none (an empty micro batch contributes nothing)."""
    mask = mask.to(values.dtype)
    return masked_sum(values, mask) / mask.sum().clamp(min=1.0)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(values - mean) / std over valid tokens, unbiased variance as in verl; 0 on padding.

    A single valid token has no spread: it whitens to 0 instead of dividing by a zero Bessel term.
    """
    mask = mask.to(values.dtype)
    count = mask.sum()
    mean = masked_sum(values, mask) / count.clamp(min=1.0)
    centered = (values - mean) * mask
    variance = (centered**2).sum() / (count - 1.0).clamp(min=1.0)
    return centered * torch.rsqrt(variance + WHITEN_EPS)

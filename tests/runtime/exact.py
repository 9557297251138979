"""Hand-computed expectations for the algorithm tests: float64 tensors and an absolute-tolerance check."""

from __future__ import annotations

import torch


def tensor(values, dtype=torch.float64):
    return torch.tensor(values, dtype=dtype)


def assert_close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, tensor(expected, actual.dtype), atol=atol, rtol=0)

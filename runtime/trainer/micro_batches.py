"""Cutting one rank's share of a pass into micro batches, identically counted on every rank.

FSDP issues collectives inside every forward and backward, so all ranks must run
the same number of micro batches. Fixed-size micro batches get that from equal
shards; token-budget micro batches take the largest count any rank needs
(all-reduce MAX) and split into that many.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlplan.planner.layout import RoleBatchLayout
from rlplan.planner.phases import TOKEN_BUDGET_KEY, Phase
from rlplan.runtime.trainer.token_batch import TokenBatch

if TYPE_CHECKING:
    import torch


def all_reduce_max(value: int, device: torch.device | str) -> int:
    import torch
    import torch.distributed as dist

    tensor = torch.tensor([value], dtype=torch.long, device=device)
    if dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


def all_reduce_sum(value: float, device: torch.device | str) -> float:
    import torch
    import torch.distributed as dist

    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return float(tensor.item())


def micro_batch_indices(batch: TokenBatch, role: RoleBatchLayout, device: torch.device | str) -> list[list[int]]:
    """Index lists, one per micro batch, covering `batch` once."""
    from rlplan.runtime.batching import fixed_micro_batches, token_budget_micro_batches

    if role.token_budget_per_sp_group is not None:
        lengths = batch["sequence_lengths"].tolist()
        budget = role.token_budget_per_sp_group
        field = TOKEN_BUDGET_KEY[Phase(role.role)]
        local = token_budget_micro_batches(lengths, budget, 1, budget_field=field)
        count = all_reduce_max(len(local), device)
        return [list(group) for group in token_budget_micro_batches(lengths, budget, count, budget_field=field)]
    size = role.micro_batch_size_per_gpu or role.chunk_size or len(batch)
    return [list(group) for group in fixed_micro_batches(len(batch), size)]


def mini_batch_indices(size: int, mini_batch_size: int, *, shuffle: bool, generator: torch.Generator = None) -> list[list[int]]:
    """Consecutive (or, with `shuffle`, permuted) chunks of `mini_batch_size` samples."""
    import torch

    order = torch.randperm(size, generator=generator).tolist() if shuffle else list(range(size))
    return [order[start : start + mini_batch_size] for start in range(0, size, mini_batch_size)]

"""Ulysses sequence parallelism: the sp ranks of a group share one packed micro batch, 1/sp of its tokens each.

Everything in a decoder layer but attention works token by token, so it runs on the local
shard. Around attention an all-to-all trades the sequence split for a head split
(DeepSpeed-Ulysses, as verl does it): q, k, v of (1, heads, S/sp, d) become (1, heads/sp, S, d),
attention runs over the whole packed stream one sequence at a time (varlen_attention.varlen_sdpa,
never an (S, S) mask), and a second all-to-all returns (1, S/sp, heads, d). The per-token results (log-probs, entropy, values) are
all-gathered over the group, so every rank of it computes the same loss.

Gradients: each rank's backward reaches the parameters only through its own tokens, and FSDP
averages gradients over all dp x sp ranks; the gather's backward multiplies its slice by sp so
that the sum over the group is the gradient of the whole micro batch (verl's grad scaler).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from attrs import frozen

from rlplan.planner.arch import heads_split_evenly

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn
    from torch.autograd.function import FunctionCtx
    from torch.distributed import ProcessGroup
    from transformers import PretrainedConfig

ATTENTION_IMPLEMENTATION = "rlplan_ulysses"


@frozen(kw_only=True)
class SequenceParallelGroup:
    """This rank's Ulysses group: contiguous world ranks [dp_index * size, (dp_index + 1) * size)."""

    size: int
    rank: int
    dp_index: int
    process_group: ProcessGroup


def new_sequence_parallel_group(world_size: int, size: int, rank: int) -> SequenceParallelGroup | None:
    """Every rank creates every group (torch.distributed requires it) and keeps its own; None for sp = 1."""
    import torch.distributed as dist

    if size <= 1:
        return None
    if world_size % size:
        raise ValueError(f"world size {world_size} is not a multiple of the Ulysses size {size}")
    mine = None
    for dp_index in range(world_size // size):
        ranks = list(range(dp_index * size, (dp_index + 1) * size))
        group = dist.new_group(ranks)
        if rank in ranks:
            mine = SequenceParallelGroup(size=size, rank=rank - ranks[0], dp_index=dp_index, process_group=group)
    assert mine is not None
    return mine


def data_parallel_rank(group: SequenceParallelGroup | None, rank: int) -> int:
    """Which dp shard this rank works on: ranks of one Ulysses group hold, cut and shuffle the same samples."""
    return group.dp_index if group is not None else rank


def _all_to_all(tensor: Tensor, scatter_dim: int, gather_dim: int, group: SequenceParallelGroup) -> Tensor:
    import torch
    import torch.distributed as dist

    inputs = [part.contiguous() for part in tensor.chunk(group.size, dim=scatter_dim)]
    outputs = [torch.empty_like(part) for part in inputs]
    dist.all_to_all(outputs, inputs, group=group.process_group)
    return torch.cat(outputs, dim=gather_dim)


@functools.cache
def _autograd_functions() -> tuple[type[torch.autograd.Function], type[torch.autograd.Function]]:
    import torch
    import torch.distributed as dist

    class AllToAll(torch.autograd.Function):
        @staticmethod
        def forward(ctx: FunctionCtx, tensor: Tensor, scatter_dim: int, gather_dim: int, group: SequenceParallelGroup) -> Tensor:
            ctx.dims, ctx.group = (scatter_dim, gather_dim), group
            return _all_to_all(tensor, scatter_dim, gather_dim, group)

        @staticmethod
        def backward(ctx: FunctionCtx, grad: Tensor) -> tuple[Tensor | None, ...]:
            scatter_dim, gather_dim = ctx.dims
            return _all_to_all(grad, gather_dim, scatter_dim, ctx.group), None, None, None

    class GatherTokens(torch.autograd.Function):
        @staticmethod
        def forward(ctx: FunctionCtx, local: Tensor, group: SequenceParallelGroup) -> Tensor:
            ctx.group = group
            parts = [torch.empty_like(local) for _ in range(group.size)]
            dist.all_gather(parts, local.contiguous(), group=group.process_group)
            return torch.cat(parts, dim=0)

        @staticmethod
        def backward(ctx: FunctionCtx, grad: Tensor) -> tuple[Tensor | None, ...]:
            group = ctx.group
            return grad.chunk(group.size, dim=0)[group.rank] * group.size, None

    return AllToAll, GatherTokens


def all_to_all(tensor: Tensor, scatter_dim: int, gather_dim: int, group: SequenceParallelGroup) -> Tensor:
    """Split `scatter_dim` over the group, concatenate what arrives along `gather_dim` (differentiable)."""
    return _autograd_functions()[0].apply(tensor, scatter_dim, gather_dim, group)


def gather_tokens(local: Tensor, group: SequenceParallelGroup) -> Tensor:
    """(S/sp, ...) per rank -> (S, ...) on every rank, in rank order (differentiable, grad scaled by sp)."""
    return _autograd_functions()[1].apply(local, group)


@frozen(kw_only=True)
class PackedShard:
    """This rank's slice of a packed micro batch, padded to a multiple of sp."""

    input_ids: Tensor  # (1, S_pad / sp)
    position_ids: Tensor  # (1, S_pad / sp)
    labels: Tensor  # (S_pad / sp,) the next token of each local position
    cu_seqlens: list[int]  # the sequence starts of the whole padded stream, ending with S_pad
    total_tokens: int  # S, before padding


def shard_packed(input_ids: Tensor, position_ids: Tensor, group: SequenceParallelGroup) -> PackedShard:
    """Pad the (1, S) packed stream to a multiple of sp and keep this rank's contiguous slice.

    The padding is its own sequence (positions restart at 0), so no real token attends to it.
    """
    import torch

    from rlplan.runtime.trainer.varlen_attention import cu_seqlens_from_positions

    total = input_ids.shape[1]
    padded = -(-total // group.size) * group.size
    extra = padded - total
    ids = torch.nn.functional.pad(input_ids, (0, extra))
    positions = torch.cat([position_ids, torch.arange(extra, device=position_ids.device).unsqueeze(0)], dim=1)
    labels = torch.roll(ids[0], -1)
    width = padded // group.size
    local = slice(group.rank * width, (group.rank + 1) * width)
    return PackedShard(
        input_ids=ids[:, local],
        position_ids=positions[:, local],
        labels=labels[local],
        cu_seqlens=cu_seqlens_from_positions(positions),
        total_tokens=total,
    )


@frozen(kw_only=True)
class UlyssesAttentionInputs:
    """What attention needs beyond the local q, k, v; travels to it as a model keyword argument."""

    group: SequenceParallelGroup
    cu_seqlens: list[int]


def ulysses_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    *,
    ulysses: UlyssesAttentionInputs,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    **kwargs: object,
) -> tuple[Tensor, None]:
    """transformers' attention interface: per-sequence sdpa over the whole packed stream, on heads/sp heads per rank."""
    from rlplan.runtime.trainer.varlen_attention import varlen_sdpa

    if sliding_window is not None or dropout:
        raise ValueError("Ulysses attention here supports neither sliding windows nor attention dropout")
    group = ulysses.group
    heads, kv_heads = query.shape[1], key.shape[1]
    if kv_heads % group.size:
        # Fewer KV heads than ranks (sp a multiple of them): give every query head its own copy.
        key, value = (x.repeat_interleave(heads // kv_heads, dim=1) for x in (key, value))
    # (1, heads, S/sp, d) -> (1, heads/sp, S, d)
    query, key, value = (all_to_all(x, 1, 2, group) for x in (query, key, value))
    # Fewer KV heads than query heads left on this rank: varlen_sdpa shares each one over its query group.
    output = varlen_sdpa(query, key, value, ulysses.cu_seqlens, scale=scaling)
    # (1, heads/sp, S, d) -> (1, S, heads/sp, d) -> (1, S/sp, heads, d)
    return all_to_all(output.transpose(1, 2), 1, 2, group), None


def use_ulysses_attention(model: nn.Module, size: int) -> None:
    """Route the model's attention through `ulysses_attention` (registered once per process)."""
    from transformers import AttentionInterface

    check_heads_divide(model.config, size)
    AttentionInterface.register(ATTENTION_IMPLEMENTATION, ulysses_attention)
    model.set_attn_implementation(ATTENTION_IMPLEMENTATION)


def check_heads_divide(config: PretrainedConfig, size: int) -> None:
    """Ulysses splits the attention heads over the group, and the KV heads or copies of them (rule R5)."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if not heads_split_evenly(heads, kv_heads, size):
        raise ValueError(f"Ulysses size {size} does not split {heads} attention heads and {kv_heads} KV heads")

"""Which sequences go together: micro batches (fixed or by token budget), rank partitions, packing.

Planning works on indices and lengths only, in pure Python, so it can run before any tensor exists and
the same plan can be reused for every tensor of a batch. torch is imported only by the packing
functions, which build tensors.

Balancing uses Karmarkar-Karp (largest differencing), as verl's seqlen_balancing.py does: repeatedly
merge the two partial partitionings with the largest spread, pairing the heaviest part of one with
the lightest part of the other.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from attrs import field, frozen

from rlplan.planner.errors import PlanError

if TYPE_CHECKING:
    import torch

# verl's calculate_workload: a sequence of L tokens costs ~ 24576*L (matmuls) + L^2 (attention) FLOPs.
# Integer form of L + L^2/24576, so the balancing is exact and deterministic.
ATTENTION_BALANCE_TOKENS = 24576


class SequenceOverBudgetError(PlanError, ValueError):
    """One sequence alone is longer than the per-micro-batch token budget (verl's rule R1).

    A PlanError, so the CLI prints it with its field and fix; a ValueError, so callers handling
    bad arguments catch it too.
    """

    def __init__(self, field: str, message: str, fix: str = "") -> None:
        # Spelled out because ValueError's constructor would otherwise shadow PlanError's for type checkers.
        PlanError.__init__(self, field, message, fix)


def sequence_workload(length: int) -> int:
    return ATTENTION_BALANCE_TOKENS * length + length * length


def karmarkar_karp(weights: Sequence[int], num_parts: int, equal_size: bool = False) -> list[list[int]]:
    """Split item indices into `num_parts` parts with near-equal weight sums (largest differencing).

    With `equal_size`, every part gets len(weights) / num_parts items: the items are seeded k at a
    time in weight order, one per part, and merges combine parts pairwise, so counts stay equal.
    Parts are returned heaviest first, each with its indices ascending. Two guarantees:
    the heaviest and lightest part differ by at most the largest weight (a merge's spread never
    exceeds the larger of the two merged spreads), and with weights >= 1 and len(weights) >= num_parts
    no part is empty (merging partitionings with j and l non-empty parts leaves min(k, j + l)).
    """
    if num_parts < 1:
        raise ValueError(f"num_parts must be >= 1, got {num_parts}")
    if equal_size and len(weights) % num_parts:
        raise ValueError(f"{len(weights)} items cannot be split into {num_parts} equal-size parts")
    order = sorted(range(len(weights)), key=lambda index: (weights[index], index))
    seeds = (
        [order[offset : offset + num_parts] for offset in range(0, len(order), num_parts)]
        if equal_size
        else [[index] for index in order]
    )
    tiebreak = itertools.count()
    heap: list[tuple[int, int, int, list[tuple[int, list[int]]]]] = []

    def push(parts: list[tuple[int, list[int]]]) -> None:
        parts.sort(key=lambda part: part[0], reverse=True)
        # heapq pops the smallest key: the largest spread (then the heaviest part) goes first.
        heapq.heappush(heap, (parts[-1][0] - parts[0][0], -parts[0][0], next(tiebreak), parts))

    for seed in seeds:
        parts = [(weights[index], [index]) for index in seed]
        push(parts + [(0, []) for _ in range(num_parts - len(parts))])
    if not heap:
        return [[] for _ in range(num_parts)]
    while len(heap) > 1:
        first = heapq.heappop(heap)[3]
        second = heapq.heappop(heap)[3]
        push([(a[0] + b[0], a[1] + b[1]) for a, b in zip(first, reversed(second), strict=True)])
    return [sorted(indices) for _, indices in heap[0][3]]


def fixed_micro_batches(num_sequences: int, micro_batch_size: int) -> list[list[int]]:
    """Consecutive runs of `micro_batch_size` indices; the last one is shorter if it does not divide."""
    if num_sequences < 0 or micro_batch_size < 1:
        raise ValueError(
            f"need num_sequences >= 0 and micro_batch_size >= 1, got {num_sequences}, {micro_batch_size}"
        )
    return [
        list(range(start, min(start + micro_batch_size, num_sequences)))
        for start in range(0, num_sequences, micro_batch_size)
    ]


def token_budget_micro_batches(
    seq_lens: Sequence[int],
    max_tokens_per_micro_batch: int,
    min_num_micro_batches: int = 1,
    *,
    budget_field: str = "actor.ppo_max_token_len_per_gpu",
) -> list[list[int]]:
    """Dynamic batch size: micro batches whose token sums each fit the budget, balanced by workload.

    Starts from ceil(total tokens / budget) micro batches (at least `min_num_micro_batches`; the
    trainer passes the MAX of this count all-reduced over DP ranks, so every rank runs the same
    number of forward/backward steps and FSDP's collectives pair up). Karmarkar-Karp balances the
    workload L + L^2/24576; if a part then exceeds the token budget the count grows by one until every
    part fits, which it must by len(seq_lens) parts, since each sequence alone fits.
    Heaviest micro batch first, so a too-large budget fails on the first step rather than later.

    `budget_field` names the plan field behind the budget in the error (e.g. ref.log_prob_max_token_len_per_gpu).
    """
    if not seq_lens:
        raise ValueError("seq_lens is empty: there is nothing to split into micro batches")
    if min(seq_lens) < 1:
        raise ValueError(f"every sequence needs at least one token, got length {min(seq_lens)}")
    if max_tokens_per_micro_batch < 1:
        raise ValueError(f"max_tokens_per_micro_batch must be >= 1, got {max_tokens_per_micro_batch}")
    longest = max(seq_lens)
    if longest > max_tokens_per_micro_batch:
        raise SequenceOverBudgetError(
            field=budget_field,
            message=(
                f"a sequence of {longest} tokens (prompt + response) does not fit the micro-batch token "
                f"budget of {max_tokens_per_micro_batch}."
            ),
            fix=f"raise {budget_field} to at least {longest} (max_prompt_length + max_response_length)",
        )
    if not 1 <= min_num_micro_batches <= len(seq_lens):
        raise ValueError(
            f"min_num_micro_batches must lie in [1, {len(seq_lens)}] (one sequence per micro batch at most), "
            f"got {min_num_micro_batches}"
        )
    workloads = [sequence_workload(length) for length in seq_lens]
    count = max(min_num_micro_batches, math.ceil(sum(seq_lens) / max_tokens_per_micro_batch))
    while True:
        parts = karmarkar_karp(workloads, count)
        if all(sum(seq_lens[index] for index in part) <= max_tokens_per_micro_batch for part in parts):
            return parts
        count += 1


def balanced_rank_partitions(seq_lens: Sequence[int], world_size: int) -> list[list[int]]:
    """verl's balance_batch: equal-size per-rank partitions of a global batch with balanced token sums.

    Partition r is rank r's share; each lists its indices ascending. Equal sizes keep every rank's
    mini/micro batch arithmetic identical; balanced tokens keep ranks from waiting on the slowest one.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if len(seq_lens) % world_size:
        raise ValueError(
            f"a batch of {len(seq_lens)} sequences cannot be split evenly over {world_size} ranks; "
            "the global batch (train_batch_size * rollout.n) must be divisible by the data-parallel size"
        )
    return sorted(karmarkar_karp(list(seq_lens), world_size, equal_size=True), key=lambda part: part[:1])


def _require_nonempty_sequences(lengths: tuple[int, ...]) -> None:
    if not lengths or min(lengths) < 1:
        raise ValueError(
            f"a packed batch needs at least one sequence and no empty one, got lengths {lengths}"
        )


@frozen(eq=False)
class PackedBatch:
    """Sequences laid end to end in one row, for a remove-padding forward.

    Run the model with `input_ids=input_ids, position_ids=position_ids, attention_mask=None,
    use_cache=False`: the attention kernels find the sequence boundaries from the position_ids that
    restart at 0 (or from cu_seqlens for flash-attn varlen), and that detection is only taken without
    a KV cache. Token t's next-token label is token t+1 of the same sequence; the last token of each
    sequence has none.
    """

    input_ids: torch.Tensor  # [1, total_tokens], int64
    position_ids: torch.Tensor  # [1, total_tokens], 0..L-1 per sequence
    cu_seqlens: torch.Tensor  # [num_sequences + 1], int32 offsets (flash-attn's layout)
    lengths: tuple[int, ...] = field(validator=lambda _, __, lengths: _require_nonempty_sequences(lengths))

    def __attrs_post_init__(self) -> None:
        expected = (1, sum(self.lengths))
        for name in ("input_ids", "position_ids"):
            if tuple(getattr(self, name).shape) != expected:
                raise ValueError(f"{name} must be {expected} for lengths {self.lengths}")

    @property
    def num_sequences(self) -> int:
        return len(self.lengths)

    @property
    def total_tokens(self) -> int:
        return sum(self.lengths)

    @property
    def max_seqlen(self) -> int:
        return max(self.lengths)


def pack_sequences(sequences: Sequence[Sequence[int]]) -> PackedBatch:
    """Concatenate token-id lists into one [1, total] row with per-sequence position ids."""
    import torch

    lengths = tuple(len(sequence) for sequence in sequences)
    _require_nonempty_sequences(lengths)
    input_ids = torch.tensor([token for sequence in sequences for token in sequence], dtype=torch.long)
    position_ids = torch.cat([torch.arange(length, dtype=torch.long) for length in lengths])
    cu_seqlens = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu_seqlens[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int32), dim=0)
    return PackedBatch(
        input_ids=input_ids.unsqueeze(0),
        position_ids=position_ids.unsqueeze(0),
        cu_seqlens=cu_seqlens,
        lengths=lengths,
    )


def unpack(values: torch.Tensor, packed: PackedBatch) -> list[torch.Tensor]:
    """Split per-token outputs of a packed forward ([1, total, ...] or [total, ...]) back per sequence."""
    total = packed.total_tokens
    if values.dim() >= 2 and values.shape[0] == 1 and values.shape[1] == total:
        values = values.squeeze(0)
    if values.dim() == 0 or values.shape[0] != total:
        raise ValueError(
            f"values {tuple(values.shape)} do not hold the {total} packed tokens in their first dims"
        )
    return list(values.split(list(packed.lengths), dim=0))

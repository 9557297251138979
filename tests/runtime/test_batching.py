"""Micro-batch planning, rank partitions and sequence packing."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlplan.planner.errors import PlanError
from rlplan.runtime.batching import (
    balanced_rank_partitions,
    fixed_micro_batches,
    karmarkar_karp,
    sequence_workload,
    token_budget_micro_batches,
)

FAST = settings(max_examples=60, deadline=None)
lengths = st.lists(st.integers(1, 4096), min_size=1, max_size=40)


def covers_each_index_once(parts, size):
    return sorted(index for part in parts for index in part) == list(range(size))


def test_batching_plans_without_importing_torch():
    # The planner may reuse the micro-batch plan; it must never pull in torch.
    code = "import sys, rlplan.runtime.batching; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_fixed_micro_batches_hand_computed():
    assert fixed_micro_batches(5, 2) == [[0, 1], [2, 3], [4]]
    assert fixed_micro_batches(4, 4) == [[0, 1, 2, 3]]
    assert fixed_micro_batches(0, 3) == []
    with pytest.raises(ValueError):
        fixed_micro_batches(4, 0)


def test_karmarkar_karp_hand_computed():
    # The textbook case: differencing 8-7, 6-5, 4-1, 3-1 leaves 16 / 14, though 15 / 15 exists.
    # The heuristic trades that optimum for O(n log n).
    weights = [8, 7, 6, 5, 4]
    parts = karmarkar_karp(weights, 2)
    assert [sum(weights[index] for index in part) for part in parts] == [16, 14]
    assert covers_each_index_once(parts, len(weights))
    # Equal size: 3 + 2 and 1 + 4.
    assert sorted(karmarkar_karp([3, 1, 2, 4], 2, equal_size=True)) == [[0, 2], [1, 3]]


def test_token_budget_micro_batches_hand_computed():
    assert token_budget_micro_batches([5, 5, 5, 5], 10) == [[0, 3], [1, 2]]
    # ceil(20 / 10) = 2 micro batches, raised to the DP-wide maximum of 3.
    assert len(token_budget_micro_batches([5, 5, 5, 5], 10, min_num_micro_batches=3)) == 3
    # 6 + 6 + 6 > 10 per pair, so the count grows past ceil(18 / 10) = 2 until each part fits.
    assert sorted(token_budget_micro_batches([6, 6, 6], 10)) == [[0], [1], [2]]


def test_a_sequence_longer_than_the_budget_names_the_plan_field():
    with pytest.raises(PlanError, match="actor.ppo_max_token_len_per_gpu") as error:
        token_budget_micro_batches([100, 4097], 4096)
    assert isinstance(error.value, ValueError)
    assert "4097" in error.value.fix
    with pytest.raises(PlanError, match="ref.log_prob_max_token_len_per_gpu"):
        token_budget_micro_batches([9], 8, budget_field="ref.log_prob_max_token_len_per_gpu")


def test_token_budget_rejects_more_micro_batches_than_sequences():
    with pytest.raises(ValueError, match="min_num_micro_batches"):
        token_budget_micro_batches([5, 5], 10, min_num_micro_batches=3)


@FAST
@given(lengths, st.integers(1, 16384), st.integers(1, 40))
def test_token_budget_micro_batches_respect_budget_and_cover_every_sequence_once(seq_lens, budget, minimum):
    budget = max(budget, max(seq_lens))
    minimum = min(minimum, len(seq_lens))
    parts = token_budget_micro_batches(seq_lens, budget, min_num_micro_batches=minimum)
    assert covers_each_index_once(parts, len(seq_lens))
    assert all(part for part in parts)
    assert all(sum(seq_lens[index] for index in part) <= budget for part in parts)
    assert len(parts) >= max(minimum, math.ceil(sum(seq_lens) / budget))


@FAST
@given(lengths, st.integers(1, 6))
def test_token_budget_micro_batches_come_heaviest_first(seq_lens, minimum):
    parts = token_budget_micro_batches(
        seq_lens, max(seq_lens) * 2, min_num_micro_batches=min(minimum, len(seq_lens))
    )
    workloads = [sum(sequence_workload(seq_lens[index]) for index in part) for part in parts]
    assert workloads == sorted(workloads, reverse=True)


@FAST
@given(st.integers(1, 8), st.integers(1, 6), st.data())
def test_balanced_partitions_are_equal_size(world_size, per_rank, data):
    seq_lens = data.draw(
        st.lists(st.integers(1, 4096), min_size=world_size * per_rank, max_size=world_size * per_rank)
    )
    parts = balanced_rank_partitions(seq_lens, world_size)
    assert len(parts) == world_size
    assert all(len(part) == per_rank for part in parts)
    assert covers_each_index_once(parts, len(seq_lens))


@FAST
@given(st.integers(2, 8), st.integers(1, 6), st.data())
def test_balanced_partitions_spread_at_most_the_longest_sequence(world_size, per_rank, data):
    # Pairing part i of one partitioning with part k-1-i of the other keeps a merge's spread within the
    # larger of the two spreads, and a seed's spread is at most its longest sequence.
    seq_lens = data.draw(
        st.lists(st.integers(1, 4096), min_size=world_size * per_rank, max_size=world_size * per_rank)
    )
    sums = [sum(seq_lens[index] for index in part) for part in balanced_rank_partitions(seq_lens, world_size)]
    assert max(sums) - min(sums) <= max(seq_lens)


def test_balanced_partitions_hand_computed_and_indivisible_batch_rejected():
    assert balanced_rank_partitions([1, 2, 3, 4, 5, 6], 3) == [[0, 5], [1, 4], [2, 3]]
    with pytest.raises(ValueError, match="divisible"):
        balanced_rank_partitions([1, 2, 3], 2)


# --- packing (needs torch) -----------------------------------------------------------------------


@pytest.mark.runtime
def test_pack_sequences_hand_computed():
    torch = pytest.importorskip("torch", reason="the runtime extra (torch) is not installed")
    from rlplan.runtime.batching import pack_sequences

    packed = pack_sequences([[11, 12, 13], [21, 22]])
    assert packed.input_ids.tolist() == [[11, 12, 13, 21, 22]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 0, 1]]
    assert packed.cu_seqlens.tolist() == [0, 3, 5] and packed.cu_seqlens.dtype == torch.int32
    assert (packed.num_sequences, packed.total_tokens, packed.max_seqlen) == (2, 5, 3)
    with pytest.raises(ValueError, match="empty"):
        pack_sequences([[1], []])


@pytest.mark.runtime
@FAST
@given(
    st.lists(st.lists(st.integers(0, 50000), min_size=1, max_size=12), min_size=1, max_size=8),
    st.integers(0, 3),
)
def test_pack_unpack_round_trip(sequences, hidden):
    torch = pytest.importorskip("torch", reason="the runtime extra (torch) is not installed")
    from rlplan.runtime.batching import pack_sequences, unpack

    packed = pack_sequences(sequences)
    assert [piece.tolist() for piece in unpack(packed.input_ids, packed)] == sequences
    assert [piece.tolist() for piece in unpack(packed.position_ids[0], packed)] == [
        list(range(len(sequence))) for sequence in sequences
    ]
    # Per-token outputs with trailing dims (hidden states, logits) split the same way.
    outputs = torch.arange(packed.total_tokens * (hidden + 1)).reshape(1, packed.total_tokens, hidden + 1)
    pieces = unpack(outputs, packed)
    assert [piece.shape[0] for piece in pieces] == [len(sequence) for sequence in sequences]
    assert torch.equal(torch.cat(pieces), outputs[0])


@pytest.mark.runtime
def test_unpack_rejects_values_of_another_length():
    pytest.importorskip("torch", reason="the runtime extra (torch) is not installed")
    from rlplan.runtime.batching import pack_sequences, unpack

    packed = pack_sequences([[1, 2], [3]])
    with pytest.raises(ValueError, match="3 packed tokens"):
        unpack(packed.input_ids[:, :2], packed)

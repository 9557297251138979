"""Architecture's derived facts (planner/arch.py): the one heads-divide-by-n test."""

from __future__ import annotations

import attrs
from hypothesis import given
from hypothesis import strategies as st

from rlplan.planner.arch import heads_split_evenly
from tests.planner.plans import QWEN25_7B


def _every_rank_gets_whole_query_heads_in_whole_or_one_kv_group(heads: int, kv_heads: int, n: int) -> bool:
    """Deal the query heads out to n ranks in order and look at the KV group of each one."""
    if heads % n:
        return False
    per_rank, group = heads // n, heads // kv_heads
    for rank in range(n):
        kv_of_rank = {q // group for q in range(rank * per_rank, (rank + 1) * per_rank)}
        # Either the rank holds whole KV groups (the KV heads split) or part of one (that KV head is copied).
        whole_groups = per_rank % group == 0 and rank * per_rank % group == 0
        if not (whole_groups or len(kv_of_rank) == 1):
            return False
    return True


@given(kv_heads=st.integers(1, 16), group=st.integers(1, 8), n=st.integers(1, 64))
def test_heads_split_evenly_iff_dealing_heads_in_order_gives_each_rank_whole_or_one_kv_group(kv_heads, group, n):
    heads = kv_heads * group
    assert heads_split_evenly(heads, kv_heads, n) == _every_rank_gets_whole_query_heads_in_whole_or_one_kv_group(
        heads, kv_heads, n)


def test_qwen_7b_splits_its_28_heads_and_4_kv_heads_over_1_2_and_4_only():
    # 7 ranks would take 4 query heads each, but 4 KV heads neither split over 7 nor copy evenly.
    assert [n for n in (1, 2, 4, 7, 8) if QWEN25_7B.splits_heads(n)] == [1, 2, 4]


def test_latent_kv_lets_an_mla_model_split_only_its_query_heads():
    mla = attrs.evolve(QWEN25_7B, kv_lora_rank=512, num_attention_heads=16, num_kv_heads=3)
    assert not mla.splits_heads(4)  # Ulysses: 3 KV heads neither split over 4 nor copy evenly
    assert mla.splits_heads(4, latent_kv=True)  # the engine keeps the latent KV whole on every rank
    assert not QWEN25_7B.splits_heads(8, latent_kv=True)  # no latent KV: the KV heads still count

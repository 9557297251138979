"""The caching allocator's documented policy (planner/memory/allocator.py), held to PyTorch's constants and to
the invariants any allocator keeps."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlplan.planner.errors import PlanError
from rlplan.planner.memory.allocator import (
    K_LARGE_BUFFER,
    AllocatorConfig,
    CachingAllocator,
    allocation_size,
    parse_alloc_conf,
    round_size,
)

MIB = 2**20
GIB = 2**30


def test_sizes_follow_the_caching_allocators_constants():
    assert round_size(1) == 512 and round_size(513) == 1024
    assert allocation_size(MIB) == 2 * MIB  # small requests pack into 2 MiB segments
    assert allocation_size(MIB + 512) == 20 * MIB  # 1 to 10 MiB share a 20 MiB segment
    assert allocation_size(11 * MIB) == 12 * MIB  # larger ones are rounded to 2 MiB


def test_a_freed_block_serves_the_next_request_of_its_size():
    allocator = CachingAllocator()
    block = allocator.malloc(3 * GIB)
    allocator.free(block)
    allocator.malloc(3 * GIB)
    assert allocator.reserved == 3 * GIB and allocator.peak_reserved == 3 * GIB


def test_a_larger_request_cannot_use_a_smaller_segment_and_the_smaller_one_stays_cached():
    allocator = CachingAllocator()
    allocator.free(allocator.malloc(3 * GIB))
    allocator.malloc(3 * GIB + 4 * MIB)
    assert allocator.reserved == 6 * GIB + 4 * MIB  # the 3 GiB segment is cached beside the new one
    assert allocator.needed == 3 * GIB + 4 * MIB  # and given back before an out-of-memory error


def test_expandable_segments_grow_in_place_instead_of_stranding_segments():
    allocator = CachingAllocator(AllocatorConfig(expandable_segments=True))
    allocator.free(allocator.malloc(3 * GIB))
    allocator.malloc(3 * GIB + 4 * MIB)
    assert allocator.reserved < 3 * GIB + 40 * MIB  # one segment, mapped in 20 MiB pages


def test_a_split_segment_strands_its_free_part_while_a_block_in_it_lives():
    allocator = CachingAllocator()
    allocator.free(allocator.malloc(3 * GIB))
    allocator.malloc(1 * GIB)  # best fit splits the cached segment
    assert allocator.allocated == 1 * GIB and allocator.needed == 3 * GIB


def test_past_the_capacity_the_cache_is_given_back_first():
    allocator = CachingAllocator(capacity=4 * GIB)
    allocator.free(allocator.malloc(3 * GIB))
    allocator.malloc(3 * GIB + 4 * MIB)
    assert allocator.reserved == 3 * GIB + 4 * MIB and not allocator.overflowed
    allocator.malloc(2 * GIB)
    assert allocator.overflowed  # no cache left to give back: a real allocator would fail here


def test_an_oversize_block_is_not_split_for_a_small_request():
    allocator = CachingAllocator(AllocatorConfig(max_split_size=512 * MIB))
    allocator.free(allocator.malloc(1 * GIB))
    allocator.malloc(100 * MIB)
    assert allocator.reserved == 1 * GIB + 100 * MIB


def test_empty_cache_gives_back_every_segment_without_a_block_in_use():
    allocator = CachingAllocator()
    kept = allocator.malloc(2 * GIB)
    allocator.free(allocator.malloc(1 * GIB))
    allocator.empty_cache()
    assert allocator.reserved == 2 * GIB
    allocator.free(kept)
    allocator.empty_cache()
    assert allocator.reserved == 0


@settings(max_examples=60, deadline=None)
@given(st.booleans(), st.lists(st.tuples(st.booleans(), st.integers(1, 3 * GIB), st.integers(0, 2)), max_size=40))
def test_reserved_holds_what_is_needed_which_holds_what_is_allocated(expandable, operations):
    allocator = CachingAllocator(AllocatorConfig(expandable_segments=expandable))
    live = []
    for allocate, size, stream in operations:
        if allocate or not live:
            live.append(allocator.malloc(size, stream))
        else:
            allocator.free(live.pop(size % len(live)))
        assert allocator.reserved >= allocator.needed >= allocator.allocated >= 0
        assert allocator.peak_reserved >= allocator.reserved and allocator.peak_allocated >= allocator.allocated
    for block in live:
        allocator.free(block)
    allocator.empty_cache()
    assert allocator.allocated == 0 and allocator.needed == 0
    assert allocator.reserved == 0 or expandable  # an expandable segment keeps at most its pages' rounding
    assert allocator.reserved < K_LARGE_BUFFER * 6


def test_the_alloc_conf_is_read_as_torch_reads_it():
    assert parse_alloc_conf(None) == AllocatorConfig()
    assert parse_alloc_conf("expandable_segments:True") == AllocatorConfig(expandable_segments=True)
    conf = parse_alloc_conf("max_split_size_mb:512, garbage_collection_threshold:0.6")
    assert conf == AllocatorConfig(max_split_size=512 * MIB)
    for bad in ("expandable_segments:yes", "max_split_size_mb:10", "expandable_segments"):
        with pytest.raises(PlanError):
            parse_alloc_conf(bad, "trainer.pytorch_cuda_alloc_conf")

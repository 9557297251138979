"""PyTorch's CUDA caching allocator, as a small simulator of its documented policy: the one owner of how the
bytes a phase allocates land in the segments the allocator reserves from the GPU.

Read from pytorch/pytorch `c10/cuda/CUDACachingAllocator.cpp` (v2.6.0 to main; the constants and the
policy below are unchanged over those releases):

* every request is rounded up to a multiple of 512 bytes (kMinBlockSize);
* requests of at most 1 MiB (kSmallSize) come from the small pool, packed into 2 MiB segments
  (kSmallBuffer); larger ones from the large pool: below 10 MiB (kMinLargeAlloc) a 20 MiB segment
  (kLargeBuffer) is reserved and split, from 10 MiB on a segment of the request rounded up to 2 MiB
  (kRoundLarge);
* a request takes the smallest free block of its pool and stream that holds it (best fit; a block freed
  on one stream serves that stream only) and splits it when the rest is worth keeping: any rest of 512 B
  or more in the small pool or under expandable segments, more than 1 MiB in the large pool, and never a
  block of max_split_size or more ("oversize": it serves only requests of max_split_size or more that
  leave less than 20 MiB of it unused, and a smaller request never takes it);
* a freed block merges with its free neighbours of the same segment; blocks of two segments never merge;
* a request no free block holds reserves a new segment (cudaMalloc); when that fails for lack of memory
  the allocator frees every cached segment with no block in use and tries again; only then is it out of memory;
* `torch.cuda.empty_cache()` frees every segment with no block in use;
* expandable_segments:True (PYTORCH_CUDA_ALLOC_CONF) keeps one segment per pool and stream whose mapped
  size grows in 2 MiB (small pool) or 20 MiB (large pool) pages: a request no free block holds extends
  the segment's end, so differently sized requests tile one segment instead of stranding slivers of many;
  empty_cache unmaps the free pages.

`max_memory_allocated()` is the peak of the bytes of the blocks in use (rounded requests), and
`max_memory_reserved()` the peak of the segments' bytes: that difference is the cache.  What the GPU must
hold at a moment is less than the reserved figure: a segment with no block in use is given back before the
allocator reports an out-of-memory error, so only the segments (or mapped pages) holding a block in use
count; `needed` is that figure.

Pure Python on plain integers: the planner never imports torch (the traces it replays are built in
memory.allocator_trace).
"""

from __future__ import annotations

import bisect
import itertools
from typing import Literal

import attrs
from attrs import frozen

from rlplan.planner.errors import PlanError

K_MIN_BLOCK = 512
K_SMALL_SIZE = 1 << 20
K_SMALL_BUFFER = 2 << 20
K_MIN_LARGE_ALLOC = 10 << 20
K_LARGE_BUFFER = 20 << 20
K_ROUND_LARGE = 2 << 20
# Expandable segments map physical memory in pages of these sizes (the allocator's choice per pool).
SMALL_PAGE = 2 << 20
LARGE_PAGE = 20 << 20

Pool = Literal["small", "large"]


@frozen(kw_only=True)
class AllocatorConfig:
    """The settings of PYTORCH_CUDA_ALLOC_CONF the planner prices (the others do not change what is reserved)."""

    expandable_segments: bool = False
    # Blocks of this size or more are never split (None: no limit, torch's default).
    max_split_size: int | None = None

    def describe(self) -> str:
        parts = [f"expandable_segments:{self.expandable_segments}"]
        if self.max_split_size is not None:
            parts.append(f"max_split_size_mb:{self.max_split_size >> 20}")
        return ",".join(parts)


DEFAULT_ALLOCATOR_CONFIG = AllocatorConfig()


def parse_alloc_conf(text: str | None, where: str = "PYTORCH_CUDA_ALLOC_CONF") -> AllocatorConfig:
    """`expandable_segments:True,max_split_size_mb:512` (torch's syntax: comma-separated key:value; the keys
    the planner does not price, such as garbage_collection_threshold, are accepted and ignored)."""
    if not text or not text.strip():
        return DEFAULT_ALLOCATOR_CONFIG
    expandable, max_split = False, None
    for item in text.split(","):
        key, sep, value = item.strip().partition(":")
        key, value = key.strip(), value.strip()
        if not key:
            continue
        if not sep:
            raise PlanError(field=where, message=f"{item.strip()!r} is not key:value.",
                            fix="write it as torch reads it, e.g. expandable_segments:True,max_split_size_mb:512")
        if key == "expandable_segments":
            if value not in ("True", "False"):
                raise PlanError(field=where, message=f"expandable_segments takes True or False, not {value!r}.",
                                fix="set expandable_segments:True or expandable_segments:False")
            expandable = value == "True"
        elif key == "max_split_size_mb":
            if not value.isdigit() or int(value) <= K_LARGE_BUFFER >> 20:
                raise PlanError(field=where, message=f"max_split_size_mb {value!r} is not a size above 20 MiB.",
                                fix="give max_split_size_mb a whole number of MiB above 20, or leave it out")
            max_split = int(value) << 20
    return AllocatorConfig(expandable_segments=expandable, max_split_size=max_split)


def round_size(size: int) -> int:
    return K_MIN_BLOCK if size < K_MIN_BLOCK else K_MIN_BLOCK * ((size + K_MIN_BLOCK - 1) // K_MIN_BLOCK)


def allocation_size(size: int) -> int:
    """The segment a request no free block holds reserves (get_allocation_size)."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * ((size + K_ROUND_LARGE - 1) // K_ROUND_LARGE)


class _Segment:
    __slots__ = ("size", "in_use", "expandable", "pool", "stream")

    def __init__(self, size: int, pool: Pool, stream: int, expandable: bool) -> None:
        self.size = size  # bytes reserved (mapped, for an expandable segment)
        self.in_use = 0  # blocks of it in use
        self.expandable = expandable
        self.pool = pool
        self.stream = stream


class _Block:
    __slots__ = ("addr", "size", "segment", "allocated", "prev", "next")

    def __init__(self, addr: int, size: int, segment: _Segment) -> None:
        self.addr = addr
        self.size = size
        self.segment = segment
        self.allocated = False
        self.prev: _Block | None = None
        self.next: _Block | None = None

    def key(self) -> tuple[int, int]:
        return self.size, self.addr


class CachingAllocator:
    """One device's caching allocator replaying allocations and frees (sizes in bytes, a stream number each).

    `capacity` is the physical memory the process's allocator may reserve (None: unbounded); `malloc` returns a
    handle for `free`.  Peaks are kept since the last `reset_peaks`, as torch keeps them.
    """

    def __init__(self, config: AllocatorConfig = DEFAULT_ALLOCATOR_CONFIG, capacity: int | None = None) -> None:
        self.config = config
        self.capacity = capacity
        self._free: dict[tuple[Pool, int], list[tuple[int, int, _Block]]] = {}
        self._expandable: dict[tuple[Pool, int], _Block] = {}  # the last block of each expandable segment
        self._segments: list[_Segment] = []
        self._addresses = itertools.count(1 << 40, 1 << 36)
        self.allocated = 0
        self.reserved = 0
        self.active_segment_bytes = 0  # bytes of segments with a block in use (non-expandable)
        self.expandable_needed = 0  # mapped pages holding a block in use, over expandable segments
        self.peak_allocated = 0
        self.peak_reserved = 0
        self.peak_needed = 0
        self.overflowed = False  # a segment was reserved past the capacity (a real allocator would have failed)

    # --- figures ---

    @property
    def needed(self) -> int:
        """What the GPU must hold now: segments (or, expandable, the pages) holding a block in use (blocks that
        share a page count it once at most: never more than the expandable segments map)."""
        expandable = sum(s.size for s in self._segments if s.expandable)
        return self.active_segment_bytes + min(self.expandable_needed, expandable)

    def reset_peaks(self) -> None:
        self.peak_allocated, self.peak_reserved, self.peak_needed = self.allocated, self.reserved, self.needed

    def _note_peaks(self) -> None:
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self.peak_needed = max(self.peak_needed, self.needed)

    # --- free lists ---

    def _insert(self, block: _Block) -> None:
        key = (block.segment.pool, block.segment.stream)
        bisect.insort(self._free.setdefault(key, []), (block.size, block.addr, block))

    def _remove(self, block: _Block) -> None:
        free = self._free[(block.segment.pool, block.segment.stream)]
        index = bisect.bisect_left(free, (block.size, block.addr))
        del free[index]

    def _best_fit(self, pool: Pool, stream: int, size: int) -> _Block | None:
        free = self._free.get((pool, stream))
        if not free:
            return None
        index = bisect.bisect_left(free, (size, -1))
        if index == len(free):
            return None
        block = free[index][2]
        limit = self.config.max_split_size
        if limit is not None and not block.segment.expandable:
            if size < limit <= block.size:
                return None
            if size >= limit and block.size >= size + K_LARGE_BUFFER:
                return None
        return block

    # --- segments ---

    def _reserve(self, nbytes: int) -> None:
        """Reserve a segment's bytes; past the capacity, first give back the cache as torch does.  What still does
        not fit is reserved all the same and remembered (`overflowed`): the replay prices plans that do not fit
        too, and says by how much they do not."""
        if self.capacity is not None and self.reserved + nbytes > self.capacity:
            self._release_cached(nbytes)
            if self.reserved + nbytes > self.capacity:
                self.overflowed = True
        self.reserved += nbytes

    def _new_segment(self, pool: Pool, stream: int, size: int) -> _Block:
        alloc = allocation_size(size)
        self._reserve(alloc)
        segment = _Segment(alloc, pool, stream, expandable=False)
        self._segments.append(segment)
        return _Block(next(self._addresses), alloc, segment)

    def _grow_expandable(self, pool: Pool, stream: int, size: int) -> _Block:
        """The block at the end of the pool's expandable segment, mapped to hold `size`."""
        page = SMALL_PAGE if pool == "small" else LARGE_PAGE
        tail = self._expandable.get((pool, stream))
        if tail is None:
            segment = _Segment(0, pool, stream, expandable=True)
            self._segments.append(segment)
            tail = _Block(next(self._addresses), 0, segment)
            self._expandable[(pool, stream)] = tail
        elif tail.allocated:
            grown = _Block(tail.addr + tail.size, 0, tail.segment)
            grown.prev, tail.next = tail, grown
            self._expandable[(pool, stream)] = tail = grown
        elif tail.size:
            self._remove(tail)
        missing = size - tail.size
        pages = -(-missing // page)
        tail.allocated = True  # taken: a cache flush the reservation may trigger must not unmap it
        self._reserve(pages * page)
        tail.allocated = False
        tail.size += pages * page
        tail.segment.size += pages * page
        return tail

    def _release_cached(self, wanted: int) -> None:
        """Give back every segment with no block in use (release_cached_blocks; with max_split_size unset torch
        skips the one-segment attempt before it) and the free pages of expandable segments."""
        self.empty_cache()

    def _drop(self, block: _Block) -> None:
        self._remove(block)
        self.reserved -= block.size
        self._segments.remove(block.segment)

    def _unmap_expandable(self) -> None:
        """Unmap the free pages at the end of every expandable segment (torch unmaps free pages anywhere; the
        ones inside stay mapped here, a small overstatement of what is kept)."""
        for key, tail in list(self._expandable.items()):
            if tail.allocated or not tail.size:
                continue
            page = SMALL_PAGE if key[0] == "small" else LARGE_PAGE
            start = -(-tail.addr // page) * page if tail.prev is not None else tail.addr
            keep = start - tail.addr
            drop = tail.size - keep
            if drop <= 0:
                continue
            self._remove(tail)
            self.reserved -= drop
            tail.segment.size -= drop
            tail.size = keep
            if keep:
                self._insert(tail)
            elif tail.prev is not None:  # the block before it (in use: free neighbours merge) ends the segment
                tail.prev.next = None
                self._expandable[key] = tail.prev
            else:
                del self._expandable[key]
                self._segments.remove(tail.segment)

    def empty_cache(self) -> None:
        for free in list(self._free.values()):
            for _, _, block in list(free):
                if block.prev is None and block.next is None and not block.segment.expandable:
                    self._drop(block)
        self._unmap_expandable()

    # --- malloc / free ---

    def malloc(self, nbytes: int, stream: int = 0) -> _Block:
        size = round_size(max(1, nbytes))
        pool: Pool = "small" if size <= K_SMALL_SIZE else "large"
        expandable = self.config.expandable_segments
        block = self._best_fit(pool, stream, size)
        if block is not None:
            self._remove(block)
        elif expandable:
            block = self._grow_expandable(pool, stream, size)
        else:
            block = self._new_segment(pool, stream, size)
        rest = block.size - size
        if self._should_split(block, size, rest):
            remainder = _Block(block.addr + size, rest, block.segment)
            remainder.prev, remainder.next = block, block.next
            if block.next is not None:
                block.next.prev = remainder
            elif block.segment.expandable:
                self._expandable[(pool, stream)] = remainder
            block.next = remainder
            block.size = size
            self._insert(remainder)
        block.allocated = True
        self._account(block, +1)
        return block

    def _should_split(self, block: _Block, size: int, rest: int) -> bool:
        if block.segment.pool == "small" or block.segment.expandable:
            return rest >= K_MIN_BLOCK
        limit = self.config.max_split_size
        return (limit is None or size < limit) and rest > K_SMALL_SIZE

    def free(self, block: _Block) -> None:
        block.allocated = False
        self._account(block, -1)
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated:
                self._merge(block, neighbour)
        self._insert(block)

    def _merge(self, block: _Block, neighbour: _Block) -> None:
        self._remove(neighbour)
        if neighbour is block.prev:
            block.addr = neighbour.addr
            block.prev = neighbour.prev
            if block.prev is not None:
                block.prev.next = block
        else:
            block.next = neighbour.next
            if block.next is not None:
                block.next.prev = block
            elif block.segment.expandable:
                self._expandable[(block.segment.pool, block.segment.stream)] = block
        block.size += neighbour.size

    def _account(self, block: _Block, sign: int) -> None:
        segment = block.segment
        self.allocated += sign * block.size
        if segment.expandable:
            page = SMALL_PAGE if segment.pool == "small" else LARGE_PAGE
            self.expandable_needed += sign * page * -(-block.size // page)
        else:
            if sign > 0 and segment.in_use == 0:
                self.active_segment_bytes += segment.size
            segment.in_use += sign
            if sign < 0 and segment.in_use == 0:
                self.active_segment_bytes -= segment.size
        if sign > 0:
            self._note_peaks()


@frozen(kw_only=True)
class AllocatorFigures:
    """One phase as the allocator sees it (bytes, peaks over the phase): what is allocated, what is reserved
    (torch's counters), and what the GPU must hold for it (`needed`: the segments holding a block in use)."""

    allocated: int = attrs.field(validator=attrs.validators.ge(0))
    reserved: int = attrs.field(validator=attrs.validators.ge(0))
    needed: int = attrs.field(validator=attrs.validators.ge(0))

    @property
    def cache(self) -> int:
        return max(0, self.reserved - self.allocated)

    @property
    def stranded(self) -> int:
        """Free bytes the allocator cannot give back at its peak: they sit in segments with a block in use."""
        return max(0, self.needed - self.allocated)


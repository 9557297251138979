"""What this machine runs: CPU threads per trainer rank."""

from __future__ import annotations

import os

import pytest

from rlplan.runtime.platform import available_cores, cpu_threads_per_rank


@pytest.mark.parametrize(("world_size", "cores", "threads"), [(1, 2, 2), (2, 2, 1), (4, 2, 1), (2, 16, 8), (3, 16, 5)])
def test_cpu_ranks_split_the_cores_and_never_get_zero_threads(world_size, cores, threads):
    assert cpu_threads_per_rank(world_size, cores) == threads


def test_available_cores_is_this_process_affinity():
    assert 1 <= available_cores() <= (os.cpu_count() or 1)

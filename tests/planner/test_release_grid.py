"""Plans for the verl the user runs (issue 45): for every release the stack table names, what solve produces for
it renders for it, and every rendered key is in that release's own trainer config (presets/verl_inventory.json).

A slice of tests/verl_compat/release_grid.py's 36 requests, the ones that reach the knobs the releases differ in
(LoRA and offload policy on 2 x 24 GB, the critic's offload and the chunked entropy on a long PPO request, the
offload policy of a long GRPO request on 16 x 141 GB); the whole grid, composed with each release's own Hydra
config, is `python tests/verl_compat/release_grid.py --verl-git ... --verl-wheels ...`.
"""

from __future__ import annotations

import pytest

from rlplan.planner.stack import VERL_ENGINE_PINS
from tests.verl_compat.release_grid import GRID, Request, check

SLICE = (
    Request("qwen2.5-0.5b", "h100-80g", 8, "grpo", 8, 512, 1024),
    Request("qwen2.5-7b", "rtx4090-24g", 2, "grpo", 8, 512, 1024),
    Request("qwen2.5-7b", "h100-80g", 8, "ppo", None, 2048, 8192),
    Request("qwen2.5-0.5b", "h200-141g", 16, "grpo", 8, 2048, 8192),
)


def test_the_slice_is_part_of_the_grid():
    assert set(SLICE) <= set(GRID) and len(GRID) == 36


# A solve per request and release (1-2 minutes a release on 2 cores): in `nox -s slow`, which CI runs too.
@pytest.mark.slow
@pytest.mark.parametrize("release", list(VERL_ENGINE_PINS))
def test_what_solve_produces_for_a_release_renders_for_it_in_its_own_keys(release):
    outcomes = [check(request, release, composer=None) for request in SLICE]
    # The small request fits on every release; the others may not fit where the release lacks what they need (or
    # where its engine's KV formula leaves too little).
    assert outcomes[0].solved, release
    for outcome in outcomes:
        if outcome.solved:
            assert outcome.rendered, outcome.why
            assert not outcome.missing_keys, outcome.missing_keys

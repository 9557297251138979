"""A verl step replayed through the caching allocator (planner/memory/allocator_trace.py): the micro batches it
walks, verl's flushes and segments per version, and the bytes a fit keeps for what the allocator strands."""

from __future__ import annotations

import pytest

from rlplan.planner.knobs import apply_knobs
from rlplan.planner.layout import plan_layout
from rlplan.planner.memory import GIB, predict_memory
from rlplan.planner.memory.allocator_trace import (
    allocator_config,
    micro_batch_tokens,
    replay_phase,
    replay_step,
    stranded_bytes,
)
from rlplan.planner.memory.phases import step_context
from rlplan.planner.phases import Phase
from rlplan.planner.profile import DEFAULT_PROFILE
from rlplan.planner.stack import StackSection
from tests.planner.plans import make_plan


def _dynamic(**knobs):
    return apply_knobs(make_plan(), {"actor.use_dynamic_bsz": True, "actor.ppo_max_token_len_per_gpu": 12000,
                                     "data.expected_response_length": 600, **knobs})


def _on(plan, verl: str):
    return plan.evolve(stack=StackSection(verl=verl))


def test_the_largest_micro_batch_is_the_one_the_phase_is_priced_at():
    plan = _dynamic()
    role = plan_layout(plan).actor_update
    chunks = micro_batch_tokens(plan, DEFAULT_PROFILE, role)
    assert max(max(chunk) for chunk in chunks) == role.tokens_per_micro_batch
    assert micro_batch_tokens(plan, DEFAULT_PROFILE, role) == chunks  # the sample is fixed, not random per call
    assert len({t for chunk in chunks for t in chunk}) > 1  # lengths vary: that is what fragments


def test_the_trainer_phases_of_verl_06_and_later_allocate_from_expandable_segments():
    plan = _dynamic()
    assert allocator_config(_on(plan, "0.6.0"), trainer_phase=True).expandable_segments
    assert not allocator_config(_on(plan, "0.6.0"), trainer_phase=False).expandable_segments
    old = _on(plan, "0.5.0")
    assert not allocator_config(old, trainer_phase=True).expandable_segments
    env = old.evolve(trainer=old.trainer.__class__(**{**_fields(old.trainer),
                                                      "pytorch_cuda_alloc_conf": "expandable_segments:True"}))
    assert allocator_config(env, trainer_phase=True).expandable_segments


def _fields(section):
    import attrs

    return attrs.asdict(section, recurse=False)


def test_fixed_segments_cache_more_than_expandable_ones_over_a_step():
    plan = _dynamic()

    def cache(verl: str) -> float:
        ctx, report = step_context(_on(plan, verl), DEFAULT_PROFILE)
        figures = replay_step(ctx, report.phases)
        return figures[Phase.ACTOR_UPDATE].cache / GIB

    assert cache("0.5.0") > cache("0.6.0") >= 0


def test_every_replayed_phase_reserves_what_it_needs_and_needs_what_it_allocates():
    ctx, report = step_context(_on(_dynamic(), "0.5.0"), DEFAULT_PROFILE)
    for figures in replay_step(ctx, report.phases).values():
        assert figures.reserved >= figures.needed >= figures.allocated >= 0


def test_the_replayed_update_allocates_what_the_memory_model_prices():
    """One owner of the bytes: the replay walks the backend's own moments, so its allocated peak is the update's
    trainer bytes as memory.phases prices them (rounding and the replay's sample aside).  With several micro batches
    per mini batch, so that the gradients accumulate as the model prices them."""
    plan = _dynamic(**{"actor.ppo_max_token_len_per_gpu": 4096})
    ctx, report = step_context(plan, DEFAULT_PROFILE)
    update = report.phase(Phase.ACTOR_UPDATE)
    trainer = sum(c.bytes for c in update.components if c.scope != "overhead" and not c.name.startswith("vllm_")
                  and c.name not in ("kv_cache", "cuda_graph_pool"))
    replayed = replay_phase(ctx, update).allocated
    assert replayed == pytest.approx(trainer, rel=0.05)


def test_the_fit_keeps_stranded_bytes_only_where_the_allocator_strands_them():
    for verl in ("0.5.0", "0.9.1"):
        ctx, report = step_context(_on(_dynamic(), verl), DEFAULT_PROFILE)
        for phase in report.phases:
            stranded = stranded_bytes(ctx, phase)
            assert stranded == phase.bytes_of("fragmentation_reserve")
            if phase.name in (Phase.WEIGHT_SYNC, Phase.ROLLOUT):
                assert stranded == 0
    # On expandable segments only page rounding is stranded: well under the 8 % of trainer bytes once reserved.
    update = predict_memory(_on(_dynamic(), "0.9.1")).phase(Phase.ACTOR_UPDATE)
    assert 0 < update.bytes_of("fragmentation_reserve") < 0.01 * update.peak_bytes

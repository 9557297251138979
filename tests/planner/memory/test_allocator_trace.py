"""A verl step replayed through the caching allocator (planner/memory/allocator_trace.py): the micro batches it
walks, verl's flushes and segments per version, and the bytes a fit keeps for what the allocator strands."""

from __future__ import annotations

import pytest

from rlplan.planner.knobs import apply_knobs
from rlplan.planner.layout import plan_layout
from rlplan.planner.memory import GIB, predict_memory
from rlplan.planner.memory.allocator_trace import (
    STRANDED_SHARE_OF_LARGEST_BLOCK,
    allocator_config,
    largest_transient_block,
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
    # On expandable segments only page rounding is stranded: well under the 8 % of trainer bytes once reserved;
    # on fixed segments a share of the largest transient block.
    update = predict_memory(_on(_dynamic(), "0.9.1")).phase(Phase.ACTOR_UPDATE)
    assert 0 < update.bytes_of("fragmentation_reserve") < 0.01 * update.peak_bytes


def _reference_plans():
    """The public runs as compare imports them, and the example gallery on verl 0.5 (fixed segments)."""
    from pathlib import Path

    from rlplan.planner.commands.commands_io import load_plan
    from tests.repo_scripts import load_script

    bench = load_script("benchmarks/public_verl_runs.py")
    plans = [bench.imported_plan(run) for run in bench.RUNS]
    root = Path(__file__).resolve().parents[3] / "examples"
    gallery = [load_plan(str(path)) for path in sorted(root.glob("*/plan.toml"))]
    return plans + [_on(plan, "0.5.0") for plan in gallery if not plan.is_megatron]


# Where the replay strands more than the fit's bound, and why the bound stays (allocator_trace.py, above
# STRANDED_SHARE_OF_LARGEST_BLOCK): the replay's first-step placement of Adam's state, which the published runs
# that ran contradict when the bound is raised to cover it.
REPLAY_ABOVE_THE_BOUND = {("qwen2.5-32b", Phase.ACTOR_UPDATE)}


def test_the_fits_bound_holds_every_stranded_byte_the_phase_replay_finds_but_the_listed_ones():
    """STRANDED_SHARE_OF_LARGEST_BLOCK is the replay's largest share on these plans, rounded up: the fit's reserve
    (monotone in the sizes, no replay) never keeps less than the replay strands, except on the listed phases,
    which must still exceed it (a listed one that no longer does is taken off the list)."""
    above = set()
    for plan in _reference_plans():
        ctx, report = step_context(plan, DEFAULT_PROFILE)
        for phase in report.phases:
            if phase.name in (Phase.WEIGHT_SYNC, Phase.ROLLOUT):
                continue
            bound = STRANDED_SHARE_OF_LARGEST_BLOCK * largest_transient_block(ctx, phase)
            if replay_phase(ctx, phase).stranded > bound + 1:
                above.add((plan.model.name, phase.name))
    assert above == REPLAY_ABOVE_THE_BOUND


@pytest.mark.parametrize("verl", ["0.5.0", "0.9.1"])
@pytest.mark.parametrize("dynamic", [True, False])
def test_every_phase_grows_with_the_response_length_reserve_included(verl, dynamic):
    """The solver and longest_expected_response_that_fits bisect over lengths: the fit's figure must not fall as
    responses grow, its allocator reserve included (a replay's stranded bytes jump with block placements)."""
    base = _on(apply_knobs(make_plan(), {"actor.use_dynamic_bsz": dynamic, "actor.ppo_max_token_len_per_gpu": 12000}),
               verl)
    previous = None
    for response in range(40, 1025, 123):
        peaks = [p.peak_bytes for p in predict_memory(apply_knobs(base, {"data.expected_response_length": response})
                                                       ).phases]
        assert previous is None or all(now >= before for now, before in zip(peaks, previous, strict=True)), response
        previous = peaks


@pytest.mark.parametrize("offload", [False, True])
def test_each_optimizer_state_is_created_at_its_first_step(offload):
    """torch's Adam builds exp_avg and exp_avg_sq at a parameter's first step() (torch/optim/adam.py _init_group):
    the replay allocates the state after the first update's first backward, never before it (resident or offloaded
    alike), and a loaded-and-offloaded state is moved only once it exists."""
    from rlplan.planner.memory.allocator_trace import _start, _step

    plan = _on(_dynamic(**{"actor.optimizer_offload": offload}), "0.5.0")
    ctx, report = step_context(plan, DEFAULT_PROFILE)
    replay = _start(ctx, report.phases)
    assert not replay.holds("actor_optimizer_state")
    for _ in range(2):
        for _, run in _step(replay, ctx):
            run()
    ops = [op for op in replay.ops if op[0] in ("alloc", "free")]
    first_state = next(i for i, op in enumerate(ops) if op[:2] == ("alloc", "actor_optimizer_state"))
    first_backward = next(i for i, op in enumerate(ops) if op[0] == "alloc" and op[1].startswith("backward:"))
    assert first_backward < first_state
    states = [op for op in ops if op[1] == "actor_optimizer_state"]
    # Resident: created once and held; offloaded: created at the first step, then loaded and offloaded each update.
    assert states == ([("alloc", "actor_optimizer_state", *states[0][2:])] if not offload else
                      [states[0], ("free", "actor_optimizer_state"), states[0], ("free", "actor_optimizer_state")])


def test_the_megatron_fit_holds_every_stranded_byte_its_phase_replay_finds_on_verls_published_runs():
    """MANY_TENSORS_STRANDED_SHARE and STRANDED_SHARE_OF_LARGEST_BLOCK bound what the phase replay strands on the
    Megatron runs benchmarks/megatron_memory.py prices (verl 0.4-0.5: fixed segments)."""
    from tests.repo_scripts import load_script

    bench = load_script("benchmarks/megatron_memory.py")
    checked = 0
    for run in bench.published_runs():
        ctx, report = step_context(run.plan, DEFAULT_PROFILE)
        for phase in report.phases:
            if phase.name in (Phase.WEIGHT_SYNC, Phase.ROLLOUT):
                continue
            assert replay_phase(ctx, phase).stranded <= stranded_bytes(ctx, phase) + 1, (run.label, phase.name)
            checked += 1
    assert checked > 29


def test_megatrons_main_weights_exist_from_the_optimizers_build_and_adams_moments_from_its_first_step():
    """Megatron's distributed optimizer builds its fp32 main weights with itself; torch's Adam makes the moments at
    the first step(): the replay holds the first from the start and makes the second after the first backward."""
    from rlplan.planner.memory.allocator_trace import _start, _step
    from rlplan.planner.memory.megatron import MAIN_WEIGHT_SHARE_OF_ADAM
    from rlplan.planner.presets import resolve_model

    plan = apply_knobs(make_plan(resolve_model("qwen2.5-7b").arch, overrides={"actor.strategy": "megatron"}),
                       {"actor.megatron.tensor_model_parallel_size": 2})
    ctx, report = step_context(_on(plan, "0.5.0"), DEFAULT_PROFILE)
    replay = _start(ctx, report.phases)
    built = [op for op in replay.ops if op[0] == "alloc" and op[1] == "actor_optimizer_state"]
    assert built and not any(op[1] == "actor_optimizer_state:moments" for op in replay.ops)
    state = report.phase(Phase.ACTOR_UPDATE).bytes_of("actor_optimizer_state")
    assert sum(op[2] * op[4] for op in built) == pytest.approx(MAIN_WEIGHT_SHARE_OF_ADAM * state, rel=0.01)
    for _, run in _step(replay, ctx):
        run()
    keys = [op[1] for op in replay.ops if op[0] == "alloc"]
    assert keys.index("actor_optimizer_state:moments") > keys.index("backward:activations")


def _sync_reserved(plan) -> int:
    ctx, report = step_context(plan, DEFAULT_PROFILE)
    return replay_step(ctx, report.phases)[Phase.WEIGHT_SYNC].reserved


def test_the_fsdp_weight_sync_starts_from_what_the_update_cached_only_where_verl_does_not_flush_before_it():
    """verl 0.8.x's engine worker syncs without a flush first (stack.EMPTIES_CACHE_BEFORE_SYNC); 0.7 and 0.9 flush.
    (Megatron's flush before the sync, MEGATRON_EMPTIES_CACHE_BEFORE_SYNC, moves no figure: its update pass already
    empties the cache, AllocationShape.empties_cache_after_pass.)"""
    fsdp = _dynamic()
    unflushed = _sync_reserved(_on(fsdp, "0.8.0"))
    assert unflushed > _sync_reserved(_on(fsdp, "0.9.0")) and unflushed > _sync_reserved(_on(fsdp, "0.7.0"))

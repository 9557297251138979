"""planner/layout.py: each engine's share of the generated batch, derived once for the solver and step time."""

from __future__ import annotations

from rlplan.planner.layout import plan_layout
from tests.planner.plans import make_plan


def test_each_rollout_engine_generates_its_share_of_the_generation_batch():
    """8 GPUs at TP 2 are 4 engines; 64 prompts x 4 responses are 64 sequences each, and a recipe generating
    192 prompts (data.gen_batch_size) gives each engine 3x that, which the solver's max_num_seqs and the
    step-time model's decode both read."""
    layout = plan_layout(make_plan(overrides={"rollout.tensor_model_parallel_size": 2}))
    assert layout.parallel.rollout_replicas == 4
    assert (layout.prompts_per_rollout_engine, layout.sequences_per_rollout_engine) == (16, 64)
    generate_3x = plan_layout(make_plan(overrides={"rollout.tensor_model_parallel_size": 2,
                                                   "data.gen_batch_size": 192}))
    assert (generate_3x.prompts_per_rollout_engine, generate_3x.sequences_per_rollout_engine) == (48, 192)


def test_a_share_that_does_not_divide_evenly_is_exact_for_the_solver_to_round_up():
    layout = plan_layout(make_plan(gpus=3, overrides={"data.train_batch_size": 10}))
    assert layout.parallel.rollout_replicas == 3
    assert layout.sequences_per_rollout_engine == 10 * 4 / 3

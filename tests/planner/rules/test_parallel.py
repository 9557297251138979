"""The parallel-layout rules (planner/rules/parallel.py): FSDP's mesh and Ulysses, the rollout engine's TP, and
each Megatron rule, which fires on the plan it is about while its suggested fix (or the fix its message names)
removes it."""

from __future__ import annotations

import attrs
import pytest

from rlplan.planner.knobs import apply_knobs
from rlplan.planner.memory import predict_memory
from rlplan.planner.rules import check_plan
from tests.planner.plans import make_plan
from tests.planner.rules.megatron_plans import DEEPSEEK_V3, QWEN3_MOE, fixed, megatron_plan, rules_of


def test_a_default_megatron_plan_breaks_no_megatron_rule():
    plan = megatron_plan(actor__megatron__sequence_parallel=False)
    assert not {name for name in rules_of(plan) if "megatron" in name or "fsdp_knobs" in name}


@pytest.mark.parametrize(("knobs", "fix"), [
    ({"actor__megatron__tensor_model_parallel_size": 4, "actor__megatron__context_parallel_size": 3},
     {"actor.megatron.context_parallel_size": 1}),
    ({"actor__megatron__pipeline_model_parallel_size": 3}, {"actor.megatron.pipeline_model_parallel_size": 2}),
])
def test_world_must_split_into_tp_pp_cp_groups(knobs, fix):
    plan = megatron_plan(**knobs)
    assert "megatron_world_divides" in rules_of(plan)
    assert "megatron_world_divides" not in rules_of(apply_knobs(plan, fix))


def test_experts_split_over_ep_and_a_dense_model_has_none_to_split():
    dense = megatron_plan(actor__megatron__expert_model_parallel_size=2)
    assert "megatron_experts_divide" in rules_of(dense)
    assert "megatron_experts_divide" not in rules_of(fixed(dense, "megatron_experts_divide"))
    moe = megatron_plan(QWEN3_MOE, actor__megatron__expert_model_parallel_size=3)  # 128 experts % 3
    assert "megatron_experts_divide" in rules_of(moe)
    assert "megatron_experts_divide" not in rules_of(
        apply_knobs(moe, {"actor.megatron.expert_model_parallel_size": 8}))
    # EP 8 x ETP 2 = 16 expert ranks on 8 GPUs
    wide = megatron_plan(QWEN3_MOE, actor__megatron__expert_model_parallel_size=8,
                         actor__megatron__expert_tensor_parallel_size=2)
    assert "megatron_experts_divide" in rules_of(wide)
    assert "megatron_experts_divide" not in rules_of(
        apply_knobs(wide, {"actor.megatron.expert_tensor_parallel_size": 1}))


def test_tp_must_divide_heads_and_kv_heads_but_not_mla_kv():
    plan = megatron_plan(QWEN3_MOE, actor__megatron__tensor_model_parallel_size=8)  # 4 KV heads
    assert "megatron_heads_divide_tp" in rules_of(plan)
    assert "megatron_heads_divide_tp" not in rules_of(
        apply_knobs(plan, {"actor.megatron.tensor_model_parallel_size": 4}))
    mla = megatron_plan(DEEPSEEK_V3, actor__megatron__tensor_model_parallel_size=8)
    assert "megatron_heads_divide_tp" not in rules_of(mla)


def test_layers_split_evenly_over_pp_times_vpp_unless_stages_are_placed_unevenly():
    plan = megatron_plan(QWEN3_MOE, actor__megatron__pipeline_model_parallel_size=2,
                         actor__megatron__virtual_pipeline_model_parallel_size=5)  # 48 % 10
    assert "megatron_layers_divide_pipeline" in rules_of(plan)
    assert "megatron_layers_divide_pipeline" not in rules_of(fixed(plan, "megatron_layers_divide_pipeline"))
    # A layout string of Megatron's own (kept as passthrough) is Megatron's to check.
    laid_out = plan.evolve(passthrough={
        "+actor_rollout_ref.actor.megatron.override_transformer_config.pipeline_model_parallel_layout": "'Et|tL'"})
    assert "megatron_layers_divide_pipeline" not in rules_of(laid_out)


def test_placed_end_stages_leave_middle_layers_that_split_evenly_over_the_middle_stages():
    """48 layers on PP 5: 12 + 3 x 8 + 12 builds; 10 + 28 over 3 middle stages + 10 does not (Megatron-Core's
    TransformerConfig.__post_init__), nor end stages a VPP of 2 cannot chunk; the reference follows the actor."""
    plan = megatron_plan(QWEN3_MOE, actor__megatron__pipeline_model_parallel_size=5)  # 48 % 5
    assert "megatron_layers_divide_pipeline" in rules_of(plan)
    even_middle = apply_knobs(plan, {"actor.megatron.num_layers_in_first_pipeline_stage": 12,
                                     "actor.megatron.num_layers_in_last_pipeline_stage": 12})
    assert "megatron_layers_divide_pipeline" not in rules_of(even_middle)
    assert even_middle.engine("ref").num_layers_in_first_pipeline_stage == 12
    uneven_middle = apply_knobs(plan, {"actor.megatron.num_layers_in_first_pipeline_stage": 10,
                                       "actor.megatron.num_layers_in_last_pipeline_stage": 10})
    assert "megatron_layers_divide_pipeline" in rules_of(uneven_middle)
    assert "megatron_layers_divide_pipeline" not in rules_of(fixed(uneven_middle, "megatron_layers_divide_pipeline"))
    too_many = apply_knobs(plan, {"actor.megatron.num_layers_in_first_pipeline_stage": 40,
                                  "actor.megatron.num_layers_in_last_pipeline_stage": 9})
    assert "megatron_layers_divide_pipeline" in rules_of(too_many)
    odd_ends = apply_knobs(plan, {"actor.megatron.num_layers_in_first_pipeline_stage": 9,
                                  "actor.megatron.num_layers_in_last_pipeline_stage": 15,
                                  "actor.megatron.virtual_pipeline_model_parallel_size": 2})
    assert "megatron_layers_divide_pipeline" in rules_of(odd_ends)


def test_a_virtual_pipeline_needs_a_pipeline():
    plan = megatron_plan(actor__megatron__virtual_pipeline_model_parallel_size=2)
    assert "megatron_vpp_needs_pipeline" in rules_of(plan)
    assert "megatron_vpp_needs_pipeline" not in rules_of(fixed(plan, "megatron_vpp_needs_pipeline"))


def test_with_a_virtual_pipeline_the_micro_batches_per_mini_batch_are_a_multiple_of_pp():
    # 8 GPUs, PP 2: DP 4; mini 16 prompts x n 4 / 4 = 16 sequences per rank; micro 16 -> 1 micro batch
    plan = megatron_plan(actor__megatron__pipeline_model_parallel_size=2,
                         actor__megatron__virtual_pipeline_model_parallel_size=2,
                         actor__ppo_micro_batch_size_per_gpu=16)
    assert "megatron_vpp_micro_batches_divide" in rules_of(plan)
    assert "megatron_vpp_micro_batches_divide" not in rules_of(
        apply_knobs(plan, {"actor.ppo_micro_batch_size_per_gpu": 8}))
    assert "megatron_vpp_micro_batches_divide" not in rules_of(apply_knobs(plan, {"actor.use_dynamic_bsz": True}))


def test_megatron_dp_is_the_world_over_tp_pp_cp_in_the_batch_layout():
    from rlplan.planner.layout import plan_layout

    plan = megatron_plan(actor__megatron__tensor_model_parallel_size=2,
                         actor__megatron__pipeline_model_parallel_size=2)
    assert plan_layout(plan).parallel.dp == 2


def test_full_recompute_covers_at_most_one_stages_layers():
    # (method and layers first: the section checks each pin's result, and full recompute needs both)
    plan = megatron_plan(actor__megatron__pipeline_model_parallel_size=4, actor__megatron__recompute_method="uniform",
                         actor__megatron__recompute_num_layers=8, actor__megatron__recompute_granularity="full")
    assert "megatron_recompute_layers_fit_stage" in rules_of(plan)  # 28 layers / 4 stages = 7
    assert "megatron_recompute_layers_fit_stage" not in rules_of(fixed(plan, "megatron_recompute_layers_fit_stage"))


def test_uniform_recompute_is_held_to_the_smallest_uneven_stage_not_the_average():
    # 28 layers on 4 stages, 6 on the first and last: the middle stages hold 8 each (28 / 4 = 7 on average).
    # Megatron-Core walks each chunk's own layers in steps of recompute_num_layers: 4 divides 8 but not 6.
    uneven = {"actor__megatron__pipeline_model_parallel_size": 4,
              "actor__megatron__num_layers_in_first_pipeline_stage": 6,
              "actor__megatron__num_layers_in_last_pipeline_stage": 6,
              "actor__megatron__recompute_method": "uniform"}
    full = {"actor__megatron__recompute_granularity": "full"}  # last: the section checks each pin's result
    plan = megatron_plan(**uneven, actor__megatron__recompute_num_layers=4, **full)
    [violation] = [v for v in check_plan(plan).violations if v.rule == "megatron_recompute_layers_fit_stage"]
    assert "6, 8 layers" in violation.message
    assert violation.suggested == {"actor.megatron.recompute_num_layers": 2}
    assert "megatron_recompute_layers_fit_stage" not in rules_of(fixed(plan, "megatron_recompute_layers_fit_stage"))
    assert "megatron_recompute_layers_fit_stage" not in rules_of(
        megatron_plan(**uneven, actor__megatron__recompute_num_layers=2, **full))


def test_uniform_recompute_that_does_not_divide_an_even_stage_indexes_past_it():
    # 7 layers a stage in units of 3: the third unit asks for layers 6-8 of a 7-layer chunk.
    plan = megatron_plan(actor__megatron__pipeline_model_parallel_size=4, actor__megatron__recompute_method="uniform",
                         actor__megatron__recompute_num_layers=3, actor__megatron__recompute_granularity="full")
    assert "megatron_recompute_layers_fit_stage" in rules_of(plan)
    assert "megatron_recompute_layers_fit_stage" not in rules_of(fixed(plan, "megatron_recompute_layers_fit_stage"))


def test_block_recompute_of_more_layers_than_a_stage_holds_recomputes_the_stage_and_is_not_refused():
    # Megatron-Core's block method checkpoints the stage's first recompute_num_layers layers, within the stage's own
    # range: 8 on a stage of 7 recomputes all 7 (verl v0.7.0's recipe/r1_ascend DeepSeek-V3 script sets block, 8).
    plan = megatron_plan(actor__megatron__pipeline_model_parallel_size=4, actor__megatron__recompute_method="block",
                         actor__megatron__recompute_num_layers=8, actor__megatron__recompute_granularity="full")
    assert "megatron_recompute_layers_fit_stage" not in rules_of(plan)


def test_sequence_parallel_at_tp_1_says_nothing_as_it_changes_nothing():
    # verl's own default (sequence_parallel true at TP 1): McoreEngineConfig turns it off, and the memory model
    # splits activations over TP only where TP > 1, so no rule may warn about what no one can act on.
    plan = megatron_plan()
    assert plan.actor.mcore.sequence_parallel and plan.actor.mcore.tensor_model_parallel_size == 1
    assert not [v for v in check_plan(plan).violations if "sequence_parallel" in v.message]
    off = apply_knobs(plan, {"actor.megatron.sequence_parallel": False})
    assert predict_memory(off).gpu_peak_bytes == predict_memory(plan).gpu_peak_bytes


def test_moe_with_tp_and_ep_needs_sequence_parallel():
    plan = megatron_plan(QWEN3_MOE, actor__megatron__tensor_model_parallel_size=2,
                         actor__megatron__expert_model_parallel_size=4, actor__megatron__sequence_parallel=False)
    assert "megatron_moe_tp_needs_sequence_parallel" in rules_of(plan)
    assert "megatron_moe_tp_needs_sequence_parallel" not in rules_of(
        fixed(plan, "megatron_moe_tp_needs_sequence_parallel"))


def test_ulysses_needs_heads_and_remove_padding():
    plan = make_plan(overrides={"actor.ulysses_sequence_parallel_size": 8, "model.use_remove_padding": False})
    rules = {v.rule for v in check_plan(plan).errors}
    assert {"ulysses_needs_remove_padding", "ulysses_divides_heads"} <= rules  # 28 heads % 8 != 0


def test_rollout_tp_must_divide_heads_and_world():
    plan = make_plan(overrides={"rollout.tensor_model_parallel_size": 3})
    rules = {v.rule for v in check_plan(plan).errors}
    assert {"rollout_tp_divides_world", "rollout_tp_divides_heads"} <= rules


def test_the_reference_places_its_layers_as_the_actor_does_unless_it_sets_its_own():
    # verl's ref config takes the actor's override_transformer_config (ppo_megatron_trainer.yaml v0.4.x,
    # ref/megatron_ref.yaml from v0.5.0): a script placing the actor's last stage by hand places the ref's too.
    plan = megatron_plan(QWEN3_MOE, actor__megatron__pipeline_model_parallel_size=2,
                         actor__megatron__virtual_pipeline_model_parallel_size=5, actor__use_kl_loss=True)
    assert plan.uses_reference and not plan.reference_is_actor
    errors = [v.message for v in check_plan(plan).errors if v.rule == "megatron_layers_divide_pipeline"]
    assert any(message.startswith("ref:") for message in errors)
    placed = megatron_plan(QWEN3_MOE, actor__megatron__pipeline_model_parallel_size=2,
                           actor__megatron__virtual_pipeline_model_parallel_size=5, actor__use_kl_loss=True,
                           actor__megatron__num_layers_in_first_pipeline_stage=23,
                           actor__megatron__num_layers_in_last_pipeline_stage=25)
    assert placed.engine("ref").num_layers_in_last_pipeline_stage == 25
    verdicts = {role: sorted(v.message.removeprefix(f"{role}: ") for v in check_plan(placed).errors
                             if v.rule == "megatron_layers_divide_pipeline" and v.message.startswith(f"{role}:"))
                for role in ("actor", "ref")}
    assert verdicts["ref"] == verdicts["actor"]


def test_the_embedding_and_loss_counted_in_the_split_make_94_layers_divide_over_8_stages():
    # verl's Qwen3-235B 96 GB example: 94 layers on PP 8 with both account_for_*_in_pipeline_split flags, which
    # Megatron-Core (core_v0.13 on) splits as 96 layers; with one flag (95) it refuses the model.
    prefix = "+actor_rollout_ref.actor.megatron.override_transformer_config."
    base = megatron_plan(QWEN3_MOE, actor__megatron__pipeline_model_parallel_size=8)
    arch = attrs.evolve(base.model.arch, num_layers=94)
    plan = base.evolve(model=attrs.evolve(base.model, arch=arch))
    assert "megatron_layers_divide_pipeline" in rules_of(plan)
    both = plan.evolve(passthrough={prefix + "account_for_embedding_in_pipeline_split": "True",
                                    prefix + "account_for_loss_in_pipeline_split": "True"})
    assert "megatron_layers_divide_pipeline" not in rules_of(both)
    one = plan.evolve(passthrough={prefix + "account_for_loss_in_pipeline_split": "True"})
    assert "megatron_layers_divide_pipeline" in rules_of(one)


def test_rollout_tp_is_checked_against_the_rollouts_own_pool_and_its_engines_count_there():
    from rlplan.planner.layout import plan_layout
    from rlplan.planner.plan import RolloutPool

    plan = make_plan(gpus=8, overrides={"rollout.tensor_model_parallel_size": 2})
    assert "rollout_tp_divides_world" not in rules_of(plan) and plan_layout(plan).parallel.rollout_replicas == 4
    # Three GPUs of its own: TP 2 leaves one idle, which verl refuses, though TP 2 divides the trainer's 8.
    odd = plan.evolve(rollout=attrs.evolve(plan.rollout, pool=RolloutPool(nodes=1, gpus_per_node=3)))
    assert "rollout_tp_divides_world" in rules_of(odd)
    apart = plan.evolve(rollout=attrs.evolve(plan.rollout, pool=RolloutPool(nodes=1, gpus_per_node=2)))
    assert "rollout_tp_divides_world" not in rules_of(apart) and plan_layout(apart).parallel.rollout_replicas == 1


def test_unset_expert_tp_takes_tp_and_the_refusal_names_megatrons_error_and_etp_1():
    # verl passes expert_tensor_parallel_size=None and Megatron-Core takes TP: EP 8 x ETP 4 on 8 GPUs (verl v0.7.0's
    # recipe/dapo/test_dapo_qwen3_moe_30b_megatron_fp16.sh: TP 4, PP 4, EP 8 on 32 GPUs).
    plan = megatron_plan(QWEN3_MOE, actor__megatron__tensor_model_parallel_size=4,
                         actor__megatron__expert_model_parallel_size=8)
    refusal = next(v for v in check_plan(plan).errors if v.rule == "megatron_experts_divide")
    assert "Megatron takes TP 4" in refusal.message and "initialize_model_parallel" in refusal.message
    assert "expert_tensor_parallel_size = 1" in refusal.fix
    assert "megatron_experts_divide" not in rules_of(
        apply_knobs(plan, {"actor.megatron.expert_tensor_parallel_size": 1}))

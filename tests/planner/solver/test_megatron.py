"""`solve --strategy megatron|auto`: the Megatron search space (planner/solver/megatron.py) and its plans."""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlplan.planner.commands.solve_commands import SolveFlags
from rlplan.planner.errors import PlanError
from rlplan.planner.hardware import Cluster
from rlplan.planner.memory import predict_memory
from rlplan.planner.plan import ModelSection
from rlplan.planner.presets import resolve_gpu, resolve_model
from rlplan.planner.render import render_plan, verl_overrides
from rlplan.planner.rules import check_plan
from rlplan.planner.solver import SolveRequest, skeleton_plan, solve, solve_engines
from rlplan.planner.solver.megatron import (
    apply_megatron_choice,
    expert_options,
    megatron_choices,
    next_interleaved,
    pinned_choices,
    uneven_stage_layers,
    virtual_pipeline_options,
)

H100 = resolve_gpu("h100-80g")


def request_for(model: str, gpus: int, *, prompt: int = 1024, response: int = 2048, strategy="megatron",
                lora="auto", pins=None) -> SolveRequest:
    resolved = resolve_model(model)
    return SolveRequest(model=ModelSection(name=resolved.name, path=resolved.path, arch=resolved.arch),
                        cluster=Cluster(gpu=H100, nodes=max(gpus // 8, 1), gpus_per_node=min(gpus, 8),
                                        host_memory_gib=2048.0),
                        prompt_len=prompt, response_len=response, strategy=strategy, lora=lora, pins=pins or {})


@functools.cache
def solved(model: str, gpus: int, strategy: str = "megatron"):
    return solve(request_for(model, gpus, strategy=strategy))


def assert_a_valid_megatron_plan(plan) -> None:
    report = check_plan(plan)
    assert plan.is_megatron and report.valid, report.errors
    assert predict_memory(plan).fits
    engine = plan.actor.mcore
    world = plan.cluster.world_size
    assert world % (engine.model_parallel_size * engine.context_parallel_size) == 0
    assert engine.use_distributed_optimizer
    # verl's Megatron config, none of FSDP's keys.
    script = render_plan(plan, "verl")
    assert "--config-name=ppo_megatron_trainer" in script or "ppo_megatron_trainer" in script
    assert "fsdp_config" not in script


def test_qwen3_30b_a3b_on_16_h100_solves_to_a_valid_megatron_plan():
    result = solved("qwen3-30b-a3b", 16)
    assert result.plan is not None
    assert_a_valid_megatron_plan(result.plan)
    engine = result.plan.actor.mcore
    assert 128 % engine.expert_model_parallel_size == 0 and engine.expert_model_parallel_size > 1


def test_deepseek_v3_on_256_h100_places_its_61_layers_unevenly_and_validates():
    result = solved("deepseek-v3", 256)
    assert result.plan is not None
    plan = result.plan
    assert_a_valid_megatron_plan(plan)
    pp = plan.actor.mcore.pipeline_model_parallel_size
    engine = plan.actor.mcore
    if pp > 1:  # 61 is prime: every pipeline needs the uneven placement
        first, last = engine.num_layers_in_first_pipeline_stage, engine.num_layers_in_last_pipeline_stage
        assert first is not None and last is not None
        assert first + last + (pp - 2) * -(-61 // pp) == 61
    # The rollout engine holds the 671B weights: beyond two nodes' TP.
    assert plan.rollout.tensor_model_parallel_size > 16


def test_deepseek_v3_pinned_to_pp_16_places_3_and_2_layers_on_the_end_stages_as_verls_recipe():
    result = solve(request_for("deepseek-v3", 256, pins={"actor.megatron.pipeline_model_parallel_size": 16}))
    assert result.plan is not None
    plan = result.plan
    assert_a_valid_megatron_plan(plan)
    engine = plan.actor.mcore
    assert (engine.num_layers_in_first_pipeline_stage, engine.num_layers_in_last_pipeline_stage) == (3, 2)
    ref = plan.engine("ref")  # 3 + 14 x 4 + 2 = 61, the reference following the actor
    assert (ref.num_layers_in_first_pipeline_stage, ref.num_layers_in_last_pipeline_stage) == (3, 2)
    # Render writes them as verl's DeepSeek recipe does, through override_transformer_config.
    rendered = verl_overrides(plan)
    for end, layers in (("first", 3), ("last", 2)):
        key = f"++actor_rollout_ref.actor.megatron.override_transformer_config.num_layers_in_{end}_pipeline_stage"
        assert f"{key}={layers}" in rendered


def test_the_default_strategy_is_fsdp_and_auto_keeps_the_faster_backend():
    fsdp = solve(request_for("qwen2.5-7b", 8, strategy="fsdp"))
    assert fsdp.plan is not None and not fsdp.plan.is_megatron
    auto = solve_engines(request_for("qwen2.5-7b", 8, strategy="auto"), ("vllm",))
    megatron = solved("qwen2.5-7b", 8)
    assert auto.best is not None and fsdp.best is not None and megatron.best is not None
    fastest = min(fsdp.best.step_time.total_seconds, megatron.best.step_time.total_seconds)
    assert auto.best.step_time.total_seconds == pytest.approx(fastest)


def test_a_pinned_layout_is_honoured():
    result = solve(request_for("qwen3-30b-a3b", 16, pins={"actor.megatron.tensor_model_parallel_size": 2,
                                                          "actor.megatron.expert_model_parallel_size": 8}))
    assert result.plan is not None
    engine = result.plan.actor.mcore
    assert (engine.tensor_model_parallel_size, engine.expert_model_parallel_size) == (2, 8)
    assert engine.sequence_parallel  # MoE with TP and EP needs it (rule megatron_moe_tp_needs_sequence_parallel)


@settings(max_examples=25, deadline=None)
@given(model=st.sampled_from(["qwen2.5-7b", "qwen3-30b-a3b", "deepseek-v3", "llama-3.1-8b"]),
       gpus=st.sampled_from([8, 16, 32, 64]), long=st.booleans(), data=st.data())
def test_every_generated_choice_satisfies_megatrons_layout_rules(model, gpus, long, data):
    """Invariant: no choice the generator yields breaks a Megatron rule (world, experts, heads, layers, SP)."""
    request = request_for(model, gpus, response=16384 if long else 2048, lora="auto")
    choices = list(megatron_choices(request.model.arch, request.cluster, 1024 + (16384 if long else 2048), (0, 32)))
    assert choices
    choice = data.draw(st.sampled_from(choices))
    # A fitting layout's interleaved variants (the search tries them next) keep to the rules too.
    variant = next_interleaved(choice, request.model.arch.num_layers)
    for drawn in (choice, *([variant, next_interleaved(variant, request.model.arch.num_layers)] if variant else [])):
        if drawn is None:
            continue
        plan = apply_megatron_choice(skeleton_plan(request, request.response_len or 1), drawn, lambda dp: 64, 1.0)
        megatron_rules = {v.rule for v in check_plan(plan).violations if v.rule.startswith("megatron_")
                          and v.rule != "megatron_vpp_micro_batches_divide"}
        assert not megatron_rules, drawn


@given(layers=st.integers(2, 128), pp=st.sampled_from([1, 2, 4, 8, 16]))
def test_virtual_pipeline_sizes_split_the_layers_into_even_chunks_of_two_or_more(layers, pp):
    """Invariant: VPP only with a pipeline, PP x VPP dividing the layers, each chunk at least two layers."""
    for vpp in virtual_pipeline_options(layers, pp):
        assert pp > 1 and vpp > 1 and layers % (pp * vpp) == 0 and layers // (pp * vpp) >= 2


def test_moe_layouts_take_etp_1_and_etp_tp_and_dense_ones_none():
    moe = resolve_model("qwen3-30b-a3b").arch
    assert expert_options(resolve_model("qwen2.5-7b").arch, 16, 1, 4) == [(1, None)]
    options = expert_options(moe, 16, 1, 4)
    assert {etp for _, etp in options} == {1, 4}
    assert all(128 % ep == 0 and 16 % (ep * etp) == 0 for ep, etp in options)
    assert {etp for _, etp in expert_options(moe, 16, 1, 1)} == {1}


def test_a_fitting_pipelined_layout_is_searched_interleaved_and_the_plan_validates():
    """Qwen3-30B-A3B on 16 H100: PP 2 layouts fit, so their VPP 2 (and 4) variants are priced; whichever wins,
    a plan with VPP keeps PP x VPP dividing the 48 layers and verl's rules."""
    result = solve(request_for("qwen3-30b-a3b", 16, response=4096))
    engine = result.plan.actor.mcore
    interleaved = [c.plan for c in (result.best, *result.runners_up)
                   if c.plan.actor.mcore.virtual_pipeline_model_parallel_size]
    pinned = solve(request_for("qwen3-30b-a3b", 16, response=4096, pins={
        "actor.megatron.pipeline_model_parallel_size": 2, "actor.megatron.virtual_pipeline_model_parallel_size": 2}))
    assert pinned.plan is not None
    assert_a_valid_megatron_plan(pinned.plan)
    assert pinned.plan.actor.mcore.virtual_pipeline_model_parallel_size == 2
    for plan in (*interleaved, result.plan):
        assert_a_valid_megatron_plan(plan)
    if engine.virtual_pipeline_model_parallel_size:
        assert 48 % (engine.pipeline_model_parallel_size * engine.virtual_pipeline_model_parallel_size) == 0


@given(layers=st.integers(2, 128), pp=st.sampled_from([1, 2, 4, 8, 16]))
def test_an_uneven_placement_holds_every_layer_and_no_stage_more_than_the_middle_ones(layers, pp):
    """Invariant: first + last + (PP - 2) x middle = layers, each stage >= 1 and <= ceil(layers / PP)."""
    uneven = uneven_stage_layers(layers, pp)
    if uneven is None:
        return
    first, last = uneven
    middle = -(-layers // pp)
    assert first + last + (pp - 2) * middle == layers
    assert 1 <= last <= first <= middle


def test_pins_outside_the_space_replace_it():
    request = request_for("qwen2.5-7b", 8)
    choices = list(megatron_choices(request.model.arch, request.cluster, 3072, (0,)))
    pinned = pinned_choices(choices, {"actor.megatron.pipeline_model_parallel_size": 7})
    assert pinned and {c.pipeline for c in pinned} == {7}


def test_megatron_on_this_cpu_is_refused_before_solving():
    with pytest.raises(PlanError, match="--strategy"):
        SolveFlags(device="cpu", strategy="megatron")
    with pytest.raises(PlanError, match="--strategy"):
        SolveFlags(strategy="deepspeed")


def test_the_command_writes_a_megatron_plan_and_a_resolve_from_it_stays_megatron(tmp_path):
    import json

    from typer.testing import CliRunner

    from rlplan.planner.commands.cli import app

    runner = CliRunner()
    plan_path = tmp_path / "plan.toml"
    solved = runner.invoke(app, ["solve", "--model", "qwen2.5-7b", "--gpus", "8", "--gpu", "h100-80g", "--strategy",
                                 "megatron", "--prompt-len", "1024", "--response-len", "2048", "--json", "-o",
                                 str(plan_path)])
    assert solved.exit_code == 0, solved.output
    assert json.loads(solved.stdout)["plan"]["actor"]["strategy"] == "megatron"
    validated = runner.invoke(app, ["validate", str(plan_path), "--json"])
    assert validated.exit_code == 0 and json.loads(validated.stdout)["valid"]
    again = runner.invoke(app, ["solve", "--from", str(plan_path), "--json"])  # no --strategy: the plan's backend
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["plan"]["actor"]["strategy"] == "megatron"
    as_fsdp = runner.invoke(app, ["solve", "--from", str(plan_path), "--strategy", "fsdp", "--json"])
    assert as_fsdp.exit_code == 0, as_fsdp.output
    fsdp_plan = json.loads(as_fsdp.stdout)["plan"]
    assert fsdp_plan["actor"]["strategy"] == "fsdp2" and "megatron" not in fsdp_plan["actor"]


def test_a_megatron_request_that_cannot_fit_names_the_closest_layout_and_what_binds():
    result = solve(request_for("deepseek-v3", 16))
    assert result.plan is None and result.diagnosis is not None
    assert "Megatron TP" in result.diagnosis.message and "GiB more" in result.diagnosis.message
    assert result.diagnosis.suggestions  # re-solved changes that fit (more GPUs, bigger GPUs)

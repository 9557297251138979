"""The runtime's platform (runtime/platform.py): the gate of `rlplan run` over the registered rules, and CPU threads per rank."""

from __future__ import annotations

import os

import attrs
import pytest

from rlplan.planner.errors import PlanError
from rlplan.planner.rules import check_plan
from rlplan.runtime.platform import (
    Platform,
    available_cores,
    blocking_errors,
    check_plan_runnable,
    cpu_threads_per_rank,
)
from tests.planner.plans import make_plan

CPU = Platform(device_type="cpu")
GPU = Platform(device_type="cuda", accelerator_count=8)


def _on_cpu(plan):
    """The plan as solved for a CPU machine (`solve --device cpu` names the device "cpu")."""
    return plan.evolve(cluster=attrs.evolve(plan.cluster, gpu=attrs.evolve(plan.cluster.gpu, name="cpu")))


def _platform_refusals(plan, platform) -> list[str]:
    """The plan keys the platform rules refuse, in order."""
    return [v.plan_key for v in check_plan(plan, platform).errors if v.stage == "platform"]


@pytest.mark.parametrize("field", ["actor.offload_policy", "critic.offload_policy"])
def test_cpu_offload_policy_is_refused_without_an_accelerator_naming_the_field(field):
    # FSDP2's CPUOffloadPolicy raises on a machine without an accelerator (runtime-facts.md).
    plan = make_plan(overrides={"algorithm.adv_estimator": "gae", "critic.ppo_micro_batch_size_per_gpu": 2,
                                "rollout.free_cache_engine": False, field: True})
    errors = [v for v in check_plan(_on_cpu(plan), CPU).errors if v.stage == "platform"]
    assert [e.plan_key for e in errors] == [field] and errors[0].fix
    # On GPUs the trainer shards with CPUOffloadPolicy, as verl does for this key.
    assert field not in _platform_refusals(plan, GPU)


@pytest.mark.parametrize(("world_size", "cores", "threads"), [(1, 2, 2), (2, 2, 1), (4, 2, 1), (2, 16, 8), (3, 16, 5)])
def test_cpu_ranks_split_the_cores_and_never_get_zero_threads(world_size, cores, threads):
    assert cpu_threads_per_rank(world_size, cores) == threads


def test_available_cores_is_this_process_affinity():
    assert 1 <= available_cores() <= (os.cpu_count() or 1)


@pytest.mark.parametrize("platform", [GPU, CPU])
def test_sglang_plan_is_refused_naming_rollout_name_on_every_platform(platform):
    plan = make_plan() if platform.has_accelerator else _on_cpu(make_plan())
    sglang = plan.evolve(rollout=attrs.evolve(plan.rollout, name="sglang"))
    with pytest.raises(PlanError) as error:
        check_plan_runnable(sglang, platform)
    assert error.value.field == "rollout.name" and "render" in error.value.fix
    assert "rollout.name" not in _platform_refusals(plan, platform)


@pytest.mark.parametrize(
    ("overrides", "platform", "rule", "key"),
    [
        # Level 2 drops vLLM's base weights on sleep and an adapter sync does not resend them.
        ({"rollout.free_cache_engine": True, "rollout.sleep_level": 2, "model.lora.rank": 8}, GPU,
         "adapter_sync_keeps_base_weights", "rollout.sleep_level"),
        ({"rollout.enable_chunked_prefill": False, "rollout.max_num_batched_tokens": 1024}, GPU,
         "batched_tokens_cover_sequences", "rollout.enable_chunked_prefill"),
        ({"rollout.max_model_len": 40000}, GPU, "max_model_len_within_model", "rollout.max_model_len"),
        ({"actor.fsdp_size": 3}, GPU, "fsdp_size_divides_world", "actor.fsdp_size"),
        ({"rollout.tensor_model_parallel_size": 2}, GPU, "runtime_rollout_is_single_gpu",
         "rollout.tensor_model_parallel_size"),
        ({"rollout.free_cache_engine": True}, CPU, "free_cache_needs_sleep_mode", "rollout.free_cache_engine"),
        ({"actor.strategy": "fsdp"}, GPU, "runtime_trains_with_fsdp2", "actor.strategy"),
    ],
)
def test_run_gate_refuses_what_a_registered_rule_refuses_naming_its_key(overrides, platform, rule, key):
    plan = make_plan(overrides=overrides)
    assert check_plan_runnable(make_plan(), GPU) is None
    errors = [v for v in check_plan(plan, platform).errors if v.rule == rule]
    assert errors and errors[0].plan_key == key and errors[0].fix
    with pytest.raises(PlanError) as raised:
        check_plan_runnable(plan, platform)
    assert raised.value.field and raised.value.fix


def test_platform_rules_run_only_with_a_platform():
    plan = make_plan(overrides={"rollout.name": "sglang", "actor.param_offload": True, "actor.strategy": "fsdp"})
    assert not [v for v in check_plan(plan).violations if v.stage == "platform"]
    assert {"runtime_rolls_out_with_vllm", "host_offload_needs_accelerator", "runtime_trains_with_fsdp2"} <= {
        v.rule for v in check_plan(plan, CPU).errors
    }


def test_run_refuses_a_megatron_plan_naming_render_target_verl():
    plan = make_plan(overrides={"actor.strategy": "megatron"})
    with pytest.raises(PlanError) as raised:
        check_plan_runnable(plan, GPU)
    assert "Megatron" in raised.value.message and "render" in raised.value.fix and "--target verl" in raised.value.fix


def test_single_gpu_rollout_fix_names_a_flag_solve_has():
    plan = make_plan(overrides={"rollout.tensor_model_parallel_size": 2})
    (refusal,) = [v for v in check_plan(plan, GPU).errors if v.rule == "runtime_rollout_is_single_gpu"]
    assert "--fix rollout.tensor_model_parallel_size=1" in refusal.fix and "--pin" not in refusal.fix


def test_a_plan_for_more_gpus_than_this_machine_has_is_refused():
    plan = make_plan(gpus=8)
    assert "cluster.gpus_per_node" in _platform_refusals(plan, Platform(device_type="cuda", accelerator_count=4))
    assert "cluster.gpus_per_node" not in _platform_refusals(plan, GPU)


def test_an_engine_in_another_dtype_than_the_cpu_trainer_is_warned_with_the_trainers_dtype_as_fix():
    def warnings(plan, platform=CPU):
        return [v for v in check_plan(plan, platform).violations if v.rule == "rollout_dtype_matches_cpu_trainer"]

    # verl's defaults: both bfloat16, nothing to say on either platform.
    assert not warnings(make_plan()) and not warnings(make_plan(), GPU)
    (fp32_engine,) = warnings(make_plan(overrides={"rollout.dtype": "float32"}))
    assert fp32_engine.severity == "warning" and fp32_engine.suggested == {"rollout.dtype": "bfloat16"}
    (bf16_engine,) = warnings(make_plan(overrides={"actor.compute_dtype": "float32"}))
    assert bf16_engine.suggested == {"rollout.dtype": "float32"}
    assert not warnings(make_plan(overrides={"actor.compute_dtype": "float32", "rollout.dtype": "float32"}))


@pytest.mark.parametrize("role", ["actor", "ref", "critic"])
def test_fp16_compute_is_refused_on_every_platform_with_bf16_as_the_fix(role):
    plan = make_plan(overrides={f"{role}.compute_dtype": "float16"})
    for platform in (CPU, GPU):
        (refusal,) = [v for v in check_plan(plan, platform).errors
                      if v.rule == "runtime_computes_without_loss_scaling"]
        assert refusal.suggested == {f"{role}.compute_dtype": "bfloat16"}
    assert not [v for v in check_plan(make_plan(), GPU).errors if v.rule == "runtime_computes_without_loss_scaling"]


def test_a_compiled_cpu_engine_without_a_cpp_compiler_is_refused_with_the_eager_fix():
    compiled = make_plan(overrides={"rollout.enforce_eager": False})
    bare_cpu = Platform(device_type="cpu", has_cpp_compiler=False)
    (refusal,) = [v for v in check_plan(compiled, bare_cpu).errors
                  if v.rule == "compiled_cpu_rollout_needs_a_compiler"]
    assert refusal.suggested == {"rollout.enforce_eager": True} and "g++" in refusal.fix
    eager = make_plan(overrides={"rollout.enforce_eager": True})
    for plan, platform in ((compiled, CPU), (compiled, GPU), (eager, bare_cpu)):
        assert not [v for v in check_plan(plan, platform).errors if v.rule == "compiled_cpu_rollout_needs_a_compiler"]


def test_a_gpu_plan_on_a_cpu_machine_is_refused_first_and_every_other_refusal_follows():
    plan = make_plan(overrides={"rollout.free_cache_engine": True, "actor.strategy": "fsdp"})
    errors = blocking_errors(plan, CPU)
    # The machine first (most other refusals follow from it), then the platform, then verl's rules.
    assert [e.field for e in errors][:3] == ["cluster.gpu", "rollout.free_cache_engine", "actor.strategy"]
    assert "no GPU" in errors[0].message and "--device cpu" in errors[0].fix
    # A plan solved for a CPU machine is not refused for its device, and a GPU machine runs a GPU plan.
    assert "cluster.gpu" not in [e.field for e in blocking_errors(_on_cpu(plan), CPU)]
    assert "cluster.gpu" not in [e.field for e in blocking_errors(plan, GPU)]
    with pytest.raises(PlanError) as first:
        check_plan_runnable(plan, CPU)
    assert first.value.field == "cluster.gpu"

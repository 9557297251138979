"""The rollout engine's KV sizing by engine version (planner/memory/rollout.py, stack.kv_pool_charges_the_whole_gpu):
which releases charge the trainer's resident state to the pool, read in vLLM's and SGLang's sources at the tags; and
vLLM V1's start-up refusal from 0.9.1 (stack.engine_refuses_short_free_memory, rollout.free_at_engine_start)."""

from __future__ import annotations

import pytest

from rlplan.planner.hf_config import architecture_from_hf_config
from rlplan.planner.memory import predict_memory
from rlplan.planner.memory.report import GIB
from rlplan.planner.memory.rollout import (
    largest_starting_utilization,
    rollout_budget,
    start_refusal,
    trainer_bytes_at_engine_start,
)
from rlplan.planner.profile import DEFAULT_PROFILE
from rlplan.planner.report import plan_reports, verdict
from rlplan.planner.stack import (
    StackSection,
    engine_refuses_short_free_memory,
    kv_pool_charges_the_whole_gpu,
    vllm_engine_of,
)
from tests.planner.plans import make_plan

# Qwen3-8B's config (hub Qwen/Qwen3-8B config.json): the model of vLLM issue #17431.
QWEN3_8B = architecture_from_hf_config({
    "model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151936,
    "max_position_embeddings": 40960, "tie_word_embeddings": False})


@pytest.mark.parametrize(("stack", "engine", "whole_gpu"), [
    (StackSection(vllm="0.6.3"), "vllm", False),  # V0: the free-memory drop since the worker started
    (StackSection(vllm="0.6.4.post1"), "vllm", True),  # V0: the process's torch peak + non-torch
    (StackSection(vllm="0.7.3"), "vllm", False),  # V0 by default; memory_profiling from its baseline
    (StackSection(vllm="0.7.3", vllm_engine="v1"), "vllm", True),
    (StackSection(vllm="0.8.5"), "vllm", True),  # V1 by default from 0.8.0
    (StackSection(vllm="0.8.5", vllm_engine="v0"), "vllm", False),
    (StackSection(vllm="0.9.0"), "vllm", True),
    (StackSection(vllm="0.9.1"), "vllm", False),  # V1's memory_profiling from its init snapshot
    (StackSection(vllm="0.11.0"), "vllm", False),
    (StackSection(sglang="0.4.6.post5"), "sglang", True),  # available - total x (1 - fraction)
    (StackSection(sglang="0.5.9"), "sglang", True),
    (StackSection(sglang="0.5.10"), "sglang", False),  # post_load - pre_load x (1 - fraction)
])
def test_which_engine_releases_size_the_kv_pool_from_the_whole_gpu(stack, engine, whole_gpu):
    assert kv_pool_charges_the_whole_gpu(stack, engine) is whole_gpu


def test_vllm_runs_v0_before_0_8_and_v1_from_it_unless_the_script_chooses():
    assert vllm_engine_of(StackSection(vllm="0.7.3")) == "v0"
    assert vllm_engine_of(StackSection(vllm="0.8.0")) == "v1"
    assert vllm_engine_of(StackSection(vllm="0.8.5", vllm_engine="v0")) == "v0"


def _one_gpu_full_tuning(**overrides):
    """Qwen3-8B on one 80 GB A800, full fine-tuning, the trainer's fp32 params resident (no offload): util 0.4."""
    return make_plan(QWEN3_8B, gpus=1, gpu_mem_gib=80.0, overrides={
        "rollout.gpu_memory_utilization": 0.4, "rollout.tensor_model_parallel_size": 1, "rollout.max_num_seqs": 256,
        "rollout.max_num_batched_tokens": 8192, "data.train_batch_size": 8, "actor.ppo_mini_batch_size": 8,
        "rollout.n": 2, "actor.ppo_micro_batch_size_per_gpu": 1, "rollout.log_prob_micro_batch_size_per_gpu": 1,
        **overrides})


def test_a_resident_trainer_leaves_no_kv_blocks_on_v1_0_8_where_v0_starts_as_vllm_issue_17431_shows():
    """vllm-project/vllm#17431 (vLLM 0.8.5, A800, Qwen3-8B, --gpu-memory-utilization 0.4): VLLM_USE_V1=0 starts,
    the default V1 dies with "No available memory for the cache blocks", V1's profile charging what else is on the
    card (#17366: two instances on one card fail with V1). In verl's hybrid engine the something else is the
    trainer built before the engine; here its fp32 parameters."""
    v1 = _one_gpu_full_tuning().evolve(stack=StackSection(verl="0.4.1", vllm="0.8.5"))
    v0 = v1.evolve(stack=StackSection(verl="0.4.1", vllm="0.8.5", vllm_engine="v0"))
    resident = trainer_bytes_at_engine_start(v1)
    assert resident == pytest.approx(4 * 8.2e9, rel=0.05)  # 8.2B fp32 parameters on one GPU
    assert rollout_budget(v0).kv_cache_bytes > 0 and rollout_budget(v0).holds_max_model_len
    assert rollout_budget(v1).kv_cache_bytes <= 0
    assert rollout_budget(v0).kv_cache_bytes - rollout_budget(v1).kv_cache_bytes == resident
    assert any("whole GPU" in note for note in predict_memory(v1).notes)
    # vLLM 0.9.1 on profiles only what the instance adds: the same plan starts.
    assert rollout_budget(v1.evolve(stack=StackSection(verl="0.7.0", vllm="0.9.1"))).kv_cache_bytes > 0


def test_an_offloaded_trainer_costs_the_v1_0_8_pool_nothing():
    offloaded = _one_gpu_full_tuning(**{"actor.param_offload": True, "actor.optimizer_offload": True})
    on_08 = offloaded.evolve(stack=StackSection(verl="0.4.1", vllm="0.8.5"))
    assert trainer_bytes_at_engine_start(on_08) == 0
    assert rollout_budget(on_08).kv_cache_bytes == rollout_budget(
        on_08.evolve(stack=StackSection(verl="0.4.1", vllm="0.8.5", vllm_engine="v0"))).kv_cache_bytes


def test_sglang_from_0_5_10_takes_its_fraction_of_the_memory_free_before_the_load():
    plan = _one_gpu_full_tuning(**{"rollout.name": "sglang", "rollout.gpu_memory_utilization": 0.5})
    old = rollout_budget(plan.evolve(stack=StackSection(verl="0.4.1", sglang="0.4.6.post5")))
    new = rollout_budget(plan.evolve(stack=StackSection(verl="0.9.1", sglang="0.5.12")))
    resident = trainer_bytes_at_engine_start(plan)
    assert old.co_resident_bytes == new.co_resident_bytes == resident > 0
    # Old: the whole resident state and pre-load use come out of 0.5 x GPU; new: half of them (the fraction).
    charged_old = old.requested_bytes - old.weights_bytes - old.kv_cache_bytes
    charged_new = new.requested_bytes - new.weights_bytes - new.kv_cache_bytes
    assert charged_old == pytest.approx(old.non_torch_bytes + resident, abs=1)
    assert charged_new == pytest.approx(0.5 * (new.non_torch_bytes + resident), abs=1)
    assert new.kv_cache_bytes > old.kv_cache_bytes


def test_the_default_stack_prices_vllm_per_instance_as_before():
    plan = make_plan()
    budget = rollout_budget(plan)
    assert budget.co_resident_bytes == 0 and budget.fraction_of_free is None
    assert budget.kv_cache_bytes == (budget.requested_bytes - budget.weights_bytes - budget.activation_bytes
                                     - budget.non_torch_bytes)
    assert budget.kv_cache_bytes > 10 * GIB


@pytest.mark.parametrize(("stack", "engine", "refuses"), [
    (StackSection(verl="0.5.0", vllm="0.8.5"), "vllm", False),  # init_gpu_memory only: no test
    (StackSection(verl="0.6.0", vllm="0.9.0"), "vllm", False),
    (StackSection(verl="0.6.0", vllm="0.9.1"), "vllm", True),  # gpu_worker.py init_device: free < requested raises
    (StackSection(verl="0.6.0", vllm="0.9.1", vllm_engine="v0"), "vllm", False),  # V0's worker.py has no test
    (StackSection(verl="0.7.0", vllm="0.12.0"), "vllm", True),  # after the worker's NCCL init from 0.11.0
    (StackSection(), "vllm", True),  # verl 0.9.1's vLLM 0.24.0: v1/worker/utils.py request_memory
    (StackSection(verl="0.6.0", sglang="0.5.2"), "sglang", False),  # SGLang: TP balance and a pool above zero
    (StackSection(sglang="0.5.12"), "sglang", False),
])
def test_which_engine_releases_refuse_to_start_below_util_x_gpu_free(stack, engine, refuses):
    assert engine_refuses_short_free_memory(stack, engine) is refuses


def _resident_trainer_at(util: float, vllm: str, **overrides):
    """Qwen3-8B's fp32 parameters resident on one 80 GB GPU when the engine starts, at utilization `util`."""
    return _one_gpu_full_tuning(**{"rollout.gpu_memory_utilization": util, **overrides}).evolve(
        stack=StackSection(verl="0.6.0", vllm=vllm))


def test_vllm_from_0_9_1_refuses_to_start_when_the_resident_trainer_leaves_less_free_than_util_x_gpu():
    """The trainer's 30.5 GiB of fp32 parameters and its CUDA context leave ~42 GiB of an 80 GB GPU free when verl
    builds the engine: util 0.7 asks for ~52 GiB, which vLLM 0.9.1 refuses at start; 0.9.0 has no such test."""
    plan = _resident_trainer_at(0.7, "0.9.1")
    budget = rollout_budget(plan)
    gpu = plan.cluster.gpu_memory_bytes
    expected_free = gpu - trainer_bytes_at_engine_start(plan) - int(DEFAULT_PROFILE.cuda_context_and_nccl_gib * GIB)
    assert budget.free_at_start_bytes == expected_free < budget.requested_bytes
    assert not budget.starts
    assert not predict_memory(plan).fits
    older = rollout_budget(_resident_trainer_at(0.7, "0.9.0"))
    assert older.free_at_start_bytes is None and older.starts


def test_the_largest_starting_utilization_starts_and_one_hundredth_more_does_not():
    for vllm in ("0.9.1", "0.24.0"):
        refused = _resident_trainer_at(0.7, vllm)
        lower = largest_starting_utilization(rollout_budget(refused), refused.cluster.gpu_memory_bytes)
        assert lower is not None and 0.4 < lower < 0.7
        assert rollout_budget(_resident_trainer_at(lower, vllm)).starts
        assert not rollout_budget(_resident_trainer_at(round(lower + 0.01, 2), vllm)).starts


def test_offloading_the_trainers_parameters_before_the_engine_starts_lets_it_start():
    offloaded = _resident_trainer_at(0.7, "0.9.1", **{"actor.param_offload": True, "actor.optimizer_offload": True})
    budget = rollout_budget(offloaded)
    assert trainer_bytes_at_engine_start(offloaded) == 0 and budget.starts
    assert start_refusal(offloaded, budget) is None


def test_the_refusal_verdict_names_the_key_the_free_and_requested_gib_and_both_fixes():
    plan = _resident_trainer_at(0.7, "0.9.1")
    budget = rollout_budget(plan)
    lower = largest_starting_utilization(budget, plan.cluster.gpu_memory_bytes)
    reports = plan_reports(plan, DEFAULT_PROFILE)
    line = verdict(reports).plain
    assert line.startswith("VALID but predicted NOT to start: vLLM 0.9.1 refuses to start")
    assert "actor_rollout_ref.rollout.gpu_memory_utilization 0.70" in line
    assert f"{budget.free_at_start_bytes / GIB:.2f} GiB free" in line and f"{budget.requested_bytes / GIB:.2f} GiB" in line
    assert f"to {lower:.2f} or less" in line and "param_offload" in line
    assert not reports.feasible and any("refuses to start" in note for note in reports.memory.notes)
    assert "refuses to start" not in verdict(plan_reports(_resident_trainer_at(0.7, "0.9.0"), DEFAULT_PROFILE)).plain


def test_a_plan_that_names_no_vllm_is_told_that_its_releases_older_vllm_has_no_such_check():
    """verl 0.6.0 installs vLLM 0.7.3 to 0.9.1 and rlplan prices the newest (0.9.1); the refusal says the range."""
    plan = _one_gpu_full_tuning(**{"rollout.gpu_memory_utilization": 0.7}).evolve(stack=StackSection(verl="0.6.0"))
    refusal = start_refusal(plan, rollout_budget(plan))
    assert refusal is not None and refusal.startswith(
        "vLLM 0.9.1 (the plan names no vLLM: verl 0.6.0 installs 0.7.3 to 0.9.1, and one before 0.9.1 has no such "
        "check) refuses to start")
    named = _resident_trainer_at(0.7, "0.9.1")
    assert "names no vLLM" not in (start_refusal(named, rollout_budget(named)) or "")


@pytest.mark.parametrize(("verl", "own_process"), [
    ("0.6.1", False),  # the async server's ExternalZeroMQDistributedExecutor runs vLLM's worker in the trainer
    ("0.7.0", False),  # still: vllm_rollout.py vLLMAsyncRollout holds WorkerWrapperBase
    ("0.7.1", True),  # vLLMHttpServer starts vLLM with distributed_executor_backend "mp"
    ("0.8.0", True),
    ("0.9.1", True),
])
def test_where_vllm_runs_in_its_own_process_its_start_snapshot_also_sees_its_own_context(verl, own_process):
    """One context (the trainer's, which vLLM shares) up to verl 0.7.0; from 0.7.1 the vLLM worker's process adds
    its own, and the trainer's cached blocks are already flushed (stack.TRAINER_FLUSHED_AT_ENGINE_START)."""
    plan = _one_gpu_full_tuning(**{"rollout.gpu_memory_utilization": 0.4}).evolve(
        stack=StackSection(verl=verl, vllm="0.10.2"))
    budget = rollout_budget(plan)
    context = int(DEFAULT_PROFILE.cuda_context_and_nccl_gib * GIB)
    trainer = plan.cluster.gpu_memory_bytes - trainer_bytes_at_engine_start(plan)
    assert budget.free_at_start_bytes == trainer - (2 if own_process else 1) * context


def test_the_refusal_on_a_verl_that_starts_vllm_in_its_own_processes_names_the_workers_context():
    own = _one_gpu_full_tuning(**{"rollout.gpu_memory_utilization": 0.7}).evolve(
        stack=StackSection(verl="0.8.0", vllm="0.10.2"))
    shared = own.evolve(stack=StackSection(verl="0.7.0", vllm="0.10.2"))
    assert "the vLLM worker's own, verl 0.8.0 starting vLLM in processes of its own" in (
        start_refusal(own, rollout_budget(own)) or "")
    assert "vLLM worker's own" not in (start_refusal(shared, rollout_budget(shared)) or "")
    lower_own = largest_starting_utilization(rollout_budget(own), own.cluster.gpu_memory_bytes)
    lower_shared = largest_starting_utilization(rollout_budget(shared), shared.cluster.gpu_memory_bytes)
    assert lower_own is not None and lower_shared is not None and lower_own < lower_shared

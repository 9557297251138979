"""The rollout engine's KV sizing by engine version (planner/memory/rollout.py, stack.kv_pool_charges_the_whole_gpu):
which releases charge the trainer's resident state to the pool, read in vLLM's and SGLang's sources at the tags."""

from __future__ import annotations

import pytest

from rlplan.planner.hf_config import architecture_from_hf_config
from rlplan.planner.memory import predict_memory
from rlplan.planner.memory.report import GIB
from rlplan.planner.memory.rollout import rollout_budget, trainer_bytes_at_engine_start
from rlplan.planner.stack import StackSection, kv_pool_charges_the_whole_gpu, vllm_engine_of
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

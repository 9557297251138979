"""The rollout engines' budgets (planner/memory/rollout.py) where one engine's formula is its own: TensorRT-LLM's
KV pool, a fraction of what is free after its load (vLLM's and SGLang's are in test_rollout_versions.py and
tests/planner/test_sglang.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlplan.planner.memory import predict_memory
from rlplan.planner.memory.report import GIB
from rlplan.planner.memory.rollout import (
    ROLLOUT_ENGINES,
    cuda_graph_pool_bytes,
    rollout_budget,
    trainer_bytes_at_engine_start,
    trtllm_kv_cache_bytes,
)
from rlplan.planner.profile import DEFAULT_PROFILE
from tests.planner.plans import make_plan


def trtllm_plan(**overrides):
    return make_plan(overrides={"rollout.name": "trtllm", "stack.verl": "0.8.0", **overrides})


def test_trtllm_kv_pool_is_the_fraction_of_what_is_free_after_its_load_and_profile_run():
    """tensorrt_llm/_torch/pyexecutor/_util.py: available_kv_mem = (total - peak) x free_gpu_memory_fraction, the
    peak counting the weights, the profile run's activations, the non-torch memory and whatever else is on the device
    (verl's trainer state when it builds the engine)."""
    plan = trtllm_plan(**{"rollout.gpu_memory_utilization": 0.6})
    budget = rollout_budget(plan)
    gpu = plan.cluster.gpu_memory_bytes
    assert budget.fraction_of_free == 0.6
    assert budget.co_resident_bytes == trainer_bytes_at_engine_start(plan) > 0
    expected = 0.6 * (gpu - budget.weights_bytes - budget.activation_bytes - budget.non_torch_bytes
                      - budget.co_resident_bytes)
    assert budget.kv_cache_bytes == pytest.approx(expected, abs=8)
    assert budget.block_size == DEFAULT_PROFILE.trtllm_tokens_per_block == 32
    # vLLM takes util x GPU and carves its workspace out of it: the same util leaves TensorRT-LLM's pool elsewhere.
    vllm = rollout_budget(make_plan(overrides={"rollout.gpu_memory_utilization": 0.6}))
    assert vllm.kv_cache_bytes != budget.kv_cache_bytes


@settings(max_examples=25, deadline=None)
@given(st.floats(0.05, 0.95), st.floats(0.05, 0.95))
def test_trtllm_kv_pool_is_proportional_to_free_gpu_memory_fraction(a, b):
    """Invariant: the fraction scales what is left after the load, so pool(a) / a == pool(b) / b."""
    free = 80 * GIB - 15 * GIB - 2 * GIB - 0.5 * GIB - 7 * GIB
    pool_a = trtllm_kv_cache_bytes(a, 80 * GIB, 15 * GIB, 2 * GIB, 0.5 * GIB, 7 * GIB)
    pool_b = trtllm_kv_cache_bytes(b, 80 * GIB, 15 * GIB, 2 * GIB, 0.5 * GIB, 7 * GIB)
    assert pool_a / a == pytest.approx(pool_b / b) == pytest.approx(free)


def test_trtllm_holds_no_adapter_copies_nothing_to_host_and_captures_graphs_even_when_eager():
    """verl passes TensorRT-LLM no LoRA arguments, sleeps it with restore mode NONE, and always gives it a
    CudaGraphConfig (trtllm_rollout/trtllm_async_server.py)."""
    engine = ROLLOUT_ENGINES["trtllm"]
    assert not engine.holds_lora_adapter
    lora = {"model.lora.rank": 32, "rollout.load_format": "safetensors"}
    assert rollout_budget(trtllm_plan(**lora)).weights_bytes == rollout_budget(trtllm_plan()).weights_bytes
    assert not engine.sleep_copies_weights_to_host(trtllm_plan(**{"rollout.sleep_level": 1}).rollout)
    eager = trtllm_plan(**{"rollout.enforce_eager": True})
    assert cuda_graph_pool_bytes(eager, DEFAULT_PROFILE) > 0
    assert cuda_graph_pool_bytes(make_plan(overrides={"rollout.enforce_eager": True}), DEFAULT_PROFILE) == 0


def test_a_larger_trainer_resident_at_engine_start_shrinks_the_trtllm_pool():
    """TensorRT-LLM measures free memory on the whole device, so the trainer's parameters left on the GPU when verl
    builds the engine come out of its pool (in proportion to the fraction)."""
    offloaded = rollout_budget(trtllm_plan(**{"actor.param_offload": True, "actor.optimizer_offload": True}))
    resident = rollout_budget(trtllm_plan())
    assert offloaded.co_resident_bytes < resident.co_resident_bytes
    assert resident.kv_cache_bytes - offloaded.kv_cache_bytes == pytest.approx(
        -0.5 * (resident.co_resident_bytes - offloaded.co_resident_bytes), abs=8)


def test_a_trtllm_plan_is_priced_through_every_phase():
    report = predict_memory(trtllm_plan())
    rollout = next(phase for phase in report.phases if phase.name == "rollout")
    names = {component.name for component in rollout.components}
    assert {"trtllm_weights", "kv_cache", "cuda_graph_pool"} <= names
    assert report.kv_cache_tokens > 0 and report.kv_cache_tokens % 32 == 0

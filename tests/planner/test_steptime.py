"""The roofline step-time model (planner/steptime.py): it must order plans the way the hardware would."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlplan.planner.memory import predict_memory
from rlplan.planner.plan import Plan
from rlplan.planner.profile import DEFAULT_PROFILE
from rlplan.planner.steptime import StepTime, predict_step_time
from tests.planner.plans import QWEN25_7B, make_plan


def step_time(plan: Plan) -> StepTime:
    return predict_step_time(plan, predict_memory(plan), DEFAULT_PROFILE)


@st.composite
def knobs(draw):
    return {
        "model.gradient_checkpointing": draw(st.booleans()),
        "model.activation_offload": draw(st.booleans()),
        "model.lora.rank": draw(st.sampled_from([0, 32])),
        "actor.use_kl_loss": draw(st.booleans()),
        "algorithm.adv_estimator": draw(st.sampled_from(["grpo", "gae"])),
        "critic.ppo_micro_batch_size_per_gpu": 2,
        "rollout.tensor_model_parallel_size": draw(st.sampled_from([1, 2, 4])),
        "rollout.sleep_level": draw(st.sampled_from([1, 2])),
        "data.train_batch_size": draw(st.sampled_from([64, 256])),
    }


OFFLOADS = ["actor.param_offload", "actor.optimizer_offload", "ref.param_offload", "critic.param_offload",
            "critic.optimizer_offload"]


@settings(max_examples=40, deadline=None)
@given(base=knobs(), offload=st.sampled_from(OFFLOADS))
def test_offloading_never_makes_a_step_faster(base, offload):
    on, off = step_time(make_plan(overrides={**base, offload: True})), step_time(make_plan(overrides=base))
    assert on.total_seconds >= off.total_seconds
    plan = make_plan(overrides=base)
    moves_state = {
        # On GPUs verl offloads a separate reference whatever the key says: the key changes nothing there.
        "ref.param_offload": False,
        "critic.param_offload": plan.uses_critic,
        "critic.optimizer_offload": plan.uses_critic,
    }.get(offload, True)
    if moves_state:
        assert on.phase_seconds["offload"] > off.phase_seconds["offload"]


@settings(max_examples=40, deadline=None)
@given(base=knobs(), low=st.sampled_from([0.3, 0.4, 0.5]), raise_by=st.sampled_from([0.1, 0.2, 0.4]))
def test_more_kv_cache_never_slows_rollout(base, low, raise_by):
    slow = step_time(make_plan(overrides={**base, "rollout.gpu_memory_utilization": low}))
    fast = step_time(make_plan(overrides={**base, "rollout.gpu_memory_utilization": low + raise_by}))
    assert fast.phase_seconds["rollout"] <= slow.phase_seconds["rollout"]


def test_kv_limited_concurrency_makes_rollout_faster_when_it_binds():
    """4096 sequences over 8 replicas: the KV cache, not max_num_seqs, caps how many decode together."""
    overrides = {"data.train_batch_size": 512, "rollout.n": 8, "actor.ppo_mini_batch_size": 64,
                 "rollout.max_num_seqs": 1024, "data.max_response_length": 4096, "rollout.max_model_len": 4608}
    tight = make_plan(overrides={**overrides, "rollout.gpu_memory_utilization": 0.4})
    roomy = make_plan(overrides={**overrides, "rollout.gpu_memory_utilization": 0.8})
    tight_memory, roomy_memory = predict_memory(tight), predict_memory(roomy)
    assert tight_memory.max_concurrent_sequences < roomy_memory.max_concurrent_sequences < 512
    assert step_time(roomy).phase_seconds["rollout"] < 0.8 * step_time(tight).phase_seconds["rollout"]


def test_gradient_checkpointing_is_slower_per_token_but_fits_bigger_micro_batches():
    plain = make_plan(overrides={"model.gradient_checkpointing": False})
    checkpointed = make_plan(overrides={"model.gradient_checkpointing": True})
    assert step_time(checkpointed).phase_seconds["actor_update"] > step_time(plain).phase_seconds["actor_update"]
    assert (predict_memory(checkpointed).phase("actor_update").peak_bytes
            < predict_memory(plain).phase("actor_update").peak_bytes)


@settings(max_examples=40, deadline=None)
@given(base=knobs(), micro=st.sampled_from([1, 2, 4, 8]), gpus=st.sampled_from([8, 16]))
def test_smaller_micro_batches_never_make_an_update_faster(base, micro, gpus):
    """Each micro batch re-gathers the weights; fewer, bigger ones amortise the collectives.

    256 prompts x 4 over at most 16 GPUs leave >= 16 sequences per mini batch, so 2 x micro divides it.
    """
    def update_seconds(size):
        plan = make_plan(gpus=gpus, overrides={**base, "actor.ppo_micro_batch_size_per_gpu": size,
                                               "data.train_batch_size": 256, "actor.ppo_mini_batch_size": 64})
        return step_time(plan).phase_seconds["actor_update"]

    assert update_seconds(micro) >= update_seconds(2 * micro) * (1 - 1e-12)


def test_update_time_is_the_flop_roofline_when_collectives_hide():
    plan = make_plan(overrides={"model.gradient_checkpointing": False, "actor.ppo_micro_batch_size_per_gpu": 8})
    seconds = step_time(plan).phase_seconds["actor_update"]
    tokens_per_gpu = 64 * 4 * 1536 / 8
    flops = 3 * QWEN25_7B.forward_flops_per_token(768) * tokens_per_gpu
    roofline = flops / (plan.cluster.gpu.bf16_tflops * 1e12 * DEFAULT_PROFILE.training_mfu)
    assert seconds == pytest.approx(roofline, rel=0.01)


def test_decode_cannot_beat_reading_the_weights_once_per_token():
    plan = make_plan(overrides={"data.train_batch_size": 8, "rollout.n": 1, "actor.ppo_mini_batch_size": 8,
                                "actor.ppo_micro_batch_size_per_gpu": 1})
    one_sequence_per_replica = step_time(plan).phase_seconds["rollout"]
    gpu = plan.cluster.gpu
    weight_reads = 1024 * 2 * QWEN25_7B.total_params / (gpu.hbm_gbps * 1e9 * DEFAULT_PROFILE.decode_hbm_efficiency)
    assert one_sequence_per_replica >= weight_reads


def test_adapter_only_sync_is_faster_than_full_weights_and_sleep_level_one_costs_pcie():
    full = step_time(make_plan()).phase_seconds["weight_sync"]
    adapter = step_time(make_plan(overrides={"model.lora.rank": 32, "rollout.load_format": "safetensors"}))
    level_one = step_time(make_plan(overrides={"rollout.sleep_level": 1})).phase_seconds["weight_sync"]
    assert adapter.phase_seconds["weight_sync"] < full / 10
    assert level_one > full


def test_step_phases_mirror_the_memory_phases_plus_offload_traffic():
    plan = make_plan(overrides={"algorithm.adv_estimator": "gae", "critic.ppo_micro_batch_size_per_gpu": 2,
                                "actor.use_kl_loss": True})
    memory = predict_memory(plan)
    seconds = predict_step_time(plan, memory).phase_seconds
    assert set(seconds) == {p.name for p in memory.phases} | {"offload"}
    assert all(value >= 0 for value in seconds.values())
    assert predict_step_time(plan, memory).total_seconds == pytest.approx(sum(seconds.values()))


@settings(max_examples=30, deadline=None)
@given(base=knobs(), role=st.sampled_from(["actor", "critic"]))
def test_cpu_offload_policy_never_makes_a_step_faster_and_slows_its_roles_update(base, role):
    plan = make_plan(overrides=base)
    on = step_time(make_plan(overrides={**base, f"{role}.offload_policy": True}))
    off = step_time(plan)
    assert on.total_seconds >= off.total_seconds
    if role == "actor" or plan.uses_critic:
        # The optimizer steps on the CPU and every pass copies the host shards in.
        assert on.phase_seconds[f"{role}_update"] > off.phase_seconds[f"{role}_update"]

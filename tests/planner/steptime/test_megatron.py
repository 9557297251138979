"""Megatron's step time (planner/steptime/megatron.py): the pipeline bubble, TP's collectives, expert
parallelism's all-to-alls, context parallelism's ring, the distributed optimizer and recompute, each as the
formula says, and a Megatron plan priced through them."""

from __future__ import annotations

import math

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlplan.planner.knobs import apply_knobs
from rlplan.planner.memory import predict_memory
from rlplan.planner.memory.model_facts import model_facts
from rlplan.planner.plan import MegatronSection
from rlplan.planner.presets import resolve_model
from rlplan.planner.profile import DEFAULT_PROFILE
from rlplan.planner.steptime import predict_step_time
from rlplan.planner.steptime.megatron import (
    context_parallel_ring_seconds,
    expert_all_to_all_seconds,
    expert_tensor_parallel_seconds,
    gradient_sync_seconds,
    host_and_device_seconds,
    pipeline_bubble_fraction,
    recomputed_forward_fraction,
    routed_split_of,
    slowest_stage_flops,
    tensor_parallel_seconds,
    weight_sync_gather_seconds,
)
from rlplan.planner.steptime.rates import Rates
from tests.planner.plans import QWEN25_7B, make_plan

QWEN3_MOE = resolve_model("qwen3-30b-a3b").arch
BANDWIDTH = 100e9


def megatron_plan(arch=QWEN3_MOE, gpus: int = 8, **knobs):
    return apply_knobs(make_plan(arch, gpus=gpus, overrides={"actor.strategy": "megatron"}), knobs)


def step_seconds(plan) -> dict[str, float]:
    return {str(phase): seconds for phase, seconds in predict_step_time(plan, predict_memory(plan)).phase_seconds.items()}


@given(pp=st.integers(1, 16), vpp=st.integers(1, 8), micro_batches=st.integers(1, 512))
def test_the_bubble_shrinks_with_micro_batches_and_virtual_stages(pp, vpp, micro_batches):
    """Invariant: the 1F1B bubble is (PP-1)/(VPP m + PP-1): none without a pipeline, under 1 with one, and never
    larger with more micro batches per schedule or more model chunks per stage."""
    bubble = pipeline_bubble_fraction(pp, vpp, micro_batches)
    assert (bubble == 0.0) if pp == 1 else (0.0 < bubble < 1.0)
    assert pipeline_bubble_fraction(pp, vpp, micro_batches + 1) <= bubble
    assert pipeline_bubble_fraction(pp, vpp + 1, micro_batches) <= bubble
    assert math.isclose(pipeline_bubble_fraction(pp, vpp, micro_batches), (pp - 1) / (vpp * micro_batches + pp - 1))


def test_expert_all_to_alls_grow_with_ep_and_jump_when_the_group_leaves_the_node():
    rates = Rates(make_plan(gpus=32), DEFAULT_PROFILE)
    assert rates.internode < rates.intranode  # the network is slower than NVLink

    def seconds(ep: int, etp: int = 1) -> float:
        in_node = min(ep, rates.gpus_per_node // etp)
        return expert_all_to_all_seconds(4096, 2048, 8, 48, ep, in_node, rates.intranode, rates.internode)

    assert seconds(1) == 0.0
    within = [seconds(ep) for ep in (2, 4, 8)]
    assert within == sorted(within) and within[0] > 0
    # Dispatch and combine, each the token copies x (EP-1)/EP, per MoE layer, all over NVLink within a node.
    assert seconds(8) == pytest.approx(2 * 48 * 4096 * 8 * 2048 * 2 * 7 / 8 / rates.intranode)
    # Across nodes only the copies bound for the other nodes' ranks take the NIC: EP 16 on two nodes sends
    # half of them over the network, EP 32 on four three quarters.
    copies = 2 * 48 * 4096 * 8 * 2048 * 2
    assert seconds(16) == pytest.approx(copies * 8 / 16 / rates.internode)
    assert seconds(32) == pytest.approx(copies * 24 / 32 / rates.internode)
    assert seconds(16) > 2 * seconds(8)
    # ETP 2 leaves a node 4 EP ranks: EP 8 then crosses nodes.
    assert seconds(8, etp=2) == pytest.approx(copies * 4 / 8 / rates.internode)


@given(tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([2, 4, 8]), head_share=st.floats(0.0, 0.3))
def test_the_output_layer_runs_on_the_last_stage_alone(tp, pp, head_share):
    """Invariant: under PP the slowest stage does its share of the layers plus the whole output layer (over TP),
    never less than an even split of everything, and exactly the even split when there is no head."""
    flops = 1e15
    head = head_share * flops
    slowest = slowest_stage_flops(flops, head, 0.0, tp=tp, routed_split=tp, stage=1 / pp, pp=pp)
    assert slowest == pytest.approx((flops - head) / (tp * pp) + head / tp)
    assert slowest >= flops / (tp * pp) * (1 - 1e-12)
    assert slowest_stage_flops(flops, 0.0, 0.0, tp=tp, routed_split=tp, stage=1 / pp, pp=pp) == pytest.approx(flops / (tp * pp))
    # At PP 1 the rank runs every layer and the head: the TP split of all of it.
    assert slowest_stage_flops(flops, head, 0.0, tp=tp, routed_split=tp, stage=1.0, pp=1) == pytest.approx(flops / tp)


def test_a_pipeline_of_two_stages_slows_qwen_7bs_update():
    """verl_megatron_practice's DAPO-7B rows 7 and 12 (TP 4 against TP 4 x PP 2, 8 H100): the update took 11 %
    longer with the pipeline. Every GPU does the same FLOPs either way; the pipeline adds its bubble and puts
    the 545M-parameter output layer (152k vocabulary x 3584) on the last stage beside its 14 layers."""
    plan = megatron_plan(QWEN25_7B, **{"actor.megatron.tensor_model_parallel_size": 4})
    piped = apply_knobs(plan, {"actor.megatron.pipeline_model_parallel_size": 2})
    assert step_seconds(piped)["actor_update"] > step_seconds(plan)["actor_update"]


def test_expert_tensor_parallelism_gathers_and_scatters_the_received_tokens_per_moe_layer():
    assert expert_tensor_parallel_seconds(4096, 2048, 8, 48, 1, BANDWIDTH) == 0.0
    # All-gather and reduce-scatter over ETP of the ETP ranks' copies: (ETP - 1) x the rank's copies each.
    assert expert_tensor_parallel_seconds(4096, 2048, 8, 48, 4, BANDWIDTH) == pytest.approx(
        2 * 48 * 3 * 4096 * 8 * 2048 * 2 / BANDWIDTH)


def test_the_routed_experts_work_splits_over_tp_with_sequence_parallelism_whatever_the_etp():
    """Each TP rank dispatches its sequence slice: at ETP 1 it runs its experts on those copies whole, at ETP = TP
    on TP slices' copies at 1 / TP of each expert; without sequence parallelism only ETP splits the work."""
    assert routed_split_of(MegatronSection(tensor_model_parallel_size=4, sequence_parallel=True,
                                           expert_tensor_parallel_size=1)) == 4
    assert routed_split_of(MegatronSection(tensor_model_parallel_size=4, sequence_parallel=True,
                                           expert_tensor_parallel_size=4)) == 4
    assert routed_split_of(MegatronSection(tensor_model_parallel_size=4, sequence_parallel=False,
                                           expert_tensor_parallel_size=2)) == 2


def test_etp_tp_costs_more_than_etp_1_over_the_same_experts_per_rank():
    """ETP = TP at EP holds the state of ETP 1 at EP x TP and does the same FLOPs; it adds the ETP collectives."""
    etp1 = megatron_plan(gpus=16, **{"actor.megatron.tensor_model_parallel_size": 2,
                                     "actor.megatron.sequence_parallel": True,
                                     "actor.megatron.expert_model_parallel_size": 8,
                                     "actor.megatron.expert_tensor_parallel_size": 1})
    etp2 = apply_knobs(etp1, {"actor.megatron.expert_model_parallel_size": 4,
                              "actor.megatron.expert_tensor_parallel_size": 2})
    assert step_seconds(etp2)["old_log_prob"] > step_seconds(etp1)["old_log_prob"]


def test_tensor_parallel_collectives_are_two_all_reduces_per_layer_and_none_at_tp_1():
    assert tensor_parallel_seconds(4096, 4096, 32, 1, BANDWIDTH) == 0.0
    # An all-reduce (or sequence parallel's all-gather + reduce-scatter) moves 2 (TP-1)/TP of the activations.
    expected = 2 * 32 * 2 * 4096 * 4096 * 2 * (3 / 4) / BANDWIDTH
    assert tensor_parallel_seconds(4096, 4096, 32, 4, BANDWIDTH) == pytest.approx(expected)
    assert tensor_parallel_seconds(4096, 4096, 32, 8, BANDWIDTH) > tensor_parallel_seconds(4096, 4096, 32, 2, BANDWIDTH)


def test_context_parallel_ring_sends_kv_cp_minus_1_times_per_layer():
    assert context_parallel_ring_seconds(8192, 1024, 32, 1, BANDWIDTH) == 0.0
    assert context_parallel_ring_seconds(8192, 1024, 32, 4, BANDWIDTH) == pytest.approx(
        32 * 3 * 8192 * 2 * 1024 * 2 / BANDWIDTH)


def test_the_distributed_optimizer_moves_fewer_bytes_than_an_all_reduce_and_nothing_without_dp():
    distributed = gradient_sync_seconds(1e9, 8, BANDWIDTH, distributed_optimizer=True)
    all_reduce = gradient_sync_seconds(1e9, 8, BANDWIDTH, distributed_optimizer=False)
    # fp32 reduce-scatter + bf16 all-gather (6 bytes) against an fp32 all-reduce (8 bytes), x (DP-1)/DP.
    assert distributed == pytest.approx(6e9 * 7 / 8 / BANDWIDTH)
    assert all_reduce == pytest.approx(8e9 * 7 / 8 / BANDWIDTH)
    assert gradient_sync_seconds(1e9, 1, BANDWIDTH, distributed_optimizer=True) == 0.0


def test_recompute_repeats_the_whole_forward_a_block_of_it_or_only_the_attention_core():
    facts = model_facts(QWEN25_7B)  # 28 layers
    full = MegatronSection(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    block = MegatronSection(pipeline_model_parallel_size=2, recompute_granularity="full", recompute_method="block",
                            recompute_num_layers=7)
    selective = MegatronSection(recompute_granularity="selective")
    assert recomputed_forward_fraction(MegatronSection(), facts, 1024) == 0.0
    assert recomputed_forward_fraction(full, facts, 1024) == 1.0
    assert recomputed_forward_fraction(block, facts, 1024) == pytest.approx(7 / 14)
    assert 0.0 < recomputed_forward_fraction(selective, facts, 1024) < recomputed_forward_fraction(selective, facts,
                                                                                                   8192) < 1.0


def test_a_megatron_plan_prices_every_phase_and_full_recompute_slows_its_update():
    plan = megatron_plan(**{"actor.megatron.expert_model_parallel_size": 8})
    phases = step_seconds(plan)
    assert set(phases) >= {"weight_sync", "rollout", "old_log_prob", "actor_update", "offload"}
    assert all(math.isfinite(seconds) and seconds >= 0 for seconds in phases.values())
    assert phases["actor_update"] > 0 and phases["old_log_prob"] > 0 and phases["offload"] == 0.0
    # One knob at a time: the method and the layer count before the granularity that needs them.
    recompute = apply_knobs(plan, {"actor.megatron.recompute_method": "uniform",
                                   "actor.megatron.recompute_num_layers": 1,
                                   "actor.megatron.recompute_granularity": "full"})
    assert step_seconds(recompute)["actor_update"] > phases["actor_update"]


def test_expert_parallelism_across_nodes_slows_the_log_prob_pass_its_all_to_alls_cross():
    """A forward's only EP cost is its all-to-alls (an update's also shrinks the experts' gradient sync and
    optimizer shard, so EP 16 may still win it): on 2 nodes EP 16 sends half of them over the network
    (verl_megatron_practice's Qwen3-30B-A3B rows 3 and 4 on 16 H100: 63 s against 41 s)."""
    within = megatron_plan(gpus=16, **{"actor.megatron.expert_model_parallel_size": 8})
    across = megatron_plan(gpus=16, **{"actor.megatron.expert_model_parallel_size": 16})
    assert step_seconds(across)["old_log_prob"] > step_seconds(within)["old_log_prob"]


def test_the_weight_sync_gathers_tp_ep_and_pp_shards_and_an_unmerged_adapter_alone():
    plan = megatron_plan(QWEN25_7B, **{"actor.megatron.tensor_model_parallel_size": 2})
    rates = Rates(plan, DEFAULT_PROFILE)
    piped = apply_knobs(plan, {"actor.megatron.pipeline_model_parallel_size": 2})
    assert weight_sync_gather_seconds(piped, Rates(piped, DEFAULT_PROFILE)) > weight_sync_gather_seconds(plan, rates)
    assert weight_sync_gather_seconds(megatron_plan(QWEN25_7B), rates) == 0.0  # TP 1, PP 1: every rank has it all
    adapter = apply_knobs(plan, {"model.lora.rank": 32})
    assert 0 < weight_sync_gather_seconds(adapter, rates) < weight_sync_gather_seconds(plan, rates)


def test_megatrons_offload_moves_the_state_over_pcie_between_phases():
    plan = megatron_plan(**{"actor.megatron.expert_model_parallel_size": 8})
    offloaded = apply_knobs(plan, {"actor.megatron.param_offload": True, "actor.megatron.optimizer_offload": True})
    assert step_seconds(offloaded)["offload"] > 0.0


def test_megatron_bridge_lora_with_megatrons_module_names_trains_only_its_adapter():
    """The adapter named by Megatron's linear_qkv / linear_proj / linear_fc1 / linear_fc2 (verl's Megatron LoRA
    examples) is a fraction of the model: a frozen base's backward and a sync of the adapter alone."""
    plan = megatron_plan(QWEN25_7B, **{"actor.megatron.tensor_model_parallel_size": 2, "model.lora.rank": 32,
                                       "model.lora.target_modules": ["linear_qkv", "linear_proj", "linear_fc1",
                                                                     "linear_fc2"]})
    full = apply_knobs(plan, {"model.lora.rank": 0})
    assert step_seconds(plan)["actor_update"] < step_seconds(full)["actor_update"]
    rates = Rates(plan, DEFAULT_PROFILE)
    assert 0 < weight_sync_gather_seconds(plan, rates) < weight_sync_gather_seconds(full, rates)


@given(st.floats(0.0, 1e4), st.floats(0.0, 1e4))
def test_a_dense_pass_takes_the_longer_of_its_kernels_and_their_launches_and_a_moe_pass_both(device, host):
    """CUDA runs launched kernels while the host launches the next ones (a dense pass overlaps them); Megatron's
    MoE token dispatcher syncs the host with the GPU once a layer, so a MoE pass adds them up."""
    dense = host_and_device_seconds(device, host, routes_tokens=False)
    assert dense == max(device, host)
    assert host_and_device_seconds(device, host, routes_tokens=True) == device + host >= dense


def test_a_dense_megatron_update_of_small_micro_batches_is_bound_by_its_launches():
    """NV's GRPO-7B table (benchmarks/data/steptime_sweeps_megatron.toml): two-sequence micro batches make the
    TP 4 update launch-bound, so at a fixed micro-batch count its seconds do not move with the MFU."""
    plan = megatron_plan(QWEN25_7B, **{"actor.megatron.tensor_model_parallel_size": 4,
                                       "actor.use_dynamic_bsz": False, "actor.ppo_micro_batch_size_per_gpu": 1,
                                       "data.expected_prompt_length": 100, "data.expected_response_length": 100})
    memory = predict_memory(plan)
    fast, slow = (predict_step_time(plan, memory, attrs.evolve(DEFAULT_PROFILE, training_mfu=mfu)).phase_seconds
                  for mfu in (0.5, 0.4))
    assert fast["actor_update"] == pytest.approx(slow["actor_update"], rel=1e-9)

"""SGLang rollouts: import, memory model (mem_fraction_static, paused regions) and multi-stage wake-up."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from rlplan.planner.hardware import Cluster
from rlplan.planner.memory import predict_memory
from rlplan.planner.memory.rollout import rollout_budget
from rlplan.planner.plan import ActorSection, DataSection, ModelSection, Plan, RolloutSection
from rlplan.planner.presets import resolve_gpu, resolve_model
from rlplan.planner.render import verl_overrides
from rlplan.planner.rules import check_plan
from rlplan.planner.solver import SolveRequest, solve_engines
from rlplan.planner.solver.rollout import solve_rollout
from rlplan.planner.stack import StackSection
from rlplan.planner.verl_import import import_verl_script
from tests.planner.plans import make_plan
from tests.planner.test_verl_ground_truth import GSM8K_PROMPT_MEAN

SCRIPTS = Path(__file__).resolve().parents[1] / "data" / "verl_scripts"
GB = 1e9


def h200_plan(model: str, *, util: float, multi_stage_wake_up: bool = True, offload: bool = True,
              max_num_seqs: int = 256) -> Plan:
    resolved = resolve_model(model)
    return Plan(
        model=ModelSection(name=resolved.name, arch=resolved.arch, path=resolved.path),
        cluster=Cluster(gpu=resolve_gpu("h200"), gpus_per_node=8),
        data=DataSection(train_batch_size=64, max_prompt_length=1024, max_response_length=1024),
        actor=ActorSection(ppo_mini_batch_size=16, ppo_micro_batch_size_per_gpu=1, param_offload=offload,
                           optimizer_offload=offload),
        rollout=RolloutSection(n=4, name="sglang", tensor_model_parallel_size=1, gpu_memory_utilization=util,
                               multi_stage_wake_up=multi_stage_wake_up, max_num_seqs=max_num_seqs,
                               log_prob_micro_batch_size_per_gpu=2),
    )


def with_engine(plan: Plan, name: str) -> Plan:
    return plan.evolve(rollout=attrs.evolve(plan.rollout, name=name))


def on_sglang(plan: Plan, version: str) -> Plan:
    return with_engine(plan, "sglang").evolve(stack=StackSection(verl=plan.stack.verl, sglang=version))


def test_sglang_kv_pool_is_the_static_fraction_less_weights_and_what_the_release_charges_before_the_load():
    """mem_fraction_static leaves SGLang's activations (and CUDA graphs) outside the pool, unlike vLLM's util; what
    was in use before the load (the context, verl's resident trainer state) comes out whole up to 0.5.9 and in
    proportion from 0.5.10 (memory/rollout.py sglang_kv_cache_bytes; docs/verl-versions.md)."""
    vllm = rollout_budget(make_plan())
    old, new = (rollout_budget(on_sglang(make_plan(), version)) for version in ("0.5.9", "0.5.12"))
    for sglang in (old, new):
        assert sglang.requested_bytes == vllm.requested_bytes and sglang.weights_bytes == vllm.weights_bytes
    assert old.co_resident_bytes > 0 and old.fraction_of_free is None
    assert old.kv_cache_bytes == old.requested_bytes - old.weights_bytes - old.non_torch_bytes - old.co_resident_bytes
    assert new.fraction_of_free == make_plan().rollout.gpu_memory_utilization
    assert new.kv_cache_bytes == pytest.approx(new.requested_bytes - new.weights_bytes
                                               - new.fraction_of_free * (new.non_torch_bytes + new.co_resident_bytes))
    # vLLM 0.24 charges only what its instance adds, its profiled activation included.
    assert old.kv_cache_bytes - vllm.kv_cache_bytes == vllm.activation_bytes - old.co_resident_bytes
    # ... and the buffers SGLang leaves outside mem_fraction_static still count in the rollout phase.
    rollout = predict_memory(with_engine(make_plan(), "sglang")).phase("rollout")
    assert {c.name: c.bytes for c in rollout.components}["sglang_activation"] == new.activation_bytes > 0


def test_paused_sglang_keeps_only_its_context_and_cuda_graphs_during_training():
    report = predict_memory(with_engine(make_plan(), "sglang"))
    names = {c.name for c in report.phase("actor_update").components}
    assert {"sglang_context", "cuda_graph_pool"} <= names
    assert not names & {"sglang_weights", "kv_cache", "sglang_activation"}


def test_without_multi_stage_wake_up_the_weight_sync_also_holds_the_kv_cache():
    staged = predict_memory(make_plan()).phase("weight_sync")
    unstaged_report = predict_memory(make_plan(overrides={"rollout.multi_stage_wake_up": False}))
    unstaged = unstaged_report.phase("weight_sync")
    assert "kv_cache" not in {c.name for c in staged.components}
    assert unstaged.peak_bytes - staged.peak_bytes == unstaged_report.kv_cache_bytes > 0
    assert any("multi_stage_wake_up" in note for note in unstaged_report.notes)


def test_blog_qwen25_32b_at_0_9_on_8_h200_fits_with_multi_stage_wake_up_and_not_without():
    # SGLang/verl memory blog and sglang issue 7009 (memory-model.md 5.6, G11): Qwen 32B, mem fraction 0.9.
    staged = predict_memory(h200_plan("qwen2.5-32b", util=0.9))
    unstaged = predict_memory(h200_plan("qwen2.5-32b", util=0.9, multi_stage_wake_up=False))
    assert staged.fits
    assert not unstaged.fits
    assert unstaged.binding_constraint.where == "weight_sync"
    # G11's logged peak with the staged wake is 131.8 "GB" (the rollout, KV resumed last); the log does
    # not say whether it means 10^9 or 2^30 bytes, so the bound spans both readings with 5% either side.
    assert staged.peak_phase.name == "rollout"
    assert 0.95 * 131.8 * GB <= staged.gpu_peak_bytes <= 1.05 * 131.8 * 2**30


@pytest.mark.parametrize("util", [0.6, 0.7])
def test_blog_qwen25_7b_fsdp8_h200_rollout_breakdown_within_the_blogs_ranges(util):
    # Blog G13 (an estimate): rollout weights 15.4 + KV 60-90 + CUDA graphs 1-3 + buffers 3-7 = 80-115 GB.
    # Weights + KV = 75-105 GB is a static fraction of 0.54-0.75 of an H200; max_num_seqs 1024 is verl's
    # RolloutConfig default (verl/workers/config/rollout.py), passed to SGLang as max_running_requests.
    rollout = predict_memory(h200_plan("qwen2.5-7b", util=util, offload=False, max_num_seqs=1024)).phase("rollout")
    by_name = {c.name: c.bytes for c in rollout.components}
    assert 14.9 * GB <= by_name["sglang_weights"] <= 15.9 * GB
    assert 60 * GB <= by_name["kv_cache"] <= 90 * GB
    assert 1 * GB <= by_name["cuda_graph_pool"] <= 3 * GB
    assert 3 * GB <= by_name["sglang_activation"] + by_name["sglang_non_torch"] <= 7 * GB
    engine = sum(b for name, b in by_name.items() if name.startswith("sglang_") or name in ("kv_cache",
                                                                                            "cuda_graph_pool"))
    assert 80 * GB <= engine <= 115 * GB


def import_multiturn_example():
    return import_verl_script((SCRIPTS / "sglang_multiturn_qwen2.5_3b.sh").read_text(), gpu=resolve_gpu("h100-80g"),
                              host_memory_gib=512.0, env={"PROJECT_DIR": "/verl", "HOME": "/home/u"},
                              local_config_reader=lambda p: None)


def test_verl_sglang_multiturn_example_imports_validates_and_fits_on_8_h100_as_it_ran():
    plan = import_multiturn_example().plan
    assert plan.rollout.name == "sglang" and plan.rollout.multi_stage_wake_up
    assert plan.rollout.gpu_memory_utilization == 0.85 and plan.rollout.n == 16
    assert not check_plan(plan).errors
    # It ran on GSM8K, whose prompts average ~105 tokens (test_verl_ground_truth.GSM8K_PROMPT_MEAN): priced
    # with every response at its 1024-token maximum, it fits.
    gsm8k = plan.evolve(data=attrs.evolve(plan.data, expected_prompt_length=GSM8K_PROMPT_MEAN))
    assert predict_memory(gsm8k).fits
    # 32 fixed micro-batch sequences of 2048 tokens would not: verl's in-place temperature's backward holds
    # four bf16 logits buffers of 65536 x 151936 (20 GB each) at the update's loss head.
    at_maximum = predict_memory(plan)
    assert not at_maximum.fits and at_maximum.binding_constraint.where == "actor_update"


def test_sglang_plan_renders_its_engine_and_wake_up_keys_back_to_verl():
    overrides = verl_overrides(import_multiturn_example().plan)
    assert "actor_rollout_ref.rollout.name=sglang" in overrides
    assert "actor_rollout_ref.rollout.multi_stage_wake_up=true" in {o.lower() for o in overrides}


def test_lora_with_sglang_is_an_error_unless_verl_merges_the_adapter():
    lora = with_engine(make_plan(overrides={"model.lora.rank": 32, "rollout.load_format": "safetensors"}), "sglang")
    assert "sglang_lora_needs_merged_adapter" in {v.rule for v in check_plan(lora).errors}
    merged = lora.evolve(passthrough={"actor_rollout_ref.model.lora.merge": "true"})
    assert "sglang_lora_needs_merged_adapter" not in {v.rule for v in check_plan(merged).violations}
    # The same plan on vLLM serves the adapter itself.
    assert "sglang_lora_needs_merged_adapter" not in {v.rule for v in check_plan(with_engine(lora, "vllm")).violations}


def test_vllm_only_rollout_keys_warn_with_sglang_and_not_with_vllm():
    plan = make_plan(overrides={"rollout.enable_prefix_caching": False, "rollout.max_num_batched_tokens": 16384})
    sglang = [v for v in check_plan(with_engine(plan, "sglang")).violations if v.rule == "sglang_ignores_vllm_keys"]
    assert len(sglang) == 1 and sglang[0].severity == "warning"
    assert "enable_prefix_caching" in sglang[0].message and "max_num_batched_tokens" in sglang[0].message
    assert not [v for v in check_plan(plan).violations if v.rule == "sglang_ignores_vllm_keys"]


def sync_bound_request(plan: Plan, pins: dict) -> SolveRequest:
    # At the GPU's edge (no margin), as G11 published its fit / OOM verdicts: these cases are about the wake-up.
    from rlplan.planner.model_error import Headroom

    return SolveRequest(model=plan.model, cluster=plan.cluster, prompt_len=1024, response_len=1024,
                        train_batch_size=64, n=4, pins={"rollout.gpu_memory_utilization": 0.9, **pins}, base=plan,
                        headroom=Headroom(gib=0.0))


def test_solver_turns_multi_stage_wake_up_on_only_when_it_is_the_difference_between_fitting_and_oom():
    unstaged = h200_plan("qwen2.5-32b", util=0.9, multi_stage_wake_up=False)
    solved = solve_rollout(unstaged, 1, sync_bound_request(unstaged, {}))
    assert solved is not None and solved.rollout.multi_stage_wake_up
    # Pinned off, the same rollout does not fit.
    assert solve_rollout(unstaged, 1, sync_bound_request(unstaged, {"rollout.multi_stage_wake_up": False})) is None
    # Where the unstaged sync fits (a 7B model), the plan's own setting is kept.
    small = h200_plan("qwen2.5-7b", util=0.9, multi_stage_wake_up=False)
    kept = solve_rollout(small, 1, sync_bound_request(small, {}))
    assert kept is not None and not kept.rollout.multi_stage_wake_up


@pytest.mark.parametrize("engines", [("sglang",), ("vllm", "sglang")])
def test_solve_engines_returns_a_valid_fitting_plan_on_one_of_the_engines_asked(engines):
    request = SolveRequest(model=ModelSection(name="qwen2.5-7b", arch=resolve_model("qwen2.5-7b").arch),
                           cluster=Cluster(gpu=resolve_gpu("h200"), gpus_per_node=8), prompt_len=512,
                           response_len=1024, train_batch_size=64, n=4, lora=0)
    result = solve_engines(request, engines)
    assert result.plan is not None and result.plan.rollout.name in engines
    assert not check_plan(result.plan).errors and predict_memory(result.plan).fits
    if len(engines) == 2:
        single = [solve_engines(request, (engine,)) for engine in engines]
        assert result.evaluated == sum(r.evaluated for r in single)


def test_dp_attention_without_rollout_dp_warns_because_sglang_drops_it():
    plan = with_engine(make_plan(), "sglang").evolve(
        passthrough={"actor_rollout_ref.rollout.engine_kwargs.sglang.enable_dp_attention": "true"})
    assert "sglang_dp_attention_needs_rollout_dp" in {v.rule for v in check_plan(plan).warnings}
    with_dp = plan.evolve(passthrough={**plan.passthrough, "actor_rollout_ref.rollout.data_parallel_size": "2"})
    assert "sglang_dp_attention_needs_rollout_dp" not in {v.rule for v in check_plan(with_dp).violations}


@pytest.mark.parametrize("prefix", ["", "+", "++"])
def test_sglang_rules_read_keys_written_with_hydras_add_prefixes(prefix):
    """Real scripts add keys verl's YAML lacks with `+key=`; the import keeps the prefix in the passthrough."""
    lora = with_engine(make_plan(overrides={"model.lora.rank": 32, "rollout.load_format": "safetensors"}), "sglang")
    merged = lora.evolve(passthrough={f"{prefix}actor_rollout_ref.model.lora.merge": "True"})
    assert "sglang_lora_needs_merged_adapter" not in {v.rule for v in check_plan(merged).violations}
    dp_attention = with_engine(make_plan(), "sglang").evolve(
        passthrough={f"{prefix}actor_rollout_ref.rollout.engine_kwargs.sglang.enable_dp_attention": "True"})
    assert "sglang_dp_attention_needs_rollout_dp" in {v.rule for v in check_plan(dp_attention).warnings}
    with_dp = dp_attention.evolve(passthrough={**dp_attention.passthrough,
                                               f"{prefix}actor_rollout_ref.rollout.data_parallel_size": "2"})
    assert "sglang_dp_attention_needs_rollout_dp" not in {v.rule for v in check_plan(with_dp).violations}


def test_an_imported_sglang_script_with_plus_keys_gets_the_merge_and_the_dp_attention_warning():
    script = ("python3 -m verl.trainer.main_ppo actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct "
              "actor_rollout_ref.rollout.name=sglang actor_rollout_ref.model.lora_rank=16 "
              "+actor_rollout_ref.model.lora.merge=true "
              "+actor_rollout_ref.rollout.engine_kwargs.sglang.enable_dp_attention=True\n")
    plan = import_verl_script(script, gpu=resolve_gpu("h100-80g"), host_memory_gib=512.0, env={},
                              local_config_reader=lambda p: None).plan
    report = check_plan(plan)
    assert "sglang_lora_needs_merged_adapter" not in {v.rule for v in report.violations}
    assert "sglang_dp_attention_needs_rollout_dp" in {v.rule for v in report.warnings}


def test_vllms_scheduler_rule_does_not_judge_an_sglang_plan():
    """verl passes SGLang neither max_num_batched_tokens nor enable_chunked_prefill."""
    plan = make_plan(overrides={"rollout.enable_chunked_prefill": False, "rollout.max_num_batched_tokens": 256,
                                "rollout.max_num_seqs": 512})
    assert "batched_tokens_cover_sequences" in {v.rule for v in check_plan(plan).errors}
    assert "batched_tokens_cover_sequences" not in {v.rule for v in check_plan(with_engine(plan, "sglang")).violations}

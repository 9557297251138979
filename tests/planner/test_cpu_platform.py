"""The CPU as a platform (issue 12): `solve --device cpu`, vLLM CPU's KV space, the machine's rates, the demo's table."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest
from typer.testing import CliRunner

from rlplan.planner.commands.cli import app
from rlplan.planner.commands.this_machine import cpu_cluster, this_machine_cpu
from rlplan.planner.hardware import estimate_cpu_rates
from rlplan.planner.knobs import knob_value
from rlplan.planner.layout import plan_layout
from rlplan.planner.memory import GIB, predict_memory
from rlplan.planner.memory.rollout import rollout_budget, vllm_cpu_kv_space_gib
from rlplan.planner.planfile import plan_from_toml
from rlplan.planner.platform import CPU_RUNTIME_PINS
from rlplan.planner.profile import DEFAULT_PROFILE
from rlplan.planner.steptime import predict_step_time
from tests.planner.plans import make_plan

runner = CliRunner()
DEMO_RUN = Path(__file__).resolve().parents[1] / "data" / "cpu_demo_run"
SOLVE_TINY = ("solve", "--model", "qwen2.5-0.5b", "--prompt-len", "48", "--response-len", "64",
              "--train-batch-size", "8", "--n", "8", "--lora", "off", "--host-mem", "64")


def _cpuinfo(processors: int, flags: str, mhz: str = "2600.000") -> str:
    block = "processor\t: {i}\nmodel name\t: test cpu\ncpu MHz\t\t: {mhz}\nflags\t\t: {flags}\n"
    return "\n".join(block.format(i=i, mhz=mhz, flags=flags) for i in range(processors))


def _on_this_cpu(plan, ranks: int = 2, host_gib: float = 16.0):
    cluster, _ = cpu_cluster(ranks, host_gib)
    return plan.evolve(cluster=cluster)


def test_cpu_estimate_is_cores_times_clock_times_fp32_lanes_and_nonzero():
    avx512 = estimate_cpu_rates(_cpuinfo(2, "fpu sse2 avx avx2 avx512f amx_tile"))
    avx2 = estimate_cpu_rates(_cpuinfo(2, "fpu sse2 avx avx2"))
    assert avx512.tflops == pytest.approx(2 * 2.6 * 32 / 1000)
    assert avx2.tflops == pytest.approx(avx512.tflops / 2)
    assert avx512.cores == 2 and avx512.gbps > 0
    assert "estimated" in avx512.source
    # The bf16 rate follows the CPU's bf16 support: native (AVX512-BF16, AMX) beats fp32, emulated loses to it.
    native = estimate_cpu_rates(_cpuinfo(2, "fpu sse2 avx avx2 avx512f avx512_bf16"))
    amx = estimate_cpu_rates(_cpuinfo(2, "fpu sse2 avx avx2 avx512f amx_tile amx_bf16"))
    assert native.bf16_tflops > native.tflops and amx.bf16_tflops > amx.tflops
    assert avx2.bf16_tflops < avx2.tflops and avx512.bf16_tflops < avx512.tflops
    assert "avx512_bf16" in native.source and "no native bf16" in avx2.source
    # The affinity mask narrows the cores; an unreadable cpuinfo still gives a positive (stated) estimate.
    assert estimate_cpu_rates(_cpuinfo(8, "avx2"), cores=2).tflops == pytest.approx(avx2.tflops)
    assert estimate_cpu_rates("").tflops > 0


def test_measured_rates_from_a_calibrated_profile_replace_the_estimate():
    profile = attrs.evolve(DEFAULT_PROFILE, cpu_measured_tflops=0.05, cpu_measured_bf16_tflops=0.11,
                           cpu_measured_gbps=12.0)
    rates = this_machine_cpu(profile)
    assert (rates.tflops, rates.bf16_tflops, rates.gbps) == (0.05, 0.11, 12.0) and "measured" in rates.source
    # A profile measured before bf16 was: the estimate's bf16/fp32 ratio on the measured fp32 rate.
    estimate = this_machine_cpu(DEFAULT_PROFILE)
    older = this_machine_cpu(attrs.evolve(profile, cpu_measured_bf16_tflops=0.0))
    assert older.bf16_tflops == pytest.approx(0.05 * estimate.bf16_tflops / estimate.tflops)
    assert "estimated" in this_machine_cpu(DEFAULT_PROFILE).source


def test_ranks_share_the_machine_rates_and_host_memory():
    one, rates = cpu_cluster(1, 16.0)
    two, _ = cpu_cluster(2, 16.0)
    assert one.gpu.is_cpu and one.gpu.bf16_tflops == pytest.approx(rates.bf16_tflops)
    assert one.gpu.tflops("float32") == pytest.approx(rates.tflops)
    assert two.gpu.bf16_tflops == pytest.approx(rates.bf16_tflops / 2) and two.gpu.memory_gib == 8.0
    assert two.gpu.tflops("float32") == pytest.approx(rates.tflops / 2)
    assert two.world_size == 2


def test_cpu_kv_budget_is_vllm_cpu_kvcache_space_whatever_gpu_memory_utilization():
    plan = _on_this_cpu(make_plan())
    budget = rollout_budget(plan)
    assert budget.kv_cache_bytes == vllm_cpu_kv_space_gib(plan) * GIB
    # vLLM CPU's default block (128 tokens), not the GPU engine's 16.
    assert budget.block_size == DEFAULT_PROFILE.cpu_block_size == 128
    assert budget.kv_cache_tokens % 128 == 0
    lower = plan.evolve(rollout=attrs.evolve(plan.rollout, gpu_memory_utilization=0.1))
    assert rollout_budget(lower).kv_cache_bytes == budget.kv_cache_bytes


def test_cpu_kv_space_is_whole_gib_for_every_concurrent_sequence_capped_by_host_memory():
    plan = _on_this_cpu(make_plan())
    per_sequence = plan.rollout.max_model_len or plan.data.max_sequence_length
    needed = plan.rollout.max_num_seqs * per_sequence * plan.model.arch.kv_cache_bytes_per_token()
    assert vllm_cpu_kv_space_gib(plan) == min(4, max(1, -(-needed // GIB)))


def test_cpu_phases_are_processes_trainer_phases_hold_no_engine_and_the_rollout_no_trainer_state():
    report = predict_memory(_on_this_cpu(make_plan()))
    trainer_names = {c.name for c in report.phase("actor_update").components}
    rollout_names = {c.name for c in report.phase("rollout").components}
    assert "cpu_process_baseline" in trainer_names
    assert not trainer_names & {"kv_cache", "vllm_weights", "cuda_context_and_nccl", "fragmentation_reserve"}
    assert rollout_names == {"vllm_weights", "kv_cache", "cpu_engine_received_weights", "vllm_cpu_process_baseline"}
    assert any(c.name == "vllm_cpu_engine" for c in report.host.components)


def test_cpu_step_time_estimate_is_nonzero_and_slower_than_an_h100():
    plan = _on_this_cpu(make_plan())
    cpu_seconds = predict_step_time(plan, predict_memory(plan)).total_seconds
    gpu_plan = make_plan()
    assert cpu_seconds > 0
    assert cpu_seconds > 100 * predict_step_time(gpu_plan, predict_memory(gpu_plan)).total_seconds


def test_an_on_policy_cpu_step_is_priced_without_the_old_log_prob_pass_that_the_runtime_skips():
    def phases(plan):
        return predict_step_time(plan, predict_memory(plan)).phase_seconds

    # One mini batch of the 64-prompt batch and one epoch, against two mini batches.
    on_policy = make_plan(overrides={"actor.ppo_mini_batch_size": 64})
    two_minis = make_plan(overrides={"actor.ppo_mini_batch_size": 32})
    assert "old_log_prob" not in phases(_on_this_cpu(on_policy))
    assert "old_log_prob" in phases(_on_this_cpu(two_minis))
    # verl runs the pass on GPUs whatever the update does.
    assert "old_log_prob" in phases(on_policy)


@pytest.mark.parametrize("device_args", [("--device", "cpu"), ("--gpu", "cpu")])
def test_solve_device_cpu_writes_a_runnable_cpu_plan(tmp_path, device_args):
    out = tmp_path / "plan.toml"
    result = runner.invoke(app, [*SOLVE_TINY, *device_args, "--gpus", "2", "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert "estimated from /proc/cpuinfo" in payload["cpu_rates"]
    plan = plan_from_toml(out.read_text())
    assert plan.cluster.gpu.is_cpu and plan.cluster.gpus_per_node == 2 and plan.cluster.host_memory_gib == 64
    assert plan.cluster.gpu.memory_gib == 32 and plan.cluster.gpu.bf16_tflops < 10
    for knob, value in CPU_RUNTIME_PINS.items():
        assert knob_value(plan, knob) == value, knob
    assert plan.prediction is not None and plan.prediction.step_time_s > 0


def test_solve_device_cpu_with_a_gpu_is_bad_input():
    result = runner.invoke(app, [*SOLVE_TINY, "--device", "cpu", "--gpu", "h100-80g"])
    assert result.exit_code == 2
    assert "--device" in result.output
    result = runner.invoke(app, [*SOLVE_TINY, "--device", "tpu", "--gpus", "1"])
    assert result.exit_code == 2


def test_the_built_in_demo_prediction_is_never_under_a_recorded_cpu_run():
    """The demo's plan-versus-actual table with the built-in baselines: an upper bound on a real run's RSS."""
    from rlplan.runtime.measure import with_runtime_head  # what runtime.metrics prices; imports no torch
    from rlplan.runtime.metrics import prediction_bound, prediction_error, prediction_verdict

    plan = plan_from_toml((DEMO_RUN / "plan.toml").read_text())
    measured = json.loads((DEMO_RUN / "measured.json").read_text())
    assert measured["memory_measure"] == "cpu_process_rss_sampled_peak"
    predicted = {p.name: p.peak_bytes / GIB for p in predict_memory(with_runtime_head(plan)).phases}
    assert set(predicted) == set(measured["measured_peak_gib"])
    for phase, gib in measured["measured_peak_gib"].items():
        error = prediction_error(predicted[phase], gib)
        assert prediction_verdict(error, prediction_bound(DEFAULT_PROFILE)) == "holds", (phase, predicted[phase], gib)


@pytest.mark.parametrize(("phase", "measured_gib"), [
    # issue 27's report of `nox -s demo` on another AVX-512-BF16 EPYC: trainer phases 0.77-0.79, rollout 1.97.
    ("actor_update", 0.79), ("old_log_prob", 0.77), ("rollout", 1.97),
    # this project's 2-core EPYC, 2026-11-25 (4 steps of `rlplan demo`, fresh environment).
    ("actor_update", 0.67), ("old_log_prob", 0.66), ("rollout", 1.90),
    # the 2-core AVX2-only EPYC, 2026-11-29 (issue 42: 3 steps of `rlplan demo`).
    ("actor_update", 0.605), ("weight_sync", 0.600), ("rollout", 1.843),
])
def test_the_demo_prediction_holds_for_the_rss_measured_on_each_cpu_it_ran_on(phase, measured_gib):
    """Invariant: never under by more than the bound's 5 %: the plan is an upper bound on every CPU measured."""
    from rlplan.runtime.measure import with_runtime_head
    from rlplan.runtime.metrics import prediction_bound, prediction_error, prediction_verdict

    plan = plan_from_toml((DEMO_RUN / "plan.toml").read_text())
    predicted = {p.name: p.peak_bytes / GIB for p in predict_memory(with_runtime_head(plan)).phases}
    error = prediction_error(predicted[phase], measured_gib)
    assert prediction_verdict(error, prediction_bound(DEFAULT_PROFILE)) == "holds", predicted[phase]


def test_cpu_rollout_is_one_engine_on_the_whole_machine_whatever_the_trainer_ranks():
    # Four sequences of a 7B model decode bound by reading the weights: two engines would each read them
    # at half the bandwidth for half the sequences, twice as slow.
    small = make_plan(overrides={"data.train_batch_size": 2, "rollout.n": 2, "actor.ppo_mini_batch_size": 2})
    one, two = _on_this_cpu(small, ranks=1), _on_this_cpu(small, ranks=2)
    rollout = [predict_step_time(p, predict_memory(p)).phase_seconds["rollout"] for p in (one, two)]
    assert rollout[0] > 0
    assert rollout[1] == pytest.approx(rollout[0])


def test_cpu_solve_sizes_the_one_engine_for_every_sequence_of_the_step(tmp_path):
    # The runtime starts one engine for the whole machine, so max_num_seqs below the step's 64 sequences
    # would make it generate in two waves (it did: 32, sized as if each of the 2 ranks had an engine).
    out = tmp_path / "plan.toml"
    result = runner.invoke(app, [*SOLVE_TINY, "--device", "cpu", "--gpus", "2", "-o", str(out)])
    assert result.exit_code == 0, result.output
    plan = plan_from_toml(out.read_text())
    assert plan_layout(plan).parallel.rollout_replicas == 1
    assert plan.rollout.max_num_seqs == plan.data.train_batch_size * plan.rollout.n == 64


def _cpu_request(flags: str, **pins):
    from rlplan.planner.plan import ModelSection
    from rlplan.planner.presets import model_presets
    from rlplan.planner.solver import SolveRequest

    rates = estimate_cpu_rates(_cpuinfo(2, flags))
    model = model_presets()["qwen2.5-0.5b"]
    cluster = rates.cluster(2, 64.0)
    return SolveRequest(model=ModelSection(name=model.name, path=model.repo_ids[0], arch=model.arch), cluster=cluster, prompt_len=48,
                        response_len=64, train_batch_size=8, n=8, lora="off", pins={**CPU_RUNTIME_PINS, **pins})


def _compute_dtypes(plan):
    return {plan.actor.compute_dtype, plan.ref.compute_dtype, plan.critic.compute_dtype, plan.rollout.dtype}


def test_cpu_solve_computes_in_bf16_where_the_cpu_has_native_bf16_and_in_fp32_where_it_is_emulated():
    from rlplan.planner.solver import solve

    native = solve(_cpu_request("fpu sse2 avx avx2 avx512f avx512_bf16")).plan
    emulated = solve(_cpu_request("fpu sse2 avx avx2")).plan
    assert native is not None and emulated is not None
    # The trainer roles and the engine together: the engine samples the policy the trainer scores.
    assert _compute_dtypes(native) == {"bfloat16"}
    assert _compute_dtypes(emulated) == {"float32"}
    # A pinned trainer dtype is kept, and the engine follows it.
    pinned = solve(_cpu_request("fpu sse2 avx avx2 avx512f avx512_bf16", **{"actor.compute_dtype": "float32"})).plan
    assert pinned is not None and _compute_dtypes(pinned) == {"float32"}


def test_cpu_step_time_prices_each_pass_at_its_compute_dtypes_rate():
    def phases(flags: str, dtype: str) -> dict[str, float]:
        cluster = estimate_cpu_rates(_cpuinfo(2, flags)).cluster(2, 64.0)
        plan = make_plan(overrides={"actor.compute_dtype": dtype, "rollout.dtype": dtype}).evolve(cluster=cluster)
        return predict_step_time(plan, predict_memory(plan)).phase_seconds

    native_bf16, native_fp32 = phases("avx512f avx512_bf16", "bfloat16"), phases("avx512f avx512_bf16", "float32")
    assert native_bf16["actor_update"] < native_fp32["actor_update"]
    assert native_bf16["rollout"] < native_fp32["rollout"]  # half the bytes to read per decode step, too
    emulated_bf16, emulated_fp32 = phases("avx512f", "bfloat16"), phases("avx512f", "float32")
    assert emulated_bf16["actor_update"] > emulated_fp32["actor_update"]

"""Profile calibration: records generated from known constants give those constants back."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlplan.planner.calibration import (
    HELD_MEASURE,
    MemoryObservation,
    TimeObservation,
    calibrate,
    fit_allocator,
    memory_observation,
    observations_from_metrics,
    time_observations,
)
from rlplan.planner.errors import PlanError
from rlplan.planner.memory import predict_phase
from rlplan.planner.profile import DEFAULT_PROFILE, Profile, load_profile_toml, profile_to_toml
from tests.planner.plans import make_plan

GIB = 2**30


def _held(allocated: float, fixed_gib: float, fragmentation: float) -> float:
    return fixed_gib * GIB + (1 + fragmentation) * allocated


@settings(max_examples=50, deadline=None)
@given(
    fixed_gib=st.floats(0.0, 8.0),
    fragmentation=st.floats(0.0, 0.4),
    # Sizes far enough apart for fit_allocator to fit the slope (spread beyond its 1 %-of-the-mean rule);
    # "more than 1 GiB apart" alone let 67.25 and 68.5 GiB through, which the rule rightly refuses.
    sizes=st.lists(st.floats(1.0, 70.0), min_size=2, max_size=8, unique=True).filter(
        lambda xs: max(xs) - min(xs) > max(1.0, 0.05 * max(xs))),
)
def test_allocator_fit_recovers_the_constants_that_generated_the_records(fixed_gib, fragmentation, sizes):
    observations = [MemoryObservation(phase="actor_update", allocated_bytes=gib * GIB,
                                      held_bytes=_held(gib * GIB, fixed_gib, fragmentation)) for gib in sizes]
    fit = fit_allocator(observations)
    assert fit.slope_fitted
    assert fit.fixed_bytes / GIB == pytest.approx(fixed_gib, abs=1e-6)
    assert fit.fragmentation_fraction == pytest.approx(fragmentation, abs=1e-9)


def test_one_allocation_size_fits_the_overhead_and_keeps_the_fragmentation():
    observation = MemoryObservation(phase="actor_update", allocated_bytes=40 * GIB,
                                    held_bytes=_held(40 * GIB, 2.5, DEFAULT_PROFILE.fragmentation_fraction))
    result = calibrate([observation])
    assert result.profile.fragmentation_fraction == DEFAULT_PROFILE.fragmentation_fraction
    assert result.profile.cuda_context_and_nccl_gib == pytest.approx(2.5)
    assert any("one allocation size" in note for note in result.notes)


def test_efficiency_fit_recovers_mfu_pooled_over_phases_of_one_kind():
    true_mfu, assumed = 0.42, 0.35
    times = [
        TimeObservation(phase=phase, efficiency="training_mfu", assumed=assumed, predicted_seconds=predicted,
                        measured_seconds=predicted * assumed / true_mfu)
        for phase, predicted in (("actor_update", 30.0), ("old_log_prob", 8.0), ("actor_update", 31.0))
    ]
    result = calibrate(times=times)
    assert result.profile.training_mfu == pytest.approx(true_mfu)
    assert result.profile.decode_hbm_efficiency == DEFAULT_PROFILE.decode_hbm_efficiency


def test_a_fit_outside_the_profile_range_is_clamped_and_said():
    observations = [MemoryObservation(phase="p", allocated_bytes=g * GIB, held_bytes=g * GIB * 2.0)
                    for g in (10.0, 20.0)]
    result = calibrate(observations)
    assert result.profile.fragmentation_fraction == 0.5
    assert any("fragmentation_fraction" in note for note in result.notes)


def test_plan_records_recover_the_profile_that_produced_them():
    """Synthetic GPU measurements of real plans, made with known constants, fit back to them."""
    truth = Profile(name="truth", cuda_context_and_nccl_gib=1.8, fragmentation_fraction=0.11, training_mfu=0.41)
    # Micro batches of 4 and 8 sequences: compute-bound, where smaller ones let FSDP's collectives bind a micro
    # batch at the default MFU, and a phase's seconds no longer split into work / MFU + fixed.
    plans = [make_plan(overrides={"actor.ppo_micro_batch_size_per_gpu": micro}) for micro in (4, 8)]
    memory = []
    for plan in plans:
        phase = predict_phase(plan, "actor_update", truth)
        allocated = phase.peak_bytes - phase.scope_bytes("overhead")
        held = truth.cuda_context_and_nccl_gib * GIB + (1 + truth.fragmentation_fraction) * allocated
        memory.append(memory_observation(plan, "actor_update", held))
    # Seconds as the step-time model predicts them with the true MFU.
    from rlplan.planner.memory import predict_memory
    from rlplan.planner.steptime import predict_step_time

    times = []
    for plan in plans:
        true_seconds = predict_step_time(plan, predict_memory(plan, truth), truth).phase_seconds
        times += time_observations(plan, {"actor_update": true_seconds["actor_update"]})
    profile = calibrate(memory, times).profile
    assert profile.cuda_context_and_nccl_gib == pytest.approx(1.8, abs=1e-3)
    assert profile.fragmentation_fraction == pytest.approx(0.11, abs=1e-4)
    # The update is compute-bound at these sizes, so its seconds scale exactly with 1 / MFU.
    assert profile.training_mfu == pytest.approx(0.41, rel=0.02)
    assert load_profile_toml(profile_to_toml(profile)) == profile


def test_run_metrics_give_times_and_only_held_memory():
    plan = make_plan()
    rows = [
        {"step": 1, "time/actor_update": 99.0, "memory_measure": HELD_MEASURE, "memory/actor_update_peak_gib": 50.0},
        {"step": 2, "time/actor_update": 20.0, "time/rollout": 30.0, "memory_measure": HELD_MEASURE,
         "memory/actor_update_peak_gib": 40.0, "memory/reward_peak_gib": 1.0},
        {"step": 3, "time/actor_update": 22.0, "memory_measure": "cuda_max_memory_allocated",
         "memory/actor_update_peak_gib": 30.0},
    ]
    memory, times, notes = observations_from_metrics(plan, rows)
    assert [o.held_bytes for o in memory] == [40.0 * GIB]  # step 1 is warm-up, step 3 is allocated-only
    assert sorted(o.phase for o in times) == ["actor_update", "actor_update", "rollout"]
    assert any("cuda_max_memory_allocated" in note for note in notes)
    assert any("'reward'" in note for note in notes)


def test_a_gpu_runs_held_figure_is_fitted_and_its_allocated_peak_is_not():
    # What runtime/metrics.py writes on CUDA: the allocator peak labelled as such, the held figure beside it.
    plan = make_plan()
    rows = [
        {"step": 2, "time/actor_update": 20.0, "memory_measure": "cuda_max_memory_allocated",
         "memory/actor_update_peak_gib": 30.0, "memory/actor_update_held_gib": 34.5,
         "memory/old_log_prob_peak_gib": 12.0},
    ]
    memory, _, notes = observations_from_metrics(plan, rows)
    assert [(o.phase, o.held_bytes) for o in memory] == [("actor_update", 34.5 * GIB)]
    assert notes == []


def test_no_observations_is_an_error_for_the_allocator_fit():
    with pytest.raises(PlanError, match="no memory observations"):
        fit_allocator([])


def _write_run(tmp_path, plan, rows):
    import json

    from rlplan.planner.planfile import plan_to_toml

    run = tmp_path / "run"
    run.mkdir()
    (run / "plan.toml").write_text(plan_to_toml(plan))
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    return run


def test_calibrate_from_run_writes_a_profile_solve_can_load(tmp_path):
    from rlplan.runtime.commands import calibrate_command

    plan = make_plan()
    probe = time_observations(plan, {"actor_update": 1e6})[0]
    # The update's seconds are work at the MFU plus costs no MFU scales (per micro batch, the optimizer).
    fixed, work = 1e6 - probe.measured_seconds, probe.predicted_seconds
    # A run whose MFU-bound work took twice the predicted time: achieved MFU is half the assumed one.
    rows = [{"step": step, "time/actor_update": fixed + 2 * work} for step in (1, 2, 3)]
    run = _write_run(tmp_path, plan, rows)
    output = tmp_path / "cluster.toml"
    assert calibrate_command(None, str(run / "metrics.jsonl"), str(output)) == 0
    profile = load_profile_toml(output.read_text())
    assert profile.name == "cluster"
    assert profile.training_mfu == pytest.approx(DEFAULT_PROFILE.training_mfu / 2)


def test_calibrate_from_run_without_a_plan_or_usable_rows_is_bad_input(tmp_path):
    from rlplan.runtime.commands import calibrate_command

    lonely = tmp_path / "metrics.jsonl"
    lonely.write_text("{}\n")
    assert calibrate_command(None, str(lonely), str(tmp_path / "p.toml")) == 2
    run = _write_run(tmp_path, make_plan(), [{"step": 1, "loss": 0.3}])
    assert calibrate_command(None, str(run / "metrics.jsonl"), str(tmp_path / "p.toml")) == 2
    assert not (tmp_path / "p.toml").exists()


def test_calibrate_on_a_machine_without_a_gpu_says_so_and_exits_2(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present: the command would calibrate instead of refusing")
    from rlplan.planner.planfile import plan_to_toml
    from rlplan.runtime.commands import calibrate_command

    plan_path = tmp_path / "plan.toml"
    plan_path.write_text(plan_to_toml(make_plan()))
    assert calibrate_command(str(plan_path), None, str(tmp_path / "p.toml")) == 2
    assert "no CUDA GPU" in capsys.readouterr().err


def test_calibrate_cpu_measures_this_machine_and_solve_device_cpu_prices_with_it(tmp_path):
    pytest.importorskip("torch", reason="measuring the CPU's matmul rate needs torch (the runtime extra)")
    from rlplan.planner.commands.this_machine import this_machine_cpu
    from rlplan.runtime.commands import calibrate_cpu_command

    output = tmp_path / "cpu.toml"
    assert calibrate_cpu_command(str(output), measure_baselines=False) == 0
    profile = load_profile_toml(output.read_text())
    assert profile.cpu_measured_tflops > 0 and profile.cpu_measured_gbps > 0
    rates = this_machine_cpu(profile)
    assert "measured" in rates.source and rates.tflops == profile.cpu_measured_tflops


# --- the lengths a run saw ----------------------------------------------------------------------------------


def test_observed_lengths_weight_each_step_by_its_sequences_and_skip_rows_without_lengths():
    from rlplan.planner.calibration import observed_lengths

    rows = [{"step": 1, "sequences": 10.0, "prompt_length_mean": 100.0, "response_length_mean": 200.0},
            {"step": 2, "sequences": 30.0, "prompt_length_mean": 120.0, "response_length_mean": 400.0},
            {"step": 3, "loss": 0.1}]
    lengths = observed_lengths(rows)
    assert lengths.prompt_mean == pytest.approx((10 * 100 + 30 * 120) / 40)
    assert lengths.response_mean == pytest.approx((10 * 200 + 30 * 400) / 40)
    assert observed_lengths([{"step": 1, "loss": 0.1}]) is None


def test_calibrate_from_run_carries_the_runs_mean_lengths_into_the_profile(tmp_path):
    from rlplan.runtime.commands import calibrate_command

    # A run that recorded only lengths (a CPU run: no held-GPU memory) still yields a profile.
    rows = [{"step": step, "sequences": 8.0, "prompt_length_mean": 104.5, "prompt_length_max": 180.0,
             "response_length_mean": 250.25 + step, "response_length_max": 900.0} for step in (1, 2, 3)]
    run = _write_run(tmp_path, make_plan(), rows)
    output = tmp_path / "seen.toml"
    assert calibrate_command(None, str(run / "metrics.jsonl"), str(output)) == 0
    profile = load_profile_toml(output.read_text())
    # Means rounded up (252.25 -> 253): a micro batch is never priced below what the run held.
    assert (profile.observed_prompt_length, profile.observed_response_length) == (105, 253)
    assert profile.training_mfu == DEFAULT_PROFILE.training_mfu


def _plan_file(tmp_path, plan) -> str:
    from rlplan.planner.planfile import plan_to_toml

    path = tmp_path / "plan.toml"
    path.write_text(plan_to_toml(plan))
    return str(path)


def _profile_file(tmp_path, **observed: int) -> str:
    path = tmp_path / "seen.toml"
    path.write_text(profile_to_toml(Profile(name="seen", **observed)))
    return str(path)


def test_validate_with_a_run_profile_prices_a_plan_without_expected_lengths_at_the_runs_means(tmp_path):
    import json

    from typer.testing import CliRunner

    from rlplan.planner.commands.cli import app

    runner = CliRunner()
    plan = _plan_file(tmp_path, make_plan())
    profile = _profile_file(tmp_path, observed_prompt_length=105, observed_response_length=2000)
    result = runner.invoke(app, ["validate", "--json", plan, "--profile", profile])
    payload = json.loads(result.stdout)
    # The response mean is capped at the plan's max_response_length (1024): the run had longer limits.
    assert (payload["expected_prompt_length"], payload["expected_response_length"]) == (105, 1024)
    plain = json.loads(runner.invoke(app, ["validate", "--json", plan]).stdout)
    assert (plain["expected_prompt_length"], plain["expected_response_length"]) == (512, 1024)
    assert payload["phases"]["old_log_prob"]["peak_gib"] < plain["phases"]["old_log_prob"]["peak_gib"]
    # A plan's own expectation, and a flag, win over the profile.
    stated = _plan_file(tmp_path, make_plan(overrides={"data.expected_prompt_length": 300}))
    own = json.loads(runner.invoke(app, ["validate", "--json", stated, "--profile", profile,
                                         "--expected-response-len", "400"]).stdout)
    assert (own["expected_prompt_length"], own["expected_response_length"]) == (300, 400)


def test_solve_with_a_run_profile_prices_at_the_runs_means():
    from rlplan.planner.solver import solve
    from tests.planner.solver.test_solve import preset_request

    profile = Profile(name="seen", observed_prompt_length=105, observed_response_length=300)
    best = solve(preset_request("qwen2.5-7b", "h100-80g", 8, profile=profile)).best
    assert (best.plan.data.expected_prompt_length, best.plan.data.expected_response_length) == (105, 300)
    flagged = solve(preset_request("qwen2.5-7b", "h100-80g", 8, profile=profile, expected_response_len=500)).best
    assert flagged.plan.data.expected_response_length == 500


def test_calibrate_json_prints_one_object_on_stdout_for_a_profile_and_for_an_error(tmp_path, capsys):
    import json

    from rlplan.runtime.commands import calibrate_command

    plan = make_plan()
    probe = time_observations(plan, {"actor_update": 1e6})[0]
    fixed, work = 1e6 - probe.measured_seconds, probe.predicted_seconds
    rows = [{"step": step, "time/actor_update": fixed + 2 * work} for step in (1, 2)]
    run = _write_run(tmp_path, plan, rows)
    output = tmp_path / "cluster.toml"
    assert calibrate_command(None, str(run / "metrics.jsonl"), str(output), as_json=True) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["profile_file"] == str(output)
    assert report["changed"]["training_mfu"] == pytest.approx(DEFAULT_PROFILE.training_mfu / 2)
    lonely = tmp_path / "metrics.jsonl"
    lonely.write_text("{}\n")
    assert calibrate_command(None, str(lonely), str(tmp_path / "p.toml"), as_json=True) == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["field"] and error["message"] and error["fix"]


def test_step_time_constants_fitted_from_runs_recover_the_profile_that_timed_them():
    """Whole runs timed (verl's timing_s keys) with known constants fit back to them: one profile for all."""
    from rlplan.planner.calibration import RunTiming, fit_step_time
    from rlplan.planner.memory import predict_memory
    from rlplan.planner.steptime import predict_step_time, verl_timing_seconds

    truth = attrs.evolve(DEFAULT_PROFILE, training_mfu=0.3, decode_seconds_per_sequence=90e-6)
    # Bigger batches make the engine host-bound (the per-sequence cost shows), smaller ones GPU-bound.
    plans = [make_plan(overrides={"data.expected_response_length": response, "data.train_batch_size": batch})
             for response in (128, 512) for batch in (64, 256)]
    def timed(plan):
        return verl_timing_seconds(predict_step_time(plan, predict_memory(plan, truth), truth))

    runs = [RunTiming(label=str(i), plan=plan, measured_seconds=timed(plan)) for i, plan in enumerate(plans)]
    fit = fit_step_time(runs, keys=("training_mfu", "decode_seconds_per_sequence"), rounds=6)
    assert fit.rms_log_error_before > 0.05
    assert fit.rms_log_error_after < 0.02
    assert fit.profile.training_mfu == pytest.approx(0.3, rel=0.05)
    assert fit.profile.decode_seconds_per_sequence == pytest.approx(90e-6, rel=0.15)


@settings(max_examples=30, deadline=None)
@given(mean=st.integers(100, 2000), sigma=st.floats(0.1, 1.2), sequences=st.sampled_from([256, 1024, 8192]))
def test_the_response_tail_fitted_from_a_runs_mean_and_max_reproduces_that_max(mean, sigma, sequences):
    """Invariant: the fitted shape predicts the longest response the run reported (the cut not hiding it)."""
    from rlplan.planner.calibration import response_tail_from_run
    from rlplan.planner.steptime import Lengths

    maximum = 65536

    def longest_of(shape: float) -> float:
        lengths = Lengths(prompt_mean=0.0, response_mean=float(mean), response_max=maximum, sigma=shape)
        return lengths.longest_of(sequences)

    longest = longest_of(sigma)
    fitted = response_tail_from_run(float(mean), longest, sequences, maximum)
    if longest >= maximum:
        assert fitted is None
        return
    assert fitted is not None
    assert longest_of(fitted) == pytest.approx(longest, rel=1e-3)


def test_a_longest_response_at_the_cut_does_not_fit_a_tail():
    from rlplan.planner.calibration import response_tail_from_run

    assert response_tail_from_run(800.0, 8192.0, 4096, 8192) is None
    assert response_tail_from_run(800.0, 700.0, 4096, 8192) is None


def test_calibrate_refuses_an_output_that_is_its_metrics_or_its_plan(tmp_path):
    from rlplan.runtime.commands import calibrate_command

    run = _write_run(tmp_path, make_plan(), [{"step": 1, "time/actor_update": 1.0}])
    (tmp_path / "link.toml").symlink_to(run / "metrics.jsonl")
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    for output in (run / "metrics.jsonl", run / "plan.toml", tmp_path / "link.toml"):
        assert calibrate_command(None, str(run / "metrics.jsonl"), str(output)) == 2
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


@pytest.mark.parametrize("metric", ["prompt_length_mean", "response_length_mean"])
def test_a_run_whose_mean_length_is_no_token_count_is_bad_input_naming_the_metric(metric):
    from rlplan.planner.calibration import observed_lengths

    rows = [{"prompt_length_mean": 300.0, "response_length_mean": 600.0, metric: 2.0**62}]
    with pytest.raises(PlanError) as raised:
        observed_lengths(rows)
    assert raised.value.field == f"metrics {metric}" and "lines" in raised.value.message
    assert observed_lengths([{"prompt_length_mean": 300.0, "response_length_mean": 600.0}]) is not None

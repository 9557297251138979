"""`rlplan compare` and `calibrate --from-verl-log` (planner/compare.py, calibration.py, compare_commands.py): every
number compare prints, per verl version's metric scope, on the synthetic fixtures and on public runs."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from rlplan.planner.calibration import STEP_TIME_CONSTANTS
from rlplan.planner.commands.commands_io import load_profile
from rlplan.planner.commands.compare_commands import load_plan_or_script, read_verl_log
from rlplan.planner.compare import SCOPES, compare_run, infer_family, version_family
from rlplan.planner.errors import PlanError
from rlplan.planner.knobs import apply_knobs, with_expected_lengths
from rlplan.planner.memory import GIB, predict_memory
from rlplan.planner.memory.phases import longest_expected_response_that_fits
from rlplan.planner.model_error import peak_error_band
from rlplan.planner.phases import Phase
from rlplan.planner.profile import DEFAULT_PROFILE
from rlplan.planner.steptime import predict_step_time
from tests.data.verl_logs.make_fixtures import STEPS, metrics
from tests.planner.cli_runner import invoke
from tests.repo_scripts import load_script

LOGS = Path(__file__).resolve().parents[1] / "data" / "verl_logs"
SCRIPT = str(LOGS / "grpo_qwen2.5-7b_long.sh")
PUBLIC = LOGS / "public"
FAMILY = {"v02_console.log": "0.2", "v03_console.log": "0.3", "v08_console.log": "0.8", "v08_file.jsonl": "0.8"}


def fixture_plan():
    plan, _ = load_plan_or_script(SCRIPT, gpu="h100-80g", gpu_mem=None, host_mem=1024.0, env=[], fixes={})
    return plan


def expected_counter_gib(plan, family: str) -> tuple[float, float, str]:
    """The comparable prediction: the phase with the largest counter bytes (allocated, reserved, its name)."""
    per_phase = expected_phase_counters(plan, family)
    name = max(per_phase, key=lambda key: per_phase[key][0])
    return (*per_phase[name], name)


def expected_phase_counters(plan, family: str) -> dict[str, tuple[float, float]]:
    """Per phase, (allocated, reserved) GiB verl's counters would show, worked out from the phase components
    independently of compare.counter_bytes."""
    scope = SCOPES[family]
    report = predict_memory(plan)
    out = {}
    for phase in report.phases:
        names = {c.name for c in phase.components}
        allocated = 0
        for c in phase.components:
            engine = c.name.startswith("vllm_") or c.name in ("kv_cache", "cuda_graph_pool")
            if c.name in ("vllm_non_torch", "vllm_context", "cuda_context_and_nccl", "fragmentation_reserve"):
                continue
            if engine and not scope.engine_in_process:
                continue
            allocated += c.bytes
        if phase.name != "rollout" and scope.engine_in_process and scope.pool_counted_asleep:
            allocated += (0 if "vllm_weights" in names else report.rollout.weights_bytes)
            allocated += (0 if "kv_cache" in names else report.rollout.kv_cache_bytes)
        out[str(phase.name)] = (allocated / GIB, (allocated + phase.bytes_of("fragmentation_reserve")) / GIB)
    return out


@pytest.mark.parametrize("name", list(FAMILY))
def test_per_phase_counter_rows(payloads, name):
    plan = with_expected_lengths(fixture_plan(), 300, 1176)
    expected = expected_phase_counters(plan, FAMILY[name])
    peaks = {str(p.name): p.peak_bytes / GIB for p in predict_memory(plan).phases}
    rows = payloads[name][1]["phases"]
    assert [row["phase"] for row in rows] == list(expected)
    for row in rows:
        allocated, reserved = expected[row["phase"]]
        assert row["counter_allocated_gib"] == pytest.approx(allocated, abs=1e-3)
        assert row["counter_reserved_gib"] == pytest.approx(reserved, abs=1e-3)
        assert row["planner_peak_gib"] == pytest.approx(peaks[row["phase"]], abs=1e-3)


@pytest.fixture(scope="module")
def payloads():
    out = {}
    for name in FAMILY:
        result = invoke("compare", SCRIPT, str(LOGS / name), "--gpu", "h100-80g", "--json")
        out[name] = (result.exit_code, json.loads(result.output))
    return out


@pytest.mark.parametrize("name", list(FAMILY))
def test_lengths_are_the_runs_means(payloads, name):
    _, payload = payloads[name]
    responses = [metrics(s)["response_length/mean"] for s in range(1, STEPS + 1)]
    lengths = payload["lengths"]
    assert lengths["prompt_mean"] == pytest.approx(300.0, abs=1e-3)
    assert lengths["response_mean"] == pytest.approx(statistics.fmean(responses), abs=1e-3)
    assert lengths["response_max"] == pytest.approx(max(metrics(s)["response_length/max"] for s in range(1, STEPS + 1)))
    assert (lengths["expected_prompt_length"], lengths["expected_response_length"]) == (300, math.ceil(1175.5))


@pytest.mark.parametrize("name", list(FAMILY))
def test_memory_numbers_follow_the_versions_scope(payloads, name):
    code, payload = payloads[name]
    family = FAMILY[name]
    plan = with_expected_lengths(fixture_plan(), 300, 1176)
    allocated, reserved, phase = expected_counter_gib(plan, family)
    rows = {row["metric"].rsplit("/", 1)[-1]: row for row in payload["memory"]}
    last = metrics(STEPS)["perf/max_memory_allocated_gb"]
    for metric, predicted, measured in (("max_memory_allocated_gb", allocated, last),
                                        ("max_memory_reserved_gb", reserved, last + 12.0)):
        row = rows[metric]
        assert row["measured_gib"] == pytest.approx(measured, abs=1e-3)
        assert row["measured_peak_step"] == STEPS
        assert row["predicted_gib"] == pytest.approx(predicted, abs=1e-3)
        assert row["predicted_peak_phase"] == phase
        assert row["ratio"] == pytest.approx(measured / predicted, abs=1e-3)
        # The band of the predicted peak's phase, as planner/model_error.py derives it from the measured rows.
        highest = peak_error_band(plan, Phase(phase)).highest_actual_gib(predicted)
        assert row["highest_allowed_gib"] == pytest.approx(highest, abs=1e-3)
        assert row["exceeds_band"] == (measured > highest)
    assert code == (1 if any(r["exceeds_band"] for r in rows.values()) else 0)
    assert payload["scope"]["engine_in_trainer_process"] == SCOPES[family].engine_in_process


def test_an_engine_in_the_trainer_process_is_inside_the_counter(payloads):
    inside = payloads["v03_console.log"][1]["memory"][0]["predicted_gib"]
    outside = payloads["v08_console.log"][1]["memory"][0]["predicted_gib"]
    budget = predict_memory(with_expected_lengths(fixture_plan(), 300, 1176)).rollout
    # The sleeping pool (weights + KV) is what separates the two scopes at the update's peak.
    assert inside - outside == pytest.approx((budget.weights_bytes + budget.kv_cache_bytes) / GIB, rel=0.05)


@pytest.mark.parametrize("name", list(FAMILY))
def test_times_are_medians_over_steady_steps_beside_the_model(payloads, name):
    _, payload = payloads[name]
    plan = with_expected_lengths(fixture_plan(), 300, 1176)
    predicted = predict_step_time(plan, predict_memory(plan)).phase_seconds
    steady = [s for s in range(2, STEPS + 1) if s != 10]  # step 1 warms up, step 10 validates
    rows = {row["phase"]: row for row in payload["times"]}
    sync_in_gen = FAMILY[name] != "0.8"  # the fixtures of 0.8 time update_weights on its own
    expected = {
        "rollout": (statistics.median(metrics(s)["timing_s/gen"] for s in steady),
                    predicted[Phase.ROLLOUT] + (predicted[Phase.WEIGHT_SYNC] if sync_in_gen else 0.0)),
        "old_log_prob": (statistics.median(metrics(s)["timing_s/old_log_prob"] for s in steady),
                         predicted[Phase.OLD_LOG_PROB]),
        "ref_log_prob": (8.0, predicted[Phase.REF_LOG_PROB]),
        "actor_update": (statistics.median(metrics(s)["timing_s/update_actor"] for s in steady),
                         predicted[Phase.ACTOR_UPDATE]),
        "step": (statistics.median(metrics(s)["timing_s/step"] for s in steady), sum(predicted.values())),
        # The driver's advantage step (steptime.step.driver_seconds), which the fixtures time.
        "adv": (statistics.median(metrics(s)["timing_s/adv"] for s in steady), predicted["adv"]),
    }
    if not sync_in_gen:
        expected["weight_sync"] = (3.0, predicted[Phase.WEIGHT_SYNC])
    assert set(rows) == set(expected)
    for phase, (measured, model) in expected.items():
        assert rows[phase]["measured_s"] == pytest.approx(measured, abs=1e-3)
        assert rows[phase]["predicted_s"] == pytest.approx(model, abs=1e-3)
        assert rows[phase]["ratio"] == pytest.approx(measured / model, abs=1e-3)
        assert rows[phase]["steps"] == len(steady)


@pytest.mark.parametrize("name", list(FAMILY))
def test_forecast_finds_the_step_where_the_plan_stops_fitting(payloads, name):
    forecast = payloads[name][1]["forecast"]
    plan = with_expected_lengths(fixture_plan(), 300, 1176)
    longest = longest_expected_response_that_fits(plan)
    assert 1176 < longest < plan.data.max_response_length
    assert forecast["slope_tokens_per_step"] == pytest.approx(9.0, abs=1e-3)
    assert forecast["longest_fitting_mean_response"] == longest
    stop = forecast["stops_fitting_at_step"]
    # Invariant: the trend first reaches a mean the plan does not fit at that step.
    assert 991 + 9 * stop >= longest + 1 - 0.01 and 991 + 9 * (stop - 1) < longest + 1
    assert forecast["reaches_max_response_length_at_step"] == math.ceil((8192 - 991) / 9)
    key, value = forecast["fix"].removeprefix("set ").split(" = ")
    assert key == "actor.ppo_max_token_len_per_gpu"
    at_limit = with_expected_lengths(plan, None, plan.data.max_response_length)
    assert not predict_memory(at_limit).fits
    assert predict_memory(apply_knobs(at_limit, {key: int(value)})).fits
    assert f"near step {stop}" in forecast["message"] and forecast["fix"] in forecast["message"]
    assert forecast["longest_response_hit_limit_at_step"] is None  # response_length/max stays below 8192


def test_text_output_prints_the_json_numbers(payloads):
    result = invoke("compare", SCRIPT, str(LOGS / "v03_console.log"), "--gpu", "h100-80g")
    _, payload = payloads["v03_console.log"]
    text = " ".join(result.output.split())
    for row in payload["memory"]:
        assert f"{row['measured_gib']:.2f}" in text and f"{row['predicted_gib']:.2f}" in text
    for row in payload["times"]:
        assert f"{row['measured_s']:.2f}" in text and f"{row['predicted_s']:.2f}" in text
    assert payload["forecast"]["message"].split(";")[0] in text
    # The still-written last line and the cut line are named in the notes.
    assert any("has no newline yet" in note for note in payload["notes"])
    assert any(note.startswith("line ") and "key:number" in note for note in payload["notes"])


def test_version_family_and_inference():
    assert version_family("0.4.1") == "0.3" and version_family("v0.8.0") == "0.8" and version_family("1.0") == "0.8"
    assert version_family("0.7.2") == "0.7" and version_family("0.6") == "0.6" and version_family("0.2.0") == "0.2"
    with pytest.raises(PlanError):
        version_family("latest")
    assert infer_family(read_verl_log(str(LOGS / "v02_console.log")))[0] == "0.2"
    assert infer_family(read_verl_log(str(LOGS / "v08_file.jsonl")))[0] == "0.8"


def test_verl_version_option_overrides_the_inference():
    result = invoke("compare", SCRIPT, str(LOGS / "v03_console.log"), "--gpu", "h100-80g", "--json",
                    "--verl-version", "0.7.0")
    payload = json.loads(result.output)
    assert payload["verl_version"] == SCOPES["0.7"].versions and not payload["scope"]["engine_in_trainer_process"]


def test_a_plan_on_another_stack_is_compared_with_its_versions_scope():
    from rlplan.planner.stack import StackSection

    log = read_verl_log(str(LOGS / "v08_console.log"))
    on_default = compare_run(fixture_plan(), log)
    assert on_default.scope.family == "0.8"  # the default stack says nothing: the log's spellings decide
    old = compare_run(fixture_plan().evolve(stack=StackSection(verl="0.7.1")), log)
    assert old.scope.family == "0.7" and "stack" in old.scope_reason
    flagged = compare_run(fixture_plan().evolve(stack=StackSection(verl="0.7.1")), log, family="0.8")
    assert flagged.scope.family == "0.8"


def test_bad_inputs_exit_2_with_json(tmp_path):
    plan_toml = tmp_path / "plan.toml"
    from rlplan.planner.planfile import plan_to_toml

    plan_toml.write_text(plan_to_toml(fixture_plan()))
    result = invoke("compare", str(plan_toml), str(LOGS / "v03_console.log"), "--gpu", "h100-80g", "--json")
    assert result.exit_code == 2 and json.loads(result.output)["error"]["field"] == "--gpu"
    no_lengths = tmp_path / "no_lengths.log"
    no_lengths.write_text("step:1 - timing_s/gen:3.0\n")
    result = invoke("compare", str(plan_toml), str(no_lengths), "--json")
    assert result.exit_code == 2 and "prompt_length/mean" in json.loads(result.output)["error"]["message"]
    result = invoke("compare", str(plan_toml), str(tmp_path), "--json")
    assert result.exit_code == 2


def test_chart_is_written(tmp_path):
    pytest.importorskip("altair")
    pytest.importorskip("vl_convert")
    chart = tmp_path / "compare.svg"
    result = invoke("compare", SCRIPT, str(LOGS / "v08_file.jsonl"), "--gpu", "h100-80g", "--chart", str(chart),
                    "--json")
    assert result.exit_code in (0, 1) and chart.read_text().startswith("<svg")


# --- public runs (tests/data/verl_logs/public/README.md) -----------------------------------------------------


def public_compare(script: str, log: str, *extra: str):
    result = invoke("compare", str(PUBLIC / script), str(PUBLIC / log), "--gpu", "h100-80g", "--fix",
                    "rollout.enforce_eager=true", "--json", *extra)
    return result.exit_code, json.loads(result.output)


def test_public_runs_memory_against_the_model():
    code, rec = public_compare("qwen2_7b_gsm8k_8gpu_recommended.sh", "verl_qwen2_7b_recommended.log")
    allocated = rec["memory"][0]
    assert allocated["measured_gib"] == pytest.approx(83.586)
    # FSDP1 keeps both models' gradients between steps (docs/accuracy.md section 4), which the planner does not
    # price outside the updates; the update's peak, with verl's in-place temperature on the logits priced (issue 24),
    # now reaches that reading within a few percent. The reserved counter still exceeds its band (exit 1).
    assert 0.95 < allocated["ratio"] < 1.10 and code == 1 and rec["memory"][1]["exceeds_band"]
    code, low = public_compare("qwen2_7b_gsm8k_8gpu_min.sh", "verl_qwen2_7b_min.log")
    assert low["memory"][0]["measured_gib"] == pytest.approx(54.493)
    assert 0.95 < low["memory"][0]["ratio"] <= 1.0 and not low["memory"][0]["exceeds_band"]
    # The reserved figure is where the flat fragmentation allowance fails: 14 GiB held beyond allocated.
    assert low["memory"][1]["exceeds_band"] and code == 1
    # Both runs' longest responses hit max_response_length (1024) from step 1; the forecast says so.
    assert low["forecast"]["longest_response_hit_limit_at_step"] == 1 and "cut there" in low["forecast"]["message"]


def test_calibrate_from_verl_log_fits_the_allocator_cache_and_compare_then_fits(tmp_path):
    profile = tmp_path / "min.toml"
    result = invoke("calibrate", "--from-verl-log", str(PUBLIC / "verl_qwen2_7b_min.log"), "--plan",
                    str(PUBLIC / "qwen2_7b_gsm8k_8gpu_min.sh"), "--gpu", "h100-80g", "--fix",
                    "rollout.enforce_eager=true", "-o", str(profile), "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    changed = payload["changed"]
    fitted = load_profile(str(profile))
    gap = 68.334 - 54.493
    # One run: the cache is fitted, the fraction refused (one allocation size), the context refused (not logged).
    assert 0.0 < changed["allocator_cache_gib"] < gap
    assert fitted.fragmentation_fraction == DEFAULT_PROFILE.fragmentation_fraction
    assert fitted.cuda_context_and_nccl_gib == DEFAULT_PROFILE.cuda_context_and_nccl_gib
    assert any(note.startswith("fragmentation_fraction: not fitted") for note in payload["notes"])
    assert any(note.startswith("cuda_context_and_nccl_gib: not fitted") for note in payload["notes"])
    assert (fitted.observed_prompt_length, fitted.observed_response_length) == (94, 195)
    # The step-time constants come from the sweeps' fit (calibration.fit_step_time), and it lowers the error.
    assert set(changed) & set(STEP_TIME_CONSTANTS)
    before, after = next(n for n in payload["notes"] if n.startswith("step time: rms log error")).split("error ")[1] \
        .split(" over")[0].split(" -> ")
    assert float(after) < float(before)
    code, again = public_compare("qwen2_7b_gsm8k_8gpu_min.sh", "verl_qwen2_7b_min.log", "--profile", str(profile))
    reserved = again["memory"][1]
    assert reserved["ratio"] == pytest.approx(1.0, abs=0.05) and not reserved["exceeds_band"] and code == 0


def test_calibrate_refuses_what_a_log_does_not_inform(tmp_path):
    log = tmp_path / "times_only.log"
    log.write_text("".join(f"step:{s} - prompt_length/mean:300.0 - response_length/mean:1000.0 - "
                           f"timing_s/gen:60.0\n" for s in range(1, 5)))
    result = invoke("calibrate", "--from-verl-log", str(log), "--plan", SCRIPT, "--gpu", "h100-80g",
                    "-o", str(tmp_path / "p.toml"), "--json")
    payload = json.loads(result.output)
    assert result.exit_code == 0
    # Only gen is timed: the lengths, and no constant that no rollout second depends on (the trainer's MFU).
    changed = set(payload["changed"])
    assert {"observed_prompt_length", "observed_response_length"} <= changed
    assert changed & set(STEP_TIME_CONSTANTS) and not changed & {"training_mfu", "training_mfu_light_gpu",
                                                                  "micro_batch_seconds_per_layer"}
    assert any("allocator_cache_gib, fragmentation_fraction: not fitted" in n for n in payload["notes"])
    assert any(n.startswith("training_mfu: not fitted") for n in payload["notes"])


def test_compare_run_is_pure_and_matches_the_command(payloads):
    comparison = compare_run(fixture_plan(), read_verl_log(str(LOGS / "v08_console.log")))
    assert comparison.memory[0].predicted_gib == pytest.approx(payloads["v08_console.log"][1]["memory"][0]["predicted_gib"],
                                                               abs=1e-3)


def test_critic_counters_of_engine_workers_are_compared_too(tmp_path):
    log = tmp_path / "v08_critic.log"
    lines = [f"step:{s} - prompt_length/mean:np.float64(300.0) - response_length/mean:np.float64(1000.0) - "
             f"actor/perf/max_memory_allocated_gb:np.float64(40.0) - critic/perf/max_memory_allocated_gb:"
             f"np.float64(41.0)" for s in (1, 2, 3)]
    log.write_text("\n".join(lines) + "\n")
    payload = json.loads(invoke("compare", SCRIPT, str(log), "--gpu", "h100-80g", "--json").output)
    rows = {row["metric"]: row for row in payload["memory"]}
    assert set(rows) == {"actor/perf/max_memory_allocated_gb", "critic/perf/max_memory_allocated_gb"}
    assert rows["critic/perf/max_memory_allocated_gb"]["measured_gib"] == 41.0
    assert rows["critic/perf/max_memory_allocated_gb"]["predicted_gib"] == rows["actor/perf/max_memory_allocated_gb"][
        "predicted_gib"]


def test_calibrating_from_two_runs_fits_the_fraction_and_centres_the_cache(tmp_path):
    """Invariant of the least-squares fit at the (clamped) fraction: over the runs it was fitted on, the predicted
    reserved-minus-allocated gap equals the measured one on average."""
    profile = tmp_path / "both.toml"
    runs = (("qwen2_7b_gsm8k_8gpu_min.sh", "verl_qwen2_7b_min.log"),
            ("qwen2_7b_gsm8k_8gpu_recommended.sh", "verl_qwen2_7b_recommended.log"))
    args = ["calibrate", "--gpu", "h100-80g", "--fix", "rollout.enforce_eager=true", "-o", str(profile), "--json"]
    for script, log in runs:
        args += ["--from-verl-log", str(PUBLIC / log), "--plan", str(PUBLIC / script)]
    payload = json.loads(invoke(*args).output)
    fitted = load_profile(str(profile))
    # Two runs of different trainer bytes separate the fraction from the flat cache; at the bound it is clamped, said.
    assert 0.0 < fitted.fragmentation_fraction <= 0.5
    assert fitted.fragmentation_fraction < 0.5 or any("lies outside" in n for n in payload["notes"])
    residuals = []
    for script, log in runs:
        _, out = public_compare(script, log, "--profile", str(profile))
        allocated, reserved = out["memory"]
        residuals.append((reserved["measured_gib"] - allocated["measured_gib"])
                         - (reserved["predicted_gib"] - allocated["predicted_gib"]))
    assert statistics.fmean(residuals) == pytest.approx(0.0, abs=0.05)


@pytest.mark.parametrize("script, log, measured", [
    ("run_demo_qwen2.5b_grpo_8gpu.sh", "verl_grpo_qwen2.5b_8gpu.log", 52.804),
    ("run_demo_qwen2.5b_ppo_8gpu.sh", "verl_ppo_qwen2.5b_8gpu.log", 53.038),
])
def test_public_small_model_runs(script, log, measured):
    """Qwen2.5-0.5B: the counter is mostly the in-process vLLM pool (util 0.6 of the card); docs/accuracy.md
    section 4 (benchmarks/public_verl_runs.py) records the under-prediction as a known gap of the rollout's terms."""
    code, payload = public_compare(script, log)
    allocated = payload["memory"][0]
    assert allocated["measured_gib"] == pytest.approx(measured)
    assert 1.0 < allocated["ratio"] < 1.10 and code == 1


def _public_runs_module():
    return load_script("benchmarks/public_verl_runs.py")


def test_the_accuracy_benchmark_compares_the_public_runs_as_the_command_does():
    """benchmarks/public_verl_runs.py (docs/accuracy.md section 4) runs compare in process: its memory rows are
    the ones `rlplan compare --json` prints with the arguments public_compare passes."""
    bench = _public_runs_module()
    for run in bench.RUNS:
        _, payload = public_compare(run.script, run.log)
        rows = bench.compare(run).comparison.memory
        assert [(r.metric, round(r.measured_gib, 3), round(r.predicted_gib, 3), r.exceeds) for r in rows] == [
            (m["metric"], m["measured_gib"], m["predicted_gib"], m["exceeds_band"]) for m in payload["memory"]]


def test_the_benchmark_replaces_only_its_own_section():
    bench = _public_runs_module()
    text = "# doc\n\n## 3. before\nkept\n\n" + bench.SECTION_HEADING + "\nold 1.23\n\n## 5. after\nkept too\n"
    replaced = bench.replace_section(text, bench.SECTION_HEADING, bench.SECTION_HEADING + "\n\nnew\n")
    assert replaced == "# doc\n\n## 3. before\nkept\n\n" + bench.SECTION_HEADING + "\n\nnew\n\n## 5. after\nkept too\n"
    # A page without the section gets it appended, the rest kept.
    assert bench.replace_section("# doc\n", "## 4. x", "## 4. x\nnew").endswith("# doc\n\n## 4. x\nnew\n")


def test_a_run_with_one_step_compares_and_forecasts_no_trend(tmp_path):
    log = tmp_path / "one.jsonl"
    log.write_text(json.dumps({"step": 1, "prompt_length/mean": 300.0, "response_length/mean": 1200.0,
                               "perf/max_memory_allocated_gb": 40.0, "timing_s/gen": 50.0}) + "\n")
    result = invoke("compare", SCRIPT, str(log), "--gpu", "h100-80g", "--json")
    payload = json.loads(result.output)
    assert payload["forecast"]["slope_tokens_per_step"] == 0.0
    assert payload["forecast"]["stops_fitting_at_step"] is None
    assert [row["steps"] for row in payload["times"]] == [1]
    assert payload["memory"][0]["measured_gib"] == 40.0 and result.exit_code == 0


def test_every_time_row_carries_its_out_of_sample_band_and_says_whether_the_run_lies_in_it():
    """Issue 40: `compare` shows each phase's seconds with the step-time model's error band (steptime/bands.py)."""
    _, payload = public_compare("qwen2_7b_gsm8k_8gpu_min.sh", "verl_qwen2_7b_min.log")
    assert payload["times"]
    for row in payload["times"]:
        band = row["band"]
        assert band is not None and 0 <= band["under"] < 1 and band["over"] >= 0, row["phase"]
        low, high = row["predicted_s"] / (1 + band["over"]), row["predicted_s"] / (1 - band["under"])
        assert row["within_band"] == (low <= row["measured_s"] <= high), row["phase"]


@pytest.mark.parametrize("bad", ["step:" + "9" * 400 + " - perf/max_memory_allocated_gb:30.0",
                                 '{"step": 1e300, "data": {"perf/max_memory_allocated_gb": 30}}',
                                 "step:2 - perf/max_memory_allocated_gb:" + "9" * 400,
                                 "step:2 - perf/max_memory_allocated_gb:-30 - timing_s/gen:-4"])
@pytest.mark.parametrize("command", ["compare", "calibrate"])
def test_hostile_log_lines_are_notes_never_internal_errors(tmp_path, bad, command):
    """Issue 41: out-of-range steps and values, and negative memory and times, enter neither the comparison nor the
    fit; each is a note naming its line, and the command ends with a verdict (compare) or a profile (calibrate)."""
    log = tmp_path / "run.log"
    log.write_text("step:1 - perf/max_memory_allocated_gb:30.0 - response_length/mean:300 - prompt_length/mean:100\n"
                   + bad + "\n", encoding="utf-8")
    if command == "compare":
        result = invoke("compare", SCRIPT, str(log), "--gpu", "h100-80g", "--json", "--chart", str(tmp_path / "c.png"))
    else:
        result = invoke("calibrate", "--from-verl-log", str(log), "--plan", SCRIPT, "--gpu", "h100-80g", "--json",
                        "-o", str(tmp_path / "p.toml"))
    assert result.exit_code in (0, 1), result.output
    notes = json.loads(result.stdout)["notes"]
    assert any("line 2" in note and ("out of range" in note or "negative" in note) for note in notes), notes

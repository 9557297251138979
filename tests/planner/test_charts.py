"""The pictures' data (planner/charts.py) and their commands: values, labels, limit lines, markers."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlplan.planner.charts import (
    frontier_data,
    memory_chart_data,
    run_report_data,
)
from rlplan.planner.commands.cli import app
from rlplan.planner.hardware import Cluster
from rlplan.planner.memory import GIB, predict_memory
from rlplan.planner.plan import ModelSection
from rlplan.planner.planfile import plan_to_toml
from rlplan.planner.presets import resolve_gpu, resolve_model
from rlplan.planner.solver import SolveRequest, solve
from tests.planner.plans import make_plan

runner = CliRunner()


def request_for(gpu: str, response_len: int = 1024) -> SolveRequest:
    model = resolve_model("qwen2.5-7b")
    return SolveRequest(model=ModelSection(name=model.name, path=model.path, arch=model.arch),
                        cluster=Cluster(gpu=resolve_gpu(gpu), nodes=1, gpus_per_node=8, host_memory_gib=1024.0),
                        prompt_len=1024, response_len=response_len)


@pytest.fixture(scope="module")
def tight_solve():
    """7B on 8 x 24 GiB: some candidates fit, some fail at the trainer, some at the rollout."""
    request = request_for("rtx4090-24g")
    return request, solve(request, keep=4, frontier=True)


# --- memory chart -----------------------------------------------------------------------


def test_memory_chart_stacks_sum_to_each_phase_peak_and_the_limit_is_the_gpu():
    report = predict_memory(make_plan())
    data = memory_chart_data(report)
    for index, phase in enumerate(report.phases):
        rows = [row for row in data["gpu_bars"] if row["phase"] == phase.name]
        assert [row["component"] for row in rows] == [c.name for c in phase.components]
        assert all(row["order"] == index for row in rows)
        assert math.isclose(sum(row["gib"] for row in rows), phase.peak_bytes / GIB, abs_tol=0.001 * len(rows))
        assert data["phase_peaks"][index] == {"phase": phase.name, "order": index, "gib": round(phase.peak_bytes / GIB, 3)}
    assert data["gpu_limit_gib"] == round(report.gpu_capacity_bytes / GIB, 3) == round(80.0, 3)
    assert data["host_limit_gib"] == 1024.0
    assert math.isclose(sum(row["gib"] for row in data["host_bars"]), report.host.total_bytes / GIB, abs_tol=0.01)
    assert data["margin_gib"] == 0.0 and memory_chart_data(report, 3.96)["margin_gib"] == 3.96


def test_memory_chart_flags_exactly_the_binding_component_and_labels_it():
    report = predict_memory(make_plan())
    binding = report.binding_constraint
    data = memory_chart_data(report)
    flagged = [(row["phase"], row["component"]) for row in [*data["gpu_bars"], *data["host_bars"]]
               if row["binding"] and "phase" in row]
    assert binding.resource in ("gpu", "kv_cache")
    assert flagged == [(binding.where, binding.component)]
    assert binding.component in data["binding"]["label"] and binding.where in data["binding"]["label"]
    assert data["binding"]["free_gib"] == round(binding.headroom_bytes / GIB, 3)


def test_memory_chart_flags_a_host_component_when_host_ram_binds():
    report = predict_memory(make_plan(overrides={"cluster.host_memory_gib": 40.0}))
    assert report.binding_constraint.resource == "host"
    data = memory_chart_data(report)
    assert not any(row["binding"] for row in data["gpu_bars"])
    assert [row["component"] for row in data["host_bars"] if row["binding"]] == [report.binding_constraint.component]
    assert data["host_limit_gib"] == 40.0


# --- frontier ------------------------------------------------------------------------------


def test_solve_records_no_frontier_unless_asked_and_the_answer_does_not_change():
    request = request_for("h100-80g")
    plain, drawn = solve(request), solve(request, frontier=True)
    assert plain.frontier == ()
    assert drawn.plan == plain.plan and drawn.evaluated == plain.evaluated and drawn.feasible == plain.feasible


def test_frontier_has_every_feasible_candidate_ranked_and_the_infeasible_with_a_reason(tight_solve):
    _, result = tight_solve
    feasible = [p for p in result.frontier if p.feasible]
    infeasible = [p for p in result.frontier if not p.feasible]
    assert len(feasible) == result.feasible and infeasible
    assert sorted(p.rank for p in feasible) == list(range(1, result.feasible + 1))
    assert {p.rank for p in infeasible} == {0} and all(p.reason for p in infeasible)
    assert {p.reason for p in infeasible} >= {"training does not fit at the smallest token budget"}
    chosen = next(p for p in feasible if p.rank == 1)
    assert round(chosen.step_time_s, 3) == result.best.plan.prediction.step_time_s
    assert round(chosen.gpu_peak_gib, 3) == result.best.plan.prediction.gpu_peak_gib
    for rank, runner_up in enumerate(result.runners_up, start=2):
        point = next(p for p in feasible if p.rank == rank)
        assert round(point.step_time_s, 3) == runner_up.plan.prediction.step_time_s


def test_frontier_data_marks_chosen_and_top_n_and_draws_the_gpu_limit(tight_solve):
    request, result = tight_solve
    data = frontier_data(result.frontier, request.cluster.gpu.memory_gib, top=3)
    rows = data["points"]
    assert data["gpu_limit_gib"] == 24.0 or data["gpu_limit_gib"] == round(request.cluster.gpu.memory_gib, 3)
    assert len(rows) == len(result.frontier)
    assert [r["rank"] for r in rows if r["mark"] == "chosen"] == [1]
    assert sorted(r["rank"] for r in rows if r["mark"] == "top 3") == [2, 3]
    assert all(r["feasible"] for r in rows if r["mark"] != "infeasible")
    assert sum(r["mark"] == "infeasible" for r in rows) == sum(not p.feasible for p in result.frontier)
    # The chosen plan is drawn last, on top of anything at its spot; its label names it.
    assert rows[-1]["mark"] == "chosen" and rows[-1]["label"].startswith("#1")
    labels = " ".join(r["label"] for r in rows)
    assert all(f"#{rank}" in labels.split() for rank in (1, 2, 3))
    assert all("rollout.tensor_model_parallel_size=" in r["knobs"] for r in rows)
    assert all(r["gpu_peak_gib"] <= data["gpu_limit_gib"] for r in rows if r["feasible"])
    # The key names each labelled candidate; runners-up by the knobs they change from #1.
    assert [line.split(":")[0] for line in data["key"]] == ["#1", "#2", "#3"]
    assert data["key"][0].endswith("the plan written")
    third = dict(next(p for p in result.frontier if p.rank == 3).knobs)
    first = dict(next(p for p in result.frontier if p.rank == 1).knobs)
    for name, value in third.items():
        if value != first[name] and value is not None:
            assert f"{name}={value}" in data["key"][2]


def test_frontier_data_without_top_marks_only_the_chosen(tight_solve):
    request, result = tight_solve
    rows = frontier_data(result.frontier, request.cluster.gpu.memory_gib, top=0)["points"]
    assert {r["mark"] for r in rows} == {"chosen", "feasible", "infeasible"}
    assert [r["label"] for r in rows if r["label"]] == ["#1"]
    assert len(frontier_data(result.frontier, 24.0, top=0)["key"]) == 1


def test_frontier_data_gives_what_each_candidate_leaves_free_and_the_margin_line(tight_solve):
    from rlplan.planner.solver import request_margin

    request, result = tight_solve
    margin = request_margin(request).gib
    data = frontier_data(result.frontier, request.cluster.gpu.memory_gib, top=3, margin_gib=margin)
    assert data["margin_gib"] == round(margin, 3) > 0
    assert data["margin_line_gib"] == round(request.cluster.gpu.memory_gib - margin, 3)
    for row in data["points"]:
        assert row["free_gib"] == pytest.approx(request.cluster.gpu.memory_gib - row["gpu_peak_gib"], abs=1e-3)
        if row["feasible"]:  # every plan solve may write stays under the margin line
            assert row["gpu_peak_gib"] <= data["margin_line_gib"] + 1e-3
    assert all("free)" in line for line in data["key"])


# --- run report ----------------------------------------------------------------------------


def metrics_record(step: int) -> dict:
    return {"step": step, "reward_mean": 0.1 * step, "kl_ref": 0.01 * step, "entropy": 1.0 - 0.05 * step,
            "response_length_mean": 100.0 + step, "sync_logprob_gap": 0.002, "actor/grad_norm": 1.0,
            "time/rollout": 2.0, "time/actor_update": 1.0 + step, "time/weight_sync": 0.5, "time/weight_gather": 0.2,
            "time/weight_load": 0.3, "time/step": 9.0,
            "memory/rollout_peak_gib": 1.0 + step, "memory/actor_update_peak_gib": 3.0,
            "memory/actor_update_predicted_gib": 3.5, "memory/rollout_predicted_gib": 2.5,
            "memory_measure": "cpu_process_rss_sampled_peak"}


def test_run_report_data_has_each_series_phase_times_and_memory_per_phase():
    records = [metrics_record(step) for step in (1, 2, 3)]
    data = run_report_data(records, {"rollout": 70.0, "weight_sync": 20.0})
    rewards = [(r["step"], r["value"]) for r in data["series"] if r["metric"] == "reward"]
    assert rewards == [(1, 0.1), (2, 0.2), (3, 0.30000000000000004)]
    assert {r["metric"] for r in data["series"]} == {"reward", "KL to reference", "entropy",
                                                       "response length (tokens)", "sync log-prob gap"}
    assert {r["phase"] for r in data["phase_seconds"]} == {"rollout", "actor_update", "weight_sync"}
    assert [r["seconds"] for r in data["phase_seconds"] if r["phase"] == "actor_update"] == [2.0, 3.0, 4.0]
    memory = {(r["phase"], r["kind"]): r["gib"] for r in data["memory"]}
    measured = "measured (cpu_process_rss_sampled_peak)"
    # The runtime's own predictions win over the plan's; the measured peak is the largest step's.
    assert memory == {("rollout", "predicted"): 2.5, ("rollout", measured): 4.0,
                      ("actor_update", "predicted"): 3.5, ("actor_update", measured): 3.0}
    assert (data["steps"], data["last_step"]) == (3, 3)


def test_run_report_data_falls_back_to_the_plans_prediction():
    records = [{k: v for k, v in metrics_record(1).items() if not k.endswith("_predicted_gib")}]
    memory = {(r["phase"], r["kind"]): r["gib"] for r in run_report_data(records, {"rollout": 70.0})["memory"]}
    assert memory[("rollout", "predicted")] == 70.0 and ("actor_update", "predicted") not in memory


# --- commands --------------------------------------------------------------------------------


def write_run(directory: Path, steps: int, cut_off: bool) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(metrics_record(s)) + "\n" for s in range(1, steps + 1))
    (directory / "metrics.jsonl").write_text(text + ('{"step": 99, "rewa' if cut_off else ""))
    (directory / "plan.toml").write_text(plan_to_toml(make_plan()))
    return directory


def test_chart_commands_without_the_extra_exit_2_with_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "altair", None)
    plan = tmp_path / "plan.toml"
    plan.write_text(plan_to_toml(make_plan()))
    for args in (["explain", str(plan), "--chart", str(tmp_path / "m.html")],
                 ["report", str(write_run(tmp_path / "run", 2, cut_off=False)), "-o", str(tmp_path / "r.html")],
                 ["solve", "--model", "qwen2.5-7b", "--gpus", "8", "--gpu", "h100-80g", "--prompt-len", "1024",
                  "--response-len", "1024", "--frontier", str(tmp_path / "f.html")]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        assert "pip install -e '.[charts]'" in result.output and "Traceback" not in result.output
    assert not list(tmp_path.glob("*.html"))


def test_chart_path_with_another_suffix_is_bad_input(tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text(plan_to_toml(make_plan()))
    result = runner.invoke(app, ["explain", str(plan), "--chart", str(tmp_path / "memory.jpg")])
    assert result.exit_code == 2 and "--chart" in result.output


def test_report_on_a_directory_without_metrics_is_bad_input(tmp_path, monkeypatch):
    pytest.importorskip("altair", reason="the charts extra (altair) is not installed")
    result = runner.invoke(app, ["report", str(tmp_path), "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 2 and "metrics.jsonl" in result.output


def test_report_draws_a_run_still_writing_into_one_offline_html(tmp_path):
    pytest.importorskip("altair", reason="the charts extra (altair, vl-convert-python) is not installed")
    run = write_run(tmp_path / "run", 3, cut_off=True)
    out = tmp_path / "report.html"
    result = runner.invoke(app, ["report", str(run), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "3 steps (last 3)" in result.output
    html = out.read_text()
    # Vega is inlined: no script is fetched from a CDN.
    assert "<script src=" not in html and "cdn.jsdelivr" not in html
    assert "sync log-prob gap" in html and "cpu_process_rss_sampled_peak" in html


def test_report_json_prints_what_was_drawn_and_errors_as_json_on_stdout(tmp_path):
    import json

    pytest.importorskip("altair", reason="the charts extra (altair, vl-convert-python) is not installed")
    run = write_run(tmp_path / "run", 3, cut_off=True)
    out = tmp_path / "report.html"
    result = runner.invoke(app, ["report", str(run), "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    drawn = json.loads(result.stdout)
    assert drawn == {"output": str(out), "metrics_file": str(run / "metrics.jsonl"), "steps": 3, "last_step": 3,
                     "steps_per_point": 1, "skipped_lines": 1,
                     "notes": ["the last line, still being written, is left out"]}
    result = runner.invoke(app, ["report", str(tmp_path), "-o", str(out), "--json"])
    assert result.exit_code == 2 and json.loads(result.stdout)["error"]["field"] == "RUN_DIR"


def test_report_without_o_writes_beside_the_run_and_says_where_never_into_the_cwd(tmp_path, monkeypatch):
    pytest.importorskip("altair", reason="the charts extra (altair, vl-convert-python) is not installed")
    run = write_run(tmp_path / "run", 2, cut_off=False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    result = runner.invoke(app, ["report", str(run)])
    assert result.exit_code == 0, result.output
    assert (run / "report.html").is_file() and not list(elsewhere.iterdir())
    assert str(run / "report.html") in "".join(result.output.split())


# --- issue 27: charts that do not mislead ------------------------------------------------------


@pytest.mark.parametrize("overrides", [{}, {"model.lora.rank": 64}, {"algorithm.adv_estimator": "gae",
                                                                     "critic.ppo_micro_batch_size_per_gpu": 2}])
def test_memory_segments_group_every_component_and_stack_to_each_phases_peak(overrides):
    """Invariant: the grouped stack of a phase sums to its peak, bottom first in MEMORY_GROUPS order."""
    import itertools

    from rlplan.planner.charts import MEMORY_GROUPS, component_group, memory_segments

    report = predict_memory(make_plan(overrides=overrides))
    data = memory_chart_data(report)
    segments = memory_segments(data)
    for phase in report.phases:
        mine = [s for s in segments if s["phase"] == phase.name]
        assert [s["group_order"] for s in mine] == sorted(s["group_order"] for s in mine)
        assert math.isclose(mine[-1]["y1"], phase.peak_bytes / GIB, abs_tol=0.01 * len(phase.components))
        assert all(math.isclose(a["y1"], b["y0"], abs_tol=1e-6) for a, b in itertools.pairwise(mine))
    assert {component_group(c.name, c.scope) for p in report.phases for c in p.components} <= set(MEMORY_GROUPS)
    expected = {"kv_cache": "KV cache", "actor_optimizer_state": "optimizer", "actor_grads": "gradients",
                "activations": "activations", "logits_head": "loss head", "actor_params": "weights",
                "vllm_weights": "engine", "cuda_context_and_nccl": "overheads"}
    assert {name: component_group(name) for name in expected} == expected


def test_host_ram_is_scaled_to_the_data_and_a_far_limit_is_said_not_drawn():
    pytest.importorskip("altair", reason="the charts extra (altair) is not installed")
    from rlplan.planner.charts import _host_panel

    data = memory_chart_data(predict_memory(make_plan()))
    far = _host_panel(data).to_dict()
    assert "of 1024 GiB" in far["title"] and not any(layer.get("mark", {}).get("type") == "rule"
                                                     for layer in far["layer"])
    near = _host_panel(dict(data, host_limit_gib=round(sum(r["gib"] for r in data["host_bars"]) * 1.2, 3))).to_dict()
    assert any(layer["mark"]["type"] == "rule" for layer in near["layer"])


def test_frontier_axes_span_the_data_not_decades_beyond_it():
    from rlplan.planner.charts import frontier_axis_domains

    rows = [{"step_time_s": t, "gpu_peak_gib": g} for t, g in ((100.0, 78.60), (175.0, 78.66))]
    (t_low, t_high), (g_low, g_high) = frontier_axis_domains(rows, 79.2)
    assert 80 < t_low < 100 and 175 < t_high < 210
    # A 0.06 GiB spread is shown against the GPU's limit, not blown up to fill the panel.
    assert g_high >= 79.2 and g_high - g_low >= 0.1 * 79.2


def test_a_report_names_the_demo_run_by_its_folder_and_carries_the_plan_and_per_process_on_a_cpu(tmp_path):
    pytest.importorskip("altair", reason="the charts extra (altair, vl-convert-python) is not installed")
    from rlplan.planner.commands.chart_commands import report_command

    run = write_run(tmp_path / "demo" / "run", 2, cut_off=False)
    out = tmp_path / "r.html"
    report_command(str(run), str(out))
    html = out.read_text()
    assert "run run" not in html and "demo/run" in html
    assert "prompt 512 + response 1024 tokens" in html and "8 x test-gpu" in html
    assert "peak GiB per process" in html  # metrics_record's measure is the CPU runtime's RSS


def test_a_frontier_with_nothing_refused_draws_one_panel_not_the_same_one_twice():
    pytest.importorskip("altair", reason="the charts extra (altair) is not installed")
    from rlplan.planner.charts import frontier_chart

    rows = [{"step_time_s": 100.0 + i, "gpu_peak_gib": 70.0, "feasible": True, "rank": i + 1,
             "mark": "chosen" if i == 0 else "feasible", "reason": "", "label": "#1" if i == 0 else "", "knobs": ""}
            for i in range(3)]
    spec = frontier_chart({"points": rows, "gpu_limit_gib": 79.2, "key": ["#1: the plan written"]}, "t").to_dict()
    assert "hconcat" not in json.dumps(spec) and "all 3 fit" in json.dumps(spec)
    refused = [*rows, dict(rows[-1], feasible=False, rank=0, mark="infeasible", step_time_s=900.0)]
    spec = frontier_chart({"points": refused, "gpu_limit_gib": 79.2, "key": ["#1: the plan written"]}, "t").to_dict()
    assert "hconcat" in json.dumps(spec)


# --- as drawn: each chart kind rendered headless (vl-convert), checked on what it draws ------------------------------


def looks_right(drawing) -> list[str]:
    """What a user would see wrong in any chart: a text over another, a value or label crossed by a limit line, a
    mark's text outside its panel, a title off the picture."""
    import importlib.util

    from tests.planner.drawn import (
        ink_on_the_edge,
        off_the_canvas,
        overlapping_texts,
        texts_across_rules,
        texts_outside_their_panel,
    )

    # The PNG's edge pixels are read with Pillow, which the charts extra does not bring (the runtime's stack does).
    edges = ink_on_the_edge(drawing) if importlib.util.find_spec("PIL") else []
    return [*overlapping_texts(drawing), *texts_across_rules(drawing), *texts_outside_their_panel(drawing),
            *off_the_canvas(drawing), *(f"ink on the {side} edge" for side in edges)]


@pytest.mark.parametrize("overrides,gpu_mem_gib", [
    ({}, 80.0),                                                     # fits
    ({}, 40.0),                                                     # over the GPU: the bar crosses both lines
    ({"actor.ppo_micro_batch_size_per_gpu": 16}, 80.0),             # over by a lot, in the update
    ({"model.lora.rank": 64, "rollout.gpu_memory_utilization": 0.3}, 24.0),
    ({"cluster.host_memory_gib": 40.0}, 80.0),                      # host RAM binds
])
def test_the_memory_chart_draws_no_text_over_another_or_across_a_limit_line(overrides, gpu_mem_gib):
    """Issue 35 item 2: in an over-budget plan's chart the GPU line's label, the margin's label and a bar's value
    ran into each other, and the binding label past the panel into the legend."""
    pytest.importorskip("vl_convert", reason="the charts extra (vl-convert-python) is not installed")
    from rlplan.planner.charts import memory_chart
    from tests.planner.drawn import drawn

    data = memory_chart_data(predict_memory(make_plan(gpu_mem_gib=gpu_mem_gib, overrides=overrides)), 4.0)
    drawing = drawn(memory_chart(data, "test-model"))
    assert looks_right(drawing) == []
    subtitle = [line for item in drawing.of(role="title-subtitle") for line in item.text]
    assert subtitle == [data["binding"]["label"]]
    legend = {line for item in drawing.of(role="legend-label") for line in item.text}
    assert {"GPU memory 80.0 GiB" if gpu_mem_gib == 80.0 else f"GPU memory {gpu_mem_gib:.1f} GiB",
            "margin: 4.0 GiB kept free"} <= legend


@pytest.fixture(scope="module")
def public_comparison():
    """The README's compare example: PPO, Qwen2-7B-Instruct, 8 x H100 (tests/data/verl_logs/public)."""
    from rlplan.planner.commands.compare_commands import load_plan_or_script, read_verl_log
    from rlplan.planner.compare import compare_run
    from rlplan.planner.compare_report import comparison_json
    from rlplan.planner.profile import DEFAULT_PROFILE

    folder = Path(__file__).parent.parent / "data" / "verl_logs" / "public"
    plan, _ = load_plan_or_script(str(folder / "qwen2_7b_gsm8k_8gpu_min.sh"), gpu="h100-80g", gpu_mem=None,
                                  host_mem=1024.0, env=[], fixes={"rollout.enforce_eager": True})
    log = read_verl_log(str(folder / "verl_qwen2_7b_min.log"))
    return comparison_json(compare_run(plan, log, DEFAULT_PROFILE, None)), log.series("response_length/mean")


def test_the_compare_chart_draws_each_bar_over_its_own_label_and_the_forecast_whole(public_comparison):
    """Issue 35 item 2: the panels shared one offset scale, so each predicted time bar stood under the next phase's
    label and the last outside the plot; the trend panel's title was the forecast cut at 90 characters."""
    pytest.importorskip("vl_convert", reason="the charts extra (vl-convert-python) is not installed")
    from rlplan.planner.compare_report import comparison_chart
    from tests.planner.drawn import bars_off_their_labels, drawn

    payload, lengths = public_comparison
    drawing = drawn(comparison_chart(payload, "run.sh vs run.log", lengths))
    assert bars_off_their_labels(drawing, "concat_0", "metric") == []
    assert bars_off_their_labels(drawing, "concat_1", "phase") == []
    times = {(bar.datum["phase"], bar.datum["kind"]) for bar in drawing.of(marktype="rect", panel="concat_1")
             if "phase" in bar.datum}
    assert times == {(row["phase"], kind) for row in payload["times"] for kind in ("measured", "predicted")}
    assert looks_right(drawing) == []
    forecast = " ".join(line for item in drawing.of(role="title-subtitle", panel="concat_2") for line in item.text)
    assert forecast == payload["forecast"]["message"]


def test_the_frontier_draws_its_labels_clear_of_the_limit_lines_and_inside_its_panels(tight_solve):
    pytest.importorskip("vl_convert", reason="the charts extra (vl-convert-python) is not installed")
    from rlplan.planner.charts import frontier_chart
    from tests.planner.drawn import drawn

    request, result = tight_solve
    data = frontier_data(result.frontier, request.cluster.gpu.memory_gib, 3, margin_gib=1.2)
    drawing = drawn(frontier_chart(data, "qwen2.5-7b on 8 x RTX4090-24G"))
    assert looks_right(drawing) == []
    labels = {line for item in drawing.of(marktype="text", role="mark") for line in item.text if ":" not in line}
    assert labels == {row["label"] for row in data["points"] if row["label"]}


def test_the_run_report_draws_each_memory_bar_over_its_own_phase(tmp_path):
    pytest.importorskip("vl_convert", reason="the charts extra (vl-convert-python) is not installed")
    from rlplan.planner.charts import report_chart
    from tests.planner.drawn import bars_off_their_labels, drawn

    data = run_report_data([metrics_record(step) for step in range(1, 13)], {})
    drawing = drawn(report_chart(data, "test-model, run demo", "grpo on 8 x test-gpu"))
    memory = next(panel for panel in drawing.panels()
                  if any("kind" in item.datum for item in drawing.of(marktype="rect", panel=panel)))
    assert bars_off_their_labels(drawing, memory, "phase") == []
    assert looks_right(drawing) == []

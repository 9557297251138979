"""metrics.jsonl: one flushed JSON object per step; memory probes; the plan-versus-actual rows."""

from __future__ import annotations

import json
import math
import threading

import pytest

from rlplan.planner.phases import ControllerWork, Phase
from rlplan.runtime.metrics import (
    CPU_MEASURE,
    METRICS_FILE,
    STEP_ORDER,
    MetricsLog,
    PeakMemoryProbe,
    held_at_peak,
    measured,
    open_trackers,
    plan_versus_actual,
    read_metrics,
)


def test_each_step_is_one_json_line_readable_before_the_log_is_closed(tmp_path):
    log = MetricsLog(tmp_path)
    log.write({"step": 1, "reward_mean": 0.25, "sync_logprob_gap": 0.001, "time/rollout": 0.5})
    # Flushed per step: a killed run keeps every finished step.
    lines = (tmp_path / METRICS_FILE).read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1]
    log.write({"step": 2, "reward_mean": math.nan, "sync_logprob_gap": math.inf})
    log.close()
    records = read_metrics(tmp_path)
    assert records[0]["reward_mean"] == 0.25 and records[0]["time/rollout"] == 0.5
    # JSON has no NaN: non-finite numbers are written as null, and the file stays strict JSON.
    assert records[1]["reward_mean"] is None and records[1]["sync_logprob_gap"] is None


def test_resume_appends_and_a_fresh_run_truncates(tmp_path):
    first = MetricsLog(tmp_path)
    first.write({"step": 1})
    first.close()
    resumed = MetricsLog(tmp_path, resume=True)
    resumed.write({"step": 2})
    resumed.close()
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    fresh = MetricsLog(tmp_path)
    fresh.write({"step": 1})
    fresh.close()
    assert [r["step"] for r in read_metrics(tmp_path)] == [1]


def test_a_record_without_its_step_is_rejected(tmp_path):
    log = MetricsLog(tmp_path)
    with pytest.raises(ValueError, match="step"):
        log.write({"reward_mean": 1.0})
    log.close()


def _tracker_plan(tmp_path, *loggers):
    import attrs

    from tests.planner.plans import make_plan

    plan = make_plan()
    return plan.evolve(trainer=attrs.evolve(plan.trainer, logger=loggers, project_name="proj",
                                            experiment_name="exp", output_dir=str(tmp_path)))


def _log_two_steps(tmp_path, plan, console=None, *, resume=False):
    log = MetricsLog(tmp_path, resume=resume, trackers=open_trackers(plan, tmp_path, console, resume=resume))
    first = 1 if not resume else 3
    log.write({"step": first, "reward_mean": 0.25, "actor/grad_norm": 1.5, "memory_measure": CPU_MEASURE})
    log.write({"step": first + 1, "reward_mean": 0.75, "actor/grad_norm": math.nan})
    return log


def test_console_tracker_prints_one_line_per_step_only_when_the_plan_names_it(tmp_path):
    from rich.console import Console

    console = Console(record=True, width=200)
    _log_two_steps(tmp_path / "with", _tracker_plan(tmp_path, "console"), console).close()
    assert console.export_text().count("reward 0.") == 2
    silent = Console(record=True, width=200)
    _log_two_steps(tmp_path / "without", _tracker_plan(tmp_path, "tensorboard"), silent).close()
    assert silent.export_text() == ""


def test_tensorboard_tracker_writes_event_files_tensorboard_reads_back(tmp_path):
    pytest.importorskip("tensorboard", reason="needs the tensorboard extra")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _log_two_steps(tmp_path, _tracker_plan(tmp_path, "tensorboard")).close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("reward_mean")] == [(1, 0.25), (2, 0.75)]
    # A non-finite number is not a point on the chart; a label is not a scalar.
    assert [e.step for e in events.Scalars("actor/grad_norm")] == [1]
    assert "memory_measure" not in events.Tags()["scalars"]


def test_mlflow_tracker_logs_to_a_file_store_under_the_run_dir_and_resume_continues_the_run(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="needs the mlflow extra")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    plan = _tracker_plan(tmp_path, "mlflow")
    _log_two_steps(tmp_path, plan).close()
    _log_two_steps(tmp_path, plan, resume=True).close()
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("proj")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1 and runs[0].info.run_name == "exp"
    history = client.get_metric_history(runs[0].info.run_id, "reward_mean")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.25), (2, 0.75), (3, 0.25), (4, 0.75)]
    # The plan is the run's params, flattened to verl-style dotted keys.
    assert runs[0].data.params["trainer.experiment_name"] == "exp"
    assert runs[0].data.params["data.train_batch_size"] == str(plan.data.train_batch_size)


@pytest.fixture
def wandb_offline(monkeypatch):
    """W&B offline, its service and threads stopped after the test rather than during the interpreter's exit."""
    wandb = pytest.importorskip("wandb", reason="needs the wandb extra")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    yield
    wandb.teardown()


def test_wandb_tracker_runs_offline_under_the_run_dir(tmp_path, wandb_offline):
    plan = _tracker_plan(tmp_path, "wandb")
    log = _log_two_steps(tmp_path, plan)
    (tracker,) = log.trackers
    assert tracker.run.offline and tracker.run.project == "proj" and tracker.run.name == "exp"
    assert tracker.run.summary["reward_mean"] == 0.75 and tracker.run.config["trainer"]["logger"] == ["wandb"]
    log.close()
    run_id = (tmp_path / "wandb-run-id").read_text().strip()
    assert list((tmp_path / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))


def test_cpu_probe_sees_an_allocation_made_inside_the_phase():
    size = 192 * 2**20

    def allocate():
        block = bytearray(size)
        for offset in range(0, size, 4096):  # touch every page so it is resident; the loop lets the sampler run
            block[offset] = 1
        threading.Event().wait(0.05)  # hold the memory while the sampler thread gets the GIL
        return len(block)

    with PeakMemoryProbe("cpu") as idle:
        pass
    _, phase = measured("cpu", allocate)
    assert phase.measure == CPU_MEASURE
    assert phase.peak_bytes - idle.peak_bytes > size * 0.8
    assert phase.seconds > 0


def test_cpu_probe_splits_the_peak_into_its_file_backed_part_and_a_heap_allocation_is_not_in_it():
    size = 128 * 2**20

    def allocate():
        block = bytearray(size)
        for offset in range(0, size, 4096):
            block[offset] = 1
        threading.Event().wait(0.05)
        return len(block)

    with PeakMemoryProbe("cpu") as idle:
        pass
    _, phase = measured("cpu", allocate)
    assert idle.mapped_bytes is not None and phase.mapped_bytes is not None
    # The interpreter's own libraries are resident and file-backed; the bytearray is anonymous memory.
    assert 0 < phase.mapped_bytes < phase.peak_bytes
    assert phase.mapped_bytes - idle.mapped_bytes < size * 0.2 < size * 0.8 < phase.peak_bytes - idle.peak_bytes


def test_cpu_phases_carry_no_held_gpu_figure():
    _, phase = measured("cpu", lambda: None)
    assert phase.held_bytes is None


def test_held_memory_adds_what_the_driver_counts_beyond_the_pool_to_the_pools_peak():
    gib = 2**30
    # Pool peaked at 40 GiB, now 36 GiB reserved; the driver counts 37.2 GiB: 1.2 GiB context + NCCL.
    assert held_at_peak(40 * gib, 36 * gib, int(37.2 * gib)) == 40 * gib + int(1.2 * gib)
    # A driver figure below the pool (NVML sampled before a late allocation) adds nothing negative.
    assert held_at_peak(40 * gib, 36 * gib, 35 * gib) == 40 * gib


def test_the_step_order_names_every_phase_and_every_piece_of_controller_work_once():
    """Invariant: whatever phase a run reports or the planner prices, the table has a place for it."""
    assert sorted(STEP_ORDER) == sorted([*Phase, *ControllerWork])
    assert STEP_ORDER.index(Phase.ROLLOUT) < STEP_ORDER.index(ControllerWork.REWARD) < STEP_ORDER.index(Phase.ACTOR_UPDATE)


def test_plan_versus_actual_lists_every_phase_either_side_knows():
    rows = plan_versus_actual({"rollout": 2.0, "actor_update": 5.0}, {"actor_update": 3 * 2**30, "reward": 2**20}, CPU_MEASURE)
    by_phase = {row["phase"]: row for row in rows}
    assert [row["phase"] for row in rows] == ["rollout", "reward", "actor_update"]
    assert by_phase["actor_update"]["predicted_gib"] == 5.0 and by_phase["actor_update"]["measured_gib"] == 3.0
    assert by_phase["rollout"]["measured_gib"] is None and by_phase["reward"]["predicted_gib"] is None
    assert all(row["measure"] == CPU_MEASURE for row in rows)


@pytest.mark.parametrize("epochs", [1, 2])
def test_predicted_phases_omit_the_old_log_prob_pass_exactly_when_an_on_policy_step_skips_it(epochs):
    import attrs

    from rlplan.planner.layout import reuses_update_log_probs
    from rlplan.runtime.metrics import predicted_phase_peaks
    from tests.planner.plans import make_plan

    plan = make_plan()
    plan = plan.evolve(actor=attrs.evolve(plan.actor, ppo_mini_batch_size=plan.data.train_batch_size,
                                          ppo_epochs=epochs))
    assert reuses_update_log_probs(plan) == (epochs == 1)
    phases = predicted_phase_peaks(plan)
    assert "actor_update" in phases
    assert ("old_log_prob" in phases) == (epochs == 2)


def test_the_plan_versus_actual_table_prints_the_error_and_a_verdict_against_the_stated_bound():
    import io

    from rich.console import Console

    from rlplan.runtime.metrics import PREDICTION_BOUND, plan_versus_actual_table, prediction_verdict

    rows = plan_versus_actual({"rollout": 2.0, "actor_update": 0.5, "old_log_prob": 1.5},
                              {"rollout": 2 * 2**30, "actor_update": 2**30, "old_log_prob": 2**30}, CPU_MEASURE)
    verdicts = {row["phase"]: (round(row["error"], 2), row["verdict"]) for row in rows}
    assert verdicts == {"rollout": (0.0, "holds"), "actor_update": (-0.5, "UNDER-predicted"),
                        "old_log_prob": (0.5, "over, beyond the bound")}
    out = io.StringIO()
    Console(file=out, width=200).print(plan_versus_actual_table(rows))
    text = out.getvalue()
    assert "-50 %" in text and "UNDER-predicted" in text and "+50 %" in text and "per process" in text
    low, high = PREDICTION_BOUND
    assert low < 0 < high and f"{100 * low:+.0f} %" in text
    # The bound's edges hold; just past them does not.
    assert prediction_verdict(low) == prediction_verdict(high) == "holds"
    assert prediction_verdict(low - 0.001) == "UNDER-predicted"


def test_with_the_built_in_baselines_only_the_under_side_is_held_and_the_table_says_how_to_measure_them():
    import io

    import attrs
    from rich.console import Console

    from rlplan.planner.profile import DEFAULT_PROFILE
    from rlplan.runtime.metrics import (
        PREDICTION_BOUND,
        PREDICTION_BOUND_BUILT_IN,
        plan_versus_actual_table,
        prediction_bound,
    )

    measured_here = attrs.evolve(DEFAULT_PROFILE, cpu_trainer_baseline_measured_gib=0.5,
                                 cpu_rollout_baseline_measured_gib=0.8)
    assert prediction_bound(DEFAULT_PROFILE) == PREDICTION_BOUND_BUILT_IN
    assert prediction_bound(measured_here) == PREDICTION_BOUND
    rows = plan_versus_actual({"rollout": 3.0, "actor_update": 0.5}, {"rollout": 2**31, "actor_update": 2**30},
                              CPU_MEASURE, bound=PREDICTION_BOUND_BUILT_IN)
    assert {row["phase"]: row["verdict"] for row in rows} == {"rollout": "holds", "actor_update": "UNDER-predicted"}
    out = io.StringIO()
    Console(file=out, width=300).print(plan_versus_actual_table(rows))
    assert "built-in bounds" in out.getvalue() and "rlplan calibrate --cpu" in out.getvalue()


def test_a_gpu_run_gets_the_error_but_no_verdict_against_the_cpu_runtimes_bound():
    from rlplan.runtime.metrics import GPU_MEASURE

    (row,) = plan_versus_actual({"actor_update": 60.0}, {"actor_update": 50 * 2**30}, GPU_MEASURE)
    assert round(row["error"], 2) == 0.2 and row["verdict"] == "-"


def test_cpu_probe_catches_a_spike_freed_inside_the_phase():
    """The kernel's peak mark sees an allocation returned to the system before the phase ends, however short:
    a sampler can miss it (glibc hands large temporaries back at free)."""
    from rlplan.runtime import metrics

    if not metrics._reset_peak_rss():
        pytest.skip("this kernel or sandbox refuses /proc/self/clear_refs: the probe samples, and may miss a spike")
    size = 128 * 2**20

    def spike():
        block = bytearray(size)  # zero-filled: every page touched, then returned at free
        return len(block)

    with PeakMemoryProbe("cpu") as idle:
        pass
    _, phase = measured("cpu", spike)
    assert phase.peak_bytes - idle.peak_bytes > size * 0.8


def test_a_probe_inside_another_keeps_the_outer_probes_peak():
    """Invariant: a nested probe never resets the mark an open probe reads (it samples instead)."""
    size = 96 * 2**20
    with PeakMemoryProbe("cpu") as outer:
        start = outer.peak_bytes
        block = bytearray(size)
        del block
        with PeakMemoryProbe("cpu"):
            pass
    assert outer.peak_bytes - start > size * 0.8

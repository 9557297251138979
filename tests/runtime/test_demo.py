"""The live demo (`rlplan demo`) and a plan of another shape on this machine: plan-versus-actual holds within the
stated bound once `calibrate --cpu` has measured this machine's process baselines.

The recorded run (tests/data/cpu_demo_run) is another machine's measurement; these tests measure this one. Each
starts Ray and the vLLM CPU engine and trains a few steps (minutes on 2 cores): run the file alone.
"""

from __future__ import annotations

import json

import attrs
import pytest

pytestmark = [pytest.mark.runtime, pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def calibrated_profile(tmp_path_factory):
    """This machine's CPU process baselines, measured as `rlplan calibrate --cpu` does, in a profile file."""
    pytest.importorskip("torch")
    pytest.importorskip("vllm")
    import torch

    from rlplan.planner.profile import DEFAULT_PROFILE, profile_to_toml
    from rlplan.runtime.calibrate import measure_cpu_baselines

    if torch.cuda.is_available():
        pytest.skip("the CPU prediction is for a machine without an accelerator")
    work = tmp_path_factory.mktemp("baselines")
    found = measure_cpu_baselines(work)
    # The shared libraries' pages alone are a few hundred MiB; the baseline is more than them and less than a GiB.
    assert 0.2 < found.trainer_gib < 1.5 and 0.2 < found.engine_gib < 2.5, found
    assert all(0 < found.mapped_gib[phase] < found.peaks_gib[phase] for phase in found.peaks_gib), found
    profile = attrs.evolve(DEFAULT_PROFILE, name="this-cpu", cpu_trainer_baseline_measured_gib=found.trainer_gib,
                           cpu_rollout_baseline_measured_gib=found.engine_gib)
    path = work / "cpu.toml"
    path.write_text(profile_to_toml(profile))
    return str(path)


def _assert_every_phase_holds(rows):
    from rlplan.runtime.metrics import PREDICTION_BOUND, prediction_error, prediction_verdict

    measured = {row["phase"]: row for row in rows if row["measured_gib"] is not None and row["predicted_gib"]}
    assert {"rollout", "actor_update", "weight_sync"} <= set(measured)
    for phase, row in measured.items():
        error = prediction_error(row["predicted_gib"], row["measured_gib"])
        assert tuple(row["bound"]) == PREDICTION_BOUND
        assert row["verdict"] == prediction_verdict(error) == "holds", (
            f"{phase}: predicted {row['predicted_gib']:.3f} GiB, measured {row['measured_gib']:.3f} GiB "
            f"({100 * error:+.1f} %, bound {PREDICTION_BOUND})")


def test_the_live_demos_plan_versus_actual_holds_on_this_cpu(tmp_path, capsys, calibrated_profile):
    from rlplan.planner.commands.commands_io import ExitCode
    from rlplan.runtime.commands import demo_command

    code = demo_command(str(tmp_path / "demo"), steps=3, as_json=True, profile_path=calibrated_profile)
    captured = capsys.readouterr()
    assert code == ExitCode.OK, captured.err[-3000:]
    result = json.loads(captured.out)
    rows = result["plan_versus_actual"]
    assert "measured on this machine" in result["cpu_baselines"]
    assert "old_log_prob" in {row["phase"] for row in rows}
    _assert_every_phase_holds(rows)
    # The demo ends with the commands that come next, on its own paths.
    assert f"rlplan report {tmp_path / 'demo' / 'run'}" in captured.err


def test_a_plan_of_another_shape_holds_on_this_cpu(tmp_path, capsys, calibrated_profile):
    """A model neither the heap terms were fitted on (planner/profile.py) nor the baselines measured with: four
    layers of width 384, longer responses, a smaller batch."""
    from rlplan.planner.commands.commands_io import ExitCode, make_console
    from rlplan.planner.profile import load_profile_toml
    from rlplan.runtime.commands import execute
    from rlplan.runtime.demo_workload import demo_plan, solve_demo_plan
    from rlplan.runtime.loop import RunOptions
    from rlplan.runtime.tiny import build_tiny_model, write_toy_dataset

    model = build_tiny_model(tmp_path / "model", num_layers=4, hidden_size=384, intermediate_size=960, vocab_size=256)
    train, _ = write_toy_dataset(tmp_path / "data" / "train.parquet", 12)
    workload = demo_plan(model, train, tmp_path / "run", steps=3, algorithm="grpo_full", train_batch_size=4, n=4)
    workload = workload.evolve(data=attrs.evolve(workload.data, max_response_length=24))
    plan = solve_demo_plan(workload)
    profile = load_profile_toml(open(calibrated_profile).read())
    code = execute(plan, RunOptions(output_dir=tmp_path / "run", profile=profile), make_console(stderr=True),
                   as_json=True)
    captured = capsys.readouterr()
    assert code == ExitCode.OK, captured.err[-3000:]
    _assert_every_phase_holds(json.loads(captured.out)["plan_versus_actual"])

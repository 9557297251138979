"""The live demo (`rlplan demo`) on this machine: its plan-versus-actual holds within the stated bound.

The recorded run (tests/data/cpu_demo_run) is another machine's measurement; this test measures this one. It
starts Ray and the vLLM CPU engine and trains a few steps (minutes on 2 cores): run it alone.
"""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.runtime, pytest.mark.vllm, pytest.mark.slow]


def test_the_live_demos_plan_versus_actual_holds_on_this_cpu(tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("vllm")
    import torch

    from rlplan.planner.commands.commands_io import ExitCode
    from rlplan.runtime.commands import demo_command
    from rlplan.runtime.metrics import PREDICTION_BOUND, prediction_error, prediction_verdict

    if torch.cuda.is_available():
        pytest.skip("the demo's CPU prediction is for a machine without an accelerator")
    code = demo_command(str(tmp_path / "demo"), steps=3, as_json=True)
    captured = capsys.readouterr()
    assert code == ExitCode.OK, captured.err[-3000:]
    rows = json.loads(captured.out)["plan_versus_actual"]
    measured = {row["phase"]: row for row in rows if row["measured_gib"] is not None and row["predicted_gib"]}
    assert {"rollout", "actor_update", "old_log_prob", "weight_sync"} <= set(measured)
    for phase, row in measured.items():
        error = prediction_error(row["predicted_gib"], row["measured_gib"])
        assert row["verdict"] == prediction_verdict(error) == "holds", (
            f"{phase}: predicted {row['predicted_gib']:.3f} GiB, measured {row['measured_gib']:.3f} GiB "
            f"({100 * error:+.1f} %, bound {PREDICTION_BOUND})")
    # The demo ends with the commands that come next, on its own paths.
    assert f"rlplan report {tmp_path / 'demo' / 'run'}" in captured.err

"""A run whose Ray workers cannot start ends within a bounded time with one paragraph naming the cause, never hangs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rlplan.planner.errors import PlanError
from rlplan.runtime.ray_session import (
    CRASHED_AT_START,
    SessionLogs,
    check_ray_temp_dir,
    ray_temp_root,
    start_failure,
)


@pytest.mark.parametrize("variable", ["TMPDIR", "RAY_TMPDIR"])
def test_a_ray_temp_dir_inside_the_virtualenv_is_refused_naming_the_variable_and_the_fix(tmp_path, variable):
    venv = tmp_path / "venv"
    environ = {"VIRTUAL_ENV": str(venv), variable: str(venv / "tmp")}
    with pytest.raises(PlanError) as caught:
        check_ray_temp_dir(environ)
    assert caught.value.field == variable
    assert str(venv) in caught.value.message and "virtualenv" in caught.value.message
    assert f"export {variable}=/tmp" in caught.value.fix


@pytest.mark.parametrize("environ", [
    {"TMPDIR": "/anywhere/tmp"},  # no virtualenv
    {"VIRTUAL_ENV": "/venvs/a", "TMPDIR": "/tmp/x"},  # outside it
    {"VIRTUAL_ENV": "/venvs/a", "RAY_TMPDIR": "/tmp/x", "TMPDIR": "/venvs/a/tmp"},  # RAY_TMPDIR wins, as in Ray
    {"VIRTUAL_ENV": "/venvs/a"},  # /tmp
])
def test_a_ray_temp_dir_outside_the_virtualenv_passes(environ):
    check_ray_temp_dir(environ)


def test_the_temp_dir_is_picked_as_ray_picks_it():
    assert ray_temp_root({"RAY_TMPDIR": "/a", "TMPDIR": "/b"}) == ("RAY_TMPDIR", "/a")
    assert ray_temp_root({"TMPDIR": "/b"}) == ("TMPDIR", "/b")
    assert ray_temp_root({}) == ("", "/tmp")


def test_a_worker_that_died_at_start_is_reported_with_what_it_wrote(tmp_path):
    (tmp_path / "raylet.out").write_text(
        "[2026-11-28 20:10:48,542 E 1 1] (raylet) worker_pool.cc:660: Some workers of the worker process(32502) have "
        f"not registered within the timeout. The process is dead, {CRASHED_AT_START}.\n")
    (tmp_path / "raylet.err").write_text("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                                         "ValueError: temp_dir must not be child directory of virtualenv root\n")
    logs = SessionLogs(tmp_path)
    error = start_failure("loading the model on 2 trainer ranks", logs, waited_s=61, crashed=True)
    assert error.field == "ray workers"
    assert "died at start while loading the model" in error.message
    assert "ValueError: temp_dir must not be child directory of virtualenv root" in error.message
    assert str(tmp_path) in error.fix and "\n" not in error.paragraph()


def test_a_stage_past_its_deadline_says_so_without_logs():
    error = start_failure("building the vLLM engine", None, waited_s=1200, crashed=False)
    assert "building the vLLM engine did not finish within 1200 s" in error.message
    assert "RLPLAN_WORKER_START_TIMEOUT_S" in error.fix


@pytest.mark.runtime
def test_run_refuses_a_ray_temp_dir_inside_the_virtualenv_before_starting_anything(tmp_path, capsys, monkeypatch,
                                                                                    tiny_model_dir):
    from rlplan.planner.commands.commands_io import ExitCode
    from rlplan.planner.planfile import plan_to_toml
    from rlplan.runtime.commands import run_command
    from rlplan.runtime.demo_workload import demo_plan
    from rlplan.runtime.tiny import write_toy_dataset

    train_file, _ = write_toy_dataset(tmp_path / "data" / "train.parquet", 16)
    plan_file = tmp_path / "plan.toml"
    plan_file.write_text(plan_to_toml(demo_plan(tiny_model_dir, train_file, tmp_path / "out", steps=1)))
    monkeypatch.setenv("VIRTUAL_ENV", str(tmp_path / "venv"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "venv" / "tmp"))
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    code = run_command(str(plan_file), resume=False, address=None, output_dir=str(tmp_path / "out"), max_steps=1)
    printed = " ".join(capsys.readouterr().out.split())
    assert code == ExitCode.BAD_INPUT
    assert "TMPDIR:" in printed and "virtualenv" in printed and "Fix:" in printed and "Traceback" not in printed
    assert not (tmp_path / "out").exists()


@pytest.mark.runtime
@pytest.mark.slow
def test_a_run_whose_ray_workers_die_at_start_exits_within_bounded_time_naming_the_cause(tmp_path, tiny_model_dir):
    """Every Ray worker process exits at start (a sitecustomize on PYTHONPATH, as a broken environment would):
    `rlplan run` used to wait for ever at "Started a local Ray instance"; now it stops once the raylet has seen
    a worker die (its registration timeout, lowered here to 10 s) and quotes what the worker wrote."""
    pytest.importorskip("ray")
    from rlplan.planner.planfile import plan_to_toml
    from rlplan.runtime.demo_workload import demo_plan
    from rlplan.runtime.tiny import write_toy_dataset

    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(textwrap.dedent("""
        import os, sys
        if any(arg.endswith("default_worker.py") for arg in sys.argv):
            sys.stderr.write("RuntimeError: this test's worker refuses to start\\n")
            os._exit(3)
    """))
    train_file, _ = write_toy_dataset(tmp_path / "data" / "train.parquet", 16)
    plan_file = tmp_path / "plan.toml"
    plan_file.write_text(plan_to_toml(demo_plan(tiny_model_dir, train_file, tmp_path / "out", steps=1)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(hooks), os.environ.get("PYTHONPATH")])),
           "RAY_worker_register_timeout_seconds": "10", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    rlplan = Path(sys.executable).with_name("rlplan")
    started = time.monotonic()
    completed = subprocess.run([str(rlplan), "run", str(plan_file), "--json"], env=env, capture_output=True,
                               text=True, timeout=600, check=False)
    elapsed = time.monotonic() - started
    assert completed.returncode in (1, 2), (completed.returncode, completed.stderr[-2000:])
    error = json.loads(completed.stdout)["error"]
    assert error["field"] == "ray workers"
    assert "died at start" in error["message"] and "this test's worker refuses to start" in error["message"]
    assert "raylet.err" in error["fix"]
    print(f"ended after {elapsed:.0f} s")

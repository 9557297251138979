"""The run's screen (runtime/progress.py): the stage spinner before the first step, then the step bar."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from rlplan.runtime.progress import RunProgress, run_progress, step_tokens_per_s


def _screen() -> tuple[io.StringIO, Console]:
    out = io.StringIO()
    return out, Console(file=out, width=160, force_terminal=False)


def test_the_stage_is_named_until_the_steps_start_then_the_bar_has_eta_and_tokens_per_second():
    out, console = _screen()
    progress = run_progress(console)
    screen = RunProgress(progress)
    screen.stage("starting Ray")
    screen.stage("vLLM is building its engine")
    assert [task.description for task in progress.tasks] == ["vLLM is building its engine"]
    assert progress.tasks[0].total is None  # no total: a spinner, not a bar at 0 %
    screen.start_steps(first_step=1, last_step=4)
    (task,) = progress.tasks
    assert task.description == "training" and (task.completed, task.total) == (0, 4)
    record = {"throughput/actor_update_tokens_per_s": 2000.0, "time/actor_update": 1.0, "time/step": 4.0}
    screen.step_done(1, record)
    assert task.completed == 1 and task.fields["rate"] == "500 tok/s"
    console.print(progress.get_renderable())
    text = out.getvalue()
    assert "1/4" in text and "eta" in text and "500 tok/s" in text


def test_a_resumed_run_starts_its_bar_at_the_restored_step():
    progress = run_progress(_screen()[1])
    screen = RunProgress(progress)
    screen.start_steps(first_step=7, last_step=10)
    assert (progress.tasks[0].completed, progress.tasks[0].total) == (6, 10)


@pytest.mark.parametrize("record", [{}, {"time/step": 2.0}, {"throughput/actor_update_tokens_per_s": 0.0,
                                                             "time/actor_update": 1.0, "time/step": 2.0}])
def test_tokens_per_second_is_left_out_when_the_step_did_not_time_its_update(record):
    assert step_tokens_per_s(record) is None


def test_without_a_screen_every_call_is_a_no_op():
    screen = RunProgress(None)
    screen.stage("starting Ray")
    screen.start_steps(1, 3)
    screen.step_done(1, {"time/step": 1.0})

"""What `rlplan run` shows while it works: a spinner naming the stage from Ray's start to the first step (vLLM
builds its engine for up to a minute on a CPU, and a blank screen reads as a hang), then the step bar with its
ETA and the tokens per second of the last step.

Rich is imported by the caller (runtime/commands.py builds the Progress); this module only drives it, so the
loop can run without a screen (progress=None, as the tests and --json's stdout need).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID


def run_progress(console: Console) -> Progress:
    """The run's rich Progress: spinner, what is happening, bar, steps done, elapsed, ETA, tokens/s."""
    from rich.progress import (
        BarColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    # The steps done and the "eta" label are fields: a stage (no total) shows neither "0/?" nor an empty ETA.
    return Progress(
        SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[done]}"),
        TimeElapsedColumn(), TextColumn("{task.fields[eta]}"), TimeRemainingColumn(), TextColumn("{task.fields[rate]}"),
        console=console,
    )


def step_tokens_per_s(record: dict[str, Any]) -> float | None:
    """Tokens of the step's batch (prompts and responses, as the update saw them) per second of the whole step."""
    update_rate, update_s, step_s = (record.get(key) for key in (
        "throughput/actor_update_tokens_per_s", "time/actor_update", "time/step"))
    if not (update_rate and update_s and step_s):
        return None
    return update_rate * update_s / step_s


class RunProgress:
    """The stage spinner, then the step bar, on one rich Progress (or nothing, when there is no screen)."""

    def __init__(self, progress: Progress | None = None) -> None:
        self.progress = progress
        self.stage_task: TaskID | None = None
        self.step_task: TaskID | None = None
        self.last_step = 0

    def stage(self, text: str) -> None:
        """Say what the run is doing before its first step (a bar with no total spins)."""
        if self.progress is None:
            return
        if self.stage_task is None:
            self.stage_task = self.progress.add_task(text, total=None, rate="", done="", eta="")
        else:
            self.progress.update(self.stage_task, description=text)

    def start_steps(self, first_step: int, last_step: int) -> None:
        if self.progress is None:
            return
        if self.stage_task is not None:
            self.progress.remove_task(self.stage_task)
            self.stage_task = None
        self.last_step = last_step
        self.step_task = self.progress.add_task("training", total=last_step, completed=first_step - 1, rate="",
                                                done=f"{first_step - 1}/{last_step}", eta="eta")

    def step_done(self, step: int, record: dict[str, Any]) -> None:
        if self.progress is None or self.step_task is None:
            return
        rate = step_tokens_per_s(record)
        self.progress.update(self.step_task, completed=step, rate=f"{rate:,.0f} tok/s" if rate else "",
                             done=f"{step}/{self.last_step}")

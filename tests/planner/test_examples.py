"""The example gallery (examples/): each checked-in plan validates, fits and renders, and each entry of
gallery.toml still solves with today's solver (by the same code `python examples/regenerate.py` runs)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlplan.planner.commands.cli import app
from rlplan.planner.commands.commands_io import load_plan
from rlplan.planner.memory import predict_memory
from rlplan.planner.presets import resolve_gpu
from rlplan.planner.render import render_plan
from rlplan.planner.rules import check_plan
from rlplan.planner.verl_import import import_verl_script
from tests.repo_scripts import load_script

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


REGENERATE = load_script("examples/regenerate.py")
ENTRIES = REGENERATE.gallery()
NAMES = [entry["name"] for entry in ENTRIES]


def _valid_fitting_and_renderable(folder: Path) -> None:
    plan = load_plan(folder / "plan.toml")
    report = check_plan(plan)
    assert report.valid, [v.message for v in report.errors]
    assert predict_memory(plan).fits
    script = render_plan(plan, "verl")
    # The script verl would be launched with reads back as a plan that verl's rules accept.
    back = import_verl_script(script, gpu=plan.cluster.gpu, host_memory_gib=plan.cluster.host_memory_gib, env={},
                              local_config_reader=lambda path: None).plan
    assert check_plan(back).valid


def test_every_gallery_entry_has_its_folder_and_no_folder_is_stale():
    folders = {path.parent.name for path in EXAMPLES.glob("*/plan.toml")}
    assert folders == set(NAMES) and len(NAMES) == len(set(NAMES))
    assert (EXAMPLES / "README.md").read_text(encoding="utf-8") == REGENERATE.readme(ENTRIES)


@pytest.mark.parametrize("name", NAMES)
def test_a_checked_in_example_validates_fits_and_renders(name):
    folder = EXAMPLES / name
    _valid_fitting_and_renderable(folder)
    assert (folder / "run.sh").read_text(encoding="utf-8").startswith("#!/usr/bin/env bash")
    back = import_verl_script((folder / "run.sh").read_text(encoding="utf-8"), gpu=resolve_gpu("h100-80g"),
                              host_memory_gib=1024.0, env={}, local_config_reader=lambda path: None)
    assert back.plan.model.path == load_plan(folder / "plan.toml").model.path


@pytest.mark.parametrize("entry", ENTRIES, ids=NAMES)
def test_a_gallery_entry_regenerates_with_todays_solver(entry, tmp_path, monkeypatch):
    """Not byte-identical (the solver's defaults move): the regenerated example must still solve, fit and render."""
    runner = CliRunner()

    def rlplan(*args):
        result = runner.invoke(app, [str(arg) for arg in args])
        assert result.exit_code == 0, result.output

    monkeypatch.setattr(REGENERATE, "rlplan", rlplan)
    _valid_fitting_and_renderable(REGENERATE.regenerate(entry, tmp_path))


def test_every_plan_file_in_the_gallery_validates():
    """Issue 35 item 10: the SGLang example kept its imported.toml (verl's overrides as verl would run them, with no
    micro batch), which `rlplan validate` refused with exit 2: a user who copied it started from an error. A plan
    file in examples/ is one that validates."""
    plans = sorted(path for path in EXAMPLES.glob("*/*.toml"))
    assert plans and all(path.name == "plan.toml" for path in plans), plans
    for path in plans:
        result = CliRunner().invoke(app, ["validate", str(path)])
        assert result.exit_code == 0, (path, result.output[-2000:])

"""The commands layer of `compare` and `calibrate --from-verl-log` (planner/compare_commands.py) against hostile use
(issue 41): it never writes over its own inputs or a read-only file, and never prints the process environment."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from tests.planner.cli_runner import invoke

LOGS = Path(__file__).resolve().parents[2] / "data" / "verl_logs"
SCRIPT = LOGS / "grpo_qwen2.5-7b_long.sh"
LOG = LOGS / "v03_console.log"


@pytest.fixture
def inputs(tmp_path):
    """Copies of a script and its log, and a symlink to each, in a folder of the test's own."""
    script, log = tmp_path / "run.sh", tmp_path / "run.log"
    script.write_bytes(SCRIPT.read_bytes())
    log.write_bytes(LOG.read_bytes())
    (tmp_path / "link-to-log.toml").symlink_to(log)
    (tmp_path / "run.html").symlink_to(script)
    return script, log


def _unchanged(paths, before):
    return all(path.read_bytes() == content for path, content in zip(paths, before, strict=True))


@pytest.mark.parametrize("output", ["run.log", "run.sh", "link-to-log.toml"])
def test_calibrate_never_writes_its_profile_over_a_log_or_plan_it_reads(inputs, tmp_path, output):
    script, log = inputs
    before = [script.read_bytes(), log.read_bytes()]
    result = invoke("calibrate", "--from-verl-log", str(log), "--plan", str(script), "--gpu", "h100-80g",
                    "-o", str(tmp_path / output))
    assert result.exit_code == 2 and "--output" in result.output and "same file" in result.output
    assert _unchanged([script, log], before)


@pytest.mark.parametrize("chart", ["run.html", "run.log"])
def test_compare_never_draws_its_chart_over_its_own_script_or_log(inputs, tmp_path, chart):
    script, log = inputs
    if chart == "run.log":  # a log named like a chart
        log = log.rename(tmp_path / "log.html")
        chart = "log.html"
    before = [script.read_bytes(), log.read_bytes()]
    result = invoke("compare", str(script), str(log), "--gpu", "h100-80g", "--chart", str(tmp_path / chart))
    assert result.exit_code == 2 and "--chart" in result.output and "same file" in result.output
    assert _unchanged([script, log], before)


@pytest.mark.parametrize("command", ["calibrate", "compare"])
def test_a_read_only_output_is_kept_unless_forced(inputs, tmp_path, command):
    script, log = inputs
    kept = tmp_path / ("profile.toml" if command == "calibrate" else "chart.svg")
    kept.write_text("mine\n")
    kept.chmod(stat.S_IRUSR | stat.S_IRGRP)
    args = (["calibrate", "--from-verl-log", str(log), "--plan", str(script), "--gpu", "h100-80g", "-o", str(kept)]
            if command == "calibrate" else
            ["compare", str(script), str(log), "--gpu", "h100-80g", "--chart", str(kept)])
    refused = invoke(*args)
    assert refused.exit_code == 2 and "read-only" in refused.output and "--force" in refused.output
    assert kept.read_text() == "mine\n"
    forced = invoke(*args, "--force")
    assert forced.exit_code in (0, 1), forced.output
    assert kept.read_text() != "mine\n"


SECRET = "sk-live-0123456789abcdef"


@pytest.mark.parametrize("command", ["compare", "calibrate"])
def test_the_process_environment_is_never_printed(tmp_path, monkeypatch, command):
    """A variable the script reads from the environment is kept as its reference: its value (a token) reaches no
    output, note, error or file, with and without --json."""
    script = tmp_path / "run.sh"
    text = SCRIPT.read_text()
    script.write_text(text.replace("python3 -m verl.trainer.main_ppo",
                                   "python3 -m verl.trainer.main_ppo trainer.project_name=$WANDB_TOKEN "
                                   "trainer.experiment_name=$WANDB_TOKEN", 1))
    monkeypatch.setenv("WANDB_TOKEN", SECRET)
    for extra in ([], ["--json"]):
        if command == "compare":
            result = invoke("compare", str(script), str(LOG), "--gpu", "h100-80g", *extra)
        else:
            result = invoke("calibrate", "--from-verl-log", str(LOG), "--plan", str(script), "--gpu", "h100-80g",
                            "-o", str(tmp_path / "p.toml"), *extra)
        assert result.exit_code in (0, 1, 2), result.output
        assert SECRET not in result.output
        if extra:
            json.loads(result.stdout)
    assert all(SECRET not in path.read_text(errors="replace") for path in tmp_path.iterdir() if path.is_file())
    assert os.environ["WANDB_TOKEN"] == SECRET

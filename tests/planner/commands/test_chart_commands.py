"""The commands side of the charts: what a written chart contains, whatever text the user put in."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import tomli_w
from typer.testing import CliRunner

from rlplan.planner.commands.cli import app
from tests.planner.chart_html import inlined_spec

pytest.importorskip("altair")
pytest.importorskip("vl_convert")

runner = CliRunner()
HOSTILE = "</script><script>alert(1)</script><!-- & \u2028\u2029 </SCRIPT >"


def inlined_rows(node) -> list[dict]:
    """Every row of inline data anywhere in a spec (`data.values` of each view)."""
    if isinstance(node, dict):
        values = node.get("values") if isinstance(node.get("values"), list) else []
        return [*values, *(row for key, child in node.items() if key != "values" for row in inlined_rows(child))]
    if isinstance(node, list):
        return [row for child in node for row in inlined_rows(child)]
    return []


def solved_plan(tmp_path: Path, name: str) -> Path:
    path = tmp_path / "plan.toml"
    result = runner.invoke(app, ["solve", "--model", "qwen2.5-0.5b", "--gpus", "8", "--gpu", "h100-80g",
                                 "--prompt-len", "512", "--response-len", "512", "-o", str(path)])
    assert result.exit_code == 0, result.output
    data = tomllib.loads(path.read_text())
    data["model"]["name"] = name
    path.write_text(tomli_w.dumps(data))
    return path


def test_user_text_in_a_chart_stays_data_inside_the_charts_own_script(tmp_path):
    """Invariant: the HTML has the Vega bundle and the chart's script, no third one, and the hostile name
    comes back unchanged from the inlined JSON."""
    plan = solved_plan(tmp_path, HOSTILE)
    chart = tmp_path / "memory.html"
    result = runner.invoke(app, ["explain", str(plan), "--chart", str(chart)])
    assert result.exit_code == 0, result.output
    html = chart.read_text()
    spec = inlined_spec(html)
    assert HOSTILE in json.dumps(spec, ensure_ascii=False) or HOSTILE in str(spec)
    assert "</script><script>alert" not in html


def write_run(directory: Path, steps: int) -> Path:
    directory.mkdir()
    lines = [json.dumps({"step": s, "reward_mean": 0.1 * s, "time/rollout": 1.0, "memory/rollout_peak_gib": 2.0})
             for s in range(1, steps + 1)]
    (directory / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return directory


def test_a_chart_that_is_or_links_to_an_input_is_refused_and_every_input_kept(tmp_path):
    """Invariant: each refusal exits 2 naming the output flag, and no input's bytes change."""
    plan = solved_plan(tmp_path, "qwen")
    as_html = tmp_path / "p.html"
    as_html.write_text(plan.read_text())
    (tmp_path / "link.html").symlink_to(plan)
    run = write_run(tmp_path / "run", 3)
    (tmp_path / "metrics.html").symlink_to(run / "metrics.jsonl")
    profile = tmp_path / "profile.svg"
    profile.write_text("training_mfu = 0.3\n")
    cases = [
        (["explain", str(as_html), "--chart", str(as_html)], "--chart"),
        (["explain", str(plan), "--chart", str(tmp_path / "link.html")], "--chart"),
        (["report", str(run), "-o", str(tmp_path / "metrics.html")], "-o"),
        (["solve", "--from", str(as_html), "--frontier", str(as_html)], "--frontier"),
        (["solve", "--from", str(plan), "--profile", str(profile), "--frontier", str(profile)], "--frontier"),
        (["solve", "--from", str(plan), "-o", str(tmp_path / "both.html"), "--frontier", str(tmp_path / "both.html")],
         "--frontier"),
    ]
    before = {path: path.read_bytes() for path in (plan, as_html, run / "metrics.jsonl", profile)}
    for args, flag in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and f"error {flag}" in result.output, (args, result.output)
        assert "destroy that file" in " ".join(result.output.split())
    assert {path: path.read_bytes() for path in before} == before and not (tmp_path / "both.html").exists()


def test_a_report_path_with_markup_is_written_and_printed_as_text(tmp_path):
    run = write_run(tmp_path / "run", 2)
    output = tmp_path / "[red]report[/].html"
    result = runner.invoke(app, ["report", str(run), "-o", str(output)])
    assert result.exit_code == 0, result.output
    assert output.is_file() and "[red]report[/].html" in result.output.replace("\n", "")


def test_a_long_run_is_drawn_as_at_most_the_drawn_steps_and_says_so(tmp_path):
    from rlplan.planner.commands.chart_commands import DRAWN_STEPS

    run = write_run(tmp_path / "run", 3 * DRAWN_STEPS)
    output = tmp_path / "report.html"
    result = runner.invoke(app, ["report", str(run), "-o", str(output), "--json"])
    assert result.exit_code == 0, result.output
    drawn = json.loads(result.stdout)
    assert drawn["steps"] == 3 * DRAWN_STEPS and drawn["steps_per_point"] == 4
    assert "points of up to 4 steps" in drawn["notes"][0]
    spec = inlined_spec(output.read_text())
    rewards = [row for row in inlined_rows(spec) if row.get("metric") == "reward"]
    assert 0 < len(rewards) <= DRAWN_STEPS


@pytest.mark.parametrize("suffix", [".svg", ".png"])
def test_text_an_svg_cannot_hold_is_replaced_not_a_crash_of_the_renderer(tmp_path, suffix):
    """vl-convert's SVG writer panics (aborting the process) on characters XML 1.0 lacks; the chart is drawn."""
    plan = solved_plan(tmp_path, "a\x00b\x01\x1f\ufffe")
    chart = tmp_path / f"memory{suffix}"
    result = runner.invoke(app, ["explain", str(plan), "--chart", str(chart)])
    assert result.exit_code == 0, result.output
    assert chart.stat().st_size > 0
    if suffix == ".svg":
        assert "a\ufffdb" in chart.read_text()

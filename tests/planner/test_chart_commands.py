"""The commands side of the charts: what a written chart contains, whatever text the user put in."""

from __future__ import annotations

import json
import re
import tomllib
from html.parser import HTMLParser
from pathlib import Path

import pytest
import tomli_w
from typer.testing import CliRunner

from rlplan.planner.cli import app

pytest.importorskip("altair")
pytest.importorskip("vl_convert")

runner = CliRunner()
HOSTILE = "</script><script>alert(1)</script><!-- & \u2028\u2029 </SCRIPT >"


class ScriptElements(HTMLParser):
    """The text of every <script> element, as a browser's tokenizer splits them."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[str] = []
        self._inside = False

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "script":
            self.scripts.append("")
            self._inside = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._inside = False

    def handle_data(self, data: str) -> None:
        if self._inside:
            self.scripts[-1] += data


def chart_scripts(html: str) -> list[str]:
    parser = ScriptElements()
    parser.feed(html)
    return parser.scripts


def inlined_spec(html: str) -> dict:
    """The chart's own script: the Vega bundle first, then `const spec = {...};` and the embed call."""
    scripts = chart_scripts(html)
    assert len(scripts) == 2, [s[:80] for s in scripts]
    match = re.search(r"const spec = (\{.*?\});\n\s*const embedOpt", scripts[1], re.S)
    assert match is not None
    return json.loads(match.group(1))


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

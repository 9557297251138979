"""What a browser would run in a written HTML chart: its <script> elements and the chart's inlined spec.

Shared by the chart command tests and the CLI fuzz test, which both check that text the user put in a
chart (titles, labels) cannot end a script element early and open another.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser


class ScriptElements(HTMLParser):
    """The text of every <script> element, as a browser's tokenizer splits the page."""

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
    """The chart's own script: the Vega bundle first, then `const spec = {...};` and the embed call.

    Exactly two script elements: a planted `</script>` would end one early and open another.
    """
    scripts = chart_scripts(html)
    assert len(scripts) == 2, [s[:120] for s in scripts]
    match = re.search(r"const spec = (\{.*?\});\n\s*const embedOpt", scripts[1], re.S)
    assert match is not None
    spec = json.loads(match.group(1))
    assert isinstance(spec, dict)
    return spec

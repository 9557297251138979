"""README.md's tour blocks are what their commands print today (benchmarks/readme_tour.py regenerates them): the
compare example once showed 16.60 s / 55.38 s predicted where compare printed 3.75 s / 21.80 s (issue 35 item 6)."""

from __future__ import annotations

import re

import pytest

from tests.repo_scripts import load_script

TOUR = load_script("benchmarks/readme_tour.py")


@pytest.mark.parametrize("marker", sorted(TOUR.TOURS))
def test_the_readme_block_is_what_its_commands_print_today(marker):
    readme = TOUR.README.read_text(encoding="utf-8")
    found = re.search(rf"<!-- {marker} -->\n```\n(.*?)```\n", readme, re.S)
    assert found is not None, f"README.md lost its {marker} block"
    assert found.group(1) == TOUR.block(marker), "stale: run `python benchmarks/readme_tour.py --write`"


def test_rewriting_replaces_only_the_marked_blocks():
    readme = "intro\n<!-- TOUR_X -->\n```\nold\n```\nkept\n```\nother\n```\n"
    assert TOUR.rewritten(readme, {"TOUR_X": "new\n"}) == "intro\n<!-- TOUR_X -->\n```\nnew\n```\nkept\n```\nother\n```\n"

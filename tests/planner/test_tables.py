"""planner/tables.py: a table printed at 80 columns or fewer (a pipe, a CI log, a narrow terminal) never splits a
word (issue 35 item 3: `presets gpus` showed `RTX4090…`, explain's headers `seqs/GP U`, `--top` keys cut mid-key);
one too wide folds into parts that repeat its key columns, and nothing is left out."""

from __future__ import annotations

import io
import json
import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from rich.cells import cell_len
from rich.console import Console

from rlplan.planner.commands.cli import app
from rlplan.planner.tables import FittedTable
from tests.planner.cli_runner import runner

NARROW = (80, 60)
SOLVE_7B = ["solve", "--model", "qwen2.5-7b", "--gpus", "8", "--gpu", "h100-80g", "--prompt-len", "1024",
            "--response-len", "2048"]


def printed(renderable, width: int) -> list[str]:
    console = Console(width=width, file=io.StringIO(), highlight=False, color_system=None)
    console.print(renderable)
    return console.file.getvalue().splitlines()


def cli_lines(width: int, *args: str) -> tuple[int, list[str]]:
    result = runner.invoke(app, list(args), env={"COLUMNS": str(width)})
    assert "Traceback" not in result.output
    return result.exit_code, result.stdout.splitlines()


def whole(word: str, lines: list[str]) -> bool:
    """The word stands whole on one line, not cut by the table's borders or an ellipsis."""
    return any(re.search(rf"(^|[\s│┃]){re.escape(word)}($|[\s│┃,])", line) for line in lines)


WORD = st.text(alphabet="abcdefghij_.-/", min_size=1, max_size=24)
CELL = st.lists(WORD, min_size=1, max_size=4).map(" ".join)


@settings(max_examples=60, deadline=None)
@given(headers=st.lists(CELL, min_size=1, max_size=7), rows=st.lists(st.lists(CELL, min_size=7, max_size=7),
                                                                       min_size=1, max_size=4),
       width=st.integers(min_value=40, max_value=140), keys=st.integers(min_value=0, max_value=2))
def test_no_word_is_split_no_line_is_too_wide_and_every_cell_is_printed(headers, rows, width, keys):
    """Invariant: at any width where the key columns and the widest other column fit side by side, every word
    of every header and cell is printed whole, and no line is wider than the width."""
    table = FittedTable(title="a title that is longer than some of these tables are wide", keys=keys)
    for header in headers:
        table.add_column(header)
    for row in rows:
        table.add_row(*row[:len(headers)])
    words = {word for text in [*headers, *(cell for row in rows for cell in row[:len(headers)])]
             for word in text.split()}
    widest = max(len(word) for word in words) + 2
    # Wide enough for the keys and any one column (narrower, rows print as records: a test below).
    assume(sum(max(len(w) for w in headers[i].split() + [c for row in rows for c in row[i].split()]) + 2
               for i in range(min(keys, len(headers)))) + widest + 3 + keys <= width)
    lines = printed(table, width)
    assert max(cell_len(line) for line in lines) <= width
    assert all(whole(word, lines) for word in words), "\n".join(lines)


def test_a_table_that_fits_renders_as_richs_own():
    plain_rows = [("H100-80G", "79.18"), ("RTX4090-24G", "23.52")]
    fitted = FittedTable(title="GPUs", title_justify="left")
    from rich.table import Table

    rich_table = Table(title="GPUs", title_justify="left")
    for table in (fitted, rich_table):
        table.add_column("name")
        table.add_column("GiB", justify="right")
        for row in plain_rows:
            table.add_row(*row)
    assert printed(fitted, 80) == printed(rich_table, 80)


def test_a_table_too_wide_folds_repeating_its_key_column_and_keeps_every_column():
    table = FittedTable(title="wide")
    for header in ("name", *(f"column{index}" for index in range(12))):
        table.add_column(header)
    table.add_row("RTX4090-24G", *(f"value-{index}" for index in range(12)))
    lines = printed(table, 60)
    assert sum("RTX4090-24G" in line for line in lines) >= 2  # the key in every part
    assert all(whole(f"column{index}", lines) and whole(f"value-{index}", lines) for index in range(12))


def test_where_not_even_a_key_and_one_column_fit_each_row_is_a_record():
    table = FittedTable()
    table.add_column("name")
    table.add_column("fix")
    table.add_row("actor_micro_batch_divides_mini", "set actor.ppo_micro_batch_size_per_gpu = 2")
    lines = printed(table, 50)
    assert lines[:2] == ["name: actor_micro_batch_divides_mini", "fix: set actor.ppo_micro_batch_size_per_gpu = 2"]


# --- through the CLI, as a pipe or a CI log prints it ------------------------------------------------------------


@pytest.mark.parametrize("width", NARROW)
def test_presets_print_every_name_whole(width):
    for kind in ("gpus", "models"):
        names = json.loads(runner.invoke(app, ["presets", kind, "--json"]).stdout)
        code, lines = cli_lines(width, "presets", kind)
        assert code == 0 and max(cell_len(line) for line in lines) <= width
        assert [name for name in names if not whole(name, lines)] == []
        if kind == "models":
            ids = [repo for entry in names.values() for repo in entry["repo_ids"][:3]]
            assert [repo for repo in ids if not whole(repo, lines)] == []


@pytest.fixture(scope="module")
def solved(tmp_path_factory):
    path = tmp_path_factory.mktemp("tables") / "plan.toml"
    assert runner.invoke(app, [*SOLVE_7B, "-o", str(path), "-q"]).exit_code == 0
    return path


@pytest.mark.parametrize("width", NARROW)
def test_explain_splits_no_header_or_name_mid_word(width, solved):
    code, lines = cli_lines(width, "explain", str(solved))
    assert code == 0 and max(cell_len(line) for line in lines) <= width
    for word in ("seqs", "GPU", "tokens", "micro", "budget", "actor_update", "old_log_prob", "fsdp_all_gather_buffers",
                 "actor_optimizer_state", "weight_sync"):
        assert whole(word, lines), word
    assert "Host RAM per node (GiB of 2048)" in lines


@pytest.mark.parametrize("width", NARROW)
def test_solve_top_prints_every_knob_key_whole(width):
    code, lines = cli_lines(width, *SOLVE_7B, "--top", "3")
    payload = json.loads(runner.invoke(app, [*SOLVE_7B, "--top", "3", "--json"]).stdout)
    assert code == 0 and max(cell_len(line) for line in lines) <= width
    keys = {key for row in payload["top"] for key, value in row["knobs"].items() if value is not None}
    assert [key for key in keys if not any(f"{key} = " in line for line in lines)] == []


@pytest.mark.parametrize("width", NARROW)
def test_validate_prints_rule_names_and_plan_keys_whole(width, tmp_path):
    imported = tmp_path / "imported.toml"
    assert runner.invoke(app, ["import", "verl", "tests/data/verl_scripts/grpo_lora_shell_vars.sh", "--gpu",
                               "h100-80g", "--env", "NGPUS=8", "-o", str(imported)]).exit_code == 0
    code, lines = cli_lines(width, "validate", str(imported))
    assert code == 2 and max(cell_len(line) for line in lines) <= width
    assert whole("actor_micro_batch_divides_mini", lines)
    assert whole("actor.ppo_micro_batch_size_per_gpu", lines), "\n".join(lines)

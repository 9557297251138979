"""verl's logs read as typed steps (planner/verl_log.py): every format and spelling verl used, a run still being
written, lines cut by a crash, NaN values. Fixtures: tests/data/verl_logs (make_fixtures.py, and public/ real runs)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlplan.planner.errors import PlanError
from rlplan.planner.verl_log import canonical_key, parse_value, parse_verl_log
from tests.data.verl_logs.make_fixtures import STEPS, metrics

LOGS = Path(__file__).resolve().parents[1] / "data" / "verl_logs"
FORMATS = ("v02_console.log", "v03_console.log", "v08_console.log", "v08_file.jsonl")
# The same metric under the name each version gives it.
ALLOCATED = {"v02_console.log": "perf/max_memory_allocated_gb", "v03_console.log": "perf/max_memory_allocated_gb",
             "v08_console.log": "actor/perf/max_memory_allocated_gb", "v08_file.jsonl": "actor/perf/max_memory_allocated_gb"}


def read(name: str):
    return parse_verl_log((LOGS / name).read_text(encoding="utf-8"), source=name)


@pytest.mark.parametrize("name", FORMATS)
def test_every_format_reads_the_same_run(name):
    log = read(name)
    # A cut line before step 21's record and the half-written step 41 are skipped; every whole step is read.
    assert [s.step for s in log.steps] == list(range(1, STEPS + 1))
    rounding = 5e-4 if name in ("v02_console.log", "v03_console.log") else 1e-12  # "%.3f" printing
    for step in log.steps:
        truth = metrics(step.step)
        assert step.get("response_length/mean") == pytest.approx(truth["response_length/mean"], abs=rounding)
        assert step.get("timing_s/gen") == pytest.approx(truth["timing_s/gen"], abs=rounding)
        assert step.get(ALLOCATED[name]) == pytest.approx(truth["perf/max_memory_allocated_gb"], abs=rounding)


def test_old_timing_spelling_is_read_as_timing_s():
    log = read("v02_console.log")
    assert "timing/" in log.spellings
    assert "timing_s/update_actor" in log.keys() and not any(k.startswith("timing/") for k in log.keys())
    assert canonical_key("timing/gen") == "timing_s/gen" and canonical_key("timing_s/gen") == "timing_s/gen"


def test_nan_values_are_kept_out_of_series_and_reported():
    for name in FORMATS:
        log = read(name)
        assert log.nan_keys["actor/pg_loss"] == 7
        reserved = ALLOCATED[name].replace("allocated", "reserved")
        assert log.nan_keys[reserved] == 5
        assert 5 not in [step for step, _ in log.series(reserved)]
        assert all(math.isfinite(v) for _, v in log.series("actor/pg_loss"))


def test_a_run_still_being_written_leaves_its_last_line_unread():
    log = read("v03_console.log")
    last_line = len((LOGS / "v03_console.log").read_text().split("\n"))
    assert log.incomplete_last_line == last_line
    assert log.steps[-1].step == STEPS  # step 41 is half written: not read as a shorter record


def test_bad_lines_are_named_by_line_number():
    console = read("v03_console.log")
    assert len(console.bad_lines) == 1
    text = (LOGS / "v03_console.log").read_text().split("\n")
    assert "cut by a crashed writer" in text[console.bad_lines[0].line - 1]
    jsonl = read("v08_file.jsonl")
    assert [b.line for b in jsonl.bad_lines] == [21] and "not JSON" in jsonl.bad_lines[0].reason
    assert jsonl.incomplete_last_line == STEPS + 2


def test_real_logs_with_ray_prefixes_parse_every_step():
    for name, allocated_step2 in (("verl_qwen2_7b_recommended.log", 83.560), ("verl_qwen2_7b_min.log", 54.493)):
        log = read(f"public/{name}")
        assert [s.step for s in log.steps] == list(range(1, 13))
        assert not log.bad_lines and log.incomplete_last_line is None
        assert log.steps[1].get("perf/max_memory_allocated_gb") == allocated_step2


@pytest.mark.parametrize("text, value", [("0.5", 0.5), ("np.float64(20.76)", 20.76), ("np.int64(3)", 3.0),
                                         ("-1.7e-08", -1.7e-08), ("1024", 1024.0), ("np.float32(2.5)", 2.5),
                                         ("tensor(0.2500)", 0.25), ("tensor(3., device='cuda:0')", 3.0)])
def test_values_as_verl_prints_them(text, value):
    assert parse_value(text) == value


def test_nan_and_non_numbers():
    assert math.isnan(parse_value("nan")) and math.isnan(parse_value("np.float64(nan)"))
    assert parse_value("True") is None and parse_value("'grpo'") is None and parse_value("[1, 2]") is None


def test_a_log_without_any_step_is_bad_input_naming_the_first_bad_line():
    with pytest.raises(PlanError, match="line 2"):
        parse_verl_log("(TaskRunner pid=1) starting\n(TaskRunner pid=1) step:1 - garbage\n", "x.log")
    with pytest.raises(PlanError, match="no finished verl step"):
        parse_verl_log("", "empty.log")


def test_a_resumed_run_logging_a_step_twice_keeps_the_later_values():
    log = parse_verl_log("step:3 - a:1.0 - b:2.0\nstep:3 - a:5.0\n")
    assert [s.step for s in log.steps] == [3]
    assert log.steps[0].get("a") == 5.0 and log.steps[0].get("b") == 2.0


def test_a_step_key_inside_another_key_is_not_a_step_line():
    log = parse_verl_log("step:2 - training/global_step:9.000 - timing_s/step:1.5\n")
    assert [s.step for s in log.steps] == [2] and log.steps[0].get("timing_s/step") == 1.5


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(FORMATS), cut=st.floats(min_value=0.0, max_value=1.0))
def test_a_log_cut_anywhere_reads_only_values_the_whole_log_has(name, cut):
    """Invariant: a run read while it is written (the text cut at any byte) yields a subset of the whole log's
    steps, each with exactly the whole log's values: a cut line is never read as a shorter number."""
    text = (LOGS / name).read_text(encoding="utf-8")
    whole = {s.step: dict(s.values) for s in read(name).steps}
    prefix = text[: int(cut * len(text))]
    try:
        partial = parse_verl_log(prefix, name)
    except PlanError:
        return  # not one finished step yet
    for step in partial.steps:
        assert step.step in whole
        for key, value in step.values.items():
            expected = whole[step.step][key]
            assert value == expected or (math.isnan(value) and math.isnan(expected))


def test_tqdm_carriage_returns_and_windows_line_ends_around_a_step():
    text = ("Training Progress:   4%|4  | 4/100\r(TaskRunner pid=9) step:4 - a:1.5 - b:2.0\rTraining Progress:   5%|\r\n"
            "step:5 - a:2.5\r\n")
    log = parse_verl_log(text)
    assert [(s.step, dict(s.values)) for s in log.steps] == [(4, {"a": 1.5, "b": 2.0}), (5, {"a": 2.5})]
    assert not log.bad_lines

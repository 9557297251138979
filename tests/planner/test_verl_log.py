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


# Hostile and corrupt logs (issue 41): every bound holds where the value enters, and nothing is dropped silently.


def test_a_step_number_out_of_range_is_a_bad_line_not_a_crash():
    text = ("step:" + "9" * 400 + " - perf/max_memory_allocated_gb:30.0\n"
            + '{"step": 1e300, "data": {"perf/max_memory_allocated_gb": 30}}\n'
            + '{"step": 2.5, "data": {"a": 1}}\n'
            + "step:3 - perf/max_memory_allocated_gb:31.0\n")
    log = parse_verl_log(text)
    assert [s.step for s in log.steps] == [3]
    reasons = [bad.reason for bad in log.bad_lines]
    assert "out of range" in reasons[0] and "400 digits" in reasons[0]
    assert "out of range" in reasons[1] and "not a whole number" in reasons[2]


def test_a_log_whose_only_steps_are_out_of_range_is_bad_input_naming_the_line():
    with pytest.raises(PlanError, match="line 1 step 1e\\+300 is out of range"):
        parse_verl_log('{"step": 1e300, "data": {"x": 1}}\n', "big.jsonl")


def test_huge_and_negative_memory_and_times_are_skipped_with_a_note():
    text = ("step:1 - perf/max_memory_allocated_gb:" + "9" * 400 + " - timing_s/gen:-5 - actor/loss:-0.5"
            " - response_length/mean:300\n"
            + '{"step": 2, "data": {"perf/max_memory_reserved_gb": ' + "9" * 400 + ', "timing_s/gen": 4.0}}\n')
    log = parse_verl_log(text)
    assert log.steps[0].values == {"actor/loss": -0.5, "response_length/mean": 300.0}  # a loss may be negative
    assert log.steps[1].values == {"timing_s/gen": 4.0}
    notes = log.reading_notes()
    assert "is out of range" in notes[0] and "line 1" in notes[0]
    assert "skipped" in notes[1] and "line 2" in notes[1]


def test_json_lines_after_console_lines_are_read_and_the_mix_is_said():
    log = parse_verl_log("step:1 - a:1.0\nstep:2 - a:2.0\n" + '{"step": 3, "data": {"a": 3.0}}\n'
                         + '{"not": "a step"}\n')
    assert [s.step for s in log.steps] == [1, 2, 3]
    assert log.format == "mixed" and log.format_lines == {"console": 2, "jsonl": 1}
    assert any("mixes console lines (2 steps) and file-logger JSON lines (1 steps)" in n for n in log.reading_notes())
    assert not log.bad_lines  # a JSON object without a step in a console log is another program's output


def test_the_reader_never_holds_the_whole_file(monkeypatch):
    """The log is read through readline with a bound: a stream that refuses whole reads still parses."""
    import io

    import rlplan.planner.verl_log as verl_log

    class LineOnly(io.StringIO):
        def read(self, *args):  # noqa: ARG002
            raise AssertionError("the whole log was read at once")

        def __iter__(self):
            raise AssertionError("iterated without a line bound")

    monkeypatch.setattr(verl_log, "MAX_LINE_CHARS", 64)
    text = "noise\n" * 100 + "x" * 1000 + " step:1 - a:1.0\n" + "step:2 - a:2.0\n" + "step:3 - a:3"
    log = verl_log.read_verl_log_stream(LineOnly(text, newline="\n"), "stream.log")
    assert [s.step for s in log.steps] == [2]
    assert log.bad_lines[0].line == 101 and "longer than 64 characters" in log.bad_lines[0].reason
    assert log.incomplete_last_line == 103


def test_a_long_log_is_folded_to_bounded_steps_peaks_as_maxima(monkeypatch):
    import rlplan.planner.verl_log as verl_log

    monkeypatch.setattr(verl_log, "MAX_KEPT_STEPS", 8)
    text = "".join(f"step:{i} - perf/max_memory_allocated_gb:{i % 5} - timing_s/gen:{i}\n" for i in range(1, 21))
    log = verl_log.parse_verl_log(text)
    assert len(log.steps) <= 8 and log.folded_steps >= 1
    assert max(v for _, v in log.series("perf/max_memory_allocated_gb")) == 4  # the peak survives folding
    assert any("neighbouring steps were merged" in note for note in log.reading_notes())


def test_unreadable_lines_past_the_kept_ones_are_counted():
    log = parse_verl_log("step:1 - a:1\n" + "step:2 - garbage\n" * 25)
    assert len(log.bad_lines) == 10 and log.bad_line_count == 25
    assert "15 more unreadable lines skipped" in log.reading_notes()[-1]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("step:{}\"0123456789e.-+ _/abgmx\n\r[]nNaIfinity")), max_size=300))
def test_any_text_is_a_log_or_bad_input_never_a_crash(text):
    try:
        log = parse_verl_log(text)
    except PlanError:
        return
    for step in log.steps:
        assert 0 <= step.step <= 10**9
        assert all(math.isnan(v) or math.isinf(v) or abs(v) <= 1e15 for v in step.values.values())

"""A run's metrics.jsonl as user input: each bad line refused by number, a cut-off last line skipped and
counted, non-regular files refused unread, and a long run folded into a bounded number of step ranges."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlplan.planner.commands.metrics_file import MetricsReading, StepBuckets, read_metrics_file
from rlplan.planner.errors import PlanError


def read(tmp_path, content: bytes) -> tuple[list[dict], MetricsReading]:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(content)
    reading = MetricsReading()
    return list(read_metrics_file(str(path), "m", reading)), reading


def test_a_cut_off_last_line_is_skipped_and_counted_and_a_bad_earlier_one_is_named_by_number(tmp_path):
    records, reading = read(tmp_path, b'{"step": 1}\n\n{"step": 2, "reward_mean": 0.5}\n{"step": 3, "rew')
    assert [r["step"] for r in records] == [1, 2] and reading.skipped_partial == 1
    with pytest.raises(PlanError, match="line 2"):
        read(tmp_path, b'{"step": 1}\n{"st\n{"step": 3}\n')
    # A complete last line that is not JSON is damage, not a run still writing.
    with pytest.raises(PlanError, match="line 2"):
        read(tmp_path, b'{"step": 1}\n{"st\n')


@pytest.mark.parametrize(("line", "says"), [
    (b"[1, 2]", "not an object"), (b'{"reward_mean": 1}', "got missing"), (b'{"step": {"a": 1}}', "got dict"),
    (b'{"step": null}', "got NoneType"), (b'{"step": true}', "got bool"), (b'{"step": 1.5}', "got float"),
    (b'{"step": 1, "reward_mean": "0.5"}', "reward_mean is str"), (b'{"step": 1, "time/x": {}}', "time/x is dict"),
    (b'{"step": 1, "kl_ref": 1' + b"0" * 101 + b"}", "too large"), (b'{"step": 1, "entropy": 1e308}', "too large"),
    (b'{"step": 1' + b"0" * 5000 + b"}", "not JSON"), (b"\xff\xfe{}", "not UTF-8"),
    (b'{"step": 1, "memory_measure": 3}', "must be text"), (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
])
def test_a_line_that_is_not_a_record_is_bad_input_naming_its_line(tmp_path, line, says):
    with pytest.raises(PlanError, match="line 2") as error:
        read(tmp_path, b'{"step": 1}\n' + line + b"\n")
    assert says in error.value.message


def test_null_and_non_finite_values_are_missing_and_unread_keys_are_dropped(tmp_path):
    records, _ = read(tmp_path, b'{"step": 1, "reward_mean": NaN, "kl_ref": null, "entropy": 2, '
                                b'"prompt_indices": [1, 2], "anything": "text"}\n')
    assert records == [{"step": 1, "entropy": 2.0}]
    # An integer past 2**64 (which vl-convert cannot draw) is read as the float it is near.
    records, _ = read(tmp_path, b'{"step": 1, "kl_ref": 184467440737095516160000}\n')
    assert records == [{"step": 1, "kl_ref": 1.8446744073709552e23}]


def test_fifos_devices_and_directories_are_refused_without_reading(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (str(fifo), "/dev/zero", str(tmp_path)):
        with pytest.raises(PlanError, match="not a regular file|directory"):
            list(read_metrics_file(path, "m"))


def test_a_file_larger_than_the_callers_limit_is_refused(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n' * 100)
    with pytest.raises(PlanError, match="more than"):
        list(read_metrics_file(str(path), "m", max_bytes=1000))


@settings(max_examples=30, deadline=None)
@given(steps=st.integers(min_value=1, max_value=3000), limit=st.sampled_from([1, 7, 64]))
def test_step_buckets_stay_bounded_keep_every_peak_and_the_mean_of_each_range(steps, limit):
    """Invariant: at most `limit` points; the largest peak of the run survives the merging; each point's mean
    is the mean of the steps it stands for (here the values are the step numbers)."""
    buckets = StepBuckets(limit=limit)
    for step in range(1, steps + 1):
        buckets.add({"step": step, "reward_mean": float(step), "memory/update_peak_gib": float(step % 97),
                     "memory/update_predicted_gib": 5.0})
    points = buckets.records()
    assert 1 <= len(points) <= limit and buckets.steps == steps and buckets.last_step == steps
    assert max(p["memory/update_peak_gib"] for p in points) == max(s % 97 for s in range(1, steps + 1))
    first = 1
    for point in points:
        assert point["reward_mean"] == pytest.approx((first + point["step"]) / 2)
        first = point["step"] + 1
    assert first == steps + 1


def test_the_writers_records_round_trip(tmp_path):
    record = {"step": 4, "reward_mean": 0.25, "time/rollout": 1.5, "memory/rollout_peak_gib": 3.0,
              "memory_measure": "cuda_memory_held"}
    records, reading = read(tmp_path, (json.dumps(record) + "\n").encode())
    assert records == [record] and reading.records == 1 and reading.skipped_partial == 0

"""A run's metrics.jsonl read as user input, for `rlplan report` and `calibrate --from-run`.

The file is whatever is on disk: a finished run, a run still writing its last line, a run of a million steps,
or something else (a FIFO, /dev/zero, a hand-edited file). It is read as a stream of lines from a regular file
only, each line checked as one record (a JSON object with a whole-number `step`, and numbers where rlplan reads
numbers) and refused by its line number when it is not one; a last line cut off mid-write is skipped and
counted. `StepBuckets` folds the records of a long run into a bounded number of step ranges as they are read,
so `report` draws any run in bounded memory and says what it merged.

Part of the commands layer (it reads files); the pure charts in charts.py take its records.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from typing import Any

from attrs import define, field

from rlplan.planner.commands.commands_io import open_regular_file
from rlplan.planner.errors import PlanError, shorten

# One step's record is about a kilobyte; a line past this is not one (or is /dev/zero's endless line).
MAX_LINE_BYTES = 2**20
# A metric value past this is not a measurement (and Vega and vl-convert cannot draw integers past 2**64).
MAX_METRIC_VALUE = 1e100
# The largest step a chart axis holds exactly (a JavaScript number).
MAX_STEP = 2**53
# Keys report or calibrate read as numbers: a value there must be a number (or null, a non-finite float as the
# runtime writes it). Other keys are not read, whatever they hold.
NUMBER_KEYS = frozenset({"reward_mean", "kl_ref", "entropy", "response_length_mean", "sync_logprob_gap",
                         "prompt_length_mean", "sequences"})
NUMBER_PREFIXES = ("time/", "memory/")
TEXT_KEYS = frozenset({"memory_measure"})
FIX = "repair or remove that line (a run writes one JSON object per step), or pass the metrics.jsonl a run wrote"


@define
class MetricsReading:
    """How the last read went: lines read (blank ones included) and a cut-off last line skipped (0 or 1)."""

    lines: int = 0
    records: int = 0
    skipped_partial: int = 0


def _bad(where: str, message: str) -> PlanError:
    return PlanError(field=where, message=message, fix=FIX)


def _number(key: str, value: Any, where: str) -> float | None:
    """The float a number-valued key holds; None for null or a non-finite float (the runtime writes NaN as null)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(where, f"{shorten(key)} is {type(value).__name__} {shorten(repr(value), 60)}, not a number.")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if not math.isfinite(number) or abs(number) > MAX_METRIC_VALUE:
        raise _bad(where, f"{shorten(key)} is too large to be a measurement (over {MAX_METRIC_VALUE:g}).")
    return number


# key -> how it is read and merged (_key_rule); a cache, as a run repeats the same few dozen keys every line.
_RULES: dict[str, str | None] = {}


def _key_rule(key: str) -> str | None:
    """None: not read. "text": memory_measure. A number key: how a step range keeps it ("max" for a memory peak,
    as a mean would hide an OOM; "last" for a prediction; "mean" for the rest)."""
    rule = _RULES.get(key)
    if rule is None and key not in _RULES:
        if key in TEXT_KEYS:
            rule = "text"
        elif key in NUMBER_KEYS or key.startswith(NUMBER_PREFIXES):
            rule = "mean"
            if key.startswith("memory/") and key.endswith(("_peak_gib", "_held_gib")):
                rule = "max"
            elif key.endswith("_predicted_gib"):
                rule = "last"
        if len(_RULES) < 4096:  # hostile files have endless distinct keys; the cache stays small
            _RULES[key] = rule
    return rule


def parse_record(line: str, where: str) -> dict[str, Any]:
    """One metrics line -> the record rlplan reads from it: `step`, the number keys, `memory_measure`."""
    try:
        value = json.loads(line)
    except RecursionError:
        raise _bad(where, "is JSON nested too deeply to be a metrics record.") from None
    except ValueError as exc:  # JSONDecodeError, or an integer too long to convert
        raise _bad(where, f"is not JSON ({shorten(str(exc), 120)}).") from None
    if not isinstance(value, dict):
        raise _bad(where, f"is a JSON {type(value).__name__}, not an object with a step.")
    step = value.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
        shown = "missing" if "step" not in value else f"{type(step).__name__} {shorten(repr(step), 60)}"
        raise _bad(where, f"step must be a whole number from 0 to 2**53, got {shown}.")
    record: dict[str, Any] = {"step": step}
    for key, item in value.items():
        rule = _key_rule(key)
        if rule is None or key == "step":
            continue
        if rule == "text":
            if not isinstance(item, str):
                raise _bad(where, f"{key} must be text, got {type(item).__name__}.")
            record[key] = shorten(item, 80)
        elif type(item) is float and -MAX_METRIC_VALUE <= item <= MAX_METRIC_VALUE:
            record[key] = item  # the common case, checked without a call; NaN fails the comparison
        else:
            number = _number(key, item, where)
            if number is not None:
                record[key] = number
    return record


def read_metrics_file(path: str, what: str, reading: MetricsReading | None = None,
                      max_bytes: int | None = None) -> Iterator[dict[str, Any]]:
    """The records of a metrics.jsonl, one line at a time, in file order.

    A line that is not a record is a PlanError on `what` naming the line; a last line without its newline that
    does not parse is a run still writing it: skipped and counted in `reading`. `max_bytes` refuses a larger
    file for a caller that keeps every record.
    """
    reading = reading if reading is not None else MetricsReading()
    shown = shorten(path)
    fd = open_regular_file(path, what)
    with os.fdopen(fd, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if max_bytes is not None and size > max_bytes:
            raise PlanError(field=what, message=f"{shown!r} is {size} bytes, more than the {max_bytes // 2**20} MiB "
                            "this command reads.", fix="pass the metrics of a shorter run, or cut the file")
        while True:
            try:
                raw = handle.readline(MAX_LINE_BYTES + 1)
            except OSError as exc:
                raise PlanError(field=what, message=f"cannot read {shown!r}: {exc}.", fix="check the file") from None
            if not raw:
                return
            reading.lines += 1
            where = f"{what} line {reading.lines}"
            if len(raw) > MAX_LINE_BYTES:
                raise _bad(where, f"is longer than {MAX_LINE_BYTES // 2**20} MiB: not one step's record.")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _bad(where, f"is not UTF-8 text ({exc.reason} at byte {exc.start}).") from None
            if not line.strip():
                continue
            try:
                record = parse_record(line, where)
            except PlanError:
                if not raw.endswith(b"\n") and not handle.peek(1):
                    reading.skipped_partial += 1  # the writer is mid-line
                    return
                raise
            reading.records += 1
            yield record


# --- long runs: a bounded number of step ranges --------------------------------------------------


@define
class _Bucket:
    """Consecutive steps merged: sums and counts of the means, and the kept (max or last) values."""

    first_step: int
    step: int = 0
    steps: int = 0
    sums: dict[str, list[float]] = field(factory=dict)
    kept: dict[str, Any] = field(factory=dict)

    def add(self, record: dict[str, Any]) -> None:
        self.step = record["step"]
        self.steps += 1
        sums, kept = self.sums, self.kept
        for key, value in record.items():
            rule = _key_rule(key)
            if rule == "mean":
                total = sums.get(key)
                if total is None:
                    sums[key] = [value, 1]
                else:
                    total[0] += value
                    total[1] += 1
            elif rule == "max" and key in kept:
                kept[key] = max(kept[key], value)
            elif rule is not None:
                kept[key] = value

    def absorb(self, other: _Bucket) -> None:
        self.step, self.steps = other.step, self.steps + other.steps
        for key, (total, count) in other.sums.items():
            mine = self.sums.setdefault(key, [0.0, 0])
            mine[0] += total
            mine[1] += count
        for key, value in other.kept.items():
            if _key_rule(key) == "max" and key in self.kept:
                self.kept[key] = max(self.kept[key], value)
            else:
                self.kept[key] = value

    def record(self) -> dict[str, Any]:
        return {"step": self.step, **{key: total / count for key, (total, count) in self.sums.items()}, **self.kept}


@define
class StepBuckets:
    """At most `limit` records stand for the run: consecutive steps merge pairwise (means, peaks as maxima)
    whenever there are more, so memory stays bounded however long the run."""

    limit: int = 1000
    steps: int = 0
    last_step: int | None = None
    _buckets: list[_Bucket] = field(factory=list)
    _width: int = 1

    def add(self, record: dict[str, Any]) -> None:
        self.steps += 1
        self.last_step = record["step"]
        if not self._buckets or self._buckets[-1].steps >= self._width:
            self._buckets.append(_Bucket(first_step=record["step"]))
        self._buckets[-1].add(record)
        if len(self._buckets) > self.limit:
            merged = self._buckets[0::2]
            for left, right in zip(merged, self._buckets[1::2], strict=False):
                left.absorb(right)
            self._buckets = merged
            self._width *= 2

    @property
    def steps_per_point(self) -> int:
        return self._width

    def records(self) -> list[dict[str, Any]]:
        return [bucket.record() for bucket in self._buckets]

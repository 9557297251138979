"""verl's training logs as typed steps: the console logger's lines and the file logger's JSON lines.

verl prints one line per step through its console logger (`verl/utils/logger/aggregate_logger.py`,
`concat_dict_to_str`): `step:N - key:value - key:value ...`, values as `f"{v:.3f}"` in older versions and
`pprint.pformat(v)` in newer ones, which under numpy 2 reads `np.float64(20.76)`. Ray prefixes each line with
`(TaskRunner pid=...)` (in colour), tqdm may share the line, and Ray's de-duplication appends
`[repeated 7x across cluster]`. The file logger (`trainer.logger` with `file`, `verl/utils/tracking.py`
`FileLogger`) writes `{"step": N, "data": {...}}` per line with `json.dumps`, so NaN reads `NaN`.

Metric spellings over verl's versions, read as one canonical name each (`canonical_key`):
`timing/<phase>` (before `timing_s/`), `perf/max_memory_allocated_gb` (v0.3-v0.7, the actor worker's reading)
and `actor/perf/max_memory_allocated_gb` / `critic/perf/...` (v0.8+, the engine workers'), kept apart
because they measure different processes.

A log may be read while the run still writes it: a last line without its newline is set aside as
incomplete, never parsed as a shorter value. Every other line that looks like a step but cannot be read
is reported with its line number. Pure: text in, values out (the commands layer reads the file).
"""

from __future__ import annotations

import functools
import io
import json
import math
import re
from collections.abc import Mapping
from typing import Literal, TextIO

import attrs
from attrs import frozen

from rlplan.planner.errors import PlanError

LogFormat = Literal["console", "jsonl", "mixed"]

# Colour codes Ray wraps its prefixes in, and the de-duplication note it appends.
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_RAY_REPEATED = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")
# `step:N - ` anywhere on the line (after Ray's prefix or a tqdm bar).
_STEP = re.compile(r"(?:^|[\s)|\]])step:(\d+)\s+-\s+(.*)$")
# A value as verl prints it: a float or int, nan / inf, numpy 2's repr of one, or a torch scalar's.
_WRAPPED = re.compile(r"^(?:(?:np|numpy)\.)?(?:float|int|uint)(?:16|32|64)?\((.*)\)$|^tensor\(([^,)]*)[,)]")


@frozen
class StepMetrics:
    """One step's numeric metrics (canonical keys), with the line it came from."""

    step: int
    values: Mapping[str, float]
    line: int

    def get(self, key: str) -> float | None:
        value = self.values.get(key)
        return None if value is None or math.isnan(value) else value


@frozen
class BadLine:
    line: int
    reason: str


@frozen
class VerlLog:
    source: str
    format: LogFormat
    steps: tuple[StepMetrics, ...]
    bad_lines: tuple[BadLine, ...] = ()
    # The last line had no newline: the run is still writing it (or was killed mid-write).
    incomplete_last_line: int | None = None
    # Keys that held NaN in some step, each with the first step it did.
    nan_keys: Mapping[str, int] = attrs.field(factory=dict)
    # The raw spellings seen that canonical_key rewrote (e.g. "timing/gen").
    spellings: frozenset[str] = frozenset()
    # Every unreadable line, counted (bad_lines keeps the first KEPT_BAD_LINES of them).
    bad_line_count: int = 0
    # Steps read per format ("console", "jsonl"): both when a file mixes them.
    format_lines: Mapping[str, int] = attrs.field(factory=dict)
    # How many times a long log was halved as it was read (MAX_KEPT_STEPS).
    folded_steps: int = 0

    def series(self, key: str) -> list[tuple[int, float]]:
        """(step, value) for every step that logged a finite value of key, in step order."""
        return [(s.step, v) for s in self.steps if (v := s.get(key)) is not None and math.isfinite(v)]

    def has(self, key: str) -> bool:
        return any(s.get(key) is not None for s in self.steps)

    def keys(self) -> set[str]:
        return {key for s in self.steps for key in s.values}

    def reading_notes(self, *, named: bool = False) -> list[str]:
        """What was skipped, merged or left out while reading, for every command that reads a log (compare,
        calibrate): nothing in a log is dropped without a note. `named`: each note starts with the log's file name
        (calibrate reads several logs)."""
        name = self.source.replace("\\", "/").rsplit("/", 1)[-1]
        at = f"{name}: " if named else ""
        notes = [f"{at}line {bad.line}: {bad.reason}; skipped" for bad in self.bad_lines]
        if self.bad_line_count > len(self.bad_lines):
            notes.append(f"{at}{self.bad_line_count - len(self.bad_lines)} more unreadable lines skipped")
        if self.format == "mixed":
            notes.append(f"{at}the log mixes console lines ({self.format_lines.get('console', 0)} steps) and "
                         f"file-logger JSON lines ({self.format_lines.get('jsonl', 0)} steps): both were read")
        if self.folded_steps:
            notes.append(f"{at}the log has more than {MAX_KEPT_STEPS:,} steps: neighbouring steps were merged "
                         f"{self.folded_steps} time(s) as it was read (memory peaks as maxima, the rest as means)")
        if self.incomplete_last_line is not None:
            notes.append(f"{at}line {self.incomplete_last_line} has no newline yet (the run is still "
                         "writing it); not read")
        for key, step in sorted(self.nan_keys.items())[:5]:
            notes.append(f"{at}{key} is NaN from step {step}; those values are left out")
        return notes


def canonical_key(key: str) -> str:
    """The name one metric has had across verl's versions: `timing/x` became `timing_s/x`."""
    if key.startswith("timing/"):
        return "timing_s/" + key.removeprefix("timing/")
    return key


def parse_value(text: str) -> float | None:
    """A printed metric value as a float (NaN kept), or None when it is not a number (a string, a list)."""
    text = text.strip()
    try:  # the common case first: a plain number, as verl's "%.3f" and most pformat values print
        return float(text)
    except ValueError:
        pass
    wrapped = _WRAPPED.match(text)
    if wrapped:
        text = (wrapped.group(1) if wrapped.group(1) is not None else wrapped.group(2)).strip()
    if text in ("True", "False"):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _console_step(body: str) -> tuple[dict[str, float], list[str]]:
    """The key:value parts of one console line; the parts that are not key:number pairs, for the report."""
    values: dict[str, float] = {}
    unreadable: list[str] = []
    for part in body.split(" - "):
        key, sep, raw = part.strip().rpartition(":")
        if not sep or not key:
            unreadable.append(part.strip())
            continue
        value = parse_value(raw)
        problem = "not a number" if value is None else _number_problem(key.strip(), value)
        if problem:
            unreadable.append(part.strip() if value is None else f"{key.strip()[:40]} is {problem}")
            continue
        values[key.strip()] = value  # type: ignore[assignment]
    return values, unreadable


# Bounds on what a log may hold, so that a hostile or corrupt line is a note, never a crash or a hang: verl's
# steps are counted in thousands; no metric it logs (GiB, seconds, tokens, counts) nears 1e15; a line longer than
# a MiB is no step line verl writes (its longest hold a few hundred metrics).
MAX_STEP = 10**9
MAX_ABS_VALUE = 1e15
MAX_LINE_CHARS = 2**20
# A log of more steps than this is folded as it is read (each two neighbouring steps become one, memory peaks as
# maxima, the rest as means), so a reader's memory stays bounded whatever the file's length.
MAX_KEPT_STEPS = 100_000
# Keep this many unreadable lines for the notes; the rest are only counted.
KEPT_BAD_LINES = 10
# Keys that are never negative in a real run (memory in GiB, seconds, token counts and lengths): a negative
# value is corrupt and is skipped with a note rather than compared or fitted.
_NEVER_NEGATIVE = re.compile(r"(?:^|/)(?:timing_s|timing)/|memory|_length/|throughput|num_tokens|tokens")


@functools.lru_cache(maxsize=4096)
def _never_negative(key: str) -> bool:
    return _NEVER_NEGATIVE.search(key) is not None


def _number_problem(key: str, value: float) -> str | None:
    """Why a parsed metric value is not one a run could log, or None when it is fine (NaN is fine: it is kept)."""
    if math.isnan(value):
        return None
    never_negative = _never_negative(key)
    if math.isinf(value):  # verl logs an overflowed grad_norm as inf; a memory figure or a time never is
        return "out of range" if never_negative else None
    if abs(value) > MAX_ABS_VALUE:
        return "out of range"
    if value < 0 and never_negative:
        return "negative"
    return None


def _checked_step(raw: object) -> int | str:
    """A step number as verl logs it (a whole number in [0, MAX_STEP]), or why it is not one."""
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        return "has no numeric step"
    if isinstance(raw, float) and (not math.isfinite(raw) or raw != int(raw)):
        return f"step {raw!r} is not a whole number"
    if not 0 <= raw <= MAX_STEP:
        return f"step {shorten_number(raw)} is out of range (0 to {MAX_STEP:,})"
    return int(raw)


def shorten_number(raw: object) -> str:
    text = str(raw)
    return text if len(text) <= 24 else f"{text[:12]}...({len(text)} digits)"


@attrs.define
class _LogReader:
    """What one parse gathers line by line (steps, unreadable lines, NaN keys, old spellings) until it is a VerlLog."""

    steps: dict[int, StepMetrics] = attrs.field(factory=dict)
    bad: list[BadLine] = attrs.field(factory=list)
    bad_count: int = 0
    nan_keys: dict[str, int] = attrs.field(factory=dict)
    spellings: set[str] = attrs.field(factory=set)
    formats: dict[str, int] = attrs.field(factory=dict)
    folded: int = 0

    def reject(self, number: int, reason: str) -> None:
        self.bad_count += 1
        if len(self.bad) < KEPT_BAD_LINES:
            self.bad.append(BadLine(number, reason))

    def record(self, step: int, raw: Mapping[str, float], number: int, log_format: LogFormat) -> None:
        self.formats[log_format] = self.formats.get(log_format, 0) + 1
        values: dict[str, float] = {}
        for key, value in raw.items():
            name = canonical_key(key)
            if name != key:
                self.spellings.add(key.split("/")[0] + "/")
            if math.isnan(value):
                self.nan_keys.setdefault(name, step)
            values[name] = value
        previous = self.steps.get(step)
        if previous is not None:
            # A resumed run logs a step again: the later line wins, its missing keys keep the earlier values.
            values = {**previous.values, **values}
        self.steps[step] = StepMetrics(step=step, values=values, line=number)
        if len(self.steps) > MAX_KEPT_STEPS:
            self._fold()

    def _fold(self) -> None:
        """Halve the kept steps: each two neighbours become one at the first's step number."""
        ordered = [self.steps[k] for k in sorted(self.steps)]
        self.steps = {}
        for first, second in zip(ordered[::2], [*ordered[1::2], None], strict=True):
            self.steps[first.step] = first if second is None else _merged(first, second)
        self.folded += 1

    def log(self, source: str, incomplete_last_line: int | None) -> VerlLog:
        log_format: LogFormat = "mixed" if len(self.formats) > 1 else "jsonl" if "jsonl" in self.formats else "console"
        return VerlLog(source=source, format=log_format, steps=tuple(self.steps[k] for k in sorted(self.steps)),
                       bad_lines=tuple(self.bad), incomplete_last_line=incomplete_last_line,
                       nan_keys=self.nan_keys, spellings=frozenset(self.spellings), bad_line_count=self.bad_count,
                       format_lines=dict(self.formats), folded_steps=self.folded)


def _merged(first: StepMetrics, second: StepMetrics) -> StepMetrics:
    """Two neighbouring steps as one: memory peaks as their maximum, every other metric as their mean."""
    values: dict[str, float] = {}
    for key in first.values.keys() | second.values.keys():
        a, b = first.values.get(key), second.values.get(key)
        if a is None or b is None:
            values[key] = a if b is None else b  # type: ignore[assignment]
        elif "memory" in key:
            values[key] = max(a, b)
        else:
            values[key] = (a + b) / 2
    return StepMetrics(step=first.step, values=values, line=first.line)


def _console_line(reader: _LogReader, raw_line: str, number: int) -> None:
    if "step:" not in raw_line:  # most lines of a console log are Ray's and vLLM's: skip them at string speed
        return
    if "\x1b" in raw_line:
        raw_line = _ANSI.sub("", raw_line)
    if "repeated" in raw_line:
        raw_line = _RAY_REPEATED.sub("", raw_line)
    # tqdm redraws its bar with carriage returns, so one line can hold a bar and a step: take the step's part.
    segments = raw_line.split("\r") if "\r" in raw_line else (raw_line,)
    match = next((m for part in reversed(segments) if (m := _STEP.search(part)) is not None), None)
    if match is None:
        return
    digits = match.group(1)
    step = (_checked_step(int(digits)) if len(digits) <= 18
            else f"step {shorten_number(digits)} is out of range (0 to {MAX_STEP:,})")
    if isinstance(step, str):
        reader.reject(number, step)
        return
    values, unreadable = _console_step(match.group(2))
    if not values:
        reader.reject(number, f"step {step} has no key:number pair" +
                      (f" ({unreadable[0][:60]!r})" if unreadable else ""))
        return
    if unreadable:
        reader.reject(number, f"{len(unreadable)} part(s) are not key:number, e.g. {unreadable[0][:60]!r}")
    reader.record(step, values, number, "console")


def _json_step(obj: object) -> tuple[int, dict[str, float], list[str]] | str:
    """(step, numeric metrics, the parts skipped) of one file-logger record, or why it is not one."""
    if not isinstance(obj, dict):
        return "is not a JSON object"
    step = _checked_step(obj.get("step"))
    if isinstance(step, str):
        return step
    # verl's FileLogger nests the metrics under "data"; a flat record (the step beside the metrics) is read too.
    data = obj.get("data", {k: v for k, v in obj.items() if k != "step"})
    if not isinstance(data, dict):
        return "its data is not an object"
    values: dict[str, float] = {}
    skipped: list[str] = []
    for key, raw in data.items():
        if not isinstance(raw, int | float) or isinstance(raw, bool):
            continue
        value = float(raw) if isinstance(raw, float) or abs(raw) <= MAX_ABS_VALUE else math.inf
        problem = _number_problem(str(key), value)
        if problem:
            skipped.append(f"{str(key)[:60]!r} is {problem}")
        else:
            values[str(key)] = value
    if not values:
        return "has no numeric metric" + (f" ({skipped[0]})" if skipped else "")
    return step, values, skipped


def _json_line(reader: _LogReader, line: str, number: int, json_file: bool) -> None:
    try:
        record = _json_step(json.loads(line))  # Python's json reads NaN / Infinity as verl writes them
    except ValueError as exc:
        if json_file:
            reader.reject(number, f"not JSON ({str(exc)[:80]})")
        return
    except RecursionError:
        reader.reject(number, "nested too deeply")
        return
    if isinstance(record, str):
        # In a console log a JSON object with no step is some other program's output, not a bad record.
        if json_file or record != "has no numeric step":
            reader.reject(number, record)
        return
    step, values, skipped = record
    if skipped:
        reader.reject(number, f"{len(skipped)} value(s) skipped: {skipped[0]}")
    reader.record(step, values, number, "jsonl")


def _bounded_lines(stream: TextIO):
    """(number, line without its newline, complete, too long) for each line of stream, reading at most
    MAX_LINE_CHARS at a time: a line longer than that is skipped to its end, never held whole."""
    number = 0
    while True:
        chunk = stream.readline(MAX_LINE_CHARS)
        if not chunk:
            return
        number += 1
        if chunk.endswith("\n"):
            yield number, chunk[:-1], True, False
            continue
        if len(chunk) < MAX_LINE_CHARS:  # the end of the file, no newline: still being written
            yield number, chunk, False, False
            return
        while chunk and not chunk.endswith("\n"):  # an over-long line: read past it in bounded pieces
            chunk = stream.readline(MAX_LINE_CHARS)
        yield number, "", bool(chunk), True


def read_verl_log_stream(stream: TextIO, source: str = "log") -> VerlLog:
    """A verl log in either format, or both mixed, read line by line from a text stream in bounded memory.

    Each line is read in its own format: a line that is a JSON object is a file-logger record, any other line
    may hold a console step. The first readable line decides which format's stray lines are reported (a console
    log's other lines are Ray's and vLLM's, never errors). A PlanError when no step is readable at all."""
    reader = _LogReader()
    json_file: bool | None = None
    incomplete: int | None = None
    for number, line, complete, too_long in _bounded_lines(stream):
        if not complete:
            incomplete = number
            break
        if too_long:
            reader.reject(number, f"longer than {MAX_LINE_CHARS:,} characters; skipped unread")
            continue
        stripped = line.strip()
        if not stripped:
            continue
        if json_file is None:
            json_file = stripped.startswith("{")
        if stripped.startswith("{"):
            _json_line(reader, stripped, number, json_file)
        else:
            _console_line(reader, line, number)
    log = reader.log(source, incomplete)
    if not log.steps:
        detail = (f"; line {log.bad_lines[0].line} {log.bad_lines[0].reason}" if log.bad_lines else "")
        raise PlanError(field=source, message=f"holds no finished verl step (no `step:N - key:value` line and no "
                        f"file-logger JSON record){detail}.",
                        fix="pass the console output of the run (the lines `step:1 - ...`) or the JSON lines of "
                            "trainer.logger=['console','file']; wait for the first step of a run still starting")
    return log


def parse_verl_log(text: str, source: str = "log") -> VerlLog:
    """A verl log held in memory (tests, pasted text): read_verl_log_stream over it."""
    return read_verl_log_stream(io.StringIO(text, newline="\n"), source)

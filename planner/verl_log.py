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

import json
import math
import re
from collections.abc import Mapping
from typing import Literal

import attrs
from attrs import frozen

from rlplan.planner.errors import PlanError

LogFormat = Literal["console", "jsonl"]

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

    def series(self, key: str) -> list[tuple[int, float]]:
        """(step, value) for every step that logged a finite value of key, in step order."""
        return [(s.step, v) for s in self.steps if (v := s.get(key)) is not None and math.isfinite(v)]

    def has(self, key: str) -> bool:
        return any(s.get(key) is not None for s in self.steps)

    def keys(self) -> set[str]:
        return {key for s in self.steps for key in s.values}


def canonical_key(key: str) -> str:
    """The name one metric has had across verl's versions: `timing/x` became `timing_s/x`."""
    if key.startswith("timing/"):
        return "timing_s/" + key.removeprefix("timing/")
    return key


def parse_value(text: str) -> float | None:
    """A printed metric value as a float (NaN kept), or None when it is not a number (a string, a list)."""
    text = text.strip()
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
        if value is None:
            unreadable.append(part.strip())
            continue
        values[key.strip()] = value
    return values, unreadable


def _complete_lines(text: str) -> tuple[list[str], int | None]:
    """The lines of text that end in a newline, and the number of a last line that does not (still being written)."""
    lines = text.split("\n")
    tail = lines.pop()
    return lines, (len(lines) + 1 if tail else None)


@attrs.define
class _LogReader:
    """What one parse gathers line by line (steps, unreadable lines, NaN keys, old spellings) until it is a VerlLog."""

    steps: dict[int, StepMetrics] = attrs.field(factory=dict)
    bad: list[BadLine] = attrs.field(factory=list)
    nan_keys: dict[str, int] = attrs.field(factory=dict)
    spellings: set[str] = attrs.field(factory=set)

    def record(self, step: int, raw: Mapping[str, float], number: int) -> None:
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

    def log(self, source: str, log_format: LogFormat, incomplete_last_line: int | None) -> VerlLog:
        return VerlLog(source=source, format=log_format, steps=tuple(self.steps[k] for k in sorted(self.steps)),
                       bad_lines=tuple(self.bad), incomplete_last_line=incomplete_last_line,
                       nan_keys=self.nan_keys, spellings=frozenset(self.spellings))


def parse_console_log(text: str, source: str = "log") -> VerlLog:
    reader = _LogReader()
    lines, incomplete = _complete_lines(text)
    for number, raw_line in enumerate(lines, start=1):
        # tqdm redraws its bar with carriage returns, so one line can hold a bar and a step: take the step's part.
        segments = [_RAY_REPEATED.sub("", _ANSI.sub("", part)) for part in raw_line.split("\r")]
        match = next((m for part in reversed(segments) if (m := _STEP.search(part)) is not None), None)
        if match is None:
            continue
        values, unreadable = _console_step(match.group(2))
        if not values:
            reader.bad.append(BadLine(number, f"step {match.group(1)} has no key:number pair"))
            continue
        if unreadable:
            reader.bad.append(BadLine(number, f"{len(unreadable)} part(s) are not key:number, "
                                              f"e.g. {unreadable[0][:60]!r}"))
        reader.record(int(match.group(1)), values, number)
    return reader.log(source, "console", incomplete)


def _json_step(obj: object) -> tuple[int, dict[str, float]] | str:
    """(step, numeric metrics) of one file-logger record, or why it is not one."""
    if not isinstance(obj, dict):
        return "is not a JSON object"
    step = obj.get("step")
    if isinstance(step, bool) or not isinstance(step, int | float) or not math.isfinite(step):
        return "has no numeric step"
    # verl's FileLogger nests the metrics under "data"; a flat record (the step beside the metrics) is read too.
    data = obj.get("data", {k: v for k, v in obj.items() if k != "step"})
    if not isinstance(data, dict):
        return "its data is not an object"
    values = {str(k): float(v) for k, v in data.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    if not values:
        return "has no numeric metric"
    return int(step), values


def parse_jsonl_log(text: str, source: str = "log") -> VerlLog:
    reader = _LogReader()
    lines, incomplete = _complete_lines(text)
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = _json_step(json.loads(line))  # Python's json reads NaN / Infinity as verl writes them
        except ValueError as exc:
            reader.bad.append(BadLine(number, f"not JSON ({str(exc)[:80]})"))
            continue
        except RecursionError:
            reader.bad.append(BadLine(number, "nested too deeply"))
            continue
        if isinstance(record, str):
            reader.bad.append(BadLine(number, record))
            continue
        reader.record(record[0], record[1], number)
    return reader.log(source, "jsonl", incomplete)


def detect_format(text: str) -> LogFormat:
    """JSON lines when the first non-blank line is a JSON object, else the console format."""
    for line in text.split("\n"):
        if line.strip():
            return "jsonl" if line.lstrip().startswith("{") else "console"
    return "console"


def parse_verl_log(text: str, source: str = "log") -> VerlLog:
    """A verl log in either format; a PlanError when it holds no readable step at all."""
    parse = parse_jsonl_log if detect_format(text) == "jsonl" else parse_console_log
    log = parse(text, source)
    if not log.steps:
        detail = (f"; line {log.bad_lines[0].line} {log.bad_lines[0].reason}" if log.bad_lines else "")
        raise PlanError(field=source, message=f"holds no finished verl step (no `step:N - key:value` line and no "
                        f"file-logger JSON record){detail}.",
                        fix="pass the console output of the run (the lines `step:1 - ...`) or the JSON lines of "
                            "trainer.logger=['console','file']; wait for the first step of a run still starting")
    return log

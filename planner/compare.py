"""A plan against a verl run: per phase, the predicted and the measured memory and time, like with like.

verl's memory figures are not per phase (shared/reference/verl-metrics.md, checked in verl's source):

* `perf/max_memory_allocated_gb` / `_reserved_gb` is `torch.cuda.max_memory_allocated()` (reserved) / 2**30,
  read in the trainer process and never reset: the peak since the worker started, over every phase that ran
  in that process before the reading. It holds no CUDA context, no NCCL buffers, nothing allocated outside
  torch's caching allocator.
* An engine in the trainer's process (sync vLLM, verl <= 0.5; v0.6's in-process async vLLM) allocates its
  weights and KV cache through the same allocator, so they are inside; with vLLM >= 0.7.3 sleep mode the pool
  stays counted while it sleeps (its physical memory is released), so the figure can exceed the card. From v0.7
  the vLLM server and always SGLang run in their own processes: outside.
* v0.3-v0.5 log rank 0's value; v0.6+ the maximum over ranks and mini batches (`reduce_metrics`, np.max).

So the comparable prediction is the largest, over the phases that precede the reading, of a phase's
allocator-held bytes (`counter_bytes`), with the engine's pool where the version keeps it in the process.
Times compare phase by phase (`timing_s/<phase>`, `marked_timer` in `RayPPOTrainer.fit`); the step-time
model is called in one place (`_predicted_seconds`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import attrs
from attrs import frozen

from rlplan.planner.errors import PlanError
from rlplan.planner.knobs import with_expected_lengths
from rlplan.planner.memory import GIB, MemoryReport, predict_memory
from rlplan.planner.memory.allocator_report import allocator_report
from rlplan.planner.memory.phases import longest_expected_response_that_fits
from rlplan.planner.memory.rollout import OWN_PROCESS_ENGINES, start_refusal
from rlplan.planner.model_error import Counter, ErrorBand, counter_error_band
from rlplan.planner.phases import Phase
from rlplan.planner.plan import ENGINE_TITLES, Plan
from rlplan.planner.profile import DEFAULT_PROFILE, Profile
from rlplan.planner.stack import DEFAULT_VERL, ENGINE_IN_TRAINER_PROCESS, in_range, parse_version
from rlplan.planner.verl_log import VerlLog

if TYPE_CHECKING:
    from rlplan.planner.steptime.bands import TimeBand

VersionFamily = Literal["0.2", "0.3", "0.6", "0.7", "0.8"]


@frozen
class MetricScope:
    """What one verl version family's memory figures cover, with the code path that reads them."""

    family: VersionFamily
    versions: str
    allocated_key: str
    reserved_key: str
    engine_in_process: bool
    # The in-process engine's weights and KV pool stay counted while it sleeps (vLLM >= 0.7.3 CuMemAllocator).
    pool_counted_asleep: bool
    ranks: str
    read_at: str


_LEGACY_READ = ("verl/workers/fsdp_workers.py ActorRolloutRefWorker.update_actor, after "
                "actor.update_policy, before the actor's offload; no reset_peak_memory_stats anywhere in training")
SCOPES: dict[VersionFamily, MetricScope] = {
    "0.2": MetricScope(family="0.2", versions="v0.2 (timing/ spelling)", allocated_key="perf/max_memory_allocated_gb",
                       reserved_key="perf/max_memory_reserved_gb", engine_in_process=True, pool_counted_asleep=False,
                       ranks="rank 0 (DataProto.concat keeps data[0].meta_info)", read_at=_LEGACY_READ),
    "0.3": MetricScope(family="0.3", versions="v0.3-v0.5", allocated_key="perf/max_memory_allocated_gb",
                       reserved_key="perf/max_memory_reserved_gb", engine_in_process=True, pool_counted_asleep=True,
                       ranks="rank 0 (DataProto.concat keeps data[0].meta_info)", read_at=_LEGACY_READ),
    "0.6": MetricScope(family="0.6", versions="v0.6.x, v0.7.0", allocated_key="perf/max_memory_allocated_gb",
                       reserved_key="perf/max_memory_reserved_gb", engine_in_process=True, pool_counted_asleep=True,
                       ranks="max over ranks (verl/utils/metric/utils.py reduce_metrics: np.max for *max*)",
                       read_at=_LEGACY_READ),
    "0.7": MetricScope(family="0.7", versions="v0.7.1 and later v0.7.x", allocated_key="perf/max_memory_allocated_gb",
                       reserved_key="perf/max_memory_reserved_gb", engine_in_process=False, pool_counted_asleep=False,
                       ranks="max over ranks (reduce_metrics, np.max)", read_at=_LEGACY_READ),
    "0.8": MetricScope(family="0.8", versions="v0.8.0, v0.9.x, HEAD",
                       allocated_key="actor/perf/max_memory_allocated_gb",
                       reserved_key="actor/perf/max_memory_reserved_gb", engine_in_process=False,
                       pool_counted_asleep=False, ranks="max over ranks and mini batches (reduce_metrics, np.max)",
                       read_at="verl/workers/engine_workers.py TrainingWorker._postprocess_output, after every "
                               "train_batch / infer_batch; prefixed actor/ or critic/ by ray_trainer.py"),
}


# The release a log's spellings date a run to, where they date one older than the default stack: the first release
# of the family (whose defaults and allocator regime the family shares: fixed segments, the engine in the trainer's
# process); `compare` reads a script at it unless --verl-version says otherwise.
FAMILY_RELEASE: dict[VersionFamily, str] = {"0.2": "0.2.0", "0.3": "0.3.0.post1"}


def version_family(version: str, where: str = "--verl-version") -> VersionFamily:
    """`0.4.1` -> "0.3" (the family whose scope it shares); a PlanError naming `where` for what is not a version."""
    major, minor, _ = parse_version(version, where)
    if major > 0 or minor >= 8:
        return "0.8"
    if minor <= 2:
        return "0.2"
    if minor <= 5:
        return "0.3"
    # 0.7.0 still runs vLLM's worker in the trainer's process, as 0.6 does (stack.ENGINE_IN_TRAINER_PROCESS owns
    # where that ends), so its counters cover the engine as 0.6's do.
    return "0.6" if minor == 6 or in_range(version.lstrip("v"), None, ENGINE_IN_TRAINER_PROCESS.before) else "0.7"


def infer_family(log: VerlLog) -> tuple[VersionFamily, str]:
    """The version family the log's spellings show, and why; ambiguous spellings take the older family."""
    keys = log.keys()
    if "actor/perf/max_memory_allocated_gb" in keys or "critic/perf/max_memory_allocated_gb" in keys:
        return "0.8", "actor/perf/ keys: verl >= 0.8 engine workers"
    if "timing/" in log.spellings:
        return "0.2", "timing/ keys: verl before timing_s/"
    return "0.3", ("unprefixed perf/ keys: verl 0.3-0.7, read as 0.3-0.5 (sync vLLM in the trainer process); "
                   "pass --verl-version for 0.6 or 0.7")


# --- lengths the run had ---------------------------------------------------------------------------


@frozen
class RunLengths:
    prompt_mean: float
    response_mean: float
    response_max: float | None
    steps: int
    # Which means the log gave; a mean it lacks is the plan's (its expected length, else its maximum).
    prompt_from_log: bool = True
    response_from_log: bool = True

    @property
    def from_log(self) -> bool:
        return self.prompt_from_log and self.response_from_log

    def note(self) -> str | None:
        """What the comparison was priced at where the log lacks a mean, in words; None when it has both."""
        if self.from_log:
            return None
        missing = [key for key, ok in (("prompt_length/mean", self.prompt_from_log),
                                       ("response_length/mean", self.response_from_log)) if not ok]
        return (f"the log has no {' and no '.join(missing)} (a partial log): priced at {self.prompt_mean:.0f} prompt "
                f"+ {self.response_mean:.0f} response tokens, the log's means where it has them and otherwise the "
                "plan's expected lengths (its maxima where it states none); no length trend without "
                "response_length/mean")


def run_lengths(log: VerlLog, plan: Plan | None = None) -> RunLengths:
    """The run's mean lengths over its steps.  Given the plan, a mean the log lacks (a pasted subset of metrics)
    is the plan's expected length (its maximum if unstated), and said (RunLengths.note); without it, a PlanError."""
    prompts = [v for _, v in log.series("prompt_length/mean")]
    responses = [v for _, v in log.series("response_length/mean")]
    if plan is None and (not prompts or not responses):
        raise PlanError(field=log.source, message="logs no prompt_length/mean and response_length/mean, so the "
                        "lengths the run had are unknown.",
                        fix="pass a log of verl's trainer (its console lines or file logger), which logs both")
    maxima = [v for _, v in log.series("response_length/max")]
    data = plan.data if plan is not None else None
    prompt = statistics.fmean(prompts) if prompts else float(
        data.expected_prompt_length or data.max_prompt_length) if data else 0.0
    response = statistics.fmean(responses) if responses else float(
        data.expected_response_length or data.max_response_length) if data else 0.0
    steps = len(responses) or len(prompts) or len(log.steps)
    return RunLengths(prompt_mean=prompt, response_mean=response, response_max=max(maxima) if maxima else None,
                      steps=steps, prompt_from_log=bool(prompts), response_from_log=bool(responses))


def plan_at_run_lengths(plan: Plan, lengths: RunLengths) -> Plan:
    """The plan with the run's mean lengths as its expected lengths (rounded up, capped at the maxima)."""
    data = plan.data
    prompt = min(data.max_prompt_length, max(1, math.ceil(lengths.prompt_mean)))
    response = min(data.max_response_length, max(1, math.ceil(lengths.response_mean)))
    return with_expected_lengths(plan, prompt, response)


# --- memory -----------------------------------------------------------------------------------------


@frozen
class MemoryRow:
    """One verl memory metric beside the prediction of what it covers."""

    metric: str
    # Which allocator figure it is: "allocated" (max_memory_allocated) or "reserved" (max_memory_reserved).
    counter: Counter
    measured_gib: float
    predicted_gib: float
    # The phase whose counter bytes are the largest: where the prediction puts the peak.
    predicted_peak_phase: str
    band: ErrorBand
    at_step: int

    @property
    def ratio(self) -> float:
        return self.measured_gib / self.predicted_gib if self.predicted_gib else math.inf

    @property
    def highest_allowed_gib(self) -> float:
        return self.band.highest_actual_gib(self.predicted_gib)

    @property
    def lowest_allowed_gib(self) -> float:
        return self.band.lowest_actual_gib(self.predicted_gib)

    @property
    def exceeds(self) -> bool:
        """The measurement lies outside the band, above it or below it."""
        return not self.lowest_allowed_gib <= self.measured_gib <= self.highest_allowed_gib


@frozen
class PhaseCounter:
    """A phase's predicted counter bytes (GiB), the per-phase view of one process-wide peak."""

    phase: str
    allocated_gib: float
    reserved_gib: float
    planner_peak_gib: float


def _measured_peak(log: VerlLog, key: str) -> tuple[float, int] | None:
    series = log.series(key)
    if not series:
        return None
    step, value = max(series, key=lambda item: (item[1], -item[0]))
    return value, step


def memory_rows(plan: Plan, log: VerlLog, scope: MetricScope, profile: Profile
                ) -> tuple[list[MemoryRow], list[PhaseCounter]]:
    """Each of the log's memory counters beside the largest prediction of it over the phases (verl reads a
    process-wide peak), and the per-phase view of both counters (memory.allocator_report)."""
    counters = allocator_report(plan, profile, engine_in_process=scope.engine_in_process,
                                pool_counted_asleep=scope.pool_counted_asleep)
    per_phase = [PhaseCounter(phase=c.phase, allocated_gib=c.allocated / GIB, reserved_gib=c.reserved / GIB,
                              planner_peak_gib=c.resident / GIB) for c in counters]
    rows: list[MemoryRow] = []
    keys: list[tuple[str, Counter]] = [(scope.allocated_key, "allocated"), (scope.reserved_key, "reserved")]
    if scope.allocated_key.startswith("actor/"):
        # The critic's engine worker reads the same process-wide counters (verl colocates the roles in one process).
        keys += [(key.replace("actor/", "critic/", 1), counter) for key, counter in list(keys)]
    for key, counter in keys:
        peak = _measured_peak(log, key)
        if peak is None:
            continue
        at = max(counters, key=lambda c: getattr(c, counter))
        rows.append(MemoryRow(metric=key, counter=counter, measured_gib=peak[0],
                              predicted_gib=getattr(at, counter) / GIB, predicted_peak_phase=at.phase,
                              band=counter_error_band(plan, Phase(at.phase), counter, scope), at_step=peak[1]))
    return rows, per_phase


# --- time ---------------------------------------------------------------------------------------------

# verl's marked_timer names (RayPPOTrainer.fit) for each planner phase.
TIMING_KEY: dict[str, str] = {
    Phase.ROLLOUT: "timing_s/gen",
    Phase.WEIGHT_SYNC: "timing_s/update_weights",
    Phase.OLD_LOG_PROB: "timing_s/old_log_prob",
    Phase.REF_LOG_PROB: "timing_s/ref",
    Phase.CRITIC_VALUES: "timing_s/values",
    Phase.CRITIC_UPDATE: "timing_s/update_critic",
    Phase.ACTOR_UPDATE: "timing_s/update_actor",
    # The driver's own steps (steptime.step.driver_seconds).
    "reward": "timing_s/reward",
    "adv": "timing_s/adv",
}
# Steps that validate or checkpoint time that work inside timing_s/step.
_EXTRA_WORK = ("timing_s/testing", "timing_s/save_checkpoint")


@frozen
class TimeRow:
    phase: str
    metric: str
    measured_s: float
    predicted_s: float
    steps: int
    # The step-time model's error out of sample on this timing key (steptime/bands.py): the measured seconds
    # a prediction stood for lay within it on the published runs.
    band: TimeBand | None = None

    @property
    def within_band(self) -> bool | None:
        return None if self.band is None else self.band.holds(self.predicted_s, self.measured_s)

    @property
    def ratio(self) -> float:
        return self.measured_s / self.predicted_s if self.predicted_s else math.inf


def _predicted_seconds(plan: Plan, report: MemoryReport, profile: Profile) -> dict[str, float]:
    """The step-time model's per-phase seconds: its one call site here (planner/steptime.py's public entry)."""
    from rlplan.planner.steptime import predict_step_time

    return dict(predict_step_time(plan, report, profile).phase_seconds)


def steady_steps(log: VerlLog) -> list[int]:
    """Steps to time: all but the first (compilation, allocator warm-up) when there are three or more,
    without the steps that validated or saved a checkpoint."""
    steps = [s for s in log.steps if not any(s.get(key) for key in _EXTRA_WORK)]
    if len(steps) >= 3:
        steps = steps[1:]
    return [s.step for s in steps]


def time_rows(plan: Plan, report: MemoryReport, log: VerlLog, profile: Profile) -> list[TimeRow]:
    from rlplan.planner.steptime.bands import time_band

    predicted = _predicted_seconds(plan, report, profile)
    used = set(steady_steps(log))
    measured: dict[str, list[float]] = {}
    for step in log.steps:
        if step.step not in used:
            continue
        for key in (*TIMING_KEY.values(), "timing_s/step"):
            value = step.get(key)
            if value is not None and math.isfinite(value):
                measured.setdefault(key, []).append(value)
    rows: list[TimeRow] = []
    # Before update_weights had a timer of its own, the sync ran inside gen.
    sync_in_gen = "timing_s/update_weights" not in measured
    for phase, key in TIMING_KEY.items():
        if key not in measured or phase not in predicted:
            continue
        with_sync = phase == Phase.ROLLOUT and sync_in_gen
        seconds = predicted[phase] + (predicted.get(Phase.WEIGHT_SYNC, 0.0) if with_sync else 0.0)
        rows.append(TimeRow(phase=phase, metric=key + (" (with the weight sync)" if with_sync else ""),
                            measured_s=statistics.median(measured[key]), predicted_s=seconds, steps=len(measured[key]),
                            band=time_band(plan, key.removeprefix("timing_s/"))))
    if "timing_s/step" in measured:
        step_times = measured["timing_s/step"]
        rows.append(TimeRow(phase="step", metric="timing_s/step", measured_s=statistics.median(step_times),
                            predicted_s=sum(predicted.values()), steps=len(step_times), band=time_band(plan, "step")))
    return rows


# --- the length trend -----------------------------------------------------------------------------------


@frozen
class Forecast:
    slope_tokens_per_step: float
    intercept: float
    last_step: int
    # The largest mean response the plan fits (memory model); max_response_length when it fits at full length.
    longest_fitting_mean: int
    max_response_length: int
    # The step at which the trend's mean response reaches longest_fitting_mean; None: never (flat, or it fits at
    # full length).
    stops_fitting_at_step: int | None
    # The step at which the trend's mean reaches max_response_length (every response truncated); None: never.
    reaches_max_length_at_step: int | None
    fix: str | None
    # The first step whose response_length/max reached max_response_length (responses cut there); None: none did.
    longest_hit_limit_at_step: int | None = None

    def mean_at(self, step: int) -> float:
        return self.intercept + self.slope_tokens_per_step * step

    def message(self) -> str:
        if self.longest_hit_limit_at_step is None:
            return self._fit_message()
        return self._fit_message() + (f" (the longest responses reach max_response_length {self.max_response_length} "
                                      f"from step {self.longest_hit_limit_at_step}: they are cut there)")

    def _fit_message(self) -> str:
        direction = "grow" if self.slope_tokens_per_step >= 0 else "shrink"
        trend = f"responses {direction} ~{abs(self.slope_tokens_per_step):.2g} tokens/step"
        if self.stops_fitting_at_step is not None:
            text = (f"{trend}; the mean response reaches {self.longest_fitting_mean} tokens, the longest this plan "
                    f"fits, near step {self.stops_fitting_at_step}")
            return text + (f"; {self.fix} now" if self.fix else "")
        if self.longest_fitting_mean >= self.max_response_length:
            return (f"{trend}; the plan fits at the full {self.max_response_length}-token response length, "
                    "whatever the trend")
        return (f"{trend}; at this trend the mean response stays below {self.longest_fitting_mean} tokens, the "
                f"longest this plan fits")


def _linear_fit(points: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """Least squares (slope, intercept) of value over step; a flat line through one point."""
    if len(points) < 2:
        return 0.0, points[0][1]
    xs = [float(x) for x, _ in points]
    ys = [y for _, y in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread if spread else 0.0
    return slope, mean_y - slope * mean_x


def _first_step_at(slope: float, intercept: float, level: float, after: int) -> int | None:
    if slope <= 0:
        return None
    return max(after, math.ceil((level - intercept) / slope))


def length_forecast(plan: Plan, log: VerlLog, profile: Profile = DEFAULT_PROFILE) -> Forecast:
    """Fit the mean response length over steps and say where the plan (at the run's prompt length) stops fitting."""
    from rlplan.planner.solver import largest_fitting_token_budget

    points = log.series("response_length/mean")
    if not points:
        raise PlanError(field=log.source, message="logs no response_length/mean: no length trend to forecast.",
                        fix="pass a log of verl's trainer, which logs response_length/mean every step")
    slope, intercept = _linear_fit(points)
    last = points[-1][0]
    longest = longest_expected_response_that_fits(plan, profile)
    maximum = plan.data.max_response_length
    stops = None if longest >= maximum else _first_step_at(slope, intercept, longest + 1, last)
    if stops is None and longest < maximum and intercept + slope * last > longest:
        stops = last  # already past it
    fix = None
    if stops is not None:
        at_limit = plan.evolve(data=attrs.evolve(plan.data, expected_response_length=maximum))
        budget = largest_fitting_token_budget(at_limit, profile)
        fix = (f"set {budget[0]} = {budget[1]}" if budget is not None
               else "re-solve with `rlplan solve --from PLAN` at the lengths to come")
    hit = next((step for step, value in log.series("response_length/max") if value >= maximum), None)
    return Forecast(slope_tokens_per_step=slope, intercept=intercept, last_step=last, longest_fitting_mean=longest,
                    max_response_length=maximum, stops_fitting_at_step=stops,
                    reaches_max_length_at_step=_first_step_at(slope, intercept, maximum, last), fix=fix,
                    longest_hit_limit_at_step=hit)


# --- the whole comparison ---------------------------------------------------------------------------------


@frozen
class Comparison:
    plan: Plan
    scope: MetricScope
    scope_reason: str
    lengths: RunLengths
    memory: tuple[MemoryRow, ...]
    phases: tuple[PhaseCounter, ...]
    times: tuple[TimeRow, ...]
    # None: the log has no response_length/mean to follow.
    forecast: Forecast | None
    notes: tuple[str, ...]

    @property
    def exceeds(self) -> bool:
        return any(row.exceeds for row in self.memory)


def _notes(log: VerlLog, scope: MetricScope, plan: Plan) -> list[str]:
    notes = list(log.reading_notes())
    if plan.rollout.name in OWN_PROCESS_ENGINES and scope.engine_in_process:
        notes.append(f"{ENGINE_TITLES[plan.rollout.name]} always runs in its own process: its memory is outside "
                     "verl's counters")
    if not any(key in log.keys() for key in (scope.allocated_key, scope.reserved_key)):
        notes.append(f"the log has no {scope.allocated_key}: no memory to compare")
    return notes


def compare_run(plan: Plan, log: VerlLog, profile: Profile = DEFAULT_PROFILE,
                family: VersionFamily | None = None) -> Comparison:
    """The plan at the run's lengths against the log: memory per verl metric, time per phase, the length trend."""
    reason = "--verl-version"
    if family is None and plan.stack.verl != DEFAULT_VERL:
        family, reason = version_family(plan.stack.verl, "stack.verl"), f"the plan's stack (verl {plan.stack.verl})"
    if family is None:  # a plan on the default stack says nothing of the verl that ran: the log's spellings do
        family, reason = infer_family(log)
    scope = SCOPES[family]
    lengths = run_lengths(log, plan)
    at_run = plan_at_run_lengths(plan, lengths)
    report = predict_memory(at_run, profile)
    memory, phases = memory_rows(at_run, log, scope, profile)
    forecast = length_forecast(at_run, log, profile) if lengths.response_from_log else None
    notes = _notes(log, scope, plan)
    if (note := lengths.note()) is not None:
        notes.insert(0, note)
    if (refusal := start_refusal(at_run, report.rollout)) is not None:  # validate's verdict, which a log may refute
        notes.insert(0, f"predicted not to start: {refusal}; a log with steps started, so the vLLM that ran or "
                        "the trainer's state at its start differ from the plan's")
    return Comparison(plan=at_run, scope=scope, scope_reason=reason, lengths=lengths, memory=tuple(memory),
                      phases=tuple(phases), times=tuple(time_rows(at_run, report, log, profile)),
                      forecast=forecast, notes=tuple(notes))

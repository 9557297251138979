"""Fit the profile's constants from measurements: pure functions from observations to a `Profile`.

Two kinds of observation feed the fit:

* memory: a phase's predicted *allocated* bytes (the planner's phase peak without its
  overhead components) beside the GPU memory the process actually held at that phase's
  peak (reserved memory plus CUDA context and NCCL).  The allocator model is
  ``held = fixed + (1 + fragmentation) x allocated``, fitted by least squares: the
  intercept is the context/NCCL budget, the slope minus one the fragmentation fraction.
* time: a phase's predicted seconds at the profile's efficiency beside its measured
  seconds.  Each phase is bound by one resource (planner/steptime.py), so the achieved
  efficiency is the profile's value scaled by predicted / measured; phases of one kind
  are pooled by time (total predicted work over total measured time).

Where the records cannot determine a constant (one memory point cannot separate the
intercept from the slope), the base profile's value is kept and the fit says so.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import attrs
from attrs import field, frozen

from rlplan.planner.errors import PlanError
from rlplan.planner.phases import Phase
from rlplan.planner.plan import Plan
from rlplan.planner.profile import DEFAULT_PROFILE, MAX_OBSERVED_LENGTH, Profile
from rlplan.planner.validators import field_check

GIB = 2**30

Efficiency = Literal["training_mfu", "training_mfu_light_gpu", "prefill_mfu", "decode_hbm_efficiency"]

# Which profile efficiency bounds each step-time phase (planner/steptime.py).
EFFICIENCY_OF_PHASE: dict[str, Efficiency] = {
    Phase.ACTOR_UPDATE: "training_mfu",
    Phase.CRITIC_UPDATE: "training_mfu",
    Phase.OLD_LOG_PROB: "training_mfu",
    Phase.REF_LOG_PROB: "training_mfu",
    Phase.CRITIC_VALUES: "training_mfu",
    Phase.ROLLOUT: "decode_hbm_efficiency",
}

# What a GPU memory figure in a run's metrics means (runtime/metrics.py labels each row).
HELD_MEASURE = "cuda_memory_held"
ALLOCATED_MEASURE = "cuda_max_memory_allocated"


_positive = field_check("calibration", lambda value: value > 0, "must be positive, got {value}.",
                        "drop the record: a phase with no bytes or no time carries no information")


@frozen(kw_only=True)
class MemoryObservation:
    phase: str
    allocated_bytes: float = field(validator=_positive)
    held_bytes: float = field(validator=_positive)


@frozen(kw_only=True)
class TimeObservation:
    phase: str
    efficiency: Efficiency
    # The efficiency the prediction was made with.
    assumed: float = field(validator=_positive)
    predicted_seconds: float = field(validator=_positive)
    measured_seconds: float = field(validator=_positive)

    @property
    def achieved(self) -> float:
        return self.assumed * self.predicted_seconds / self.measured_seconds


@frozen(kw_only=True)
class AllocatorFit:
    fixed_bytes: float
    fragmentation_fraction: float
    # False when the records could fit the intercept only (one allocation size).
    slope_fitted: bool
    residual_bytes: float


@frozen(kw_only=True)
class Calibration:
    profile: Profile
    allocator: AllocatorFit | None
    efficiencies: dict[str, float]
    notes: tuple[str, ...] = ()

    def changed_constants(self) -> dict[str, Any]:
        """The constants the fit moved off the default profile's values (the profile's name aside)."""
        return {key: value for key, value in attrs.asdict(self.profile).items()
                if key != "name" and value != getattr(DEFAULT_PROFILE, key)}

    def to_json(self, profile_file: str) -> dict[str, Any]:
        """What `calibrate --json` prints once the fitted profile is written to profile_file."""
        return {"profile_file": profile_file, "changed": self.changed_constants(), "notes": list(self.notes)}


def fit_allocator(observations: Sequence[MemoryObservation],
                  default_fragmentation: float = DEFAULT_PROFILE.fragmentation_fraction) -> AllocatorFit:
    """Least squares of held = fixed + (1 + fragmentation) x allocated."""
    if not observations:
        raise PlanError(field="calibration", message="no memory observations to fit.",
                        fix="measure at least one phase's held GPU memory")
    xs = [o.allocated_bytes for o in observations]
    ys = [o.held_bytes for o in observations]
    count = len(xs)
    mean_x, mean_y = sum(xs) / count, sum(ys) / count
    spread = sum((x - mean_x) ** 2 for x in xs)
    # Allocation sizes within 1 % of each other cannot separate the slope from the intercept.
    if count >= 2 and spread > (0.01 * mean_x) ** 2 * count:
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
        fixed = mean_y - slope * mean_x
        fitted = True
    else:
        slope = 1.0 + default_fragmentation
        fixed = mean_y - slope * mean_x
        fitted = False
    residual = max(abs(y - (fixed + slope * x)) for x, y in zip(xs, ys, strict=True))
    return AllocatorFit(fixed_bytes=fixed, fragmentation_fraction=slope - 1.0, slope_fitted=fitted,
                        residual_bytes=residual)


def fit_efficiencies(observations: Iterable[TimeObservation]) -> dict[str, float]:
    """Achieved efficiency per kind, pooled by time: sum(assumed x predicted) / sum(measured)."""
    work: dict[str, float] = {}
    seconds: dict[str, float] = {}
    for o in observations:
        work[o.efficiency] = work.get(o.efficiency, 0.0) + o.assumed * o.predicted_seconds
        seconds[o.efficiency] = seconds.get(o.efficiency, 0.0) + o.measured_seconds
    return {key: work[key] / seconds[key] for key in work}


def _clamped(key: str, value: float, notes: list[str]) -> float:
    """Keep a fitted value inside the range the profile accepts, and say when it had to be moved."""
    bounds = {"cuda_context_and_nccl_gib": (0.0, 16.0), "fragmentation_fraction": (0.0, 0.5)}
    low, high = bounds.get(key, (1e-3, 1.0))
    clamped = min(max(value, low), high)
    if clamped != value:
        notes.append(f"{key}: fitted {value:.4g} lies outside [{low}, {high}]; kept {clamped:.4g}")
    return clamped


@frozen
class ObservedLengths:
    """Mean prompt and response tokens per sequence over a run's steps."""

    prompt_mean: float = field(validator=_positive)
    response_mean: float = field(validator=_positive)


def observed_lengths(rows: Sequence[dict[str, Any]]) -> ObservedLengths | None:
    """The run's mean lengths from its metrics rows (`prompt_length_mean`, `response_length_mean`), each
    step weighted by its `sequences`; None when no row records both.  Warm-up steps count: lengths are
    the data's, not the machine's."""
    totals = {"prompt": 0.0, "response": 0.0}
    weight = 0.0
    for row in rows:
        prompt, response = row.get("prompt_length_mean"), row.get("response_length_mean")
        if not isinstance(prompt, int | float) or not isinstance(response, int | float):
            continue
        sequences = row.get("sequences", 1.0)
        w = float(sequences) if isinstance(sequences, int | float) and sequences > 0 else 1.0
        totals["prompt"] += w * prompt
        totals["response"] += w * response
        weight += w
    if not weight or totals["prompt"] <= 0 or totals["response"] <= 0:
        return None
    for name in ("prompt", "response"):
        mean = totals[name] / weight
        if not mean <= MAX_OBSERVED_LENGTH:  # also NaN
            raise PlanError(field=f"metrics {name}_length_mean",
                            message=f"averages {mean:.4g} tokens per sequence over the run's lines, beyond any "
                                    f"context length ({MAX_OBSERVED_LENGTH:,}): the metrics file is not a run's.",
                            fix=f"correct or drop the lines whose {name}_length_mean is not a token count")
    return ObservedLengths(prompt_mean=totals["prompt"] / weight, response_mean=totals["response"] / weight)


def calibrate(memory: Sequence[MemoryObservation] = (), times: Sequence[TimeObservation] = (),
              base: Profile = DEFAULT_PROFILE, name: str = "calibrated",
              lengths: ObservedLengths | None = None) -> Calibration:
    """A profile with every constant the observations determine replaced by its fitted value."""
    notes: list[str] = []
    changes: dict[str, Any] = {"name": name}
    if lengths is not None:
        # Rounded up: a mean a token short would price a micro batch below what the run held.
        changes["observed_prompt_length"] = math.ceil(lengths.prompt_mean)
        changes["observed_response_length"] = math.ceil(lengths.response_mean)
    allocator = None
    if memory:
        allocator = fit_allocator(memory, base.fragmentation_fraction)
        changes["cuda_context_and_nccl_gib"] = _clamped("cuda_context_and_nccl_gib", allocator.fixed_bytes / GIB, notes)
        if allocator.slope_fitted:
            changes["fragmentation_fraction"] = _clamped("fragmentation_fraction", allocator.fragmentation_fraction, notes)
        else:
            notes.append("one allocation size: fragmentation_fraction kept, the fixed overhead fitted alone")
    efficiencies = fit_efficiencies(times)
    for key, value in efficiencies.items():
        changes[key] = _clamped(key, value, notes)
    if not memory and not times and lengths is None:
        notes.append("no usable observations: the base profile is returned unchanged")
    return Calibration(profile=attrs.evolve(base, **changes), allocator=allocator, efficiencies=efficiencies,
                       notes=tuple(notes))


# --- observations from plans and runs -------------------------------------------------------


def memory_observation(plan: Plan, phase: str, held_bytes: float,
                       profile: Profile = DEFAULT_PROFILE) -> MemoryObservation:
    """A plan phase's predicted allocated bytes beside the GPU memory held at its peak."""
    from rlplan.planner.memory import predict_phase

    predicted = predict_phase(plan, phase, profile)
    allocated = predicted.peak_bytes - predicted.scope_bytes("overhead")
    return MemoryObservation(phase=phase, allocated_bytes=allocated, held_bytes=held_bytes)


def time_observations(plan: Plan, measured_seconds: dict[str, float],
                      profile: Profile = DEFAULT_PROFILE) -> list[TimeObservation]:
    """Measured phase seconds beside the step-time model's, for the phases one efficiency bounds.

    A phase also has costs no efficiency scales (a fixed cost per micro batch, the optimizer step):
    pricing it at the efficiency and at half of it splits seconds = work / efficiency + fixed, and the
    observation compares the work's share with the measured seconds less the fixed part.  The
    trainer's passes are bound by the MFU of the plan's GPU class (steptime.training_mfu_key).
    """
    from rlplan.planner.memory import predict_memory
    from rlplan.planner.steptime import predict_step_time, training_mfu_key

    memory = predict_memory(plan, profile)
    predicted = predict_step_time(plan, memory, profile).phase_seconds
    halved: dict[str, dict[str, float]] = {}
    observations = []
    for phase, seconds in measured_seconds.items():
        efficiency = EFFICIENCY_OF_PHASE.get(phase)
        if efficiency is None or seconds <= 0 or predicted.get(phase, 0.0) <= 0:
            continue
        if efficiency == "training_mfu":
            efficiency = training_mfu_key(plan, profile)  # type: ignore[assignment]
        assumed = float(getattr(profile, efficiency))
        if efficiency not in halved:
            slower = attrs.evolve(profile, **{efficiency: assumed / 2})
            halved[efficiency] = predict_step_time(plan, memory, slower).phase_seconds
        bound = min(predicted[phase], halved[efficiency][phase] - predicted[phase])
        fixed = predicted[phase] - bound
        if bound <= 0 or seconds <= fixed:
            continue
        observations.append(TimeObservation(phase=phase, efficiency=efficiency, assumed=assumed,
                                            predicted_seconds=bound, measured_seconds=seconds - fixed))
    return observations


def observations_from_metrics(plan: Plan, rows: Sequence[dict[str, Any]], profile: Profile = DEFAULT_PROFILE,
                              skip_steps: int = 1) -> tuple[list[MemoryObservation], list[TimeObservation], list[str]]:
    """Observations from a run's metrics.jsonl rows (runtime/metrics.py keys), skipping warm-up steps.

    Times come from `time/<phase>`. Memory comes from `memory/<phase>_held_gib`, what the GPU
    held at the phase's peak (reserved pool plus context and NCCL; runtime/metrics.py writes it
    on CUDA where NVML can tell), or from `memory/<phase>_peak_gib` in rows whose
    `memory_measure` is cuda_memory_held. An allocator's max_memory_allocated lacks the very
    context and fragmentation this fit is for, and a CPU process's RSS is not GPU memory.
    """
    notes: list[str] = []
    used = [row for row in rows if int(row.get("step", 0)) > skip_steps] or list(rows)
    memory: list[MemoryObservation] = []
    times: list[TimeObservation] = []
    skipped_measures: set[str] = set()
    for row in used:
        seconds = {key.removeprefix("time/"): float(value) for key, value in row.items()
                   if key.startswith("time/") and isinstance(value, int | float)}
        times += time_observations(plan, seconds, profile)
        for phase, held_gib in _held_memory(row, skipped_measures).items():
            try:
                memory.append(memory_observation(plan, phase, held_gib * GIB, profile))
            except KeyError:
                notes.append(f"phase {phase!r} is not in this plan's step; its memory rows are ignored")
    for measure in sorted(skipped_measures):
        notes.append(f"memory rows measured as {measure!r} do not show held GPU memory; not used for the "
                     "allocator fit")
    return memory, times, notes


def _held_memory(row: dict[str, Any], skipped_measures: set[str]) -> dict[str, float]:
    """Phase -> GiB held, from one metrics row; the measures that show something else are noted."""
    held: dict[str, float] = {}
    peak_is_held = row.get("memory_measure", "") == HELD_MEASURE
    for key, value in row.items():
        if not key.startswith("memory/") or not isinstance(value, int | float):
            continue
        name = key.removeprefix("memory/")
        if name.endswith("_held_gib"):
            held[name.removesuffix("_held_gib")] = float(value)
        elif name.endswith("_peak_gib") and peak_is_held:
            held.setdefault(name.removesuffix("_peak_gib"), float(value))
    if not held and any(key.startswith("memory/") and key.endswith("_peak_gib") for key in row):
        skipped_measures.add(str(row.get("memory_measure", "")) or "unlabelled")
    return held


# --- observations from a verl run's log (`calibrate --from-verl-log`) ------------------------------------------


@frozen(kw_only=True)
class VerlRun:
    """One verl run to fit from: the plan it ran (at any lengths) and its parsed log."""

    plan: Plan
    log: Any  # planner.verl_log.VerlLog (imported lazily: calibration stays importable without it)


def _verl_reserved_residual(run: VerlRun, profile: Profile, family: Any) -> tuple[float | None, str]:
    """GiB by which the run's max_memory_reserved exceeds the prediction of that counter (memory.allocator_report:
    the allocator replay and the fitted terms): what a site's `allocator_cache_gib` adds to it."""
    from rlplan.planner.compare import SCOPES, infer_family
    from rlplan.planner.memory.allocator_report import allocator_report

    scope = SCOPES[family or infer_family(run.log)[0]]
    reserved = run.log.series(scope.reserved_key)
    if not reserved:
        return None, (f"{run.log.source}: no {scope.reserved_key}; the allocator cache is not informed by it")
    rows = allocator_report(run.plan, attrs.evolve(profile, allocator_cache_gib=0.0),
                            engine_in_process=scope.engine_in_process, pool_counted_asleep=scope.pool_counted_asleep)
    predicted = max(r.reserved for r in rows) / GIB
    return max(v for _, v in reserved) - predicted, ""


def verl_run_timing(run: VerlRun) -> RunTiming | None:
    """Median seconds per verl timing key over the run's steady steps, as `fit_step_time` compares them."""
    from rlplan.planner.compare import steady_steps

    used = set(steady_steps(run.log))

    def median(key: str) -> float | None:
        values = [v for step, v in run.log.series(f"timing_s/{key}") if step in used and math.isfinite(v)]
        return statistics.median(values) if values else None

    measured = {key: value for key in FITTED_TIMINGS if (value := median(key)) is not None and value > 0}
    sync = median("update_weights")
    if "gen" in measured and sync:
        # The model's gen is the rollout plus the weight sync (steptime.verl_timing_seconds), as older verl timed it;
        # newer verl times the sync apart, so it is added back.
        measured["gen"] += sync
    return RunTiming(label=str(run.log.source), plan=run.plan, measured_seconds=measured) if measured else None


def calibrate_from_verl_logs(runs: Sequence[VerlRun], base: Profile = DEFAULT_PROFILE, name: str = "calibrated",
                             family: Any = None) -> Calibration:
    """A profile fitted from verl runs: lengths, the allocator's cache and fragmentation, the efficiencies.

    Each run is priced at its own mean lengths (its prompt_length/mean and response_length/mean). Constants a verl
    log cannot inform are refused by name in the notes: the CUDA context and NCCL (verl's counters exclude them),
    fragmentation with one allocation size, and any efficiency whose phase the log does not time.
    """
    from rlplan.planner.compare import plan_at_run_lengths, run_lengths

    if not runs:
        raise PlanError(field="--from-verl-log", message="no verl log to fit from.", fix="pass --from-verl-log LOG")
    notes = ["cuda_context_and_nccl_gib: not fitted (verl's counters exclude the CUDA context and NCCL)",
             "fragmentation_fraction: not fitted (every trainer phase, FSDP's and Megatron's, takes the allocator "
             "replay's stranded bytes; the fraction prices only benchmarks/accuracy.py's torchtitan rows)"]
    priced_runs: list[VerlRun] = []
    timings: list[RunTiming] = []
    weighted = {"prompt": 0.0, "response": 0.0, "steps": 0}
    for run in runs:
        notes.extend(run.log.reading_notes(named=True))
        lengths = run_lengths(run.log)
        priced = VerlRun(plan=plan_at_run_lengths(run.plan, lengths), log=run.log)
        priced_runs.append(priced)
        weighted["prompt"] += lengths.prompt_mean * lengths.steps
        weighted["response"] += lengths.response_mean * lengths.steps
        weighted["steps"] += lengths.steps
        timing = verl_run_timing(priced)
        if timing is not None:
            timings.append(timing)
    changes: dict[str, Any] = {"name": name,
                               "observed_prompt_length": math.ceil(weighted["prompt"] / weighted["steps"]),
                               "observed_response_length": math.ceil(weighted["response"] / weighted["steps"])}
    profile = attrs.evolve(base, **changes)
    moved: dict[str, float] = {}
    if timings:
        # The step-time constants from the same fit the published sweeps use, one profile for every run given.
        fit = fit_step_time(timings, profile, name=name)
        moved = {key: float(getattr(fit.profile, key)) for key in STEP_TIME_CONSTANTS
                 if getattr(fit.profile, key) != getattr(profile, key)}
        notes.append(f"step time: rms log error {fit.rms_log_error_before:.2f} -> {fit.rms_log_error_after:.2f} "
                     f"over {fit.compared_phases} timed phases")
        notes += [f"{key}: not fitted (the log's timed phases do not move it)"
                  for key in STEP_TIME_CONSTANTS if key not in moved]
        profile = fit.profile
    else:
        notes.append("step-time constants: not fitted (the log times no phase rlplan prices)")
    # Last: the replay walks the workload's response tail, which the step-time fit may move.
    residuals: list[float] = []
    for priced in priced_runs:
        residual, why = _verl_reserved_residual(priced, profile, family)
        if residual is not None:
            residuals.append(residual)
        elif why:
            notes.append(why)
    if residuals:
        # The reserved counter's mean excess over the prediction, never below zero: the site's own cache.
        profile = attrs.evolve(profile, allocator_cache_gib=min(max(statistics.fmean(residuals), 0.0), 64.0))
    else:
        notes.append("allocator_cache_gib: not fitted (no run logs the reserved counter)")
    return Calibration(profile=profile, allocator=None, efficiencies=moved, notes=tuple(notes))


# --- step-time constants from whole runs (verl's timing_s per phase) -----------------------------------

# The step-time constants `fit_step_time` tunes (planner/steptime.py, docs/steptime.md): the decode step's
# host costs, the trainer's MFU per GPU class and fixed per-micro-batch cost, and the response tail.
STEP_TIME_CONSTANTS: tuple[str, ...] = (
    "decode_step_floor_s",
    "decode_eager_seconds_per_layer",
    "decode_seconds_per_sequence",
    "tp_allreduce_latency_us",
    "decode_mfu",
    "response_length_sigma",
    "training_mfu",
    "training_mfu_light_gpu",
    "micro_batch_seconds_per_layer",
    # a step's fixed costs (issue 40): the worker calls, verl's offloads, the optimizer step's host work, the
    # driver's reward and advantage steps, the engine's wake-up and sleep
    "worker_call_seconds",
    "dataproto_gbps",
    "pageable_copy_gbps",
    "optimizer_step_seconds_per_layer",
    "reward_seconds_per_sequence",
    "gae_seconds_per_position",
    "gae_seconds_per_token",
    "grouped_advantage_seconds_per_sequence",
    "engine_wake_sleep_seconds_per_gib",
)
# The phases a fit compares, by verl's timing key; `step` is their sum plus what rlplan does not price.
FITTED_TIMINGS: tuple[str, ...] = ("gen", "old_log_prob", "ref", "update_actor", "update_critic", "values", "reward",
                                   "adv")


@frozen(kw_only=True)
class RunTiming:
    """One run's plan (at the run's mean lengths) and its measured seconds by verl timing key."""

    label: str
    plan: Plan
    measured_seconds: dict[str, float]


@frozen(kw_only=True)
class StepTimeFit:
    profile: Profile
    # Root mean square of log(predicted / measured) over every compared phase, before and after.
    rms_log_error_before: float
    rms_log_error_after: float
    compared_phases: int


def _log_errors(runs: Sequence[RunTiming], profile: Profile, memories: Sequence[Any]) -> list[float]:
    from rlplan.planner.steptime import predict_step_time, verl_timing_seconds

    errors = []
    for run, memory in zip(runs, memories, strict=True):
        predicted = verl_timing_seconds(predict_step_time(run.plan, memory, profile))
        for key in FITTED_TIMINGS:
            measured = run.measured_seconds.get(key, 0.0)
            if measured > 0 and predicted.get(key, 0.0) > 0:
                errors.append(math.log(predicted[key] / measured))
    return errors


def _rms(errors: Sequence[float]) -> float:
    return math.sqrt(sum(e * e for e in errors) / len(errors)) if errors else 0.0


def fit_step_time(runs: Sequence[RunTiming], base: Profile = DEFAULT_PROFILE,
                  keys: Sequence[str] = STEP_TIME_CONSTANTS, rounds: int = 4,
                  name: str = "calibrated", prior_weight: float = 0.0) -> StepTimeFit:
    """The profile whose step-time constants minimise the squared log error of every measured phase of `runs`.

    Coordinate descent: each key in turn is scanned over a log grid around its value (x1/4 .. x4 first,
    narrower each round) inside the bounds the profile accepts.  One profile for all runs: never a
    constant per case.  With `prior_weight` > 0 the objective also charges every key its squared log
    distance from `base` times that weight (a ridge prior): a constant the runs do not pin down stays at
    its sourced value instead of wandering to fit one sweep's noise.
    """
    from rlplan.planner.memory import predict_memory

    if not runs:
        raise PlanError(field="calibration", message="no runs to fit the step-time constants to.",
                        fix="give at least one run with measured timing_s phases")
    memories = [predict_memory(run.plan, base) for run in runs]
    profile = attrs.evolve(base, name=name)

    def objective(candidate: Profile) -> float:
        errors = _log_errors(runs, candidate, memories)
        mean_square = sum(e * e for e in errors) / len(errors) if errors else 0.0
        prior = sum(math.log(float(getattr(candidate, key)) / float(getattr(base, key))) ** 2
                    for key in keys if float(getattr(base, key)) > 0 and float(getattr(candidate, key)) > 0)
        return mean_square + prior_weight * prior

    before = _rms(_log_errors(runs, profile, memories))
    best = objective(profile)
    span = 4.0
    for _ in range(rounds):
        for key in keys:
            current = float(getattr(profile, key))
            for factor in _log_grid(span):
                value = _within_bounds(key, current * factor)
                try:
                    candidate = attrs.evolve(profile, **{key: value})
                except PlanError:
                    continue
                score = objective(candidate)
                if score < best - 1e-12:
                    best, profile = score, candidate
        span = math.sqrt(span)
    errors = _log_errors(runs, profile, memories)
    return StepTimeFit(profile=profile, rms_log_error_before=before, rms_log_error_after=_rms(errors),
                       compared_phases=len(errors))


def _log_grid(span: float, points: int = 9) -> list[float]:
    return [span ** (2 * i / (points - 1) - 1) for i in range(points)]


def _within_bounds(key: str, value: float) -> float:
    """Keep efficiencies at most 1 (the profile refuses more); other constants only positive."""
    if key.startswith("training_mfu") or key.endswith("_efficiency"):
        return min(value, 1.0)
    return value


def response_tail_from_run(mean: float, longest: float, sequences: float, maximum: int) -> float | None:
    """`response_length_sigma` from a run's `response_length/mean` and `response_length/max` over a batch of
    `sequences` responses: the log-normal shape whose expected longest of that many is the one seen.

    None when the longest hit max_response_length (the cut hides the tail) or is not above the mean.
    """
    from rlplan.planner.steptime import Lengths

    if longest >= maximum or longest <= mean or mean <= 0:
        return None

    def seen_longest(sigma: float) -> float:
        lengths = Lengths(prompt_mean=0.0, response_mean=mean, response_max=maximum, sigma=sigma)
        return lengths.longest_of(sequences)

    low, high = 1e-3, 4.0
    if seen_longest(high) < longest:
        return high
    for _ in range(50):
        middle = (low + high) / 2
        if seen_longest(middle) < longest:
            low = middle
        else:
            high = middle
    return (low + high) / 2

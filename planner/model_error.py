"""How wrong the memory model is: error bands from measured rows, and the margin `solve` keeps because of them.

The one owner of the model's measured error. The rows are data, not constants: `presets/measured_accuracy.toml`
holds every row of docs/accuracy.md that compares a prediction with a measurement (the CPU tracker's training
steps, the loss-head twins, torchtitan's whole-GPU peaks, llm-d's vLLM budgets), each with the prediction the
planner made when `benchmarks/accuracy.py` last wrote it. When the model changes and the rows are regenerated,
the bands and the default margin follow.

Two kinds of row, kept apart in the bands' words:

* twin rows (presets/measured_accuracy.toml): rlplan's own CPU measurements of the real model code (the tracker's
  training steps, the loss-head twins) and published whole-GPU figures (torchtitan, llm-d); all of the allocated
  figure;
* real runs (presets/public_runs_accuracy.toml, written by benchmarks/public_verl_runs.py): public verl logs, each
  counter (allocated, reserved) against the prediction for that run made with constants fitted on the other runs
  only (leave-one-out), with the run's allocator regime (where the engine runs, expandable segments or not) and
  the phase the prediction puts the counter's peak in.

A plan phase's band for a counter is the widest error of the rows comparable to it: twin rows of the same kind of
pass (an update, a no_grad forward, the engine), loss head (`memory.resolved_loss_head`) and FSDP strategy, and
the real runs of that counter and regime, whose largest error either way bounds both sides (real_run_width).
Where no real run is comparable the band takes every real run of the counter and says it has no comparable
evidence; where no twin row is comparable it takes the widest of the kind, and says so.  A band is never narrower
than the real runs' evidence and never of zero width.

The default margin (`--headroom` unset) is the larger of the profile's floor (`headroom_floor_fraction`: what the
rows cannot see) and the largest under-prediction of the plan's phases' bands, as a share of one GPU's memory.
"""

from __future__ import annotations

import functools
import math
import statistics
from typing import Any, Literal

import attrs
from attrs import frozen

from rlplan.planner.errors import PlanError
from rlplan.planner.memory.heads import resolved_loss_head
from rlplan.planner.package_data import package_toml, package_toml_exists
from rlplan.planner.phases import Phase
from rlplan.planner.plan import Plan
from rlplan.planner.profile import DEFAULT_PROFILE, Profile

GIB = 2**30
ROWS_FILE = "measured_accuracy.toml"
RUN_ROWS_FILE = "public_runs_accuracy.toml"
# The public evidence of a Megatron run's counters, searched for and kept by hand (presets/).
MEGATRON_EVIDENCE_FILE = "megatron_public_evidence.toml"
# Two of them measured at the engine's start (benchmarks/megatron_public_runs.py --write-rows).
ENGINE_START_ROWS_FILE = "megatron_engine_start_rows.toml"
REAL_RUN = "public"  # the source of a real run's row

Counter = Literal["allocated", "reserved"]
COUNTERS: tuple[Counter, ...] = ("allocated", "reserved")

# Which measured rows a phase compares with: a training step, a no_grad forward pass, or the rollout engine
# (whose budget is vLLM's own accounting; the weight sync adds sizes the engine rows already check).
PHASE_KIND = {
    Phase.ACTOR_UPDATE: "update", Phase.CRITIC_UPDATE: "update",
    Phase.OLD_LOG_PROB: "forward", Phase.REF_LOG_PROB: "forward", Phase.CRITIC_VALUES: "forward",
    Phase.ROLLOUT: "engine", Phase.WEIGHT_SYNC: "engine",
}
# The critic's value head is no vocabulary head: its phases compare with every row of their kind.
_HEADLESS_PHASES = frozenset({Phase.CRITIC_UPDATE, Phase.CRITIC_VALUES, Phase.ROLLOUT, Phase.WEIGHT_SYNC})


@frozen(kw_only=True)
class AccuracyRow:
    """One measured row of docs/accuracy.md, as benchmarks/accuracy.py wrote it."""

    source: str  # the section: steps (1), heads (1b), torchtitan (2b), llm-d (2a)
    model: str
    phase: str
    head: str  # the loss head the step ran ("" for the engine rows)
    strategy: str
    configuration: str
    measured_mib: float = attrs.field(validator=attrs.validators.gt(0))
    predicted_mib: float = attrs.field(validator=attrs.validators.gt(0))
    # Which figure: the tensors allocated, or the caching allocator's reserved segments (real runs only).
    counter: Counter = attrs.field(default="allocated", validator=attrs.validators.in_(COUNTERS))
    # A real run's allocator regime (allocator_regime); "" for twin rows.
    regime: str = ""

    @property
    def real_run(self) -> bool:
        return self.source == REAL_RUN

    @property
    def kind(self) -> str:
        return PHASE_KIND[Phase(self.phase)]

    @property
    def error(self) -> float:
        """predicted / measured - 1: negative is an under-prediction."""
        return self.predicted_mib / self.measured_mib - 1


@frozen(kw_only=True)
class ErrorBand:
    """How far the model's prediction fell from measurement on the rows comparable to one phase."""

    # >= 0: the largest fraction by which the prediction fell BELOW the measurement on comparable rows.
    under: float = attrs.field(validator=attrs.validators.and_(attrs.validators.ge(0.0), attrs.validators.lt(1.0)))
    # >= 0: the largest fraction by which it fell ABOVE.
    over: float = attrs.field(validator=attrs.validators.ge(0.0))
    # How many measured rows back it (0: no comparable rows; the band is then the stated default).
    rows: int = attrs.field(validator=attrs.validators.ge(0))
    # Which rows, in words.
    basis: str
    # True: no measured row covers the plan's training backend at all; `under` is the stated assumption
    # (profile.unmeasured_backend_under_fraction), not a measurement.
    assumed: bool = False
    # Real runs the band takes (leave-one-out errors), and whether any of them is comparable to the plan.
    runs: int = 0
    comparable_runs: bool = False
    counter: Counter = "allocated"
    # The largest under-prediction measured on the rows (the band's `under` is where a new run may fall; the default
    # margin keeps what was seen); None: the band's own `under`.
    observed_under: float | None = None
    # What public evidence of the plan's backend exists where no real run backs the band (BackendEvidence), in words.
    evidence: str = ""

    @property
    def seen_under(self) -> float:
        return self.under if self.observed_under is None else self.observed_under

    def highest_actual_gib(self, predicted_gib: float) -> float:
        """The largest real peak consistent with the band: the prediction was `under` too low at worst."""
        return predicted_gib / (1 - self.under)

    def lowest_actual_gib(self, predicted_gib: float) -> float:
        """The smallest real peak consistent with the band: the prediction was `over` too high at worst."""
        return predicted_gib / (1 + self.over)

    def describe(self) -> str:
        evidence = f"; {self.evidence}" if self.evidence else ""
        if self.assumed:
            over = f" to +{100 * self.over:.0f} %" if self.over else ""
            where = "here" if self.rows else "for this training backend"
            return f"{self.counter}: model error unmeasured {where}: assumed -{100 * self.under:.0f} %{over}{evidence}"
        span = f"-{100 * self.under:.0f} % to +{100 * self.over:.0f} %"
        if not self.runs:
            return (f"{self.counter}: model error on {'comparable measured rows' if self.rows else 'all measured rows'}"
                    f" (no real run): {span}{evidence}")
        if self.comparable_runs:
            return (f"{self.counter}: model error on {self.runs} comparable real verl runs (leave-one-out, 95 % "
                    f"prediction interval): {span}")
        return (f"{self.counter}: no comparable real run; all {self.runs} real verl runs of other regimes "
                f"(leave-one-out, 95 % prediction interval): {span}")

    def as_json(self) -> dict[str, Any]:
        return {"counter": self.counter, "under": round(self.under, 4), "over": round(self.over, 4),
                "rows": self.rows, "real_runs": self.runs, "comparable_real_runs": self.comparable_runs,
                "basis": self.basis, "assumed": self.assumed, "text": self.describe(),
                **({"evidence": self.evidence} if self.evidence else {})}


@functools.cache
def accuracy_rows() -> tuple[AccuracyRow, ...]:
    """Every twin row, from the package's presets/measured_accuracy.toml (read once per process)."""
    return tuple(AccuracyRow(**row) for row in package_toml(ROWS_FILE)["row"])


@functools.cache
def run_rows() -> tuple[AccuracyRow, ...]:
    """Every real run's row, from presets/public_runs_accuracy.toml (none when the file is absent)."""
    if not package_toml_exists(RUN_ROWS_FILE):
        return ()
    return tuple(AccuracyRow(**row) for row in package_toml(RUN_ROWS_FILE).get("row", []))


@frozen(kw_only=True)
class BackendEvidence:
    """What public evidence of a training backend's counters exists (presets/megatron_public_evidence.toml)."""

    sources: int  # public sources examined
    phase_peak_runs: int  # runs whose phase counters and launch config rebuild a comparison (none yet)
    engine_start_runs: int  # runs measured at the engine's start only (docs/accuracy.md 4c)

    def describe(self) -> str:
        return (f"real Megatron verl runs: {self.phase_peak_runs} with phase memory counters, {self.engine_start_runs} "
                f"measured at the engine's start only (docs/accuracy.md 4c), of {self.sources} public sources examined "
                f"(presets/{MEGATRON_EVIDENCE_FILE})")


@functools.cache
def backend_evidence(strategy: str) -> BackendEvidence | None:
    """The public evidence of `strategy`'s counters where it is kept (Megatron's); None for other backends."""
    if strategy != "megatron" or not package_toml_exists(MEGATRON_EVIDENCE_FILE):
        return None
    sources = package_toml(MEGATRON_EVIDENCE_FILE).get("source", [])
    measures = [source["measures"] for source in sources]
    return BackendEvidence(sources=len(sources), phase_peak_runs=measures.count("phase_peaks"),
                           engine_start_runs=measures.count("engine_start"))


@functools.cache
def engine_start_rows() -> tuple[AccuracyRow, ...]:
    """The public Megatron runs' allocated counter at the engine's start beside the prediction (the trainer's
    resident state and the engine's weights; no phase peak), from presets/megatron_engine_start_rows.toml."""
    if not package_toml_exists(ENGINE_START_ROWS_FILE):
        return ()
    return tuple(AccuracyRow(**row) for row in package_toml(ENGINE_START_ROWS_FILE).get("row", []))


# Student's t at 97.5 % by degrees of freedom (1 to 10; the normal's 1.96 beyond), for a 95 % prediction interval.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def real_run_interval(errors: list[float]) -> tuple[float, float]:
    """(under, over): where a new run's error falls with 95 % probability, from the real runs' errors: the
    prediction interval mean +- t s sqrt(1 + 1/n) of a normal sample, never inside the errors seen.  A verl counter
    is one process-wide peak, so real runs compare by counter and allocator regime, not by the kind of the phase
    predicted to hold the peak."""
    if not errors:
        return 0.0, 0.0
    n = len(errors)
    mean = statistics.fmean(errors)
    spread = statistics.stdev(errors) if n > 1 else abs(mean)
    t = _T975[min(n - 1, len(_T975)) - 1] if n > 1 else _T975[0]
    half = t * spread * math.sqrt(1 + 1 / n)
    return max(-min(errors), half - mean, 0.0), max(max(errors), mean + half, 0.0)


def allocator_regime(engine_in_process: bool, expandable: bool) -> str:
    """How a run's caching allocator is used, in words: the engine's place and the trainer's segments."""
    engine = "engine in the trainer process" if engine_in_process else "engine in its own process"
    return f"{engine}, {'expandable segments' if expandable else 'fixed segments'}"


# rlplan's bundled runtime on CPU ranks: no caching allocator, no verl process; the real runs say nothing of it.
CPU_REGIME = "rlplan's CPU runtime"


def plan_regime(plan: Plan, engine_in_process: bool | None = None) -> str:
    if plan.cluster.gpu.is_cpu:
        return CPU_REGIME
    from rlplan.planner.memory.allocator_report import engine_in_trainer_process
    from rlplan.planner.memory.allocator_trace import allocator_config

    in_process = engine_in_trainer_process(plan) if engine_in_process is None else engine_in_process
    return allocator_regime(in_process, allocator_config(plan, trainer_phase=True).expandable_segments)


def _band(rows: tuple[AccuracyRow, ...], basis: str, count: int) -> ErrorBand:
    errors = [row.error for row in rows] or [0.0]
    return ErrorBand(under=max(0.0, -min(errors)), over=max(0.0, max(errors)), rows=count, basis=basis)


def _rows(count: int) -> str:
    return f"{count} row" + "s" * (count != 1)


def _same_backend(measured: str, planned: str) -> bool:
    """FSDP and FSDP2 are one backend here: the same per-rank sharding and the same loss-head code."""
    def family(strategy: str) -> str:
        return "fsdp" if strategy.startswith("fsdp") else strategy
    return family(measured) == family(planned)


@functools.cache
def error_band(kind: str, head: str | None, strategy: str, counter: Counter = "allocated",
               regime: str = "") -> ErrorBand:
    """The band of the rows of `kind` with `head` (None: any) under `strategy` (the engine's: any), for `counter`,
    widened to the real runs of that counter, kind and `regime` (every real run of the counter when none is)."""
    twins = _twin_band(kind, head, strategy)
    # Real runs of another training backend (the public logs are FSDP's) say nothing of this one's.
    real = [row for row in run_rows() if row.counter == counter and regime != CPU_REGIME
            and _same_backend(row.strategy, strategy)]
    found = backend_evidence(strategy)
    evidence = found.describe() if found is not None and not real and regime != CPU_REGIME else ""
    if twins.assumed:
        return attrs.evolve(twins, counter=counter, evidence=evidence)
    comparable = [row for row in real if row.regime == regime]
    used = comparable or real
    errors = [row.error for row in used]
    interval = real_run_interval(errors)
    seen = max([twins.under if counter == "allocated" else 0.0, *(-e for e in errors)], default=0.0)
    # A real run measured at the engine's start sees the resident state every phase holds: the band keeps its errors.
    starts = [row.error for row in engine_start_rows() if row.counter == counter and regime != CPU_REGIME
              and _same_backend(row.strategy, strategy)]
    seen = max([seen, *(-e for e in starts)])
    under = max([twins.under if counter == "allocated" else 0.0, interval[0], *(-e for e in starts)])
    over = max([twins.over if counter == "allocated" else 0.0, interval[1], *starts])
    if under <= 0 and over <= 0:
        # No evidence of any error is not evidence of none: the stated assumption, as for an unmeasured backend.
        under = DEFAULT_PROFILE.unmeasured_backend_under_fraction
        return ErrorBand(under=under, over=under, rows=twins.rows, counter=counter, assumed=True, evidence=evidence,
                         basis=f"no measured error for {counter} here: +-{100 * under:.1f} % assumed")
    runs = f"{len(used)} real verl run{'s' * (len(used) != 1)} ({'comparable' if comparable else 'none comparable: all'})"
    basis = f"{runs}" + (f"; {twins.basis}" if counter == "allocated" else "") + (
        f"; {len(starts)} real runs at the engine's start only: {', '.join(f'{100 * e:+.1f} %' for e in starts)}"
        if starts else "")
    return ErrorBand(under=min(max(0.0, under), 0.99), over=max(0.0, over), rows=twins.rows, basis=basis,
                     runs=len(used), comparable_runs=bool(comparable), counter=counter, evidence=evidence,
                     observed_under=min(max(0.0, seen), 0.99))


@functools.cache
def _twin_band(kind: str, head: str | None, strategy: str) -> ErrorBand:
    """The band of the twin rows of `kind` with `head` (None: any) under `strategy` (the engine's: any)."""
    if strategy == "megatron" and kind != "engine":
        # The Megatron backend prices the larger of verl's head and Megatron-Core's own vocabulary-parallel cross
        # entropy, which its measured rows run (the CPU twin, docs/accuracy.md 6b): they hold for any head.
        head = None
    of_kind = tuple(row for row in accuracy_rows() if row.kind == kind)
    comparable = tuple(row for row in of_kind if (head is None or row.head == head)
                       and (kind == "engine" or row.strategy == strategy))
    what = {"update": "update", "forward": "forward-pass", "engine": "rollout-engine"}[kind]
    owner = "vLLM" if kind == "engine" else strategy
    if kind != "engine" and not any(_same_backend(row.strategy, strategy) for row in of_kind):
        # Rows of another backend (or of another kind of pass) say nothing about this one's code path: assume
        # the error an unmeasured path has shown before, and say so.
        under = DEFAULT_PROFILE.unmeasured_backend_under_fraction
        return ErrorBand(under=under, over=0.0, rows=0, assumed=True,
                         basis=f"no measured row of the {strategy} backend: -{100 * under:.1f} % assumed "
                               "(profile.unmeasured_backend_under_fraction)")
    if comparable:
        sources = ", ".join(sorted({row.source for row in comparable}))
        return _band(comparable, f"{_rows(len(comparable))} measured: {owner} {what}"
                     f"{f', {head} head' if head else ''} (docs/accuracy.md: {sources})", len(comparable))
    if not of_kind:
        return _band((), f"no measured {what} rows at all: the model's error there is unknown", 0)
    return _band(of_kind, f"no measured {what} row{f' with the {head} head' if head else ''} under {owner}: the "
                 f"widest error of all {_rows(len(of_kind))} of that kind", 0)


def peak_error_band(plan: Plan, phase: Phase | str, counter: Counter = "allocated",
                    engine_in_process: bool | None = None) -> ErrorBand:
    """The error band of the plan's predicted `counter` in `phase`, from the measured rows comparable to it (the
    engine's place defaults to the plan's stack)."""
    phase = Phase(phase)
    head = None if phase in _HEADLESS_PHASES else resolved_loss_head(plan)
    return error_band(PHASE_KIND[phase], head, plan.actor.strategy, counter, plan_regime(plan, engine_in_process))


def counter_error_band(plan: Plan, phase: Phase | str, counter: Counter, scope: Any) -> ErrorBand:
    """The band of a verl counter predicted at `phase`, for a run whose metric scope (compare.MetricScope) says
    where its engine ran."""
    return peak_error_band(plan, phase, counter, scope.engine_in_process)


def plan_phases(plan: Plan) -> tuple[Phase, ...]:
    """The GPU phases whose bands decide the plan's default margin (the critic's only with a critic)."""
    phases = (Phase.WEIGHT_SYNC, Phase.ROLLOUT, Phase.OLD_LOG_PROB, Phase.ACTOR_UPDATE)
    return phases + ((Phase.CRITIC_VALUES, Phase.CRITIC_UPDATE) if plan.uses_critic else ())


# --- the margin solve keeps ---------------------------------------------------------------------


@frozen(kw_only=True)
class Headroom:
    """`--headroom`: the GPU memory every phase of a solved plan leaves free. Neither set: the default rule."""

    fraction: float | None = None  # of one GPU's memory
    gib: float | None = None

    def __attrs_post_init__(self) -> None:
        for value, high in ((self.fraction, 0.9), (self.gib, 4096.0)):
            if value is not None and not (math.isfinite(value) and 0 <= value <= high):
                raise PlanError(field="--headroom", message=f"{value:g} is not a margin (0 to {high:g}).",
                                fix="pass --headroom 10%, --headroom 4GiB or --headroom 0")
        if self.fraction is not None and self.gib is not None:
            raise PlanError(field="--headroom", message="a margin is a share of the GPU or an amount, not both.",
                            fix="pass --headroom 10% or --headroom 4GiB")

    @property
    def is_default(self) -> bool:
        return self.fraction is None and self.gib is None


DEFAULT_HEADROOM = Headroom()


def parse_headroom(text: str | None) -> Headroom:
    """`10%` (of one GPU), `4GiB` / `4096MiB` / `4GB` (units as --gpu-mem takes), a bare `0`, or `auto`."""
    from rlplan.planner.presets import parse_memory_amount

    raw = (text or "").strip()
    if not raw or raw.lower() in ("auto", "default"):
        return DEFAULT_HEADROOM
    if raw.endswith("%"):
        try:
            percent = float(raw[:-1])
        except ValueError:
            percent = math.nan
        if not math.isfinite(percent):
            raise PlanError(field="--headroom", message=f"{raw[:40]!r} is not a percentage.",
                            fix="pass --headroom 10%")
        return Headroom(fraction=percent / 100)
    return Headroom(gib=parse_memory_amount(raw, "--headroom"))


@frozen(kw_only=True)
class Margin:
    """The margin a plan is held to, in bytes of one GPU, and the rule it came from in words."""

    bytes: int
    fraction: float
    rule: str
    default: bool

    @property
    def gib(self) -> float:
        return self.bytes / GIB

    def as_json(self) -> dict[str, Any]:
        return {"gib": round(self.gib, 3), "fraction": round(self.fraction, 4), "rule": self.rule,
                "default": self.default}


@functools.cache
def default_margin_fraction(head: str, strategy: str, uses_critic: bool, floor: float,
                            regime: str = "") -> tuple[float, str]:
    worst, where = 0.0, ""
    for phase in (Phase.WEIGHT_SYNC, Phase.ROLLOUT, Phase.OLD_LOG_PROB, Phase.ACTOR_UPDATE,
                  *((Phase.CRITIC_VALUES, Phase.CRITIC_UPDATE) if uses_critic else ())):
        band = error_band(PHASE_KIND[phase], None if phase in _HEADLESS_PHASES else head, strategy, "allocated",
                          regime)
        if band.seen_under > worst:
            worst, where = band.seen_under, f"{phase.value}: {band.basis}"
    if worst > floor:
        return worst, f"the largest under-prediction of the plan's phases, {100 * worst:.1f} % ({where})"
    return floor, (f"the {100 * floor:g} % floor (profile.headroom_floor_fraction: what the measured rows cannot "
                   f"see), above the phases' largest under-prediction of {100 * worst:.1f} %")


def plan_margin(plan: Plan, headroom: Headroom = DEFAULT_HEADROOM, profile: Profile = DEFAULT_PROFILE) -> Margin:
    """The GPU memory `plan` must leave free on every phase: `headroom` if given, else the default rule."""
    capacity = plan.cluster.gpu_memory_bytes
    if headroom.gib is not None:
        fraction = min(1.0, headroom.gib * GIB / capacity)
        return Margin(bytes=int(headroom.gib * GIB), fraction=fraction, default=False,
                      rule="--headroom 0: no margin kept" if headroom.gib == 0 else f"--headroom {headroom.gib:g}GiB")
    if headroom.fraction is not None:
        return Margin(bytes=int(headroom.fraction * capacity), fraction=headroom.fraction, default=False,
                      rule="--headroom 0: no margin kept" if headroom.fraction == 0
                      else f"--headroom {100 * headroom.fraction:g}%")
    fraction, why = default_margin_fraction(resolved_loss_head(plan), plan.actor.strategy, plan.uses_critic,
                                            profile.headroom_floor_fraction, plan_regime(plan))
    return Margin(bytes=int(fraction * capacity), fraction=fraction, default=True,
                  rule=f"default: {100 * fraction:.1f} % of the GPU, {why}")

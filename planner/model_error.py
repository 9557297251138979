"""How wrong the memory model is: error bands from measured rows, and the margin `solve` keeps because of them.

The one owner of the model's measured error. The rows are data, not constants: `presets/measured_accuracy.toml`
holds every row of docs/accuracy.md that compares a prediction with a measurement (the CPU tracker's training
steps, the loss-head twins, torchtitan's whole-GPU peaks, llm-d's vLLM budgets), each with the prediction the
planner made when `benchmarks/accuracy.py` last wrote it. When the model changes and the rows are regenerated,
the bands and the default margin follow.

A plan phase's band comes from the rows comparable to it: the same kind of pass (an update, a no_grad forward,
the engine), the same loss head (`memory.resolved_loss_head`) and the same FSDP strategy. Where no row is
comparable the band is the widest error of every row of that kind, and says so.

The default margin (`--headroom` unset) is the larger of the profile's floor (`headroom_floor_fraction`: what the
rows cannot see) and the largest under-prediction of the plan's phases' bands, as a share of one GPU's memory.
"""

from __future__ import annotations

import functools
import math
import tomllib
from importlib import resources
from typing import Any

import attrs
from attrs import frozen

from rlplan.planner.errors import PlanError
from rlplan.planner.memory.heads import resolved_loss_head
from rlplan.planner.phases import Phase
from rlplan.planner.plan import Plan
from rlplan.planner.profile import DEFAULT_PROFILE, Profile

GIB = 2**30
ROWS_FILE = "measured_accuracy.toml"

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

    def highest_actual_gib(self, predicted_gib: float) -> float:
        """The largest real peak consistent with the band: the prediction was `under` too low at worst."""
        return predicted_gib / (1 - self.under)

    def describe(self) -> str:
        if self.assumed:
            return f"model error unmeasured for this training backend: assumed -{100 * self.under:.0f} %"
        return (f"model error on {'comparable measured rows' if self.rows else 'all measured rows (none comparable)'}"
                f": -{100 * self.under:.0f} % to +{100 * self.over:.0f} %")

    def as_json(self) -> dict[str, Any]:
        return {"under": round(self.under, 4), "over": round(self.over, 4), "rows": self.rows, "basis": self.basis,
                "assumed": self.assumed, "text": self.describe()}


@functools.cache
def accuracy_rows() -> tuple[AccuracyRow, ...]:
    """Every measured row, from the package's presets/measured_accuracy.toml (read once per process)."""
    text = resources.files("rlplan.presets").joinpath(ROWS_FILE).read_text(encoding="utf-8")
    return tuple(AccuracyRow(**row) for row in tomllib.loads(text)["row"])


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
def error_band(kind: str, head: str | None, strategy: str) -> ErrorBand:
    """The band of the rows of `kind` with `head` (None: any) under `strategy` (the engine's: any)."""
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


def peak_error_band(plan: Plan, phase: Phase | str) -> ErrorBand:
    """The error band of the plan's predicted peak in `phase`, from the measured rows comparable to it."""
    phase = Phase(phase)
    head = None if phase in _HEADLESS_PHASES else resolved_loss_head(plan)
    return error_band(PHASE_KIND[phase], head, plan.actor.strategy)


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
def default_margin_fraction(head: str, strategy: str, uses_critic: bool, floor: float) -> tuple[float, str]:
    worst, where = 0.0, ""
    for phase in (Phase.WEIGHT_SYNC, Phase.ROLLOUT, Phase.OLD_LOG_PROB, Phase.ACTOR_UPDATE,
                  *((Phase.CRITIC_VALUES, Phase.CRITIC_UPDATE) if uses_critic else ())):
        band = error_band(PHASE_KIND[phase], None if phase in _HEADLESS_PHASES else head, strategy)
        if band.under > worst:
            worst, where = band.under, f"{phase.value}: {band.basis}"
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
                                      profile.headroom_floor_fraction)
    return Margin(bytes=int(fraction * capacity), fraction=fraction, default=True,
                  rule=f"default: {100 * fraction:.1f} % of the GPU, {why}")

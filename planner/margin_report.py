"""What `solve`, `validate` and `explain` say about how close to the edge a plan is: the margin it keeps, the
error band of every predicted peak, and the host RAM figure it was priced against.

Pure: `margin_report` builds the typed record once; the JSON (`margin_json`) and the lines (`margin_text`,
`margin_summary`, `margin_warning`) are functions of it. report.py puts them in its payload and tables, the CLI prints them.
"""

from __future__ import annotations

from typing import Any

from attrs import frozen

from rlplan.planner.memory import MemoryReport
from rlplan.planner.model_error import (
    DEFAULT_HEADROOM,
    ErrorBand,
    Headroom,
    Margin,
    peak_error_band,
    plan_margin,
)
from rlplan.planner.plan import Plan
from rlplan.planner.profile import Profile

GIB = 2**30

# Host components that hold training state moved off the GPU (the offloads the solver chooses).
OFFLOADED_STATE = ("actor_params_offloaded", "actor_grads_offloaded", "actor_optimizer_offloaded",
                   "critic_params_offloaded", "critic_grads_offloaded", "critic_optimizer_offloaded",
                   "activations_offloaded")


@frozen(kw_only=True)
class MarginWarning:
    """A warning (never an error: the plan may still run) that the plan leaves less than its margin; shown and
    written beside the rules' warnings, as they are (rule, message, fix)."""

    message: str
    fix: str
    rule: str = "memory_margin"

    def as_json(self) -> dict[str, str]:
        return {"rule": self.rule, "message": self.message, "fix": self.fix}


@frozen(kw_only=True)
class MarginReport:
    """How close to the edge one plan is: the margin it is held to, what its peak leaves of the GPU, and the error
    band of every phase's peak. GiB figures are rounded as --json shows them, so the lines and the JSON agree."""

    margin: Margin
    # The phase with the highest GPU peak, and that peak.
    peak_phase: str
    peak_gib: float
    gpu_mem_gib: float
    # GPU memory the peak leaves free (negative: over), and whether that is less than the margin.
    left_gib: float
    below_margin: bool
    # The error band of each phase's peak, by phase; the peak phase's is `band`.
    bands: dict[str, ErrorBand]
    # The largest real peak consistent with the peak phase's band.
    highest_actual_gib: float

    @property
    def band(self) -> ErrorBand:
        return self.bands[self.peak_phase]


def margin_report(plan: Plan, profile: Profile, memory: MemoryReport,
                  headroom: Headroom = DEFAULT_HEADROOM) -> MarginReport:
    margin = plan_margin(plan, headroom, profile)
    peak = memory.peak_phase
    left = memory.gpu_capacity_bytes - peak.peak_bytes
    bands = {p.name: peak_error_band(plan, p.name) for p in memory.phases}
    return MarginReport(margin=margin, peak_phase=peak.name, peak_gib=round(peak.peak_bytes / GIB, 3),
                        gpu_mem_gib=round(memory.gpu_capacity_bytes / GIB, 3), left_gib=round(left / GIB, 3),
                        below_margin=left < margin.bytes, bands=bands,
                        highest_actual_gib=round(bands[peak.name].highest_actual_gib(peak.peak_bytes / GIB), 3))


def margin_json(report: MarginReport) -> dict[str, Any]:
    """`headroom_gib` (the margin the plan is held to), what it leaves, and the error band of every peak."""
    return {
        "headroom_gib": round(report.margin.gib, 3),
        "headroom": {**report.margin.as_json(), "left_gib": report.left_gib, "below_margin": report.below_margin},
        "error_band": {**report.band.as_json(), "phase": report.peak_phase,
                       "highest_actual_gib": report.highest_actual_gib},
        "phase_error_bands": {name: band.as_json() for name, band in report.bands.items()},
    }


def peak_text(report: MarginReport) -> str:
    """"peak 71.20 GiB in actor_update (model error on comparable measured rows: -3 % to +4 %)"."""
    return f"peak {report.peak_gib:.2f} GiB in {report.peak_phase} ({report.band.describe()})"


def margin_text(report: MarginReport) -> str:
    """The margin line every command prints under its verdict."""
    margin = report.margin.as_json()
    return (f"{peak_text(report)}, at most {report.highest_actual_gib:.2f} GiB at the band's edge; "
            f"leaves {report.left_gib:.2f} GiB of {report.gpu_mem_gib:.2f}, margin {margin['gib']:.2f} GiB "
            f"({report.margin.rule}).")


def margin_summary(report: MarginReport) -> str:
    """The margin in one line, for solve and validate: the peak, what it leaves free and the margin kept. `explain`
    prints `margin_text`, the details: the model's error band and the rule the margin comes from."""
    left = (f"{report.left_gib:.2f} of {report.gpu_mem_gib:.2f} GiB free" if report.left_gib >= 0
            else f"{-report.left_gib:.2f} GiB over the {report.gpu_mem_gib:.2f} GiB GPU")
    rule = "default" if report.margin.default else report.margin.rule
    return (f"peak {report.peak_gib:.2f} GiB in {report.peak_phase}: {left}, margin "
            f"{report.margin.as_json()['gib']:.2f} GiB ({rule}; `rlplan explain` says why)")


def margin_warning(report: MarginReport, feasible: bool) -> MarginWarning | None:
    """A feasible plan that leaves less than its margin; None otherwise."""
    if not report.below_margin or not feasible:
        return None
    margin_gib = report.margin.as_json()["gib"]
    return MarginWarning(
        message=(f"the plan leaves {report.left_gib:.2f} GiB of the GPU free in {report.peak_phase}, less than the "
                 f"{margin_gib:.2f} GiB margin ({report.margin.rule}): a batch a little longer than the mean, or the "
                 f"model's error ({report.band.describe()}), may run it out of memory."),
        fix="re-solve with `rlplan solve --from PLAN -o PLAN` (it keeps the margin), or lower the binding phase's "
            "token budget")


def host_note(plan: Plan, memory: MemoryReport, assumed: str | None) -> str:
    """What the plan keeps in host RAM, against which figure, and what to check; "" when nothing to say."""
    offloaded = sum(c.bytes for c in memory.host.components if c.name in OFFLOADED_STATE)
    total, capacity = memory.host.total_bytes / GIB, memory.host_capacity_bytes / GIB
    if not offloaded:
        return f"host RAM: {assumed}." if assumed else ""
    figure = assumed or f"{capacity:g} GiB of host RAM per node given"
    return (f"host RAM: the plan offloads {offloaded / GIB:.1f} GiB per node of training state and needs "
            f"{total:.1f} GiB per node in all, against {figure}. Check your nodes' RAM (free -g) and pass it, "
            f"e.g. --host-mem 512GiB: an offload plan priced against RAM the node lacks dies at its first update.")

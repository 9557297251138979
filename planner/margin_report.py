"""What `solve`, `validate` and `explain` say about how close to the edge a plan is: the margin it keeps, the
error band of every predicted peak, and the host RAM figure it was priced against.

Pure: builds dictionaries and text; report.py puts them in its payload and tables, the CLI prints them.
"""

from __future__ import annotations

from typing import Any

from rlplan.planner.memory import MemoryReport
from rlplan.planner.model_error import DEFAULT_HEADROOM, Headroom, peak_error_band, plan_margin
from rlplan.planner.plan import Plan
from rlplan.planner.profile import Profile

GIB = 2**30

# Host components that hold training state moved off the GPU (the offloads the solver chooses).
OFFLOADED_STATE = ("actor_params_offloaded", "actor_grads_offloaded", "actor_optimizer_offloaded",
                   "critic_params_offloaded", "critic_grads_offloaded", "critic_optimizer_offloaded",
                   "activations_offloaded")


def margin_json(plan: Plan, profile: Profile, memory: MemoryReport,
                headroom: Headroom = DEFAULT_HEADROOM) -> dict[str, Any]:
    """`headroom_gib` (the margin the plan is held to), what it leaves, and the error band of every peak."""
    margin = plan_margin(plan, headroom, profile)
    peak = memory.peak_phase
    left = memory.gpu_capacity_bytes - peak.peak_bytes
    bands = {p.name: peak_error_band(plan, p.name) for p in memory.phases}
    band = bands[peak.name]
    return {
        "headroom_gib": round(margin.gib, 3),
        "headroom": {**margin.as_json(), "left_gib": round(left / GIB, 3), "below_margin": left < margin.bytes},
        "error_band": {**band.as_json(), "phase": peak.name,
                       "highest_actual_gib": round(band.highest_actual_gib(peak.peak_bytes / GIB), 3)},
        "phase_error_bands": {name: b.as_json() for name, b in bands.items()},
    }


def peak_text(payload: dict[str, Any]) -> str:
    """"peak 71.20 GiB in actor_update (model error on comparable measured rows: -3 % to +4 %)"."""
    band = payload["error_band"]
    return f"peak {payload['gpu_peak_gib']:.2f} GiB in {band['phase']} ({band['text']})"


def margin_text(payload: dict[str, Any]) -> str:
    """The margin line every command prints under its verdict."""
    headroom = payload["headroom"]
    band = payload["error_band"]
    return (f"{peak_text(payload)}, at most {band['highest_actual_gib']:.2f} GiB if the model errs as on those rows; "
            f"leaves {headroom['left_gib']:.2f} GiB of {payload['gpu_mem_gib']:.2f}, margin {headroom['gib']:.2f} GiB "
            f"({headroom['rule']}).")


def margin_warning(payload: dict[str, Any]) -> dict[str, str] | None:
    """A warning (never an error: the plan may still run) when the plan leaves less than its margin."""
    headroom = payload["headroom"]
    if not headroom["below_margin"] or not payload["feasible"]:
        return None
    return {"rule": "memory_margin",
            "message": (f"the plan leaves {headroom['left_gib']:.2f} GiB of the GPU free in "
                        f"{payload['error_band']['phase']}, less than the {headroom['gib']:.2f} GiB margin "
                        f"({headroom['rule']}): a batch a little longer than the mean, or the model's error "
                        "(" + payload["error_band"]["text"] + "), may run it out of memory."),
            "fix": "re-solve with `rlplan solve --from PLAN -o PLAN` (it keeps the margin), or lower the binding "
                   "phase's token budget"}


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

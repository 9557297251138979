"""The JSON object, the rich tables and the chart of `rlplan compare`: built from a `Comparison`, never printed.

Kept beside report.py rather than in it: a verl run's comparison has its own shape (a process-wide memory
peak per verl metric, times per phase, the length trend), and report.py stays the validate/explain/solve view.
"""

from __future__ import annotations

import textwrap
from typing import Any

from rlplan.planner.compare import Comparison
from rlplan.planner.memory.allocator_report import FIGURES


def _r(value: float, digits: int = 3) -> float:
    return round(value, digits)


def _forecast_json(c: Comparison) -> dict[str, Any] | None:
    forecast = c.forecast
    if forecast is None:
        return None
    return {"slope_tokens_per_step": _r(forecast.slope_tokens_per_step, 4),
            "last_step": forecast.last_step, "longest_fitting_mean_response": forecast.longest_fitting_mean,
            "max_response_length": forecast.max_response_length,
            "stops_fitting_at_step": forecast.stops_fitting_at_step,
            "reaches_max_response_length_at_step": forecast.reaches_max_length_at_step,
            "longest_response_hit_limit_at_step": forecast.longest_hit_limit_at_step,
            "fix": forecast.fix, "message": forecast.message()}


def comparison_json(c: Comparison) -> dict[str, Any]:
    scope = c.scope
    return {
        "exceeds_band": c.exceeds,
        "verl_version": scope.versions,
        "verl_version_reason": c.scope_reason,
        "scope": {"allocated_metric": scope.allocated_key, "reserved_metric": scope.reserved_key,
                  "engine_in_trainer_process": scope.engine_in_process,
                  "sleeping_pool_counted": scope.pool_counted_asleep, "ranks": scope.ranks, "read_at": scope.read_at,
                  "excludes": "CUDA context, NCCL buffers, memory allocated outside torch's caching allocator",
                  "reset_between_steps": False},
        "lengths": {"prompt_mean": _r(c.lengths.prompt_mean), "response_mean": _r(c.lengths.response_mean),
                    "response_max": c.lengths.response_max, "steps": c.lengths.steps,
                    "prompt_from_log": c.lengths.prompt_from_log, "response_from_log": c.lengths.response_from_log,
                    "expected_prompt_length": c.plan.data.expected_prompt_length,
                    "expected_response_length": c.plan.data.expected_response_length},
        "figures": FIGURES,
        "memory": [{"metric": row.metric, "counter": row.counter, "measured_gib": _r(row.measured_gib),
                    "predicted_gib": _r(row.predicted_gib), "ratio": _r(row.ratio, 4),
                    "lowest_allowed_gib": _r(row.lowest_allowed_gib), "highest_allowed_gib": _r(row.highest_allowed_gib),
                    "exceeds_band": row.exceeds, "predicted_peak_phase": str(row.predicted_peak_phase),
                    "measured_peak_step": row.at_step, "band": row.band.describe(),
                    "error_band": row.band.as_json()} for row in c.memory],
        "phases": [{"phase": str(p.phase), "counter_allocated_gib": _r(p.allocated_gib),
                    "counter_reserved_gib": _r(p.reserved_gib), "resident_gib": _r(p.planner_peak_gib),
                    "planner_peak_gib": _r(p.planner_peak_gib)} for p in c.phases],
        "times": [{"phase": str(t.phase), "metric": t.metric, "measured_s": _r(t.measured_s),
                   "predicted_s": _r(t.predicted_s), "ratio": _r(t.ratio, 4), "steps": t.steps,
                   "band": t.band.to_json() if t.band else None, "within_band": t.within_band} for t in c.times],
        "forecast": _forecast_json(c),
        "notes": list(c.notes),
    }


def _time_band_cell(row: dict[str, Any]) -> str:
    """A time row's band: the range the predicted seconds stood for on published runs out of sample, and whether
    the measurement lies in it (steptime/bands.py)."""
    band = row.get("band")
    if not band:
        return ""
    low, high = row["predicted_s"] / (1 + band["over"]), row["predicted_s"] / (1 - band["under"])
    basis = "" if band["runs"] else ", no run measured it: the widest"
    verdict = "within" if row["within_band"] else "OUTSIDE"
    return f"-{100 * band['under']:.0f}/+{100 * band['over']:.0f} % ({low:.2f}-{high:.2f} s{basis}) {verdict}"


def comparison_tables(payload: dict[str, Any]) -> list[Any]:
    from rich.text import Text

    from rlplan.planner.tables import FittedTable

    out: list[Any] = []
    lengths = payload["lengths"]
    scope = payload["scope"]
    from_log = lengths.get("prompt_from_log", True) and lengths.get("response_from_log", True)
    priced = (f"priced at the run's lengths: {lengths['prompt_mean']:.1f} prompt + {lengths['response_mean']:.1f} "
              f"response tokens on average over {lengths['steps']} steps" if from_log else
              f"priced at {lengths['prompt_mean']:.0f} prompt + {lengths['response_mean']:.0f} response tokens "
              f"(the log lacks a mean length: see the note) over {lengths['steps']} steps")
    out.append(Text(f"verl {payload['verl_version']} ({payload['verl_version_reason']}); {priced} (expected lengths "
                    f"{lengths['expected_prompt_length']} + {lengths['expected_response_length']})."))
    memory = FittedTable(title="memory: verl's process-wide peak vs the prediction of what it covers")
    for column in ("metric", "counter", "measured GiB", "predicted GiB", "ratio", "band allows", "predicted peak at",
                   "verdict"):
        memory.add_column(column, overflow="fold")
    for row in payload["memory"]:
        verdict = "within the band"
        if row["exceeds_band"]:
            verdict = "OUTSIDE the band: " + ("under" if row["measured_gib"] > row["predicted_gib"] else "over") \
                + "-predicted"
        memory.add_row(row["metric"], row["counter"], f"{row['measured_gib']:.2f}", f"{row['predicted_gib']:.2f}",
                       f"{row['ratio']:.3f}", f"{row['lowest_allowed_gib']:.2f}-{row['highest_allowed_gib']:.2f}",
                       row["predicted_peak_phase"], verdict)
    out.append(memory)
    for band in dict.fromkeys(row["band"] for row in payload["memory"]):
        out.append(Text(f"error band, {band}", style="dim"))
    if payload["memory"]:
        out.append(Text(f"Scope: {scope['ranks']}; engine in the trainer process: "
                        f"{'yes' if scope['engine_in_trainer_process'] else 'no'}; read at {scope['read_at']}; "
                        f"excludes the {scope['excludes']}.", style="dim"))
    phases = FittedTable(title="per phase at its peak (GiB): allocated and reserved as torch's counters would show them, "
                         "resident as the GPU holds it")
    for column in ("phase", "allocated (tensors)", "reserved (allocator's segments)", "resident (context, engine, "
                   "the cache it cannot give back: the fit)"):
        phases.add_column(column, overflow="fold")
    for row in payload["phases"]:
        phases.add_row(row["phase"], f"{row['counter_allocated_gib']:.2f}", f"{row['counter_reserved_gib']:.2f}",
                       f"{row['planner_peak_gib']:.2f}")
    out.append(phases)
    times = FittedTable(title="time per phase (median over steady steps)")
    for column in ("phase", "verl metric", "measured s", "predicted s", "ratio", "steps", "error band (out of sample)"):
        times.add_column(column, overflow="fold")
    for row in payload["times"]:
        times.add_row(row["phase"], row["metric"], f"{row['measured_s']:.2f}", f"{row['predicted_s']:.2f}",
                      f"{row['ratio']:.2f}", str(row["steps"]), _time_band_cell(row))
    out.append(times)
    if payload["forecast"] is not None:
        out.append(Text(f"forecast: {payload['forecast']['message']}", style="bold"))
    for note in payload["notes"]:
        out.append(Text(f"note: {note}", style="dim"))
    return out


def comparison_chart(payload: dict[str, Any], title: str, length_series: list[tuple[int, float]]) -> Any:
    """Measured vs predicted memory and time side by side, and the response-length trend with its fit."""
    import altair as alt

    memory_rows = [{"metric": row["metric"].rsplit("/", 1)[-1], "kind": kind, "gib": row[key]}
                   for row in payload["memory"]
                   for kind, key in (("measured", "measured_gib"), ("predicted", "predicted_gib"))]
    time_rows = [{"phase": row["phase"], "kind": kind, "seconds": row[key]}
                 for row in payload["times"]
                 for kind, key in (("measured", "measured_s"), ("predicted", "predicted_s"))]
    forecast = payload["forecast"] or {"slope_tokens_per_step": 0.0, "message": "no length trend in the log"}
    slope = forecast["slope_tokens_per_step"]
    lengths = [{"step": step, "tokens": value, "series": "response_length/mean"} for step, value in length_series]
    if length_series:
        first, last = length_series[0][0], length_series[-1][0]
        mean = sum(v for _, v in length_series) / len(length_series)
        centre = sum(s for s, _ in length_series) / len(length_series)
        lengths += [{"step": s, "tokens": mean + slope * (s - centre), "series": "trend"} for s in (first, last)]
    memory = alt.Chart(alt.Data(values=memory_rows)).mark_bar().encode(
        x=alt.X("metric:N"), xOffset="kind:N", y=alt.Y("gib:Q", title="GiB per GPU"), color="kind:N",
        tooltip=["metric:N", "kind:N", alt.Tooltip("gib:Q", format=".2f")]).properties(width=240, height=220,
                                                                                         title="memory")
    times = alt.Chart(alt.Data(values=time_rows)).mark_bar().encode(
        x=alt.X("phase:N", axis=alt.Axis(labelAngle=-30)), xOffset="kind:N", y=alt.Y("seconds:Q"), color="kind:N",
        tooltip=["phase:N", "kind:N", alt.Tooltip("seconds:Q", format=".2f")]).properties(width=320, height=220,
                                                                                            title="time per phase")
    # The forecast in whole lines under the panel's title: cut to 90 characters it ended mid-word, past the chart.
    trend = alt.Chart(alt.Data(values=lengths)).mark_line(point=True).encode(
        x="step:Q", y=alt.Y("tokens:Q", scale=alt.Scale(zero=False)), color="series:N").properties(
        width=320, height=220, title=alt.TitleParams("response length per step", anchor="start",
                                                     subtitle=textwrap.wrap(forecast["message"], 56)))
    # Each panel its own offset scale: shared, the memory panel's wider bands set the time panel's offsets, and
    # each predicted bar stood under the next phase's label, the last outside the plot.
    return alt.hconcat(memory, times, trend).resolve_scale(color="independent", xOffset="independent").properties(
        title=title)

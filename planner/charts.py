"""The data behind rlplan's three pictures, and the Vega-Altair specs drawn from it.

The `*_data` functions are pure: they take planner objects or parsed metrics and return plain
rows (lists of dicts) that tests can check value by value.  The `*_chart` functions turn those
rows into Altair charts; Altair is the optional `charts` extra, imported only inside them, so
`rlplan solve` without --frontier never loads it.  Writing files is the commands layer's job
(planner/chart_commands.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rlplan.planner.memory import GIB, MemoryReport
from rlplan.planner.solver import FrontierPoint

# Per-step series `rlplan report` draws, by metrics.jsonl key (runtime/loop.py writes them).
RUN_SERIES = {
    "reward_mean": "reward",
    "kl_ref": "KL to reference",
    "entropy": "entropy",
    "response_length_mean": "response length (tokens)",
    "sync_logprob_gap": "sync log-prob gap",
}
TIME_PREFIX = "time/"
# Sub-timers inside weight_sync and the step total: drawn as lines would double-count the stack.
NOT_A_PHASE_TIME = ("time/step", "time/weight_gather", "time/weight_load")


def _gib(value: int | float) -> float:
    return round(value / GIB, 3)


def _gpu_limit_line(limit_gib: float, label: str = "", color: str = "red") -> Any:
    """The GPU's memory (or another limit) as a dashed line across the panel, labelled with its GiB."""
    import altair as alt

    rows = alt.Data(values=[{"limit": limit_gib, "label": label or f"GPU memory {limit_gib:.1f} GiB"}])
    rule = alt.Chart(rows).mark_rule(color=color, strokeDash=[6, 3], size=2).encode(y="limit:Q")
    text = alt.Chart(rows).mark_text(align="right", dx=-4, dy=-6, color=color, x="width").encode(
        y="limit:Q", text="label:N")
    return rule + text


# --- explain --chart ---------------------------------------------------------------


def memory_chart_data(report: MemoryReport, margin_gib: float = 0.0) -> dict[str, Any]:
    """One row per (phase, component) per GPU, the GPU limit (and the margin solve keeps below it), host RAM per
    node, and the binding component."""
    binding = report.binding_constraint
    bars = [
        {"phase": phase.name, "order": index, "component": component.name, "scope": component.scope,
         "gib": _gib(component.bytes),
         "binding": binding.resource != "host" and phase.name == binding.where and component.name == binding.component}
        for index, phase in enumerate(report.phases)
        for component in phase.components
    ]
    host = [{"component": c.name, "gib": _gib(c.bytes),
             "binding": binding.resource == "host" and c.name == binding.component}
            for c in report.host.components]
    return {
        "gpu_bars": bars,
        "phase_peaks": [{"phase": p.name, "order": i, "gib": _gib(p.peak_bytes)} for i, p in enumerate(report.phases)],
        "gpu_limit_gib": _gib(report.gpu_capacity_bytes),
        "margin_gib": round(margin_gib, 3),
        "host_bars": host,
        "host_limit_gib": _gib(report.host_capacity_bytes),
        "binding": {"resource": binding.resource, "where": binding.where, "component": binding.component,
                    "headroom_gib": _gib(binding.headroom_bytes),
                    "label": f"binding: {binding.component} in {binding.where} "
                             f"({_gib(binding.headroom_bytes):+.2f} GiB headroom)"},
    }


def memory_chart(data: dict[str, Any], title: str) -> Any:
    import altair as alt

    order = [row["phase"] for row in data["phase_peaks"]]
    bars = alt.Chart(alt.Data(values=data["gpu_bars"])).mark_bar().encode(
        x=alt.X("phase:N", sort=order, title="phase", axis=alt.Axis(labelAngle=0)),
        # One row per (phase, component): stacked, not aggregated, so each segment keeps its fields.
        y=alt.Y("gib:Q", stack="zero", title="GiB per GPU"),
        color=alt.Color("component:N", scale=alt.Scale(scheme="category20"),
                        legend=alt.Legend(columns=2, symbolLimit=40)),
        order=alt.Order("component:N"),
        # The binding component is outlined: that is the bar to shrink.
        stroke=alt.condition("datum.binding", alt.value("black"), alt.value("white")),
        strokeWidth=alt.condition("datum.binding", alt.value(2.5), alt.value(0.5)),
        tooltip=["phase:N", "component:N", "scope:N", alt.Tooltip("gib:Q", format=".2f")],
    )
    limit = _gpu_limit_line(data["gpu_limit_gib"])
    if data.get("margin_gib"):
        limit += _gpu_limit_line(data["gpu_limit_gib"] - data["margin_gib"],
                                 f"margin: {data['margin_gib']:.1f} GiB kept free", color="#ff7f0e")
    binding_rows = [dict(row, label=data["binding"]["label"]) for row in data["phase_peaks"]
                    if row["phase"] == data["binding"]["where"]]
    binding = alt.Chart(alt.Data(values=binding_rows)).mark_text(dy=-18, fontWeight="bold").encode(
        x=alt.X("phase:N", sort=order), y="gib:Q", text="label:N")
    gpu_panel = (bars + limit + binding).properties(
        width=420, height=340, title=f"{title}: GPU memory per phase")
    host_bars = alt.Chart(alt.Data(values=data["host_bars"])).mark_bar(color="#7f7f7f").encode(
        x=alt.X("gib:Q", title="GiB per node", axis=alt.Axis(tickCount=6)), y=alt.Y("component:N", title=None),
        stroke=alt.condition("datum.binding", alt.value("black"), alt.value(None)),
        tooltip=["component:N", alt.Tooltip("gib:Q", format=".2f")],
    )
    host_limit_rows = [{"limit": data["host_limit_gib"], "label": f"host RAM {data['host_limit_gib']:.0f} GiB"}]
    host_limit = alt.Chart(alt.Data(values=host_limit_rows)).mark_rule(color="red", strokeDash=[6, 3], size=2).encode(
        x="limit:Q")
    host_text = alt.Chart(alt.Data(values=data["host_bars"])).mark_text(align="left", dx=3).encode(
        x="gib:Q", y="component:N", text=alt.Text("gib:Q", format=".1f"))
    host_limit_text = alt.Chart(alt.Data(values=host_limit_rows)).mark_text(
        align="right", dx=-4, color="red", y=-6).encode(x="limit:Q", text="label:N")
    host_panel = (host_bars + host_text + host_limit + host_limit_text).properties(
        width=420, height=22 * max(1, len(data["host_bars"])), title="host RAM per node")
    return alt.vconcat(gpu_panel, host_panel)


# --- solve --frontier --------------------------------------------------------------


def knobs_text(knobs: Iterable[tuple[str, Any]]) -> str:
    return ", ".join(f"{key}={value}" for key, value in knobs if value is not None)


def frontier_data(points: Iterable[FrontierPoint], gpu_limit_gib: float, top: int, *,
                  margin_gib: float = 0.0) -> dict[str, Any]:
    """One row per priced candidate; `mark` is chosen, top N (rank 2..top), feasible or infeasible.

    headroom_gib: what each candidate leaves free of the GPU; margin_gib: what solve keeps free (a second line,
    `margin_line_gib`, below the GPU's).

    key: one line per labelled candidate, the runners-up by the knobs in which they differ from #1.
    """
    points = list(points)
    rows = []
    for point in points:
        if point.rank == 1:
            mark = "chosen"
        elif point.feasible and point.rank <= top:
            mark = f"top {top}"
        else:
            mark = "feasible" if point.feasible else "infeasible"
        rows.append({"step_time_s": round(point.step_time_s, 3), "gpu_peak_gib": round(point.gpu_peak_gib, 3),
                     "headroom_gib": round(gpu_limit_gib - point.gpu_peak_gib, 3),
                     "feasible": point.feasible, "rank": point.rank, "mark": mark, "reason": point.reason,
                     "label": f"#{point.rank}" if point.feasible and 0 < point.rank <= max(top, 1) else "",
                     "knobs": knobs_text(point.knobs)})
    # Candidates that differ only in knobs the step-time and memory models do not see share one
    # spot: one label lists them all.
    at_spot: dict[tuple[float, float], dict[str, Any]] = {}
    for row in sorted((r for r in rows if r["label"]), key=lambda r: r["rank"]):
        spot = (row["step_time_s"], row["gpu_peak_gib"])
        if spot in at_spot:
            at_spot[spot]["label"] += " " + row["label"]
            row["label"] = ""
        else:
            at_spot[spot] = row
    by_rank = {p.rank: dict(p.knobs) for p in points if p.feasible}
    key = []
    for row in sorted((r for r in rows if 0 < r["rank"] <= max(top, 1) and r["feasible"]), key=lambda r: r["rank"]):
        knobs = by_rank[row["rank"]]
        changed = knobs_text((k, v) for k, v in knobs.items() if by_rank[1].get(k) != v)
        what = "the plan written" if row["rank"] == 1 else (f"as #1 but {changed}" if changed else "the knobs of #1")
        key.append(f"#{row['rank']}: {row['step_time_s']:.1f} s, {row['gpu_peak_gib']:.2f} GiB "
                   f"({row['headroom_gib']:.2f} free): {what}")
    # Drawn in this order, so the chosen plan is on top of any candidate at its spot.
    layer = {"infeasible": 0, "feasible": 1, "chosen": 3}
    rows.sort(key=lambda r: (layer.get(r["mark"], 2), -r["rank"]))
    return {"points": rows, "gpu_limit_gib": round(gpu_limit_gib, 3), "key": key, "margin_gib": round(margin_gib, 3),
            "margin_line_gib": round(gpu_limit_gib - margin_gib, 3)}


def frontier_chart(data: dict[str, Any], title: str) -> Any:
    """All candidates (log step time: infeasible ones can be many times slower), and the feasible ones zoomed."""
    import altair as alt

    marks = ["chosen", *sorted({r["mark"] for r in data["points"]} - {"chosen", "feasible", "infeasible"}),
             "feasible", "infeasible"]
    colours = ["#d62728", *["#ff7f0e"] * (len(marks) - 3), "#1f77b4", "#bbbbbb"]

    def panel(rows: list[dict[str, Any]], x_scale: Any, panel_title: str) -> Any:
        points = alt.Chart(alt.Data(values=rows)).mark_point(filled=True, opacity=0.85).encode(
            x=alt.X("step_time_s:Q", title="predicted step time (s)", scale=x_scale),
            y=alt.Y("gpu_peak_gib:Q", title="peak GiB per GPU", scale=alt.Scale(zero=False)),
            color=alt.Color("mark:N", scale=alt.Scale(domain=marks, range=colours), title="candidate"),
            shape=alt.Shape("feasible:N", scale=alt.Scale(domain=[True, False], range=["circle", "cross"])),
            size=alt.condition("datum.rank == 1", alt.value(220), alt.value(60)),
            tooltip=["mark:N", "rank:Q", alt.Tooltip("step_time_s:Q", format=".2f"),
                     alt.Tooltip("gpu_peak_gib:Q", format=".2f"), alt.Tooltip("headroom_gib:Q", format=".2f"),
                     "reason:N", "knobs:N"],
        )
        layers = [points, _gpu_limit_line(data["gpu_limit_gib"])]
        if data.get("margin_gib"):
            layers.append(_gpu_limit_line(data["margin_line_gib"], f"margin: {data['margin_gib']:.1f} GiB kept free",
                                          color="#ff7f0e"))
        # Near-equal candidates sit close together: their labels step upwards so none hides another.
        for index, row in enumerate(sorted((r for r in rows if r["label"]), key=lambda r: r["rank"])):
            layers.append(alt.Chart(alt.Data(values=[row])).mark_text(
                align="left", dx=8, dy=-10 - 14 * (index % 3), fontWeight="bold").encode(
                x=alt.X("step_time_s:Q", scale=x_scale), y="gpu_peak_gib:Q", text="label:N"))
        return alt.layer(*layers).properties(width=420, height=340, title=panel_title)

    everything = panel(data["points"], alt.Scale(type="log"), "every candidate priced")
    feasible = panel([r for r in data["points"] if r["feasible"]], alt.Scale(zero=False), "the feasible ones")
    # What the labelled candidates are, readable in a PNG where there is no tooltip.
    key = alt.Chart(alt.Data(values=[{"line": line, "order": i} for i, line in enumerate(data["key"])])).mark_text(
        align="left", x=0, fontSize=11).encode(y=alt.Y("order:O", axis=None), text="line:N").properties(
        width=860, height=16 * max(1, len(data["key"])))
    return alt.vconcat(alt.hconcat(everything, feasible), key).properties(title=title)


# --- report RUN_DIR ----------------------------------------------------------------


def run_report_data(records: list[dict[str, Any]], plan_phase_peak_gib: dict[str, float]) -> dict[str, Any]:
    """Long-form rows: the headline series, seconds per phase per step, predicted vs measured peak per phase.

    Measured peak: the largest over the steps.  Predicted: the runtime's own prediction in the records
    (memory/<phase>_predicted_gib, priced for the head it runs), else the plan's [prediction]; never a
    mix of the two, which price different heads.
    """
    series = [{"step": r["step"], "metric": label, "value": r[key]}
              for r in records for key, label in RUN_SERIES.items() if isinstance(r.get(key), (int, float))]
    times = [{"step": r["step"], "phase": key[len(TIME_PREFIX):], "seconds": value}
             for r in records for key, value in r.items()
             if key.startswith(TIME_PREFIX) and key not in NOT_A_PHASE_TIME and isinstance(value, (int, float))]
    measured: dict[str, float] = {}
    predicted: dict[str, float] = {}
    for record in records:
        for key, value in record.items():
            if not (key.startswith("memory/") and isinstance(value, (int, float))):
                continue
            name = key[len("memory/"):]
            if name.endswith("_peak_gib"):
                phase = name[:-len("_peak_gib")]
                measured[phase] = max(measured.get(phase, 0.0), value)
            elif name.endswith("_predicted_gib"):
                predicted[name[:-len("_predicted_gib")]] = value
    predicted = predicted or dict(plan_phase_peak_gib)
    measure = next((r["memory_measure"] for r in reversed(records) if r.get("memory_measure")), "")
    memory = [{"phase": phase, "kind": kind, "gib": round(values[phase], 3)}
              for phase in sorted(set(measured) | set(predicted))
              for kind, values in (("predicted", predicted), (f"measured ({measure or 'unknown'})", measured))
              if phase in values]
    return {"series": series, "phase_seconds": times, "memory": memory,
            "steps": len(records), "last_step": records[-1]["step"] if records else None}


def report_chart(data: dict[str, Any], title: str) -> Any:
    import altair as alt

    series = alt.Chart(alt.Data(values=data["series"])).mark_line(point=True).encode(
        x=alt.X("step:Q"), y=alt.Y("value:Q", title=None, scale=alt.Scale(zero=False)),
        tooltip=["step:Q", "metric:N", alt.Tooltip("value:Q", format=".4g")],
    ).properties(width=260, height=150).facet(
        facet=alt.Facet("metric:N", title=None), columns=3).resolve_scale(y="independent")
    times = alt.Chart(alt.Data(values=data["phase_seconds"])).mark_area().encode(
        x=alt.X("step:Q"), y=alt.Y("sum(seconds):Q", title="seconds per step"),
        color=alt.Color("phase:N"), tooltip=["step:Q", "phase:N", alt.Tooltip("seconds:Q", format=".3f")],
    ).properties(width=400, height=220, title="time per phase per step")
    memory = alt.Chart(alt.Data(values=data["memory"])).mark_bar().encode(
        x=alt.X("phase:N", axis=alt.Axis(labelAngle=-30)), xOffset="kind:N", y=alt.Y("gib:Q", title="peak GiB per GPU"),
        color=alt.Color("kind:N", title="memory", legend=alt.Legend(labelLimit=400)), tooltip=["phase:N", "kind:N", alt.Tooltip("gib:Q", format=".3f")],
    ).properties(width=400, height=220, title="predicted vs measured peak per phase")
    heading = f"{title}: {data['steps']} steps (last {data['last_step']})"
    panels = alt.hconcat(times, memory).resolve_scale(color="independent")
    return alt.vconcat(series, panels).resolve_scale(color="independent").properties(title=heading)

"""The data behind rlplan's three pictures, and the Vega-Altair specs drawn from it.

The `*_data` functions are pure: they take planner objects or parsed metrics and return plain
rows (lists of dicts) that tests can check value by value.  The `*_chart` functions turn those
rows into Altair charts; Altair is the optional `charts` extra, imported only inside them, so
`rlplan solve` without --frontier never loads it.  Writing files is the commands layer's job
(planner/commands/chart_commands.py).
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


LIMIT_RED, MARGIN_ORANGE = "red", "#ff7f0e"


def gpu_limit_lines(limit_gib: float, margin_gib: float = 0.0) -> list[tuple[float, str, str]]:
    """The dashed lines a GPU panel draws: the GPU's memory and, when solve keeps one, the margin below it, as
    (GiB, the legend's words, colour)."""
    lines = [(limit_gib, f"GPU memory {limit_gib:.1f} GiB", LIMIT_RED)]
    if margin_gib:
        lines.append((round(limit_gib - margin_gib, 3), f"margin: {margin_gib:.1f} GiB kept free", MARGIN_ORANGE))
    return lines


def _limit_rules(lines: list[tuple[float, str, str]]) -> Any:
    """Limit lines as dashed rules across the panel, named in a legend of their own ("lines"): words drawn beside
    a line ran into the other line (the margin is a few GiB under the GPU's), the bars and their values."""
    import altair as alt

    rows = alt.Data(values=[{"limit": gib, "line": label} for gib, label, _ in lines])
    return alt.Chart(rows).mark_rule(strokeDash=[6, 3], size=2).encode(
        y="limit:Q",
        stroke=alt.Stroke("line:N", title="lines", legend=alt.Legend(symbolType="stroke", symbolStrokeWidth=2,
                                                                    symbolDash=[6, 3], labelLimit=300),
                          scale=alt.Scale(domain=[label for _, label, _ in lines],
                                          range=[colour for _, _, colour in lines])))


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
        # free_gib: what the binding phase leaves free (negative: over). "headroom" is the margin --headroom asks for.
        "binding": {"resource": binding.resource, "where": binding.where, "component": binding.component,
                    "free_gib": _gib(binding.headroom_bytes),
                    "label": f"binding: {binding.component} in {binding.where} ("
                             + (f"{_gib(binding.headroom_bytes):.2f} GiB free)" if binding.headroom_bytes >= 0
                                else f"over by {-_gib(binding.headroom_bytes):.2f} GiB)")},
    }


# The memory chart's groups, bottom of the stack first: what a user can act on, whatever the component's name.
MEMORY_GROUPS = ("weights", "optimizer", "gradients", "activations", "loss head", "KV cache", "engine", "overheads")
GROUP_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
ENGINE_PREFIXES = ("vllm_", "sglang_", "cuda_graph_pool")


def component_group(name: str, scope: str = "step") -> str:
    """Which of MEMORY_GROUPS a memory.py component belongs to."""
    if name == "kv_cache":
        return "KV cache"
    if name.startswith(ENGINE_PREFIXES):
        return "engine"
    if name in ("logits_head", "loss_head_hidden", "cached_logits_block"):
        return "loss head"
    if "optimizer" in name:
        return "optimizer"
    if "_grads" in name or "reduce_scatter" in name:
        return "gradients"
    if name.startswith("activations") or name in ("forward_transients", "layer_backward_workspace"):
        return "activations"
    if scope == "overhead" or name in ("cuda_context_and_nccl", "fragmentation_reserve", "process_overhead"):
        return "overheads"
    return "weights"


def memory_segments(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One stacked segment per (phase, group), bottom first: its span, its GiB and the components in it."""
    segments = []
    for peak in data["phase_peaks"]:
        rows = [row for row in data["gpu_bars"] if row["phase"] == peak["phase"]]
        base = 0.0
        for index, group in enumerate(MEMORY_GROUPS):
            members = [row for row in rows if component_group(row["component"], row["scope"]) == group]
            gib = round(sum(row["gib"] for row in members), 3)
            if not members or gib <= 0:
                continue
            segments.append({"phase": peak["phase"], "group": group, "group_order": index, "gib": gib,
                             "y0": round(base, 3), "y1": round(base + gib, 3), "mid": round(base + gib / 2, 3),
                             "components": ", ".join(f"{row['component']} {row['gib']:.2f}" for row in members),
                             "binding": any(row["binding"] for row in members)})
            base += gib
    return segments


# The GPU panel's size in pixels, and its values' font: which segments have room for their value follows from them.
MEMORY_PANEL = (420, 340)
VALUE_FONT_SIZE = 10
# The y axis runs this far above the tallest of the GPU and the peaks.
MEMORY_Y_TOP = 1.15


def labelled_segments(segments: list[dict[str, Any]], tallest: float, lines: list[float]) -> list[dict[str, Any]]:
    """The segments whose value is written on them: tall enough to hold it, and clear of every limit line (a
    value printed across a dashed line cannot be read); the rest are in the tooltip."""
    gib_per_pixel = tallest * MEMORY_Y_TOP / MEMORY_PANEL[1]
    clear = (VALUE_FONT_SIZE / 2 + 3) * gib_per_pixel
    return [row for row in segments if row["gib"] >= 0.06 * tallest
            and all(abs(row["mid"] - line) > clear for line in lines)]


def memory_chart(data: dict[str, Any], title: str) -> Any:
    import altair as alt

    order = [row["phase"] for row in data["phase_peaks"]]
    segments = memory_segments(data)
    tallest = max([data["gpu_limit_gib"], *(row["gib"] for row in data["phase_peaks"])])
    lines = gpu_limit_lines(data["gpu_limit_gib"], data.get("margin_gib", 0.0))
    labelled = labelled_segments(segments, tallest, [gib for gib, _, _ in lines])
    present = [group for group in MEMORY_GROUPS if any(row["group"] == group for row in segments)]
    colours = [GROUP_COLOURS[MEMORY_GROUPS.index(group)] for group in present]
    x = alt.X("phase:N", sort=order, title="phase", axis=alt.Axis(labelAngle=0))
    bars = alt.Chart(alt.Data(values=segments)).mark_bar().encode(
        x=x, y=alt.Y("y0:Q", title="GiB per GPU", scale=alt.Scale(domain=[0, tallest * MEMORY_Y_TOP])), y2="y1:Q",
        # The legend reads top to bottom as the stack does.
        color=alt.Color("group:N", scale=alt.Scale(domain=present[::-1], range=colours[::-1]), title="memory",
                        legend=alt.Legend(symbolType="square")),
        # The binding group is outlined: that is the segment to shrink.
        stroke=alt.condition("datum.binding", alt.value("black"), alt.value("white")),
        strokeWidth=alt.condition("datum.binding", alt.value(2.5), alt.value(0.5)),
        tooltip=["phase:N", "group:N", alt.Tooltip("gib:Q", format=".2f"), "components:N"],
    )
    values = alt.Chart(alt.Data(values=labelled)).mark_text(color="white", fontSize=VALUE_FONT_SIZE).encode(
        x=alt.X("phase:N", sort=order), y="mid:Q", text=alt.Text("gib:Q", format=".1f"))
    # The binding component is named under the title: drawn above its bar, it ran past the panel into the legend.
    gpu_panel = (bars + values + _limit_rules(lines)).properties(
        width=MEMORY_PANEL[0], height=MEMORY_PANEL[1],
        title=alt.TitleParams(f"{title}: GPU memory per phase", subtitle=[data["binding"]["label"]]))
    return alt.vconcat(gpu_panel, _host_panel(data))


def _host_panel(data: dict[str, Any]) -> Any:
    """Host RAM per node, scaled to the data: a limit far beyond it (1024 GiB against 40) is said, not drawn."""
    import altair as alt

    largest = max([row["gib"] for row in data["host_bars"]] or [1.0])
    limit_gib = data["host_limit_gib"]
    draw_limit = limit_gib <= 1.5 * sum(row["gib"] for row in data["host_bars"])
    domain = [0, (max(limit_gib, largest) if draw_limit else largest) * 1.15]
    x = alt.X("gib:Q", title="GiB per node", scale=alt.Scale(domain=domain), axis=alt.Axis(tickCount=6))
    host_bars = alt.Chart(alt.Data(values=data["host_bars"])).mark_bar(color="#7f7f7f").encode(
        x=x, y=alt.Y("component:N", title=None),
        stroke=alt.condition("datum.binding", alt.value("black"), alt.value(None)),
        tooltip=["component:N", alt.Tooltip("gib:Q", format=".2f")],
    )
    host_text = alt.Chart(alt.Data(values=data["host_bars"])).mark_text(align="left", dx=3).encode(
        x=alt.X("gib:Q", scale=alt.Scale(domain=domain)), y="component:N", text=alt.Text("gib:Q", format=".1f"))
    layers = [host_bars, host_text]
    title = "host RAM per node"
    if draw_limit:
        rows = [{"limit": limit_gib, "label": f"host RAM {limit_gib:.0f} GiB"}]
        layers.append(alt.Chart(alt.Data(values=rows)).mark_rule(color="red", strokeDash=[6, 3], size=2).encode(
            x=alt.X("limit:Q", scale=alt.Scale(domain=domain))))
    else:
        title += f" (of {limit_gib:.0f} GiB: the components sum to {sum(r['gib'] for r in data['host_bars']):.1f})"
    return alt.layer(*layers).properties(width=420, height=22 * max(1, len(data["host_bars"])), title=title)


# --- solve --frontier --------------------------------------------------------------


def knobs_text(knobs: Iterable[tuple[str, Any]]) -> str:
    """key=value, as --fix takes them (true / false, never Python's True / False)."""
    return ", ".join(f"{key}={str(value).lower() if isinstance(value, bool) else value}" for key, value in knobs
                     if value is not None)


def frontier_data(points: Iterable[FrontierPoint], gpu_limit_gib: float, top: int, *,
                  margin_gib: float = 0.0) -> dict[str, Any]:
    """One row per priced candidate; `mark` is chosen, top N (rank 2..top), feasible or infeasible.

    free_gib: what each candidate leaves free of the GPU; margin_gib: what solve keeps free (a second line,
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
                     "free_gib": round(gpu_limit_gib - point.gpu_peak_gib, 3),
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
                   f"({row['free_gib']:.2f} free): {what}")
    # Drawn in this order, so the chosen plan is on top of any candidate at its spot.
    layer = {"infeasible": 0, "feasible": 1, "chosen": 3}
    rows.sort(key=lambda r: (layer.get(r["mark"], 2), -r["rank"]))
    return {"points": rows, "gpu_limit_gib": round(gpu_limit_gib, 3), "key": key, "margin_gib": round(margin_gib, 3),
            "margin_line_gib": round(gpu_limit_gib - margin_gib, 3)}


# The share of a frontier panel's height kept under the lowest labelled point: three stepped labels of 14 px.
LABEL_ROOM = 0.16


def frontier_axis_domains(rows: list[dict[str, Any]], gpu_limit_gib: float,
                          log: bool = True) -> tuple[list[float], list[float]]:
    """The step-time and GiB ranges a frontier panel shows: the data's own, padded (a log axis to 900 s for
    points at 100-175 s, or a 0.06 GiB range, said nothing), the GPU limit always in view."""
    times = [r["step_time_s"] for r in rows if r["step_time_s"] > 0] or [1.0]
    low, high = min(times), max(times)
    if log:
        time_domain = [low / 1.15, high * 1.15]
    else:
        pad = max(0.05 * (high - low), 0.02 * high, 0.5)
        time_domain = [max(0.0, low - pad), high + pad]
    gibs = [r["gpu_peak_gib"] for r in rows] + [gpu_limit_gib]
    # At least a tenth of the GPU below the highest point, so a 0.06 GiB spread reads as the small one it is.
    span = max(max(gibs) - min(gibs), 0.1 * gpu_limit_gib)
    top, bottom = max(gibs) + 0.1 * span, max(gibs) - 1.1 * span
    # Room under the lowest labelled candidate for its label (they are drawn below their points).
    labelled = [r["gpu_peak_gib"] for r in rows if r.get("label")]
    if labelled:
        bottom = min(bottom, (min(labelled) - LABEL_ROOM * top) / (1 - LABEL_ROOM))
    return time_domain, [max(0.0, bottom), top]


def _time_scale(rows: list[dict[str, Any]], log: bool = True) -> Any:
    import altair as alt

    domain = frontier_axis_domains(rows, 0.0, log)[0]
    return alt.Scale(type="log", domain=domain, nice=False) if log else alt.Scale(domain=domain, nice=False)


def _memory_scale(rows: list[dict[str, Any]], gpu_limit_gib: float) -> Any:
    import altair as alt

    return alt.Scale(domain=frontier_axis_domains(rows, gpu_limit_gib)[1], nice=False)


def frontier_chart(data: dict[str, Any], title: str) -> Any:
    """All candidates (log step time: infeasible ones can be many times slower), and the feasible ones zoomed."""
    import altair as alt

    marks = ["chosen", *sorted({r["mark"] for r in data["points"]} - {"chosen", "feasible", "infeasible"}),
             "feasible", "infeasible"]
    colours = ["#d62728", *["#ff7f0e"] * (len(marks) - 3), "#1f77b4", "#bbbbbb"]

    def panel(rows: list[dict[str, Any]], x_scale: Any, panel_title: str) -> Any:
        y_scale = _memory_scale(rows, data["gpu_limit_gib"])
        points = alt.Chart(alt.Data(values=rows)).mark_point(filled=True, opacity=0.85).encode(
            x=alt.X("step_time_s:Q", title="predicted step time (s)", scale=x_scale),
            y=alt.Y("gpu_peak_gib:Q", title="peak GiB per GPU", scale=y_scale),
            color=alt.Color("mark:N", scale=alt.Scale(domain=marks, range=colours), title="candidate"),
            shape=alt.Shape("feasible:N", scale=alt.Scale(domain=[True, False], range=["circle", "cross"])),
            size=alt.condition("datum.rank == 1", alt.value(220), alt.value(60)),
            tooltip=["mark:N", "rank:Q", alt.Tooltip("step_time_s:Q", format=".2f"),
                     alt.Tooltip("gpu_peak_gib:Q", format=".2f"), alt.Tooltip("free_gib:Q", format=".2f"),
                     "reason:N", "knobs:N"],
        )
        # The limit lines are inside y_scale's domain.
        layers = [points, _limit_rules(gpu_limit_lines(data["gpu_limit_gib"], data.get("margin_gib", 0.0)))]
        # Near-equal candidates sit close together: their labels step downwards so none hides another. Below the
        # point: a feasible candidate is under the limit lines (the best usually just under the margin's), so a
        # label above it ran across them.
        for index, row in enumerate(sorted((r for r in rows if r["label"]), key=lambda r: r["rank"])):
            layers.append(alt.Chart(alt.Data(values=[row])).mark_text(
                align="left", baseline="top", dx=8, dy=6 + 14 * (index % 3), fontWeight="bold").encode(
                x=alt.X("step_time_s:Q", scale=x_scale), y=alt.Y("gpu_peak_gib:Q", scale=y_scale), text="label:N"))
        return alt.layer(*layers).properties(width=420, height=340, title=panel_title)

    feasible_rows = [r for r in data["points"] if r["feasible"]]
    if len(feasible_rows) == len(data["points"]):
        # Nothing was refused: a second panel of "the feasible ones" would repeat the first.
        only = panel(feasible_rows, _time_scale(feasible_rows, log=False),
                     f"every candidate priced: all {len(feasible_rows)} fit")
        return alt.vconcat(only, _frontier_key(data)).properties(title=title)
    everything = panel(data["points"], _time_scale(data["points"]), "every candidate priced")
    feasible = panel(feasible_rows, _time_scale(feasible_rows, log=False), "the feasible ones")
    return alt.vconcat(alt.hconcat(everything, feasible), _frontier_key(data)).properties(title=title)


def _frontier_key(data: dict[str, Any]) -> Any:
    """What the labelled candidates are, readable in a PNG where there is no tooltip."""
    import altair as alt

    return alt.Chart(alt.Data(values=[{"line": line, "order": i} for i, line in enumerate(data["key"])])).mark_text(
        align="left", x=0, fontSize=11).encode(y=alt.Y("order:O", axis=None), text="line:N").properties(
        width=860, height=16 * max(1, len(data["key"])))


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
            "steps": len(records), "last_step": records[-1]["step"] if records else None,
            # rlplan's CPU runtime measures each phase's process, not a GPU.
            "per": "process" if measure.startswith("cpu") else "GPU"}


def report_chart(data: dict[str, Any], title: str, subtitle: str = "") -> Any:
    import altair as alt

    steps = alt.X("step:Q", axis=alt.Axis(tickMinStep=1, format="d"))  # whole steps, never 1.5
    series = alt.Chart(alt.Data(values=data["series"])).mark_line(point=True).encode(
        x=steps, y=alt.Y("value:Q", title=None, scale=alt.Scale(zero=False)),
        tooltip=["step:Q", "metric:N", alt.Tooltip("value:Q", format=".4g")],
    ).properties(width=260, height=150).facet(
        facet=alt.Facet("metric:N", title=None), columns=3).resolve_scale(y="independent").resolve_axis(
        x="independent")  # step labels under every row of panels, not only the last
    times = alt.Chart(alt.Data(values=data["phase_seconds"])).mark_area().encode(
        x=steps, y=alt.Y("sum(seconds):Q", title="seconds per step"),
        color=alt.Color("phase:N"), tooltip=["step:Q", "phase:N", alt.Tooltip("seconds:Q", format=".3f")],
    ).properties(width=400, height=220, title="time per phase per step")
    memory = alt.Chart(alt.Data(values=data["memory"])).mark_bar().encode(
        x=alt.X("phase:N", axis=alt.Axis(labelAngle=-30)), xOffset="kind:N",
        y=alt.Y("gib:Q", title=f"peak GiB per {data.get('per', 'GPU')}"),
        color=alt.Color("kind:N", title="memory", legend=alt.Legend(labelLimit=400)), tooltip=["phase:N", "kind:N", alt.Tooltip("gib:Q", format=".3f")],
    ).properties(width=400, height=220, title="predicted vs measured peak per phase")
    heading = f"{title}: {data['steps']} steps (last {data['last_step']})"
    panels = alt.hconcat(times, memory).resolve_scale(color="independent")
    return alt.vconcat(series, panels).resolve_scale(color="independent").properties(
        title=alt.TitleParams(heading, subtitle=[subtitle] if subtitle else [], anchor="start"))

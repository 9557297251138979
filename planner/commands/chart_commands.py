"""The commands side of the pictures: check the extra, build a chart from planner/charts.py, write it.

Imported by cli.py only when --chart, --frontier or `report` is used.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from rlplan.planner.commands.commands_io import load_plan, refuse_overwriting_inputs, write_atomic
from rlplan.planner.errors import PlanError, shorten

CHART_SUFFIXES = (".html", ".png", ".svg")
INSTALL_CHARTS = "pip install -e '.[charts]'"
# A report draws at most this many points per series: a longer run's steps are merged into ranges.
DRAWN_STEPS = 1000


def check_chart_path(path: str, flag: str) -> None:
    """Fail before any work on a suffix we cannot write, or without the extra."""
    if Path(path).suffix.lower() not in CHART_SUFFIXES:
        raise PlanError(field=flag, message=f"{path!r} is not an .html, .png or .svg file.",
                        fix=f"pass {flag} memory.html (or .png / .svg)")
    try:
        import altair  # noqa: F401
        import vl_convert  # noqa: F401
    except ImportError as error:
        raise PlanError(field=flag, message=f"drawing charts needs the charts extra ({error.name} is missing).",
                        fix=f"run {INSTALL_CHARTS}") from None


class ScriptSafeJSON(json.JSONEncoder):
    """JSON that cannot end the <script> element it is inlined in: every `<`, `>` and `&` (and the two line
    separators JavaScript once read as line ends) is written as its \\u escape, so user text in a chart (a
    model, GPU or phase name, a metric) stays data. The escapes are JSON, so the parsed spec is unchanged."""

    ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}

    def encode(self, o: Any) -> str:
        # Outside strings JSON has none of these characters, so replacing them everywhere only touches strings.
        text = super().encode(o)
        return re.sub("[<>&\u2028\u2029]", lambda match: self.ESCAPES[match.group()], text)


def chart_spec(chart: Any) -> dict[str, Any]:
    """The Vega-Lite spec, data inline. Not validated against the schema: rlplan builds every chart itself,
    and validating thousands of inlined rows costs seconds to minutes."""
    import altair as alt

    with alt.data_transformers.disable_max_rows():
        return chart.to_dict(validate=False)


# Characters XML 1.0 cannot hold (C0 controls but tab and newlines, surrogates, U+FFFE/U+FFFF): vl-convert's SVG
# writer panics on them, which aborts the whole process, so they are replaced before it sees the spec.
NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_safe(value: Any) -> Any:
    """The spec with every string (keys too) holding only characters an SVG can: others become U+FFFD."""
    if isinstance(value, str):
        return NOT_XML.sub("\ufffd", value)
    if isinstance(value, dict):
        return {xml_safe(key): xml_safe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [xml_safe(item) for item in value]
    return value


def write_chart(chart: Any, path: str, flag: str, *, force: bool = False) -> None:
    """HTML with Vega inlined (opens offline, no CDN) and the spec escaped for its <script> element; PNG / SVG
    rendered by vl-convert, no browser. Rendered in memory, then written by the one atomic writer, so a failed
    render leaves no half-written chart."""
    import altair as alt
    import vl_convert
    from altair.utils._importers import vl_version_for_vl_convert
    from altair.utils.html import spec_to_html

    suffix = Path(path).suffix.lower()
    spec = chart_spec(chart)
    content: str | bytes
    if suffix == ".html":
        content = spec_to_html(spec, mode="vega-lite", vega_version=alt.VEGA_VERSION,
                               vegaembed_version=alt.VEGAEMBED_VERSION, vegalite_version=alt.VEGALITE_VERSION,
                               template="inline", json_kwds={"cls": ScriptSafeJSON})
    elif suffix == ".png":
        content = vl_convert.vegalite_to_png(xml_safe(spec), vl_version=vl_version_for_vl_convert(), scale=2)
    else:
        content = vl_convert.vegalite_to_svg(xml_safe(spec), vl_version=vl_version_for_vl_convert())
    write_atomic(path, content, flag, force=force)


def memory_chart_command(plan: Any, profile: Any, path: str, headroom: Any = None, *, force: bool = False) -> None:
    from rlplan.planner.charts import memory_chart, memory_chart_data
    from rlplan.planner.memory import predict_memory
    from rlplan.planner.model_error import DEFAULT_HEADROOM, plan_margin

    margin = plan_margin(plan, headroom or DEFAULT_HEADROOM, profile)
    data = memory_chart_data(predict_memory(plan, profile), margin.gib)
    write_chart(memory_chart(data, plan.model.name), path, "--chart", force=force)


def frontier_chart_command(result: Any, gpu_limit_gib: float, top: int, title: str, path: str, *,
                           margin_gib: float = 0.0, force: bool = False) -> None:
    from rlplan.planner.charts import frontier_chart, frontier_data

    write_chart(frontier_chart(frontier_data(result.frontier, gpu_limit_gib, top, margin_gib=margin_gib), title),
                path, "--frontier", force=force)


def report_command(run_dir: str, output: str, *, force: bool = False) -> dict[str, object]:
    """Draw RUN_DIR's metrics.jsonl (finished or still running) beside its plan's prediction; returns what
    was drawn and where (the --json object; `report_summary` is its line of text).

    The file is streamed into at most DRAWN_STEPS step ranges (metrics_file.StepBuckets), so a run of any
    length draws in seconds and bounded memory; the chart's title and the summary say when steps were merged.
    """
    from rlplan.planner.charts import report_chart, run_report_data
    from rlplan.planner.commands.metrics_file import MetricsReading, StepBuckets, read_metrics_file

    directory = Path(run_dir)
    metrics = directory / "metrics.jsonl"
    plan_file = directory / "plan.toml"
    refuse_overwriting_inputs(output, "-o", {"metrics.jsonl": metrics, "plan.toml": plan_file})
    if not metrics.exists():
        raise PlanError(field="RUN_DIR", message=f"{shorten(str(metrics))} does not exist.",
                        fix="pass the output directory of `rlplan run` (trainer.output_dir), which holds metrics.jsonl")
    reading = MetricsReading()
    buckets = StepBuckets(limit=DRAWN_STEPS)
    for record in read_metrics_file(str(metrics), str(metrics), reading):
        buckets.add(record)
    if not buckets.steps:
        raise PlanError(field=str(metrics), message="no finished step yet.", fix="wait for the first step, then rerun")
    predicted: dict[str, float] = {}
    # `rlplan demo` writes its run to <dir>/run: name it by both, never "run run".
    name = f"{directory.resolve().parent.name}/{directory.name}" if directory.name == "run" else directory.name
    title, subtitle = f"run {name}", ""
    if plan_file.is_file():
        plan = load_plan(plan_file)
        predicted = dict(plan.prediction.phase_peak_gib) if plan.prediction is not None else {}
        title, subtitle = f"{plan.model.name}, run {name}", run_subtitle(plan)
    points = buckets.records()
    data = run_report_data(points, predicted)
    merged = buckets.steps_per_point
    notes = []
    if merged > 1:
        notes.append(f"drawn as {len(points)} points of up to {merged} steps "
                     "each (means; memory peaks are the maxima)")
    if reading.skipped_partial:
        notes.append("the last line, still being written, is left out")
    data.update(steps=buckets.steps, last_step=buckets.last_step)
    write_chart(report_chart(data, "; ".join([title, *notes]), subtitle), output, "-o", force=force)
    return {"output": output, "metrics_file": str(metrics), "steps": buckets.steps, "last_step": buckets.last_step,
            "steps_per_point": merged, "skipped_lines": reading.skipped_partial, "notes": notes}


def run_subtitle(plan: Any) -> str:
    """The model, cluster and key knobs of the run, on the report's page."""
    cluster, data, actor = plan.cluster, plan.data, plan.actor
    devices = (f"{cluster.gpus_per_node} CPU rank{'s' if cluster.gpus_per_node > 1 else ''}" if cluster.gpu.is_cpu
               else f"{cluster.nodes * cluster.gpus_per_node} x {cluster.gpu.name}")
    lora = f"LoRA rank {plan.model.lora.rank}" if plan.model.lora.rank else "full fine-tuning"
    return (f"{plan.algorithm.name} on {devices}; {data.train_batch_size} prompts x n {plan.rollout.n}, "
            f"prompt {data.max_prompt_length} + response {data.max_response_length} tokens; {lora}, lr {actor.lr:g}; "
            f"{actor.compute_dtype}, rollout {plan.rollout.name}")


def report_summary(drawn: dict[str, Any]) -> str:
    notes = "".join(f"; {note}" for note in drawn["notes"])
    return f"{drawn['steps']} steps (last {drawn['last_step']}) of {drawn['metrics_file']}{notes}; wrote {drawn['output']}"

"""The commands side of the pictures: check the extra, build a chart from planner/charts.py, write it.

Imported by cli.py only when --chart, --frontier or `report` is used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlplan.planner.commands_io import load_plan, write_atomic
from rlplan.planner.errors import PlanError

CHART_SUFFIXES = (".html", ".png", ".svg")
INSTALL_CHARTS = "pip install -e '.[charts]'"


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


def write_chart(chart: Any, path: str, flag: str) -> None:
    """HTML with Vega inlined (opens offline, no CDN); PNG / SVG rendered by vl-convert, no browser. Rendered
    in memory, then written by the one atomic writer, so a failed render leaves no half-written chart."""
    import io

    suffix = Path(path).suffix.lower()
    buffer: io.BytesIO | io.StringIO = io.BytesIO() if suffix == ".png" else io.StringIO()
    if suffix == ".html":
        chart.save(buffer, format="html", inline=True)
    else:
        chart.save(buffer, format=suffix[1:], scale_factor=2 if suffix == ".png" else 1)
    write_atomic(path, buffer.getvalue(), flag)


def memory_chart_command(plan: Any, profile: Any, path: str) -> None:
    from rlplan.planner.charts import memory_chart, memory_chart_data
    from rlplan.planner.memory import predict_memory

    data = memory_chart_data(predict_memory(plan, profile))
    write_chart(memory_chart(data, plan.model.name), path, "--chart")


def frontier_chart_command(result: Any, gpu_limit_gib: float, top: int, title: str, path: str) -> None:
    from rlplan.planner.charts import frontier_chart, frontier_data

    write_chart(frontier_chart(frontier_data(result.frontier, gpu_limit_gib, top), title), path, "--frontier")


def report_command(run_dir: str, output: str) -> dict[str, object]:
    """Draw RUN_DIR's metrics.jsonl (finished or still running) beside its plan's prediction; returns what
    was drawn and where (the --json object; `report_summary` is its line of text)."""
    from rlplan.planner.charts import parse_metrics, report_chart, run_report_data
    directory = Path(run_dir)
    metrics = directory / "metrics.jsonl"
    if not metrics.is_file():
        raise PlanError(field="RUN_DIR", message=f"{metrics} does not exist.",
                        fix="pass the output directory of `rlplan run` (trainer.output_dir), which holds metrics.jsonl")
    try:
        records = parse_metrics(metrics.read_text(encoding="utf-8"))
    except ValueError as error:
        raise PlanError(field=str(metrics), message=f"a line before the last is not JSON ({error}).",
                        fix="repair or remove that line; only the last line may be cut off") from None
    if not records:
        raise PlanError(field=str(metrics), message="no finished step yet.", fix="wait for the first step, then rerun")
    plan_file = directory / "plan.toml"
    predicted: dict[str, float] = {}
    # `rlplan demo` writes its run to <dir>/run: name it by both, never "run run".
    name = f"{directory.resolve().parent.name}/{directory.name}" if directory.name == "run" else directory.name
    title, subtitle = f"run {name}", ""
    if plan_file.is_file():
        plan = load_plan(plan_file)
        predicted = dict(plan.prediction.phase_peak_gib) if plan.prediction is not None else {}
        title, subtitle = f"{plan.model.name}, run {name}", run_subtitle(plan)
    data = run_report_data(records, predicted)
    write_chart(report_chart(data, title, subtitle), output, "-o")
    return {"output": output, "metrics_file": str(metrics), "steps": data["steps"], "last_step": data["last_step"]}


def run_subtitle(plan: Any) -> str:
    """The model, cluster and key knobs of the run, on the report's page."""
    cluster, data, actor = plan.cluster, plan.data, plan.actor
    devices = (f"{cluster.gpus_per_node} CPU rank{'s' if cluster.gpus_per_node > 1 else ''}" if cluster.gpu.is_cpu
               else f"{cluster.nodes * cluster.gpus_per_node} x {cluster.gpu.name}")
    lora = f"LoRA rank {plan.model.lora.rank}" if plan.model.lora.rank else "full fine-tuning"
    return (f"{plan.algorithm.adv_estimator} on {devices}; {data.train_batch_size} prompts x n {plan.rollout.n}, "
            f"prompt {data.max_prompt_length} + response {data.max_response_length} tokens; {lora}, lr {actor.lr:g}; "
            f"{actor.compute_dtype}, rollout {plan.rollout.name}")


def report_summary(drawn: dict[str, object]) -> str:
    return f"{drawn['steps']} steps (last {drawn['last_step']}) of {drawn['metrics_file']}; wrote {drawn['output']}"

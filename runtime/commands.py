"""The runtime's commands: `rlplan run` and `rlplan demo` (load or build a plan, check it, run it, map failures
to exit codes) and `rlplan calibrate` (write a profile of what runtime/calibrate.py measured or fitted).

Exit codes (`ExitCode`): OK the run finished; FAILED the run failed; BAD_INPUT (a PlanError:
missing model directory, a knob this platform cannot run, an unknown reward
function), reported as one paragraph with no traceback and before anything that
looks like a checkpoint is written. Errors go to the run's own console (stdout), after its log.

The demo plan is written with the plan schema directly and is small enough for a
2-core CPU: a few prompts per step, short responses, two trainer ranks.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from rlplan.planner.commands.commands_io import (
    ExitCode,
    load_plan,
    load_profile,
    make_console,
    print_json,
    refuse_overwriting_inputs,
    report_error,
    report_errors,
    write_atomic,
)
from rlplan.planner.errors import PlanError, shorten
from rlplan.planner.plan import Plan
from rlplan.planner.platform import CPU_RUNTIME_PINS, Platform
from rlplan.planner.profile import DEFAULT_PROFILE, profile_to_toml
from rlplan.runtime.calibrate import calibrate_from_run, calibrate_on_gpu, measure_cpu_rates
from rlplan.runtime.demo_workload import demo_plan, solve_demo_plan
from rlplan.runtime.loop import RunOptions

if TYPE_CHECKING:
    from rich.console import Console

# --- the commands ------------------------------------------------------------------------------

DEMO_PROMPTS = 64


def _plan_error_of(error: BaseException) -> PlanError | None:
    """The PlanError behind an exception, also when it was raised inside a Ray actor."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, PlanError):
            return current
        seen.add(id(current))
        cause = getattr(current, "cause", None)
        current = cause if isinstance(cause, BaseException) else current.__cause__
    return None


def replan_fix(plan: Plan, platform: Platform, errors: list[PlanError], plan_source: str) -> str:
    """The one command that re-solves a plan for this CPU machine, when the plan was not solved for it (its
    cluster is GPUs) or asks for what the CPU runtime pins; empty otherwise."""
    if platform.has_accelerator or (plan.cluster.gpu.is_cpu and not any(e.field in CPU_RUNTIME_PINS for e in errors)):
        return ""
    return (f"re-solve the plan for this machine, keeping its workload: `rlplan solve --device cpu --from "
            f"{shlex.quote(plan_source)} -o cpu-plan.toml`, then `rlplan run cpu-plan.toml`")


def execute(plan: Plan, options: RunOptions, console: Console, *, as_json: bool = False,
            plan_file: str | None = None, plan_source: str = "plan.toml") -> int:
    """Check everything that can be checked up front, then run. Returns the exit code.

    Every blocking error is listed at once, the machine the plan is for first (runtime/platform.py), so a plan
    solved for other hardware is refused in one message with the command that re-solves it for this one.

    With --json the log (the console, then on stderr) stays human, and stdout gets one JSON object: the
    run's outcome, or {"error": {field, message, fix}}.
    """
    from rlplan.planner.memory.cpu_process import cpu_baselines
    from rlplan.runtime.loop import PromptSource, run_loop
    from rlplan.runtime.metrics import check_trackers, plan_versus_actual_table
    from rlplan.runtime.platform import blocking_errors, detect_platform
    from rlplan.runtime.progress import run_progress
    from rlplan.runtime.ray_session import check_ray_temp_dir
    from rlplan.runtime.trainer.model import check_model_dir

    platform = detect_platform()
    errors = blocking_errors(plan, platform)
    checks = [lambda: check_trackers(plan.trainer.logger), lambda: check_model_dir(plan.model.path)]
    if not (options.address or os.environ.get("RAY_ADDRESS")):  # a local cluster: its workers must be able to start
        checks.append(check_ray_temp_dir)
    for check in checks:
        try:
            check()
        except PlanError as error:
            errors.append(error)
    data = None
    if not errors:  # reading the data is worth it only for a plan that can run here
        try:
            data = PromptSource.from_plan(plan)
        except PlanError as error:
            errors.append(error)
    if errors or data is None:
        return report_errors(errors, fix_all=replan_fix(plan, platform, errors, plan_source), as_json=as_json, log=console)
    dataset = data.dataset
    # The plan as run sits beside its metrics: `rlplan calibrate --from-run` and readers of a
    # finished run need both. Written only after every up-front check passed.
    from rlplan.planner.planfile import plan_to_toml

    run_dir = Path(options.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(str(run_dir / "plan.toml"), plan_to_toml(plan), "trainer.output_dir")
    console.print(
        f"{len(dataset)} prompts ({dataset.num_filtered} filtered and {dataset.num_truncated} truncated "
        f"at data.max_prompt_length = {plan.data.max_prompt_length})"
    )
    try:
        with run_progress(console) as progress:
            summary = run_loop(plan, platform, options, data, console=console, progress=progress)
    except Exception as error:  # noqa: BLE001 - every failure becomes an exit code and a message
        plan_error = _plan_error_of(error)
        if plan_error is not None:
            return report_error(plan_error, as_json=as_json, log=console)
        console.print_exception(show_locals=False)
        console.print(f"[bold red]run failed[/bold red]: {type(error).__name__}: {error}", soft_wrap=True)
        if as_json:
            print_json({"error": {"field": "run", "message": f"{type(error).__name__}: {error}",
                                   "fix": "read the traceback on stderr; a checkpointed run continues with "
                                          "`rlplan run PLAN --resume`"}})
        return ExitCode.FAILED
    console.print(plan_versus_actual_table(summary.plan_versus_actual))
    baselines = cpu_baselines(options.profile).describe() if plan.cluster.gpu.is_cpu else None
    if baselines:
        console.print(baselines, markup=False)
    metrics_file = Path(options.output_dir) / "metrics.jsonl"
    console.print(f"finished {summary.last_step} steps; metrics in {metrics_file}")
    if as_json:
        print_json({"finished_steps": summary.last_step, "steps_this_run": summary.steps_done,
                     "output_dir": str(options.output_dir), "metrics_file": str(metrics_file),
                     "plan_file": plan_file or str(run_dir / "plan.toml"),
                     "plan_versus_actual": summary.plan_versus_actual, "cpu_baselines": baselines})
    return ExitCode.OK



def run_command(
    plan_path: str, *, resume: bool, address: str | None, output_dir: str | None, max_steps: int | None,
    as_json: bool = False, profile_path: str | None = None,
) -> int:
    """`rlplan run plan.toml [--resume] [--address A] [--output-dir D] [--max-steps N] [--json]`."""
    # With --json the log goes to stderr so that stdout holds only the one JSON object.
    console = make_console(stderr=as_json)
    try:
        plan = load_plan(plan_path)
        profile = load_profile(profile_path)
    except PlanError as error:
        return report_error(error, as_json=as_json, log=console)
    directory = Path(output_dir or plan.trainer.output_dir)
    options = RunOptions(output_dir=directory, resume=resume, address=address, max_steps=max_steps, profile=profile)
    return execute(plan, options, console, as_json=as_json, plan_source=plan_path)


def demo_command(output_dir: str, steps: int, as_json: bool = False, profile_path: str | None = None) -> int:
    """`rlplan demo`: the bundled tiny model and toy task, solved for this machine, run end to end."""
    from rlplan.planner.planfile import plan_to_toml
    from rlplan.runtime.platform import detect_platform
    from rlplan.runtime.tiny import ensure_tiny_model, write_toy_dataset

    console = make_console(stderr=as_json)
    try:
        profile = load_profile(profile_path)
    except PlanError as error:
        return report_error(error, as_json=as_json, log=console)
    out = Path(output_dir)
    model_dir = ensure_tiny_model(out / "model")
    train_file, _ = write_toy_dataset(out / "data" / "train.parquet", DEMO_PROMPTS)
    world_size = 1 if detect_platform().has_accelerator else 2
    try:
        workload = demo_plan(model_dir, train_file, out / "run", steps=steps, world_size=world_size,
                             algorithm="grpo_full")
        plan = solve_demo_plan(workload)
    except PlanError as error:
        return report_error(error, as_json=as_json, log=console)
    plan_file = out / "plan.toml"
    write_atomic(str(plan_file), plan_to_toml(plan), "--output-dir")
    console.print(
        f"demo: tiny Qwen2 in {model_dir}, toy task in {train_file}; plan solved for {world_size} CPU rank(s) "
        f"and written to {plan_file} (update token budget {plan.actor.ppo_max_token_len_per_gpu} per rank); "
        f"{steps} GRPO steps, full fine-tuning"
    )
    code = execute(plan, RunOptions(output_dir=out / "run", profile=profile), console, as_json=as_json,
                   plan_file=str(plan_file))
    if code == ExitCode.OK:
        # soft_wrap: a command is never cut across lines, so it pastes as one.
        console.print("\n".join(demo_next_steps(out, model_dir, train_file)), markup=False, highlight=False,
                      soft_wrap=True)
    return code


# What `rlplan demo` suggests solving for this machine: the demo's own model and data, at its lengths and batch (the
# toy data set holds DEMO_PROMPTS prompts, so the default batch of 256 prompts would not fit it).
NEXT_CPU_WORKLOAD = ("--prompt-len", "48", "--response-len", "8", "--train-batch-size", "8", "--n", "8")


def demo_next_steps(out: Path, model_dir: Path, train_file: Path) -> list[str]:
    """What to run after the demo, each command runnable as printed from where the demo ran: its report, its plan
    explained, a plan solved for this machine from a model directory and a data set (the demo's, to swap for
    one's own) and its run, then a GPU cluster's plan rendered for verl."""
    run_dir, plan_file = shlex.quote(str(out / "run")), shlex.quote(str(out / "plan.toml"))
    model, data = shlex.quote(str(model_dir)), shlex.quote(str(train_file))
    return [
        "The demo is a toy (a 2-layer model, 8-token answers): it shows the plan and the runtime end to end; its "
        "reward curve is no learning result.",
        "Next:",
        f"  rlplan report {run_dir}          # the run's charts, written to {run_dir}/report.html",
        f"  rlplan explain {plan_file}    # where the plan's memory goes, phase by phase",
        f"  rlplan solve --device cpu --model {model} --train-files {data} {' '.join(NEXT_CPU_WORKLOAD)} "
        "-o cpu-plan.toml   # a plan for this machine: put your model directory and data set in",
        "  rlplan run cpu-plan.toml --max-steps 2",
        "  rlplan solve --model qwen2.5-7b --gpus 8 --gpu h100-80g --prompt-len 1024 --response-len 2048 "
        "--train-files ~/data/gsm8k/train.parquet -o gpu-plan.toml   # a GPU cluster",
        "  rlplan render gpu-plan.toml --target verl -o run.sh   # ... run by verl (examples/ has ready plans)",
    ]


# --- calibrate ---------------------------------------------------------------------------------


def calibrate_command(plan_path: str | None, from_run: str | None, output: str, as_json: bool = False) -> int:
    console = make_console(stderr=as_json)
    try:
        refuse_overwriting_inputs(output, "--output", {"PLAN": plan_path, "--from-run": from_run,
                                                       "plan.toml": _sibling_plan(from_run) if from_run else None})
        plan = _calibration_plan(plan_path, from_run)
        if from_run is not None:
            result = calibrate_from_run(plan, _read_metrics(from_run), name=Path(output).stem)
        else:
            result = calibrate_on_gpu(plan, name=Path(output).stem)
        write_atomic(output, profile_to_toml(result.profile), "--output")
    except PlanError as error:
        return report_error(error, as_json=as_json)
    if as_json:
        print_json(result.to_json(output))
        return ExitCode.OK
    changed = result.changed_constants()
    for note in result.notes:
        console.print(f"note: {note}", markup=False)
    console.print(f"wrote {output}: " + (", ".join(f"{k} = {v:.4g}" for k, v in changed.items())
                                         or "no constant changed"), markup=False)
    console.print(f"use it with `rlplan solve ... --profile {output}`", markup=False)
    return ExitCode.OK


def calibrate_cpu_command(output: str, as_json: bool = False, *, measure_baselines: bool = True) -> int:
    """`rlplan calibrate --cpu`: this machine's fp32 and bf16 FLOP/s and copy bandwidth, all cores, and (unless
    --no-baselines) what a trainer rank and the engine hold beside the priced tensors, into a profile."""
    import tempfile

    from rlplan.runtime.calibrate import measure_cpu_baselines

    console = make_console(stderr=as_json)
    tflops, bf16_tflops, gbps = measure_cpu_rates()
    profile = attrs.evolve(DEFAULT_PROFILE, name=Path(output).stem, cpu_measured_tflops=tflops,
                           cpu_measured_bf16_tflops=bf16_tflops, cpu_measured_gbps=gbps)
    baselines: dict[str, Any] = {}
    if measure_baselines:
        console.print("measuring this machine's CPU process baselines: a two-step run of the bundled tiny model "
                      "(Ray, the trainer ranks and the vLLM CPU engine; a minute or two)")
        try:
            with tempfile.TemporaryDirectory(prefix="rlplan-calibrate-") as work:
                found = measure_cpu_baselines(work)
        except PlanError as error:
            return report_error(error, as_json=as_json, log=console)
        profile = attrs.evolve(profile, cpu_trainer_baseline_measured_gib=found.trainer_gib,
                               cpu_rollout_baseline_measured_gib=found.engine_gib)
        baselines = {"cpu_trainer_baseline_measured_gib": found.trainer_gib,
                     "cpu_rollout_baseline_measured_gib": found.engine_gib,
                     "peaks_gib": found.peaks_gib, "mapped_gib": found.mapped_gib}
    try:
        write_atomic(output, profile_to_toml(profile), "--output")
    except PlanError as error:
        return report_error(error, as_json=as_json)
    if as_json:
        print_json({"profile_file": output, "cpu_measured_tflops": tflops, "cpu_measured_bf16_tflops": bf16_tflops,
                    "cpu_measured_gbps": gbps, **baselines})
        return ExitCode.OK
    console.print(f"wrote {output}: cpu_measured_tflops = {tflops:.4g} ({tflops * 1000:.1f} GFLOP/s fp32 matmul), "
                  f"cpu_measured_bf16_tflops = {bf16_tflops:.4g} ({bf16_tflops * 1000:.1f} GFLOP/s bf16), "
                  f"cpu_measured_gbps = {gbps:.4g}")
    if baselines:
        mapped = ", ".join(f"{phase} {gib:.2f}" for phase, gib in sorted(baselines["mapped_gib"].items()))
        console.print(f"CPU process baselines: {baselines['cpu_trainer_baseline_measured_gib']:.2f} GiB per trainer "
                      f"rank, {baselines['cpu_rollout_baseline_measured_gib']:.2f} GiB for the engine (file-backed "
                      f"and shared pages of the peaks, GiB: {mapped})")
    console.print(f"use it with `rlplan solve --device cpu ... --profile {output}` and "
                  f"`rlplan run PLAN --profile {output}`")
    return ExitCode.OK


def _calibration_plan(plan_path: str | None, from_run: str | None) -> Plan:
    if plan_path is None and from_run is not None:
        sibling = _sibling_plan(from_run)
        if not sibling.is_file():
            raise PlanError(field="--from-run", message=f"no plan.toml beside {from_run}, and no plan was given.",
                            fix="pass the run's plan too: `rlplan calibrate plan.toml --from-run metrics.jsonl`")
        plan_path = str(sibling)
    if plan_path is None:
        raise PlanError(field="calibrate", message="needs a plan or --from-run.",
                        fix="pass plan.toml or --from-run FILE")
    return load_plan(plan_path)


def _sibling_plan(from_run: str) -> Path:
    """The plan a run wrote beside its metrics.jsonl."""
    return Path(from_run).with_name("plan.toml")


# calibrate keeps every record of the run (about a kilobyte a step): 64 MiB is some 60,000 steps.
CALIBRATE_MAX_BYTES = 64 * 2**20


def _read_metrics(path: str) -> list[dict[str, Any]]:
    """Every record of a finished run's metrics.jsonl (metrics_file's checks: a regular file, each line a record
    or refused by its number); held whole, so a file past CALIBRATE_MAX_BYTES is refused, not read."""
    from rlplan.planner.commands.metrics_file import read_metrics_file

    rows = list(read_metrics_file(path, "--from-run", max_bytes=CALIBRATE_MAX_BYTES))
    if not rows:
        raise PlanError(field="--from-run", message=f"{shorten(path)!r} has no finished step.",
                        fix="pass the metrics.jsonl of a run that finished at least one step")
    return rows

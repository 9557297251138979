"""`rlplan compare` and `rlplan calibrate --from-verl-log`: reading the plan (or the run's verl script) and the
verl logs, calling the pure planner.compare / planner.calibration, printing, writing. No torch: both work on a
planner-only install.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rlplan.planner.commands.commands_io import (
    ExitCode,
    load_plan,
    load_profile,
    make_console,
    print_json,
    read_text,
    write_atomic,
)
from rlplan.planner.errors import PlanError
from rlplan.planner.knobs import apply_knobs

# A verl run's console log grows by a few KiB a step (plus Ray's and vLLM's own lines): far above the 16 MiB
# of a plan, still a bound that cannot exhaust memory.
MAX_LOG_BYTES = 512 * 2**20


def read_verl_log(path: str, what: str = "VERL_LOG"):
    from rlplan.planner.verl_log import parse_verl_log

    return parse_verl_log(read_text(path, what, limit=MAX_LOG_BYTES, errors="replace"), source=path)


def load_plan_or_script(path: str, *, gpu: str | None, gpu_mem: str | None, host_mem: float, env: list[str],
                        fixes: dict[str, Any]):
    """A plan.toml as it is, or a verl launch script through `import verl`'s path; then the --fix pins.
    Returns (plan, import warnings)."""
    warnings: tuple[str, ...] = ()
    if Path(path).suffix.lower() == ".toml":
        if gpu is not None or gpu_mem is not None:
            raise PlanError(field="--gpu", message="a plan.toml names its GPU already.",
                            fix="drop --gpu / --gpu-mem, or pass the run's launch script instead")
        plan = load_plan(path)
    else:
        from rlplan.planner.commands.interop_commands import _gpu, parse_env_pins, read_local_model_config
        from rlplan.planner.verl_import import import_verl_script

        # compare writes no plan, so the script is read as the shell that launched it would read it: the process
        # environment stands in for --env pins ($HOME in data paths), and the user's --env wins over it.
        result = import_verl_script(read_text(path, "PLAN"), gpu=_gpu(gpu, gpu_mem), host_memory_gib=host_mem,
                                    env={**os.environ, **parse_env_pins(env)},
                                    local_config_reader=read_local_model_config, environment=dict(os.environ))
        plan, warnings = result.plan, tuple(result.warnings)
    return (apply_knobs(plan, fixes) if fixes else plan), warnings


def _family(verl_version: str | None):
    from rlplan.planner.compare import version_family

    return None if verl_version is None else version_family(verl_version)


def compare_command(plan_path: str, log_path: str, *, gpu: str | None, gpu_mem: str | None, host_mem: float,
                    env: list[str], fixes: dict[str, Any], profile_path: str | None, verl_version: str | None,
                    chart: str | None, as_json: bool) -> int:
    """Exit OK when every measured memory figure lies within the model's band above its prediction, else FAILED."""
    from rlplan.planner.compare import compare_run
    from rlplan.planner.compare_report import comparison_chart, comparison_json, comparison_tables

    if chart:
        from rlplan.planner.commands.chart_commands import check_chart_path

        check_chart_path(chart, "--chart")
    plan, warnings = load_plan_or_script(plan_path, gpu=gpu, gpu_mem=gpu_mem, host_mem=host_mem, env=env, fixes=fixes)
    if verl_version is not None:  # the run's verl is the plan's target stack too (as --verl-version elsewhere)
        from rlplan.planner.stack import stack_from_flags

        plan = plan.evolve(stack=stack_from_flags(plan.stack, verl_version, None, None))
    log = read_verl_log(log_path)
    comparison = compare_run(plan, log, load_profile(profile_path), _family(verl_version))
    payload = comparison_json(comparison)
    payload["import_warnings"] = list(warnings)
    if chart:
        from rlplan.planner.commands.chart_commands import write_chart

        title = f"{Path(plan_path).name} vs {Path(log_path).name}"
        write_chart(comparison_chart(payload, title, log.series("response_length/mean")), chart, "--chart")
        payload["chart"] = chart
    if as_json:
        print_json(payload)
    else:
        console = make_console()
        for renderable in comparison_tables(payload):
            console.print(renderable)
    return ExitCode.FAILED if comparison.exceeds else ExitCode.OK


def calibrate_verl_command(logs: list[str], plans: list[str], output: str, *, gpu: str | None, gpu_mem: str | None,
                           host_mem: float, env: list[str], fixes: dict[str, Any], verl_version: str | None,
                           as_json: bool) -> int:
    """Fit a profile from verl logs, each with its plan (one plan serves every log when only one is given)."""
    from rlplan.planner.calibration import VerlRun, calibrate_from_verl_logs
    from rlplan.planner.profile import DEFAULT_PROFILE, profile_to_toml

    if not plans:
        raise PlanError(field="--plan", message="the plan (or launch script) the logged run ran is needed.",
                        fix="pass --plan plan.toml (or --plan run.sh --gpu h100-80g)")
    if len(plans) not in (1, len(logs)):
        raise PlanError(field="--plan", message=f"{len(plans)} plans for {len(logs)} logs.",
                        fix="pass one --plan for every --from-verl-log, in the same order, or a single --plan")
    runs = []
    for index, log_path in enumerate(logs):
        plan_path = plans[index if len(plans) > 1 else 0]
        plan, _ = load_plan_or_script(plan_path, gpu=gpu, gpu_mem=gpu_mem, host_mem=host_mem, env=env, fixes=fixes)
        runs.append(VerlRun(plan=plan, log=read_verl_log(log_path, "--from-verl-log")))
    result = calibrate_from_verl_logs(runs, name=Path(output).stem, family=_family(verl_version))
    write_atomic(output, profile_to_toml(result.profile), "--output")
    if as_json:
        print_json(result.to_json(output))
        return ExitCode.OK
    console = make_console()
    for key, value in result.changed_constants().items():
        why = result.profile.why(key)
        why = why if len(why) < 80 else why[:77] + "..."
        console.print(f"{key}: {getattr(DEFAULT_PROFILE, key):.4g} -> {value:.4g} ({why})", markup=False)
    for note in result.notes:
        console.print(f"note: {note}", markup=False)
    console.print(f"wrote {output}; plan with it: `rlplan solve ... --profile {output}`", markup=False)
    return ExitCode.OK

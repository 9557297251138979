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
    open_regular_file,
    print_json,
    read_text,
    refuse_overwriting_inputs,
    refuse_read_only_output,
    write_atomic,
)
from rlplan.planner.errors import PlanError
from rlplan.planner.knobs import apply_knobs


def read_verl_log(path: str, what: str = "VERL_LOG"):
    """A verl log streamed line by line (a run's console log grows without bound: it is never read whole), from a
    regular file only (a FIFO or device is refused before a byte is read)."""
    from rlplan.planner.verl_log import read_verl_log_stream

    fd = open_regular_file(path, what)
    try:
        with os.fdopen(fd, "r", encoding="utf-8", errors="replace", newline="\n") as stream:
            return read_verl_log_stream(stream, source=path)
    except OSError as exc:
        raise PlanError(field=what, message=f"cannot read {path!r}: {exc}.", fix="check the file") from None


def load_plan_or_script(path: str, *, gpu: str | None, gpu_mem: str | None, host_mem: float, env: list[str],
                        fixes: dict[str, Any], log=None, verl_version: str | None = None):
    """A plan.toml as it is, or a verl launch script through `import verl`'s path; then the --fix pins.
    With the run's `log`, a script whose keys leave a range of verl releases is read again on the newest release
    whose metric spellings the log has (`narrowed_by_log`). Returns (plan, import warnings)."""
    if log is not None and verl_version is None and Path(path).suffix.lower() != ".toml":
        first = load_plan_or_script(path, gpu=gpu, gpu_mem=gpu_mem, host_mem=host_mem, env=env, fixes=fixes)
        narrowed = narrowed_by_log(first[0], log)
        if narrowed is None:
            return first
        again = load_plan_or_script(path, gpu=gpu, gpu_mem=gpu_mem, host_mem=host_mem, env=env, fixes=fixes,
                                    verl_version=narrowed[0])
        return again[0], (*again[1], narrowed[1])
    warnings: tuple[str, ...] = ()
    if Path(path).suffix.lower() == ".toml":
        if gpu is not None or gpu_mem is not None:
            raise PlanError(field="--gpu", message="a plan.toml names its GPU already.",
                            fix="drop --gpu / --gpu-mem, or pass the run's launch script instead")
        plan = load_plan(path)
    else:
        from rlplan.planner.commands.interop_commands import (
            _gpu,
            parse_env_pins,
            read_local_model_config,
            script_context,
        )
        from rlplan.planner.verl_import import import_verl_script

        # Read as `import verl` reads it: the process environment is the environment (a value from it is kept as
        # its reference and never printed: it may hold a token), --env pins are the user's own values.
        result = import_verl_script(read_text(path, "PLAN"), gpu=_gpu(gpu, gpu_mem), host_memory_gib=host_mem,
                                    env=parse_env_pins(env), local_config_reader=read_local_model_config,
                                    environment=dict(os.environ), context=script_context(path),
                                    versions=(verl_version, None, None))
        plan, warnings = result.plan, tuple(result.warnings)
    return (apply_knobs(plan, fixes) if fixes else plan), warnings


def narrowed_by_log(plan, log) -> tuple[str, str] | None:
    """The newest release of the script's inferred verl range (stack.verl_oldest to stack.verl) whose metric
    spellings the log has, with why; None where the plan holds no range or the log does not narrow it."""
    from rlplan.planner.compare import infer_family, version_family
    from rlplan.planner.stack import VERL_RELEASES, in_range, parse_version
    from rlplan.planner.stack_inference import span_text

    oldest, newest = plan.stack.verl_oldest, plan.stack.verl
    if oldest is None:
        return None
    family, why = infer_family(log)
    span = [r for r in VERL_RELEASES if in_range(r, oldest, None) and parse_version(r) <= parse_version(newest)]
    within = [r for r in span if version_family(r) == family]
    if not within or within == span:
        return None
    return within[-1], (f"the log's metric spellings ({why}) narrow the script's verl {span_text(span)} to "
                        f"{span_text(within)}: compared as verl {within[-1]}")


def _plan_for_log(plan_path: str, log: Any, verl_version: str | None, *, gpu: str | None, gpu_mem: str | None,
                  host_mem: float, env: list[str], fixes: dict[str, Any]) -> tuple[Any, tuple[str, ...], str | None]:
    """The plan a log is compared with, its import warnings, and the verl it is read at: --verl-version (the script
    imported at it, the plan's stack set to it); else a script's inferred range narrowed by the log's spellings
    (narrowed_by_log); else, for a script left on the default stack by a log whose spellings are older, that
    family's first release (compare.FAMILY_RELEASE), whose defaults and allocator regime the run had."""
    from rlplan.planner.compare import FAMILY_RELEASE, infer_family
    from rlplan.planner.stack import DEFAULT_VERL, stack_from_flags

    plan, warnings = load_plan_or_script(plan_path, gpu=gpu, gpu_mem=gpu_mem, host_mem=host_mem, env=env,
                                         fixes=fixes, log=None if verl_version else log, verl_version=verl_version)
    script = Path(plan_path).suffix.lower() != ".toml"
    if verl_version is None and script and plan.stack.verl == DEFAULT_VERL and plan.stack.verl_oldest is None:
        dated = FAMILY_RELEASE.get(infer_family(log)[0])
        if dated is not None:
            verl_version = dated
            plan, warnings = load_plan_or_script(plan_path, gpu=gpu, gpu_mem=gpu_mem, host_mem=host_mem, env=env,
                                                 fixes=fixes, verl_version=dated)
            warnings = (*warnings, f"the log's metric names date it to verl {dated} or near it: the script is read "
                                   f"at verl {dated} (pass --verl-version to choose another)")
    if verl_version is not None:  # the run's verl is the plan's target stack too (as --verl-version elsewhere)
        plan = plan.evolve(stack=stack_from_flags(plan.stack, verl_version, None, None))
    return plan, warnings, verl_version


def _family(verl_version: str | None):
    from rlplan.planner.compare import version_family

    return None if verl_version is None else version_family(verl_version)


def compare_command(plan_path: str, log_path: str, *, gpu: str | None, gpu_mem: str | None, host_mem: float,
                    env: list[str], fixes: dict[str, Any], profile_path: str | None, verl_version: str | None,
                    chart: str | None, as_json: bool, force: bool = False) -> int:
    """Exit OK when every measured memory figure lies within the model's band above its prediction, else FAILED."""
    from rlplan.planner.compare import compare_run
    from rlplan.planner.compare_report import comparison_chart, comparison_json, comparison_tables

    if chart:
        from rlplan.planner.commands.chart_commands import check_chart_path

        check_chart_path(chart, "--chart")
        # A chart named like its own log or script (run.html) would replace it.
        refuse_overwriting_inputs(chart, "--chart", {"PLAN_OR_SCRIPT": plan_path, "VERL_LOG": log_path,
                                                     "--profile": profile_path})
        refuse_read_only_output(chart, "--chart", force=force)
    log = read_verl_log(log_path)
    plan, warnings, verl_version = _plan_for_log(plan_path, log, verl_version, gpu=gpu, gpu_mem=gpu_mem,
                                                 host_mem=host_mem, env=env, fixes=fixes)
    comparison = compare_run(plan, log, load_profile(profile_path), _family(verl_version))
    payload = comparison_json(comparison)
    payload["import_warnings"] = list(warnings)
    if chart:
        from rlplan.planner.commands.chart_commands import write_chart

        title = f"{Path(plan_path).name} vs {Path(log_path).name}"
        write_chart(comparison_chart(payload, title, log.series("response_length/mean")), chart, "--chart", force=force)
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
                           as_json: bool, force: bool = False) -> int:
    """Fit a profile from verl logs, each with its plan (one plan serves every log when only one is given)."""
    from rlplan.planner.calibration import VerlRun, calibrate_from_verl_logs
    from rlplan.planner.profile import DEFAULT_PROFILE, profile_to_toml

    if not plans:
        raise PlanError(field="--plan", message="the plan (or launch script) the logged run ran is needed.",
                        fix="pass --plan plan.toml (or --plan run.sh --gpu h100-80g)")
    if len(plans) not in (1, len(logs)):
        raise PlanError(field="--plan", message=f"{len(plans)} plans for {len(logs)} logs.",
                        fix="pass one --plan for every --from-verl-log, in the same order, or a single --plan")
    # The profile must not land on any log or plan it is fitted from (a typo, `-o run.log`, or a symlink to one).
    inputs = {f"--from-verl-log {log_path!r}": log_path for log_path in logs}
    inputs.update({f"--plan {plan_path!r}": plan_path for plan_path in plans})
    refuse_overwriting_inputs(output, "--output", inputs)
    refuse_read_only_output(output, "--output", force=force)
    runs = []
    for index, log_path in enumerate(logs):
        plan_path = plans[index if len(plans) > 1 else 0]
        log = read_verl_log(log_path, "--from-verl-log")
        plan, _, _ = _plan_for_log(plan_path, log, verl_version, gpu=gpu, gpu_mem=gpu_mem, host_mem=host_mem,
                                   env=env, fixes=fixes)
        runs.append(VerlRun(plan=plan, log=log))
    result = calibrate_from_verl_logs(runs, name=Path(output).stem, family=_family(verl_version))
    write_atomic(output, profile_to_toml(result.profile), "--output", force=force)
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

"""`rlplan import verl` and `rlplan render`: the file reading and printing around the pure
`verl_import` and `render` modules.  Each returns the process exit code (`ExitCode`): OK, or BAD_INPUT
printed by `report_error` as one paragraph naming the field and the fix, never a traceback.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from typing import Any

import attrs

from rlplan.planner.commands.commands_io import (
    ExitCode,
    load_plan,
    make_console,
    model_config_path,
    read_text,
    refuse_overwriting_inputs,
    refuse_read_only_output,
    report_error,
    write_atomic,
)
from rlplan.planner.errors import PlanError
from rlplan.planner.knobs import with_expected_lengths
from rlplan.planner.presets import parse_host_memory, typical_host_memory


def _print_json(payload: dict[str, Any]) -> None:
    print(json.dumps(payload, indent=2))


def parse_env_pins(items: list[str]) -> dict[str, str]:
    pins: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip().isidentifier():
            raise PlanError(field="--env", message=f"{item!r} is not KEY=VALUE.", fix="pass e.g. --env NGPUS=8")
        pins[name.strip()] = value
    return pins


def read_local_model_config(path: str):
    """The config.json a model path or hub id has on this machine (a local folder, verl's checkpoint layout, the
    local Hugging Face cache: `model_config_path`), with where it was read; None when it is nowhere here."""
    from rlplan.planner.verl_import import FoundConfig

    candidate = model_config_path(path, os.environ)
    if candidate is None:
        return None

    try:
        config = json.loads(read_text(str(candidate), "actor_rollout_ref.model.path"))
    except ValueError as exc:  # JSONDecodeError, or an integer too long to convert
        raise PlanError(field="actor_rollout_ref.model.path", message=f"{candidate} is not valid JSON ({exc}).",
                        fix="point the model path at a Hugging Face model directory") from None
    if not isinstance(config, dict):
        raise PlanError(field="actor_rollout_ref.model.path", message=f"{candidate} is not a JSON object.",
                        fix="point the model path at a Hugging Face model directory")
    return FoundConfig(config=config, source=str(candidate), in_hub_cache=not _is_local(path, candidate))


def _is_local(spec: str, found) -> bool:
    """Whether a found config.json lies under the folder the spec names (not in the Hugging Face cache)."""
    try:
        return os.path.commonpath([os.path.abspath(os.path.expanduser(spec)), os.path.abspath(found)]) == \
            os.path.abspath(os.path.expanduser(spec))
    except ValueError:
        return False


def read_optional_text(path: str) -> str | None:
    """A small text file a script's command names (a recipe's config, its module), or None when it is not
    readable here: the import then says what it could not read."""
    try:
        return read_text(path, "config")
    except PlanError:
        return None


def script_context(script: str, arguments: tuple[str, ...] = ()):
    """Where the script is imported from: this folder (bash's PWD; where `python3 -m` would find verl and its
    configs), the script as given ($0), its --arg arguments, and the reader of the files its command names."""
    from rlplan.planner.verl_import import ScriptContext

    return ScriptContext(cwd=os.getcwd(), script=script, arguments=arguments, read_text=read_optional_text)


def _gpu(gpu: str | None, gpu_mem: str | None):
    from rlplan.planner.presets import custom_gpu, parse_gpu_memory, resolve_gpu

    if gpu is not None and gpu_mem is not None:
        raise PlanError(field="--gpu", message="--gpu and --gpu-mem both describe the GPU.", fix="pass only one")
    if gpu is not None:
        return resolve_gpu(gpu)
    if gpu_mem is not None:
        return custom_gpu(parse_gpu_memory(gpu_mem))
    raise PlanError(field="--gpu", message="verl scripts rarely say which GPU they run on, and the memory model "
                    "needs it.", fix="pass --gpu h100-80g (see `rlplan presets gpus`) or --gpu-mem GiB")


def import_command(script: str, *, gpu: str | None, gpu_mem: str | None, host_mem: str | None, env: list[str],
                   output: str | None, expected_lengths: tuple[int | None, int | None] = (None, None),
                   as_json: bool = False,
                   versions: tuple[str | None, str | None, str | None] = (None, None, None),
                   arguments: tuple[str, ...] = (), force: bool = False) -> int:
    """With as_json: one object on stdout, {"output", "warnings", "plan_toml"} (the plan's text when no -o)."""
    from rich.markup import escape

    from rlplan.planner.planfile import plan_to_toml
    from rlplan.planner.verl_import import import_verl_script

    try:
        refuse_overwriting_inputs(output, "--output", {"SCRIPT": script})
        refuse_read_only_output(output, "--output", force=force)
        host_gib = parse_host_memory(host_mem)
        result = import_verl_script(
            read_text(script, "script"), gpu=_gpu(gpu, gpu_mem), host_memory_gib=host_gib or 1024.0,
            env=parse_env_pins(env), local_config_reader=read_local_model_config, environment=dict(os.environ),
            versions=versions, context=script_context(script, arguments),
        )
        if host_gib is None:  # the script does not say: the GPU class's typical node, said as a warning
            cluster = result.plan.cluster
            assumed = typical_host_memory(cluster.gpu, cluster.gpus_per_node)
            plan = result.plan.evolve(cluster=attrs.evolve(cluster, host_memory_gib=assumed.gib))
            result = attrs.evolve(result, plan=plan,
                                  warnings=(*result.warnings, f"{assumed.describe()}; pass --host-mem to change it"))
        from rlplan.planner.stack_inference import verdicts_across

        across = verdicts_across(result.plan)  # the script's verl range judged apart: said beside the inference
        if across:
            result = attrs.evolve(result, warnings=(*result.warnings, *across))
        text = plan_to_toml(with_expected_lengths(result.plan, *expected_lengths))
        if output:
            write_atomic(output, text, "--output", force=force)
        elif not as_json:
            sys.stdout.write(text)
    except PlanError as error:
        return report_error(error, as_json=as_json)
    if as_json:
        _print_json({"output": output, "warnings": list(result.warnings), "plan_toml": None if output else text})
        return ExitCode.OK
    console = make_console(stderr=True, soft_wrap=True)
    for warning in result.warnings:
        console.print(f"[yellow]warning[/] {escape(warning)}")
    if output:
        console.print(f"wrote {escape(output)}; check it with `rlplan validate {escape(output)}`")
    return ExitCode.OK


# What each render target writes, as `render` says it after writing one.
RENDERED = {"verl": "a verl launch script (python3 -m verl.trainer.main_ppo with every knob as an override)",
            "slurm": "a SLURM batch script that starts Ray on the allocation and runs `rlplan run` (the bundled "
                     "runtime, not verl) on the plan",
            "ray-job": "a Ray job submission of `rlplan run` (the bundled runtime, not verl) on an existing cluster"}


def render_command(plan_path: str, *, target: str, fmt: str, output: str | None, as_json: bool = False,
                   force: bool = False) -> int:
    """With as_json: one object on stdout, {"output", "target", "format", "text"} (the text when no -o)."""
    from rlplan.planner.render import render_plan, verl_additions

    try:
        refuse_overwriting_inputs(output, "--output", {"PLAN": plan_path})
        refuse_read_only_output(output, "--output", force=force)
        plan = load_plan(plan_path)
        text = render_plan(plan, target, fmt, plan_file=plan_path)
        added = verl_additions(plan) if target == "verl" else []
        if output:
            write_atomic(output, text, "--output", force=force)
            if fmt == "script":
                mode = os.stat(output).st_mode
                os.chmod(output, mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        elif not as_json:
            sys.stdout.write(text)
    except PlanError as error:
        return report_error(error, as_json=as_json)
    except BrokenPipeError:
        raise  # stdout's reader went away: cli.guarded's quiet exit, not a file we could not chmod
    except OSError as exc:
        return report_error(PlanError(field="--output", message=f"cannot make {output!r} executable: {exc}.",
                                      fix="choose a writable path"), as_json=as_json)
    if as_json:
        _print_json({"output": output, "target": target, "format": fmt, "added": added,
                     "text": None if output else text})
        return ExitCode.OK
    # On stderr, so that a script rendered to stdout stays the script alone.
    console = make_console(stderr=True)
    for line in added:
        console.print(f"added: {line}", markup=False)
    if output:
        what = "verl's Hydra overrides, one per line" if fmt == "overrides" else RENDERED[target]
        console.print(f"wrote {output}: {what}", markup=False)
    return ExitCode.OK

"""The `rlplan` command line: one thin typer function per command, the entry of the commands layer.

Reading inputs, loading plans, writing files atomically, printing errors and the exit codes (`ExitCode`) live in
commands_io.py, which every command module shares. Exit codes (stable, for scripts):
  solve:    0 plan written, 1 no feasible plan, 2 bad input
  validate: 0 valid and fits, 1 valid but predicted not to fit (GPU or host OOM), 2 invalid plan or bad input
  compare:  0 every measured memory figure within the error band, 1 one above it, 2 bad input
  others:   0 ok, 1 the work failed, 2 bad input; 3 an internal error (a bug) for every command
Bad input never shows a traceback: it is one paragraph naming the field and the fix.
Runtime commands (run, demo, measure, calibrate) import torch lazily, inside the command.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated, Any, NoReturn, get_args

import typer

from rlplan.planner.commands_io import (
    RUNTIME_INSTALL,
    ExitCode,
    closed_stdout,
    error_json,
    load_plan,
    load_profile,
    local_config_path,
    make_console,
    print_json,
    read_text,
    refuse_overwriting_inputs,
    report_error,
    write_atomic,
)
from rlplan.planner.errors import ECHO_LIMIT, PlanError, shorten
from rlplan.planner.knobs import with_expected_lengths
from rlplan.planner.model_error import parse_headroom
from rlplan.planner.plan import Algorithm, LossHead, RolloutEngine
from rlplan.planner.platform import CPU_RUNTIME_PINS
from rlplan.planner.render import Format, Target
from rlplan.planner.solver import Objective
from rlplan.planner.this_machine import cpu_cluster, this_machine_memory_gib

# Choices of the fixed-set options, taken from the plan's Literals so --help and validation cannot drift from them.
# `ppo` is the user's name for the gae estimator with a critic; `auto` lets the solver price both engines.
ALGO_CHOICES = ("ppo", *get_args(Algorithm))
ROLLOUT_CHOICES = (*get_args(RolloutEngine), "auto")
OBJECTIVE_CHOICES = get_args(Objective)
RENDER_TARGETS = get_args(Target)
RENDER_FORMATS = get_args(Format)
PRESET_KINDS = ("models", "gpus")
MEASURE_PHASES = ("update", "logprob")
MEASURE_HEADS = ("runtime", *get_args(LossHead))


def choices_metavar(choices: tuple[str, ...]) -> str:
    return "|".join(choices)


def completion(choices: tuple[str, ...]):
    """Shell completion of a fixed-choice option. The value is still checked by the command, so a wrong one is
    a PlanError (one paragraph, and JSON with --json) rather than click's usage error."""
    def complete(incomplete: str) -> list[str]:
        return [choice for choice in choices if choice.startswith(incomplete)]

    return complete


def complete_gpu_presets(incomplete: str) -> list[str]:
    from rlplan.planner.presets import gpu_presets

    # Offered as the docs write them (h100-80g); resolve_gpu reads any case.
    return [name.lower() for name in (*gpu_presets(), "cpu") if name.lower().startswith(incomplete.lower())]


# The panels of `rlplan solve --help`, in the order a user fills them in.
MODEL_PANEL = "Model"
CLUSTER_PANEL = "Cluster"
WORKLOAD_PANEL = "Workload"
SOLVER_PANEL = "Solver"
OUTPUT_PANEL = "Output"


HELP_OPTION_NAMES = {"help_option_names": ["-h", "--help"]}

# Options that several commands take, written once (typer copies the Option for each command).
ExpectedPromptLen = Annotated[int | None, typer.Option(
    "--expected-prompt-len", help="Mean prompt tokens of the data (default: the max).")]
ExpectedResponseLen = Annotated[int | None, typer.Option(
    "--expected-response-len", help="Mean response tokens of the data (default: the max).")]
ProfileOption = Annotated[str | None, typer.Option("--profile", metavar="FILE", help="Calibration profile TOML.")]
HeadroomOption = Annotated[str | None, typer.Option(
    "--headroom", metavar="10%|4GiB|0", help="GPU memory every phase must leave free: a share of the GPU or an "
    "amount (default: from the model's measured error, at least 5 %; docs/accuracy.md 1c).")]
JsonOutput = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]

app = typer.Typer(
    name="rlplan",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings=HELP_OPTION_NAMES,
)
import_app = typer.Typer(help="Import a launch script of another framework into a plan.", no_args_is_help=True,
                         context_settings=HELP_OPTION_NAMES)
app.add_typer(import_app, name="import")


def fail(error: PlanError, *, as_json: bool = False) -> NoReturn:
    raise typer.Exit(report_error(error, as_json=as_json))


def resolve_model_arg(spec: str):
    from rlplan.planner.presets import resolve_model

    candidate = local_config_path(spec)
    if candidate is not None:
        text = read_text(str(candidate), "--model")
        try:
            config = json.loads(text)
        except ValueError as exc:  # JSONDecodeError, or an integer too long to convert
            raise PlanError(field="--model", message=f"{shorten(str(candidate))} is not valid JSON ({shorten(str(exc))}).",
                            fix="point --model at a Hugging Face config.json or its directory") from None
        return resolve_model(spec, local_config=config)
    return resolve_model(spec)


def weightless_model_note(spec: str) -> str | None:
    """--model DIR with a config.json but no weights: model.path is that directory all the same, so say so."""
    candidate = local_config_path(spec)
    if candidate is None or any(any(candidate.parent.glob(f"*.{suffix}")) for suffix in ("safetensors", "bin", "pt")):
        return None
    return (f"{shorten(str(candidate.parent))} has a config.json but no weights (*.safetensors); model.path is set to "
            "it all the same, and a run loads the weights from there: put the checkpoint there, or edit model.path.")


def parse_fixes(fixes: list[str]) -> dict[str, Any]:
    from rlplan.planner.knobs import parse_pin

    pins: dict[str, Any] = {}
    for item in fixes:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise PlanError(field="--fix", message=f"{item!r} is not key=value.",
                            fix="pass e.g. --fix actor.param_offload=true")
        field, value = parse_pin(key.strip(), raw.strip())
        pins[field] = value
    return pins


# Modules only the runtime extra installs: a command that needs one fails as bad setup (exit 2), not as a bug.
RUNTIME_MODULES = frozenset({"torch", "vllm", "ray", "transformers", "peft", "datasets", "accelerate", "safetensors",
                             "numpy", "pynvml", "tensordict", "tokenizers", "pyarrow"})


def guarded(function):
    """Turn PlanError into the one-paragraph message and exit 2; other failures into exit 3 without a traceback."""
    import functools

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        as_json = bool(kwargs.get("json_output"))
        try:
            return function(*args, **kwargs)
        except PlanError as error:
            fail(error, as_json=as_json)
        except typer.Exit:
            raise
        except BrokenPipeError:
            raise typer.Exit(closed_stdout()) from None
        except KeyboardInterrupt:
            make_console(stderr=True).print("interrupted")
            raise typer.Exit(ExitCode.INTERRUPTED) from None
        except RecursionError:
            # Only a hostile input (TOML, JSON or ${A:-${A:-...}} nested thousands deep) recurses this far.
            fail(PlanError(field=function.__name__, message="the input is nested too deeply to read.",
                           fix="flatten the nested tables, lists or variable defaults"), as_json=as_json)
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] not in RUNTIME_MODULES:
                raise
            needs = "--verify" if function.__name__ == "solve" else function.__name__  # solve needs it only to verify
            fail(PlanError(field=needs, message=f"needs the runtime extra ({exc.name} is not installed).",
                           fix=RUNTIME_INSTALL), as_json=as_json)
        except Exception as exc:  # a bug in rlplan, not bad input: say so, keep the trace behind a flag
            if os.environ.get("RLPLAN_DEBUG"):
                raise
            from rich.markup import escape

            if as_json:
                print(json.dumps(error_json(PlanError(
                    field="internal", message=f"{type(exc).__name__}: {exc}",
                    fix="a bug in rlplan: rerun with RLPLAN_DEBUG=1 and report the traceback")), indent=2))
            make_console(stderr=True).print(
                f"[bold red]internal error[/] {type(exc).__name__}: {escape(shorten(str(exc)))}. This is a bug in "
                "rlplan, not in your input; rerun with RLPLAN_DEBUG=1 for the traceback and report it.", markup=True)
            raise typer.Exit(ExitCode.INTERNAL) from None

    return wrapper


# --- solve -------------------------------------------------------------------------


def _path_list(flag: str, text: str | None) -> tuple[str, ...] | None:
    """`PATH[,PATH]` as a tuple of paths; None when the flag is not given."""
    if text is None:
        return None
    paths = tuple(part.strip() for part in text.split(","))
    if not all(paths):
        raise PlanError(field=flag, message=f"{text!r} has an empty path.",
                        fix=f"pass {flag} train.parquet or {flag} a.parquet,b.parquet")
    return paths


@app.command()
@guarded
def solve(
    model: Annotated[str | None, typer.Option(
        "--model", metavar="NAME|DIR", rich_help_panel=MODEL_PANEL,
        help="Preset name, Hugging Face repo id, or local config.json / dir. Required unless --from.")] = None,
    lora: Annotated[str, typer.Option(
        "--lora", metavar="off|auto|RANK", rich_help_panel=MODEL_PANEL, autocompletion=completion(("off", "auto", "8", "16",
                                                                                          "32", "64")),
        help="LoRA adapters: off (full fine-tuning), auto (the solver's choice) or a rank.")] = "auto",
    gpus: Annotated[int | None, typer.Option(
        "--gpus", metavar="N", rich_help_panel=CLUSTER_PANEL, help="Total number of GPUs.")] = None,
    gpu: Annotated[str | None, typer.Option(
        "--gpu", metavar="NAME", rich_help_panel=CLUSTER_PANEL, autocompletion=complete_gpu_presets,
        help="GPU preset, e.g. h100-80g (`rlplan presets gpus`). Required unless --gpu-mem, --device cpu or "
             "--from.")] = None,
    gpu_mem: Annotated[str | None, typer.Option(
        "--gpu-mem", metavar="GIB", rich_help_panel=CLUSTER_PANEL,
        help="GPU memory for a GPU without a preset: GiB, or with a unit (80GB, 81559MiB).")] = None,
    gpu_tflops: Annotated[float | None, typer.Option(
        "--gpu-tflops", metavar="TFLOPS", rich_help_panel=CLUSTER_PANEL,
        help="Dense BF16 TFLOPS of a --gpu-mem GPU.")] = None,
    gpu_bandwidth: Annotated[float | None, typer.Option(
        "--gpu-bandwidth", metavar="GB/S", rich_help_panel=CLUSTER_PANEL,
        help="Memory bandwidth of a --gpu-mem GPU, GB/s.")] = None,
    nodes: Annotated[int | None, typer.Option(
        "--nodes", metavar="N", rich_help_panel=CLUSTER_PANEL, help="Number of nodes (default: gpus / gpus-per-node).")] = None,
    gpus_per_node: Annotated[int | None, typer.Option(
        "--gpus-per-node", metavar="N", rich_help_panel=CLUSTER_PANEL,
        help="GPUs per node (default: min(gpus, 8)).")] = None,
    host_mem: Annotated[str | None, typer.Option(
        "--host-mem", metavar="GIB", rich_help_panel=CLUSTER_PANEL,
        help="Host RAM per node: GiB or with a unit (512GiB); default: the GPU's typical node (`rlplan presets "
             "gpus`), with --device cpu this machine's MemTotal.")] = None,
    device: Annotated[str, typer.Option(
        "--device", metavar="gpu|cpu", rich_help_panel=CLUSTER_PANEL, autocompletion=completion(("gpu", "cpu")),
        help="cpu: plan rlplan's CPU runtime on this machine (--gpus is then its trainer ranks, default 1); the "
             "same as --gpu cpu.")] = "gpu",
    algo: Annotated[str | None, typer.Option(
        "--algo", metavar="ALGO", rich_help_panel=WORKLOAD_PANEL, autocompletion=completion(ALGO_CHOICES),
        help=f"Algorithm: {', '.join(ALGO_CHOICES)} (ppo is gae + critic; default: the --from plan's, else "
             "grpo).")] = None,
    prompt_len: Annotated[int | None, typer.Option(
        "--prompt-len", metavar="TOKENS", rich_help_panel=WORKLOAD_PANEL,
        help="Max prompt tokens. Required unless --from.")] = None,
    response_len: Annotated[int | None, typer.Option(
        "--response-len", metavar="TOKENS", rich_help_panel=WORKLOAD_PANEL, help="Max response tokens.")] = None,
    max_response_len: Annotated[int | None, typer.Option(
        "--max-response-len", metavar="TOKENS", rich_help_panel=WORKLOAD_PANEL,
        help="Find the longest response up to this that fits.")] = None,
    train_batch_size: Annotated[int | None, typer.Option(
        "--train-batch-size", metavar="PROMPTS", rich_help_panel=WORKLOAD_PANEL,
        help="Prompts per step (default 256).")] = None,
    n: Annotated[int | None, typer.Option(
        "--n", metavar="N", rich_help_panel=WORKLOAD_PANEL, help="Responses per prompt (rollout.n, default 5).")] = None,
    ppo_mini_batch_size: Annotated[int | None, typer.Option(
        "--ppo-mini-batch-size", metavar="PROMPTS", rich_help_panel=WORKLOAD_PANEL,
        help="Prompts per optimizer step.")] = None,
    expected_prompt_len: Annotated[int | None, typer.Option(
        "--expected-prompt-len", metavar="TOKENS", rich_help_panel=WORKLOAD_PANEL,
        help="Mean prompt tokens of the data (default: the max).")] = None,
    expected_response_len: Annotated[int | None, typer.Option(
        "--expected-response-len", metavar="TOKENS", rich_help_panel=WORKLOAD_PANEL,
        help="Mean response tokens of the data (default: the max).")] = None,
    train_files: Annotated[str | None, typer.Option(
        "--train-files", metavar="PATH[,PATH]", rich_help_panel=WORKLOAD_PANEL,
        help="data.train_files: the parquet file(s) verl trains on (default: the --from plan's, else none).")] = None,
    val_files: Annotated[str | None, typer.Option(
        "--val-files", metavar="PATH[,PATH]", rich_help_panel=WORKLOAD_PANEL,
        help="data.val_files: validation parquet file(s).")] = None,
    from_plan: Annotated[str | None, typer.Option(
        "--from", metavar="PLAN", rich_help_panel=WORKLOAD_PANEL,
        help="Keep this plan's model and workload; solve the knobs.")] = None,
    objective: Annotated[str, typer.Option(
        "--objective", metavar=choices_metavar(OBJECTIVE_CHOICES), rich_help_panel=SOLVER_PANEL,
        autocompletion=completion(OBJECTIVE_CHOICES), help="What the solver optimizes.")] = "throughput",
    rollout: Annotated[str | None, typer.Option(
        "--rollout", metavar=choices_metavar(ROLLOUT_CHOICES), rich_help_panel=SOLVER_PANEL,
        autocompletion=completion(ROLLOUT_CHOICES),
        help="Rollout engine (auto: the better of both; default: the --from plan's engine, else vllm).")] = None,
    fix: Annotated[list[str] | None, typer.Option(
        "--fix", metavar="KEY=VALUE", rich_help_panel=SOLVER_PANEL,
        help="Pin a knob, e.g. actor.param_offload=true (repeatable).")] = None,
    profile: Annotated[str | None, typer.Option(
        "--profile", metavar="FILE", rich_help_panel=SOLVER_PANEL, help="Calibration profile TOML (`rlplan calibrate`).")] = None,
    headroom: Annotated[str | None, typer.Option(
        "--headroom", metavar="10%|4GiB|0", rich_help_panel=SOLVER_PANEL,
        help="GPU memory every phase must leave free: a share of the GPU or an amount (default: from the model's "
             "measured error, at least 5 %; docs/accuracy.md 1c).")] = None,
    verify: Annotated[bool, typer.Option(
        "--verify", rich_help_panel=SOLVER_PANEL,
        help="Measure the top candidates' training step with the CPU tracker (needs the runtime extra) and keep "
             "the first that fits.")] = False,
    output: Annotated[str | None, typer.Option(
        "-o", "--output", metavar="FILE", rich_help_panel=OUTPUT_PANEL, help="Where to write plan.toml.")] = None,
    json_output: Annotated[bool, typer.Option(
        "--json", rich_help_panel=OUTPUT_PANEL, help="Print one JSON object instead of tables.")] = False,
    quiet: Annotated[bool, typer.Option(
        "-q", "--quiet", rich_help_panel=OUTPUT_PANEL,
        help="Print only errors: no tables, notes or next step (the exit code and -o say the rest).")] = False,
    top: Annotated[int | None, typer.Option(
        "--top", metavar="N", rich_help_panel=OUTPUT_PANEL,
        help="Also list the N best candidates (knobs, peak GiB per phase, step time).")] = None,
    frontier: Annotated[str | None, typer.Option(
        "--frontier", metavar="FILE", rich_help_panel=OUTPUT_PANEL,
        help="Also draw every candidate priced (step time vs peak GiB per GPU) to this .html / .png / .svg; needs "
             "the charts extra.")] = None,
) -> None:
    """Solve every knob for a model, a cluster and a workload; write plan.toml.

    Example: rlplan solve --model qwen2.5-7b --gpus 8 --gpu h100-80g --prompt-len 1024 --response-len 2048
    --train-files ~/data/gsm8k/train.parquet -o plan.toml
    """
    from rlplan.planner.hardware import Cluster
    from rlplan.planner.plan import ModelSection
    from rlplan.planner.planfile import plan_from_toml, plan_to_toml
    from rlplan.planner.presets import custom_gpu, defaulted_speeds, parse_gpu_memory, resolve_gpu
    from rlplan.planner.report import solve_summary
    from rlplan.planner.solver import RUNNERS_UP, SolveRequest, request_margin, searched_knobs, solve_engines

    # A zero or negative count is a mistake, never a request for the default.
    for flag, value in (("--top", top), ("--gpus", gpus), ("--nodes", nodes), ("--gpus-per-node", gpus_per_node),
                        ("--train-batch-size", train_batch_size), ("--n", n),
                        ("--ppo-mini-batch-size", ppo_mini_batch_size), ("--prompt-len", prompt_len),
                        ("--response-len", response_len), ("--max-response-len", max_response_len),
                        ("--expected-prompt-len", expected_prompt_len), ("--expected-response-len", expected_response_len)):
        if value is not None and value < 1:
            raise PlanError(field=flag, message=f"must be >= 1, got {value}.", fix=f"pass a positive {flag} or leave "
                            "it out for the default")
    if frontier:
        from rlplan.planner.chart_commands import check_chart_path

        check_chart_path(frontier, "--frontier")
    # The plan -o writes may replace the --from plan (a re-solve in place); nothing else may replace an input.
    read = {"--profile": profile, "--model": local_config_path(model) if model else None}
    refuse_overwriting_inputs(output, "--output", read)
    refuse_overwriting_inputs(frontier, "--frontier", {**read, "--from": from_plan, "--output": output})
    from rlplan.planner.presets import parse_host_memory, typical_host_memory

    host_gib = parse_host_memory(host_mem)
    headroom_asked = parse_headroom(headroom)
    if device not in ("gpu", "cpu"):
        raise PlanError(field="--device", message=f"{device!r} is neither gpu nor cpu.",
                        fix="pass --device cpu to plan a run on this machine's CPU, or leave it out")
    on_cpu = device == "cpu" or (gpu is not None and gpu.strip().lower() == "cpu")
    if on_cpu and (gpu_mem is not None or (gpu is not None and gpu.strip().lower() != "cpu")):
        raise PlanError(field="--device", message="--device cpu is given with a GPU (--gpu / --gpu-mem).",
                        fix="leave out --gpu / --gpu-mem to plan the CPU, or --device cpu to plan the GPU")
    base = load_plan(from_plan) if from_plan else None
    if model is None and base is None:
        raise PlanError(field="--model", message="no model given.", fix="pass --model qwen2.5-7b (or --from plan.toml)")
    if base is not None and model is None:
        model_section = base.model
    else:
        assert model is not None
        resolved = resolve_model_arg(model)
        weightless = weightless_model_note(model)
        if weightless and not (json_output or quiet):
            make_console(stderr=True).print(f"note: {weightless}", markup=False)
        model_section = ModelSection(name=resolved.name, path=resolved.path, arch=resolved.arch)
    if gpu is not None and gpu_mem is not None:
        raise PlanError(field="--gpu-mem", message="both --gpu and --gpu-mem are given.", fix="pass only one")
    profile_loaded = load_profile(profile)
    cpu_note = ""
    host_note: str | None = None  # the host RAM figure assumed when --host-mem is not given
    if on_cpu:
        if nodes not in (None, 1):
            raise PlanError(field="--nodes", message=f"a CPU plan runs on this one machine, got {nodes} nodes.",
                            fix="leave out --nodes with --device cpu")
        ranks = gpus or gpus_per_node or 1
        try:
            cluster, rates = cpu_cluster(ranks, host_gib or this_machine_memory_gib() or 1024.0, profile_loaded)
        except PlanError as error:  # a CPU plan's "GPU" memory and host RAM are both --host-mem
            if host_gib is None or not error.field.startswith("cluster."):
                raise
            raise PlanError(field="--host-mem", message=error.message, fix="pass --host-mem in GiB, or leave it out "
                            "for this machine's MemTotal") from None
        gpu_spec = cluster.gpu
        cpu_note = f"CPU rates {rates.source}"
        if not (json_output or quiet):
            make_console(stderr=True).print(f"note: {cpu_note}.", markup=False)
    elif gpu is not None:
        gpu_spec = resolve_gpu(gpu)
    elif gpu_mem is not None:
        gpu_spec = custom_gpu(parse_gpu_memory(gpu_mem), bf16_tflops=gpu_tflops, hbm_gbps=gpu_bandwidth)
        if defaulted_speeds(gpu_tflops, gpu_bandwidth) and not (json_output or quiet):
            make_console(stderr=True).print(f"note: {defaulted_speeds(gpu_tflops, gpu_bandwidth)}.", markup=False)
    elif base is not None:
        gpu_spec = base.cluster.gpu
    else:
        raise PlanError(field="--gpu", message="no GPU given.", fix="pass --gpu h100-80g or --gpu-mem GiB")
    if on_cpu:
        pass  # cluster: this machine, built above
    elif gpus is None and base is not None and nodes is None and gpus_per_node is None:
        cluster = base.cluster if gpu is None and gpu_mem is None else base.cluster.__class__(
            gpu=gpu_spec, nodes=base.cluster.nodes, gpus_per_node=base.cluster.gpus_per_node,
            host_memory_gib=base.cluster.host_memory_gib if host_gib is None else host_gib)
    else:
        if gpus is None and (nodes is None or gpus_per_node is None):
            raise PlanError(field="--gpus", message="the GPU count is needed.", fix="pass --gpus 8")
        if gpus is not None and gpus < 1:
            raise PlanError(field="--gpus", message=f"must be >= 1, got {gpus}.", fix="pass --gpus 8")
        per_node = gpus_per_node or min(gpus or 8, 8)
        node_count = nodes or max(1, (gpus or per_node) // per_node)
        if gpus is not None and node_count * per_node != gpus:
            raise PlanError(field="--gpus", message=f"{gpus} GPUs is not nodes x gpus-per-node ({node_count} x {per_node}).",
                            fix=f"pass --gpus-per-node so that it divides {gpus}")
        assumed = None if host_gib is not None else typical_host_memory(gpu_spec, per_node)
        host_note = assumed.describe() if assumed else None
        try:
            cluster = Cluster(gpu=gpu_spec, nodes=node_count, gpus_per_node=per_node,
                              host_memory_gib=assumed.gib if assumed else host_gib)
        except PlanError as error:
            if error.field != "cluster.host_memory_gib":
                raise
            raise PlanError(field="--host-mem", message=error.message, fix="pass --host-mem in GiB per node") from None
    # Not given (None) keeps the --from plan's algorithm; "grpo" given keeps GRPO even over a PPO plan.
    algorithm = {"ppo": "gae"}.get((algo or "grpo").lower(), (algo or "grpo").lower())
    if algo is None and base is not None:
        algorithm = base.algorithm.adv_estimator
    if algorithm not in get_args(Algorithm):
        raise PlanError(field="--algo", message=f"unknown algorithm {algo!r}.",
                        fix=f"pass one of {', '.join(ALGO_CHOICES)}")
    if lora not in ("off", "auto") and not (lora.isascii() and lora.isdigit()):
        raise PlanError(field="--lora", message=f"{lora!r} is not off, auto or a rank.", fix="pass --lora 64")
    if rollout is not None and rollout not in ROLLOUT_CHOICES:
        raise PlanError(field="--rollout", message=f"{rollout!r} is not one of {', '.join(ROLLOUT_CHOICES)}.",
                        fix="pass --rollout vllm (the bundled runtime's engine), sglang or auto")
    pins = {**(CPU_RUNTIME_PINS if on_cpu else {}), **parse_fixes(fix or [])}
    if rollout is not None and "rollout.name" in pins:
        raise PlanError(field="--rollout", message="both --rollout and --fix rollout.name are given.",
                        fix="pass only --rollout")
    if objective not in OBJECTIVE_CHOICES:
        raise PlanError(field="--objective", message=f"{objective!r} is not one of {', '.join(OBJECTIVE_CHOICES)}.",
                        fix="pass --objective throughput")
    if base is not None:
        prompt_len = base.data.max_prompt_length if prompt_len is None else prompt_len
        if response_len is None and max_response_len is None:
            response_len = base.data.max_response_length
        train_batch_size = base.data.train_batch_size if train_batch_size is None else train_batch_size
        n = base.rollout.n if n is None else n
        if ppo_mini_batch_size is None:
            ppo_mini_batch_size = base.actor.ppo_mini_batch_size
    if prompt_len is None:
        raise PlanError(field="--prompt-len", message="the prompt length is needed.", fix="pass --prompt-len 1024")
    # A mean above its maximum is a mistake (validate and explain refuse it too), never silently capped.
    for flag, mean, maximum, limit in (("--expected-prompt-len", expected_prompt_len, prompt_len, "--prompt-len"),
                                       ("--expected-response-len", expected_response_len,
                                        response_len or max_response_len, "--response-len")):
        if mean is not None and maximum is not None and mean > maximum:
            raise PlanError(field=flag, message=f"is a mean length and cannot exceed {limit} {maximum}, got {mean}.",
                            fix=f"pass {flag} at most {maximum}, or leave it out (= the maximum)")
    request = SolveRequest(
        model=model_section, cluster=cluster, prompt_len=prompt_len, response_len=response_len,
        max_response_len=max_response_len, train_batch_size=256 if train_batch_size is None else train_batch_size,
        n=5 if n is None else n,
        algorithm=algorithm, ppo_mini_batch_size=ppo_mini_batch_size,
        lora=int(lora) if lora.isascii() and lora.isdigit() else lora, objective=objective, pins=pins,
        headroom=headroom_asked,
        base=base, profile=profile_loaded,
        expected_prompt_len=expected_prompt_len, expected_response_len=expected_response_len,
        train_files=_path_list("--train-files", train_files), val_files=_path_list("--val-files", val_files),
    )
    if rollout == "auto":
        engines: tuple[Any, ...] = ("vllm",) if on_cpu else ("vllm", "sglang")
    else:
        engines = (rollout or pins.get("rollout.name") or (base.rollout.name if base is not None else "vllm"),)
    if on_cpu and engines != ("vllm",):
        # The platform rule runtime_rolls_out_with_vllm would refuse the plan at `rlplan run`: say so now.
        raise PlanError(field="--rollout" if rollout else "rollout.name",
                        message=f"rlplan's CPU runtime runs vLLM rollouts only, not {engines[0]}; SGLang plans are "
                        "for verl on GPUs.", fix="leave out --rollout with --device cpu (vllm), or plan a GPU cluster")
    result = solve_engines(request, engines, keep=max(top or 0, RUNNERS_UP + 1), frontier=frontier is not None)
    if frontier:
        from rlplan.planner.chart_commands import frontier_chart_command

        frontier_chart_command(result, cluster.gpu.memory_gib, top or 0,
                               f"{model_section.name} on {cluster.nodes * cluster.gpus_per_node} x {cluster.gpu.name}",
                               frontier, margin_gib=request_margin(request).gib)
    ranked = [result.best, *result.runners_up][:top or 0] if result.best is not None else []
    top_rows = [{"rank": rank, "step_time_s": c.plan.prediction.step_time_s, "gpu_peak_gib": c.plan.prediction.gpu_peak_gib,
                 "phase_peak_gib": c.plan.prediction.phase_peak_gib, "knobs": searched_knobs(c.plan),
                 "phase_seconds": c.plan.prediction.phase_seconds,
                 "left_gib": round(cluster.gpu.memory_gib - c.plan.prediction.gpu_peak_gib, 3),
                 "headroom_gib": round(request_margin(request).gib, 3)}
                for rank, c in enumerate(ranked, start=1)]
    if result.best is None:
        assert result.diagnosis is not None
        if json_output:
            print(json.dumps({
                "feasible": False, "binding": result.diagnosis.binding, "message": result.diagnosis.message,
                "suggestions": [{"change": s.change, "detail": s.detail, "step_time_s": s.step_time_s,
                                 "gpus": s.gpus, "more_gpus": s.more_gpus} for s in result.diagnosis.suggestions],
                "evaluated": result.evaluated, "headroom_gib": round(request_margin(request).gib, 3),
                "host_memory_assumed": host_note,
            }, indent=2))
        else:
            from rich.markup import escape

            console = make_console(stderr=True)
            console.print(f"[bold red]no feasible plan[/] {escape(shorten(result.diagnosis.message, 4 * ECHO_LIMIT))}",
                          markup=True)
            if host_note:
                console.print(f"note: {host_note}; --host-mem sets it.", markup=False)
        raise typer.Exit(ExitCode.INFEASIBLE)
    plan = result.plan
    verification: list[dict[str, Any]] = []
    if verify:
        plan, verification = verify_candidates([result.best, *result.runners_up], request.profile,
                                               None if json_output or quiet else make_console())
        if plan is None:
            message = ("every candidate's measured training step exceeds the GPU once the planner's "
                       "non-tracked memory is added; the model under-predicts this workload")
            if json_output:
                print(json.dumps({"feasible": False, "message": message, "verification": verification}, indent=2))
            else:
                make_console(stderr=True).print(f"[bold red]no verified plan[/] {message}.", markup=True)
            raise typer.Exit(ExitCode.INFEASIBLE)
    # Everything that can fail runs before the plan is written, so a written plan means a finished solve.
    plan_text = plan_to_toml(plan)
    # Read back as `validate` will: a plan it would reject (a pin its strict reader refuses) is not written.
    plan_from_toml(plan_text, source="the solved plan")
    if json_output:
        from rlplan.planner.planfile import plan_to_dict
        from rlplan.planner.report import validation_json

        payload = validation_json(plan, request.profile, request.headroom)
        knobs = plan_to_dict(plan)
        knobs["model"].pop("arch", None)  # the architecture is an input, not a knob; --json stays readable
        knobs.pop("prediction", None)
        payload.update({"plan_file": output, "evaluated": result.evaluated, "feasible_candidates": result.feasible,
                        "plan": knobs})
        if top:
            payload["top"] = top_rows
        if cpu_note:
            payload["cpu_rates"] = cpu_note
        payload["host_memory_assumed"] = host_note
        if verify:
            payload["verification"] = verification
        report_text = json.dumps(payload, indent=2)
        if output:
            write_atomic(output, plan_text, "--output")
        print(report_text)
    elif quiet:
        if output:
            write_atomic(output, plan_text, "--output")
    else:
        renderables = list(solve_summary(plan, result, output, request.profile, request.headroom, host_note))
        if top:
            from rlplan.planner.report import top_candidates_table

            renderables.append(top_candidates_table(top_rows))
        if output:
            write_atomic(output, plan_text, "--output")
        console = make_console()
        for renderable in renderables:
            console.print(renderable)
        console.print(solve_next_step(output, on_cpu), markup=False, highlight=False, soft_wrap=True)


def solve_next_step(output: str | None, on_cpu: bool) -> str:
    """What to run after a solve: write the plan, or launch it (the CPU runtime here, else verl)."""
    import shlex

    if not output:
        return "(plan not written: pass -o plan.toml)"
    plan = shlex.quote(output)
    if on_cpu:
        return f"Next: rlplan explain {plan}   then   rlplan run {plan}"
    return f"Next: rlplan explain {plan}   then   rlplan render {plan} --target verl -o run.sh"


def verify_candidates(candidates, profile, console) -> tuple[Any, list[dict[str, Any]]]:
    """Measure the actor update of each candidate, best first; keep the first whose measured peak fits.

    The tracker sees what the step allocates; the planner's resident state and overheads
    (CUDA context, fragmentation, a sleeping vLLM) are added to it unchanged.
    """
    from rlplan.planner.phases import Phase
    from rlplan.runtime.measure import measure_plan

    rows: list[dict[str, Any]] = []
    chosen = None
    for rank, candidate in enumerate(candidates, start=1):
        if console is not None:
            console.print(f"verifying candidate {rank}/{len(candidates)} with the CPU tracker ...")
        # The head verl runs for the candidate, so the measured step replaces its own predicted step.
        comparison = measure_plan(candidate.plan, Phase.ACTOR_UPDATE, profile, head="auto")
        phase = next(p for p in candidate.memory.phases if p.name == comparison.planner_phase)
        measured_total = phase.peak_bytes - comparison.predicted_bytes + comparison.measured.peak_bytes
        fits = measured_total <= candidate.memory.gpu_capacity_bytes
        rows.append({
            "rank": rank,
            "predicted_step_gib": round(comparison.predicted_bytes / 2**30, 3),
            "measured_step_gib": round(comparison.measured.peak_bytes / 2**30, 3),
            "error": round(comparison.error, 4),
            "measured_phase_peak_gib": round(measured_total / 2**30, 3),
            "fits": fits,
        })
        if console is not None:
            console.print(f"  predicted {rows[-1]['predicted_step_gib']:.2f} GiB, measured "
                          f"{rows[-1]['measured_step_gib']:.2f} GiB ({100 * comparison.error:+.1f} %): "
                          f"{'fits' if fits else 'does NOT fit'}")
        if fits:
            chosen = candidate.plan
            break
    return chosen, rows


# --- validate / explain ----------------------------------------------------------------


def plan_with_profile(plan_path: str, profile_path: str | None, prompt: int | None, response: int | None):
    """The plan at PLAN and the profile, with the --expected-*-len flags (or the profile's observed means)
    applied: what validate and explain price."""
    profile = load_profile(profile_path)
    return with_expected_lengths(load_plan(plan_path), prompt, response, profile), profile


@app.command()
@guarded
def validate(
    plan_path: Annotated[str, typer.Argument(metavar="PLAN", help="plan.toml to check.")],
    json_output: JsonOutput = False,
    profile: ProfileOption = None,
    expected_prompt_len: ExpectedPromptLen = None,
    expected_response_len: ExpectedResponseLen = None,
    headroom: HeadroomOption = None,
) -> None:
    """Check a plan against verl's rules and the memory model. Exit 0 ok, 1 predicted OOM, 2 invalid.

    A plan that fits but leaves less than the margin (--headroom) gets a warning, not an error.

    Example: rlplan validate plan.toml --json
    """
    from rlplan.planner.report import fit_fix, validation_json, validation_tables

    plan, prof = plan_with_profile(plan_path, profile, expected_prompt_len, expected_response_len)
    payload = validation_json(plan, prof, parse_headroom(headroom))
    if payload["valid"] and not payload["feasible"]:
        payload["fix"] = fit_fix(plan, prof, plan_path)
    if json_output:
        print(json.dumps(payload, indent=2))
    else:
        console = make_console()
        for renderable in validation_tables(plan, prof, payload):
            console.print(renderable)
    if not payload["valid"]:
        raise typer.Exit(ExitCode.BAD_INPUT)
    if not payload["feasible"]:
        raise typer.Exit(ExitCode.INFEASIBLE)


@app.command()
@guarded
def explain(
    plan_path: Annotated[str, typer.Argument(metavar="PLAN", help="plan.toml to explain.")],
    json_output: JsonOutput = False,
    profile: ProfileOption = None,
    expected_prompt_len: ExpectedPromptLen = None,
    expected_response_len: ExpectedResponseLen = None,
    chart: Annotated[str | None, typer.Option("--chart", help="Also draw memory per phase and host RAM to this "
                                              ".html / .png / .svg; needs the charts extra.")] = None,
    headroom: HeadroomOption = None,
) -> None:
    """Per-phase, per-component memory table, the batch layout and the step-time estimate.

    Example: rlplan explain plan.toml --chart memory.html
    """
    from rlplan.planner.report import explain_tables, validation_json

    if chart:
        from rlplan.planner.chart_commands import check_chart_path

        check_chart_path(chart, "--chart")
        refuse_overwriting_inputs(chart, "--chart", {"PLAN": plan_path, "--profile": profile})
    plan, prof = plan_with_profile(plan_path, profile, expected_prompt_len, expected_response_len)
    if chart:
        from rlplan.planner.chart_commands import memory_chart_command

        memory_chart_command(plan, prof, chart, parse_headroom(headroom))
    if json_output:
        print(json.dumps(validation_json(plan, prof, parse_headroom(headroom)), indent=2))
        return
    console = make_console()
    for renderable in explain_tables(plan, prof, parse_headroom(headroom)):
        console.print(renderable)


@app.command()
@guarded
def presets(
    kind: Annotated[str, typer.Argument(metavar="models|gpus", autocompletion=completion(PRESET_KINDS),
                                        help="What to list: models or gpus.")],
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the built-in model architectures or GPUs.

    Example: rlplan presets gpus --json
    """
    from rlplan.planner.report import preset_table, presets_json

    if kind not in PRESET_KINDS:
        raise PlanError(field="presets", message=f"{kind!r} is not models or gpus.", fix="run `rlplan presets models`")
    if json_output:
        print(json.dumps(presets_json(kind), indent=2))
    else:
        make_console().print(preset_table(kind))


@app.command()
@guarded
def schema(
    output: Annotated[str | None, typer.Option("-o", "--output", metavar="FILE",
                                               help="File to write (default: stdout).")] = None,
) -> None:
    """Print the JSON Schema (draft 2020-12) of plan.toml, for TOML editors and scripts.

    Written plans start with `#:schema ./plan.schema.json`: write the schema there and taplo / Even Better TOML
    validate and complete the plan's keys.

    Example: rlplan schema -o plan.schema.json
    """
    from rlplan.planner.plan_schema import plan_json_schema

    text = json.dumps(plan_json_schema(), indent=2) + "\n"
    if output is None:
        print(text, end="")
    else:
        write_atomic(output, text, "--output")
        make_console(stderr=True).print(f"wrote {output}", markup=False)


@app.command()
@guarded
def report(
    run_dir: Annotated[str, typer.Argument(metavar="RUN_DIR", help="A run's output directory (metrics.jsonl, plan.toml).")],
    output: Annotated[str | None, typer.Option("-o", "--output", help="Chart to write: .html, .png or .svg "
                                               "(default: RUN_DIR/report.html, beside the run).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object (chart written, metrics file, "
                                              "steps) or the error.")] = False,
) -> None:
    """Draw a run, finished or still running: reward, KL, entropy, lengths, sync gap, phase times, memory.

    Example: rlplan report runs/demo -o report.html
    """
    from rlplan.planner.chart_commands import check_chart_path, report_command, report_summary

    output = output or os.path.join(run_dir, "report.html")  # beside the run, never silently into the cwd
    check_chart_path(output, "-o")
    drawn = report_command(run_dir, output)
    if json_output:
        print_json(drawn)
    else:
        make_console(soft_wrap=True).print(report_summary(drawn), markup=False)


# --- runtime commands (heavy imports inside) --------------------------------------------


@app.command()
@guarded
def run(
    plan_path: Annotated[str, typer.Argument(metavar="PLAN", help="plan.toml to run.")],
    resume: Annotated[bool, typer.Option(help="Continue from the newest complete checkpoint.")] = False,
    address: Annotated[str | None, typer.Option(help="Ray cluster address (default: $RAY_ADDRESS or a local one).")] = None,
    output_dir: Annotated[str | None, typer.Option("--output-dir", help="Overrides trainer.output_dir.")] = None,
    max_steps: Annotated[int | None, typer.Option("--max-steps", help="Stop after this many steps.")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Log to stderr; print one JSON object (steps, "
                                              "metrics file, plan versus actual, or the error) on stdout.")] = False,
) -> None:
    """Run a plan with the bundled runtime (FSDP2 + vLLM + Ray).

    Example: rlplan run plan.toml --max-steps 10
    """
    plan = load_plan(plan_path)
    if plan.rollout.name != "vllm":
        # The platform rule runtime_rolls_out_with_vllm, said before the runtime (perhaps not installed) loads.
        raise PlanError(field="rollout.name", message=f"is {plan.rollout.name}; the bundled runtime runs vLLM "
                        "rollouts only.", fix="render the plan for verl (rlplan render PLAN --target verl), or re-solve "
                        "with --rollout vllm to run it here")
    from rlplan.runtime.commands import run_command

    raise typer.Exit(run_command(plan_path, resume=resume, address=address or os.environ.get("RAY_ADDRESS"),
                                 output_dir=output_dir, max_steps=max_steps, as_json=json_output))


@app.command()
@guarded
def demo(
    output_dir: Annotated[str, typer.Option("--output-dir", help="Where the model, data and run go.")] = "runs/demo",
    steps: Annotated[int, typer.Option(help="RL steps to run.")] = 12,
    json_output: Annotated[bool, typer.Option("--json", help="Log to stderr; print one JSON object on stdout.")] = False,
) -> None:
    """CPU demo: build the bundled tiny model and toy task, solve a plan for this machine, run it.

    Example: rlplan demo --steps 12
    """
    from rlplan.runtime.commands import demo_command

    raise typer.Exit(demo_command(output_dir, steps, as_json=json_output))


@app.command()
@guarded
def measure(
    plan_path: Annotated[str, typer.Argument(metavar="PLAN", help="plan.toml to measure.")],
    phase: Annotated[str, typer.Option(
        "--phase", metavar=choices_metavar(MEASURE_PHASES), autocompletion=completion(MEASURE_PHASES),
        help="The pass to measure: the actor update or a log-prob pass.")] = "update",
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    head: Annotated[str, typer.Option(
        "--head", metavar="HEAD", autocompletion=completion(MEASURE_HEADS),
        help="Loss head to measure: runtime (rlplan's bundled runtime, chunked), auto (what verl runs for the "
             "plan), flash_attn_ce, torch_logprob, fused, chunked or naive.")] = "runtime",
) -> None:
    """Emulate the plan's training step on the CPU (FSDP2 + fake tensors) and compare with the prediction.

    verl's GPU heads are measured through memory twins that allocate and save what the GPU kernel does;
    a compiled entropy (actor.use_torch_compile) through a twin of inductor's fused kernels.

    Example: rlplan measure plan.toml --phase update --head flash_attn_ce
    """
    from rlplan.runtime.measure import measure_command

    if phase not in MEASURE_PHASES:
        raise PlanError(field="--phase", message=f"{phase!r} is not update or logprob.", fix="pass --phase update")
    if head not in MEASURE_HEADS:
        raise PlanError(field="--head", message=f"{head!r} is not a loss head.",
                        fix=f"pass one of {', '.join(MEASURE_HEADS)}")
    raise typer.Exit(measure_command(plan_path, phase, json_output, None if head == "runtime" else head))


@app.command()
@guarded
def calibrate(
    plan_path: Annotated[str | None, typer.Argument(metavar="[PLAN]", help="plan.toml to run a short real step of.")] = None,
    from_run: Annotated[str | None, typer.Option("--from-run", help="A finished run's metrics.jsonl.")] = None,
    output: Annotated[str, typer.Option("-o", "--output", help="Profile TOML to write.")] = "profile.toml",
    cpu: Annotated[bool, typer.Option("--cpu", help="Measure this machine's fp32 matmul FLOP/s and memory "
                                      "bandwidth (what `solve --device cpu` prices), with or without a plan.")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object (profile file, changed "
                                              "constants, notes, or the error).")] = False,
    from_verl_log: Annotated[list[str] | None, typer.Option(
        "--from-verl-log", help="A verl run's console log or file-logger JSON lines (repeatable); no torch needed.")] = None,
    plan: Annotated[list[str] | None, typer.Option(
        "--plan", help="The plan.toml or verl launch script each --from-verl-log ran (repeatable, same order).")] = None,
    gpu: Annotated[str | None, typer.Option(help="GPU preset a launch-script --plan ran on.")] = None,
    gpu_mem: Annotated[str | None, typer.Option("--gpu-mem", help="GPU memory of a launch-script --plan.")] = None,
    verl_version: Annotated[str | None, typer.Option("--verl-version", help="verl version of the logs (default: "
                                                     "read from their metric names).")] = None,
    fix: Annotated[list[str] | None, typer.Option("--fix", help="Pin a key of every --plan (with --from-verl-log), "
                                                  "e.g. rollout.enforce_eager=true.")] = None,
) -> None:
    """Fit a calibration profile on a GPU, from a finished run's plan-vs-actual records, from verl logs, or
    measure this CPU.

    Example: rlplan calibrate --from-verl-log run.log --plan run.sh --gpu h100-80g -o profile.toml
    """
    if from_verl_log:
        from rlplan.planner.compare_commands import calibrate_verl_command

        plans = list(plan or []) + ([plan_path] if plan_path else [])
        raise typer.Exit(calibrate_verl_command(from_verl_log, plans, output, gpu=gpu, gpu_mem=gpu_mem,
                                                host_mem=1024.0, env=[], fixes=parse_fixes(fix or []),
                                                verl_version=verl_version, as_json=json_output))
    from rlplan.runtime.commands import calibrate_command, calibrate_cpu_command

    if cpu:
        raise typer.Exit(calibrate_cpu_command(output, as_json=json_output))
    if plan_path is None and from_run is None:
        raise PlanError(field="calibrate", message="needs a plan or --from-run.", fix="pass plan.toml or --from-run FILE")
    raise typer.Exit(calibrate_command(plan_path, from_run, output, as_json=json_output))


@app.command()
@guarded
def compare(
    plan_path: Annotated[str, typer.Argument(metavar="PLAN_OR_SCRIPT", help="plan.toml, or the run's verl launch "
                                             "script (imported as `rlplan import verl` does).")],
    log_path: Annotated[str, typer.Argument(metavar="VERL_LOG", help="The run's console log (`step:N - ...` lines) "
                                            "or its file logger's JSON lines; a run still writing is fine.")],
    gpu: Annotated[str | None, typer.Option(help="GPU preset a launch script ran on.")] = None,
    gpu_mem: Annotated[str | None, typer.Option("--gpu-mem", help="GPU memory of a launch script's GPU.")] = None,
    host_mem: Annotated[float, typer.Option("--host-mem", help="Host RAM per node in GiB (launch script).")] = 1024.0,
    env: Annotated[list[str] | None, typer.Option("--env", help="KEY=VALUE for the script's shell variables.")] = None,
    fix: Annotated[list[str] | None, typer.Option("--fix", help="Pin a plan key the log shows differently "
                                                  "(e.g. rollout.enforce_eager=true); repeatable.")] = None,
    profile: ProfileOption = None,
    verl_version: Annotated[str | None, typer.Option("--verl-version", help="verl version that wrote the log "
                                                     "(default: read from its metric names).")] = None,
    chart: Annotated[str | None, typer.Option("--chart", help="Also draw measured vs predicted and the length trend "
                                              "to this .html / .png / .svg; needs the charts extra.")] = None,
    json_output: JsonOutput = False,
) -> None:
    """Hold a plan against a verl run: memory and time per phase at the run's lengths, and the length trend.
    Exit 1 when a measured memory figure exceeds the prediction by more than the model's error band.

    Example: rlplan compare run_qwen2_7b.sh verl.log --gpu h100-80g
    """
    from rlplan.planner.compare_commands import compare_command

    raise typer.Exit(compare_command(plan_path, log_path, gpu=gpu, gpu_mem=gpu_mem, host_mem=host_mem, env=env or [],
                                     fixes=parse_fixes(fix or []), profile_path=profile, verl_version=verl_version,
                                     chart=chart, as_json=json_output))


# --- interop -------------------------------------------------------------------------


@import_app.command("verl")
@guarded
def import_verl(
    script: Annotated[str, typer.Argument(help="verl launch script or a file of Hydra overrides.")],
    gpu: Annotated[str | None, typer.Option(help="GPU preset the script runs on.")] = None,
    gpu_mem: Annotated[str | None, typer.Option("--gpu-mem", help="GPU memory instead of a preset: GiB, or with a "
                                                "unit (80GB, 81559MiB).")] = None,
    host_mem: Annotated[str | None, typer.Option(
        "--host-mem", help="Host RAM per node: GiB or with a unit (512GiB); default: the GPU's typical node, said "
                           "as a warning.")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", help="KEY=VALUE for shell variables (repeatable).")] = None,
    output: Annotated[str | None, typer.Option("-o", "--output", help="Where to write plan.toml.")] = None,
    expected_prompt_len: ExpectedPromptLen = None,
    expected_response_len: ExpectedResponseLen = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object: output path, warnings, and "
                                              "the plan's TOML when there is no -o.")] = False,
) -> None:
    """Import a verl launch script (python3 -m verl.trainer.main_ppo ...) into a plan.

    Example: rlplan import verl run_qwen2_7b.sh --gpu h100-80g -o plan.toml
    """
    from rlplan.planner.interop_commands import import_command

    raise typer.Exit(import_command(script, gpu=gpu, gpu_mem=gpu_mem, host_mem=host_mem, env=env or [],
                                    output=output, expected_lengths=(expected_prompt_len, expected_response_len),
                                    as_json=json_output))


@app.command()
@guarded
def render(
    plan_path: Annotated[str, typer.Argument(metavar="PLAN", help="plan.toml to render.")],
    target: Annotated[str, typer.Option(
        "--target", metavar=choices_metavar(RENDER_TARGETS), autocompletion=completion(RENDER_TARGETS),
        help="What to write: a verl launch script, a SLURM script or a Ray job.")] = "verl",
    fmt: Annotated[str, typer.Option(
        "--format", metavar=choices_metavar(RENDER_FORMATS), autocompletion=completion(RENDER_FORMATS),
        help="A script, or verl's Hydra overrides one per line (verl only).")] = "script",
    output: Annotated[str | None, typer.Option("-o", "--output", metavar="FILE",
                                               help="File to write (default: stdout).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object: output path, target, format, "
                                              "and the text when there is no -o.")] = False,
) -> None:
    """Render a plan as a verl launch script, Hydra overrides, a SLURM script or a Ray job.

    Example: rlplan render plan.toml --target verl -o run.sh
    """
    from rlplan.planner.interop_commands import render_command

    raise typer.Exit(render_command(plan_path, target=target, fmt=fmt, output=output, as_json=json_output))


def version_callback(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"rlplan {version('rlplan')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            print("rlplan (not installed: no version metadata)")
        raise typer.Exit(ExitCode.OK)


@app.callback()
def root(
    show_version: Annotated[bool, typer.Option("--version", callback=version_callback, is_eager=True,
                                               help="Print the installed version and exit.")] = False,
) -> None:
    """Solve, validate, explain and run RL fine-tuning launch plans (PPO/GRPO, FSDP2 + vLLM).

    Example: rlplan solve --model qwen2.5-7b --gpus 8 --gpu h100-80g -o plan.toml
    """


def main() -> None:
    try:
        try:
            app()
        finally:
            sys.stdout.flush()  # here, so a reader that went away is seen now and not at interpreter exit
    except SystemExit as exc:
        # click reports usage errors with exit 2 already; keep every code as is.
        sys.exit(exc.code)
    except BrokenPipeError:
        sys.exit(closed_stdout())
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(ExitCode.INTERRUPTED)


if __name__ == "__main__":
    main()

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

# No `from __future__ import annotations` here: typer reads every command's signature at each start, and string
# annotations would be compiled and evaluated one by one on every run (about 30 ms of each `rlplan solve`).
import json
import os
import sys
from typing import Annotated, Any, NoReturn, get_args

import typer
from typer.core import TyperGroup

from rlplan.planner.commands import solve_commands as steps
from rlplan.planner.commands.commands_io import (
    RUNTIME_INSTALL,
    ExitCode,
    closed_stdout,
    error_json,
    load_plan,
    load_profile,
    make_console,
    print_json,
    refuse_overwriting_inputs,
    refuse_read_only_output,
    report_error,
    write_atomic,
)
from rlplan.planner.commands.solve_commands import (
    ALGO_CHOICES,
    OBJECTIVE_CHOICES,
    ROLLOUT_CHOICES,
    parse_fixes,
)
from rlplan.planner.errors import PlanError, shorten
from rlplan.planner.knobs import with_expected_lengths
from rlplan.planner.model_error import parse_headroom
from rlplan.planner.plan import LossHead
from rlplan.planner.render import Format, Target

# Choices of the fixed-set options, taken from the plan's Literals so --help and validation cannot drift from them
# (solve's are solve_commands.py's, which checks them).
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
def expected_len_option(part: str, *, metavar: str | None = None, panel: str | None = None) -> Any:
    """--expected-prompt-len / --expected-response-len: solve shows them in its Workload panel as TOKENS."""
    return typer.Option(f"--expected-{part}-len", metavar=metavar, rich_help_panel=panel,
                        help=f"Mean {part} tokens of the data (default: the max).")


def headroom_option(*, panel: str | None = None) -> Any:
    return typer.Option("--headroom", metavar="10%|4GiB|0", rich_help_panel=panel,
                        help="The margin: GPU memory every phase must leave free, a share of the GPU or an amount "
                             "(default: from the model's measured error, at least 5 %; docs/accuracy.md 1c).")


def plan_output_option(*, metavar: str | None = None, panel: str | None = None) -> Any:
    return typer.Option("-o", "--output", metavar=metavar, rich_help_panel=panel, help="Where to write plan.toml.")


ExpectedPromptLen = Annotated[int | None, expected_len_option("prompt")]
ExpectedResponseLen = Annotated[int | None, expected_len_option("response")]
ProfileOption = Annotated[str | None, typer.Option("--profile", metavar="FILE", help="Calibration profile TOML.")]
HeadroomOption = Annotated[str | None, headroom_option()]
PlanOutput = Annotated[str | None, plan_output_option()]
JsonOutput = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
# Every command that writes a file the user names: an existing read-only file is kept unless this is given.
ForceOutput = Annotated[bool, typer.Option("--force", help="Replace the output file even if it is read-only.")]
# The target stack (planner/stack.py): the versions the plan is for; they select version-dependent defaults, rules
# and memory. Left out: the plan's own [stack], else the default (`rlplan --version`).
STACK_PANEL = "Stack"
VerlVersion = Annotated[str | None, typer.Option(
    "--verl-version", metavar="X.Y.Z", rich_help_panel=STACK_PANEL,
    help="verl version the run uses (default: the plan's stack; rlplan --version shows the default stack).")]
VllmVersion = Annotated[str | None, typer.Option(
    "--vllm-version", metavar="X.Y.Z", rich_help_panel=STACK_PANEL, help="vLLM version (vLLM rollouts only).")]
SglangVersion = Annotated[str | None, typer.Option(
    "--sglang-version", metavar="X.Y.Z", rich_help_panel=STACK_PANEL, help="SGLang version (SGLang rollouts only).")]

def asks_for_json(args: list[str]) -> bool:
    """Whether a command line asks for --json (before a `--`, after which words are values)."""
    return "--json" in (args[:args.index("--")] if "--" in args else args)


# click's exceptions, wherever this typer takes click from (typer >= 0.23 carries its own copy, `typer._click`).
CLICK_EXCEPTIONS = sys.modules[typer.BadParameter.__module__]


def usage_error(error: Exception, command: str) -> PlanError:
    """click's usage error (an option's bad value, an unknown option, a missing argument) as bad input naming
    the option or argument, with the command's --help as the fix."""
    context = getattr(error, "ctx", None)
    command = context.command_path if context is not None else command
    param = getattr(error, "param", None)
    named = (param.opts[0] if getattr(param, "param_type_name", "") == "option" else param.human_readable_name) \
        if param is not None else None
    field = getattr(error, "option_name", None) or named or command
    return PlanError(field=field, message=getattr(error, "format_message", error.__str__)(),
                     fix=f"see `{command} --help`")


class RlplanGroup(TyperGroup):
    """The root command group: with --json, a usage error click finds while parsing (`--gpus 2.5`, an unknown
    option, a missing argument) is one JSON object on stdout and exit 2, as every other error; without it,
    click's own message on stderr."""

    def main(self, args: Any = None, *more: Any, **kwargs: Any) -> Any:
        words = list(sys.argv[1:] if args is None else args)
        if not asks_for_json(words):
            return super().main(words, *more, **kwargs)
        try:
            # Not standalone, so click raises its usage errors here rather than printing them; it then returns
            # the exit code a command raised (typer.Exit) instead of exiting with it.
            code = super().main(words, *more, **{**kwargs, "standalone_mode": False})
        except CLICK_EXCEPTIONS.ClickException as error:
            code = report_error(usage_error(error, self.command_path_of(words)), as_json=True)
        except CLICK_EXCEPTIONS.Abort:
            code = ExitCode.INTERRUPTED
        sys.exit(code if isinstance(code, int) else ExitCode.OK)

    def command_path_of(self, words: list[str]) -> str:
        """`rlplan` and the (sub)command names the words start with: the command an error names when click's
        error does not carry its context."""
        path, command = ["rlplan"], self
        for word in words:
            sub = getattr(command, "commands", {}).get(word)
            if sub is None:
                break
            path.append(word)
            command = sub
        return " ".join(path)


app = typer.Typer(
    name="rlplan",
    cls=RlplanGroup,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings=HELP_OPTION_NAMES,
)
import_app = typer.Typer(help="Import a launch script of another framework into a plan.", no_args_is_help=True,
                         context_settings=HELP_OPTION_NAMES)
app.add_typer(import_app, name="import")


def fail(error: PlanError, *, as_json: bool = False) -> NoReturn:
    raise typer.Exit(report_error(error, as_json=as_json))


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

# solve's options, in the order `rlplan solve --help` shows them.
ModelFlag = Annotated[str | None, typer.Option(
    "--model", metavar="NAME|DIR", rich_help_panel=MODEL_PANEL,
    help="Preset name, Hugging Face repo id, or local config.json / dir. Required unless --from.")]
LoraFlag = Annotated[str, typer.Option(
    "--lora", metavar="off|auto|RANK", rich_help_panel=MODEL_PANEL,
    autocompletion=completion(("off", "auto", "8", "16", "32", "64")),
    help="LoRA adapters: off (full fine-tuning), auto (the solver's choice) or a rank.")]
GpusFlag = Annotated[int | None, typer.Option(
    "--gpus", metavar="N", rich_help_panel=CLUSTER_PANEL, help="Total number of GPUs.")]
GpuFlag = Annotated[str | None, typer.Option(
    "--gpu", metavar="NAME", rich_help_panel=CLUSTER_PANEL, autocompletion=complete_gpu_presets,
    help="GPU preset, e.g. h100-80g (`rlplan presets gpus`). Required unless --gpu-mem, --device cpu or --from.")]
GpuMemFlag = Annotated[str | None, typer.Option(
    "--gpu-mem", metavar="GIB", rich_help_panel=CLUSTER_PANEL,
    help="GPU memory for a GPU without a preset: GiB, or with a unit (80GB, 81559MiB).")]
GpuTflopsFlag = Annotated[float | None, typer.Option(
    "--gpu-tflops", metavar="TFLOPS", rich_help_panel=CLUSTER_PANEL, help="Dense BF16 TFLOPS of a --gpu-mem GPU.")]
GpuBandwidthFlag = Annotated[float | None, typer.Option(
    "--gpu-bandwidth", metavar="GB/S", rich_help_panel=CLUSTER_PANEL, help="Memory bandwidth of a --gpu-mem GPU, GB/s.")]
NodesFlag = Annotated[int | None, typer.Option(
    "--nodes", metavar="N", rich_help_panel=CLUSTER_PANEL, help="Number of nodes (default: gpus / gpus-per-node).")]
GpusPerNodeFlag = Annotated[int | None, typer.Option(
    "--gpus-per-node", metavar="N", rich_help_panel=CLUSTER_PANEL, help="GPUs per node (default: min(gpus, 8)).")]
HostMemFlag = Annotated[str | None, typer.Option(
    "--host-mem", metavar="GIB", rich_help_panel=CLUSTER_PANEL,
    help="Host RAM per node: GiB or with a unit (512GiB); default: the GPU's typical node (`rlplan presets gpus`), "
         "with --device cpu this machine's MemTotal.")]
DeviceFlag = Annotated[str, typer.Option(
    "--device", metavar="gpu|cpu", rich_help_panel=CLUSTER_PANEL, autocompletion=completion(("gpu", "cpu")),
    help="cpu: plan rlplan's CPU runtime on this machine (--gpus is then its trainer ranks, default 1); the same as "
         "--gpu cpu.")]
AlgoFlag = Annotated[str | None, typer.Option(
    "--algo", metavar="ALGO", rich_help_panel=WORKLOAD_PANEL, autocompletion=completion(ALGO_CHOICES),
    help=f"Algorithm: {', '.join(ALGO_CHOICES)} (ppo is gae + critic; default: the --from plan's, else grpo).")]
PromptLenFlag = Annotated[int | None, typer.Option(
    "--prompt-len", metavar="TOKENS", rich_help_panel=WORKLOAD_PANEL, help="Max prompt tokens. Required unless --from.")]
ResponseLenFlag = Annotated[int | None, typer.Option(
    "--response-len", metavar="TOKENS", rich_help_panel=WORKLOAD_PANEL, help="Max response tokens.")]
MaxResponseLenFlag = Annotated[int | None, typer.Option(
    "--max-response-len", metavar="TOKENS", rich_help_panel=WORKLOAD_PANEL,
    help="Find the longest response up to this that fits.")]
TrainBatchSizeFlag = Annotated[int | None, typer.Option(
    "--train-batch-size", metavar="PROMPTS", rich_help_panel=WORKLOAD_PANEL, help="Prompts per step (default 256).")]
ResponsesPerPromptFlag = Annotated[int | None, typer.Option(
    "--n", metavar="N", rich_help_panel=WORKLOAD_PANEL, help="Responses per prompt (rollout.n, default 5).")]
PpoMiniBatchSizeFlag = Annotated[int | None, typer.Option(
    "--ppo-mini-batch-size", metavar="PROMPTS", rich_help_panel=WORKLOAD_PANEL, help="Prompts per optimizer step.")]
SolveExpectedPromptLen = Annotated[int | None, expected_len_option("prompt", metavar="TOKENS",
                                                                   panel=WORKLOAD_PANEL)]
SolveExpectedResponseLen = Annotated[int | None, expected_len_option("response", metavar="TOKENS",
                                                                     panel=WORKLOAD_PANEL)]
TrainFilesFlag = Annotated[str | None, typer.Option(
    "--train-files", metavar="PATH[,PATH]", rich_help_panel=WORKLOAD_PANEL,
    help="data.train_files: the parquet file(s) verl trains on (default: the --from plan's, else none).")]
ValFilesFlag = Annotated[str | None, typer.Option(
    "--val-files", metavar="PATH[,PATH]", rich_help_panel=WORKLOAD_PANEL,
    help="data.val_files: validation parquet file(s).")]
FromPlanFlag = Annotated[str | None, typer.Option(
    "--from", metavar="PLAN", rich_help_panel=WORKLOAD_PANEL, help="Keep this plan's model and workload; solve the "
    "knobs.")]
ObjectiveFlag = Annotated[str, typer.Option(
    "--objective", metavar=choices_metavar(OBJECTIVE_CHOICES), rich_help_panel=SOLVER_PANEL,
    autocompletion=completion(OBJECTIVE_CHOICES), help="What the solver optimizes.")]
RolloutFlag = Annotated[str | None, typer.Option(
    "--rollout", metavar=choices_metavar(ROLLOUT_CHOICES), rich_help_panel=SOLVER_PANEL,
    autocompletion=completion(ROLLOUT_CHOICES),
    help="Rollout engine (auto: the better of vllm and sglang; trtllm only when named; default: the --from plan's "
         "engine, else vllm).")]
StrategyFlag = Annotated[str | None, typer.Option(
    "--strategy", metavar=choices_metavar(steps.STRATEGY_CHOICES), rich_help_panel=SOLVER_PANEL,
    autocompletion=completion(steps.STRATEGY_CHOICES),
    help="Training backend: fsdp, megatron (TP/PP/CP/EP searched) or auto (the faster of both; default: the --from "
         "plan's, else fsdp).")]
SolveFixFlag = Annotated[list[str] | None, typer.Option(
    "--fix", metavar="KEY=VALUE", rich_help_panel=SOLVER_PANEL,
    help="Pin a knob, e.g. actor.param_offload=true (repeatable).")]
SolveProfile = Annotated[str | None, typer.Option(
    "--profile", metavar="FILE", rich_help_panel=SOLVER_PANEL, help="Calibration profile TOML (`rlplan calibrate`).")]
SolveHeadroom = Annotated[str | None, headroom_option(panel=SOLVER_PANEL)]
VerifyFlag = Annotated[bool, typer.Option(
    "--verify", rich_help_panel=SOLVER_PANEL,
    help="Measure the top candidates' training step with the CPU tracker (needs the runtime extra) and keep the "
         "first that fits.")]
SolvePlanOutput = Annotated[str | None, plan_output_option(metavar="FILE", panel=OUTPUT_PANEL)]
SolveForce = Annotated[bool, typer.Option(
    "--force", rich_help_panel=OUTPUT_PANEL, help="Replace -o / --frontier even if the file is read-only.")]
SolveJsonOutput = Annotated[bool, typer.Option(
    "--json", rich_help_panel=OUTPUT_PANEL, help="Print one JSON object instead of tables.")]
QuietFlag = Annotated[bool, typer.Option(
    "-q", "--quiet", rich_help_panel=OUTPUT_PANEL,
    help="Print only errors: no tables, notes or next step (the exit code and -o say the rest).")]
TopFlag = Annotated[int | None, typer.Option(
    "--top", metavar="N", rich_help_panel=OUTPUT_PANEL,
    help="Also list the N best candidates (knobs, peak GiB per phase, step time).")]
FrontierFlag = Annotated[str | None, typer.Option(
    "--frontier", metavar="FILE", rich_help_panel=OUTPUT_PANEL,
    help="Also draw every candidate priced (step time vs peak GiB per GPU) to this .html / .png / .svg; needs the "
         "charts extra.")]


@app.command()
@guarded
def solve(
    model: ModelFlag = None,
    lora: LoraFlag = "auto",
    gpus: GpusFlag = None,
    gpu: GpuFlag = None,
    gpu_mem: GpuMemFlag = None,
    gpu_tflops: GpuTflopsFlag = None,
    gpu_bandwidth: GpuBandwidthFlag = None,
    nodes: NodesFlag = None,
    gpus_per_node: GpusPerNodeFlag = None,
    host_mem: HostMemFlag = None,
    device: DeviceFlag = "gpu",
    algo: AlgoFlag = None,
    prompt_len: PromptLenFlag = None,
    response_len: ResponseLenFlag = None,
    max_response_len: MaxResponseLenFlag = None,
    train_batch_size: TrainBatchSizeFlag = None,
    n: ResponsesPerPromptFlag = None,
    ppo_mini_batch_size: PpoMiniBatchSizeFlag = None,
    expected_prompt_len: SolveExpectedPromptLen = None,
    expected_response_len: SolveExpectedResponseLen = None,
    train_files: TrainFilesFlag = None,
    val_files: ValFilesFlag = None,
    from_plan: FromPlanFlag = None,
    objective: ObjectiveFlag = "throughput",
    rollout: RolloutFlag = None,
    strategy: StrategyFlag = None,
    fix: SolveFixFlag = None,
    profile: SolveProfile = None,
    headroom: SolveHeadroom = None,
    verify: VerifyFlag = False,
    output: SolvePlanOutput = None,
    json_output: SolveJsonOutput = False,
    quiet: QuietFlag = False,
    top: TopFlag = None,
    frontier: FrontierFlag = None,
    verl_version: VerlVersion = None,
    vllm_version: VllmVersion = None,
    sglang_version: SglangVersion = None,
    force: SolveForce = False,
) -> None:
    """Solve every knob for a model, a cluster and a workload; write plan.toml.

    Example: rlplan solve --model qwen2.5-7b --gpus 8 --gpu h100-80g --prompt-len 1024 --response-len 2048
    --train-files ~/data/gsm8k/train.parquet -o plan.toml
    """
    flags = steps.SolveFlags(**locals())  # before any other name is bound: locals() is the options, by name
    from rlplan.planner.solver import RUNNERS_UP, solve_engines

    steps.check_outputs(flags)
    base = steps.load_base(flags)
    inputs = steps.solve_inputs(flags, base, steps.stderr_notes(flags))
    result = solve_engines(inputs.request, inputs.engines, keep=max(flags.top or 0, RUNNERS_UP + 1),
                           frontier=flags.frontier is not None)
    if flags.frontier:
        steps.draw_frontier(flags, inputs, result)
    if result.best is None:
        raise typer.Exit(steps.report_infeasible(flags, inputs, result))
    plan, verification = steps.verified_plan(flags, inputs, result)
    if plan is None:
        raise typer.Exit(steps.report_unverified(flags, verification or []))
    steps.print_solved(flags, inputs, result, plan, steps.checked_plan_text(plan), verification)


# --- validate / explain ----------------------------------------------------------------


def plan_with_profile(plan_path: str, profile_path: str | None, prompt: int | None, response: int | None,
                      stack: tuple[str | None, str | None, str | None] = (None, None, None)):
    """The plan at PLAN and the profile, with the --expected-*-len flags (or the profile's observed means)
    and the version flags (its target stack) applied: what validate and explain price."""
    from rlplan.planner.stack import stack_from_flags

    profile = load_profile(profile_path)
    plan = load_plan(plan_path)
    # The plan's knobs stay as its file states them: only plans built from incomplete input (solve, import) take
    # the target stack's defaults.
    plan = plan.evolve(stack=stack_from_flags(plan.stack, *stack))
    return with_expected_lengths(plan, prompt, response, profile), profile


@app.command()
@guarded
def validate(
    plan_path: Annotated[str, typer.Argument(metavar="PLAN", help="plan.toml to check.")],
    json_output: JsonOutput = False,
    profile: ProfileOption = None,
    expected_prompt_len: ExpectedPromptLen = None,
    expected_response_len: ExpectedResponseLen = None,
    headroom: HeadroomOption = None,
    verl_version: VerlVersion = None,
    vllm_version: VllmVersion = None,
    sglang_version: SglangVersion = None,
) -> None:
    """Check a plan against verl's rules and the memory model. Exit 0 ok, 1 predicted OOM, 2 invalid.

    A plan that fits but leaves less than the margin (--headroom) gets a warning, not an error.

    Example: rlplan validate plan.toml --json
    """
    from rlplan.planner.report import fit_fix, plan_reports, reports_json, validation_tables

    plan, prof = plan_with_profile(plan_path, profile, expected_prompt_len, expected_response_len,
                                   (verl_version, vllm_version, sglang_version))
    from rlplan.planner.stack_inference import verdicts_across

    reports = plan_reports(plan, prof, parse_headroom(headroom))
    fix = fit_fix(plan, prof, plan_path) if reports.rules.valid and not reports.feasible else None
    # An imported script whose keys leave a range of verl releases: where the verdict differs across it.
    across = verdicts_across(plan, prof)
    if json_output:
        print(json.dumps({**reports_json(reports), **({"fix": fix} if fix else {}),
                          **({"verdicts_across_verl": across} if across else {})}, indent=2))
    else:
        console = make_console()
        for renderable in validation_tables(reports, fix):
            console.print(renderable)
        for line in across:
            console.print(f"note: {line} (pass --verl-version to judge one release)", markup=False)
    if not reports.rules.valid:
        raise typer.Exit(ExitCode.BAD_INPUT)
    if not reports.feasible:
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
    verl_version: VerlVersion = None,
    vllm_version: VllmVersion = None,
    sglang_version: SglangVersion = None,
    force: ForceOutput = False,
) -> None:
    """Per-phase, per-component memory table, the batch layout and the step-time estimate.

    Example: rlplan explain plan.toml --chart memory.html
    """
    from rlplan.planner.report import explain_tables, plan_reports, reports_json

    if chart:
        from rlplan.planner.commands.chart_commands import check_chart_path

        check_chart_path(chart, "--chart")
        refuse_overwriting_inputs(chart, "--chart", {"PLAN": plan_path, "--profile": profile})
        refuse_read_only_output(chart, "--chart", force=force)
    plan, prof = plan_with_profile(plan_path, profile, expected_prompt_len, expected_response_len,
                                   (verl_version, vllm_version, sglang_version))
    if chart:
        from rlplan.planner.commands.chart_commands import memory_chart_command

        memory_chart_command(plan, prof, chart, parse_headroom(headroom), force=force)
    reports = plan_reports(plan, prof, parse_headroom(headroom))
    if json_output:
        print(json.dumps(reports_json(reports), indent=2))
        return
    console = make_console()
    for renderable in explain_tables(reports):
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
    json_output: Annotated[bool, typer.Option("--json", help="The schema is JSON already; with -o, print "
                                              "{\"output\": FILE}; errors as one JSON object.")] = False,
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
        if json_output:
            print_json({"output": output})
        else:
            make_console(stderr=True).print(f"wrote {output}", markup=False)


@app.command()
@guarded
def report(
    run_dir: Annotated[str, typer.Argument(metavar="RUN_DIR", help="A run's output directory (metrics.jsonl, plan.toml).")],
    output: Annotated[str | None, typer.Option("-o", "--output", help="Chart to write: .html, .png or .svg "
                                               "(default: RUN_DIR/report.html, beside the run).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object (chart written, metrics file, "
                                              "steps) or the error.")] = False,
    force: ForceOutput = False,
) -> None:
    """Draw a run, finished or still running: reward, KL, entropy, lengths, sync gap, phase times, memory.

    Example: rlplan report runs/demo -o report.html
    """
    from rlplan.planner.commands.chart_commands import check_chart_path, report_command, report_summary

    output = output or os.path.join(run_dir, "report.html")  # beside the run, never silently into the cwd
    check_chart_path(output, "-o")
    refuse_read_only_output(output, "-o", force=force)
    drawn = report_command(run_dir, output, force=force)
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
    profile: Annotated[str | None, typer.Option(
        "--profile", metavar="FILE", help="Profile plan-versus-actual prices with (on a CPU: the process baselines "
        "`rlplan calibrate --cpu` measured here; without it, the built-in bounds).")] = None,
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
                                 output_dir=output_dir, max_steps=max_steps, as_json=json_output,
                                 profile_path=profile))


@app.command()
@guarded
def demo(
    output_dir: Annotated[str, typer.Option("--output-dir", help="Where the model, data and run go.")] = "runs/demo",
    steps: Annotated[int, typer.Option(help="RL steps to run.")] = 12,
    json_output: Annotated[bool, typer.Option("--json", help="Log to stderr; print one JSON object on stdout.")] = False,
    profile: Annotated[str | None, typer.Option(
        "--profile", metavar="FILE", help="Profile plan-versus-actual prices with (`rlplan calibrate --cpu`).")] = None,
) -> None:
    """CPU demo: build the bundled tiny model and toy task, solve a plan for this machine, run it.

    Example: rlplan demo --steps 12
    """
    from rlplan.runtime.commands import demo_command

    raise typer.Exit(demo_command(output_dir, steps, as_json=json_output, profile_path=profile))


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
                                      "bandwidth (what `solve --device cpu` prices), with or without a plan, and "
                                      "its CPU process baselines (a short run of the bundled tiny model).")] = False,
    baselines: Annotated[bool, typer.Option("--baselines/--no-baselines", help="With --cpu: also measure the "
                                            "trainer's and the engine's process baselines (needs the runtime: "
                                            "Ray and vLLM).")] = True,
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
    force: ForceOutput = False,
) -> None:
    """Fit a calibration profile on a GPU, from a finished run's plan-vs-actual records, from verl logs, or
    measure this CPU.

    Example: rlplan calibrate --from-verl-log run.log --plan run.sh --gpu h100-80g -o profile.toml
    """
    if from_verl_log:
        from rlplan.planner.commands.compare_commands import calibrate_verl_command

        plans = list(plan or []) + ([plan_path] if plan_path else [])
        raise typer.Exit(calibrate_verl_command(from_verl_log, plans, output, gpu=gpu, gpu_mem=gpu_mem,
                                                host_mem=1024.0, env=[], fixes=parse_fixes(fix or []),
                                                verl_version=verl_version, as_json=json_output, force=force))
    from rlplan.runtime.commands import calibrate_command, calibrate_cpu_command

    if cpu:
        raise typer.Exit(calibrate_cpu_command(output, as_json=json_output, measure_baselines=baselines))
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
    verl_version: VerlVersion = None,
    chart: Annotated[str | None, typer.Option("--chart", help="Also draw measured vs predicted and the length trend "
                                              "to this .html / .png / .svg; needs the charts extra.")] = None,
    json_output: JsonOutput = False,
    force: ForceOutput = False,
) -> None:
    """Hold a plan against a verl run: memory and time per phase at the run's lengths, and the length trend.
    Exit 1 when a measured memory figure exceeds the prediction by more than the model's error band.

    Example: rlplan compare run_qwen2_7b.sh verl.log --gpu h100-80g
    """
    from rlplan.planner.commands.compare_commands import compare_command

    raise typer.Exit(compare_command(plan_path, log_path, gpu=gpu, gpu_mem=gpu_mem, host_mem=host_mem, env=env or [],
                                     fixes=parse_fixes(fix or []), profile_path=profile, verl_version=verl_version,
                                     chart=chart, as_json=json_output, force=force))


# --- interop -------------------------------------------------------------------------


@import_app.command("verl")
@guarded
def import_verl(
    script: Annotated[str, typer.Argument(metavar="SCRIPT", help="verl launch script or a file of Hydra overrides.")],
    gpu: Annotated[str | None, typer.Option(help="GPU preset the script runs on.")] = None,
    gpu_mem: Annotated[str | None, typer.Option("--gpu-mem", help="GPU memory instead of a preset: GiB, or with a "
                                                "unit (80GB, 81559MiB).")] = None,
    host_mem: Annotated[str | None, typer.Option(
        "--host-mem", help="Host RAM per node: GiB or with a unit (512GiB); default: the GPU's typical node, said "
                           "as a warning.")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", help="KEY=VALUE for shell variables (repeatable).")] = None,
    arg: Annotated[list[str] | None, typer.Option("--arg", help="An argument of the script ($1, $2 ... in order; "
                                                  "repeatable); default none, as `bash SCRIPT` runs it.")] = None,
    output: PlanOutput = None,
    expected_prompt_len: ExpectedPromptLen = None,
    expected_response_len: ExpectedResponseLen = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object: output path, warnings, and "
                                              "the plan's TOML when there is no -o.")] = False,
    verl_version: VerlVersion = None,
    vllm_version: VllmVersion = None,
    sglang_version: SglangVersion = None,
    force: ForceOutput = False,
) -> None:
    """Import a verl launch script (python3 -m verl.trainer.main_ppo ...) into a plan.

    Example: rlplan import verl run_qwen2_7b.sh --gpu h100-80g -o plan.toml
    """
    from rlplan.planner.commands.interop_commands import import_command

    raise typer.Exit(import_command(script, gpu=gpu, gpu_mem=gpu_mem, host_mem=host_mem, env=env or [],
                                    output=output, expected_lengths=(expected_prompt_len, expected_response_len),
                                    as_json=json_output, versions=(verl_version, vllm_version, sglang_version),
                                    arguments=tuple(arg or ()), force=force))


@app.command()
@guarded
def render(
    plan_path: Annotated[str, typer.Argument(metavar="PLAN", help="plan.toml to render.")],
    target: Annotated[str, typer.Option(
        "--target", metavar=choices_metavar(RENDER_TARGETS), autocompletion=completion(RENDER_TARGETS),
        help="What to write: verl, a verl launch script; slurm or ray-job, a SLURM script or a Ray job that run the "
             "plan with `rlplan run` (the bundled runtime, not verl).")] = "verl",
    fmt: Annotated[str, typer.Option(
        "--format", metavar=choices_metavar(RENDER_FORMATS), autocompletion=completion(RENDER_FORMATS),
        help="A script, or verl's Hydra overrides one per line (verl only).")] = "script",
    output: Annotated[str | None, typer.Option("-o", "--output", metavar="FILE",
                                               help="File to write (default: stdout).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object: output path, target, format, "
                                              "what was added, and the text when there is no -o.")] = False,
    force: ForceOutput = False,
) -> None:
    """Render a plan as a verl launch script or Hydra overrides, or as a SLURM script or a Ray job of `rlplan run`.

    What the verl script adds that the plan leaves unset (rollout.max_model_len) is said on stderr.

    The SLURM and Ray job targets run the plan with rlplan's bundled runtime (`rlplan run`), not verl.

    Example: rlplan render plan.toml --target verl -o run.sh
    """
    from rlplan.planner.commands.interop_commands import render_command

    raise typer.Exit(render_command(plan_path, target=target, fmt=fmt, output=output, as_json=json_output,
                                    force=force))


def version_callback(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"rlplan {version('rlplan')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            print("rlplan (not installed: no version metadata)")
        from rlplan.planner.stack import default_stack_text
        from rlplan.planner.verl_inventory import supported_releases_text

        print(default_stack_text())
        print(supported_releases_text())
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

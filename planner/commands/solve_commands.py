"""The work of `rlplan solve` around the solver, as a list of named steps that cli.py's `solve` calls in order.

`SolveFlags` is the command line as given ("not given" is None, so a --from plan's value is never mistaken for a
default), checked at construction. `solve_inputs(flags, base, say)` resolves what the flags name (the model, the
cluster: this CPU machine, a GPU preset, a custom GPU or the --from plan's) and merges the flags over the --from
plan into a `SolveRequest` (`request_from_flags`, pure). After the search, `report_infeasible`, `verified_plan`
and `print_solved` print the result through report.py's JSON shapes and tables, and write the plan.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, get_args

from attrs import field, frozen

from rlplan.planner.commands.commands_io import (
    ExitCode,
    load_plan,
    load_profile,
    local_config_path,
    make_console,
    read_text,
    refuse_overwriting_inputs,
    refuse_read_only_output,
    write_atomic,
)
from rlplan.planner.commands.this_machine import cpu_cluster, this_machine_memory_gib
from rlplan.planner.errors import ECHO_LIMIT, PlanError, shorten
from rlplan.planner.hardware import Cluster, GpuSpec
from rlplan.planner.model_error import Headroom, parse_headroom
from rlplan.planner.phases import Phase
from rlplan.planner.plan import ENGINE_TITLES, RUNTIME_ESTIMATORS, ModelSection, Plan, RolloutEngine
from rlplan.planner.platform import CPU_RUNTIME_PINS
from rlplan.planner.profile import Profile
from rlplan.planner.solver import Candidate, Objective, SolveRequest, SolveResult, SolveStrategy
from rlplan.planner.stack import DEFAULT_STACK, solve_pins
from rlplan.planner.validators import MAX_PLAN_NUMBER

if TYPE_CHECKING:
    from rich.console import Console

    from rlplan.planner.report import VerifiedCandidate

# Choices of the fixed-set options, taken from the plan's Literals so --help and validation cannot drift from them.
# `ppo` is the user's name for the gae estimator with a critic; `auto` lets the solver price both engines.
ALGO_CHOICES = ("ppo", *RUNTIME_ESTIMATORS)
ROLLOUT_CHOICES = (*get_args(RolloutEngine), "auto")
OBJECTIVE_CHOICES = get_args(Objective)
STRATEGY_CHOICES = get_args(SolveStrategy)

# The count flags, each with what leaving it out means: a zero or negative count is a mistake, never a request for
# the default, and the fix says what the default is (issue 35: "leave it out for the default" where there is none).
_COUNT_FLAGS = (
    ("--top", "top", "without it no runners-up are listed"),
    ("--gpus", "gpus", "it may be left out only with --from (the plan's count) or --device cpu (1 rank)"),
    ("--nodes", "nodes", "without it, --gpus / --gpus-per-node"),
    ("--gpus-per-node", "gpus_per_node", "without it, --gpus up to 8"),
    ("--train-batch-size", "train_batch_size", "without it, the --from plan's, else 256 prompts"),
    ("--n", "n", "without it, the --from plan's, else 5 responses per prompt"),
    ("--ppo-mini-batch-size", "ppo_mini_batch_size", "without it, the --from plan's, else the solver's choice"),
    ("--prompt-len", "prompt_len", "it may be left out only with --from (the plan's)"),
    ("--response-len", "response_len", "without it, the --from plan's, or --max-response-len"),
    ("--max-response-len", "max_response_len", "without it, --response-len is the length"),
    ("--expected-prompt-len", "expected_prompt_len", "without it, 0.3 of --prompt-len (or a --profile's mean)"),
    ("--expected-response-len", "expected_response_len",
     "without it, 0.3 of --response-len (or a --profile's mean)"),
)

Say = Callable[[str], None]


def _as_tuple(values: list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    return tuple(values or ())


@frozen(kw_only=True)
class SolveFlags:
    """`rlplan solve`'s options as the user gave them: None is "not given" (the --from plan's value, else the
    default), so no default can pass for a choice. Checked at construction: each flag on its own, and the pairs
    that contradict each other."""

    model: str | None = None
    lora: str = "auto"
    gpus: int | None = None
    gpu: str | None = None
    gpu_mem: str | None = None
    gpu_tflops: float | None = None
    gpu_bandwidth: float | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    host_mem: str | None = None
    device: str = "gpu"
    algo: str | None = None
    prompt_len: int | None = None
    response_len: int | None = None
    max_response_len: int | None = None
    train_batch_size: int | None = None
    n: int | None = None
    ppo_mini_batch_size: int | None = None
    expected_prompt_len: int | None = None
    expected_response_len: int | None = None
    train_files: str | None = None
    val_files: str | None = None
    from_plan: str | None = None
    objective: str = "throughput"
    rollout: str | None = None
    # None: the --from plan's backend (megatron for a Megatron plan), else fsdp.
    strategy: str | None = None
    fix: tuple[str, ...] = field(default=(), converter=_as_tuple)
    # Replace a read-only -o / --frontier file (refused without it).
    force: bool = False
    profile: str | None = None
    headroom: str | None = None
    verify: bool = False
    output: str | None = None
    json_output: bool = False
    quiet: bool = False
    top: int | None = None
    frontier: str | None = None
    # The target stack (planner/stack.py); None: the --from plan's, else the default.
    verl_version: str | None = None
    vllm_version: str | None = None
    sglang_version: str | None = None

    def __attrs_post_init__(self) -> None:
        for flag, name, left_out in _COUNT_FLAGS:
            value = getattr(self, name)
            if value is not None and value < 1:
                raise PlanError(field=flag, message=f"must be >= 1, got {value}.",
                                fix=f"pass a whole number >= 1 ({left_out})")
        if self.device not in ("gpu", "cpu"):
            raise PlanError(field="--device", message=f"{self.device!r} is neither gpu nor cpu.",
                            fix="pass --device cpu to plan a run on this machine's CPU, or leave it out")
        if self.on_cpu and (self.gpu_mem is not None or (self.gpu is not None and not _names_cpu(self.gpu))):
            raise PlanError(field="--device", message="--device cpu is given with a GPU (--gpu / --gpu-mem).",
                            fix="leave out --gpu / --gpu-mem to plan the CPU, or --device cpu to plan the GPU")
        if self.gpu is not None and self.gpu_mem is not None:
            raise PlanError(field="--gpu-mem", message="both --gpu and --gpu-mem are given.", fix="pass only one")
        if self.algo is not None and _algorithm_name(self.algo) not in RUNTIME_ESTIMATORS:
            raise PlanError(field="--algo", message=f"unknown algorithm {self.algo!r}.",
                            fix=f"pass one of {', '.join(ALGO_CHOICES)}")
        if self.lora not in ("off", "auto") and not _is_rank(self.lora):
            raise PlanError(field="--lora", message=f"{shorten(self.lora)!r} is not off, auto or a rank.",
                            fix="pass --lora 64")
        if _is_rank(self.lora) and (len(self.lora) > 8 or not 1 <= int(self.lora) <= MAX_PLAN_NUMBER):
            raise PlanError(field="--lora", message=f"rank {shorten(self.lora)} is out of range.",
                            fix="pass a LoRA rank such as 8, 16, 32 or 64 (verl's examples use 8 to 256), or --lora off")
        if self.rollout is not None and self.rollout not in ROLLOUT_CHOICES:
            raise PlanError(field="--rollout", message=f"{self.rollout!r} is not one of {', '.join(ROLLOUT_CHOICES)}.",
                            fix="pass --rollout vllm (the bundled runtime's engine), sglang, trtllm or auto")
        if self.strategy is not None and self.strategy not in STRATEGY_CHOICES:
            raise PlanError(field="--strategy", message=f"{self.strategy!r} is not one of "
                            f"{', '.join(STRATEGY_CHOICES)}.", fix="pass --strategy megatron, fsdp or auto")
        if self.on_cpu and self.strategy in ("megatron", "auto"):
            raise PlanError(field="--strategy", message="rlplan's CPU runtime trains with FSDP2; Megatron plans are "
                            "for verl on GPUs.", fix="leave out --strategy with --device cpu, or plan a GPU cluster")
        if self.objective not in OBJECTIVE_CHOICES:
            raise PlanError(field="--objective", message=f"{self.objective!r} is not one of "
                            f"{', '.join(OBJECTIVE_CHOICES)}.", fix="pass --objective throughput")

    @property
    def on_cpu(self) -> bool:
        """A plan for rlplan's CPU runtime on this machine: --device cpu, or --gpu cpu."""
        return self.device == "cpu" or (self.gpu is not None and _names_cpu(self.gpu))

    @property
    def shows_notes(self) -> bool:
        """Notes go to stderr unless the output is JSON or --quiet."""
        return not (self.json_output or self.quiet)

    def algorithm(self, base: Plan | None) -> str:
        """The advantage estimator: --algo (ppo is gae), else the --from plan's, else grpo."""
        if self.algo is not None:
            return _algorithm_name(self.algo)
        if base is None:
            return "grpo"
        if base.algorithm.adv_estimator is None:
            raise PlanError(field="--from", message=f"plans verl's {base.algorithm.recipe} recipe, whose own trainer "
                            "runs the step; solve searches verl's PPO trainer.",
                            fix="pass --algo (grpo, ppo, ...) to solve the same workload for verl's PPO trainer")
        return base.algorithm.adv_estimator

    def lora_choice(self) -> int | str:
        return int(self.lora) if _is_rank(self.lora) else self.lora


def _names_cpu(gpu: str) -> bool:
    return gpu.strip().lower() == "cpu"


def _algorithm_name(algo: str) -> str:
    name = algo.lower()
    return {"ppo": "gae"}.get(name, name)


def _is_rank(lora: str) -> bool:
    return lora.isascii() and lora.isdigit()


def stderr_notes(flags: SolveFlags) -> Say:
    """Where a note about the inputs goes: stderr at once (before any later error), or nowhere with --json/-q."""
    if not flags.shows_notes:
        return lambda note: None
    console = make_console(stderr=True)
    return lambda note: console.print(f"note: {note}", markup=False)


def check_outputs(flags: SolveFlags) -> None:
    """The --frontier chart's kind, and no output replacing an input (-o may replace the --from plan: a re-solve
    in place)."""
    if flags.frontier:
        from rlplan.planner.commands.chart_commands import check_chart_path

        check_chart_path(flags.frontier, "--frontier")
    read = {"--profile": flags.profile, "--model": local_config_path(flags.model) if flags.model else None}
    refuse_overwriting_inputs(flags.output, "--output", read)
    refuse_overwriting_inputs(flags.frontier, "--frontier", {**read, "--from": flags.from_plan, "--output": flags.output})
    refuse_read_only_output(flags.output, "--output", force=flags.force)
    refuse_read_only_output(flags.frontier, "--frontier", force=flags.force)


def load_base(flags: SolveFlags) -> Plan | None:
    """The --from plan, whose model and workload the flags not given keep."""
    return load_plan(flags.from_plan) if flags.from_plan else None


# --- what the flags name ------------------------------------------------------------------


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


def model_section(flags: SolveFlags, base: Plan | None, say: Say) -> ModelSection:
    """--model resolved (a preset, a repo id or a local config.json), else the --from plan's model."""
    if flags.model is None:
        if base is None:
            raise PlanError(field="--model", message="no model given.", fix="pass --model qwen2.5-7b (or --from "
                            "plan.toml)")
        return base.model
    resolved = resolve_model_arg(flags.model)
    weightless = weightless_model_note(flags.model)
    if weightless:
        say(weightless)
    return ModelSection(name=resolved.name, path=resolved.path, arch=resolved.arch)


def parse_fixes(fixes: list[str] | tuple[str, ...]) -> dict[str, Any]:
    from rlplan.planner.knobs import parse_pin

    pins: dict[str, Any] = {}
    for item in fixes:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise PlanError(field="--fix", message=f"{item!r} is not key=value.",
                            fix="pass e.g. --fix actor.param_offload=true")
        field_name, value = parse_pin(key.strip(), raw.strip())
        pins[field_name] = value
    return pins


def path_list(flag: str, text: str | None) -> tuple[str, ...] | None:
    """`PATH[,PATH]` as a tuple of paths; None when the flag is not given."""
    if text is None:
        return None
    paths = tuple(part.strip() for part in text.split(","))
    if not all(paths):
        raise PlanError(field=flag, message=f"{text!r} has an empty path.",
                        fix=f"pass {flag} train.parquet or {flag} a.parquet,b.parquet")
    return paths


# --- the cluster ----------------------------------------------------------------------------


@frozen(kw_only=True)
class ClusterChoice:
    """The cluster a solve plans for, and what was assumed about it (shown with the result)."""

    cluster: Cluster
    # The host RAM figure assumed when --host-mem is not given (a GPU preset's typical node).
    host_note: str | None = None
    # Where a CPU plan's compute rates came from.
    cpu_note: str = ""


def solve_cluster(flags: SolveFlags, base: Plan | None, profile: Profile, say: Say) -> ClusterChoice:
    """This machine's CPU, or GPUs: a preset, a custom --gpu-mem GPU, or the --from plan's cluster."""
    from rlplan.planner.presets import parse_host_memory

    host_gib = parse_host_memory(flags.host_mem)
    if flags.on_cpu:
        return this_cpu_cluster(flags, host_gib, profile, say)
    gpu = gpu_spec(flags, base, say)
    if flags.gpus is None and base is not None and flags.nodes is None and flags.gpus_per_node is None:
        return ClusterChoice(cluster=base_cluster(flags, base, gpu, host_gib))
    return gpu_cluster(flags, gpu, host_gib)


def this_cpu_cluster(flags: SolveFlags, host_gib: float | None, profile: Profile, say: Say) -> ClusterChoice:
    """--device cpu: this machine, --gpus trainer ranks, its RAM (or --host-mem) as both memories."""
    if flags.nodes not in (None, 1):
        raise PlanError(field="--nodes", message=f"a CPU plan runs on this one machine, got {flags.nodes} nodes.",
                        fix="leave out --nodes with --device cpu")
    ranks = flags.gpus or flags.gpus_per_node or 1
    try:
        cluster, rates = cpu_cluster(ranks, host_gib or this_machine_memory_gib() or 1024.0, profile)
    except PlanError as error:  # a CPU plan's "GPU" memory and host RAM are both --host-mem
        if host_gib is None or not error.field.startswith("cluster."):
            raise
        raise PlanError(field="--host-mem", message=error.message, fix="pass --host-mem in GiB, or leave it out "
                        "for this machine's MemTotal") from None
    cpu_note = f"CPU rates {rates.source}"
    say(f"{cpu_note}.")
    return ClusterChoice(cluster=cluster, cpu_note=cpu_note)


def gpu_spec(flags: SolveFlags, base: Plan | None, say: Say) -> GpuSpec:
    """--gpu's preset, a --gpu-mem GPU (with the speeds given or defaulted), else the --from plan's GPU."""
    from rlplan.planner.presets import custom_gpu, defaulted_speeds, parse_gpu_memory, resolve_gpu

    if flags.gpu is not None:
        return resolve_gpu(flags.gpu)
    if flags.gpu_mem is not None:
        spec = custom_gpu(parse_gpu_memory(flags.gpu_mem), bf16_tflops=flags.gpu_tflops, hbm_gbps=flags.gpu_bandwidth)
        defaulted = defaulted_speeds(flags.gpu_tflops, flags.gpu_bandwidth)
        if defaulted:
            say(f"{defaulted}.")
        return spec
    if base is not None:
        return base.cluster.gpu
    raise PlanError(field="--gpu", message="no GPU given.", fix="pass --gpu h100-80g or --gpu-mem GiB")


def base_cluster(flags: SolveFlags, base: Plan, gpu: GpuSpec, host_gib: float | None) -> Cluster:
    """No count given: the --from plan's nodes, with --gpu / --gpu-mem / --host-mem over its GPU and RAM."""
    if flags.gpu is None and flags.gpu_mem is None:
        return base.cluster
    return Cluster(gpu=gpu, nodes=base.cluster.nodes, gpus_per_node=base.cluster.gpus_per_node,
                   host_memory_gib=base.cluster.host_memory_gib if host_gib is None else host_gib)


def gpu_cluster(flags: SolveFlags, gpu: GpuSpec, host_gib: float | None) -> ClusterChoice:
    """--gpus (or --nodes x --gpus-per-node) of one GPU, with --host-mem or the GPU's typical node's RAM."""
    from rlplan.planner.presets import typical_host_memory

    gpus, nodes, gpus_per_node = flags.gpus, flags.nodes, flags.gpus_per_node
    if gpus is None and (nodes is None or gpus_per_node is None):
        raise PlanError(field="--gpus", message="the GPU count is needed.", fix="pass --gpus 8")
    per_node = gpus_per_node or min(gpus or 8, 8)
    node_count = nodes or max(1, (gpus or per_node) // per_node)
    if gpus is not None and node_count * per_node != gpus:
        raise PlanError(field="--gpus", message=f"{gpus} GPUs is not nodes x gpus-per-node ({node_count} x {per_node}).",
                        fix=f"pass --gpus-per-node so that it divides {gpus}")
    assumed = None if host_gib is not None else typical_host_memory(gpu, per_node)
    try:
        cluster = Cluster(gpu=gpu, nodes=node_count, gpus_per_node=per_node,
                          host_memory_gib=assumed.gib if assumed else host_gib)
    except PlanError as error:
        if error.field != "cluster.host_memory_gib":
            raise
        raise PlanError(field="--host-mem", message=error.message, fix="pass --host-mem in GiB per node") from None
    return ClusterChoice(cluster=cluster, host_note=assumed.describe() if assumed else None)


# --- the request ------------------------------------------------------------------------------


@frozen(kw_only=True)
class SolveInputs:
    """Everything a solve searches with: the request, the engines to price, and the cluster's assumptions."""

    request: SolveRequest
    engines: tuple[RolloutEngine, ...]
    cluster: ClusterChoice


def solve_inputs(flags: SolveFlags, base: Plan | None, say: Say) -> SolveInputs:
    """Resolve what the flags name (the model, the profile, the cluster), then merge them over the --from plan."""
    headroom = parse_headroom(flags.headroom)
    model = model_section(flags, base, say)
    profile = load_profile(flags.profile)
    cluster = solve_cluster(flags, base, profile, say)
    stack = solve_pins(base.stack if base else DEFAULT_STACK, flags.verl_version, flags.vllm_version,
                       flags.sglang_version)
    pins = {**stack, **(CPU_RUNTIME_PINS if flags.on_cpu else {}), **parse_fixes(flags.fix)}
    if flags.rollout is not None and "rollout.name" in pins:
        raise PlanError(field="--rollout", message="both --rollout and --fix rollout.name are given.",
                        fix="pass only --rollout")
    request = request_from_flags(flags, base, model=model, cluster=cluster.cluster, profile=profile,
                                 headroom=headroom, pins=pins)
    return SolveInputs(request=request, engines=rollout_engines(flags, base, pins), cluster=cluster)


def request_from_flags(flags: SolveFlags, base: Plan | None, *, model: ModelSection, cluster: Cluster,
                       profile: Profile, headroom: Headroom, pins: dict[str, Any]) -> SolveRequest:
    """The request: each workload flag given, else the --from plan's value, else the default. Pure."""
    prompt_len, response_len = flags.prompt_len, flags.response_len
    train_batch_size, n, ppo_mini_batch_size = flags.train_batch_size, flags.n, flags.ppo_mini_batch_size
    if base is not None:
        prompt_len = base.data.max_prompt_length if prompt_len is None else prompt_len
        if response_len is None and flags.max_response_len is None:
            response_len = base.data.max_response_length
        train_batch_size = base.data.train_batch_size if train_batch_size is None else train_batch_size
        n = base.rollout.n if n is None else n
        if ppo_mini_batch_size is None:
            ppo_mini_batch_size = base.actor.ppo_mini_batch_size
    if prompt_len is None:
        raise PlanError(field="--prompt-len", message="the prompt length is needed.", fix="pass --prompt-len 1024")
    check_means(flags, prompt_len, response_len or flags.max_response_len)
    return SolveRequest(
        model=model, cluster=cluster, prompt_len=prompt_len, response_len=response_len,
        max_response_len=flags.max_response_len, train_batch_size=256 if train_batch_size is None else train_batch_size,
        n=5 if n is None else n, algorithm=flags.algorithm(base), ppo_mini_batch_size=ppo_mini_batch_size,
        lora=flags.lora_choice(), objective=flags.objective,  # type: ignore[arg-type]  # checked by SolveFlags
        pins=pins, headroom=headroom, base=base, profile=profile,
        expected_prompt_len=flags.expected_prompt_len, expected_response_len=flags.expected_response_len,
        train_files=path_list("--train-files", flags.train_files), val_files=path_list("--val-files", flags.val_files),
        strategy=solve_strategy(flags, base),
    )


def solve_strategy(flags: SolveFlags, base: Plan | None) -> SolveStrategy:
    """--strategy, else the --from plan's backend, else fsdp (the search of every release before Megatron's)."""
    if flags.strategy is not None:
        return flags.strategy  # type: ignore[return-value]  # checked by SolveFlags
    return "megatron" if base is not None and base.is_megatron else "fsdp"


def check_means(flags: SolveFlags, prompt_len: int, response_len: int | None) -> None:
    """A mean above its maximum is a mistake (validate and explain refuse it too), never silently capped."""
    for flag, mean, maximum, limit in (("--expected-prompt-len", flags.expected_prompt_len, prompt_len, "--prompt-len"),
                                       ("--expected-response-len", flags.expected_response_len, response_len,
                                        "--response-len")):
        if mean is not None and maximum is not None and mean > maximum:
            raise PlanError(field=flag, message=f"is a mean length and cannot exceed {limit} {maximum}, got {mean}.",
                            fix=f"pass {flag} at most {maximum}, or leave it out (= the maximum)")


def rollout_engines(flags: SolveFlags, base: Plan | None, pins: dict[str, Any]) -> tuple[RolloutEngine, ...]:
    """The engines to price: vLLM and SGLang with --rollout auto (vLLM only on a CPU), else --rollout, the pin, the
    --from plan's engine or vLLM. TensorRT-LLM only when asked (--rollout trtllm): its decode is priced with vLLM's
    host constants (steptime.rollout.decode_step), so a race between it and vLLM would rank nothing measured."""
    if flags.rollout == "auto":
        engines: tuple[Any, ...] = ("vllm",) if flags.on_cpu else ("vllm", "sglang")
    else:
        engines = (flags.rollout or pins.get("rollout.name") or (base.rollout.name if base is not None else "vllm"),)
    if flags.on_cpu and engines != ("vllm",):
        # The platform rule runtime_rolls_out_with_vllm would refuse the plan at `rlplan run`: say so now.
        raise PlanError(field="--rollout" if flags.rollout else "rollout.name",
                        message=f"rlplan's CPU runtime runs vLLM rollouts only, not {engines[0]}; "
                        f"{ENGINE_TITLES[engines[0]]} plans are for verl on GPUs.", fix="leave out --rollout with --device cpu (vllm), or plan a GPU cluster")
    return engines


# --- after the search ---------------------------------------------------------------------------


def draw_frontier(flags: SolveFlags, inputs: SolveInputs, result: SolveResult) -> None:
    """--frontier: every candidate priced, step time against peak GiB per GPU."""
    from rlplan.planner.commands.chart_commands import frontier_chart_command
    from rlplan.planner.solver import request_margin

    assert flags.frontier is not None
    request, cluster = inputs.request, inputs.cluster.cluster
    frontier_chart_command(result, cluster.gpu.memory_gib, flags.top or 0,
                           f"{request.model.name} on {cluster.nodes * cluster.gpus_per_node} x {cluster.gpu.name}",
                           flags.frontier, margin_gib=request_margin(request).gib, force=flags.force)


def report_infeasible(flags: SolveFlags, inputs: SolveInputs, result: SolveResult) -> ExitCode:
    """No plan fits: the diagnosis (what binds, the changes that fit) as JSON or one paragraph on stderr."""
    from rlplan.planner.report import infeasible_json
    from rlplan.planner.solver import request_margin

    diagnosis = result.diagnosis
    assert diagnosis is not None
    host_note = inputs.cluster.host_note
    newer = newer_release_note(flags, inputs, result)
    if flags.json_output:
        payload = infeasible_json(result, request_margin(inputs.request), host_note)
        print(json.dumps({**payload, **({"newer_release": newer} if newer else {})}, indent=2))
    else:
        from rich.markup import escape

        from rlplan.planner.report import infeasible_lines

        console = make_console(stderr=True)
        first, *rest = infeasible_lines(diagnosis, inputs.request.cluster)
        console.print(f"[bold red]no feasible plan[/] {escape(shorten(first, 4 * ECHO_LIMIT))}", markup=True)
        for line in rest:
            console.print(shorten(line, 4 * ECHO_LIMIT), markup=False, highlight=False)
        if host_note:
            console.print(f"note: {host_note}; --host-mem sets it.", markup=False)
        if newer:
            console.print(f"note: {newer['text']}.", markup=False)
    return ExitCode.INFEASIBLE


def newer_release_note(flags: SolveFlags, inputs: SolveInputs, result: SolveResult) -> dict[str, Any] | None:
    """What a newer verl release would give a request solved for an older one (release_advice.py), said beside
    the plan, never in it; None with --quiet, on the newest release, or where no newer release helps."""
    from rlplan.planner.release_advice import newer_release

    if flags.quiet and not flags.json_output:
        return None
    advice = newer_release(inputs.request, result, inputs.engines)
    if advice is None:
        return None
    target_step = result.best.step_time.total_seconds if result.best is not None else None
    verl = str(inputs.request.pins.get("stack.verl", DEFAULT_STACK.verl))
    return {**advice.to_json(), "text": advice.text(verl, target_step)}


def verified_plan(flags: SolveFlags, inputs: SolveInputs,
                  result: SolveResult) -> tuple[Plan | None, list[VerifiedCandidate] | None]:
    """The best plan; with --verify the first candidate whose measured training step fits (None if none does),
    and the measurements."""
    if not flags.verify:
        return result.plan, None
    assert result.best is not None
    return verify_candidates([result.best, *result.runners_up], inputs.request.profile,
                             make_console() if flags.shows_notes else None)


def report_unverified(flags: SolveFlags, verification: list[VerifiedCandidate]) -> ExitCode:
    message = ("every candidate's measured training step exceeds the GPU once the planner's "
               "non-tracked memory is added; the model under-predicts this workload")
    if flags.json_output:
        print(json.dumps({"feasible": False, "message": message,
                          "verification": [row.to_json() for row in verification]}, indent=2))
    else:
        make_console(stderr=True).print(f"[bold red]no verified plan[/] {message}.", markup=True)
    return ExitCode.INFEASIBLE


def verify_candidates(candidates: list[Candidate], profile: Profile,
                      console: Console | None) -> tuple[Plan | None, list[VerifiedCandidate]]:
    """Measure the actor update of each candidate, best first; keep the first whose measured peak fits.

    The tracker sees what the step allocates; the planner's resident state and overheads
    (CUDA context, fragmentation, a sleeping vLLM) are added to it unchanged.
    """
    from rlplan.planner.report import VerifiedCandidate
    from rlplan.runtime.measure import measure_plan

    rows: list[VerifiedCandidate] = []
    chosen = None
    for rank, candidate in enumerate(candidates, start=1):
        if console is not None:
            console.print(f"verifying candidate {rank}/{len(candidates)} with the CPU tracker ...")
        # The head verl runs for the candidate, so the measured step replaces its own predicted step.
        comparison = measure_plan(candidate.plan, Phase.ACTOR_UPDATE, profile, head="auto")
        phase = next(p for p in candidate.memory.phases if p.name == comparison.planner_phase)
        measured_total = phase.peak_bytes - comparison.predicted_bytes + comparison.measured.peak_bytes
        fits = measured_total <= candidate.memory.gpu_capacity_bytes
        row = VerifiedCandidate(rank=rank, predicted_step_gib=round(comparison.predicted_bytes / 2**30, 3),
                                measured_step_gib=round(comparison.measured.peak_bytes / 2**30, 3),
                                error=round(comparison.error, 4),
                                measured_phase_peak_gib=round(measured_total / 2**30, 3), fits=fits)
        rows.append(row)
        if console is not None:
            console.print(f"  predicted {row.predicted_step_gib:.2f} GiB, measured {row.measured_step_gib:.2f} GiB "
                          f"({100 * comparison.error:+.1f} %): {'fits' if fits else 'does NOT fit'}")
        if fits:
            chosen = candidate.plan
            break
    return chosen, rows


def checked_plan_text(plan: Plan) -> str:
    """plan.toml's text, read back as `validate` will: a plan its strict reader refuses (a pin) is not written.
    Everything that can fail runs before the plan is written, so a written plan means a finished solve."""
    from rlplan.planner.planfile import check_reads_back, plan_to_toml

    plan_text = plan_to_toml(plan)
    check_reads_back(plan, plan_text, source="the solved plan")
    return plan_text


def print_solved(flags: SolveFlags, inputs: SolveInputs, result: SolveResult, plan: Plan, plan_text: str,
                 verification: list[VerifiedCandidate] | None) -> None:
    """Write the plan (-o), then print the JSON result, nothing (--quiet), or the tables and the next step."""
    from rlplan.planner.report import solve_summary, solved_json, top_candidates, top_candidates_table

    request = inputs.request
    rows = top_candidates(result, request, flags.top or 0)
    newer = newer_release_note(flags, inputs, result)
    if flags.json_output:
        payload = solved_json(plan, result, request, output=flags.output, top=rows if flags.top else None,
                              cluster_notes=(inputs.cluster.cpu_note, inputs.cluster.host_note),
                              verification=verification)
        report_text = json.dumps({**payload, **({"newer_release": newer} if newer else {})}, indent=2)
        if flags.output:
            write_atomic(flags.output, plan_text, "--output", force=flags.force)
        print(report_text)
        return
    if flags.quiet:
        if flags.output:
            write_atomic(flags.output, plan_text, "--output", force=flags.force)
        return
    renderables = list(solve_summary(plan, result, flags.output, request.profile, request.headroom,
                                     inputs.cluster.host_note))
    if flags.top:
        renderables.append(top_candidates_table(rows))
    if flags.output:
        write_atomic(flags.output, plan_text, "--output", force=flags.force)
    console = make_console()
    for renderable in renderables:
        console.print(renderable)
    if newer:
        make_console(stderr=True).print(f"note: {newer['text']}; this plan stays on its target verl.", markup=False)
    console.print(solve_next_step(flags.output, flags.on_cpu), markup=False, highlight=False, soft_wrap=True)


def solve_next_step(output: str | None, on_cpu: bool) -> str:
    """What to run after a solve: write the plan, or launch it (the CPU runtime here, else verl)."""
    import shlex

    if not output:
        return "(plan not written: pass -o plan.toml)"
    plan = shlex.quote(output)
    if on_cpu:
        return f"Next: rlplan explain {plan}   then   rlplan run {plan}"
    return f"Next: rlplan explain {plan}   then   rlplan render {plan} --target verl -o run.sh"

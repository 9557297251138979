"""A verl launch script (or a file of Hydra overrides) -> a plan.

Reads what verl users write: a bash script whose `python3 -m verl.trainer.main_ppo` (or
`-m recipe....`) command carries Hydra overrides over many `\\`-continued lines, with
comments, quotes, lists, `+key=value`, `~key`, and shell variables (`${VAR:-x}`, `${VAR}`,
`$VAR`, `$((...))`) set by the script itself, by `--env KEY=VALUE`, or by the environment.
A variable the verl command needs but nothing sets is a PlanError naming it.

Every key `verl_keys` maps becomes a plan field, keys the script omits take verl's own
defaults (so `rlplan validate` sees what verl would run), deprecated global micro-batch
keys stay global (rules.py normalizes them as verl does), and every other key is kept
verbatim in `plan.passthrough` and reported.  Pure: the CLI reads the files.
The shell itself (lexing, variables, finding the verl command) is interpreted in shell_script.py.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from typing import Any

import attrs
from attrs import frozen

from rlplan.planner.errors import PlanError
from rlplan.planner.hardware import Cluster, GpuSpec
from rlplan.planner.plan import Plan
from rlplan.planner.planfile import plan_from_dict
from rlplan.planner.presets import ResolvedModel, resolve_model
from rlplan.planner.shell_script import ShellScope, find_verl_command
from rlplan.planner.verl_keys import (
    ARF,
    BY_FIELD,
    BY_KEY,
    DEFAULT_REWARD_NAME,
    KEY_ALIASES,
    RENDER_ALSO,
    REWARD_NAME_KEY,
    REWARD_PATH_KEY,
    VERL_KEYS,
    Backend,
    Follows,
    HydraSyntaxError,
    Interpolation,
    VerlKey,
    backend_has,
    coerce,
    parse_value,
    table_for,
    verl_sleep_level,
)

KNOWN_KEYS = sorted({*BY_KEY, REWARD_PATH_KEY, REWARD_NAME_KEY})
LocalConfigReader = Callable[[str], "dict[str, Any] | None"]


@frozen(kw_only=True)
class ImportResult:
    plan: Plan
    warnings: tuple[str, ...]
    passthrough_keys: tuple[str, ...]


# --- Hydra overrides -> plan ------------------------------------------------------------------


@frozen(kw_only=True)
class Override:
    prefix: str  # "", "+", "++" or "~"
    key: str
    value: str | None

    @classmethod
    def parse(cls, text: str) -> Override:
        prefix = "++" if text.startswith("++") else text[:1] if text[:1] in "+~" else ""
        body = text[len(prefix) :]
        key, sep, value = body.partition("=")
        key = key.strip()
        if not key or (not sep and prefix != "~"):
            raise PlanError(field=text, message="is not a Hydra override (key=value).",
                            fix="write overrides as key=value, +key=value or ~key")
        return cls(prefix=prefix, key=key, value=value if sep else None)

    @property
    def text(self) -> str:
        return f"{self.prefix}{self.key}" + ("" if self.value is None else f"={self.value}")


ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"


def _overrides_from_script(text: str, env: dict[str, str], environment: dict[str, str],
                           warnings: list[str]) -> tuple[list[str], str, str | None] | None:
    """The verl command's Hydra overrides, its --config-name ("" when it names none), and the
    PYTORCH_CUDA_ALLOC_CONF the script exports or --env pins (None: neither; the importing shell's own is not the
    cluster's)."""
    scope = ShellScope(env, environment)
    command, count = find_verl_command(text, scope)
    if command is None:
        return None
    alloc_conf = None
    if ALLOC_CONF in scope.pinned or ALLOC_CONF in scope.assigned_by_script:
        value = scope.values.get(ALLOC_CONF) if ALLOC_CONF not in scope.pinned else scope.pinned[ALLOC_CONF]
        alloc_conf = value if isinstance(value, str) and value.strip() else None
    if count > 1:
        warnings.append(f"the script runs verl {count} times; imported the first command ({command.module}).")
    if command.module != "verl.trainer.main_ppo":
        warnings.append(f"{command.module} is not verl.trainer.main_ppo; its keys are read with main_ppo's "
                        "defaults (ppo_trainer.yaml).")
    if scope.dropped_positional:
        warnings.append("the command passes the script's own arguments ($@); they are not part of the import.")
    if scope.branch_assigned:
        names = sorted(scope.branch_assigned)
        warnings.append(f"the script branches (if/case) and assigns {', '.join(names)} there; the import read the "
                        f"assignments in order. Pass --env {names[0]}=VALUE to choose the branch's value.")
    if scope.machine_paths_used:
        shown = ", ".join(f"${name} = {value}" for name, value in scope.machine_paths_used.items())
        first = next(iter(scope.machine_paths_used))
        warnings.append(f"the script's paths use this machine's {shown}; the plan holds those paths, frozen, and "
                        f"the cluster's may differ. Pass --env {first}=<the path on the cluster> to import theirs.")
    if scope.kept_references:
        warnings.append(f"values from the environment are kept as references, not copied into the plan: "
                        f"{', '.join(scope.kept_references)}.")
    overrides: list[str] = []
    config_name = ""
    arguments = list(command.arguments)
    while arguments:
        argument = arguments.pop(0)
        if argument.startswith("-") and not argument.startswith("--") or argument.startswith("--"):
            name, _, value = argument.partition("=")
            if name in ("--config-name", "-cn", "--config-path", "-cp") and not value and arguments:
                value = arguments.pop(0)
            if name in ("--config-name", "-cn"):
                config_name = value.strip("'\"")
            if name in ("--config-name", "-cn") and config_name not in (*FSDP_CONFIGS, *MEGATRON_CONFIGS):
                warnings.append(f"--config-name {value}: read with {_config_file(config_name)}'s defaults, which "
                                "may differ.")
            elif name not in ("--config-name", "-cn", "--config-path", "-cp"):
                warnings.append(f"ignored the command-line flag {argument}.")
            continue
        overrides.append(argument)
    return overrides, config_name, alloc_conf


FSDP_CONFIGS = ("ppo_trainer", "ppo_trainer.yaml")
MEGATRON_CONFIGS = ("ppo_megatron_trainer", "ppo_megatron_trainer.yaml")


def _config_file(config_name: str) -> str:
    return "ppo_megatron_trainer.yaml" if "megatron" in config_name else "ppo_trainer.yaml"


_OVERRIDE_LINE = re.compile(r"(?P<prefix>\+\+|\+|~)?(?P<key>[A-Za-z_][A-Za-z0-9_.@/-]*)(=.*)?", re.DOTALL)


def _is_overrides_file(text: str) -> bool:
    """Every line a comment, blank, or a Hydra override of a dotted key (`a.b=v`, `+a.b=v`, `~a.b`).

    A shell script has a command line (`python3 -m ...`), and its variable assignments have no dots.
    """
    lines = [line.strip() for line in text.split("\n")]
    overrides = [line for line in lines if line and not line.startswith("#")]

    def is_override(line: str) -> bool:
        match = _OVERRIDE_LINE.fullmatch(line)
        return match is not None and (match.group("prefix") is not None or "." in match.group("key"))

    return bool(overrides) and all(is_override(line) for line in overrides)


def _overrides_from_file(text: str) -> list[str]:
    lines = (line.strip() for line in text.split("\n"))
    return [line for line in lines if line and not line.startswith("#")]


class _Values:
    """The script's modeled values with verl's defaults behind them, interpolations resolved."""

    def __init__(self, given: dict[str, str], passthrough: dict[str, str], pinned: dict[str, str],
                 environment: dict[str, str], table: dict[str, VerlKey]) -> None:
        self.table = table
        self.given = given
        self.passthrough = passthrough
        self.pinned = pinned
        self.environment = environment
        self.resolving: set[str] = set()
        self.resolved: dict[str, Any] = {}

    def field_value(self, field: str) -> Any:
        entry = self.table[field]
        if field in self.resolved:
            return self.resolved[field]
        if entry.key in self.resolving:
            raise PlanError(field=entry.key, message="refers to itself through interpolations.",
                            fix="replace the interpolation with a value")
        self.resolving.add(entry.key)
        raw = self.given.get(entry.key)
        if raw is None:
            value: Any = entry.default
            if isinstance(value, str) and "${" in value:
                value = self._interpolate(Interpolation(value), entry.key)
        else:
            try:
                parsed = parse_value(raw)
            except HydraSyntaxError as exc:
                raise PlanError(field=entry.key, message=f"has a value Hydra cannot parse ({exc}): {raw!r}.",
                                fix="quote the value") from None
            if isinstance(parsed, Interpolation):
                parsed = self._interpolate(parsed, entry.key)
                if isinstance(parsed, str) and entry.kind in ("int", "float", "bool"):
                    parsed = parse_value(parsed)
            value = coerce(entry, parsed, raw)
        if isinstance(value, Follows):
            value = self.field_value(value.field)
        self.resolving.discard(entry.key)
        self.resolved[field] = value
        return value

    def _interpolate(self, value: Interpolation, key: str) -> Any:
        pieces = re.split(r"(\$\{[^{}]*\})", value.text)
        resolved = [self._reference(piece[2:-1], key) if piece.startswith("${") else piece for piece in pieces]
        meaningful = [piece for piece in resolved if piece != ""]
        if len(meaningful) == 1 and len(pieces) == 3 and not pieces[0] and not pieces[2]:
            return meaningful[0]
        return "".join("" if piece is None else str(piece) for piece in resolved)

    def _reference(self, expression: str, key: str) -> Any:
        expression = expression.strip()
        if expression.startswith("oc.env:"):
            name, _, default = expression[len("oc.env:") :].partition(",")
            name = name.strip()
            if name in self.pinned:
                return self.pinned[name]
            if name in self.environment:
                # The plan would keep the value of a modeled key, and no environment value is copied into a plan
                # unless --env asks for it (a secret, a home directory, a token).
                raise PlanError(field=key, message=f"takes its value from the environment variable {name}, which "
                                "an import does not copy into a plan.",
                                fix=f"pass --env {name}=VALUE to write that value into the plan")
            if not default:
                raise PlanError(field=key, message=f"reads the environment variable {name}, which is not set.",
                                fix=f"pass --env {name}=VALUE")
            return parse_value(default)
        if expression in BY_KEY and BY_KEY[expression].field in self.table:
            return self.field_value(BY_KEY[expression].field)
        if expression in self.passthrough:
            return parse_value(self.passthrough[expression])
        raise PlanError(field=key, message=f"interpolates ${{{expression}}}, which rlplan cannot resolve.",
                        fix="replace the interpolation with its value")


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for dotted, value in flat.items():
        node = nested
        parts = dotted.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return nested


def _resolve_model(model_path: str, local_config_reader: LocalConfigReader, warnings: list[str]) -> ResolvedModel:
    """A preset by repo id, a local config.json, or - for a local path not on this machine (scripts
    are often imported away from the cluster) - the preset its directory name is a repo name of."""
    config = local_config_reader(model_path)
    try:
        return resolve_model(model_path, config)
    except PlanError as error:
        directory = model_path.rstrip("/").rpartition("/")[2]
        if config is None and directory and directory != model_path:
            try:
                resolved = resolve_model(directory)
            except PlanError:
                pass
            else:
                warnings.append(f"{model_path} is not readable here; its name matches the preset {resolved.name}, "
                                "whose architecture the plan uses.")
                return resolved
        raise PlanError(field="actor_rollout_ref.model.path", message=error.message,
                        fix="run the import where the model directory is readable, or use a hub repo id a preset "
                        "lists") from None


CONTEXT_OVERRIDE_KEY = f"{ARF}.model.override_config.max_position_embeddings"


def _with_overridden_context(resolved: ResolvedModel, passthrough: dict[str, str],
                             warnings: list[str]) -> ResolvedModel:
    """verl applies `model.override_config` to the HF config it loads: a raised max_position_embeddings
    (DAPO's Qwen2.5-Math-7B at 32768) is the model's context for the run.  The key stays passthrough,
    so a rendered script still sets it."""
    raw = next((passthrough[key] for key in (f"+{CONTEXT_OVERRIDE_KEY}", f"++{CONTEXT_OVERRIDE_KEY}",
                                              CONTEXT_OVERRIDE_KEY) if key in passthrough), None)
    if raw is None:
        return resolved
    value = parse_value(raw)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(field=CONTEXT_OVERRIDE_KEY, message=f"must be a positive integer, got {raw!r}.",
                        fix=f"set {CONTEXT_OVERRIDE_KEY} to the context in tokens, e.g. 32768")
    warnings.append(f"{CONTEXT_OVERRIDE_KEY}={value} is applied to the model's context "
                    f"({resolved.arch.max_position_embeddings} in its config), as verl applies it to the HF "
                    "config.")
    return attrs.evolve(resolved, arch=attrs.evolve(resolved.arch, max_position_embeddings=value))


def _build_plan(fields: dict[str, Any], gpu: GpuSpec, host_memory_gib: float, resolved: ResolvedModel) -> Plan:
    data = _nest(fields)
    data["model"].update(name=resolved.name, arch=attrs.asdict(resolved.arch))
    data["cluster"].update(gpu=attrs.asdict(gpu), host_memory_gib=host_memory_gib)
    try:
        plan = plan_from_dict(data)
    except PlanError as exc:
        if exc.field == "cluster.host_memory_gib":
            raise PlanError(field="--host-mem", message=exc.message, fix="pass --host-mem in GiB") from None
        entry = BY_FIELD.get(exc.field)
        if entry is None:
            raise
        raise PlanError(field=entry.key, message=exc.message, fix=f"correct {entry.key} (plan field {exc.field})") from None
    try:
        return plan.evolve(cluster=Cluster(gpu=gpu, nodes=plan.cluster.nodes,
                                           gpus_per_node=plan.cluster.gpus_per_node,
                                           host_memory_gib=host_memory_gib))
    except PlanError as exc:
        raise PlanError(field="--host-mem", message=exc.message, fix="pass --host-mem in GiB") from None


def with_target_stack(plan: Plan, given: dict[str, str], passthrough: dict[str, str], text: str,
                      versions: tuple[str | None, str | None, str | None], warnings: list[str]) -> Plan:
    """The imported plan on its target stack: the version flags, else what the script shows (said as a warning),
    with that stack's defaults for the keys the script leaves out (planner/stack.py)."""
    from rlplan.planner.knobs import apply_knobs
    from rlplan.planner.stack import infer_stack, stack_defaults, stack_from_flags

    ranges = {entry.key: (entry.since, entry.before) for entry in VERL_KEYS}
    inferred = infer_stack(given, passthrough, text, ranges, plan.rollout.name)
    stack = inferred.stack if inferred is not None else plan.stack
    if inferred is not None:
        flagged = [name for name, value in zip(("verl", "vllm", "sglang"), versions, strict=True) if value]
        overruled = f"; --{'-version, --'.join(flagged)}-version given instead" if flagged else ""
        warnings.append(f"target stack inferred from the script: {'; '.join(inferred.reasons)}{overruled}.")
    stack = stack_from_flags(stack, *versions)
    omitted = {field: value for field, value in stack_defaults(stack, plan.rollout.name).items()
               if BY_FIELD[field].key not in given}
    if omitted:
        warnings.append(f"keys the script leaves out take verl {stack.verl}'s defaults: "
                        + ", ".join(f"{BY_FIELD[field].key}={value}" for field, value in omitted.items()) + ".")
    return apply_knobs(plan.evolve(stack=stack), omitted)


def import_verl_script(text: str, *, gpu: GpuSpec, host_memory_gib: float, env: dict[str, str],
                       local_config_reader: LocalConfigReader, environment: dict[str, str] | None = None,
                       versions: tuple[str | None, str | None, str | None] = (None, None, None)) -> ImportResult:
    """A verl launch script or a file of Hydra overrides -> plan, warnings, passthrough keys.

    `env` holds --env KEY=VALUE pins (they win over the script's own assignments);
    `environment` is the process environment the script would inherit; `versions` the
    --verl-version / --vllm-version / --sglang-version flags.
    """
    warnings: list[str] = []
    config_name = ""
    alloc_conf: str | None = None
    if _is_overrides_file(text):
        overrides = _overrides_from_file(text)
    else:
        found = _overrides_from_script(text, env, environment or {}, warnings)
        if found is None:
            raise PlanError(field="script", message="has no `python -m verl...` / `-m recipe...` command, and is not "
                            "a file of Hydra overrides (one key=value per line).",
                            fix="import the script that launches verl.trainer.main_ppo")
        overrides, config_name, alloc_conf = found
    backend = _backend(config_name, overrides)
    table = table_for(backend)
    given: dict[str, str] = {}
    passthrough: dict[str, str] = {}
    reward: dict[str, str] = {}
    seen: dict[str, str | None] = {}
    for raw in overrides:
        override = Override.parse(raw)
        key = KEY_ALIASES.get(override.key, override.key)
        if key != override.key:
            warnings.append(f"{override.key} is verl's older spelling of {key}; read as {key}.")
        if key in seen and seen[key] != override.value:
            warnings.append(f"{key} is set twice ({seen[key]} and {override.value}); the last one wins, as in Hydra.")
        seen[key] = override.value
        if override.prefix == "~" or override.value is None:
            passthrough[f"~{override.key}"] = override.value or ""
            continue
        if key in BY_KEY and backend_has(key, backend):
            given[key] = override.value
        elif key in BY_KEY:
            # The other backend's key: verl's config for this one ignores it (or Hydra refuses it); kept as
            # written, so rules (lora_keys_the_backend_ignores, ...) can name it.
            warnings.append(f"{key} is a plan key only on {'an FSDP' if backend == 'megatron' else 'a Megatron'} "
                            "plan; kept as passthrough, rendered back unchanged.")
            passthrough[f"{override.prefix}{override.key}"] = override.value
        elif key in (REWARD_PATH_KEY, REWARD_NAME_KEY):
            reward[key] = override.value
        else:
            near = difflib.get_close_matches(key, KNOWN_KEYS, n=1, cutoff=0.9)
            if near:
                warnings.append(f"{key} is not a verl key rlplan models; did you mean {near[0]}? Kept as passthrough.")
            passthrough[f"{override.prefix}{override.key}"] = override.value
    values = _Values(given, passthrough, dict(env), dict(environment or {}), table)
    fields = {field: values.field_value(field) for field in table}
    for key, field in RENDER_ALSO.items():
        # A render writes these from the plan; when they agree with it they carry nothing more.
        if key in passthrough and parse_value(passthrough[key]) == fields[field]:
            del passthrough[key]
    model_path = fields.pop("model.path")
    if not model_path:
        raise PlanError(field="actor_rollout_ref.model.path", message="the script does not say which model it trains.",
                        fix="add actor_rollout_ref.model.path=<hub repo id or local directory>")
    fields["model.path"] = model_path
    _warn_about_algorithm_defaults(given, fields, warnings)
    if "actor_rollout_ref.rollout.name" not in given:
        warnings.append("verl requires actor_rollout_ref.rollout.name; the import assumes vllm.")
    fields["rollout.sleep_level"] = verl_sleep_level(fields["model.lora.rank"] > 0, fields["rollout.layered_summon"])
    fields["reward.function"] = _reward_function(reward)
    resolved = _resolve_model(str(model_path), local_config_reader, warnings)
    resolved = _with_overridden_context(resolved, passthrough, warnings)
    plan = with_target_stack(_build_plan(fields, gpu, host_memory_gib, resolved), given, passthrough, text, versions,
                             warnings)
    kept = tuple(passthrough)
    if kept:
        warnings.append(f"kept {len(kept)} verl key(s) rlplan does not model, rendered back unchanged: {', '.join(kept)}.")
    if alloc_conf is not None:
        from rlplan.planner.memory.allocator import parse_alloc_conf

        parse_alloc_conf(alloc_conf, ALLOC_CONF)  # a value torch would refuse is refused here, by name
        plan = plan.evolve(trainer=attrs.evolve(plan.trainer, pytorch_cuda_alloc_conf=alloc_conf))
    return ImportResult(plan=plan.evolve(passthrough=passthrough), warnings=tuple(warnings), passthrough_keys=kept)


def _warn_about_algorithm_defaults(given: dict[str, str], fields: dict[str, Any], warnings: list[str]) -> None:
    """Say where a verl default, not the script, decides the algorithm or a batch: the plan follows verl
    (that is what the script runs), and the user may not know it."""
    estimator = BY_FIELD["algorithm.adv_estimator"]
    if estimator.key not in given:
        critic = "with a critic (PPO): the plan trains one too" if fields.get("critic.enable") is not False else ""
        warnings.append(f"the script sets no {estimator.key}, so verl runs its default, {estimator.default}"
                        f"{', ' + critic if critic else ''}. Add {estimator.key}=grpo to the script (or --env) if it "
                        "means GRPO.")
    for micro, dynamic in DYNAMIC_BSZ_IGNORES:
        micro_key, dynamic_key = BY_FIELD[micro].key, BY_FIELD[dynamic].key
        if micro_key in given and fields.get(dynamic):
            warnings.append(f"{micro_key} = {given[micro_key]} is ignored by verl: {dynamic_key} is true, so "
                            "batches are cut by tokens (the *_max_token_len_per_gpu budget) instead.")


# (a micro batch size, the dynamic-batch switch under which verl ignores it)
DYNAMIC_BSZ_IGNORES = (
    ("actor.ppo_micro_batch_size_per_gpu", "actor.use_dynamic_bsz"),
    ("rollout.log_prob_micro_batch_size_per_gpu", "rollout.log_prob_use_dynamic_bsz"),
    ("ref.log_prob_micro_batch_size_per_gpu", "ref.log_prob_use_dynamic_bsz"),
    ("critic.ppo_micro_batch_size_per_gpu", "critic.use_dynamic_bsz"),
    ("critic.forward_micro_batch_size_per_gpu", "critic.use_dynamic_bsz"),
)


def _backend(config_name: str, overrides: list[str]) -> Backend:
    """Megatron when the command runs verl's Megatron trainer config, or sets the actor's strategy to megatron."""
    strategy_key = f"{ARF}.actor.strategy"
    for raw in overrides:
        override = Override.parse(raw)
        if override.key == strategy_key and override.value is not None:
            config_name = "megatron" if override.value.strip("'\"") == "megatron" else "fsdp"
    return "megatron" if "megatron" in config_name else "fsdp"


def _reward_function(reward: dict[str, str]) -> str:
    path_raw = reward.get(REWARD_PATH_KEY)
    path = parse_value(path_raw) if path_raw is not None else None
    if not path:
        return ""
    name_raw = reward.get(REWARD_NAME_KEY)
    name = parse_value(name_raw) if name_raw is not None else None
    return f"{path}:{name or DEFAULT_REWARD_NAME}"

"""A verl launch script (or a file of Hydra overrides) -> a plan.

Reads what verl users write: a bash script whose `python3 -m verl.trainer.main_ppo` (or
`-m recipe....`) command carries Hydra overrides over many `\\`-continued lines, with
comments, quotes, lists, `+key=value`, `~key`, and shell variables (`${VAR:-x}`, `${VAR}`,
`$VAR`, `$((...))`) set by the script itself, by `--env KEY=VALUE`, or by the environment.
A variable the verl command needs but nothing sets is a PlanError naming it.

Every key `verl_keys` maps becomes a plan field, keys the script omits take verl's own
defaults (so `rlplan validate` sees what verl would run), deprecated global micro-batch
keys stay global (the batch rules normalize them as verl does), and every other key is kept
verbatim in `plan.passthrough` and reported.  Pure: the CLI reads the files.
The shell itself (lexing, variables, finding the verl command) is interpreted in shell_script.py.
"""

from __future__ import annotations

import difflib
import posixpath
import re
from collections.abc import Callable, Iterable
from typing import Any

import attrs
from attrs import frozen

from rlplan.planner.errors import PlanError
from rlplan.planner.hardware import Cluster, GpuSpec
from rlplan.planner.megatron_overrides import lift_megatron_overrides, lift_mtp
from rlplan.planner.plan import RECIPES, Plan, RolloutPool
from rlplan.planner.planfile import plan_from_dict
from rlplan.planner.presets import HUB_REPO_ID, ResolvedModel, resolve_model
from rlplan.planner.redaction import is_secret, reference
from rlplan.planner.shell_expand import ShellScope
from rlplan.planner.shell_script import find_verl_command, positional_warning
from rlplan.planner.verl_config import TextReader, TrainerConfig, source_tree_defaults, trainer_config
from rlplan.planner.verl_keys import (
    ARF,
    BY_FIELD,
    BY_KEY,
    CONTEXT_OVERRIDE_KEY,
    CONTEXT_OVERRIDE_KEYS,
    DEFAULT_REWARD_NAME,
    KEY_ALIASES,
    MEGATRON_CONTEXT_OVERRIDE_KEY,
    RENDER_ALSO,
    REWARD_NAME_KEY,
    REWARD_PATH_KEY,
    WARMUP_RATIO_KEY,
    Backend,
    Follows,
    HydraSyntaxError,
    Interpolation,
    VerlKey,
    backend_has,
    coerce,
    format_value,
    parse_value,
    table_for,
    value_alias,
)

KNOWN_KEYS = sorted({*BY_KEY, REWARD_PATH_KEY, REWARD_NAME_KEY})
LocalConfigReader = Callable[[str], "dict[str, Any] | FoundConfig | None"]


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


@frozen(kw_only=True)
class ScriptContext:
    """Where a script is imported from, as bash would run it there: the folder (PWD, where `python3 -m` finds
    verl and its configs), the path the script was given by ($0), its arguments ($1 ...), and the reader of
    the files its command names (a recipe's config). The default knows no folder and reads nothing."""

    cwd: str | None = None
    script: str = "script.sh"
    arguments: tuple[str, ...] = ()
    read_text: TextReader = attrs.field(default=lambda path: None)


@frozen(kw_only=True)
class _Command:
    module: str
    line: int
    overrides: tuple[str, ...]
    config_path: str | None
    config_name: str | None
    scope: ShellScope | None


_CONFIG_FLAGS = {"--config-name": "name", "-cn": "name", "--config-path": "path", "-cp": "path"}


def _command_from_script(text: str, env: dict[str, str], environment: dict[str, str], context: ScriptContext,
                         warnings: list[str]) -> _Command | None:
    """The verl command's Hydra overrides, module and config flags, read as bash reads the script."""
    scope = ShellScope(env, environment, cwd=context.cwd, script=context.script, arguments=context.arguments)
    command, count = find_verl_command(text, scope)
    if command is None:
        return None
    if count > 1:
        warnings.append(f"the script runs verl {count} times; imported the first command ({command.module}, line "
                        f"{command.line}).")
    _script_warnings(scope, warnings)
    overrides: list[str] = []
    config: dict[str, str | None] = {"name": None, "path": None}
    arguments = list(command.arguments)
    while arguments:
        argument = arguments.pop(0)
        if not argument.startswith("-"):
            overrides.append(argument)
            continue
        name, sep, value = argument.partition("=")
        if name in _CONFIG_FLAGS:
            if not sep and arguments:
                value = arguments.pop(0)
            if scope.unknowns_in(value):
                warnings.append(f"{name} is {scope.verbatim(value)}, which rlplan cannot know "
                                f"({scope.unknowns_in(value)[0].describe()}); the config is read as unknown.")
                value = "\ue000"
            config[_CONFIG_FLAGS[name]] = value.strip("'\"")
        else:
            warnings.append(f"ignored the command-line flag {scope.verbatim(argument)}.")
    return _Command(module=command.module, line=command.line, overrides=tuple(overrides), config_path=config["path"],
                    config_name=config["name"], scope=scope)


def _script_warnings(scope: ShellScope, warnings: list[str]) -> None:
    """What the import assumed while reading the script as bash would: arguments, branches, this machine."""
    positional = positional_warning(scope)
    if positional:
        warnings.append(positional)
    if scope.decided_on_unset:
        shown = ", ".join(f"${name} (branch {taken})" for name, taken in scope.decided_on_unset.items())
        first = next(iter(scope.decided_on_unset))
        warnings.append(f"the script branches on variables not set here, read as empty as bash reads them: {shown}. "
                        f"Pass --env {first}=VALUE to take the other branch.")
    if scope.branch_assigned:
        names = sorted(scope.branch_assigned)
        warnings.append(f"the script branches (if/case) on what rlplan cannot decide and assigns {', '.join(names)} "
                        f"there; the import read the assignments in order. Pass --env {names[0]}=VALUE to choose "
                        "the branch's value.")
    if scope.machine_paths_used:
        shown = ", ".join(f"${name} = {value}" for name, value in scope.machine_paths_used.items())
        first = next(iter(scope.machine_paths_used))
        warnings.append(f"the script's paths use this machine's {shown}; the plan holds those paths, frozen, and "
                        f"the cluster's may differ. Pass --env {first}=<the path on the cluster> to import theirs.")
    if scope.kept_references:
        warnings.append(f"values from the environment are kept as references, not copied into the plan: "
                        f"{', '.join(scope.kept_references)}.")
    if scope.secrets_used:
        names = sorted(set(scope.secrets_used))
        warnings.append(f"{', '.join(names)} hold{'s' if len(names) == 1 else ''} a credential (by name or shape); the "
                        f"plan keeps {', '.join(reference(name) for name in names)} instead of the value: export "
                        f"{'it' if len(names) == 1 else 'them'} where verl runs.")


FSDP_CONFIGS = ("ppo_trainer", "ppo_trainer.yaml")
MEGATRON_CONFIGS = ("ppo_megatron_trainer", "ppo_megatron_trainer.yaml")


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


@frozen(kw_only=True)
class FoundConfig:
    """A model's config.json found on this machine: in a local folder (verl's checkpoint layout included) or
    in the local Hugging Face cache, and the file it was read from."""

    config: dict[str, Any]
    source: str
    in_hub_cache: bool = False


def _found(found: dict[str, Any] | FoundConfig | None, model_path: str) -> FoundConfig | None:
    if found is None or isinstance(found, FoundConfig):
        return found
    return FoundConfig(config=found, source=model_path)


def _resolve_model(model_path: str, local_config_reader: LocalConfigReader, warnings: list[str]) -> ResolvedModel:
    """As verl loads it: a local folder first (its config.json, or verl's checkpoint layout under it); then a
    hub id a preset lists, else its config.json in the local Hugging Face cache; then, for a local path not on
    this machine (scripts are often imported away from the cluster), the preset its folder's name lists."""
    spec = model_path.strip()
    found = _found(local_config_reader(spec), spec)
    if found is not None and not found.in_hub_cache:
        if found.source.rstrip("/") not in (spec.rstrip("/"), f"{spec.rstrip('/')}/config.json"):
            warnings.append(f"read the model's architecture from {found.source}.")
        return resolve_model(spec, found.config)
    try:
        return resolve_model(spec)
    except PlanError as unresolved:
        error = unresolved
        if found is not None:
            warnings.append(f"read {spec}'s architecture from the local Hugging Face cache: {found.source}.")
            return resolve_model(spec, found.config)
        folder = spec.rstrip("/").rpartition("/")[2]
        if folder and folder != spec and not HUB_REPO_ID.fullmatch(spec):
            try:
                resolved = resolve_model(folder)
            except PlanError as by_folder:
                if "is not supported" in by_folder.message:  # a release rlplan recognises by name and refuses
                    error = by_folder
            else:
                warnings.append(f"{spec} is not readable here; its name matches the preset {resolved.name}, "
                                "whose architecture the plan uses.")
                return resolved
        if "is not supported" in error.message:
            raise PlanError(field="actor_rollout_ref.model.path", message=error.message, fix=error.fix) from None
        raise _model_not_found(spec, error) from None


# A model path a script ships as a stand-in for the user's own: `<path_to_...>`, `/YOUR_MODELPATH`, `path/to/model`,
# or a bare word naming what belongs there (`model_path`, `ref_model_path`: no folder here, no hub repo id).
_PLACEHOLDER = re.compile(r"<[^<>]*>|(?:^|[/_.\-])your[/_.\-]|path[/_]to[/_]|^[a-z_]*(?:model|ckpt|checkpoint)_?(?:path|dir)$",
                          re.IGNORECASE)
CANNOT_RUN_AS_SHIPPED = "the script cannot run as shipped"


def _model_not_found(spec: str, error: PlanError) -> PlanError:
    if _PLACEHOLDER.search(spec):
        # verl's main_ppo (TaskRunner.run, v0.3-v0.7) loads the tokenizer from the model path first
        # (copy_to_local, then hf_tokenizer): a placeholder exists on no machine and is no hub repo id.
        return PlanError(field="actor_rollout_ref.model.path",
                         message=f"is {spec!r}, a placeholder the script ships in place of a model: verl loads the "
                         f"tokenizer from it first (main_ppo: copy_to_local, hf_tokenizer) and fails on any machine, "
                         f"so {CANNOT_RUN_AS_SHIPPED}.",
                         fix="set the model: --env NAME=PATH for the variable the script reads it from, or write "
                         "it into actor_rollout_ref.model.path")
    if HUB_REPO_ID.fullmatch(spec):
        return PlanError(field="actor_rollout_ref.model.path",
                         message=f"{error.message.rstrip('.')}, and the local Hugging Face cache has no config.json "
                         "for it (rlplan downloads nothing).",
                         fix=f"fetch just its config.json (a few KB, into that cache, where the import looks): "
                         f"`hf download {spec} config.json`")
    return PlanError(field="actor_rollout_ref.model.path",
                     message=f"{spec!r} is not on this machine (no config.json in that folder, nor in "
                     "actor/huggingface/ under it, where verl's checkpoints keep it), and its folder's name is no "
                     "preset.",
                     fix="import where the model folder is, or copy its config.json there (a verl checkpoint's is "
                     "global_step_N/actor/huggingface/config.json), or pass --env to point the script at a hub "
                     "repo id")


def _context_override_read(plan: Plan) -> str:
    """The spelling of the positions override whose value the rollout's HF config takes on the plan's release and
    backend (stack.ROLLOUT_HF_MODEL_CONFIG): from v0.6.0 override_config.model_config.* where the script sets any
    key under it, else override_config.*; before, FSDP's trainer config (override_config.*) or Megatron's
    (override_config.model_config.* only)."""
    from rlplan.planner.stack import ROLLOUT_HF_MODEL_CONFIG, holds

    if holds(ROLLOUT_HF_MODEL_CONFIG, plan.stack):
        nested = MEGATRON_CONTEXT_OVERRIDE_KEY.rsplit(".", 1)[0] + "."
        sets_nested = any(key.lstrip("+~").startswith(nested) for key in plan.passthrough)
        return MEGATRON_CONTEXT_OVERRIDE_KEY if sets_nested else CONTEXT_OVERRIDE_KEY
    return MEGATRON_CONTEXT_OVERRIDE_KEY if plan.is_megatron else CONTEXT_OVERRIDE_KEY


def with_overridden_context(plan: Plan, warnings: list[str]) -> Plan:
    """verl applies `model.override_config` to the HF config its rollout checks: a raised max_position_embeddings
    (DAPO's Qwen2.5-Math-7B at 32768) is the model's context for the run, in the spelling the plan's release and
    backend read (`_context_override_read`); a spelling it ignores is said as a warning, naming the one it reads.
    The keys stay passthrough, so a rendered script still sets them."""
    written = {name: plan.passthrough[prefix + name] for name in CONTEXT_OVERRIDE_KEYS
               for prefix in ("", "+", "++") if prefix + name in plan.passthrough}
    if not written:
        return plan
    read = _context_override_read(plan)
    backend = "Megatron" if plan.is_megatron else "FSDP"
    for name in written:
        if name != read:
            warnings.append(f"{name} is ignored: verl {plan.stack.verl}'s rollout with the {backend} backend reads "
                            f"the model's context from {read} (stack.py ROLLOUT_HF_MODEL_CONFIG), so the model keeps "
                            f"{plan.model.arch.max_position_embeddings} positions.")
    if read not in written:
        return plan
    raw = written[read]
    value = parse_value(raw)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(field=read, message=f"must be a positive integer, got {raw!r}.",
                        fix=f"set {read} to the context in tokens, e.g. 32768")
    warnings.append(f"{read}={value} is applied to the model's context "
                    f"({plan.model.arch.max_position_embeddings} in its config), as verl {plan.stack.verl} applies it "
                    "to the HF config its rollout checks.")
    arch = attrs.evolve(plan.model.arch, max_position_embeddings=value)
    return plan.evolve(model=attrs.evolve(plan.model, arch=arch))


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


def with_target_stack(plan: Plan, given: dict[str, str], written: dict[str, str], text: str,
                      versions: tuple[str | None, str | None, str | None], warnings: list[str],
                      installed: str | None = None) -> Plan:
    """The imported plan on its target stack: the version flags, else what the script shows (said as a warning;
    planner/stack_inference.py), with that stack's defaults for the keys the script leaves out (planner/stack.py)."""
    from rlplan.planner.knobs import apply_knobs
    from rlplan.planner.stack import SPIN_SPPO_RECIPES, stack_defaults, stack_from_flags
    from rlplan.planner.stack_inference import infer_stack

    needs = (SPIN_SPPO_RECIPES,) if plan.algorithm.recipe is not None else ()
    inferred = infer_stack(written, text, "megatron" if plan.is_megatron else "fsdp", plan.rollout.name, installed,
                           needs)
    stack = inferred.stack if inferred is not None else plan.stack
    if inferred is not None:
        flagged = [name for name, value in zip(("verl", "vllm", "sglang"), versions, strict=True) if value]
        overruled = f"; --{'-version, --'.join(flagged)}-version given instead" if flagged else ""
        warnings.append(f"target stack inferred from the script: {'; '.join(inferred.reasons)}{overruled}.")
    stack = stack_from_flags(stack, *versions)
    if versions[0] is not None:  # --verl-version names the release: no range is left to judge
        stack = attrs.evolve(stack, verl_oldest=None)
    omitted = {field: value for field, value in stack_defaults(stack, plan.rollout.name).items()
               if BY_FIELD[field].key not in given}
    if omitted:
        warnings.append(f"keys the script leaves out take verl {stack.verl}'s defaults: "
                        + ", ".join(f"{BY_FIELD[field].key}={value}" for field, value in omitted.items()) + ".")
    return apply_knobs(plan.evolve(stack=stack), omitted)


# Plan fields no memory, time or rule term reads: a value rlplan cannot know there (a dated experiment name, a
# data folder from an unset variable) passes through verbatim instead of blocking the import.
UNPRICED_FIELDS = frozenset({
    "data.train_files", "data.val_files", "data.prompt_key", "data.shuffle", "data.seed",
    "trainer.total_epochs", "trainer.total_training_steps", "trainer.save_freq", "trainer.test_freq",
    "trainer.project_name", "trainer.experiment_name", "trainer.logger", "trainer.output_dir", "trainer.seed",
    "trainer.val_before_train", "trainer.max_checkpoints_to_keep",
    "actor.lr", "actor.weight_decay", "actor.lr_warmup_steps", "actor.grad_clip", "actor.clip_ratio_low",
    "actor.clip_ratio_high", "actor.clip_ratio_c", "actor.kl_loss_coef", "actor.entropy_coeff",
    "critic.lr", "critic.cliprange_value", "critic.grad_clip",
    "algorithm.gamma", "algorithm.lam", "algorithm.kl_coef", "model.lora.adapter_path", "rollout.top_p",
})


def priced(key: str) -> bool:
    """Whether a plan term depends on the key's value (then a value rlplan cannot know blocks the import)."""
    return (key in BY_KEY and BY_KEY[key].field not in UNPRICED_FIELDS) or key == CONTEXT_OVERRIDE_KEY


@frozen(kw_only=True)
class _Sorted:
    """The command's overrides by what they are to the plan."""

    given: dict[str, str]
    passthrough: dict[str, str]
    reward: dict[str, str]
    # key -> the verbatim value of a key whose value rlplan cannot know, passed through.
    unknowable: dict[str, str]
    # Every override as the script spells it (prefix and key) -> its value: the stack inference's evidence.
    written: dict[str, str]


def _read_command(text: str, env: dict[str, str], environment: dict[str, str], context: ScriptContext,
                  warnings: list[str]) -> _Command:
    if _is_overrides_file(text):
        return _Command(module="verl.trainer.main_ppo", line=0, overrides=tuple(_overrides_from_file(text)),
                        config_path=None, config_name=None, scope=None)
    found = _command_from_script(text, env, environment, context, warnings)
    if found is None:
        raise PlanError(field="script", message="has no `python -m verl...` / `-m recipe...` command, and is not "
                        "a file of Hydra overrides (one key=value per line).",
                        fix="import the script that launches verl.trainer.main_ppo")
    return found


def _unknown_value(override: Override, key: str, scope: ShellScope, sorted_: _Sorted) -> None:
    """An override whose value holds what rlplan cannot know: passed through verbatim, or refused when a plan
    term depends on it (the model: unless its folder's name, known, names a preset)."""
    assert override.value is not None
    unknowns = scope.unknowns_in(override.value)
    verbatim = scope.verbatim(override.value)
    tail = override.value.rpartition("/")[2]
    if key == BY_FIELD["model.path"].key and "/" in override.value and tail and not scope.unknowns_in(tail):
        sorted_.given[key] = format_value(verbatim)
        sorted_.unknowable[key] = verbatim
        return
    if priced(key):
        first = unknowns[0]
        others = f" (and {len(unknowns) - 1} more unknown part(s))" if len(unknowns) > 1 else ""
        raise PlanError(field=key, message=f"is {verbatim}: it needs {first.describe()}{others}, and the plan "
                        "depends on this key. rlplan runs no command and reads no variable it is not given.",
                        fix=f"{first.how}, or write the value in the script")
    sorted_.passthrough[f"{override.prefix}{override.key}"] = format_value(verbatim)
    sorted_.unknowable[key] = verbatim


def _without_literal_secret(override: Override, pinned_values: set[str], warnings: list[str]) -> Override:
    """A credential written into the command itself (`...env_vars.HF_TOKEN=hf_...`, a key named as one or a value
    shaped like one) is kept as the reference verl resolves from its environment, never copied (redaction.py);
    a value the user gave with --env is theirs to persist."""
    assert override.value is not None
    name = override.key.rpartition(".")[2]
    if "${oc.env:" in override.value or not is_secret(name, override.value):
        return override
    if any(len(value) >= 4 and value in override.value for value in pinned_values):
        return override
    warnings.append(f"{override.key} holds a credential; the plan keeps {reference(name)} instead of its value: "
                    f"export {name} where verl runs.")
    return attrs.evolve(override, value=reference(name))


def _sort_overrides(command: _Command, backend: Backend, warnings: list[str], pinned: set[str],
                    pinned_values: set[str]) -> _Sorted:
    sorted_ = _Sorted(given={}, passthrough={}, reward={}, unknowable={}, written={})
    seen: dict[str, str | None] = {}
    scope = command.scope
    for raw in command.overrides:
        if not raw.strip():
            raise PlanError(field="script", message=f"the verl command (line {command.line}) gets an argument that is "
                            "only whitespace, which Hydra refuses: a backslash followed by a space escapes the "
                            "space instead of continuing the line, so bash ends the command there and runs the lines "
                            f"after it as a command of their own: {CANNOT_RUN_AS_SHIPPED}.",
                            fix="remove the space after that backslash (or the comment after it)")
        override = Override.parse(raw)
        if override.value is not None:  # as spelled, for the stack inference (an older spelling dates the script)
            sorted_.written[f"{override.prefix}{override.key}"] = override.value
        if scope is not None and scope.unknowns_in(override.key):
            unknown = scope.unknowns_in(override.key)[0]
            raise PlanError(field=scope.verbatim(raw), message=f"names its key through {unknown.describe()}, so "
                            "rlplan cannot tell which verl key it sets.", fix=unknown.how)
        key = KEY_ALIASES.get(override.key, override.key)
        if key != override.key:
            warnings.append(f"{override.key} is verl's older spelling of {key}; read as {key}.")
        if key in seen and seen[key] != override.value:
            shown = [scope.verbatim(value or "") if scope else value for value in (seen[key], override.value)]
            warnings.append(f"{key} is set twice ({shown[0]} and {shown[1]}); the last one wins, as in Hydra.")
        seen[key] = override.value
        if override.prefix == "~" or override.value is None:
            sorted_.passthrough[f"~{override.key}"] = override.value or ""
            continue
        if scope is not None and scope.unknowns_in(override.value):
            sorted_.given.pop(key, None)
            _unknown_value(override, key, scope, sorted_)
            continue
        sorted_.unknowable.pop(key, None)
        renamed = value_alias(key, override.value)
        if renamed is not None:
            warnings.append(f"{key}={override.value} is {renamed[1]}; read as {renamed[0]}.")
            override = attrs.evolve(override, value=renamed[0])
        override = _without_literal_secret(override, pinned_values, warnings)
        assert override.value is not None
        referenced = set(re.findall(r"\$\{oc\.env:([^,}]*)", override.value))
        if key in BY_KEY and not priced(key) and referenced and not referenced & pinned:
            # An environment value (a data folder, a run name) where no plan term reads it: the reference stays,
            # and verl reads it from the same environment when it runs.
            sorted_.given.pop(key, None)
            sorted_.passthrough[f"{override.prefix}{override.key}"] = override.value
            continue
        if key in BY_KEY and backend_has(key, backend):
            sorted_.given[key] = override.value
        elif key in BY_KEY:
            # The other backend's key: verl's config for this one ignores it (or Hydra refuses it); kept as
            # written, so rules (lora_keys_the_backend_ignores, ...) can name it.
            warnings.append(f"{key} is a plan key only on {'an FSDP' if backend == 'megatron' else 'a Megatron'} "
                            "plan; kept as passthrough, rendered back unchanged.")
            sorted_.passthrough[f"{override.prefix}{override.key}"] = override.value
        elif key in (REWARD_PATH_KEY, REWARD_NAME_KEY):
            sorted_.reward[key] = override.value
        else:
            near = difflib.get_close_matches(key, KNOWN_KEYS, n=1, cutoff=0.9)
            if near:
                warnings.append(f"{key} is not a verl key rlplan models; did you mean {near[0]}? Kept as passthrough.")
            sorted_.passthrough[f"{override.prefix}{override.key}"] = override.value
    if sorted_.unknowable:
        listed = "; ".join(f"{key} = {value}" for key, value in sorted_.unknowable.items())
        warnings.append(f"values rlplan cannot know (command output, unset variables) are kept as the script writes "
                        f"them, since no plan term depends on them: {listed}.")
    return sorted_


def _take_source_tree_switches(installed: str | None, context: ScriptContext, backend: str,
                               passthrough: dict[str, str], written: Iterable[str], warnings: list[str]) -> None:
    """A verl tree between releases (verl/version/version `0.8.0.dev`) may still default a switch its release number
    does not (stack.LEGACY_WORKER_SWITCH): the switches the script leaves unset take the tree's own defaults, kept
    in the passthrough so the rules judge the worker that tree builds, where they change a behaviour of that
    release (a tag's tree, whose version text also ends in .dev, changes none: its defaults are the release's)."""
    from rlplan.planner.stack import source_tree_switches, switch_decides

    if not installed or ".dev" not in installed or context.cwd is None:
        return
    release = installed.strip().splitlines()[0].partition(".dev")[0]
    set_here = {key.lstrip("+~") for key in (*passthrough, *written)}
    tree = source_tree_defaults(context.cwd, context.read_text, backend, source_tree_switches())
    for key, value in sorted(tree.items()):
        try:
            decides = key not in set_here and switch_decides(release, passthrough, key, value)
        except PlanError:  # a release number rlplan cannot read: the import judges it elsewhere
            return
        if decides:
            passthrough[key] = value
            warnings.append(f"this verl tree ({installed.strip()}, between releases) still defaults {key} to "
                            f"{value} in its own trainer config: the plan keeps {key}={value}, judged as that "
                            f"tree runs it.")


def import_verl_script(text: str, *, gpu: GpuSpec, host_memory_gib: float, env: dict[str, str],
                       local_config_reader: LocalConfigReader, environment: dict[str, str] | None = None,
                       versions: tuple[str | None, str | None, str | None] = (None, None, None),
                       context: ScriptContext | None = None) -> ImportResult:
    """A verl launch script or a file of Hydra overrides -> plan, warnings, passthrough keys.

    `env` holds --env KEY=VALUE pins (they win over the script's own assignments);
    `environment` is the process environment the script would inherit; `versions` the
    --verl-version / --vllm-version / --sglang-version flags; `context` where the script runs from.
    """
    warnings: list[str] = []
    context = context or ScriptContext()
    command = _read_command(text, env, environment or {}, context, warnings)
    config = trainer_config(command.module, command.config_path, command.config_name, context.cwd,
                            context.read_text)
    backend = _backend(config.base or config.name, list(command.overrides))
    sorted_ = _sort_overrides(command, backend, warnings, set(env), set(env.values()))
    given, passthrough = sorted_.given, sorted_.passthrough
    given = {**_config_values(config, command.module, backend, given, warnings), **given}
    pool = _placement(given, passthrough, warnings)
    recipe = _recipe(command.module, given, warnings)
    table = table_for(backend)
    values = _Values(given, passthrough, dict(env), dict(environment or {}), table)
    fields = {field: values.field_value(field) for field in table}
    for key, field in RENDER_ALSO.items():
        # A render writes these from the plan; when they agree with it they carry nothing more.
        if key in passthrough and parse_value(passthrough[key]) == fields[field]:
            del passthrough[key]
    model_path = fields.pop("model.path")
    if not model_path:
        model_key = BY_FIELD["model.path"].key
        if model_key in given or model_key in sorted_.written:
            raise PlanError(field=model_key, message="is empty as the script sets it: verl loads the tokenizer from "
                            f"it first (main_ppo: copy_to_local, hf_tokenizer) and fails, so {CANNOT_RUN_AS_SHIPPED}.",
                            fix="set the model: --env NAME=PATH for the variable the script reads it from, or write "
                            "it into actor_rollout_ref.model.path")
        raise PlanError(field=model_key, message="the script does not say which model it trains.",
                        fix="add actor_rollout_ref.model.path=<hub repo id or local directory>")
    fields["model.path"] = model_path
    fields["algorithm.recipe"] = recipe
    if recipe is not None:
        fields["algorithm.adv_estimator"] = None
    else:
        _warn_about_algorithm_defaults(given, fields, warnings)
    if "actor_rollout_ref.rollout.name" not in given:
        warnings.append("verl requires actor_rollout_ref.rollout.name; the import assumes vllm.")
    fields["reward.function"] = _reward_function(sorted_.reward)
    resolved = _resolve_model(str(model_path), local_config_reader, warnings)
    # A file of overrides is no shell: only a script's own commands can export an engine switch.
    script = "" if _is_overrides_file(text) else text
    installed = context.read_text(posixpath.join(context.cwd, "verl", "version", "version")) if context.cwd else None
    _take_source_tree_switches(installed, context, backend, passthrough, sorted_.written, warnings)
    plan = with_target_stack(_build_plan(fields, gpu, host_memory_gib, resolved), given, sorted_.written, script, versions,
                             warnings, installed)
    # The sleep level verl picks (no key of its own) depends on the release: set once the stack is known.
    from rlplan.planner.stack import verl_sleep_level

    plan = plan.evolve(rollout=attrs.evolve(plan.rollout, sleep_level=verl_sleep_level(
        plan.stack, plan.model.lora.enabled, plan.rollout.layered_summon)))
    plan = with_overridden_context(plan.evolve(passthrough=passthrough), warnings)
    _drop_switched_off_warmup_ratio(plan, given, passthrough, warnings)
    # The Megatron settings rlplan types (uneven pipeline, CPU optimizer) leave the passthrough here, once.
    plan = lift_mtp(lift_megatron_overrides(plan.evolve(passthrough=passthrough)))
    if pool is not None:
        plan = plan.evolve(rollout=attrs.evolve(plan.rollout, pool=pool))
    if plan.model.mtp is not None:
        _say_what_mtp_prices(plan, warnings)
    kept = tuple(plan.passthrough)
    unmodeled = [key for key in kept if key.lstrip("+~") not in sorted_.unknowable]
    if unmodeled:
        warnings.append(f"kept {len(unmodeled)} verl key(s) rlplan does not model, rendered back unchanged: "
                        f"{', '.join(unmodeled)}.")
    alloc_conf = _alloc_conf(command.scope)
    if alloc_conf is not None:
        plan = plan.evolve(trainer=attrs.evolve(plan.trainer, pytorch_cuda_alloc_conf=alloc_conf))
    return ImportResult(plan=plan, warnings=tuple(warnings), passthrough_keys=kept)


ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"


def _drop_switched_off_warmup_ratio(plan: Plan, given: dict[str, str], passthrough: dict[str, str],
                                    warnings: list[str]) -> None:
    """A script's explicit actor lr_warmup_steps=0 switches its lr_warmup_steps_ratio off on the legacy FSDP worker
    (stack.WARMUP_ZERO_READS_RATIO does not hold). The plan's 0 renders as verl's -1, which would switch the ratio
    back on (render.py): a ratio the script's verl never reads is dropped, and the import says so."""
    from rlplan.planner.stack import WARMUP_ZERO_READS_RATIO, holds

    steps_key = BY_FIELD["actor.lr_warmup_steps"].key
    ratio_keys = [p + WARMUP_RATIO_KEY for p in ("", "+", "++") if p + WARMUP_RATIO_KEY in passthrough]
    if plan.is_megatron or not ratio_keys or steps_key not in given or parse_value(given[steps_key]) != 0:
        return
    if holds(WARMUP_ZERO_READS_RATIO, plan.stack, passthrough=passthrough):
        return
    for key in ratio_keys:
        warnings.append(f"{key}={passthrough.pop(key)} is dropped: verl {plan.stack.verl}'s FSDP worker reads "
                        f"{steps_key}=0 as no warm-up and never reads the ratio (fsdp_workers.py: the ratio only for "
                        f"lr_warmup_steps < 0); the plan's no warm-up steps renders as verl's -1.")


def _alloc_conf(scope: ShellScope | None) -> str | None:
    """The PYTORCH_CUDA_ALLOC_CONF the script exports or --env pins (None: neither; the importing shell's own is
    not the cluster's), refused by name where torch would refuse it (memory.allocator prices it)."""
    if scope is None or not (ALLOC_CONF in scope.pinned or ALLOC_CONF in scope.assigned_by_script):
        return None
    value = scope.pinned[ALLOC_CONF] if ALLOC_CONF in scope.pinned else scope.values.get(ALLOC_CONF)
    if not isinstance(value, str) or not value.strip():
        return None
    from rlplan.planner.memory.allocator import parse_alloc_conf

    parse_alloc_conf(value, ALLOC_CONF)
    return value


# A recipe's own rollout placement (recipe/one_step_off_policy, recipe/fully_async_policy at v0.6.1 and v0.7.0): the
# rollout on GPUs of its own, the top-level `rollout.nnodes` x `rollout.n_gpus_per_node` (the recipes' configs
# declare both, default 1 x 8: one_step_off_ppo_trainer.yaml, fully_async_ppo_trainer.yaml), beside the trainer's.
_SPLIT_ROLLOUT_KEYS = {"rollout.nnodes": ("nodes", 1), "rollout.n_gpus_per_node": ("gpus_per_node", 8)}
# The fully async trainer's batch: async_training.require_batches mini batches (fully_async_ppo_trainer.yaml: 1).
REQUIRE_BATCHES_KEY = "async_training.require_batches"


def _placement(given: dict[str, str], passthrough: dict[str, str], warnings: list[str]) -> RolloutPool | None:
    """The recipe's rollout pool, its keys taken out of the passthrough (None: colocated); a streamed batch
    (fully async, data.train_batch_size=0) priced as the trainer's step takes it."""
    sizes: dict[str, int] = {}
    for key, (name, _) in _SPLIT_ROLLOUT_KEYS.items():
        for spelling in ("++" + key, "+" + key, key):
            if spelling in passthrough:
                sizes[name] = _whole_number(key, passthrough.pop(spelling))
    streams = given.get("data.train_batch_size", "").strip("'\"") == "0"
    if streams:
        _price_streamed_batch(given, passthrough, warnings, split=bool(sizes))
    if not sizes:
        return None
    for name, default in _SPLIT_ROLLOUT_KEYS.values():
        sizes.setdefault(name, default)
    try:
        return RolloutPool(**sizes, streams=streams)
    except PlanError as error:
        key = next(k for k, (name, _) in _SPLIT_ROLLOUT_KEYS.items() if error.field.endswith("." + name))
        raise PlanError(field=key, message=error.message, fix=f"set {key} to a whole number of at least 1") from None


def _say_what_mtp_prices(plan: Plan, warnings: list[str]) -> None:
    layers = plan.model.mtp_layers
    trained = ("; enable_train adds each depth's layer activations and its own output layer's cross entropy to the "
               "update's loss moment, and their FLOPs (no recompute assumed)") if plan.model.mtp_trained_layers else ""
    warnings.append(f"model.mtp.enable: the actor and the reference are priced with the model's {layers} multi-token-"
                    "prediction layer(s) (arch.mtp_layers, its config's num_nextn_predict_layers; the mimo-7b preset "
                    "takes 2 from XiaomiMiMo/MiMo's config.json, its README says one: a readable model folder's "
                    "config decides) on the last pipeline stage beside a copy of the embedding, in weights, gradients "
                    f"and optimizer state{trained}. The rollout engine does not load them.")


def _recipe(module: str, given: dict[str, str], warnings: list[str]) -> str | None:
    """The verl recipe whose own trainer runs the command's step (plan.RECIPES), said in a warning with what
    is priced and what is assumed; an estimator of null under any other module is refused."""
    recipe = next((name for name, facts in RECIPES.items() if facts.module == module), None)
    if recipe is None:
        if given.get("algorithm.adv_estimator", "").strip("'\"") == "null":
            raise PlanError(field="algorithm.adv_estimator", message=f"is null under {module}, whose trainer rlplan "
                            "does not know: only verl's SPIN and SPPO recipes (recipe.spin.main_spin, "
                            "recipe.sppo.main_sppo) run a step without an advantage estimator.",
                            fix="import a script whose algorithm.adv_estimator is one of verl's estimators")
        return None
    # The recipe's config sets null, which the plan spells as its recipe (no estimator field).
    estimator = given.pop("algorithm.adv_estimator", "null").strip("'\"")
    ignored = f" Its algorithm.adv_estimator={estimator} is never read." if estimator not in ("null", "None") else ""
    if RECIPES[recipe].pair_update:
        warnings.append("verl's SPIN recipe (recipe.spin.main_spin): priced as its online DPO step: the rollout, the "
                        "actor's and the reference's log-prob passes over the batch (the reference always runs), and "
                        "update_actor_dpo as one optimizer step over the whole batch, each micro batch "
                        "ppo_micro_batch_size_per_gpu chosen plus as many rejected sequences forward padded to the "
                        "maximum prompt + response length, with SPIN's own cross-entropy head (read from "
                        "recipe/spin/dp_actor.py, not measured). Not priced: the reference refresh every "
                        "trainer.ref_update_freq steps (the actor written to /tmp/actor_state_mid and read back into "
                        "the reference). An odd train_batch_size x rollout.n is refused (rule spin_pairs_responses)."
                        + ignored)
    else:
        warnings.append("verl's SPPO recipe (recipe.sppo.main_sppo): priced as a PPO step without a critic (its "
                        "trainer builds none): the rollout, the old-log-prob pass, the reference's only under a KL "
                        "switch, and the actor update through verl's own forward per micro batch of each mini batch; "
                        "its softmean advantage runs on the driver." + ignored)
    return recipe


def _whole_number(key: str, text: str) -> int:
    value = parse_value(text)
    if type(value) is not int:
        raise PlanError(field=key, message=f"is {text!r}, which is not a whole number.",
                        fix=f"set {key} to the rollout's {'nodes' if 'nnodes' in key else 'GPUs per node'}")
    return value


def _price_streamed_batch(given: dict[str, str], passthrough: dict[str, str], warnings: list[str], *,
                          split: bool) -> None:
    """verl's fully async recipe: data.train_batch_size=0 (and data.gen_batch_size=1) because the rollouter streams
    prompts; the trainer's step takes async_training.require_batches x ppo_mini_batch_size of them
    (fully_async_trainer.py required_samples, v0.7.0), which the plan prices as its train batch."""
    if not split:
        raise PlanError(field="data.train_batch_size", message="is 0: the prompts stream to the trainer from a rollout "
                        "on GPUs of its own (verl's fully async recipe), but the script gives the rollout no GPUs "
                        "(rollout.nnodes / rollout.n_gpus_per_node).",
                        fix="set rollout.nnodes and rollout.n_gpus_per_node as the recipe's scripts do")
    mini_entry = BY_FIELD["actor.ppo_mini_batch_size"]
    mini = parse_value(given[mini_entry.key]) if mini_entry.key in given else mini_entry.default
    spellings = [prefix + REQUIRE_BATCHES_KEY for prefix in ("++", "+", "")]
    require_text = next((passthrough[key] for key in spellings if key in passthrough), "1")
    require = parse_value(require_text)
    if type(mini) is not int or type(require) is not int or mini < 1 or require < 1:
        raise PlanError(field=REQUIRE_BATCHES_KEY, message=f"and {mini_entry.key} ({require_text} x {mini}) size the "
                        "fully async trainer's step, and one of them is no whole number of at least 1.",
                        fix=f"set {REQUIRE_BATCHES_KEY} and {mini_entry.key} to whole numbers")
    given["data.train_batch_size"] = str(require * mini)
    gen_key = BY_FIELD["data.gen_batch_size"].key
    if gen_key in given:  # the rollouter's one prompt at a time: kept for render, not the step's generated batch
        passthrough[gen_key] = given.pop(gen_key)
    warnings.append(f"data.train_batch_size is 0 (verl's fully async recipe streams prompts): the trainer's step "
                    f"takes {REQUIRE_BATCHES_KEY} x ppo_mini_batch_size = {require} x {mini} = {require * mini} "
                    "prompts, priced as the step's batch (rendered back as 0).")


_PLAIN_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_.]*)\}")


def _config_values(config: TrainerConfig, module: str, backend: Backend, given: dict[str, str],
                   warnings: list[str]) -> dict[str, str]:
    """The plan keys the command's own config file sets (under the command's overrides), and the warning that
    says what was read, or which keys may differ when it could not be."""
    if config.is_verls_own:
        return {}
    if not config.readable:
        missed = [key for key in _CONSEQUENTIAL_KEYS if key not in given]
        where = f"--config-name {config.name}" if config.name else f"{module}'s config"
        problems = "; ".join(config.problems)
        warnings.append(f"{where} is not readable here ({problems}); the plan takes ppo_trainer.yaml's defaults for "
                        f"the keys the command does not set, and that config may set these differently: "
                        f"{', '.join(missed) or 'none of the keys that size the plan'}. Import from the root of the "
                        "verl checkout the script runs in to read it.")
        return {}
    found: dict[str, str] = {}
    skipped: list[str] = []
    for dotted, text in config.values:
        key = KEY_ALIASES.get(dotted, dotted)
        if key not in BY_KEY or not backend_has(key, backend) or key in given:
            continue
        renamed = value_alias(key, text)
        if renamed is not None:
            warnings.append(f"{config.path} sets {key}={text}, {renamed[1]}; read as {renamed[0]}.")
            text = renamed[0]
        references = _PLAIN_REFERENCE.findall(text)
        if "${" in text and (len(references) != text.count("${") or any(ref not in BY_KEY for ref in references)):
            skipped.append(f"{key} = {text}")
            continue
        found[key] = text
    base = config.base or "an unknown trainer config"
    shown = ", ".join(f"{key}={value}" for key, value in found.items()) or "none of the plan's keys"
    warnings.append(f"read {config.path} ({config.name}, on verl's {base}); under the command's overrides it sets "
                    f"{shown}." + (f" Not read (interpolations rlplan does not resolve; verl's defaults stand): "
                                   f"{', '.join(skipped)}." if skipped else "")
                    + (f" Not followed: {'; '.join(config.problems)}." if config.problems else ""))
    return found


# The keys that size a plan most, named when a config they may come from cannot be read.
_CONSEQUENTIAL_KEYS = (
    "data.train_batch_size", "data.max_prompt_length", "data.max_response_length", f"{ARF}.rollout.n",
    f"{ARF}.rollout.name", f"{ARF}.actor.ppo_mini_batch_size", f"{ARF}.actor.ppo_micro_batch_size_per_gpu",
    f"{ARF}.actor.use_dynamic_bsz", f"{ARF}.actor.ppo_max_token_len_per_gpu",
    f"{ARF}.rollout.tensor_model_parallel_size", f"{ARF}.rollout.gpu_memory_utilization",
    f"{ARF}.actor.fsdp_config.param_offload", f"{ARF}.actor.fsdp_config.optimizer_offload",
    f"{ARF}.model.enable_gradient_checkpointing", f"{ARF}.actor.strategy", "algorithm.adv_estimator",
    "trainer.n_gpus_per_node", "trainer.nnodes",
)


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
        key, sep, value = raw.lstrip("+").partition("=")
        if key.strip() == strategy_key and sep:
            config_name = "megatron" if value.strip("'\"") == "megatron" else "fsdp"
    return "megatron" if "megatron" in config_name else "fsdp"


def _reward_function(reward: dict[str, str]) -> str:
    path_raw = reward.get(REWARD_PATH_KEY)
    path = parse_value(path_raw) if path_raw is not None else None
    if not path:
        return ""
    name_raw = reward.get(REWARD_NAME_KEY)
    name = parse_value(name_raw) if name_raw is not None else None
    return f"{path}:{name or DEFAULT_REWARD_NAME}"

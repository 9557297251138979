"""A plan -> a verl launch script, a file of Hydra overrides, a SLURM script or a Ray job.

Templates live in rlplan.templates and render with StrictUndefined, so a template that
names a missing value fails loudly instead of writing an empty string.  Every value that
reaches a shell goes through the `shquote` filter (shlex.quote): a model path or an
experiment name holding spaces, quotes, `$()`, backquotes or `;` stays one inert word.
Values inside Hydra overrides are first written in Hydra's own syntax
(`verl_keys.format_value`), so Hydra reads back the exact string.

For verl the plan first gets what verl would otherwise default badly (`prepare_for_verl`):
an explicit max_model_len, and load_format = safetensors when vLLM keeps its own base
weights (LoRA, layered summon).
"""

from __future__ import annotations

import functools
import posixpath
import re
import shlex
from typing import TYPE_CHECKING, Any, Literal

import attrs

from rlplan.planner import verl_inventory
from rlplan.planner.errors import PlanError
from rlplan.planner.hardware import Cluster
from rlplan.planner.knobs import apply_knobs, knob_value
from rlplan.planner.megatron_overrides import megatron_override_keys, mtp_override_keys
from rlplan.planner.package_data import package_file
from rlplan.planner.plan import RECIPES, Plan
from rlplan.planner.stack import VERL_WARMUP_STEPS_DEFAULT, parse_version, stack_defaults, verl_sleep_level
from rlplan.planner.verl_inventory import TRAINER_CONFIGS, TrainerBackend
from rlplan.planner.verl_keys import (
    BY_FIELD,
    DEFAULT_REWARD_NAME,
    RENDER_ALSO,
    REWARD_NAME_KEY,
    REWARD_PATH_KEY,
    REWARD_SPELLINGS,
    ROLLOUT_ENGINE_SINCE,
    UNREAD_WHERE_ABSENT,
    WARMUP_RATIO_KEY,
    Follows,
    VerlKey,
    backend_of,
    format_value,
    has_key,
    rendered_value,
    spelled,
    table_for,
)

if TYPE_CHECKING:
    import jinja2

Target = Literal["verl", "slurm", "ray-job"]
Format = Literal["script", "overrides"]
TARGETS: tuple[str, ...] = ("verl", "slurm", "ray-job")
FORMATS: tuple[str, ...] = ("script", "overrides")

_TEMPLATES = {
    ("verl", "script"): "verl.sh.j2",
    ("verl", "overrides"): "verl_overrides.txt.j2",
    ("slurm", "script"): "slurm.sh.j2",
    ("ray-job", "script"): "ray_job.sh.j2",
}


def shquote(value: Any) -> str:
    return shlex.quote(str(value))


@functools.cache
def _environment() -> jinja2.Environment:
    import jinja2  # here, not at import: the CLI reads this module's choices on every command

    def load(name: str) -> str:
        return package_file("rlplan.templates", name).read_text(encoding="utf-8")

    environment = jinja2.Environment(
        loader=jinja2.FunctionLoader(load),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters["shquote"] = shquote
    return environment


def prepare_for_verl(plan: Plan) -> Plan:
    """The plan with what verl would default badly made explicit; a PlanError for what verl cannot run."""
    if plan.algorithm.grpo_leave_one_out:
        raise PlanError(
            field="algorithm.grpo_leave_one_out",
            message="verl has no leave-one-out GRPO baseline, so a verl run would train differently.",
            fix='set algorithm.grpo_leave_one_out = false, or algorithm.adv_estimator = "rloo"',
        )
    for role in ("actor", "ref", "critic") if plan.uses_critic else ("actor", "ref"):
        if getattr(plan, role).compute_dtype == "float32":
            # verl 0.9's FSDPEngineConfig asserts dtype in (bfloat16, float16).
            raise PlanError(
                field=f"{role}.compute_dtype",
                message="is float32, which only rlplan's CPU runtime computes in; verl's FSDP engine computes in "
                        "bfloat16 or float16 and refuses float32.",
                fix=f'set {role}.compute_dtype = "bfloat16" (and rollout.dtype = "bfloat16") for a verl run',
            )
    _check_estimator(plan)
    _check_engine_release(plan)
    if not plan.model.path:
        raise PlanError(
            field="model.path",
            message="is empty, and verl loads the model from a path or a hub repo id.",
            fix="set model.path to the checkpoint directory or hub repo id",
        )
    rollout = plan.rollout
    if plan.is_megatron:
        plan = _with_explicit_megatron_sections(plan)
    if rollout.max_model_len is None:
        # verl would size vLLM for max_position_embeddings (often 32k-128k tokens) instead.
        rollout = attrs.evolve(rollout, max_model_len=plan.fitting_max_model_len)
    if (plan.model.lora.enabled or rollout.layered_summon) and rollout.load_format == "dummy":
        # With dummy weights the first sync pushes the whole base model; verl's docs require safetensors.
        rollout = attrs.evolve(rollout, load_format="safetensors")
    return plan.evolve(rollout=rollout)


def _check_estimator(plan: Plan) -> None:
    """verl refuses an advantage estimator its release does not have (ray_trainer.compute_advantage /
    core_algos.get_adv_estimator_fn), after the workers have started."""
    estimator, verl = plan.algorithm.adv_estimator, plan.stack.verl
    if estimator is None:
        from rlplan.planner.stack import SPIN_SPPO_RECIPES, holds

        if not holds(SPIN_SPPO_RECIPES, plan.stack):
            raise PlanError(field="algorithm.recipe",
                            message=f"is {plan.algorithm.recipe}, a recipe verl {verl} does not ship (recipe/spin and "
                                    "recipe/sppo are in verl 0.4.1 to 0.7.x), so the rendered script has nothing to run.",
                            fix="target a verl release from 0.4.1 to 0.7.x (stack.verl / --verl-version)")
        return
    if estimator in verl_inventory.estimators_of(verl):
        return
    later = [release for release, _ in verl_inventory.estimator_runs(estimator)]
    raise PlanError(field="algorithm.adv_estimator",
                    message=f"is {estimator}, which verl {verl} does not have (verl added it in {later[0]}), so the "
                            "rendered run would stop at its first advantage computation.",
                    fix=f"target verl >= {later[0]} (stack.verl / --verl-version), or pick one of verl {verl}'s: "
                        + ", ".join(sorted(verl_inventory.estimators_of(verl))))


def _check_engine_release(plan: Plan) -> None:
    """verl refuses a rollout.name its release has no rollout for (verl_keys.ROLLOUT_ENGINE_SINCE)."""
    engine, verl = plan.rollout.name, plan.stack.verl
    since = ROLLOUT_ENGINE_SINCE[engine]
    if since is not None and parse_version(verl) < parse_version(since):
        raise PlanError(field="rollout.name",
                        message=f"is {engine}, which verl {verl} has no rollout for (verl added it in {since}).",
                        fix=f"target verl >= {since} (stack.verl / --verl-version), or set rollout.name = \"vllm\"")


def verl_additions(plan: Plan) -> list[str]:
    """What `prepare_for_verl` writes into a verl script that the plan itself leaves unset or sets otherwise, each
    with why: what `rlplan render` says it added, so no value reaches the script silently."""
    prepared, rollout = prepare_for_verl(plan).rollout, plan.rollout
    added = []
    if rollout.max_model_len is None:
        added.append(f"rollout.max_model_len = {prepared.max_model_len} (the plan leaves it unset, and verl would "
                     f"size vLLM for the model's {plan.model.arch.max_position_embeddings} positions)")
    if prepared.load_format != rollout.load_format:
        added.append(f"rollout.load_format = {prepared.load_format} (not {rollout.load_format}: with LoRA or a "
                     "layered summon vLLM keeps its own base weights, which verl loads from the checkpoint)")
    if plan.is_megatron and (plan.ref.megatron is None or (plan.uses_critic and plan.critic.megatron is None)):
        added.append("the reference's (and critic's) Megatron sections written out: the reference follows the "
                     "actor's parallel sizes, as verl's defaults do")
    return added


def _with_explicit_megatron_sections(plan: Plan) -> Plan:
    """Every role's Megatron engine written out: the reference's parallel sizes and offload follow the actor's
    where the plan leaves them unset (verl's oc.select defaults), the critic takes Megatron's own defaults."""
    return plan.evolve(actor=attrs.evolve(plan.actor, megatron=plan.engine("actor")),
                       ref=attrs.evolve(plan.ref, megatron=plan.engine("ref")),
                       critic=attrs.evolve(plan.critic, megatron=plan.engine("critic")))


def plan_as_verl_runs_it(plan: Plan) -> Plan:
    """What importing the rendered verl script gives back: `prepare_for_verl`, with the fields
    verl has no key for set the way an import sets them (verl_keys.RLPLAN_ONLY_FIELDS)."""
    prepared = prepare_for_verl(plan)
    rollout = attrs.evolve(prepared.rollout, sleep_level=verl_sleep_level(
        prepared.stack, prepared.model.lora.enabled, prepared.rollout.layered_summon))
    cluster = Cluster(gpu=plan.cluster.gpu, nodes=plan.cluster.nodes, gpus_per_node=plan.cluster.gpus_per_node,
                      host_memory_gib=plan.cluster.host_memory_gib)
    prepared = prepared.evolve(rollout=rollout, cluster=cluster, prediction=None)
    unrendered = _unrendered(prepared)
    return apply_knobs(prepared, unrendered) if unrendered else prepared


def _rendered(plan: Plan, entry: VerlKey) -> bool:
    """A plan without a critic renders no critic block but its switch: verl builds no critic then, and
    a GRPO script full of critic keys reads as if it trained one. A key the plan's backend's config does not
    have is not rendered (Hydra would refuse it)."""
    if not has_key(entry, backend_of(plan.actor.strategy)):
        return False
    return plan.uses_critic or not entry.key.startswith("critic.") or entry.field == "critic.enable"


def _unrendered(plan: Plan) -> dict[str, Any]:
    """The fields a render leaves out, as an import of that script sets them: verl's defaults, a
    default that follows another key read from the plan."""
    values: dict[str, Any] = {}
    for entry in table_for(backend_of(plan.actor.strategy)).values():
        if _rendered(plan, entry):
            continue
        value = entry.default
        while isinstance(value, Follows):
            value = values[value.field] if value.field in values else knob_value(plan, value.field)
        values[entry.field] = value
    return values


def implied_value(plan: Plan, entry: VerlKey) -> Any:
    """What the plan's target verl does for the entry's knob when a script does not set it: that release's
    default where stack.py says it differs from the table's (`stack_defaults`), else the table's; a default that
    follows another field is that field's value in the plan."""
    value = stack_defaults(plan.stack, plan.rollout.name).get(entry.field, entry.default)
    while isinstance(value, Follows):
        value = knob_value(plan, value.field)
    return value


def absent_knobs(plan: Plan) -> dict[str, Any]:
    """Every knob the plan's target verl has no key for in its backend's trainer config, at what that release
    does without it (`implied_value`): the solver searches only the target release's space, so it holds these
    as pins (verl 0.3 has no LoRA, no offload_policy, no entropy_from_logits_with_chunking)."""
    verl, backend = plan.stack.verl, backend_of(plan.actor.strategy)
    absent: dict[str, Any] = {}
    for entry in table_for(backend).values():
        if entry.field in UNREAD_WHERE_ABSENT or not has_key(entry, backend) or entry.spelling_for(verl, backend):
            continue
        value = implied_value(plan, entry)
        if value is not None:
            absent[entry.field] = value
    return absent


def _target_spelling(plan: Plan, entry: VerlKey, value: Any) -> str | None:
    """The target verl's spelling of `entry`'s key (verl_inventory: that release's own trainer config), or None
    where that release has none and the plan asks for what it does without the knob. Anything else is refused by
    name: Hydra would refuse the override at start-up."""
    verl, backend = plan.stack.verl, backend_of(plan.actor.strategy)
    spelling = entry.spelling_for(verl, backend)
    if spelling is not None:
        return spelling
    if entry.field in UNREAD_WHERE_ABSENT:
        return None
    implied = implied_value(plan, entry)
    if value == implied or (entry.kind == "str_list" and tuple(value) == tuple(implied or ())):
        return None
    raise PlanError(field=entry.field, message=f"is {format_value(value)}, but verl {verl} has no {entry.key}: "
                    f"{_where_verl_has(entry, backend, verl)}, so the rendered script would not start.",
                    fix=f"set {entry.field} = {format_value(implied)}, or target a verl that has it "
                        f"(stack.verl / --verl-version)")


def _where_verl_has(entry: VerlKey, backend: TrainerBackend, verl: str) -> str:
    """Which release added the knob (the first after `verl` that has it) and how it spelled it; for a knob verl
    removed, the last release that had it."""
    releases = entry.releases(backend)
    if not releases:
        return f"no verl release read has it in its {TRAINER_CONFIGS[backend]} config"
    later = [release for release in releases if parse_version(release) > parse_version(verl)]
    release = later[0] if later else releases[-1]
    spelled_as = entry.spelling_for(release, backend)
    if later:
        return f"verl added it in {release}, spelled {spelled_as}"
    return f"verl had it up to {release}, spelled {spelled_as}"


def _as_verl_reads(plan: Plan, entry: VerlKey, value: Any) -> Any:
    """The plan's value as the target verl reads the same meaning: no warm-up steps of the plan's own, beside a
    passthrough lr_warmup_steps_ratio, is verl's own default -1 (the ratio decides on every worker; an explicit 0
    would switch it off on the legacy FSDP worker, stack.WARMUP_ZERO_READS_RATIO)."""
    ratio_set = any(key.lstrip("+") == WARMUP_RATIO_KEY for key in plan.passthrough)
    if entry.field == "actor.lr_warmup_steps" and value == 0 and ratio_set:
        return VERL_WARMUP_STEPS_DEFAULT
    return value


def verl_overrides(plan: Plan) -> list[str]:
    """Every knob of the plan as verl Hydra overrides in the target release's spelling, then the passthrough keys
    verbatim."""
    prepared = prepare_for_verl(plan)
    verl, backend = prepared.stack.verl, backend_of(prepared.actor.strategy)
    overrides: list[str] = []
    for entry in table_for(backend).values():
        value = knob_value(prepared, entry.field)
        if value is None or not _rendered(prepared, entry):
            continue
        if entry.field == "data.train_batch_size" and prepared.rollout.pool and prepared.rollout.pool.streams:
            value = 0  # verl's fully async rollouter asserts it (plan.RolloutPool.streams)
        spelling = _target_spelling(prepared, entry, value)
        if spelling is not None:
            overrides.append(f"{spelling}={format_value(rendered_value(entry, _as_verl_reads(prepared, entry, value)))}")
    for key, field in RENDER_ALSO.items():
        value = knob_value(prepared, BY_FIELD[field].field)
        wanted = value is not None and key not in prepared.passthrough
        if wanted and (prepared.uses_critic or not key.startswith("critic.")) and spelled((key,), verl, backend):
            overrides.append(f"{key}={format_value(value)}")
    if prepared.reward.function:
        path, _, name = prepared.reward.function.rpartition(":")
        if not path:
            path, name = name, DEFAULT_REWARD_NAME
        for key, text in ((REWARD_PATH_KEY, path), (REWARD_NAME_KEY, name)):
            overrides.append(f"{spelled(REWARD_SPELLINGS[key], verl, backend) or key}={format_value(text)}")
    overrides.extend(megatron_override_keys(prepared) + mtp_override_keys(prepared))
    if (pool := prepared.rollout.pool) is not None:
        # The recipes' configs declare the rollout's pool (one_step_off_ppo_trainer.yaml, fully_async_ppo_trainer.yaml).
        overrides += [f"rollout.nnodes={pool.nodes}", f"rollout.n_gpus_per_node={pool.gpus_per_node}"]
    for key, value in prepared.passthrough.items():
        overrides.append(key if key.startswith("~") and value == "" else f"{key}={value}")
    return overrides


def _one_line_each(overrides: list[str]) -> None:
    """Hydra has no escape for a line break, so a value holding one cannot live in a one-per-line file."""
    for override in overrides:
        if "\n" in override or "\r" in override:
            key = override.partition("=")[0]
            raise PlanError(field=key, message="holds a line break, which a file of one override per line "
                            "cannot carry.", fix="render --format script instead, or remove the line break")


def verl_entry_point(plan: Plan) -> tuple[str, str]:
    """The module a rendered verl script runs and its --config-name ("": the module's own). verl's Megatron workers
    read ppo_megatron_trainer.yaml, whose keys (actor.megatron.*) ppo_trainer.yaml lacks. A rollout on a pool of its
    own runs verl's one-step-off recipe, or its fully async one for a streamed batch, each with its own configs
    (<name>_ppo_trainer.yaml, <name>_ppo_megatron_trainer.yaml: they declare the pool's rollout.* keys), under
    recipe/ or, from verl 0.8, verl/experimental/ (stack.ASYNC_RECIPES_IN_PACKAGE)."""
    from rlplan.planner.stack import ASYNC_RECIPES_IN_PACKAGE, holds

    if plan.algorithm.recipe is not None:
        # The recipe's module and its own @hydra.main config (config/spin_trainer.yaml, config/sppo_trainer.yaml).
        return RECIPES[plan.algorithm.recipe].module, ""
    pool = plan.rollout.pool
    if pool is None:
        return "verl.trainer.main_ppo", "ppo_megatron_trainer" if plan.is_megatron else ""
    package = "verl.experimental" if holds(ASYNC_RECIPES_IN_PACKAGE, plan.stack) else "recipe"
    recipe, main, config = (("fully_async_policy", "fully_async_main", "fully_async") if pool.streams
                            else ("one_step_off_policy", "main_ppo", "one_step_off"))
    return f"{package}.{recipe}.{main}", f"{config}_ppo_megatron_trainer" if plan.is_megatron else ""


def _job_name(plan: Plan) -> str:
    """A scheduler job name from the experiment name, reduced to characters every scheduler takes."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", plan.trainer.experiment_name)[:64].strip("-.") or "rlplan"


def render_plan(plan: Plan, target: str, fmt: str = "script", *, plan_file: str = "plan.toml") -> str:
    """The text of one launch artifact. `plan_file` is the path `rlplan run` is given (SLURM, Ray job)."""
    if target not in TARGETS:
        raise PlanError(field="--target", message=f"{target!r} is not a render target.",
                        fix=f"use one of {', '.join(TARGETS)}")
    if fmt not in FORMATS:
        raise PlanError(field="--format", message=f"{fmt!r} is not a format.", fix=f"use one of {', '.join(FORMATS)}")
    template = _TEMPLATES.get((target, fmt))
    if template is None:
        raise PlanError(field="--format", message=f"the {target} target renders a script only.",
                        fix="drop --format overrides, or render --target verl")
    context: dict[str, Any] = {
        "nodes": plan.cluster.nodes,
        "gpus_per_node": plan.cluster.gpus_per_node,
        "world_size": plan.cluster.world_size,
        "job_name": _job_name(plan),
        "plan_file": plan_file,
        "plan_dir": posixpath.dirname(plan_file) or ".",
        "plan_name": posixpath.basename(plan_file),
    }
    context["module"], context["config_name"] = verl_entry_point(plan)
    # The caching allocator's settings the plan was priced with (memory.allocator_trace), for every process it starts.
    context["alloc_conf"] = plan.trainer.pytorch_cuda_alloc_conf
    if target == "verl":
        context["overrides"] = verl_overrides(plan)
        if fmt == "overrides":
            _one_line_each(context["overrides"])
    return _environment().get_template(template).render(**context)

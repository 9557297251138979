"""The Megatron-Core settings verl passes through its dict-valued keys that rlplan types: the uneven pipeline
(`<role>.megatron.override_transformer_config.num_layers_in_first/last_pipeline_stage`, Megatron-Core
TransformerConfig) and the CPU optimizer (`<role>.optim.override_optimizer_config.optimizer_cpu_offload` and
`optimizer_offload_fraction`, Megatron-Core OptimizerConfig).

verl's configs do not list these keys (a script adds them with `+`), so they arrive in a plan's passthrough: an
imported script's, or a plan file written before they were typed. `lift_megatron_overrides` reads them there once,
at the edge, into the role's typed `MegatronSection` fields (a value that is no number, or out of range, is a
PlanError naming the key); rules, memory, step time and render read the fields. `megatron_override_keys` writes
them back, with `++` (add or override: some verl releases may list a key, which `+` would then refuse).

verl's model.mtp switches (verl main: hf_model.yaml `mtp`, read by the Megatron workers) are typed alike:
`lift_mtp` reads `actor_rollout_ref.model.mtp.enable` / `enable_train` / `enable_rollout` into the plan's
`model.mtp` (plan.MtpSection; the section's other keys stay passthrough), `mtp_override_keys` writes them back.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from rlplan.planner.errors import PlanError
from rlplan.planner.plan import MegatronSection, MtpSection, Plan
from rlplan.planner.verl_keys import parse_value

Role = Literal["actor", "ref", "critic"]
# verl's section of each role that Megatron builds.
ROLE_PREFIX: dict[Role, str] = {"actor": "actor_rollout_ref.actor", "ref": "actor_rollout_ref.ref",
                                "critic": "critic"}
STAGE_FIELDS = ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage")
# The reference is forward only: no optimizer.
OPTIMIZER_FIELDS = ("optimizer_cpu_offload", "optimizer_offload_fraction")


def override_key(role: Role, name: str) -> str:
    """The verl key (no Hydra prefix) of a typed field `name` of `role`'s engine."""
    section = ".megatron.override_transformer_config." if name in STAGE_FIELDS else ".optim.override_optimizer_config."
    return ROLE_PREFIX[role] + section + name


def _fields_of(role: Role) -> tuple[str, ...]:
    return STAGE_FIELDS if role == "ref" else STAGE_FIELDS + OPTIMIZER_FIELDS


def _parsed(key: str, name: str, text: str) -> Any:
    """A passthrough value as the field's type; anything else is a PlanError naming the key."""
    value = text.strip().strip("'\"")
    lowered = value.lower()
    if name == "optimizer_cpu_offload":
        if lowered in ("true", "false"):
            return lowered == "true"
        raise PlanError(field=key, message=f"is {value!r}, which is not true or false.", fix=f"set {key}=True or False")
    if name == "optimizer_offload_fraction":
        try:
            return float(value)
        except ValueError:
            raise PlanError(field=key, message=f"is {value!r}, which is not a number.",
                            fix=f"set {key} to the share of the optimizer state on the CPU, between 0 and 1"
                            ) from None
    if lowered.lstrip("+").isdigit():
        return int(lowered)
    raise PlanError(field=key, message=f"is {value!r}, which is not a whole number of layers.",
                    fix=f"set {key} to the layers that stage holds (at least 1)")


def _take(passthrough: dict[str, str], role: Role) -> dict[str, Any]:
    """The role's typed values found in `passthrough` (each Hydra spelling of the key), removed from it."""
    values: dict[str, Any] = {}
    for name in _fields_of(role):
        key = override_key(role, name)
        for spelling in ("++" + key, "+" + key, key):
            if spelling in passthrough:
                values[name] = _parsed(key, name, passthrough.pop(spelling))
    return values


def _engine_with(engine: MegatronSection, role: Role, values: dict[str, Any]) -> MegatronSection:
    """`engine` with the values, validated as the plan's fields are; a bad one named by its verl key."""
    try:
        return attrs.evolve(engine, **values)
    except PlanError as error:
        name = error.field.rpartition(".")[2]
        key = override_key(role, name)
        if name == "optimizer_offload_fraction":
            raise PlanError(field=key, message=f"({role}.megatron.{name}) is {values[name]!r}, not a share between "
                            "0 and 1 of the optimizer state Megatron's CPU optimizer keeps on the host.",
                            fix=f"set {key} between 0 and 1 (in the script, the variable it is read from, "
                                "OFFLOAD_FRACTION say)") from None
        raise PlanError(field=key, message=f"({role}.megatron.{name}) {error.message}", fix=error.fix) from None


def lift_megatron_overrides(plan: Plan) -> Plan:
    """`plan` with the typed Megatron settings read out of its passthrough into each role's engine. An FSDP plan
    is returned unchanged (the keys mean nothing to its workers and stay passthrough)."""
    if not plan.is_megatron:
        return plan
    passthrough = dict(plan.passthrough)
    found = {role: _take(passthrough, role) for role in ROLE_PREFIX}
    if not any(found.values()):
        return plan
    actor = plan.actor
    if found["actor"]:
        actor = attrs.evolve(actor, megatron=_engine_with(actor.mcore, "actor", found["actor"]))
    critic = plan.critic
    if found["critic"]:
        critic = attrs.evolve(critic, megatron=_engine_with(plan.engine("critic"), "critic", found["critic"]))
    lifted = plan.evolve(actor=actor, critic=critic, passthrough=passthrough)
    ref = plan.ref
    # verl's reference follows the actor's override_transformer_config (ref/megatron_ref.yaml `oc.select`): a
    # reference of its own keeps the actor's placement unless the script places its layers itself.
    if ref.megatron is not None:
        follows = {name: getattr(lifted.actor.mcore, name) for name in STAGE_FIELDS}
        ref = attrs.evolve(ref, megatron=_engine_with(ref.megatron, "ref", {**follows, **found["ref"]}))
    elif found["ref"] and any(getattr(lifted.engine("ref"), name) != value for name, value in found["ref"].items()):
        ref = attrs.evolve(ref, megatron=_engine_with(lifted.engine("ref"), "ref", found["ref"]))
    return lifted.evolve(ref=ref)


def megatron_override_keys(plan: Plan) -> list[str]:
    """The typed settings as verl Hydra overrides, for each role verl builds with Megatron: the actor, a reference
    of its own (a KL term without LoRA), a critic."""
    if not plan.is_megatron:
        return []
    built: list[Role] = ["actor"]
    if plan.uses_reference and not plan.reference_is_actor:
        built.append("ref")
    if plan.uses_critic:
        built.append("critic")
    overrides = []
    for role in built:
        engine = plan.engine(role)
        for name in _fields_of(role):
            value = getattr(engine, name)
            if value is not None:
                shown = ("True" if value else "False") if isinstance(value, bool) else repr(value)
                overrides.append(f"++{override_key(role, name)}={shown}")
    return overrides


# verl's model.mtp switches (verl/trainer/config/model/hf_model.yaml, verl main at 0.8.0.dev) -> plan.MtpSection.
MTP_PREFIX = "actor_rollout_ref.model.mtp."
MTP_SWITCHES = {"enable": None, "enable_train": "train", "enable_rollout": "rollout"}


def lift_mtp(plan: Plan) -> Plan:
    """`plan` with verl's model.mtp switches read out of its passthrough into `model.mtp` (on when `enable` is
    true); unchanged where the passthrough has none. A value that is no boolean is a PlanError naming the key."""
    passthrough = dict(plan.passthrough)
    found: dict[str, bool] = {}
    for switch in MTP_SWITCHES:
        for spelling in ("++", "+", ""):
            key = spelling + MTP_PREFIX + switch
            if key in passthrough:
                found[switch] = _switch(MTP_PREFIX + switch, passthrough.pop(key))
    if not found:
        return plan
    mtp = None
    if found.get("enable", False):
        mtp = MtpSection(train=found.get("enable_train", False), rollout=found.get("enable_rollout", False))
    return plan.evolve(model=attrs.evolve(plan.model, mtp=mtp), passthrough=passthrough)


def mtp_override_keys(plan: Plan) -> list[str]:
    """The plan's model.mtp as verl's switches (none when it is off: verl's default)."""
    from rlplan.planner.stack import MODEL_MTP, holds

    mtp = plan.model.mtp
    if mtp is None:
        return []
    if not holds(MODEL_MTP, plan.stack):
        raise PlanError(field="model.mtp", message=f"is on, but verl {plan.stack.verl} has no model.mtp keys (they "
                        "arrive with verl 0.8.0), so its Hydra config would refuse the rendered script.",
                        fix="target verl >= 0.8.0 (stack.verl / --verl-version), or remove [model.mtp]")
    values = {"enable": True, "enable_train": mtp.train, "enable_rollout": mtp.rollout}
    return [f"{MTP_PREFIX}{switch}={values[switch]}" for switch in MTP_SWITCHES]


def _switch(key: str, text: str) -> bool:
    value = parse_value(text)
    if not isinstance(value, bool):
        raise PlanError(field=key, message=f"is {text!r}, and verl reads it as a boolean (MtpConfig).",
                        fix=f"set {key}=True or {key}=False")
    return value

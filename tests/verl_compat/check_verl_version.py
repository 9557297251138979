"""The rules rlplan dates by verl version, against the verl installed here (any release from 0.3.0.post1).

`nox -s verl_compat` runs this once per verl release it installs (noxfile.py VERL_COMPAT_VERSIONS). With
`stack.verl` = the installed version, it checks rlplan's version tables against that version's own YAML
and source, never against rlplan's memory of them:

1. keys       the inventory (presets/verl_inventory.json, from which verl_keys.py dates every spelling) lists
              exactly the installed verl's composed `ppo_trainer` keys, and every era key stack.py's
              REMOVED_KEYS names is in that config inside its range and absent outside it;
2. defaults   each verl behaviour in stack.py that sets a default (entropy_coeff 0.001, eager rollout,
              unstaged wake-up) holds exactly where the YAML has that default (or, for a key the version
              lacks, where the key is absent);
3. render     plans targeting this verl (the pins `solve --verl-version` adds, several layouts) render to
              overrides that verl's own hydra compose of `ppo_trainer` accepts (hydra refuses a key the YAML
              lacks), and a plan switching on a dated key this verl lacks is refused by render, naming it;
4. worker     the rules that belong to the engine worker (stack.ENGINE_WORKER: dynamic_bsz_flags_agree)
              apply exactly where verl runs the engine worker by default and its source asserts
              `actor.use_dynamic_bsz == rollout.log_prob_use_dynamic_bsz` (read with ast, not imported:
              an old worker module imports transformers names the pinned transformers no longer has).

5. rules      each version-dependent rule or behaviour against what this verl's own code does: hydra's compose of
              `ppo_megatron_trainer` refuses `actor.megatron.grad_offload` exactly where
              `megatron_grad_offload_is_not_in_verl_0_9` fires; the agent loop's even chunking, the async default,
              the sync rollout's prompt + response fallback for max_model_len, 0.7.0's max_position_embeddings
              override, the chunked-prefill refusal, 0.9.1's raised max_num_batched_tokens, the unrounded LoRA rank
              and the engine worker's micro-batch assert are present in the source exactly where stack.py says.

What is not checked here: the memory behaviours that live in code paths without a config trace
(stack.MICRO_OUTPUTS_HELD_TO_MINI_END, SOFT_TOKEN_BUDGET, WORKER_HOLDS_BATCH_ON_GPU and its exceptions)
and vLLM's V0 engine.

Usage: python tests/verl_compat/check_verl_version.py   (exit 0: all agree)
"""

from __future__ import annotations

import ast
import sys
from importlib import resources
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from omegaconf import OmegaConf  # noqa: E402

from rlplan.planner import verl_inventory  # noqa: E402
from rlplan.planner.errors import PlanError  # noqa: E402
from rlplan.planner.render import render_plan  # noqa: E402
from rlplan.planner.rules import check_plan  # noqa: E402
from rlplan.planner.stack import (  # noqa: E402
    BEHAVIOURS,
    DEFAULT_STACK,
    ENGINE_WORKER,
    REMOVED_KEYS,
    in_range,
    solve_pins,
)
from rlplan.planner.verl_keys import BY_FIELD, VERL_KEYS  # noqa: E402
from tests.planner.plans import make_plan  # noqa: E402
from tests.verl_compat.check_key_table import (  # noqa: E402
    _ABSENT,
    DELIBERATE_DEFAULTS,
    raw_node_value,
    resolved_default,
)
from tests.verl_compat.check_verl_accepts import full_compose, script_arguments  # noqa: E402
from tests.verl_compat.make_inventory import leaves  # noqa: E402

# Layouts whose rendered scripts verl's compose must accept: each switches on a different part of the table.
RENDERED_LAYOUTS: dict[str, dict[str, Any]] = {
    "grpo": {},
    "lora": {"model.lora.rank": 32},
    "dynamic_bsz": {"actor.use_dynamic_bsz": True, "rollout.log_prob_use_dynamic_bsz": True},
    "ppo_critic": {"algorithm.adv_estimator": "gae"},
    "offload": {"actor.param_offload": True, "actor.optimizer_offload": True},
}


def check_dated_keys(config: Any, version: str) -> tuple[int, list[str]]:
    """The inventory (presets/verl_inventory.json) lists exactly the keys of this verl's composed ppo_trainer, so
    every spelling the key table dates by it is present exactly where the inventory says; and stack.py's eras."""
    failures = []
    composed = {key for key, _ in leaves(OmegaConf.to_container(config, resolve=False))}
    listed = verl_inventory.keys_of(version, "fsdp")
    failures += [f"keys: {key} is in verl {version}'s ppo_trainer config, but not in the inventory"
                 for key in sorted(composed - listed)]
    failures += [f"keys: the inventory lists {key} for verl {version}, whose ppo_trainer config lacks it"
                 for key in sorted(listed - composed)]
    # An era that a value shows (rollout.mode=sync) is not about the key: verl keeps the key.
    dated = [(era.key, era.since, era.before) for era in REMOVED_KEYS if era.value is None]
    for key, since, before in dated:
        present = raw_node_value(config, key) is not _ABSENT
        if present != in_range(version, since, before):
            failures.append(f"keys: {key} is {'in' if present else 'not in'} verl {version}'s ppo_trainer config, "
                            f"but stack.py dates it since {since} before {before}")
    return len(composed) + len(dated), failures


def check_behaviour_defaults(config: Any, version: str) -> tuple[int, list[str]]:
    failures = []
    checked = 0
    for behaviour in BEHAVIOURS:
        if behaviour.package != "verl" or behaviour.default is None:
            continue
        field, value = behaviour.default
        key = BY_FIELD[field].key
        checked += 1
        raw = raw_node_value(config, key)
        # A version without the key behaves as if it were the behaviour's value (that is why the default is set).
        # A key whose YAML default rlplan deliberately does not follow (verl never reads it) shows the behaviour
        # only by being absent.
        # A behaviour whose value is also the YAML's default where the key exists (val_before_train) shows only by
        # the key's absence.
        shown_by_value = key not in DELIBERATE_DEFAULTS and value != BY_FIELD[field].default
        yaml_has_value = raw is _ABSENT or (shown_by_value and resolved_default(config, key) == value)
        if yaml_has_value != behaviour.holds_for(version):
            shown = "no such key" if raw is _ABSENT else repr(resolved_default(config, key))
            failures.append(f"defaults: stack.py says {behaviour.name} ({field} = {value!r}) "
                            f"{'holds' if behaviour.holds_for(version) else 'does not hold'} for verl {version}, "
                            f"its YAML has {key}: {shown}")
    return checked, failures


def plan_on(version: str, knobs: dict[str, Any]):
    # A hub id: render refuses a plan without a model path, and compose never loads it.
    return make_plan(overrides={"model.path": "Qwen/Qwen2.5-7B-Instruct",
                                **solve_pins(DEFAULT_STACK, version, None, None), **knobs})


def check_rendered_keys(config: Any, version: str) -> tuple[int, list[str]]:
    """Every key a plan for this verl renders is in its YAML (hydra would stop at the first it lacks, so each is
    looked up), then hydra composes the whole script's overrides."""
    failures = []
    for name, knobs in RENDERED_LAYOUTS.items():
        # A layout switching on a key this verl lacks must be refused, naming it (LoRA before 0.4.0).
        lacking = [field for field in knobs if field in BY_FIELD and BY_FIELD[field].spelling_for(version, "fsdp") is None]
        try:
            words = script_arguments(render_plan(plan_on(version, knobs), "verl"))
        except PlanError as error:
            if error.field in lacking:
                continue
            failures.append(f"render: the {name} plan for verl {version} is refused: {error.field}: {error.message}")
            continue
        if lacking:
            failures.append(f"render: the {name} plan for verl {version} renders although verl lacks {lacking}")
            continue
        keys = [word.split("=", 1)[0] for word in words if not word.startswith(("+", "~"))]
        missing = [key for key in keys if raw_node_value(config, key) is _ABSENT]
        if missing:
            failures += [f"render: the {name} plan for verl {version} renders {key}, which its ppo_trainer lacks"
                         for key in missing if key not in REPORTED_MISSING.setdefault(version, set())]
            REPORTED_MISSING[version].update(missing)
            continue
        try:
            full_compose(words)
        except Exception as error:  # hydra's refusal of a value (a key's type) this verl does not take
            failures.append(f"render: verl {version}'s hydra refuses the {name} plan's overrides: "
                            f"{type(error).__name__}: {str(error).splitlines()[0]}")
    return len(RENDERED_LAYOUTS), failures


# verl version -> the rendered keys already reported missing (one line per key, not one per layout).
REPORTED_MISSING: dict[str, set[str]] = {}


def check_render_refuses_missing(version: str) -> tuple[int, list[str]]:
    """A bool key this verl lacks, switched away from what that verl does without it: render must refuse it."""
    failures = []
    checked = 0
    defaults = solve_pins(DEFAULT_STACK, version, None, None)
    for entry in VERL_KEYS:
        if entry.kind != "bool" or "fsdp" not in entry.trainer_configs() or entry.spelling_for(version, "fsdp"):
            continue
        implied = defaults.get(entry.field, entry.default)
        checked += 1
        # A plan without a critic renders no critic keys (render._rendered): switch a critic key on one with a critic.
        critic = RENDERED_LAYOUTS["ppo_critic"] if entry.key.startswith("critic.") else {}
        try:
            render_plan(plan_on(version, {**critic, entry.field: not implied}), "verl")
        except PlanError as error:
            if error.field != entry.field:
                failures.append(f"render: {entry.field} = {not implied} on verl {version} is refused for "
                                f"{error.field}, not for {entry.key}")
            continue
        failures.append(f"render: {entry.field} = {not implied} renders for verl {version}, which has no {entry.key}")
    return checked, failures


def _source(module: str) -> str | None:
    path = resources.files("verl").joinpath(*module.split(".")[1:]).with_suffix(".py")  # type: ignore[attr-defined]
    return path.read_text() if path.is_file() else None


def _dotted(node: ast.expr) -> str:
    return f"{_dotted(node.value)}.{node.attr}" if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def asserts_dynamic_bsz_agreement(source: str | None) -> bool:
    """Whether a module asserts actor.use_dynamic_bsz == rollout.log_prob_use_dynamic_bsz (either order)."""
    if source is None:
        return False
    wanted = {"actor.use_dynamic_bsz", "rollout.log_prob_use_dynamic_bsz"}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare) and len(node.test.comparators) == 1:
            sides = {_dotted(node.test.left), _dotted(node.test.comparators[0])}
            if {next((w for w in wanted if side.endswith(w)), side) for side in sides} == wanted:
                return True
    return False


def engine_worker_is_default(config: Any) -> bool:
    """verl runs the legacy FSDP worker (verl/workers/fsdp_workers.py) while it has one, unless
    trainer.use_legacy_worker_impl is 'disable' (its default, 'auto', picks the legacy worker in main_ppo up to
    v0.7.x); v0.8.0 removed the legacy worker."""
    if _source("verl.workers.engine_workers") is None:
        return False
    if _source("verl.workers.fsdp_workers") is None:
        return True
    return raw_node_value(config, "trainer.use_legacy_worker_impl") == "disable"


def check_engine_worker_rules(config: Any, version: str) -> tuple[int, list[str]]:
    runs_assert = engine_worker_is_default(config) and asserts_dynamic_bsz_agreement(
        _source("verl.workers.engine_workers"))
    failures = []
    if runs_assert != ENGINE_WORKER.holds_for(version):
        failures.append(f"worker: verl {version}'s default worker {'asserts' if runs_assert else 'does not assert'} "
                        f"the dynamic-bsz agreement, but stack.py says {ENGINE_WORKER.name} "
                        f"({ENGINE_WORKER.versions}) {'holds' if ENGINE_WORKER.holds_for(version) else 'does not'}")
    if asserts_dynamic_bsz_agreement(_source("verl.workers.fsdp_workers")):
        failures.append(f"worker: verl {version}'s legacy fsdp_workers.py asserts the dynamic-bsz agreement too")
    return 1, failures


def _megatron_compose(overrides: list[str]):
    """verl's own hydra compose of `ppo_megatron_trainer` with these overrides (raises where hydra refuses one)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    config_dir = str(resources.files("verl").joinpath("trainer", "config"))  # type: ignore[attr-defined]
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return hydra_compose(config_name="ppo_megatron_trainer", overrides=overrides)


def _megatron_accepts(override: str) -> bool:
    try:
        _megatron_compose([override])
    except Exception:  # noqa: BLE001 - hydra's ConfigCompositionException and omegaconf's errors alike
        return False
    return True


def _source_has(module: str, *texts: str) -> bool:
    source = _source(module)
    return source is not None and all(text in source for text in texts)


def _rule_fires(rule_name: str, plan) -> bool:
    return any(v.rule == rule_name for v in check_plan(plan).violations)


def version_rule_findings(config: Any, version: str) -> list[tuple[str, bool, bool]]:
    """(what, what this verl's own code does, what rlplan says for it) for each version-dependent rule: the
    rule (or behaviour) must hold exactly where verl's config classes, worker normalisation or rollout code
    refuse (or misbehave on) the config."""
    from rlplan.planner.stack import (
        AGENT_LOOP,
        ASYNC_ROLLOUT_DEFAULT,
        BATCHED_TOKENS_RAISED,
        CHUNKED_PREFILL_NEEDS_MODEL_LEN,
        LEN_FROM_MODEL_ALWAYS,
        LEN_FROM_SEQUENCES,
        LORA_RANK_UNROUNDED,
        StackSection,
    )

    stack = StackSection(verl=version)
    grad_offload = plan_on(version, {"actor.strategy": "megatron", "actor.megatron.grad_offload": True})
    spmd = "verl.workers.rollout.vllm_rollout.vllm_rollout_spmd"
    server = "verl.workers.rollout.vllm_rollout.vllm_async_server"
    unrounded = (_source_has("verl.workers.fsdp_workers", '"max_lora_rank": self._lora_rank')
                 or _source_has(spmd, '"max_lora_rank": model_config.lora_rank'))
    return [
        ("megatron_grad_offload_is_not_in_verl_0_9: hydra refuses actor.megatron.grad_offload",
         not _megatron_accepts("actor_rollout_ref.actor.megatron.grad_offload=True"),
         _rule_fires("megatron_grad_offload_is_not_in_verl_0_9", grad_offload)),
        (f"{AGENT_LOOP.name}: verl/experimental/agent_loop chunks the batch over its workers",
         _source_has("verl.experimental.agent_loop.agent_loop", "prompts.chunk(len(self.agent_loop_workers))"),
         AGENT_LOOP.holds_for(version)),
        (f"{ASYNC_ROLLOUT_DEFAULT.name}: rollout.mode defaults to async",
         raw_node_value(config, "actor_rollout_ref.rollout.mode") == "async",
         ASYNC_ROLLOUT_DEFAULT.holds_for(version)),
        (f"{LEN_FROM_SEQUENCES.name}: the sync rollout falls back to prompt + response",
         _source_has(spmd, "prompt_length + config.response_length")
         or _source_has(spmd, "config.prompt_length + config.response_length"),
         LEN_FROM_SEQUENCES.holds_for(version)),
        (f"{LEN_FROM_MODEL_ALWAYS.name}: the server sets max_model_len to max_position_embeddings outright",
         _source_has(server, "self.config.max_model_len = self.model_config.hf_config.max_position_embeddings"),
         LEN_FROM_MODEL_ALWAYS.holds_for(version)),
        (f"{CHUNKED_PREFILL_NEEDS_MODEL_LEN.name}: verl refuses batched tokens below max_model_len with chunked "
         "prefill", _source_has(spmd, "Enable chunked prefill, max_num_batched_tokens is smaller than max_model_len"),
         CHUNKED_PREFILL_NEEDS_MODEL_LEN.holds_for(version)),
        (f"{BATCHED_TOKENS_RAISED.name}: verl raises max_num_batched_tokens to max_model_len",
         _source_has(server, "raising max_num_batched_tokens"), BATCHED_TOKENS_RAISED.holds_for(version)),
        (f"{LORA_RANK_UNROUNDED.name}: verl passes lora_rank to vLLM unrounded",
         unrounded, LORA_RANK_UNROUNDED.holds_for(version) and in_range(version, "0.4.0", None)),
        ("log_prob_micro_batch_divides_batch: the default worker asserts the micro batch divides the batch",
         engine_worker_is_default(config) and _source_has("verl.workers.engine.utils", "data size must be divisible"),
         _rule_fires("log_prob_micro_batch_divides_batch", plan_on(
             version, {"rollout.log_prob_micro_batch_size_per_gpu": 5}).evolve(stack=stack))),
    ]


def check_version_rules(config: Any, version: str) -> tuple[int, list[str]]:
    findings = version_rule_findings(config, version)
    return len(findings), [f"rules: {what}: verl {version} {'does' if verl_does else 'does not'}, rlplan says it "
                           f"{'does' if rlplan_says else 'does not'}"
                           for what, verl_does, rlplan_says in findings if verl_does != rlplan_says]


def main() -> int:
    import verl

    version = verl.__version__
    config = full_compose([])
    failures: list[str] = []
    counts: dict[str, int] = {}
    for name, check in (("dated keys", lambda: check_dated_keys(config, version)),
                        ("behaviour defaults", lambda: check_behaviour_defaults(config, version)),
                        ("rendered layouts", lambda: check_rendered_keys(config, version)),
                        ("refused missing keys", lambda: check_render_refuses_missing(version)),
                        ("engine-worker rules", lambda: check_engine_worker_rules(config, version)),
                        ("version-dependent rules", lambda: check_version_rules(config, version))):
        counts[name], found = check()
        failures += found
    print(f"verl {version}: " + ", ".join(f"{count} {name}" for name, count in counts.items()))
    for failure in failures:
        print("FAIL", failure)
    if failures:
        print(f"{len(failures)} disagreement(s) between rlplan's version tables and verl {version}")
        return 1
    print(f"rlplan's version tables agree with verl {version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

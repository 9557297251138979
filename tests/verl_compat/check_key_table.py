"""verl's own YAML defaults and hydra-core's override parser as oracles for the importer's key table.

`planner/verl_keys.py` is kept by hand: which verl key each plan field maps to, verl's default for it,
and a Hydra value codec (`parse_value`, `format_value`).  Run inside the verl_compat environment
(verl 0.9.x + hydra-core), this checks it against the real thing:

1. keys      every key the importer knows (VERL_KEYS, the reward pair, RENDER_ALSO, the targets of
             KEY_ALIASES) exists in verl's composed `ppo_trainer` config, and every key of the Megatron
             backend (and those both share) in `ppo_megatron_trainer`;
2. defaults  each key's default in the table equals the YAML's, except the deliberate differences in
             DELIBERATE_DEFAULTS (each with its reason; an entry that no longer differs fails too);
             a `Follows(field)` default must be a YAML interpolation of that field's verl key;
3. corpus    for every override word the importer reads from tests/data/verl_scripts (through its
             bash lexer, with the environments tests/planner/test_verl_import.py uses), the key and
             prefix it splits off and the value `parse_value` reads equal what hydra's
             OverridesParser reads, as OmegaConf then holds it (`\\${` escapes resolved);
4. codec     (hypothesis) `format_value` writes text that hydra reads back as the same value.

Usage: python tests/verl_compat/check_key_table.py [--examples N]   (exit 0: all agree)
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from rlplan.planner import verl_inventory  # noqa: E402
from rlplan.planner.verl_import import (  # noqa: E402
    Override,
    ScriptContext,
    _command_from_script,
    _overrides_from_file,
)
from rlplan.planner.verl_keys import (  # noqa: E402
    BY_FIELD,
    RENDER_ALSO,
    REWARD_NAME_KEY,
    REWARD_PATH_KEY,
    REWARD_SPELLINGS,
    VERL_KEYS,
    Follows,
    Interpolation,
    format_value,
    has_key,
    parse_value,
)

SCRIPTS = ROOT / "tests" / "data" / "verl_scripts"
# Script -> (--env pins, process environment): the ones tests/planner/test_verl_import.py and
# test_sglang.py import them with.
SCRIPT_ENVIRONMENTS = {
    "grpo_lora_shell_vars.sh": ({"NGPUS": "8", "HOME": "/home/u"}, {}),
    "ppo_offload_deprecated_globals.sh": ({"DATA_DIR": "/data"}, {}),
    "sglang_multiturn_qwen2.5_3b.sh": ({"PROJECT_DIR": "/verl", "HOME": "/home/u"}, {}),
    "megatron_dense_qwen2_7b.sh": ({"HOME": "/home/u"}, {}),
    "megatron_dense_lora_qwen2_7b.sh": ({"HOME": "/home/u"}, {}),
    "megatron_moe_qwen3_30b_a3b.sh": ({"HOME": "/home/u", "TEST_FILE": "/data/aime-2024.parquet"}, {}),
    "megatron_moe_lora_qwen3_30b_a3b.sh": ({"HOME": "/home/u"}, {}),
    "trtllm_grpo_qwen2_7b.sh": ({"HOME": "/home/u"}, {}),
    # The script ships LLM="<path_to_dsv3_config>", which Hydra's lexer refuses: the model as the user sets it.
    "megatron_moe_deepseek_v3_256_h100.sh": ({"HOME": "/home/u", "CKPT_DIR": "/c", "LLM": "deepseek-ai/DeepSeek-V3",
                                              "RAY_DATA_HOME": "/r", "TRAIN_FILE": "/t", "TEST_FILE": "/t"}, {}),
}

# verl key -> why rlplan's table keeps a different default from verl 0.9's YAML.
DELIBERATE_DEFAULTS = {
    "actor_rollout_ref.model.path": "the YAML's placeholder model; an import without a model is an error",
    "actor_rollout_ref.rollout.name": "mandatory (???) in the YAML; the import assumes vllm and warns",
    "data.seed": "verl's null leaves the sampler unseeded; a plan always carries a seed",
    "actor_rollout_ref.actor.optim.lr_warmup_steps": "verl's -1 means lr_warmup_steps_ratio, 0 by default: "
                                                     "no warm-up, which the plan spells 0",
    "actor_rollout_ref.rollout.multi_stage_wake_up": "the YAML says false, but verl never reads it and wakes "
                                                     "in stages whenever free_cache_engine",
    "critic.ppo_mini_batch_size": "optional in the plan: unset renders nothing and verl's interpolation of the "
                                  "actor's mini batch applies",
}

# verl key -> why the table keeps a key verl 0.9.1's config lacks (a render writes it only where the plan sets it).
KEYS_BEYOND_THE_CONFIG = {
    "actor_rollout_ref.actor.megatron.grad_offload": "verl b178a3cd's Megatron examples set it; optional in the "
                                                     "plan, rendered only when set",
    "critic.megatron.grad_offload": "as the actor's",
}

_ABSENT = object()


def compose_defaults(config_name: str = "ppo_trainer"):
    from hydra import compose, initialize_config_dir

    config_dir = str(resources.files("verl.trainer").joinpath("config"))
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name=config_name)


def raw_node_value(config: Any, key: str) -> Any:
    """The YAML value of a dotted key as written (interpolations unresolved, `???` kept), or _ABSENT."""
    from omegaconf import OmegaConf

    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(config, parent_key, default=None) if parent_key else config
    if parent is None or not OmegaConf.is_dict(parent) or leaf not in parent.keys():  # `in` hides ??? values
        return _ABSENT
    node = parent._get_node(leaf)
    return OmegaConf.to_container(node) if OmegaConf.is_config(node) else node._value()


def resolved_default(config: Any, key: str) -> Any:
    from omegaconf import OmegaConf

    value = OmegaConf.select(config, key)
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def table_default(entry: Any) -> Any:
    """The table's default as the YAML spells it: one module/file as a string, several as a list."""
    if isinstance(entry.default, tuple):
        if entry.kind == "list":
            return list(entry.default)
        return entry.default[0] if len(entry.default) == 1 else list(entry.default)
    return entry.default


def follows_key(interpolation: str, key: str) -> str | None:
    """The key a `${...}` / `${oc.select:KEY,default}` interpolation refers to, made absolute."""
    body = interpolation.strip()
    if not (body.startswith("${") and body.endswith("}")):
        return None
    body = body[2:-1]
    if body.startswith("oc.select:"):
        body = body[len("oc.select:"):].split(",")[0]
    if body.startswith("."):
        return f"{key.rpartition('.')[0]}{body}"
    return body


def check_keys_and_defaults(config: Any, version: str, backend: str = "fsdp") -> list[str]:
    """The table's entries of one backend (those both share included) against that backend's config.
    `version`: the installed verl's; every spelling of a key (VerlKey.spellings, the reward pair's) is checked to
    be in the config exactly where presets/verl_inventory.json says this release has it."""
    failures: list[str] = []
    name = "ppo_megatron_trainer" if backend == "megatron" else "ppo_trainer"
    entries = [entry for entry in VERL_KEYS if has_key(entry, backend)]  # type: ignore[arg-type]
    known = [key for entry in entries for key in entry.spellings]
    if backend == "fsdp":
        known += [*REWARD_SPELLINGS[REWARD_PATH_KEY], *REWARD_SPELLINGS[REWARD_NAME_KEY], *RENDER_ALSO]
    for key in known:
        listed = verl_inventory.has_key(version, key, backend)  # type: ignore[arg-type]
        absent = raw_node_value(config, key) is _ABSENT and key not in KEYS_BEYOND_THE_CONFIG
        if absent and listed:
            failures.append(f"keys: {key} is not in verl {version}'s {name} config, which the inventory lists it in")
        elif not absent and not listed and key not in KEYS_BEYOND_THE_CONFIG:
            failures.append(f"keys: {key} is in verl {version}'s {name} config, but not in the inventory")
    for entry in entries:
        raw = raw_node_value(config, entry.key)
        if raw is _ABSENT:
            continue
        if isinstance(entry.default, Follows):
            target = BY_FIELD[entry.default.field].key
            referred = follows_key(raw, entry.key) if isinstance(raw, str) else None
            if referred != target:
                failures.append(f"defaults: {entry.key} follows {target} in the table, but verl's YAML says {raw!r}")
            continue
        agrees = table_default(entry) in (raw, resolved_default(config, entry.key))
        if entry.key in DELIBERATE_DEFAULTS:
            if agrees:
                failures.append(f"defaults: {entry.key} is listed as a deliberate difference, but the table and "
                                f"verl now agree ({raw!r}): drop it from DELIBERATE_DEFAULTS")
        elif not agrees:
            failures.append(f"defaults: {entry.key} defaults to {entry.default!r} in the table, "
                            f"{raw!r} in verl's YAML")
    return failures


# --- hydra's reading of a value --------------------------------------------------------------------

_PARSER: Any = None


def hydra_override(word: str) -> Any:
    global _PARSER
    if _PARSER is None:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        _PARSER = OverridesParser.create()
    return _PARSER.parse_override(word)


def as_omegaconf_holds(value: Any) -> Any:
    """Hydra's parsed value as OmegaConf then holds it: `\\${` escapes resolved, real interpolations kept.

    Run with no resolvers registered, so that a string resolves only when it holds no interpolation
    (escaped ones included) and anything else, `${oc.env:...}` too, stays an Interpolation.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(value, list):
        return [as_omegaconf_holds(item) for item in value]
    if isinstance(value, dict):
        return {key: as_omegaconf_holds(item) for key, item in value.items()}
    if not isinstance(value, str) or "${" not in value:
        return value
    try:
        return OmegaConf.create({"v": value}).v
    except OmegaConfBaseException:
        return Interpolation(value)


def hydra_reading(word: str) -> tuple[str, str, Any]:
    """(prefix, key, value) as hydra reads one override word."""
    from hydra.core.override_parser.types import OverrideType

    override = hydra_override(word)
    prefix = {OverrideType.CHANGE: "", OverrideType.ADD: "+", OverrideType.FORCE_ADD: "++",
              OverrideType.DEL: "~"}[override.type]
    key = override.key_or_group if override.package is None else f"{override.key_or_group}@{override.package}"
    value = None if override.type == OverrideType.DEL and override.value() is None else override.value()
    return prefix, key, as_omegaconf_holds(value)


def importer_reading(word: str) -> tuple[str, str, Any]:
    override = Override.parse(word)
    return override.prefix, override.key, None if override.value is None else parse_value(override.value)


def corpus() -> list[tuple[str, str]]:
    """(file, override word) for every override the importer reads from the script corpus."""
    words: list[tuple[str, str]] = []
    for path in sorted(SCRIPTS.iterdir()):
        if path.suffix == ".txt":
            found = _overrides_from_file(path.read_text())
        elif path.suffix == ".sh":
            env, environment = SCRIPT_ENVIRONMENTS.get(path.name, ({}, {}))
            command = _command_from_script(path.read_text(), env, environment, ScriptContext(), [])
            found = list(command.overrides) if command else None
        else:
            continue
        assert found, f"the importer read no overrides from {path.name}"
        words += [(path.name, word) for word in found]
    return words


def check_corpus() -> tuple[list[str], int]:
    failures = []
    words = corpus()
    for name, word in words:
        ours, hydras = importer_reading(word), hydra_reading(word)
        if ours != hydras:
            failures.append(f"corpus: {name}: {word!r}: the importer reads {ours!r}, hydra {hydras!r}")
    return failures, len(words)


# --- the writer: format_value's text reads back in hydra as the value ---------------------------------

_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=24)
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12),
                     st.floats(allow_nan=False, allow_infinity=False), _TEXT,
                     st.sampled_from(["${oc.env:HOME}", "a\\${b}", "it's", "x,y", "[1]", "null", "1e-6", " pad "]))
VALUES = st.one_of(_SCALARS, st.lists(_SCALARS, max_size=4))


def check_codec(examples: int) -> list[str]:
    failures: list[str] = []

    @settings(max_examples=examples, deadline=None, database=None)
    @given(VALUES)
    def format_value_reads_back_in_hydra_as_the_same_value(value: Any) -> None:
        expected = list(value) if isinstance(value, tuple) else value
        text = format_value(value)
        try:
            _, _, read = hydra_reading(f"key={text}")
        except Exception as error:  # noqa: BLE001 - any hydra refusal is a disagreement to report
            read = f"<hydra refused it: {type(error).__name__}: {error}>"
        if read != expected or type(read) is not type(expected):
            failures.append(f"codec: {value!r} is written {text!r}, which hydra reads as {read!r}")
            raise AssertionError(failures[-1])

    try:
        format_value_reads_back_in_hydra_as_the_same_value()
    except AssertionError:
        pass  # the shrunk counterexample is the last failure recorded
    return failures[-1:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=int(os.environ.get("VERL_COMPAT_EXAMPLES", "300")))
    args = parser.parse_args()
    import hydra
    import verl
    from omegaconf import OmegaConf

    config, megatron_config = compose_defaults(), compose_defaults("ppo_megatron_trainer")
    OmegaConf.clear_resolvers()  # as_omegaconf_holds resolves only escapes, never a lookup
    failures = (check_keys_and_defaults(config, verl.__version__)
                + check_keys_and_defaults(megatron_config, verl.__version__, "megatron"))
    corpus_failures, words = check_corpus()
    failures += corpus_failures
    failures += check_codec(args.examples)
    print(f"verl {verl.__version__}, hydra-core {hydra.__version__}: {len(VERL_KEYS)} table keys, "
          f"{len(DELIBERATE_DEFAULTS)} deliberate default differences, {words} corpus overrides, "
          f"{args.examples} codec examples")
    for failure in failures:
        print("FAIL", failure)
    print("all agree" if not failures else f"{len(failures)} disagreement(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""The target stack (planner/stack.py): versions, the default stack, version-dependent defaults, rules and keys."""

from __future__ import annotations

import json
import re
from pathlib import Path

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from rlplan.planner import verl_inventory
from rlplan.planner.commands.cli import app
from rlplan.planner.errors import PlanError
from rlplan.planner.knobs import apply_knobs
from rlplan.planner.planfile import plan_from_toml, plan_to_toml
from rlplan.planner.presets import resolve_gpu
from rlplan.planner.render import render_plan
from rlplan.planner.rules import RULES, check_plan
from rlplan.planner.stack import (
    BEHAVIOURS,
    DEFAULT_STACK,
    DEFAULT_VERL,
    EMPTIES_CACHE_BEFORE_SYNC,
    ENGINE_IN_TRAINER_PROCESS,
    ENGINE_WORKER,
    FITTED_ENGINE_VERSIONS,
    MEGATRON_EMPTIES_CACHE_BEFORE_SYNC,
    SGLANG_FRACTION_OF_FREE,
    TRAINER_FLUSHED_AT_ENGINE_START,
    VERL_ENGINE_PINS,
    VERL_RELEASES,
    VERL_WARMUP_STEPS_DEFAULT,
    VLLM_GEMMA3_POSITIONS_PRESCALED,
    VLLM_REFUSES_SHORT_FREE_MEMORY,
    VLLM_V0_WHOLE_GPU_PROFILE,
    VLLM_V1_WHOLE_GPU_PROFILE,
    VLLM_YARN_POSITIONS_PRESCALED,
    WARMUP_ZERO_READS_RATIO,
    WEIGHT_SYNC_BUCKET_512,
    StackSection,
    default_engine_version,
    holds,
    parse_version,
    root_reshards_after_forward,
    solve_pins,
    source_tree_switches,
    stack_defaults,
    unnamed_engine_range,
    verl_sleep_level,
)
from rlplan.planner.verl_import import import_verl_script
from rlplan.planner.verl_keys import BY_FIELD, WARMUP_RATIO_KEY
from tests.planner.plans import make_plan

runner = CliRunner()
H100 = resolve_gpu("h100-80g")
MINIMAL = "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct\nactor_rollout_ref.rollout.name=vllm\n"


def load(text: str, versions=(None, None, None)):
    return import_verl_script(text, gpu=H100, host_memory_gib=512.0, env={}, local_config_reader=lambda path: None,
                              environment={}, versions=versions)


@pytest.mark.parametrize(("text", "release"), [("0.4.1", (0, 4, 1)), ("v0.3.0.post1", (0, 3, 0)),
                                               ("0.8.0.dev", (0, 8, 0)), ("0.5.0rc1", (0, 5, 0)),
                                               ("0.11.1+cu128", (0, 11, 1)), ("1", (1, 0, 0))])
def test_versions_parse_to_their_release(text, release):
    assert parse_version(text) == release


@pytest.mark.parametrize("text", ["", "latest", "0.x", "0.4.1.2.3", "..."])
def test_a_bad_version_is_an_error_naming_the_field(text):
    with pytest.raises(PlanError) as raised:
        StackSection(verl=text)
    assert raised.value.field == "stack.verl"


@given(st.tuples(*(st.integers(0, 30),) * 3), st.tuples(*(st.integers(0, 30),) * 3))
def test_version_order_is_the_order_of_release_numbers(a, b):
    """Invariant: comparing parsed versions is comparing their (major, minor, patch) tuples."""
    text_a, text_b = ".".join(map(str, a)), ".".join(map(str, b))
    assert (parse_version(text_a) < parse_version(text_b)) == (a < b)


def test_the_plan_names_a_version_only_for_its_own_rollout_engine():
    plan = make_plan()
    plan.evolve(stack=StackSection(vllm="0.8.3"))
    with pytest.raises(PlanError) as raised:
        plan.evolve(stack=StackSection(sglang="0.4.6"))
    assert raised.value.field == "stack.sglang"


def test_the_stack_round_trips_through_plan_toml_and_a_file_without_it_gets_the_default():
    plan = make_plan().evolve(stack=StackSection(verl="0.4.0", vllm="0.8.3"))
    text = plan_to_toml(plan)
    assert '[stack]\nverl = "0.4.0"\nvllm = "0.8.3"' in text
    assert plan_from_toml(text).stack == plan.stack
    without = text.replace('[stack]\nverl = "0.4.0"\nvllm = "0.8.3"\n', "")
    assert plan_from_toml(without).stack == DEFAULT_STACK


@pytest.mark.parametrize(("verl", "vllm", "sglang"), [
    ("0.3.0.post1", "0.8.2", "0.4.4.post3"),   # vllm<=0.8.2: vLLM 0.11 is not what this verl installs
    ("0.4.1", "0.8.5", "0.4.6.post5"),         # a release between two listed ones has the older one's pins
    ("0.6.0", "0.9.1", "0.5.2"),
    ("0.7.1", "0.11.0", "0.5.6"),              # vllm 0.8.5..0.12.0 allows the version the terms were read at
    ("0.9.0", "0.18.0", "0.5.8"),              # vllm>=0.18.0, open above: its lowest
    ("0.9.1", "0.24.0", "0.5.12"),
    ("0.2.0", "0.8.2", "0.4.4.post3"),         # older than every listed release: the oldest's
])
def test_an_engine_left_out_is_what_the_verl_release_installs(verl, vllm, sglang):
    stack = StackSection(verl=verl)
    assert (stack.version_of("vllm"), stack.version_of("sglang")) == (vllm, sglang)
    assert StackSection(verl=verl, vllm="0.10.1").version_of("vllm") == "0.10.1"  # a given version is kept


@given(st.sampled_from(sorted(VERL_ENGINE_PINS)), st.sampled_from(["vllm", "sglang"]))
def test_an_engine_default_is_always_within_the_verl_releases_pins(verl, engine):
    lowest, highest = VERL_ENGINE_PINS[verl][engine]
    chosen = parse_version(default_engine_version(verl, engine))
    assert lowest is None or chosen >= parse_version(lowest)
    assert highest is None or chosen <= parse_version(highest)
    fitted = parse_version(FITTED_ENGINE_VERSIONS[engine])
    if (lowest is None or fitted >= parse_version(lowest)) and (highest is None or fitted <= parse_version(highest)):
        assert chosen == fitted  # the terms' own version wherever the release allows it


def test_every_behaviour_names_its_code_path_and_a_range():
    for behaviour in BEHAVIOURS:
        assert behaviour.code_path and (behaviour.since or behaviour.before), behaviour.name


def test_the_default_stack_has_verl_09s_defaults():
    assert stack_defaults(DEFAULT_STACK) == {}


@pytest.mark.parametrize(("verl", "expected"), [
    ("0.3.0.post1", {"actor.entropy_coeff": 0.001, "rollout.enforce_eager": True,
                     "rollout.multi_stage_wake_up": False, "ref.model_dtype": "bf16",
                     "trainer.val_before_train": True, "rollout.update_weights_bucket_megabytes": 512}),
    ("0.4.0", {"rollout.enforce_eager": True, "rollout.multi_stage_wake_up": False, "ref.model_dtype": "bf16",
               "rollout.update_weights_bucket_megabytes": 512}),
    ("0.5.0", {"rollout.enforce_eager": True, "ref.model_dtype": "bf16",
               "rollout.update_weights_bucket_megabytes": 512}),
    ("0.6.0", {"rollout.update_weights_bucket_megabytes": 512}),
    ("0.7.0", {"rollout.update_weights_bucket_megabytes": 512}),
    ("0.7.1", {}),
])
def test_old_verls_defaults_are_what_their_yaml_said(verl, expected):
    assert stack_defaults(StackSection(verl=verl)) == expected


def test_import_fills_omitted_keys_with_the_target_verls_defaults_and_keeps_the_scripts_own():
    old = load(MINIMAL, versions=("0.3.0.post1", None, None)).plan
    assert old.stack.verl == "0.3.0.post1"
    assert old.actor.entropy_coeff == 0.001 and old.rollout.enforce_eager and not old.rollout.multi_stage_wake_up
    pinned = load(MINIMAL + "actor_rollout_ref.actor.entropy_coeff=0\n", versions=("0.3.0.post1", None, None)).plan
    assert pinned.actor.entropy_coeff == 0.0
    assert load(MINIMAL).plan.stack == DEFAULT_STACK and not load(MINIMAL).plan.rollout.enforce_eager


def test_import_infers_vllms_v0_era_from_the_xformers_backend_and_says_so():
    result = load("export VLLM_ATTENTION_BACKEND=XFORMERS\npython3 -m verl.trainer.main_ppo "
                  + MINIMAL.replace("\n", " "))
    # V0 is gone from vLLM 0.11, and verl 0.9.0 on installs vLLM >= 0.18: the script is judged on verl 0.8.0 at most.
    assert result.plan.stack.vllm == "0.8.5" and result.plan.stack.vllm_engine == "v0"
    assert result.plan.stack.verl == "0.8.0" and result.plan.stack.verl_oldest == "0.3.0.post1"
    assert any("VLLM_ATTENTION_BACKEND=XFORMERS" in warning for warning in result.warnings)


def test_import_infers_the_newest_verl_a_removed_key_allows_and_a_flag_overrules_it():
    text = MINIMAL + "actor_rollout_ref.rollout.mode=sync\n"
    result = load(text)
    assert result.plan.stack.verl == "0.6.1"
    assert any("rollout.mode=sync" in warning and "0.6.1" in warning for warning in result.warnings)
    assert load(text, versions=("0.5.0", None, None)).plan.stack.verl == "0.5.0"


def test_import_infers_nothing_from_keys_every_version_has():
    assert load(MINIMAL + "actor_rollout_ref.rollout.gpu_memory_utilization=0.5\n").plan.stack == DEFAULT_STACK


def test_a_key_newer_releases_added_leaves_a_range_up_to_the_default():
    stack = load(MINIMAL + "actor_rollout_ref.rollout.multi_stage_wake_up=true\n").plan.stack
    assert (stack.verl_oldest, stack.verl) == ("0.4.1", DEFAULT_VERL)


def test_engine_worker_rule_applies_only_on_stacks_with_the_engine_worker():
    applies = {rule.name: rule.applies for rule in RULES}
    assert applies["dynamic_bsz_flags_agree"] is ENGINE_WORKER
    mixed = apply_knobs(make_plan(), {"actor.use_dynamic_bsz": True, "rollout.log_prob_use_dynamic_bsz": False})
    refused = {v.rule for v in check_plan(mixed).errors}
    assert "dynamic_bsz_flags_agree" in refused
    legacy = mixed.evolve(stack=StackSection(verl="0.7.1"))
    assert not holds(ENGINE_WORKER, legacy.stack)
    assert "dynamic_bsz_flags_agree" not in {v.rule for v in check_plan(legacy).errors}
    assert "dynamic_bsz_flags_agree" in {v.rule for v in check_plan(legacy.evolve(
        stack=StackSection(verl="0.8.0"))).errors}


def test_render_leaves_out_a_key_the_target_verl_lacks_when_the_plan_asks_for_its_behaviour():
    plan = attrs.evolve(make_plan(), stack=StackSection(verl="0.4.0"))
    plan = apply_knobs(plan.evolve(model=attrs.evolve(plan.model, path="Qwen/Qwen2.5-7B-Instruct")),
                       stack_defaults(plan.stack))  # multi_stage_wake_up false, the reference in bf16
    overrides = render_plan(plan, "verl", "overrides")
    assert "multi_stage_wake_up" not in overrides and "entropy_checkpointing" not in overrides
    assert "model_dtype" not in overrides
    assert "layered_summon" in overrides  # verl 0.4.0 has it


def test_render_refuses_by_name_a_key_the_target_verl_lacks_when_the_plan_changes_it():
    plan = make_plan(overrides={"actor.entropy_checkpointing": True})
    plan = plan.evolve(model=attrs.evolve(plan.model, path="Qwen/Qwen2.5-7B-Instruct"),
                       stack=StackSection(verl="0.4.0"))
    with pytest.raises(PlanError) as raised:
        render_plan(plan, "verl", "overrides")
    assert raised.value.field == "actor.entropy_checkpointing" and "0.4.1" in raised.value.message


def test_render_leaves_out_the_actor_seed_a_verl_before_0_7_cannot_read_and_writes_it_from_0_7():
    plan = make_plan(overrides={"trainer.seed": 7})
    plan = plan.evolve(model=attrs.evolve(plan.model, path="Qwen/Qwen2.5-7B-Instruct"))
    assert "fsdp_config.seed" not in render_plan(plan.evolve(stack=StackSection(verl="0.6.1")), "verl", "overrides")
    assert "fsdp_config.seed=7" in render_plan(plan.evolve(stack=StackSection(verl="0.7.0")), "verl", "overrides")


def test_version_flags_reach_validate_and_solve_json(tmp_path):
    path = tmp_path / "plan.toml"
    path.write_text(plan_to_toml(make_plan()))
    result = runner.invoke(app, ["validate", str(path), "--json", "--verl-version", "0.4.0", "--vllm-version", "0.8.3"])
    assert json.loads(result.output)["stack"] == {"verl": "0.4.0", "vllm": "0.8.3"}
    bad = runner.invoke(app, ["validate", str(path), "--json", "--verl-version", "newest"])
    assert bad.exit_code == 2 and json.loads(bad.output)["error"]["field"] == "--verl-version"
    solved = runner.invoke(app, ["solve", "--model", "qwen2.5-7b", "--gpus", "8", "--gpu", "h100-80g", "--prompt-len",
                                 "512", "--response-len", "1024", "--verl-version", "0.3.0.post1", "--json"])
    payload = json.loads(solved.output)
    assert payload["stack"]["verl"] == "0.3.0.post1"
    assert payload["plan"]["actor"]["entropy_coeff"] == 0.001 and payload["plan"]["rollout"]["enforce_eager"]


@pytest.mark.parametrize(("engine", "version", "reshards"), [
    ("vllm", "0.8.5", False), ("vllm", "0.10.1", False),  # torch 2.6 / 2.7.1: the root's reshard cleared
    ("vllm", "0.10.2", True), ("vllm", "0.11.0", True), ("vllm", "0.11.1+cu128", True),  # torch 2.8.0 and on
    ("sglang", "0.4.6.post5", False), ("sglang", "0.4.10.post2", False),  # torch 2.6.0 / 2.7.1
    ("sglang", "0.5.0rc2", True), ("sglang", "0.5.2", True),  # torch 2.8.0
])
def test_the_root_reshards_after_forward_from_each_engines_first_release_on_torch_2_8(engine, version, reshards):
    stack = StackSection(**{engine: version})
    assert root_reshards_after_forward(stack, engine) is reshards
    # The other engine's range says nothing about this one: the stack's engine pins the trainer's torch.
    other = "sglang" if engine == "vllm" else "vllm"
    assert root_reshards_after_forward(stack, other) is root_reshards_after_forward(StackSection(), other)


def test_the_root_follows_the_engine_verl_installs_torch_2_8_on_verl_0_9_1_and_older_torch_on_verl_0_4_1():
    # verl 0.9.1 installs vLLM 0.24.0 / SGLang 0.5.12 (torch >= 2.8); verl 0.4.1 vLLM 0.8.5 / SGLang 0.4.6.post5.
    assert root_reshards_after_forward(DEFAULT_STACK, "vllm") and root_reshards_after_forward(DEFAULT_STACK, "sglang")
    old = StackSection(verl="0.4.1")
    assert not root_reshards_after_forward(old, "vllm") and not root_reshards_after_forward(old, "sglang")


def test_the_engine_pin_table_in_docs_is_the_one_stack_py_holds():
    """docs/verl-versions.md's table of each verl release's engine extras and defaults, row by row."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "verl-versions.md").read_text()
    rows = re.findall(r"^\| ([0-9][^|]*?) \| ([^|]+) \| ([^|]+) \| ([^|]+) \| ([^|]+) \|$", text, flags=re.M)
    documented = {}
    for releases, _vllm_extra, vllm, _sglang_extra, sglang in rows:
        for release in releases.split(", "):
            documented[release.strip()] = (vllm.strip(), sglang.strip())
    assert set(VERL_ENGINE_PINS) <= set(documented)
    for release, (vllm, sglang) in documented.items():
        assert (default_engine_version(release, "vllm"), default_engine_version(release, "sglang")) == (vllm, sglang)


def test_the_rules_by_release_table_in_docs_names_every_dated_rule_with_its_releases():
    docs = (Path(__file__).resolve().parents[2] / "docs" / "verl-versions.md").read_text()
    table = docs[docs.index("## Rules by release"):docs.index("## Engine formulas by version")]
    rows = {line.split("|")[1].strip().strip("`"): line for line in table.splitlines() if line.startswith("| `")}
    for dated in (rule for rule in RULES if rule.applies is not None):
        assert dated.name in rows, dated.name
        assert dated.applies.versions in rows[dated.name], (dated.name, dated.applies.versions)
        assert f"`{dated.applies.name}`" in rows[dated.name] or dated.applies is ENGINE_WORKER


def test_the_engine_formula_table_names_each_formula_behaviour():
    docs = (Path(__file__).resolve().parents[2] / "docs" / "verl-versions.md").read_text()
    table = docs[docs.index("## Engine formulas by version"):docs.index("## What a script shows")]
    for behaviour in (VLLM_V0_WHOLE_GPU_PROFILE, VLLM_V1_WHOLE_GPU_PROFILE, SGLANG_FRACTION_OF_FREE):
        assert f"`{behaviour.name}`" in table, behaviour.name


@pytest.mark.parametrize("verl", VERL_RELEASES)
def test_a_plans_weight_sync_bucket_is_the_default_of_the_release_it_targets(verl):
    """The bucket default stack.py gives a release is the one its own rollout config has under the spelling it
    uses (presets/verl_inventory.json, read from each tag / wheel), 512 MB in 0.5.0-0.7.0; releases without the key
    get the smallest default verl ever had (they push a tensor at a time)."""
    entry = BY_FIELD["rollout.update_weights_bucket_megabytes"]
    spelling = entry.spelling_for(verl, "fsdp")
    defaults = stack_defaults(StackSection(verl=verl))
    planned = defaults.get(entry.field, entry.default)
    if spelling is None:
        assert parse_version(verl) < parse_version("0.5.0")
        assert planned == 512
    else:
        assert planned == verl_inventory.default_of(verl, spelling)
    assert holds(WEIGHT_SYNC_BUCKET_512, StackSection(verl=verl)) == (planned == 512)


@pytest.mark.parametrize("verl", VERL_RELEASES)
def test_the_warmup_default_rendered_for_no_warmup_steps_is_every_releases_own(verl):
    """Every release's actor optimizer defaults lr_warmup_steps to -1 (None for Megatron in 0.4.1-0.5.0): the
    ratio decides, on every worker. That is what a plan without warm-up steps renders beside a script's
    lr_warmup_steps_ratio, so the ratio keeps working (without one, 0 and -1 both mean none on every worker);
    explicit steps are written as they are, and import reads each back."""
    key = BY_FIELD["actor.lr_warmup_steps"].spelling_for(verl, "fsdp")
    assert verl_inventory.default_of(verl, key) == VERL_WARMUP_STEPS_DEFAULT
    assert verl_inventory.default_of(verl, key, "megatron") in (VERL_WARMUP_STEPS_DEFAULT, None)
    assert verl_inventory.default_of(verl, WARMUP_RATIO_KEY) == 0.0
    for steps, passthrough, written in ((0, {WARMUP_RATIO_KEY: "0.1"}, VERL_WARMUP_STEPS_DEFAULT),
                                        (7, {WARMUP_RATIO_KEY: "0.1"}, 7), (0, {}, 0)):
        plan = make_plan(overrides={**solve_pins(DEFAULT_STACK, verl, None, None), "actor.lr_warmup_steps": steps,
                                    "model.path": "Qwen/Qwen2.5-7B-Instruct"})
        plan = attrs.evolve(plan, passthrough=passthrough)
        overrides = render_plan(plan, "verl", "overrides")
        assert f"{key}={written}" in overrides.splitlines()
        imported = load(overrides, versions=(verl, None, None)).plan
        assert imported.actor.lr_warmup_steps == steps
        assert imported.passthrough == passthrough


def test_warmup_zero_reads_the_ratio_only_on_the_engine_worker():
    """The legacy FSDP worker (the default up to 0.7.x) reads lr_warmup_steps=0 as no warm-up; the engine worker
    (the default from 0.8.0, opted into in 0.7.x) hands it to the ratio."""
    legacy = {"trainer.use_legacy_worker_impl": "disable"}
    assert not holds(WARMUP_ZERO_READS_RATIO, StackSection(verl="0.7.1"))
    assert holds(WARMUP_ZERO_READS_RATIO, StackSection(verl="0.7.1"), passthrough=legacy)
    assert not holds(WARMUP_ZERO_READS_RATIO, StackSection(verl="0.6.1"), passthrough=legacy)
    assert holds(WARMUP_ZERO_READS_RATIO, StackSection(verl="0.8.0"))


def test_the_engine_worker_does_not_run_where_a_tree_between_releases_keeps_the_legacy_switch():
    """0.8.0.dev trees defaulted trainer.use_legacy_worker_impl to auto (the legacy worker); v0.8.0 removed the key,
    so the switch only counts on 0.8.0 (where a .dev tree is judged) and disable still opts in on 0.7.x."""
    for kept in ("auto", "enable", "'auto'"):
        assert not holds(ENGINE_WORKER, StackSection(verl="0.8.0"), passthrough={"trainer.use_legacy_worker_impl": kept})
    assert holds(ENGINE_WORKER, StackSection(verl="0.8.0"), passthrough={"trainer.use_legacy_worker_impl": "disable"})
    assert holds(ENGINE_WORKER, StackSection(verl="0.9.1"), passthrough={"+trainer.use_legacy_worker_impl": "auto"})
    assert holds(ENGINE_WORKER, StackSection(verl="0.7.1"), passthrough={"trainer.use_legacy_worker_impl": "disable"})
    assert "trainer.use_legacy_worker_impl" in source_tree_switches()


@pytest.mark.parametrize(("verl", "kept"), [("0.5.0", False), ("0.7.1", False), ("0.8.0", True), ("0.9.1", True)])
def test_a_ratio_an_explicit_zero_switches_off_is_dropped_on_import(verl, kept):
    """lr_warmup_steps=0 with a ratio: no warm-up on the legacy worker (up to 0.7.x), the ratio on the engine
    worker. The plan's 0 renders as -1 (the ratio on every worker), so the import keeps the ratio only where the
    script's verl reads it; either way the rendered plan warms up as the script did."""
    ratio = WARMUP_RATIO_KEY
    script = (MINIMAL + "actor_rollout_ref.actor.optim.lr_warmup_steps=0\n" + f"{ratio}=0.1\n")
    result = load(script, versions=(verl, None, None))
    assert result.plan.actor.lr_warmup_steps == 0
    assert (ratio in result.plan.passthrough) == kept
    assert any(f"{ratio}=0.1 is dropped" in warning for warning in result.warnings) != kept
    kept_without_zero = load(MINIMAL + f"{ratio}=0.1\n", versions=(verl, None, None)).plan.passthrough
    assert kept_without_zero[ratio] == "0.1"  # verl's default -1 reads the ratio on every worker


def test_trtllm_is_an_engine_of_verl_0_7_1_on_with_verls_lowest_pin_and_only_its_own_version_named():
    """verl's `trtllm` extra (setup.py TRTLLM_REQUIRES, tensorrt-llm>=1.2.0rc6) arrives in 0.7.1."""
    assert VERL_ENGINE_PINS["0.7.1"]["trtllm"] == ("1.2.0rc6", None)
    assert "trtllm" not in VERL_ENGINE_PINS["0.7.0"]
    assert default_engine_version("0.8.0", "trtllm") == FITTED_ENGINE_VERSIONS["trtllm"] == "1.2.0rc6"
    plan = make_plan(overrides={"rollout.name": "trtllm", "stack.verl": "0.8.0"})
    assert plan.stack.version_of("trtllm") == "1.2.0rc6"
    assert plan.evolve(stack=StackSection(verl="0.8.0", trtllm="1.3.0")).stack.version_of("trtllm") == "1.3.0"
    for other in ({"vllm": "0.11.0"}, {"sglang": "0.5.8"}, {"vllm_engine": "v1"}):
        with pytest.raises(PlanError):
            plan.evolve(stack=StackSection(verl="0.8.0", **other))
    with pytest.raises(PlanError) as raised:
        make_plan().evolve(stack=StackSection(trtllm="1.2.0rc6"))
    assert raised.value.field == "stack.trtllm"


@pytest.mark.parametrize(("stack", "spans"), [
    (StackSection(verl="0.5.0"), None),  # vLLM 0.7.3-0.8.5: none has the start-up check
    (StackSection(verl="0.6.0"), ("0.7.3", "0.9.1")),  # 0.9.1 has it, 0.7.3 does not
    (StackSection(verl="0.7.0"), ("0.8.5", "0.12.0")),
    (StackSection(verl="0.6.0", vllm="0.9.1"), None),  # named: no range
    (StackSection(verl="0.9.1"), None),  # 0.24.0 only
])
def test_an_unnamed_engine_range_is_reported_where_a_behaviour_differs_across_it(stack, spans):
    assert unnamed_engine_range(stack, VLLM_REFUSES_SHORT_FREE_MEMORY) == spans


def test_every_verl_release_that_starts_vllm_in_its_own_processes_flushes_the_trainers_cache_before():
    """rollout.free_at_engine_start prices no cached trainer block where vLLM has a process of its own: that holds
    only while each such release flushes the trainer's cache as init_model ends (read per release in stack.py)."""
    for release in VERL_RELEASES:
        stack = StackSection(verl=release)
        if not holds(ENGINE_IN_TRAINER_PROCESS, stack):
            assert holds(TRAINER_FLUSHED_AT_ENGINE_START, stack), release
    assert holds(ENGINE_IN_TRAINER_PROCESS, StackSection(verl="0.7.0"))
    assert not holds(ENGINE_IN_TRAINER_PROCESS, StackSection(verl="0.7.1"))


@pytest.mark.parametrize(("vllm", "gemma3", "yarn"), [
    ("0.6.3", False, False), ("0.7.3", False, False), ("0.8.0", True, False), ("0.11.0", True, False),
    ("0.24.0", True, False), ("0.29.0", True, False), ("0.30.0", True, True),
])
def test_the_rope_types_vllm_takes_as_already_scaled_move_by_release(vllm, gemma3, yarn):
    stack = StackSection(vllm=vllm)
    assert holds(VLLM_GEMMA3_POSITIONS_PRESCALED, stack) is gemma3
    assert holds(VLLM_YARN_POSITIONS_PRESCALED, stack) is yarn
    assert not holds(VLLM_GEMMA3_POSITIONS_PRESCALED, StackSection(vllm=vllm, sglang="0.5.2"), "sglang")


@pytest.mark.parametrize(("verl", "passthrough", "fsdp", "megatron"), [
    ("0.3.0.post1", {}, True, False),  # megatron_vllm.py __enter__ without a flush
    ("0.7.0", {}, True, True),  # the legacy workers' rollout_mode
    ("0.7.0", {"trainer.use_legacy_worker_impl": "disable"}, True, True),  # the engine worker's wake_up
    ("0.7.1", {"trainer.use_legacy_worker_impl": "disable"}, False, True),  # update_weights: after the sync only
    ("0.8.0", {}, False, True),  # Megatron: load_megatron_model_to_gpu's empty_cache
    ("0.8.0", {"trainer.use_legacy_worker_impl": "auto"}, True, True),  # a 0.8.0.dev tree's legacy worker
    ("0.9.0", {}, True, True), ("0.9.1", {}, True, True),  # update_weights flushes first again
])
def test_verl_flushes_the_cache_before_the_weight_sync_per_backend_and_worker(verl, passthrough, fsdp, megatron):
    stack = StackSection(verl=verl)
    assert holds(EMPTIES_CACHE_BEFORE_SYNC, stack, passthrough=passthrough) is fsdp
    assert holds(MEGATRON_EMPTIES_CACHE_BEFORE_SYNC, stack, passthrough=passthrough) is megatron


@pytest.mark.parametrize(("verl", "vllm", "level"), [
    ("0.3.0.post1", None, 1), ("0.4.1", None, 1), ("0.5.0", None, 1), ("0.5.0", "0.8.5", 1),
    ("0.6.0", "0.8.4", 1), ("0.6.0", "0.8.5", 2), ("0.6.0", None, 2), ("0.6.1", None, 2), ("0.7.0", None, 2),
    ("0.9.1", None, 2),
])
def test_verl_sleeps_vllm_at_level_one_up_to_05_and_at_level_two_from_06_on_vllm_085(verl, vllm, level):
    """verl up to v0.5.0 calls sleep(level=1); from v0.6.0 VLLM_SLEEP_LEVEL is 2 on vLLM >= 0.8.5."""
    assert verl_sleep_level(StackSection(verl=verl, vllm=vllm), False, False) == level


@pytest.mark.parametrize("verl", ["0.5.0", "0.6.0", "0.9.1"])
def test_an_adapter_or_layered_sync_sleeps_at_level_one_on_every_release(verl):
    stack = StackSection(verl=verl)
    assert verl_sleep_level(stack, True, False) == verl_sleep_level(stack, False, True) == 1

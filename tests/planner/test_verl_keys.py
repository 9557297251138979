"""The key table (planner/verl_keys.py) against the per-release inventory, and the doc generated from both."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlplan.planner import verl_inventory
from rlplan.planner.presets import resolve_gpu
from rlplan.planner.verl_import import import_verl_script
from rlplan.planner.verl_keys import KEY_ALIASES, VERL_KEYS
from tests.verl_compat import key_table_doc

ROOT = Path(__file__).resolve().parents[2]


def test_docs_key_table_is_the_generated_one():
    """Regenerate with: python tests/verl_compat/key_table_doc.py --write docs/verl-versions.md"""
    text = (ROOT / "docs" / "verl-versions.md").read_text()
    assert key_table_doc.replaced(text) == text


def test_every_spelling_in_the_table_is_a_key_of_some_release():
    for entry in VERL_KEYS:
        for key in entry.spellings:
            assert any(verl_inventory.key_runs(key, backend) for backend in entry.trainer_configs()), key


def test_no_release_has_two_spellings_of_one_knob_unless_the_newest_is_the_one_it_reads():
    """Where a release still carries an older spelling beside the new one, render writes the new one (first)."""
    for entry in VERL_KEYS:
        for backend in entry.trainer_configs():
            for release in verl_inventory.releases_read():
                present = [key for key in entry.spellings if verl_inventory.has_key(release, key, backend)]
                if present:
                    assert entry.spelling_for(release, backend) == present[0]


def test_older_spellings_are_import_aliases():
    assert KEY_ALIASES["critic.model.fsdp_config.param_offload"] == "critic.fsdp.param_offload"
    assert KEY_ALIASES["custom_reward_function.path"] == "reward.custom_reward_function.path"
    assert set(KEY_ALIASES) == {old for entry in VERL_KEYS for old in entry.older} | {
        "custom_reward_function.path", "custom_reward_function.name"}


@pytest.mark.parametrize("estimator", verl_inventory.all_estimators())
def test_every_estimator_of_every_release_imports(estimator):
    script = (f"python3 -m verl.trainer.main_ppo algorithm.adv_estimator={estimator} "
              "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct actor_rollout_ref.rollout.name=vllm "
              "actor_rollout_ref.rollout.n=8")
    plan = import_verl_script(script, gpu=resolve_gpu("h100-80g"), host_memory_gib=1000, env={},
                              local_config_reader=lambda path: None).plan
    assert plan.algorithm.adv_estimator == estimator
    assert plan.uses_critic == (estimator == "gae")


@pytest.mark.parametrize("estimator", ["gpg", "remax", "grpo_passk"])
def test_the_bundled_runtime_refuses_an_estimator_it_does_not_compute_and_validate_does_not(estimator):
    from rlplan.planner.platform import Platform
    from rlplan.planner.rules import check_plan
    from tests.planner.plans import make_plan

    plan = make_plan(overrides={"algorithm.adv_estimator": estimator})
    assert "runtime_computes_the_estimator" not in {v.rule for v in check_plan(plan).violations}
    gpu = Platform(device_type="cuda", accelerator_count=8)
    refusals = [v for v in check_plan(plan, gpu).errors if v.rule == "runtime_computes_the_estimator"]
    assert refusals and estimator in refusals[0].message and "render" in refusals[0].fix
    grpo = make_plan(overrides={"algorithm.adv_estimator": "grpo"})
    assert "runtime_computes_the_estimator" not in {v.rule for v in check_plan(grpo, gpu).errors}


def _release_defaults_script(release: str, backend: str) -> str:
    """One verl command setting every key of that release's trainer config to the release's own default (model.path
    aside: a local example path no preset knows; interpolations, nulls, `???` and mappings left out)."""
    from rlplan.planner.verl_keys import format_value

    words = ["actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct", "actor_rollout_ref.rollout.name=vllm"]
    for key in sorted(verl_inventory.keys_of(release, backend)):  # type: ignore[arg-type]
        value = verl_inventory.default_of(release, key, backend)  # type: ignore[arg-type]
        skipped = value is None or isinstance(value, dict) or (isinstance(value, str) and ("${" in value or value == "???"))
        if not skipped and key not in ("actor_rollout_ref.model.path", "actor_rollout_ref.rollout.name"):
            words.append(f"{key}={format_value(value)}")
    config = " --config-name ppo_megatron_trainer" if backend == "megatron" else ""
    return "python3 -m verl.trainer.main_ppo" + config + " " + " ".join(words)


@pytest.mark.parametrize("backend", ["fsdp", "megatron"])
@pytest.mark.parametrize("release", verl_inventory.releases_read())
def test_every_key_a_release_accepts_imports_at_its_own_default(release, backend):
    """Issue 36 item 4: a key verl accepts is read or kept as passthrough, never refused for existing (verl 0.3's
    load_format dummy_dtensor, 0.5's `None`, the optimizer's lr_warmup_steps -1 included)."""
    result = import_verl_script(_release_defaults_script(release, backend), gpu=resolve_gpu("h100-80g"),
                                host_memory_gib=1000, env={}, local_config_reader=lambda path: None)
    assert result.plan.is_megatron == (backend == "megatron")

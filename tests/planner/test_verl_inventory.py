"""presets/verl_inventory.json as read by planner/verl_inventory.py: facts read from verl's sources per release."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rlplan.planner import verl_inventory as inventory
from rlplan.planner.stack import VERL_ENGINE_PINS, VERL_RELEASES, in_range


def test_inventory_reads_every_release_the_stack_table_names():
    assert inventory.releases_read() == VERL_RELEASES
    assert set(VERL_ENGINE_PINS) <= set(inventory.releases_read())
    for release in inventory.releases_read():
        source = inventory.release_source(release)
        assert source["source"].startswith(("volcengine/verl tag v", "PyPI wheel verl-"))
        assert "ppo_trainer.yaml" in source["fsdp"] and "ppo_megatron_trainer.yaml" in source["megatron"]
        assert source["estimators"], release


def test_critic_offload_has_one_spelling_per_release():
    """verl 0.3-0.7 spell the critic's FSDP offload under critic.model.fsdp_config, 0.8 on under critic.fsdp."""
    for release in VERL_RELEASES:
        old = inventory.has_key(release, "critic.model.fsdp_config.param_offload")
        new = inventory.has_key(release, "critic.fsdp.param_offload")
        assert old != new, release
        assert new == in_range(release, "0.8.0", None), release
    assert inventory.key_runs("critic.model.fsdp_config.offload_policy")[0][:2] == ("0.4.0", "0.8.0")


def test_a_patch_release_between_two_read_ones_has_the_older_ones_keys():
    assert inventory.keys_of("0.6.2") == inventory.keys_of("0.6.1")
    assert inventory.keys_of("0.2.0") == inventory.keys_of("0.3.0.post1")
    assert inventory.keys_of("0.4.1.dev3") == inventory.keys_of("0.4.1")


def test_keys_and_defaults_of_a_release():
    assert not inventory.has_key("0.4.0", "actor_rollout_ref.actor.entropy_from_logits_with_chunking")
    assert inventory.has_key("0.4.1", "actor_rollout_ref.actor.entropy_from_logits_with_chunking")
    assert inventory.default_of("0.3.0.post1", "actor_rollout_ref.actor.entropy_coeff") == 0.001
    assert inventory.default_of("0.9.1", "actor_rollout_ref.actor.entropy_coeff") == 0
    assert "actor_rollout_ref.actor.megatron.param_offload" in inventory.keys_of("0.9.1", "megatron")
    assert "actor_rollout_ref.actor.megatron.param_offload" not in inventory.keys_of("0.9.1", "fsdp")


def test_estimators_grow_with_the_releases():
    assert inventory.estimators_of("0.3.0.post1") == {"gae", "grpo", "reinforce_plus_plus", "remax", "rloo"}
    assert {"gpg", "reinforce_plus_plus_baseline", "optimal_token_baseline", "gdpo"} <= inventory.estimators_of("0.9.1")
    assert "gpg" not in inventory.estimators_of("0.4.1") and "gpg" in inventory.estimators_of("0.5.0")
    for older, newer in zip(VERL_RELEASES, VERL_RELEASES[1:], strict=False):
        assert inventory.estimators_of(older) <= inventory.estimators_of(newer)
    assert set(inventory.all_estimators()) == inventory.estimators_of(VERL_RELEASES[-1])


def test_inventory_loads_without_torch_or_verl():
    code = ("import sys; from rlplan.planner import verl_inventory as v; v.keys_of('0.5.0'); "
            "assert not {'torch', 'verl', 'yaml', 'omegaconf'} & set(sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_generator_keeps_a_run_per_presence_and_default():
    from tests.verl_compat.make_inventory import leaves, spans

    releases = VERL_RELEASES
    present = {releases[0]: 1, releases[1]: 1, releases[2]: 2, releases[4]: 2}
    assert spans(present) == [[releases[0], releases[2], 1], [releases[2], releases[3], 2],
                              [releases[4], releases[5], 2]]
    assert spans({release: None for release in releases})[0] == [releases[0], None, None]
    assert dict(leaves({"a": {"b": 1, "c": {}, "d": [1, 2]}, "e": None})) == {"a.b": 1, "a.c": {}, "a.d": [1, 2],
                                                                            "e": None}


def test_the_plans_estimators_are_exactly_those_some_release_accepts():
    from typing import get_args

    from rlplan.planner.plan import ESTIMATORS, Algorithm

    assert set(ESTIMATORS) == set(get_args(Algorithm)) == set(inventory.all_estimators())


def test_the_supported_releases_are_listed_by_version_and_the_docs():
    """`rlplan --version` and docs/verl-versions.md name every release a plan can target, in order."""
    listed = ", ".join(VERL_RELEASES)
    assert listed in inventory.supported_releases_text()
    doc = (Path(__file__).resolve().parents[2] / "docs" / "verl-versions.md").read_text()
    supported = doc.split("**Releases supported**", 1)[1].split("(`stack.VERL_RELEASES`", 1)[0]
    assert " ".join(supported.split()).endswith(f": {listed}")

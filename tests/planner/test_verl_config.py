"""The Hydra config a verl command composes (planner/verl_config.py): where verl finds it, its defaults list,
hydra.searchpath and values, read through a dictionary of files instead of a disk."""

from __future__ import annotations

from rlplan.planner.verl_config import trainer_config

ROOT = "/checkout"


def reader(files: dict[str, str]):
    return lambda path: files.get(path)


RECIPE = """
hydra:
  searchpath:
    - file://verl/trainer/config
defaults:
  - ppo_trainer
  - rollout@actor_rollout_ref.rollout: fast
  - _self_
data:
  train_batch_size: 512
  gen_batch_size: ${data.train_batch_size}
actor_rollout_ref:
  actor:
    optim:
      lr: 1e-6
  rollout:
    n: 16
algorithm:
  filter_groups:
    _target_: verl.trainer.config.FilterGroupsConfig
    enable: False
"""
FAST = "n: 8\ngpu_memory_utilization: 0.7\nname: sglang\n"
MODULE = '@hydra.main(config_path="config", config_name="dapo_trainer", version_base=None)\ndef main(config): ...\n'


def test_a_recipe_modules_own_config_is_found_from_its_hydra_main_and_composed_in_order():
    files = {f"{ROOT}/recipe/dapo/main_dapo.py": MODULE, f"{ROOT}/recipe/dapo/config/dapo_trainer.yaml": RECIPE,
             f"{ROOT}/recipe/dapo/config/rollout/fast.yaml": FAST}
    config = trainer_config("recipe.dapo.main_dapo", None, None, ROOT, reader(files))
    values = dict(config.values)
    assert config.name == "dapo_trainer" and config.base == "ppo_trainer" and config.readable
    assert config.path == f"{ROOT}/recipe/dapo/config/dapo_trainer.yaml"
    # The group entry lands under its package; _self_ comes after it, so the file's own n wins.
    assert values["actor_rollout_ref.rollout.n"] == "16"
    assert values["actor_rollout_ref.rollout.gpu_memory_utilization"] == "0.7"
    assert values["actor_rollout_ref.rollout.name"] == "sglang"
    assert values["data.gen_batch_size"] == "${data.train_batch_size}" and values["actor_rollout_ref.actor.optim.lr"] \
        == "1e-06"
    assert "algorithm.filter_groups._target_" not in values and values["algorithm.filter_groups.enable"] == "false"


def test_config_path_is_relative_to_the_module_file_or_absolute():
    files = {f"{ROOT}/verl/trainer/config/mine.yaml": "defaults:\n  - ppo_megatron_trainer\ndata:\n  seed: 3\n",
             "/abs/cfg/mine.yaml": "data:\n  seed: 4\n"}
    relative = trainer_config("verl.trainer.main_ppo", "./config", "mine", ROOT, reader(files))
    assert relative.base == "ppo_megatron_trainer" and dict(relative.values)["data.seed"] == "3"
    absolute = trainer_config("verl.trainer.main_ppo", "/abs/cfg", "mine.yaml", ROOT, reader(files))
    assert absolute.path == "/abs/cfg/mine.yaml" and dict(absolute.values)["data.seed"] == "4"


def test_verls_own_trainer_configs_are_not_read_and_the_default_is_ppo_trainer():
    for name in (None, "ppo_trainer", "ppo_megatron_trainer.yaml"):
        config = trainer_config("verl.trainer.main_ppo", "config", name, ROOT, reader({}))
        assert config.is_verls_own and config.readable and config.values == ()


def test_self_at_the_end_when_the_defaults_list_omits_it_and_a_searchpath_default_is_followed():
    files = {f"{ROOT}/ex/cfg/top.yaml": "hydra:\n  searchpath: [file://shared]\ndefaults:\n  - common\n"
                                        "data:\n  seed: 1\n",
             f"{ROOT}/shared/common.yaml": "data:\n  seed: 0\n  shuffle: false\n"}
    values = dict(trainer_config("verl.trainer.main_ppo", f"{ROOT}/ex/cfg", "top", ROOT, reader(files)).values)
    assert values == {"data.seed": "1", "data.shuffle": "false"}


def test_what_cannot_be_read_is_named_not_raised():
    missing = trainer_config("verl.trainer.main_ppo", "/nowhere", "x", ROOT, reader({}))
    assert not missing.readable and "/nowhere/x.yaml" in missing.problems[-1]
    broken = trainer_config("verl.trainer.main_ppo", "/c", "x", ROOT, reader({"/c/x.yaml": "a: [unclosed\n"}))
    assert not broken.readable and any("not YAML" in problem for problem in broken.problems)
    lost = trainer_config("verl.trainer.main_ppo", "/c", "x", ROOT, reader({"/c/x.yaml": "defaults:\n  - gone\n"}))
    assert lost.readable and any("gone.yaml" in problem for problem in lost.problems)
    unknown_module = trainer_config("recipe.x.main", None, None, ROOT, reader({}))
    assert not unknown_module.readable and unknown_module.problems

"""The bash subset of verl launch scripts (planner/shell_script.py), read directly: the verl command's words.
The importer's end-to-end cases (quoting, heredocs, branches, the environment) are in test_verl_import.py."""

from __future__ import annotations

import pytest

from rlplan.planner.errors import PlanError
from rlplan.planner.shell_script import ShellScope, find_verl_command

SCRIPT = """#!/bin/bash
set -x
MODEL=${MODEL_PATH:-Qwen/Qwen2.5-7B-Instruct}
BATCH=$((16 * 2))
python3 -m verl.trainer.main_ppo \\
    data.train_batch_size=$BATCH \\
    actor_rollout_ref.model.path="$MODEL" \\
    trainer.project_name='rl run'  # a comment
python3 -m verl.trainer.main_ppo trainer.total_epochs=1
"""


def test_the_first_verl_command_with_its_variables_expanded_and_the_count_of_commands():
    command, count = find_verl_command(SCRIPT, ShellScope({}, {}))
    assert command is not None and command.module == "verl.trainer.main_ppo"
    assert command.arguments == ("data.train_batch_size=32", "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct",
                                 "trainer.project_name=rl run")
    assert count == 2


def test_a_pin_wins_over_the_environment_which_the_default_only_fills_in():
    scope = ShellScope({"MODEL_PATH": "/pinned"}, {"MODEL_PATH": "/from-env"})
    command, _ = find_verl_command(SCRIPT, scope)
    assert command is not None and "actor_rollout_ref.model.path=/pinned" in command.arguments


def test_a_script_without_a_verl_command_finds_none():
    assert find_verl_command("echo hello\nls -l\n", ShellScope({}, {})) == (None, 0)


def test_a_variable_the_verl_command_needs_but_nothing_sets_is_an_error_naming_it():
    with pytest.raises(PlanError, match="UNSET_DIR"):
        find_verl_command("python3 -m verl.trainer.main_ppo data.train_files=$UNSET_DIR/train.parquet\n",
                          ShellScope({}, {}))

"""The bash subset of verl launch scripts (planner/shell_script.py), read directly: the verl command's words.
The importer's end-to-end cases (quoting, heredocs, branches, the environment) are in test_verl_import.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlplan.planner.shell_expand import ShellScope
from rlplan.planner.shell_lexer import shell_commands
from rlplan.planner.shell_script import find_verl_command

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


def test_a_variable_nothing_sets_is_an_unknown_that_names_it_and_is_kept_verbatim():
    scope = ShellScope({}, {})
    command, _ = find_verl_command("python3 -m verl.trainer.main_ppo data.train_files=$UNSET_DIR/train.parquet\n",
                                   scope)
    assert command is not None
    (argument,) = command.arguments
    (unknown,) = scope.unknowns_in(argument)
    assert unknown.variable == "UNSET_DIR" and "--env UNSET_DIR=" in unknown.how
    assert scope.verbatim(argument) == "data.train_files=$UNSET_DIR/train.parquet"


# --- lexing as bash does --------------------------------------------------------------------------------------



def words_of(text: str) -> list[list[str]]:
    return list(shell_commands(text))


def test_a_backslash_space_then_hash_is_part_of_a_word_not_a_comment_and_the_newline_ends_the_command():
    # bash: `printf x a \ #b\n c` runs printf with "a", " #b"; "c" is a command of its own.
    assert words_of("cmd a \\ #b\n c\n") == [["cmd", "a", "\\ #b"], ["c"]]
    assert words_of("cmd a \\  # a comment\n b=2\n") == [["cmd", "a", "\\ "], ["b=2"]]


def test_a_comment_ends_at_its_newline_even_after_a_backslash():
    assert words_of("cmd a=1 \\\n  # b=2 \\\n  c=3 \\\n  d=4\n") == [["cmd", "a=1"], ["c=3", "d=4"]]


def test_a_backslash_that_ends_the_text_is_dropped():
    assert words_of('cmd "${A[@]}" \\') == [["cmd", '"${A[@]}"']]


def test_a_multi_line_array_with_comments_and_quotes_in_them_is_one_word():
    (words,) = words_of("A=(\n  a=1  # it's a comment\n  # (a paren)\n  'b=2'\n)\n")
    assert words == ["A=(a=1\x1f'b=2')"]


# --- expansion -----------------------------------------------------------------------------------------------


def expand(text: str, scope: ShellScope | None = None) -> str:
    scope = scope or ShellScope({}, {})
    return " ".join(scope.expand(text))


@pytest.mark.parametrize(("script", "word", "value"), [
    ("X=actor_rollout_ref.actor.a=1", "${X//actor_rollout_ref.actor/critic}", "critic.a=1"),
    ("X=a/b/c.tar.gz", "${X#*/}", "b/c.tar.gz"),
    ("X=a/b/c.tar.gz", "${X##*/}", "c.tar.gz"),
    ("X=a/b/c.tar.gz", "${X%.*}", "a/b/c.tar"),
    ("X=a/b/c.tar.gz", "${X%%.*}", "a/b/c"),
    ("X=abcdef", "${X:1:3}", "bcd"),
    ("X=abcdef", "${#X}", "6"),
    ("X=Qwen", "${X,,}", "qwen"),
    ("X=", "${X:-d}", "d"),
    ("X=", "${X-d}", ""),
    ("X=1", "${X:+set}", "set"),
    ("A=(a b c)", "${A[1]}", "b"),
    ("A=(a b c)", "${#A[@]}", "3"),
    ("A=(a b)\nA+=(c)", '"${A[*]}"', "a b c"),
    ("", "$((7 / 2 + 2 ** 3 - 10 % 4))", "9"),
    ("", "$((-7 / 2))", "-3"),
    ("N=3", "$((N > 2 ? 10 : 20))", "10"),
    ("N=4", "$(( (N + 2) * 3 ))", "18"),
])
def test_parameter_expansions_and_arithmetic_read_as_bash_reads_them(script, word, value):
    scope = ShellScope({}, {})
    find_verl_command(script, scope)
    assert expand(word, scope) == value


@pytest.mark.parametrize(("word", "value"), [
    ("$(pwd)", "/work/verl"),
    ('$(dirname "$0")', "examples/grpo"),
    ('$(cd "$(dirname "$0")" && pwd)', "/work/verl/examples/grpo"),
    ('$(cd -- "$(dirname "${BASH_SOURCE[0]}")/../.." >/dev/null 2>&1 && pwd)', "/work/verl"),
    ("$(basename /models/Qwen2.5-7B-Instruct)", "Qwen2.5-7B-Instruct"),
    ("$(basename data/train.parquet .parquet)", "train"),
    ("$(realpath ../data)", "/work/data"),
    ("$(readlink -f ./x/../y)", "/work/verl/y"),
    ("$(echo a b)", "a b"),
])
def test_command_substitutions_that_only_print_the_scripts_own_text_are_evaluated(word, value):
    scope = ShellScope({}, {}, cwd="/work/verl", script="examples/grpo/run.sh")
    assert expand(word, scope) == value


@pytest.mark.parametrize("word", ["$(date +%Y%m%d)", "$(nvidia-smi -L | wc -l)", "`hostname`", "$(now)",
                                  "$(echo $UNSET_THING)", "$(cat n)"])
def test_any_other_command_substitution_is_an_unknown_kept_verbatim(word):
    scope = ShellScope({}, {}, cwd="/w")
    (value,) = scope.expand(word)
    assert scope.unknowns_in(value) and scope.verbatim(value) == word.replace("$UNSET_THING", "$UNSET_THING")


def test_an_unknown_assigned_to_a_variable_names_it_for_env_and_propagates_through_arithmetic():
    scope = ShellScope({}, {})
    find_verl_command("N=$(nproc)\nM=$((N * 2))\n", scope)
    (unknown,) = scope.unknowns_in(scope.values["M"])
    assert unknown.variable == "N" and "--env N=" in unknown.how


def test_positional_parameters_are_the_arguments_given_and_shift_drops_them():
    scope = ShellScope({}, {}, arguments=("a", "b", "c"))
    find_verl_command("FIRST=$1\nshift\nREST=\"$*\"\n", scope)
    assert scope.values["FIRST"] == "a" and scope.values["REST"] == "b c"
    assert expand("$#", scope) == "2" and scope.expand('"$@"') == ["b", "c"]


def test_a_missing_argument_without_a_default_is_an_unknown_that_says_to_pass_arg():
    scope = ShellScope({}, {})
    (value,) = scope.expand("$2")
    (unknown,) = scope.unknowns_in(value)
    assert "--arg" in unknown.how


# --- branches ------------------------------------------------------------------------------------------------


BRANCHES = """
if [ "$MODE" = "megatron" ]; then
    NAME=ppo_megatron_trainer
elif [[ -z $MODE ]]; then
    NAME=unset
else
    NAME=ppo_trainer
fi
if [ "$N" -gt 4 ] && [ -n "$N" ]; then BIG=yes; else BIG=no; fi
if [ -f /etc/some-file ]; then MAYBE=a; else MAYBE=b; fi
"""


@pytest.mark.parametrize(("environment", "name", "big"), [
    ({}, "unset", "no"), ({"MODE": "megatron", "N": "8"}, "ppo_megatron_trainer", "yes"),
    ({"MODE": "fsdp", "N": "2"}, "ppo_trainer", "no"),
])
def test_if_elif_else_takes_the_branch_bash_takes_when_the_condition_is_decidable(environment, name, big):
    scope = ShellScope({}, environment)
    find_verl_command(BRANCHES, scope)
    assert scope.values["NAME"] == name and scope.values["BIG"] == big
    # A file test is not decided (nothing is read): both branches are read in order and named.
    assert scope.values["MAYBE"] == "b" and scope.branch_assigned == {"MAYBE"}


def test_a_branch_decided_on_an_unset_variable_is_said():
    scope = ShellScope({}, {})
    find_verl_command(BRANCHES, scope)
    assert "MODE" in scope.decided_on_unset


# --- provenance (issue 41 reads it) ----------------------------------------------------------------------------


def test_provenance_says_where_each_exported_variable_came_from():
    scope = ShellScope({"PINNED": "x"}, {"FROM_ENV": "1", "TOKEN": "s3cr3t"})
    find_verl_command("export OWN=1\nexport FROM_ENV\nexport TOKEN=$TOKEN\ndeclare -x ALSO=2\nLOCAL=3\n", scope)
    assert scope.provenance() == {"ALSO": "script", "FROM_ENV": "environment", "OWN": "script", "PINNED": "--env",
                                  "TOKEN": "script"}
    assert scope.masked["TOKEN"][1] == ("TOKEN",)  # its value was read from the environment


# --- nothing runs -----------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="abc/._- $", min_size=1, max_size=12))
def test_no_command_substitution_is_ever_run_whatever_its_text(tmp_path_factory, text):
    folder = tmp_path_factory.mktemp("never")
    mark = folder / "ran"
    script = (f'A=$(touch {mark} {text!r})\nB=`touch {mark}`\nif [ "$(touch {mark})" ]; then C=1; fi\n'
              f'python3 -m verl.trainer.main_ppo x.y="$(touch {mark}; echo {text!r})"\n')
    command, _ = find_verl_command(script, ShellScope({}, {}, cwd=str(folder)))
    assert command is not None and not mark.exists() and list(folder.iterdir()) == []

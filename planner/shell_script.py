"""A verl launch script read as bash would read it, running nothing: its verl command's words.

shell_lexer.py cuts the text into simple commands and shell_expand.py expands their words; here the commands are
interpreted in order: assignments, `export` / `declare` / `local`, arrays (`A=( ... )`, `A+=( ... )`), `shift`,
`cd`, `unset`, `if`/`elif`/`else` on the conditions rlplan can decide (`[ "$X" = y ]`, `[[ -z $X ]]`, `-eq` ...;
a file test or a command is undecided, and both branches are read in order, said as a warning), and the one
command that runs `python3 -m verl.trainer.main_ppo` (or `-m recipe....`; behind `ray job submit ... --`, `srun`,
`nohup` ...), as its expanded words. What the words mean to verl (Hydra overrides -> a plan) is verl_import.py's.
"""

from __future__ import annotations

import fnmatch
import operator
import re
from collections.abc import Callable

from attrs import frozen

from rlplan.planner.shell_expand import NAME, ShellScope, absolute_path
from rlplan.planner.shell_lexer import ARRAY_SEPARATOR, SimpleCommand, simple_commands

_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=")
# python, python3, python3.11, or a wrapper named after it (Isaac Sim's python.sh).
_PYTHON = re.compile(r"(.*/)?python(\d+(\.\d+)?)?(\.sh)?")
_VERL_MODULE = re.compile(r"(verl|recipe)(\.[A-Za-z0-9_]+)+")
_SHELL_KEYWORDS = {"then", "do", "else", "{", "}", "!", "time", "exec", "nohup", "env", "command", "builtin"}
_ASSIGNING_BUILTINS = {"export", "declare", "local", "readonly", "typeset"}


# --- conditions ----------------------------------------------------------------------------

_INTEGER_TESTS = {"-eq": operator.eq, "-ne": operator.ne, "-lt": operator.lt, "-le": operator.le,
                  "-gt": operator.gt, "-ge": operator.ge}


def _test(words: list[str], double: bool) -> bool | None:
    """`[ ... ]` / `[[ ... ]]` / `test ...` on expanded words: True, False, or None (rlplan cannot tell)."""
    for joiner, combine in (("||", any), ("-o", any), ("&&", all), ("-a", all)):
        if joiner in words and (double or joiner.startswith("-")):
            index = words.index(joiner)
            parts = [_test(words[:index], double), _test(words[index + 1 :], double)]
            if combine is any and True in parts or combine is all and False in parts:
                return combine is any
            return None if None in parts else combine(parts)
    if words[:1] == ["!"]:
        result = _test(words[1:], double)
        return None if result is None else not result
    if len(words) == 1:
        return words[0] != ""
    if len(words) == 2 and words[0] in ("-z", "-n"):
        return (words[1] == "") == (words[0] == "-z")
    if len(words) == 3:
        left, op, right = words
        if op in ("=", "=="):
            return fnmatch.fnmatchcase(left, right) if double else left == right
        if op == "!=":
            return not (fnmatch.fnmatchcase(left, right) if double else left == right)
        if op in _INTEGER_TESTS:
            try:
                return _INTEGER_TESTS[op](int(left), int(right))
            except ValueError:
                return None
    return None  # file tests (-f, -d ...) and anything else: rlplan reads no file system here


# --- finding the verl command ---------------------------------------------------------------


@frozen(kw_only=True)
class VerlCommand:
    module: str
    arguments: tuple[str, ...]
    line: int = 0


def _assignment_value(scope: ShellScope, name: str, raw_value: str, append: bool) -> None:
    if raw_value.startswith("(") and raw_value.endswith(")"):
        # An array keeps its raw element words: they expand where it is used, so environment values in them
        # are masked there like any other word's.
        elements = [element for element in raw_value[1:-1].split(ARRAY_SEPARATOR) if element]
        if name not in scope.pinned:
            scope.arrays[name] = (scope.arrays.get(name, []) if append else []) + elements
            scope.values.pop(name, None)
            scope.assigned_by_script.add(name)
        return
    scope.environment_used.clear()
    value = "".join(scope.expand(raw_value, split=False))
    read = tuple(dict.fromkeys(scope.environment_used))
    masked = "".join(scope.expand_masked(raw_value, split=False)) if read else None
    if append:
        previous = scope.lookup(name) or ""
        value, masked = previous + value, (previous + masked) if masked is not None else None
    scope.assign(name, value, masked, read)


def _run_builtin(scope: ShellScope, words: list[str]) -> bool:
    """`unset`, `shift`, `cd`: their effect on the scope; False for any other command."""
    name = words[0]
    if name == "unset":
        for variable in words[1:]:
            if variable not in scope.pinned and not variable.startswith("-"):
                scope.values.pop(variable, None)
                scope.arrays.pop(variable, None)
                scope.environment.pop(variable, None)
        return True
    if name == "shift":
        count = "".join(scope.expand(words[1])) if len(words) > 1 else "1"
        del scope.arguments[: int(count) if count.isdigit() else 1]
        return True
    if name == "cd" and scope.cwd is not None:
        target = [field for raw in words[1:] for field in scope.expand(raw) if field != "--"]
        if target and not scope.unknowns_in(target[0]) and not target[0].startswith("-"):
            scope.cwd = absolute_path(scope.working_directory(), target[0])
        return True
    return False


def _run_assignments(scope: ShellScope, words: list[str]) -> int:
    """Apply leading `NAME=value` words, `export` / `declare` / `local` and the builtins that change the scope;
    the index of the first word that is none of them."""
    index = 0
    while index < len(words) and words[index] in _SHELL_KEYWORDS:
        index += 1
    if index < len(words) and _run_builtin(scope, words[index:]):
        return len(words)
    if index < len(words) and words[index] in _ASSIGNING_BUILTINS:
        builtin = words[index]
        index += 1
        flags = []
        while index < len(words) and words[index].startswith("-"):
            flags.append(words[index])
            index += 1
        for word in words[index:]:
            match = _ASSIGNMENT.match(word)
            name = match.group(1) if match else word
            if match:
                _assignment_value(scope, name, word[match.end() :], bool(match.group(2)))
            if NAME.fullmatch(name) and (builtin == "export" or any("x" in flag for flag in flags)):
                scope.exported.add(name)
        return len(words)
    first_other = index
    while first_other < len(words) and _ASSIGNMENT.match(words[first_other]):
        first_other += 1
    if first_other == len(words):
        for word in words[index:first_other]:
            match = _ASSIGNMENT.match(word)
            assert match is not None
            _assignment_value(scope, match.group(1), word[match.end() :], bool(match.group(2)))
    return first_other


_HEAD_CANDIDATE = re.compile(r'.*python.*|"?\$\{?[A-Za-z_][A-Za-z0-9_]*\}?"?')


def _verl_command(scope: ShellScope, raw_words: list[str], line: int) -> VerlCommand | None:
    first = _run_assignments(scope, raw_words)
    for start in range(first, len(raw_words)):
        if not _HEAD_CANDIDATE.fullmatch(raw_words[start]):
            continue
        head = scope.expand(raw_words[start])
        if not head or not _PYTHON.fullmatch(head[0]):
            continue
        for offset in range(start + 1, min(start + 5, len(raw_words) - 1)):
            if raw_words[offset] != "-m":
                continue
            module = "".join(scope.expand(raw_words[offset + 1]))
            if not _VERL_MODULE.fullmatch(module):
                return None
            arguments: list[str] = []
            for raw in raw_words[offset + 2 :]:
                scope.environment_used.clear()
                expanded = scope.expand(raw)
                if scope.environment_used:
                    # No environment value goes into the plan: the override keeps references to it.
                    expanded = scope.expand_masked(raw)
                    scope.kept_references.extend(word for word in expanded if "${oc.env:" in word)
                arguments.extend(expanded)
            return VerlCommand(module=module, arguments=tuple(arguments), line=line)
    return None


class _Branches:
    """The if/elif/else/fi (and case) the interpreter is inside: which commands run."""

    def __init__(self, scope: ShellScope) -> None:
        self.scope = scope
        # Per open `if`: (runs the enclosing code, a branch was taken for sure, this branch runs, undecided).
        self.frames: list[list[bool]] = []

    @property
    def active(self) -> bool:
        return all(frame[2] for frame in self.frames)

    @property
    def undecided(self) -> bool:
        return any(frame[3] for frame in self.frames)

    def condition(self, commands: list[SimpleCommand]) -> bool | None:
        """The result of a condition (`[ ... ]`, `[[ ... ]]`, `test`, joined by && / ||), or None."""
        result: bool | None = None
        joiner = ""
        for command in commands:
            value = self._one(list(command.words))
            if not joiner:
                result = value
            elif joiner == "&&":
                result = False if False in (result, value) else None if None in (result, value) else True
            else:
                result = True if True in (result, value) else None if None in (result, value) else False
            joiner = command.separator
        return result

    def _one(self, words: list[str]) -> bool | None:
        negate = words[:1] == ["!"]
        words = words[1:] if negate else words
        double = words[:1] == ["[["]
        if words[:1] in (["["], ["[["]) and words[-1:] in (["]"], ["]]"]):
            words = words[1:-1]
        elif words[:1] == ["test"]:
            words = words[1:]
        else:
            return None
        scope = self.scope
        scope._unset_is_empty, scope._unset_read = True, []
        try:
            expanded = ["".join(scope.expand(word, split=False)) for word in words]
        finally:
            scope._unset_is_empty = False
        if any(scope.unknowns_in(word) for word in expanded):
            return None
        result = _test(expanded, double)
        if result is not None and scope._unset_read:
            for name in scope._unset_read:
                scope.decided_on_unset.setdefault(name, "taken" if result != negate else "not taken")
        return None if result is None else result != negate

    def open(self, result: bool | None) -> None:
        runs = self.active
        self.frames.append([runs, result is True, result is not False, result is None])

    def alternative(self, result: bool | None) -> None:
        """An `elif` (with its condition) or an `else` (result True)."""
        if not self.frames:
            return
        frame = self.frames[-1]
        runs_here = not frame[1] and result is not False
        frame[2] = runs_here
        frame[1] = frame[1] or result is True
        frame[3] = frame[3] or (result is None and not frame[1])

    def close(self) -> None:
        if self.frames:
            self.frames.pop()


def _condition_commands(commands: list[SimpleCommand], index: int) -> tuple[list[SimpleCommand], int]:
    """The condition of the if/elif at commands[index] (its words after the keyword, and the commands it is
    joined to by && / ||), and the index after it."""
    first = commands[index]
    condition = [SimpleCommand(words=first.words[1:], separator=first.separator, line=first.line)]
    while condition[-1].separator in ("&&", "||") and index + 1 < len(commands):
        index += 1
        condition.append(commands[index])
    return condition, index + 1


def find_verl_command(text: str, scope: ShellScope,
                      on_command: Callable[[VerlCommand], None] | None = None) -> tuple[VerlCommand | None, int]:
    """The first `python -m verl...` command the script runs, as bash reads it, and how many there are."""
    commands = list(simple_commands(text))
    branches = _Branches(scope)
    found: VerlCommand | None = None
    count = 0
    index = 0
    while index < len(commands):
        command = commands[index]
        words = list(command.words)
        keyword = words[0] if words else ""
        if keyword in ("if", "elif"):
            condition, index = _condition_commands(commands, index)
            result = branches.condition(condition) if branches.active or keyword == "elif" else False
            if keyword == "if":
                branches.open(result)
            else:
                branches.alternative(result)
            continue
        index += 1
        if keyword == "case":
            branches.open(None)
            continue
        if keyword in ("fi", "esac"):
            branches.close()
            continue
        if keyword == "else":
            branches.alternative(True)
            words = words[1:]
        if keyword == "then":
            words = words[1:]
        if not words or not branches.active:
            continue
        if branches.undecided:
            scope.branch_assigned.update(match.group(1) for word in words
                                         if (match := _ASSIGNMENT.match(word)) and word[0] != "-")
        verl = _verl_command(scope, words, command.line)
        if verl is not None:
            count += 1
            found = found or verl
    return found, count


def positional_warning(scope: ShellScope) -> str | None:
    """What the import assumed of the script's arguments, and how to give them; None when it read none."""
    if scope.defaulted_positionals:
        taken = ", ".join(f"${name} = {value!r}" for name, value in sorted(scope.defaulted_positionals.items()))
        given = f"{len(scope.arguments)} argument(s)" if scope.arguments else "no arguments"
        return (f"the script reads its arguments and was imported as run with {given}: its defaults were taken "
                f"({taken}). Pass the arguments with --arg VALUE (repeatable, in order).")
    if scope.dropped_positional:
        return "the command passes the script's own arguments ($@); none were given (--arg VALUE gives them)."
    return None

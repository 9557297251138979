"""A verl launch script (or a file of Hydra overrides) -> a plan.

Reads what verl users write: a bash script whose `python3 -m verl.trainer.main_ppo` (or
`-m recipe....`) command carries Hydra overrides over many `\\`-continued lines, with
comments, quotes, lists, `+key=value`, `~key`, and shell variables (`${VAR:-x}`, `${VAR}`,
`$VAR`, `$((...))`) set by the script itself, by `--env KEY=VALUE`, or by the environment.
A variable the verl command needs but nothing sets is a PlanError naming it.

Every key `verl_keys` maps becomes a plan field, keys the script omits take verl's own
defaults (so `rlplan validate` sees what verl would run), deprecated global micro-batch
keys stay global (rules.py normalizes them as verl does), and every other key is kept
verbatim in `plan.passthrough` and reported.  Pure: the CLI reads the files.
"""

from __future__ import annotations

import ast
import difflib
import operator
import re
from collections.abc import Callable, Iterator
from typing import Any

import attrs
from attrs import frozen

from rlplan.planner.errors import PlanError
from rlplan.planner.hardware import Cluster, GpuSpec
from rlplan.planner.plan import Plan
from rlplan.planner.planfile import plan_from_dict
from rlplan.planner.presets import ResolvedModel, resolve_model
from rlplan.planner.quoting import UnclosedQuote, unquoted
from rlplan.planner.verl_keys import (
    ARF,
    BY_FIELD,
    BY_KEY,
    DEFAULT_REWARD_NAME,
    KEY_ALIASES,
    RENDER_ALSO,
    REWARD_NAME_KEY,
    REWARD_PATH_KEY,
    VERL_KEYS,
    Follows,
    HydraSyntaxError,
    Interpolation,
    coerce,
    parse_value,
    verl_sleep_level,
)

KNOWN_KEYS = sorted({*BY_KEY, REWARD_PATH_KEY, REWARD_NAME_KEY})
LocalConfigReader = Callable[[str], "dict[str, Any] | None"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=")
_PYTHON = re.compile(r"(.*/)?python(\d+(\.\d+)?)?")
_VERL_MODULE = re.compile(r"(verl|recipe)(\.[A-Za-z0-9_]+)+")
_SHELL_KEYWORDS = {"then", "do", "else", "elif", "{", "!", "time", "exec", "nohup", "env"}
_ASSIGNING_BUILTINS = {"export", "declare", "local", "readonly", "typeset"}


@frozen(kw_only=True)
class ImportResult:
    plan: Plan
    warnings: tuple[str, ...]
    passthrough_keys: tuple[str, ...]


# --- shell: lexing ------------------------------------------------------------------------


def _matching(text: str, start: int, opening: str, closing: str) -> int:
    """Index just past the `closing` that balances the `opening` at text[start]."""
    depth = 0
    try:
        for i, char in unquoted(text, start, backslash_in_single_quotes=False):
            if char == opening:
                depth += 1
            elif char == closing:
                depth -= 1
                if depth == 0:
                    return i + 1
    except UnclosedQuote:
        pass
    raise PlanError(field="script", message=f"an opening {opening!r} is never closed.",
                    fix="check the script's quotes and brackets")


_HEREDOC = re.compile(r"<<(?P<dash>-)?[ \t]*(?P<delimiter>'[^'\n]*'|\"[^\"\n]*\"|[A-Za-z0-9_]+)")


def _skip_heredoc_bodies(text: str, start: int, heredocs: list[tuple[str, bool]]) -> int:
    """The index after the bodies of the heredocs opened on the line that ended at `start`."""
    position = start
    for delimiter, strip_tabs in heredocs:
        while position < len(text):
            end = text.find("\n", position)
            end = len(text) if end < 0 else end
            line = text[position:end]
            position = end + 1
            if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                break
    return min(position, len(text))


def shell_commands(text: str) -> Iterator[list[str]]:
    """Simple commands as lists of raw words (quotes kept, line continuations removed)."""
    text = re.sub(r"\\\r?\n", "", text)
    words: list[str] = []
    current: list[str] = []
    skip_redirect_target = False
    heredocs: list[tuple[str, bool]] = []
    i = 0

    def end_word() -> None:
        nonlocal skip_redirect_target
        if current:
            if skip_redirect_target:
                skip_redirect_target = False
            else:
                words.append("".join(current))
            current.clear()

    while i < len(text):
        char = text[i]
        if char == "#" and not current:
            while i < len(text) and text[i] != "\n":
                i += 1
            continue
        if char in " \t":
            end_word()
            i += 1
            continue
        if char in "\n;&|()":
            end_word()
            if words:
                yield list(words)
                words.clear()
            i += 1
            if char == "\n" and heredocs:
                i = _skip_heredoc_bodies(text, i, heredocs)
                heredocs.clear()
            continue
        heredoc = _HEREDOC.match(text, i) if char == "<" else None
        if heredoc:
            # `<<EOF` / `<<-'EOF'`: the body after this line is input to the command, not script to lex.
            end_word()
            heredocs.append((heredoc.group("delimiter").strip("'\""), bool(heredoc.group("dash"))))
            i = heredoc.end()
            continue
        if char in "<>":
            if current and "".join(current).isdigit():
                current.clear()
            end_word()
            while i < len(text) and text[i] in "<>&":
                i += 1
            if i < len(text) and text[i].isdigit() and text[i - 1] == "&":
                i += 1
            else:
                skip_redirect_target = True
            continue
        if char in "'`":
            # Single quotes and backquotes both run to the next of their kind, with no escapes.
            end = text.find(char, i + 1)
            if end < 0:
                what = "single quote" if char == "'" else "backquote"
                raise PlanError(field="script", message=f"a {what} is never closed.", fix=f"close the {what}")
            current.append(text[i : end + 1])
            i = end + 1
            continue
        if char == '"':
            j = i + 1
            while j < len(text) and text[j] != '"':
                if text[j] == "\\":
                    j += 1
                elif text.startswith("$(", j):
                    j = _matching(text, j + 1, "(", ")") - 1
                elif text.startswith("${", j):
                    j = _matching(text, j + 1, "{", "}") - 1
                j += 1
            if j >= len(text):
                raise PlanError(field="script", message="a double quote is never closed.", fix="close the quote")
            current.append(text[i : j + 1])
            i = j + 1
            continue
        if char == "\\":
            current.append(text[i : i + 2])
            i += 2
            continue
        if text.startswith("$(", i):
            end = _matching(text, i + 1, "(", ")")
            current.append(text[i:end])
            i = end
            continue
        if text.startswith("${", i):
            end = _matching(text, i + 1, "{", "}")
            current.append(text[i:end])
            i = end
            continue
        current.append(char)
        i += 1
    end_word()
    if words:
        yield list(words)


# --- shell: expansion ---------------------------------------------------------------------


class _Unresolved(Exception):
    def __init__(self, name: str, reason: str) -> None:
        super().__init__(name)
        self.name = name
        self.reason = reason


@frozen
class _Unset:
    """A variable the script assigns from something rlplan cannot evaluate (`$(nvidia-smi ...)`)."""

    name: str
    reason: str


_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
               ast.FloorDiv: operator.floordiv, ast.Div: operator.floordiv, ast.Mod: operator.mod}


# Shell variables that hold where the importing machine's shell is, not where the job will run.
MACHINE_PATH_VARIABLES = ("PWD", "HOME", "OLDPWD", "USER", "TMPDIR")


class ShellScope:
    """Variables as bash sees them: --env pins win over the script's assignments, which win over the environment."""

    def __init__(self, pinned: dict[str, str], environment: dict[str, str]) -> None:
        self.pinned = dict(pinned)
        self.values: dict[str, str | _Unset] = dict(environment)
        self.dropped_positional = False
        # Names assigned inside if/case: the script branches and the import cannot tell which branch runs.
        self.branch_assigned: set[str] = set()
        self.assigned_by_script: set[str] = set()
        # Environment variables (not --env, not the script's) an expansion read, directly or through a script
        # variable assigned from one: the caller clears it before the expansion it asks about.
        self.environment_used: list[str] = []
        # A script variable whose value came from the environment, as text with `${oc.env:NAME}` in place of
        # each environment value (what a plan may keep), and the variables it read.
        self.masked: dict[str, tuple[str, tuple[str, ...]]] = {}
        # While set, each environment value expands to its `${oc.env:NAME}` reference instead (`expand_masked`).
        self.masking = False
        self.kept_references: list[str] = []
        # Variables naming where the importing shell is (its directory, its user's home), read from this machine.
        self.machine_paths_used: dict[str, str] = {}

    def assign(self, name: str, value: str | _Unset, masked: str | None = None, read: tuple[str, ...] = ()) -> None:
        if name not in self.pinned:
            self.values[name] = value
            self.assigned_by_script.add(name)
            if masked is not None:
                self.masked[name] = (masked, read)
            else:
                self.masked.pop(name, None)

    def lookup(self, name: str) -> str | None:
        if name in self.pinned:
            return self.pinned[name]
        value = self.values.get(name)
        if value is not None and name not in self.assigned_by_script:
            self._read_from_environment(name, value)
        elif name in self.masked:
            for read in self.masked[name][1]:
                self._read_from_environment(read, self.values.get(read))
        if isinstance(value, _Unset):
            raise _Unresolved(name, value.reason)
        return value

    def _read_from_environment(self, name: str, value: str | _Unset | None) -> None:
        # Where the importing shell is ($HOME, $PWD) is not a secret, and nearly every verl example reads its data
        # under $HOME: a modeled key keeps this machine's value, and the import says so (machine_paths_used). Any
        # other environment value never reaches a modeled key (the caller refuses it, naming the variable).
        if name in MACHINE_PATH_VARIABLES and isinstance(value, str):
            self.machine_paths_used[name] = value
        else:
            self.environment_used.append(name)

    def shown(self, name: str, value: str) -> str:
        """A looked-up value as the expansion writes it: while masking, an environment value is its reference."""
        if not self.masking or name in self.pinned:
            return value
        if name in self.masked:
            return self.masked[name][0]
        return value if name in self.assigned_by_script else "${oc.env:" + name + "}"

    def expand_masked(self, raw: str, split: bool = True) -> list[str]:
        """`expand`, with every value that came from the environment written as `${oc.env:NAME}`: the text a
        plan may keep (verl reads the reference from the same environment when it runs)."""
        self.masking = True
        try:
            return self.expand(raw, split)
        finally:
            self.masking = False

    # A word's expansion: a list of fields (unquoted expansions split on whitespace).
    def expand(self, raw: str, split: bool = True) -> list[str]:
        if raw in ('"$@"', '"$*"'):
            # The script's own arguments: nothing when rlplan reads it.
            self.dropped_positional = True
            return []
        fields: list[str] = []
        current: list[str] = []
        has_content = False

        def add_unquoted(value: str) -> None:
            nonlocal has_content
            if not split:
                current.append(value)
                has_content = has_content or bool(value)
                return
            pieces = value.split()
            if not pieces:
                return
            if value[:1].isspace() and current:
                fields.append("".join(current))
                current.clear()
            for index, piece in enumerate(pieces):
                if index:
                    fields.append("".join(current))
                    current.clear()
                current.append(piece)
            has_content = True
            if value[-1:].isspace():
                fields.append("".join(current))
                current.clear()
                has_content = False

        i = 0
        while i < len(raw):
            char = raw[i]
            if char == "'":
                end = raw.index("'", i + 1)
                current.append(raw[i + 1 : end])
                has_content = True
                i = end + 1
            elif char == '"':
                end, value = self._double_quoted(raw, i + 1)
                current.append(value)
                has_content = True
                i = end
            elif char == "\\":
                current.append(raw[i + 1 : i + 2])
                has_content = True
                i += 2
            elif char == "$" or char == "`":
                end, value, positional = self._dollar(raw, i)
                if positional:
                    self.dropped_positional = True
                add_unquoted(value)
                i = end
            else:
                current.append(char)
                has_content = True
                i += 1
        if current or has_content:
            fields.append("".join(current))
        return fields

    def _double_quoted(self, raw: str, start: int) -> tuple[int, str]:
        out: list[str] = []
        i = start
        while raw[i] != '"':
            char = raw[i]
            if char == "\\" and raw[i + 1] in '$`"\\\n':
                out.append(raw[i + 1])
                i += 2
            elif char in "$`":
                i, value, positional = self._dollar(raw, i)
                if positional:
                    self.dropped_positional = True
                out.append(value)
            else:
                out.append(char)
                i += 1
        return i + 1, "".join(out)

    def _dollar(self, raw: str, i: int) -> tuple[int, str, bool]:
        """Expand the `$...` (or backquote) at raw[i]: (end index, value, was it $@ / $*)."""
        if raw[i] == "`":
            end = raw.index("`", i + 1)
            raise _Unresolved(raw[i : end + 1], "a command substitution rlplan cannot run")
        if raw.startswith("$((", i):
            end = _matching(raw, i + 1, "(", ")")
            return end, str(self._arithmetic(raw[i + 3 : end - 2])), False
        if raw.startswith("$(", i):
            end = _matching(raw, i + 1, "(", ")")
            raise _Unresolved(raw[i:end], "a command substitution rlplan cannot run")
        if raw.startswith("${", i):
            end = _matching(raw, i + 1, "{", "}")
            return end, self._braced(raw[i + 2 : end - 1]), False
        if i + 1 < len(raw) and raw[i + 1] in "@*":
            return i + 2, "", True
        if i + 1 < len(raw) and raw[i + 1].isdigit():
            raise _Unresolved(f"${raw[i + 1]}", "a positional argument of the script")
        match = _NAME.match(raw, i + 1)
        if not match:
            return i + 1, "$", False
        return match.end(), self._value(match.group(0)), False

    def _value(self, name: str) -> str:
        value = self.lookup(name)
        if value is None:
            raise _Unresolved(name, "not set by the script, --env or the environment")
        return self.shown(name, value)

    def _braced(self, body: str) -> str:
        match = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(:?[-=?+])?(.*)", body, re.DOTALL)
        if not match:
            raise _Unresolved("${" + body + "}", "a parameter expansion rlplan does not evaluate")
        name, operation, word = match.group(1), match.group(2), match.group(3)
        if operation is None:
            if word:
                raise _Unresolved("${" + body + "}", "a parameter expansion rlplan does not evaluate")
            return self._value(name)
        value = self.lookup(name)
        missing = value is None or (operation.startswith(":") and value == "")
        kind = operation[-1]
        if kind == "+":
            return "" if missing else " ".join(self.expand(word, split=False))
        if not missing:
            return self.shown(name, value or "")
        if kind == "?":
            raise _Unresolved(name, "the script requires it (${" + body + "})")
        default = "".join(self.expand(word, split=False))
        if kind == "=":
            self.assign(name, default)
        return default

    def _arithmetic(self, expression: str) -> int:
        def substitute(match: re.Match[str]) -> str:
            name = match.group(1) or match.group(2)
            value = self._value(name)
            if value.startswith("${oc.env:"):
                raise _Unresolved(name, "read from the environment inside $((...)), which a plan cannot refer to")
            return value

        text = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?|\b([A-Za-z_][A-Za-z0-9_]*)\b", substitute, expression)

        def evaluate(node: ast.AST) -> int:
            if isinstance(node, ast.Expression):
                return evaluate(node.body)
            if isinstance(node, ast.Constant) and isinstance(node.value, int):
                return node.value
            if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
                return _ARITHMETIC[type(node.op)](evaluate(node.left), evaluate(node.right))
            if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
                return -evaluate(node.operand)
            raise _Unresolved(f"$(({expression}))", "arithmetic rlplan does not evaluate")

        try:
            return evaluate(ast.parse(text.strip(), mode="eval"))
        except (SyntaxError, ZeroDivisionError):
            raise _Unresolved(f"$(({expression}))", "arithmetic rlplan does not evaluate") from None


# --- finding the verl command ---------------------------------------------------------------


@frozen(kw_only=True)
class VerlCommand:
    module: str
    arguments: tuple[str, ...]


def _run_assignments(scope: ShellScope, words: list[str]) -> int:
    """Apply leading `NAME=value` / `export NAME=value` words; the index of the first other word."""
    index = 0
    while index < len(words) and words[index] in _SHELL_KEYWORDS:
        index += 1
    only_assignments = all(_ASSIGNMENT.match(word) for word in words[index:])
    builtin = index < len(words) and words[index] in _ASSIGNING_BUILTINS
    if builtin:
        index += 1
        while index < len(words) and words[index].startswith("-"):
            index += 1
    first_other = index
    while first_other < len(words) and _ASSIGNMENT.match(words[first_other]):
        first_other += 1
    if builtin or only_assignments:
        for word in words[index:first_other]:
            name = _ASSIGNMENT.match(word).group(1)  # type: ignore[union-attr]
            raw_value = word[len(name) + 1 :]
            scope.environment_used.clear()
            try:
                value = "".join(scope.expand(raw_value, split=False))
                read = tuple(dict.fromkeys(scope.environment_used))
                masked = "".join(scope.expand_masked(raw_value, split=False)) if read else None
            except _Unresolved as exc:
                scope.assign(name, _Unset(name, f"assigned from {exc.name}: {exc.reason}"))
                continue
            scope.assign(name, value, masked, read)
    return first_other


def _verl_command(scope: ShellScope, raw_words: list[str]) -> VerlCommand | None:
    first = _run_assignments(scope, raw_words)
    for start in range(first, len(raw_words)):
        try:
            head = scope.expand(raw_words[start])
        except _Unresolved:
            continue
        if not head or not _PYTHON.fullmatch(head[0]):
            continue
        for offset in range(start + 1, min(start + 4, len(raw_words) - 1)):
            if raw_words[offset] != "-m":
                continue
            module = raw_words[offset + 1]
            if not _VERL_MODULE.fullmatch(module):
                return None
            arguments: list[str] = []
            for raw in raw_words[offset + 2 :]:
                scope.environment_used.clear()
                try:
                    expanded = scope.expand(raw)
                    if scope.environment_used:
                        # No environment value goes into the plan: the override keeps references to it.
                        expanded = scope.expand_masked(raw)
                        scope.kept_references.extend(word for word in expanded if "${oc.env:" in word)
                    arguments.extend(expanded)
                except _Unresolved as exc:
                    raise PlanError(
                        field=exc.name,
                        message=f"the verl command uses {exc.name}, which is {exc.reason}.",
                        fix=f"pass --env {exc.name.strip('${}')}=VALUE" if _NAME.fullmatch(exc.name.strip("${}"))
                        else "replace it with its value in the script",
                    ) from None
            return VerlCommand(module=module, arguments=tuple(arguments))
    return None


def find_verl_command(text: str, scope: ShellScope) -> tuple[VerlCommand | None, int]:
    """The first `python -m verl...` command and how many there are."""
    found: VerlCommand | None = None
    count = 0
    depth = 0
    for words in shell_commands(text):
        if words[0] in ("if", "case"):
            depth += 1
        elif words[0] in ("fi", "esac") and depth:
            depth -= 1
        if depth:
            scope.branch_assigned.update(
                match.group(1) for word in words if (match := _ASSIGNMENT.match(word)) and word[0] != "-")
        command = _verl_command(scope, words)
        if command is not None:
            count += 1
            found = found or command
    return found, count


# --- Hydra overrides -> plan ------------------------------------------------------------------


@frozen(kw_only=True)
class Override:
    prefix: str  # "", "+", "++" or "~"
    key: str
    value: str | None

    @classmethod
    def parse(cls, text: str) -> Override:
        prefix = "++" if text.startswith("++") else text[:1] if text[:1] in "+~" else ""
        body = text[len(prefix) :]
        key, sep, value = body.partition("=")
        key = key.strip()
        if not key or (not sep and prefix != "~"):
            raise PlanError(field=text, message="is not a Hydra override (key=value).",
                            fix="write overrides as key=value, +key=value or ~key")
        return cls(prefix=prefix, key=key, value=value if sep else None)

    @property
    def text(self) -> str:
        return f"{self.prefix}{self.key}" + ("" if self.value is None else f"={self.value}")


def _overrides_from_script(text: str, env: dict[str, str], environment: dict[str, str],
                           warnings: list[str]) -> list[str] | None:
    scope = ShellScope(env, environment)
    command, count = find_verl_command(text, scope)
    if command is None:
        return None
    if count > 1:
        warnings.append(f"the script runs verl {count} times; imported the first command ({command.module}).")
    if command.module != "verl.trainer.main_ppo":
        warnings.append(f"{command.module} is not verl.trainer.main_ppo; its keys are read with main_ppo's "
                        "defaults (ppo_trainer.yaml).")
    if scope.dropped_positional:
        warnings.append("the command passes the script's own arguments ($@); they are not part of the import.")
    if scope.branch_assigned:
        names = sorted(scope.branch_assigned)
        warnings.append(f"the script branches (if/case) and assigns {', '.join(names)} there; the import read the "
                        f"assignments in order. Pass --env {names[0]}=VALUE to choose the branch's value.")
    if scope.machine_paths_used:
        shown = ", ".join(f"${name} = {value}" for name, value in scope.machine_paths_used.items())
        first = next(iter(scope.machine_paths_used))
        warnings.append(f"the script's paths use this machine's {shown}; the plan holds those paths, frozen, and "
                        f"the cluster's may differ. Pass --env {first}=<the path on the cluster> to import theirs.")
    if scope.kept_references:
        warnings.append(f"values from the environment are kept as references, not copied into the plan: "
                        f"{', '.join(scope.kept_references)}.")
    overrides: list[str] = []
    arguments = list(command.arguments)
    while arguments:
        argument = arguments.pop(0)
        if argument.startswith("-") and not argument.startswith("--") or argument.startswith("--"):
            name, _, value = argument.partition("=")
            if name in ("--config-name", "-cn", "--config-path", "-cp") and not value and arguments:
                value = arguments.pop(0)
            if name in ("--config-name", "-cn") and "megatron" in value:
                raise PlanError(field="--config-name", message=f"is {value}, verl's Megatron trainer, which rlplan "
                                "does not support yet: it plans FSDP training (fsdp, fsdp2); Megatron's tensor and "
                                "pipeline parallelism is planned.",
                                fix="import the FSDP variant of the script (ppo_trainer.yaml), or plan the workload "
                                "afresh with `rlplan solve --model ... --gpus ...`")
            if name in ("--config-name", "-cn") and value not in ("ppo_trainer", "ppo_trainer.yaml"):
                warnings.append(f"--config-name {value}: read with ppo_trainer.yaml's defaults, which may differ.")
            elif name not in ("--config-name", "-cn", "--config-path", "-cp"):
                warnings.append(f"ignored the command-line flag {argument}.")
            continue
        overrides.append(argument)
    return overrides


_OVERRIDE_LINE = re.compile(r"(?P<prefix>\+\+|\+|~)?(?P<key>[A-Za-z_][A-Za-z0-9_.@/-]*)(=.*)?", re.DOTALL)


def _is_overrides_file(text: str) -> bool:
    """Every line a comment, blank, or a Hydra override of a dotted key (`a.b=v`, `+a.b=v`, `~a.b`).

    A shell script has a command line (`python3 -m ...`), and its variable assignments have no dots.
    """
    lines = [line.strip() for line in text.split("\n")]
    overrides = [line for line in lines if line and not line.startswith("#")]

    def is_override(line: str) -> bool:
        match = _OVERRIDE_LINE.fullmatch(line)
        return match is not None and (match.group("prefix") is not None or "." in match.group("key"))

    return bool(overrides) and all(is_override(line) for line in overrides)


def _overrides_from_file(text: str) -> list[str]:
    lines = (line.strip() for line in text.split("\n"))
    return [line for line in lines if line and not line.startswith("#")]


class _Values:
    """The script's modeled values with verl's defaults behind them, interpolations resolved."""

    def __init__(self, given: dict[str, str], passthrough: dict[str, str], pinned: dict[str, str],
                 environment: dict[str, str]) -> None:
        self.given = given
        self.passthrough = passthrough
        self.pinned = pinned
        self.environment = environment
        self.resolving: set[str] = set()
        self.resolved: dict[str, Any] = {}

    def field_value(self, field: str) -> Any:
        entry = BY_FIELD[field]
        if field in self.resolved:
            return self.resolved[field]
        if entry.key in self.resolving:
            raise PlanError(field=entry.key, message="refers to itself through interpolations.",
                            fix="replace the interpolation with a value")
        self.resolving.add(entry.key)
        raw = self.given.get(entry.key)
        if raw is None:
            value: Any = entry.default
            if isinstance(value, str) and "${" in value:
                value = self._interpolate(Interpolation(value), entry.key)
        else:
            try:
                parsed = parse_value(raw)
            except HydraSyntaxError as exc:
                raise PlanError(field=entry.key, message=f"has a value Hydra cannot parse ({exc}): {raw!r}.",
                                fix="quote the value") from None
            if isinstance(parsed, Interpolation):
                parsed = self._interpolate(parsed, entry.key)
                if isinstance(parsed, str) and entry.kind in ("int", "float", "bool"):
                    parsed = parse_value(parsed)
            value = coerce(entry, parsed, raw)
        if isinstance(value, Follows):
            value = self.field_value(value.field)
        self.resolving.discard(entry.key)
        self.resolved[field] = value
        return value

    def _interpolate(self, value: Interpolation, key: str) -> Any:
        pieces = re.split(r"(\$\{[^{}]*\})", value.text)
        resolved = [self._reference(piece[2:-1], key) if piece.startswith("${") else piece for piece in pieces]
        meaningful = [piece for piece in resolved if piece != ""]
        if len(meaningful) == 1 and len(pieces) == 3 and not pieces[0] and not pieces[2]:
            return meaningful[0]
        return "".join("" if piece is None else str(piece) for piece in resolved)

    def _reference(self, expression: str, key: str) -> Any:
        expression = expression.strip()
        if expression.startswith("oc.env:"):
            name, _, default = expression[len("oc.env:") :].partition(",")
            name = name.strip()
            if name in self.pinned:
                return self.pinned[name]
            if name in self.environment:
                # The plan would keep the value of a modeled key, and no environment value is copied into a plan
                # unless --env asks for it (a secret, a home directory, a token).
                raise PlanError(field=key, message=f"takes its value from the environment variable {name}, which "
                                "an import does not copy into a plan.",
                                fix=f"pass --env {name}=VALUE to write that value into the plan")
            if not default:
                raise PlanError(field=key, message=f"reads the environment variable {name}, which is not set.",
                                fix=f"pass --env {name}=VALUE")
            return parse_value(default)
        if expression in BY_KEY:
            return self.field_value(BY_KEY[expression].field)
        if expression in self.passthrough:
            return parse_value(self.passthrough[expression])
        raise PlanError(field=key, message=f"interpolates ${{{expression}}}, which rlplan cannot resolve.",
                        fix="replace the interpolation with its value")


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for dotted, value in flat.items():
        node = nested
        parts = dotted.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return nested


def _resolve_model(model_path: str, local_config_reader: LocalConfigReader, warnings: list[str]) -> ResolvedModel:
    """A preset by repo id, a local config.json, or - for a local path not on this machine (scripts
    are often imported away from the cluster) - the preset its directory name is a repo name of."""
    config = local_config_reader(model_path)
    try:
        return resolve_model(model_path, config)
    except PlanError as error:
        directory = model_path.rstrip("/").rpartition("/")[2]
        if config is None and directory and directory != model_path:
            try:
                resolved = resolve_model(directory)
            except PlanError:
                pass
            else:
                warnings.append(f"{model_path} is not readable here; its name matches the preset {resolved.name}, "
                                "whose architecture the plan uses.")
                return resolved
        raise PlanError(field="actor_rollout_ref.model.path", message=error.message,
                        fix="run the import where the model directory is readable, or use a hub repo id a preset "
                        "lists") from None


CONTEXT_OVERRIDE_KEY = f"{ARF}.model.override_config.max_position_embeddings"


def _with_overridden_context(resolved: ResolvedModel, passthrough: dict[str, str],
                             warnings: list[str]) -> ResolvedModel:
    """verl applies `model.override_config` to the HF config it loads: a raised max_position_embeddings
    (DAPO's Qwen2.5-Math-7B at 32768) is the model's context for the run.  The key stays passthrough,
    so a rendered script still sets it."""
    raw = next((passthrough[key] for key in (f"+{CONTEXT_OVERRIDE_KEY}", f"++{CONTEXT_OVERRIDE_KEY}",
                                              CONTEXT_OVERRIDE_KEY) if key in passthrough), None)
    if raw is None:
        return resolved
    value = parse_value(raw)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(field=CONTEXT_OVERRIDE_KEY, message=f"must be a positive integer, got {raw!r}.",
                        fix=f"set {CONTEXT_OVERRIDE_KEY} to the context in tokens, e.g. 32768")
    warnings.append(f"{CONTEXT_OVERRIDE_KEY}={value} is applied to the model's context "
                    f"({resolved.arch.max_position_embeddings} in its config), as verl applies it to the HF "
                    "config.")
    return attrs.evolve(resolved, arch=attrs.evolve(resolved.arch, max_position_embeddings=value))


def _build_plan(fields: dict[str, Any], gpu: GpuSpec, host_memory_gib: float, resolved: ResolvedModel) -> Plan:
    data = _nest(fields)
    data["model"].update(name=resolved.name, arch=attrs.asdict(resolved.arch))
    data["cluster"].update(gpu=attrs.asdict(gpu), host_memory_gib=host_memory_gib)
    try:
        plan = plan_from_dict(data)
    except PlanError as exc:
        if exc.field == "cluster.host_memory_gib":
            raise PlanError(field="--host-mem", message=exc.message, fix="pass --host-mem in GiB") from None
        entry = BY_FIELD.get(exc.field)
        if entry is None:
            raise
        raise PlanError(field=entry.key, message=exc.message, fix=f"correct {entry.key} (plan field {exc.field})") from None
    try:
        return plan.evolve(cluster=Cluster(gpu=gpu, nodes=plan.cluster.nodes,
                                           gpus_per_node=plan.cluster.gpus_per_node,
                                           host_memory_gib=host_memory_gib))
    except PlanError as exc:
        raise PlanError(field="--host-mem", message=exc.message, fix="pass --host-mem in GiB") from None


def with_target_stack(plan: Plan, given: dict[str, str], passthrough: dict[str, str], text: str,
                      versions: tuple[str | None, str | None, str | None], warnings: list[str]) -> Plan:
    """The imported plan on its target stack: the version flags, else what the script shows (said as a warning),
    with that stack's defaults for the keys the script leaves out (planner/stack.py)."""
    from rlplan.planner.knobs import apply_knobs
    from rlplan.planner.stack import infer_stack, stack_defaults, stack_from_flags

    ranges = {entry.key: (entry.since, entry.before) for entry in VERL_KEYS}
    inferred = infer_stack(given, passthrough, text, ranges, plan.rollout.name)
    stack = inferred.stack if inferred is not None else plan.stack
    if inferred is not None:
        flagged = [name for name, value in zip(("verl", "vllm", "sglang"), versions, strict=True) if value]
        overruled = f"; --{'-version, --'.join(flagged)}-version given instead" if flagged else ""
        warnings.append(f"target stack inferred from the script: {'; '.join(inferred.reasons)}{overruled}.")
    stack = stack_from_flags(stack, *versions)
    omitted = {field: value for field, value in stack_defaults(stack, plan.rollout.name).items()
               if BY_FIELD[field].key not in given}
    if omitted:
        warnings.append(f"keys the script leaves out take verl {stack.verl}'s defaults: "
                        + ", ".join(f"{BY_FIELD[field].key}={value}" for field, value in omitted.items()) + ".")
    return apply_knobs(plan.evolve(stack=stack), omitted)


def import_verl_script(text: str, *, gpu: GpuSpec, host_memory_gib: float, env: dict[str, str],
                       local_config_reader: LocalConfigReader, environment: dict[str, str] | None = None,
                       versions: tuple[str | None, str | None, str | None] = (None, None, None)) -> ImportResult:
    """A verl launch script or a file of Hydra overrides -> plan, warnings, passthrough keys.

    `env` holds --env KEY=VALUE pins (they win over the script's own assignments);
    `environment` is the process environment the script would inherit; `versions` the
    --verl-version / --vllm-version / --sglang-version flags.
    """
    warnings: list[str] = []
    if _is_overrides_file(text):
        overrides = _overrides_from_file(text)
    else:
        found = _overrides_from_script(text, env, environment or {}, warnings)
        if found is None:
            raise PlanError(field="script", message="has no `python -m verl...` / `-m recipe...` command, and is not "
                            "a file of Hydra overrides (one key=value per line).",
                            fix="import the script that launches verl.trainer.main_ppo")
        overrides = found
    given: dict[str, str] = {}
    passthrough: dict[str, str] = {}
    reward: dict[str, str] = {}
    seen: dict[str, str | None] = {}
    for raw in overrides:
        override = Override.parse(raw)
        key = KEY_ALIASES.get(override.key, override.key)
        if key != override.key:
            warnings.append(f"{override.key} is verl's older spelling of {key}; read as {key}.")
        if key in seen and seen[key] != override.value:
            warnings.append(f"{key} is set twice ({seen[key]} and {override.value}); the last one wins, as in Hydra.")
        seen[key] = override.value
        _refuse_megatron(key, override.value)
        if override.prefix == "~" or override.value is None:
            passthrough[f"~{override.key}"] = override.value or ""
            continue
        if key in BY_KEY:
            given[key] = override.value
        elif key in (REWARD_PATH_KEY, REWARD_NAME_KEY):
            reward[key] = override.value
        else:
            near = difflib.get_close_matches(key, KNOWN_KEYS, n=1, cutoff=0.9)
            if near:
                warnings.append(f"{key} is not a verl key rlplan models; did you mean {near[0]}? Kept as passthrough.")
            passthrough[f"{override.prefix}{override.key}"] = override.value
    values = _Values(given, passthrough, dict(env), dict(environment or {}))
    fields = {entry.field: values.field_value(entry.field) for entry in VERL_KEYS}
    for key, field in RENDER_ALSO.items():
        # A render writes these from the plan; when they agree with it they carry nothing more.
        if key in passthrough and parse_value(passthrough[key]) == fields[field]:
            del passthrough[key]
    model_path = fields.pop("model.path")
    if not model_path:
        raise PlanError(field="actor_rollout_ref.model.path", message="the script does not say which model it trains.",
                        fix="add actor_rollout_ref.model.path=<hub repo id or local directory>")
    fields["model.path"] = model_path
    _warn_about_algorithm_defaults(given, fields, warnings)
    if "actor_rollout_ref.rollout.name" not in given:
        warnings.append("verl requires actor_rollout_ref.rollout.name; the import assumes vllm.")
    fields["rollout.sleep_level"] = verl_sleep_level(fields["model.lora.rank"] > 0, fields["rollout.layered_summon"])
    fields["reward.function"] = _reward_function(reward)
    resolved = _resolve_model(str(model_path), local_config_reader, warnings)
    resolved = _with_overridden_context(resolved, passthrough, warnings)
    plan = with_target_stack(_build_plan(fields, gpu, host_memory_gib, resolved), given, passthrough, text, versions,
                             warnings)
    kept = tuple(passthrough)
    if kept:
        warnings.append(f"kept {len(kept)} verl key(s) rlplan does not model, rendered back unchanged: {', '.join(kept)}.")
    return ImportResult(plan=plan.evolve(passthrough=passthrough), warnings=tuple(warnings), passthrough_keys=kept)


def _warn_about_algorithm_defaults(given: dict[str, str], fields: dict[str, Any], warnings: list[str]) -> None:
    """Say where a verl default, not the script, decides the algorithm or a batch: the plan follows verl
    (that is what the script runs), and the user may not know it."""
    estimator = BY_FIELD["algorithm.adv_estimator"]
    if estimator.key not in given:
        critic = "with a critic (PPO): the plan trains one too" if fields.get("critic.enable") is not False else ""
        warnings.append(f"the script sets no {estimator.key}, so verl runs its default, {estimator.default}"
                        f"{', ' + critic if critic else ''}. Add {estimator.key}=grpo to the script (or --env) if it "
                        "means GRPO.")
    for micro, dynamic in DYNAMIC_BSZ_IGNORES:
        micro_key, dynamic_key = BY_FIELD[micro].key, BY_FIELD[dynamic].key
        if micro_key in given and fields.get(dynamic):
            warnings.append(f"{micro_key} = {given[micro_key]} is ignored by verl: {dynamic_key} is true, so "
                            "batches are cut by tokens (the *_max_token_len_per_gpu budget) instead.")


# (a micro batch size, the dynamic-batch switch under which verl ignores it)
DYNAMIC_BSZ_IGNORES = (
    ("actor.ppo_micro_batch_size_per_gpu", "actor.use_dynamic_bsz"),
    ("rollout.log_prob_micro_batch_size_per_gpu", "rollout.log_prob_use_dynamic_bsz"),
    ("ref.log_prob_micro_batch_size_per_gpu", "ref.log_prob_use_dynamic_bsz"),
    ("critic.ppo_micro_batch_size_per_gpu", "critic.use_dynamic_bsz"),
    ("critic.forward_micro_batch_size_per_gpu", "critic.use_dynamic_bsz"),
)


def _refuse_megatron(key: str, value: str | None) -> None:
    """A Megatron script is refused in plain words: its parallelism (tensor, pipeline, expert) is not what
    rlplan's memory model and rules price, so no plan of it would be honest."""
    if key.endswith(".strategy") and (value or "").strip("'\"") == "megatron":
        raise PlanError(field=key, message="is megatron, which rlplan does not support yet: it plans FSDP "
                        "training (fsdp, fsdp2); Megatron's tensor and pipeline parallelism is planned.",
                        fix=f"import the FSDP variant of the script ({key}=fsdp2), or plan the workload "
                        "afresh with `rlplan solve --model ... --gpus ...`")


def _reward_function(reward: dict[str, str]) -> str:
    path_raw = reward.get(REWARD_PATH_KEY)
    path = parse_value(path_raw) if path_raw is not None else None
    if not path:
        return ""
    name_raw = reward.get(REWARD_NAME_KEY)
    name = parse_value(name_raw) if name_raw is not None else None
    return f"{path}:{name or DEFAULT_REWARD_NAME}"

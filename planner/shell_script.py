"""The bash subset verl launch scripts are written in, interpreted far enough to find their verl command.

Lexing (quotes, `\\`-continued lines, comments, heredocs, `;` / `&&` / `|` separators), expansion of the
variables the script sets itself, `--env KEY=VALUE` pins or the environment (`${VAR:-x}`, `${VAR}`, `$VAR`,
`$((...))`) with the script's branches, exports and positional arguments tracked, and the one command that
runs `python3 -m verl.trainer.main_ppo` (or `-m recipe....`), as its words.  What the words mean to verl
(Hydra overrides -> a plan) is verl_import.py's.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Iterator

from attrs import frozen

from rlplan.planner.errors import PlanError
from rlplan.planner.quoting import UnclosedQuote, unquoted

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=")
_PYTHON = re.compile(r"(.*/)?python(\d+(\.\d+)?)?")
_VERL_MODULE = re.compile(r"(verl|recipe)(\.[A-Za-z0-9_]+)+")
_SHELL_KEYWORDS = {"then", "do", "else", "elif", "{", "!", "time", "exec", "nohup", "env"}
_ASSIGNING_BUILTINS = {"export", "declare", "local", "readonly", "typeset"}


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


_ARRAY_START = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_ARRAY_USE = re.compile(r'"?\$\{([A-Za-z_][A-Za-z0-9_]*)\[[@*]\]\}"?')
# Between the element words of an array assignment's one word (a character no script holds).
ARRAY_SEPARATOR = "\x1f"


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
        if char == "(" and _ARRAY_START.fullmatch("".join(current)):
            # `NAME=( word word ... )`: a bash array, kept as one word of its element words.
            end = _matching(text, i, "(", ")")
            elements = [word for command in shell_commands(text[i + 1 : end - 1]) for word in command]
            current.append("(" + ARRAY_SEPARATOR.join(elements) + ")")
            i = end
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
        # Bash arrays the script assigns (`ARGS=(a=1 b=2)`), as their raw element words.
        self.arrays: dict[str, list[str]] = {}

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
        array = _ARRAY_USE.fullmatch(raw)
        if array and array.group(1) in self.arrays:
            # `"${ARGS[@]}"`: each element its own word, as bash expands a quoted array.
            return [word for element in self.arrays[array.group(1)] for word in self.expand(element)]
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
            if raw_value.startswith("(") and raw_value.endswith(")"):
                scope.arrays[name] = [element for element in raw_value[1:-1].split(ARRAY_SEPARATOR) if element]
                continue
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

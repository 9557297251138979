"""Bash's word expansion for the launch scripts verl ships, running nothing: `ShellScope` holds the variables
(--env pins over the script's assignments over the environment, arrays, positional parameters, the folder) and
expands words as bash does: `${X:-x}`, `${X:=x}`, `${X:+x}`, `${X?}`, `${#X}`, `${X//a/b}`, `${X#p}` / `${X%p}`,
`${X:1:2}`, `${X,,}`, `"${A[@]}"`, `$((...))`, and the command substitutions whose output is the script's own
text: `$(pwd)` (the folder the import runs in), `$(dirname "$0")`, `$(cd "$(dirname "$0")" && pwd)`, `basename`,
`realpath`, `readlink -f`, `echo`.

A value rlplan cannot know (any other command substitution, an unset variable, an argument not given) expands
to a marker of an `Unknown` (what the script writes there, the variable that would set it, why): the caller
decides whether a key that holds one passes through verbatim or blocks the import. Environment values are
tracked so that none is copied into a plan unasked (`${oc.env:NAME}` references instead), and the scope keeps
where each exported variable came from (`provenance`). The interpreter of the script's commands is
shell_script.py's.
"""

from __future__ import annotations

import ast
import fnmatch
import operator
import posixpath
import re
from typing import Literal

from attrs import frozen

from rlplan.planner.redaction import is_secret, reference
from rlplan.planner.shell_lexer import matching, simple_commands

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_UNKNOWN = re.compile("\ue000(\\d+)\ue001")

# Shell variables that hold where the importing machine's shell is, not where the job will run.
MACHINE_PATH_VARIABLES = ("PWD", "HOME", "OLDPWD", "USER", "TMPDIR")
Origin = Literal["--env", "script", "environment", "shell", "unset"]


@frozen
class Unknown:
    """A value rlplan cannot know: what the script writes there, the variable that sets it ("" when the
    script writes it in place), why, and how the user can give it."""

    text: str
    variable: str
    reason: str
    how: str

    def describe(self) -> str:
        via = f"${self.variable}, " if self.variable and not self.text.lstrip("${").startswith(self.variable) else ""
        return f"{self.text} ({via}{self.reason})"


def _pin_fix(name: str) -> str:
    return f"pass --env {name}=VALUE"


# --- arithmetic --------------------------------------------------------------------------

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Pow: operator.pow,
           ast.FloorDiv: operator.floordiv, ast.Div: operator.floordiv, ast.Mod: operator.mod,
           ast.LShift: operator.lshift, ast.RShift: operator.rshift}
_COMPARE = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
            ast.Eq: operator.eq, ast.NotEq: operator.ne}


def _evaluate(node: ast.AST) -> int:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, (ast.FloorDiv, ast.Div, ast.Mod)) and right != 0:
            quotient = abs(left) // abs(right) * (1 if (left >= 0) == (right >= 0) else -1)  # C's truncation
            return quotient if not isinstance(node.op, ast.Mod) else left - right * quotient
        if isinstance(node.op, ast.Pow) and (right < 0 or right > 64):
            raise ValueError("exponent")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
        return int(_COMPARE[type(node.ops[0])](_evaluate(node.left), _evaluate(node.comparators[0])))
    if isinstance(node, ast.IfExp):
        return _evaluate(node.body) if _evaluate(node.test) else _evaluate(node.orelse)
    raise ValueError("not arithmetic")


def _arithmetic_to_python(expression: str) -> str:
    """bash's `a ? b : c` and `**` in Python's grammar (the rest of the integer operators read alike)."""
    match = re.fullmatch(r"(.*?)\?(.*):(.*)", expression, re.DOTALL)
    if match:
        return f"({match.group(2)}) if ({match.group(1)}) else ({match.group(3)})"
    return expression.replace("/", "//").replace("////", "//")


# --- paths (command substitutions rlplan evaluates as text) -----------------------------


def _dirname(path: str) -> str:
    stripped = path.rstrip("/")
    if not stripped:
        return "/" if path else "."
    head = stripped.rpartition("/")[0].rstrip("/")
    return head or ("/" if stripped.startswith("/") else ".")


def _basename(path: str, suffix: str = "") -> str:
    stripped = path.rstrip("/")
    name = stripped.rpartition("/")[2] if stripped else "/" if path else ""
    return name[: -len(suffix)] if suffix and name.endswith(suffix) and name != suffix else name


def absolute_path(cwd: str, path: str) -> str:
    return posixpath.normpath(posixpath.join(cwd, path))


def _glob_regex(pattern: str) -> str:
    """A bash pattern (`*`, `?`, `[...]`) as a regular expression, with no anchors."""
    return fnmatch.translate(pattern).removeprefix("(?s:").removesuffix(")\\Z")


class ShellScope:
    """Variables as bash sees them: --env pins win over the script's assignments, which win over the
    environment; `cwd` is the folder the import runs in (bash's PWD), `script` the path the script was given
    by ($0), `arguments` its positional parameters."""

    def __init__(self, pinned: dict[str, str], environment: dict[str, str], *, cwd: str | None = None,
                 script: str = "script.sh", arguments: tuple[str, ...] = ()) -> None:
        self.pinned = dict(pinned)
        self.environment = dict(environment)
        self.values: dict[str, str] = {}
        self.arrays: dict[str, list[str]] = {}
        self.exported: set[str] = set()
        self.script = script
        self.arguments = list(arguments)
        self.cwd = cwd if cwd is not None else environment.get("PWD")
        self.unknowns: list[Unknown] = []
        # The script's arguments: $@ dropped (none given), and ${1:-x} defaults taken.
        self.dropped_positional = False
        self.defaulted_positionals: dict[str, str] = {}
        # Names assigned inside if/case branches the import could not decide: it read them in order.
        self.branch_assigned: set[str] = set()
        # Branches decided on a variable that is not set here (bash reads it as empty): the variable, the branch.
        self.decided_on_unset: dict[str, str] = {}
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
        # Credentials the script set itself that an expansion read (planner/redaction.py): never copied.
        self.secrets_used: list[str] = []
        # Variables naming where the importing shell is (its directory, its user's home), read from this machine.
        self.machine_paths_used: dict[str, str] = {}
        # While set (conditions), an unset variable is empty, as bash reads it, instead of an Unknown.
        self._unset_is_empty = False
        self._unset_read: list[str] = []

    # --- provenance -----------------------------------------------------------------------

    def origin(self, name: str) -> Origin:
        """Where a variable's value comes from: a --env pin, the script, the inherited environment, the shell
        itself (PWD), or nowhere."""
        if name in self.pinned:
            return "--env"
        if name in self.values:
            return "script"
        if name in self.environment:
            return "environment"
        return "shell" if name == "PWD" and self.cwd is not None else "unset"

    def provenance(self) -> dict[str, Origin]:
        """Each exported variable (`export NAME[=value]` in the script) and each --env pin, by where its value
        came from: what a redacting printer needs to know (issue 41)."""
        return {name: self.origin(name) for name in sorted({*self.exported, *self.pinned})}

    # --- unknown values ---------------------------------------------------------------------

    def unknown(self, text: str, variable: str, reason: str, how: str = "") -> str:
        """The marker of a value rlplan cannot know, standing in for it in expansions."""
        self.unknowns.append(Unknown(text=text, variable=variable, reason=reason,
                                     how=how or (_pin_fix(variable) if variable else
                                                 "replace it with its value in the script")))
        return f"\ue000{len(self.unknowns) - 1}\ue001"

    def unknowns_in(self, value: str) -> list[Unknown]:
        return [self.unknowns[int(index)] for index in _UNKNOWN.findall(value)]

    def verbatim(self, value: str) -> str:
        """`value` with each unknown part written as the script writes it."""
        return _UNKNOWN.sub(lambda match: self.unknowns[int(match.group(1))].text, value)

    def _renamed(self, value: str, name: str) -> str:
        """An assigned value's unknowns that the script wrote in place now belong to `name` (--env sets it)."""
        def rename(match: re.Match[str]) -> str:
            unknown = self.unknowns[int(match.group(1))]
            if unknown.variable or unknown.text.startswith("$") and unknown.text[1:2].isdigit():
                return match.group(0)
            return self.unknown(unknown.text, name, unknown.reason)
        return _UNKNOWN.sub(rename, value)

    def _propagated(self, text: str, parts: str) -> str:
        """An Unknown for `text`, computed from `parts` that hold unknowns: the first one's variable and reason."""
        first = self.unknowns_in(parts)[0]
        return self.unknown(text, first.variable, first.reason, first.how)

    # --- variables --------------------------------------------------------------------------

    def assign(self, name: str, value: str, masked: str | None = None, read: tuple[str, ...] = ()) -> None:
        if name in self.pinned:
            return
        self.values[name] = self._renamed(value, name)
        self.arrays.pop(name, None)
        self.assigned_by_script.add(name)
        if masked is not None:
            self.masked[name] = (masked, read)
        else:
            self.masked.pop(name, None)

    def working_directory(self) -> str:
        """PWD: a --env pin, else the folder the import runs in (the script's `cd` moves it)."""
        if "PWD" in self.pinned:
            return self.pinned["PWD"]
        if self.cwd is None:
            return self.unknown("$PWD", "PWD", "the folder the script runs in, which the import was not told")
        self.machine_paths_used["PWD"] = self.cwd
        return self.cwd

    def lookup(self, name: str) -> str | None:
        if name in self.pinned:  # the user's own value, given to be used (and persisted) as it is
            return self.pinned[name]
        if name == "PWD":
            return self.working_directory()
        if name in self.values:
            if is_secret(name, self.values[name]):
                # A credential the script sets itself (export HF_TOKEN=...): masked like an environment value.
                self.secrets_used.append(name)
                self.environment_used.append(name)
            for read in self.masked.get(name, ("", ()))[1]:
                self._read_from_environment(read, self.environment.get(read))
            return self.values[name]
        if name in self.arrays:
            return self._element(name, 0)
        value = self.environment.get(name)
        if value is not None:
            self._read_from_environment(name, value)
        return value

    def _element(self, name: str, number: int) -> str:
        """Element `number` of an array (its raw word expanded as bash expanded it at the assignment)."""
        fields = [field for element in self.arrays[name] for field in self.expand(element)]
        return fields[number] if -len(fields) <= number < len(fields) else ""

    def _read_from_environment(self, name: str, value: str | None) -> None:
        # Where the importing shell is ($HOME) is not a secret, and nearly every verl example reads its data
        # under $HOME: a modeled key keeps this machine's value, and the import says so (machine_paths_used). Any
        # other environment value never reaches a modeled key (the caller refuses it, naming the variable).
        if name in MACHINE_PATH_VARIABLES and isinstance(value, str):
            self.machine_paths_used[name] = value
        else:
            self.environment_used.append(name)

    def shown(self, name: str, value: str) -> str:
        """A looked-up value as the expansion writes it: while masking, an environment value or a credential the
        script set itself (by its name or its shape) is its reference; a --env pin is the user's to persist."""
        if self.masking and name != "PWD" and name not in self.pinned and is_secret(name, value):
            return reference(name)
        if not self.masking or name in self.pinned or name == "PWD":
            return value
        if name in self.masked:
            return self.masked[name][0]
        if name in self.assigned_by_script or name in self.arrays or name not in self.environment:
            return value
        return "${oc.env:" + name + "}"

    def _value(self, name: str, text: str) -> str:
        value = self.lookup(name)
        if value is None:
            if self._unset_is_empty:
                self._unset_read.append(name)
                return ""
            return self.unknown(text, name, "not set by the script, --env or the environment")
        return self.shown(name, value)

    def _positional(self, index: int, text: str) -> str:
        if index == 0:
            return self.script
        if index <= len(self.arguments):
            return self.arguments[index - 1]
        if self._unset_is_empty:
            return ""
        return self.unknown(text, "", f"the script's argument {index}, and the import gives it "
                            f"{len(self.arguments) or 'none'}", how="pass the script's arguments with --arg VALUE")

    def expand_masked(self, raw: str, split: bool = True) -> list[str]:
        """`expand`, with every value that came from the environment written as `${oc.env:NAME}`: the text a
        plan may keep (verl reads the reference from the same environment when it runs)."""
        self.masking = True
        try:
            return self.expand(raw, split)
        finally:
            self.masking = False

    # --- word expansion ---------------------------------------------------------------------

    def _list_expansion(self, raw: str) -> list[str] | None:
        """A word that is one list expansion, `"$@"`, `"${A[@]}"`, `${@:2}`: its fields; None for other words."""
        match = re.fullmatch(r'("?)\$(?:\{(?:([A-Za-z_][A-Za-z0-9_]*)\[[@*]\]|(@)(?::(\d+))?)\}|(@|\*))\1', raw)
        if not match:
            return None
        quoted = bool(match.group(1))
        if match.group(2) is not None:
            name = match.group(2)
            if name in self.arrays:
                elements = [field for element in self.arrays[name] for field in self.expand(element)]
            else:
                value = self.lookup(name)
                elements = [] if value is None else [self.shown(name, value)]
        else:
            start = int(match.group(4) or 1)
            elements = list(self.arguments[start - 1 :]) if start >= 1 else [self.script, *self.arguments]
            if not self.arguments:
                self.dropped_positional = True
        if quoted and "*" not in raw:
            return list(elements)
        if quoted:
            return [" ".join(elements)]
        return [field for element in elements for field in element.split()]

    def expand(self, raw: str, split: bool = True) -> list[str]:
        """A word's expansion: a list of fields (unquoted expansions split on whitespace)."""
        listed = self._list_expansion(raw)
        if listed is not None:
            return listed
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
            if char == "'" or raw.startswith("$'", i):
                start = i + 1 if char == "'" else i + 2
                end = raw.index("'", start) if char == "'" else self._ansi_end(raw, start)
                text = raw[start:end]
                current.append(text if char == "'" else text.encode("latin-1", "backslashreplace")
                               .decode("unicode_escape", "replace"))
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
                end, value = self._dollar(raw, i)
                add_unquoted(value)
                i = end
            elif char == "~" and i == 0 and (len(raw) == 1 or raw[1] == "/"):
                home = self._value("HOME", "~")
                current.append(home)
                has_content = True
                i += 1
            else:
                current.append(char)
                has_content = True
                i += 1
        if current or has_content:
            fields.append("".join(current))
        return fields

    @staticmethod
    def _ansi_end(raw: str, start: int) -> int:
        j = start
        while raw[j] != "'":
            j += 2 if raw[j] == "\\" else 1
        return j

    def _double_quoted(self, raw: str, start: int) -> tuple[int, str]:
        out: list[str] = []
        i = start
        while raw[i] != '"':
            char = raw[i]
            if char == "\\" and raw[i + 1] in '$`"\\\n':
                out.append(raw[i + 1] if raw[i + 1] != "\n" else "")
                i += 2
            elif char in "$`":
                i, value = self._dollar(raw, i)
                out.append(value)
            else:
                out.append(char)
                i += 1
        return i + 1, "".join(out)

    def _dollar(self, raw: str, i: int) -> tuple[int, str]:
        """Expand the `$...` (or backquote) at raw[i]: (end index, value)."""
        if raw[i] == "`":
            end = raw.index("`", i + 1)
            return end + 1, self.substitute(raw[i + 1 : end], raw[i : end + 1])
        if raw.startswith("$((", i):
            end = matching(raw, i + 1, "(", ")")
            return end, self._arithmetic(raw[i + 3 : end - 2], raw[i:end])
        if raw.startswith("$(", i):
            end = matching(raw, i + 1, "(", ")")
            return end, self.substitute(raw[i + 2 : end - 1], raw[i:end])
        if raw.startswith("${", i):
            end = matching(raw, i + 1, "{", "}")
            return end, self._braced(raw[i + 2 : end - 1], raw[i:end])
        following = raw[i + 1 : i + 2]
        if following in ("@", "*"):
            if not self.arguments:
                self.dropped_positional = True
            return i + 2, " ".join(self.arguments)
        if following == "#":
            return i + 2, str(len(self.arguments))
        if following == "?":
            return i + 2, "0"
        if following in ("$", "!"):
            return i + 2, self.unknown(raw[i : i + 2], "", "a process id, known only when the script runs")
        if following.isdigit():
            return i + 2, self._positional(int(following), raw[i : i + 2])
        match = NAME.match(raw, i + 1)
        if not match:
            return i + 1, "$"
        return match.end(), self._value(match.group(0), raw[i : match.end()])

    # --- ${...} ----------------------------------------------------------------------------

    def _braced(self, body: str, text: str) -> str:
        match = re.fullmatch(r"(#?)([A-Za-z_][A-Za-z0-9_]*|\d+|[@*#?])(\[[^\]]*\])?(.*)", body, re.DOTALL)
        if not match or body.startswith("!"):
            return self.unknown(text, "", "a parameter expansion rlplan does not evaluate")
        length, name, index, rest = match.groups()
        if length:
            if rest:
                return self.unknown(text, "", "a parameter expansion rlplan does not evaluate")
            if index in ("[@]", "[*]") and name in self.arrays:
                return str(len(self.arrays[name]))
            value = self._parameter(name, index, text)
            return str(len(value)) if not self.unknowns_in(value) else self._propagated(text, value)
        if rest[:2] in (":-", ":=", ":+", ":?") or rest[:1] in ("-", "=", "+", "?"):
            return self._with_default(name, index, rest, text)
        value = self._parameter(name, index, text)
        if not rest:
            return value
        if self.unknowns_in(value):
            return self._propagated(text, value)
        operated = self._operate(value, rest)
        return operated if operated is not None else self.unknown(
            text, "", "a parameter expansion rlplan does not evaluate")

    def _parameter(self, name: str, index: str | None, text: str) -> str:
        """The value of `name` (a variable, a positional number, @, #) or of `name[index]`."""
        if name == "BASH_SOURCE":
            return self.script
        if name.isdigit():
            return self._positional(int(name), text)
        if name in ("@", "*"):
            if not self.arguments:
                self.dropped_positional = True
            return " ".join(self.arguments)
        if name == "#":
            return str(len(self.arguments))
        if name == "?":
            return "0"
        if index and index not in ("[@]", "[*]") and name in self.arrays:
            position = self._arithmetic(index[1:-1], text)
            if self.unknowns_in(position):
                return position
            return self._element(name, int(position))
        if index in ("[@]", "[*]") and name in self.arrays:
            return " ".join(field for element in self.arrays[name] for field in self.expand(element))
        return self._value(name, text)

    def _with_default(self, name: str, index: str | None, rest: str, text: str) -> str:
        colon = rest.startswith(":")
        kind, word = rest[1 if colon else 0], rest[2 if colon else 1 :]
        if name.isdigit():
            value: str | None = self.arguments[int(name) - 1] if 0 < int(name) <= len(self.arguments) else None
            if name == "0":
                value = self.script
        elif name in self.arrays or name in ("@", "*", "#", "?", "BASH_SOURCE") or index:
            value = self._parameter(name, index, text)
        else:
            value = self.lookup(name)
        missing = value is None or (colon and value == "")
        if kind == "+":
            return "" if missing else " ".join(self.expand(word, split=False))
        if not missing:
            return self.shown(name, value or "")
        if kind == "?":
            return self.unknown(text, name, "required by the script (${" + name + "?}) and not set")
        default = "".join(self.expand(word, split=False))
        if name.isdigit():
            self.defaulted_positionals[name] = self.verbatim(default)
        elif kind == "=":
            self.assign(name, default)
        return default

    def _operate(self, value: str, rest: str) -> str | None:
        """`${X//a/b}`, `${X/a/b}`, `${X#p}`, `${X##p}`, `${X%p}`, `${X%%p}`, `${X:1:2}`, `${X,,}`, `${X^^}`."""
        substitution = re.fullmatch(r"/(/?)([^/]*)(?:/(.*))?", rest, re.DOTALL)
        if substitution:
            every, pattern, replacement = substitution.groups()
            pattern = "".join(self.expand(pattern, split=False))
            replacement = "".join(self.expand(replacement or "", split=False))
            regex = _glob_regex(pattern) if pattern else None
            if regex is None:
                return value
            return re.sub(regex, lambda _: replacement, value, count=0 if every else 1)
        trim = re.fullmatch(r"(##?|%%?)(.*)", rest, re.DOTALL)
        if trim:
            how, pattern = trim.groups()
            regex = _glob_regex("".join(self.expand(pattern, split=False)))
            greedy = len(how) == 2
            ends = range(len(value) + 1)
            if how[0] == "#":
                for end in (reversed(ends) if greedy else ends):
                    if re.fullmatch(regex, value[:end], re.DOTALL):
                        return value[end:]
            else:
                for start in (ends if greedy else reversed(ends)):
                    if re.fullmatch(regex, value[start:], re.DOTALL):
                        return value[:start]
            return value
        case = {",,": str.lower, "^^": str.upper}.get(rest)
        if case is not None:
            return case(value)
        offset = re.fullmatch(r":\s*(-?\d+)(?::\s*(-?\d+))?", rest)
        if offset:
            start = int(offset.group(1))
            start = max(len(value) + start, 0) if start < 0 else start
            if offset.group(2) is None:
                return value[start:]
            count = int(offset.group(2))
            return value[start : start + count] if count >= 0 else value[start : len(value) + count]
        return None

    # --- $((...)) --------------------------------------------------------------------------

    def _arithmetic(self, expression: str, text: str) -> str:
        expanded = "".join(self.expand(expression, split=False)) if "$" in expression or "`" in expression \
            else expression
        if self.unknowns_in(expanded):
            return self._propagated(text, expanded)
        read: list[str] = []

        def substitute(match: re.Match[str]) -> str:
            name = match.group(0)
            value = self._value(name, "$" + name)
            read.append(value)
            return f"({value})" if value.strip() else "0"

        python = re.sub(r"\b[A-Za-z_][A-Za-z0-9_]*\b", substitute, expanded)
        values = "".join(read)
        if self.unknowns_in(values):
            return self._propagated(text, values)
        if "${oc.env:" in values:
            name = re.search(r"\$\{oc\.env:([^}]*)\}", values)
            return self.unknown(text, name.group(1) if name else "", "read from the environment inside $((...)), "
                                "which a plan cannot refer to")
        try:
            return str(_evaluate(ast.parse(_arithmetic_to_python(python).strip(), mode="eval")))
        except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
            return self.unknown(text, "", "arithmetic rlplan does not evaluate")

    # --- $(...) ----------------------------------------------------------------------------

    def substitute(self, inner: str, text: str) -> str:
        """A command substitution's output when its commands only print the script's own text (pwd, cd,
        dirname, basename, realpath, readlink -f, echo); an Unknown otherwise. Nothing runs."""
        cwd: str | None = None  # the substitution's own folder once a command needs it (a subshell's cd)
        output: list[str] = []
        skip = False
        not_run = "a command substitution rlplan does not run (it runs nothing)"
        for command in simple_commands(inner):
            if skip or not command.words:
                skip = command.separator == "||" or (skip and command.separator == "&&")
                continue
            if command.separator in ("|", "&"):
                return self.unknown(text, "", not_run)
            words = [field for raw in command.words for field in self.expand(raw)]
            if not words or words[0] not in _PRINTING:
                return self.unknown(text, "", not_run)
            if words[0] in _NEEDS_FOLDER and cwd is None:
                cwd = self.working_directory()
            if self.unknowns_in(" ".join(words) + (cwd or "")):
                return self._propagated(text, " ".join(words) + (cwd or ""))
            printed = _printed(words, cwd or "")
            if printed is None:
                return self.unknown(text, "", not_run)
            if words[0] == "cd":
                cwd = printed
            else:
                output.append(printed)
            skip = command.separator == "||"
        return "".join(output).rstrip("\n")


_PRINTING = frozenset({"pwd", "cd", "dirname", "basename", "realpath", "readlink", "echo", "true", ":"})
_NEEDS_FOLDER = frozenset({"pwd", "cd", "realpath", "readlink"})


def _printed(words: list[str], cwd: str) -> str | None:
    """What a command of the evaluated few prints (for `cd`: the folder it moves to); None for any other."""
    name, arguments = words[0], [word for word in words[1:] if word != "--"]
    options = [word for word in arguments if word.startswith("-") and word != "-"]
    operands = [word for word in arguments if word not in options]
    if name == "pwd":
        return cwd + "\n"
    if name == "cd":
        return absolute_path(cwd, operands[0]) if operands else None
    if name == "dirname" and operands:
        return "".join(_dirname(path) + "\n" for path in operands)
    if name == "basename" and operands:
        return _basename(operands[0], operands[1] if len(operands) > 1 else "") + "\n"
    if (name == "realpath" or name == "readlink" and options) and operands:
        return "".join(absolute_path(cwd, path) + "\n" for path in operands)
    if name == "echo":
        newline = "-n" not in options
        return " ".join(word for word in arguments if word not in ("-n", "-e", "-E")) + ("\n" if newline else "")
    if name in ("true", ":"):
        return ""
    return None

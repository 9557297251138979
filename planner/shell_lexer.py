"""Bash's lexing, as bash does it, for the scripts verl ships: a script's text -> simple commands of raw words.

Quotes (single, double, `$'...'`), backquotes, `$(...)`, `$((...))` and `${...}` are kept inside their word as
written; a backslash-newline joins lines outside quotes and comments, never inside a comment (`# ... \\` ends at
its newline, and the next line is a new command, as in bash); `\\ ` escapes a space, so a `#` after it is part
of a word, not a comment; heredoc bodies are skipped; redirections are dropped with their targets; a bash array
assignment (`NAME=( ... )`, `NAME+=( ... )`, over many lines, with comments) is one word holding its elements.
What the words mean is shell_script.py's.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from attrs import frozen

from rlplan.planner.errors import PlanError
from rlplan.planner.quoting import UnclosedQuote, unquoted

# Between the element words of an array assignment's one word (a character no script holds).
ARRAY_SEPARATOR = "\x1f"
_ARRAY_START = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=")
_HEREDOC = re.compile(r"<<(?P<dash>-)?[ \t]*(?P<delimiter>'[^'\n]*'|\"[^\"\n]*\"|[A-Za-z0-9_]+)")
_OPERATORS = ("&&", "||", ";;", "\n", ";", "&", "|", "(", ")")


@frozen
class SimpleCommand:
    """One simple command's raw words, what ended it (`&&`, `||`, `|`, `;`, a newline, `(`, `)`, `&`, or ""
    at the end of the text) and the line it starts on (1-based)."""

    words: tuple[str, ...]
    separator: str
    line: int


def matching(text: str, start: int, opening: str, closing: str) -> int:
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


def _double_quote_end(text: str, i: int) -> int:
    """Index just past the double quote that closes the one at text[i]."""
    j = i + 1
    while j < len(text) and text[j] != '"':
        if text[j] == "\\":
            j += 1
        elif text.startswith("$(", j):
            j = matching(text, j + 1, "(", ")") - 1
        elif text.startswith("${", j):
            j = matching(text, j + 1, "{", "}") - 1
        elif text[j] == "`":
            end = text.find("`", j + 1)
            j = len(text) if end < 0 else end
        j += 1
    if j >= len(text):
        raise PlanError(field="script", message="a double quote is never closed.", fix="close the quote")
    return j + 1


def _quoted_end(text: str, i: int) -> int | None:
    """Index just past the quoted or substituted part starting at text[i], or None when none starts there."""
    char = text[i]
    if char == "'" or char == "`" or text.startswith("$'", i):
        start = i + 1 if char != "$" else i + 2
        j = start
        while j < len(text) and text[j] != text[start - 1]:
            j += 2 if char == "$" and text[j] == "\\" else 1
        if j >= len(text):
            what = "backquote" if char == "`" else "single quote"
            raise PlanError(field="script", message=f"a {what} is never closed.", fix=f"close the {what}")
        return j + 1
    if char == '"':
        return _double_quote_end(text, i)
    if text.startswith("$(", i):
        return matching(text, i + 1, "(", ")")
    if text.startswith("${", i):
        return matching(text, i + 1, "{", "}")
    return None


class _Lexer:
    def __init__(self, text: str) -> None:
        self.text = text
        self.i = 0
        self.heredocs: list[tuple[str, bool]] = []

    def line(self, index: int) -> int:
        return self.text.count("\n", 0, index) + 1

    def skip_comment(self) -> None:
        end = self.text.find("\n", self.i)
        self.i = len(self.text) if end < 0 else end

    def words(self, in_array: bool = False) -> Iterator[tuple[list[str], str, int]]:
        """(words, separator, start) per simple command; in an array, words until its closing `)`."""
        text = self.text
        words: list[str] = []
        current: list[str] = []
        started = self.i
        redirect_target = False

        def end_word() -> None:
            nonlocal redirect_target
            if current:
                if not redirect_target:
                    words.append("".join(current))
                redirect_target = False
                current.clear()

        while self.i < len(text):
            i = self.i
            char = text[i]
            if char == "\\" and text.startswith(("\\\n", "\\\r\n"), i):
                self.i += 2 if text[i + 1] == "\n" else 3  # a line continuation: the word goes on
                continue
            if char == "#" and not current:
                self.skip_comment()
                continue
            if char in " \t\r" or (in_array and char in "\n;"):
                end_word()
                self.i += 1
                if char == "\n" and self.heredocs:
                    self.i = _skip_heredoc_bodies(text, self.i, self.heredocs)
                    self.heredocs.clear()
                continue
            if in_array and char == ")":
                end_word()
                self.i += 1
                yield words, ")", started
                return
            if char == "(" and _ARRAY_START.fullmatch("".join(current)):
                self.i += 1
                elements = [word for found, _, _ in self.words(in_array=True) for word in found]
                current.append("(" + ARRAY_SEPARATOR.join(elements) + ")")
                continue
            if char == "&" and text.startswith("&>", i):
                end_word()
                self.i += 2
                redirect_target = True
                continue
            operator = next((op for op in _OPERATORS if text.startswith(op, i)), None)
            if operator is not None:
                end_word()
                self.i += len(operator)
                if operator == "\n" and self.heredocs:
                    self.i = _skip_heredoc_bodies(text, self.i, self.heredocs)
                    self.heredocs.clear()
                if words or operator not in ("\n", ";"):
                    yield list(words), operator, started
                words.clear()
                started = self.i
                continue
            heredoc = _HEREDOC.match(text, i) if char == "<" else None
            if heredoc:
                end_word()
                self.heredocs.append((heredoc.group("delimiter").strip("'\""), bool(heredoc.group("dash"))))
                self.i = heredoc.end()
                continue
            if char in "<>":
                if current and "".join(current).isdigit():
                    current.clear()
                end_word()
                while self.i < len(text) and text[self.i] in "<>&":
                    self.i += 1
                if self.i < len(text) and text[self.i].isdigit() and text[self.i - 1] == "&":
                    self.i += 1
                else:
                    redirect_target = True
                continue
            if char == "\\":
                if i + 1 < len(text):  # a backslash that ends the text escapes nothing, and bash drops it
                    current.append(text[i : i + 2])
                self.i += 2
                continue
            end = _quoted_end(text, i) if char in "'\"`$" else None
            if end is not None:
                current.append(text[i:end])
                self.i = end
                continue
            current.append(char)
            self.i += 1
        if in_array:
            raise PlanError(field="script", message="an array's opening '(' is never closed.",
                            fix="close the array with ')'")
        end_word()
        if words:
            yield words, "", started


def simple_commands(text: str) -> Iterator[SimpleCommand]:
    """The script's simple commands in order, each with its separator and first line."""
    lexer = _Lexer(text)
    for words, separator, start in lexer.words():
        yield SimpleCommand(words=tuple(words), separator=separator, line=lexer.line(start))


def shell_commands(text: str) -> Iterator[list[str]]:
    """Simple commands as lists of raw words (quotes kept, line continuations removed)."""
    for command in simple_commands(text):
        if command.words:
            yield list(command.words)

"""The one error a user ever sees from rlplan: a field, what is wrong, and the fix.

Every bad input (a malformed TOML, a wrong type, an unknown model, a negative
batch size) becomes a PlanError; the CLI prints it as one paragraph and exits 2.
No traceback reaches a user for bad input.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class PlanError(Exception):
    """Bad input, named by the field it is in and paired with the fix."""

    def __init__(self, field: str, message: str, fix: str = "") -> None:
        self.field = field
        self.message = message
        self.fix = fix
        super().__init__(self.paragraph())

    def paragraph(self) -> str:
        text = f"{self.field}: {self.message}"
        if self.fix:
            text += f" Fix: {self.fix}" + ("" if self.fix.endswith((".", "?", "!")) else ".")
        return text


def did_you_mean(name: str, valid: Iterable[str], *, prefix: str = "", otherwise: str | None = None,
                 cutoff: float = 0.5) -> str:
    """The fix for an unknown key: the closest valid one (written with `prefix`), else `otherwise`, else
    the valid keys."""
    choices = sorted(valid)
    near = difflib.get_close_matches(name, choices, n=1, cutoff=cutoff)
    if near:
        return f"did you mean `{prefix}{near[0]}`?"
    return otherwise if otherwise is not None else f"valid keys here: {', '.join(choices)}"


# Echoed user values are cut to this many characters: rich wraps long lines in quadratic time, so a
# 20 MB string in a field would otherwise make printing one error take minutes.
ECHO_LIMIT = 200


def shorten(text: str, limit: int = ECHO_LIMIT) -> str:
    """Keep the start and the end of a long text, which name the field and the problem."""
    if len(text) <= limit:
        return text
    keep = limit // 2
    return f"{text[:keep]} ...[{len(text) - 2 * keep} characters left out]... {text[-keep:]}"

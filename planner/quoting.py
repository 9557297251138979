"""Walking text past what its quotes protect.

The shell lexer (verl_import) and Hydra's override values (verl_keys) both look for brackets and
separators outside quotes; they differ only in whether a backslash escapes inside single quotes
(the shell: never; Hydra: always).
"""

from __future__ import annotations

from collections.abc import Iterator


class UnclosedQuote(ValueError):
    """The text ended inside a quote; the caller says which syntax broke."""


def unquoted(text: str, start: int = 0, *, backslash_in_single_quotes: bool) -> Iterator[tuple[int, str]]:
    """(index, character) of each character of text[start:] that is outside quotes and not escaped by a
    backslash. Quote characters are not yielded. Raises UnclosedQuote at the end when a quote is still open."""
    quote, i = "", start
    while i < len(text):
        char = text[i]
        if char == "\\" and (quote != "'" or backslash_in_single_quotes):
            i += 2
            continue
        if quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        else:
            yield i, char
        i += 1
    if quote:
        raise UnclosedQuote(quote)

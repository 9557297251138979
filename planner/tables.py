"""Rich tables laid out for the width they are printed at (a terminal, a pipe, a CI log of 80 columns).

rich shrinks a table that is too wide by cutting its columns evenly, through the middle of words: a GPU name
became `RTX4090…`, a header `seqs/GP U`, a plan key `actor.param_offl oad`, names a user has to type. A
`FittedTable` renders like rich's `Table` where that fits, and otherwise by one rule: no column is narrower than
its longest word (its header's included), the spare width going to the columns that wrap; where even that is too
wide, the table folds: it is printed as several tables one under the other, each repeating the key columns (the
first `keys`) with as many of the other columns as fit. Nothing is cut and nothing is left out. A title or
caption wider than the table prints as a line of its own rather than folded to the table's width.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table


class FittedTable(Table):
    """A rich `Table` that never splits a word and folds where its columns cannot fit side by side.

    `keys`: how many leading columns name a row (repeated in every part of a folded table)."""

    def __init__(self, *args: Any, keys: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.keys = keys

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        # A column that does not wrap is as narrow as its longest line, not its longest word.
        ranges = [Measurement(measured.maximum, measured.maximum) if column.no_wrap else measured
                  for column, measured in ((column, self._measure_column(console, options, column))
                                           for column in self.columns)]
        if not self.columns or sum(r.maximum for r in ranges) + self._extra_width <= width:
            yield from self._annotated(self, console, options, sum(r.maximum for r in ranges))
            return
        minima = [r.minimum for r in ranges]
        parts = self._parts(minima, width)
        if self.title:
            yield console.render_str(str(self.title), style=self.title_style or "table.title", highlight=False)
        # Each part with its outer edge where that fits, else without (two columns more of room).
        edges = [bool(self.show_edge) and self._minimum(columns, minima, edge=True) <= width for columns in parts]
        if any(self._minimum(columns, minima, edge=edge) > width for columns, edge in zip(parts, edges, strict=True)):
            yield from self._records(console, list(range(len(self.columns))), caption=True)
            return
        for number, (columns, edge) in enumerate(zip(parts, edges, strict=True)):
            part = self._part(columns, [ranges[index] for index in columns], width, edge=edge)
            part.caption = self.caption if number == len(parts) - 1 else None
            yield from self._annotated(part, console, options, sum(column.width or 0 for column in part.columns))

    def _parts(self, minima: list[int], width: int) -> list[list[int]]:
        """The column indexes of each part, key columns first in each: one part when their minima fit."""
        keys = list(range(min(self.keys, len(self.columns))))
        parts: list[list[int]] = []
        for index in range(len(keys), len(self.columns)):
            current = parts[-1] if parts else None
            if current is not None and self._minimum(current + [index], minima, edge=self.show_edge) <= width:
                current.append(index)
            else:
                parts.append(keys + [index])
        return parts or [keys]

    def _minimum(self, columns: list[int], minima: list[int], *, edge: bool) -> int:
        return sum(minima[index] for index in columns) + self._borders(len(columns), edge=edge)

    def _borders(self, count: int, *, edge: bool) -> int:
        """The borders of a table of `count` columns (rich's `_extra_width` for this many)."""
        return (2 if self.box and edge else 0) + (count - 1 if self.box else 0)

    def _part(self, indexes: list[int], ranges: list[Measurement], width: int, *, edge: bool) -> Table:
        """A plain Table of these columns at fixed widths, so rich never cuts one: each column as wide as it
        likes, the widest shrunk first (as rich does), none below its longest word. Without its outer edge
        where that is what lets the part fit."""
        widths = [r.maximum for r in ranges]
        excess = sum(widths) + self._borders(len(indexes), edge=edge) - width
        while excess > 0:
            shrinkable = [i for i, (wide, r) in enumerate(zip(widths, ranges, strict=True)) if wide > r.minimum]
            if not shrinkable:
                break
            widest = max(shrinkable, key=lambda i: widths[i])
            widths[widest] -= 1
            excess -= 1
        part = plain_copy(self)  # rendered as rich's own table from here: the widths below are final
        part.title, part.show_edge = None, edge
        part.columns = [dataclasses.replace(self.columns[index], _index=position)
                        for position, index in enumerate(indexes)]
        for position, (column, wide) in enumerate(zip(part.columns, widths, strict=True)):
            column.width = max(1, wide - part._get_padding_width(position))
        return part

    def _records(self, console: Console, columns: list[int], *, caption: bool) -> Iterator[Any]:
        """The last resort, where not even the key columns and one other fit side by side: each row as a record,
        a line per column (its header, then its value; a value's further lines indented), records apart."""
        from rich.text import Text

        for row in range(self.row_count):
            if row:
                yield Text("")
            for index in columns:
                column = self.columns[index]
                cell = column._cells[row]
                value = console.render_str(cell) if isinstance(cell, str) else cell
                header = Text(f"{column.header}: " if column.header else "", style="bold")
                if not isinstance(value, Text):  # another renderable: under its header
                    yield from (header, value)
                    continue
                lines = value.split("\n")
                yield Text.assemble(header, lines[0])
                yield from (Text.assemble("  ", line) for line in lines[1:])
        if caption and self.caption:
            yield console.render_str(str(self.caption), style=self.caption_style or "table.caption",
                                     highlight=False)

    def _annotated(self, table: Table, console: Console, options: ConsoleOptions, columns_width: int) -> \
            Iterator[Any]:
        """The table, with a title or caption wider than the table printed as a line of its own."""
        table_width = min(options.max_width, columns_width + self._borders(len(table.columns), edge=table.show_edge))
        title, caption = table.title, table.caption
        long_title, long_caption = (bool(text) and console.measure(console.render_str(str(text))).maximum > table_width
                                    for text in (title, caption))
        if table is self and not (long_title or long_caption):
            yield from super().__rich_console__(console, options)
            return
        if long_title:
            yield console.render_str(str(title), style=table.title_style or "table.title", highlight=False)
        plain = plain_copy(table)
        plain.title = None if long_title else title
        plain.caption = None if long_caption else caption
        yield from Table.__rich_console__(plain, console, options)
        if long_caption:
            yield console.render_str(str(caption), style=table.caption_style or "table.caption", highlight=False)


def plain_copy(table: Table) -> Table:
    """A shallow copy of a table as rich's own `Table` (its columns list shared until replaced)."""
    plain = Table.__new__(Table)
    plain.__dict__.update(vars(table))
    return plain

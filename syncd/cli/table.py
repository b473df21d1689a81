"""A table a command prints (machines, sessions, prune's verdicts): a header row, then
one row per item.

On a terminal rich draws it. Otherwise (a pipe, a file, a test) it is plain text: columns
padded with spaces, no box drawing, one line per row, so that grep, awk and cut still
work.

Cells come from the store: every one is made printable here, whatever its caller did (an
escape sequence must not drive the reader's terminal), and rich gets them as ``Text``,
never as markup (a title ``[link=…]x[/link]`` is printed as written).
"""

from __future__ import annotations

import sys
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TextIO, TypeVar

import click

from syncd.untrusted import printable

if TYPE_CHECKING:
    from rich.console import Console

R = TypeVar("R")

# Between two columns.
GAP = "  "
# A column of free text is never made narrower than this to fit a terminal.
MIN_TEXT = 12


@dataclass(frozen=True)
class Column:
    header: str
    # Numbers and sizes are right-aligned.
    right: bool = False
    # Free text (a title, a path) that rich may wrap on a narrow terminal; the other
    # columns (ids, names, times, numbers) are kept whole on one line.
    wrap: bool = False


def width(text: str) -> int:
    """Terminal cells ``text`` takes: wide (CJK, emoji) characters two, combining ones none."""
    return sum(0 if unicodedata.combining(c) else
               2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


class Table(Generic[R]):
    """``rows`` shown through ``cells`` (one string per column). The plain table calls
    ``cells`` twice per row (widths, then lines) rather than keep a second copy of a long
    listing; rich, on a terminal, holds every cell to lay them out."""

    def __init__(self, columns: Sequence[Column], rows: Sequence[R],
                 cells: Callable[[R], Sequence[str]]) -> None:
        self.columns = tuple(columns)
        self.rows = rows
        self._cells = cells

    def cells(self, row: R) -> list[str]:
        out = [printable(c) for c in self._cells(row)]
        if len(out) != len(self.columns):
            raise ValueError(f"{len(out)} cells for {len(self.columns)} columns")
        return out

    def lines(self) -> Iterator[str]:
        """The plain table: the header, then one line per row (no trailing spaces)."""
        widths = [width(c.header) for c in self.columns]
        for row in self.rows:
            widths = [max(w, width(c)) for w, c in zip(widths, self.cells(row), strict=True)]
        yield self._line([c.header for c in self.columns], widths)
        for row in self.rows:
            yield self._line(self.cells(row), widths)

    def _line(self, cells: list[str], widths: list[int]) -> str:
        parts = []
        for col, cell, w in zip(self.columns, cells, widths, strict=True):
            pad = " " * (w - width(cell))
            parts.append(pad + cell if col.right else cell + pad)
        return GAP.join(parts).rstrip()

    def render(self, console: Console) -> None:
        """The table drawn by rich on ``console``. The columns that do not wrap are kept
        whole; the free text shares the room left, wrapped within it. A terminal too
        narrow for that gets lines as long as they must be (rich alone would squeeze
        columns to nothing)."""
        from rich import box
        from rich.table import Table as RichTable
        from rich.text import Text

        rows = [self.cells(row) for row in self.rows]
        natural = [max([width(c.header), *(width(r[i]) for r in rows)])
                   for i, c in enumerate(self.columns)]
        free = [i for i, c in enumerate(self.columns) if c.wrap]
        floor = {i: min(natural[i], MIN_TEXT) for i in free}
        fixed = len(GAP) * (len(self.columns) - 1) + sum(
            w for i, w in enumerate(natural) if i not in free)
        total = max(console.width, fixed + sum(floor.values()))
        room, wanted = total - fixed, sum(natural[i] for i in free)
        limit = {i: max(floor[i], room * natural[i] // wanted)
                 for i in free} if wanted > room else {}
        # One space after each column and one for the rule between two: GAP's width.
        t = RichTable(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                      padding=(0, 1, 0, 0), header_style="bold")
        for i, c in enumerate(self.columns):
            # Folded if it must be, never cut with an ellipsis: a session id is copied
            # from here.
            t.add_column(Text(c.header), justify="right" if c.right else "left",
                         no_wrap=not c.wrap, overflow="fold", max_width=limit.get(i))
        for r in rows:
            t.add_row(*(Text(cell) for cell in r))
        console.width = total  # print's own width is capped at the console's
        console.print(t)

    def echo(self, stream: TextIO | None = None, *, terminal: bool | None = None,
             columns: int | None = None) -> None:
        """Print the table to ``stream`` (stdout): drawn by rich when it is a terminal
        (or ``terminal``; ``columns`` wide, default the terminal's), else plain."""
        if terminal is None:
            terminal = (stream or sys.stdout).isatty()
        if not terminal:
            for line in self.lines():
                click.echo(line, file=stream)
            return
        # rich is imported only for a terminal: piped and scripted runs never pay for it.
        from rich.console import Console

        self.render(Console(file=stream, force_terminal=True, width=columns, markup=False,
                            emoji=False, highlight=False))

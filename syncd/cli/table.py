"""A table a command prints (machines, sessions, snapshots, prune's verdicts): a header
row, then one row per item.

On a terminal rich draws it, fitted to the terminal's width with one line per row: ids
shown by their first characters (enough to tell them apart, as the commands take them),
free text cut with an ellipsis (a path in its middle, keeping its head and last
components; a title or a name at its end), and the least useful columns left out when
even that is too wide. ``--wide`` shows every value whole (the terminal folds the lines).
Otherwise (a pipe, a file, a test) it is plain text with every value whole: columns
padded with spaces, no box drawing, one line per row, so that grep, awk and cut still
work.

Cells come from the store: every one is made printable here, whatever its caller did (an
escape sequence must not drive the reader's terminal, a newline must not start a row),
and rich gets them as ``Text``, never as markup (a title ``[link=…]x[/link]`` is printed
as written). Widths are terminal cells (rich's ``cell_len``: a CJK character or an emoji
takes two).
"""

from __future__ import annotations

import sys
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, TextIO, TypeVar

import click

from syncd.untrusted import printable

if TYPE_CHECKING:
    from rich.console import Console

R = TypeVar("R")

# Between two columns.
GAP = "  "
# On a terminal, a column of free text is cut no narrower than this (or its header) while
# columns can still be left out; then down to its header's width.
MIN_TEXT = 10
ELLIPSIS = "…"

Cut = Literal["end", "path"]


@dataclass(frozen=True)
class Column:
    header: str
    # Numbers and sizes are right-aligned.
    right: bool = False
    # On a terminal, free text too long for its column is cut: "end" (a title, a name:
    # its start kept), "path" (its head and last components kept, the middle left out).
    # The other columns (ids, times, numbers) are kept whole.
    cut: Cut | None = None
    # Cut no narrower than this while columns can still be left out (a name people type,
    # such as a machine id, may ask for more than free text).
    least: int = MIN_TEXT
    # An id shown on a terminal by its first ``short`` characters, more where two rows'
    # ids begin alike (0: whole).
    short: int = 0
    # Left out on a terminal too narrow for the table, highest first (0: never).
    drop: int = 0


def width(text: str) -> int:
    """Terminal cells ``text`` takes: wide (CJK, emoji) characters two, combining ones none."""
    if text.isascii():  # printable ASCII (cells are made printable): one cell each
        return len(text)
    return sum(0 if unicodedata.combining(c) else
               2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _cells(text: str) -> int:
    from rich.cells import cell_len
    return cell_len(text)


def _end(chars: Iterable[str], room: int) -> int:
    """How many of ``chars`` take at most ``room`` cells, summed a character at a time
    (the scan stops there: a 4,096-character title costs what the column shows)."""
    from rich.cells import get_character_cell_size
    used = n = 0
    for c in chars:
        used += get_character_cell_size(c)
        if used > room:
            break
        n += 1
    return n


def _head(text: str, room: int) -> str:
    """The longest start of ``text`` that takes at most ``room`` cells."""
    end = min(_end(text, room), len(text))
    while end and _cells(text[:end]) > room:  # a cluster rich counts wider
        end -= 1
    return text[:end]


def _tail(text: str, room: int) -> str:
    """The longest end of ``text`` that takes at most ``room`` cells."""
    n = min(_end(reversed(text), room), len(text))
    while n and _cells(text[len(text) - n:]) > room:
        n -= 1
    return text[len(text) - n:]


def _fits(text: str, room: int) -> bool:
    return len(_head(text, room)) == len(text)


def cells_upto(text: str, most: int) -> int:
    """``text``'s cells, or ``most + 1`` when it takes more than ``most``."""
    if len(text) <= most // 2:
        return _cells(text)
    return _cells(text) if _fits(text, most) else most + 1


def cut_end(text: str, room: int) -> str:
    """``text`` in at most ``room`` cells: its start and an ellipsis when it is longer."""
    if _fits(text, room):
        return text
    return _head(text, room - 1) + ELLIPSIS if room > 0 else ""


def cut_path(text: str, room: int) -> str:
    """A path in at most ``room`` cells: its head, an ellipsis, and as many of its last
    components as leave the head its first component (or a few cells of it), the last
    one whole whatever is left of the head; a last component too long for that is cut
    in its middle (the path's two ends)."""
    if _fits(text, room):
        return text
    if room < 3:
        return cut_end(text, room)
    parts = text.split("/")
    # The head's first component: "/home" of "/home/a/b", "~" of "~/b".
    first = "/" + parts[1] if parts[0] == "" and len(parts) > 1 else parts[0]
    least = min(cells_upto(first, 6), 6)
    best, used = 0, 0
    # The last components, one more at a time while they fit ("/" joins no cluster).
    for k in range(1, len(parts)):
        used += cells_upto("/" + parts[-k], room)
        left = room - 1 - used
        if left < 0:
            break
        # The last component whole wins over the head's first.
        if left >= (least if k > 1 else 0):
            best = k
    if best:
        tail = "/" + "/".join(parts[-best:])
        return _head(text, room - 1 - _cells(tail)) + ELLIPSIS + tail
    # No last component fits whole beside the head: both ends, the larger half the end's.
    # (The head takes what a wide character at the end's cut left over.)
    end = _tail(text, room - 1 - (room - 1) // 2)
    return _head(text, room - 1 - _cells(end)) + ELLIPSIS + end


def cut(text: str, room: int, how: Cut) -> str:
    return cut_path(text, room) if how == "path" else cut_end(text, room)


def short_ids(ids: Sequence[str], least: int) -> dict[str, str]:
    """Each id by its first ``least`` characters, or as many more as tell it from the
    others (the same id twice, say a session on two machines, is one). Told apart as
    the commands take them, in either case: ``ABCDEF12-…`` from ``abcdef12-…``, an id
    that differs from another in case alone being that one."""
    ordered = sorted({i.lower() for i in ids})
    n_of = {}
    for i, sid in enumerate(ordered):
        n = least
        for other in ordered[max(i - 1, 0):i] + ordered[i + 1:i + 2]:
            same = next((j for j, (a, b) in enumerate(zip(sid, other, strict=False))
                         if a != b), min(len(sid), len(other)))
            n = max(n, same + 1)
        n_of[sid] = n
    return {sid: sid[:n_of[sid.lower()]] for sid in ids}


def fit(columns: Sequence[Column], natural: Sequence[int], total: int
        ) -> tuple[list[int], list[int]]:
    """The columns kept and their widths for a terminal ``total`` cells wide: whole
    columns at their natural width, the columns that may be cut sharing what is left
    evenly (none below its ``least``); columns left out (``drop``, highest first)
    while even that is too wide, then the cut ones narrowed to their headers. Too narrow
    still: the widths of that, wider than ``total``."""
    floor = [natural[i] if c.cut is None else min(natural[i], max(c.least, _cells(c.header)))
             for i, c in enumerate(columns)]

    def need(kept: list[int], floors: Sequence[int]) -> int:
        return sum(floors[i] for i in kept) + len(GAP) * (len(kept) - 1)

    kept = list(range(len(columns)))
    for i in sorted((i for i, c in enumerate(columns) if c.drop), key=lambda i: -columns[i].drop):
        if need(kept, floor) <= total:
            break
        kept.remove(i)
    if need(kept, floor) > total:
        floor = [natural[i] if c.cut is None else min(natural[i], _cells(c.header))
                 for i, c in enumerate(columns)]
    widths = {i: floor[i] for i in kept}
    cuts = [i for i in kept if columns[i].cut is not None]
    # What is left goes a cell at a time to the narrowest cut column short of its own.
    for _ in range(total - need(kept, floor)):
        short = [i for i in cuts if widths[i] < natural[i]]
        if not short:
            break
        widths[min(short, key=lambda i: widths[i])] += 1
    return kept, [widths[i] for i in kept]


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

    def render(self, console: Console, *, wide: bool = False) -> None:
        """The table drawn by rich on ``console``, fitted to its width (see ``fit``), one
        line per row; ``wide``: every value whole, the lines as long as they must be."""
        from rich import box
        from rich.table import Table as RichTable
        from rich.text import Text

        rows = [self.cells(row) for row in self.rows]
        if not wide:
            for i, c in enumerate(self.columns):
                if c.short:
                    shown = short_ids([r[i] for r in rows], c.short)
                    for r in rows:
                        r[i] = shown[r[i]]
        # A cut cell's width beyond the terminal's is not needed (nor measured).
        most = sys.maxsize if wide else console.width
        natural = [max([_cells(c.header), *(cells_upto(r[i], most if c.cut else sys.maxsize)
                                             for r in rows)])
                   for i, c in enumerate(self.columns)]
        if wide:
            kept, widths = list(range(len(self.columns))), natural
        else:
            kept, widths = fit(self.columns, natural, console.width)
        # One space after each column and one for the rule between two: GAP's width.
        t = RichTable(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                      padding=(0, 1, 0, 0), header_style="bold")
        for i, w in zip(kept, widths, strict=True):
            c = self.columns[i]
            # Cut here already: rich only pads (crop: never a fold to a second line).
            t.add_column(Text(c.header), justify="right" if c.right else "left",
                         width=w, no_wrap=True, overflow="crop")
        for r in rows:
            t.add_row(*(Text(r[i] if (how := self.columns[i].cut) is None else
                             cut(r[i], w, how)) for i, w in zip(kept, widths, strict=True)))
        # print's own width is capped at the console's.
        console.width = sum(widths) + len(GAP) * (len(widths) - 1)
        console.print(t, crop=False, soft_wrap=False)

    def echo(self, stream: TextIO | None = None, *, terminal: bool | None = None,
             columns: int | None = None, wide: bool = False) -> None:
        """Print the table to ``stream`` (stdout): drawn by rich when it is a terminal
        (or ``terminal``; ``columns`` wide, default the terminal's; ``wide``: every value
        whole), else plain."""
        if terminal is None:
            terminal = (stream or sys.stdout).isatty()
        if not terminal:
            for line in self.lines():
                click.echo(line, file=stream)
            return
        # rich is imported only for a terminal: piped and scripted runs never pay for it.
        from rich.console import Console

        self.render(Console(file=stream, force_terminal=True, width=columns, markup=False,
                            emoji=False, highlight=False), wide=wide)


def wide_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--wide``: on a terminal, every value whole (whole ids, paths and titles)."""
    return click.option("--wide", is_flag=True,
                        help="On a terminal, show every value whole (lines may be longer "
                             "than the terminal; piped output always is whole).")(fn)

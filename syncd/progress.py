"""Progress for long foreground work (first seed, restore): a rich bar on a terminal.

The work itself only sees a ``Meter``: ``start(total)`` once the size is known, then
``advance(n)`` as bytes are done. When stderr is not a terminal nothing is drawn: the
command's one-line summary is the whole output.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol, TextIO


class Meter(Protocol):
    def start(self, total: int) -> None: ...

    def advance(self, n: int) -> None: ...


class NullMeter:
    """Counts, draws nothing."""

    def __init__(self) -> None:
        self.total = 0
        self.done = 0

    def start(self, total: int) -> None:
        self.total = total

    def advance(self, n: int) -> None:
        self.done += n


class _RichMeter(NullMeter):
    def __init__(self, description: str, stream: TextIO) -> None:
        super().__init__()
        # rich is imported only on a terminal: plain runs and the daemon never pay for it.
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
            TransferSpeedColumn(), TimeRemainingColumn(),
            console=Console(file=stream), transient=True)
        self._task = self._progress.add_task(description, total=None)

    def start(self, total: int) -> None:
        super().start(total)
        self._progress.update(self._task, total=total or None)
        self._progress.start()

    def advance(self, n: int) -> None:
        super().advance(n)
        self._progress.update(self._task, advance=n)

    def stop(self) -> None:
        self._progress.stop()


@contextmanager
def meter(description: str, stream: TextIO | None = None) -> Iterator[NullMeter]:
    """A progress bar on ``stream`` (stderr) when it is a terminal, else a silent counter."""
    stream = stream or sys.stderr
    if not stream.isatty():
        yield NullMeter()
        return
    m = _RichMeter(description, stream)
    try:
        yield m
    finally:
        m.stop()

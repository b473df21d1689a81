"""A local SQLite database of the daemon's passes (the search index, the secrets
findings): one connection per thread, in autocommit mode, whose writer takes the write
lock when it starts writing, so that its reads (a cursor) and its writes are one view
and two writers (the daemon, a command) take turns.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from types import TracebackType
from typing import Self

from syncd.errors import StateError


class LocalDb:
    """The open database. Not thread-safe: one per thread."""

    what = "database"  # how its errors name it

    def __init__(self, db: sqlite3.Connection, path: Path) -> None:
        self.db = db
        self.path = path

    def __enter__(self) -> Self:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _begin(self) -> None:
        if not self.db.in_transaction:
            try:
                self.db.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as e:
                raise StateError.of(self.what, self.path, e) from e

    def commit(self) -> None:
        if not self.db.in_transaction:
            return
        try:
            self.db.execute("COMMIT")
        except sqlite3.Error as e:
            raise StateError.of(self.what, self.path, e) from e

    def close(self) -> None:
        if self.db.in_transaction:
            self.db.execute("COMMIT")
        self.db.close()


__all__ = ["LocalDb"]

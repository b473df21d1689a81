"""What a restore did: an ``Action`` per file (create, fast-forward, merge, replace, skip,
keep, conflict, refuse, wait, error) and the ``RestoreReport`` that holds them, with the
errors and notes; how an error of one file is said.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from syncd.errors import RestoreError
from syncd.restore.remap import Rule


@dataclass
class Action:
    # create | fast-forward | merge | replace | skip | keep | conflict | refuse | wait
    # | error
    action: str
    path: str    # in the target
    source: str  # in the backup
    reason: str
    size: int = 0
    conflict_copy: str | None = None
    # A config file replaced: the local file as it was, kept beside it.
    previous_copy: str | None = None
    # A config file in a dry run: what would change, as a unified diff (local → backup).
    diff: str | None = None
    # A merge: how many bytes of the local file it kept, the backup's lines after them.
    kept: int = 0


@dataclass
class RestoreReport:
    machine: str = ""
    actions: list[Action] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # Said once, not failures: what was done differently than asked (an impossible mtime).
    notes: list[str] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)
    # Restored sessions: id → project path on this machine.
    sessions: dict[str, str] = field(default_factory=dict)
    # Stored paths restored only up to this many of their bytes (the rest was lost).
    cut: dict[bytes, int] = field(default_factory=dict)

    def _paths(self, *kinds: str) -> list[str]:
        return [a.path for a in self.actions if a.action in kinds]

    @property
    def written(self) -> list[str]:
        return self._paths("create", "fast-forward", "merge", "replace")

    @property
    def skipped(self) -> list[str]:
        return self._paths("skip")

    @property
    def refused(self) -> list[str]:
        return self._paths("refuse")

    @property
    def kept(self) -> list[str]:
        return [f"{a.path} ({a.reason})" for a in self.actions if a.action in ("keep", "conflict")]

    @property
    def bytes_written(self) -> int:
        return sum(a.size for a in self.actions
                   if a.action in ("create", "fast-forward", "merge", "replace"))


def _why(e: BaseException) -> str:
    return (e.strerror or str(e)) if isinstance(e, OSError) else str(e)


def _file_error(target: Path, path: bytes, e: BaseException) -> str:
    if isinstance(e, RestoreError):
        return str(e)
    return f"{target}: {os.fsdecode(path)}: {_why(e)}"

"""What a restore is asked to do: ``RestoreOptions`` (the target, the sessions, the point in
time, the rules, and the callbacks by which follow and the daemon's state take part).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from syncd.backup.state import OriginRecord
from syncd.claude import Selection
from syncd.progress import Meter
from syncd.restore.remap import Rule
from syncd.seen import Seen

# A rule the user gave on the command line (``--map``), not one a config or a guess gave.
ASKED = "--map"


@dataclass
class RestoreOptions:
    target: Path
    sessions: tuple[str, ...] = ()
    projects: tuple[str, ...] = ()
    at: float | None = None
    maps: tuple[Rule, ...] = ()
    worktrees: str = "map"  # or "fold": worktree sessions go to the main checkout's folder
    dry_run: bool = False
    local_home: str = field(default_factory=lambda: str(Path.home()))
    # The local Claude tree: the source machine's tree maps to it (None: no such rule).
    local_root: str | None = None
    project_roots: tuple[str, ...] = ()
    conflicts_dir: Path | None = None
    # Copies kept there: at most conflict_copies of one file of one machine and
    # conflict_bytes in all, the oldest going first (the config's keys of those names).
    conflict_copies: int = 8
    conflict_bytes: int = 1 << 30
    # Told the line saying a copy was refused (bigger than conflict_bytes alone), which
    # is also one of the report's errors.
    refused_copy: Callable[[str], None] | None = None
    progress: Meter | None = None  # told the bytes to fetch, then each chunk fetched
    # What this machine backs up: nothing outside it is written, whatever a store holds.
    selection: Selection = field(default_factory=Selection)
    # Also write the user's config files (settings.json, CLAUDE.md, commands/, …).
    config: bool = False
    # Also write other files that carry instructions or code (another machine's project
    # memory, settings inside a project folder).
    instructions: bool = False
    # This machine's id: another machine's project memory counts as instructions.
    local_machine: str | None = None
    # What this host saw of the store before (a backup that ends earlier is reported).
    seen: Seen | None = None
    # Told (path in the target, generation, size, its content: a file or bytes) before
    # each file that holds exactly a generation of this machine's own backup is written
    # into its own tree: ``backup.ship.Provenance``, so the daemon never ships it again.
    record: Callable[[bytes, int, int, Path | bytes], None] | None = None
    # Told (path in the target, the machine, its stored path, generation, size, the
    # content written: a file or bytes) before a file another machine's backup gives whole
    # is written into this machine's tree: recorded as imported from there, the daemon
    # ships it so labelled and that machine never takes it for one of this machine's own.
    record_import: Callable[[bytes, str, bytes, int, int, Path | bytes], None] | None = None
    # Given a local file's path in the target and its stat: a reason to leave it as it is
    # for now (a session being written here: follow), or None.
    leave: Callable[[bytes, os.stat_result], str | None] | None = None
    # A session's lines of history.jsonl go with it (follow leaves that file to Claude).
    history: bool = True
    # Given a stored path and its path in the target: (generation, size, local size) when
    # the local file is exactly that generation's first size bytes remapped, local size
    # bytes long (an earlier import wrote it: follow), else None. Such a file is not
    # fetched when the backup holds no more of it, else only its bytes past those.
    base: Callable[[bytes, bytes], tuple[int, int, int] | None] | None = None
    # A session's earlier copy here, in a place that does not exist here, may move to the
    # one these rules give (``restore/relocation``); follow never moves a local session.
    relocate: bool = True
    # Where a session here came from, as this machine's state knows it (``restore/origin``).
    origin_of: Callable[[str], OriginRecord | None] | None = None
    # Told before a session new here is written, where it came from and the rules used
    # (and, replacing what was told before, of a session it moved).
    record_origin: Callable[[OriginRecord, bool], None] | None = None
    # Given a local file's path in the target: how many of its first bytes this machine
    # has shipped (what another machine can have from its backup; ``merge.Lineage``).
    shipped: Callable[[bytes], int] | None = None

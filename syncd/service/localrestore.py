"""A restore into this machine's tree, as the command line and the web page run it: the
options from the settings, and the state it goes through (what the daemon shipped already,
where sessions came from, and Quiet: a transcript being written here is left alone)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from syncd.backup.ship import open_provenance
from syncd.claude import Selection
from syncd.config import Settings
from syncd.errors import StateError, UsageError
from syncd.follow.quiet import Quiet, as_imported
from syncd.restore.remap import Rule, config_rules, local_target
from syncd.restore.restorer import ASKED, RestoreOptions


def restore_options(settings: Settings, *, target: Path | None, sessions: tuple[str, ...],
                    projects: tuple[str, ...], at: float | None, maps: tuple[str, ...],
                    worktrees: str, dry_run: bool) -> RestoreOptions:
    """What ``syncd restore`` asks: ``--to`` (None: this machine's tree), ``--session``,
    ``--project``, ``--at``, ``--map`` (the config's [remap] after them), ``--worktrees``,
    ``--dry-run``."""
    rules = []
    for m in maps:
        old, sep, new = m.partition("=")
        if not sep or not old or not new:
            raise UsageError(f"--map takes OLD=NEW, got {m!r}")
        rules.append(Rule(old, local_target(new), ASKED))
    rules += config_rules(settings)
    return RestoreOptions(
        target=target or settings.source, sessions=sessions, projects=projects,
        at=at, maps=tuple(rules), worktrees=worktrees,
        dry_run=dry_run, local_root=None if target else str(settings.source),
        project_roots=tuple(settings.project_roots),
        conflicts_dir=settings.state_dir / "conflicts",
        conflict_copies=settings.conflict_copies, conflict_bytes=settings.conflict_bytes,
        selection=Selection(settings.include, settings.exclude),
        local_machine=settings.machine_id)


@contextlib.contextmanager
def provenance(settings: Settings, opts: RestoreOptions,
               notes: list[str]) -> Iterator[None]:
    """A restore into this machine's tree goes through its state: ``opts.record`` tells
    the daemon which restored files hold what it shipped already, ``record_origin`` where
    the sessions new here came from (and ``origin_of`` what it knows of that), ``shipped``
    what of a local file it shipped (the merge asks), and ``leave`` keeps it off a
    transcript being written here, as follow does. A state that cannot take it costs
    bytes shipped again (a note), never the restore."""
    if opts.local_root is None:  # --to DIR: not this machine's tree
        yield
        return
    try:
        prov = open_provenance(settings.state_file, create=True)
    except StateError as e:
        notes.append(f"{e}: the daemon will ship the restored files again")
        prov = None
    if prov is not None:
        opts.record, opts.record_origin = prov.record, prov.record_origin
        opts.record_import = prov.record_import
        opts.origin_of, opts.shipped = prov.origin_of, prov.shipped(os.fsencode(
            settings.source))
    quiet = Quiet(settings.source, settings.follow_quiet, ours=as_imported(
        prov.state, settings.source) if prov is not None and prov.state is not None
        else None)

    def leave(rel: bytes, st: os.stat_result) -> str | None:
        # Transcripts: what a running Claude writes (anything else is only appended to
        # in place, or replaced with a copy kept, as before).
        return quiet(rel, st) if rel.startswith(b"projects/") and rel.endswith(b".jsonl") \
            else None

    opts.leave = leave
    try:
        yield
    finally:
        if prov is not None:
            prov.close()
            if prov.problem:
                notes.append(prov.problem)

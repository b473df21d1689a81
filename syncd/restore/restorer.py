"""Restore: bring a machine's backup (as of a time, whole or some sessions) into a tree.

The plan (``restore/plan``) says which files; they are fetched window by window into a
staging directory (``restore/fetch``), every extent checked against its sha256. Then each
file is remapped to this machine's paths (``restore/rewrite``; a big rewrite in worker
processes), compared with what is already there (``restore/place``, ``restore/merge``) and
written atomically: temp file, fsync, rename (``restore/install``). A new file is made
durable (or rewritten) as soon as its bytes are in, and renamed into place once every
object it has bytes in is read. A failure halfway leaves every existing file as it was; a
local file is never replaced by an older or diverged copy, except a config file asked for
with ``--config``, which is kept beside it first (a diverged copy is saved aside:
``restore/conflicts``).
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

from syncd.duration import format_time
from syncd.errors import BackupError, RestoreError
from syncd.format.catalog import session_of
from syncd.gitinfo import find_clones
from syncd.progress import Meter, NullMeter
from syncd.repository import Repository
from syncd.restore.fetch import Staging, _make_room, _stage
from syncd.restore.mapping import build_remapper
from syncd.restore.options import ASKED, RestoreOptions
from syncd.restore.origin import Pass, origin_record, passes
from syncd.restore.place import Placing, _Placer
from syncd.restore.plan import _bases, _chosen, _collisions, _refuse, _select, _sides, safe_relpath
from syncd.restore.relocation import (
    Moved,
    head_of,
    launch_dir,
    move,
    placed_by,
    plan,
    preview,
    strays,
)
from syncd.restore.remap import Remapper
from syncd.restore.report import Action, RestoreReport, _why
from syncd.restore.rewrite import _rewriters
from syncd.view import Backup, load_backup


def restore_tree(repo: Repository, target: Path,
                 progress: Meter | None = None) -> RestoreReport:
    """The repository machine's whole backup, as it is now, into ``target``, config
    included, restored as that machine (its own project memory is no foreign instruction)."""
    return restore(repo, RestoreOptions(target=target, progress=progress, config=True,
                                        local_machine=repo.machine))


def restore(repo: Repository, opts: RestoreOptions,
            backup: Backup | None = None) -> RestoreReport:
    """Restore the repository machine's backup as ``opts`` say (from ``backup``, that
    machine's view the caller loaded, when given)."""
    if backup is None:
        try:
            # One session (or a few): only their part of the snapshot is read.
            backup = load_backup(repo, opts.at,
                                 sessions=opts.sessions if opts.sessions and not opts.projects
                                 else None, seen=opts.seen)
        except BackupError as e:
            raise RestoreError(str(e)) from None
    # Local clones by git remote: looked for once (a walk and a git call per clone).
    clones = find_clones(list(opts.project_roots)) if opts.project_roots else {}
    plain = build_remapper(backup, opts, clones=clones)
    steps = passes(_chosen(backup, opts, RestoreReport()), backup.machine,
                   target=opts.target, local_machine=opts.local_machine, mapped=plain.path,
                   asked=Remapper(r for r in opts.maps if r.why == ASKED).path,
                   relocate=opts.relocate, origin_of=opts.origin_of)
    whole = not opts.sessions and not opts.projects
    # (The first pass maps with these rules alone when it learned nothing.)
    report = _restore(repo, opts, backup, steps[0], clones,
                      None if steps[0].rules or steps[0].folders else plain)
    for step in steps[1:]:
        # Sessions whose learned rules contradict the first pass's, in a pass of their own
        # (a whole restore's history.jsonl went with the first).
        more = _restore(repo, dataclasses.replace(
            opts, sessions=step.sessions or (), projects=(),
            history=opts.history and not whole), backup, step, clones)
        report.actions += more.actions
        report.errors += [e for e in more.errors if e not in backup.errors]
        report.notes += [n for n in more.notes if n not in report.notes]
        report.rules += [r for r in more.rules if r not in report.rules]
        report.sessions.update(more.sessions)
        report.cut.update(more.cut)
    return report


def _restore(repo: Repository, opts: RestoreOptions, backup: Backup, step: Pass,
             clones: dict[str, str], remap: Remapper | None = None) -> RestoreReport:
    """One pass of ``restore``: its sessions, mapped with what ``step`` learned (``remap``:
    those rules, built already)."""
    machine = repo.machine
    if remap is None:
        remap = build_remapper(backup, opts, step, clones)
    report = RestoreReport(machine=machine, errors=list(backup.errors), rules=remap.rules)
    if opts.at is not None and backup.point is not None:
        seq, t = backup.point
        report.notes.append(f"as of {format_time(t)} (flush {seq}), the last point in time "
                            f"at or before {format_time(opts.at)}")
    files, history_sids = _select(backup, opts, report, step.without)
    _refuse(files, remap, backup, opts, report)
    for s in backup.sessions.values():
        if s.path in files and (cwd := placed_by(s)):
            report.sessions[s.session_id] = remap.path(cwd)
    aside = _collisions(files, remap)
    # Files of sessions that exist here (subagents, tool results, todos, file history,
    # tasks) → that session's transcript: placed once the transcript was, and only when
    # the backup's copy of it continues the local one (a stranger adds no file to a
    # session of this machine).
    sides = _sides(backup, files, remap, opts)
    # Each file's actions, errors and notes, told in path order once all are placed.
    sinks: dict[bytes, RestoreReport] = {}
    # Files whose local copy holds their first bytes (opts.base): the source offset their
    # staged bytes start at, and the local copy's size.
    tails: dict[bytes, tuple[int, int]] = {}
    # Sessions whose earlier copy is in another folder (moved, see _relocate).
    moving = strays(opts.target, {s.session_id: remap.folder(s.folder)
                                  for s in backup.sessions.values() if s.path in files}
                    ) if opts.relocate else {}
    if not moving and opts.base is not None:
        # (With no earlier copy to move: those where the base says are the ones.)
        _bases(files, remap, opts, opts.base, aside, tails, sinks)
    if not opts.dry_run:
        _make_room(opts.target, files)
    staging = Staging(None if opts.dry_run else opts.target)
    placing = Placing(backup, opts, remap, files, history_sids, aside, sides, tails, sinks,
                      staging.path)
    early: _Placer | None = None
    try:
        # Before any other thread of this restore starts.
        placing.rewriters = None if opts.dry_run else _rewriters(files, remap, history_sids)
        # With no earlier copy of a session to move (a new machine, a fresh target), a new
        # file is placed as soon as its bytes are in, while the others are still fetched.
        early = None if moving else _Placer(placing.place_early)
        meter = opts.progress or NullMeter()
        meter.start(sum(f.size - tails.get(p, (0, 0))[0] for p, f in files.items()))
        staged = _stage(repo, files, staging.path, report, meter,
                        None if early is None else early.put,
                        None if early is None or opts.dry_run else placing.prepare_early,
                        {p: start for p, (start, _) in tails.items()})
        if early is not None:
            early.close()
        planned = {} if early is not None else _relocate(backup, staged, remap, opts, report,
                                                         staging.path)
        # A session's transcript before its other files (which wait for its verdict).
        for path in sorted(staged, key=lambda p: (p in sides, p)):
            if path not in sinks:
                placing.place(path, staged[path], planned)
        for path in sorted(sinks):
            sink = sinks[path]
            report.actions += sink.actions
            report.errors += sink.errors
            report.notes += sink.notes
    finally:
        # Nothing may still write into staging when it goes.
        if early is not None:
            early.stop(drop=True)  # after a failure, nothing more is placed
        placing.finish(report)
        staging.close()
    return report


def _relocate(backup: Backup, staged: dict[bytes, Path], remap: Remapper,
              opts: RestoreOptions, report: RestoreReport,
              scratch: Path) -> dict[bytes, Path]:
    """Move a restored session's earlier copy in another project folder to the one these
    rules give (``restore/relocation``); one that cannot move is named in a note. A dry
    run moves nothing: what would move where (place → its copy in ``scratch``) is
    returned, for the plan to compare with as the real run would."""
    planned: dict[bytes, Path] = {}
    wanted: dict[str, str] = {}
    sessions = {s.session_id: s for s in backup.sessions.values() if s.path in staged}
    for sid, s in sessions.items():
        wanted[sid] = remap.folder(s.folder)
    found = strays(opts.target, wanted)
    taken: set[str] = set()
    for sid, olds in found.items():
        s = sessions[sid]
        relocated = s.fields.get("relocated_cwd")
        launched = launch_dir(s.folder, s.project) if s.project else None
        # (A moved session's folder is its relocatedCwd's: its first cwd is its start.)
        start = launched[0] if launched else s.project if relocated else None
        for old in olds:
            where = f"{opts.target}/projects/{old}/{sid}.jsonl"
            moved, why = Moved(), ""
            try:
                m = plan(opts.target, sid, old, wanted[sid], remap.path(start) if start
                         else None, head_of(staged[s.path]), taken,
                         remap.path(relocated) if relocated else None)
                if m.rule is None:
                    report.notes.append(f"session {sid} is also in projects/{old}: {m.why}")
                    continue
                taken.add(m.new)
                why = f"session was in projects/{old}: moved, {m.rule.old} -> {m.rule.new}"
                if opts.dry_run:
                    for place, copy in preview(opts.target, m, scratch).items():
                        planned[place] = copy
                        name = os.fsdecode(place)
                        report.actions.append(Action(
                            "move", name, f"projects/{old}/" + name.split("/", 2)[2], why))
                    continue
                move(opts.target, m, moved)
                if opts.record_origin is not None and moved.files and \
                        backup.machine != opts.local_machine:
                    # Where it is now is where these rules put it.
                    opts.record_origin(origin_record(sid, backup.machine, s.path,
                                                     remap.rules, time.time()), True)
            except (OSError, RestoreError) as e:
                report.errors.append(f"{where}: cannot move it to projects/{wanted[sid]}: "
                                     f"{_why(e)}; " + (f"{len(moved.files)} of its files "
                                     "moved, the rest left there" if moved.files else
                                     "left there"))
            for src, dest in moved.files:
                report.actions.append(Action("move", dest, src, why))
            for left in moved.left:
                report.notes.append(f"{left}: changed while being moved, or its place in "
                                    f"projects/{wanted[sid]} is taken: left there")
    return planned


__all__ = ["ASKED", "Action", "RestoreError", "RestoreOptions", "RestoreReport", "restore",
           "restore_tree", "safe_relpath", "session_of"]

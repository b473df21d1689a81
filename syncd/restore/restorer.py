"""Restore: bring a machine's backup (as of a time, whole or some sessions) into a tree.

Files are fetched window by window (whole objects or byte ranges, two at a time) into a
staging directory, every extent checked against its sha256. Then each file is remapped to
this machine's paths (``restore/remap``; a big rewrite in worker processes), compared with
what is already there (``restore/merge``) and written atomically: temp file, fsync,
rename. A new file is made durable (or rewritten) as soon as its bytes are in, and renamed
into place once every object it has bytes in is read. A failure halfway leaves every existing
file as it was; a local file is never replaced by an older or diverged copy, except a
config file asked for with ``--config``, which is kept beside it first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import gc
import hashlib
import logging
import multiprocessing
import os
import queue
import re
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from syncd.backup.state import OriginRecord
from syncd.claude import (
    STAGING_PREFIX,
    Selection,
    carries_instructions,
    in_git_dir,
    is_never,
    is_user_config,
    project_folder,
    sweep_temps,
    temp_name,
)
from syncd.config import format_time
from syncd.errors import BackupError, FormatError, RestoreError, StoreError
from syncd.format.catalog import Session, session_of
from syncd.format.segment import Extent, check_extent, windows
from syncd.format.snapshot import Entry, has_sid
from syncd.gitinfo import find_clones, normalize_remote, project_info
from syncd.private import create_private, private_dir
from syncd.progress import Meter, NullMeter
from syncd.repository import Repository
from syncd.restore.install import (
    Changed,
    Installer,
    check_parents,
    make_parents,
    unchanged,
)
from syncd.restore.merge import Lineage, decide
from syncd.restore.origin import Pass, origin_record, passes
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
from syncd.restore.remap import CHUNK, LINE_MAX, Remapper, Rule, rewrite_lines
from syncd.restore.userconfig import (
    already_here,
    config_diff,
    install_config,
    remapped,
    restored_mode,
)
from syncd.seen import Seen
from syncd.sibling import is_sibling, owner_of, siblings
from syncd.view import Backup, load_backup

log = logging.getLogger("syncd.restore")

WORKTREE_MARK = "/.claude/worktrees/"
# A rule the user gave on the command line (``--map``), not one a config or a guess gave.
ASKED = "--map"
UNSAFE = "unsafe path: it could leave the target"


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


def safe_relpath(path: bytes) -> bytes:
    """Reject store paths that could escape the target (``..``, absolute, NUL)."""
    parts = path.split(b"/")
    if not path or path.startswith(b"/") or b"\0" in path or any(
            p in (b"", b".", b"..") for p in parts):
        raise RestoreError(f"refusing unsafe path {path!r} from the store")
    return path


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
    for path in sorted(files):
        claim = _overclaim(files[path])
        if claim is not None:
            # Copies of copies (a store's doing, never a writer's) name the same frames
            # over and over: that file alone is refused, the rest restores.
            del files[path]
            report.errors.append(f"refusing {path!r} from the store: {claim}")
            report.actions.append(Action("refuse", os.fsdecode(path), os.fsdecode(path),
                                         claim))
            continue
        why = _refusal(path, remap, backup, opts)
        if why is not None:
            # Listed, never written: what lands in the Claude tree is this machine's call.
            f = files.pop(path)
            if why == CONFIG_ONLY and already_here(os.path.join(
                    os.fsencode(opts.target), _target_rel(path, remap)), f, remap):
                # Nothing to refuse: it is here as the backup has it.
                report.actions.append(Action("skip", os.fsdecode(path), os.fsdecode(path),
                                             "identical"))
                continue
            report.actions.append(Action("refuse", os.fsdecode(path), os.fsdecode(path), why))
            if why.startswith(UNSAFE):  # no writer stores such a name: a damaged backup
                report.errors.append(f"refusing unsafe path {path!r} from the store")
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
        try:
            opts.target.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as e:
            raise RestoreError(f"{opts.target}: cannot create: {e.strerror}") from e
        if not os.access(opts.target, os.W_OK | os.X_OK):
            raise RestoreError(f"{opts.target}: not writable")
        # Sizes are what the backup claims: a disk that cannot hold them is said at once
        # (a file skipped as the last import left it needs nothing).
        need = sum(min(f.size, sum(x.end - x.start for _, x in f.extents))
                   for f in files.values())
        fs = os.statvfs(opts.target)
        if need > fs.f_bavail * fs.f_frsize:
            raise RestoreError(f"{opts.target}: the restore needs {need / 1e6:.1f} MB, the "
                               f"filesystem has {fs.f_bavail * fs.f_frsize / 1e6:.1f} MB free")
        _sweep_staging(opts.target)
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX,
                                    dir=None if opts.dry_run else opts.target))
    # Held while the restore runs: a staging folder nobody holds was left by a restore
    # that was killed (a later one removes it).
    held = os.open(staging / STAGING_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)
    rewriters: ProcessPoolExecutor | None = None
    installer = Installer()
    placed: dict[bytes, Action] = {}
    # Rewrites started as soon as a file's bytes were in: its size then, and the job.
    rewrites: dict[bytes, tuple[int, Future[tuple[Path, int]]]] = {}

    def place(path: bytes, staged: Path, planned: dict[bytes, Path]) -> None:
        sink = sinks[path] = RestoreReport()
        if path in aside:
            _set_aside(staged, path, aside[path], backup, opts, sink)
            return
        if path in sides and _side_left(path, staged, sides[path], sinks, backup, opts,
                                        remap, sink):
            return
        # A sibling is its session's state at the transcript's end: newer with it.
        verdict = _verdict(sides[path], sinks) if path in sides else None
        newer = verdict is not None and verdict.action == "fast-forward" and is_sibling(path)
        try:
            queued = _place_tail(staged, files[path], *tails[path], remap, opts, sink,
                                 installer) if path in tails else \
                _place(staged, files[path], remap, history_sids, backup, opts, sink,
                       installer, planned, rewriters, rewrites.pop(path, None), newer)
        except (RestoreError, OSError, ValueError, OverflowError) as e:
            if isinstance(e, Changed) and opts.leave is not None:
                sink.actions.append(Action("wait", os.fsdecode(_target_rel(path, remap)),
                                           os.fsdecode(path), _why(e)))
                return
            # This file only; the others still restore.
            sink.errors.append(_file_error(opts.target, path, e))
            sink.actions.append(Action("error", os.fsdecode(path), os.fsdecode(path), _why(e)))
            return
        if queued is not None:
            placed[queued[0]] = queued[1]
            sid = session_of(path)
            if sid is not None and queued[1].action == "create" and \
                    opts.record_origin is not None and backup.machine != opts.local_machine:
                # Decided and queued, before the installer's thread makes it appear (the
                # daemon may ship it at once; a flush before the record ships the origin
                # with the session's next bytes).
                opts.record_origin(origin_record(sid, backup.machine, path, remap.rules,
                                                 time.time()), False)

    def new_here(path: bytes) -> bool:
        # Placed early: only a new file (no config, none set aside); one that changes a
        # local file waits for the whole fetch, so a failure halfway leaves every local
        # file as it was.
        return path not in aside and path not in sides and \
            not is_user_config(os.fsdecode(path)) and \
            not os.path.lexists(os.path.join(os.fsencode(opts.target),
                                             _target_rel(path, remap)))

    def place_early(path: bytes) -> None:
        if new_here(path):
            place(path, _staged_path(staging, path), {})

    def prepare_early(path: bytes) -> None:
        # A file that will be placed early (new): made durable as soon as its bytes are
        # written, or rewritten by a worker process, while the others are fetched; once
        # its objects are all read (a failure in its object's last window loses its bytes
        # too), placing it is a rename. Placed otherwise, it is as if not prepared.
        f = files[path]
        if f.sparse or not 0 <= f.mtime_ns <= time.time_ns() + _MTIME_SLACK_NS or \
                not new_here(path):
            return
        staged = _staged_path(staging, path)
        sids = history_sids if path == b"history.jsonl" else None
        if not (_remapped(path) and not remap.identity) and sids is None:
            installer.prepare(os.fsencode(staged), f.mtime_ns)
        elif rewriters is not None and len({key for key, _ in f.extents}) == 1:
            # Rewritten in place: only a file of one object, which a failure later in
            # that object loses whole (one of several would keep its intact prefix, cut
            # at an offset of the bytes as they were).
            size = staged.stat().st_size
            rewrites[path] = (size, rewriters.submit(_rewrite_job, staged, sids, False,
                                                     size <= CHUNK))

    early: _Placer | None = None
    try:
        # Before any other thread of this restore starts.
        rewriters = None if opts.dry_run else _rewriters(files, remap, history_sids)
        # With no earlier copy of a session to move (a new machine, a fresh target), a new
        # file is placed as soon as its bytes are in, while the others are still fetched.
        early = None if moving else _Placer(place_early)
        meter = opts.progress or NullMeter()
        meter.start(sum(f.size - tails.get(p, (0, 0))[0] for p, f in files.items()))
        staged = _stage(repo, files, staging, report, meter,
                        None if early is None else early.put,
                        None if early is None or opts.dry_run else prepare_early,
                        {p: start for p, (start, _) in tails.items()})
        if early is not None:
            early.close()
        planned = {} if early is not None else _relocate(backup, staged, remap, opts, report,
                                                         staging)
        # A session's transcript before its other files (which wait for its verdict).
        for path in sorted(staged, key=lambda p: (p in sides, p)):
            if path not in sinks:
                place(path, staged[path], planned)
        for path in sorted(sinks):
            sink = sinks[path]
            report.actions += sink.actions
            report.errors += sink.errors
            report.notes += sink.notes
    finally:
        # Nothing may still write into staging when it goes.
        if early is not None:
            early.stop(drop=True)  # after a failure, nothing more is placed
        for dest, err in installer.finish():
            act = placed.get(dest)
            if act is not None and isinstance(err, Changed) and opts.leave is not None:
                # Written here meanwhile: left until quiet, as if seen before the decision.
                act.action, act.reason, act.size = "wait", _why(err), 0
                continue
            if act is not None:
                act.action, act.reason, act.size = "error", _why(err), 0
            report.errors.append(f"{os.fsdecode(dest)}: {_why(err)}")
        installer.close()
        if rewriters is not None:
            rewriters.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(staging, ignore_errors=True)
        os.close(held)
    return report


STAGING_LOCK = ".held"
# A staging folder without its lock file (made by an older version, or killed between
# the two) is left alone this long: it may be a restore's that is just starting.
STAGING_STALE = 3600


def _sweep_staging(target: Path) -> None:
    """Remove the staging folders that killed restores left in ``target`` (their files
    are copies of the store's bytes: nothing of the user's)."""
    try:
        names = [e.name for e in os.scandir(target)
                 if e.name.startswith(STAGING_PREFIX) and e.is_dir(follow_symlinks=False)]
    except OSError:
        return
    for name in names:
        d = target / name
        try:
            fd = os.open(d / STAGING_LOCK, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            with contextlib.suppress(OSError):
                if time.time() - os.lstat(d).st_mtime > STAGING_STALE:
                    shutil.rmtree(d, ignore_errors=True)
            continue
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: a restore running now
            os.close(fd)
            continue
        try:
            shutil.rmtree(d, ignore_errors=True)
        finally:
            os.close(fd)


def _collisions(files: dict[bytes, Entry],
                remap: Remapper) -> dict[bytes, tuple[bytes, bytes]]:
    """Stored paths that land where another one does (two folders of one start directory,
    named by two runtimes) → (that place, the stored path placed there: one already at its
    place first, else the first in order). They are saved aside, never written over each
    other."""
    places = {path: _target_rel(path, remap) for path in files}
    claimed: dict[bytes, bytes] = {}
    aside: dict[bytes, tuple[bytes, bytes]] = {}
    for path in sorted(files, key=lambda p: (places[p] != p, p)):
        rel = places[path]
        if rel in claimed:
            aside[path] = (rel, claimed[rel])
        else:
            claimed[rel] = path
    return aside


def _set_aside(staged: Path, path: bytes, where: tuple[bytes, bytes], backup: Backup,
               opts: RestoreOptions, report: RestoreReport) -> None:
    rel, winner = where
    _keep_aside(Action("conflict", os.fsdecode(rel), os.fsdecode(path),
                       f"{os.fsdecode(winner)} of the backup restores to the same place: "
                       "this copy saved aside"), staged, path, backup, opts, report)


def _keep_aside(act: Action, staged: Path, name: bytes, backup: Backup,
                opts: RestoreOptions, report: RestoreReport) -> None:
    """``act``, a conflict: the staged copy saved as a conflict copy under ``name`` (not in
    a dry run); one that cannot be saved is this file's error."""
    if not opts.dry_run:
        try:
            act.conflict_copy = _save_conflict(staged, name, backup.machine, opts)
        except (OSError, RestoreError) as e:
            act.action, act.reason = "error", _why(e)
            report.errors.append(f"{act.source}: cannot save it aside: {_why(e)}")
    report.actions.append(act)


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


CONFIG_ONLY = "user config: restored only with --config"


def _refusal(path: bytes, remap: Remapper, backup: Backup, opts: RestoreOptions) -> str | None:
    """Why a stored path is not written here (None: it may be)."""
    rel = os.fsdecode(path)
    target = _target_rel(path, remap)
    try:
        safe_relpath(path)
        safe_relpath(target)
    except RestoreError:
        return UNSAFE
    # Where it would land is checked as well: the folder a path maps to is this machine's.
    if is_never(rel) or is_never(os.fsdecode(target)):
        return "on the never-upload list: not restored"
    if not opts.selection.wants(rel) or not opts.selection.wants(os.fsdecode(target)):
        return "outside the include set: not restored"
    if is_user_config(rel) and not opts.config:
        return CONFIG_ONLY
    if is_user_config(rel) and not in_git_dir(rel):
        return None
    if not opts.instructions and carries_instructions(
            rel, foreign=backup.machine != opts.local_machine):  # unknown here: foreign
        return "carries instructions or code: restored only with --with-instructions"
    return None


def _why(e: BaseException) -> str:
    return (e.strerror or str(e)) if isinstance(e, OSError) else str(e)


def _file_error(target: Path, path: bytes, e: BaseException) -> str:
    if isinstance(e, RestoreError):
        return str(e)
    return f"{target}: {os.fsdecode(path)}: {_why(e)}"


# -- mapping -------------------------------------------------------------------

def build_remapper(backup: Backup, opts: RestoreOptions, step: Pass | None = None,
                   clones: dict[str, str] | None = None) -> Remapper:
    """Explicit rules, what ``step`` learned of this machine's copies and the sessions'
    origins (``restore/origin``), then git-remote matches (``clones``: the local ones by
    remote, when already looked for) and worktrees, then the Claude tree and home."""
    learned = step or Pass()
    rules: list[Rule] = [*learned.rules, *opts.maps]
    home = backup.info.get("home")
    homes = [Rule(home, opts.local_home, "home")] if isinstance(home, str) else []
    if opts.project_roots:
        if clones is None:
            clones = find_clones(list(opts.project_roots))
        for info in backup.projects.values():
            remote, top = info.get("remote"), info.get("toplevel")
            local = clones.get(normalize_remote(remote)) if remote else None
            if local and top and not any(_under(top, r.old) for r in opts.maps):
                rules.append(Rule(top, local, f"same git remote ({remote})"))
    pre = Remapper([*rules, *homes])
    for info in backup.projects.values():
        main = info.get("main")
        for wt in info.get("worktrees", [])[1:]:
            path = wt.get("path")
            if not main or not path or any(_under(path, r.old) for r in opts.maps):
                continue
            new_main = pre.path(main)
            if opts.worktrees == "fold":
                rules.append(Rule(path, new_main, "worktree folded into its main checkout"))
            elif not _under(path, main):
                local = _local_worktree(new_main, wt.get("branch"))
                if local:
                    rules.append(Rule(path, local, f"worktree of branch {wt.get('branch')}"))
    if opts.worktrees == "fold":
        for s in backup.sessions.values():
            for cwd in (s.project or "", s.fields.get("relocated_cwd") or ""):
                if WORKTREE_MARK in cwd.replace("\\", "/"):
                    main = cwd[: cwd.replace("\\", "/").index(WORKTREE_MARK)]
                    rules.append(Rule(cwd, pre.path(main),
                                      "worktree folded into its main checkout"))
    root = backup.info.get("claude_root")
    if opts.local_root and isinstance(root, str):
        rules.append(Rule(root, opts.local_root, "Claude tree"))
    if isinstance(home, str):
        rules.append(Rule(home, opts.local_home, "home"))
    remap = Remapper(rules)
    return Remapper(remap.rules, {**_folders(backup, remap), **learned.folders})


def _under(path: str, prefix: str) -> bool:
    p, q = path.replace("\\", "/").rstrip("/"), prefix.replace("\\", "/").rstrip("/")
    return p == q or p.startswith(q + "/")


def _local_worktree(main: str, branch: str | None) -> str | None:
    if not branch:
        return None
    info = project_info(main)
    for wt in (info or {}).get("worktrees", []):
        if wt.get("branch") == branch:
            return str(wt["path"])
    return None


def _launched(s: Session) -> tuple[str, str] | None:
    """The directory ``s``'s folder is named by, and how (``relocation.launch_dir``): its
    last relocatedCwd's, which Claude derives the folder from, else its start's."""
    cwd = placed_by(s)
    found = launch_dir(s.folder, cwd) if cwd else None
    if found is None and s.fields.get("relocated_cwd"):
        return s.fields["relocated_cwd"], "exact"
    return found


def _folders(backup: Backup, remap: Remapper) -> dict[str, str]:
    """Old project folder → new one, only where the rules move the start directory."""
    folders: dict[str, str] = {}
    for s in sorted(backup.sessions.values(), key=lambda s: s.path):
        found = _launched(s)
        if found is not None and s.folder not in folders:
            start, how = found
            moved = remap.path(start)
            # Named by this machine's rule, also where the path stays (a variant name is
            # where this CLI never looks); but a long name's other hash suffix stays where
            # the path does: Claude finds it by its prefix, which does not say whether the
            # start was this directory or one above.
            folders[s.folder] = s.folder if how == "prefix" and moved == start else \
                project_folder(moved)
    prefixes = [(project_folder(r.old), project_folder(r.new)) for r in remap.rules]
    for path in backup.files:
        parts = path.split(b"/")
        if len(parts) < 3 or parts[0] != b"projects":
            continue
        name = os.fsdecode(parts[1])
        if name in folders:
            continue
        for old, new in prefixes:
            if len(name) <= 200 and (name == old or name.startswith(old + "-")):
                folders[name] = new + name[len(old):]
                break
    return folders


# -- selection -------------------------------------------------------------------

def _chosen(backup: Backup, opts: RestoreOptions, report: RestoreReport) -> list[Session]:
    """The sessions a restore writes: those asked for, or all of them."""
    if not opts.sessions and not opts.projects:
        return list(backup.sessions.values())
    chosen: list[Session] = []
    for sid in opts.sessions:
        s = backup.find_session(sid)
        if s is None:
            raise RestoreError(f"session {sid} is not in machine {backup.machine!r}'s backup")
        chosen.append(s)
    home_only = Remapper([Rule(str(backup.info.get("home", "")), opts.local_home)]
                         if backup.info.get("home") else [])
    for want in opts.projects:
        found = [s for s in backup.sessions.values() if any(
            _under(p, want) or _under(home_only.path(p), want) for p in s.places)]
        if not found:
            # As for an unknown --session: nothing is planned (history lines included).
            raise RestoreError(f"no project in machine {backup.machine!r}'s backup matches "
                               f"{want} (syncd sessions lists them)")
        chosen.extend(found)
    return chosen


def _session_files(chosen: list[Session]) -> Callable[[bytes], bool]:
    """Whether a stored path is one of ``chosen``'s files (transcript, its siblings, its
    folder, its todos, file history and tasks)."""
    prefixes = []
    for s in chosen:
        folder = s.path.rsplit(b"/", 1)[0]
        raw = s.session_id.encode()
        prefixes += [folder + b"/" + raw + b"/", b"todos/" + raw + b"-",
                     b"file-history/" + raw + b"/", b"tasks/" + raw + b"/"]
    paths = {p for s in chosen for p in (s.path, *siblings(s.path))}
    starts = tuple(prefixes)
    return lambda p: p in paths or p.startswith(starts)


# A file whose extents reach more than this many times the raw bytes of the distinct
# frames they are parts of, plus OVERCLAIM_SLACK, is no writer's: a writer's copies name
# each shipped byte about once (a patch of a file of repeated lines a few times), and no
# transcript comes near the slack.
OVERCLAIM_RATIO = 16
OVERCLAIM_SLACK = 64 << 20


def _overclaim(f: Entry) -> str | None:
    """Why ``f``'s bytes are refused unfetched (None: they are not)."""
    reach = sum(x.end - x.start for _, x in f.extents)
    if reach <= OVERCLAIM_SLACK:
        return None
    distinct = sum({(k, x.off): x.raw for k, x in f.extents}.values())
    if reach <= OVERCLAIM_RATIO * distinct + OVERCLAIM_SLACK:
        return None
    return (f"its copies claim {reach} bytes made of {distinct} bytes of frames, named over "
            "and over (no writer makes that)")


def _select(backup: Backup, opts: RestoreOptions, report: RestoreReport,
            without: frozenset[str] = frozenset()
            ) -> tuple[dict[bytes, Entry], set[str] | None]:
    """The files to restore (but those of the sessions ``without``, which another pass
    restores), and the sessions whose history lines to keep (None: all)."""
    chosen = _chosen(backup, opts, report)
    left = [s for s in chosen if s.session_id in without]
    if not opts.sessions and not opts.projects:
        theirs = _session_files(left)
        return {p: f for p, f in backup.files.items() if not left or not theirs(p)}, None
    chosen = [s for s in chosen if s.session_id not in without]
    sids = {s.session_id for s in chosen}
    ours = _session_files(chosen)
    files = {p: f for p, f in backup.files.items() if ours(p)}
    if b"history.jsonl" in backup.files and opts.history:
        files[b"history.jsonl"] = _history_of(backup.files[b"history.jsonl"], sids)
    return files, sids


def _history_of(h: Entry, sids: set[str]) -> Entry:
    """history.jsonl with only the frames that hold lines of ``sids`` (and those whose
    sessions are not known), as a sparse file. A history with a gap is restored whole
    (its intact prefix), so offsets past the gap never decide a sparse file's size."""
    if not h.sids or _first_gap(h) is not None:
        return h
    keep = [(k, x) for k, x in h.extents
            if (ids := h.sids.get((k, x.off))) is None or any(has_sid(ids, s) for s in sids)]
    return dataclasses.replace(h, extents=keep, sparse=len(keep) < len(h.extents))


# -- fetching --------------------------------------------------------------------

# Windows fetched at once. Each holds at most one window (SPAN) and two frames in memory
# (one decoded, one that parts of it are cut from), whatever the store holds; their GETs
# overlap, and zstd and sha256, which let go of the GIL, run on every core.
FETCHERS = 2


@dataclass
class _Fetched:
    """What fetching one window of an object met, replayed in order once all are in."""
    damaged: list[tuple[Extent, FormatError]] = field(default_factory=list)
    failed: FormatError | StoreError | None = None


class _Placer:
    """Places files, in a thread of its own, as they are told (a file whose bytes are all
    staged) while the others are still being fetched."""

    def __init__(self, place: Callable[[bytes], None]) -> None:
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._dropped = False
        self._thread = threading.Thread(target=self._run, args=(place,), daemon=True,
                                        name="syncd-place")
        self._thread.start()

    def put(self, path: bytes) -> None:
        self._queue.put(path)

    def _run(self, place: Callable[[bytes], None]) -> None:
        while (path := self._queue.get()) is not None:
            if self._error is None and not self._dropped:
                try:
                    place(path)
                except BaseException as e:  # raised again by close, in the caller's thread
                    self._error = e

    def stop(self, drop: bool = False) -> None:
        """Wait until every file told so far is placed, or (``drop``) until the one being
        placed is; once: again does nothing."""
        self._dropped = self._dropped or drop
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def close(self) -> None:
        self.stop()
        if self._error is not None:
            raise self._error


# Staged files are spread over this many subdirectories of the staging directory: the
# fetching threads make them as their first bytes come, and files made at once in one
# directory contend for its lock.
STAGING_DIRS = 16


def _staged_path(staging: Path, path: bytes) -> Path:
    name = hashlib.sha256(path).hexdigest()
    return staging / name[0] / name


def _stage(repo: Repository, files: dict[bytes, Entry], staging: Path,
           report: RestoreReport, meter: Meter,
           ready: Callable[[bytes], None] | None = None,
           written: Callable[[bytes], None] | None = None,
           tails: dict[bytes, int] | None = None) -> dict[bytes, Path]:
    """Fetch every file into ``staging``; returns those that arrived, whole or as the
    intact prefix of a transcript whose later bytes are lost (cut at a line end).

    ``ready`` is told (from a fetching thread) of each file as soon as all its bytes are
    staged, when nothing of it was lost: it may be placed before the others arrive.
    ``written`` is told of each file as soon as its last byte is written, when nothing of
    it was lost so far (a window of one of its objects may still fail). ``tails``: files
    fetched from a byte on (their local copy holds the bytes before it), staged from there;
    one of them that loses a byte is not restored."""
    tails = tails or {}
    by_key: dict[str, list[tuple[Entry, Extent]]] = {}
    # Per file: the first byte lost (a gap, a damaged frame, an unreadable object) and why.
    lost: dict[bytes, tuple[int, int, str]] = {}

    def lose(f: Entry, start: int, end: int, why: str) -> None:
        if f.path not in lost or start < lost[f.path][0]:
            lost[f.path] = (start, end, why)

    for f in files.values():
        base = tails.get(f.path, 0)
        if not f.sparse:
            gap = _first_gap(f, base)
            if gap is not None:
                lose(f, *gap)
        for key, ext in f.extents:
            # Not past a point-in-time size, nor before a tail.
            if (ext.start < f.size or ext.start == 0) and (not base or ext.end > base):
                by_key.setdefault(key, []).append((f, ext))
    names = {p: _staged_path(staging, p) for p in files}
    owners = {key: {id(x): f for f, x in wanted} for key, wanted in by_key.items()}
    runs: dict[str, list[list[Extent]]] = {}
    for key in sorted(by_key):
        where = repo.where(key)
        good, bad = [], []
        for x in sorted((x for _, x in by_key[key]), key=lambda e: e.off):
            try:
                check_extent(x, where)
                good.append(x)
            except FormatError:
                bad.append(x)
        # The windows read_extents would take, one job each: the same GETs.
        runs[key] = ([bad] if bad else []) + [run for run, _ in windows(good)]
    # A file is ready once every object it has bytes in was read without a fault (one that
    # fails loses all its extents, as when it was read in one go), none of its frames was
    # damaged, and it has no gap.
    lock = threading.Lock()
    jobs_left = {key: len(rs) for key, rs in runs.items()}
    failed_keys: set[str] = set()
    faulty = set(lost)
    keys_left: dict[bytes, int] = {}
    paths_of: dict[str, set[bytes]] = {}
    for key, wanted in by_key.items():
        paths_of[key] = {f.path for f, _ in wanted}
        for path in paths_of[key]:
            keys_left[path] = keys_left.get(path, 0) + 1
    made: set[bytes] = set()
    # Per file: its extents not yet written.
    unwritten: dict[bytes, int] = {}
    for wanted in by_key.values():
        for f, _ in wanted:
            unwritten[f.path] = unwritten.get(f.path, 0) + 1

    def fetch(key: str, run: list[Extent]) -> _Fetched:
        got, owner = _Fetched(), owners[key]
        try:
            for x, data in repo.read_extents(key, run, lambda x, e: got.damaged.append((x, e))):
                f = owner[id(x)]
                # At its offset: a file's extents can come from objects in any order. The
                # file is made by whichever window reaches it first, while the other
                # fetches (made up front, one at a time, they delayed the first GET).
                fd = os.open(names[f.path], os.O_RDWR | os.O_CREAT, 0o600)
                base = tails.get(f.path, 0)
                cut = max(0, base - x.start)
                try:
                    _pwrite_all(fd, memoryview(data)[cut : max(cut, f.size - x.start)],
                                x.start + cut - base)
                finally:
                    os.close(fd)
                with lock:
                    made.add(f.path)
                    meter.advance(len(data))
                    # All written: none of its extents was damaged (those are never
                    # written); a gap would have made it faulty from the start.
                    unwritten[f.path] -= 1
                    whole = unwritten[f.path] == 0 and f.path not in faulty
                if whole and written is not None:
                    written(f.path)
        except (FormatError, StoreError) as e:
            got.failed = e
        with lock:
            faulty.update(owner[id(x)].path for x, _ in got.damaged)
            if got.failed is not None:
                failed_keys.add(key)
            jobs_left[key] -= 1
            if jobs_left[key] == 0 and key not in failed_keys:
                for path in paths_of[key]:
                    keys_left[path] -= 1
                    if keys_left[path] == 0 and path not in faulty and ready is not None:
                        ready(path)
        return got

    pool = ThreadPoolExecutor(FETCHERS, thread_name_prefix="syncd-fetch")
    try:
        for d in range(STAGING_DIRS):
            (staging / f"{d:x}").mkdir(mode=0o700)
        jobs = {key: [pool.submit(fetch, key, run) for run in rs] for key, rs in runs.items()}
        for key, futures in jobs.items():
            wanted = by_key[key]
            # As one reader of the object in offset order would have met them: damaged
            # frames, up to the first window that failed; then all of its extents lost.
            for fut in futures:
                got = fut.result()
                for x, err in got.damaged:
                    lose(owners[key][id(x)], x.start, x.end, str(err))
                if got.failed is not None:
                    report.errors.append(str(got.failed))
                    for f, x in wanted:
                        lose(f, x.start, x.end, f"{key}: unreadable")
                    break
        # Those no window reached: empty files, and those whose every extent was lost.
        for path, name in names.items():
            if path not in made:
                os.close(os.open(name, os.O_WRONLY | os.O_CREAT, 0o600))
    except OSError as e:
        raise RestoreError(f"{staging}: cannot write: {e.strerror}") from e
    finally:
        # Nothing may still write into staging when it is read or goes.
        pool.shutdown(wait=True, cancel_futures=True)
    try:
        for path, (start, end, why) in lost.items():
            f = files[path]
            cut = _intact_prefix(names[path], start) if _by_lines(f) and \
                path not in tails else 0
            report.errors.append(
                f"{why}: bytes {start}..{end} of {os.fsdecode(path)} (generation {f.gen}) are "
                "lost; " + (f"restored its first {cut} bytes (whole lines)" if cut
                            else "not restored"))
            if cut:
                os.truncate(names[path], cut)
                files[path] = dataclasses.replace(f, size=cut)
                report.cut[path] = cut
            else:
                del names[path]
    except OSError as e:
        raise RestoreError(f"{staging}: cannot write: {e.strerror}") from e
    return names


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    # A write into a filling disk is short first; the next one says ENOSPC.
    while data:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


def _first_gap(f: Entry, pos: int = 0) -> tuple[int, int, str] | None:
    """The first range of ``f``'s bytes (from ``pos`` on) that no extent holds: (start,
    end, why)."""
    for key, e in sorted(f.extents, key=lambda ke: ke[1].start):
        if e.end <= pos:
            continue
        if e.start > pos:
            return pos, e.start, f"{key}: a gap before this object's extent"
        pos = max(pos, e.end)
        if pos >= f.size:
            return None
    last = f.extents[-1][0] if f.extents else "the backup"
    return (pos, f.size, f"{last}: the backup ends early") if pos < f.size else None


def _by_lines(f: Entry) -> bool:
    """Files whose intact prefix is worth restoring: JSON lines, cut at a line end."""
    return not f.sparse and f.path.endswith(b".jsonl")


def _intact_prefix(staged: Path, end: int) -> int:
    """The length of the staged file's whole lines before byte ``end``."""
    with open(staged, "rb") as fh:
        pos = end
        while pos > 0:
            start = max(0, pos - (1 << 20))
            fh.seek(start)
            cut = fh.read(pos - start).rfind(b"\n")
            if cut >= 0:
                return start + cut + 1
            pos = start
    return 0


# -- placing ---------------------------------------------------------------------

def _kind(rel: bytes) -> str:
    if rel == b"history.jsonl":
        return "history"
    if rel.startswith(b"projects/") and rel.endswith(b".jsonl"):
        return "transcript"
    return "file"


def _remapped(rel: bytes) -> bool:
    """Files whose paths are rewritten: transcripts, history, projects' JSON metadata, and
    saved tool output (its preview in the transcript is rewritten too)."""
    return rel == b"history.jsonl" or (rel.startswith(b"projects/") and (
        rel.endswith((b".jsonl", b".json")) or b"/tool-results/" in rel))


def _target_rel(rel: bytes, remap: Remapper) -> bytes:
    parts = rel.split(b"/")
    if len(parts) >= 3 and parts[0] == b"projects":
        parts[1] = os.fsencode(remap.folder(os.fsdecode(parts[1])))
    return b"/".join(parts)


_HISTORY_SID = re.compile(rb'"sessionId"\s*:\s*"([^"]+)"')


def _filter_history(data: bytes, sids: set[str]) -> bytes:
    wanted = {s.encode() for s in sids}
    # A sparse history has holes (zero bytes) before the frames that were fetched.
    keep = [line.lstrip(b"\0") for line in data.split(b"\n")
            if (m := _HISTORY_SID.search(line)) and m.group(1) in wanted]
    return b"".join(line + b"\n" for line in keep)


def _place(staged: Path, f: Entry, remap: Remapper, history_sids: set[str] | None,
           backup: Backup, opts: RestoreOptions, report: RestoreReport,
           installer: Installer, planned: dict[bytes, Path],
           rewriters: ProcessPoolExecutor | None = None,
           rewriting: tuple[int, Future[tuple[Path, int]]] | None = None,
           newer: bool = False) -> tuple[bytes, Action] | None:
    """Decide and hand ``f`` to the installer; its action is reported only once decided.

    ``rewriting``: the staged file's size when its rewrite by ``rewriters`` (as
    ``_rewrite_job`` whole when small, not sparse) was started, and that job. ``newer``:
    a sibling whose session's transcript here the backup's continues (it replaces the
    local one rather than diverging from it).

    Returns the destination and the action when a write was queued (its failure, known
    later, turns the action into an error)."""
    src = os.fsdecode(f.path)
    # A staged file being rewritten has the size it had before.
    size = staged.stat().st_size if rewriting is None else rewriting[0]
    if size != f.size and not (f.sparse and size <= f.size):
        raise RestoreError(f"{src}: assembled {size} bytes, expected {f.size}")
    rel = _target_rel(f.path, remap)
    safe_relpath(rel)
    dest = os.path.join(os.fsencode(opts.target), rel)
    if rel in planned:  # a dry run: compared with what a move would have put there
        dest = os.fsencode(planned[rel])
    check_parents(opts.target, rel, installer.known)
    try:
        st: os.stat_result | None = os.lstat(dest)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        report.actions.append(Action("keep", os.fsdecode(rel), src,
                                     "local is not a regular file"))
        return None
    mtime_ns = _sane_mtime(f, report)
    if is_user_config(os.fsdecode(f.path)):
        _place_config(staged, f, dest, rel, st, mtime_ns, remap, backup.machine, opts, report)
        return None
    sids = history_sids if f.path == b"history.jsonl" else None
    transform = (_remapped(f.path) and not remap.identity) or sids is not None
    if st is None and transform and rewriters is not None and not opts.dry_run:
        # Nothing local: rewritten by a worker process, as below (whole when small, else
        # a chunk of lines at a time), while an installer thread waits for it.
        act = Action("create", os.fsdecode(rel), src, "not present locally", size)
        make_parents(opts.target, rel, installer.known)
        whole = size <= CHUNK
        holes = f.sparse if whole else sids is not None and f.sparse

        def rewrite(staged: Path = staged, pool: ProcessPoolExecutor = rewriters) -> bytes:
            job = rewriting[1] if rewriting is not None else \
                pool.submit(_rewrite_job, staged, sids, holes, whole)
            out, act.size = job.result()
            return os.fsencode(out)

        installer.produce(rewrite, dest, mtime_ns, size if whole else CHUNK + LINE_MAX)
        report.actions.append(act)
        return dest, act
    if st is None and transform and size <= CHUNK:
        # Nothing local, small: rewritten in memory, written by the installer's threads
        # while the next file is rewritten.
        data = _lines_out(staged.read_bytes().replace(b"\0", b"") if f.sparse
                          else staged.read_bytes(), remap, sids)
        act = Action("create", os.fsdecode(rel), src, "not present locally", len(data))
        if not opts.dry_run:
            make_parents(opts.target, rel, installer.known)
            installer.write(data, dest, mtime_ns)
        report.actions.append(act)
        return dest, act
    if st is None and transform:
        # Nothing local, big: rewritten a chunk of lines at a time (a file's size never
        # decides memory) by an installer thread, while the next file is placed.
        act = Action("create", os.fsdecode(rel), src, "not present locally", size)
        if not opts.dry_run:
            make_parents(opts.target, rel, installer.known)

            def rewritten(staged: Path = staged) -> bytes:
                out, act.size = _rewrite(staged, f, remap, history_sids)
                return os.fsencode(out)

            installer.produce(rewritten, dest, mtime_ns, CHUNK + LINE_MAX)
        report.actions.append(act)
        return dest, act
    if transform:
        staged, size = _rewrite(staged, f, remap, history_sids) if rewriting is None \
            else rewriting[1].result()
    # What is written is the backup's generation as it is (nothing rewritten).
    as_is = f if not transform and not f.sparse else None
    if st is None:
        # The common case, streamed: nothing local.
        act = Action("create", os.fsdecode(rel), src, "not present locally", size)
        if not opts.dry_run:
            make_parents(opts.target, rel, installer.known)
            _record(opts, backup.machine, rel, as_is, staged)
            installer.rename(os.fsencode(staged), dest, mtime_ns)
        report.actions.append(act)
        return dest, act
    if max(size, st.st_size) > MERGE_MAX:
        return _place_big(staged, dest, rel, src, st, mtime_ns, backup, opts, report,
                          installer, as_is, _lineage(f.path, rel, backup, opts)
                          if _kind(f.path) == "transcript" else None)
    data = staged.read_bytes()
    with open(dest, "rb") as fh:
        local = fh.read()
    d = decide(_kind(f.path), local, data, _lineage(f.path, rel, backup, opts))
    if _left(opts, rel, st, d.action, report, src):
        return None
    if (d.conflict or d.action == "merge") and (newer or _supersedes(f, rel, st, opts)):
        act = Action("replace", os.fsdecode(rel), src, "newer, as its transcript is"
                     if newer else "a newer generation of what the last import wrote here",
                     len(data))
        if not opts.dry_run:
            installer.write(data, dest, mtime_ns, expect=st)
        report.actions.append(act)
        return dest, act
    # A skip's size: the local bytes found identical (a line written here since is not).
    act = Action(d.action, os.fsdecode(rel), src, d.reason,
                 len(local) if d.action == "skip" else len(d.content or b""))
    if d.action == "merge":
        act.kept = len(local)
    if opts.dry_run or (d.content is None and not d.conflict):
        report.actions.append(act)
        return None
    if d.conflict:
        act.conflict_copy = _save_conflict(data, rel, backup.machine, opts)
    if d.content is None:
        report.actions.append(act)
        return None
    unchanged(dest, st)
    if d.action == "fast-forward":
        _record(opts, backup.machine, rel, as_is, d.content)
    # A fast-forward or a merge keeps every local byte first: only what follows them is
    # written, at the end of the same file.
    assert d.content.startswith(local)
    installer.append(d.content[len(local):], dest,
                     mtime_ns if d.action == "fast-forward" else time.time_ns(), st)
    report.actions.append(act)
    return dest, act


def _supersedes(f: Entry, rel: bytes, st: os.stat_result, opts: RestoreOptions) -> bool:
    """Whether ``f``, a sibling Claude rewrites whole or a transcript its machine cut or
    rewrote (a withdrawn row, a compaction), is a newer generation of the one the last
    import from that machine wrote here, still as that import left it (follow's
    ``opts.base`` vouches): it replaces it, not a divergence (nor a merge that would keep
    the rows that machine withdrew)."""
    if opts.base is None or not (is_sibling(f.path) or _kind(f.path) == "transcript"):
        return False
    known = opts.base(f.path, rel)
    return known is not None and known[0] < f.gen and known[2] == st.st_size


def _left(opts: RestoreOptions, rel: bytes, st: os.stat_result, action: str,
          report: RestoreReport, src: str) -> bool:
    """Whether a local file that ``action`` would change (or save a conflict copy of: it
    may be more than what was compared) is left as it is for now (``opts.leave``: being
    written here); said as a "wait" action."""
    busy = None if opts.leave is None or action not in ("fast-forward", "merge", "conflict") \
        else opts.leave(rel, st)
    if busy is not None:
        report.actions.append(Action("wait", os.fsdecode(rel), src, busy))
    return busy is not None


# A transcript's verdicts that let its session's other files in: its copy here is, or
# now continues, the backup's.
CONTINUING = ("create", "fast-forward", "merge", "skip", "keep")


def _sides(backup: Backup, files: dict[bytes, Entry], remap: Remapper,
           opts: RestoreOptions) -> dict[bytes, bytes]:
    """The files of sessions that exist here and did not come from the backup's machine
    (the backup is not this machine's own), and the siblings of those that did (a
    sibling is the session's state at the transcript's end: it goes in only with the
    transcript's lines): file → its session's transcript."""
    if backup.machine == opts.local_machine:
        return {}
    root = os.fsencode(opts.target)
    here: dict[str, Session] = {}
    kin: dict[str, Session] = {}  # came from that machine: only their siblings wait
    for s in backup.sessions.values():
        if s.path not in files or not os.path.lexists(
                os.path.join(root, _target_rel(s.path, remap))):
            continue
        rec = opts.origin_of(s.session_id) if opts.origin_of is not None else None
        (here if rec is None or rec.machine != backup.machine else kin)[s.session_id] = s
    if not here and not kin:
        return {}
    # One pass over the files: each is looked for among the sessions its path names.
    theirs = {sid: _session_files([s]) for sid, s in (here | kin).items()}
    out: dict[bytes, bytes] = {}
    for p in files:
        sid = _session_named(p) or ""
        owner = here.get(sid) or (kin.get(sid) if is_sibling(p) else None)
        if owner is not None and p != owner.path and theirs[owner.session_id](p):
            out[p] = owner.path
    return out


def _session_named(path: bytes) -> str | None:
    """The session a stored path may belong to, by ``_session_files``' rules: under
    projects/, as ``sibling.owner_of`` says; a todo's name (an id and "-"), a folder of
    file-history/ or tasks/ (session ids are UUIDs: 36 characters)."""
    parts = path.split(b"/")
    if parts[0] == b"todos" and len(parts) == 2:
        return parts[1][:36].decode("ascii", "replace")
    if parts[0] in (b"file-history", b"tasks") and len(parts) > 2:
        return parts[1].decode("ascii", "replace")
    return owner_of(path)


def _side_left(path: bytes, staged: Path, transcript: bytes,
               sinks: dict[bytes, RestoreReport], backup: Backup, opts: RestoreOptions,
               remap: Remapper, report: RestoreReport) -> bool:
    """Whether a file of a session that exists here is kept out (saved aside as a conflict
    copy, or left waiting with its transcript) because the backup's copy of the session's
    transcript does not continue the local one; said in ``report``."""
    verdict = _verdict(transcript, sinks)
    if verdict is not None and verdict.action in CONTINUING:
        return False
    rel = _target_rel(path, remap)
    if verdict is not None and verdict.action == "wait":
        report.actions.append(Action("wait", os.fsdecode(rel), os.fsdecode(path),
                                     "its session's transcript is being written here"))
        return True
    _keep_aside(Action("conflict", os.fsdecode(rel), os.fsdecode(path),
                       "a file of a session of this machine that the backup's copy does "
                       "not continue: saved as a conflict copy"), staged, rel, backup, opts,
                report)
    return True


def _verdict(transcript: bytes, sinks: dict[bytes, RestoreReport]) -> Action | None:
    """What this restore decided for ``transcript`` (None: nothing yet)."""
    return next((a for a in sinks[transcript].actions if a.source == os.fsdecode(
        transcript)), None) if transcript in sinks else None


def _lineage(path: bytes, rel: bytes, backup: Backup, opts: RestoreOptions) -> Lineage:
    """What vouches that the backup's copy of ``path`` continues the local one (``rel``)."""
    sid = owner_of(path)
    rec = opts.origin_of(sid) if opts.origin_of is not None and sid is not None else None
    return Lineage(trusted=backup.machine == opts.local_machine or (
                       rec is not None and rec.machine == backup.machine),
                   shipped=opts.shipped(rel) if opts.shipped is not None else 0)


def _bases(files: dict[bytes, Entry], remap: Remapper, opts: RestoreOptions,
           base: Callable[[bytes, bytes], tuple[int, int, int] | None],
           aside: dict[bytes, tuple[bytes, bytes]], tails: dict[bytes, tuple[int, int]],
           sinks: dict[bytes, RestoreReport]) -> None:
    """The files whose local copy ``base`` vouches for: skipped, unfetched, when the backup
    holds no more of them (taken out of ``files``, told in ``sinks``); a transcript whose
    copy ends a line is fetched from there on (``tails``)."""
    for path in sorted(files):
        f = files[path]
        if f.sparse or path in aside or is_user_config(os.fsdecode(path)):
            continue
        rel = _target_rel(path, remap)
        known = base(path, rel)
        if known is None or known[0] != f.gen or not 0 < known[1] <= f.size or known[2] <= 0:
            continue
        if known[1] == f.size:
            del files[path]
            # Its size: the bytes vouched for (a line written here since is not).
            sinks[path] = RestoreReport(actions=[Action(
                "skip", os.fsdecode(rel), os.fsdecode(path), "as the last import left it",
                known[2])])
        elif _kind(path) == "transcript" and _ends_line(
                os.path.join(os.fsencode(opts.target), rel), known[2]):
            tails[path] = (known[1], known[2])


def _ends_line(path: bytes, size: int) -> bool:
    """Whether byte ``size`` - 1 of the file ``path`` ends a line (lines after it can then
    be remapped alone)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return os.pread(fd, 1, size - 1) == b"\n"
    except OSError:
        return False
    finally:
        os.close(fd)


def _place_tail(staged: Path, f: Entry, start: int, local_size: int, remap: Remapper,
                opts: RestoreOptions, report: RestoreReport,
                installer: Installer) -> tuple[bytes, Action] | None:
    """``f``'s bytes from ``start`` on (staged), remapped after the local copy of its first
    ``start`` bytes (``local_size`` long): a fast-forward fetched from where the copy ends."""
    src = os.fsdecode(f.path)
    size = staged.stat().st_size
    if size != f.size - start:
        raise RestoreError(f"{src}: assembled {size} bytes from byte {start}, expected "
                           f"{f.size - start}")
    with open(staged, "rb") as fh:
        if fh.read(1) != b"{":  # a transcript's lines are JSON objects
            raise RestoreError(f"{src}: byte {start} does not start a line; fetched whole "
                               "next time")
    rel = _target_rel(f.path, remap)
    safe_relpath(rel)
    dest = os.path.join(os.fsencode(opts.target), rel)
    check_parents(opts.target, rel, installer.known)
    try:
        st = os.lstat(dest)
    except FileNotFoundError:
        st = None
    if st is None or not stat.S_ISREG(st.st_mode) or st.st_size != local_size:
        raise Changed.at(dest)
    busy = None if opts.leave is None else opts.leave(rel, st)
    if busy is not None:
        report.actions.append(Action("wait", os.fsdecode(rel), src, busy))
        return None
    mtime_ns = _sane_mtime(f, report)
    act = Action("fast-forward", os.fsdecode(rel), src, "appended since the last import")
    if opts.dry_run:
        report.actions.append(act)
        return None
    out = staged.with_name(staged.name + ".out")
    with open(staged, "rb") as tail, os.fdopen(create_private(os.fsencode(out), os.O_EXCL),
                                               "wb") as fh:
        rewrite_lines(tail, fh.write, lambda text: _lines_out(text, remap, None))
        act.size = local_size + fh.tell()
    # Written after the local copy's bytes, in place (a descriptor held open keeps working).
    installer.append(out, dest, mtime_ns, st)
    report.actions.append(act)
    return dest, act


def _record(opts: RestoreOptions, machine: str, rel: bytes, f: Entry | None,
            content: Path | bytes) -> None:
    """Before ``content`` becomes ``rel``: tell ``opts.record`` when it is generation ``f``
    of this machine's own backup as it is (None: rewritten), written into its own tree."""
    if opts.record is not None and f is not None and opts.local_root is not None and \
            machine == opts.local_machine:
        opts.record(rel, f.gen, f.size, content)


# Two copies of a file bigger than this are compared as streams, not merged in memory.
MERGE_MAX = 64 << 20


def _place_config(staged: Path, f: Entry, dest: bytes, rel: bytes, st: os.stat_result | None,
                  mtime_ns: int, remap: Remapper, machine: str, opts: RestoreOptions,
                  report: RestoreReport) -> None:
    """A config file, asked for with ``--config``: the backup's copy (paths remapped)
    replaces the local one, which is kept beside it; a dry run shows the diff."""
    src = os.fsdecode(f.path)
    if max(f.size, st.st_size if st else 0) > MERGE_MAX:
        raise RestoreError(f"{src}: {max(f.size, st.st_size if st else 0)} bytes: too big "
                           "for a config file; not restored")
    raw = staged.read_bytes()
    data = remapped(raw, remap)
    local = None
    if st is not None:
        with open(dest, "rb") as fh:
            local = fh.read()
    if local == data:
        report.actions.append(Action("skip", os.fsdecode(rel), src, "identical"))
        return None
    act = Action("create" if local is None else "replace", os.fsdecode(rel), src,
                 "not present locally" if local is None else
                 "differs from the backup: local kept beside it", len(data))
    if opts.dry_run:
        act.diff = config_diff(os.fsdecode(rel), local, data)
        report.actions.append(act)
        return None
    unchanged(dest, st)
    make_parents(opts.target, rel)
    _record(opts, machine, rel, f if data == raw else None, data)
    # Now, not by the installer's threads: the local file is kept beside it the moment
    # before it is replaced, and a new one never replaces a file made meanwhile.
    act.previous_copy = install_config(dest, data, mtime_ns, restored_mode(f.mode),
                                       replacing=st is not None)
    report.actions.append(act)
    return None


def _place_big(staged: Path, dest: bytes, rel: bytes, src: str, st: os.stat_result,
               mtime_ns: int, backup: Backup, opts: RestoreOptions, report: RestoreReport,
               installer: Installer, as_is: Entry | None,
               lineage: Lineage | None = None) -> tuple[bytes, Action] | None:
    """``_place`` for a file too big to merge in memory: the same skip, fast-forward and
    keep; two diverged copies keep the local one and save the backup's beside it, and so
    does a fast-forward of a transcript that ``lineage`` does not say it continues."""
    relation = _relation(dest, staged)
    if relation == "local-prefix" and lineage is not None and not lineage.trusted and \
            st.st_size and not _shipped_a_line(dest, lineage.shipped):
        relation = "stranger"
    kind, why = {
        "same": ("skip", "identical"),
        "local-prefix": ("fast-forward", "local is a prefix of the backup"),
        "backup-prefix": ("keep", "backup is a prefix of local"),
        "diverged": ("conflict", "diverged, too big to merge in memory: local kept, "
                                 "backup copy saved"),
        "stranger": ("conflict", "the backup's copy adds to a local one this machine has "
                                 "not shipped a line of: saved as a conflict copy"),
    }[relation]
    if _left(opts, rel, st, kind, report, src):
        return None
    act = Action(kind, os.fsdecode(rel), src, why)
    if act.action == "skip":
        act.size = st.st_size  # the local bytes found identical
    if act.action == "conflict" and not opts.dry_run:
        # Said once saved (a copy refused is this file's error, as in _place).
        act.conflict_copy = _save_conflict(staged, rel, backup.machine, opts)
    report.actions.append(act)
    if opts.dry_run or act.action in ("skip", "keep", "conflict"):
        return None
    unchanged(dest, st)
    act.size = staged.stat().st_size
    _record(opts, backup.machine, rel, as_is, staged)
    installer.append(staged, dest, mtime_ns, st, skip=st.st_size)
    return dest, act


def _shipped_a_line(path: bytes, shipped: int) -> bool:
    """Whether the first ``shipped`` bytes of the file hold a whole line (a shipped prefix
    of more than ``CHUNK`` counts as one: a line that long is history all the same)."""
    if shipped >= CHUNK:
        return True
    with open(path, "rb") as fh:
        return b"\n" in fh.read(shipped)


def _relation(local: bytes, backup: bytes | Path) -> str:
    """How two files compare, read a chunk at a time: "same", "local-prefix" (backup
    extends local), "backup-prefix" or "diverged"."""
    with open(local, "rb") as a, open(backup, "rb") as b:
        while True:
            x, y = a.read(CHUNK), b.read(CHUNK)
            common = min(len(x), len(y))
            if x[:common] != y[:common]:
                return "diverged"
            if len(x) != len(y):
                # One ran out within this chunk: the other goes on beyond it.
                return "local-prefix" if len(x) < len(y) else "backup-prefix"
            if not x:
                return "same"


# A stored mtime past this far in the future is impossible (a clock gone wrong, or a
# store's invention): the file gets the time of the restore.
_MTIME_SLACK_NS = 86400 * 10**9


def _sane_mtime(f: Entry, report: RestoreReport) -> int:
    now = time.time_ns()
    if 0 <= f.mtime_ns <= now + _MTIME_SLACK_NS:
        return f.mtime_ns
    report.notes.append(f"{os.fsdecode(f.path)}: impossible mtime {f.mtime_ns} ns in the "
                        "backup; restored with the time of the restore")
    return now


def _rewrite(staged: Path, f: Entry, remap: Remapper,
             history_sids: set[str] | None) -> tuple[Path, int]:
    """``staged`` remapped (and a history filtered) into a new staged file; its size."""
    sids = history_sids if f.path == b"history.jsonl" else None
    return _rewrite_lines(staged, remap, sids, sids is not None and f.sparse)


# A restore that rewrites this much starts worker processes for it: the rewrite is Python
# (regex substitutions with a callback per path), which threads would run on one core.
POOL_MIN_BYTES = 32 << 20
REWRITERS_MAX = 4
# A worker process's remapper, made once when it starts.
_worker_remap: Remapper | None = None


def _rewriters(files: dict[bytes, Entry], remap: Remapper,
               history_sids: set[str] | None) -> ProcessPoolExecutor | None:
    """Worker processes for the rewrite, when it is big enough and there are cores to
    share it; started now, before this process has other threads (a fork copies only the
    thread that calls it)."""
    work = sum(f.size for p, f in files.items()
               if (_remapped(p) and not remap.identity) or
               (history_sids is not None and p == b"history.jsonl"))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        os.cpu_count() or 1
    if work < POOL_MIN_BYTES or cores < 2:
        return None
    method = "fork" if threading.active_count() == 1 and \
        "fork" in multiprocessing.get_all_start_methods() else "spawn"
    pool = ProcessPoolExecutor(min(cores, REWRITERS_MAX), multiprocessing.get_context(method),
                               initializer=_start_rewriter, initargs=(remap.rules, remap.folders))
    # A forked process's collector would walk (and so copy) every object it inherited.
    gc.freeze()
    try:
        pool.submit(int).result()  # forks them all now (their threads come later)
    finally:
        gc.unfreeze()
    return pool


def _start_rewriter(rules: list[Rule], folders: dict[str, str]) -> None:
    global _worker_remap
    _worker_remap = Remapper(rules, folders)


def _rewrite_job(staged: Path, sids: set[str] | None, holes: bool,
                 whole: bool) -> tuple[Path, int]:
    """In a worker process: ``staged`` rewritten as ``_place`` rewrites it (``whole``: at
    once, the small file's way), and the staged file that holds it now, and its size."""
    assert _worker_remap is not None
    # Made durable here, by this process, so that installing it is only a rename.
    if not whole:
        path, size = _rewrite_lines(staged, _worker_remap, sids, holes)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return path, size
    # Written back into the staged file: a new file costs the filesystem an inode.
    with open(staged, "r+b") as fh:
        data = fh.read()
        out = _lines_out(data.replace(b"\0", b"") if holes else data, _worker_remap, sids)
        fh.seek(0)
        fh.write(out)
        fh.truncate()
        fh.flush()
        os.fsync(fh.fileno())
    return staged, len(out)


def _rewrite_lines(staged: Path, remap: Remapper, sids: set[str] | None,
                   holes: bool) -> tuple[Path, int]:
    out_path = staged.with_name(staged.name + ".out")
    size = 0
    with open(staged, "rb") as src, open(out_path, "wb") as out:
        os.fchmod(out.fileno(), 0o600)

        def emit(text: bytes) -> None:
            nonlocal size
            out.write(text)
            size += len(text)

        # A filtered sparse history has zero bytes where other sessions' lines were.
        rewrite_lines(src, emit, lambda text: _lines_out(text, remap, sids), holes=holes)
    staged.unlink()
    return out_path, size


def _lines_out(text: bytes, remap: Remapper, sids: set[str] | None) -> bytes:
    return remap.lines(text if sids is None else _filter_history(text, sids))


def _save_conflict(data: bytes | Path, rel: bytes, machine: str, opts: RestoreOptions) -> str:
    """The backup's copy (its bytes, or a file of them) beside syncd's state, under the
    second it was saved (``-2``, ``-3`` … after it for another copy of that second: none
    is written over); its path. A copy that says nothing new (it is, or begins, one kept
    already: that one's path) is not written. Copies stay within ``opts.conflict_copies``
    of one file and ``opts.conflict_bytes`` in all, the oldest going first; one bigger
    than ``conflict_bytes`` alone is refused (``RestoreError``)."""
    base = os.fsencode(opts.conflicts_dir or (opts.target.parent / ".syncd-conflicts"))
    under = os.path.join(base, os.fsencode(machine))
    size = data.stat().st_size if isinstance(data, Path) else len(data)
    if size > opts.conflict_bytes:
        why = (f"{os.fsdecode(rel)}: local file kept, machine {machine}'s copy not saved: "
               f"its {size} bytes are more than conflict_bytes ({opts.conflict_bytes}) "
               "allows for every conflict copy")
        if opts.refused_copy is not None:
            opts.refused_copy(why)
        raise RestoreError(why)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    older = _copies(under, rel)
    if isinstance(data, Path) and (kept := _kept_already(older, data, size)) is not None:
        return kept
    # Written whole first, then linked into place: another restore superseding copies
    # meanwhile never meets this one half written (its bytes so far a prefix of another).
    private_dir(under)
    sweep_temps(under)  # a killed restore's
    tmp = os.path.join(under, os.fsencode(temp_name()))
    try:
        with os.fdopen(create_private(tmp, os.O_EXCL), "wb") as out:
            if isinstance(data, Path):
                with open(data, "rb") as src:
                    shutil.copyfileobj(src, out, CHUNK)
            else:
                out.write(data)
        if not isinstance(data, Path) and (kept := _kept_already(older, tmp, size)) is not None:
            return kept
        for n in range(1, CONFLICTS_PER_SECOND + 1):
            path = os.path.join(under, (stamp if n == 1 else f"{stamp}-{n}").encode(), rel)
            private_dir(os.path.dirname(path))
            try:
                os.link(tmp, path)
            except FileExistsError:
                continue
            _drop_superseded(under, path, size, older, opts.conflict_copies)
            _trim(base, path, opts.conflict_bytes)
            return os.fsdecode(path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    raise RestoreError(f"{os.fsdecode(rel)}: {CONFLICTS_PER_SECOND} conflict copies of it "
                       "saved this second already")


CONFLICTS_PER_SECOND = 100
# The name of a second's folder of conflict copies (``_save_conflict``).
_SECOND = re.compile(rb"(\d{8}T\d{6})(?:-(\d{1,3}))?")


def _age(second: bytes) -> tuple[bytes, int] | None:
    """Where a second's folder sorts among the others, oldest first (None: not one)."""
    m = _SECOND.fullmatch(second)
    return None if m is None else (m[1], int(m[2] or 1))


def _copies(under: bytes, rel: bytes) -> list[tuple[tuple[bytes, int], bytes, int]]:
    """(age, path, size) of the copies of ``rel`` kept under ``under``, oldest first."""
    out = []
    with contextlib.suppress(OSError):
        for second in os.listdir(under):
            age = _age(second)
            path = os.path.join(under, second, rel)
            with contextlib.suppress(OSError):
                st = os.lstat(path)
                if age is not None and stat.S_ISREG(st.st_mode):
                    out.append((age, path, st.st_size))
    return sorted(out)


def _drop_superseded(under: bytes, newest: bytes, size: int,
                     older: list[tuple[tuple[bytes, int], bytes, int]], keep: int) -> None:
    """Remove the ``older`` copies of a file (``under``/<second>/<rel>) whose bytes all
    begin ``newest`` (``size`` bytes): while two machines keep writing one session, each
    import would save another, longer copy of the other's branch; the newest holds every
    byte of those. Of the others, the oldest go while more than ``keep`` copies stay."""
    left = []
    for copy in older:
        _, old, old_size = copy
        if old_size <= size and _has_prefix(newest, old):
            _remove_copy(under, old)
        else:
            left.append(copy)
    for _, old, _ in left[: max(0, len(left) + 1 - keep)]:
        _remove_copy(under, old)


def _kept_already(older: list[tuple[tuple[bytes, int], bytes, int]], new: bytes | Path,
                  size: int) -> str | None:
    """The copy of ``older`` that is, or begins with, the file ``new`` (``size`` bytes):
    that one says all it says."""
    for _, old, old_size in older:
        if old_size >= size and _has_prefix(old, new):
            return os.fsdecode(old)
    return None


def _has_prefix(longer: bytes, shorter: bytes | Path) -> bool:
    """Whether the file ``longer`` begins with every byte of ``shorter`` (or is it),
    compared as streams, a chunk of each at a time; False when either cannot be read."""
    try:
        return _relation(longer, shorter) in ("same", "backup-prefix")
    except OSError:
        return False


def _trim(base: bytes, newest: bytes, budget: int) -> None:
    """The oldest copies under ``base`` (every machine's) go while they hold more than
    ``budget`` bytes (never ``newest``). Only syncd's own (<machine>/<second>/…) count."""
    kept = []
    for machine in _listdir(base):
        under = os.path.join(base, machine)
        for second in _listdir(under):
            age = _age(second)
            if age is None:
                continue
            for top, _, names in os.walk(os.path.join(under, second)):
                for name in names:
                    path = os.path.join(top, name)
                    with contextlib.suppress(OSError):
                        st = os.lstat(path)
                        if stat.S_ISREG(st.st_mode):
                            kept.append((age, path, st.st_size, under))
    total = sum(n for _, _, n, _ in kept)
    for _, path, n, under in sorted(kept):
        if total <= budget:
            break
        if path != newest:
            _remove_copy(under, path)
            total -= n


def _listdir(path: bytes) -> list[bytes]:
    try:
        return [n for n in os.listdir(path) if os.path.isdir(os.path.join(path, n))
                and not os.path.islink(os.path.join(path, n))]
    except OSError:
        return []


def _remove_copy(under: bytes, path: bytes) -> None:
    """Remove a conflict copy and its now empty directories, up to the second's (never
    ``under``)."""
    try:
        os.unlink(path)
    except OSError:
        return
    d = os.path.dirname(path)
    while d != under and d.startswith(under):
        try:
            os.rmdir(d)
        except OSError:
            break
        d = os.path.dirname(d)


__all__ = ["Action", "RestoreError", "RestoreOptions", "RestoreReport", "restore",
           "restore_tree", "safe_relpath", "session_of"]

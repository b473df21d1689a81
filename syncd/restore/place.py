"""Placing a staged file: compared with what is already there (``restore/merge``) and handed
to the installer (create, fast-forward, merge, replace), kept, saved aside or left
waiting; a config file asked for with ``--config``; ``_Placer``, the thread that places
new files while the others are still fetched.
"""

from __future__ import annotations

import os
import queue
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

from syncd.claude import is_user_config
from syncd.errors import RestoreError
from syncd.format.catalog import session_of
from syncd.format.snapshot import Entry
from syncd.private import create_private
from syncd.restore.conflicts import _keep_aside, _relation, _save_conflict, _set_aside
from syncd.restore.fetch import _staged_path
from syncd.restore.install import Changed, Installer, check_parents, make_parents, unchanged
from syncd.restore.mapping import _kind, _remapped, _target_rel
from syncd.restore.merge import Lineage, decide
from syncd.restore.options import RestoreOptions
from syncd.restore.origin import origin_record
from syncd.restore.plan import safe_relpath
from syncd.restore.remap import CHUNK, LINE_MAX, Remapper, rewrite_lines
from syncd.restore.report import Action, RestoreReport, _file_error, _why
from syncd.restore.rewrite import _lines_out, _rewrite, _rewrite_job
from syncd.restore.userconfig import config_diff, install_config, remapped, restored_mode
from syncd.sibling import is_sibling, owner_of
from syncd.view import Backup


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
            _record_import(opts, backup.machine, rel, f, out)
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
            _record_import(opts, backup.machine, rel, f, data)
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
                _record_import(opts, backup.machine, rel, f, out)
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
            _record_import(opts, backup.machine, rel, f, staged)
            installer.rename(os.fsencode(staged), dest, mtime_ns)
        report.actions.append(act)
        return dest, act
    if max(size, st.st_size) > MERGE_MAX:
        return _place_big(staged, dest, rel, src, st, mtime_ns, backup, opts, report,
                          installer, f, as_is, _lineage(f.path, rel, backup, opts)
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
            _record_import(opts, backup.machine, rel, f, data)
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
        _record_import(opts, backup.machine, rel, f, d.content)
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


def _record_import(opts: RestoreOptions, machine: str, rel: bytes, f: Entry,
                   content: Path | str | bytes) -> None:
    """Before ``content`` (all of it ``machine``'s generation ``f``, remapped) becomes
    ``rel`` of this machine's own tree: tell ``opts.record_import``."""
    # A session's files only (history.jsonl's lines are filtered, and merged).
    if opts.record_import is not None and opts.local_root is not None and \
            machine != opts.local_machine and owner_of(f.path) is not None:
        opts.record_import(rel, machine, f.path, f.gen, f.size,
                           content if isinstance(content, bytes) else Path(content))


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
               installer: Installer, f: Entry, as_is: Entry | None,
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
    _record_import(opts, backup.machine, rel, f, staged)
    installer.append(staged, dest, mtime_ns, st, skip=st.st_size)
    return dest, act


def _shipped_a_line(path: bytes, shipped: int) -> bool:
    """Whether the first ``shipped`` bytes of the file hold a whole line (a shipped prefix
    of more than ``CHUNK`` counts as one: a line that long is history all the same)."""
    if shipped >= CHUNK:
        return True
    with open(path, "rb") as fh:
        return b"\n" in fh.read(shipped)


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


class Placing:
    """One pass's placing: each staged file to its verdict (set aside, kept out with its
    session, a tail, or ``_place``), told in its own report (``sinks``); the writes it
    queued and the rewrites started early, until ``finish``."""

    def __init__(self, backup: Backup, opts: RestoreOptions, remap: Remapper,
                 files: dict[bytes, Entry], history_sids: set[str] | None,
                 aside: dict[bytes, tuple[bytes, bytes]], sides: dict[bytes, bytes],
                 tails: dict[bytes, tuple[int, int]], sinks: dict[bytes, RestoreReport],
                 staging: Path) -> None:
        self.backup, self.opts, self.remap, self.files = backup, opts, remap, files
        self.history_sids, self.aside, self.sides, self.tails = history_sids, aside, sides, tails
        self.sinks, self.staging = sinks, staging
        self.installer = Installer()
        # Worker processes for a big rewrite (set before any other thread starts).
        self.rewriters: ProcessPoolExecutor | None = None
        # The writes queued: destination → its action (an error once known turns it).
        self.placed: dict[bytes, Action] = {}
        # Rewrites started as soon as a file's bytes were in: its size then, and the job.
        self.rewrites: dict[bytes, tuple[int, Future[tuple[Path, int]]]] = {}

    def place(self, path: bytes, staged: Path, planned: dict[bytes, Path]) -> None:
        backup, opts, remap, sinks, sides = self.backup, self.opts, self.remap, self.sinks, \
            self.sides
        sink = sinks[path] = RestoreReport()
        if path in self.aside:
            _set_aside(staged, path, self.aside[path], backup, opts, sink)
            return
        if path in sides and _side_left(path, staged, sides[path], sinks, backup, opts,
                                        remap, sink):
            return
        # A sibling is its session's state at the transcript's end: newer with it.
        verdict = _verdict(sides[path], sinks) if path in sides else None
        newer = verdict is not None and verdict.action == "fast-forward" and is_sibling(path)
        try:
            queued = _place_tail(staged, self.files[path], *self.tails[path], remap, opts,
                                 sink, self.installer) if path in self.tails else \
                _place(staged, self.files[path], remap, self.history_sids, backup, opts, sink,
                       self.installer, planned, self.rewriters, self.rewrites.pop(path, None),
                       newer)
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
            self.placed[queued[0]] = queued[1]
            sid = session_of(path)
            if sid is not None and queued[1].action == "create" and \
                    opts.record_origin is not None and backup.machine != opts.local_machine:
                # Decided and queued, before the installer's thread makes it appear (the
                # daemon may ship it at once; a flush before the record ships the origin
                # with the session's next bytes).
                opts.record_origin(origin_record(sid, backup.machine, path, remap.rules,
                                                 time.time()), False)

    def new_here(self, path: bytes) -> bool:
        # Placed early: only a new file (no config, none set aside); one that changes a
        # local file waits for the whole fetch, so a failure halfway leaves every local
        # file as it was.
        return path not in self.aside and path not in self.sides and \
            not is_user_config(os.fsdecode(path)) and \
            not os.path.lexists(os.path.join(os.fsencode(self.opts.target),
                                             _target_rel(path, self.remap)))

    def place_early(self, path: bytes) -> None:
        if self.new_here(path):
            self.place(path, _staged_path(self.staging, path), {})

    def prepare_early(self, path: bytes) -> None:
        # A file that will be placed early (new): made durable as soon as its bytes are
        # written, or rewritten by a worker process, while the others are fetched; once
        # its objects are all read (a failure in its object's last window loses its bytes
        # too), placing it is a rename. Placed otherwise, it is as if not prepared.
        f = self.files[path]
        if f.sparse or not 0 <= f.mtime_ns <= time.time_ns() + _MTIME_SLACK_NS or \
                not self.new_here(path):
            return
        staged = _staged_path(self.staging, path)
        sids = self.history_sids if path == b"history.jsonl" else None
        if not (_remapped(path) and not self.remap.identity) and sids is None:
            self.installer.prepare(os.fsencode(staged), f.mtime_ns)
        elif self.rewriters is not None and len({key for key, _ in f.extents}) == 1:
            # Rewritten in place: only a file of one object, which a failure later in
            # that object loses whole (one of several would keep its intact prefix, cut
            # at an offset of the bytes as they were).
            size = staged.stat().st_size
            self.rewrites[path] = (size, self.rewriters.submit(_rewrite_job, staged, sids,
                                                               False, size <= CHUNK))

    def finish(self, report: RestoreReport) -> None:
        """Wait for every write queued (a failure turns its action into an error, or a
        wait for follow), then stop the installer and the rewriters."""
        for dest, err in self.installer.finish():
            act = self.placed.get(dest)
            if act is not None and isinstance(err, Changed) and self.opts.leave is not None:
                # Written here meanwhile: left until quiet, as if seen before the decision.
                act.action, act.reason, act.size = "wait", _why(err), 0
                continue
            if act is not None:
                act.action, act.reason, act.size = "error", _why(err), 0
            report.errors.append(f"{os.fsdecode(dest)}: {_why(err)}")
        self.installer.close()
        if self.rewriters is not None:
            self.rewriters.shutdown(wait=True, cancel_futures=True)


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

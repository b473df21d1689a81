"""Compaction: fold a machine's segments into packs and write a snapshot manifest.

Order (restic's): packs first, then the manifest that references them, and only then
delete what the new manifest no longer needs: the compacted segments, packs whose
extents were moved, superseded manifest revisions. A crash at any point leaves a store
that restores: before the manifest, the new packs are unreferenced leftovers (removed
by the next run); after it, the old objects are leftovers that readers ignore.

The newest manifest locates every byte any kept snapshot needs: the current files, and
(``retained``) older generations that older snapshots still hold. Readers of an older
snapshot find its bytes through the newest one, so packs can be merged and rewritten
without touching older manifests. ``keep`` (prune) recomputes what is retained.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from syncd.archive.packer import PackWriter, Spool
from syncd.errors import AlreadyExists, CompactError, FormatError, Locked, StoreError
from syncd.format.catalog import Session, session_of
from syncd.format.fold import fold_index
from syncd.format.segment import FRAME_MAX, HEADER, TRAILER, Extent, SegmentIndex
from syncd.format.snapshot import HISTORY, Entry, Manifest, build, current
from syncd.progress import Meter, NullMeter
from syncd.repository import Repository
from syncd.security.lock import ProcessLock
from syncd.store import layout

log = logging.getLogger("syncd.compact")

# history.jsonl interleaves every session's lines: small frames let one session's
# restore fetch only the frames that hold its lines.
HISTORY_FRAME = 256 << 10


@dataclass
class CompactOptions:
    level: int = 9
    pack_target: int = 32 << 20   # a pack is closed once its frames reach this size
    small_pack: int = 8 << 20     # packs below this are merged into the next one written
    repack_share: float = 0.5     # a pack less referenced than this is rewritten
    tombstone_keep: float = 180 * 86400.0
    now: float | None = None
    # Prune: the snapshot keys that stay; what they need is recomputed from them.
    keep: Collection[str] | None = None
    dry_run: bool = False
    spool_dir: Path | None = None
    # One compaction or prune per machine at a time on this host (an flock): a second
    # one is refused, never run beside the first.
    lock: Path | None = None
    progress: Meter | None = None  # told the raw bytes to rewrite, then each frame written
    # Checked between files: the daemon is stopping (nothing is deleted then).
    should_stop: Callable[[], bool] = lambda: False
    # The newest seq the store confirmed to this machine's writer (None: unknown). A newest
    # manifest beyond it is no compaction's of ours: building on it would delete segments.
    acknowledged: int | None = None


@dataclass
class CompactReport:
    machine: str
    snapshot: str | None = None
    segments: int = 0
    segment_bytes: int = 0
    raw_bytes: int = 0
    packs_written: list[tuple[str, int]] = field(default_factory=list)
    packs_merged: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"machine": self.machine, "snapshot": self.snapshot, "segments": self.segments,
                "segment_bytes": self.segment_bytes, "raw_bytes": self.raw_bytes,
                "packs_written": [{"key": k, "size": s} for k, s in self.packs_written],
                "packs_merged": self.packs_merged, "expired": self.expired,
                "deleted": len(self.deleted), "errors": self.errors, "note": self.note}


@dataclass
class _Tree:
    """What the next manifest will hold, built from the newest one plus segments."""

    live: dict[bytes, Entry] = field(default_factory=dict)
    retained: dict[tuple[bytes, int], Entry] = field(default_factory=dict)
    sessions: dict[bytes, Session] = field(default_factory=dict)
    projects: dict[str, dict[str, Any]] = field(default_factory=dict)
    in_newest: set[tuple[bytes, int]] = field(default_factory=set)
    first_time: float | None = None
    time: float = 0.0
    seq: int = -1

    def retire(self, e: Entry) -> None:
        # A generation the newest snapshot holds stays findable for it; one born and
        # gone between two compactions is in no snapshot.
        if (e.path, e.gen) in self.in_newest:
            e.retained = True
            self.retained[(e.path, e.gen)] = e

    def fold(self, key: str, ix: SegmentIndex) -> None:
        fold_index(key, ix, self.live, self.sessions, self.projects, retire=self.retire)
        self.first_time = ix.time if self.first_time is None else self.first_time
        self.time, self.seq = ix.time, ix.seq

    def catalog(self, machine: str) -> list[Session]:
        out = []
        for path, e in self.live.items():
            sid = session_of(path)
            if sid is None:
                continue
            s = self.sessions.get(path)
            if s is None or s.gen != e.gen:
                s = Session(sid, machine, path, e.gen)
            out.append(s)
        return out


def compact(repo: Repository, opts: CompactOptions | None = None) -> CompactReport:
    """Compact the repository machine's segments (and sparse packs) into packs and a new
    snapshot manifest."""
    opts = opts or CompactOptions()
    with exclusive(opts.lock, "compaction"):
        return _compact(repo, opts)


@contextlib.contextmanager
def exclusive(path: Path | None, what: str) -> Iterator[None]:
    """Hold the compaction lock at ``path`` (None: no lock), or raise CompactError."""
    if path is None:
        yield
        return
    lock = ProcessLock(path)
    try:
        lock.acquire()
    except Locked:
        raise CompactError(f"refusing the {what}: another compaction or prune of this "
                           f"machine is running (pid {lock.holder() or '?'})") from None
    try:
        yield
    finally:
        lock.release()


def _compact(repo: Repository, opts: CompactOptions) -> CompactReport:
    machine = repo.machine
    now = time.time() if opts.now is None else opts.now
    rep = CompactReport(machine)
    snaps = current(repo.snapshots())
    newest: Manifest | None = None
    tree = _Tree()
    if snaps:
        try:
            newest = repo.read_manifest(snaps[-1][2])
            groups = repo.read_groups(newest)
        except (FormatError, StoreError) as err:
            raise CompactError(f"the newest snapshot is unreadable, not building on it "
                               f"(run syncd verify): {err}") from err
        if opts.acknowledged is not None and newest.seq > opts.acknowledged:
            known = (f"seq {opts.acknowledged:016x}, the newest this machine's state knows"
                     if opts.acknowledged >= 0 else "what this machine's state knows (nothing)")
            raise CompactError(f"{repo.where(newest.key)}: a snapshot beyond {known}: not "
                               "building on it (run syncd sync first: it adopts "
                               "what an earlier run left; if it persists, the snapshot was "
                               "planted or is foreign)")
        for g in groups.values():
            for e in g.entries:
                if e.retained:
                    tree.retained[(e.path, e.gen)] = e
                else:
                    tree.live[e.path] = e
                    tree.in_newest.add((e.path, e.gen))
            for s in g.sessions:
                tree.sessions[s.path] = s
        tree.projects.update(newest.projects)
        tree.first_time, tree.time, tree.seq = newest.first_time, newest.time, newest.seq
    segs = _segments(repo, tree.seq, rep, opts.acknowledged)
    for key, size, ix in segs:
        tree.fold(key, ix)
        rep.segments += 1
        rep.segment_bytes += size
    changed = bool(segs)
    for path, e in list(tree.live.items()):
        if e.deleted_at is not None and e.deleted_at < now - opts.tombstone_keep:
            del tree.live[path]
            tree.retire(e)
            rep.expired.append(os.fsdecode(path))
            changed = True
    if opts.keep is not None:
        changed |= _recompute_retained(repo, tree, newest, opts.keep, rep)
    entries = [*tree.live.values(), *tree.retained.values()]
    packs = dict(repo.packs())
    used: dict[str, int] = {}
    for e in entries:
        for key, x in e.extents:
            used[key] = used.get(key, 0) + x.clen
    small = [k for k in used if k in packs and packs[k] < opts.small_pack]
    sparse = {k for k in used if k in packs
              and used[k] < opts.repack_share * _frame_bytes(repo, k, packs[k])}
    move = set(sparse)
    if changed or len(small) > 1 or sparse:
        move |= set(small)
    if not changed and not move:
        rep.note = "nothing to compact"
        if newest is not None and not opts.dry_run:
            # Leftovers of a run that died after its manifest, before its clean-up.
            _sweep(repo, newest.seq, newest.key, set(used), rep)
        return rep
    if tree.first_time is None:
        rep.note = "nothing to compact (no segment is readable)"
        return rep
    rep.packs_merged = sorted(move)
    rep.raw_bytes = sum(x.end - x.start for e in entries for k, x in e.extents
                        if _moves(k, move))
    if opts.dry_run:
        rep.note = "dry run: nothing written"
        return rep
    lo = min([s[2].seq for s in segs] + [_pack_lo(k) for k in move] + [tree.seq])
    _write_packs(repo, entries, move, lo, tree, opts, rep)
    rev = 0 if newest is None or tree.seq > newest.seq else newest.rev + 1
    key = _write_manifest(repo, tree, entries, rev, opts)
    try:  # what readers will see, read back before anything it replaces is deleted
        repo.read_groups(repo.read_manifest(key))
    except (FormatError, StoreError) as e:
        raise CompactError(f"the new snapshot does not read back, nothing deleted: {e}") from e
    rep.snapshot = key
    log.info("compacted %d segments of %s into %s (%d packs written)", rep.segments, machine,
             key, len(rep.packs_written))
    _sweep(repo, tree.seq, key, {k for e in entries for k, _ in e.extents}, rep)
    return rep


def _frame_bytes(repo: Repository, key: str, size: int) -> int:
    """The bytes of a pack's frames (all but header, index and trailer): one small GET."""
    try:
        off = TRAILER.unpack(repo.read_range(key, -TRAILER.size))[0]
    except (StoreError, struct.error):
        return size  # judged by its size; verify reports what is wrong with it
    return max(0, min(size, int(off)) - HEADER.size)


def _segments(repo: Repository, after: int, rep: CompactReport,
              upto: int | None = None) -> list[tuple[str, int, SegmentIndex]]:
    """The readable segments after ``after`` (up to ``upto``, the newest the writer's
    state knows), in order, up to the first gap or damage."""
    out = []
    expected = after + 1
    for key, size in repo.segments(after):
        seq = layout.segment_seq(key)
        if upto is not None and seq is not None and seq > upto:
            break  # not acknowledged yet: the writer adopts or rewrites it first
        if seq != expected:
            rep.errors.append(f"{repo.where(key)}: segment {expected:016x} is missing; "
                              "compacting only up to it")
            break
        try:
            ix = repo.read_index(key, size)
        except (FormatError, StoreError) as e:
            rep.errors.append(f"{e}; compacting only up to it")
            break
        out.append((key, size, ix))
        expected += 1
    return out


def _recompute_retained(repo: Repository, tree: _Tree, newest: Manifest | None,
                        keep: Collection[str], rep: CompactReport) -> bool:
    """Retain exactly the older generations the kept snapshots hold."""
    needed: set[tuple[bytes, int]] = set()
    for key in keep:
        if newest is not None and key == newest.key:
            m = newest
        else:
            try:
                m = repo.read_manifest(key)
            except (FormatError, StoreError) as e:
                raise CompactError(f"kept snapshot unreadable, not pruning what it may "
                                   f"need: {e}") from e
        for g in repo.read_groups(m).values():
            needed |= {(e.path, e.gen) for e in g.entries if not e.retained}
    live = {(e.path, e.gen) for e in tree.live.values()}
    gone = [k for k in tree.retained if k not in needed or k in live]
    for k in gone:
        del tree.retained[k]
    missing = needed - live - set(tree.retained)
    for path, gen in sorted(missing):
        rep.errors.append(f"{os.fsdecode(path)} generation {gen}: held by a kept snapshot, "
                          "but no object holds its bytes")
    return bool(gone)


def _write_packs(repo: Repository, entries: list[Entry], move: set[str], lo: int,
                 tree: _Tree, opts: CompactOptions, rep: CompactReport) -> None:
    """Rewrite every extent in a segment or in ``move`` into new packs, file by file."""
    machine = repo.machine
    meter = opts.progress or NullMeter()
    meter.start(rep.raw_bytes)
    try:
        spool = Spool(repo, opts.spool_dir)
    except OSError as ex:
        raise CompactError(f"compaction of {machine}: cannot create a spool directory in "
                           f"{opts.spool_dir or 'the temp dir'}: {ex.strerror}") from ex
    out = PackWriter(repo, lo, tree.seq, tree.time, level=opts.level,
                     target=opts.pack_target, written=rep.packs_written)
    try:
        for e in sorted(entries, key=lambda e: (e.path, e.gen)):
            if opts.should_stop():
                raise CompactError(f"compaction of {machine} stopped (the daemon is stopping); "
                                   "nothing deleted")
            limit = HISTORY_FRAME if e.path == HISTORY else FRAME_MAX
            new: list[tuple[str, Extent]] = []
            for run in _runs(e.extents, move):
                if not _moves(run[0][0], move):
                    new.extend(run)
                    continue
                start = run[0][1].start
                buf = bytearray()
                for key, x in run:
                    buf += spool.read(key, x)
                    meter.advance(x.end - x.start)
                    while len(buf) >= limit:
                        cut = limit
                        if e.path == HISTORY:  # whole lines: a frame names its sessions
                            cut = buf.rfind(b"\n", 0, limit) + 1 or limit
                        out.add(e, start, bytes(buf[:cut]), new)
                        start += cut
                        del buf[:cut]
                if buf:
                    out.add(e, start, bytes(buf), new)
            e.extents = new  # queued frames fill their places when their batch is done
            e.sids = {k: v for k, v in e.sids.items() if k[0] not in move}
        out.drain()
        out.flush()
    except (FormatError, StoreError) as ex:
        raise CompactError(f"compaction of {machine} stopped, nothing deleted: {ex}") from ex
    except OSError as ex:
        raise CompactError(f"compaction of {machine} stopped, nothing deleted: spool "
                           f"{ex.filename or ''}: {ex.strerror}") from ex
    finally:
        spool.close()


def _pack_lo(key: str) -> int:
    r = layout.pack_range(key)
    return 0 if r is None else r[0]


def _moves(key: str, move: set[str]) -> bool:
    return key in move or layout.kind_of(key) == "seg"


def _runs(extents: list[tuple[str, Extent]],
          move: set[str]) -> Iterator[list[tuple[str, Extent]]]:
    """Consecutive extents that all move (or all stay)."""
    run: list[tuple[str, Extent]] = []
    for item in extents:
        if run and _moves(run[0][0], move) != _moves(item[0], move):
            yield run
            run = []
        run.append(item)
    if run:
        yield run


def _write_manifest(repo: Repository, tree: _Tree, entries: list[Entry], rev: int,
                    opts: CompactOptions) -> str:
    assert tree.first_time is not None
    machine = repo.machine
    for _ in range(16):
        key = layout.snapshot_key(machine, tree.seq, rev)
        blob = build(machine, tree.seq, rev, tree.time, tree.first_time, entries,
                     tree.catalog(machine), tree.projects, level=opts.level,
                     cipher=repo.cipher(key))
        try:
            repo.put(key, blob)
            return key
        except AlreadyExists:
            rev += 1  # left by a run that died before its clean-up: the next revision
    raise CompactError(f"{repo.where(layout.snapshot_key(machine, tree.seq, rev))}: "
                       "too many revisions of one snapshot")


def _sweep(repo: Repository, seq: int, manifest: str, referenced: set[str],
           rep: CompactReport) -> None:
    """Delete what the new manifest made redundant (it is confirmed in the store)."""
    doomed = [key for key, _ in repo.segments() if (layout.segment_seq(key) or 0) <= seq]
    for key, _ in repo.packs():
        r = layout.pack_range(key)
        # A pack above ``seq`` may belong to a compaction still running elsewhere.
        if r is not None and r[1] <= seq and key not in referenced:
            doomed.append(key)
    snaps = repo.snapshots()
    if snaps and snaps[-1][2] != manifest:
        # Someone else wrote a newer manifest meanwhile: its objects are not ours to judge.
        rep.errors.append(f"{repo.where(snaps[-1][2])} appeared during the compaction; "
                          "nothing deleted")
        return
    for s, _, key in snaps:
        if s == seq and key != manifest and key < manifest:
            doomed.append(key)
    if not doomed:
        return
    try:
        repo.delete(doomed)
        rep.deleted = doomed
    except StoreError as e:
        # The backup is whole already; the next run finds these and deletes them.
        rep.errors.append(f"clean-up left {len(doomed)} redundant objects: {e}")

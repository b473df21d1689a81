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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from syncd.archive.deltawriter import HISTORY_FRAME, write_delta
from syncd.archive.packer import PackWriter, spooled
from syncd.errors import AlreadyExists, CompactError, FormatError, Locked, StoreError
from syncd.format import points as pointfmt
from syncd.format.catalog import Session, session_of
from syncd.format.delta import Delta, manifest_points
from syncd.format.points import Locator, Point, apply, apply_catalog, point_of
from syncd.format.segment import FRAME_MAX, HEADER, TRAILER, Extent, SegmentIndex
from syncd.format.snapshot import HISTORY, Entry, Group, Manifest, build, current
from syncd.progress import Meter, NullMeter
from syncd.repository import Repository
from syncd.security.lock import ProcessLock
from syncd.store import layout

log = logging.getLogger("syncd.compact")

# A manifest restates the tree (JSON, a few hundred kB at most) and is kept for long:
# compressed hard, in well under a second.
MANIFEST_LEVEL = 19
# One delta folds at most this many segments and entries (its index stays small).
DELTA_SEGMENTS = 4096
DELTA_ENTRIES = 16384


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
    # Seqs this machine's writer passed over (an object not its segment held them): such
    # an object is folded as an empty point, then deleted with the segments.
    passed_over: Collection[int] = ()
    # A compaction folds the segments since the last one into a delta; a manifest is
    # written instead once this many deltas follow the newest one (a restore reads each),
    # or when the segments are too big for one delta.
    max_chain: int = 24
    delta_max: int = 16 << 20
    # A last delta smaller than this (stored bytes) is extended by the next compaction
    # rather than followed by another.
    delta_target: int = 64 << 10
    # Prune: deltas whose points no kept point needs; their data moves into packs.
    drop: Collection[str] = ()


@dataclass
class CompactReport:
    machine: str
    snapshot: str | None = None
    delta: str | None = None
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
        return {"machine": self.machine, "snapshot": self.snapshot, "delta": self.delta,
                "segments": self.segments,
                "segment_bytes": self.segment_bytes, "raw_bytes": self.raw_bytes,
                "packs_written": [{"key": k, "size": s} for k, s in self.packs_written],
                "packs_merged": self.packs_merged, "expired": self.expired,
                "deleted": len(self.deleted), "errors": self.errors, "note": self.note}


@dataclass
class _Tree:
    """What the next manifest will hold: the newest one, then the points after it."""

    live: dict[bytes, Entry] = field(default_factory=dict)
    retained: dict[tuple[bytes, int], Entry] = field(default_factory=dict)
    sessions: dict[bytes, Session] = field(default_factory=dict)
    projects: dict[str, dict[str, Any]] = field(default_factory=dict)
    locator: Locator = field(default_factory=Locator)
    first_time: float | None = None
    time: float = 0.0
    seq: int = -1

    def start(self, m: Manifest, groups: dict[str, Group]) -> None:
        for g in groups.values():
            for e in g.entries:
                self.locator.add_all(e.extents)
                if e.retained:
                    self.retained[(e.path, e.gen)] = e
                else:
                    self.live[e.path] = e
            for s in g.sessions:
                self.sessions[s.path] = s
        self.projects.update(m.projects)
        self.first_time, self.time, self.seq = m.first_time, m.time, m.seq

    def retire(self, e: Entry) -> None:
        # Every generation a point names stays findable (prune drops what no kept point
        # needs any more).
        e.retained = True
        self.retained[(e.path, e.gen)] = e

    def fold(self, key: str, ix: SegmentIndex, points: list[Point]) -> None:
        self.locator.add_all((key, x) for x in ix.extents)
        self.locator.add_copies(ix.copies)
        self.projects.update(ix.projects)
        for p in points:
            apply(p, self.live, retire=self.retire, mode_of=self.locator.mode_of,
                  held=self.locator.holds)
            apply_catalog(p, self.sessions, ix.machine)
            self.first_time = p.time if self.first_time is None else self.first_time
            self.time, self.seq = p.time, p.seq

    def located(self) -> list[Entry]:
        """Every entry the manifest holds, each with the extents of its bytes."""
        out = []
        live = {(e.path, e.gen) for e in self.live.values()}
        for e in [*self.live.values(), *self.retained.values()]:
            if e.retained and (e.path, e.gen) in live:
                continue
            e.extents = self.locator.extents(e.path, e.gen, e.size)
            out.append(e)
        return out

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
    top = snaps[-1][0] if snaps else -1
    if opts.acknowledged is not None and top > opts.acknowledged:
        known = (f"seq {opts.acknowledged:016x}, the newest this machine's state knows"
                 if opts.acknowledged >= 0 else "what this machine's state knows (nothing)")
        raise CompactError(f"{repo.where(snaps[-1][2])}: a snapshot beyond {known}: not "
                           "building on it (run syncd sync first: it adopts "
                           "what an earlier run left; if it persists, the snapshot was "
                           "planted or is foreign)")
    if snaps:
        try:  # deltas build on it: one that no reader can start from is no base
            repo.read_manifest(snaps[-1][2])
        except (FormatError, StoreError) as err:
            raise CompactError(f"the newest snapshot is unreadable, not building on it "
                               f"(run syncd verify): {err}") from err
    chain = repo.delta_chain(top, opts.acknowledged, rep.errors)
    head = chain[-1].hi if chain else top
    segs = _segments(repo, head, rep, _covered(repo, opts.acknowledged), opts.passed_over)
    raw = sum(x.end - x.start for _, _, ix in segs for x in ix.extents)
    entries = sum(_entries(ix) for _, _, ix in segs)
    # A long chain is rebased by the compaction that would lengthen it (max_chain 0: a
    # manifest every time, as before deltas).
    rebase = (not snaps or (opts.keep is not None and not segs)
              or ((bool(segs) or not opts.max_chain)
                  and (len(chain) >= opts.max_chain
                       or sum(d.size for d in chain) > opts.pack_target))
              or raw > opts.delta_max or entries > DELTA_ENTRIES or len(segs) > DELTA_SEGMENTS)
    if not rebase:
        if not segs:
            rep.note = "nothing to compact"
            if not opts.dry_run:  # leftovers of a run that died before deleting them
                _delete(repo, [k for k, _ in repo.segments() if (layout.segment_seq(k) or 0)
                               <= head] + _narrower(repo, chain), rep)
            return rep
        rep.segments = len(segs)
        rep.segment_bytes = sum(size for _, size, _ in segs)
        rep.raw_bytes = raw
        if opts.dry_run:
            rep.note = "dry run: nothing written"
            return rep
        # A small last delta grows instead of being followed by another: fewer objects
        # to read, one run of frames per file, and a chain that reaches further.
        # Its points and entries stay within what one delta folds (a reader's limits).
        last = chain[-1] if chain and chain[-1].size < opts.delta_target \
            and len(chain[-1].points) + len(segs) <= DELTA_SEGMENTS \
            and _entries(chain[-1].index) + entries <= DELTA_ENTRIES else None
        d = write_delta(repo, segs, level=opts.level, spool_dir=opts.spool_dir, extend=last)
        if d is None:
            key = layout.delta_key(machine, segs[0][2].seq if last is None else last.lo,
                                   segs[-1][2].seq)
            rep.errors.append(f"{repo.where(key)}: taken by an object that is no delta of "
                              "these segments; writing a manifest instead")
            return _rebase(repo, opts, rep, snaps, chain, segs, now)
        rep.delta = d.key
        log.info("compacted %d segments of %s into %s", len(segs), machine, d.key)
        _delete(repo, [k for k, _ in repo.segments() if (layout.segment_seq(k) or 0) <= d.hi]
                + _narrower(repo, [*chain[:-1], d] if last is not None else [*chain, d]), rep)
        return rep
    return _rebase(repo, opts, rep, snaps, chain, segs, now)


def _entries(ix: SegmentIndex) -> int:
    return len(ix.extents) + len(ix.tombstones) + len(ix.copies) + len(ix.forgotten) + \
        len(ix.redacted)


def _narrower(repo: Repository, chain: list[Delta]) -> list[str]:
    """Deltas that a delta of the chain replaced (same start, an earlier end): left by a
    run that died between writing the wider one and deleting them."""
    ends = {d.lo: d.hi for d in chain}
    return [key for lo, hi, key, _ in repo.deltas() if lo in ends and hi < ends[lo]]


def _rebase(repo: Repository, opts: CompactOptions, rep: CompactReport,
            snaps: list[tuple[int, int, str]], deltas: list[Delta],
            segs: list[tuple[str, int, SegmentIndex]], now: float) -> CompactReport:
    """A new manifest: the newest one, the deltas after it and the segments after them."""
    machine = repo.machine
    newest: Manifest | None = None
    tree = _Tree()
    if snaps:
        try:
            newest = repo.read_manifest(snaps[-1][2])
            groups = repo.read_groups(newest)
        except (FormatError, StoreError) as err:
            raise CompactError(f"the newest snapshot is unreadable, not building on it "
                               f"(run syncd verify): {err}") from err
        tree.start(newest, groups)
    for d in deltas:
        tree.fold(d.key, d.index, d.points)
    for key, size, ix in segs:
        tree.fold(key, ix, [point_of(ix)])
        rep.segments += 1
        rep.segment_bytes += size
    # A prune writes a manifest only when it reclaims something (deltas alone are no
    # reason: their points are kept as they are).
    changed = bool(segs) or (bool(deltas) and opts.keep is None)
    for path, e in list(tree.live.items()):
        if e.deleted_at is not None and e.deleted_at < now - opts.tombstone_keep:
            del tree.live[path]
            tree.retire(e)
            rep.expired.append(os.fsdecode(path))
            changed = True
    if opts.keep is not None:
        changed |= _recompute_retained(repo, tree, newest, opts.keep, rep)
    entries = tree.located()
    packs = dict(repo.packs())
    used: dict[str, int] = {}
    for e in entries:
        for key, x in e.extents:
            used[key] = used.get(key, 0) + x.clen
    small = [k for k in used if k in packs and packs[k] < opts.small_pack]
    sparse = {k for k in used if k in packs
              and used[k] < opts.repack_share * _frame_bytes(repo, k, packs[k])}
    move = set(sparse) | set(opts.drop)
    changed |= bool(opts.drop)
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
    own: dict[str, Any] = {}
    if segs:  # the points of the segments it folds itself
        own = {"lo": segs[0][2].seq, **pointfmt.encode([point_of(ix) for _, _, ix in segs])}
    elif newest is not None and rev > 0:
        own = dict(newest.chain)  # a re-issue keeps the points of the one it replaces
    key = _write_manifest(repo, tree, entries, rev, opts, own)
    try:  # what readers will see, read back before anything it replaces is deleted
        repo.read_groups(repo.read_manifest(key))
    except (FormatError, StoreError) as e:
        raise CompactError(f"the new snapshot does not read back, nothing deleted: {e}") from e
    rep.snapshot = key
    log.info("compacted %d segments and %d deltas of %s into %s (%d packs written)",
             rep.segments, len(deltas), machine, key, len(rep.packs_written))
    _sweep(repo, tree.seq, key, {k for e in entries for k, _ in e.extents}, rep,
           drop=set(opts.drop))
    return rep


def _frame_bytes(repo: Repository, key: str, size: int) -> int:
    """The bytes of a pack's frames (all but header, index and trailer): one small GET."""
    try:
        off = TRAILER.unpack(repo.read_range(key, -TRAILER.size))[0]
    except (StoreError, struct.error):
        return size  # judged by its size; verify reports what is wrong with it
    return max(0, min(size, int(off)) - HEADER.size)


def _covered(repo: Repository, upto: int | None) -> int | None:
    """The newest seq to fold: what the writer's state confirmed (``upto``), and no further
    than the machine's head covers. Readers of the head fold the segments after it onto
    it, so those stay segments until a head covers them (a busy machine's head lags up
    to head_interval). A head that does not read bounds nothing: its readers read the
    backup."""
    try:
        h = repo.head()
    except FormatError:
        return upto
    if h is None:
        return upto
    return h.seq if upto is None else min(upto, h.seq)


def _segments(repo: Repository, after: int, rep: CompactReport, upto: int | None = None,
              passed: Collection[int] = ()) -> list[tuple[str, int, SegmentIndex]]:
    """The readable segments after ``after`` (up to ``upto``, the newest the writer's
    state knows), in order, up to the first gap or damage. An object the writer passed
    over (``passed``) is an empty point with the time of the segment after it (none
    yet: it waits for one)."""
    out = []
    waiting: list[tuple[str, int, int]] = []
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
        except StoreError as e:
            rep.errors.append(f"{e}; compacting only up to it")
            break
        except FormatError as e:
            bad: str | None = str(e)
        else:
            bad = None if (ix.machine, ix.seq) == (repo.machine, seq) else \
                f"{repo.where(key)}: index says machine {ix.machine!r} seq {ix.seq}, not " \
                "what its key says"
        if bad is not None:
            if seq not in passed:
                rep.errors.append(f"{bad}; compacting only up to it")
                break
            waiting.append((key, size, seq))
            expected += 1
            continue
        out += [(k, n, SegmentIndex(repo.machine, s, ix.time)) for k, n, s in waiting]
        waiting = []
        out.append((key, size, ix))
        expected += 1
    return out


def _recompute_retained(repo: Repository, tree: _Tree, newest: Manifest | None,
                        keep: Collection[str], rep: CompactReport) -> bool:
    """Retain exactly the older generations the kept snapshots hold."""
    needed: set[tuple[bytes, int]] = set()
    deltas = [k for k in keep if layout.kind_of(k) == "delta"]
    for key in [k for k in keep if layout.kind_of(k) != "delta"]:
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
        own = manifest_points(m)
        needed |= _named(own[1] if own else [])
    for key in deltas:
        try:
            needed |= _named(repo.read_delta(key).points)
        except (FormatError, StoreError) as e:
            raise CompactError(f"kept delta unreadable, not pruning what it may need: "
                               f"{e}") from e
    live = {(e.path, e.gen) for e in tree.live.values()}
    gone = [k for k in tree.retained if k not in needed or k in live]
    for k in gone:
        del tree.retained[k]
    missing = needed - live - set(tree.retained)
    for path, gen in sorted(missing):
        rep.errors.append(f"{os.fsdecode(path)} generation {gen}: held by a kept snapshot, "
                          "but no object holds its bytes")
    return bool(gone)


def _named(points: list[Point]) -> set[tuple[bytes, int]]:
    """Every generation the points give a size."""
    return {(c.path, c.gen) for p in points for c in p.changes if c.size is not None}


def _write_packs(repo: Repository, entries: list[Entry], move: set[str], lo: int,
                 tree: _Tree, opts: CompactOptions, rep: CompactReport,
                 transform: Callable[[Entry, int, bytes], bytes] | None = None) -> None:
    """Rewrite every extent in a segment or in ``move`` into new packs, file by file.

    A frame that several generations share (parts of it: copies of a cut tail, a moved
    file, a patch) is rewritten once, whole, and each of them takes its part of the new
    frame: shared bytes are stored once in packs as in segments."""
    machine = repo.machine
    meter = opts.progress or NullMeter()
    meter.start(rep.raw_bytes)
    out = PackWriter(repo, lo, tree.seq, tree.time, level=opts.level,
                     target=opts.pack_target, written=rep.packs_written, transform=transform)
    solo = _shared_frames(entries, move)
    # A shared frame rewritten: where its new extent is (a list and an index: filled once
    # its batch is compressed); the extents that take a part of it, filled after.
    placed: dict[tuple[str, int], tuple[list[tuple[str, Extent]], int]] = {}
    parts: list[tuple[list[tuple[str, Extent]], int, tuple[str, int], Extent]] = []
    with spooled(repo, opts.spool_dir) as spool:
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
                    meter.advance(x.end - x.start)
                    if (key, x.off) in solo:
                        if buf:
                            out.add(e, start, bytes(buf), new)
                            buf.clear()
                        if (key, x.off) not in placed:
                            whole = replace(x, start=x.start - x.skip if x.start >= x.skip
                                            else 0, skip=0, frame=0)
                            whole = replace(whole, end=whole.start + x.raw)
                            out.add(e, whole.start, spool.read(key, whole), new)
                            placed[(key, x.off)] = (new, len(new) - 1)
                        else:
                            new.append(("", x))  # its place, filled below
                        parts.append((new, len(new) - 1, (key, x.off), x))
                        start = x.end
                        continue
                    buf += spool.read(key, x)
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
    for into, at, frame, x in parts:
        where, i = placed[frame]
        key, nx = where[i]
        if into is where and at == i and (nx.start, nx.end) == (x.start, x.end):
            continue  # the whole frame, where it was
        base = nx.start
        into[at] = (key, nx.part(x.path, x.gen, base + x.skip, base + x.skip + x.end - x.start,
                                 x.start))


def _shared_frames(entries: list[Entry], move: set[str]) -> set[tuple[str, int]]:
    """The frames to rewrite that are shared: named by more than one extent, or in part."""
    seen: set[tuple[str, int]] = set()
    shared: set[tuple[str, int]] = set()
    for e in entries:
        for key, x in e.extents:
            if not _moves(key, move):
                continue
            k = (key, x.off)
            if x.frame or k in seen:
                shared.add(k)
            seen.add(k)
    return shared


def _pack_lo(key: str) -> int:
    r = layout.pack_range(key) or layout.delta_range(key)
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
                    opts: CompactOptions, own: dict[str, Any]) -> str:
    assert tree.first_time is not None
    machine = repo.machine
    for _ in range(16):
        key = layout.snapshot_key(machine, tree.seq, rev)
        blob = build(machine, tree.seq, rev, tree.time, tree.first_time, entries,
                     tree.catalog(machine), tree.projects, level=MANIFEST_LEVEL,
                     cipher=repo.cipher(key), chain=own)
        try:
            repo.put(key, blob)
            return key
        except AlreadyExists:
            rev += 1  # left by a run that died before its clean-up: the next revision
    raise CompactError(f"{repo.where(layout.snapshot_key(machine, tree.seq, rev))}: "
                       "too many revisions of one snapshot")


def _delete(repo: Repository, doomed: list[str], rep: CompactReport) -> None:
    if not doomed:
        return
    try:
        repo.delete(doomed)
        rep.deleted += doomed
    except StoreError as e:
        # The backup is whole already; the next run finds these and deletes them.
        rep.errors.append(f"clean-up left {len(doomed)} redundant objects: {e}")


def _sweep(repo: Repository, seq: int, manifest: str, referenced: set[str],
           rep: CompactReport, drop: Collection[str] = ()) -> None:
    """Delete what the new manifest made redundant (it is confirmed in the store)."""
    doomed = [key for key, _ in repo.segments() if (layout.segment_seq(key) or 0) <= seq]
    doomed += [key for key in drop if key not in referenced]
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
    _delete(repo, doomed, rep)

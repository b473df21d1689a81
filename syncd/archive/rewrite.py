"""Rewrite: take sessions or values out of every point in time of a machine's backup.

``forget`` drops every file of some sessions (``sessionfiles``) and masks their lines of
``history.jsonl``; ``redact`` masks values (``mask``). Masks keep each byte range's
length, so every other file at every point restores byte for byte as before, and only
the objects that hold what goes are rewritten.

The order is compaction's (docs/FORMAT.md, "Writing order": new objects, read back,
then the pointer, then deletion), so a kill at any point leaves a store whose every
point restores each file as it was or as the rewrite makes it, never one that lost its
bytes, and a second run completes:

1. the segments since the last compaction are folded into a manifest (``compact``);
2. the packs and deltas that hold a dropped file, a masked byte or a catalog field to
   mask are *dirty*; when the newest manifest finds bytes in a dirty delta, they are
   first copied as they are into packs under its next revision (``_detach``), so that
   no manifest needs a dirty delta;
3. the dirty packs' and deltas' other bytes, masked, go into new packs;
4. what replaces the older points, oldest first: each older manifest that names what
   goes (its next revision) and each dirty delta as a manifest at the delta's last seq
   carrying the delta's points (readers step from a manifest to a delta or to a
   manifest whose own points start there: the same walk); each is read back;
5. the dirty deltas are deleted (a walk through one would now name bytes the next step
   takes away); then the newest manifest's next revision, read back;
6. then the dirty packs and replaced revisions are deleted, and the head is written
   again without what goes.

A dirty delta no walk reaches (retention thinned its points out) is deleted without a
replacement; one a walk would reach but for an object that does not read is left, in
one line. A trained dictionary that holds what goes is named, not rewritten.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from syncd import mask
from syncd.archive.compact import (
    MANIFEST_LEVEL,
    CompactOptions,
    CompactReport,
    _compact,
    _delete,
    _sweep,
    _Tree,
    _write_packs,
    exclusive,
)
from syncd.errors import AlreadyExists, CompactError, FormatError, StoreError
from syncd.format import points as pointfmt
from syncd.format.catalog import Session
from syncd.format.delta import Delta, by_start, manifest_points
from syncd.format.points import Locator, Point, point_of
from syncd.format.segment import SegmentIndex
from syncd.format.snapshot import HISTORY, Entry, Manifest, build, current, has_sid
from syncd.repository import Repository
from syncd.sessionfiles import session_owning
from syncd.store import layout

log = logging.getLogger("syncd.rewrite")

# Bytes of a file read at a time while looking for what to mask.
WINDOW = 16 << 20
# Files whose lines are JSON (a value is masked only inside a string, never a signed
# one); in any other file every occurrence is.
JSON_NAMES = (b".jsonl", b".json")


@dataclass(frozen=True)
class Rewrite:
    forget: frozenset[str] = frozenset()  # session ids
    redact: tuple[bytes, ...] = ()  # values, as the files hold them
    patterns: tuple[re.Pattern[bytes], ...] = ()  # matched against each line's bytes
    # Values known by (sha256, length) only, looked for in the files of ``within``'s
    # sessions: what another machine's redact tombstone names.
    digests: frozenset[tuple[str, int]] = frozenset()
    within: frozenset[str] = frozenset()

    def drops(self, path: bytes) -> bool:
        return bool(self.forget) and session_owning(path) in self.forget

    def searched(self, path: bytes) -> bool:
        """Whether ``path`` is looked into for the ``digests``' values."""
        return bool(self.digests) and session_owning(path) in self.within

    @property
    def masking(self) -> bool:
        return bool(self.redact or self.patterns or self.digests)

    def values_in(self, read: Callable[[], Iterable[bytes]], path: bytes) -> tuple[bytes, ...]:
        """The values to mask in a file: ``redact``'s, and the ``digests``' found in it."""
        if not self.searched(path):
            return self.redact
        return tuple(sorted({*self.redact, *mask.find_digests(read(), self.digests)}))

    def masks_text(self, text: str) -> bool:
        return self.masking and mask.mask_text(text, self.redact, self.patterns) != text

    def in_bytes(self, data: bytes) -> bool:
        """Whether raw ``data`` (a dictionary) holds a session id or a value that goes."""
        return any(sid.encode() in data for sid in self.forget) or \
            any(v and v in data for v in self.redact) or \
            any(p.search(data) for p in self.patterns)

    def __bool__(self) -> bool:
        return bool(self.forget or self.masking)


@dataclass
class RewriteReport:
    machine: str
    dry_run: bool = False
    files_dropped: list[str] = field(default_factory=list)
    ranges_masked: int = 0
    left_alone: list[str] = field(default_factory=list)  # values found and not masked
    rewritten: list[str] = field(default_factory=list)  # dirty objects replaced
    written: list[tuple[str, int]] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    bytes_deleted: int = 0
    folded: CompactReport | None = None
    dictionaries: list[str] = field(default_factory=list)  # dropped: they held what goes
    # Per session, the (sha256, length) of each value masked in its files: what its
    # tombstone tells the machines that imported it (never the value).
    digests: dict[str, set[tuple[str, int]]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def bytes_written(self) -> int:
        return sum(n for _, n in self.written)

    def as_dict(self) -> dict[str, Any]:
        return {"machine": self.machine, "dry_run": self.dry_run,
                "files_dropped": self.files_dropped, "ranges_masked": self.ranges_masked,
                "left_alone": self.left_alone, "rewritten": self.rewritten,
                "written": [{"key": k, "size": n} for k, n in self.written],
                "bytes_written": self.bytes_written, "deleted": len(self.deleted),
                "bytes_deleted": self.bytes_deleted,
                "bytes_reclaimed": self.bytes_deleted - self.bytes_written,
                "dictionaries_dropped": self.dictionaries,
                "errors": self.errors, "note": self.note}


def rewrite(repo: Repository, spec: Rewrite, opts: CompactOptions | None = None,
            retire_dictionary: Callable[[str], None] = lambda dict_id: None
            ) -> RewriteReport:
    """Take ``spec`` out of every point of the repository machine's backup.

    A trained dictionary that holds what goes (a session id or a value its training
    saw) goes too: ``retire_dictionary`` is told first (the writer stops compressing with
    it), the deltas whose frames use it are rewritten, and it is deleted unless a segment
    still names it."""
    opts = opts or CompactOptions()
    with exclusive(opts.lock, "rewrite"):
        rep = RewriteReport(repo.machine, dry_run=opts.dry_run)
        if not spec:
            rep.note = "nothing to rewrite"
            return rep
        rep.dictionaries = _dirty_dictionaries(repo, spec, rep)
        if not opts.dry_run:
            for d in rep.dictionaries:
                retire_dictionary(d)
            # Segments have fixed keys: fold them first, so that what holds the bytes is
            # packs, deltas and manifests, which can be replaced.
            rep.folded = _compact(repo, replace(opts, max_chain=0, keep=None, drop=()))
            rep.errors += rep.folded.errors
        _Run(repo, spec, opts, rep).run()
        rep.errors = _one_line_each(rep.errors)
        return rep


def _dirty_dictionaries(repo: Repository, spec: Rewrite, rep: RewriteReport) -> list[str]:
    out = []
    for info in repo.store.list(layout.dict_key(repo.machine, "")):
        dict_id = info.key.rsplit("/", 1)[-1]
        try:
            d = repo.dictionary(dict_id)
        except (FormatError, StoreError) as e:
            rep.errors.append(f"{e}; not looked into")
            continue
        if spec.in_bytes(d.data):
            out.append(dict_id)
    return out


def _one_line_each(errors: list[str]) -> list[str]:
    """The first line about each object (the fold and the rewrite both meet one that
    does not read)."""
    seen: set[str] = set()
    out = []
    for e in errors:
        about = e.split(": ", 1)[0]
        if about not in seen:
            seen.add(about)
            out.append(e)
    return out


class _Run:
    def __init__(self, repo: Repository, spec: Rewrite, opts: CompactOptions,
                 rep: RewriteReport) -> None:
        self.repo, self.spec, self.opts, self.rep = repo, spec, opts, rep
        self.masks: dict[tuple[bytes, int], list[mask.Range]] = {}
        self.sizes: dict[str, int] = {}
        self.leftovers: list[Delta] = []
        self.found: set[bytes] = set()  # the digests' values, found in the files
        self.unreadable: list[int] = []  # seqs of manifests, los of deltas, that do not read
        self.orphans: set[str] = set()  # dirty deltas no walk reaches
        self.left: set[str] = set()  # dirty deltas kept (a walk to them does not read)

    # -- what is there ------------------------------------------------------
    def run(self, detached: bool = False) -> None:
        repo, rep = self.repo, self.rep
        errors = list(rep.errors)
        snaps = current(repo.snapshots())
        if not snaps:
            self._segments_only()
            return
        manifests: list[Manifest] = []
        self.unreadable, self.orphans, self.left = [], set(), set()
        for seq, _, key in snaps:
            try:
                manifests.append(repo.read_manifest(key))
            except (FormatError, StoreError) as e:
                if key == snaps[-1][2]:
                    raise CompactError(f"the newest snapshot is unreadable, not rewriting "
                                       f"(run syncd verify): {e}") from e
                rep.errors.append(f"{e}; left as it is")
                self.unreadable.append(seq)
        newest = manifests[-1]
        try:
            groups = repo.read_groups(newest)
        except (FormatError, StoreError) as e:
            raise CompactError(f"the newest snapshot is unreadable, not rewriting: {e}") from e
        tree = _Tree()
        tree.start(newest, groups)
        # A dry run folds nothing first: what is pending (deltas after the newest
        # manifest, segments after them) is looked into as the fold would see it.
        self._find_masks(self._pending(tree, newest.seq) if self.opts.dry_run
                         else [*tree.live.values(), *tree.retained.values()])
        deltas, narrower = self._deltas()
        dicts = set(rep.dictionaries)

        def dirty(d: Delta) -> bool:
            return self._dirty_index(d.index, d.points) or \
                any(x.dict_id in dicts for x in d.index.extents)

        dirty_deltas = self._reached([d for d in deltas if dirty(d)], deltas, manifests)
        self.leftovers = [d for d in narrower if dirty(d)]
        packs = dict(repo.packs())
        dirty_packs = []
        for key, size in sorted(packs.items()):
            try:
                ix = repo.read_index(key, size)
            except (FormatError, StoreError) as e:
                rep.errors.append(f"{e}; its bytes, if any are dropped, stay")
                continue
            if self._dirty_index(ix, []):
                dirty_packs.append(key)
        dirty_manifests = [m for m in manifests[:-1] if self._dirty_manifest(m)]
        later = self._later(newest, groups)
        move = set(dirty_packs) | {d.key for d in dirty_deltas}
        # (a leftover's bytes are in the delta that replaced it: deleted, not moved)
        ours = {k for k, _ in rep.written}  # (what ``_detach`` wrote is no rewritten one)
        rep.rewritten = sorted((set(rep.rewritten) | move | {m.key for m in dirty_manifests})
                               - ours)
        dropped = sorted({os.fsdecode(e.path) for e in [*tree.live.values(),
                                                         *tree.retained.values()]
                          if self.spec.drops(e.path)})
        rep.files_dropped = dropped
        rep.ranges_masked = sum(len(v) for v in self.masks.values())
        newest_dirty = bool(move or dirty_manifests or dropped or self.leftovers
                            or dicts or self._dirty_manifest(newest)
                            or (self.opts.dry_run and later))
        if later and self.opts.dry_run:  # the fold takes them first
            rep.rewritten = sorted({*rep.rewritten, *later})
            later = []
        if later:
            rep.errors.append(f"{repo.where(later[0])}: {len(later)} segments after the "
                              "newest snapshot hold what goes and were not folded (beyond "
                              "what the machine's head or its writer confirmed, or shipped "
                              "meanwhile): run this again once its head covers them (a "
                              "daemon writes it every head_interval), with a PATTERN if "
                              "the files here are masked already")
        if not newest_dirty:
            rep.note = "nothing holds it" if not later else rep.note
            if not self.opts.dry_run:
                self._clean_head()
            # Replaced revisions a run left when it died before deleting them.
            stale = [k for k in self._stale(manifests, {}) if self._dirty_key(k)]
            if stale and not self.opts.dry_run:
                drep = CompactReport(repo.machine)
                _delete(repo, stale, drep)
                rep.deleted, rep.errors = drep.deleted, rep.errors + drep.errors
                rep.note = "nothing holds it but replaced snapshots, deleted"
            return
        if self.opts.dry_run:
            rep.note = "dry run: nothing written"
            self.sizes = {k: s for k, s in packs.items() if k in move}
            rep.bytes_deleted = sum(self.sizes.values()) + sum(d.size for d in dirty_deltas)
            return
        if not detached and self._detach(newest, tree, dirty_deltas):
            # Everything again from the newest manifest just written (what it found, it
            # finds again: its lines are not said twice).
            self.masks, self.leftovers = {}, []
            rep.errors, rep.left_alone = errors, []
            self.run(detached=True)
            return
        self._write(newest, tree, manifests, deltas, dirty_deltas, dirty_manifests, move,
                    packs)

    def _clean_head(self) -> None:
        """The head lists sessions and their catalog fields: written again without what
        goes (the same flush, so readers fold the same segments onto it)."""
        repo = self.repo
        try:
            h = repo.head()
        except (FormatError, StoreError) as e:
            self.rep.errors.append(f"{e}; not searched for what goes (readers pass over a "
                                   "head that does not read)")
            return
        if h is None:
            return
        sessions = [replace(s, fields=self._clean_fields(s.fields)) for s in h.sessions
                    if not self.spec.drops(s.path)]
        if sessions == h.sessions:
            return
        try:
            repo.write_head(replace(h, sessions=sessions))
        except StoreError as e:
            self.rep.errors.append(f"{repo.where(layout.head_key(repo.machine))}: still "
                                   f"lists what goes, not written again: {e}")
            return
        self.rep.rewritten.append(layout.head_key(repo.machine))

    def _pending(self, tree: _Tree, after: int) -> list[Entry]:
        """Every generation of ``tree`` with what the deltas and segments after seq
        ``after`` add, located (a dry run's view of what the fold would make)."""
        repo = self.repo
        chain = repo.delta_chain(after, None, self.rep.errors)
        for d in chain:
            tree.fold(d.key, d.index, d.points)
        for key, size in repo.segments(chain[-1].hi if chain else after):
            try:
                ix = repo.read_index(key, size)
            except (FormatError, StoreError) as e:
                self.rep.errors.append(f"{e}; not looked into")
                break
            tree.fold(key, ix, [point_of(ix)])
        return tree.located()

    def _later(self, newest: Manifest, groups: Any) -> list[str]:
        """The segments after the newest manifest that hold what goes. The fold leaves
        those past the head: the masks found so far are only the manifest's generations,
        so a value or a history line only those segments hold is looked for in them as a
        dry run would (else the run would say "nothing holds it" of what they hold)."""
        segs = list(self.repo.segments(newest.seq))
        if not segs or self.opts.dry_run:
            return [k for k, size in segs if self._dirty_segment(k, size)]
        probe = _Run(self.repo, self.spec, self.opts,
                     RewriteReport(self.repo.machine, dry_run=True))
        tree = _Tree()
        tree.start(newest, copy.deepcopy(groups))  # (folding changes the entries)
        probe._find_masks(probe._pending(tree, newest.seq))
        return [k for k, size in segs if probe._dirty_segment(k, size)]

    def _segments_only(self) -> None:
        # A machine never compacted (nor could be just now): nothing but segments, whose
        # keys are fixed.
        if self.opts.dry_run:  # what the fold would find in them
            tree = _Tree()
            self._find_masks(self._pending(tree, -1))
            segs = [k for k, n in self.repo.segments() if self._dirty_segment(k, n)]
            self.rep.rewritten = segs
            self.rep.files_dropped = sorted({os.fsdecode(e.path) for e in tree.live.values()
                                             if self.spec.drops(e.path)})
            self.rep.ranges_masked = sum(len(v) for v in self.masks.values())
            self.rep.note = "dry run: nothing written" if segs else "nothing holds it"
            return
        if any(self._dirty_segment(k, n) for k, n in self.repo.segments()):
            raise CompactError(f"{self.repo.machine}: its segments could not be folded "
                               "into a snapshot, so they cannot be rewritten (run syncd "
                               "compact, then this again)")
        self.rep.note = "nothing holds it"

    def _deltas(self) -> tuple[list[Delta], list[Delta]]:
        """The widest delta of each start (the chain), and the narrower ones (leftovers of
        a run that died before deleting them: redundant)."""
        chain: list[Delta] = []
        narrower: list[Delta] = []
        for lo, rows in by_start(self.repo.deltas()).items():
            read = False  # readers take the widest that reads: a wider one that does not
            for _, _, key, size in rows:  # makes no leftover of the one they take
                try:
                    (narrower if read else chain).append(self.repo.read_delta(key, size))
                    read = True
                except (FormatError, StoreError) as e:
                    self.rep.errors.append(f"{e}; left as it is")
                    self.unreadable.append(lo)
        return sorted(chain, key=lambda d: d.lo), narrower

    def _leads_to(self, d: Delta, manifests: list[Manifest], by_lo: dict[int, Delta]) -> bool:
        """Whether a walk reaches delta ``d``: from the newest manifest before it (or the
        beginning), delta after delta, as readers step."""
        base = max((m.seq for m in manifests if m.seq < d.lo), default=-1)
        at = base + 1
        while at < d.lo and at in by_lo:
            at = by_lo[at].hi + 1
        return at == d.lo

    def _reached(self, dirty: list[Delta], deltas: list[Delta], manifests: list[Manifest]
                 ) -> list[Delta]:
        """The dirty deltas to rewrite. One that no walk reaches holds no point: retention
        thinned its points out (a prune drops it later), so it goes without a replacement
        (``orphans``). One that a walk would reach but for an object that does not read
        stays, in one line (``left``): its points may come back with that object. The
        bytes the newest manifest finds in either are moved (masked) all the same."""
        by_lo = {d.lo: d for d in deltas}
        for d in dirty:
            if self._leads_to(d, manifests, by_lo):
                continue
            if any(u < d.lo for u in self.unreadable):
                self.rep.errors.append(f"{self.repo.where(d.key)}: holds what goes, but a "
                                       "snapshot or delta before it does not read, so its "
                                       "points cannot be restated: left as it is")
                self.left.add(d.key)
            else:
                self.orphans.add(d.key)
        return dirty

    def _find_masks(self, entries: list[Entry]) -> None:
        """Every range to mask, found in each generation's bytes as the newest manifest
        locates them (it locates every generation any kept point names)."""
        spec = self.spec
        for e in entries:
            if spec.drops(e.path) or not e.extents or e.size == 0:
                continue
            history = e.path == HISTORY and bool(spec.forget)
            if not history and not spec.masking:
                continue
            ranges: list[mask.Range] = []
            chunks: Iterable[bytes] = self._bytes(e)
            if history and spec.masking:  # read twice: held once (history.jsonl is small)
                chunks = list(chunks)
            if history:
                ranges += mask.history_ranges(chunks, spec.forget)
            if spec.masking:
                values = spec.values_in(functools.partial(self._bytes, e), e.path)
                self.found |= set(values) - set(spec.redact)
                got, found = mask.value_places(chunks, values, spec.patterns,
                                               plain=not e.path.endswith(JSON_NAMES))
                ranges += got
                for f in found:
                    if f.why is not None:
                        self.rep.left_alone.append(
                            f"{os.fsdecode(e.path)} generation {e.gen} line {f.line_no}: "
                            f"{f.why}")
            if ranges:
                self.masks[(e.path, e.gen)] = sorted(ranges, key=lambda r: r.start)
                sid = session_owning(e.path)
                if sid is not None:
                    self.rep.digests.setdefault(sid, set()).update(
                        (r.digest, r.end - r.start) for r in ranges if not r.line)

    def _bytes(self, e: Entry) -> Iterator[bytes]:
        try:
            yield from self.repo.entry_bytes(e, e.size, WINDOW)
        except (FormatError, StoreError) as err:
            raise CompactError(f"{os.fsdecode(e.path)}: cannot be read to find what to "
                               f"mask, nothing written: {err}") from err

    # -- what is dirty ------------------------------------------------------
    def _overlaps(self, path: bytes, gen: int, start: int, end: int) -> bool:
        return any(r.start < end and start < r.end for r in self.masks.get((path, gen), ()))

    def _dirty_fields(self, fields: dict[str, str]) -> bool:
        return self.spec.masking and self._clean_fields(fields) != fields

    def _dirty_points(self, pts: list[Point]) -> bool:
        return any(self.spec.drops(c.path) for p in pts for c in p.changes) or any(
            self.spec.drops(path) or self._dirty_fields(f) for p in pts
            for path, _, f in p.catalog)

    def _dirty_index(self, ix: SegmentIndex, pts: list[Point]) -> bool:
        s = self.spec
        return (any(s.drops(x.path) or self._overlaps(x.path, x.gen, x.start, x.end)
                    for x in ix.extents)
                or any(s.drops(c.path) or s.drops(c.src) for c in ix.copies)
                or any(s.drops(t.path) for t in ix.tombstones)
                or any(s.drops(p) or self._dirty_fields(f) for p, (_, f) in ix.sessions.items())
                or self._dirty_points(pts))

    def _dirty_segment(self, key: str, size: int) -> bool:
        try:
            return self._dirty_index(self.repo.read_index(key, size), [])
        except (FormatError, StoreError):
            return False  # compaction stops there as before; verify says why

    def _dirty_key(self, key: str) -> bool:
        try:
            return self._dirty_manifest(self.repo.read_manifest(key))
        except (FormatError, StoreError):
            return False  # superseded anyway; what it holds cannot be judged

    def _dirty_manifest(self, m: Manifest) -> bool:
        try:
            groups = self.repo.read_groups(m)
            own = manifest_points(m)
        except (FormatError, StoreError) as e:
            self.rep.errors.append(f"{e}; left as it is")
            return False
        # (history.jsonl's extents name the sessions of their lines: ``sids``)
        return any(self.spec.drops(e.path) or self._names_forgotten(e)
                   for g in groups.values() for e in g.entries) \
            or any(self.spec.drops(s.path) or self._dirty_fields(s.fields)
                   for g in groups.values() for s in g.sessions) \
            or self._dirty_points(own[1] if own else [])

    def _names_forgotten(self, e: Entry) -> bool:
        return e.path == HISTORY and any(
            ids is not None and has_sid(ids, sid)
            for ids in e.sids.values() for sid in self.spec.forget)

    # -- what replaces it ---------------------------------------------------
    def _clean_points(self, pts: list[Point]) -> list[Point]:
        out = []
        for p in pts:
            changes = [c for c in p.changes if not self.spec.drops(c.path)]
            catalog = [(path, gen, self._clean_fields(f)) for path, gen, f in p.catalog
                       if not self.spec.drops(path)]
            out.append(Point(p.seq, p.time, changes, catalog))
        return out

    def _clean_fields(self, fields: dict[str, str]) -> dict[str, str]:
        if not self.spec.masking:
            return fields
        values = (*self.spec.redact, *sorted(self.found))
        return {k: mask.mask_text(v, values, self.spec.patterns) for k, v in fields.items()}

    def _clean_sessions(self, sessions: list[Session]) -> list[Session]:
        return [replace(s, fields=self._clean_fields(s.fields)) for s in sessions
                if not self.spec.drops(s.path)]

    def _transform(self, e: Entry, start: int, raw: bytes) -> bytes:
        ranges = self.masks.get((e.path, e.gen))
        return raw if not ranges else mask.apply(raw, start, ranges)

    def _write(self, newest: Manifest, tree: _Tree, manifests: list[Manifest],
               deltas: list[Delta], dirty_deltas: list[Delta],
               dirty_manifests: list[Manifest], move: set[str], packs: dict[str, int]) -> None:
        repo, rep, opts = self.repo, self.rep, self.opts
        for path in [p for p in tree.live if self.spec.drops(p)]:
            del tree.live[path]
        for k in [k for k in tree.retained if self.spec.drops(k[0])]:
            del tree.retained[k]
        for path in [p for p in tree.sessions if self.spec.drops(p)]:
            del tree.sessions[path]
        for s in tree.sessions.values():
            s.fields = self._clean_fields(s.fields)
        entries = tree.located()
        crep = CompactReport(repo.machine)
        crep.raw_bytes = sum(x.end - x.start for e in entries for k, x in e.extents
                             if k in move)
        lo = min([newest.seq, *(d.lo for d in dirty_deltas),
                  *((layout.pack_range(k) or (newest.seq, 0))[0] for k in move)])
        _write_packs(repo, entries, move, lo, tree, replace(opts, progress=opts.progress),
                     crep, transform=self._transform)
        rep.written += crep.packs_written
        final = Locator()
        for e in entries:
            final.add_all(e.extents)
        taken = {(s, r) for s, r, _ in repo.snapshots()}
        # First what replaces the older points: the older manifests that name what goes,
        # and each dirty delta as a manifest carrying its points (a delta ending at the
        # newest's seq is carried by the newest's own points). Until the newest is
        # replaced, it locates every byte those points name, so a kill leaves each file of
        # each point as it was or as it will be, never one that lost its bytes.
        last = next((d for d in dirty_deltas if d.hi == newest.seq
                     and d.key not in self.orphans | self.left), None)
        # Oldest first: a walk then meets what was rewritten before what was not, so a
        # file that goes either starts again at its next change as it was, or is gone;
        # the other way round, an older point would keep it at a stale size.
        by_lo = {d.lo: d for d in deltas}
        jobs: list[tuple[int, int, Manifest | Delta]] = [(m.seq, 0, m) for m in dirty_manifests]
        jobs += [(d.hi, 1, d) for d in dirty_deltas
                 if d is not last and d.key not in self.orphans | self.left]
        older: list[str] = []
        for _, _, x in sorted(jobs, key=lambda j: j[:2]):
            older.append(self._reissue(x, final, taken) if isinstance(x, Manifest) else
                         self._delta_as_manifest(x, manifests, by_lo, final, taken))
        self._read_back(older)
        # The dirty deltas are needed by no manifest now (``_detach``): their points are
        # the replacements' (or the newest's own), so they go before the newest changes:
        # once it does, a walk through one would name bytes that no object holds.
        gone = [d.key for d in [*dirty_deltas, *self.leftovers] if d.key not in self.left]
        drep = CompactReport(repo.machine)
        _delete(repo, gone, drep)
        if drep.errors:
            rep.errors += drep.errors
            rep.deleted = drep.deleted
            rep.errors.append("the newest snapshot is left as it was (run this again)")
            return
        own = self._own(newest)
        if last is not None and not own:
            own = {"lo": last.lo, **pointfmt.encode(self._clean_points(last.points))}
        top = self._put(newest.seq, newest.rev + 1, tree.time, tree.first_time or tree.time,
                        entries, tree.catalog(repo.machine), tree.projects, own, taken)
        self._read_back([top])
        referenced = {k for e in entries for k, _ in e.extents}
        doomed = [k for k in move if k in packs and k not in referenced]
        doomed += self._stale([newest, *manifests, *(repo.read_manifest(k) for k in older)],
                              {newest.seq: top})
        rep.bytes_deleted = sum(packs.get(k, 0) for k in doomed) + \
            sum(d.size for d in [*dirty_deltas, *self.leftovers] if d.key not in self.left)
        snaps = repo.snapshots()
        if snaps and current(snaps)[-1][2] != top:
            rep.errors.append(f"{repo.where(current(snaps)[-1][2])} appeared during the "
                              "rewrite; nothing more deleted (run it again)")
            rep.deleted = drep.deleted
            return
        _delete(repo, sorted(set(doomed)), drep)
        _sweep(repo, newest.seq, top, referenced, drep)
        self._drop_dictionaries(newest.seq, drep)
        rep.deleted = drep.deleted
        rep.errors += drep.errors
        self._clean_head()
        log.info("rewrote %d objects of %s (%d written, %d deleted)", len(rep.rewritten),
                 repo.machine, len(rep.written), len(rep.deleted))

    def _drop_dictionaries(self, seq: int, drep: CompactReport) -> None:
        """The dirty dictionaries, once no object left names them (a segment written
        before the writer stopped using one keeps it)."""
        if not self.rep.dictionaries:
            return
        named: set[str] = set()
        for key, size in self.repo.segments(seq):
            try:
                named |= {x.dict_id for x in self.repo.read_index(key, size).extents
                          if x.dict_id}
            except (FormatError, StoreError):
                named |= set(self.rep.dictionaries)  # unknown: kept
        for _, _, key, size in self.repo.deltas():
            with contextlib.suppress(FormatError, StoreError):
                named |= {x.dict_id for x in self.repo.read_delta(key, size).index.extents
                          if x.dict_id}
        for d in self.rep.dictionaries:
            if d in named:
                self.rep.errors.append(f"dictionary {d[:12]} holds what goes, and objects "
                                       "written meanwhile still use it: run this again")
            else:
                _delete(self.repo, [layout.dict_key(self.repo.machine, d)], drep)

    def _read_back(self, keys: list[str]) -> None:
        for key in keys:  # what readers will see, read back before anything goes
            try:
                self.repo.read_groups(self.repo.read_manifest(key))
            except (FormatError, StoreError) as e:
                raise CompactError(f"a rewritten snapshot does not read back, nothing "
                                   f"deleted: {e}") from e

    def _stale(self, read: list[Manifest], newer: dict[int, str]) -> list[str]:
        """Revisions below the current one of a seq whose current one reads (a run that
        died before deleting them left them: they may hold what goes)."""
        best = dict(newer)
        for m in read:
            if m.seq not in newer and m.key > best.get(m.seq, ""):
                best[m.seq] = m.key
        return [key for s, _, key in self.repo.snapshots() if s in best and key < best[s]]

    def _detach(self, newest: Manifest, tree: _Tree, dirty: list[Delta]) -> bool:
        """Make the newest manifest need no dirty delta, so that those can be deleted
        before it is replaced: their extents it names are copied into packs as they are,
        and a delta ending at its seq lends it its points. Returns whether it wrote one
        (the newest manifest is then another: everything is looked at again)."""
        entries = tree.located()
        keys = {d.key for d in dirty if d.key not in self.left}  # (those stay meanwhile)
        move = {k for e in entries for k, _ in e.extents if k in keys}
        last = next((d for d in dirty if d.hi == newest.seq
                     and d.key not in self.orphans | self.left), None)
        own = dict(newest.chain)
        if last is not None and manifest_points(newest) is None:
            own = {"lo": last.lo, **pointfmt.encode(last.points)}
        elif not move:
            return False
        repo, opts = self.repo, self.opts
        crep = CompactReport(repo.machine)
        lo = min([newest.seq, *(d.lo for d in dirty if d.key in move)])
        _write_packs(repo, entries, move, lo, tree, opts, crep)
        self.rep.written += crep.packs_written
        key = self._put(newest.seq, newest.rev + 1, tree.time, tree.first_time or tree.time,
                        entries, tree.catalog(repo.machine), tree.projects, own,
                        {(s, r) for s, r, _ in repo.snapshots()})
        self._read_back([key])
        return True

    def _own(self, m: Manifest) -> dict[str, Any]:
        got = manifest_points(m)
        if got is None:
            return {}
        return {"lo": got[0], **pointfmt.encode(self._clean_points(got[1]))}

    def _put(self, seq: int, rev: int, t: float, first: float, entries: list[Entry],
             sessions: list[Session], projects: dict[str, dict[str, Any]],
             own: dict[str, Any], taken: set[tuple[int, int]]) -> str:
        repo = self.repo
        while (seq, rev) in taken:
            rev += 1
        for _ in range(16):
            key = layout.snapshot_key(repo.machine, seq, rev)
            blob = build(repo.machine, seq, rev, t, first, entries, sessions, projects,
                         level=MANIFEST_LEVEL, cipher=repo.cipher(key), chain=own)
            try:
                repo.put(key, blob)
            except AlreadyExists:
                rev += 1
                continue
            taken.add((seq, rev))
            self.rep.written.append((key, len(blob)))
            return key
        raise CompactError(f"{repo.where(layout.snapshot_key(repo.machine, seq, rev))}: "
                           "too many revisions of one snapshot")

    def _relocated(self, entries: list[Entry], final: Locator) -> list[Entry]:
        out = []
        for e in entries:
            if self.spec.drops(e.path):
                continue
            got = final.extents(e.path, e.gen, e.size)
            if got and got[-1][1].end >= e.size:
                e = replace(e, extents=got, sids={})
            out.append(e)
        return out

    def _reissue(self, m: Manifest, final: Locator, taken: set[tuple[int, int]]) -> str:
        groups = self.repo.read_groups(m)
        entries = self._relocated([e for g in groups.values() for e in g.entries], final)
        sessions = self._clean_sessions([s for g in groups.values() for s in g.sessions])
        return self._put(m.seq, m.rev + 1, m.time, m.first_time, entries, sessions,
                         m.projects, self._own(m), taken)

    def _delta_as_manifest(self, d: Delta, manifests: list[Manifest], by_lo: dict[int, Delta],
                           final: Locator, taken: set[tuple[int, int]]) -> str:
        """A manifest at the delta's last seq: the tree as of it, and its points."""
        base = max((m for m in manifests if m.seq < d.lo), key=lambda m: m.seq, default=None)
        tree = _Tree()
        if base is not None:
            tree.start(base, self.repo.read_groups(base))
        chain: list[Delta] = []
        at = (base.seq if base is not None else -1) + 1
        while at <= d.lo and at in by_lo and by_lo[at] is not d:
            chain.append(by_lo[at])
            at = by_lo[at].hi + 1
        if at != d.lo:
            raise CompactError(f"{self.repo.where(d.key)}: no snapshot and deltas lead to it; "
                               "not rewriting it (run syncd verify)")
        for x in [*chain, d]:
            tree.fold(x.key, x.index, x.points)
        if tree.first_time is None:
            tree.first_time = d.time
        live = [e for e in tree.live.values()]
        entries = self._relocated(live, final)
        sessions = self._clean_sessions(tree.catalog(self.repo.machine))
        own = {"lo": d.lo, **pointfmt.encode(self._clean_points(d.points))}
        return self._put(d.hi, 0, d.time, tree.first_time, entries, sessions, tree.projects,
                         own, taken)


__all__ = ["Rewrite", "RewriteReport", "rewrite"]

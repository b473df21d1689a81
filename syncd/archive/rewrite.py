"""Rewrite: take sessions or values out of every point in time of a machine's backup.

``forget`` drops every file of some sessions (``sessionfiles``) and masks their lines of
``history.jsonl``; ``redact`` masks values (``mask``). Masks keep each byte range's
length, so every other file at every point restores byte for byte as before, and only
the objects that hold what goes are rewritten.

The order is compaction's (docs/FORMAT.md, "Writing order"), so a kill at any point
leaves a store that restores (with what was to go still in it until a run completes):

1. the segments since the last compaction are folded into a manifest (``compact``);
2. the packs and deltas that hold a dropped file, a masked byte or a catalog field to
   mask are *dirty*; their other bytes, masked, go into new packs;
3. new manifests: the newest one again (its next revision), each older manifest that
   names what goes (its next revision), and each dirty delta as a manifest at the
   delta's last seq carrying the delta's points (readers step from a manifest to a delta
   or to a manifest whose own points start there: the same walk);
4. each is read back; only then are the dirty objects and replaced revisions deleted.
"""

from __future__ import annotations

import contextlib
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
from syncd.format.points import Locator, Point
from syncd.format.segment import SegmentIndex
from syncd.format.snapshot import HISTORY, Entry, Manifest, build, current
from syncd.repository import Repository
from syncd.sessionfiles import session_owning
from syncd.store import layout

log = logging.getLogger("syncd.rewrite")

# Bytes of a file read at a time while looking for what to mask.
WINDOW = 16 << 20


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


class _Run:
    def __init__(self, repo: Repository, spec: Rewrite, opts: CompactOptions,
                 rep: RewriteReport) -> None:
        self.repo, self.spec, self.opts, self.rep = repo, spec, opts, rep
        self.masks: dict[tuple[bytes, int], list[mask.Range]] = {}
        self.sizes: dict[str, int] = {}
        self.leftovers: list[Delta] = []
        self.found: set[bytes] = set()  # the digests' values, found in the files

    # -- what is there ------------------------------------------------------
    def run(self) -> None:
        repo, rep = self.repo, self.rep
        snaps = current(repo.snapshots())
        if not snaps:
            self._segments_only()
            return
        manifests: list[Manifest] = []
        for _, _, key in snaps:
            try:
                manifests.append(repo.read_manifest(key))
            except (FormatError, StoreError) as e:
                if key == snaps[-1][2]:
                    raise CompactError(f"the newest snapshot is unreadable, not rewriting "
                                       f"(run syncd verify): {e}") from e
                rep.errors.append(f"{e}; left as it is")
        newest = manifests[-1]
        try:
            groups = repo.read_groups(newest)
        except (FormatError, StoreError) as e:
            raise CompactError(f"the newest snapshot is unreadable, not rewriting: {e}") from e
        tree = _Tree()
        tree.start(newest, groups)
        self._find_masks(tree)
        deltas, narrower = self._deltas()
        dicts = set(rep.dictionaries)
        dirty_deltas = [d for d in deltas if self._dirty_index(d.index, d.points)
                        or any(x.dict_id in dicts for x in d.index.extents)]
        self.leftovers = [d for d in narrower if self._dirty_index(d.index, d.points)
                          or any(x.dict_id in dicts for x in d.index.extents)]
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
        later = [k for k, size in repo.segments(newest.seq)
                 if self._dirty_segment(k, size)]
        move = set(dirty_packs) | {d.key for d in dirty_deltas}
        # (a leftover's bytes are in the delta that replaced it: deleted, not moved)
        rep.rewritten = sorted(move) + [m.key for m in dirty_manifests]
        dropped = sorted({os.fsdecode(e.path) for e in [*tree.live.values(),
                                                         *tree.retained.values()]
                          if self.spec.drops(e.path)})
        rep.files_dropped = dropped
        rep.ranges_masked = sum(len(v) for v in self.masks.values())
        newest_dirty = bool(move or dirty_manifests or dropped or self.leftovers
                            or dicts or self._dirty_manifest(newest))
        if later:
            rep.errors.append(f"{len(later)} segments written during the rewrite hold what "
                              "goes (the daemon ships it until it knows): run it again")
        if not newest_dirty:
            rep.note = "nothing holds it" if not later else rep.note
            return
        if self.opts.dry_run:
            rep.note = "dry run: nothing written"
            self.sizes = {k: s for k, s in packs.items() if k in move}
            rep.bytes_deleted = sum(self.sizes.values()) + sum(d.size for d in dirty_deltas)
            return
        self._write(newest, tree, manifests, deltas, dirty_deltas, dirty_manifests, move,
                    packs)

    def _segments_only(self) -> None:
        # A machine never compacted (nor could be just now): nothing but segments, whose
        # keys are fixed.
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
        for rows in by_start(self.repo.deltas()).values():
            for i, (_, _, key, size) in enumerate(rows):
                try:
                    (narrower if i else chain).append(self.repo.read_delta(key, size))
                except (FormatError, StoreError) as e:
                    self.rep.errors.append(f"{e}; left as it is")
        return sorted(chain, key=lambda d: d.lo), narrower

    def _find_masks(self, tree: _Tree) -> None:
        """Every range to mask, found in each generation's bytes as the newest manifest
        locates them (it locates every generation any kept point names)."""
        spec = self.spec
        for e in [*tree.live.values(), *tree.retained.values()]:
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
                got, found = mask.value_places(chunks, values, spec.patterns)
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

    def _dirty_manifest(self, m: Manifest) -> bool:
        try:
            groups = self.repo.read_groups(m)
            own = manifest_points(m)
        except (FormatError, StoreError) as e:
            self.rep.errors.append(f"{e}; left as it is")
            return False
        return any(self.spec.drops(e.path) for g in groups.values() for e in g.entries) \
            or any(self.spec.drops(s.path) or self._dirty_fields(s.fields)
                   for g in groups.values() for s in g.sessions) \
            or self._dirty_points(own[1] if own else [])

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
        new_keys: list[str] = []
        # The newest again; a delta ending at its seq is carried by it (its points).
        last = next((d for d in dirty_deltas if d.hi == newest.seq), None)
        own = self._own(newest)
        if last is not None and not own:
            own = {"lo": last.lo, **pointfmt.encode(self._clean_points(last.points))}
        top = self._put(newest.seq, newest.rev + 1, tree.time, tree.first_time or tree.time,
                        entries, tree.catalog(repo.machine), tree.projects, own, taken)
        new_keys.append(top)
        for m in dirty_manifests:
            new_keys.append(self._reissue(m, final, taken))
        by_lo = {d.lo: d for d in deltas}
        for d in dirty_deltas:
            if d is last:
                continue
            new_keys.append(self._delta_as_manifest(d, manifests, by_lo, final, taken))
        for key in new_keys:  # what readers will see, read back before anything goes
            try:
                repo.read_groups(repo.read_manifest(key))
            except (FormatError, StoreError) as e:
                raise CompactError(f"a rewritten snapshot does not read back, nothing "
                                   f"deleted: {e}") from e
        referenced = {k for e in entries for k, _ in e.extents}
        doomed = [d.key for d in [*dirty_deltas, *self.leftovers]]
        doomed += [k for k in move if k in packs and k not in referenced]
        replaced = {(m.seq, m.key) for m in [newest, *dirty_manifests]}
        doomed += [key for s, r, key in repo.snapshots()
                   if any(s == seq and key <= old for seq, old in replaced)]
        rep.bytes_deleted = sum(packs.get(k, 0) for k in doomed) + \
            sum(d.size for d in dirty_deltas)
        snaps = repo.snapshots()
        if snaps and current(snaps)[-1][2] != top:
            rep.errors.append(f"{repo.where(current(snaps)[-1][2])} appeared during the "
                              "rewrite; nothing deleted (run it again)")
            return
        drep = CompactReport(repo.machine)
        _delete(repo, sorted(set(doomed)), drep)
        _sweep(repo, newest.seq, top, referenced, drep)
        self._drop_dictionaries(newest.seq, drep)
        rep.deleted = drep.deleted
        rep.errors += drep.errors
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

"""The shipper: reads the new bytes of dirty files into segments and makes them durable.

Local state advances only after the store confirmed a segment: a crash between the two
ships the bytes again or adopts the segment, never skips them.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import json
import logging
import os
import platform
import socket
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path

import zstandard

from syncd.archive import redactions
from syncd.backup.marks import cut_point, marks_of
from syncd.backup.patch import OLD_MAX, OldLines, file_chunks, patch
from syncd.backup.state import FileState, ImportedFile, OriginRecord, RestoredFile, State
from syncd.claude import Selection
from syncd.errors import (
    AlreadyExists,
    BackupError,
    FormatError,
    NoBackup,
    NotFound,
    StateError,
    StoreError,
    SyncError,
)
from syncd.format.catalog import (
    FIRST,
    MetaScanner,
    Origin,
    session_of,
    session_of_any,
    title_file_fields,
    title_file_owner,
)
from syncd.format.segment import FRAME_MAX, Copy, Extent, Redaction, SegmentWriter, Tombstone
from syncd.format.snapshot import Entry, current
from syncd.gitinfo import project_info
from syncd.repository import Repository
from syncd.security.lease import Lease
from syncd.sessionfiles import HISTORY, history_session, session_owning
from syncd.store import layout
from syncd.view import Backup, load_backup
from syncd.worker import worker

log = logging.getLogger("syncd.ship")

# A state row whose bytes the store lost: the next flush ships a new generation.
LOST = b"lost"
# The reason of the extent that brings a deleted file's generation back (FORMAT.md).
REVIVED = "revived: restored as it was shipped"
# The reasons of extents an import wrote (FORMAT.md): from a followed machine as it
# is, or merged with this machine's own lines.
IMPORTED_FROM = "imported from "


def imported_from(machine: str) -> str:
    return IMPORTED_FROM + machine


def merged_from(machine: str) -> str:
    return f"merged with machine {machine}'s copy"


# Revive no deletion older than this (default: a day less than tombstone_keep's 180 d).
REVIVE_WITHIN = 179 * 86400.0
# A generation or an offset past these is no writer's (a rewrite a second for a million
# years; a file of a petabyte): adopting one would leave the state unable to go on.
GEN_MAX = 1 << 45
OFFSET_MAX = 1 << 50
# A snapshot this many seqs ahead of the state is no writer's: years of flushes.
MAX_AHEAD = 1 << 32
# Passed-over seqs the state remembers until compaction folds them (each one took a
# planted object: a PUT of whoever planted it).
PASSED_KEPT = 4096
# Forgotten sessions' tombstones one flush carries at most (the rest go with the next).
FORGETS_MAX = 4096
# Redactions' tombstones one flush carries at most (each of at most 256 values).
REDACTS_MAX = 64
# Rewrite detection hashes the first and last shipped bytes, not the whole file:
# transcripts are append-only, and a rewrite touches the head or the tail.
CHECK_HEAD = 4 << 10
CHECK_TAIL = 64 << 10
# A transcript rewritten whole ships as a patch of the generation before it from this
# size on (smaller ones ship whole: a patch would save little), reading its frames in
# runs of about PATCH_RUN raw bytes.
PATCH_MIN = 64 << 10
PATCH_RUN = 16 << 20
# Claude cuts a withdrawn row within its file's last 64 KiB; a "cut" further back is a
# rewrite, whose patch also keeps what follows the change.
CUT_BACK = 64 << 10


def masked_history(data: bytes, sids: Collection[str], *, at_end: bool
                   ) -> tuple[bytes, bytes]:
    """``data`` (bytes of history.jsonl) cut after its last whole line, unless it holds
    none and is not the file's end (a line of 4 MiB), and what is shipped of it: the lines
    naming a session of ``sids`` as spaces. A last line without its newline at the
    file's end waits (b"", b"": it is being written)."""
    cut = data.rfind(b"\n") + 1
    if cut == 0:
        if at_end:
            return b"", b""
        cut = len(data)
    data = data[:cut]
    out = []
    for line in data.splitlines(keepends=True):
        if b"sessionId" in line and history_session(line) in sids:
            body = len(line) - (1 if line.endswith(b"\n") else 0)
            line = b" " * body + line[body:]
        out.append(line)
    return data, b"".join(out)


def check_hash(fd: int, length: int) -> bytes:
    h = hashlib.sha256()
    h.update(os.pread(fd, min(CHECK_HEAD, length), 0))
    tail = max(CHECK_HEAD, length - CHECK_TAIL)
    if tail < length:
        h.update(os.pread(fd, length - tail, tail))
    return h.digest()


def holds(full: bytes, size: int, digest: bytes) -> int | None:
    """The local file's size when its first ``size`` bytes have check hash ``digest``,
    else None."""
    try:
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        now = os.fstat(fd).st_size
        return now if now >= size and check_hash(fd, size) == digest else None
    finally:
        os.close(fd)


def shipped_bytes(state: State, root: bytes, rel: bytes) -> int:
    """How many of the local file ``rel``'s first bytes this machine has shipped (as its
    generation the state knows, still at its head)."""
    row = state.get(rel)
    if row is None or row.deleted_at is not None or not row.offset or \
            row.check_hash in (None, LOST):
        return 0
    digest = row.check_hash
    assert digest is not None
    return 0 if holds(os.path.join(root, rel), row.offset, digest) is None else row.offset


@dataclass
class FlushResult:
    segments: list[int] = field(default_factory=list)
    raw_bytes: int = 0
    stored_bytes: int = 0
    files: int = 0
    tombstones: int = 0
    # Files that could not be read this time: they stay pending, with the reason.
    problems: dict[bytes, str] = field(default_factory=dict)
    # Files that changed while being read: shipped as read, to be looked at again.
    requeue: set[bytes] = field(default_factory=set)


def _shipped(files: int, raw: int, deleted: int) -> str:
    """What a segment holds, as a log line says it: a flush of deletions alone is not
    "0 files, 0 bytes"."""
    parts = [f"{files} files, {raw} bytes"] if files or raw or not deleted else []
    if deleted:
        parts.append(f"{deleted} deletion{'' if deleted == 1 else 's'}")
    return ", ".join(parts)


def machine_facts(root: bytes) -> dict[str, str]:
    """Who this machine is, as machine.json and the head say it."""
    return {"hostname": socket.gethostname(), "os": f"{platform.system()} {platform.release()}",
            "home": str(Path.home()), "claude_root": os.fsdecode(root)}


class _Batch:
    """One segment being filled, with the state rows it will commit."""

    def __init__(self, writer: SegmentWriter) -> None:
        self.writer = writer
        self.updates: dict[bytes, FileState] = {}
        # The forgotten sessions whose tombstone this segment carries.
        self.forgets: list[str] = []
        # The redactions whose tombstone it carries.
        self.redacts: list[Redaction] = []


class Shipper:
    def __init__(self, *, root: Path, repo: Repository, state: State, selection: Selection,
                 level: int = 3, segment_max: int = 64 << 20,
                 clock: Callable[[], float] = time.time,
                 should_stop: Callable[[], bool] = lambda: False,
                 lease: Lease | None = None,
                 prepare: Callable[[], None] = lambda: None,
                 revive_within: float = REVIVE_WITHIN) -> None:
        self.root = os.fsencode(root)
        # This machine's objects; its cipher is set once the engine unlocked the store
        # (every segment and machine.json of an encrypted store is sealed).
        self.repo = repo
        self.state = state
        self.machine = repo.machine
        self.selection = selection
        self.level = level
        self.segment_max = segment_max
        self.clock = clock
        self.should_stop = should_stop
        # One writer per machine: checked (locally) before every PUT.
        self.lease = lease
        # Called before the first PUT (and before anything else touches the store): the
        # engine connects there (unlock, lease), so reading starts before it is done.
        self.prepare = prepare
        # A deleted generation is revived only this long after its deletion: well before
        # compaction lets its tombstone expire (tombstone_keep), after which the store
        # holds it only for older snapshots and an empty extent could not bring it back.
        self.revive_within = revive_within
        # Told the size of every frame read: progress bars, the daemon's watchdog.
        self.progress: Callable[[int], None] = lambda n: None
        self._recovered = False
        # The segment being uploaded: its batch, its size and the PUT's future.
        self._upload: tuple[_Batch, int, Future[str]] | None = None
        # Per flush: does the directory lead through a symlink (see _through_symlink).
        self._dirs: dict[bytes, bool] = {}
        self._verified = False  # set by ship: the lease was HEADed before its first PUT
        self._dict: tuple[str, zstandard.ZstdCompressionDict] | None = None
        self._projects_seen: set[str] = set()
        # Files whose bytes the store lost (``audit``): shipped again by the next flush.
        self.repair: set[bytes] = set()
        self._audited = False
        # Per flush: the sessions the state knows (looked up for a new session file).
        self._sessions: set[str] | None = None
        # Per flush: files that begin with a copy of another generation (their catalog
        # starts from that one's).
        self._copied: dict[bytes, tuple[bytes, int]] = {}
        # Per flush: the sessions forgotten here (``syncd forget``, or a followed
        # machine's tombstone), re-read each flush: the CLI writes them from another
        # process. None of their files is shipped, nor its deletion.
        self._forgotten: set[str] = set()

    # -- recovery -----------------------------------------------------------
    def recover(self) -> int:
        """Adopt segments the store has beyond our state (a crash after PUT, before commit),
        then check that what the store confirmed earlier is still there (``audit``).

        Returns how many segments were adopted plus how many files are to be shipped
        again. Cheap when all is well: one HEAD and two LISTs.
        """
        adopted = 0
        snaps = current(self.repo.snapshots())
        if snaps and snaps[-1][0] >= self.state.next_seq:
            self._adopt_snapshot(snaps[-1][2])
            adopted += 1
        folded = self.repo.folded(snaps)
        if folded >= self.state.next_seq:
            self._adopt_deltas(folded)
            adopted += 1
        self._forget_passed(lambda seq: seq <= folded)  # compaction folded them
        adopted += self._take_next()
        if not self._audited:
            try:
                adopted += len(self.audit(snaps))
            except (FormatError, BackupError) as e:
                # Not a reason to stop backing up: said, and looked at again hourly.
                self._audited = True
                log.warning("cannot check the store for lost segments: %s", e)
        if not self.state.meta("machine_json"):
            self._write_machine_json()
        self._recovered = True
        return adopted

    def audit(self, snaps: list[tuple[int, int, str]] | None = None) -> set[bytes]:
        """Are the segments the store confirmed still there? Returns the files to ship
        again (also kept in ``repair`` until shipped).

        A segment can be lost in the store (deleted by hand, a lifecycle rule, a provider's
        fault, a rollback). Its files are noticed here and shipped again from the local
        tree as new generations. Lost seqs at the end are used again; one lost between two
        the store holds gets an empty segment in its place, so seqs stay contiguous for
        readers. Run at start and hourly: two LISTs.
        """
        last = self.state.next_seq - 1
        if snaps is None:
            snaps = current(self.repo.snapshots())
        missing, present = self._missing(snaps, last)
        if missing:
            # A compaction between the two LISTs deletes the segments its manifest holds.
            snaps = current(self.repo.snapshots())
            missing, present = self._missing(snaps, last)
        if not missing:
            self._audited = True
            return set()
        # A seq passed over whose object went since held nothing of ours: it only gets
        # its stand-in (or is written anew), nothing is shipped again, nothing is said.
        lost = [seq for seq in missing if seq not in self.state.passed_over()]
        try:
            view = load_backup(self.repo) if lost else Backup(self.machine, {})
        except NoBackup:  # everything is gone
            view = Backup(self.machine, {})
        marks: list[FileState] = []
        for row in self.state.files() if lost else ():
            have = view.files.get(row.path)
            if row.deleted_at is not None:
                # Its tombstone was lost when the store still shows it live; a file the
                # store no longer lists at all left the snapshots (tombstone_keep).
                if have is not None and have.gen == row.gen and have.deleted_at is None:
                    marks.append(row.but(deleted_at=None))  # the tombstone goes again
            elif have is None or have.gen != row.gen or _reach(have) < row.offset or \
                    have.deleted_at is not None:
                # Lost bytes, or a lost revival (the store shows it deleted): shipped again.
                marks.append(row.but(dev=0, ino=0, check_hash=LOST))
        self.state.touch(marks)
        self.repair |= {m.path for m in marks}
        # The seqs lost at the end are written again by the next flushes; one lost
        # between two the store holds gets an empty stand-in.
        newest = max(present | {self.repo.folded(snaps)})
        for seq in missing:
            if seq < newest:
                self._fill(seq, self._time_near(seq, present))
        if newest < last:
            self.state.set_meta(next_seq=str(newest + 1))
            self._forget_passed(lambda seq: seq > newest)  # free again: written anew
        self._audited = True
        if not lost:
            return self.repair
        note = (f"segments {_seqs(lost)} of machine {self.machine}, confirmed earlier, are "
                f"missing from {self.repo.url}: shipping {len(marks)} files again from the "
                "local tree")
        log.warning("%s", note)
        self.state.set_meta(store_repair=json.dumps({"time": self.clock(), "note": note}))
        return self.repair

    def _missing(self, snaps: list[tuple[int, int, str]], last: int
                 ) -> tuple[list[int], set[int]]:
        """The seqs up to ``last`` after the newest manifest that the store does not hold,
        and those it holds."""
        base = self.repo.folded(snaps)
        if base >= last:
            return [], set()
        present = {seq for key, _ in self.repo.segments(base)
                   if (seq := layout.segment_seq(key)) is not None}
        return [seq for seq in range(base + 1, last + 1) if seq not in present], present

    def _time_near(self, seq: int, present: set[int]) -> float | None:
        """A time for the stand-in of lost ``seq`` that keeps times growing with seqs
        (a point-in-time restore relies on it): that of the next segment the store holds
        (the previous one's, when that cannot be read). None: neither reads."""
        for near in (min((s for s in present if s > seq), default=None),
                     max((s for s in present if s < seq), default=None)):
            if near is None:
                continue
            try:
                return self.repo.read_index(layout.segment_key(self.machine, near)).time
            except FormatError as e:
                log.warning("cannot read the time of %s: %s", near, e)
        return None

    def _fill(self, seq: int, time_: float | None) -> None:
        """An empty segment in place of lost ``seq`` (without a time none can be made: the
        gap stays, readers report it, the files are whole again anyway)."""
        if time_ is None:
            return
        key = layout.segment_key(self.machine, seq)
        w = SegmentWriter(self.machine, seq, time_, cipher=self.repo.cipher(key))
        w.index.extra = {"lost": True}
        if self.lease is not None:
            self.lease.ensure()
        with contextlib.suppress(AlreadyExists):  # another run filled it
            self.repo.put(key, w.finish())

    def _write_machine_json(self) -> None:
        doc = {"machine": self.machine, **machine_facts(self.root), "created": self.clock(),
               "format": 1}
        if self.lease is not None:
            self.lease.ensure()
        self.repo.write_info(doc)  # one written by an earlier run stays
        self.state.set_meta(machine_json="1")

    def _take_next(self) -> int:
        """Adopt or pass over whatever holds our next seq, as long as something does (one
        HEAD when nothing does); returns how many seqs it moved past."""
        moved = 0
        while (size := self.repo.size_of(layout.segment_key(
                self.machine, self.state.next_seq))) is not None:
            if not self._adopt(self.state.next_seq, size):
                break
            moved += 1
        return moved

    def _adopt(self, seq: int, size: int) -> bool:
        """Adopt the object at our next seq ``seq`` when it is our segment of that seq (an
        earlier run stopped between PUT and commit); pass the seq over when it is not.
        False: it went meanwhile, the seq is free again."""
        key = layout.segment_key(self.machine, seq)
        if self.lease is not None:
            # A writer that took our lease over may have written it: not our own past.
            self.lease.verify()
        try:
            ix = self.repo.read_index(key, size)
        except NotFound:
            return False
        except FormatError as err:
            self._pass_over(seq, str(err))
            return True
        if ix.machine != self.machine or ix.seq != seq:
            self._pass_over(seq, f"{self.repo.where(key)}: its index says machine "
                                 f"{ix.machine!r} seq {ix.seq}")
            return True
        odd = [x.path for x in ix.extents if not (0 <= x.gen <= GEN_MAX and
                                                  0 <= x.start <= x.end <= OFFSET_MAX)] + \
            [t.path for t in ix.tombstones if not 0 <= t.gen <= GEN_MAX] + \
            [c.path for c in ix.copies if not (c.gen <= GEN_MAX and c.stop <= OFFSET_MAX)]
        if odd:
            # No writer of ours gets there: the state could not even hold what follows.
            self._pass_over(seq, f"{self.repo.where(key)}: it names {odd[0]!r} at a "
                                 "generation or offset no writer makes", replace=True)
            return True
        ends: dict[bytes, tuple[int, int, int, int]] = {}
        held: dict[bytes, list[Extent]] = {}
        copied: dict[bytes, list[Copy]] = {}
        for c in ix.copies:  # a cut with nothing after it is a copy alone
            ends[c.path] = (c.gen, c.stop, c.mode, c.mtime_ns)
            held.setdefault(c.path, [])
            copied.setdefault(c.path, []).append(c)
        for e in ix.extents:
            ends[e.path] = (e.gen, e.end, e.mode, e.mtime_ns)
            held.setdefault(e.path, []).append(e)
        updates: list[FileState] = []
        for path, (gen, end, mode, mtime_ns) in ends.items():
            updates.append(self._adopted_state(path, gen, end, mode, mtime_ns, held[path],
                                               copied.get(path, ())))
        for t in ix.tombstones:
            prev = self.state.get(t.path)
            updates.append((prev or FileState(t.path, t.gen, 0, 0, 0, 0, 0, None))
                           .but(deleted_at=t.time))
        if ix.forgotten:  # what its flush marked: their files ship anew once lifted
            sids = {sid for sid, _ in ix.forgotten}
            named = {u.path for u in updates}
            updates += [mark for row in self.state.files() if row.path not in named and
                        session_owning(row.path) in sids and (mark := _lost(row)) is not None]
        self.state.commit(seq, updates, ix.sessions)
        if ix.forgotten:  # their tombstones are in the store: not shipped again
            self.state.announce_forgotten(sid for sid, _ in ix.forgotten)
        if ix.redacted:
            redactions.announced(self.state, ix.redacted)
        log.warning("adopted segment %s already in the store (%d files): a previous run "
                    "stopped between upload and commit", key, len(updates))
        return True

    def _pass_over(self, seq: int, why: str, replace: bool = False) -> None:
        """An object that is not this machine's segment of ``seq`` holds it (planted,
        damaged, foreign): the next flush takes the next seq (docs/FORMAT.md, "A seq
        passed over"). None of our bytes are in it, so nothing is lost; readers report
        it and walk on. ``replace``: one that reads as a segment of ours (readers would
        take its files for this machine's) is deleted, an empty stand-in in its place."""
        if replace:
            key = layout.segment_key(self.machine, seq)
            try:
                if self.lease is not None:
                    self.lease.ensure()
                self.repo.delete([key])
                self._fill(seq, self.clock())
            except StoreError as e:  # it stays passed over; compaction deletes it
                log.warning("cannot replace %s: %s", self.repo.where(key), e)
        note = (f"{why}: not this machine's segment {seq:016x}, so that seq is passed over "
                f"(the next flush takes {seq + 1:016x})")
        log.warning("%s", note)
        passed = sorted(self.state.passed_over() | {seq})[-PASSED_KEPT:]
        self.state.set_meta(next_seq=str(seq + 1), passed_over=json.dumps(passed),
                            passed_over_note=json.dumps({"time": self.clock(), "note": note}))

    def _forget_passed(self, done: Callable[[int], bool]) -> None:
        passed = self.state.passed_over()
        if any(done(seq) for seq in passed):
            self.state.set_meta(passed_over=json.dumps(sorted(
                seq for seq in passed if not done(seq))))

    def _adopt_snapshot(self, key: str) -> None:
        # Our state is older than the store's newest snapshot (it was lost, or restored
        # from an old copy) and the segments it would adopt were compacted away.
        m = self.repo.read_manifest(key)
        if m.machine != self.machine:
            raise FormatError(f"{self.repo.where(key)}: written by machine {m.machine!r}, "
                               "not by us; refusing to continue")
        if m.seq - self.state.next_seq > MAX_AHEAD or m.time > self.clock() + 86400:
            # Adopting it would move this machine's seqs there, and the next compaction
            # would delete every segment below it: a manifest no writer of ours made.
            raise FormatError(f"{self.repo.where(key)}: a snapshot at seq {m.seq:016x} (time "
                              f"{m.time:.0f}) far beyond this machine's seq "
                              f"{self.state.next_seq:016x}: refusing to adopt it (planted "
                              "or foreign; remove it from the store)")
        updates: list[FileState] = []
        catalog: dict[bytes, tuple[int, dict[str, str]]] = {}
        for g in self.repo.read_groups(m).values():
            catalog.update((s.path, (s.gen, s.fields)) for s in g.sessions)
            for e in g.entries:
                if e.retained:
                    continue
                st = self._adopted_state(e.path, e.gen, e.size, e.mode, e.mtime_ns)
                updates.append(st if e.deleted_at is None else st.but(deleted_at=e.deleted_at))
        self.state.commit(m.seq, updates, catalog)
        log.warning("adopted snapshot %s (%d files): the local state was behind the store",
                    key, len(updates))

    def _adopt_deltas(self, folded: int) -> None:
        # The same, when deltas after the newest snapshot folded the segments away.
        if folded - self.state.next_seq > MAX_AHEAD:
            raise FormatError(f"{self.repo.url}: deltas up to seq {folded:016x}, far beyond "
                              f"this machine's seq {self.state.next_seq:016x}: refusing to "
                              "adopt them (planted or foreign; remove them from the store)")
        view = load_backup(self.repo)
        if view.last_seq is None or view.last_seq < folded:
            raise BackupError(f"{self.repo.url}: the deltas up to seq {folded:016x} do not "
                              f"read ({'; '.join(view.errors[:2])})")
        if view.last_time is not None and view.last_time > self.clock() + 86400:
            raise FormatError(f"{self.repo.url}: deltas up to seq {folded:016x} made at "
                              f"{view.last_time:.0f}, far beyond this machine's clock: "
                              "refusing to adopt them (planted or foreign; remove them "
                              "from the store)")
        updates = [self._adopted_state(e.path, e.gen, e.size, e.mode, e.mtime_ns)
                   for e in view.files.values()]
        updates = [u if e.deleted_at is None else u.but(deleted_at=e.deleted_at)
                   for u, e in zip(updates, view.files.values(), strict=True)]
        self.state.commit(view.last_seq, updates,
                          {s.path: (s.gen, s.fields) for s in view.sessions.values()})
        log.warning("adopted the deltas up to seq %d (%d files): the local state was behind "
                    "the store", view.last_seq, len(updates))

    def _adopted_state(self, path: bytes, gen: int, end: int, mode: int,
                       mtime_ns: int, extents: Iterable[Extent] = (),
                       copies: Iterable[Copy] = ()) -> FileState:
        # Trust the local file as the segment's source only if its bytes still match
        # (those of ``extents``, when given: the segment's own bytes of it, and those
        # ``copies`` name, as the state proves them); otherwise a zero inode forces a
        # fresh generation on the next flush.
        full = os.path.join(self.root, path)
        try:
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return FileState(path, gen, end, 0, 0, mtime_ns, mode, None)
        try:
            st = os.fstat(fd)
            prev = self.state.get(path)
            if st.st_size >= end and (prev is None or prev.gen <= gen) and all(
                    hashlib.sha256(os.pread(fd, x.end - x.start, x.start)).hexdigest()
                    == x.sha256 for x in extents) and \
                    all(self._proven(fd, st, c) for c in copies):
                return FileState(path, gen, end, st.st_dev, st.st_ino, st.st_mtime_ns,
                                 st.st_mode & 0o7777, check_hash(fd, end))
            return FileState(path, gen, end, 0, 0, mtime_ns, mode, None)
        finally:
            os.close(fd)

    def _proven(self, fd: int, st: os.stat_result, c: Copy) -> bool:
        """Whether the open local file begins with the bytes copy ``c`` names, by the
        proofs the shipper writes copies on (a cut's marks, a move's check hash)."""
        row = self.state.get(c.src)
        if (c.at, c.start) != (0, 0) or row is None or row.gen != c.src_gen or \
                row.check_hash in (None, LOST) or not 0 < c.end <= min(row.offset, st.st_size):
            return False
        if c.end == row.offset and check_hash(fd, c.end) == row.check_hash:
            return True
        cut = cut_point(fd, st.st_size, row.marks) if c.src == c.path else None
        return cut is not None and c.end <= cut

    # -- shipping -----------------------------------------------------------
    def ship(self, paths: Iterable[bytes]) -> FlushResult:
        """Ship the new bytes of ``paths``; one segment unless they exceed ``segment_max``."""
        result = FlushResult()
        self._verified = False  # the lease's HEAD before this flush's first segment
        self._dirs = {}
        self._sessions = None
        self._copied = {}
        repair = set(self.repair)
        try:
            batch = self._new_batch()
            self._announce(batch)
            for rel in sorted(set(paths) | self.repair):
                if self.should_stop():
                    raise InterruptedError("stopping: flush abandoned before upload")
                if batch.writer.full:
                    # An index names at most MAX_ENTRIES entries (a reader's limit).
                    batch = self._next_segment(batch, result)
                batch = self._stage(rel, batch, result)
            if not batch.writer.empty:
                self._put(batch, result)
            else:
                self._settle(result)
                # Even with nothing to ship: connected, recovered; and what the store
                # turned out to have lost is shipped now.
                if self._ready() and self.repair:
                    raise _Restart()
                if batch.updates:
                    self.state.touch(batch.updates.values())
        finally:
            # An upload in flight is waited for and committed, whatever stopped us.
            self._settle(result)
        self.repair -= repair
        return result

    def tombstones_due(self) -> bool:
        """Whether a forgotten session's tombstone waits to be shipped (then even a flush
        with nothing else to ship is one PUT)."""
        return any(not f.announced for f in self.state.forgotten().values()) or \
            bool(redactions.unannounced(self.state))

    def _announce(self, batch: _Batch) -> None:
        """Read the forgotten sessions; the tombstones of those not announced yet go in
        ``batch`` (``announce_forgotten`` once the store confirmed it), and their files'
        rows are marked as the store's bytes lost: lifted, they ship as new generations."""
        forgotten = self.state.forgotten()
        self._forgotten = set(forgotten)
        news = sorted((f for f in forgotten.values() if not f.announced),
                      key=lambda f: (f.at, f.sid))[:FORGETS_MAX]
        # What ``syncd redact`` masked here: digests and lengths, never the values.
        batch.redacts = redactions.unannounced(self.state)[:REDACTS_MAX]
        for r in batch.redacts:
            batch.writer.add_redact(r)
        if not news:
            return
        for f in news:
            batch.writer.add_forget(f.sid, f.at)
        batch.forgets = [f.sid for f in news]
        sids = set(batch.forgets)
        for row in self.state.files():
            if session_owning(row.path) in sids and (mark := _lost(row)) is not None:
                batch.updates[row.path] = mark

    def _ready(self) -> bool:
        """Connect and recover, once. True when recovery changed the state: what was
        read before it may be stale."""
        self.prepare()
        return not self._recovered and self.recover() > 0

    def _new_batch(self) -> _Batch:
        # Seq and key come in _put: not known before the store was connected to.
        return _Batch(SegmentWriter(self.machine, 0, self.clock(), self.level,
                                    dictionary=self._dictionary()))

    def _dictionary(self) -> tuple[str, zstandard.ZstdCompressionDict] | None:
        # Adopted by a compaction run (another thread or process) through the state.
        dict_id = self.state.meta("dict_id")
        if not dict_id:
            return None
        if self._dict is None or self._dict[0] != dict_id:
            data = base64.b64decode(self.state.meta("dict_data") or "")
            self._dict = (dict_id, zstandard.ZstdCompressionDict(data))
        return self._dict

    def _put(self, batch: _Batch, result: FlushResult) -> None:
        """Start the upload of ``batch``'s segment, once the one before it is committed.

        The upload runs in a worker while the next segment is read and compressed; the
        state advances only in ``_settle``, after the store confirmed the PUT.
        """
        self._settle(result)
        if self._ready():
            raise _Restart()
        seq = self.state.next_seq
        key = layout.segment_key(self.machine, seq)
        batch.writer.bind(seq, self.repo.cipher(key))
        blob = batch.writer.finish()
        if self.lease is not None:
            if self._verified:
                self.lease.ensure()  # lost → no PUT; not renewed lately → renewed first
            else:
                # A flush's first PUT: one HEAD shows the lease is still ours, however
                # long ago the last renewal was (a --takeover meanwhile stops us here).
                self.lease.verify(strict=False)
                self._verified = True
        self._upload = (batch, len(blob), worker("upload").submit(self.repo.put, key, blob))

    def _next_segment(self, batch: _Batch, result: FlushResult) -> _Batch:
        """Upload ``batch``'s segment and start the next one (a flush cut in several)."""
        self._put(batch, result)
        if self.should_stop():
            # Stopping: the segments uploaded so far are committed (ship's finally), the
            # rest waits for the next start.
            raise InterruptedError("stopping: flush cut after a committed segment")
        return self._new_batch()

    def _settle(self, result: FlushResult) -> None:
        """Wait for the upload in flight, if any, and commit its segment to the state."""
        if self._upload is None:
            return
        (batch, size, job), self._upload = self._upload, None
        seq = batch.writer.index.seq
        try:
            job.result()
        except AlreadyExists:
            # Someone (our own earlier run, or whoever planted an object) holds this seq:
            # adopted or passed over (only while the lease is still ours), then again.
            self._take_next()
            raise _Restart() from None
        # A tombstone is for followers that read the head too: it is written soon.
        self.state.commit(seq, batch.updates.values(), batch.writer.index.sessions,
                          **({"head_due": "now"} if batch.forgets or batch.redacts else {}))
        if batch.forgets:
            self.state.announce_forgotten(batch.forgets)
        if batch.redacts:
            redactions.announced(self.state, batch.redacts)
        result.segments.append(seq)
        result.raw_bytes += batch.writer.raw_bytes
        result.stored_bytes += size
        ix = batch.writer.index
        files = len({e.path for e in ix.extents})
        result.files += files
        result.tombstones += len(ix.tombstones)
        log.info("flushed segment %d: %s -> %d stored", seq,
                 _shipped(len({e.path for e in ix.extents} | {c.path for c in ix.copies}),
                          batch.writer.raw_bytes, len(ix.tombstones)), size)

    def _stage(self, rel: bytes, batch: _Batch, result: FlushResult) -> _Batch:
        prev = self.state.get(rel)
        if self._forgotten and session_owning(rel) in self._forgotten:
            # Forgotten: neither its bytes nor its deletion leave this machine.
            mark = None if prev is None or rel in batch.updates else _lost(prev)
            if mark is not None:
                batch.updates[rel] = mark
            return batch
        full = os.path.join(self.root, rel)
        text = os.fsdecode(rel)
        try:
            # A path through a symlinked directory has left the tree: treated as gone.
            st = None if self._through_symlink(rel) else os.lstat(full)
        except FileNotFoundError:
            st = None
        except OSError as e:
            result.problems[rel] = f"{text}: {e.strerror}"
            return batch
        if st is None or not stat.S_ISREG(st.st_mode) or not self.selection.wants(text):
            if prev is not None and prev.deleted_at is None and (
                    st is None or not stat.S_ISREG(st.st_mode)):
                now = self.clock()
                batch.writer.add_tombstone(rel, prev.gen, now)
                batch.updates[rel] = prev.but(deleted_at=now)
            return batch
        try:
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            return self._stage(rel, batch, result)  # deleted since lstat: tombstone it
        except OSError as e:
            if e.errno == errno.ELOOP:  # replaced by a symlink since lstat
                return self._stage(rel, batch, result)
            result.problems[rel] = f"{text}: {e.strerror}"
            log.error("cannot read %s: %s", text, e.strerror)
            return batch
        try:
            return self._stage_open(rel, fd, prev, batch, result)
        except InterruptedError:
            raise  # a stop (an OSError too), not a read error
        except OSError as e:
            result.problems[rel] = f"{text}: {e.strerror}"
            log.error("cannot read %s: %s", text, e.strerror)
            return batch
        finally:
            os.close(fd)

    def _through_symlink(self, rel: bytes) -> bool:
        """True when a directory on the way to ``rel`` is a symlink (never followed).

        Each directory is looked at once per flush, not once per file under it."""
        parent = os.path.dirname(rel)
        if not parent:
            return False
        known = self._dirs.get(parent)
        if known is None:
            known = self._through_symlink(parent) or os.path.islink(
                os.path.join(self.root, parent))
            self._dirs[parent] = known
        return known

    def _stage_open(self, rel: bytes, fd: int, prev: FileState | None, batch: _Batch,
                    result: FlushResult) -> _Batch:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return batch
        gen, start, reason, copies = self._position(rel, fd, st, prev)
        end = st.st_size
        # A transcript's marks (to tell a cut later), from its second flush on: a seed
        # spends nothing on them, and a file cut before it grew again is a patch.
        marked = prev is not None and rel.endswith(b".jsonl")
        # Bytes an import from a followed machine wrote: shipped once, marked as such
        # (that machine never imports them back); this machine's own bytes after them.
        label, imported_to = (None, start) if reason == REVIVED else \
            self._imported(rel, fd, st, start)
        mode = st.st_mode & 0o7777
        text = os.fsdecode(rel)
        if reason == REVIVED:
            log.info("%s: generation %d %s", text, gen, reason)
        elif reason:
            log.log(logging.DEBUG if prev is None else logging.INFO,
                    "%s: new generation %d (%s)", text, gen, reason)
        elif start == end and not copies:
            # Nothing new; remember the metadata so the next scan does not look again.
            if prev is not None and (prev.mtime_ns, prev.mode, prev.dev, prev.ino) != (
                    st.st_mtime_ns, mode, st.st_dev, st.st_ino):
                batch.updates[rel] = prev.but(mtime_ns=st.st_mtime_ns, mode=mode,
                                              dev=st.st_dev, ino=st.st_ino)
            return batch
        scanner = None
        # A patch's new bytes are not contiguous: its catalog is read from the whole file.
        patched = any(c.at >= start for c in copies)
        if session_of(rel) is not None and not patched:
            scanner = MetaScanner(at_line_start=start == 0 or os.pread(fd, 1, start - 1) == b"\n")
        pos = start
        in_batch = False
        # Bytes a generation the store holds has (a cut tail's or a moved file's before
        # ``start``; a patch's runs of old lines): copies, and only the rest as data.
        pending = deque(copies)
        while pending and pending[0].at < pos:
            batch.writer.add_copy(replace(pending.popleft(), reason=reason))
            in_batch, reason = True, None
        if in_batch and pos >= end:
            batch.updates[rel] = self._shipped(rel, fd, st, gen, pos, marked)
            if scanner is not None:
                self._catalog(batch, rel, gen, {})
            return batch
        if reason == REVIVED:
            # The revival is an empty extent of its own; bytes appended since the restore
            # follow as ordinary extents (a reader that no longer holds the generation
            # ignores the empty one, never starting a file at this offset).
            batch.writer.add_data(rel, gen, pos, b"", mode=mode, mtime_ns=st.st_mtime_ns,
                                  reason=reason)
            in_batch, reason = True, None
            if pos >= end:
                batch.updates[rel] = self._shipped(rel, fd, st, gen, pos, marked)
                return batch
        data = b""
        while True:
            if pending and pending[0].at == pos:
                c = pending.popleft()
                batch.writer.add_copy(replace(c, reason=reason))
                pos, in_batch, reason = c.stop, True, None
                if pos >= end:
                    break
                continue
            want = min(FRAME_MAX, end - pos, *((pending[0].at - pos,) if pending else ()))
            if pos < imported_to:
                want = min(want, imported_to - pos)
            if batch.writer.raw_bytes and batch.writer.raw_bytes + want > self.segment_max:
                # Bounded memory: this segment is full, the rest goes in the next one.
                if in_batch:
                    batch.updates[rel] = self._shipped(rel, fd, st, gen, pos, marked)
                batch = self._next_segment(batch, result)
                in_batch = False
            data = os.pread(fd, want, pos) if want else b""
            short = len(data) < want
            shipped = data
            if rel == HISTORY and self._forgotten and data:
                # A forgotten session's lines go as spaces of their length (the store
                # then holds what a forget leaves); a line is judged whole, so a frame
                # ends at a line end and a line still being written waits.
                data, shipped = masked_history(data, self._forgotten,
                                               at_end=pos + len(data) >= end)
                if not data:
                    result.requeue.add(rel)
                    break
            batch.writer.add_data(rel, gen, pos, shipped, mode=mode, mtime_ns=st.st_mtime_ns,
                                  reason=label if pos < imported_to else reason)
            reason = None
            pos += len(data)
            in_batch = True
            self.progress(len(data))
            if scanner is not None:
                scanner.feed(data)
            if short:
                # Shrank while we read it: what we have is shipped; the next pass starts
                # a new generation if the shipped bytes changed.
                result.requeue.add(rel)
                break
            if pos >= end:
                break
        batch.updates[rel] = self._shipped(rel, fd, st, gen, pos, marked)
        after = os.fstat(fd)
        if after.st_size != end or after.st_mtime_ns != st.st_mtime_ns:
            result.requeue.add(rel)
            if copies:
                # Its copies say what the file held before it changed again: not proof
                # that the bytes read since are of one file. The next pass looks afresh.
                batch.updates[rel] = batch.updates[rel].but(check_hash=None, marks=None)
        if scanner is not None:
            self._catalog(batch, rel, gen, scanner.finish())
        elif patched and session_of(rel) is not None:
            whole = MetaScanner(at_line_start=True)
            for chunk in file_chunks(fd, pos):
                whole.feed(chunk)
            fields = whole.finish()
            known = self.state.catalog_of(rel)
            if known is not None and "custom_title" in known[1] and "custom_title" not in fields:
                # A title the user gave (its own file, custom-title.json) outlives a rewrite.
                fields["custom_title"] = known[1]["custom_title"]
            self._catalog(batch, rel, gen, fields)
        elif start == 0 and len(data) == end:
            self._title_file(batch, rel, data)
        return batch

    def _imported(self, rel: bytes, fd: int, st: os.stat_result,
                  start: int) -> tuple[str | None, int]:
        """(the label of bytes an import wrote from ``start``, where they end); (None,
        start) when an import's record does not describe the file's bytes there."""
        rec = self.state.imported(rel)
        if rec is None or rec.size <= start or st.st_size < rec.size or \
                check_hash(fd, rec.size) != rec.check_hash:
            return None, start
        return (merged_from(rec.source) if rec.merged else imported_from(rec.source)), rec.size

    @staticmethod
    def _shipped(rel: bytes, fd: int, st: os.stat_result, gen: int, pos: int,
                 marked: bool = False) -> FileState:
        """The state row once bytes [0, pos) of this generation are in the store;
        ``marked``: with the marks of its last lines (``backup.marks``)."""
        return FileState(rel, gen, pos, st.st_dev, st.st_ino, st.st_mtime_ns,
                         st.st_mode & 0o7777, check_hash(fd, pos),
                         marks=marks_of(fd, pos) if marked else None)

    def _catalog(self, batch: _Batch, rel: bytes, gen: int, fields: dict[str, str]) -> None:
        sid = session_of(rel)
        source = self._copied.get(rel)
        if source is not None:
            # A generation that begins with another's bytes names what their lines named
            # (readers take a session's fields from its newest generation alone); its own
            # lines, after them, fold on top (the first cwd and prompt stay).
            known = self.state.catalog_of(source[0])
            if known is not None and known[0] == source[1]:
                fields = {**known[1], **{k: v for k, v in fields.items()
                                         if k not in FIRST or k not in known[1]}}
        rec = None if sid is None else self.state.origin(sid)
        if rec is not None:
            # Where the session came from, once per generation (the catalog keeps it):
            # that machine maps its lines back to its own paths (FORMAT.md "origin").
            origin = Origin(rec.machine, os.fsdecode(rec.src_path), rec.rules).encode()
            known = self.state.catalog_of(rel)
            if known is None or known[0] != gen or known[1].get("origin") != origin:
                fields = {**fields, "origin": origin}
        batch.writer.add_session(rel, gen, fields)
        cwd = fields.get("cwd")
        if cwd and cwd not in self._projects_seen:
            self._projects_seen.add(cwd)
            info = project_info(cwd)
            if info is not None:
                batch.writer.add_project(cwd, info)

    def _title_file(self, batch: _Batch, rel: bytes, data: bytes) -> None:
        """A session's title file shipped whole: its title in the catalog as its
        transcript's (catalog.title_file_fields), beside what the transcript's lines of
        this segment named."""
        owner = title_file_owner(rel)
        if owner is None:
            return
        fields = title_file_fields(data)
        st = batch.updates.get(owner) or self.state.get(owner)
        if not fields or st is None or st.deleted_at is not None:
            return
        named = batch.writer.index.sessions.get(owner)
        if named is not None and named[0] == st.gen:
            fields = {**named[1], **fields}
        batch.writer.add_session(owner, st.gen, fields)

    def _position(self, rel: bytes, fd: int, st: os.stat_result, prev: FileState | None
                  ) -> tuple[int, int, str | None, list[Copy]]:
        """Where shipping resumes: (generation, start offset, reason for a new generation,
        the copies of bytes the store holds that the generation begins with or, for a
        patch, is made of besides its new bytes)."""
        if prev is None:
            return self._moved(rel, fd, st, 1) or (1, 0, "new file", [])
        if prev.check_hash == LOST:
            return prev.gen + 1, 0, "shipped again: the store lost its earlier bytes", []
        gen, start, reason = self._shipped_position(fd, st, prev)
        if reason is None or start != 0:
            return gen, start, reason, []
        if prev.deleted_at is not None:  # back where it was deleted from: moved back?
            return self._moved(rel, fd, st, gen) or (gen, start, reason, [])
        if not prev.offset:
            return gen, start, reason, []
        # Not an append: a cut tail (the CLI withdrew a row) ships as a copy of the bytes
        # before the cut, when they are what was shipped (``marks``); a file rewritten
        # further back, as a patch of the generation before it.
        cut = cut_point(fd, st.st_size, prev.marks)
        # Nothing withdrawn (the marks match to the end): not a cut unless the append
        # check agrees too (defence in depth: the marks cover at least its tail).
        if cut == prev.offset and check_hash(fd, cut) != prev.check_hash:
            cut = None
        # (Further back than Claude cuts, a patch is tried first: it copies what follows.)
        runs = None if cut is not None and prev.offset - cut <= CUT_BACK else \
            self._patch(rel, fd, st, prev)
        if runs:
            return gen, 0, f"patched: {reason}", [
                Copy(rel, gen, at, prev.path, prev.gen, old, old + n, st.st_mode & 0o7777,
                     st.st_mtime_ns) for at, old, n in runs]
        if cut is not None:
            self._copied[rel] = (prev.path, prev.gen)
            return gen, cut, f"cut at {cut} of {prev.offset} bytes ({reason})", [
                Copy(rel, gen, 0, prev.path, prev.gen, 0, cut, st.st_mode & 0o7777,
                     st.st_mtime_ns)]
        return gen, start, reason, []

    def _moved(self, rel: bytes, fd: int, st: os.stat_result, gen: int
               ) -> tuple[int, int, str | None, list[Copy]] | None:
        moved = self._moved_from(rel, fd, st)
        if moved is None:
            return None
        self._copied[rel] = (moved.path, moved.gen)
        return gen, moved.offset, f"moved from {os.fsdecode(moved.path)}", [
            Copy(rel, gen, 0, moved.path, moved.gen, 0, moved.offset, st.st_mode & 0o7777,
                 st.st_mtime_ns)]

    def _patch(self, rel: bytes, fd: int, st: os.stat_result,
               prev: FileState) -> list[tuple[int, int, int]] | None:
        """The runs of old lines of a transcript rewritten whole (``patch``), the old
        generation read from the store (a rewrite is rare: a view of its session and
        its frames, once); None when it is no transcript, too small to gain, too big,
        not readable, or no patch."""
        sid = session_of_any(rel)
        if sid is None or not rel.endswith(b".jsonl") or \
                not PATCH_MIN <= prev.offset <= OLD_MAX:
            return None
        if self._ready():  # connected now: what was read before recovery may be stale
            raise _Restart()
        try:
            view = load_backup(self.repo, sessions=[sid])
            e = view.files.get(rel)
            if e is None or e.gen != prev.gen or _reach(e) < prev.offset:
                return None
            old = OldLines()
            old.add(self._frames(e, prev.offset))
        except (BackupError, FormatError, StoreError) as err:
            log.info("%s: shipped whole, its earlier generation does not read: %s",
                     os.fsdecode(rel), err)
            return None
        return patch(old, fd, st.st_size)

    def _frames(self, e: Entry, size: int) -> Iterator[bytes]:
        """Bytes [0, size) of ``e``, a run of frames of one object at a time."""
        return self.repo.entry_bytes(e, size, PATCH_RUN)

    def _moved_from(self, rel: bytes, fd: int, st: os.stat_result) -> FileState | None:
        """The file this new one was moved from (Claude's ``/cd`` and worktree moves take
        a session's files to another project folder): a file of the same session, at the
        same place under another project folder, whose shipped bytes this one begins with
        (checked by hash, not by name), and not deleted longer ago than a revival may be
        (compaction may have expired its generation since)."""
        parts = rel.split(b"/", 2)
        sid = session_of_any(rel)
        if sid is None or len(parts) != 3:
            return None
        if self._sessions is None:  # once per flush, only when a session file is new
            self._sessions = self.state.known_sessions()
        if sid not in self._sessions:
            return None
        best = None
        for row in self.state.same_place(parts[2]):
            if row.path == rel or row.check_hash in (None, LOST) or not row.offset or \
                    row.offset > st.st_size or row.path.split(b"/", 2)[2] != parts[2]:
                continue
            if row.deleted_at is not None and \
                    self.clock() - row.deleted_at >= self.revive_within:
                continue  # (as a revival: compaction may have expired its bytes since)
            if (best is None or row.offset > best.offset) and \
                    check_hash(fd, row.offset) == row.check_hash:
                best = row
        return best

    def _shipped_position(self, fd: int, st: os.stat_result,
                          prev: FileState) -> tuple[int, int, str | None]:
        """(generation, start, reason) after what was shipped of ``prev``'s file."""
        if (prev.deleted_at is not None or (prev.dev, prev.ino) != (st.st_dev, st.st_ino)) \
                and self._restored_as_shipped(fd, st, prev):
            # A restore put back exactly what the store holds: those bytes are not
            # this machine's new ones. A deleted file's generation comes back to life.
            return prev.gen, prev.offset, REVIVED if prev.deleted_at is not None else None
        if prev.deleted_at is None and (prev.dev, prev.ino) != (st.st_dev, st.st_ino) and \
                self._imported_after(fd, st, prev):
            # An import replaced the file with one that continues what was shipped.
            return prev.gen, prev.offset, None
        if prev.deleted_at is not None:
            return prev.gen + 1, 0, "recreated after deletion"
        if (prev.dev, prev.ino) != (st.st_dev, st.st_ino):
            return prev.gen + 1, 0, "replaced (new inode)"
        if st.st_size < prev.offset:
            return prev.gen + 1, 0, f"truncated from {prev.offset} to {st.st_size} bytes"
        if prev.offset and check_hash(fd, prev.offset) != prev.check_hash:
            return prev.gen + 1, 0, "shipped bytes were rewritten"
        return prev.gen, prev.offset, None

    def _imported_after(self, fd: int, st: os.stat_result, prev: FileState) -> bool:
        """True when an import wrote this file (as it is, or merged: the other's lines
        after this one's), longer than what was shipped of ``prev``'s generation, and
        those bytes are still its head."""
        rec = self.state.imported(prev.path)
        return rec is not None and rec.size >= prev.offset and \
            st.st_size >= rec.size and prev.check_hash not in (None, LOST) and \
            check_hash(fd, prev.offset) == prev.check_hash

    def _restored_as_shipped(self, fd: int, st: os.stat_result, prev: FileState) -> bool:
        """True when a restore recorded writing this file (``Provenance``) as exactly the
        bytes of ``prev``'s generation that the store has, and its head and tail are
        still those bytes."""
        if prev.deleted_at is not None and \
                self.clock() - prev.deleted_at >= self.revive_within:
            return False
        r = self.state.restored(prev.path)
        if r is None or r.gen != prev.gen or r.size != prev.offset or st.st_size < r.size \
                or not check_hash(fd, r.size) == r.check_hash == prev.check_hash:
            return False
        self.state.forget_restored(prev.path)  # used once
        return True


class Provenance:
    """Tells this machine's daemon, through its state, which files a restore of this
    machine's own backup is writing into its tree: bytes [0, size) of a generation it
    shipped, recorded before each file appears (the daemon may look at any moment).
    A record a crash loses only means those bytes are shipped again, so none is fsynced;
    a state that cannot take one stops the recording and says why (``problem``)."""

    def __init__(self, state_file: Path) -> None:
        self.state: State | None = State(state_file, durable=False)
        self.problem: str | None = None
        self._lock = threading.Lock()
        # Once per restore, not with every record: the records are written one by one.
        try:
            self.state.expire_restored()
        except StateError:
            self.close()
            raise

    def record(self, path: bytes, gen: int, size: int, content: Path | bytes) -> None:
        if self.state is None:
            return
        if isinstance(content, bytes):
            digest = _check_hash_of(content, size)
        else:
            fd = os.open(content, os.O_RDONLY | os.O_CLOEXEC)
            try:
                digest = check_hash(fd, size)
            finally:
                os.close(fd)
        try:
            self.state.record_restored([RestoredFile(path, gen, size, digest, time.time())])
        except StateError as e:
            self.problem = f"{e}: the daemon will ship the restored files again"
            self.close()

    def record_import(self, path: bytes, machine: str, src_path: bytes, gen: int, size: int,
                      content: Path | bytes) -> None:
        """Before ``content`` becomes ``path``: it is all ``machine``'s (its ``src_path``,
        generation ``gen`` at ``size``, remapped), as an import would have written it. The
        daemon ships it marked ``imported from`` there, so that machine never takes this
        copy for one of this machine's own sessions (one deleted there stays deleted)."""
        if self.state is None:
            return
        if isinstance(content, bytes):
            n, digest = len(content), _check_hash_of(content, len(content))
        else:
            fd = os.open(content, os.O_RDONLY | os.O_CLOEXEC)
            try:
                n = os.fstat(fd).st_size
                digest = check_hash(fd, n)
            finally:
                os.close(fd)
        try:
            with self._lock:  # told by the installer's threads too
                if self.state is not None:
                    self.state.record_imported([ImportedFile(
                        path, machine, n, digest, False, src_path, gen, size, time.time())])
        except StateError as e:
            self.problem = f"{e}: the daemon will ship the restored files as this machine's"
            self.close()

    def record_origin(self, rec: OriginRecord, replace: bool = False) -> None:
        """Where a session new here came from (``restore/origin``), before it appears."""
        if self.state is None:
            return
        try:
            self.state.record_origins([rec], replace)
        except StateError as e:
            self.problem = f"{e}: where restored sessions came from is not recorded"
            self.close()

    def origin_of(self, sid: str) -> OriginRecord | None:
        return None if self.state is None else self.state.origin(sid)

    def shipped(self, root: bytes) -> Callable[[bytes], int]:
        """``shipped_bytes`` of the tree ``root`` (0 once the state is gone)."""
        return lambda rel: 0 if self.state is None else shipped_bytes(self.state, root, rel)

    def close(self) -> None:
        if self.state is not None:
            self.state.close()
            self.state = None


def open_provenance(state_file: Path, create: bool = False) -> Provenance | None:
    """This machine's ``Provenance`` when it has a state (a daemon or a sync ran), or
    (``create``) a new one: a restore into the tree before the daemon's first start
    records where the sessions it brings came from."""
    return Provenance(state_file) if create or state_file.exists() else None


def _lost(row: FileState) -> FileState | None:
    """``row`` marked as bytes the store no longer holds (a forgotten session's: the next
    scan after a lift ships it anew), or None when it is already (or deleted)."""
    if row.deleted_at is not None or (row.check_hash == LOST and not row.dev and not row.ino):
        return None
    return row.but(dev=0, ino=0, check_hash=LOST, marks=None)


def _check_hash_of(data: bytes, length: int) -> bytes:
    """``check_hash`` of bytes in memory: the same head and tail of the first ``length``."""
    h = hashlib.sha256(data[:min(CHECK_HEAD, length)])
    tail = max(CHECK_HEAD, length - CHECK_TAIL)
    if tail < length:
        h.update(data[tail:length])
    return h.digest()


def _reach(e: Entry) -> int:
    """How many bytes of ``e`` the store holds contiguously from 0."""
    pos = 0
    for _, x in sorted(e.extents, key=lambda kx: kx[1].start):
        if x.start > pos:
            break
        pos = max(pos, x.end)
    return min(pos, e.size)


def _seqs(seqs: list[int]) -> str:
    return ", ".join(f"{s:016x}" for s in seqs[:5]) + (f" and {len(seqs) - 5} more"
                                                        if len(seqs) > 5 else "")


class _Restart(Exception):
    """The seq we wrote to was taken and has been adopted; build the flush again."""


def ship_with_restart(shipper: Shipper, paths: Iterable[bytes]) -> FlushResult:
    """``Shipper.ship``, started over when a seq turned out to be taken already."""
    wanted = list(paths)
    for _ in range(100):
        try:
            return shipper.ship(wanted)
        except _Restart:
            continue
    raise SyncError("segment seq keeps being taken by another writer; is a second "
                       "daemon running with the same machine id?")


__all__ = ["FlushResult", "Shipper", "Tombstone", "check_hash", "ship_with_restart"]

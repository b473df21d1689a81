"""Following other machines: their sessions arrive in this tree on their own, remapped
and merged exactly as ``syncd restore --machine M --session …`` would.

A followed machine that is idle costs one request per interval: a HEAD of its next
segment's key, which is not there. New segments name the sessions they changed; only
those are imported, through the restorer (which reads only their part of the machine's
backup). Every ``HEAD_EVERY`` polls, and at the first after a start, what is here is
reconciled with the machine's head (its session list): what this machine never had, and
segments compacted away before they were read, come from there.

What an import writes is recorded in the state (``imported``) before the next flush:
the shipper ships it once, marked as imported, and the machine it came from never
imports it back.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

from syncd.archive import purge as purges
from syncd.archive import redactions
from syncd.backup.ship import check_hash, imported_from, merged_from, shipped_bytes
from syncd.backup.state import ImportedFile, State
from syncd.claude import Selection, tree_writable
from syncd.config import Settings
from syncd.errors import FormatError, NoBackup, NotFound, RestoreError, SyncdError
from syncd.follow.choice import choose, record
from syncd.follow.cursor import META, Cursor, cursors, waited
from syncd.follow.quiet import Quiet, intact
from syncd.format.catalog import session_of, session_of_any
from syncd.format.segment import Redaction, SegmentIndex, index_bytes
from syncd.progress import NullMeter
from syncd.repository import Repository
from syncd.restore.remap import config_rules
from syncd.restore.restorer import RestoreOptions, RestoreReport, restore
from syncd.sessionfiles import session_owning
from syncd.sibling import owner_of
from syncd.store import layout
from syncd.view import Backup, load_backup

log = logging.getLogger("syncd.follow")

# Polls between two reconciliations with the machine's head (its session list: every
# session it holds arrives, a segment compacted away before it was read included); one
# comes at the first poll after a start and after an import that failed as well.
HEAD_EVERY = 10
# Sessions a reconciliation imports at most per poll (the rest come with the next ones).
RECONCILE_MAX = 256
# A session whose import keeps failing waits 2, 4, 8 … polls, at most this many.
FAILED_WAIT_MAX = 64
# Sessions of a head's list missing here kept at most per machine (the rest counted).
MISSING_KEPT = 4096
# Failed sessions remembered at most (of all followed machines).
FAILED_KEPT = 4096
# Segments read in one poll; the rest come with the next.
SEGMENTS_MAX = 256
# With follow = "*", the store's machines are listed again every this many polls; at
# most this many of them are followed (each costs a HEAD a poll; a team's bucket may
# hold thousands): those named in the config, then the others backed up last.
MACHINES_EVERY = 20
FOLLOW_ALL_MAX = 64
# Polls a machine that keeps failing waits at most (at 30 s each: an hour).
RETRY_MAX = 120
# Conflict copies (for ``syncd status``) and sessions to retry remembered per machine.
KEPT = 50
# Actions recorded as looked at: a file written by the import; "skip": it already was;
# "keep": the local copy holds all of it; "conflict": saved aside (none of the local
# file's bytes is the other machine's then).
WRITTEN = ("create", "fast-forward", "replace", "merge", "conflict", "skip", "keep")
# Segment indexes a follower keeps once read: at most this many and these bytes (as
# ``index_bytes`` estimates them) per followed machine, and these bytes in all. Thousands
# of a busy machine's indexes fit; a hostile machine's big ones cost their reads, never
# more memory. So many refused ones are remembered per machine (never read again).
INDEXES_KEPT = 4096
INDEX_BYTES_KEPT = 32 << 20
INDEX_BYTES_ALL = 128 << 20
# Sessions forgotten on a machine's tombstones remembered per machine (as many as a head
# lists): one lifted here is not forgotten again by the same tombstone.
HONOURED_KEPT = 4096
# Redactions' tombstones one poll reads of a machine at most (the newest: its head lists
# the newest 256 again at later looks).
REDACTS_SEEN = 4096
# A refusal is said (logged, the cursor's problem) in at most this many characters.
PROBLEM_MAX = 500
# The largest integer the state holds: a source's generation or size past it (a number no
# writer makes) is recorded as this.
STATE_INT_MAX = (1 << 63) - 1


def first_look_due(settings: Settings, state: State) -> bool:
    """Whether a followed machine was never looked at here: its first import (every session
    it holds) is still to come. With ``"*"``: when none was."""
    if not settings.follow:
        return False
    seen = {m for m, c in cursors(state).items() if c.seq is not None}
    named = [m for m in settings.follow if m not in ("*", settings.machine_id)]
    return any(m not in seen for m in named) or ("*" in settings.follow and not seen)


class _Indexes:
    """The segment indexes of the followed machines, kept once read, the least recently
    used going first: INDEXES_KEPT and INDEX_BYTES_KEPT per machine, INDEX_BYTES_ALL in
    all. One bigger than a machine's share is not kept (read again when needed)."""

    def __init__(self) -> None:
        self.per_machine, self.total = INDEX_BYTES_KEPT, INDEX_BYTES_ALL
        self._all: OrderedDict[tuple[str, str, int], tuple[SegmentIndex, int]] = OrderedDict()
        self._of: dict[str, OrderedDict[tuple[str, str, int], int]] = {}
        self._bytes: dict[str, int] = {}
        self.bytes = 0

    def held(self, machine: str) -> tuple[int, int]:
        """How many of ``machine``'s indexes are kept, and their bytes."""
        return len(self._of.get(machine, ())), self._bytes.get(machine, 0)

    def get(self, machine: str, key: str, size: int) -> SegmentIndex | None:
        k = (machine, key, size)
        got = self._all.get(k)
        if got is None:
            return None
        self._all.move_to_end(k)
        self._of[machine].move_to_end(k)
        return got[0]

    def put(self, machine: str, key: str, size: int, ix: SegmentIndex) -> None:
        k = (machine, key, size)
        n = index_bytes(ix)
        if n > self.per_machine or k in self._all:
            return
        self._all[k] = (ix, n)
        mine = self._of.setdefault(machine, OrderedDict())
        mine[k] = n
        self._bytes[machine] = self._bytes.get(machine, 0) + n
        self.bytes += n
        while self._bytes[machine] > self.per_machine or len(mine) > INDEXES_KEPT:
            self._drop(next(iter(mine)))
        while self.bytes > self.total:
            self._drop(next(iter(self._all)))

    def _drop(self, k: tuple[str, str, int]) -> None:
        _, n = self._all.pop(k)
        del self._of[k[0]][k]
        self._bytes[k[0]] -= n
        self.bytes -= n


class _Remembered(Repository):
    """A followed machine's objects, its segments' indexes kept once read (in ``indexes``,
    which the follower's machines share). A segment is written once, and each import's
    view reads every segment since the machine's last compaction: kept, a busy machine's
    look reads only its new ones. One whose index is refused (damaged, more than a reader
    accepts) is remembered as such, never read again.

    Its listings too (manifests, deltas, segments: three LISTs, each 12.5 times a GET's
    price) and its ``machine.json``, once read: the segments the follower HEADs since are
    added (``saw``), so a busy machine's import lists nothing. Only a compaction there
    changes the listings (objects gone, new ones); ``forget`` makes the next view list
    again."""

    def __init__(self, repo: Repository, machine: str, indexes: _Indexes | None = None) -> None:
        super().__init__(repo.store, machine, repo.crypto)
        self._indexes = indexes or _Indexes()
        # (key, size) of a segment whose index was refused → why (said once).
        self._refused: OrderedDict[tuple[str, int], str] = OrderedDict()
        # The conflict copy the last import's restore refused (too big), if it did, and
        # the refusals said (the same one again is not).
        self._copy_refused: str | None = None
        self._copies_said: OrderedDict[str, None] = OrderedDict()
        self._info: dict[str, Any] | None = None
        self._snaps: list[tuple[int, int, str]] | None = None
        self._deltas: list[tuple[int, int, str, int]] | None = None
        self._segments: dict[int, tuple[str, int]] | None = None

    @property
    def listed(self) -> bool:
        """Whether the listings are kept (the next view lists nothing)."""
        return self._segments is not None

    def forget(self) -> None:
        self._info = self._snaps = self._deltas = self._segments = None

    def problem(self) -> str | None:
        """Why a segment the machine still lists (as last listed) was refused, if one was;
        else why the last import could not keep a conflict copy, if it could not."""
        listed = None if self._segments is None else {k for k, _ in self._segments.values()}
        for (key, _), why in reversed(self._refused.items()):
            if listed is None or key in listed:
                return why
        return self._copy_refused

    def copy_refused(self, why: str) -> None:
        """Told by the restore of an import: a conflict copy was refused (``why``)."""
        self._copy_refused = why[:PROBLEM_MAX]

    def to_say(self, line: str) -> bool:
        """Whether to log ``line``, an import's error: not when it is about a refused
        segment (its refusal, the gap it leaves: said when it was refused), nor a refused
        conflict copy said already (noted as said now)."""
        if any(self.where(key) in line for key, _ in self._refused):
            return False
        # (Said as it is, or as part of a line naming the file it was for.)
        if self._copy_refused is not None and self._copy_refused in line:
            if line in self._copies_said:
                return False
            self._copies_said[line] = None
            if len(self._copies_said) > KEPT:
                self._copies_said.popitem(last=False)
        return True

    def saw(self, seq: int, key: str, size: int) -> None:
        """Segment ``seq`` exists (a HEAD said so)."""
        if self._segments is not None:
            self._segments[seq] = (key, size)
            if len(self._segments) > INDEXES_KEPT:
                self.forget()

    def info(self) -> dict[str, Any]:
        if self._info is None:
            self._info = super().info()
        return self._info

    def snapshots(self) -> list[tuple[int, int, str]]:
        if self._snaps is None:
            self._snaps = super().snapshots()
        return self._snaps

    def deltas(self) -> list[tuple[int, int, str, int]]:
        if self._deltas is None:
            self._deltas = super().deltas()
        return self._deltas

    def segments(self, after: int = -1) -> list[tuple[str, int]]:
        self._copy_refused = None  # a view, so an import, begins: its own refusals count
        if self._segments is None:
            listed = super().segments(after)
            self._segments = {seq: (k, n) for k, n in listed
                              if (seq := layout.segment_seq(k)) is not None}
            # A refused segment no view reads any more (compacted, deleted) is forgotten.
            there = set(listed)
            for gone in [k for k in self._refused if k not in there]:
                del self._refused[gone]
            return listed
        return [ks for seq, ks in sorted(self._segments.items()) if seq > after]

    def read_index(self, key: str, size: int | None = None) -> SegmentIndex:
        if size is None or not key.startswith(layout.segments_prefix(self.machine)):
            return super().read_index(key, size)
        why = self._refused.get((key, size))
        if why is not None:
            raise FormatError(why)
        kept = self._indexes.get(self.machine, key, size)
        if kept is not None:
            return kept
        try:
            ix = super().read_index(key, size)
        except FormatError as e:
            why = str(e)
            why = why if len(why) <= PROBLEM_MAX else why[: PROBLEM_MAX - 1] + "…"
            self._refused[(key, size)] = why
            if len(self._refused) > INDEXES_KEPT:
                self._refused.popitem(last=False)
            log.warning("following %s: %s", self.machine, why)  # the one line that says it
            raise FormatError(why) from None
        self._indexes.put(self.machine, key, size, ix)
        return ix


class Follower:
    """Polls the followed machines (``poll``, every ``follow_interval``) and imports."""

    def __init__(self, settings: Settings, repo: Repository, state: State, *,
                 clock: Callable[[], float] = time.time,
                 progress: Callable[[int], None] = lambda n: None) -> None:
        self.settings = settings
        # Told every chunk an import fetches: a long first import feeds the watchdog.
        self.progress = progress
        self.repo = repo
        self.state = state
        self.clock = clock
        self.me = repo.machine
        self.cursors = cursors(state)
        self._machines: list[str] = []
        self._polls = 0
        self._repos: dict[str, _Remembered] = {}
        self._indexes = _Indexes()  # the machines' kept segment indexes, in one budget
        # A failing machine: (the poll it is tried again at, the wait that was).
        self._retry: dict[str, tuple[int, int]] = {}
        # (machine, session) → the local file an import left until quiet: while it is
        # still being written, the session is not imported again (no request for it).
        self._left: dict[tuple[str, str], bytes] = {}
        # Per machine: the poll its head is reconciled at next (the first poll: at once),
        # and what it lists that is missing here (stored path → gen, size).
        self._reconcile_at: dict[str, int] = {}
        self._missing: dict[str, dict[bytes, tuple[int, int]]] = {}
        self._missing_more: dict[str, int] = {}  # listed too, past MISSING_KEPT
        # Per machine: failed sessions forgotten (FAILED_KEPT), and the poll they are due.
        self._cold: dict[str, tuple[int, set[str]]] = {}
        # (machine, session) → (failed imports, the poll it is tried again at).
        self._failed: dict[tuple[str, str], tuple[int, int]] = {}
        # Machines whose sessions wait for the tree to be writable.
        self._blocked: set[str] = set()
        # Per machine: the seq of its head last read here (a gap past it: read again).
        self._head_seq: dict[str, int] = {}
        # Per machine: the etag of a head that did not read (said once).
        self._bad_head: dict[str, str] = {}
        # This poll's: per session, the flush time of the first segment read naming it;
        # the flush time of the last segment read (None: none read).
        self._seen_at: dict[str, float] = {}
        self._top_time: float | None = None
        # This poll's: the tombstones (session → when forgotten) read of the machine, from
        # its segments and its head.
        self._forgets: dict[str, float] = {}
        # This poll's: the redactions' tombstones read of the machine (segments, head).
        self._redacts: list[Redaction] = []
        # Per machine: the flush time of its head last read here.
        self._head_time: dict[str, float | None] = {}
        # Machines not reconciled yet since this follower started.
        self._unreconciled: set[str] = set(self.cursors)
        # After a start, what failed before it is tried again at once.
        for machine, cur in self.cursors.items():
            self._failed.update(((machine, sid), (1, 0)) for sid in cur.retry)
        self.root = os.fsencode(settings.source)

    def machines(self) -> list[str]:
        """The machines followed now (never this one)."""
        named = [m for m in self.settings.follow if m not in ("*", self.me)]
        if "*" not in self.settings.follow:
            return named
        if self._polls % MACHINES_EVERY == 0:
            # Those backed up last, by their heads; never one that does not open this
            # store's key (follow/choice.py); with several trees, only those of this
            # tree's name (Settings.follows).
            others = [m for m in self.repo.machines() if m != self.me and m not in named
                      and self.settings.follows(m)]
            chosen = choose(self.repo, others, len(named), FOLLOW_ALL_MAX, self.clock())
            record(self.state, chosen)
            self._machines = chosen.followed
        return sorted(set(self._machines) | set(named))

    def poll(self) -> None:
        """One round: each followed machine's new sessions are imported."""
        try:
            machines = self.machines()
        except SyncdError as e:
            log.warning("following: cannot list the store's machines: %s", e)
            machines = [m for m in self.settings.follow if m not in ("*", self.me)]
        # Once a round, for every machine: can imports write the tree?
        why = tree_writable(self.settings.source)
        blocked = None if why is None else f"the Claude tree is not writable here ({why})"
        for machine in machines:
            cur = self.cursors.setdefault(machine, Cursor())
            if self._polls < self._retry.get(machine, (0, 0))[0]:
                continue
            cur.last_check = self.clock()
            self._seen_at = {}
            self._forgets = {}
            self._redacts = []
            try:
                if self._poll(machine, cur, blocked):
                    # (A first look still to come is not held back by it.)
                    cur.problem = None if cur.seq is None else self._repos[machine].problem()
                self._retry.pop(machine, None)
            except Exception as e:  # that machine's problem, never the daemon's end
                # Tried again after 1, 2, 4 … polls (at most an hour's worth), so a
                # machine that keeps failing costs little.
                known = isinstance(e, SyncdError | OSError)
                cur.problem = (str(e) if known else f"{type(e).__name__}: {e}")[:PROBLEM_MAX]
                last = self._retry.get(machine)
                wait = 1 if last is None else min(last[1] * 2, RETRY_MAX)
                self._retry[machine] = (self._polls + wait, wait)
                # A reader's bug its objects met gets its traceback.
                log.warning("following %s: %s", machine, cur.problem, exc_info=not known)
            waited(cur, self._seen_at, cur.last_check if cur.seq_time is None else cur.seq_time)
        self._polls += 1
        self._save_cursors()

    # -- one machine ------------------------------------------------------------------
    def _poll(self, machine: str, cur: Cursor, blocked: str | None) -> bool:
        """Look at one machine (``blocked``: why the tree cannot be written now, or None);
        False when it was left alone this time (its problem stands)."""
        rm = self._repos.get(machine)
        if rm is None:
            rm = self._repos[machine] = _Remembered(self.repo, machine, self._indexes)
        if blocked is None and machine in self._blocked:
            # Writable again: everything that waited is brought now, not once it changes.
            self._blocked.discard(machine)
            self._reconcile_at[machine] = self._polls
            cur.problem = None
        elif blocked is not None:
            self._blocked.add(machine)
        if cur.seq is None:
            if blocked is not None:
                # How many wait: its head's list, read with the head's cadence.
                if self._polls >= self._reconcile_at.get(machine, 0):
                    self._reconcile(rm, cur)
                cur.problem = f"{blocked}: {cur.missing or 0} sessions waiting" \
                    if cur.missing is not None else \
                    f"{blocked}: its sessions wait until it can be written"
                cur.misses = HEAD_EVERY  # looked at again as soon as it can be (no cost)
                return False
            if cur.problem is not None and cur.misses + 1 < HEAD_EVERY:
                # Its first look failed (a backup that does not read): looked at again
                # with the head's cadence, not at full cost every poll.
                cur.misses += 1
                return False
            cur.misses = 0
            # The first look: every session it holds, from a new listing (one kept from
            # a first look that failed may name objects gone since).
            rm.forget()
            try:
                backup = load_backup(rm)
            except NoBackup:
                # Nothing flushed yet: its first segment is HEADed like any next one.
                cur.seq = -1
                self._reconcile_at[machine] = self._polls + HEAD_EVERY
                return True
            live = {s.session_id for s in backup.sessions.values() if s.deleted_at is None}
            self._import(rm, cur, live, backup)
            cur.seq = backup.last_seq if backup.last_seq is not None else -1
            cur.seq_time = backup.last_time
            if live:  # an import of every session, those found here already included
                cur.last_import = self.clock()
            # It saw every session the machine holds: what it could not bring is tried
            # again (``_fail``), the head is read with the usual cadence.
            cur.missing = sum(1 for (m, _) in self._failed if m == machine)
            self._reconcile_at[machine] = self._polls + HEAD_EVERY
            return True
        sids, top = self._changed(rm, cur.seq)
        cur.misses = cur.misses + 1 if top is None else 0
        if self._polls >= self._reconcile_at.get(machine, 0):
            found, head_top = self._reconcile(rm, cur, gap=top is None)
            if head_top is not None and head_top < cur.seq and top is None:
                log.warning("following %s: its head is at seq %d, before the seq %d read "
                            "here, which is gone (made again under its id, or a head that "
                            "went ahead): following it again from the start",
                            machine, head_top, cur.seq)
                cur.seq = None
                return True
            sids |= found
            if top is None and head_top is not None and head_top > cur.seq:
                top = head_top  # segments compacted away before they were read
                self._top_time = self._head_time.get(machine)
        self._honour(machine, cur, blocked is None)
        if blocked is not None:
            # Nothing is imported: what the new segments named waits with what waits
            # already, and comes (with what the head lists) once the tree can be written.
            cur.waiting = sorted(set(cur.waiting) | sids)
            if top is not None:
                cur.seq, cur.seq_time = top, self._top_time or cur.seq_time
            listed = {owner_of(p) for p in self._missing.get(machine, {})} - {None}
            cur.problem = f"{blocked}: {len(listed | set(cur.waiting))} sessions waiting"
            return False
        sids |= self._due_again(machine)
        ready = self._quiet_now(machine, cur.waiting)
        if sids or ready:
            self._import(rm, cur, sids | ready, None)
        if top is not None:
            cur.seq, cur.seq_time = top, self._top_time or cur.seq_time
        self._count_missing(machine, cur)
        return True

    def _reconcile(self, rm: _Remembered, cur: Cursor,
                   gap: bool = False) -> tuple[set[str], int | None]:
        """What this machine holds against the machine's head (one HEAD of it, and one GET
        when it changed or something is left to bring): the sessions to import now, and
        the head's seq (None: no head, or unchanged).

        Those are the sessions it lists that this machine never had (no copy, no record of
        one, none deleted here): every change of the others came with the segments read
        here (a copy that grew with this machine's own lines, echoed, is not behind). With
        a ``gap`` (the next segment is gone, and the head is past the seq read here: they
        were compacted before they were read), also those behind what was imported.

        A head before the seq read here whose segment is gone means the machine's seqs
        went back: no session then, the head's seq (the caller starts over)."""
        machine = rm.machine
        after = -1 if cur.seq is None else cur.seq
        self._reconcile_at[machine] = self._polls + HEAD_EVERY
        key = layout.head_key(machine)
        info = rm.store.head(key)
        if info is None:
            return set(), None
        # Unchanged since it was last read here: what it listed is known already (after a
        # start: read once), but when it was past the seq read here.
        if info.etag and info.etag == cur.head_etag and not self._started(machine) and \
                self._head_seq.get(machine, after + 1) <= after and \
                (cur.missing == 0 or machine in self._missing):
            return self._due_listed(machine), None
        if info.etag and info.etag == self._bad_head.get(machine):
            return self._due_listed(machine), None  # refused already, said once
        try:
            head = rm.head()
        except FormatError as e:
            # One bad object, one line: this head (its etag) is not read again.
            self._bad_head[machine] = info.etag
            log.warning("following %s: its head does not read (its segments are followed "
                        "all the same): %s", machine, e)
            return self._due_listed(machine), None
        if head is None:
            return set(), None
        # Its tombstones, for those whose segment was compacted before it was read here.
        self._forgets.update(head.forgotten)
        self._redacts = [*self._redacts, *head.redacted][-REDACTS_SEEN:]
        if head.seq < after and rm.store.head(layout.segment_key(machine, after)) is None:
            if self._compacted_past(rm, after):
                # An older head put back over the newer one (segments gone because they
                # were compacted, not because the machine began again): it says nothing.
                self._missing.pop(machine, None)
                return set(), None
            return set(), head.seq
        gap = gap and head.seq > after
        # After a start, what was imported from there and is behind it too: an update
        # whose import failed before the stop (no echo of this machine's lines grows those
        # past what was imported, but for sessions this machine went on with: fetched
        # once a start).
        started = self._started(machine)
        self._unreconciled.discard(machine)
        wants = Selection(self.settings.include, self.settings.exclude).wants
        known = self.state.known_sessions()
        forgotten = self.state.forgotten()
        have = {r.src_path: r for r in self.state.imports(machine)}
        missing: dict[bytes, tuple[int, int]] = {}
        more = 0
        for s in head.sessions:
            r = have.get(s.path)
            if s.deleted_at is not None or not wants(os.fsdecode(s.path)) or \
                    s.session_id in forgotten or not (
                    (gap or s.session_id not in known) if r is None else
                    (gap or started) and _behind(r, s.gen, s.size)):
                continue
            if len(missing) < MISSING_KEPT:
                missing[s.path] = (s.gen, s.size)
            else:
                more += 1  # counted, not kept: a head's claims never decide memory
        self._missing[machine] = missing
        self._missing_more[machine] = more
        cur.head_etag = info.etag  # only now: what it lists is known here
        self._head_seq[machine] = head.seq
        self._head_time[machine] = head.time
        cur.missing = len(missing) + more
        return self._due_listed(machine), None if head.seq <= after else head.seq

    def _started(self, machine: str) -> bool:
        """Whether the machine was not reconciled yet since this follower started."""
        return machine in self._unreconciled

    def _compacted_past(self, rm: _Remembered, seq: int) -> bool:
        """Whether a compaction folded segment ``seq`` of the machine (a delta or a
        manifest holds it): listed anew, two LISTs, only when its head went back."""
        rm.forget()
        return any(hi >= seq for _, hi, _, _ in rm.deltas()) or \
            any(s >= seq for s, _, _ in rm.snapshots())

    def _due_listed(self, machine: str) -> set[str]:
        """The sessions its last head listed as missing here that are due now (not
        waiting after a failure), at most ``RECONCILE_MAX``."""
        due = []
        cold = self._cold.get(machine, (0, set()))[1]
        for path in sorted(self._missing.get(machine, {})):
            sid = owner_of(path)
            tried = self._failed.get((machine, sid or ""))
            if sid is not None and sid not in cold and (tried is None or
                                                        tried[1] <= self._polls):
                due.append(sid)
                if len(due) >= RECONCILE_MAX:
                    break
        return set(due)

    def _due_again(self, machine: str) -> set[str]:
        """The sessions whose import failed and whose wait is over (of those forgotten
        into the cold set, at most ``RECONCILE_MAX`` once its wait is over)."""
        due = {sid for (m, sid), (_, at) in self._failed.items()
               if m == machine and at <= self._polls}
        until, cold = self._cold.get(machine, (0, set()))
        if cold and until <= self._polls:
            back = set(sorted(cold)[:RECONCILE_MAX])
            cold -= back
            if not cold:
                del self._cold[machine]
            due |= back
        return due

    def _count_missing(self, machine: str, cur: Cursor) -> None:
        """What the last head listed that is still missing or behind here (imports since
        brought the rest)."""
        listed = self._missing.get(machine)
        more = self._missing_more.get(machine, 0)
        if not listed:
            if listed is not None:
                cur.missing = more
            return
        have = {r.src_path: r for r in self.state.imports(machine)}
        for path in [p for p, (gen, size) in listed.items() if (r := have.get(p)) is not None
                     and not _behind(r, gen, size)]:
            del listed[path]
        cur.missing = len(listed) + more

    def _quiet_now(self, machine: str, waiting: list[str]) -> set[str]:
        """The sessions left until quiet whose local file is quiet now (or unknown here)."""
        quiet = Quiet(self.settings.source, self.settings.follow_quiet, self.clock,
                      ours=self._as_imported)
        root = os.fsencode(self.settings.source)
        ready = set()
        for sid in waiting:
            rel = self._left.get((machine, sid))
            try:
                st = None if rel is None else os.lstat(os.path.join(root, rel))
            except OSError:
                st = None
            if rel is None or st is None or quiet(rel, st) is None:
                ready.add(sid)
        return ready

    def _as_imported(self, rel: bytes, st: os.stat_result) -> bool:
        return intact(self.state, self.root, rel, st.st_size) is not None

    def _base(self, machine: str, again: set[str]
              ) -> Callable[[bytes, bytes], tuple[int, int, int] | None]:
        """For the restore of an import from ``machine``: the local files still as its last
        import left them (but those of the sessions imported ``again``), so that only what
        that machine added since is fetched."""
        def base(src: bytes, rel: bytes) -> tuple[int, int, int] | None:
            rec = intact(self.state, self.root, rel)
            if rec is None or rec.source != machine or rec.src_path != src or \
                    owner_of(src) in again:
                return None
            return rec.src_gen, rec.src_size, rec.size

        return base

    def _changed(self, rm: _Remembered, after: int) -> tuple[set[str], int | None]:
        """The sessions the segments after ``after`` changed, and the last seq read
        (None: no new segment). Bytes this machine shipped as imported from that
        machine are its own coming back: not imported again."""
        sids: set[str] = set()
        top = None
        self._top_time = None
        for seq in range(after + 1, after + 1 + SEGMENTS_MAX):
            key = layout.segment_key(rm.machine, seq)
            info = rm.store.head(key)
            if info is None:
                break
            rm.saw(seq, key, info.size)
            try:
                ix = rm.read_index(key, info.size)
            except NotFound:
                # Compacted away since its HEAD: not passed over, the head brings what it
                # changed (read when the HEADs find nothing).
                break
            except FormatError:  # said by read_index, and passed over
                top = seq
                continue
            top = seq
            if ix.machine != rm.machine or ix.seq != seq:
                log.warning("following %s: skipping %s: written by machine %r seq %d",
                            rm.machine, rm.where(key), ix.machine, ix.seq)
                continue
            echo: dict[str, bool] = {}
            for x in ix.extents:
                sid = owner_of(x.path)
                if sid is not None:
                    # This machine's lines it merged after its own, continuing what it
                    # had shipped (a new generation holds its own lines too): ours too.
                    ours = x.reason == imported_from(self.me) or (
                        x.reason == merged_from(self.me) and x.start > 0)
                    echo[sid] = echo.get(sid, True) and ours
            self._forgets.update(ix.forgotten)
            self._redacts = [*self._redacts, *ix.redacted][-REDACTS_SEEN:]
            # A copy (a cut, a move, a rewrite) changes its session like new bytes do.
            sids |= {sid for c in ix.copies if (sid := session_of_any(c.path)) is not None}
            sids |= {sid for sid, back in echo.items() if not back}
            for sid in sids:
                self._seen_at.setdefault(sid, ix.time)
            self._top_time = ix.time
        return sids, top

    def _import(self, rm: _Remembered, cur: Cursor, sids: set[str],
                backup: Backup | None) -> None:
        # A session forgotten here (by the user, or on a tombstone) never comes again.
        gone = sids & self.state.forgotten().keys()
        if gone:
            sids = sids - gone
            cur.waiting = [s for s in cur.waiting if s not in gone]
            cur.retry = [s for s in cur.retry if s not in gone]
            for sid in gone:
                self._failed.pop((rm.machine, sid), None)
        if not sids:
            return

        def listed_anew() -> Backup:
            rm.forget()
            return load_backup(rm, sessions=sorted(sids))

        # A view from the listings kept since the last one (see _Remembered).
        kept = backup is None and rm.listed
        if backup is None:
            backup = load_backup(rm, sessions=sorted(sids))
            if kept and backup.errors:  # listed before a compaction there
                kept, backup = False, listed_anew()
        present = sorted(sid for sid in sids if (found := backup.find_session(sid))
                         is not None and found.deleted_at is None)
        cur.waiting = [s for s in cur.waiting if s not in sids]  # still written here
        machine = rm.machine
        # Those that failed before are fetched whole.
        again = {sid for sid in sids if (machine, sid) in self._failed}
        cur.retry = [s for s in cur.retry if s not in sids]
        listed = {owner_of(p) for p in self._missing.get(machine, {})}
        for sid in sids - set(present):
            if sid in listed:
                # Its head lists it, its backup does not hold it (a head that lies, or a
                # session gone since): looked for again only after the longest wait.
                self._failed.pop((machine, sid), None)
                self._failed[(machine, sid)] = (FAILED_WAIT_MAX.bit_length(),
                                                self._polls + FAILED_WAIT_MAX)
                self._trim_failed()
            else:
                self._failed.pop((machine, sid), None)  # gone there: nothing to bring
        if not present:
            return
        cfg = self.settings
        state = self.state
        opts = RestoreOptions(
            target=cfg.source, sessions=tuple(present), maps=tuple(config_rules(cfg)),
            local_root=str(cfg.source), project_roots=tuple(cfg.project_roots),
            conflicts_dir=cfg.state_dir / "conflicts",
            conflict_copies=cfg.conflict_copies, conflict_bytes=cfg.conflict_bytes,
            refused_copy=rm.copy_refused,
            selection=Selection(cfg.include, cfg.exclude), local_machine=self.me,
            leave=Quiet(cfg.source, cfg.follow_quiet, self.clock, ours=self._as_imported),
            history=False,
            # A first look (a machine made again under its id included) fetches whole, as
            # does the import of a session that failed.
            base=None if cur.seq is None else self._base(machine, again),
            progress=_Fed(self.progress),
            # A session that exists here stays where it is, with this machine's paths.
            relocate=False, origin_of=state.origin,
            record_origin=lambda rec, replace: state.record_origins([rec], replace),
            shipped=lambda rel: shipped_bytes(state, self.root, rel))
        batches = [tuple(present)]
        while batches:
            batch = batches.pop()
            try:
                report = restore(rm, replace(opts, sessions=batch), backup)
            except RestoreError as e:
                # One session's failure (a size no disk here holds, …) is its own: the
                # others are imported in halves; that one is said, and tried again later.
                if len(batch) == 1:
                    log.warning("following %s: session %s not imported: %s", rm.machine,
                                batch[0], e)
                    self._fail(machine, cur, batch[0])
                else:
                    batches += [batch[: len(batch) // 2], batch[len(batch) // 2 :]]
                continue
            if kept and report.errors:
                # Objects compacted away since the listing: what was written stays
                # recorded, the batch is imported again from a view listed anew (the
                # files just written are skipped, unfetched).
                self._account(rm.machine, cur, report, backup, said=False)
                kept, backup = False, listed_anew()
                batches.append(batch)
                continue
            self._account(rm.machine, cur, report, backup)
            brought = {a.source for a in report.actions if a.action != "error"}
            for sid in batch:
                s = backup.find_session(sid)
                if s is not None and (os.fsdecode(s.path) not in brought or
                                      s.path in report.cut):
                    self._fail(machine, cur, sid)
                else:
                    self._failed.pop((machine, sid), None)
            self._placed(cur, report)

    # -- tombstones -------------------------------------------------------------------
    def _honour(self, machine: str, cur: Cursor, writable: bool) -> None:
        """The tombstones read of ``machine`` this poll: a session that came here from it
        and is not forgotten here yet is forgotten (by that machine), its local copy
        removed once quiet and this machine's backup purged of it. One that did not
        come from there is not that machine's to forget: ignored."""
        tombs, self._forgets = self._forgets, {}
        if tombs:
            forgotten = self.state.forgotten()
            done = set(cur.forgetting) | set(cur.honoured)
            fresh = [sid for sid in sorted(tombs) if sid not in forgotten and sid not in done]
            theirs = self._from(machine, fresh) if fresh else set()
            if theirs:
                # Noted in the cursor before anything else: a crash from here on
                # finds the session there at the next start, and goes on.
                cur.forgetting = sorted(set(cur.forgetting) | theirs)
                cur.honoured = [*(s for s in cur.honoured if s not in theirs),
                                *sorted(theirs)][-HONOURED_KEPT:]
                self._save_cursors()
                self.state.forget_sessions(sorted(theirs), by=machine)
                purges.queue(self.state, sorted(theirs))
                log.info("following %s: %d sessions forgotten there are forgotten here too",
                         machine, len(theirs))
        if cur.forgetting and writable:
            self._remove_forgotten(machine, cur)
        reds, self._redacts = self._redacts, []
        if reds:
            # The same rule: only a session that came here from there is that machine's
            # to redact. The values are masked by the archive job (``redact_here``).
            theirs = self._from(machine, sorted({r.session for r in reds}))
            queued = redactions.queue(self.state, machine,
                                      [r for r in reds if r.session in theirs])
            if queued:
                log.info("following %s: %d values redacted there in %d sessions are "
                         "queued to be masked here", machine,
                         sum(len(r.values) for r in queued), len({r.session for r in queued}))

    def _from(self, machine: str, sids: list[str]) -> set[str]:
        """Those of ``sids`` that came here from ``machine``: their origin says so (an
        import or a restore that made them here records it), or, with no origin known (a
        state from before origins), an import from there wrote their transcript whole. A
        conflict or a merge wrote nothing of that machine's over this one's own."""
        imported = {sid for r in self.state.imports(machine)
                    if r.size and not r.merged and (sid := session_of(r.path)) is not None}
        out = set()
        for sid in sids:
            rec = self.state.origin(sid)
            if (rec.machine == machine) if rec is not None else sid in imported:
                out.add(sid)
        return out

    def _remove_forgotten(self, machine: str, cur: Cursor) -> None:
        """Remove the local files of the sessions in ``cur.forgetting`` that are exactly
        what imports from ``machine`` left, each once it is quiet (else at a later poll);
        a file holding lines written here is kept, and said once."""
        sids = set(cur.forgetting)
        forgotten = self.state.forgotten()
        again = sorted(sids - forgotten.keys())
        if again:  # (a crash between the cursor and the table: made good)
            self.state.forget_sessions(again, by=machine)
        purges.queue(self.state, sorted(sids))
        quiet = Quiet(self.settings.source, self.settings.follow_quiet, self.clock,
                      ours=self._as_imported)
        wants = Selection(self.settings.include, self.settings.exclude).wants
        imported: dict[str, list[bytes]] = {}
        for r in self.state.imports(machine):
            sid = session_owning(r.path)
            if sid in sids:
                imported.setdefault(sid, []).append(r.path)
        top = os.path.realpath(self.root)
        # The session's files no import wrote (shipped from here): kept, being its own.
        own: dict[str, list[bytes]] = {}
        for f in self.state.files():
            sid = session_owning(f.path)
            if sid in sids and f.deleted_at is None and f.path not in imported.get(sid, ()):
                own.setdefault(sid, []).append(f.path)
        still = []
        for sid in sorted(sids):
            waits = False
            kept = [p for p in own.get(sid, []) if os.path.lexists(os.path.join(self.root, p))]
            removed: list[bytes] = []
            for rel in imported.get(sid, []):
                full = os.path.join(self.root, rel)
                try:
                    st = os.lstat(full)
                except FileNotFoundError:
                    continue
                except OSError:
                    waits = True
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                if intact(self.state, self.root, rel, st.st_size) is None or \
                        not wants(os.fsdecode(rel)) or \
                        os.path.realpath(os.path.dirname(full)) != \
                        os.path.join(top, os.path.dirname(rel)).rstrip(b"/"):
                    # Lines written here, or merged with them; or (never removed) beyond
                    # the include set or through a symlinked folder.
                    kept.append(rel)
                elif quiet(rel, st) is not None:
                    waits = True
                else:
                    try:
                        os.unlink(full)
                    except FileNotFoundError:
                        pass
                    except OSError as e:
                        log.warning("following %s: cannot remove %s of forgotten session "
                                    "%s: %s", machine, os.fsdecode(rel), sid, e.strerror)
                        waits = True
                        continue
                    removed.append(rel)
            _remove_empty_dirs(self.root, removed, sid)
            if waits:
                still.append(sid)
                continue
            if kept:
                log.warning("following %s: session %s was forgotten there; %d of its files "
                            "here are kept, holding lines written here (or not as an import "
                            "left them): %s%s", machine, sid, len(kept),
                            os.fsdecode(sorted(kept)[0]), ", …" if len(kept) > 1 else "")
            elif removed:
                log.info("following %s: removed forgotten session %s (%d files)", machine,
                         sid, len(removed))
        cur.forgetting = still

    def _save_cursors(self) -> None:
        self.state.set_meta(**{META: json.dumps({m: asdict(c)
                                                 for m, c in self.cursors.items()})})

    def _fail(self, machine: str, cur: Cursor, sid: str) -> None:
        """An import of ``sid`` that did not bring it: tried again at the next poll, then
        after 2, 4 … polls (at most ``FAILED_WAIT_MAX``), whether or not it changes there."""
        n = self._failed.pop((machine, sid), (0, 0))[0] + 1
        at = self._polls + 1 + (0 if n == 1 else min(1 << (n - 1), FAILED_WAIT_MAX))
        self._failed[(machine, sid)] = (n, at)
        self._trim_failed()
        cur.retry = [*(x for x in cur.retry if x != sid), sid][-KEPT:]  # the newest stay

    def _trim_failed(self) -> None:
        # A machine whose sessions all fail costs bounded memory: the oldest failure is
        # forgotten, but not as if it never failed: its session waits in that machine's
        # cold set (a session id each, at most MISSING_KEPT) the longest wait, with all
        # the others forgotten so far, then comes with the head's list again.
        while len(self._failed) > FAILED_KEPT:
            (machine, sid) = next(iter(self._failed))
            del self._failed[(machine, sid)]
            cold = self._cold.setdefault(machine, (self._polls + FAILED_WAIT_MAX, set()))
            if len(cold[1]) < MISSING_KEPT:
                cold[1].add(sid)

    def _theirs(self, machine: str, sid: str | None, rel: bytes) -> bool:
        """Whether the local file ``rel`` (of session ``sid``) is, as far as this machine
        knows, ``machine``'s: the session came from there, or an import from there wrote
        the file before."""
        rec = self.state.origin(sid) if sid is not None else None
        if rec is not None:
            return rec.machine == machine
        before = self.state.imported(rel)
        return before is not None and before.source == machine

    def _placed(self, cur: Cursor, report: RestoreReport) -> None:
        """Note the sessions made here whose project path does not exist on this machine
        (nothing local told where this machine keeps them): ``status`` lists them."""
        made = {sid for a in report.actions if a.action == "create" and
                (sid := session_of(os.fsencode(a.source))) is not None}
        for sid, path in report.sessions.items():
            if sid in made and not os.path.isdir(path):
                cur.elsewhere = [*(s for s in cur.elsewhere if s != sid), sid][-KEPT:]
            elif os.path.isdir(path):
                cur.elsewhere = [s for s in cur.elsewhere if s != sid]

    def _account(self, machine: str, cur: Cursor, report: RestoreReport,
                 backup: Backup, said: bool = True) -> None:
        """Record what the import wrote (before the next flush looks at it), and what it
        left for later; its errors are logged (unless not ``said``)."""
        root = os.fsencode(self.settings.source)
        records: list[ImportedFile] = []
        written: set[str] = set()
        for a in report.actions:
            src = os.fsencode(a.source)
            sid = owner_of(src)
            if a.action == "wait" and sid is not None:
                # All of them (a local file each): one dropped would never be imported.
                cur.waiting = sorted(set(cur.waiting) | {sid})
                self._left[(machine, sid)] = os.fsencode(a.path)
            if a.conflict_copy:
                # Gone: those a newer copy superseded or the bounds let go (the oldest);
                # a copy kept already (nothing new) is named once.
                cur.conflicts = [*(c for c in cur.conflicts if os.path.exists(c) and
                                   c != a.conflict_copy), a.conflict_copy][-KEPT:]
            f = backup.files.get(src)
            if a.action not in WRITTEN or f is None:
                continue
            if a.action in ("skip", "keep") and not self._theirs(machine, sid,
                                                                 os.fsencode(a.path)):
                # This machine's own session (that machine's copy is its, echoed): nothing
                # of it is that machine's, and it is not counted among its sessions here.
                continue
            # What the import wrote (or, skipped, found as the last one left it), not what
            # the file holds by now: a line Claude appended since is this machine's own,
            # never labelled imported.
            # A conflict wrote nothing: the local file is this machine's own, none of its
            # bytes labelled (the record only says how far that machine was looked at).
            # An empty file it wrote is that: 0 bytes (a line appended since is not its).
            wrote = 0 if a.action in ("conflict", "keep") else a.size
            full = os.path.join(root, os.fsencode(a.path))
            if a.action == "merge":
                # The merged lines follow the local ones it kept: those not shipped yet
                # are this machine's own. Then none is labelled (the record vouches only
                # for what was shipped, continued): the other machine, finding its own
                # lines in them, keeps what it has.
                shipped = shipped_bytes(self.state, root, os.fsencode(a.path))
                if a.kept > shipped:
                    wrote = shipped
            rec = _record(full, os.fsencode(a.path),
                          machine, a.action not in ("create", "fast-forward", "replace", "skip"),
                          src, f.gen, report.cut.get(src, f.size), self.clock(), wrote)
            if rec is not None:
                records.append(rec)
                if a.action not in ("skip", "keep", "conflict") and sid is not None:
                    written.add(sid)
        self.state.record_imported(records)
        for line in report.errors if said else ():
            if self._repos[machine].to_say(line):
                log.warning("following %s: %s", machine, line)
        if written:
            cur.imported += len(written)
            cur.last_import = self.clock()
            log.info("imported %d sessions from %s%s", len(written), machine,
                     f"; {len(cur.waiting)} left until quiet" if cur.waiting else "")


def _remove_empty_dirs(root: bytes, removed: list[bytes], sid: str) -> None:
    """The directories of session ``sid`` that removing ``removed`` left empty (never one
    that is not the session's own, such as its project folder)."""
    dirs = {os.path.dirname(rel) for rel in removed}
    for d in sorted(dirs, key=len, reverse=True):
        while d and session_owning(d + b"/x") == sid:
            try:
                os.rmdir(os.path.join(root, d))
            except OSError:
                break  # not empty (or gone): its parents are not either
            d = os.path.dirname(d)


def _behind(rec: ImportedFile, gen: int, size: int) -> bool:
    """Whether what an import brought is behind generation ``gen`` at ``size`` there."""
    return rec.src_gen < gen or (rec.src_gen == gen and rec.src_size < size)


class _Fed(NullMeter):
    def __init__(self, told: Callable[[int], None]) -> None:
        super().__init__()
        self.told = told

    def advance(self, n: int) -> None:
        self.told(n)


def _record(full: bytes, rel: bytes, machine: str, merged: bool, src: bytes, gen: int,
            size: int, now: float, wrote: int) -> ImportedFile | None:
    """The record of a file an import left, its first ``wrote`` bytes the import's."""
    try:
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_size < wrote:
            return None  # not what the import wrote any more
        return ImportedFile(rel, machine, wrote, check_hash(fd, wrote), merged, src,
                            max(0, min(gen, STATE_INT_MAX)), max(0, min(size, STATE_INT_MAX)),
                            now)
    finally:
        os.close(fd)


__all__ = ["Cursor", "Follower", "cursors", "first_look_due", "session_of_any"]

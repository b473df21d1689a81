"""``syncd verify``: is a machine's backup whole, and do its stored bytes still check out?

The metadata is checked whole: every current snapshot manifest reads; the newest one
locates every byte any kept snapshot needs (its objects exist, its extents lie inside
them and run contiguously); older snapshots resolve through it; the segments after it
run without a gap. Then, as asked, a random share of the stored frames is fetched,
decompressed and checked against its sha256 (every frame at 100 %).

The reference is the newest *readable* manifest, as for a restore. Older manifests' own
extents may point to packs that compaction has since replaced: that is by design
(``archive/compact``), so only the reference's extents are checked against the store.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from syncd.duration import format_time
from syncd.errors import FormatError, StoreError
from syncd.format.segment import HEADER, PACK_KIND, Extent
from syncd.format.snapshot import Entry, Group, Manifest, current
from syncd.progress import Meter, NullMeter
from syncd.repository import Repository
from syncd.store import layout

# One request while sampling spans at most this many bytes of an object: memory stays
# bounded and the clock is looked at often enough for --max-duration.
_SPAN = 8 << 20
# Per-file problems of one manifest beyond this many are counted, not listed.
_EXAMPLES = 10
# The writer's default head_interval, and the slack a head gets beyond it: a head is
# written after the flush it covers is confirmed (a flush's time is when it began), and
# a verify may look between the two.
HEAD_INTERVAL = 300.0
HEAD_SLACK = 300.0


@dataclass
class VerifyReport:
    machine: str
    # One line each, naming the object (store URL and key) and what is wrong.
    problems: list[str] = field(default_factory=list)
    checked_objects: int = 0
    snapshots: int = 0
    deltas: int = 0
    segments: int = 0
    packs: int = 0
    # Frames fetched and checked (damaged ones included).
    extents_read: int = 0
    # Raw bytes that were decompressed and matched their sha256.
    bytes_read: int = 0
    # Share of the referenced stored bytes (frames) that was fetched and checked.
    sampled_share: float = 0.0
    # --max-duration ran out before the sample was read.
    stopped_early: bool = False
    # Packs nothing references: leftovers of an interrupted run, a note, not a problem.
    unreferenced: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {"machine": self.machine, "ok": self.ok, "problems": self.problems,
                "checked_objects": self.checked_objects, "snapshots": self.snapshots,
                "deltas": self.deltas,
                "segments": self.segments, "packs": self.packs,
                "extents_read": self.extents_read, "bytes_read": self.bytes_read,
                "sampled_share": self.sampled_share, "stopped_early": self.stopped_early,
                "unreferenced": self.unreferenced}


def verify(repo: Repository, *, read_data: float = 0.0,
           max_duration: float | None = None, rng: random.Random | None = None,
           clock: Callable[[], float] = time.monotonic,
           progress: Meter | None = None, acknowledged: int | None = None,
           head_interval: float = HEAD_INTERVAL, now: float | None = None) -> VerifyReport:
    """Check the repository machine's backup; what is wrong goes to the report's
    ``problems``.

    ``read_data``: the percentage (0..100) of the referenced stored bytes to fetch and
    check, picked at random. ``max_duration``: seconds from the start after which the
    sampling stops (the metadata checks always run whole). A failing LIST raises
    ``StoreError``: then nothing can be judged. ``progress`` is told the stored bytes
    to sample, then each frame checked. ``acknowledged``: the newest seq the store
    confirmed to this machine's writer (its state knows): a store whose segments end
    before it has lost some. ``head_interval``: how far the machine's head may lag its
    flushes (its writer's setting); ``now``: the wall time to judge that by.
    """
    if not 0.0 <= read_data <= 100.0:
        raise ValueError(f"read_data is a percentage from 0 to 100, not {read_data}")
    deadline = None if max_duration is None else clock() + max_duration
    machine = repo.machine
    rep = VerifyReport(machine)
    prefix = layout.machine_prefix(machine)
    listing = {i.key: i.size for i in repo.objects()}
    v = _Verifier(repo, listing, rep, progress or NullMeter())
    snaps = current(sorted(
        (*sid, key) for key in listing
        if key.startswith(layout.snapshots_prefix(machine))
        and (sid := layout.snapshot_id(key)) is not None))
    if not snaps and not v.segment_keys(-1):
        known = ", ".join(repo.machines()) or "none"
        rep.problems.append(f"{repo.where(prefix)}: no backup for machine {machine!r} "
                            f"(machines in this store: {known})")
        return rep
    ref: tuple[Manifest, dict[str, Group]] | None = None
    for _, _, key in reversed(snaps):
        ref = v.read_snapshot(key)
        if ref is not None:
            break
    if ref is None:
        v.segments(v.deltas(-1))
    else:
        m, groups = ref
        located, refs = v.check_reference(m, groups)
        for seq, _, key in snaps:
            if seq < m.seq and (older := v.read_snapshot(key)) is not None:
                v.check_older(older[0], older[1], m, located)
        v.check_objects(m, refs)
        if m.key == snaps[-1][2]:
            # Only a reference that is the newest manifest knows what nothing needs.
            rep.unreferenced = sorted(
                k for k in listing
                if k.startswith(layout.packs_prefix(machine)) and layout.pack_range(k) is not None
                and k not in refs)
        v.segments(v.deltas(m.seq))
    if acknowledged is not None:
        newest = max([seq for seq, _ in v.segment_keys(-1)] + [s[0] for s in snaps] + [-1]
                     + [r[1] for k in listing if (r := layout.delta_range(k)) is not None
                        and k.startswith(layout.deltas_prefix(machine))])
        if newest < acknowledged:
            v.problem(layout.segment_key(machine, newest + 1),
                      f"missing: segments {newest + 1:016x}..{acknowledged:016x} were "
                      "confirmed to this machine's writer and are not in the store (lost or "
                      "deleted; the writer ships their files again at its next start)")
    if layout.head_key(machine) in listing:  # none: an older writer's machine
        v.check_head(head_interval, time.time() if now is None else now)
    if read_data > 0:
        v.sample(read_data / 100.0, rng or random.Random(), clock, deadline)
    return rep


def _named(where: str, err: Exception) -> str:
    msg = str(err) or type(err).__name__
    return msg if where in msg else f"{where}: {msg}"


def _reach(e: Entry) -> tuple[int, int | None]:
    """How far ``e``'s extents run contiguously from 0, and where a gap starts (if any)."""
    pos = 0
    for _, x in e.extents:
        if x.start != pos or x.end < x.start:
            return pos, x.start
        pos = x.end
    return pos, None


def _ident(x: Extent) -> tuple[bytes, int, int, int, int, int, str, str | None]:
    # The dictionary too: a frame read without the one it was made with does not open.
    return x.path, x.gen, x.start, x.end, x.off, x.clen, x.sha256, x.dict_id


def _frame(x: Extent) -> tuple[int, int, str, str | None]:
    return x.off, x.clen, x.sha256, x.dict_id


def _spans(exts: list[Extent]) -> Iterator[list[Extent]]:
    """Extents (sorted by offset) in runs that each span at most ``_SPAN`` bytes."""
    run: list[Extent] = []
    for x in exts:
        if run and x.off + x.clen - run[0].off > _SPAN:
            yield run
            run = []
        run.append(x)
    if run:
        yield run


class _Verifier:
    def __init__(self, repo: Repository, listing: dict[str, int], rep: VerifyReport,
                 meter: Meter) -> None:
        self.repo, self.machine = repo, repo.machine
        self.listing, self.rep, self.meter = listing, rep, meter
        # Stored frames the backup needs: what the data sample is drawn from.
        self.population: dict[tuple[str, int], Extent] = {}
        self.sampled = 0
        # The time of each flush a readable object names (seq → time): what the head
        # is held to.
        self.flushes: dict[int, float] = {}

    def where(self, key: str) -> str:
        return self.repo.where(key)

    def problem(self, key: str, what: str) -> None:
        self.rep.problems.append(f"{self.where(key)}: {what}")

    def listed(self, key: str, lines: list[str], what: str) -> None:
        for line in lines[:_EXAMPLES]:
            self.problem(key, line)
        if len(lines) > _EXAMPLES:
            self.problem(key, f"and {len(lines) - _EXAMPLES} more {what}")

    def read_snapshot(self, key: str) -> tuple[Manifest, dict[str, Group]] | None:
        self.rep.snapshots += 1
        self.rep.checked_objects += 1
        try:
            m = self.repo.read_manifest(key)
            groups = self.repo.read_groups(m)
        except (FormatError, StoreError) as e:
            self.rep.problems.append(_named(self.where(key), e))
            return None
        if m.machine != self.machine:
            self.problem(key, f"written by machine {m.machine!r} (foreign or renamed object)")
            return None
        self.flushes[m.seq] = m.time
        return m, groups

    def check_reference(self, m: Manifest, groups: dict[str, Group]
                        ) -> tuple[dict[tuple[bytes, int], int], dict[str, list[Extent]]]:
        """Every entry runs contiguously to its size; returns what it locates, and where."""
        located: dict[tuple[bytes, int], int] = {}
        refs: dict[str, list[Extent]] = {}
        bad: list[str] = []
        for g in groups.values():
            for e in g.entries:
                reach, gap = _reach(e)
                name = (f"{os.fsdecode(e.path)} {'retained ' if e.retained else ''}"
                        f"generation {e.gen}")
                if gap is not None:
                    bad.append(f"{name}: extents are not contiguous (byte {reach} is followed "
                               f"by an extent from byte {gap})")
                elif reach < e.size:
                    bad.append(f"{name}: extents reach byte {reach}, short of its size "
                               f"{e.size}")
                located[(e.path, e.gen)] = max(reach, located.get((e.path, e.gen), 0))
                for key, x in e.extents:
                    refs.setdefault(key, []).append(x)
        self.listed(m.key, bad, "damaged files")
        return located, refs

    def check_older(self, old: Manifest, groups: dict[str, Group], ref: Manifest,
                    located: dict[tuple[bytes, int], int]) -> None:
        """Each file of ``old`` must be found, long enough, through the reference."""
        bad: list[str] = []
        for g in groups.values():
            for e in g.entries:
                if e.retained:
                    continue
                reach = located.get((e.path, e.gen))
                if reach is not None and reach >= e.size:
                    continue
                name = f"{os.fsdecode(e.path)} generation {e.gen} ({e.size} bytes)"
                why = ("is not in" if reach is None
                       else f"has only {reach} bytes in")
                bad.append(f"{name} {why} the newest snapshot {self.where(ref.key)}")
        self.listed(old.key, bad, "files that cannot be restored")

    def check_objects(self, m: Manifest, refs: dict[str, list[Extent]]) -> None:
        """The objects the reference locates bytes in: present, long enough, indexed."""
        for key in sorted(refs):
            exts = refs[key]
            size = self.listing.get(key)
            if size is None:
                self.problem(key, f"missing, but snapshot {self.where(m.key)} locates "
                                  f"{len(exts)} extents in it (e.g. of "
                                  f"{os.fsdecode(exts[0].path)})")
                continue
            inside = self.inside(key, size, exts)
            self.rep.checked_objects += 1
            try:
                ix = self.repo.read_index(key, size)
            except (FormatError, StoreError) as e:
                self.rep.problems.append(_named(self.where(key), e))
                self.add(key, inside)  # its frames may still be whole
                continue
            rng = layout.pack_range(key)
            if rng is not None:
                self.rep.packs += 1
                kind, lo, hi = (ix.extra.get(k) for k in ("kind", "lo", "hi"))
                if kind != PACK_KIND or (lo, hi) != rng:
                    self.problem(key, f"index says kind {kind!r} lo {lo!r} hi {hi!r}, not a "
                                      "pack of the range its key names")
            if ix.machine != self.machine:
                self.problem(key, f"written by machine {ix.machine!r} (foreign or renamed "
                                  "object)")
            # The object's own index is what its frames were written with (a dictionary
            # id, say): the sample reads through it.
            own = {_ident(x): x for x in ix.extents}
            # A part of a frame (bytes another generation shares) is the frame's.
            frames = {_frame(x): x for x in ix.extents}
            stray = [x for x in inside if _ident(x) not in own and
                     not (x.frame and _frame(x) in frames)]
            self.add(key, [own.get(_ident(x)) or frames.get(_frame(x), x) for x in inside])
            if stray:
                x = stray[0]
                self.problem(key, f"{len(stray)} extents that snapshot {self.where(m.key)} "
                                  f"locates here are not in the object's index (e.g. "
                                  f"{os.fsdecode(x.path)} [{x.start},{x.end}))")

    def add(self, key: str, exts: list[Extent]) -> None:
        for x in exts:
            self.population.setdefault((key, x.off), x)

    def inside(self, key: str, size: int, exts: list[Extent]) -> list[Extent]:
        """The extents that lie inside the object (a problem names the others)."""
        inside: list[Extent] = []
        outside: list[Extent] = []
        for x in exts:
            (inside if x.off >= HEADER.size and x.off + x.clen <= size else outside).append(x)
        if outside:
            x = outside[0]
            self.problem(key, f"{len(outside)} extents lie outside the object ({size} bytes; "
                              f"e.g. {os.fsdecode(x.path)} at [{x.off},{x.off + x.clen}))")
        return inside

    def segment_keys(self, after: int) -> list[tuple[int, str]]:
        prefix = layout.segments_prefix(self.machine)
        out = []
        for key in self.listing:
            seq = layout.segment_seq(key) if key.startswith(prefix) else None
            if seq is not None and seq > after:
                out.append((seq, key))
        return sorted(out)

    def deltas(self, after: int) -> int:
        """Every delta read and its frames added to the sample; returns the seq the chain
        after ``after`` reaches (segments follow it)."""
        rows = sorted((*rng, key) for key in self.listing
                      if key.startswith(layout.deltas_prefix(self.machine))
                      and (rng := layout.delta_range(key)) is not None)
        top = after
        for lo, hi, key in rows:
            self.rep.deltas += 1
            self.rep.checked_objects += 1
            try:
                d = self.repo.read_delta(key, self.listing[key])
            except (FormatError, StoreError) as e:
                self.rep.problems.append(_named(self.where(key), e))
                continue
            if d.index.machine != self.machine:
                self.problem(key, f"written by machine {d.index.machine!r} (foreign or "
                                  "renamed object)")
                continue
            self.add(key, self.inside(key, self.listing[key], d.index.extents))
            self.flushes.update((p.seq, p.time) for p in d.points)
            if lo <= top + 1 < hi + 1:  # the chain's next one (the widest of a start)
                top = hi
        return top

    def segments(self, after: int) -> None:
        """The segments after the reference run without a gap and their indexes read."""
        expected = after + 1
        for seq, key in self.segment_keys(after):
            if seq != expected:
                which = (f"segment {expected:016x} is" if seq == expected + 1
                         else f"segments {expected:016x}..{seq - 1:016x} are")
                self.problem(layout.segment_key(self.machine, expected),
                             f"missing: {which} not in the store (a gap before {key})")
            expected = seq + 1
            self.rep.segments += 1
            self.rep.checked_objects += 1
            try:
                ix = self.repo.read_index(key, self.listing[key])
            except (FormatError, StoreError) as e:
                self.rep.problems.append(_named(self.where(key), e))
                continue
            if (ix.machine, ix.seq) != (self.machine, seq):
                self.problem(key, f"index says machine {ix.machine!r} seq {ix.seq}, not what "
                                  "its key says (foreign or renamed object)")
                continue
            self.flushes[seq] = ix.time
            self.add(key, self.inside(key, self.listing[key], ix.extents))

    def check_head(self, interval: float, now: float) -> None:
        """The head reads, covers no flush the store does not list, and lags the flushes
        no more than its writer lets it: rewritten at most every ``interval`` while
        flushes come (so a flush made that long after the head was written is in the
        next one), at once for a new session, at a clean stop."""
        key = layout.head_key(self.machine)
        self.rep.checked_objects += 1
        try:
            h = self.repo.head()
        except (FormatError, StoreError) as e:
            self.rep.problems.append(_named(self.where(key), e))
            return
        if h is None:  # gone since the listing
            return
        listed = [seq for seq, _ in self.segment_keys(-1)]
        for k in self.listing:
            kind = layout.kind_of(k)
            if kind == "delta" and (rng := layout.delta_range(k)) is not None:
                listed.append(rng[1])
            elif kind == "snap" and (sid := layout.snapshot_id(k)) is not None:
                listed.append(sid[0])
        newest = max(listed, default=-1)
        if h.seq > newest:
            self.problem(key, f"covers flush {h.seq}, but the newest the store holds is "
                              f"{newest}: a head ahead of its backup (the store was rolled "
                              "back, or the head is not its writer's)")
            return
        late = sorted((seq, t) for seq, t in self.flushes.items() if seq > h.seq
                      and h.written + interval + HEAD_SLACK <= t <= now - HEAD_SLACK)
        if late:
            seq, t = late[0]
            self.problem(key, f"covers flush {h.seq} (written {format_time(h.written)}), "
                              f"but flush {seq} of {format_time(t)} came more than "
                              f"head_interval ({interval:g} s) after it and is not in it: "
                              "an older head put back, or its writer cannot write it "
                              "(readers fold only the segments after a head onto it)")

    def sample(self, share: float, rng: random.Random, clock: Callable[[], float],
               deadline: float | None) -> None:
        """Fetch and check a random ``share`` of the population's stored bytes."""
        items = sorted(self.population.items())
        total = sum(x.clen for _, x in items)
        rng.shuffle(items)
        want = total * share
        picked: dict[str, list[Extent]] = {}
        got = 0
        for (key, _), x in items:
            if got >= want and share < 1.0:
                break
            picked.setdefault(key, []).append(x)
            got += x.clen
        self.meter.start(got)

        def late() -> bool:
            return deadline is not None and clock() >= deadline

        for key, exts in picked.items():
            errors: list[str] = []
            stopped = self.sample_object(key, sorted(exts, key=lambda x: x.off), errors, late)
            if errors:
                more = len(errors) - 1
                self.rep.problems.append(errors[0] + (
                    f" (and {more} more damaged extents in this object)" if more else ""))
            if stopped:
                self.rep.stopped_early = True
                break
        self.rep.sampled_share = self.sampled / total if total else 1.0

    def sample_object(self, key: str, exts: list[Extent], errors: list[str],
                      late: Callable[[], bool]) -> bool:
        """Check ``exts`` of one object; True when the deadline stopped it."""
        for run in _spans(exts):
            if late():
                return True
            done = 0
            try:
                for x, data in self.repo.read_extents(key, run):
                    self.count(x, len(data))
                    done += 1
                    if done < len(run) and late():
                        return True
                continue
            except (FormatError, StoreError):
                pass
            # Something in the run is damaged: one at a time, to tell good frames from bad.
            for x in run[done:]:
                if late():
                    return True
                try:
                    for _, data in self.repo.read_extents(key, [x]):
                        self.count(x, len(data))
                except (FormatError, StoreError) as e:
                    self.count(x, 0)
                    errors.append(_named(self.where(key), e))
        return False

    def count(self, x: Extent, raw: int) -> None:
        self.rep.extents_read += 1
        self.sampled += x.clen
        self.rep.bytes_read += raw
        self.meter.advance(x.clen)

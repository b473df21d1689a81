"""A machine's timeline: every point in time a restore of it can reach.

A point is a flush (a segment, or one of the points a delta or a manifest keeps) or a
compacted snapshot (a manifest). A restore as of T starts at the newest manifest at or
before T and walks forward (view.py); the points listed here are exactly those such a
walk can reach: each manifest, and every point chained after one (or after the
beginning) without a gap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from syncd.errors import FormatError, StoreError
from syncd.format.catalog import session_of
from syncd.format.delta import manifest_points
from syncd.format.points import Point, point_of
from syncd.format.segment import Extent
from syncd.format.snapshot import Manifest, current
from syncd.repository import Repository
from syncd.store import layout


@dataclass
class PointRow:
    seq: int
    time: float
    kind: str  # "flush" or "snapshot" (a compacted one: a manifest)
    key: str  # the object that holds it
    sessions: list[str] = field(default_factory=list)  # the sessions it changed
    added: int | None = None  # bytes it added (None: unknown, a manifest's own)


def timeline(repo: Repository) -> tuple[list[PointRow], list[str]]:
    """The points of the repository machine, oldest first, and one line per object that
    could not be read (its points are missing)."""
    errors: list[str] = []
    manifests: dict[int, Manifest] = {}
    for seq, _, key in current(repo.snapshots()):
        try:
            manifests[seq] = repo.read_manifest(key)
        except (FormatError, StoreError) as e:
            errors.append(str(e))
    # Every source of points by the seq it starts at: deltas, manifests' own points,
    # segments after the newest manifest.
    sources: dict[int, list[tuple[int, str, list[Point], list[Extent]]]] = {}
    for lo, hi, key, size in repo.deltas():
        try:
            d = repo.read_delta(key, size)
        except (FormatError, StoreError) as e:
            errors.append(str(e))
            continue
        sources.setdefault(lo, []).append((hi, key, d.points, d.index.extents))
    for m in manifests.values():
        try:
            own = manifest_points(m)
        except FormatError as e:
            errors.append(str(e))
            continue
        if own is not None:
            sources.setdefault(own[0], []).append((m.seq, m.key, own[1], []))
    top = max(manifests, default=-1)
    for key, size in repo.segments(top):
        seq = layout.segment_seq(key) or 0
        try:
            ix = repo.read_index(key, size)
        except (FormatError, StoreError) as e:
            errors.append(str(e))
            continue
        sources.setdefault(seq, []).append((seq, key, [point_of(ix)], ix.extents))
    rows: dict[int, PointRow] = {}
    sizes: dict[tuple[bytes, int], int] = {}
    for start in [-1, *sorted(manifests)]:
        if start >= 0:
            m = manifests[start]
            rows.setdefault(m.seq, PointRow(m.seq, m.time, "snapshot", m.key))
        cursor = start
        while sources.get(cursor + 1):
            hi, key, points, extents = max(sources[cursor + 1], key=lambda s: s[0])
            for x in extents:  # where each generation stood before this object
                sizes.setdefault((x.path, x.gen), x.start)
            for p in points:
                if p.seq not in rows:
                    rows[p.seq] = _row(p, key, sizes)
                    if p.seq in manifests:
                        rows[p.seq].kind = "snapshot"
            cursor = hi
    return [rows[s] for s in sorted(rows)], errors


def _row(p: Point, key: str, sizes: dict[tuple[bytes, int], int]) -> PointRow:
    row = PointRow(p.seq, p.time, "flush", key, added=0)
    sids: dict[str, None] = {}  # in the order the point names them
    for c in p.changes:
        sid = session_of(c.path)
        if sid is not None:
            sids[sid] = None
        if c.size is None:
            continue
        before = sizes.get((c.path, c.gen))
        if before is None:
            row.added = None  # a manifest's own point: where it started is not at hand
        elif row.added is not None:
            row.added += max(0, c.size - before)
        sizes[(c.path, c.gen)] = c.size
    row.sessions = list(sids)
    return row

"""Deltas: the flushes between two compactions, folded into one object with their points.

A delta is a segment container (docs/FORMAT.md, "Deltas") whose index says ``"kind":
"delta"``: the new bytes of segments ``lo..hi`` re-compressed (a frame per file and
generation, the trained dictionary for small ones), their deletions, the catalog they
add, and every one of their points. A machine's backup is its newest manifest, then the
deltas after it, then the segments after those.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from syncd.errors import FormatError
from syncd.format.points import Point, decode
from syncd.format.segment import SegmentIndex
from syncd.format.snapshot import Manifest
from syncd.store import layout

KIND = "delta"


@dataclass
class Delta:
    key: str
    lo: int
    hi: int
    index: SegmentIndex
    points: list[Point] = field(default_factory=list)
    size: int = 0  # of the object, where known

    @property
    def time(self) -> float:
        return self.index.time


def by_start(rows: list[tuple[int, int, str, int]]) -> dict[int, list[tuple[int, int, str, int]]]:
    """Deltas ``(lo, hi, key, size)`` by ``lo``, the widest of each start first (a wider
    one replaced the others: those are leftovers of a run that died before deleting
    them)."""
    out: dict[int, list[tuple[int, int, str, int]]] = {}
    for row in sorted(rows):
        out.setdefault(row[0], []).insert(0, row)
    return out


def delta_of(key: str, ix: SegmentIndex, where: str, size: int = 0) -> Delta:
    """The delta whose index is ``ix``, checked against its key and its points."""
    x = ix.extra
    if x.get("kind") != KIND:
        raise FormatError(f"{where}: not a delta")
    rng = layout.delta_range(key)
    try:
        lo, hi = int(x["lo"]), int(x["hi"])
        points = decode(x, where)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        raise FormatError(f"{where}: unreadable delta index: {e}") from e
    if rng != (lo, hi) or ix.seq != hi:
        raise FormatError(f"{where}: delta says segments {lo}..{hi}, which is not its key "
                          "(renamed object)")
    if not points or points[0].seq < lo or points[-1].seq != hi:
        raise FormatError(f"{where}: its points do not span segments {lo}..{hi}")
    return Delta(key, lo, hi, ix, points, size)


def manifest_points(m: Manifest) -> tuple[int, list[Point]] | None:
    """``(lo, points)`` of the segments manifest ``m`` folded itself (None: it names none,
    as manifests before points did)."""
    x = m.chain
    if "points" not in x:
        return None
    try:
        lo, points = int(x["lo"]), decode(x, m.key)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        raise FormatError(f"{m.key}: unreadable points: {e}") from e
    if not points or points[0].seq < lo or points[-1].seq != m.seq:
        raise FormatError(f"{m.key}: its points do not span segments {lo}..{m.seq}")
    return lo, points

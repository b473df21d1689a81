"""Writing a delta: the segments since the last compaction, folded into one object that
keeps every one of their points (docs/FORMAT.md, "Deltas").

Each file generation's new bytes become frames of their own (history.jsonl cut at line
ends), small ones compressed with the machine's trained dictionary; the deletions, the
tombstones of forgotten sessions and of redactions and the projects of the segments come
along, and the points say what each flush changed and which catalog fields its lines
named. A rerun after a crash finds the delta written (its key names its range) and adopts
it when it reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from syncd.archive.packer import Spool, spooled
from syncd.errors import AlreadyExists, CompactError, FormatError, StoreError
from syncd.format import points as pointfmt
from syncd.format.delta import KIND, Delta
from syncd.format.segment import FRAME_MAX, Extent, SegmentIndex, SegmentWriter
from syncd.format.snapshot import HISTORY
from syncd.repository import Repository
from syncd.store import layout

# history.jsonl interleaves every session's lines: small frames let one session's
# restore fetch only the frames that hold its lines.
HISTORY_FRAME = 256 << 10
# A delta's index (sha256s, paths, points) is most of its bytes and is kept for a day or
# more: compressed hard (tens of kB: milliseconds).
INDEX_LEVEL = 19


def write_delta(repo: Repository, segs: Sequence[tuple[str, int, SegmentIndex]], *,
                level: int, spool_dir: Path | None, extend: Delta | None = None) -> Delta | None:
    """The delta of ``segs`` (consecutive segments), written and read back; None when
    its key is taken by an object that is no delta of ours (planted, or damaged).

    ``extend``: a small delta that ends where ``segs`` start; the new one holds it and
    them (its range from ``extend.lo``), so the caller then deletes it with the segments.
    A file's new bytes of both become one run of frames."""
    lo, hi = (segs[0][2].seq if extend is None else extend.lo), segs[-1][2].seq
    key = layout.delta_key(repo.machine, lo, hi)
    sources = ([] if extend is None else [(extend.key, extend.index)]) + \
        [(k, ix) for k, _, ix in segs]
    points = ([] if extend is None else extend.points) + \
        [pointfmt.point_of(ix) for _, _, ix in segs]
    blob = _build(repo, key, sources, points, level, spool_dir)
    taken = False
    try:
        repo.put(key, blob)
    except AlreadyExists:
        taken = True  # left by a run that died before deleting the segments: read back
    try:
        d = repo.read_delta(key)
    except (FormatError, StoreError) as e:
        if taken:
            return None
        raise CompactError(f"the delta does not read back, nothing deleted: {e}") from e
    if taken and (d.index.machine != repo.machine or len(d.points) != len(points)):
        return None
    return d


def _build(repo: Repository, key: str, sources: Sequence[tuple[str, SegmentIndex]],
           points: list[pointfmt.Point], level: int, spool_dir: Path | None) -> bytes:
    lo, hi = layout.delta_range(key) or (0, 0)
    runs: dict[tuple[bytes, int], list[tuple[str, Extent]]] = {}
    projects: dict[str, dict[str, object]] = {}
    dict_id: str | None = None
    for skey, ix in sources:
        for x in ix.extents:
            runs.setdefault((x.path, x.gen), []).append((skey, x))
            dict_id = x.dict_id or dict_id
        projects.update(ix.projects)
    dictionary = None
    if dict_id is not None:
        try:
            dictionary = (dict_id, repo.dictionary(dict_id).zdict)
        except (FormatError, StoreError):
            dictionary = None  # frames are compressed without it
    w = SegmentWriter(repo.machine, hi, sources[-1][1].time, level=level,
                      cipher=repo.cipher(key), dictionary=dictionary, index_level=INDEX_LEVEL)
    with spooled(repo, spool_dir) as spool:
        for (path, gen), run in runs.items():
            _add_run(w, spool, path, gen, run)
    for _, ix in sources:
        for c in ix.copies:
            w.add_copy(c)
        for t in ix.tombstones:
            w.add_tombstone(t.path, t.gen, t.time)
    # Forgotten sessions' tombstones travel on (followers that read the delta honour them).
    for sid, at in _forgets(sources):
        w.add_forget(sid, at)
    # So do redactions' (each its own values: all kept, the same one once).
    for r in dict.fromkeys(r for _, ix in sources for r in ix.redacted):
        w.add_redact(r)
    for cwd, info in projects.items():
        w.add_project(cwd, dict(info))
    w.index.extra = {"kind": KIND, "lo": lo, "hi": hi, **pointfmt.encode(points)}
    return w.finish()


def _forgets(sources: Sequence[tuple[str, SegmentIndex]]) -> list[tuple[str, float]]:
    """The sources' forget entries, one per session (its newest), in the order met."""
    out: dict[str, float] = {}
    for _, ix in sources:
        for sid, t in ix.forgotten:
            out.pop(sid, None)
            out[sid] = t
    return list(out.items())


def _add_run(w: SegmentWriter, spool: Spool, path: bytes, gen: int,
             run: list[tuple[str, Extent]]) -> None:
    """One generation's new bytes as frames; an empty one as one empty extent."""
    limit = HISTORY_FRAME if path == HISTORY else FRAME_MAX
    last = run[-1][1]
    reason = run[0][1].reason
    start = run[0][1].start
    buf = bytearray()
    wrote = False

    def put(n: int) -> None:
        nonlocal start, reason, wrote
        w.add_data(path, gen, start, bytes(buf[:n]), mode=last.mode, mtime_ns=last.mtime_ns,
                   reason=reason)
        start += n
        del buf[:n]
        reason, wrote = None, True

    for skey, x in run:
        if x.start != start + len(buf):  # a gap (a lost segment): the next frame starts anew
            if buf:
                put(len(buf))
            start = x.start
        buf += spool.read(skey, x)
        while len(buf) >= limit:
            cut = limit
            if path == HISTORY:  # whole lines: a frame names its sessions
                cut = buf.rfind(b"\n", 0, limit) + 1 or limit
            put(cut)
    if buf or not wrote:
        put(len(buf))

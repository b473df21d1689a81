"""Reading segments back from a store: the index by one suffix GET, frames by range."""

from __future__ import annotations

from ._segment import (
    HEADER,
    TAIL_READ,
    TRAILER,
    Extent,
    FormatError,
    SegmentIndex,
    check_header,
    decode_extent,
    decode_index,
    index_digest,
    parse_index,
)
from .store import Store


def read_index(store: Store, key: str, size: int | None = None) -> SegmentIndex:
    """The index of segment ``key``; names the object in any error."""
    where = f"{store.url}{key}"
    if size is None:
        info = store.head(key)
        if info is None:
            raise FormatError(f"{where}: segment is missing")
        size = info.size
    tail = store.get(key, -min(size, TAIL_READ)) if size else b""
    if size <= TAIL_READ:
        check_header(tail, where)
    got = parse_index(tail, size, where)
    if isinstance(got, SegmentIndex):
        return got
    off, length = got
    return decode_index(store.get(key, off, length), index_digest(tail), where)


def parse_segment(blob: bytes, where: str) -> SegmentIndex:
    """The index of a segment held whole in memory."""
    check_header(blob, where)
    got = parse_index(blob[-TAIL_READ:] if len(blob) > TAIL_READ else blob, len(blob), where)
    if isinstance(got, SegmentIndex):
        return got
    off, length = got
    return decode_index(blob[off : off + length], index_digest(blob[-TRAILER.size:]), where)


def extent_bytes(blob: bytes, base: int, ext: Extent, where: str) -> bytes:
    """The raw bytes of ``ext`` from ``blob``, which holds the object from offset ``base``."""
    lo = ext.off - base
    if ext.off < HEADER.size or lo < 0 or lo + ext.clen > len(blob):
        raise FormatError(f"{where}: extent of {ext.path!r} lies outside the object")
    return decode_extent(blob[lo : lo + ext.clen], ext, where)

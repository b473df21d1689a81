"""Reading segments back from a store: the index by one suffix GET, frames by range.

``crypto`` is the unlocked key of an encrypted store (None for a plain one); with it
only sealed segments are accepted, without it only plain ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import zstandard

from ._crypto import Crypto, ObjectCipher
from ._dictionary import fetch, machine_of
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
from .store import Store, StoreError


def _cipher(crypto: Crypto | None, key: str) -> ObjectCipher | None:
    return None if crypto is None else crypto.cipher(key)


def read_index(store: Store, key: str, size: int | None = None,
               crypto: Crypto | None = None) -> SegmentIndex:
    """The index of segment ``key``; names the object in any error."""
    where = f"{store.url}{key}"
    if size is None:
        info = store.head(key)
        if info is None:
            raise FormatError(f"{where}: segment is missing")
        size = info.size
    tail = store.get(key, -min(size, TAIL_READ)) if size else b""
    if len(tail) != min(size, TAIL_READ):
        raise FormatError(f"{where}: object changed size while being read (truncated?)")
    cipher = _cipher(crypto, key)
    if size <= TAIL_READ:
        check_header(tail, where, sealed=cipher is not None)
    got = parse_index(tail, size, where, cipher)
    if isinstance(got, SegmentIndex):
        return got
    off, length = got
    # The tail already holds the index's last bytes: fetch only what comes before them.
    have = len(tail) - TRAILER.size
    blob = store.get(key, off, length - have) + tail[:have]
    return decode_index(blob, index_digest(tail), where, cipher=cipher, offset=off)


def parse_segment(blob: bytes, where: str, crypto: Crypto | None = None,
                  key: str = "") -> SegmentIndex:
    """The index of a segment held whole in memory (``key``: its object key, when sealed)."""
    cipher = _cipher(crypto, key)
    check_header(blob, where, sealed=cipher is not None)
    got = parse_index(blob[-TAIL_READ:] if len(blob) > TAIL_READ else blob, len(blob), where,
                      cipher)
    if isinstance(got, SegmentIndex):
        return got
    off, length = got
    return decode_index(blob[off : off + length], index_digest(blob[-TRAILER.size:]), where,
                        cipher=cipher, offset=off)


def extent_bytes(blob: bytes, base: int, ext: Extent, where: str,
                 cipher: ObjectCipher | None = None,
                 zdict: zstandard.ZstdCompressionDict | None = None) -> bytes:
    """The raw bytes of ``ext`` from ``blob``, which holds the object from offset ``base``."""
    lo = ext.off - base
    if ext.off < HEADER.size or lo < 0 or lo + ext.clen > len(blob):
        raise FormatError(f"{where}: extent of {ext.path!r} lies outside the object")
    return decode_extent(blob[lo : lo + ext.clen], ext, where, cipher, zdict)


def dictionary_for(store: Store, key: str, ext: Extent,
                   crypto: Crypto | None) -> zstandard.ZstdCompressionDict | None:
    """The trained dictionary ``ext``'s frame needs (None when it needs none)."""
    if not ext.dict_id:
        return None
    try:
        return fetch(store, machine_of(key), ext.dict_id, crypto).zdict
    except StoreError as e:
        raise FormatError(f"{store.url}{key}: its dictionary is unreadable: {e}") from e


# Fetch the whole span of an object when at least this share of it is needed, else ranges.
WHOLE_OBJECT_SHARE = 0.5


def read_extents(store: Store, key: str, exts: list[Extent], crypto: Crypto | None = None,
                 on_error: Callable[[Extent, FormatError], None] | None = None,
                 ) -> Iterator[tuple[Extent, bytes]]:
    """The raw bytes of each extent of object ``key``, checked, in offset order.

    ``on_error``: told of each extent that fails its check, and the others still come;
    without it the first failure raises.
    """
    where = f"{store.url}{key}"
    cipher = _cipher(crypto, key)
    exts = sorted(exts, key=lambda e: e.off)
    if not exts:
        return
    lo = exts[0].off
    hi = max(e.off + e.clen for e in exts)
    need = sum(e.clen for e in exts)
    whole = need >= WHOLE_OBJECT_SHARE * (hi - lo) or len(exts) > 64
    blob = b""
    if whole:
        if lo == HEADER.size:
            lo = 0  # the first frame: the header comes along and is checked too
        blob = store.get(key, lo, hi - lo)
        if lo == 0:
            check_header(blob, where, sealed=cipher is not None)
    for e in exts:
        try:
            if whole:
                data = extent_bytes(blob, lo, e, where, cipher,
                                    dictionary_for(store, key, e, crypto))
            else:
                data = extent_bytes(store.get(key, e.off, e.clen), e.off, e, where, cipher,
                                    dictionary_for(store, key, e, crypto))
        except FormatError as err:
            if on_error is None:
                raise
            on_error(e, err)
            continue
        yield e, data

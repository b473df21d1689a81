"""Reading segments back from a store: the index by one suffix GET, frames by range.

``crypto`` is the unlocked key of an encrypted store (None for a plain one); with it
only sealed segments are accepted, without it only plain ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import zstandard

from syncd.errors import FormatError, StoreError
from syncd.format.dictionary import fetch, machine_of
from syncd.format.segment import (
    HEADER,
    INDEX_MAX,
    TAIL_READ,
    TRAILER,
    Extent,
    SegmentIndex,
    check_extent,
    check_header,
    decode_extent,
    decode_index,
    index_digest,
    parse_index,
)
from syncd.security.crypto import Crypto, ObjectCipher
from syncd.store import Store


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
    if length > INDEX_MAX:
        raise FormatError(f"{where}: index of {length} bytes, more than the {INDEX_MAX} a "
                          "reader accepts (refusing it)")
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


# Extents are fetched in windows of at most SPAN bytes: a window is one GET when at least
# WHOLE_OBJECT_SHARE of it is needed (or it holds many frames), else one GET per frame.
SPAN = 16 << 20
WHOLE_OBJECT_SHARE = 0.5


def _windows(exts: list[Extent]) -> Iterator[tuple[list[Extent], bool]]:
    """Runs of extents (sorted by offset) within SPAN bytes, and whether to GET each whole."""
    run: list[Extent] = []
    for e in exts:
        if run and e.off + e.clen - run[0].off > SPAN:
            yield run, _whole(run)
            run = []
        run.append(e)
    if run:
        yield run, _whole(run)


def _whole(run: list[Extent]) -> bool:
    span = max(e.off + e.clen for e in run) - run[0].off
    return sum(e.clen for e in run) >= WHOLE_OBJECT_SHARE * span or len(run) > 64


def read_extents(store: Store, key: str, exts: list[Extent], crypto: Crypto | None = None,
                 on_error: Callable[[Extent, FormatError], None] | None = None,
                 ) -> Iterator[tuple[Extent, bytes]]:
    """The raw bytes of each extent of object ``key``, checked, in offset order.

    ``on_error``: told of each extent that fails its check, and the others still come;
    without it the first failure raises. Memory is bounded by SPAN and the frame limits,
    whatever sizes the index claims.
    """
    where = f"{store.url}{key}"
    cipher = _cipher(crypto, key)
    good: list[Extent] = []
    for e in sorted(exts, key=lambda e: e.off):
        try:
            check_extent(e, where)
        except FormatError as err:
            if on_error is None:
                raise
            on_error(e, err)
            continue
        good.append(e)
    for run, whole in _windows(good):
        lo, blob = 0, b""
        if whole:
            lo = 0 if run[0].off == HEADER.size else run[0].off  # the header is checked too
            blob = store.get(key, lo, max(e.off + e.clen for e in run) - lo)
            if lo == 0:
                check_header(blob, where, sealed=cipher is not None)
        for e in run:
            try:
                if not whole:
                    lo, blob = e.off, store.get(key, e.off, e.clen)
                data = extent_bytes(blob, lo, e, where, cipher,
                                    dictionary_for(store, key, e, crypto))
            except FormatError as err:
                if on_error is None:
                    raise
                on_error(e, err)
                continue
            yield e, data

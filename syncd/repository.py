"""The repository: one machine's prefix in a store, with the store's cipher.

Every read and write of syncd's objects goes through here: keys come from the layout,
objects are sealed and opened when the store is encrypted (and refused when they are
not what the store's kind says), and every read is bounded by what the reader expects
(docs/FORMAT.md, "Reader limits"), never by what an object claims. Errors name the
object.
"""

from __future__ import annotations

import contextlib
import functools
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import zstandard

from syncd import untrusted
from syncd.config import MACHINE_ID
from syncd.errors import AlreadyExists, CryptoError, FormatError, NotFound, StoreError
from syncd.format.delta import Delta, by_start, delta_of
from syncd.format.dictionary import DICT_SIZE, Dictionary
from syncd.format.head import HEAD_MAX, HEAD_RAW_MAX, Head
from syncd.format.head import decode as head_decode
from syncd.format.head import encode as head_encode
from syncd.format.segment import (
    HEADER,
    INDEX_MAX,
    TAIL_READ,
    TRAILER,
    Extent,
    LastFrame,
    SegmentIndex,
    check_extent,
    check_header,
    decode_index,
    extent_bytes,
    index_digest,
    parse_index,
    windows,
)
from syncd.format.snapshot import (
    Entry,
    Group,
    Manifest,
    current,
    group_path,
    manifest_of,
    oversize,
    parse_group,
)
from syncd.security.crypto import SCRYPT_N, Crypto, ObjectCipher, is_box, wrap
from syncd.security.keys import key_files, write_key_file
from syncd.store import ObjectInfo, Store, get_small, layout

# machine.json is a few hundred bytes (sealed and padded, under 1 KiB).
MACHINE_JSON_MAX = 64 << 10
# A dictionary is DICT_SIZE bytes; a sealed box adds under 1 KiB.
DICTIONARY_MAX = DICT_SIZE + 1024
_MACHINE_JSON = "machine.json"
_DICT = "dict"
_HEAD = "head"

# Dictionaries by (store URL, key): a store's indexes can name any number of them, the
# cache keeps the last few.
_dictionaries: OrderedDict[tuple[str, str], Dictionary] = OrderedDict()
_dictionaries_lock = threading.Lock()
_DICTIONARIES_KEPT = 8


class Repository:
    """``machine``'s objects in ``store``; ``crypto`` unlocks an encrypted store (None:
    a plain one, whose readers refuse sealed objects, as sealed stores refuse plain ones)."""

    def __init__(self, store: Store, machine: str, crypto: Crypto | None = None) -> None:
        self.store = store
        self.machine = machine
        self.crypto = crypto

    def __repr__(self) -> str:
        return f"Repository({self.store.url}, {self.machine})"

    @property
    def url(self) -> str:
        return self.store.url

    def for_machine(self, machine: str) -> Repository:
        """Another machine's objects in the same store, with the same cipher."""
        return Repository(self.store, machine, self.crypto)

    def where(self, key: str) -> str:
        return f"{self.store.url}{key}"

    def cipher(self, key: str) -> ObjectCipher | None:
        return None if self.crypto is None else self.crypto.cipher(key)

    # -- the store ------------------------------------------------------------------------
    def machines(self) -> list[str]:
        """Every machine with an object in the store, in name order: one delimited LIST per
        1,000 machines (names no machine id can have, as a store may hold anything, are
        not machines: never printed, never read)."""
        return [m for p in self.store.prefixes(layout.MACHINES_PREFIX)
                if (m := p[len(layout.MACHINES_PREFIX):-1]) and MACHINE_ID.fullmatch(m)]

    def objects(self) -> list[ObjectInfo]:
        """Every object under this machine's prefix (one LIST)."""
        return list(self.store.list(layout.machine_prefix(self.machine)))

    def exists(self, key: str) -> bool:
        """One HEAD."""
        return self.store.head(key) is not None

    def size_of(self, key: str) -> int | None:
        """One HEAD: the object's size (None: there is none)."""
        info = self.store.head(key)
        return None if info is None else info.size

    def read_range(self, key: str, start: int, length: int | None = None) -> bytes:
        """Raw bytes of an object (a negative ``start`` counts from its end)."""
        return self.store.get(key, start, length)

    def packs(self) -> list[tuple[str, int]]:
        """``(key, size)`` of the machine's packs (one LIST)."""
        return [(o.key, o.size) for o in self.store.list(layout.packs_prefix(self.machine))
                if layout.pack_range(o.key) is not None]

    def put(self, key: str, blob: bytes) -> str:
        """Write a new object (never over one: a taken key is ``AlreadyExists``)."""
        return self.store.put(key, blob, if_none_match=True)

    def delete(self, keys: Iterable[str]) -> None:
        self.store.delete_many(keys)

    # -- machine.json ---------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        """What ``machine.json`` says: only the fields a writer records, of their types."""
        key = layout.machine_key(self.machine)
        try:
            raw = self._open_box(key, _MACHINE_JSON, get_small(self.store, key,
                                                               MACHINE_JSON_MAX))
        except NotFound:
            return {"machine": self.machine}
        where = self.where(key)
        try:
            doc = untrusted.loads(raw)
        except ValueError as e:
            raise StoreError(f"{where}: not JSON: {e}") from e
        if not isinstance(doc, dict):
            raise StoreError(f"{where}: not a JSON object")
        info: dict[str, Any] = {"machine": self.machine}
        for name in ("hostname", "os", "home", "claude_root"):
            if isinstance(doc.get(name), str):
                info[name] = doc[name][:4096]
        for name in ("created", "format"):
            if type(doc.get(name)) in (int, float):
                info[name] = doc[name]
        if isinstance(doc.get("key"), str):
            info["key"] = doc["key"][:64]
        return info

    def write_info(self, doc: dict[str, Any]) -> None:
        """Write ``machine.json`` once (sealed in an encrypted store, with the key's
        fingerprint); one written earlier stays."""
        key = layout.machine_key(self.machine)
        if self.crypto is None:
            blob = json.dumps(doc, indent=1).encode()
        else:
            doc = {**doc, "format": 2, "key": self.crypto.fingerprint}
            blob = self.crypto.seal_box(key, _MACHINE_JSON, json.dumps(doc, indent=1).encode())
        with contextlib.suppress(AlreadyExists):
            self.put(key, blob)

    def _open_box(self, key: str, position: str, blob: bytes) -> bytes:
        """A small object as written: opened in an encrypted store, refused sealed in a
        plain one."""
        where = self.where(key)
        if self.crypto is not None:
            return self.crypto.open_box(key, position, blob, where)
        if is_box(blob):
            raise CryptoError(f"{where}: encrypted, but no key is loaded (the store has no "
                              "keys/, or it was removed)")
        return blob

    # -- the head ------------------------------------------------------------------------
    def head(self, raw_max: int = HEAD_RAW_MAX) -> Head | None:
        """The machine's head (one GET; None: it has none, an older writer's machine;
        ``HeadTooLarge`` when its JSON may be more than ``raw_max`` bytes)."""
        key = layout.head_key(self.machine)
        try:
            blob = get_small(self.store, key, HEAD_MAX)
        except NotFound:
            return None
        try:
            raw = self._open_box(key, _HEAD, blob)
        except CryptoError as e:
            raise FormatError(str(e)) from None
        return head_decode(raw, self.machine, self.where(key), raw_max)

    def write_head(self, h: Head) -> None:
        """Replace the machine's head (the one object a writer rewrites in place)."""
        key = layout.head_key(self.machine)
        blob = head_encode(h)
        if self.crypto is not None:
            blob = self.crypto.seal_box(key, _HEAD, blob)
        self.store.put(key, blob, if_none_match=False)

    # -- segments (and packs and manifests, which share their container) -------------------
    def segments(self, after: int = -1) -> list[tuple[str, int]]:
        """``(key, size)`` of the machine's segments with a seq above ``after`` (one LIST)."""
        start = layout.segment_key(self.machine, after) if after >= 0 else ""
        return [(o.key, o.size) for o in self.store.list(layout.segments_prefix(self.machine),
                                                         start_after=start)
                if layout.segment_seq(o.key) is not None]

    def read_index(self, key: str, size: int | None = None) -> SegmentIndex:
        """The index of the object ``key`` (a segment, pack or manifest): one suffix GET,
        rarely two."""
        got = self._read_index(key, size, small=False)
        assert got is not None
        return got

    def read_small_index(self, key: str, size: int) -> SegmentIndex | None:
        """``read_index`` when the index lies in the object's last bytes, the one suffix
        GET (it then expands to 1.5 MiB at most); None when it is larger than that."""
        return self._read_index(key, size, small=True)

    def _read_index(self, key: str, size: int | None, small: bool) -> SegmentIndex | None:
        where = self.where(key)
        if size is None:
            info = self.store.head(key)
            if info is None:
                raise FormatError(f"{where}: segment is missing")
            size = info.size
        tail = self.store.get(key, -min(size, TAIL_READ)) if size else b""
        if len(tail) != min(size, TAIL_READ):
            raise FormatError(f"{where}: object changed size while being read (truncated?)")
        cipher = self.cipher(key)
        if size <= TAIL_READ:
            check_header(tail, where, sealed=cipher is not None)
        # A manifest's entries are its groups' frames, as many as the tree has groups;
        # every other index is held to what a writer puts in one.
        capped = layout.kind_of(key) != "snap"
        got = parse_index(tail, size, where, cipher, capped)
        if isinstance(got, SegmentIndex):
            return got
        off, length = got
        if small:
            return None
        if length > INDEX_MAX:
            raise FormatError(f"{where}: index of {length} bytes, more than the {INDEX_MAX} a "
                              "reader accepts (refusing it)")
        # The tail already holds the index's last bytes: fetch only what comes before them.
        have = len(tail) - TRAILER.size
        blob = self.store.get(key, off, length - have) + tail[:have]
        return decode_index(blob, index_digest(tail), where, cipher=cipher, offset=off,
                            capped=capped)

    def read_extents(self, key: str, exts: list[Extent],
                     on_error: Callable[[Extent, FormatError], None] | None = None,
                     ) -> Iterator[tuple[Extent, bytes]]:
        """The raw bytes of each extent of object ``key``, checked, in offset order.

        ``on_error``: told of each extent that fails its check, and the others still
        come; without it the first failure raises. Memory is bounded by the fetch window
        and the frame limits, whatever sizes the index claims.
        """
        where = self.where(key)
        cipher = self.cipher(key)
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
        last = LastFrame()
        for run, whole in windows(good):
            lo, blob = 0, b""
            if whole:
                lo = 0 if run[0].off == HEADER.size else run[0].off  # the header is checked
                blob = self.store.get(key, lo, max(e.off + e.clen for e in run) - lo)
                if lo == 0:
                    check_header(blob, where, sealed=cipher is not None)
            for e in run:
                try:
                    data = last.bytes_of(e, functools.partial(
                        self._frame_bytes, key, where, cipher, (lo, blob) if whole else None))
                except FormatError as err:
                    if on_error is None:
                        raise
                    on_error(e, err)
                    continue
                yield e, data

    def entry_bytes(self, e: Entry, size: int, window: int) -> Iterator[bytes]:
        """Bytes [0, size) of a backup's file, read a run of one object's frames at a
        time (a run grows to ``window`` raw bytes, one frame past it at most)."""
        chain = [(k, x) for k, x in e.extents if x.start < size]
        i = 0
        while i < len(chain):
            key, run = chain[i][0], [chain[i][1]]
            i += 1
            while i < len(chain) and chain[i][0] == key and \
                    sum(x.end - x.start for x in run) < window:
                run.append(chain[i][1])
                i += 1
            got = {x.start: data for x, data in self.read_extents(key, run)}
            for x in run:
                yield got[x.start][: max(0, size - x.start)]

    def _frame_bytes(self, key: str, where: str, cipher: ObjectCipher | None,
                     window: tuple[int, bytes] | None, x: Extent) -> bytes:
        """The checked bytes of ``x`` from ``window`` (its offset in the object, its bytes),
        or (None) from a GET of its frame alone."""
        lo, blob = window or (x.off, self.store.get(key, x.off, x.clen))
        return extent_bytes(blob, lo, x, where, cipher, self.frame_dictionary(key, x))

    def frame_dictionary(self, key: str, ext: Extent) -> zstandard.ZstdCompressionDict | None:
        """The trained dictionary ``ext``'s frame needs (None when it needs none)."""
        if not ext.dict_id:
            return None
        try:
            return self.dictionary(ext.dict_id).zdict
        except StoreError as e:
            raise FormatError(f"{self.where(key)}: its dictionary is unreadable: {e}") from e

    # -- deltas ---------------------------------------------------------------------------
    def deltas(self) -> list[tuple[int, int, str, int]]:
        """``(lo, hi, key, size)`` of every delta, in ``lo`` order (one LIST)."""
        return sorted((*rng, o.key, o.size) for o in self.store.list(
            layout.deltas_prefix(self.machine)) if (rng := layout.delta_range(o.key)) is not None)

    def folded(self, snaps: list[tuple[int, int, str]]) -> int:
        """The last seq compaction has folded: the newest manifest's, then the deltas
        chained after it (-1: none)."""
        top = snaps[-1][0] if snaps else -1
        chain = self.delta_chain(top)
        return chain[-1].hi if chain else top

    def delta_chain(self, top: int, upto: int | None = None,
                    errors: list[str] | None = None) -> list[Delta]:
        """The deltas after seq ``top``, each starting where the one before ended, each
        read (a key alone says nothing; one LIST and a GET per delta): of a start, the
        widest that reads, is this machine's and ends by ``upto`` (the newest seq the
        writer confirmed, when known). ``errors`` hears of each one passed over; the
        first start without one ends the chain."""
        said = errors if errors is not None else []
        starts = by_start(self.deltas())
        out: list[Delta] = []
        while rows := starts.get(top + 1):
            got = None
            for _, hi, key, size in rows:
                if upto is not None and hi > upto:
                    said.append(f"{self.where(key)}: a delta beyond what this machine's "
                                "state knows: not building on it")
                    continue
                try:
                    d = self.read_delta(key, size)
                except (FormatError, StoreError) as e:
                    said.append(f"{e}; not building on it")
                    continue
                if d.index.machine != self.machine:
                    said.append(f"{self.where(key)}: written by machine "
                                f"{d.index.machine!r}; not building on it")
                    continue
                got = d
                break
            if got is None:
                break
            out.append(got)
            top = got.hi
        return out

    def read_delta(self, key: str, size: int | None = None) -> Delta:
        """A delta's index and points (one suffix GET, rarely two)."""
        if size is None:
            info = self.store.head(key)
            if info is None:
                raise FormatError(f"{self.where(key)}: delta is missing")
            size = info.size
        return delta_of(key, self.read_index(key, size), self.where(key), size)

    # -- snapshot manifests ---------------------------------------------------------------
    def snapshots(self) -> list[tuple[int, int, str]]:
        """``(seq, rev, key)`` of every manifest, oldest first (one LIST)."""
        return sorted((*sid, o.key) for o in self.store.list(
            layout.snapshots_prefix(self.machine))
            if (sid := layout.snapshot_id(o.key)) is not None)

    def read_manifest(self, key: str) -> Manifest:
        """The manifest's index (one suffix GET): its groups, objects and sessions."""
        return manifest_of(key, self.read_index(key), self.where(key))

    def newest_manifest(self, errors: list[str] | None = None) -> Manifest | None:
        """The newest readable manifest; unreadable newer ones go to ``errors`` (without
        it the first one raises)."""
        for _, _, key in reversed(current(self.snapshots())):
            try:
                return self.read_manifest(key)
            except (FormatError, StoreError) as e:
                if errors is None:
                    raise
                errors.append(str(e))
        return None

    def read_groups(self, m: Manifest, names: Iterable[str] | None = None,
                    on_error: Callable[[str, FormatError], None] | None = None
                    ) -> dict[str, Group]:
        """The groups ``names`` (all when None) of manifest ``m``; absent names are skipped.

        Each group is parsed as soon as its frames are in, so memory holds one group's
        JSON at a time; one that claims more than a reader accepts is refused unread.
        ``on_error``: told of each group that cannot be read, and the others still come;
        without it the first one raises.
        """
        where = self.where(m.key)
        wanted = sorted(m.groups) if names is None else sorted(set(names) & set(m.groups))
        bad = {n: err for n in wanted if (err := oversize(m, n, where)) is not None}
        wanted = [n for n in wanted if n not in bad]
        by_path = {group_path(n): n for n in wanted}
        left = {p: len(m.groups[n]) for p, n in by_path.items()}
        parts: dict[bytes, list[tuple[int, bytes]]] = {}
        out = {}

        def damaged(x: Extent, err: FormatError) -> None:
            bad.setdefault(by_path[x.path], err)

        for e, data in self.read_extents(m.key, [e for n in wanted for e in m.groups[n]],
                                         damaged if on_error is not None else None):
            name = by_path[e.path]
            if name in bad:
                continue
            parts.setdefault(e.path, []).append((e.start, data))
            left[e.path] -= 1
            if left[e.path] == 0:
                text = b"".join(c for _, c in sorted(parts.pop(e.path)))
                try:
                    out[name] = parse_group(text, m, name, where)
                except FormatError as err:
                    bad[name] = err
        for name, problem in sorted(bad.items()):
            if on_error is None:
                raise problem
            on_error(name, problem)
        return out

    # -- key files ------------------------------------------------------------------------
    def add_key(self, passphrase: str, *, n: int = SCRYPT_N) -> str:
        """A key file wrapping the (unlocked) master key for another passphrase; its id."""
        crypto = self._unlocked()
        return write_key_file(self.store,
                              lambda key_id, key: wrap(crypto, passphrase, key_id, key, n=n))

    def remove_key(self, key_id: str) -> None:
        """Remove one key file; never the last one, nor the one this passphrase opened."""
        crypto = self._unlocked()
        infos = key_files(self.store)
        key = layout.key_file_key(key_id)
        if key not in {i.key for i in infos}:
            raise CryptoError(f"{self.url}: no key file {key} (the store has: "
                              f"{', '.join(i.key for i in infos) or 'none'})")
        if len(infos) == 1:
            raise CryptoError(f"{self.where(key)}: refusing to remove the last key file (the "
                              "store could never be read again)")
        if key_id == crypto.key_id:
            raise CryptoError(f"{self.where(key)}: refusing to remove the key file your "
                              "passphrase opens; run this with another passphrase of the store")
        self.delete([key])

    def _unlocked(self) -> Crypto:
        if self.crypto is None:
            raise CryptoError(f"{self.url}: not encrypted (keys/ is empty)")
        return self.crypto

    # -- dictionaries ---------------------------------------------------------------------
    def dictionary(self, dict_id: str) -> Dictionary:
        """The machine's dictionary ``dict_id`` (cached), checked against its id."""
        key = layout.dict_key(self.machine, dict_id)
        with _dictionaries_lock:
            hit = _dictionaries.get((self.store.url, key))
        if hit is not None:
            return hit
        blob = get_small(self.store, key, DICTIONARY_MAX)
        try:
            d = Dictionary(self._open_box(key, _DICT, blob))
        except CryptoError as e:
            raise FormatError(str(e)) from None
        if d.id != dict_id:
            raise FormatError(f"{self.where(key)}: dictionary content does not match its id "
                              "(corrupted)")
        with _dictionaries_lock:
            _dictionaries[(self.store.url, key)] = d
            while len(_dictionaries) > _DICTIONARIES_KEPT:
                _dictionaries.popitem(last=False)
        return d

    def publish(self, d: Dictionary) -> str:
        """Store dictionary ``d`` under its content address; returns its key."""
        key = layout.dict_key(self.machine, d.id)
        blob = d.data if self.crypto is None else self.crypto.seal_box(key, _DICT, d.data)
        with contextlib.suppress(AlreadyExists):  # content-addressed: the same bytes
            self.put(key, blob)
        return key

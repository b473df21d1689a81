"""Object keys in the store (docs/FORMAT.md): sortable, written once, no LIST on the hot path."""

from __future__ import annotations

import re

MACHINES_PREFIX = "machines/"


def machine_prefix(machine: str) -> str:
    return f"{MACHINES_PREFIX}{machine}/"


def machine_of(key: str) -> str | None:
    """The machine a key under ``machines/`` belongs to (None for any other key)."""
    parts = key.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == MACHINES_PREFIX[:-1] else None


def kind_of(key: str) -> str | None:
    """What a key under a machine's prefix names: "seg", "pack", "snap", "delta" or "dict"
    (None for anything else, machine.json and lease.json included)."""
    parts = key.split("/")
    if len(parts) == 4 and parts[0] == MACHINES_PREFIX[:-1] and parts[2] in _KINDS:
        return parts[2]
    return None


_KINDS = frozenset({"seg", "pack", "snap", "delta", "dict"})


def segments_prefix(machine: str) -> str:
    return f"{MACHINES_PREFIX}{machine}/seg/"


def snapshots_prefix(machine: str) -> str:
    return f"{MACHINES_PREFIX}{machine}/snap/"


def packs_prefix(machine: str) -> str:
    return f"{MACHINES_PREFIX}{machine}/pack/"


def deltas_prefix(machine: str) -> str:
    return f"{MACHINES_PREFIX}{machine}/delta/"


def machine_key(machine: str) -> str:
    return f"{machine_prefix(machine)}machine.json"


def head_key(machine: str) -> str:
    return f"{machine_prefix(machine)}head"


def lease_key(machine: str) -> str:
    return f"{machine_prefix(machine)}lease.json"


KEYS_PREFIX = "keys/"


def key_file_key(key_id: str) -> str:
    return f"{KEYS_PREFIX}{key_id}"


def is_key_file(key: str) -> bool:
    """Whether ``key`` names a key file (``keys/`` and 16 hex digits)."""
    return key.startswith(KEYS_PREFIX) and _KEY_ID.fullmatch(key[len(KEYS_PREFIX):]) is not None


def segment_key(machine: str, seq: int) -> str:
    return f"{segments_prefix(machine)}{seq:016x}"


def segment_seq(key: str) -> int | None:
    """The seq of a segment key, or None for anything else under ``seg/``."""
    m = _SEGMENT.fullmatch(key.rpartition("/")[2])
    return None if m is None else int(m[0], 16)


def pack_key(machine: str, lo: int, hi: int, tag: str) -> str:
    """A pack of data from segments ``lo..hi``; ``tag`` (8 hex) keeps two packs apart."""
    return f"{packs_prefix(machine)}{lo:016x}-{hi:016x}-{tag}"


def pack_range(key: str) -> tuple[int, int] | None:
    """``(lo, hi)`` of a pack key, or None for anything else under ``pack/``."""
    m = _PACK.fullmatch(key.rpartition("/")[2])
    return None if m is None else (int(m[1], 16), int(m[2], 16))


def delta_key(machine: str, lo: int, hi: int) -> str:
    """The delta folding segments ``lo..hi`` (one per range: a rerun finds it written)."""
    return f"{deltas_prefix(machine)}{lo:016x}-{hi:016x}"


def delta_range(key: str) -> tuple[int, int] | None:
    """``(lo, hi)`` of a delta key, or None for anything else under ``delta/``."""
    m = _DELTA.fullmatch(key.rpartition("/")[2])
    if m is None or int(m[1], 16) > int(m[2], 16):
        return None
    return int(m[1], 16), int(m[2], 16)


def snapshot_key(machine: str, seq: int, rev: int) -> str:
    """The manifest as of segment ``seq``; ``rev`` counts re-issues at the same seq."""
    return f"{snapshots_prefix(machine)}{seq:016x}-{rev:04x}"


def snapshot_id(key: str) -> tuple[int, int] | None:
    """``(seq, rev)`` of a snapshot key, or None for anything else under ``snap/``."""
    m = _SNAPSHOT.fullmatch(key.rpartition("/")[2])
    return None if m is None else (int(m[1], 16), int(m[2], 16))


# Names exactly as written (lowercase hex of fixed width): int(x, 16) alone would also
# take "0x…", "+…" and "1_0", so two names could claim one seq.
_SEGMENT = re.compile(r"[0-9a-f]{16}")
_KEY_ID = _SEGMENT  # 16 hex digits too
_PACK = re.compile(r"([0-9a-f]{16})-([0-9a-f]{16})-[0-9a-f]{8}")
_SNAPSHOT = re.compile(r"([0-9a-f]{16})-([0-9a-f]{4})")
_DELTA = re.compile(r"([0-9a-f]{16})-([0-9a-f]{16})")


def dict_key(machine: str, dict_id: str) -> str:
    """A zstd dictionary, named by the sha256 of its bytes."""
    return f"{machine_prefix(machine)}dict/{dict_id}"

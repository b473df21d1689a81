"""Object keys in the store (docs/FORMAT.md): sortable, written once, no LIST on the hot path."""

from __future__ import annotations


def machine_prefix(machine: str) -> str:
    return f"machines/{machine}/"


def machine_key(machine: str) -> str:
    return f"machines/{machine}/machine.json"


def lease_key(machine: str) -> str:
    return f"machines/{machine}/lease.json"


KEYS_PREFIX = "keys/"


def key_file_key(key_id: str) -> str:
    return f"{KEYS_PREFIX}{key_id}"


def segment_key(machine: str, seq: int) -> str:
    return f"machines/{machine}/seg/{seq:016x}"


def segment_seq(key: str) -> int | None:
    """The seq of a segment key, or None for anything else under ``seg/``."""
    name = key.rpartition("/")[2]
    if len(name) != 16:
        return None
    try:
        return int(name, 16)
    except ValueError:
        return None

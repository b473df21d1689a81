"""Copies against a hostile store and a changing tree: a copy names bytes of another
generation, so every reader bound (time, memory, names, which bytes win) and every
shipper proof (a cut, a move, an adopted segment) is attacked here."""

from __future__ import annotations

import os
from pathlib import Path

from syncd.repository import Repository
from syncd.store import MemoryStore
from syncd.store.layout import segment_key
from syncd.view import load_backup
from tests.helpers import tree_bytes, write
from tests.readers import read_index
from tests.test_compact import Clock, M, make_shipper, ship_all
from tests.test_copies import APP, SID
from tests.test_points import restored


def short_rows(lo: int, hi: int) -> bytes:
    """Transcript lines of ~100 bytes: 64 marked lines are far less than the 64 KiB tail
    the append check compares."""
    return b"".join(b'{"type":"user","sessionId":"%s","uuid":"%08x","n":"%s"}\n'
                    % (SID.encode(), i, b"x" * 20) for i in range(lo, hi))


# -- the shipper's proofs --------------------------------------------------------------


def test_a_rewrite_the_marks_do_not_see_is_no_cut(tmp_path: Path) -> None:
    """A byte changed 30 KB before the end of a transcript of short lines, in place: the
    append check sees it (its tail is 64 KiB), the marks (the last 64 lines, ~6 KB) do
    not. Before the fix the whole shipped prefix passed as a "cut" and was copied from
    the old generation: the store kept the old byte, silently."""
    store, clock = MemoryStore(), Clock()
    src = tmp_path / "src"
    sh = make_shipper(src, store, tmp_path / "st.db", clock)
    f = write(src, APP, short_rows(0, 3000))
    ship_all(sh, src)
    data = bytearray(f.read_bytes())
    at = len(data) - 30_000
    data[at] = ord("y") if data[at] != ord("y") else ord("z")
    with open(f, "r+b") as fh:  # same inode, same size
        fh.write(bytes(data))
    clock.t += 5
    ship_all(sh, src)
    ix = read_index(store, segment_key(M, 1))
    assert ix.copies == []
    assert restored(store, clock.t, tmp_path / "out") == tree_bytes(src)

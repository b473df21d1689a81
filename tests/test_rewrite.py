"""Rewrite: forget a session and redact a value in every point of a backup.

Every point restores as before but for what goes (the forgotten session's files gone,
its history lines spaces, a redacted value masked), through manifests, deltas and
segments, and no object holds the bytes any more.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from syncd.archive.compact import CompactOptions, compact
from syncd.archive.rewrite import Rewrite, rewrite
from syncd.mask import mask_of
from syncd.repository import Repository
from syncd.restore.restorer import RestoreOptions, restore
from syncd.security.crypto import Crypto
from syncd.store import MemoryStore, Store
from syncd.timeline import timeline
from tests.helpers import tree_bytes, write
from tests.test_compact import (
    HIST,
    SA,
    SB,
    SUB,
    TA,
    TB,
    TODO,
    Clock,
    history,
    line,
    make_shipper,
    ship_all,
)

M = "m1"
SECRET = b"AKIAQWERTYUIOPASDFGH"  # an AWS key id's shape
DELTA = CompactOptions()  # the daemon's: deltas, a manifest every 24


def said(sid: str, i: int, text: str) -> bytes:
    return json.dumps({"type": "user", "sessionId": sid, "uuid": f"{i:08x}",
                       "message": {"role": "user", "content": text}}).encode() + b"\n"


def thought(sid: str, text: str) -> bytes:
    return json.dumps({"type": "assistant", "sessionId": sid, "message": {"content": [
        {"type": "thinking", "thinking": text, "signature": "c2lnbmVk"}]}}).encode() + b"\n"


def points(store: Store, crypto: Crypto | None = None) -> dict[int, dict[bytes, bytes]]:
    """Every point's tree, by seq, as a restore as of it writes it."""
    repo = Repository(store, M, crypto)
    rows, errors = timeline(repo)
    assert errors == []
    out = {}
    for row in rows:
        got = _restore_at(store, row.time, crypto)
        out[row.seq] = got
    return out


def _restore_at(store: Store, at: float, crypto: Crypto | None = None) -> dict[bytes, bytes]:
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        r = restore(Repository(store, M, crypto), RestoreOptions(target=Path(d), at=at,
                                                                 local_machine=M))
        assert r.errors == []
        return tree_bytes(Path(d))


def all_raw(store: Store) -> bytes:
    """Every object's bytes, decompressed where they are zstd frames (a plain store)."""
    import zstandard
    out = bytearray()
    for info in store.list(f"machines/{M}/"):
        blob = store.get(info.key)
        out += blob
        d = zstandard.ZstdDecompressor()
        i = 0
        while True:
            j = blob.find(b"\x28\xb5\x2f\xfd", i)
            if j < 0:
                break
            with contextlib.suppress(zstandard.ZstdError):
                out += d.decompressobj().decompress(blob[j:])
            i = j + 4
    return bytes(out)


def build(tmp_path: Path, store: Store | None = None, crypto: Crypto | None = None
          ) -> tuple[Path, Store, Clock]:
    """Flushes over time: two sessions, history lines, compactions into deltas and
    manifests between them, a segment after (on ``store``: a new memory store)."""
    src, store, clock = tmp_path / "src", store or MemoryStore(), Clock()
    sh = make_shipper(src, store, tmp_path / "st.db", clock, crypto)
    write(src, TA, line(SA, 0) + said(SA, 1, "the key is " + SECRET.decode()))
    write(src, HIST, history(SA, 0))
    write(src, TB, line(SB, 0, cwd="/home/u/lib"))
    ship_all(sh, src)
    clock.t += 10
    compact(Repository(store, M, crypto), CompactOptions(max_chain=0))  # a manifest
    write(src, TA, line(SA, 2) + thought(SA, "thinking of " + SECRET.decode()), "ab")
    write(src, HIST, history(SB, 1), "ab")
    ship_all(sh, src)
    clock.t += 10
    write(src, SUB, line(SA, 100) * 3)
    write(src, TODO, b'[{"content":"x","status":"pending"}]')
    write(src, TB, said(SB, 2, "also " + SECRET.decode()), "ab")
    ship_all(sh, src)
    clock.t += 10
    compact(Repository(store, M, crypto), DELTA)  # a delta
    write(src, HIST, history(SA, 2) + history(SB, 3), "ab")
    write(src, TB, line(SB, 3, cwd="/home/u/lib"), "ab")
    ship_all(sh, src)
    clock.t += 10
    compact(Repository(store, M, crypto), DELTA)  # another delta (or the small one grown)
    write(src, TB, line(SB, 4, cwd="/home/u/lib"), "ab")
    ship_all(sh, src)  # a segment after
    return src, store, clock


def forgotten(tree: dict[bytes, bytes]) -> dict[bytes, bytes]:
    out = {}
    for p, data in tree.items():
        if SA.encode() in p:
            continue
        if p == HIST.encode():
            data = b"".join(b" " * (len(x) - 1) + b"\n" if SA.encode() in x else x
                            for x in data.splitlines(keepends=True))
        out[p] = data
    return out


def test_forget_takes_a_session_out_of_every_point(tmp_path: Path) -> None:
    _, store, _ = build(tmp_path)
    before = points(store)
    assert len(before) >= 5 and any(SA.encode() in p for t in before.values() for p in t)

    rep = rewrite(Repository(store, M), Rewrite(forget=frozenset({SA})))

    assert rep.errors == []
    assert TA in rep.files_dropped and SUB in rep.files_dropped
    after = points(store)
    assert sorted(after) == sorted(before)
    for seq, tree in before.items():
        assert after[seq] == forgotten(tree), f"point {seq}"
    raw = all_raw(store)
    assert SA.encode() not in raw and SA[:8].encode() not in raw
    assert rewrite(Repository(store, M), Rewrite(forget=frozenset({SA}))).note == \
        "nothing holds it"


def test_redact_masks_a_value_in_every_point_but_in_signed_blocks(tmp_path: Path) -> None:
    _, store, _ = build(tmp_path)
    before = points(store)

    rep = rewrite(Repository(store, M), Rewrite(redact=(SECRET,)))

    assert rep.errors == []
    assert any("thinking" in w for w in rep.left_alone), rep.left_alone
    after = points(store)
    assert sorted(after) == sorted(before)
    masked = mask_of(len(SECRET))
    for seq, tree in before.items():
        want = {}
        for p, data in tree.items():
            lines = []
            for x in data.splitlines(keepends=True):
                lines.append(x if b'"thinking"' in x else x.replace(SECRET, masked))
            want[p] = b"".join(lines)
        assert after[seq] == want, f"point {seq}"
        assert all(len(after[seq][p]) == len(d) for p, d in tree.items())
    raw = all_raw(store)
    # Only the signed block keeps it.
    assert raw.count(SECRET) == raw.count(b"thinking of " + SECRET)


def test_a_dictionary_that_learnt_the_session_goes_with_it(tmp_path: Path) -> None:
    import base64

    from syncd.backup.state import State
    from syncd.format.dictionary import Dictionary

    src, store, clock = tmp_path / "src", MemoryStore(), Clock()
    sh = make_shipper(src, store, tmp_path / "st.db", clock)
    write(src, TB, line(SB, 0, cwd="/home/u/lib"))
    ship_all(sh, src)
    compact(Repository(store, M), CompactOptions(max_chain=0))
    # A dictionary whose content holds the session's id (as training on its lines would).
    d = Dictionary(b"".join(line(SA, i) for i in range(40)))
    Repository(store, M).publish(d)
    st = State(tmp_path / "st.db")
    st.set_meta(dict_id=d.id, dict_data=base64.b64encode(d.data).decode())
    st.close()
    write(src, TA, line(SA, 0))
    write(src, TB, line(SB, 1, cwd="/home/u/lib"), "ab")
    ship_all(sh, src)
    clock.t += 10
    compact(Repository(store, M), DELTA)
    assert any(i.key.endswith(d.id) for i in store.list(f"machines/{M}/dict/"))
    before = points(store)
    retired: list[str] = []

    rep = rewrite(Repository(store, M), Rewrite(forget=frozenset({SA})),
                  retire_dictionary=retired.append)

    assert rep.errors == [] and rep.dictionaries == [d.id] == retired
    assert list(store.list(f"machines/{M}/dict/")) == []
    after = points(store)
    for seq, tree in before.items():
        assert after[seq] == forgotten(tree), f"point {seq}"
    assert SA.encode() not in all_raw(store)


def test_values_known_by_digest_are_found_in_the_named_sessions_only(tmp_path: Path) -> None:
    import hashlib
    _, store, _ = build(tmp_path)
    before = points(store)
    digest = (hashlib.sha256(SECRET).hexdigest(), len(SECRET))

    rep = rewrite(Repository(store, M), Rewrite(digests=frozenset({digest}),
                                                 within=frozenset({SA})))

    assert rep.errors == []
    masked = mask_of(len(SECRET))
    for seq, tree in points(store).items():
        for p, data in tree.items():
            old = before[seq][p]
            if SA.encode() in p:
                assert data == b"".join(x if b'"thinking"' in x else x.replace(SECRET, masked)
                                        for x in old.splitlines(keepends=True))
            else:
                assert data == old  # SB's copy of the value is not SA's


def test_history_lines_of_a_forgotten_session_ship_as_spaces(tmp_path: Path) -> None:
    from syncd.backup.ship import masked_history
    from syncd.backup.state import State

    src, store = tmp_path / "src", MemoryStore()
    sh = make_shipper(src, store, tmp_path / "st.db")
    write(src, TB, line(SB, 0, cwd="/home/u/lib"))
    ship_all(sh, src)
    st = State(tmp_path / "st.db")
    st.forget_sessions([SA])
    st.close()
    hist = history(SB, 0) + history(SA, 1) + history(SB, 2)
    write(src, HIST, hist + b'{"display":"half a li')  # a line being written
    ship_all(sh, src)

    got = _restore_at(store, 4e9)[HIST.encode()]
    assert got == history(SB, 0) + b" " * (len(history(SA, 1)) - 1) + b"\n" + history(SB, 2)
    assert masked_history(b"x", {SA}, at_end=False) == (b"x", b"x")  # a line of 4 MiB


def test_a_dry_run_sees_what_the_fold_would_and_writes_nothing(tmp_path: Path) -> None:
    _, store, _ = build(tmp_path)
    before = {i.key: store.get(i.key) for i in store.list(f"machines/{M}/")}
    opts = CompactOptions(dry_run=True)

    rep = rewrite(Repository(store, M), Rewrite(redact=(SECRET,)), opts)

    assert rep.ranges_masked == 2 and rep.note == "dry run: nothing written"
    assert {i.key: store.get(i.key) for i in store.list(f"machines/{M}/")} == before
    # A machine never compacted: its segments only.
    src, fresh = tmp_path / "src2", MemoryStore()
    sh = make_shipper(src, fresh, tmp_path / "st2.db")
    write(src, TA, said(SA, 1, "the key is " + SECRET.decode()))
    ship_all(sh, src)
    rep = rewrite(Repository(fresh, M), Rewrite(forget=frozenset({SA})), opts)
    assert rep.files_dropped == [TA] and rep.rewritten and rep.note.startswith("dry run")

"""Every flush a point in time: a tree changed in rounds, compacted (deltas, manifests)
and pruned, restores as it was at every round, byte for byte: plain, encrypted, on
SeaweedFS, and after a kill -9 at every store write of a compaction and of a prune."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from syncd.archive.compact import CompactOptions, compact
from syncd.archive.prune import prune
from syncd.archive.retention import Policy
from syncd.errors import NoBackup, RestoreError
from syncd.format.points import Change, Locator, Point, apply, decode, encode
from syncd.format.segment import Extent
from syncd.format.snapshot import Entry
from syncd.repository import Repository
from syncd.restore.restorer import RestoreOptions, restore
from syncd.security.crypto import Crypto, new_master
from syncd.store import LocalStore, MemoryStore, Store, open_store
from syncd.view import load_backup
from tests.helpers import tree_bytes, write
from tests.seaweed import Seaweed
from tests.test_compact import (
    HIST,
    NOTE,
    ROOT,
    SA,
    SB,
    T0,
    TA,
    TB,
    TODO,
    Clock,
    M,
    history,
    keys,
    line,
    make_shipper,
    ship_all,
    todo,
)

DAY = 86400.0
Tree = dict[bytes, bytes]


class Rounds:
    """A tree changed in rounds 5 s apart, each one flush; ``trees[i]`` is what a restore
    as of round i must give (deleted files included: a restore brings them back)."""

    def __init__(self, src: Path, store: Store, state: Path,
                 crypto: Crypto | None = None) -> None:
        self.src, self.clock = src, Clock()
        self.sh = make_shipper(src, store, state, self.clock, crypto)
        self.times: list[float] = []
        self.trees: list[Tree] = []
        self.gone: Tree = {}

    def flush(self, *gone: str) -> None:
        self.clock.t += 5
        for g in gone:
            self.gone[g.encode()] = (self.src / g).read_bytes()
            os.unlink(self.src / g)
        ship_all(self.sh, self.src, *gone)
        self.times.append(self.clock.t)
        self.trees.append({**self.gone, **tree_bytes(self.src)})

    def play(self, after: Callable[[int], None]) -> None:
        """The eight changes, ``after(i)`` once round i is flushed."""
        src = self.src
        steps: list[Callable[[], None]] = [
            lambda: (write(src, TA, line(SA, 0) + line(SA, 1)), write(src, TODO, todo(0, 400)),
                     write(src, HIST, history(SA, 0))),
            lambda: write(src, TA, line(SA, 2), "ab"),                       # an append
            lambda: write(src, TB, line(SB, 0, cwd="/home/u/lib")),         # a new session
            lambda: write(src, TA, line(SA, 3)[:100], "ab"),                # a torn line
            lambda: write(src, TODO, todo(1, 100)),                         # truncated, rewritten
            lambda: None,                                                   # TB deleted
            lambda: write(src, TA, line(SA, 3)[100:] + line(SA, 4), "ab"),  # the line completed
            lambda: (write(src, NOTE, b"# notes\n"), write(src, HIST, history(SB, 1), "ab")),
            lambda: write(src, TA, line(SA, 5), "ab"),
        ]
        for i, step in enumerate(steps):
            step()
            self.flush(*((TB,) if i == 5 else ()))
            after(i)


def restored(store: Store, at: float, out: Path, crypto: Crypto | None = None) -> Tree:
    r = restore(Repository(store, M, crypto), RestoreOptions(target=out, at=at, local_machine=M))
    assert r.errors == [], r.errors
    return tree_bytes(out)


def assert_every_round(store: Store, rounds: Rounds, out: Path,
                       crypto: Crypto | None = None) -> None:
    for i, (t, want) in enumerate(zip(rounds.times, rounds.trees, strict=True)):
        assert restored(store, t, out / f"r{i}", crypto) == want, f"round {i}"
        # Between two rounds: the point before it.
        assert restored(store, t + 2, out / f"r{i}+2", crypto) == want, f"after round {i}"
    with pytest.raises(NoBackup, match="first point in time is"):
        load_backup(Repository(store, M, crypto), at=rounds.times[0] - 1)


def schedule(store: Store, rounds: Rounds, crypto: Crypto | None,
             opts: CompactOptions) -> Callable[[int], None]:
    """Compact after rounds 2, 5 and 7, prune (keep_within 7d) after round 6."""
    repo = Repository(store, M, crypto)

    def after(i: int) -> None:
        now = rounds.clock.t
        if i in (2, 5, 7):
            rep = compact(repo, dataclasses.replace(opts, now=now))
            assert rep.errors == [], rep.errors
        if i == 6:
            pr = prune(repo, Policy(keep_within=7 * DAY), opts=dataclasses.replace(opts, now=now))
            assert pr.errors == [] and pr.forgotten == [], pr

    return after


@pytest.mark.parametrize("max_chain", [24, 0], ids=["deltas", "manifests"])
def test_every_round_restores_after_compactions_and_a_prune(tmp_path: Path,
                                                            max_chain: int) -> None:
    store = MemoryStore()
    rounds = Rounds(tmp_path / "src", store, tmp_path / "st.db")
    rounds.play(schedule(store, rounds, None, CompactOptions(max_chain=max_chain)))
    # The prune folds round 6 as a compaction would; round 8 is still a segment.
    assert len(keys(store, "seg")) == 1
    if max_chain:
        # The delta of rounds 3-5 grew with rounds 6 and 7 (it is small): one object.
        assert len(keys(store, "snap")) == 1 and [k[-33:] for k in keys(store, "delta")] == [
            "0000000000000003-0000000000000007"]
    else:
        assert len(keys(store, "snap")) == 4 and keys(store, "delta") == []
    assert_every_round(store, rounds, tmp_path / "out")


def test_every_round_restores_in_an_encrypted_store(tmp_path: Path) -> None:
    store, crypto = MemoryStore(), Crypto(new_master())
    rounds = Rounds(tmp_path / "src", store, tmp_path / "st.db", crypto)
    rounds.play(schedule(store, rounds, crypto, CompactOptions()))
    delta = keys(store, "delta")[0]
    assert b"notes" not in store.objects[delta] and SA.encode() not in store.objects[delta]
    assert_every_round(store, rounds, tmp_path / "out", crypto)


def test_every_round_restores_on_seaweedfs(tmp_path: Path, seaweed: Seaweed,
                                           bucket: str) -> None:
    store = open_store(f"s3://{bucket}/points", endpoint_url=seaweed.endpoint)
    rounds = Rounds(tmp_path / "src", store, tmp_path / "st.db")
    rounds.play(schedule(store, rounds, None, CompactOptions()))
    assert len(keys(store, "delta")) == 1
    assert_every_round(store, rounds, tmp_path / "out")


def test_a_prune_thins_points_older_than_its_window(tmp_path: Path) -> None:
    """Hours of flushes, a delta an hour, a manifest every 4 deltas; a prune keeping 6
    hourly: every flush of the last six hours restores exactly, older times take the
    manifest before them, and the deltas before the window are gone."""
    store = MemoryStore()
    src, clock = tmp_path / "src", Clock()
    sh = make_shipper(src, store, tmp_path / "st.db", clock)
    repo = Repository(store, M)
    opts = CompactOptions(max_chain=4, delta_target=0)  # a delta an hour, never extended
    times: list[float] = []
    trees: list[Tree] = []
    for h in range(12):
        for k in range(3):
            clock.t = T0 + h * 3600 + k * 600
            write(src, TA, line(SA, h * 3 + k), "ab")
            write(src, TODO, todo(h * 3 + k, 200))
            ship_all(sh, src)
            times.append(clock.t)
            trees.append(tree_bytes(src))
        clock.t += 60
        compact(repo, dataclasses.replace(opts, now=clock.t))
    before = set(keys(store, "delta"))
    pr = prune(repo, Policy(keep_hourly=6, keep_daily=1), opts=dataclasses.replace(
        opts, now=clock.t))
    assert pr.errors == [] and pr.dropped and set(pr.dropped) <= before
    assert not set(pr.dropped) & set(keys(store, "delta"))
    start = clock.t - 60 - 6 * 3600
    for i, (t, want) in enumerate(zip(times, trees, strict=True)):
        if t > start:
            assert restored(store, t, tmp_path / f"r{i}") == want, i
    # An older time: the tree of the manifest at or before it, a point the prune kept.
    old = load_backup(repo, at=times[4] + 1)
    assert old.point is not None and old.point[1] <= times[4] + 1
    want = trees[[j for j, t in enumerate(times) if t <= old.point[1]][-1]]
    assert restored(store, times[4] + 1, tmp_path / "old") == want


def test_kill_9_at_every_store_write_of_a_compaction_and_a_prune_keeps_every_point(
        tmp_path: Path) -> None:
    """A delta's compaction, then a prune that keeps only the newest point: after a kill
    before each write, and after the rerun, every round restores as itself or (a point
    the prune forgets) as an earlier round, never as anything else; what the policy keeps
    restores exactly."""
    base = tmp_path / "base"
    store = LocalStore(base)
    rounds = Rounds(tmp_path / "src", store, tmp_path / "st.db")
    opts = CompactOptions(max_chain=1, pack_target=1 << 30, delta_target=0)
    rounds.play(schedule(store, rounds, None, opts))
    now = rounds.clock.t
    # "delta": the delta of round 7 is extended with round 8 (a new, wider delta, then
    # the old one and the segment go).
    for mode in ("delta", "prune-window"):
        clean = tmp_path / f"clean-{mode}"
        r, writes = _kill(base, clean, 0, mode, now)
        assert r.returncode == 0, r.stderr
        assert writes, mode
        if mode == "prune-window":
            # The base of its window is the manifest of round 6: the one of round 2 and
            # the delta of rounds 3-5 go, what comes after round 6 stays.
            done = LocalStore(clean / "store")
            assert [k[-21:] for k in keys(done, "snap")] == ["0000000000000006-0000",
                                                             "0000000000000008-0000"]
            assert [k[-33:] for k in keys(done, "delta")] == [
                "0000000000000007-0000000000000007", "0000000000000008-0000000000000008"]
        for k in range(1, len(writes) + 1):
            work = tmp_path / f"kill-{mode}-{k}"
            r, _ = _kill(base, work, k, mode, now)
            assert r.returncode == -signal.SIGKILL, (mode, k, r.stderr)
            killed = LocalStore(work / "store")
            exact = 0 if mode == "delta" else 6
            _check_rounds(killed, rounds, work / "killed", exact)
            again = compact(Repository(killed, M), dataclasses.replace(opts, now=now))
            assert again.errors == [], (mode, k, again)
            _check_rounds(killed, rounds, work / "again", exact)


def _check_rounds(store: Store, rounds: Rounds, out: Path, exact: int) -> None:
    """Rounds from ``exact`` on restore as themselves; earlier ones as themselves or an
    earlier round, or not at all."""
    for i, (t, want) in enumerate(zip(rounds.times, rounds.trees, strict=True)):
        if i >= exact:
            assert restored(store, t, out / f"r{i}") == want, i
            continue
        try:
            got = restored(store, t, out / f"r{i}")
        except RestoreError as e:
            assert "no backup at or before" in str(e), e
            continue  # forgotten, with every point before it
        assert got in rounds.trees[: i + 1], i


def _kill(base: Path, work: Path, kill_at: int, mode: str, now: float) -> tuple[
        subprocess.CompletedProcess[str], list[str]]:
    shutil.copytree(base, work / "store")
    log = work / "writes.log"
    r = subprocess.run([sys.executable, "-m", "tests.compactkill", str(work / "store"), M,
                        str(kill_at), str(log), str(1 << 30), str(8 << 20), mode, str(now)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    return r, log.read_text().splitlines() if log.exists() else []


# -- the format pieces -------------------------------------------------------------------

def test_points_encode_and_decode() -> None:
    pts = [Point(3, T0, [Change(b"a", 1, 10), Change(b"\xff", 2, None, T0 - 1)]),
           Point(4, T0 + 1, [Change(b"a", 1, 20)])]
    doc = encode(pts)
    assert decode(doc, "x") == pts
    for bad in ({**doc, "points": [[4, T0, []], [3, T0, []]]},   # seqs not rising
                {**doc, "points": [[3, T0, [[0, 1, -5]]]]},       # a negative size
                {**doc, "points": [[3, T0, [[9, 1, 5]]]]}):       # no such path
        with pytest.raises((ValueError, IndexError)):
            decode(bad, "x")


def test_apply_follows_the_fold_rules() -> None:
    files: dict[bytes, Entry] = {}
    retired: list[Entry] = []
    apply(Point(0, T0, [Change(b"f", 1, 5)]), files, retire=retired.append)
    apply(Point(1, T0, [Change(b"f", 1, None, T0)]), files)       # deleted
    assert files[b"f"].deleted_at == T0
    apply(Point(2, T0, [Change(b"f", 1, 9)]), files)              # revived and grown
    assert files[b"f"].deleted_at is None and files[b"f"].size == 9
    apply(Point(3, T0, [Change(b"f", 2, 3)]), files, retire=retired.append)
    assert (files[b"f"].gen, files[b"f"].size) == (2, 3) and [e.gen for e in retired] == [1]
    apply(Point(4, T0, [Change(b"f", 1, 50)]), files)             # an older gen: ignored
    assert (files[b"f"].gen, files[b"f"].size) == (2, 3)


def test_the_locator_chains_extents_from_several_objects() -> None:
    def x(start: int, end: int) -> Extent:
        return Extent(b"f", 1, start, end, 16, 1, "", 0o600, 0)

    loc = Locator()
    loc.add_all([("pack", x(0, 10)), ("pack", x(10, 20))])
    loc.add_all([("delta", x(10, 15)), ("delta", x(15, 30))])
    # Cut differently: the pack's [10, 20) leads nowhere past 20, the delta's reach 30.
    got = [(k, e.start, e.end) for k, e in loc.extents(b"f", 1, 30)]
    assert got == [("pack", 0, 10), ("delta", 10, 15), ("delta", 15, 30)]
    assert [(k, e.end) for k, e in loc.extents(b"f", 1, 20)] == [("pack", 10), ("pack", 20)]
    assert loc.extents(b"f", 1, 5) == [("pack", x(0, 10))]
    assert [e.end for _, e in loc.extents(b"f", 1, 99)][-1] == 30  # as far as they reach
    assert loc.extents(b"g", 1, 5) == []


def test_a_catalog_field_is_written_once_until_it_changes() -> None:
    from syncd.format.catalog import Session
    from syncd.format.points import apply_catalog
    fields = [{"cwd": "/a", "git_branch": "main", "last_prompt": "one"},
              {"cwd": "/a", "git_branch": "main", "last_prompt": "two"},
              {"cwd": "/a", "git_branch": "dev", "last_prompt": "two"}]
    path = f"projects/-a/{SA}.jsonl".encode()
    pts = [Point(i, T0 + i, [Change(path, 1, 10 * (i + 1))], [(path, 1, f)])
           for i, f in enumerate(fields)]
    doc = encode(pts)
    written = [p[3][0][2] if len(p) > 3 else {} for p in doc["points"]]
    assert written == [fields[0], {"last_prompt": "two"}, {"git_branch": "dev"}]
    back = decode(doc, "x")
    for upto in range(1, 4):
        got: dict[bytes, Session] = {}
        want: dict[bytes, Session] = {}
        for p in back[:upto]:
            apply_catalog(p, got, M)
        for p in pts[:upto]:
            apply_catalog(p, want, M)
        assert got[path].fields == want[path].fields

"""Every flush a point in time, under random histories: a tree changed over about forty
flushes (appends, new sessions, rewrites, deletions, revivals, torn lines, empty files,
history and settings), with compactions (random chain lengths) and prunes (random
policies) in between. Seeded: each seed is one history, the same on every run.

After each prune and at the end, every point the timeline lists restores byte for byte
as the flush that made it left the tree; a time between two points restores as the
earlier one; the time of a thinned flush loads as the newest listed point before it;
every flush within the last prune's window is still listed; and verify reads everything
back."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from syncd.archive.compact import CompactOptions, compact
from syncd.archive.prune import prune
from syncd.archive.retention import Policy
from syncd.archive.verify import verify
from syncd.errors import NoBackup
from syncd.repository import Repository
from syncd.restore import restorer
from syncd.restore.restorer import RestoreOptions, restore
from syncd.store import MemoryStore
from syncd.timeline import timeline
from syncd.view import Backup, load_backup
from tests.helpers import tree_bytes
from tests.test_compact import T0, Clock, M, history, line, make_shipper, todo

SEEDS = list(range(12))
FLUSHES = 40
CHAINS = (0, 1, 2, 5, 24)
FOLDERS = (("projects/-home-u-app", "/home/u/app"), ("projects/-home-u-lib", "/home/u/lib"))
SETTINGS = "settings.json"
HIST = "history.jsonl"

Tree = dict[bytes, bytes]
Point = tuple[int, float] | None

# One step of a history: ("write", path, data, mode, what) | ("delete", path) |
# ("flush", seconds) | ("compact", max_chain) | ("prune", policy fields, max_chain).
Step = tuple[Any, ...]


# -- the history: generated from the seed, then played ----------------------------------

@dataclass
class _Plan:
    """What the generator knows of the tree: which paths exist, which are deleted, which
    transcripts end in a torn line (and its rest)."""

    rng: random.Random
    live: dict[str, str] = field(default_factory=dict)  # path -> "session" | "other"
    gone: set[str] = field(default_factory=set)
    gone_now: set[str] = field(default_factory=set)  # deleted in the flush being built
    torn: dict[str, bytes] = field(default_factory=dict)
    empty: set[str] = field(default_factory=set)  # live paths that are empty files
    sids: dict[str, tuple[str, str]] = field(default_factory=dict)  # path -> (sid, cwd)
    n: int = 0

    def count(self) -> int:
        self.n += 1
        return self.n

    def lines(self, path: str, k: int) -> bytes:
        sid, cwd = self.sids[path]
        return b"".join(line(sid, self.count(), self.rng.randrange(120, 700), cwd=cwd)
                        for _ in range(k))

    def content(self, path: str) -> bytes:
        """A whole new content for ``path`` (never empty)."""
        if path in self.sids:
            return self.lines(path, self.rng.randint(1, 3))
        if path == HIST:
            return history(f"s{self.count()}", self.n)
        if path == SETTINGS:
            return json.dumps({"model": f"m{self.count()}", "n": self.rng.random()},
                              indent=2).encode() + b"\n"
        return todo(self.count(), self.rng.randrange(60, 400))


def _ops(p: _Plan) -> list[Step]:
    """One flush's worth of random changes (at least one)."""
    rng = p.rng
    out: list[Step] = []
    before = set(p.live)
    sessions = [x for x, kind in p.live.items() if kind == "session"]
    whole = [x for x in p.live if x not in p.torn]

    def write(path: str, data: bytes, mode: str, what: str) -> None:
        out.append(("write", path, data, mode, what))
        if data or mode == "ab":
            p.empty.discard(path)
        else:
            p.empty.add(path)

    choices = ["append"] * 4 + ["new"] + ["rewrite", "delete", "revive", "torn", "empty",
                                          "emptied", "history", "settings"] + ["complete"] * 2
    for _ in range(rng.randint(1, 4)):
        op = rng.choice(choices)
        if op == "append" and sessions:
            path = rng.choice(sessions)
            if path in p.torn:
                write(path, p.torn.pop(path), "ab", "complete the torn line")
            write(path, p.lines(path, rng.randint(1, 3)), "ab", "append lines")
        elif (op == "new" and len(p.sids) < 6) or (op == "append" and not sessions):
            folder, cwd = rng.choice(FOLDERS)
            sid = f"{rng.getrandbits(32):08x}-0000-4000-8000-{rng.getrandbits(48):012x}"
            path = f"{folder}/{sid}.jsonl"
            p.sids[path] = (sid, cwd)
            p.live[path] = "session"
            write(path, p.lines(path, rng.randint(1, 3)), "wb", "new transcript")
        elif op == "rewrite" and whole:
            path = rng.choice(whole)
            write(path, p.content(path), "wb", "truncate and rewrite")
        elif op == "delete" and p.live:
            path = rng.choice(sorted(p.live))
            out.append(("delete", path))
            del p.live[path]
            p.torn.pop(path, None)
            p.empty.discard(path)
            p.gone.add(path)
            p.gone_now.add(path)
        elif op == "revive" and p.gone - p.gone_now:
            path = rng.choice(sorted(p.gone - p.gone_now))
            p.gone.discard(path)
            p.live[path] = "session" if path in p.sids else "other"
            write(path, p.content(path), "wb", "recreate a deleted file")
        elif op == "torn" and [s for s in sessions if s not in p.torn]:
            path = rng.choice([s for s in sessions if s not in p.torn])
            whole_line = p.lines(path, 1)
            cut = rng.randrange(1, len(whole_line) - 1)
            write(path, whole_line[:cut], "ab", "a torn line")
            p.torn[path] = whole_line[cut:]
        elif op == "complete" and p.torn:
            path = rng.choice(sorted(p.torn))
            write(path, p.torn.pop(path), "ab", "complete the torn line")
        elif op == "empty":
            path = f"plans/empty-{p.count()}.md"
            p.live[path] = "other"
            write(path, b"", "wb", "an empty file")
        elif op == "emptied" and [x for x in p.live if x not in p.empty]:
            path = rng.choice(sorted(x for x in p.live if x not in p.empty))
            p.torn.pop(path, None)
            write(path, b"", "wb", "truncated to nothing")
        elif op == "history":
            p.live[HIST] = "other"
            p.gone.discard(HIST)
            write(HIST, history(f"s{p.count()}", p.n), "ab", "history append")
        elif op == "settings":
            p.live[SETTINGS] = "other"
            p.gone.discard(SETTINGS)
            write(SETTINGS, p.content(SETTINGS), "wb", "settings rewritten")
    if not any((s[0] == "write" and s[1] in p.live) or (s[0] == "delete" and s[1] in before)
               for s in out):
        # Nothing that ships (what was written is deleted again): a history line does.
        p.live[HIST] = "other"
        p.gone.discard(HIST)
        write(HIST, history(f"s{p.count()}", p.n), "ab", "history append")
    return out


def _policy(rng: random.Random) -> dict[str, int]:
    kind = rng.choice(["within", "within", "hourly", "daily", "last", "mixed"])
    if kind == "within":
        return {"keep_within": rng.randint(1, 6 * 3600)}
    if kind == "hourly":
        return {"keep_hourly": rng.randint(1, 6)}
    if kind == "daily":
        return {"keep_daily": rng.randint(1, 2)}
    if kind == "last":
        return {"keep_last": rng.randint(1, 4)}
    return {"keep_last": rng.randint(0, 3), "keep_hourly": rng.randint(1, 4),
            "keep_daily": rng.randint(0, 1)}


def history_of(seed: int, flushes: int = FLUSHES) -> list[Step]:
    """The steps of one seed's history."""
    rng = random.Random(seed)
    p = _Plan(rng)
    steps: list[Step] = []
    for _ in range(flushes):
        p.gone_now = set()
        steps += _ops(p)
        steps.append(("flush", rng.randint(1, 900)))
        r = rng.random()
        if r < 0.3:
            steps.append(("compact", rng.choice(CHAINS)))
        elif r < 0.37:
            steps.append(("prune", _policy(rng), rng.choice(CHAINS)))
    return steps


# -- playing a history, and what must hold --------------------------------------------------

@dataclass
class Flush:
    seq: int
    time: float
    tree: Tree


@dataclass
class Played:
    flushes: list[Flush] = field(default_factory=list)
    # The last prune: the newest point's time then, its window, the last seq then, and
    # the points listed just before it.
    pruned: tuple[float, float, int, set[int]] | None = None


def _fresh(base: Path) -> Iterator[Path]:
    n = 0
    while True:
        n += 1
        yield base / f"o{n}"


def play(steps: list[Step], tmp: Path) -> Played:
    """Play ``steps`` against a memory store; the checks run after each prune and at the
    end (an AssertionError says what failed). A step that cannot be done (deleting what
    is not there, a flush with nothing to ship) is passed over."""
    src, store, clock = tmp / "src", MemoryStore(), Clock(T0)
    src.mkdir(parents=True)
    sh = make_shipper(src, store, tmp / "st.db", clock)
    repo = Repository(store, M)
    out = _fresh(tmp / "out")
    gone: Tree = {}
    seen: Tree = {}
    known: set[bytes] = set()
    got = Played()
    for step in steps:
        kind = step[0]
        if kind == "write":
            _, path, data, mode, _ = step
            full = src / path
            full.parent.mkdir(parents=True, exist_ok=True)
            with open(full, mode) as f:
                f.write(data)
            known.add(path.encode())
        elif kind == "delete":
            full = src / step[1]
            if full.exists():
                os.unlink(full)
        elif kind == "flush":
            clock.t += step[1]
            before = sh.state.next_seq
            sh.ship(sorted(known))
            if sh.state.next_seq == before:
                continue
            assert sh.state.next_seq == before + 1, "one flush, one segment"
            now = tree_bytes(src)
            # A deleted file comes back as the last flush before its deletion saw it (a
            # file made and deleted between two flushes was never backed up); one that
            # is there again replaces its deleted self.
            gone.update({k: v for k, v in seen.items() if k not in now})
            gone = {k: v for k, v in gone.items() if k not in now}
            seen = now
            got.flushes.append(Flush(before, clock.t, {**gone, **now}))
        elif kind == "compact":
            if not got.flushes:
                continue
            rep = compact(repo, CompactOptions(max_chain=step[1], now=clock.t))
            assert rep.errors == [], rep.errors
        elif kind == "prune":
            if not got.flushes:
                continue
            policy = Policy(**step[1])
            alive = {r.seq for r in timeline(repo)[0]}
            pr = prune(repo, policy, opts=CompactOptions(max_chain=step[2], now=clock.t))
            assert pr.errors == [], pr.errors
            got.pruned = (got.flushes[-1].time, policy.window, got.flushes[-1].seq, alive)
            check(repo, got, next(out), f"after the prune {step}")
    if got.flushes:
        check(repo, got, next(out), "at the end", final=True)
    return got


def restored(repo: Repository, at: float | None, out: Path) -> tuple[Tree, Point]:
    """The tree a restore as of ``at`` writes into the fresh ``out``, and the point of the
    view it restored (``load_backup(repo, at).point``, as the restore itself loaded it)."""
    views: list[Backup] = []

    def load(*args: Any, **kwargs: Any) -> Backup:
        views.append(load_backup(*args, **kwargs))
        return views[-1]

    with mock.patch.object(restorer, "load_backup", load):
        r = restore(repo, RestoreOptions(target=out, at=at, local_machine=M, config=True))
    assert r.errors == [], r.errors
    (view,) = views
    return tree_bytes(out), view.point


def _diff(got: Tree, want: Tree) -> str:
    missing = sorted(k for k in want if k not in got)
    extra = sorted(k for k in got if k not in want)
    differ = [f"{k!r}: {len(got[k])} bytes, want {len(want[k])}"
              for k in sorted(want) if k in got and got[k] != want[k]]
    return f"missing {missing}, extra {extra}, different {differ}"


def check(repo: Repository, got: Played, out: Path, when: str, final: bool = False) -> None:
    rows, errors = timeline(repo)
    assert errors == [], (when, errors)
    by_seq = {f.seq: f for f in got.flushes}
    # Every listed point is a flush, at that flush's time, in order.
    for r in rows:
        assert r.seq in by_seq and by_seq[r.seq].time == r.time, (when, r)
    assert [r.time for r in rows] == sorted({r.time for r in rows}), (when, "times rise")
    listed = {r.seq for r in rows}
    # Nothing thinned that no prune could thin: every flush after the last prune, and
    # every point listed before it that is within its window.
    if got.pruned is None:
        required = set(by_seq)
    else:
        newest, window, last, alive = got.pruned
        required = {f.seq for f in got.flushes
                    if f.seq > last or (f.seq in alive and f.time >= newest - window)}
    assert required <= listed, (when, "not listed", sorted(required - listed), got.pruned)
    n = 0
    between: list[tuple[float, Flush]] = []
    for i, r in enumerate(rows):
        want = by_seq[r.seq].tree
        n += 1
        have, point = restored(repo, r.time, out / f"p{n}")
        assert point == (r.seq, r.time), (when, r, point)
        assert have == want, (when, f"point {r.seq} at {r.time}", _diff(have, want))
        nxt = rows[i + 1].time if i + 1 < len(rows) else r.time + 1000
        if nxt - r.time > 1:
            # Half way to the next point, or just before it.
            between.append((nxt - 0.5 if i % 2 else r.time + (nxt - r.time) / 2, by_seq[r.seq]))
    # Between two points: the earlier one. Every such time loads as it at the end, a
    # sample after a prune; a sample restores in full (the same view as its point's).
    pick = random.Random(repr([r.seq for r in rows]))
    for at, f in between if final else pick.sample(between, min(8, len(between))):
        b = load_backup(repo, at=at)
        assert b.point == (f.seq, f.time), (when, f"between {f.seq} and the next, at {at}",
                                            b.point)
    for at, f in pick.sample(between, min(8 if final else 2, len(between))):
        n += 1
        have, point = restored(repo, at, out / f"p{n}")
        assert point == (f.seq, f.time), (when, f"between {f.seq} and the next, at {at}",
                                          point)
        assert have == f.tree, (when, f"between {f.seq} and the next, at {at}",
                                _diff(have, f.tree))
    # A thinned flush: the newest listed point before it, or no backup at all.
    for f in got.flushes:
        if f.seq in listed:
            continue
        before = [r for r in rows if r.time <= f.time]
        if not before:
            with pytest.raises(NoBackup):
                load_backup(repo, at=f.time)
            continue
        b = load_backup(repo, at=f.time)
        assert b.point == (before[-1].seq, before[-1].time), (when, "thinned", f.seq,
                                                              b.point)
    if final:
        n += 1
        have, point = restored(repo, None, out / f"p{n}")
        want = got.flushes[-1].tree
        assert point == (got.flushes[-1].seq, got.flushes[-1].time), (when, "now", point)
        assert have == want, (when, "as of now", _diff(have, want))
        v = verify(repo, read_data=100)
        assert v.ok, (when, v.problems)


@pytest.fixture
def no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """Restores land on disk without fsync: durability is not what is tested here, and
    the fsyncs of a thousand restores would be most of the time."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_histories_restore_every_listed_point(tmp_path: Path, seed: int,
                                                     no_fsync: None) -> None:
    steps = history_of(seed)
    got = play(steps, tmp_path)
    assert len(got.flushes) == FLUSHES

#!/usr/bin/env python3
"""Forget and redact figures: one session (or one value) taken out of every point of a
generated store on a local store.

Prints figures; asserts nothing about timing. See bench/README.md, "Forget and redact".

    .venv/bin/python bench/forget.py                # ~1 GB of transcripts
    .venv/bin/python bench/forget.py --size 200     # MB of transcripts
    .venv/bin/python bench/forget.py --quick        # smoke run: 30 MB

The store is built as a daemon builds it over a day: the tree shipped, a manifest, then
rounds of appended lines (every session may grow, the victim too), each round compacted
(deltas, small ones grown), a manifest every few rounds, segments after the last one.
Then ``rewrite`` forgets one session of median size that has subagents and a line in
every round (so in every delta), then (on a copy of the store as built) one of the same
size shipped once, then, on the first store, redacts one value planted in another
session's line. Everything lives in one temporary
directory, removed at the end.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from core import MB, append_line, build_main_tree, log, synthetic_corpus

from syncd.archive.compact import CompactOptions, compact
from syncd.archive.rewrite import Rewrite, RewriteReport, rewrite
from syncd.backup.ship import Shipper
from syncd.backup.state import State
from syncd.claude import Selection
from syncd.repository import Repository
from syncd.store import LocalStore, ObjectInfo, layout
from syncd.timeline import timeline

MACHINE = "bench-forget"
SECRET = b"ghp_" + b"R2d2C3po" * 4 + b"Bb8x"  # a GitHub token's shape (40 characters)


class Counting(LocalStore):
    """A local store that counts requests and bytes."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.n: Counter[str] = Counter()

    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        data = super().get(key, start, length)
        self.n["get"] += 1
        self.n["get_bytes"] += len(data)
        self.n[f"get:{key}"] = 1
        return data

    def put(self, key: str, data: bytes, *, if_none_match: bool = True,
            if_match: str | None = None) -> str:
        self.n["put"] += 1
        self.n["put_bytes"] += len(data)
        return super().put(key, data, if_none_match=if_none_match, if_match=if_match)

    def delete_many(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        self.n["deleted"] += len(keys)
        super().delete_many(keys)

    def list(self, prefix: str, start_after: str = "") -> Iterator[ObjectInfo]:
        self.n["list"] += 1
        return super().list(prefix, start_after)


def stored(store: LocalStore) -> tuple[int, int, Counter[str]]:
    """Objects, bytes, and bytes by kind of the machine."""
    kinds: Counter[str] = Counter()
    n = size = 0
    for info in LocalStore.list(store, f"machines/{MACHINE}/"):
        n, size = n + 1, size + info.size
        kinds[layout.kind_of(info.key) or "other"] += info.size
    return n, size, kinds


def by_kind(kinds: Counter[str]) -> str:
    return ", ".join(f"{k} {v / MB:.2f} MB" for k, v in sorted(kinds.items()))


def build(work: Path, size: int, rounds: int) -> tuple[Counting, str, str, float]:
    rng = random.Random(28)
    corpus = synthetic_corpus(rng)
    src = work / "claude"
    t0 = time.perf_counter()
    tree = build_main_tree(src, corpus, rng, size)
    log(f"tree: {tree.bytes / MB:.0f} MB, {tree.files} files, {len(tree.sessions)} "
        f"sessions ({time.perf_counter() - t0:.0f} s)")
    store = Counting(work / "store")
    clock = [time.time() - 86400.0]
    repo = Repository(store, MACHINE)
    sh = Shipper(root=src, repo=repo, state=State(work / "state.db"), selection=Selection(),
                 clock=lambda: clock[0])
    with_agents = sorted((p.stat().st_size, str(p), sid) for p, sid, _ in tree.sessions
                         if (p.parent / sid / "subagents").is_dir())
    _, _, victim = with_agents[len(with_agents) // 2]
    idle = with_agents[len(with_agents) // 2 + 1][2]  # shipped once, never appended to
    others = [(p, sid, cwd) for p, sid, cwd in tree.sessions if sid not in (victim, idle)]
    victim_row = next(r for r in tree.sessions if r[1] == victim)

    def flush() -> None:
        paths = [p.relative_to(src).as_posix().encode() for p in src.rglob("*") if p.is_file()]
        sh.ship(paths)

    t0 = time.perf_counter()
    flush()
    compact(repo, CompactOptions(max_chain=0, now=clock[0]))
    for r in range(rounds):
        clock[0] += 900.0
        for p, sid, cwd in [victim_row, *rng.sample(others, min(20, len(others)))]:
            append_line(p, corpus.line(rng, sid, cwd))
        if r == rounds // 2:  # the value to redact, in another session's line
            p, sid, _ = others[0]
            append_line(p, b'{"type":"user","sessionId":"' + sid.encode()
                        + b'","message":{"role":"user","content":"export GH_TOKEN='
                        + SECRET + b'"}}\n')
        flush()
        if r < rounds - 2:  # the last two rounds stay segments
            compact(repo, CompactOptions(max_chain=0 if r % 6 == 5 else 24, now=clock[0]))
    log(f"store built in {time.perf_counter() - t0:.0f} s")
    for what, sid in (("active", victim), ("idle", idle)):
        mine = [p for p in src.rglob("*") if p.is_file() and sid in str(p)]
        print(f"{what} session {sid}: {len(mine)} files, "
              f"{sum(p.stat().st_size for p in mine) / MB:.2f} MB")
    return store, victim, idle, clock[0]


def measure(store: Counting, spec: Rewrite, now: float) -> tuple[RewriteReport, dict[str, float]]:
    before = stored(store)
    store.n.clear()
    wall, cpu = time.perf_counter(), time.process_time()
    rep = rewrite(Repository(store, MACHINE), spec, CompactOptions(now=now))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    after = stored(store)
    objects_read = sum(1 for k in store.n if k.startswith("get:"))
    log(f"by kind before: {by_kind(before[2])}; after: {by_kind(after[2])}")
    return rep, {"wall": wall, "cpu": cpu, "gets": store.n["get"],
                 "objects_read": objects_read, "read": store.n["get_bytes"],
                 "puts": store.n["put"], "written": store.n["put_bytes"],
                 "deleted": store.n["deleted"], "before": before[1], "after": after[1],
                 "objects_before": before[0], "objects_after": after[0]}


def show(what: str, rep: RewriteReport, f: dict[str, float]) -> None:
    print(f"{what}: {f['wall']:.1f} s wall, {f['cpu']:.1f} s CPU; "
          f"{f['gets']:.0f} GETs of {f['objects_read']:.0f} objects ({f['read'] / MB:.1f} MB); "
          f"{f['puts']:.0f} objects written ({f['written'] / MB:.1f} MB), "
          f"{f['deleted']:.0f} deleted ({rep.bytes_deleted / MB:.1f} MB in packs and deltas); "
          f"store {f['before'] / MB:.1f} -> {f['after'] / MB:.1f} MB "
          f"({f['objects_before']:.0f} -> {f['objects_after']:.0f} objects); "
          f"{len(rep.files_dropped)} files dropped, {rep.ranges_masked} ranges masked, "
          f"{len(rep.rewritten)} objects rewritten; errors: {rep.errors or 'none'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1024, help="MB of transcripts")
    ap.add_argument("--rounds", type=int, default=24, help="rounds of appends")
    ap.add_argument("--quick", action="store_true", help="30 MB, 8 rounds")
    args = ap.parse_args()
    size, rounds = (30, 8) if args.quick else (args.size, args.rounds)
    work = Path(tempfile.mkdtemp(prefix="syncd-forget-"))
    try:
        store, victim, idle, now = build(work, size * MB, rounds)
        n, total, kinds = stored(store)
        points = len(timeline(Repository(store, MACHINE))[0])
        print(f"store: {total / MB:.0f} MB in {n} objects ({by_kind(kinds)}), "
              f"{points} points, from {size} MB of transcripts")
        shutil.copytree(work / "store", work / "store-idle")
        rep, f = measure(store, Rewrite(forget=frozenset({victim})), now)
        show("forget one active session (in every delta)", rep, f)
        rep, f = measure(Counting(work / "store-idle"), Rewrite(forget=frozenset({idle})), now)
        show("forget one idle session, on the store as built", rep, f)
        rep, f = measure(store, Rewrite(redact=(SECRET,)), now)
        show("redact one value", rep, f)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The timeline: `syncd snapshots` lists exactly the points a restore reaches, each time it
prints restores that point, and retention groups them as the policy does."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from syncd.archive.compact import CompactOptions, compact
from syncd.archive.prune import prune
from syncd.archive.retention import Policy, retention_groups
from syncd.duration import format_time, parse_time
from syncd.repository import Repository
from syncd.store import LocalStore, MemoryStore
from syncd.timeline import timeline
from syncd.view import load_backup
from tests.test_cli import env_of, syncd
from tests.test_compact import SA, SB, M
from tests.test_points import Rounds, schedule


def test_the_timeline_is_every_round_and_each_of_its_times_restores_that_round(
        tmp_path: Path) -> None:
    store = MemoryStore()
    rounds = Rounds(tmp_path / "src", store, tmp_path / "st.db")
    rounds.play(schedule(store, rounds, None, CompactOptions()))
    repo = Repository(store, M)
    points, errors = timeline(repo)
    assert errors == []
    assert [p.time for p in points] == rounds.times
    # Round 2 was compacted into the first manifest; the others are flushes.
    assert [p.kind for p in points] == ["flush"] * 2 + ["snapshot"] + ["flush"] * 6
    assert points[2].sessions == [SB] and SA in points[1].sessions
    assert points[1].added is not None and points[1].added > 0
    assert points[5].added == 0  # a deletion adds nothing
    for p in points:
        got = load_backup(repo, at=parse_time(format_time(p.time)))
        assert got.point == (p.seq, p.time)
        between = load_backup(repo, at=p.time + 1)
        assert between.point == (p.seq, p.time)


def test_a_pruned_timeline_lists_what_still_restores(tmp_path: Path) -> None:
    store = MemoryStore()
    rounds = Rounds(tmp_path / "src", store, tmp_path / "st.db")
    opts = CompactOptions(max_chain=1)
    rounds.play(schedule(store, rounds, None, opts))
    repo = Repository(store, M)
    compact(repo, dataclasses.replace(opts, now=rounds.clock.t))
    pr = prune(repo, Policy(keep_within=1.0, keep_hourly=1), opts=dataclasses.replace(
        opts, now=rounds.clock.t))
    assert pr.errors == [] and pr.forgotten
    points, errors = timeline(repo)
    assert errors == [] and len(points) < len(rounds.times)
    for p in points:
        assert load_backup(repo, at=p.time).point == (p.seq, p.time)
    # A time before the first point names it.
    groups = retention_groups(points, Policy(keep_within=1.0, keep_hourly=1))
    assert groups[points[-1].seq] == "every flush, the last 1s"


def test_snapshots_command_prints_the_points_newest_first(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    rounds = Rounds(tmp_path / "src", store, tmp_path / "st.db")
    rounds.play(schedule(store, rounds, None, CompactOptions()))
    env = env_of(tmp_path)
    r = syncd(env, "snapshots", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [row["time"] for row in rows] == rounds.times[::-1]
    assert {row["kept_as"] for row in rows} == {"every flush, the last 1d"}
    table = syncd(env, "snapshots")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:4] == ["TIME", "(UTC)", "KIND", "SEQ"]
    assert lines[1].startswith(format_time(rounds.times[-1]))
    # restore --at a printed time says which point it used.
    out = tmp_path / "out"
    at = rows[3]["at"]
    r = syncd(env, "restore", "--at", at, "--to", str(out))
    assert r.returncode == 0, r.stderr
    assert f"as of {at} (flush {rows[3]['seq']})" in r.stdout + r.stderr
    early = syncd(env, "restore", "--at", format_time(rounds.times[0] - 60), "--to",
                  str(tmp_path / "early"))
    assert early.returncode == 1
    assert f"its first point in time is {format_time(rounds.times[0])}" in early.stderr
    assert os.path.isdir(tmp_path / "src")

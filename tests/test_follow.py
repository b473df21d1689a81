"""Following another machine (syncd/follow/follower.py): imports remapped and merged as a
restore would, one request per idle poll, shipped once and never echoed back, left alone
while written here, caught up after a compaction."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from syncd.archive.compact import compact
from syncd.backup.engine import sync_once
from syncd.backup.ship import imported_from
from syncd.backup.state import OriginRecord, State
from syncd.claude import project_folder
from syncd.cli.main import cli
from syncd.cli.restore import imported_copies
from syncd.config import Settings, load_settings
from syncd.errors import TransientError
from syncd.follow import follower as follower_module
from syncd.follow.follower import HEAD_EVERY, Follower, cursors, session_of_any
from syncd.repository import Repository
from syncd.restore.listing import here, session_rows
from syncd.restore.restorer import RestoreOptions, RestoreReport, restore
from syncd.service.status import format_status, status
from syncd.store import LocalStore, ObjectInfo, Store, layout
from tests.counting import CountingStore
from tests.helpers import running, tree_bytes, wait_for, write
from tests.hostile import line
from tests.readers import read_index

S1 = "0a0eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
S2 = "1b1eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"


class Machine:
    """One machine of the test: its home, settings and state, over a shared store."""

    def __init__(self, tmp: Path, name: str, home: str, **kw: object) -> None:
        self.name = name
        self.home = tmp / home.strip("/")
        self.home.mkdir(parents=True, exist_ok=True)
        base: dict[str, object] = dict(source=self.home / ".claude",
                                       store=(tmp / "store").as_uri(),
                                       state_dir=tmp / name / "state", machine_id=name,
                                       follow_quiet=0)
        base.update(kw)
        self.settings: Settings = load_settings(config_file=tmp / "none.toml", **base)
        self.store_dir = tmp / "store"
        self.now = 2e9  # the follower's clock: far after any file's mtime

    def cwd(self, project: str) -> str:
        return f"{self.home}/{project}"

    def transcript(self, project: str, sid: str) -> Path:
        return self.settings.source / "projects" / project_folder(self.cwd(project)) / \
            f"{sid}.jsonl"

    def sync(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("HOME", str(self.home))
        sync_once(self.settings)

    def follower(self, monkeypatch: pytest.MonkeyPatch, store: Store | None = None
                 ) -> Iterator[Follower]:
        monkeypatch.setenv("HOME", str(self.home))
        state = State(self.settings.state_file)
        repo = Repository(store or LocalStore(self.store_dir), self.name)
        try:
            yield Follower(self.settings, repo, state, clock=lambda: self.now)
        finally:
            state.close()

    def poll(self, monkeypatch: pytest.MonkeyPatch, store: Store | None = None) -> None:
        for f in self.follower(monkeypatch, store):
            f.poll()

    def cursor(self, machine: str) -> dict[str, object]:
        state = State(self.settings.state_file, readonly=True)
        try:
            return dict(vars(cursors(state)[machine]))
        finally:
            state.close()


@pytest.fixture
def two(tmp_path: Path) -> tuple[Machine, Machine]:
    a = Machine(tmp_path, "desk", "/home/alice", follow=["laptop"])
    b = Machine(tmp_path, "laptop", "/users/bob", follow=["desk"])
    return a, b


def extents_of(m: Machine, path: Path) -> list[tuple[int, int, int, str | None]]:
    """(gen, start, end, reason) of every extent the machine's segments hold for ``path``."""
    rel = os.fsencode(path.relative_to(m.settings.source))
    store = LocalStore(m.store_dir)
    out = []
    for o in store.list(layout.segments_prefix(m.name)):
        for x in read_index(store, o.key).extents:
            if x.path == rel:
                out.append((x.gen, x.start, x.end, x.reason))
    return sorted(out)


def imported_once(a: Machine, b: Machine, monkeypatch: pytest.MonkeyPatch
                  ) -> tuple[Path, Path]:
    """desk's session S1 with one line, brought to the laptop by its first poll: the
    session's path in desk's tree, and the laptop's copy."""
    rel = a.transcript("app", S1).relative_to(a.settings.source)
    write(a.settings.source, rel, line(S1, a.cwd("app"), 0))
    a.sync(monkeypatch)
    b.poll(monkeypatch)
    return rel, b.transcript("app", S1)


def test_the_first_poll_brings_every_session_remapped_into_this_machines_folder(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = two
    write(a.settings.source, a.transcript("app", S1).relative_to(a.settings.source),
          line(S1, a.cwd("app"), 0) + line(S1, a.cwd("app"), 1))
    write(a.settings.source, a.transcript("lib", S2).relative_to(a.settings.source),
          line(S2, a.cwd("lib"), 0))
    a.sync(monkeypatch)
    b.poll(monkeypatch)
    got = b.transcript("app", S1)
    assert got.read_bytes() == line(S1, b.cwd("app"), 0) + line(S1, b.cwd("app"), 1)
    assert b.transcript("lib", S2).read_bytes() == line(S2, b.cwd("lib"), 0)
    cur = b.cursor("desk")
    assert cur["imported"] == 2 and cur["seq"] == 0 and cur["problem"] is None


def test_an_idle_followed_machine_costs_one_request_per_poll(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = two
    write(a.settings.source, a.transcript("app", S1).relative_to(a.settings.source),
          line(S1, a.cwd("app"), 0))
    a.sync(monkeypatch)
    counting = CountingStore(LocalStore(b.store_dir))
    for f in b.follower(monkeypatch, counting):  # type: ignore[arg-type]
        f.poll()  # the first look
        counting.counts.calls.clear()
        for _ in range(HEAD_EVERY - 1):
            f.poll()
        assert counting.counts.by_kind() == {"HEAD": HEAD_EVERY - 1}, counting.counts.calls
        # Every HEAD_EVERY polls its head is reconciled: one HEAD more (a GET only when
        # it changed since it was read).
        f.poll()
        assert counting.counts.by_kind()["HEAD"] == HEAD_EVERY + 1, counting.counts.calls
        assert counting.counts.by_kind()["GET"] <= 1, counting.counts.calls
        counting.counts.calls.clear()
        f.poll()
        assert counting.counts.by_kind() == {"HEAD": 1}, counting.counts.calls
    # A start reconciles at once: the head's HEAD and, once a start, its GET (what was
    # imported from there and is behind it comes then too).
    counting.counts.calls.clear()
    b.poll(monkeypatch, counting)  # type: ignore[arg-type]
    assert counting.counts.by_kind() == {"HEAD": 2, "GET": 1}, counting.counts.calls


def test_appends_arrive_shipped_once_as_imported_and_never_come_back(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = two
    rel, _ = imported_once(a, b, monkeypatch)
    b.sync(monkeypatch)
    write(a.settings.source, rel, line(S1, a.cwd("app"), 1), mode="ab")
    a.sync(monkeypatch)
    b.poll(monkeypatch)
    theirs = b.transcript("app", S1)
    assert theirs.read_bytes() == line(S1, b.cwd("app"), 0) + line(S1, b.cwd("app"), 1)
    b.sync(monkeypatch)
    # One generation, each byte once, every extent marked as desk's.
    size = theirs.stat().st_size
    ext = extents_of(b, theirs)
    assert [(g, s, e) for g, s, e, _ in ext] == [(1, 0, len(line(S1, b.cwd("app"), 0))),
                                                 (1, len(line(S1, b.cwd("app"), 0)), size)]
    assert {r for *_, r in ext} == {imported_from("desk")}
    # desk follows laptop: what laptop imported from it is not imported back.
    before = {p: p.stat().st_mtime_ns for p in a.settings.source.rglob("*.jsonl")}
    a.poll(monkeypatch)
    assert {p: p.stat().st_mtime_ns for p in a.settings.source.rglob("*.jsonl")} == before
    assert a.cursor("laptop")["imported"] == 0
    a.sync(monkeypatch)
    assert len(extents_of(a, a.transcript("app", S1))) == 2  # its own two appends only


def test_a_continuation_here_ships_only_its_own_bytes_and_reaches_the_other_machine(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = two
    _, mine = imported_once(a, b, monkeypatch)
    b.sync(monkeypatch)
    base = mine.stat().st_size
    write(b.settings.source, mine.relative_to(b.settings.source),
          line(S1, b.cwd("app"), 1, "continued on the laptop"), mode="ab")
    b.sync(monkeypatch)
    assert extents_of(b, mine)[-1] == (1, base, mine.stat().st_size, None)
    a.poll(monkeypatch)
    assert a.transcript("app", S1).read_bytes() == line(S1, a.cwd("app"), 0) + line(
        S1, a.cwd("app"), 1, "continued on the laptop")
    a.sync(monkeypatch)
    assert extents_of(a, a.transcript("app", S1))[-1][3] == imported_from("laptop")
    # Back on the laptop: nothing new to import, nothing written.
    mtime = mine.stat().st_mtime_ns
    b.poll(monkeypatch)
    assert mine.stat().st_mtime_ns == mtime


def test_a_session_written_here_is_left_until_quiet(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = two
    b.settings = b.settings.model_copy(update={"follow_quiet": 60.0})
    rel, mine = imported_once(a, b, monkeypatch)
    write(a.settings.source, rel, line(S1, a.cwd("app"), 1), mode="ab")
    a.sync(monkeypatch)
    typed = line(S1, b.cwd("app"), 0, "typed here").replace(b"-000000", b"-typed0")
    write(b.settings.source, mine.relative_to(b.settings.source), typed, mode="ab")
    b.now = mine.stat().st_mtime + 10  # written here 10 s ago
    b.poll(monkeypatch)
    assert mine.read_bytes() == line(S1, b.cwd("app"), 0) + typed
    assert b.cursor("desk")["waiting"] == [S1]
    b.now += 60
    b.poll(monkeypatch)
    assert mine.read_bytes() == line(S1, b.cwd("app"), 0) + typed + line(S1, b.cwd("app"), 1)
    assert b.cursor("desk")["waiting"] == []


def test_a_followed_machine_s_lag_is_the_wait_of_its_oldest_change_not_here(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = two
    b.settings = b.settings.model_copy(update={"follow_quiet": 60.0})
    rel, mine = imported_once(a, b, monkeypatch)
    row = status(b.settings)["following"][0]
    assert row["lag_seconds"] == 0.0 and row["behind_since"] is None
    assert "following:    desk: up to date as of " in format_status(
        status(b.settings), now=b.now + 5)
    # Two flushes of desk wait here, held until the laptop's copy is quiet: the lag runs
    # from the first of them.
    flushed = []
    for n in (1, 2):
        write(a.settings.source, rel, line(S1, a.cwd("app"), n), mode="ab")
        a.sync(monkeypatch)
        flushed.append(read_index(LocalStore(a.store_dir), layout.segment_key("desk", n)).time)
    typed = line(S1, b.cwd("app"), 0, "typed here").replace(b"-000000", b"-typed0")
    write(b.settings.source, mine.relative_to(b.settings.source), typed, mode="ab")
    b.now = mine.stat().st_mtime + 10
    b.poll(monkeypatch)
    assert b.cursor("desk")["waiting"] == [S1]
    shown = status(b.settings)
    row = shown["following"][0]
    assert row["behind_since"] == flushed[0] and row["seq"] == 2, row
    assert row["lag_seconds"] > 0 and "since" not in row
    assert "following:    desk: 5m behind, " in format_status(shown, now=flushed[0] + 300)
    b.now += 60
    b.poll(monkeypatch)
    row = status(b.settings)["following"][0]
    assert row["waiting"] == [] and row["behind_since"] is None and row["lag_seconds"] == 0.0


def test_a_session_held_open_here_is_left_until_closed(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc")
    a, b = two
    rel, mine = imported_once(a, b, monkeypatch)
    write(a.settings.source, rel, line(S1, a.cwd("app"), 1), mode="ab")
    a.sync(monkeypatch)
    with open(mine, "ab"):
        b.poll(monkeypatch)
        assert mine.read_bytes() == line(S1, b.cwd("app"), 0)
    b.poll(monkeypatch)
    assert mine.read_bytes() == line(S1, b.cwd("app"), 0) + line(S1, b.cwd("app"), 1)


def test_both_continuing_at_once_keeps_both_branches_on_both_machines(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    a, b = two
    rel, mine = imported_once(a, b, monkeypatch)
    b.sync(monkeypatch)
    write(a.settings.source, rel, line(S1, a.cwd("app"), 1, "desk's branch"), mode="ab")
    wire = json.loads(line(S1, b.cwd("app"), 2, "laptop's branch"))
    wire["uuid"] = "laptop-branch-1"
    write(b.settings.source, mine.relative_to(b.settings.source),
          json.dumps(wire, separators=(",", ":")).encode() + b"\n", mode="ab")
    a.sync(monkeypatch)
    b.sync(monkeypatch)
    b.poll(monkeypatch)
    a.poll(monkeypatch)

    def uuids(m: Machine) -> set[str]:
        found = set()
        conflicts = m.settings.state_dir / "conflicts"
        for p in [m.transcript("app", S1), *conflicts.rglob("*")]:
            if p.is_file():
                found |= {json.loads(x)["uuid"] for x in p.read_bytes().splitlines() if x}
        return found

    want = {f"{S1[:8]}-000000", f"{S1[:8]}-000001", "laptop-branch-1"}
    assert uuids(a) == want and uuids(b) == want
    # The laptop's backup alone gives its tree back byte for byte.
    b.sync(monkeypatch)
    out = tmp_path / "restored"
    restore(Repository(LocalStore(b.store_dir), "laptop"),
            RestoreOptions(target=out, local_home=str(b.home)))
    assert tree_bytes(out) == tree_bytes(b.settings.source)


def test_segments_compacted_before_they_were_read_are_caught_from_the_head(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = two
    a.settings = a.settings.model_copy(update={"head_interval": 0.0})
    rel, _ = imported_once(a, b, monkeypatch)
    write(a.settings.source, rel, line(S1, a.cwd("app"), 1), mode="ab")
    a.sync(monkeypatch)
    # Its segment is folded by a compaction before the laptop read it; the head says how
    # far the desk is.
    store = LocalStore(b.store_dir)
    compact(Repository(store, "desk"))
    assert store.head(layout.segment_key("desk", 1)) is None
    for _ in range(HEAD_EVERY):
        b.poll(monkeypatch)
    assert b.transcript("app", S1).read_bytes() == line(S1, b.cwd("app"), 0) + line(
        S1, b.cwd("app"), 1)
    assert b.cursor("desk")["seq"] == 1


def test_the_daemon_imports_on_its_own(two: tuple[Machine, Machine],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = two
    rel = a.transcript("app", S1).relative_to(a.settings.source)
    write(a.settings.source, rel, line(S1, a.cwd("app"), 0))
    a.sync(monkeypatch)
    monkeypatch.setenv("HOME", str(b.home))
    s = b.settings.model_copy(update={"follow_interval": 1.0, "flush_quiet": 0.2})
    with running(s):
        wait_for(lambda: b.transcript("app", S1).exists(), what="the import")
        write(a.settings.source, rel, line(S1, a.cwd("app"), 1), mode="ab")
        monkeypatch.setenv("HOME", str(a.home))
        sync_once(a.settings)
        monkeypatch.setenv("HOME", str(b.home))
        want = line(S1, b.cwd("app"), 0) + line(S1, b.cwd("app"), 1)
        wait_for(lambda: b.transcript("app", S1).read_bytes() == want, what="the append")
        wait_for(lambda: extents_of(b, b.transcript("app", S1))[-1][2] == len(want),
                 what="the laptop's flush")
    assert {r for *_, r in extents_of(b, b.transcript("app", S1))} == {imported_from("desk")}


@pytest.mark.parametrize(("path", "sid"), [
    (f"projects/-x/{S1}.jsonl", S1),
    (f"projects/-x/{S1}/subagents/agent-1.jsonl", S1),
    (f"projects/-x/{S1}/tool-results/t.txt", S1),
    (f"projects/-x/{S1}", None),
    (f"projects/-x/{S1}.json", None),
    ("projects/-x/not-a-session.jsonl", None),
    (f"todos/{S1}-agent.json", None),
    ("history.jsonl", None),
])
def test_the_session_a_path_belongs_to(path: str, sid: str | None) -> None:
    assert session_of_any(path.encode()) == sid


def test_status_and_sessions_say_what_was_imported_and_what_is_behind(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = two
    a.settings = a.settings.model_copy(update={"head_interval": 0.0})
    rel, _ = imported_once(a, b, monkeypatch)
    shown = status(b.settings)
    assert [(f["machine"], f["seq"], f["imported"], f["sessions"], f["waiting"])
            for f in shown["following"]] == [("desk", 0, 1, 1, [])]
    text = format_status(shown)
    assert "following:    desk: up to date as of " in text and "ago), last import " in text
    # Imported again as desk writes it: one session here, two imports.
    write(a.settings.source, rel, line(S1, a.cwd("app"), 9), mode="ab")
    a.sync(monkeypatch)
    b.poll(monkeypatch)
    row = status(b.settings)["following"][0]
    assert (row["imported"], row["sessions"]) == (2, 1)
    assert "1 of its sessions here (2 imports)" in format_status(status(b.settings))
    repo = Repository(LocalStore(b.store_dir), "laptop")

    def marks() -> dict[str, str]:
        rows = session_rows(repo, here(b.settings.source, imported_copies(b.settings)))
        return {r["machine"]: r["here"] for r in rows if r["session_id"] == S1}

    assert marks() == {"desk": "imported"}
    write(a.settings.source, rel, line(S1, a.cwd("app"), 10), mode="ab")
    a.sync(monkeypatch)
    assert marks() == {"desk": "behind"}
    b.poll(monkeypatch)
    assert marks() == {"desk": "imported"}


def test_a_machine_that_keeps_failing_is_tried_less_and_less_often(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = two
    rel, _ = imported_once(a, b, monkeypatch)
    write(a.settings.source, rel, line(S1, a.cwd("app"), 1), mode="ab")
    a.sync(monkeypatch)

    class ListsFail(CountingStore):
        def list(self, prefix: str, start_after: str = "") -> Iterator[ObjectInfo]:
            self._request("list")
            raise TransientError("the store is down")

    counting = ListsFail(LocalStore(b.store_dir))
    for f in b.follower(monkeypatch, counting):  # type: ignore[arg-type]
        tried = []
        for _ in range(16):
            before = counting.counts.total()
            f.poll()
            tried.append(counting.counts.total() > before)
        assert "the store is down" in (f.cursors["desk"].problem or "")
    # Polls 0, 1, 3, 7, 15: after 1, 2, 4, 8 polls.
    assert [n for n, t in enumerate(tried) if t] == [0, 1, 3, 7, 15]
    b.poll(monkeypatch)  # back: the append arrives
    assert b.transcript("app", S1).read_bytes().count(b"\n") == 2


def test_a_file_as_the_last_import_left_it_is_not_a_local_write(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    # An import gives the file the other machine's mtime: a session the desk is writing
    # right now keeps arriving, since nothing wrote to it here.
    a, b = two
    b.settings = b.settings.model_copy(update={"follow_quiet": 60.0})
    rel, mine = imported_once(a, b, monkeypatch)
    for i in (1, 2):
        write(a.settings.source, rel, line(S1, a.cwd("app"), i), mode="ab")
        a.sync(monkeypatch)
        b.now = mine.stat().st_mtime + 1
        b.poll(monkeypatch)
        assert mine.read_bytes().count(b"\n") == i + 1
    write(b.settings.source, mine.relative_to(b.settings.source),
          line(S1, b.cwd("app"), 7, "typed here"), mode="ab")
    write(a.settings.source, rel, line(S1, a.cwd("app"), 3), mode="ab")
    a.sync(monkeypatch)
    b.now = mine.stat().st_mtime + 1
    b.poll(monkeypatch)
    assert b.cursor("desk")["waiting"] == [S1]


def test_resume_of_a_session_follow_keeps_here_fetches_nothing(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = two
    rel, _ = imported_once(a, b, monkeypatch)
    for k in [k for k in os.environ if k.startswith("SYNCD_")]:
        monkeypatch.delenv(k)
    env = {"SYNCD_SOURCE": str(b.settings.source), "SYNCD_STORE": b.settings.store,
           "SYNCD_STATE_DIR": str(b.settings.state_dir), "SYNCD_MACHINE_ID": "laptop",
           "SYNCD_FOLLOW": '["desk"]', "SYNCD_CONFIG": os.devnull, "HOME": str(b.home)}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    (Path(b.cwd("app"))).mkdir(parents=True)
    reads: list[str] = []
    real_get = LocalStore.get

    def get(self: LocalStore, key: str, start: int = 0, length: int | None = None) -> bytes:
        reads.append(key)
        return real_get(self, key, start, length)

    monkeypatch.setattr(LocalStore, "get", get)
    r = CliRunner().invoke(cli, ["resume", S1[:8]], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert r.stdout.strip().endswith(f"cd {b.cwd('app')} && claude --resume {S1}")
    assert "is here already" in r.stderr
    assert reads == [layout.head_key("desk")]  # the head to find it, nothing else
    # Behind the desk's head: restored as before.
    write(a.settings.source, rel, line(S1, a.cwd("app"), 1), mode="ab")
    a.settings = a.settings.model_copy(update={"head_interval": 0.0})
    a.sync(monkeypatch)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    r = CliRunner().invoke(cli, ["resume", S1[:8]], catch_exceptions=False)
    assert r.exit_code == 0 and "is here already" not in r.stderr, r.output
    assert b.transcript("app", S1).read_bytes().count(b"\n") == 2


def test_a_busy_machines_segment_indexes_are_read_once(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = two
    rel = a.transcript("app", S1).relative_to(a.settings.source)
    write(a.settings.source, rel, line(S1, a.cwd("app"), 0))
    a.sync(monkeypatch)
    suffix_reads: list[str] = []

    class Reads(CountingStore):
        def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
            if start < 0:  # an index's suffix GET
                suffix_reads.append(key)
            return super().get(key, start, length)

    store = Reads(LocalStore(b.store_dir))
    for f in b.follower(monkeypatch, store):  # type: ignore[arg-type]
        for i in range(1, 5):
            write(a.settings.source, rel, line(S1, a.cwd("app"), i), mode="ab")
            a.sync(monkeypatch)
            monkeypatch.setenv("HOME", str(b.home))
            f.poll()
    segments = [k for k in suffix_reads if layout.segment_seq(k) is not None]
    assert sorted(segments) == sorted(set(segments)), segments  # none read twice
    assert len(set(segments)) == 5
    assert b.transcript("app", S1).read_bytes().count(b"\n") == 5


def test_a_line_appended_right_after_an_import_is_not_labelled_imported(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    # Claude continuing the session the moment it arrived: its line is this machine's.
    a, b = two
    real = follower_module.restore
    typed = line(S1, b.cwd("app"), 9, "typed at once").replace(b"-000009", b"-typed9")

    def restore_then_type(*args: object, **kw: object) -> RestoreReport:
        report = real(*args, **kw)  # type: ignore[arg-type]
        write(b.settings.source, b.transcript("app", S1).relative_to(b.settings.source),
              typed, mode="ab")
        return report

    monkeypatch.setattr(follower_module, "restore", restore_then_type)
    _, mine = imported_once(a, b, monkeypatch)
    assert mine.read_bytes() == line(S1, b.cwd("app"), 0) + typed
    b.sync(monkeypatch)
    base = len(line(S1, b.cwd("app"), 0))
    assert extents_of(b, mine) == [(1, 0, base, imported_from("desk")),
                                   (1, base, base + len(typed), None)]


def test_a_busy_session_is_fetched_only_past_what_the_last_import_brought(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    """A session the other machine keeps writing: each import fetches its new lines
    alone, not the transcript again nor its unchanged subagent."""
    a, b = two
    rel = a.transcript("app", S1).relative_to(a.settings.source)
    agent = rel.parent / S1 / "subagents" / "agent-1.jsonl"
    write(a.settings.source, rel, line(S1, a.cwd("app"), 0) + line(S1, a.cwd("app"), 1))
    write(a.settings.source, agent, line(S1, a.cwd("app"), 5, "the agent's"))
    a.sync(monkeypatch)
    b.poll(monkeypatch)
    b.sync(monkeypatch)
    frames: list[str] = []

    class Reads(CountingStore):
        def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
            if start >= 0 and layout.segment_seq(key) is not None:
                frames.append(key)
            return super().get(key, start, length)

    for i in (2, 3):
        write(a.settings.source, rel, line(S1, a.cwd("app"), i), mode="ab")
        a.sync(monkeypatch)
        frames.clear()
        b.poll(monkeypatch, Reads(LocalStore(b.store_dir)))
        # The new segment's frame only (each segment holds one flush's appends).
        assert frames == [layout.segment_key("desk", i - 1)], frames
        assert b.transcript("app", S1).read_bytes() == b"".join(
            line(S1, b.cwd("app"), n) for n in range(i + 1))
    mine = b.settings.source / b.transcript("app", S1).relative_to(
        b.settings.source).parent / S1 / "subagents" / "agent-1.jsonl"
    assert mine.read_bytes() == line(S1, b.cwd("app"), 5, "the agent's")
    # Shipped as before: one generation continued, each new line once, marked desk's.
    b.sync(monkeypatch)
    theirs = b.transcript("app", S1)
    ext = extents_of(b, theirs)
    ends = [len(b"".join(line(S1, b.cwd("app"), n) for n in range(k))) for k in (2, 4)]
    assert [(g, s, e) for g, s, e, _ in ext] == [(1, 0, ends[0]), (1, ends[0], ends[1])]
    assert {r for *_, r in ext} == {imported_from("desk")}


def test_a_busy_machines_imports_list_nothing(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    """Its listings (and machine.json) are kept from the first look; the segments the
    polls HEAD are added to them: an import costs GETs, never a LIST."""
    a, b = two
    rel = a.transcript("app", S1).relative_to(a.settings.source)
    write(a.settings.source, rel, line(S1, a.cwd("app"), 0))
    a.sync(monkeypatch)
    store = CountingStore(LocalStore(b.store_dir))
    for f in b.follower(monkeypatch, store):  # type: ignore[arg-type]
        f.poll()
        assert store.counts.by_kind()["LIST"] > 0  # the first look lists
        store.counts.calls.clear()
        for i in range(1, 4):
            write(a.settings.source, rel, line(S1, a.cwd("app"), i), mode="ab")
            a.sync(monkeypatch)
            monkeypatch.setenv("HOME", str(b.home))
            f.poll()
    assert store.counts.by_kind()["LIST"] == 0, store.counts.calls
    assert "get_small" not in store.counts.calls  # machine.json once
    assert b.transcript("app", S1).read_bytes() == b"".join(
        line(S1, b.cwd("app"), n) for n in range(4))


def test_objects_compacted_after_the_listing_was_kept_are_listed_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """desk compacts between the laptop's view (from its kept listing) and its read of a
    frame: the frame is gone, the import lists again and brings the lines from the
    snapshot, in the same poll."""
    a = Machine(tmp_path, "desk", "/home/alice", head_interval=0.0)
    b = Machine(tmp_path, "laptop", "/users/bob", follow=["desk"])
    rel = a.transcript("app", S1).relative_to(a.settings.source)
    write(a.settings.source, rel, line(S1, a.cwd("app"), 0))
    a.sync(monkeypatch)
    frame_of = layout.segment_key("desk", 1)
    raced: list[str] = []

    class CompactsAtFrame(CountingStore):
        def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
            if key == frame_of and start >= 0 and not raced:
                raced.append(key)
                monkeypatch.setenv("HOME", str(a.home))
                compact(Repository(LocalStore(b.store_dir), "desk"))
                monkeypatch.setenv("HOME", str(b.home))
            return super().get(key, start, length)

    store = CompactsAtFrame(LocalStore(b.store_dir))
    for f in b.follower(monkeypatch, store):  # type: ignore[arg-type]
        f.poll()
        write(a.settings.source, rel, line(S1, a.cwd("app"), 1), mode="ab")
        a.sync(monkeypatch)
        monkeypatch.setenv("HOME", str(b.home))
        f.poll()
        assert raced and f.cursors["desk"].retry == []
    assert LocalStore(b.store_dir).head(frame_of) is None
    assert b.transcript("app", S1).read_bytes() == line(S1, b.cwd("app"), 0) + line(
        S1, b.cwd("app"), 1)


def test_follow_all_follows_at_most_so_many_machines(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """"*" in a team's bucket of thousands: each machine followed costs a HEAD a poll, so
    at most FOLLOW_ALL_MAX are (those named first, then those backed up last), and the
    rest is said once."""
    monkeypatch.setattr(follower_module, "FOLLOW_ALL_MAX", 3)
    others = [Machine(tmp_path, f"m{i}", f"/home/u{i}") for i in range(5)]
    for m in others:
        rel = m.transcript("app", S1).relative_to(m.settings.source)
        write(m.settings.source, rel, line(S1, m.cwd("app"), 0))
        m.sync(monkeypatch)
    me = Machine(tmp_path, "laptop", "/users/bob", follow=["*", "m4"])
    for f in me.follower(monkeypatch):
        assert f.machines() == ["m2", "m3", "m4"]  # m3, then m2, backed up last
        f._polls += 1
        assert f.machines() == ["m2", "m3", "m4"]  # listed again only every so often
        f._polls = follower_module.MACHINES_EVERY
        assert f.machines() == ["m2", "m3", "m4"]
    said = [r.getMessage() for r in caplog.records if "only 3 are followed" in r.getMessage()]
    assert said == ['following "*": the store holds 5 other machines; only 3 are followed, '
                    "those backed up last (name them in follow to choose; syncd status "
                    "lists the others)"]


def test_a_conflict_labels_none_of_this_machines_own_lines(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    """Both wrote the session, this machine's line the newer and not shipped yet when the
    import keeps it (a conflict copy of desk's): that line ships as this machine's own,
    and desk imports it."""
    a, b = two
    rel, mine = imported_once(a, b, monkeypatch)
    b.sync(monkeypatch)
    write(a.settings.source, rel, line(S1, a.cwd("app"), 1, "desk's"), mode="ab")
    a.sync(monkeypatch)
    ours = line(S1, b.cwd("app"), 2, "laptop's").replace(b"-000002", b"-laptop2")
    write(b.settings.source, mine.relative_to(b.settings.source), ours, mode="ab")
    b.poll(monkeypatch)  # diverged, the laptop's newer: kept, desk's saved aside
    assert mine.read_bytes() == line(S1, b.cwd("app"), 0) + ours
    assert b.cursor("desk")["conflicts"]
    b.sync(monkeypatch)
    size = len(line(S1, b.cwd("app"), 0))
    assert extents_of(b, mine)[-1] == (1, size, size + len(ours), None)
    a.poll(monkeypatch)
    assert ours.replace(b.cwd("app").encode(), a.cwd("app").encode()) in \
        a.settings.source.joinpath(rel).read_bytes() or any(
        b"laptop2" in p.read_bytes() for p in (a.settings.state_dir / "conflicts").rglob("*")
        if p.is_file())


def test_a_merge_labels_none_of_this_machines_unshipped_lines(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    """Both wrote the session, desk's line the newer: the import merges it after the
    laptop's own line, not shipped yet. That line ships as the laptop's own, and desk
    (which looked at the laptop before) gets it."""
    a, b = two
    rel, mine = imported_once(a, b, monkeypatch)
    b.sync(monkeypatch)
    a.poll(monkeypatch)
    ours = line(S1, b.cwd("app"), 1, "laptop's").replace(b"-000001", b"-laptop1")
    write(b.settings.source, mine.relative_to(b.settings.source), ours, mode="ab")
    write(a.settings.source, rel, line(S1, a.cwd("app"), 2, "desk's"), mode="ab")
    a.sync(monkeypatch)
    b.poll(monkeypatch)  # diverged, desk's newer: merged after the laptop's line
    base = len(line(S1, b.cwd("app"), 0))
    assert mine.read_bytes() == line(S1, b.cwd("app"), 0) + ours + line(
        S1, b.cwd("app"), 2, "desk's")
    b.sync(monkeypatch)
    assert extents_of(b, mine)[-1] == (1, base, mine.stat().st_size, None)
    a.poll(monkeypatch)
    assert b"laptop1" in a.settings.source.joinpath(rel).read_bytes() or any(
        b"laptop1" in p.read_bytes() for p in (a.settings.state_dir / "conflicts").rglob("*")
        if p.is_file())


def test_a_line_appended_right_after_an_empty_file_arrived_is_not_labelled_imported(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    """desk's subagent file was empty when it flushed; the laptop's Claude writes to its
    copy the moment the import made it: that line is the laptop's own, and desk gets it."""
    a, b = two
    rel = a.transcript("app", S1).relative_to(a.settings.source)
    agent = rel.parent / S1 / "subagents" / "agent-1.jsonl"
    write(a.settings.source, rel, line(S1, a.cwd("app"), 0))
    write(a.settings.source, agent, b"")
    a.sync(monkeypatch)
    a.poll(monkeypatch)  # desk has looked at the laptop: what comes next is new
    mine = b.settings.source / b.transcript("app", S1).relative_to(
        b.settings.source).parent / S1 / "subagents" / "agent-1.jsonl"
    typed = line(S1, b.cwd("app"), 1, "the laptop's agent").replace(b"-000001", b"-agent1")
    real = follower_module.restore

    def restore_then_type(*args: object, **kw: object) -> RestoreReport:
        report = real(*args, **kw)  # type: ignore[arg-type]
        write(b.settings.source, mine.relative_to(b.settings.source), typed, mode="ab")
        return report

    monkeypatch.setattr(follower_module, "restore", restore_then_type)
    b.poll(monkeypatch)
    monkeypatch.setattr(follower_module, "restore", real)
    assert mine.read_bytes() == typed
    b.sync(monkeypatch)
    assert [(s, e, r) for _, s, e, r in extents_of(b, mine)] == [
        (0, len(typed), "new file")]
    a.poll(monkeypatch)
    assert b"agent1" in a.settings.source.joinpath(agent).read_bytes()


def test_a_file_too_big_to_merge_in_memory_is_recorded_and_never_comes_back(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    """The laptop holds an older copy of desk's session (restored by hand) when it first
    looks at desk, the file too big to merge in memory: the fast-forward is recorded as an
    import, its bytes ship as desk's, and desk does not fetch them back."""
    from syncd.restore import place

    monkeypatch.setattr(place, "MERGE_MAX", 2)
    a, b = two
    rel = a.transcript("app", S1).relative_to(a.settings.source)
    write(a.settings.source, rel, line(S1, a.cwd("app"), 0) + line(S1, a.cwd("app"), 1))
    a.sync(monkeypatch)
    a.poll(monkeypatch)
    mine = b.transcript("app", S1)
    write(b.settings.source, mine.relative_to(b.settings.source), line(S1, b.cwd("app"), 0))
    # Restored from desk (``syncd resume`` records where it came from), never shipped.
    state = State(b.settings.state_file)
    try:
        state.record_origins([OriginRecord(S1, "desk", os.fsencode(rel), (), 0.0)])
    finally:
        state.close()
    seen: list[tuple[str, str, str]] = []

    def told(*args: object, **kw: object) -> RestoreReport:
        report = restore(*args, **kw)  # type: ignore[arg-type]
        seen.extend((x.action, x.path, x.source) for x in report.actions)
        return report

    monkeypatch.setattr(follower_module, "restore", told)
    b.poll(monkeypatch)
    assert seen == [("fast-forward", os.fsdecode(mine.relative_to(b.settings.source)),
                     os.fsdecode(rel))]
    assert mine.read_bytes() == line(S1, b.cwd("app"), 0) + line(S1, b.cwd("app"), 1)
    assert b.cursor("desk")["retry"] == []
    b.sync(monkeypatch)
    assert {r for *_, r in extents_of(b, mine)} == {imported_from("desk")}
    a.poll(monkeypatch)
    assert a.cursor("laptop")["imported"] == 0


def read_only(monkeypatch: pytest.MonkeyPatch, tree: Path) -> Any:
    """``os.access`` answers for ``tree`` as on a read-only mount (root ignores modes; a
    real read-only mount is in tests/test_follow_e2e.py); returns the real one."""
    top, real = os.fsencode(tree), os.access

    def access(path: Any, mode: int, **kw: Any) -> bool:
        p = os.fsencode(path)
        if mode & os.W_OK and (p == top or p.startswith(top + b"/")):
            return False
        return real(path, mode, **kw)

    monkeypatch.setattr(os, "access", access)
    return real


def test_a_tree_that_cannot_be_written_is_a_problem_and_its_sessions_come_once_it_can(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a service whose sandbox leaves the Claude tree read-only: nothing is written,
    ``status`` says so with what waits, and everything arrives once the tree can be
    written, whether or not it changes again on the other machine."""
    a, b = two
    rel, mine = imported_once(a, b, monkeypatch)
    write(a.settings.source, rel, line(S1, a.cwd("app"), 1), mode="ab")
    rel2 = a.transcript("lib", S2).relative_to(a.settings.source)
    write(a.settings.source, rel2, line(S2, a.cwd("lib"), 0))
    a.settings = a.settings.model_copy(update={"head_interval": 0.0})
    a.sync(monkeypatch)
    real = read_only(monkeypatch, b.settings.source)
    for f in b.follower(monkeypatch):
        for _ in range(3):
            f.poll()
        assert mine.read_bytes() == line(S1, b.cwd("app"), 0)
        assert not b.transcript("lib", S2).exists()
        s = status(b.settings)
        [row] = s["following"]
        assert "not writable" in row["problem"] and "2 sessions waiting" in row["problem"]
        [health] = [h for h in format_status(s).splitlines() if h.startswith("health:")]
        assert "following desk: the Claude tree" in health and "not writable" in health
        monkeypatch.setattr(os, "access", real)
        f.poll()  # nothing changed on desk since
        assert mine.read_bytes() == line(S1, b.cwd("app"), 0) + line(S1, b.cwd("app"), 1)
        assert b.transcript("lib", S2).read_bytes() == line(S2, b.cwd("lib"), 0)
        assert f.cursors["desk"].problem is None and f.cursors["desk"].missing == 0


def test_a_first_look_at_a_tree_that_cannot_be_written_waits_for_it(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = two
    write(a.settings.source, a.transcript("app", S1).relative_to(a.settings.source),
          line(S1, a.cwd("app"), 0))
    a.sync(monkeypatch)
    b.settings.source.mkdir(parents=True)
    real = read_only(monkeypatch, b.settings.source)
    b.poll(monkeypatch)
    assert "not writable" in str(b.cursor("desk")["problem"])
    assert b.cursor("desk")["seq"] is None
    assert not (b.settings.source / "projects").exists()
    monkeypatch.setattr(os, "access", real)
    b.poll(monkeypatch)
    assert b.transcript("app", S1).read_bytes() == line(S1, b.cwd("app"), 0)


def test_every_session_its_head_lists_arrives_and_status_counts_what_is_missing(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    """A session the segments never brought (its import interrupted: no record, no file)
    arrives from the head's list at the next start, without changing there; until then
    ``status`` counts it, and 0 means every session of the head is here."""
    a, b = two
    a.settings = a.settings.model_copy(update={"head_interval": 0.0})
    imported_once(a, b, monkeypatch)
    rel2 = a.transcript("lib", S2).relative_to(a.settings.source)
    write(a.settings.source, rel2, line(S2, a.cwd("lib"), 0))
    a.sync(monkeypatch)
    b.poll(monkeypatch)
    assert b.cursor("desk")["missing"] == 0
    # The import of S2 as if killed before it wrote anything.
    b.transcript("lib", S2).unlink()
    state = State(b.settings.state_file)
    try:
        state._db.execute("DELETE FROM imported WHERE src_path = ?", (os.fsencode(rel2),))
        state._db.commit()
        state.set_meta(follow=json.dumps({"desk": {**b.cursor("desk"), "missing": 1}}))
    finally:
        state.close()
    assert "1 of its head's sessions missing or behind here" in format_status(
        status(b.settings))
    b.poll(monkeypatch)  # a start: reconciled with desk's head at once
    assert b.transcript("lib", S2).read_bytes() == line(S2, b.cwd("lib"), 0)
    assert b.cursor("desk")["missing"] == 0
    assert "0 of its head's sessions missing" in format_status(status(b.settings))


def test_a_first_look_that_finds_everything_here_is_the_last_import(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    """The start-up import (the first look) shows as the last import in ``status``, also
    when every session it brought was here already (restored before follow was set)."""
    a, b = two
    rel = a.transcript("app", S1).relative_to(a.settings.source)
    write(a.settings.source, rel, line(S1, a.cwd("app"), 0))
    a.sync(monkeypatch)
    write(b.settings.source, b.transcript("app", S1).relative_to(b.settings.source),
          line(S1, b.cwd("app"), 0))
    b.poll(monkeypatch)
    row = status(b.settings)["following"][0]
    assert row["seq"] == 0 and row["last_import"] == b.now, row
    assert "last import never" not in format_status(status(b.settings), now=b.now)


class DataReads(LocalStore):
    """Counts the reads of ``machine``'s data (frames: not an index, not its head)."""

    def __init__(self, root: Path, machine: str) -> None:
        super().__init__(root)
        self.prefix = layout.machine_prefix(machine)
        self.reads: list[str] = []

    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        if key.startswith(self.prefix) and start >= 0 and key != layout.head_key(
                self.prefix.split("/")[1]):
            self.reads.append(key)
        return super().get(key, start, length)


def test_a_followed_machines_copy_of_this_machines_session_is_not_fetched_to_reconcile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """desk writes its session, the laptop follows it (its copy grows with desk's lines,
    echoed in the laptop's backup and head): desk's reconciliations with the laptop's head
    fetch none of it, however often it grows, and never bring back a session desk's own
    Claude deleted (its cleanup)."""
    a = Machine(tmp_path, "desk", "/home/alice", follow=["laptop"])
    b = Machine(tmp_path, "laptop", "/users/bob", follow=["desk"], head_interval=0.0)
    rel = a.transcript("app", S1).relative_to(a.settings.source)
    reads = DataReads(a.store_dir, "laptop")
    for f in a.follower(monkeypatch, reads):
        for i in range(4):
            write(a.settings.source, rel, line(S1, a.cwd("app"), i), mode="ab")
            a.sync(monkeypatch)
            b.poll(monkeypatch)
            b.sync(monkeypatch)  # its copy, as imported from desk, in its head too
            monkeypatch.setenv("HOME", str(a.home))
            for _ in range(HEAD_EVERY + 1):
                f.poll()
            if i == 0:
                # The first look compares every session the laptop holds (it may have
                # gone on with one of them): that one time, desk's too.
                assert reads.reads, "the first look read nothing"
                reads.reads.clear()
        assert reads.reads == [], reads.reads
        assert f.cursors["laptop"].missing == 0
        # Claude's cleanup deletes it on desk: the laptop's copy does not come back.
        (a.settings.source / rel).unlink()
        a.sync(monkeypatch)
        monkeypatch.setenv("HOME", str(a.home))
        for _ in range(HEAD_EVERY + 1):
            f.poll()
    assert not (a.settings.source / rel).exists() and reads.reads == []


def test_a_cut_there_reaches_a_copy_as_the_last_import_left_it(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    """desk withdraws its last rows (a cut: a new generation) and writes others: the
    laptop's copy, untouched since the import, becomes desk's as it is now, without the
    withdrawn rows; a copy the laptop wrote to since keeps its own lines (a merge)."""
    a, b = two
    rel, theirs = imported_once(a, b, monkeypatch)
    write(a.settings.source, rel, b"".join(line(S1, a.cwd("app"), i) for i in range(1, 6)),
          mode="ab")
    a.sync(monkeypatch)
    b.poll(monkeypatch)
    b.sync(monkeypatch)
    full = a.settings.source / rel
    keep = full.read_bytes()[: full.read_bytes().index(line(S1, a.cwd("app"), 4))]
    full.write_bytes(keep + line(S1, a.cwd("app"), 9))
    a.sync(monkeypatch)
    b.poll(monkeypatch)
    want = (keep + line(S1, a.cwd("app"), 9)).replace(a.cwd("app").encode(),
                                                       b.cwd("app").encode())
    assert theirs.read_bytes() == want
    # Written to here, then cut there again: the laptop's line stays.
    b.sync(monkeypatch)
    write(b.settings.source, theirs.relative_to(b.settings.source),
          line(S1, b.cwd("app"), 20), mode="ab")
    b.now += 60
    full.write_bytes(keep + line(S1, a.cwd("app"), 10))
    a.sync(monkeypatch)
    b.poll(monkeypatch)
    assert line(S1, b.cwd("app"), 20) in theirs.read_bytes()


def test_resume_of_an_imported_session_the_laptop_backed_up_too(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    # The laptop's daemon ships what follow imported into its own backup: the session is
    # in two machines' backups, the laptop's copy of it the desk's (its origin). `resume
    # ID` takes the desk's, as with the laptop's backup not written yet, never "pick one".
    a, b = two
    imported_once(a, b, monkeypatch)
    b.sync(monkeypatch)
    for k in [k for k in os.environ if k.startswith("SYNCD_")]:
        monkeypatch.delenv(k)
    env = {"SYNCD_SOURCE": str(b.settings.source), "SYNCD_STORE": b.settings.store,
           "SYNCD_STATE_DIR": str(b.settings.state_dir), "SYNCD_MACHINE_ID": "laptop",
           "SYNCD_FOLLOW": '["desk"]', "SYNCD_CONFIG": os.devnull, "HOME": str(b.home)}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    (Path(b.cwd("app"))).mkdir(parents=True)
    listed = CliRunner().invoke(cli, ["sessions", "--wide"], catch_exceptions=False)
    assert {ln.split()[4] for ln in listed.stdout.splitlines() if S1 in ln} == {
        "desk", "laptop"}, listed.output
    r = CliRunner().invoke(cli, ["resume", S1[:8]], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert r.stdout.strip().endswith(f"cd {b.cwd('app')} && claude --resume {S1}")
    assert "is here already" in r.stderr
    # On the desk, the session is its own: resumed from its backup, not the laptop's.
    monkeypatch.setenv("SYNCD_MACHINE_ID", "desk")
    monkeypatch.setenv("SYNCD_SOURCE", str(a.settings.source))
    monkeypatch.setenv("SYNCD_STATE_DIR", str(a.settings.state_dir))
    monkeypatch.setenv("SYNCD_FOLLOW", "[]")
    monkeypatch.setenv("HOME", str(a.home))
    Path(a.cwd("app")).mkdir(parents=True, exist_ok=True)
    r = CliRunner().invoke(cli, ["resume", S1[:8]], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert r.stdout.strip().endswith(f"cd {a.cwd('app')} && claude --resume {S1}")
    assert "restored from desk" in r.stdout, r.output


def _cli_as(m: Machine, monkeypatch: pytest.MonkeyPatch, *args: str) -> Any:
    """``syncd ARGS`` run as machine ``m`` (its tree, state and store), following nobody."""
    for k in [k for k in os.environ if k.startswith("SYNCD_")]:
        monkeypatch.delenv(k)
    env = {"SYNCD_SOURCE": str(m.settings.source), "SYNCD_STORE": m.settings.store,
           "SYNCD_STATE_DIR": str(m.settings.state_dir), "SYNCD_MACHINE_ID": m.name,
           "SYNCD_FOLLOW": "[]", "SYNCD_CONFIG": os.devnull, "HOME": str(m.home)}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_a_session_deleted_here_that_another_machine_resumed_comes_back_only_with_its_lines(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    # The laptop follows the desk; its own session is deleted here, and the desk resumes
    # it from the laptop's backup. The desk's copy holds only the laptop's lines: it is
    # no session of the desk's, and never recreates the one deleted here. Lines the desk
    # writes in it afterwards are a continuation, which arrives like any other.
    a, b = two
    local = b.transcript("app", S1)
    rel = local.relative_to(b.settings.source)
    write(b.settings.source, rel, line(S1, b.cwd("app"), 0) + line(S1, b.cwd("app"), 1))
    b.sync(monkeypatch)
    b.poll(monkeypatch)  # the first look at the desk: nothing there yet
    local.unlink()
    b.sync(monkeypatch)  # the deletion shipped
    Path(a.cwd("app")).mkdir(parents=True, exist_ok=True)
    r = _cli_as(a, monkeypatch, "resume", S1[:8], "--machine", "laptop")
    assert r.exit_code == 0, r.output
    desk = a.transcript("app", S1)
    assert desk.read_bytes().count(b"\n") == 2
    a.sync(monkeypatch)
    assert all(x[3] == imported_from("laptop") for x in extents_of(a, desk))
    b.poll(monkeypatch)
    assert not local.exists()
    b.now += 3600
    for f in b.follower(monkeypatch):  # reconciled with the desk's head too
        for _ in range(HEAD_EVERY + 1):
            f.poll()
    assert not local.exists()
    # The desk goes on with it: its line arrives, with the session it continues.
    write(a.settings.source, desk.relative_to(a.settings.source),
          line(S1, a.cwd("app"), 2), mode="ab")
    a.sync(monkeypatch)
    b.poll(monkeypatch)
    assert local.read_bytes() == line(S1, b.cwd("app"), 0) + line(S1, b.cwd("app"), 1) + \
        line(S1, b.cwd("app"), 2)

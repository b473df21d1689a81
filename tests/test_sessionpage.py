"""The session pages' logic, without a server: which machine and session a request may
name, a session's points in time, the restore's plan then its confirmed run (one at a
time), the resume line; conflict copies listed and kept either way."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from syncd.backup.engine import sync_once
from syncd.claude import project_folder
from syncd.config import Settings, load_settings
from syncd.errors import RestoreBusy, RestoreError
from syncd.repository import Repository
from syncd.store import LocalStore
from syncd.web.conflictcopy import fingerprint, keep_copy, keep_local, line_diff, list_copies
from syncd.web.sessionpage import SessionDesk
from tests.helpers import write
from tests.hostile import line

S1 = "0a0eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
S2 = "1b1eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"


def settings_of(tmp: Path, name: str, home: str, **kw: object) -> Settings:
    base: dict[str, object] = dict(source=tmp / home.strip("/") / ".claude",
                                   store=(tmp / "store").as_uri(),
                                   state_dir=tmp / name / "state", machine_id=name,
                                   follow_quiet=0)
    base.update(kw)
    return load_settings(config_file=tmp / "none.toml", **base)


def desk_of(s: Settings, calls: list[str | None] | None = None) -> SessionDesk:
    repo = Repository(LocalStore(Path(s.store.removeprefix("file://"))), s.machine_id)

    def repository(machine: str | None) -> Repository:
        if calls is not None:
            calls.append(machine)
        return repo if machine is None else repo.for_machine(machine)

    return SessionDesk(s, repository)


@pytest.fixture
def laptop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Machine "laptop" backed up S1 in two flushes, S2 in a third between them."""
    s = settings_of(tmp_path, "laptop", "/users/bob")
    monkeypatch.setenv("HOME", str(tmp_path / "users/bob"))
    bob = _app(s)
    rel = f"projects/{project_folder(bob)}/{S1}.jsonl"
    write(s.source, rel, line(S1, bob, 0, "the first prompt"))
    sync_once(s)
    write(s.source, f"projects/{project_folder(bob)}/{S2}.jsonl", line(S2, bob, 0))
    sync_once(s)
    write(s.source, rel, line(S1, bob, 1, "the second prompt"), "ab")
    sync_once(s)
    monkeypatch.setenv("HOME", str(tmp_path / "home/alice"))
    return s


@pytest.fixture
def desk(tmp_path: Path, laptop: Settings) -> Settings:
    return settings_of(tmp_path, "desk", "/home/alice")


def test_only_a_listed_machine_and_a_session_id_are_known(desk: Settings) -> None:
    calls: list[str | None] = []
    d = desk_of(desk, calls)
    assert not d.known("laptop", "../../etc/passwd")
    assert not d.known("laptop", S1[:8])
    assert calls == []  # a bad session id never reaches the store
    assert d.known("desk", S1)  # this machine, before the store is read
    assert calls == []
    assert d.known("laptop", S1)
    assert not d.known("nobody", S1)
    assert not d.known("laptop/../desk", S1)
    assert calls == [None]  # the store's machines listed once, then reused


def test_the_points_are_those_where_the_session_changed(desk: Settings) -> None:
    d = desk_of(desk)
    points, problems = d.points("laptop", S1)
    assert problems == []
    assert len(points) == 2  # S2's flush is not one of S1's
    assert points[0].time >= points[1].time  # newest first
    assert all(S1 in p.sessions for p in points)
    assert [p.seq for p in d.points("laptop", S2)[0]] == [1]
    assert d.point("laptop", S1, 1) is None  # S2's point: not one of S1's
    assert d.point("laptop", S1, points[1].seq) == points[1]


def _app(s: Settings) -> str:
    return str(s.source.parent / "app")  # the remap's: bob's home → this HOME


def _transcript(s: Settings, sid: str) -> Path:
    return s.source / "projects" / project_folder(_app(s)) / f"{sid}.jsonl"


def test_the_plan_writes_nothing_and_the_confirm_restores(desk: Settings) -> None:
    d = desk_of(desk)
    plan = d.restore("laptop", S1, None, dry_run=True)
    assert [a.action for a in plan.actions if a.path.endswith(f"{S1}.jsonl")] == ["create"]
    assert not _transcript(desk, S1).exists()
    done = d.restore("laptop", S1, None, dry_run=False)
    assert done.errors == []
    data = _transcript(desk, S1).read_bytes()
    assert b"the second prompt" in data and _app(desk).encode() in data
    assert not _transcript(desk, S2).exists()  # only the session asked
    assert d.resume_line(S1, done) == f"cd {_app(desk)} && claude --resume {S1}"
    assert d.resume_line(S1) == f"cd {_app(desk)} && claude --resume {S1}"  # from the tree


def test_a_restore_as_of_a_point_restores_the_session_as_it_was(desk: Settings) -> None:
    d = desk_of(desk)
    oldest = d.points("laptop", S1)[0][-1]
    d.restore("laptop", S1, oldest.time, dry_run=False)
    data = _transcript(desk, S1).read_bytes()
    assert b"the first prompt" in data and b"the second prompt" not in data


def test_one_restore_at_a_time(desk: Settings) -> None:
    d = desk_of(desk)
    with d.restoring, pytest.raises(RestoreBusy):
        d.restore("laptop", S1, None, dry_run=True)
    d.restore("laptop", S1, None, dry_run=True)  # free again


def test_a_transcript_being_written_here_is_left_alone(tmp_path: Path, laptop: Settings
                                                       ) -> None:
    s = settings_of(tmp_path, "desk", "/home/alice", follow_quiet=600)
    d = desk_of(s)
    d.restore("laptop", S1, d.points("laptop", S1)[0][-1].time, dry_run=False)
    mine = _transcript(s, S1)
    # Written just now: a running Claude appends a line. (A touch alone is not a write:
    # the file is still exactly what the restore wrote, recorded as imported.)
    with mine.open("ab") as f:
        f.write(mine.read_bytes().splitlines(keepends=True)[-1])
    before = mine.read_bytes()
    report = d.restore("laptop", S1, None, dry_run=False)
    assert [a.action for a in report.actions if a.path.endswith(f"{S1}.jsonl")] == ["wait"]
    assert mine.read_bytes() == before


def test_the_size_is_the_local_file_or_the_head(desk: Settings, laptop: Settings) -> None:
    d = desk_of(desk)
    assert d.size("desk", S1) is None
    there = (laptop.source / "projects" / project_folder(_app(laptop)) / f"{S1}.jsonl"
             ).stat().st_size
    assert d.size("laptop", S1) == there
    d.restore("laptop", S1, None, dry_run=False)
    assert d.size("desk", S1) == _transcript(desk, S1).stat().st_size


# -- conflict copies ---------------------------------------------------------------------

REL = f"projects/-home-alice-app/{S1}.jsonl"


def _copy(s: Settings, data: bytes, second: str = "20261201T101010",
          machine: str = "laptop", rel: str = REL) -> Path:
    return write(s.state_dir / "conflicts" / machine / second, rel, data)


def _old(path: Path) -> None:
    t = time.time() - 3600
    os.utime(path, (t, t))


def test_conflict_copies_are_listed_from_the_folder_only(desk: Settings, tmp_path: Path
                                                         ) -> None:
    _copy(desk, b"copy\n")
    _copy(desk, b"other\n", second="20261202T000000", rel="settings.json")
    base = desk.state_dir / "conflicts" / "laptop" / "20261201T101010"
    (base / "link.json").symlink_to(tmp_path / "secret")
    (desk.state_dir / "conflicts" / "laptop" / "notasecond").mkdir()
    write(desk.state_dir / "conflicts" / "laptop" / "notasecond", "x.json", b"x")
    copies = list_copies(desk)
    assert [(c.index, c.rel, c.machine) for c in copies] == [
        (0, "settings.json", "laptop"), (1, REL, "laptop")]
    assert copies[1].transcript and not copies[0].transcript
    assert fingerprint(copies) != fingerprint(copies[1:])


def test_keep_the_local_file_removes_the_copy(desk: Settings) -> None:
    local = write(desk.source, REL, b"local\n")
    _copy(desk, b"copy\n")
    [c] = list_copies(desk)
    keep_local(c)
    assert local.read_bytes() == b"local\n"
    assert list_copies(desk) == []
    assert list(os.scandir(desk.state_dir / "conflicts" / "laptop")) == []  # folders too


def test_keep_the_copy_replaces_the_local_file_and_keeps_it(desk: Settings) -> None:
    local = write(desk.source, REL, b"local line\n")
    _old(local)
    _copy(desk, b"copy line\n")
    [c] = list_copies(desk)
    saved = keep_copy(desk, c)
    assert local.read_bytes() == b"copy line\n"
    assert saved is not None and Path(saved).read_bytes() == b"local line\n"
    [kept] = list_copies(desk)  # no byte lost: the local one is a copy now
    assert (kept.machine, kept.rel) == ("desk", REL)


def test_keep_the_copy_waits_for_a_file_being_written(tmp_path: Path, laptop: Settings
                                                      ) -> None:
    s = settings_of(tmp_path, "desk", "/home/alice", follow_quiet=600)
    local = write(s.source, REL, b"local line\n")  # written just now
    _copy(s, b"copy line\n")
    [c] = list_copies(s)
    with pytest.raises(RestoreError, match="left until quiet"):
        keep_copy(s, c)
    assert local.read_bytes() == b"local line\n"
    assert len(list_copies(s)) == 1


def test_keep_the_copy_where_there_is_no_local_file(desk: Settings) -> None:
    _copy(desk, b"copy line\n")
    [c] = list_copies(desk)
    assert keep_copy(desk, c) is None
    assert (desk.source / REL).read_bytes() == b"copy line\n"
    assert list_copies(desk) == []


def test_a_held_lock_keeps_concurrent_restores_apart(desk: Settings) -> None:
    d = desk_of(desk)
    started, release = threading.Event(), threading.Event()
    got: list[BaseException] = []

    def hold() -> None:
        with d.restoring:
            started.set()
            release.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    assert started.wait(30)
    try:
        d.restore("laptop", S1, None, dry_run=False)
    except RestoreBusy as e:
        got.append(e)
    release.set()
    t.join(30)
    assert len(got) == 1 and not _transcript(desk, S1).exists()


def test_the_line_diff_is_text_not_markup() -> None:
    diff = line_diff(b"a\n<b>\n", b"a\n<script>x</script>\n")
    assert ("-", "<b>") in diff and ("+", "<script>x</script>") in diff


@pytest.mark.parametrize("rel", [
    "settings.json", "CLAUDE.md", "commands/x.md", "projects/-x/memory/notes.md",
    "projects/-x/app/.claude/settings.local.json", ".credentials.json", "statsig/x.json"])
def test_keep_the_copy_never_writes_instructions_or_outside_the_include_set(
        desk: Settings, rel: str) -> None:
    local = write(desk.source, rel, b"local\n")
    _old(local)
    _copy(desk, b"from another machine\n", rel=rel)
    [c] = list_copies(desk)
    with pytest.raises(RestoreError, match=r"instructions|include set"):
        keep_copy(desk, c)
    assert local.read_bytes() == b"local\n"
    keep_local(c)  # the other way is always open: it writes nothing
    assert list_copies(desk) == []


def test_a_rendering_is_reused_for_the_same_version_only(desk: Settings) -> None:
    d = desk_of(desk)
    renders: list[str] = []

    def render() -> str:
        renders.append("x")
        return f"<p>{len(renders)}</p>"

    seq = d.points("laptop", S1)[0][-1].seq
    assert d.rendered("laptop", S1, seq, render) == d.rendered("laptop", S1, seq, render)
    assert len(renders) == 1  # a point never changes
    d.rendered("laptop", S1, None, render)
    d.rendered("laptop", S1, None, render)
    assert len(renders) == 2  # now: the same size
    d.restore("laptop", S1, None, dry_run=False)
    d.rendered("desk", S1, None, render)
    assert d.rendered("desk", S1, None, render) == "<p>3</p>"
    with open(_transcript(desk, S1), "ab") as f:  # it grew here
        f.write(line(S1, _app(desk), 9))
    assert d.rendered("desk", S1, None, render) == "<p>4</p>"


def test_a_parsed_transcript_is_read_once_for_its_parts(desk: Settings,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    from syncd.render.transcript import Item, Transcript
    from syncd.web import sessionpage

    d = desk_of(desk)
    loads: list[int] = []

    def load(n: int) -> Transcript:
        loads.append(n)
        return Transcript(S1, items=[Item("prompt", "x" * 1000)])

    first = d.transcript("laptop", S1, 7, lambda: load(7))
    assert d.transcript("laptop", S1, 7, lambda: load(7)) is first and loads == [7]
    # Beyond the bound, the oldest go; the last one stays, however big.
    monkeypatch.setattr(sessionpage, "TRANSCRIPTS_MAX", 1500)
    d.transcript("laptop", S1, 8, lambda: load(8))
    d.transcript("laptop", S1, 8, lambda: load(8))
    d.transcript("laptop", S1, 7, lambda: load(7))
    assert loads == [7, 8, 7]
    monkeypatch.setattr(sessionpage, "TRANSCRIPTS_MAX", 0)
    d.transcript("laptop", S1, 9, lambda: load(9))
    d.transcript("laptop", S1, 9, lambda: load(9))
    assert loads == [7, 8, 7, 9]

"""A session moved by ``/cd`` or a worktree (DESIGN §4a): its transcript sits in the folder
of its last ``relocatedCwd``, which Claude finds it by. Restore and follow rewrite that
field like every cwd and place the session by it (mapped), not by its first cwd."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from syncd.claude import project_folder
from syncd.repository import Repository
from syncd.restore.relocation import last_relocated, relocated_cwd
from syncd.restore.remap import Rule
from syncd.restore.restorer import RestoreOptions, RestoreReport, restore
from syncd.store import MemoryStore
from syncd.view import Backup, load_backup
from tests.helpers import shipper, tree_bytes, write
from tests.hostile import line
from tests.test_follow import Machine

SID = "11111111-2222-3333-4444-555555555555"
START = "/home/alice/app"


def _relocated(sid: str, cwd: str) -> bytes:
    return json.dumps({"type": "relocated", "sessionId": sid, "relocatedCwd": cwd},
                      separators=(",", ":")).encode() + b"\n"


def _moved(start: str, to: str, sid: str = SID) -> bytes:
    """A session begun in ``start``, moved to ``to`` (the record), then continued there."""
    return line(sid, start, 0) + line(sid, start, 1) + _relocated(sid, to) + line(sid, to, 2)


def _catalogued(backup: Backup, to: str) -> Backup:
    """The catalog's ``relocated_cwd`` (format/catalog), here also where the catalog that
    shipped the store does not name it yet."""
    for s in backup.sessions.values():
        s.fields.setdefault("relocated_cwd", to)
    return backup


def _shipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, to: str) -> Repository:
    """desk's backup of the session moved to ``to``; HOME is bob's from then on."""
    monkeypatch.setenv("HOME", "/home/alice")
    src, store = tmp_path / "src", MemoryStore()
    write(src, f"projects/{project_folder(to)}/{SID}.jsonl", _moved(START, to))
    shipper(src, store, tmp_path / "st.db", machine="desk").ship(list(tree_bytes(src)))
    monkeypatch.setenv("HOME", str(tmp_path / "bob"))
    return Repository(store, "desk")


def _restore(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, to: str,
             maps: tuple[Rule, ...] = (), worktrees: str = "map",
             repo: Repository | None = None) -> tuple[RestoreReport, Path]:
    repo = repo or _shipped(tmp_path, monkeypatch, to)
    target = tmp_path / "bob" / ".claude"
    report = restore(repo, RestoreOptions(target=target, local_home="/home/bob", maps=maps,
                                          worktrees=worktrees),
                     _catalogued(load_backup(repo), to))
    assert report.errors == []
    return report, target


def _placed(target: Path) -> dict[str, bytes]:
    return {p.parent.name: p.read_bytes() for p in (target / "projects").rglob("*.jsonl")}


def test_a_moved_session_lands_in_the_folder_of_its_mapped_relocated_cwd(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report, target = _restore(tmp_path, monkeypatch, "/home/alice/lib", maps=(
        Rule(START, "/srv/app"), Rule("/home/alice/lib", "/srv/lib")))
    assert _placed(target) == {project_folder("/srv/lib"): _moved("/srv/app", "/srv/lib")}
    # resume starts Claude where it looks for the session.
    assert report.sessions == {SID: "/srv/lib"}


def test_a_relocated_cwd_beside_a_mapped_start_follows_its_own_rule(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``/cd`` to a sibling whose folder name begins like the start's: placed by the
    home rule its path takes, not by the start's rule its folder name looks like."""
    _, target = _restore(tmp_path, monkeypatch, "/home/alice/app-two",
                         maps=(Rule(START, "/srv/app"),))
    assert _placed(target) == {project_folder("/home/bob/app-two"):
                               _moved("/srv/app", "/home/bob/app-two")}


def test_a_session_that_entered_a_worktree_is_folded_with_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    worktree = f"{START}/.claude/worktrees/feat"
    report, target = _restore(tmp_path, monkeypatch, worktree, worktrees="fold")
    assert _placed(target) == {project_folder("/home/bob/app"):
                               _moved("/home/bob/app", "/home/bob/app")}
    assert report.sessions == {SID: "/home/bob/app"}


def test_a_moved_session_restored_here_before_stays_where_it_was_placed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Restored once with ``--map`` (its start to a directory that does not exist here,
    the one it moved to to one that does), then again without: the local copy is where
    this machine keeps it (by its own relocatedCwd, read from its tail), not moved to
    where the home rule alone would put it."""
    two, to = tmp_path / "two", "/home/alice/app-two"
    two.mkdir()
    repo = _shipped(tmp_path, monkeypatch, to)
    _, target = _restore(tmp_path, monkeypatch, to, (Rule(START, "/srv/app"),
                                                     Rule(to, str(two))), repo=repo)
    assert list(_placed(target)) == [project_folder(str(two))]
    _restore(tmp_path, monkeypatch, to, repo=repo)
    assert _placed(target) == {project_folder(str(two)): _moved("/srv/app", str(two))}


def test_a_moved_session_restored_here_before_moves_when_map_names_a_directory_here(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The earlier copy (restored with its start elsewhere) is found by its relocatedCwd
    and moves with it, its start rewritten too: the same lines as the backup's then."""
    two, to = tmp_path / "two", "/home/alice/app-two"
    two.mkdir()
    repo = _shipped(tmp_path, monkeypatch, to)
    _, target = _restore(tmp_path, monkeypatch, to, (Rule(START, "/srv/app"),), repo=repo)
    assert list(_placed(target)) == [project_folder("/home/bob/app-two")]
    report, _ = _restore(tmp_path, monkeypatch, to, (Rule(to, str(two)),), repo=repo)
    assert _placed(target) == {project_folder(str(two)): _moved("/home/bob/app", str(two))}
    assert [a.action for a in report.actions if a.path.endswith(".jsonl")] == ["move", "skip"]


def test_a_session_without_a_relocated_cwd_is_placed_by_its_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An older store's catalog (no relocated_cwd): where its folder names, as before."""
    monkeypatch.setenv("HOME", "/home/alice")
    src, store = tmp_path / "src", MemoryStore()
    write(src, f"projects/{project_folder(START)}/{SID}.jsonl", line(SID, START, 0))
    shipper(src, store, tmp_path / "st.db", machine="desk").ship(list(tree_bytes(src)))
    report = restore(Repository(store, "desk"), RestoreOptions(
        target=tmp_path / "out", local_home="/home/bob", maps=(Rule(START, "/srv/app"),)))
    assert _placed(tmp_path / "out") == {"-srv-app": line(SID, "/srv/app", 0)}
    assert report.sessions == {SID: "/srv/app"}


def test_the_last_relocated_record_of_the_tail_is_the_one(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    assert last_relocated(_relocated(SID, "/a") + line(SID, "/a", 3) + _relocated(SID, "/b")
                          + line(SID, "/b", 4)) == "/b"
    # Text that only mentions a record is none; nor is a record too long to be one.
    assert last_relocated(line(SID, "/a", 0, text='{"type":"relocated","relocatedCwd":"/x"}')
                          ) is None
    assert last_relocated(_relocated(SID, "/a" * (40 << 10))) is None
    import syncd.restore.relocation as relocation
    monkeypatch.setattr(relocation, "_TAIL", 200)
    path = tmp_path / "t.jsonl"
    path.write_bytes(_relocated(SID, "/early") + line(SID, "/early", 0) * 3)
    assert relocated_cwd(path) is None  # only the tail is read, never a cut first line
    path.write_bytes(line(SID, "/a", 0) * 3 + _relocated(SID, "/late"))
    assert relocated_cwd(path) == "/late"
    assert relocated_cwd(tmp_path / "missing.jsonl") is None


def test_follow_places_a_moved_session_by_its_relocated_cwd(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As restore does: the laptop maps desk's start by a ``[remap]`` rule, and the
    sibling the session moved to by the home rule."""
    a = Machine(tmp_path, "desk", "/home/alice")
    start, to = a.cwd("app"), a.cwd("app-two")
    b = Machine(tmp_path, "laptop", "/users/bob", follow=["desk"], remap={start: "/srv/app"})
    write(a.settings.source, f"projects/{project_folder(to)}/{SID}.jsonl", _moved(start, to))
    a.sync(monkeypatch)
    b.poll(monkeypatch)
    assert _placed(b.settings.source) == {
        project_folder(b.cwd("app-two")): _moved("/srv/app", b.cwd("app-two"))}

"""One folder per session: a session restored under other rules earlier moves to the
folder the new rules give, keeping what was written to it since; a copy that cannot move
is named."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import pytest

import syncd.restore.install as install
import syncd.restore.relocation as relocation
from syncd.claude import project_folder
from syncd.repository import Repository
from syncd.restore.remap import Rule
from syncd.restore.restorer import RestoreOptions, restore
from syncd.store import MemoryStore
from tests.helpers import tree_bytes, write
from tests.hostile import Piece, fields, line, sid, transcript
from tests.test_compact import M, make_shipper
from tests.test_hostile_store import World, sane
from tests.test_restore_remap import SID, _line, _opts, alice  # noqa: F401 (a fixture)


def _sessions_on_disk(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root / "projects"))
                  for p in (root / "projects").glob(f"*/{SID}.jsonl"))


def test_a_later_remap_moves_the_session_with_what_was_written_since(
        alice: tuple[MemoryStore, Path], tmp_path: Path) -> None:  # noqa: F811
    store, _ = alice
    repo = Repository(store, "desk")
    root = tmp_path / "bob" / ".claude"
    # `syncd resume` without --map: the home rule alone.
    restore(repo, _opts(tmp_path, sessions=(SID,)))
    old = root / "projects" / "-home-bob-app"
    here = _line(SID, "L9", "/home/bob/app", "continued here", ts="2027-01-01T00:00:00.000Z")
    with open(old / f"{SID}.jsonl", "ab") as fh:
        fh.write(here)
    # Then a restore that maps the project elsewhere.
    dry = restore(repo, _opts(tmp_path, dry_run=True,
                              maps=(Rule("/home/alice/app", "/home/bob/src/app"),)))
    [planned] = [a for a in dry.actions
                 if a.action == "move" and a.path.endswith(f"{SID}.jsonl")]
    assert planned.source == f"projects/-home-bob-app/{SID}.jsonl"
    assert planned.path == f"projects/{project_folder('/home/bob/src/app')}/{SID}.jsonl"
    assert (old / f"{SID}.jsonl").exists()  # a dry run moves nothing

    r = restore(repo, _opts(tmp_path, maps=(Rule("/home/alice/app", "/home/bob/src/app"),)))
    assert r.errors == [] and r.notes == []
    new = root / "projects" / project_folder("/home/bob/src/app")
    assert _sessions_on_disk(root) == [f"{new.name}/{SID}.jsonl"]
    assert not old.exists()  # nothing else was in it
    lines = [json.loads(x) for x in (new / f"{SID}.jsonl").read_bytes().splitlines()]
    assert lines[-1]["uuid"] == "L9" and lines[-1]["cwd"] == "/home/bob/src/app"
    assert lines[0]["cwd"] == "/home/bob/src/app"
    assert json.loads((new / SID / "subagents" / "agent-x.meta.json").read_bytes()) == {
        "worktreePath": "/home/bob/src/app"}
    moved = {a.source for a in r.actions if a.action == "move"}
    assert moved == {f"projects/-home-bob-app/{SID}.jsonl",
                     f"projects/-home-bob-app/{SID}/subagents/agent-x.jsonl",
                     f"projects/-home-bob-app/{SID}/subagents/agent-x.meta.json"}
    # And back: resume without --map moves it home again.
    restore(repo, _opts(tmp_path, sessions=(SID,)))
    assert _sessions_on_disk(root) == [f"-home-bob-app/{SID}.jsonl"]


def test_a_copy_that_cannot_move_is_named(alice: tuple[MemoryStore, Path],  # noqa: F811
                                          tmp_path: Path) -> None:
    store, _ = alice
    repo = Repository(store, "desk")
    root = tmp_path / "bob" / ".claude"
    rule = Rule("/home/alice/app", "/home/bob/src/app")
    stray = root / "projects" / "-home-bob-app" / f"{SID}.jsonl"
    stray.parent.mkdir(parents=True)
    # Not an earlier copy of the backup's session: another first entry.
    stray.write_bytes(_line(SID, "other", "/home/bob/app", "mine"))
    r = restore(repo, _opts(tmp_path, maps=(rule,), dry_run=True))
    assert r.notes == [f"session {SID} is also in projects/-home-bob-app: it starts "
                       "otherwise than the backup's copy: not this session's earlier copy, "
                       "left there"]
    # Its first entry, but no cwd: its start is unknown.
    stray.write_bytes(b'{"type":"user","uuid":"u1","timestamp":"2026-11-01T10:00:00.000Z"}\n')
    r = restore(repo, _opts(tmp_path, maps=(rule,)))
    assert stray.exists()
    assert r.notes == [f"session {SID} is also in projects/-home-bob-app: its start "
                       "directory is unknown: left there"]
    # One whose new folder holds the session too: both stay, and the restore says so.
    stray.write_bytes(_line(SID, "u1", "/home/bob/app", "fix the bug"))
    r = restore(repo, _opts(tmp_path, maps=(rule,)))
    assert stray.exists() and len(_sessions_on_disk(root)) == 2
    assert "holds it too: left in both folders" in r.notes[0]


@pytest.mark.parametrize("name", ["x.jsonl", f"{SID}.jsonl.bak"])
def test_other_files_are_not_sessions(alice: tuple[MemoryStore, Path],  # noqa: F811
                                      tmp_path: Path, name: str) -> None:
    store, _ = alice
    root = tmp_path / "bob" / ".claude"
    other = root / "projects" / "-srv-x" / name
    other.parent.mkdir(parents=True)
    other.write_bytes(b"keep\n")
    r = restore(Repository(store, "desk"), _opts(tmp_path))
    assert other.read_bytes() == b"keep\n" and r.notes == []


RULE = Rule("/home/alice/app", "/home/bob/src/app")
OLD = "-home-bob-app"
NEW = project_folder("/home/bob/src/app")


def _resumed(alice: tuple[MemoryStore, Path],  # noqa: F811
             tmp_path: Path) -> tuple[Repository, Path]:
    """``syncd resume`` without --map: SID lands in projects/-home-bob-app."""
    store, _ = alice
    repo = Repository(store, "desk")
    restore(repo, _opts(tmp_path, sessions=(SID,)))
    root = tmp_path / "bob" / ".claude"
    assert (root / "projects" / OLD / f"{SID}.jsonl").is_file()
    return repo, root


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes()
            for p in root.rglob("*") if p.is_file() and not p.is_symlink()}



# -- relocation never follows a symlink out of the target ---------------------------------

@pytest.mark.parametrize("where", ["new-folder", "side-folder", "projects-dir"])
def test_relocation_never_writes_through_a_symlink(alice: tuple[MemoryStore, Path],  # noqa: F811
                                                   tmp_path: Path, where: str) -> None:
    repo, root = _resumed(alice, tmp_path)
    outside = tmp_path / "outside"
    projects = root / "projects"
    if where == "new-folder":  # the store picks the folder name; a local one is a symlink
        outside.mkdir()
        (projects / NEW).symlink_to(outside)
    elif where == "side-folder":
        outside.mkdir()
        (projects / NEW).mkdir()
        (projects / NEW / SID).symlink_to(outside)
    else:  # restore refuses a symlinked projects/ ("symlinks are not followed")
        projects.rename(outside)
        projects.symlink_to(outside)
    before = _tree(outside)
    restore(repo, _opts(tmp_path, maps=(RULE,)))
    assert _tree(outside) == before, "relocation wrote or removed files outside the target"


# -- a store never moves a local session it did not give -----------------------------------

def test_a_store_cannot_move_an_unrelated_local_session(tmp_path: Path) -> None:
    """This machine's own session (never restored from anywhere); a crafted machine holds
    a session with the same id (ids are readable in this machine's own plain backup)."""
    w = World(tmp_path, sealed=False)
    mine = sid("here", 7)
    mycwd = str(w.home / "secret")
    local = w.source / transcript(mycwd, mine)
    local.parent.mkdir(parents=True)
    own = line(mine, mycwd, 0, "my private work")
    local.write_bytes(own)
    evil = transcript("/srv/evil/app", mine)
    w.craft.machine_json("evil", "/home/evil")
    w.craft.segment("evil", 0, [Piece(evil, line(mine, "/srv/evil/app", 5, "injected"))],
                    sessions={evil: fields(mine, "/srv/evil/app")})
    r = w.syncd("restore", "--machine", "evil")
    sane(r)
    assert local.is_file() and local.read_bytes() == own, r.describe()


# -- lines written during a move are kept --------------------------------------------------

def test_lines_written_while_a_session_moves_are_kept(alice: tuple[MemoryStore, Path],  # noqa: F811
                                                      tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    repo, root = _resumed(alice, tmp_path)
    copy = relocation._copy_rewritten
    late = _line(SID, "LATE", "/home/bob/app", "written by claude while the restore ran")

    def racing(src: Path, dest: Path, remap: object) -> bool:
        done = copy(src, dest, remap)  # type: ignore[arg-type]
        if src.name == f"{SID}.jsonl":  # claude appends to the session it is running
            with open(src, "ab") as fh:
                fh.write(late)
        return done

    monkeypatch.setattr(relocation, "_copy_rewritten", racing)
    r = restore(repo, _opts(tmp_path, maps=(RULE,)))
    everything = b"".join(p.read_bytes() for p in root.rglob(f"{SID}.jsonl"))
    assert b'"uuid":"LATE"' in everything, "a line appended during the move was lost"
    assert (root / "projects" / OLD / f"{SID}.jsonl").read_bytes().endswith(late)
    assert any("changed while being moved" in n for n in r.notes), r.notes


# -- one bad store name is one problem --------------------------------------------------

def test_a_session_folder_name_too_long_is_one_problem_and_the_rest_goes_on(
        tmp_path: Path) -> None:
    w = World(tmp_path, sealed=False)
    m = w.good("desk")["desk"]
    assert w.syncd("restore", "--machine", "desk").rc == 0  # s1 is local now
    s1 = m.sessions[0]
    long = f"projects/{'x' * 300}/{s1}.jsonl"
    other = sid("evil", 2)
    ok = transcript("/srv/evil/app", other)
    w.craft.machine_json("evil", "/home/evil")
    w.craft.segment("evil", 0, [Piece(long, line(s1, "/srv/evil/" + "a" * 300, 0)),
                                Piece(ok, line(other, "/srv/evil/app", 0))],
                    sessions={long: fields(s1, "/srv/evil/" + "a" * 300),
                              ok: fields(other, "/srv/evil/app")})
    r = w.syncd("restore", "--machine", "evil")
    sane(r)
    assert r.rc == 1 and "x" * 300 in r.err, r.describe()
    assert (w.source / ok).is_file(), f"the rest did not go on\n{r.describe()}"


# -- a move that fails halfway says what moved --------------------------------------------

def test_a_move_that_fails_halfway_reports_what_moved(alice: tuple[MemoryStore, Path],  # noqa: F811
                                                      tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    repo, root = _resumed(alice, tmp_path)
    copy, calls = relocation._copy_rewritten, []

    def flaky(src: Path, dest: Path, remap: object) -> bool:
        calls.append(src)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return copy(src, dest, remap)  # type: ignore[arg-type]

    monkeypatch.setattr(relocation, "_copy_rewritten", flaky)
    r = restore(repo, _opts(tmp_path, maps=(RULE,)))
    assert not (root / "projects" / OLD / f"{SID}.jsonl").exists()  # it did move
    assert f"projects/{OLD}/{SID}.jsonl" in {a.source for a in r.actions
                                             if a.action == "move"}, r.actions
    assert any("1 of its files moved, the rest left there" in e for e in r.errors), r.errors


# -- the new copy is durable before the old one goes ------------------------------------

def test_a_moved_file_is_durable_before_its_old_copy_goes(alice: tuple[MemoryStore, Path],  # noqa: F811
                                                          tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    repo, root = _resumed(alice, tmp_path)
    events: list[tuple[str, str]] = []
    real_fsync, real_unlink, real_remove = os.fsync, os.unlink, os.remove

    def fsync(fd: int) -> None:
        with contextlib.suppress(OSError):
            events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def unlink(path: object, *a: object, **k: object) -> None:
        events.append(("unlink", os.path.realpath(os.fsdecode(path))))  # type: ignore[arg-type]
        real_unlink(path, *a, **k)  # type: ignore[arg-type]

    def remove(path: object, *a: object, **k: object) -> None:
        events.append(("unlink", os.path.realpath(os.fsdecode(path))))  # type: ignore[arg-type]
        real_remove(path, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "unlink", unlink)
    monkeypatch.setattr(os, "remove", remove)
    restore(repo, _opts(tmp_path, maps=(RULE,)))
    monkeypatch.undo()
    old = os.path.realpath(root / "projects" / OLD / f"{SID}.jsonl")
    new_dir = os.path.realpath(root / "projects" / NEW)
    gone = [i for i, e in enumerate(events) if e == ("unlink", old)]
    assert gone, "the old copy was not removed (did it move?)"
    assert ("fsync", new_dir) in events[:gone[0]], \
        "the old copy was unlinked before the new folder's entry was fsynced"


# -- a dry run plans the moves the restore makes ----------------------------------------

def test_a_dry_run_plans_the_moves_the_restore_makes(alice: tuple[MemoryStore, Path],  # noqa: F811
                                                     tmp_path: Path) -> None:
    store, _ = alice
    repo = Repository(store, "desk")
    root = tmp_path / "bob" / ".claude"
    for cwd in ("/home/bob/app", "/home/bob/old/app"):
        p = root / "projects" / project_folder(cwd) / f"{SID}.jsonl"
        p.parent.mkdir(parents=True)
        p.write_bytes(_line(SID, "u1", cwd, "fix the bug"))
    dry = restore(repo, _opts(tmp_path, dry_run=True, maps=(RULE,)))
    real = restore(repo, _opts(tmp_path, maps=(RULE,)))

    def moves(r: object) -> set[str]:
        return {a.source for a in r.actions  # type: ignore[attr-defined]
                if a.action == "move" and a.source.endswith(f"{SID}.jsonl")}

    assert moves(dry) == moves(real), (moves(dry), moves(real), real.notes)


def test_a_dry_run_plans_exactly_what_the_restore_does_with_a_moved_session(
        alice: tuple[MemoryStore, Path], tmp_path: Path) -> None:  # noqa: F811
    """The moved copy grew here (continued): the plan compares the backup with it, as
    the real run does after the move (keep, not create), subagents and all."""
    repo, root = _resumed(alice, tmp_path)
    with open(root / "projects" / OLD / f"{SID}.jsonl", "ab") as fh:
        fh.write(_line(SID, "L9", "/home/bob/app", "continued here",
                       ts="2027-01-01T00:00:00.000Z"))
    before = _tree(root)
    dry = restore(repo, _opts(tmp_path, dry_run=True, maps=(RULE,)))
    assert _tree(root) == before  # a dry run moves nothing
    real = restore(repo, _opts(tmp_path, maps=(RULE,)))

    def plan(r: object) -> list[tuple[str, str, str]]:
        return sorted((a.action, a.path, a.source)  # type: ignore[attr-defined]
                      for a in r.actions)  # type: ignore[attr-defined]

    assert plan(dry) == plan(real)
    assert ("keep", f"projects/{NEW}/{SID}.jsonl", f"projects/-home-alice-app/{SID}.jsonl") \
        in plan(real), plan(real)


# -- long folders: a subdirectory's cwd, two runtimes' folders --------------------------

SID2 = "22222222-2222-3333-4444-555555555555"
LONG = "/home/alice/" + "a-very-long-directory-name/" * 8 + "project"


def _entry(sid: str, uuid: str, cwd: str, text: str) -> bytes:
    return json.dumps({"parentUuid": None, "type": "user", "uuid": uuid,
                       "timestamp": "2026-11-01T10:00:00.000Z", "cwd": cwd,
                       "sessionId": sid, "message": {"role": "user", "content": text}},
                      separators=(",", ":")).encode() + b"\n"


def test_a_long_start_folder_stays_when_the_first_cwd_is_a_subdirectory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A start directory whose folder name is over 200 characters, and a session whose
    first cwd is a subdirectory of it (a cd before the lines we hold). The subdirectory
    matches the folder's first 200 characters too; the exact name of the directory above
    wins, and the folder (memory included) keeps its name."""
    monkeypatch.setenv("HOME", "/home/alice")
    assert len(project_folder(LONG)) > 201
    folder = project_folder(LONG)
    src, store = tmp_path / "src", MemoryStore()
    rel = f"projects/{folder}/{SID}.jsonl"
    write(src, rel, _entry(SID, "u1", LONG + "/src/pkg", "in a subdirectory"))
    write(src, f"projects/{folder}/memory/MEMORY.md", b"# memory\n")
    make_shipper(src, store, tmp_path / "st.db").ship(
        [rel.encode(), f"projects/{folder}/memory/MEMORY.md".encode()])
    out = tmp_path / "out"
    r = restore(Repository(store, M), RestoreOptions(target=out, local_home="/home/alice",
                                                    local_machine=M))
    assert r.errors == []
    assert sorted(p.name for p in (out / "projects").iterdir()) == [folder]


def test_a_local_session_in_its_long_start_folder_is_not_moved_out_of_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same machine, the session still in its folder (and continued here): restoring
    it leaves the local copy in the folder Claude started at LONG uses."""
    monkeypatch.setenv("HOME", "/home/alice")
    folder = project_folder(LONG)
    src, store = tmp_path / "src", MemoryStore()
    rel = f"projects/{folder}/{SID}.jsonl"
    first = _entry(SID, "u1", LONG + "/src/pkg", "in a subdirectory")
    write(src, rel, first)
    make_shipper(src, store, tmp_path / "st.db").ship([rel.encode()])
    write(src, rel, _entry(SID, "u2", LONG + "/src/pkg", "continued here"), "ab")
    r = restore(Repository(store, M), RestoreOptions(
        target=src, local_home="/home/alice", local_root=str(src), local_machine=M))
    assert [a.action for a in r.actions if a.action == "move"] == []
    assert (src / rel).exists()


def test_two_variant_folders_of_one_start_directory_never_overwrite_each_other(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One long start directory, two folders in the store (Node's hash suffix and
    another runtime's), each with its own memory/MEMORY.md, both restored to this
    machine's one folder: the two memory files land on one path, and the second is saved
    aside, even while the first is still being installed (a slow fsync here)."""
    monkeypatch.setenv("HOME", "/home/alice")
    java = project_folder(LONG)
    bun = java[:200] + "-3k9zq1"
    src, store = tmp_path / "src", MemoryStore()
    files = {f"projects/{java}/{SID}.jsonl": _entry(SID, "u1", LONG, "node"),
             f"projects/{java}/memory/MEMORY.md": b"# written under node\n",
             f"projects/{bun}/{SID2}.jsonl": _entry(SID2, "u2", LONG, "bun"),
             f"projects/{bun}/memory/MEMORY.md": b"# written under bun\n"}
    for rel, data in files.items():
        write(src, rel, data)
    make_shipper(src, store, tmp_path / "st.db").ship([r.encode() for r in files])
    slow = install._finish

    def finish(tmp: bytes, dest: bytes, mtime_ns: int, mode: int = 0o600,
               expect: os.stat_result | None = None) -> None:
        time.sleep(0.2)  # fsync on a busy disk
        slow(tmp, dest, mtime_ns, mode, expect)

    monkeypatch.setattr(install, "_finish", finish)
    out = tmp_path / "out"
    r = restore(Repository(store, M), RestoreOptions(
        target=out, local_home="/home/alice", local_machine=M,
        conflicts_dir=tmp_path / "conflicts"))
    everything = b"".join(tree_bytes(out).values()) + b"".join(
        tree_bytes(tmp_path / "conflicts").values() if (tmp_path / "conflicts").exists()
        else [])
    assert b"written under node" in everything and b"written under bun" in everything, \
        [(a.action, a.path) for a in r.actions]


def test_a_moved_copy_is_rewritten_past_an_overlong_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A line longer than LINE_MAX is copied as it is; the lines after it are rewritten
    again (as restore does)."""
    from syncd.restore import remap as _remap
    from syncd.restore.remap import Remapper

    monkeypatch.setattr(_remap, "CHUNK", 64)
    monkeypatch.setattr(_remap, "LINE_MAX", 100)
    long = b'{"cwd":"/home/a/x","t":"' + b"y" * 300 + b'"}\n'
    data = b'{"cwd":"/home/a/p"}\n' + long + b'{"cwd":"/home/a/q"}\n{"cwd":"/home/a/end"}'
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.write_bytes(data)
    assert relocation._copy_rewritten(src, dest, Remapper([Rule("/home/a", "/home/b")]))
    assert dest.read_bytes() == (b'{"cwd":"/home/b/p"}\n' + long +
                                 b'{"cwd":"/home/b/q"}\n{"cwd":"/home/b/end"}')
    # A destination that appeared meanwhile is never replaced.
    dest.write_bytes(b"made meanwhile\n")
    assert not relocation._copy_rewritten(src, dest, None)
    assert dest.read_bytes() == b"made meanwhile\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest", "src"]

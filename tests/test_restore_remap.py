"""Restore onto another machine: selection, point in time, remapping, merging."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from syncd.claude import project_folder
from syncd.errors import RestoreError
from syncd.repository import Repository
from syncd.restore.remap import Rule
from syncd.restore.restorer import RestoreOptions, restore
from syncd.store import MemoryStore
from syncd.view import load_backup
from tests.helpers import shipper, tree_bytes, write

SID = "11111111-2222-3333-4444-555555555555"
OTHER = "99999999-2222-3333-4444-555555555555"
THINK = {"type": "thinking", "thinking": "consider /home/alice/app/main.py", "signature": "c2ln"}


def _line(sid: str, uuid: str, cwd: str, text: str, ts: str = "2026-11-01T10:00:00.000Z",
          **extra: object) -> bytes:
    entry = {"parentUuid": None, "isSidechain": False, "type": "user",
             "message": {"role": "user", "content": text}, "uuid": uuid, "timestamp": ts,
             "cwd": cwd, "sessionId": sid, **extra}
    return json.dumps(entry, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def _assistant(sid: str, uuid: str, cwd: str) -> bytes:
    entry = {"parentUuid": "u1", "type": "assistant", "uuid": uuid, "cwd": cwd,
             "sessionId": sid, "timestamp": "2026-11-01T10:00:05.000Z",
             "message": {"role": "assistant", "content": [THINK, {
                 "type": "tool_use", "name": "Read",
                 "input": {"file_path": f"{cwd}/main.py"}}]}}
    return json.dumps(entry, separators=(",", ":")).encode() + b"\n"


@pytest.fixture
def alice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[MemoryStore, Path]:
    """A backup made on alice's machine: two projects, subagents, history."""
    monkeypatch.setenv("HOME", "/home/alice")
    src = tmp_path / "alice-claude"
    app, lib = "/home/alice/app", "/home/alice/lib"
    folder = f"projects/{project_folder(app)}"
    write(src, f"{folder}/{SID}.jsonl", _line(SID, "u1", app, "fix the bug")
          + _assistant(SID, "a1", app)
          + b'{"type":"custom-title","customTitle":"Bug hunt","sessionId":"' + SID.encode()
          + b'"}\n')
    write(src, f"{folder}/{SID}/subagents/agent-x.jsonl", _line(SID, "s1", app, "sub"))
    write(src, f"{folder}/{SID}/subagents/agent-x.meta.json",
          json.dumps({"worktreePath": app}).encode())
    write(src, f"projects/{project_folder(lib)}/{OTHER}.jsonl", _line(OTHER, "o1", lib, "lib"))
    write(src, "history.jsonl", b"".join(
        json.dumps({"display": d, "project": p, "sessionId": s}).encode() + b"\n"
        for d, p, s in [("fix the bug", app, SID), ("lib", lib, OTHER)]))
    store = MemoryStore()
    sh = shipper(src, store, tmp_path / "alice.db", machine="desk")
    sh.ship(list(tree_bytes(src)))
    monkeypatch.setenv("HOME", str(tmp_path / "bob"))
    return store, src


def _opts(tmp_path: Path, **kw: object) -> RestoreOptions:
    return RestoreOptions(target=tmp_path / "bob" / ".claude", local_home="/home/bob",
                          conflicts_dir=tmp_path / "conflicts", **kw)  # type: ignore[arg-type]


def test_catalog_lists_sessions_without_reading_transcripts(
        alice: tuple[MemoryStore, Path]) -> None:
    store, _ = alice
    b = load_backup(Repository(store, "desk"))
    s = b.find_session(SID)
    assert s is not None and s.project == "/home/alice/app" and s.title == "Bug hunt"
    assert s.fields["first_prompt"] == "fix the bug"
    assert s.fields["last_activity"] == "2026-11-01T10:00:05.000Z"
    assert b.info["home"] == "/home/alice"


def test_home_is_remapped_and_folders_follow(alice: tuple[MemoryStore, Path],
                                             tmp_path: Path) -> None:
    store, _ = alice
    report = restore(Repository(store, "desk"), _opts(tmp_path))
    assert report.errors == []
    root = tmp_path / "bob" / ".claude"
    new = root / "projects" / "-home-bob-app"
    lines = (new / f"{SID}.jsonl").read_bytes().splitlines()
    assert json.loads(lines[0])["cwd"] == "/home/bob/app"
    content = json.loads(lines[1])["message"]["content"]
    assert content[0] == THINK  # thinking and signature untouched
    assert content[1]["input"]["file_path"] == "/home/bob/app/main.py"
    assert json.loads((new / SID / "subagents" / "agent-x.meta.json").read_bytes()) == {
        "worktreePath": "/home/bob/app"}
    assert (root / "projects" / "-home-bob-lib" / f"{OTHER}.jsonl").exists()
    hist = [json.loads(x) for x in (root / "history.jsonl").read_bytes().splitlines()]
    assert [h["project"] for h in hist] == ["/home/bob/app", "/home/bob/lib"]
    assert report.sessions[SID] == "/home/bob/app"
    assert all((p.stat().st_mode & 0o777) == 0o600 for p in root.rglob("*") if p.is_file())


def test_explicit_map_beats_home(alice: tuple[MemoryStore, Path], tmp_path: Path) -> None:
    store, _ = alice
    restore(Repository(store, "desk"),
            _opts(tmp_path, maps=(Rule("/home/alice/app", "/srv/work app"),)))
    folder = tmp_path / "bob" / ".claude" / "projects" / project_folder("/srv/work app")
    first = json.loads((folder / f"{SID}.jsonl").read_bytes().splitlines()[0])
    assert first["cwd"] == "/srv/work app"


def test_one_session_brings_its_files_and_history_lines(
        alice: tuple[MemoryStore, Path], tmp_path: Path) -> None:
    store, _ = alice
    restore(Repository(store, "desk"), _opts(tmp_path, sessions=(SID,)))
    root = tmp_path / "bob" / ".claude"
    got = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert got == ["history.jsonl", f"projects/-home-bob-app/{SID}.jsonl",
                   f"projects/-home-bob-app/{SID}/subagents/agent-x.jsonl",
                   f"projects/-home-bob-app/{SID}/subagents/agent-x.meta.json"]
    assert [json.loads(x)["sessionId"] for x in
            (root / "history.jsonl").read_bytes().splitlines()] == [SID]


def test_project_selection(alice: tuple[MemoryStore, Path], tmp_path: Path) -> None:
    store, _ = alice
    r = restore(Repository(store, "desk"), _opts(tmp_path, projects=("/home/bob/lib",)))
    assert list(r.sessions) == [OTHER]


def test_unknown_session_is_an_error(alice: tuple[MemoryStore, Path], tmp_path: Path) -> None:
    store, _ = alice
    with pytest.raises(RestoreError, match="session nope is not in machine 'desk'"):
        restore(Repository(store, "desk"), _opts(tmp_path, sessions=("nope",)))


def test_dry_run_writes_nothing(alice: tuple[MemoryStore, Path], tmp_path: Path) -> None:
    store, _ = alice
    r = restore(Repository(store, "desk"), _opts(tmp_path, dry_run=True))
    assert {a.action for a in r.actions} == {"create"} and len(r.actions) == 5
    assert not (tmp_path / "bob").exists()


def test_restore_twice_is_idempotent(alice: tuple[MemoryStore, Path], tmp_path: Path) -> None:
    store, _ = alice
    restore(Repository(store, "desk"), _opts(tmp_path))
    before = tree_bytes(tmp_path / "bob")
    r = restore(Repository(store, "desk"), _opts(tmp_path))
    assert {a.action for a in r.actions} == {"skip"}
    assert tree_bytes(tmp_path / "bob") == before


def test_point_in_time(tmp_path: Path) -> None:
    src, store = tmp_path / "src", MemoryStore()
    rel = f"projects/-home-a/{SID}.jsonl"
    write(src, rel, b"one\n")
    sh = shipper(src, store, tmp_path / "st.db")
    sh.clock = lambda: 1000.0
    sh.ship([rel.encode()])
    write(src, rel, b"two\n", "ab")
    sh.clock = lambda: 2000.0
    sh.ship([rel.encode()])
    out = tmp_path / "out"
    restore(Repository(store, "m1"), RestoreOptions(target=out, at=1500.0))
    assert (out / rel).read_bytes() == b"one\n"
    with pytest.raises(RestoreError, match="no backup at or before"):
        restore(Repository(store, "m1"), RestoreOptions(target=tmp_path / "o2", at=999.0))


def test_long_project_path_gets_claudes_hashed_folder(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/alice")
    long_cwd = "/home/alice/" + "a-very-long-directory-name/" * 9 + "project"
    src, store = tmp_path / "src", MemoryStore()
    rel = f"projects/{project_folder(long_cwd)}/{SID}.jsonl"
    write(src, rel, _line(SID, "u1", long_cwd, "hi"))
    shipper(src, store, tmp_path / "st.db", machine="desk").ship([rel.encode()])
    r = restore(Repository(store, "desk"), _opts(tmp_path))
    new_cwd = long_cwd.replace("/home/alice", "/home/bob")
    assert r.sessions[SID] == new_cwd
    folder = project_folder(new_cwd)
    assert len(folder) > 200
    assert (tmp_path / "bob" / ".claude" / "projects" / folder / f"{SID}.jsonl").exists()


def test_diverged_session_merge_and_conflict(alice: tuple[MemoryStore, Path],
                                             tmp_path: Path) -> None:
    store, _ = alice
    restore(Repository(store, "desk"), _opts(tmp_path))
    local = tmp_path / "bob" / ".claude" / "projects" / "-home-bob-app" / f"{SID}.jsonl"
    original = local.read_bytes()
    newer = _line(SID, "L9", "/home/bob/app", "local work", ts="2027-01-01T00:00:00.000Z")
    lines = original.splitlines(keepends=True)
    local.write_bytes(b"".join(lines[:-1]) + newer)  # diverged: different last entry
    r = restore(Repository(store, "desk"), _opts(tmp_path))
    act = next(a for a in r.actions if a.path.endswith(f"{SID}.jsonl"))
    assert act.action == "conflict" and act.conflict_copy is not None
    assert local.read_bytes() == b"".join(lines[:-1]) + newer  # untouched
    assert Path(act.conflict_copy).read_bytes() == original


def test_folder_follows_the_start_directory_not_a_later_cd(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A transcript whose first cwd is a subdirectory stays in (the mapped) start folder."""
    monkeypatch.setenv("HOME", "/home/alice")
    src, store = tmp_path / "src", MemoryStore()
    rel = f"projects/{project_folder('/home/alice/app')}/{SID}.jsonl"
    write(src, rel, _line(SID, "u1", "/home/alice/app/rock", "in a subdirectory"))
    shipper(src, store, tmp_path / "st.db", machine="desk").ship([rel.encode()])
    restore(Repository(store, "desk"), _opts(tmp_path))
    root = tmp_path / "bob" / ".claude" / "projects"
    assert [p.name for p in root.iterdir()] == ["-home-bob-app"]
    # Restoring on the same machine moves nothing at all.
    monkeypatch.setenv("HOME", "/home/alice")
    same = restore(Repository(store, "desk"), RestoreOptions(target=tmp_path / "same",
                                                 local_home="/home/alice"))
    assert same.written == [rel]


@pytest.mark.parametrize("variant", ["other-runtime-suffix", "non-bmp-as-one"])
def test_a_folder_named_by_another_rule_lands_in_this_machines(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variant: str) -> None:
    """A >200-character folder with Bun's hash suffix where this CLI uses Java's, or a
    path with an emoji counted as one "-": restored into the folder this machine's CLI
    looks in, with the home mapped. Where the path stays, the emoji variant is renamed,
    and the long one keeps its name (Claude finds it by its first 200 characters, which
    do not say whether it started there or in a directory above)."""
    monkeypatch.setenv("HOME", "/home/alice")
    if variant == "other-runtime-suffix":
        cwd = "/home/alice/" + "a-very-long-directory-name/" * 9 + "project"
        folder = project_folder(cwd)[:200] + "-3k9zq1"
    else:
        cwd = "/home/alice/\U0001F600app"
        folder = "-home-alice--app"
    assert folder != project_folder(cwd)
    src, store = tmp_path / "src", MemoryStore()
    rel = f"projects/{folder}/{SID}.jsonl"
    write(src, rel, _line(SID, "u1", cwd, "hi"))
    shipper(src, store, tmp_path / "st.db", machine="desk").ship([rel.encode()])
    for home in ("/home/bob", "/home/alice"):
        out = tmp_path / home.rsplit("/", 1)[1]
        r = restore(Repository(store, "desk"), RestoreOptions(
            target=out, local_home=home, conflicts_dir=tmp_path / "c"))
        new_cwd = cwd.replace("/home/alice", home)
        assert r.sessions[SID] == new_cwd
        kept = variant == "other-runtime-suffix" and home == "/home/alice"
        assert [p.parent.name for p in out.rglob("*.jsonl")] == [
            folder if kept else project_folder(new_cwd)]


@pytest.mark.parametrize("chunk", [8 << 20, 64])
@pytest.mark.parametrize("sessions", [(), (SID,)])
def test_rewriting_processes_write_what_one_process_writes(
        alice: tuple[MemoryStore, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        chunk: int, sessions: tuple[str, ...]) -> None:
    """A big rewrite runs in worker processes: the files (whole or a chunk of lines at a
    time, a filtered history too) and the report are the same as without them."""
    import syncd.restore.place as place_mod
    import syncd.restore.remap as remap_mod
    import syncd.restore.rewrite as rewrite_mod

    store, _ = alice
    monkeypatch.setattr(place_mod, "CHUNK", chunk)
    monkeypatch.setattr(remap_mod, "CHUNK", chunk)
    got = {}
    for pool_min in (1 << 60, 0):
        monkeypatch.setattr(rewrite_mod, "POOL_MIN_BYTES", pool_min)
        target = tmp_path / f"out-{pool_min}"
        report = restore(Repository(store, "desk"), RestoreOptions(
            target=target, local_home="/home/bob", sessions=sessions))
        assert report.errors == []
        got[pool_min] = (tree_bytes(target), [(a.action, a.path, a.size)
                                              for a in report.actions])
    assert got[0] == got[1 << 60]
    assert any(b"/home/bob/app" in data for data in got[0][0].values())



@pytest.mark.parametrize("whole", [True, False])
def test_a_rewriting_process_leaves_the_disk_to_the_installer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, whole: bool) -> None:
    """A rewriting process's job goes on with the next file rather than wait for the
    disk; the installer's thread fsyncs the file as it renames it into place."""
    import os

    import syncd.restore.rewrite as rewrite_mod
    from syncd.restore.install import Installer

    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("no /proc")
    monkeypatch.setattr(os, "fsync", fsync)
    rewrite_mod._start_rewriter([Rule("/home/alice", "/home/bob")], {})
    staged = write(tmp_path, "staged", b'{"cwd":"/home/alice/app"}\n' * 3)
    out, size = rewrite_mod._rewrite_job(staged, None, False, whole)
    assert out.read_bytes() == b'{"cwd":"/home/bob/app"}\n' * 3 and size == 3 * 24
    assert synced == []
    installer = Installer()
    try:
        installer.produce(lambda: os.fsencode(out), os.fsencode(tmp_path / "dest"), 0, 0)
        assert installer.finish() == []
    finally:
        installer.close()
    assert str(out) in synced
    assert (tmp_path / "dest").read_bytes() == b'{"cwd":"/home/bob/app"}\n' * 3

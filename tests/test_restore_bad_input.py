"""Restore on bad input: full disk, unwritable target, unknown ids, shared ids, git identity."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from syncd.claude import project_folder
from syncd.errors import RestoreError
from syncd.repository import Repository
from syncd.restore.restorer import RestoreOptions, restore
from syncd.store import LocalStore, MemoryStore
from tests.helpers import shipper, tree_bytes, write

SID = "aaaaaaaa-0000-0000-0000-000000000001"


def _session(cwd: str, sid: str = SID, text: str = "hello", size: int = 0) -> bytes:
    entry = {"type": "user", "uuid": f"u-{sid}", "cwd": cwd, "sessionId": sid,
             "timestamp": "2026-11-01T00:00:00.000Z",
             "message": {"role": "user", "content": text + "x" * size}}
    return json.dumps(entry, separators=(",", ":")).encode() + b"\n"


def _backup(tmp_path: Path, store: MemoryStore | LocalStore, machine: str, cwd: str,
            sid: str = SID, size: int = 0) -> None:
    src = tmp_path / f"src-{machine}"
    rel = f"projects/{project_folder(cwd)}/{sid}.jsonl"
    write(src, rel, _session(cwd, sid, size=size))
    shipper(src, store, tmp_path / f"{machine}.db", machine=machine).ship([rel.encode()])


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill (needs root): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_leaves_nothing_half_written(tmp_path: Path, tiny_fs: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/a")
    store = MemoryStore()
    _backup(tmp_path, store, "desk", "/home/a/app", size=2 << 20)  # 2 MiB > the disk
    target = tiny_fs / "claude"
    write(target, "history.jsonl", b"local history\n")
    before = tree_bytes(target)
    # Said before anything is fetched: the backup's sizes do not fit.
    with pytest.raises(RestoreError, match=r"needs 2\.1 MB, the filesystem has"):
        restore(Repository(store, "desk"), RestoreOptions(target=target, local_home="/home/a"))
    assert tree_bytes(target) == before
    # And when the disk fills up all the same (the free space was misjudged).
    real = os.statvfs

    def roomy(path: str | bytes | os.PathLike[str] | int) -> os.statvfs_result:
        st = real(path)
        return os.statvfs_result((st.f_bsize, st.f_frsize, st.f_blocks, st.f_bfree,
                                  1 << 40, *st[5:]))

    monkeypatch.setattr(os, "statvfs", roomy)
    with pytest.raises(RestoreError, match="No space left on device"):
        restore(Repository(store, "desk"), RestoreOptions(target=target, local_home="/home/a"))
    assert tree_bytes(target) == before
    assert sorted(os.listdir(target)) == ["history.jsonl"]  # no staging, no partial files


def test_unwritable_target_is_a_clear_error(tmp_path: Path) -> None:
    store = MemoryStore()
    _backup(tmp_path, store, "m1", "/home/a/app")
    (tmp_path / "file").write_text("x")
    with pytest.raises(RestoreError, match="cannot create"):
        restore(Repository(store, "m1"), RestoreOptions(target=tmp_path / "file" / "sub"))


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(tmp_path / "home"), "SYNCD_SOURCE": str(tmp_path / "dst"),
           "SYNCD_STORE": (tmp_path / "store").as_uri(), "SYNCD_MACHINE_ID": "laptop",
           "SYNCD_STATE_DIR": str(tmp_path / "state"), "SYNCD_CONFIG": os.devnull}
    return subprocess.run([sys.executable, "-m", "syncd", *args], env=env, capture_output=True,
                          text=True, timeout=60)


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    _backup(tmp_path, store, "desk", "/home/a/app")
    other = "aaaaaaaa-0000-0000-0000-00000000000f"
    cases = [
        (("restore", "--machine", "desk", "--at", "2001-01-01T00:00"), "no backup at or before", 1),
        (("restore", "--machine", "desk", "--session", other), f"session {other} is not in", 1),
        (("resume", other), f"session {other} is in no backup", 1),
        (("restore", "--machine", "ghost"), "no backup for machine 'ghost'", 1),
        (("restore", "--machine", "desk", "--session", "nope"), "'nope' is not a session id", 2),
        (("resume", "nope"), "'nope' is not a session id", 2),
        (("restore", "--machine", "desk", "--at", "yesterday-ish"), "cannot read time", 2),
    ]
    for args, message, code in cases:
        r = _cli(tmp_path, *args)
        assert r.returncode == code, (args, r.stderr)
        assert message in r.stderr and r.stderr.count("\n") == 1, (args, r.stderr)
    assert not (tmp_path / "dst").exists()


def test_two_machines_sharing_a_session_id(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    _backup(tmp_path, store, "desk", "/home/a/app")
    _backup(tmp_path, store, "laptop2", "/home/a/app")
    r = _cli(tmp_path, "resume", SID)
    assert r.returncode == 1 and "desk" in r.stderr and "laptop2" in r.stderr
    assert "--machine" in r.stderr
    r = _cli(tmp_path, "resume", SID, "--machine", "laptop2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith(f"claude --resume {SID}")
    rows = json.loads(_cli(tmp_path, "sessions", "--json").stdout)
    assert sorted(row["machine"] for row in rows) == ["desk", "laptop2"]
    assert all(row["local"] for row in rows)  # restored just now


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True)


@pytest.mark.skipif(not any(os.access(os.path.join(p, "git"), os.X_OK)
                            for p in os.environ.get("PATH", "").split(os.pathsep)),
                    reason="git is not installed")
def test_project_maps_to_the_local_clone_with_the_same_remote(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    desk_repo = tmp_path / "desk" / "src" / "proj"
    desk_repo.mkdir(parents=True)
    _git(desk_repo, "init", "-q")
    _git(desk_repo, "remote", "add", "origin", "git@github.com:acme/proj.git")
    monkeypatch.setenv("HOME", str(tmp_path / "desk"))
    store = MemoryStore()
    _backup(tmp_path, store, "desk", str(desk_repo))
    clone = tmp_path / "laptop" / "code" / "acme-proj"
    clone.mkdir(parents=True)
    _git(clone, "init", "-q")
    _git(clone, "remote", "add", "origin", "https://github.com/acme/proj")
    target = tmp_path / "laptop" / ".claude"
    r = restore(Repository(store, "desk"), RestoreOptions(
        target=target, local_home=str(tmp_path / "laptop"),
        project_roots=(str(tmp_path / "laptop" / "code"),)))
    assert r.sessions[SID] == str(clone)
    assert any("same git remote" in rule.why for rule in r.rules)
    restored = target / "projects" / project_folder(str(clone)) / f"{SID}.jsonl"
    assert json.loads(restored.read_bytes())["cwd"] == str(clone)


def test_a_history_with_a_gap_is_never_restored_as_a_sparse_file() -> None:
    """One session's history keeps only its frames, at their offsets; an extent the store
    placed far past a gap must not decide the size of that sparse file."""
    from syncd.format.segment import Extent
    from syncd.format.snapshot import Entry
    from syncd.restore.plan import _history_of

    def ext(start: int, end: int, off: int) -> Extent:
        return Extent(b"history.jsonl", 1, start, end, off, 10, "0" * 64, 0o600, 0)

    whole = [("p", ext(0, 100, 0)), ("p", ext(100, 200, 10))]
    h = Entry(b"history.jsonl", 1, 200, extents=whole, sids={("p", 0): SID[:8]})
    assert _history_of(h, {"bbbbbbbb"}).sparse  # the first frame is another session's
    far = 1 << 43
    h = Entry(b"history.jsonl", 1, far + 100, extents=[whole[0], ("p", ext(far, far + 100, 10))],
              sids={("p", 0): SID[:8]})
    got = _history_of(h, {"bbbbbbbb"})
    assert not got.sparse and got.extents == h.extents  # restored as its intact prefix

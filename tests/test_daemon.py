"""The daemon end to end: events → dirty set → flush → store, on a real inotify watch."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import syncd.restore.install as install
from syncd.backup.state import FileState, State
from syncd.config import Settings, load_settings
from syncd.repository import Repository
from syncd.restore.restorer import RestoreOptions, restore_tree
from syncd.service.daemon import Daemon
from syncd.store import open_store
from syncd.view import load_backup
from tests.helpers import (
    restore_own,
    running,
    shipped,
    start_daemon,
    tree_bytes,
    wait_for,
    write,
)
from tests.seaweed import Seaweed


def settings(tmp_path: Path, **kw: object) -> Settings:
    base: dict[str, object] = dict(source=tmp_path / "src", store=(tmp_path / "store").as_uri(),
                                   state_dir=tmp_path / "state", machine_id="m1",
                                   flush_quiet=0.2, flush_max_delay=1.0)
    base.update(kw)
    return load_settings(config_file=tmp_path / "none.toml", **base)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[Daemon, Settings]]:
    (tmp_path / "src").mkdir()
    s = settings(tmp_path)
    dt = start_daemon(s)
    try:
        yield dt.daemon, s
    finally:
        dt.stop()
        assert not dt.thread.is_alive()


def test_appends_are_shipped_by_events(daemon: tuple[Daemon, Settings], tmp_path: Path) -> None:
    _d, s = daemon
    rel = "projects/-home-a/s.jsonl"
    f = write(s.source, rel, b'{"n":0}\n')
    wait_for(lambda: shipped(s, rel) == f.stat().st_size, what="first line shipped")
    for i in range(1, 20):
        write(s.source, rel, f'{{"n":{i}}}\n'.encode(), "ab")
    wait_for(lambda: shipped(s, rel) == f.stat().st_size, what="appends shipped")
    out = tmp_path / "out"
    restore_tree(Repository(open_store(s.store), "m1"), out)
    assert (out / rel).read_bytes() == f.read_bytes()


def test_quiet_period_batches_a_burst_into_one_segment(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    s = settings(tmp_path, flush_quiet=1.0, flush_max_delay=30.0)
    with running(s) as d:
        # Ready: watching, and its start-up scan is done (the state file comes earlier).
        wait_for(lambda: d._ready, what="daemon start")
        paths = [f"projects/p/{i}.jsonl" for i in range(30)]
        for p in paths:
            write(s.source, p, b"line\n")
        wait_for(lambda: all(shipped(s, p) == 5 for p in paths), what="burst shipped")
        st = State(s.state_file, readonly=True)
        # machine.json aside, the burst arrived in one segment.
        assert st.next_seq == 1
        st.close()


def test_new_directory_contents_are_found(daemon: tuple[Daemon, Settings]) -> None:
    _d, s = daemon
    staged = s.source.parent / "staged"
    write(staged, "sid/subagents/agent-1.jsonl", b"sub\n")
    write(staged, "sid/tool-results/t.txt", b"result\n")
    (s.source / "projects").mkdir()
    staged.rename(s.source / "projects" / "-home-b")  # one event for the whole subtree
    wait_for(lambda: shipped(s, "projects/-home-b/sid/subagents/agent-1.jsonl") == 4
             and shipped(s, "projects/-home-b/sid/tool-results/t.txt") == 7,
             what="moved-in subtree shipped")


def test_deleted_file_keeps_its_backup(daemon: tuple[Daemon, Settings], tmp_path: Path) -> None:
    _d, s = daemon
    rel = "projects/-home-a/old.jsonl"
    f = write(s.source, rel, b"keep me\n")
    wait_for(lambda: shipped(s, rel) == 8, what="shipped")
    f.unlink()

    def tombstoned() -> bool:
        st = State(s.state_file, readonly=True)
        try:
            row = st.get(rel.encode())
            return row is not None and row.deleted_at is not None
        finally:
            st.close()

    wait_for(tombstoned, what="tombstone")
    out = tmp_path / "out"
    restore_tree(Repository(open_store(s.store), "m1"), out)
    assert (out / rel).read_bytes() == b"keep me\n"


def test_a_segment_lost_while_running_is_shipped_again_at_the_next_scan(
        daemon: tuple[Daemon, Settings], tmp_path: Path) -> None:
    d, s = daemon
    rel = "projects/-home-a/0a0eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b.jsonl"
    write(s.source, rel, b'{"n":1}\n')
    wait_for(lambda: shipped(s, rel) == 8, what="first line shipped")
    write(s.source, rel, b'{"n":2}\n', "ab")
    wait_for(lambda: shipped(s, rel) == 16, what="second line shipped")
    store = open_store(s.store)
    newest = max(o.key for o in store.list("machines/m1/seg/"))
    store.delete_many([newest])  # the store loses it (a lifecycle rule, a hand)
    d.request_scan()  # what the hourly reconcile scan does

    def whole() -> bool:
        out = tmp_path / f"out-{time.monotonic_ns()}"
        r = restore_tree(Repository(open_store(s.store), "m1"), out)
        return not r.errors and (out / rel).read_bytes() == b'{"n":1}\n{"n":2}\n'

    wait_for(whole, what="the lost line back in the store")


def _env(s: Settings, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, "SYNCD_SOURCE": str(s.source), "SYNCD_STORE": s.store,
           "SYNCD_STATE_DIR": str(s.state_dir), "SYNCD_MACHINE_ID": s.machine_id,
           "SYNCD_CONFIG": os.devnull,
           "SYNCD_FLUSH_QUIET": "0.2", "SYNCD_FLUSH_MAX_DELAY": "1"}
    env.update(extra or {})
    return env


def _syncd(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "syncd", *args], env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_cli_run_stops_cleanly_on_signal(tmp_path: Path, sig: signal.Signals) -> None:
    s = settings(tmp_path)
    write(s.source, "history.jsonl", b'{"display":"hi"}\n')
    p = subprocess.Popen([sys.executable, "-m", "syncd", "run"], env=_env(s),
                         stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: shipped(s, "history.jsonl") == 17, what="initial reconcile shipped")
        status = json.loads(_syncd("status", "--json", env=_env(s)).stdout)
        assert status["daemon_pid"] == p.pid
        p.send_signal(sig)
        _out, err = p.communicate(timeout=30)
        assert p.returncode == 0, err
    finally:
        if p.poll() is None:
            p.kill()
    status = json.loads(_syncd("status", "--json", env=_env(s)).stdout)
    assert status["daemon_pid"] is None and status["bytes_pending"] == 0


def test_second_daemon_on_same_state_refuses(daemon: tuple[Daemon, Settings]) -> None:
    d, s = daemon
    wait_for(lambda: d._ready, what="daemon start")
    r = _syncd("sync", env=_env(s))
    assert r.returncode == 1
    assert "another syncd (pid" in r.stderr and r.stderr.count("\n") == 1


def test_cli_sync_status_restore_on_seaweed(tmp_path: Path, seaweed: Seaweed,
                                            bucket: str, samples: Path) -> None:
    s = settings(tmp_path, store=f"s3://{bucket}/backups", s3_endpoint_url=seaweed.endpoint)
    for f in samples.rglob("*.jsonl"):
        rel = f.relative_to(f.parents[len(f.relative_to(samples).parts) - 2])
        write(s.source, str(rel), f.read_bytes())
    write(s.source, "history.jsonl", b'{"display":"x","project":"/home/a"}\n')
    env = _env(s, {"SYNCD_S3_ENDPOINT_URL": seaweed.endpoint})
    r = _syncd("sync", env=env)
    assert r.returncode == 0, r.stderr
    status = json.loads(_syncd("status", "--json", env=env).stdout)
    assert status["bytes_pending"] == 0 and status["files_tracked"] == len(tree_bytes(s.source))
    assert status["last_flush_seq"] == 0 and status["machine_id"] == "m1"
    text = _syncd("status", env=env).stdout
    assert "machine:      m1" in text and "last error:   none" in text
    r = _syncd("restore", "--to", str(tmp_path / "out"), env=env)
    assert r.returncode == 0, r.stderr
    assert tree_bytes(tmp_path / "out") == tree_bytes(s.source)
    keys = [o["Key"] for o in seaweed.client().list_objects_v2(Bucket=bucket)["Contents"]]
    assert keys == ["backups/machines/m1/head", "backups/machines/m1/machine.json",
                    "backups/machines/m1/seg/0000000000000000"]


@pytest.mark.parametrize("first,last,busy,expected", [
    (100.0, 100.5, 4.0, 102.5),    # a single burst: flushed once quiet for 2 s
    (100.0, 103.9, 4.0, 104.0),    # writes keep coming: flushed 4 s after the first
    (100.0, 109.0, 0.0, 110.0),    # busy rule off: the max delay caps it
])
def test_flush_deadline(tmp_path: Path, first: float, last: float, busy: float,
                        expected: float) -> None:
    from syncd.service.daemon import _Dirty

    d = Daemon(settings(tmp_path, flush_quiet=2.0, flush_max_delay=10.0,
                        flush_busy_interval=busy))
    assert d._due(_Dirty(first=first, last=last)) == pytest.approx(expected)


def test_config_saved_by_rename_is_shipped_whole(daemon: tuple[Daemon, Settings],
                                                 tmp_path: Path) -> None:
    """Claude and editors save settings.json through a temp file and a rename: each save
    is a new whole-file generation in the store."""
    _d, s = daemon

    def save(rel: str, data: bytes) -> None:
        tmp = s.source / f".{rel.replace('/', '_')}.tmp"
        tmp.write_bytes(data)
        (s.source / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, s.source / rel)

    save("settings.json", b'{"model": "opus"}\n')
    save("agents/linter.md", b"---\nname: linter\n---\n")
    wait_for(lambda: shipped(s, "settings.json") == 18 and
             shipped(s, "agents/linter.md") == 21, what="config shipped")
    save("settings.json", b'{"model": "sonnet", "env": {}}\n')
    wait_for(lambda: shipped(s, "settings.json") == 31, what="the new settings shipped")
    out = tmp_path / "out"
    restore_tree(Repository(open_store(s.store), s.machine_id), out)
    assert (out / "settings.json").read_bytes() == b'{"model": "sonnet", "env": {}}\n'
    assert (out / "agents/linter.md").read_bytes() == b"---\nname: linter\n---\n"
    assert not list(out.glob(".*.tmp"))


@pytest.mark.parametrize("slow", [False, True], ids=["fast-disk", "slow-disk"])
def test_a_restore_with_the_daemon_running_ships_nothing_again(
        daemon: tuple[Daemon, Settings], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        slow: bool) -> None:
    """rm -rf projects, then a restore of this machine's own backup: the daemon revives
    the deleted generations instead of shipping every restored byte as a new one. On a
    slow disk the daemon flushes (every 0.2 s) between the restore's files."""
    _d, s = daemon
    if slow:
        finish = install._finish

        def slow_finish(tmp: bytes, dest: bytes, mtime_ns: int, mode: int = 0o600,
                        expect: os.stat_result | None = None) -> None:
            time.sleep(0.5)
            finish(tmp, dest, mtime_ns, mode, expect)

        monkeypatch.setattr(install, "_finish", slow_finish)
    files = {f"projects/-home-a/{n}.jsonl": b'{"n":%d}\n' % n * 200 for n in range(3)}
    files["projects/-home-a/s0/subagents/agent-1.jsonl"] = b'{"sub":1}\n'
    files["settings.json"] = b'{"model": "opus"}\n'
    for rel, data in files.items():
        write(s.source, rel, data)
    wait_for(lambda: all(shipped(s, rel) == len(data) for rel, data in files.items()),
             what="the tree shipped")
    shutil.rmtree(s.source / "projects")

    def state(rel: str) -> FileState | None:
        st = State(s.state_file, readonly=True)
        try:
            return st.get(rel.encode())
        finally:
            st.close()

    gens = {rel: state(rel).gen for rel in files}  # type: ignore[union-attr]
    wait_for(lambda: all(state(rel).deleted_at is not None  # type: ignore[union-attr]
                         for rel in files if rel.startswith("projects/")),
             what="the deletions shipped")
    repo = Repository(open_store(s.store), s.machine_id)
    before = repo.segments()
    # Recorded before each file appears: the daemon, flushing 0.2 s after a change, may
    # look at any moment while the restore runs.
    report, recorded = restore_own(repo, RestoreOptions(
        target=s.source, local_root=str(s.source), local_machine=s.machine_id), s.state_file)
    assert report.errors == []
    assert recorded == 4  # the projects; settings.json is not written
    wait_for(lambda: all(state(rel).deleted_at is None for rel in files),  # type: ignore[union-attr]
             what="the generations revived")
    assert {rel: state(rel).gen for rel in files} == gens  # type: ignore[union-attr]
    new = [k for k, _ in repo.segments() if k not in {k for k, _ in before}]
    assert new, "the revival is one small segment"
    data = [x for k in new for x in repo.read_index(k).extents]
    assert data and all(x.end == x.start for x in data), data  # no byte shipped again
    assert all(x.reason == "revived: restored as it was shipped" for x in data)
    # The store's view: nothing deleted, every byte as the tree has it.
    b = load_backup(repo)
    assert all(b.files[rel.encode()].deleted_at is None for rel in files)
    out = tmp_path / "out"
    restore_tree(repo, out)
    assert tree_bytes(out) == {k.encode(): v for k, v in files.items()}


@pytest.mark.parametrize("keep,within", [("180d", 179 * 86400.0), ("7d", 6 * 86400.0),
                                         ("12h", 0.0), ("", 0.0)])
def test_revival_reaches_less_far_back_than_compaction_keeps_tombstones(
        tmp_path: Path, keep: str, within: float) -> None:
    from syncd.backup.engine import _revive_within
    assert _revive_within(settings(tmp_path, tombstone_keep=keep)) == within


@pytest.mark.parametrize("follow", [["laptop"], []])
def test_a_tree_follow_cannot_write_is_one_error_line_at_start(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, follow: list[str]) -> None:
    # projects/ that is no directory: what an import must write into cannot be written.
    write(tmp_path / "src", "projects", b"")
    s = settings(tmp_path, follow=follow)
    caplog.set_level(logging.INFO)
    with running(s) as d:
        wait_for(lambda: d._ready, what="daemon start")
    lines = [r.getMessage() for r in caplog.records
             if r.levelno >= logging.ERROR and "Claude tree" in r.getMessage()]
    if not follow:
        assert lines == []  # nothing to import: the tree is only read
        return
    assert len(lines) == 1, lines
    assert f"{s.source / 'projects'}: Not a directory" in lines[0]
    assert "ReadWritePaths=" in lines[0] and "systemctl --user edit syncd" in lines[0]

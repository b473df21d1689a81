"""The start-up catch-up: a big backlog is shipped by a child process, then the daemon
goes on as usual; a child that fails or is stopped loses nothing."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from syncd.backup.engine import sync_once
from syncd.backup.state import State
from syncd.config import Settings
from syncd.errors import SyncStopped
from syncd.repository import Repository
from syncd.restore.restorer import restore_tree
from syncd.security.lock import ProcessLock
from syncd.service import catchup as _catchup
from syncd.service.catchup import catch_up
from syncd.store import open_store
from tests.helpers import running, shipped, tree_bytes, wait_for, write
from tests.test_daemon import _env, settings


def tree(s: Settings, n: int) -> list[str]:
    rels = [f"projects/-home-a/{i:04d}.jsonl" for i in range(n)]
    for i, rel in enumerate(rels):
        write(s.source, rel, b'{"n":%d,"pad":"%s"}\n' % (i, b"x" * (i % 200)))
    return rels


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in list(caplog.records)]


def logged(caplog: pytest.LogCaptureFixture, pattern: str) -> re.Match[str] | None:
    return next((m for m in map(re.compile(pattern).search, messages(caplog)) if m), None)


@pytest.fixture
def low_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    # The decision is the daemon's own (in this process); only the shipping is the child's.
    monkeypatch.setattr(_catchup, "MIN_FILES", 50)


def test_big_backlog_ships_in_a_child_then_the_daemon_goes_on(
        tmp_path: Path, low_threshold: None, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="syncd")
    s = settings(tmp_path)
    rels = tree(s, 60)
    with running(s):
        wait_for(lambda: logged(caplog, r"reconcile scan: 60 files") is not None,
                 what="the daemon's own reconcile scan")
        done = logged(caplog, r"start-up catch-up: 60 files, .* shipped by child process "
                              r"(\d+) in .*\(peak RSS [\d.]+ MB\)")
        assert done is not None, messages(caplog)
        assert int(done.group(1)) != os.getpid()
        # The child shipped it all: the daemon's scan found nothing left to do.
        assert logged(caplog, r"reconcile scan: 60 files, 0 changed") is not None
        assert all(shipped(s, rel) > 0 for rel in rels)
        # Appends after the start are the daemon's.
        f = write(s.source, rels[7], b'{"n":"more"}\n', "ab")
        wait_for(lambda: shipped(s, rels[7]) == f.stat().st_size, what="append shipped")
    out = tmp_path / "out"
    restore_tree(Repository(open_store(s.store), "m1"), out)
    assert tree_bytes(out) == tree_bytes(s.source)


@pytest.mark.parametrize(("files", "child"), [(10, True), (60, False)])
def test_small_backlog_or_setting_off_ships_in_the_daemon(
        tmp_path: Path, low_threshold: None, caplog: pytest.LogCaptureFixture, files: int,
        child: bool) -> None:
    caplog.set_level(logging.INFO, logger="syncd")
    s = settings(tmp_path, catchup_child=child)
    rels = tree(s, files)
    with running(s):
        wait_for(lambda: all(shipped(s, rel) > 0 for rel in rels), what="backlog shipped")
        assert logged(caplog, rf"reconcile scan: {files} files, {files} changed") is not None
    assert not any("catch-up" in m for m in messages(caplog))


def test_a_failing_child_leaves_the_backlog_to_the_daemon(
        tmp_path: Path, low_threshold: None, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="syncd")
    s = settings(tmp_path)
    rels = tree(s, 60)
    # A real failure, in the child only: the machine's directory cannot be created (a file
    # is in its way) until the test removes the file.
    blocker = write(tmp_path / "store", "machines", b"in the way")
    with running(s) as d:
        wait_for(lambda: logged(caplog, r"catch-up in a child process failed \(.+\)")
                 is not None, what="the child's failure")
        blocker.unlink()
        wait_for(lambda: all(shipped(s, rel) > 0 for rel in rels), what="backlog shipped")
        assert not d.stop.is_set()
    assert logged(caplog, r"reconcile scan: 60 files, 60 changed") is not None
    out = tmp_path / "out"
    restore_tree(Repository(open_store(s.store), "m1"), out)
    assert tree_bytes(out) == tree_bytes(s.source)


def test_no_child_while_another_process_holds_the_state(tmp_path: Path,
                                                         low_threshold: None) -> None:
    s = settings(tmp_path)
    tree(s, 60)
    lock = ProcessLock(s.state_file.with_suffix(".lock"))
    lock.acquire()
    try:
        waits: list[int] = []
        assert catch_up(s, threading.Event(), takeover=False,
                        on_wait=lambda: waits.append(1)) == "skipped"
        assert not waits
    finally:
        lock.release()
    assert _catchup.backlog(s).pending_bytes > 0  # nothing was shipped


# -- stopping ---------------------------------------------------------------------------

class _StopAtSecondFile:
    """A progress meter that sets ``stop`` while the second file is read: by then the
    first file's segment is uploading (the second does not fit in it)."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.frames = 0

    def start(self, total: int) -> None:
        pass

    def advance(self, n: int) -> None:
        self.frames += 1
        if self.frames == 2:
            self.stop.set()


@pytest.mark.parametrize("when", ["between files", "after a committed segment"])
def test_sync_once_stops_at_a_segment_boundary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               when: str) -> None:
    # The catch-up child's body: the stop its SIGTERM sets ends the pass after the
    # segment in flight, which is committed; the rest waits for the next run.
    s = settings(tmp_path, segment_max_bytes=1 << 20)
    rels = [f"file-history/s/{i}" for i in range(3)]  # one segment each
    for rel in rels:
        write(s.source, rel, os.urandom(700_000))
    stop = threading.Event()
    meter = None
    if when == "between files":
        meter = _StopAtSecondFile(stop)  # set before the third file is looked at
        expect = [700_000, -1, -1]
    else:
        # Set when segment 0 is committed: that is in the middle of the third file's
        # staging, after it was found not to fit, right before segment 1 is uploaded.
        commit = State.commit

        def commit_then_stop(self: State, seq: int, *args: Any, **kw: Any) -> None:
            commit(self, seq, *args, **kw)
            if seq == 0:
                stop.set()

        monkeypatch.setattr(State, "commit", commit_then_stop)
        expect = [700_000, 700_000, -1]
    with pytest.raises(SyncStopped):
        sync_once(s, meter, stop=stop)
    monkeypatch.undo()
    assert [shipped(s, rel) for rel in rels] == expect
    assert _committed(s) == sum(n > 0 for n in expect)  # nothing shipped twice
    assert _last_error(s) is None  # a stop is not an error (`syncd status` counts those)
    # It stopped cleanly: its lease is released, not left to expire.
    assert not (tmp_path / "store" / "machines" / "m1" / "lease.json").exists()
    assert len(sync_once(s).segments) == expect.count(-1)
    out = tmp_path / "out"
    restore_tree(Repository(open_store(s.store), "m1"), out)
    assert tree_bytes(out) == tree_bytes(s.source)


def test_a_stop_reaches_the_child_without_waiting_for_a_poll(
        tmp_path: Path, low_threshold: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # A poll that never comes in this test: only the wake-up can pass the stop on.
    monkeypatch.setattr(_catchup, "POLL", 3600.0)
    s = settings(tmp_path)
    tree(s, 60)
    stop, wakeup = threading.Event(), _catchup.Wakeup()
    outcome: list[str] = []
    t = threading.Thread(target=lambda: outcome.append(
        catch_up(s, stop, takeover=False, on_wait=lambda: None, wakeup=wakeup)))
    t.start()
    child = None
    try:
        def found() -> bool:
            nonlocal child
            child = _catchup_child(os.getpid())
            return child is not None

        wait_for(found, what="the catch-up child")
        assert child is not None
        _freeze(child)
        stop.set()
        wakeup.set()
        wait_for(lambda: _sigterm_pending(child), what="SIGTERM passed to the child")
    finally:
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGCONT)
        t.join(60)
        wakeup.close()
    assert not t.is_alive() and outcome == ["stopped"]
    assert not (tmp_path / "store" / "machines" / "m1" / "lease.json").exists()


# -- the CLI: SIGTERM while the child ships ---------------------------------------------

def _catchup_child(parent: int) -> int | None:
    """The pid of ``parent``'s spawned child (not multiprocessing's resource tracker)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[1]) == parent and b"spawn_main" in cmdline:
            return int(name)
    return None


def _freeze(pid: int) -> None:
    """SIGSTOP ``pid`` and wait until every thread of it has stopped: a thread still on its
    way to the stop could take a signal sent meanwhile, which would then never show as
    pending."""
    os.kill(pid, signal.SIGSTOP)

    def stopped() -> bool:
        states = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):  # a thread that just ended
                states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        return bool(states) and all(s == "T" for s in states)

    wait_for(stopped, what=f"process {pid} stopped")


def _sigterm_pending(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("SigPnd:", "ShdPnd:")) and \
                int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)):
            return True
    return False


def _committed(s: Settings) -> int:
    """Segments the state has seen confirmed so far."""
    if not s.state_file.exists():
        return 0
    st = State(s.state_file, readonly=True)
    try:
        return st.next_seq
    finally:
        st.close()


def test_sigterm_during_the_catch_up_exits_0_and_loses_nothing(tmp_path: Path) -> None:
    # Many small segments, so the child is caught between two of them.
    s = settings(tmp_path, segment_max_bytes=1 << 20)
    n = _catchup.MIN_FILES + 100  # the real threshold: the daemon is another process
    for i in range(n):
        write(s.source, f"projects/-home-p{i % 7}/{i:05d}.jsonl",
              os.urandom(18_000).hex().encode())
    env = _env(s, {"SYNCD_SEGMENT_MAX_BYTES": str(s.segment_max_bytes)})
    err = tmp_path / "run.err"
    with open(err, "w") as stderr:
        p = subprocess.Popen([sys.executable, "-m", "syncd", "run"], env=env,
                             stderr=stderr)
    child = None
    try:
        def found() -> bool:
            nonlocal child
            child = _catchup_child(p.pid)
            return child is not None

        wait_for(found, what="the catch-up child")
        assert child is not None
        wait_for(lambda: _committed(s) >= 1, what="the child's first segment")
        # Hold the child where it is until the daemon has passed our SIGTERM on to it.
        _freeze(child)
        held = _committed(s)
        p.send_signal(signal.SIGTERM)
        wait_for(lambda: _sigterm_pending(child), what="SIGTERM passed to the child")
        os.kill(child, signal.SIGCONT)
        assert p.wait(timeout=60) == 0, err.read_text()
    finally:
        if p.poll() is None:
            for pid in (child, p.pid):
                if pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            p.wait()
    text = err.read_text()
    assert "start-up catch-up stopped" in text and "Traceback" not in text, text
    assert "shipping in this process" not in text, text
    assert not Path(f"/proc/{child}").exists()
    # At a segment boundary: the upload in flight and the segment being read, no more.
    assert _committed(s) <= held + 2
    assert 0 < sum(shipped(s, rel) > 0 for rel in _rels(s)) < n  # stopped half-way
    # It stopped cleanly: its lease is released, not left to expire.
    assert not (tmp_path / "store" / "machines" / "m1" / "lease.json").exists()
    r = subprocess.run([sys.executable, "-m", "syncd", "sync"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out"
    restore_tree(Repository(open_store(s.store), "m1"), out)
    assert tree_bytes(out) == tree_bytes(s.source)


def _last_error(s: Settings) -> str | None:
    st = State(s.state_file, readonly=True)
    try:
        return st.meta("last_error")
    finally:
        st.close()


def _rels(s: Settings) -> list[str]:
    return [str(p.relative_to(s.source)) for p in s.source.rglob("*.jsonl")]


def test_a_first_import_from_a_followed_machine_is_made_and_shipped_by_the_child(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Following a machine for the first time brings every session it holds: the child
    imports them and ships what it brought; the daemon then follows on from there."""
    caplog.set_level(logging.DEBUG, logger="syncd")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    desk = settings(tmp_path, source=tmp_path / "desk", state_dir=tmp_path / "desk-state",
                    machine_id="desk")
    rel = "projects/-home-a/0a0eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b.jsonl"
    content = b'{"type":"user","sessionId":"0a0eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"}\n'
    write(desk.source, rel, content)
    sync_once(desk)
    s = settings(tmp_path, follow=["desk"], follow_quiet=0)
    s.source.mkdir()
    with running(s):
        child = wait_for(lambda: logged(caplog, r"shipped by child process (\d+)"),
                         what="the child's catch-up")
        assert int(child.group(1)) != os.getpid()
        assert shipped(s, rel) == len(content)
        done = logged(caplog, r"pending, and a first import from the followed machines")
        assert done is not None, messages(caplog)
        wait_for(lambda: logged(caplog, r"reconcile scan: 1 files, 0 changed") is not None,
                 what="the daemon's own reconcile scan")
    assert (s.source / rel).read_bytes() == content
    # Imported by the child alone: the daemon's follower found it as imported already.
    assert not any(m.startswith("imported ") for m in messages(caplog)), messages(caplog)
    state = State(s.state_file, readonly=True)
    try:
        rec = state.imported(rel.encode())
    finally:
        state.close()
    assert rec is not None and rec.source == "desk"

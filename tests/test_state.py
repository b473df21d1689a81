"""The state database shared by the daemon and the commands run beside it."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from syncd.backup.state import State
from syncd.errors import StateError
from syncd.security.lock import ProcessLock

OTHER_PROCESS = """
import sys
from pathlib import Path
from syncd.backup.state import State
State(Path(sys.argv[1]), durable=False).close()
"""


def test_a_second_connection_keeps_the_daemons_wal(tmp_path: Path) -> None:
    """The daemon opens the state more than once (engine, archive jobs); another process
    (a restore recording what it writes) then opens and closes it. The daemon's WAL must
    survive: what it writes afterwards is what every reader sees."""
    path = tmp_path / "m@tag.sqlite"
    engine = State(path)
    try:
        engine.set_meta(last_flush_seq="1")
        State(path).close()  # the archiver's own connection, opened and closed
        subprocess.run([sys.executable, "-c", OTHER_PROCESS, str(path)], check=True,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        assert path.with_name(path.name + "-wal").exists()
        engine.set_meta(last_flush_seq="2")
        reader = State(path, readonly=True)
        try:
            assert reader.meta("last_flush_seq") == "2"
        finally:
            reader.close()
    finally:
        engine.close()
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_lock_whose_pid_cannot_be_written_is_not_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk fails the pid's write after the flock was taken: the error names the
    lock file, and the lock is let go (kept, the daemon's own next try would be refused
    as "another syncd (pid ?)")."""
    import syncd.security.lock

    path = tmp_path / "state" / "m1@x.lock"

    def full(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(syncd.security.lock.os, "pwrite", full)
    with pytest.raises(StateError, match=f"^lock file {path}: No space left on device "
                                         r"\(the disk is full: "):
        ProcessLock(path).acquire()
    monkeypatch.undo()
    lock = ProcessLock(path)
    lock.acquire()
    try:
        assert ProcessLock(path).holder() == os.getpid()
    finally:
        lock.release()
